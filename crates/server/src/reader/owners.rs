//! Which writer epoch a shard's latest manifest names, with as few
//! object-store requests as the question allows. A key lookup that the
//! held writers' unflushed rows answer only needs to know that each
//! answering writer still owns its shard (`lookup.rs`).
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

/// Per shard: its manifest store and the last version read, with the
/// epoch it names.
#[derive(Default)]
pub(crate) struct Owners {
    shards: parking_lot::Mutex<HashMap<ShardId, Arc<Known>>>,
}

struct Known {
    manifests: ManifestStore,
    /// `(version, writer_epoch)` of the last manifest read.
    seen: parking_lot::Mutex<Option<(u64, u64)>>,
}

impl Owners {
    /// The `writer_epoch` of `shard`'s latest manifest as of this call
    /// (`None`: the shard has no manifest).
    pub(crate) async fn epoch(
        &self,
        loc: &StoreLocation,
        shard: ShardId,
    ) -> Result<Option<u64>, FencingError> {
        let known = self
            .shards
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
            .clone();
        let version = known.manifests.latest_version().await?;
        if version == 0 {
            return Ok(None);
        }
        if let Some((seen, epoch)) = *known.seen.lock() {
            if seen == version {
                return Ok(Some(epoch));
            }
        }
        // Gone since it was probed (pruned): search again from scratch.
        let manifest = match known.manifests.load_version(version).await? {
            Some(m) => Some(m),
            None => known.manifests.load_latest().await?,
        };
        Ok(manifest.map(|m| {
            *known.seen.lock() = Some((m.version, m.writer_epoch));
            m.writer_epoch
        }))
    }
}
