//! What `/status` shows of each shard of a table: its state in the shard
//! set, its writer's progress, and its compaction and index catch-up
//! progress read from the base table.

use std::collections::BTreeMap;

use memwal::ShardId;
use memwal_sstable::LanceStore;
use memwal_table::BaseTable;
use serde::Serialize;

use crate::shards::{hex, ShardSet};
use crate::slots::Slot;

/// One shard in `/status`.
#[derive(Debug, Clone, Serialize)]
pub struct ShardStatus {
    /// The shard id.
    pub shard: String,
    /// Its shard field values (hex).
    pub values: BTreeMap<String, String>,
    /// `serving`, `closing` (idle, being closed), `lost` (to another
    /// writer), `failed` (corrupt stored state) or `down` (its writer
    /// stopped on a storage failure; reopened with backoff): see
    /// `last_error`.
    pub state: &'static str,
    /// Epoch, manifest version, generations, WAL, memory (when serving).
    pub epoch: Option<u64>,
    /// The manifest version this writer last wrote or read.
    pub manifest_version: Option<u64>,
    /// The generation in memory.
    pub generation: Option<u64>,
    /// Highest published generation.
    pub published_generation: Option<u64>,
    /// Frozen, unpublished generations.
    pub unflushed_generations: Option<usize>,
    /// Memory of unpublished memtables.
    pub memtable_bytes: Option<usize>,
    /// Last durable WAL position.
    pub wal_position: Option<u64>,
    /// `compacted_sstables` of the shard in the base table (0: none yet;
    /// `None`: the base table could not be read).
    pub compacted_generation: Option<u64>,
    /// Published generations not yet compacted into the base table.
    pub compaction_lag_generations: Option<u64>,
    /// Why the shard is no longer served, the writer's terminal error, or
    /// its last failed flush (retried).
    pub last_error: Option<String>,
    /// Per index reads may be served by: the generation of this shard the
    /// base index has caught up to (`index_catchup`; SSTables above it stay
    /// until it catches up). Empty when the base could not be read.
    pub index_catchup: BTreeMap<String, u64>,
    /// Published SSTables reads still merge (not yet covered by the base),
    /// the write stalls' measure (when serving).
    pub pending_sstables: Option<usize>,
    /// `slowed` or `stopped` while a write stall holds the shard's puts
    /// back (with why), `None` otherwise.
    pub stall: Option<String>,
    /// Puts the shard's write stalls delayed and refused so far.
    pub stalled_puts: Option<u64>,
    /// See `stalled_puts`.
    pub refused_puts: Option<u64>,
}

impl ShardStatus {
    /// A shard this daemon does not write: only its identity, compaction
    /// progress and why.
    fn not_serving(
        shard: ShardId,
        values: BTreeMap<String, String>,
        state: &'static str,
        compacted_generation: Option<u64>,
        why: &str,
    ) -> Self {
        Self {
            shard: shard.to_string(),
            values,
            state,
            epoch: None,
            manifest_version: None,
            generation: None,
            published_generation: None,
            unflushed_generations: None,
            memtable_bytes: None,
            wal_position: None,
            compacted_generation,
            compaction_lag_generations: None,
            last_error: Some(why.to_string()),
            index_catchup: BTreeMap::new(),
            pending_sstables: None,
            stall: None,
            stalled_puts: None,
            refused_puts: None,
        }
    }
}

impl ShardSet {
    /// See [`crate::TableHost::status`].
    pub(crate) async fn status(&self) -> Vec<ShardStatus> {
        let lance = LanceStore::new(self.loc().store.clone());
        let base = match BaseTable::load(&lance, &self.loc().root).await {
            Ok(b) => Some(b),
            Err(e) => {
                tracing::warn!(table = %self.table(), error = %e, "status: base table unreadable");
                None
            }
        };
        let compacted = |shard: ShardId| {
            base.as_ref()
                .map(|b| b.compacted_generation(shard.uuid().as_bytes()).unwrap_or(0))
        };
        let indexes = base
            .as_ref()
            .map(BaseTable::reader_indexes)
            .unwrap_or_default();
        let catchup = |shard: ShardId| -> BTreeMap<String, u64> {
            let Some(b) = &base else {
                return BTreeMap::new();
            };
            indexes
                .iter()
                .map(|i| (i.clone(), b.index_caught_up(i, shard.uuid().as_bytes())))
                .collect()
        };
        let mut out: Vec<ShardStatus> = self
            .snapshot()
            .iter()
            .map(|(key, slot)| {
                let values = key.iter().map(|(k, v)| (k.clone(), hex(v))).collect();
                let shard = slot.shard();
                let mut status = match slot {
                    Slot::Live(w) => {
                        let s = w.stats();
                        // Counted against the base just read (the
                        // writer's own count moves only at its publishes
                        // and stalled puts).
                        let pending = base.as_ref().map_or(s.pending_sstables, |b| {
                            w.pending_above(b.covered_generation(w.shard().uuid().as_bytes()))
                        });
                        let m = w.manifest();
                        let done = compacted(w.shard());
                        ShardStatus {
                            shard: w.shard().to_string(),
                            values,
                            state: "serving",
                            epoch: Some(s.epoch),
                            manifest_version: Some(m.version),
                            generation: Some(s.generation),
                            published_generation: Some(s.published_generation),
                            unflushed_generations: Some(s.unpublished.len()),
                            memtable_bytes: Some(s.unflushed_bytes),
                            wal_position: Some(s.last_durable_position),
                            compacted_generation: done,
                            compaction_lag_generations: done
                                .map(|d| s.published_generation.saturating_sub(d)),
                            last_error: s.terminal.clone().or(s.last_flush_error.clone()),
                            index_catchup: BTreeMap::new(),
                            pending_sstables: Some(pending),
                            stall: w.stall_at(pending),
                            stalled_puts: Some(s.stalled_puts),
                            refused_puts: Some(s.refused_puts),
                        }
                    }
                    Slot::Closing(w) => ShardStatus::not_serving(
                        w.shard(),
                        values,
                        "closing",
                        compacted(w.shard()),
                        "idle: closing (rows for it wait, then open it again)",
                    ),
                    Slot::Lost { shard, reason } => {
                        ShardStatus::not_serving(*shard, values, "lost", compacted(*shard), reason)
                    }
                    Slot::Failed { shard, error } => ShardStatus::not_serving(
                        *shard,
                        values,
                        "failed",
                        compacted(*shard),
                        &error.to_string(),
                    ),
                    Slot::Down {
                        shard,
                        cause,
                        since,
                        attempts,
                        ..
                    } => ShardStatus::not_serving(
                        *shard,
                        values,
                        "down",
                        compacted(*shard),
                        &format!(
                            "down for {} s after: {cause}; {attempts} reopen attempts so far",
                            since.elapsed().as_secs()
                        ),
                    ),
                };
                status.index_catchup = catchup(shard);
                status
            })
            .collect();
        out.sort_by(|a, b| a.values.cmp(&b.values));
        out
    }
}
