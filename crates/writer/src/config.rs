//! Writer configuration and its validation.

use std::time::Duration;

use memwal_fencing::ShardIdentity;
use memwal_proto::ShardingSpec;
use memwal_store::RetryPolicy;

use crate::{Error, Result};

/// The sharding spec a shard belongs to and the shard's identity under it.
///
/// Every row written is checked against it (`ShardRouter::check_batch`):
/// a row that maps to another shard is refused with
/// [`Error::InvalidInput`]. `identity.spec_id` must equal `spec.spec_id`
/// and `identity` must hold a value for every field of the spec.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardingConfig {
    /// The table's sharding spec (spec_id >= 1).
    pub spec: ShardingSpec,
    /// This shard's field values under it.
    pub identity: ShardIdentity,
}

/// Settings of a [`crate::ShardWriter`]. [`Default`] gives the documented
/// defaults; [`ShardWriterConfig::validate`] is run by `open` before
/// anything is touched in storage.
#[derive(Debug, Clone)]
pub struct ShardWriterConfig {
    /// `None` (default): a manual shard (spec 0, no field values), rows are
    /// not routed. `Some`: a shard of a sharding spec; rows are checked.
    pub sharding: Option<ShardingConfig>,
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
    /// Backoff between attempts of a failed SSTable write or publish
    /// (retried until it succeeds, the writer is fenced or it is closed).
    /// `max_attempts` bounds the attempts only while `open` flushes
    /// replayed data (open then fails with the last error).
    pub flush_retry: RetryPolicy,
    /// How long a put waits for room under backpressure before failing
    /// with [`Error::Backpressure`]. Default 30 s.
    pub backpressure_timeout: Duration,
}

impl Default for ShardWriterConfig {
    fn default() -> Self {
        Self {
            sharding: None,
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
        }
    }
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
        if self.max_unflushed_age == Some(Duration::ZERO) {
            return bad("max_unflushed_age must be > 0 (or None)".into());
        }
        if let Some(s) = &self.sharding {
            if s.spec.spec_id == 0 {
                return bad("a sharding spec has spec_id >= 1 (0 is a manual shard)".into());
            }
            if s.identity.spec_id != s.spec.spec_id {
                return bad(format!(
                    "shard identity has spec_id {}, the spec is {}",
                    s.identity.spec_id, s.spec.spec_id
                ));
            }
            for f in &s.spec.fields {
                if !s.identity.field_values.contains_key(&f.field_id) {
                    return bad(format!(
                        "shard identity has no value for shard field `{}`",
                        f.field_id
                    ));
                }
            }
        }
        Ok(())
    }

    /// The identity the shard is created with / must have.
    pub(crate) fn identity(&self) -> ShardIdentity {
        self.sharding
            .as_ref()
            .map(|s| s.identity.clone())
            .unwrap_or_else(ShardIdentity::manual)
    }
}
