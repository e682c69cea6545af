//! The claim protocol: create, claim, check, update, seal, unseal.

use bytes::Bytes;
use memwal_proto::{ShardManifest, ShardStatus};
use memwal_store::{read_object, CreateOutcome};
use tracing::Instrument;

use crate::{codec, FencingError, FencingResult, ManifestStore, ShardIdentity};

/// A won claim: this writer now owns the shard at `epoch`.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The fencing token this writer holds.
    pub epoch: u64,
    /// The manifest version the claim wrote.
    pub manifest: ShardManifest,
}

impl ManifestStore {
    /// Creates the shard (version 1, epoch 0) with `identity`, or returns the
    /// existing version 1 when it was created with the same identity.
    /// Creating twice is harmless; a different identity is
    /// [`FencingError::IdentityMismatch`].
    pub async fn initialize_shard(&self, identity: &ShardIdentity) -> FencingResult<ShardManifest> {
        // A shard whose early versions were pruned must not get a second
        // version 1: look for any version first (probing, then LIST).
        if self.latest_version().await? > 1 {
            let latest = self.require_latest().await?;
            self.check_identity(&latest, identity)?;
            return Ok(latest);
        }
        let first = ShardManifest {
            shard_id: Some(self.shard().to_proto()),
            version: 1,
            shard_spec_id: identity.spec_id,
            shard_field_entries: identity.entries(),
            writer_epoch: 0,
            current_generation: 1,
            status: ShardStatus::Active as i32,
            ..Default::default()
        };
        match self.write_version(1, codec::encode(&first)).await? {
            CreateOutcome::Created | CreateOutcome::Identical => Ok(first),
            CreateOutcome::Conflict(_) => {
                let existing =
                    self.load_version(1)
                        .await?
                        .ok_or_else(|| FencingError::Corrupt {
                            path: self.layout().manifest_path(1).to_string(),
                            reason: "version 1 collided but cannot be read back".into(),
                        })?;
                self.check_identity(&existing, identity)?;
                Ok(existing)
            }
        }
    }

    /// Takes ownership of the shard: writes the next version with
    /// `writer_epoch + 1`, which fences the previous writer at its next
    /// manifest check or WAL collision.
    ///
    /// With `create_with`, a missing shard is created first and an existing
    /// one must have that identity; without, a missing shard is
    /// [`FencingError::ShardNotFound`]. A SEALED shard is refused
    /// ([`FencingError::Sealed`]). When another claimer already reached our
    /// epoch the claim is [`FencingError::ClaimLost`] (no retry at a higher
    /// epoch: no epoch war). A claim whose write outcome is unknown is never
    /// assumed won: the slot is read back and the claim token decides (ours
    /// landed and no one claimed since: won; someone else's: lost; still
    /// empty: claim again).
    pub async fn claim(&self, create_with: Option<&ShardIdentity>) -> FencingResult<Claim> {
        let span = tracing::info_span!("claim", shard = %self.shard());
        async {
            let result = self.claim_inner(create_with).await;
            let outcome = match &result {
                Ok(_) => "won",
                Err(FencingError::ClaimLost { .. }) => "lost",
                Err(FencingError::Sealed { .. }) => "sealed",
                Err(_) => "error",
            };
            metrics::counter!("memwal_claims_total", "outcome" => outcome).increment(1);
            if let Ok(c) = &result {
                tracing::info!(
                    epoch = c.epoch,
                    version = c.manifest.version,
                    "claimed shard"
                );
            }
            result
        }
        .instrument(span)
        .await
    }

    async fn claim_inner(&self, create_with: Option<&ShardIdentity>) -> FencingResult<Claim> {
        // Claims whose PUT outcome is unknown: (version, bytes, epoch). They
        // may have landed (or may still land); their token tells.
        let mut pending: Vec<(u64, Bytes, u64)> = Vec::new();
        for _ in 0..self.max_races() {
            let base = match self.load_latest().await? {
                Some(m) => m,
                None => match create_with {
                    Some(identity) => {
                        self.initialize_shard(identity).await?;
                        continue;
                    }
                    None => {
                        return Err(FencingError::ShardNotFound {
                            shard: self.shard(),
                        })
                    }
                },
            };
            if let Some(identity) = create_with {
                self.check_identity(&base, identity)?;
            }
            if let Some(outcome) = self.settle_pending(&mut pending, &base).await? {
                return outcome;
            }
            if base.status == ShardStatus::Sealed as i32 {
                return Err(FencingError::Sealed {
                    shard: self.shard(),
                });
            }
            let wanted = self.incremented(&base, "writer_epoch", base.writer_epoch)?;
            let mut next = base.clone();
            next.version = self.incremented(&base, "version", base.version)?;
            next.writer_epoch = wanted;
            let bytes = codec::encode_with_claim_token(&next, rand::random());
            match self.write_version(next.version, bytes.clone()).await {
                // The token makes our bytes unique: Identical is our own write.
                Ok(CreateOutcome::Created | CreateOutcome::Identical) => {
                    return Ok(Claim {
                        epoch: wanted,
                        manifest: next,
                    })
                }
                Ok(CreateOutcome::Conflict(found)) => {
                    if pending
                        .iter()
                        .any(|(v, b, _)| *v == next.version && *b == found)
                    {
                        // An earlier attempt of ours landed there: settle it
                        // in the next round, against the latest version.
                        continue;
                    }
                    let path = self.layout().manifest_path(next.version);
                    let stored = codec::decode(path.as_ref(), &found, next.version, self.shard())?;
                    if stored.status == ShardStatus::Sealed as i32 {
                        return Err(FencingError::Sealed {
                            shard: self.shard(),
                        });
                    }
                    if stored.writer_epoch >= wanted {
                        return Err(FencingError::ClaimLost {
                            shard: self.shard(),
                            wanted_epoch: wanted,
                            stored_epoch: stored.writer_epoch,
                        });
                    }
                    // A non-claim update (e.g. a publish) won the slot: retry on it.
                }
                Err(e) if e.is_outcome_unknown() => {
                    // Never assume the win: the next round reads the slot
                    // back and settles it by our token.
                    tracing::warn!(error = %e, "claim outcome unknown; checking the slot next round");
                    pending.push((next.version, bytes, wanted));
                    if pending.len() >= 3 {
                        // The store keeps failing: report it; the claim did
                        // not provably happen and must not be assumed.
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(FencingError::Contended {
            shard: self.shard(),
            attempts: self.max_races(),
        })
    }

    /// Settles claims whose outcome was unknown, now that `latest` is
    /// known: one of ours that landed is a win if no one claimed since
    /// (else a loss, or Sealed); a slot another claimer took at our epoch is
    /// a loss; slots taken by a lower-epoch update are forgotten;
    /// slots still empty stay pending (the PUT may yet land). `None`: no
    /// decision, claim on.
    async fn settle_pending(
        &self,
        pending: &mut Vec<(u64, Bytes, u64)>,
        latest: &ShardManifest,
    ) -> FencingResult<Option<FencingResult<Claim>>> {
        let mut still = Vec::new();
        for (version, bytes, wanted) in pending.drain(..) {
            if version > latest.version {
                still.push((version, bytes, wanted));
                continue;
            }
            let path = self.layout().manifest_path(version);
            let Some(found) = read_object(self.store().as_ref(), &path, self.retry()).await? else {
                continue;
            };
            if found != bytes {
                // Someone else took the slot we raced for: if they claimed
                // our epoch (or sealed), we lost; no claiming above them.
                let theirs = codec::decode(path.as_ref(), &found, version, self.shard())?;
                if theirs.status == ShardStatus::Sealed as i32 {
                    return Ok(Some(Err(FencingError::Sealed {
                        shard: self.shard(),
                    })));
                }
                if theirs.writer_epoch >= wanted {
                    return Ok(Some(Err(FencingError::ClaimLost {
                        shard: self.shard(),
                        wanted_epoch: wanted,
                        stored_epoch: theirs.writer_epoch,
                    })));
                }
                continue;
            }
            let ours = codec::decode(path.as_ref(), &bytes, version, self.shard())?;
            let outcome = if latest.status == ShardStatus::Sealed as i32 {
                Err(FencingError::Sealed {
                    shard: self.shard(),
                })
            } else if latest.writer_epoch == wanted {
                // Nobody claimed after us; only we write with our epoch.
                Ok(Claim {
                    epoch: wanted,
                    manifest: if latest.version == version {
                        ours
                    } else {
                        latest.clone()
                    },
                })
            } else {
                Err(FencingError::ClaimLost {
                    shard: self.shard(),
                    wanted_epoch: wanted,
                    stored_epoch: latest.writer_epoch,
                })
            };
            return Ok(Some(outcome));
        }
        *pending = still;
        Ok(None)
    }

    /// The latest manifest, provided `epoch` still owns the shard:
    /// [`FencingError::Fenced`] when a newer epoch is recorded,
    /// [`FencingError::Sealed`] when the shard is sealed.
    pub async fn check_fenced(&self, epoch: u64) -> FencingResult<ShardManifest> {
        let latest = self.require_latest().await?;
        self.check_owner(&latest, epoch)?;
        Ok(latest)
    }

    /// Writes the next manifest version as the owner at `epoch`.
    ///
    /// Each round re-reads the latest version, checks `epoch` against it
    /// ([`ManifestStore::check_fenced`]'s rules), applies `change` to a copy
    /// and writes it with put-if-not-exists; a lost race re-runs the round
    /// on the new version, so `change` must be idempotent with respect to
    /// what it finds. `change` cannot alter the fields it does not own:
    /// shard id, identity, epoch, version and status are kept from the base,
    /// and the replay cursor, `current_generation` and the WAL hint never
    /// move backwards.
    pub async fn update<F>(&self, epoch: u64, mut change: F) -> FencingResult<ShardManifest>
    where
        F: FnMut(&mut ShardManifest) -> FencingResult<()>,
    {
        for _ in 0..self.max_races() {
            let base = self.check_fenced(epoch).await?;
            let mut next = base.clone();
            change(&mut next)?;
            // The replay cursor, the generation counter and the WAL hint
            // only move forward, whatever the change asked for.
            next.replay_after_wal_entry_position = next
                .replay_after_wal_entry_position
                .max(base.replay_after_wal_entry_position);
            next.current_generation = next.current_generation.max(base.current_generation);
            next.wal_entry_position_last_seen = next
                .wal_entry_position_last_seen
                .max(base.wal_entry_position_last_seen);
            next.shard_id = base.shard_id.clone();
            next.shard_spec_id = base.shard_spec_id;
            next.shard_field_entries = base.shard_field_entries.clone();
            next.writer_epoch = base.writer_epoch;
            next.status = base.status;
            next.version = self.incremented(&base, "version", base.version)?;
            // Our epoch is in the bytes and no one else holds it: Identical
            // can only be our own landed write.
            match self
                .write_version(next.version, codec::encode(&next))
                .await?
            {
                CreateOutcome::Created | CreateOutcome::Identical => return Ok(next),
                CreateOutcome::Conflict(_) => continue,
            }
        }
        Err(FencingError::Contended {
            shard: self.shard(),
            attempts: self.max_races(),
        })
    }

    /// Marks the shard SEALED and bumps the epoch in the same version, so
    /// the live writer fails its next manifest check or publish. Its WAL
    /// appends only stop once a fence sentinel is at the WAL tip: a drop
    /// should use `memwal_wal::seal_and_fence`, which does both. Sealing a
    /// sealed shard returns it as is.
    pub async fn seal(&self) -> FencingResult<ShardManifest> {
        self.set_status(ShardStatus::Sealed).await
    }

    /// Returns a SEALED shard to ACTIVE so it can be claimed again.
    /// Unsealing an active shard returns it as is.
    pub async fn unseal(&self) -> FencingResult<ShardManifest> {
        self.set_status(ShardStatus::Active).await
    }

    async fn set_status(&self, status: ShardStatus) -> FencingResult<ShardManifest> {
        for _ in 0..self.max_races() {
            let base = self.require_latest().await?;
            if base.status == status as i32 {
                return Ok(base);
            }
            let mut next = base.clone();
            next.version = self.incremented(&base, "version", base.version)?;
            next.status = status as i32;
            if status == ShardStatus::Sealed {
                next.writer_epoch = self.incremented(&base, "writer_epoch", base.writer_epoch)?;
            }
            let bytes = codec::encode_with_claim_token(&next, rand::random());
            match self.write_version(next.version, bytes).await {
                Ok(CreateOutcome::Created | CreateOutcome::Identical) => {
                    tracing::info!(shard = %self.shard(), ?status, version = next.version, "shard status changed");
                    return Ok(next);
                }
                Ok(CreateOutcome::Conflict(_)) => continue,
                Err(e) if e.is_outcome_unknown() => continue,
                Err(e) => return Err(e),
            }
        }
        Err(FencingError::Contended {
            shard: self.shard(),
            attempts: self.max_races(),
        })
    }

    /// `value + 1`, where `value` is the manifest field `field` of `base`;
    /// a field already at `u64::MAX` cannot have been written by the
    /// protocol and is [`FencingError::Corrupt`] naming the shard, the
    /// field and the manifest's path, never wrapped or a panic.
    fn incremented(&self, base: &ShardManifest, field: &str, value: u64) -> FencingResult<u64> {
        value.checked_add(1).ok_or_else(|| FencingError::Corrupt {
            path: self.layout().manifest_path(base.version).to_string(),
            reason: format!(
                "shard {}: `{field}` is {value} (u64::MAX) and cannot be incremented",
                self.shard()
            ),
        })
    }

    /// The latest manifest; a shard without one is [`FencingError::ShardNotFound`].
    async fn require_latest(&self) -> FencingResult<ShardManifest> {
        self.load_latest()
            .await?
            .ok_or(FencingError::ShardNotFound {
                shard: self.shard(),
            })
    }

    fn check_owner(&self, m: &ShardManifest, epoch: u64) -> FencingResult<()> {
        if m.status == ShardStatus::Sealed as i32 {
            return Err(FencingError::Sealed {
                shard: self.shard(),
            });
        }
        if m.writer_epoch > epoch {
            return Err(FencingError::Fenced {
                shard: self.shard(),
                local_epoch: epoch,
                stored_epoch: m.writer_epoch,
            });
        }
        if m.writer_epoch < epoch {
            return Err(FencingError::EpochRegressed {
                shard: self.shard(),
                local_epoch: epoch,
                stored_epoch: m.writer_epoch,
            });
        }
        Ok(())
    }

    fn check_identity(&self, m: &ShardManifest, identity: &ShardIdentity) -> FencingResult<()> {
        let found = ShardIdentity::of_manifest(m);
        if &found != identity {
            return Err(FencingError::IdentityMismatch {
                shard: self.shard(),
                reason: format!("stored {found:?}, requested {identity:?}"),
            });
        }
        Ok(())
    }
}
