//! A point-in-time view of a writer, and the metrics it records.

/// Metric names (the `metrics` facade; install any recorder to export them).
/// Every series carries the label `shard` (the shard id).
pub mod names {
    /// Counter: put/delete calls acknowledged.
    pub const PUTS: &str = "memwal_writer_puts_total";
    /// Counter: rows acknowledged (tombstones included).
    pub const ROWS: &str = "memwal_writer_rows_total";
    /// Counter: payload bytes acknowledged.
    pub const BYTES: &str = "memwal_writer_bytes_total";
    /// Histogram: seconds from a put's call to its durable acknowledgement.
    pub const PUT_SECONDS: &str = "memwal_writer_put_seconds";
    /// Histogram: seconds from a generation's freeze to its publish.
    pub const FLUSH_SECONDS: &str = "memwal_writer_flush_seconds";
    /// Counter: failed SSTable writes / publishes (retried).
    pub const FLUSH_ERRORS: &str = "memwal_writer_flush_errors_total";
    /// Counter: generations published.
    pub const PUBLISHES: &str = "memwal_writer_publishes_total";
    /// Gauge: memory of the active plus frozen, unpublished memtables.
    pub const UNFLUSHED_BYTES: &str = "memwal_writer_unflushed_bytes";
    /// Counter: puts that had to wait for room (backpressure).
    pub const BACKPRESSURE_WAITS: &str = "memwal_writer_backpressure_waits_total";
    /// Counter: puts that gave up waiting ([`crate::Error::Backpressure`]).
    pub const BACKPRESSURE_TIMEOUTS: &str = "memwal_writer_backpressure_timeouts_total";
    /// Gauge: the epoch the shard's writer holds.
    pub const EPOCH: &str = "memwal_writer_epoch";
    /// Counter: writers that found themselves fenced (or sealed).
    pub const FENCED: &str = "memwal_writer_fenced_total";
    /// Counter: memtables frozen, by reason.
    pub const FREEZES: &str = "memwal_writer_freezes_total";
    /// Counter: base-table indexes SSTables do not mirror (a kind memwal
    /// cannot build under `maintain_all_indexes`, a listed index the base
    /// lacks, a column the writer's schema lacks); once per index name.
    pub const INDEXES_SKIPPED: &str = "memwal_writer_indexes_skipped_total";
    /// Counter: puts with a producer sequence found written before
    /// (acknowledged again, nothing written).
    pub const PRODUCER_DUPLICATES: &str = "memwal_writer_producer_duplicates_total";
    /// Counter: puts with a producer sequence refused (fenced producer
    /// epoch, or a gap).
    pub const PRODUCER_REFUSALS: &str = "memwal_writer_producer_refusals_total";
    /// Counter: producer checkpoints written.
    pub const PRODUCER_CHECKPOINTS: &str = "memwal_writer_producer_checkpoints_total";
    /// Gauge: producers known at the shard.
    pub const PRODUCERS: &str = "memwal_writer_producers";
    /// Counter: moves onto a new version of the table's schema.
    pub const SCHEMA_CHANGES: &str = "memwal_writer_schema_changes_total";
    /// Gauge: published SSTables of the shard not yet covered by the base
    /// table (what every read merges; the write stalls' measure).
    pub const PENDING_SSTABLES: &str = "memwal_writer_pending_sstables";
    /// Counter (label `action`: `delayed` or `refused`): puts a write
    /// stall delayed or refused.
    pub const STALLED_PUTS: &str = "memwal_writer_stalled_puts_total";
}

/// The writer's metric handles, every one labelled `shard` (its id), so a
/// process serving many shards exports each shard's own series.
pub(crate) struct Meters {
    shard: String,
    pub puts: metrics::Counter,
    pub rows: metrics::Counter,
    pub bytes: metrics::Counter,
    pub put_seconds: metrics::Histogram,
    pub flush_seconds: metrics::Histogram,
    pub flush_errors: metrics::Counter,
    pub publishes: metrics::Counter,
    pub unflushed_bytes: metrics::Gauge,
    pub backpressure_waits: metrics::Counter,
    pub backpressure_timeouts: metrics::Counter,
    pub epoch: metrics::Gauge,
    pub fenced: metrics::Counter,
    pub indexes_skipped: metrics::Counter,
    pub schema_changes: metrics::Counter,
    pub producer_duplicates: metrics::Counter,
    pub producer_refusals: metrics::Counter,
    pub producer_checkpoints: metrics::Counter,
    pub producers: metrics::Gauge,
    pub pending_sstables: metrics::Gauge,
}

impl std::fmt::Debug for Meters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meters")
            .field("shard", &self.shard)
            .finish_non_exhaustive()
    }
}

impl Meters {
    pub(crate) fn new(shard: &memwal_fencing::ShardId) -> Self {
        let shard = shard.to_string();
        let l = || [("shard", shard.clone())];
        Self {
            puts: metrics::counter!(names::PUTS, &l()),
            rows: metrics::counter!(names::ROWS, &l()),
            bytes: metrics::counter!(names::BYTES, &l()),
            put_seconds: metrics::histogram!(names::PUT_SECONDS, &l()),
            flush_seconds: metrics::histogram!(names::FLUSH_SECONDS, &l()),
            flush_errors: metrics::counter!(names::FLUSH_ERRORS, &l()),
            publishes: metrics::counter!(names::PUBLISHES, &l()),
            unflushed_bytes: metrics::gauge!(names::UNFLUSHED_BYTES, &l()),
            backpressure_waits: metrics::counter!(names::BACKPRESSURE_WAITS, &l()),
            backpressure_timeouts: metrics::counter!(names::BACKPRESSURE_TIMEOUTS, &l()),
            epoch: metrics::gauge!(names::EPOCH, &l()),
            fenced: metrics::counter!(names::FENCED, &l()),
            indexes_skipped: metrics::counter!(names::INDEXES_SKIPPED, &l()),
            schema_changes: metrics::counter!(names::SCHEMA_CHANGES, &l()),
            producer_duplicates: metrics::counter!(names::PRODUCER_DUPLICATES, &l()),
            producer_refusals: metrics::counter!(names::PRODUCER_REFUSALS, &l()),
            producer_checkpoints: metrics::counter!(names::PRODUCER_CHECKPOINTS, &l()),
            producers: metrics::gauge!(names::PRODUCERS, &l()),
            pending_sstables: metrics::gauge!(names::PENDING_SSTABLES, &l()),
            shard,
        }
    }

    /// Counts a put a write stall delayed or refused (`action`).
    pub(crate) fn stalled_puts(&self, action: &'static str) {
        metrics::counter!(names::STALLED_PUTS, "shard" => self.shard.clone(), "action" => action)
            .increment(1);
    }

    /// Counts a freeze for `reason`.
    pub(crate) fn freeze(&self, reason: &'static str) {
        metrics::counter!(names::FREEZES, "shard" => self.shard.clone(), "reason" => reason)
            .increment(1);
    }
}

/// A snapshot of a writer's state ([`crate::ShardWriter::stats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// The epoch this writer holds.
    pub epoch: u64,
    /// Generation of the active memtable.
    pub generation: u64,
    /// Highest generation published (base table = 0).
    pub published_generation: u64,
    /// Physical rows in the active memtable.
    pub active_rows: usize,
    /// Memory of the active memtable.
    pub active_bytes: usize,
    /// Frozen, not yet published generations and their physical rows, in
    /// generation order.
    pub unpublished: Vec<(u64, usize)>,
    /// Memory of the active plus frozen, unpublished memtables.
    pub unflushed_bytes: usize,
    /// Highest WAL position acknowledged durable by this writer's appender.
    pub last_durable_position: u64,
    /// The position of this writer's fence sentinel.
    pub sentinel_position: u64,
    /// Puts and deletes acknowledged.
    pub puts: u64,
    /// Rows acknowledged.
    pub rows: u64,
    /// Generations published by this writer (replayed ones included).
    pub publishes: u64,
    /// Puts that waited for room.
    pub backpressure_waits: u64,
    /// SSTable writes and publishes that failed transiently (each was
    /// retried, or given up on at the retry bound while opening or
    /// closing).
    pub flush_failures: u64,
    /// The last SSTable write or publish failure (cleared by a publish).
    pub last_flush_error: Option<String>,
    /// Published SSTables not yet covered by the base table (the write
    /// stalls' measure, as of the last publish or stall refresh).
    pub pending_sstables: usize,
    /// Puts a write stall delayed, and refused.
    pub stalled_puts: u64,
    /// See `stalled_puts`.
    pub refused_puts: u64,
    /// The error that made the writer terminal, if any.
    pub terminal: Option<String>,
}
