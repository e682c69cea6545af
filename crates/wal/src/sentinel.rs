//! The fence sentinel a new writer puts at the WAL tip after claiming.

use memwal_fencing::{ManifestStore, ShardManifest};
use memwal_store::{create_object, CreateOutcome};
use tracing::Instrument;

use crate::codec::encode_sentinel;
use crate::tail::{find_tail_for, probe_up};
use crate::{WalError, WalLocation, WalResult};

/// How many occupied slots the sentinel moves past before giving up.
const MAX_COLLISIONS: u32 = 1024;

/// Writes this writer's fence sentinel just past the WAL tip and returns its
/// position. Call it right after a won claim, before replay; the appender
/// then starts at the returned position + 1 and replay ends just below it.
///
/// `epoch` and `claimed` are the claim's epoch and manifest. The tail is
/// found with [`crate::find_tail`] from the manifest's cursor and hint, then
/// the sentinel is written with put-if-not-exists. When the slot is taken:
///
/// - by an entry with a higher epoch: a newer writer exists,
///   [`WalError::Fenced`];
/// - by another entry of our own epoch: [`WalError::EpochConflict`];
/// - by an entry of a lower epoch (the predecessor, whose PUT raced ours):
///   that entry will be replayed; the sentinel moves on to the next free slot.
///
/// Guarantees once it returns `Ok(s)`: `s + 1` (the appender's first
/// position) does not overflow; every position below `s` is filled and will
/// not change, and a predecessor writing in order at any position
/// up to `s` collides (with the sentinel or an entry before it), reloads
/// the manifest and learns it is fenced. A sentinel's bytes depend only on
/// the epoch, so a retried PUT that had landed is recognised as ours.
pub async fn write_fence_sentinel(
    manifests: &ManifestStore,
    epoch: u64,
    claimed: &ShardManifest,
) -> WalResult<u64> {
    if claimed.writer_epoch != epoch {
        return Err(WalError::invalid(format!(
            "fence sentinel for epoch {epoch} with a manifest at epoch {}",
            claimed.writer_epoch
        )));
    }
    let loc = WalLocation::of(manifests);
    let span = tracing::info_span!("wal_fence_sentinel", shard = %loc.shard(), epoch);
    async {
        let bytes = encode_sentinel(epoch);
        let mut position = next_position(&loc, find_tail_for(&loc, claimed).await?)?;
        let mut collisions = 0;
        loop {
            let path = loc.path(position);
            match create_object(loc.store().as_ref(), &path, bytes.clone(), loc.retry()).await {
                Ok(CreateOutcome::Created | CreateOutcome::Identical) => {
                    metrics::counter!("memwal_wal_sentinel_collisions_total")
                        .increment(collisions as u64);
                    tracing::info!(position, collisions, "fence sentinel written");
                    return Ok(position);
                }
                Ok(CreateOutcome::Conflict(found)) => {
                    let entry = loc.decode(position, &found)?;
                    if entry.epoch > epoch {
                        return Err(WalError::Fenced {
                            shard: loc.shard(),
                            local_epoch: epoch,
                            stored_epoch: entry.epoch,
                        });
                    }
                    if entry.epoch == epoch {
                        // Not our sentinel (those compare identical), yet
                        // written at our epoch: someone else holds it too.
                        return Err(WalError::EpochConflict {
                            shard: loc.shard(),
                            position,
                            path: path.to_string(),
                            epoch,
                            found_epoch: entry.epoch,
                        });
                    }
                    collisions += 1;
                    if collisions >= MAX_COLLISIONS {
                        return Err(WalError::Contended {
                            shard: loc.shard(),
                            attempts: collisions,
                        });
                    }
                    tracing::debug!(
                        position,
                        found_epoch = entry.epoch,
                        "sentinel slot taken; moving past it"
                    );
                    position = next_position(&loc, probe_up(&loc, position).await?)?;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    .instrument(span)
    .await
}

/// The sentinel position after `tail`, leaving room for the appender's
/// first position (sentinel + 1): a tail at `u64::MAX - 1` or above (only a
/// stray or corrupt object can be there) is reported, not overflowed.
fn next_position(loc: &WalLocation, tail: u64) -> WalResult<u64> {
    tail.checked_add(1)
        .filter(|p| p.checked_add(1).is_some())
        .ok_or_else(|| WalError::Corrupt {
            shard: loc.shard(),
            position: tail,
            path: loc.path(tail).to_string(),
            reason: "an object sits at the last possible WAL positions".into(),
        })
}

/// Seals the shard for a drop and fences its WAL: [`ManifestStore::seal`]
/// (claims are refused from now on and the epoch is bumped) followed by a
/// fence sentinel at the WAL tip written with the sealing epoch. Once this
/// returns, the live writer's next append collides and stops with
/// [`WalError::Sealed`]: no append is acknowledged after the seal. Returns
/// the sealed manifest and the sentinel's position.
pub async fn seal_and_fence(manifests: &ManifestStore) -> WalResult<(ShardManifest, u64)> {
    let sealed = manifests.seal().await?;
    let position = write_fence_sentinel(manifests, sealed.writer_epoch, &sealed).await?;
    Ok((sealed, position))
}
