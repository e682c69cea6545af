//! What a reader should read: the base table plus, per shard, the
//! published SSTables the base does not contain yet.

use std::collections::BTreeMap;
use std::sync::Arc;

use lance::Dataset;
use memwal_fencing::ShardId;
use memwal_proto::SsTable;
use memwal_sstable::LanceStore;
use memwal_store::{RetryPolicy, StoreLocation};

use crate::init::open_dataset;
use crate::shards::{compacted_generations, index_caught_up, latest_manifest, list_shards};
use crate::{BaseTable, Result};

/// One shard as a reader should see it.
#[derive(Debug, Clone)]
pub struct ShardView {
    /// The shard.
    pub shard: ShardId,
    /// The shard's sharding spec id (0: manual).
    pub spec_id: u32,
    /// The manifest's `current_generation` (the generation in memory).
    pub current_generation: u64,
    /// The manifest's version.
    pub version: u64,
    /// The manifest's `replay_after_wal_entry_position`: WAL entries above
    /// it may hold rows not yet published (at generations from
    /// `current_generation` on); entries at or below it are published and
    /// may be deleted.
    pub replay_after: u64,
    /// The manifest's `writer_epoch`: the writer that owns the shard now.
    /// A writer holding another epoch is fenced, and its unpublished rows
    /// must not be read.
    pub writer_epoch: u64,
    /// Generations up to this one are in the base table (or, for an
    /// index-served read, in the index) and must not be read again.
    pub floor: u64,
    /// Published SSTables above `floor`, ascending by generation.
    pub sstables: Vec<SsTable>,
}

/// A consistent read: the base table and every shard's SSTables above what
/// that base version contains.
#[derive(Debug, Clone)]
pub struct TableView {
    /// The base table, at a version read after every shard manifest, so no
    /// SSTable a writer pruned is missing from both.
    pub base: Arc<Dataset>,
    /// `compacted_sstables` of that base version.
    pub compacted: BTreeMap<ShardId, u64>,
    /// Every shard with a manifest, in id order.
    pub shards: Vec<ShardView>,
}

impl TableView {
    /// The view's shards as upstream's `LsmScanner` takes them: each with
    /// its spec, current generation and exactly the SSTables to read.
    pub fn snapshots(&self) -> Vec<lance::dataset::mem_wal::ShardSnapshot> {
        self.shards
            .iter()
            .map(|s| {
                let mut snap = lance::dataset::mem_wal::ShardSnapshot::new(s.shard.uuid())
                    .with_spec_id(s.spec_id)
                    .with_current_generation(s.current_generation);
                for t in &s.sstables {
                    snap = snap.with_sstable(t.generation, t.path.clone());
                }
                snap
            })
            .collect()
    }
}

/// Generations of `shard` a reader must not read from SSTables: what the
/// base holds, or for an index-served read what the index has caught up to
/// (absent: nothing), never above what the base holds.
fn read_floor(
    compacted: &BTreeMap<ShardId, u64>,
    caught_up: Option<&BTreeMap<ShardId, u64>>,
    shard: ShardId,
) -> u64 {
    let compacted = compacted.get(&shard).copied().unwrap_or(0);
    match caught_up {
        None => compacted,
        Some(c) => c.get(&shard).copied().unwrap_or(0).min(compacted),
    }
}

/// Builds the read view of the table at `loc`.
///
/// `index`: `None` for a scan of the base table's data; `Some(name)` for a
/// read served by base-table index `name`, whose floor per shard is what
/// that index has caught up to (an absent entry: nothing), never above
/// `compacted_sstables`.
///
/// Manifests are read before the base table: a writer drops SSTables from
/// its manifest only once the base records them compacted, so reading in
/// this order never loses a generation (reading the base first could pair
/// an old base with a pruned manifest).
///
/// Fails, never returning a partial view, when the shards cannot be listed
/// ([`crate::TableError::Store`]), a manifest cannot be read or decoded
/// ([`crate::TableError::Manifest`]), or the base table cannot be opened or
/// its MemWAL index read; [`crate::TableError::is_transient`] tells a
/// storage failure worth retrying.
pub async fn table_view(
    loc: &StoreLocation,
    index: Option<&str>,
    retry: &RetryPolicy,
) -> Result<TableView> {
    let mut manifests = Vec::new();
    for shard in list_shards(loc).await? {
        if let Some(m) = latest_manifest(loc, shard, retry).await? {
            manifests.push((shard, m));
        }
    }
    let lance = LanceStore::new(loc.store.clone());
    let base = open_dataset(&lance, loc).await?;
    let table = BaseTable::of_dataset(&base, &loc.uri).await?;
    let compacted = compacted_generations(&loc.uri, table.mem_wal.as_ref())?;
    let caught_up = index
        .map(|name| index_caught_up(&loc.uri, table.mem_wal.as_ref(), name))
        .transpose()?;
    let shards = manifests
        .into_iter()
        .map(|(shard, m)| {
            let floor = read_floor(&compacted, caught_up.as_ref(), shard);
            let mut sstables: Vec<SsTable> = m
                .sstables
                .into_iter()
                .filter(|s| s.generation > floor)
                .collect();
            sstables.sort_by_key(|s| s.generation);
            ShardView {
                shard,
                spec_id: m.shard_spec_id,
                current_generation: m.current_generation,
                version: m.version,
                replay_after: m.replay_after_wal_entry_position,
                writer_epoch: m.writer_epoch,
                floor,
                sstables,
            }
        })
        .collect();
    Ok(TableView {
        base,
        compacted,
        shards,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_the_compacted_generation_capped_by_the_index() {
        let (a, b) = (ShardId::random(), ShardId::random());
        let compacted = BTreeMap::from([(a, 5), (b, 2)]);
        assert_eq!(read_floor(&compacted, None, a), 5);
        assert_eq!(read_floor(&compacted, None, ShardId::random()), 0);
        let caught = BTreeMap::from([(a, 3), (b, 9)]);
        assert_eq!(
            read_floor(&compacted, Some(&caught), a),
            3,
            "index behind the base"
        );
        assert_eq!(
            read_floor(&compacted, Some(&caught), b),
            2,
            "never above the base"
        );
        let none = BTreeMap::new();
        assert_eq!(
            read_floor(&compacted, Some(&none), a),
            0,
            "absent: not caught up"
        );
    }
}
