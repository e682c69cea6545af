//! Writer configuration and its validation.

use std::collections::BTreeMap;
use std::time::Duration;

use memwal_proto::ShardingSpec;
use memwal_sstable::SsTableCompression;
use memwal_store::RetryPolicy;

use crate::{Error, Result};

/// Which shard of the table's sharding a writer owns (and, for a table
/// without a `__lance_mem_wal` index, the spec to route by).
///
/// Every row written is checked against the shard's field values: a row
/// that maps to another shard is refused with [`Error::InvalidInput`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShardingConfig {
    /// The spec rows are routed by. `None`: the spec the table's MemWAL
    /// index declares. On a table with the index a given spec must equal
    /// the table's; on a table without it, it is the spec (spec_id >= 1).
    pub spec: Option<ShardingSpec>,
    /// This shard's field values: raw little-endian Arrow scalar bytes by
    /// shard field id (upstream's bucket shards: `{"bucket": i32 LE}`).
    /// Empty: the values the shard's manifest records (implied for an
    /// `unsharded` spec, which has one shard). Given for an existing shard
    /// that records values, they must be equal.
    pub field_values: BTreeMap<String, Vec<u8>>,
}

impl ShardingConfig {
    /// The shard with `values` under the table's spec.
    pub fn with_values(values: impl IntoIterator<Item = (String, Vec<u8>)>) -> Self {
        Self {
            spec: None,
            field_values: values.into_iter().collect(),
        }
    }

    /// The shard with `values` under `spec` (for tables without a MemWAL
    /// index, or to assert the table's spec).
    pub fn with_spec(
        spec: ShardingSpec,
        values: impl IntoIterator<Item = (String, Vec<u8>)>,
    ) -> Self {
        Self {
            spec: Some(spec),
            field_values: values.into_iter().collect(),
        }
    }
}

/// Settings of a [`crate::ShardWriter`]. [`Default`] gives the documented
/// defaults; [`ShardWriterConfig::validate`] is run by `open` before
/// anything is touched in storage.
#[derive(Debug, Clone)]
pub struct ShardWriterConfig {
    /// `None` (default): the table decides: the spec its MemWAL index
    /// declares and the field values the shard records (or implies, for
    /// `unsharded`); a table without the index gets manual shards (spec 0,
    /// rows not routed). `Some`: narrows or, without the index, sets it
    /// (see [`ShardingConfig`]).
    pub sharding: Option<ShardingConfig>,
    /// Apply the `writer_config_defaults` of the table's MemWAL index to
    /// every setting still at its built-in [`Default`] value (settings
    /// changed from the default always win). Default true. The mapping of
    /// keys is documented on [`ShardWriterConfig::apply_table_defaults`].
    pub use_table_defaults: bool,
    /// Create the shard (manifest version 1) when it does not exist yet.
    /// Default true; when false a missing shard fails `open` with
    /// [`Error::InvalidInput`].
    pub create_if_missing: bool,
    /// The active memtable is frozen (and flushed) once its memory reaches
    /// this many bytes. Default 64 MiB.
    pub memtable_max_bytes: usize,
    /// ... or once it holds this many physical rows. Default 1,000,000.
    pub memtable_max_rows: usize,
    /// ... or once its oldest row is this old. `None` disables age-based
    /// freezing. Default 60 s.
    pub max_unflushed_age: Option<Duration>,
    /// Puts wait (backpressure) while the memory of the active memtable
    /// plus the frozen, not yet published ones reaches this. Default 256 MiB;
    /// must be at least `memtable_max_bytes`. Replay refuses (with
    /// [`Error::Backpressure`]) a recorded generation larger than this.
    pub max_unflushed_bytes: usize,
    /// Upper bound on the batch bytes one WAL entry groups. Default 16 MiB.
    pub wal_max_entry_bytes: usize,
    /// SSTable writes that may run at once (publishes stay in generation
    /// order). Default 2; at least 1.
    pub flush_concurrency: usize,
    /// Retry policy of every object-store request (manifest, WAL).
    pub retry: RetryPolicy,
    /// Backoff between attempts of a failed SSTable write or publish.
    /// Transient failures are retried until they pass, the writer is
    /// fenced (the fence is re-checked every third failure) or stopped;
    /// deterministic failures make the writer terminal at once.
    /// `max_attempts` bounds the attempts while `open` runs (a replayed
    /// generation that cannot be written then fails `open` with the last
    /// error) and while closing.
    pub flush_retry: RetryPolicy,
    /// When `open` may return after replaying the WAL. Default
    /// [`ReplayPublish::InBackground`].
    pub replay_publish: ReplayPublish,
    /// How flushed SSTables' data files are encoded. Default
    /// [`SsTableCompression::Off`]: flushes take far less CPU from the
    /// write path; SSTables of compressible rows are larger until the
    /// compactor rewrites them into the (compressed) base table.
    pub sstable_compression: SsTableCompression,
    /// How long a put waits for room under backpressure before failing
    /// with [`Error::Backpressure`]. Default 30 s.
    pub backpressure_timeout: Duration,
    /// Upper bound on how long [`crate::ShardWriter::close`] spends
    /// flushing and draining before it stops anyway (rows not yet
    /// published stay in the WAL for the next writer). While closing,
    /// failed SSTable writes and publishes get at most
    /// `flush_retry.max_attempts` attempts. Default 60 s.
    pub close_timeout: Duration,
    /// A producer (of puts with a [`crate::ProducerSeq`]) that wrote
    /// nothing to the shard for this long is forgotten at the next
    /// checkpoint: a retry of its sequences after that is written again.
    /// Default 7 days.
    pub producer_expiry: Duration,
    /// Producers a shard keeps at most: a put of a producer not known at
    /// the shard while this many are is refused
    /// ([`crate::Error::ProducerRefused`]; idle ones expire after
    /// `producer_expiry`). Bounds the memory and the checkpoint size the
    /// producers take. Default 100,000.
    pub producer_limit: usize,
    /// Write stalls (`stall.rs`): once this many published SSTables of the
    /// shard are not yet covered by the base table, each put waits before
    /// it is admitted, up to `stall_max_delay` at `stall_stop_sstables`.
    /// 0: no slowdown. Default 32.
    pub stall_slowdown_sstables: usize,
    /// ... and at this many, puts are refused ([`crate::Error::Backpressure`],
    /// nothing written) until the compactor catches up. 0: never refused.
    /// Default 96; when both are set, above `stall_slowdown_sstables`.
    pub stall_stop_sstables: usize,
    /// The longest wait a slowdown puts on one put. Default 100 ms.
    pub stall_max_delay: Duration,
}

impl Default for ShardWriterConfig {
    fn default() -> Self {
        Self {
            sharding: None,
            use_table_defaults: true,
            create_if_missing: true,
            memtable_max_bytes: 64 << 20,
            memtable_max_rows: 1_000_000,
            max_unflushed_age: Some(Duration::from_secs(60)),
            max_unflushed_bytes: 256 << 20,
            wal_max_entry_bytes: 16 << 20,
            flush_concurrency: 2,
            retry: RetryPolicy::default(),
            flush_retry: RetryPolicy {
                max_attempts: 8,
                initial_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(10),
            },
            backpressure_timeout: Duration::from_secs(30),
            close_timeout: Duration::from_secs(60),
            producer_expiry: Duration::from_secs(7 * 24 * 3600),
            producer_limit: 100_000,
            stall_slowdown_sstables: 32,
            stall_stop_sstables: 96,
            stall_max_delay: Duration::from_millis(100),
            replay_publish: ReplayPublish::InBackground,
            sstable_compression: SsTableCompression::Off,
        }
    }
}

/// What `open` waits for after reading the WAL. Either way every replayed
/// generation is published in generation order before any generation
/// written after `open`, and a generation that cannot be written while
/// `open` runs fails it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplayPublish {
    /// Ready once the WAL has been read: the replayed generations are
    /// written and published in the background (readable through
    /// `unflushed_batches`, counted against `max_unflushed_bytes`, waited
    /// for by `flush` and `close`); `open` waits only while the replayed
    /// generations not yet published hold more than `max_unflushed_bytes`.
    #[default]
    InBackground,
    /// Ready once every replayed generation is published (the manifest
    /// lists its SSTable when `open` returns).
    BeforeOpenReturns,
}

impl ShardWriterConfig {
    /// Checks the settings; [`Error::InvalidInput`] names the first bad one.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(Error::invalid(format!("config: {reason}")));
        if self.memtable_max_bytes == 0 {
            return bad("memtable_max_bytes must be > 0".into());
        }
        if self.memtable_max_rows == 0 {
            return bad("memtable_max_rows must be > 0".into());
        }
        if self.memtable_max_rows > memwal_memtable::MAX_ROWS {
            return bad(format!(
                "memtable_max_rows {} exceeds the memtable limit {}",
                self.memtable_max_rows,
                memwal_memtable::MAX_ROWS
            ));
        }
        if self.max_unflushed_bytes < self.memtable_max_bytes {
            return bad(format!(
                "max_unflushed_bytes ({}) must be >= memtable_max_bytes ({})",
                self.max_unflushed_bytes, self.memtable_max_bytes
            ));
        }
        if self.wal_max_entry_bytes == 0 {
            return bad("wal_max_entry_bytes must be > 0".into());
        }
        if self.flush_concurrency == 0 {
            return bad("flush_concurrency must be >= 1".into());
        }
        if self.producer_expiry.is_zero() {
            return bad("producer_expiry must be > 0".into());
        }
        if self.producer_limit == 0 {
            return bad("producer_limit must be >= 1".into());
        }
        if self.close_timeout.is_zero() {
            return bad("close_timeout must be > 0".into());
        }
        if self.stall_slowdown_sstables > 0
            && self.stall_stop_sstables > 0
            && self.stall_stop_sstables <= self.stall_slowdown_sstables
        {
            return bad(format!(
                "stall_stop_sstables ({}) must be above stall_slowdown_sstables ({}) (or 0)",
                self.stall_stop_sstables, self.stall_slowdown_sstables
            ));
        }
        if self.max_unflushed_age == Some(Duration::ZERO) {
            return bad("max_unflushed_age must be > 0 (or None)".into());
        }
        if let Some(ShardingConfig {
            spec: Some(spec), ..
        }) = &self.sharding
        {
            if spec.spec_id == 0 {
                return bad("a sharding spec has spec_id >= 1 (0 is a manual shard)".into());
            }
        }
        Ok(())
    }
}
