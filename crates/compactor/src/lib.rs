//! MemWAL compaction (docs/memwal-format.md "Compaction into the base table"): the
//! published SSTables of every shard merged into the base Lance table in
//! generation order, each commit advancing `compacted_sstables` of the
//! `__lance_mem_wal` index for the generation whose last rows it carries.
//!
//! Creating a table, listing its shards and the reader view are
//! `memwal_table`'s ([`memwal_table::create_table`],
//! [`memwal_table::list_shards`], [`memwal_table::table_view`]): readers and
//! the daemon need them without the compactor.
//!
//! The compactor never writes shard manifests; a shard's own writer drops
//! compacted SSTables from its manifest on its next update.

#![warn(missing_docs)]

mod catchup;
mod compact;
mod error;
mod gc;
mod maintain;
mod merge;
mod resolve;
mod task;
mod together;

pub use catchup::CatchupReport;
pub use compact::{CatchupOutcome, Compactor, CompactorConfig, MaintenanceOutcome, ShardReport};
pub use error::{CompactorError, Result};
pub use gc::{collect_garbage, GcConfig, GcReport};
pub use maintain::{BaseHealth, MaintenanceConfig, MaintenanceReport};
pub use task::{CompactorTask, Gate as CompactorGate};

/// Metric names the compactor records.
pub mod names {
    /// Counter: compaction cycles started by the background task (one
    /// pass over every shard, then GC when configured).
    pub const CYCLES: &str = "memwal_compactor_cycles_total";
    /// Counter: generations merged into the base table.
    pub const GENERATIONS: &str = "memwal_compactor_generations_total";
    /// Counter: live rows upserted or appended into the base table.
    pub const ROWS: &str = "memwal_compactor_rows_total";
    /// Counter: tombstones applied to the base table.
    pub const TOMBSTONES: &str = "memwal_compactor_tombstones_total";
    /// Counter: commits that lost to a concurrent commit and were replanned.
    pub const CONFLICTS: &str = "memwal_compactor_conflicts_total";
    /// Counter: shard compactions that failed.
    pub const ERRORS: &str = "memwal_compactor_errors_total";
    /// Histogram: seconds to merge one generation.
    pub const GENERATION_SECONDS: &str = "memwal_compactor_generation_seconds";
    /// Gauge (label `shard`): published generations not yet in the base.
    pub const LAG_GENERATIONS: &str = "memwal_compaction_lag_generations";
    /// Gauge (label `shard`): in-memory bytes of those generations.
    pub const LAG_BYTES: &str = "memwal_compaction_lag_bytes";
    /// Gauge (label `shard`): the shard's `compacted_sstables` generation.
    pub const COMPACTED_GENERATION: &str = "memwal_compacted_generation";
    /// Histogram: seconds of an index catch-up that committed
    /// (`optimize_indices` over the indexes behind).
    pub const INDEX_CATCHUP_SECONDS: &str = "memwal_compactor_index_catchup_seconds";
    /// Counter: index catch-ups that failed.
    pub const INDEX_CATCHUP_ERRORS: &str = "memwal_compactor_index_catchup_errors_total";
    /// Gauge (label `index`): generations the index lags behind the
    /// compacted ones (largest over shards).
    pub const INDEX_LAG_GENERATIONS: &str = "memwal_index_lag_generations";
    /// Counter: base maintenance runs that committed a rewrite.
    pub const MAINTENANCE_COMMITS: &str = "memwal_maintenance_commits_total";
    /// Counter: base fragments rewritten by maintenance.
    pub const MAINTENANCE_FRAGMENTS_REWRITTEN: &str =
        "memwal_maintenance_fragments_rewritten_total";
    /// Counter: base maintenance runs that failed.
    pub const MAINTENANCE_ERRORS: &str = "memwal_maintenance_errors_total";
    /// Histogram: seconds of a maintenance run that committed.
    pub const MAINTENANCE_SECONDS: &str = "memwal_maintenance_seconds";
    /// Gauge: fragments of the base table (after the last maintenance run).
    pub const BASE_FRAGMENTS: &str = "memwal_base_fragments";
    /// Gauge: rows of the base table readers see.
    pub const BASE_LIVE_ROWS: &str = "memwal_base_live_rows";
    /// Gauge: deleted rows the base table still stores.
    pub const BASE_DELETED_ROWS: &str = "memwal_base_deleted_rows";
    /// Gauge: base fragments with a deletion file.
    pub const BASE_DELETION_FILES: &str = "memwal_base_deletion_files";
    /// Gauge: bytes of the base table's data files (latest version).
    pub const BASE_DATA_BYTES: &str = "memwal_base_data_bytes";
}
