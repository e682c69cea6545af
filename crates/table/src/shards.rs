//! Which shards a table has and what their manifests and its MemWAL index
//! say about them.

use std::collections::BTreeMap;

use memwal_fencing::{ManifestStore, ShardId, ShardManifest};
use memwal_proto::MemWalIndexDetails;
use memwal_store::{RetryPolicy, StoreLocation};

use crate::{Result, TableError};

/// The shards with a directory under `{table}/_mem_wal/`, in id order.
/// Entries whose name is not a shard id are skipped (logged); a listing
/// failure is [`TableError::Store`], never "no shards".
pub async fn list_shards(loc: &StoreLocation) -> Result<Vec<ShardId>> {
    let dir = loc.child("_mem_wal");
    let listing = loc
        .store
        .list_with_delimiter(Some(&dir))
        .await
        .map_err(|source| TableError::Store {
            path: dir.to_string(),
            source: Box::new(source),
        })?;
    let mut shards: Vec<ShardId> = listing
        .common_prefixes
        .iter()
        .filter_map(|p| {
            let name = p.filename()?;
            match ShardId::parse(name) {
                Ok(id) => Some(id),
                Err(_) => {
                    tracing::debug!(entry = %p, "not a shard directory; skipped");
                    None
                }
            }
        })
        .collect();
    shards.sort_by_key(|s| s.uuid());
    Ok(shards)
}

/// The latest manifest of `shard`; `None` for a shard directory without
/// one yet (a writer creating it). A manifest that cannot be read or does
/// not decode is [`TableError::Manifest`] (never `None`).
pub async fn latest_manifest(
    loc: &StoreLocation,
    shard: ShardId,
    retry: &RetryPolicy,
) -> Result<Option<ShardManifest>> {
    ManifestStore::new(loc.store.clone(), &loc.root, shard, retry.clone())
        .load_latest()
        .await
        .map_err(|source| TableError::Manifest {
            uri: loc.uri.clone(),
            shard,
            source: Box::new(source),
        })
}

/// `compacted_sstables` of the MemWAL index: the highest generation of each
/// shard merged into the base table (absent: none yet). An entry whose shard
/// id does not decode is [`TableError::Corrupt`].
pub fn compacted_generations(
    uri: &str,
    details: Option<&MemWalIndexDetails>,
) -> Result<BTreeMap<ShardId, u64>> {
    let mut out = BTreeMap::new();
    for c in details.iter().flat_map(|d| d.compacted_sstables.iter()) {
        let shard = c
            .shard_id
            .as_ref()
            .and_then(ShardId::from_proto)
            .ok_or_else(|| TableError::Corrupt {
                uri: uri.to_string(),
                reason: "a compacted_sstables entry has no valid shard id".into(),
            })?;
        out.insert(shard, c.generation);
    }
    Ok(out)
}

/// Generations of `index`'s catch-up progress by shard (absent entry: the
/// index has caught up to nothing of that shard). An entry whose shard id
/// does not decode is [`TableError::Corrupt`].
pub fn index_caught_up(
    uri: &str,
    details: Option<&MemWalIndexDetails>,
    index: &str,
) -> Result<BTreeMap<ShardId, u64>> {
    let mut out = BTreeMap::new();
    for p in details
        .iter()
        .flat_map(|d| d.index_catchup.iter())
        .filter(|p| p.index_name == index)
    {
        for c in &p.caught_up_generations {
            let shard = c
                .shard_id
                .as_ref()
                .and_then(ShardId::from_proto)
                .ok_or_else(|| TableError::Corrupt {
                    uri: uri.to_string(),
                    reason: format!("index_catchup of `{index}` has an entry without a shard id"),
                })?;
            out.insert(shard, c.generation);
        }
    }
    Ok(out)
}
