//! A point-in-time view of a writer, and the metrics it records.

/// Metric names (the `metrics` facade; install any recorder to export them).
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
    /// Gauge: the epoch of the most recently opened writer.
    pub const EPOCH: &str = "memwal_writer_epoch";
    /// Counter: writers that found themselves fenced (or sealed).
    pub const FENCED: &str = "memwal_writer_fenced_total";
    /// Counter: memtables frozen, by reason.
    pub const FREEZES: &str = "memwal_writer_freezes_total";
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
    /// The last SSTable write or publish failure (cleared by a publish).
    pub last_flush_error: Option<String>,
    /// The error that made the writer terminal, if any.
    pub terminal: Option<String>,
}
