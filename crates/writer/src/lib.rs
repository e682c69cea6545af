//! `memwal`: the embedded shard writer of a MemWAL table (docs/memwal-format.md).
//!
//! A [`ShardWriter`] owns one shard of a Lance table at a time (epoch
//! fencing through the shard manifest). Rows are acknowledged only once
//! durable in the shard's write-ahead log, buffered in a memtable keyed by
//! primary key (last write wins), frozen into generations and flushed as
//! SSTables that are published strictly in generation order.
//!
//! Lifecycle: [`ShardWriter::open`] validates everything it can (config,
//! base table schema, sharding spec, shard identity), then claims the
//! shard, writes its fence sentinel and replays the WAL: each recorded
//! generation is rebuilt as one memtable under its recorded number and
//! queued, frozen, to the flusher, which writes and publishes it in the
//! background in generation order, before any generation written after
//! `open` (the writer is ready for puts once the WAL has been read; the
//! replayed rows are readable through [`ShardWriter::unflushed_batches`]
//! and count against `max_unflushed_bytes` until published, and
//! [`ShardWriter::flush`] / [`ShardWriter::close`] wait for them; with
//! [`ReplayPublish::BeforeOpenReturns`] `open` waits until they are
//! published). Then
//! [`ShardWriter::put`] / [`ShardWriter::delete`] (durable, group-committed),
//! [`ShardWriter::flush`], [`ShardWriter::close`] or [`ShardWriter::abort`]
//! (dropping = abort). [`ShardWriter::evolve_to`] moves a live writer onto
//! a new version of the table's schema at a generation boundary.
//!
//! Only durable writes are supported (there is no non-durable mode).
//!
//! Readers that add a writer's unpublished rows to the published view
//! take [`ShardWriter::read_snapshot`]: acknowledged rows only (rows whose
//! WAL write is still in flight, or failed, are left out: the WAL
//! appender's append counts are the visibility watermark), with the
//! writer's epoch, which the reader checks against the shard's manifest
//! (a fenced writer's rows must not be read).
//!
//! Errors are one enum, [`Error`]: `Fenced`, `Sealed`, `InvalidInput`,
//! `Backpressure`, `OutcomeUnknown`, `Storage`, `Corrupt`, `Closed`.
//! Metrics names are in [`stats::names`]; tracing spans are `open`,
//! `claim`, `replay`, `append`, `freeze`, `flush`, `publish`.

#![warn(missing_docs)]

// The write path, bottom to top (each module imports only those above
// it): config, error, stats, resolve -> storage, lifecycle -> state ->
// flusher, backpressure, stall -> write_path -> put, replay, evolve -> open ->
// writer (the public handle, imported by nobody).
mod backpressure;
mod checkpoint;
mod config;
mod error;
mod evolve;
mod flusher;
mod lifecycle;
mod open;
mod producers;
mod put;
mod replay;
mod resolve;
mod stall;
mod state;
pub mod stats;
mod storage;
#[cfg(test)]
mod tests;
mod transient;
mod write_path;
mod writer;

pub use config::{ReplayPublish, ShardWriterConfig, ShardingConfig};
pub use error::{Error, Result, Source};
pub use memwal_fencing::{ShardId, ShardIdentity, ShardManifest};
pub use memwal_sstable::SsTableCompression;
pub use memwal_store::{RetryPolicy, StoreLocation};
pub use open::TableLocation;
pub use producers::{Acked, Gaps, ProducerSeq, WINDOW as PRODUCER_WINDOW};
pub use put::PutHandle;
pub use stats::WriterStats;
pub use writer::{PreparedPut, ReadSnapshot, ShardWriter};
