//! Which writer epoch (and replay cursor) a shard's latest manifest
//! names, with as few object-store requests as the question allows. A key
//! lookup that the held writers' unflushed rows answer only needs to know
//! that each answering writer still owns its shard (`lookup.rs`); a read
//! of another writer's WAL tail, how far its cursor has moved since
//! (`tails.rs`).
//!
//! A [`ManifestStore`] is kept per shard, so the search for the latest
//! version starts from the last one seen: when nothing changed, one probe
//! of the version after it (a new store reads the hint, probes around it
//! and reads the manifest: four requests). The epoch of the last version
//! read is kept with it, so an unchanged shard needs no read at all. A
//! manifest version never changes once written, so neither can go stale;
//! a newer version is found by the probe and read.

use std::collections::HashMap;
use std::sync::Arc;

use memwal::ShardId;
use memwal_fencing::{FencingError, ManifestStore};
use memwal_store::{RetryPolicy, StoreLocation};
use memwal_wal::WalLocation;

/// Per shard: its manifest store and the last version read, with the
/// epoch it names.
#[derive(Default)]
pub(crate) struct Owners {
    shards: parking_lot::Mutex<HashMap<ShardId, Arc<Known>>>,
}

struct Known {
    manifests: ManifestStore,
    /// The last manifest read.
    seen: parking_lot::Mutex<Option<Seen>>,
}

/// What a shard's latest manifest says about its owner and its WAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    /// The manifest's version.
    pub version: u64,
    /// Its `writer_epoch`.
    pub epoch: u64,
    /// Its `replay_after_wal_entry_position`.
    pub replay_after: u64,
}

impl Owners {
    /// The `writer_epoch` of `shard`'s latest manifest as of this call
    /// (`None`: the shard has no manifest).
    pub(crate) async fn epoch(
        &self,
        loc: &StoreLocation,
        shard: ShardId,
    ) -> Result<Option<u64>, FencingError> {
        Ok(self.latest(loc, shard).await?.map(|s| s.epoch))
    }

    /// `shard`'s WAL (same store and retry policy as its manifests).
    pub(crate) fn wal(&self, loc: &StoreLocation, shard: ShardId) -> WalLocation {
        WalLocation::of(&self.known(loc, shard).manifests)
    }

    /// What `shard`'s latest manifest as of this call says (`None`: the
    /// shard has no manifest).
    pub(crate) async fn latest(
        &self,
        loc: &StoreLocation,
        shard: ShardId,
    ) -> Result<Option<Seen>, FencingError> {
        let known = self.known(loc, shard);
        let version = known.manifests.latest_version().await?;
        if version == 0 {
            return Ok(None);
        }
        if let Some(seen) = *known.seen.lock() {
            if seen.version == version {
                return Ok(Some(seen));
            }
        }
        // Gone since it was probed (pruned): search again from scratch.
        let manifest = match known.manifests.load_version(version).await? {
            Some(m) => Some(m),
            None => known.manifests.load_latest().await?,
        };
        Ok(manifest.map(|m| {
            let seen = Seen {
                version: m.version,
                epoch: m.writer_epoch,
                replay_after: m.replay_after_wal_entry_position,
            };
            *known.seen.lock() = Some(seen);
            seen
        }))
    }

    /// The kept state of `shard` (made on first use).
    fn known(&self, loc: &StoreLocation, shard: ShardId) -> Arc<Known> {
        self.shards
            .lock()
            .entry(shard)
            .or_insert_with(|| {
                Arc::new(Known {
                    manifests: ManifestStore::new(
                        loc.store.clone(),
                        &loc.root,
                        shard,
                        RetryPolicy::default(),
                    ),
                    seen: parking_lot::Mutex::new(None),
                })
            })
            .clone()
    }
}
