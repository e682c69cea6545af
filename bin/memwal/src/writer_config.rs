//! The `[writer]` section of `memwal serve`'s settings: every
//! [`ShardWriterConfig`] setting a daemon can honour, applied to each shard
//! writer it opens.
//!
//! A key left unset keeps the writer's built-in default, which the table's
//! `writer_config_defaults` (in its MemWAL index) may override; a key that
//! is set always wins. Settings the daemon decides itself are not here:
//! sharding (the table's spec) and `create_if_missing` (a daemon creates
//! the shards rows are routed to).

use std::time::Duration;

use memwal::{ReplayPublish, ShardWriterConfig, SsTableCompression};
use serde::{Deserialize, Serialize};

/// The `[writer]` keys (file), `MEMWAL_WRITER_<KEY>` (environment) and
/// `--writer KEY=VALUE` (flags).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WriterSettings {
    /// Freeze (and flush) the active memtable at this many MiB. Default 64.
    pub memtable_max_mib: Option<usize>,
    /// ... or at this many rows. Default 1,000,000.
    pub memtable_max_rows: Option<usize>,
    /// ... or when its oldest row is this many seconds old (0: never).
    /// Default 60.
    pub max_unflushed_age_secs: Option<u64>,
    /// Puts wait (backpressure) while unflushed memtables hold this many
    /// MiB; at least `memtable_max_mib`. Default 256.
    pub max_unflushed_mib: Option<usize>,
    /// A put waiting for room fails (RESOURCE_EXHAUSTED) after this many
    /// seconds. Default 30.
    pub backpressure_timeout_secs: Option<u64>,
    /// Batch bytes one WAL entry groups, in MiB. Default 16.
    pub wal_max_entry_mib: Option<usize>,
    /// SSTable writes running at once. Default 2.
    pub flush_concurrency: Option<usize>,
    /// `off` (default: no compression, least flush CPU) or `lance`
    /// (lance's encodings: smaller SSTables, more flush CPU).
    pub sstable_compression: Option<Compression>,
    /// Shutdown spends at most this many seconds per shard flushing before
    /// it stops anyway (the rest stays in the WAL). Default 60.
    pub close_timeout_secs: Option<u64>,
    /// Tries per object-store request (manifest, WAL). Default 6.
    pub store_retry_attempts: Option<u32>,
    /// Tries of an SSTable write or publish while opening or closing.
    /// Default 8.
    pub flush_retry_attempts: Option<u32>,
    /// `background` (default: a shard serves once its WAL is read) or
    /// `before_open` (once every replayed generation is published).
    pub replay_publish: Option<Replay>,
    /// Let the table's `writer_config_defaults` fill the keys left unset.
    /// Default true.
    pub use_table_defaults: Option<bool>,
    /// An idempotent producer that wrote nothing to a shard for this many
    /// hours is forgotten there (a retry of its sequences after that is
    /// written again). Default 168 (7 days).
    pub producer_expiry_hours: Option<u64>,
    /// Idempotent producers a shard keeps at most; a new one past it is
    /// refused (FAILED_PRECONDITION) until idle ones expire. Default 100000.
    pub producer_limit: Option<usize>,
    /// Once this many published SSTables of a shard wait for compaction,
    /// its puts are slowed (0: never). Default 32.
    pub stall_slowdown_sstables: Option<usize>,
    /// ... and at this many refused with RESOURCE_EXHAUSTED until the
    /// compactor catches up (0: never). Default 96.
    pub stall_stop_sstables: Option<usize>,
    /// The longest wait a slowdown puts on one put, in ms. Default 100.
    pub stall_max_delay_ms: Option<u64>,
}

/// `sstable_compression` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    Off,
    Lance,
}

/// `replay_publish` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Replay {
    Background,
    BeforeOpen,
}

const MIB: usize = 1 << 20;

impl WriterSettings {
    /// The writer configuration these settings give; an invalid value is
    /// an error naming its `writer.` key.
    pub fn to_config(&self) -> Result<ShardWriterConfig, String> {
        for (key, zero) in [
            ("memtable_max_mib", self.memtable_max_mib == Some(0)),
            ("memtable_max_rows", self.memtable_max_rows == Some(0)),
            ("max_unflushed_mib", self.max_unflushed_mib == Some(0)),
            ("wal_max_entry_mib", self.wal_max_entry_mib == Some(0)),
            ("flush_concurrency", self.flush_concurrency == Some(0)),
            ("close_timeout_secs", self.close_timeout_secs == Some(0)),
            ("store_retry_attempts", self.store_retry_attempts == Some(0)),
            ("flush_retry_attempts", self.flush_retry_attempts == Some(0)),
            (
                "producer_expiry_hours",
                self.producer_expiry_hours == Some(0),
            ),
        ] {
            if zero {
                return Err(format!("writer.{key} must be at least 1"));
            }
        }
        let mib = |key: &str, v: usize| {
            v.checked_mul(MIB)
                .ok_or_else(|| format!("writer.{key}: {v} MiB is too large"))
        };
        let mut c = ShardWriterConfig::default();
        if let Some(v) = self.memtable_max_mib {
            c.memtable_max_bytes = mib("memtable_max_mib", v)?;
        }
        if let Some(v) = self.memtable_max_rows {
            c.memtable_max_rows = v;
        }
        if let Some(v) = self.max_unflushed_age_secs {
            c.max_unflushed_age = (v > 0).then(|| Duration::from_secs(v));
        }
        if let Some(v) = self.max_unflushed_mib {
            c.max_unflushed_bytes = mib("max_unflushed_mib", v)?;
        }
        if let Some(v) = self.backpressure_timeout_secs {
            c.backpressure_timeout = Duration::from_secs(v);
        }
        if let Some(v) = self.wal_max_entry_mib {
            c.wal_max_entry_bytes = mib("wal_max_entry_mib", v)?;
        }
        if let Some(v) = self.flush_concurrency {
            c.flush_concurrency = v;
        }
        if let Some(v) = self.sstable_compression {
            c.sstable_compression = match v {
                Compression::Off => SsTableCompression::Off,
                Compression::Lance => SsTableCompression::Lance,
            };
        }
        if let Some(v) = self.close_timeout_secs {
            c.close_timeout = Duration::from_secs(v);
        }
        if let Some(v) = self.store_retry_attempts {
            c.retry.max_attempts = v;
        }
        if let Some(v) = self.flush_retry_attempts {
            c.flush_retry.max_attempts = v;
        }
        if let Some(v) = self.replay_publish {
            c.replay_publish = match v {
                Replay::Background => ReplayPublish::InBackground,
                Replay::BeforeOpen => ReplayPublish::BeforeOpenReturns,
            };
        }
        if let Some(v) = self.producer_expiry_hours {
            c.producer_expiry = v
                .checked_mul(3600)
                .map(Duration::from_secs)
                .ok_or_else(|| format!("writer.producer_expiry_hours: {v} is too large"))?;
        }
        if let Some(v) = self.producer_limit {
            c.producer_limit = v;
        }
        if let Some(v) = self.use_table_defaults {
            c.use_table_defaults = v;
        }
        if let Some(v) = self.stall_slowdown_sstables {
            c.stall_slowdown_sstables = v;
        }
        if let Some(v) = self.stall_stop_sstables {
            c.stall_stop_sstables = v;
        }
        if let Some(v) = self.stall_max_delay_ms {
            c.stall_max_delay = Duration::from_millis(v);
        }
        c.validate().map_err(|e| format!("writer: {e}"))?;
        Ok(c)
    }

    /// Every key, with the built-in default where unset (what
    /// `--print-config` shows; the table's `writer_config_defaults` may
    /// still replace the unset ones when a shard opens).
    pub fn filled(&self) -> Self {
        let d = ShardWriterConfig::default();
        Self {
            memtable_max_mib: self.memtable_max_mib.or(Some(d.memtable_max_bytes / MIB)),
            memtable_max_rows: self.memtable_max_rows.or(Some(d.memtable_max_rows)),
            max_unflushed_age_secs: self
                .max_unflushed_age_secs
                .or(Some(d.max_unflushed_age.map_or(0, |a| a.as_secs()))),
            max_unflushed_mib: self.max_unflushed_mib.or(Some(d.max_unflushed_bytes / MIB)),
            backpressure_timeout_secs: self
                .backpressure_timeout_secs
                .or(Some(d.backpressure_timeout.as_secs())),
            wal_max_entry_mib: self.wal_max_entry_mib.or(Some(d.wal_max_entry_bytes / MIB)),
            flush_concurrency: self.flush_concurrency.or(Some(d.flush_concurrency)),
            sstable_compression: self
                .sstable_compression
                .or(Some(match d.sstable_compression {
                    SsTableCompression::Off => Compression::Off,
                    SsTableCompression::Lance => Compression::Lance,
                })),
            close_timeout_secs: self.close_timeout_secs.or(Some(d.close_timeout.as_secs())),
            store_retry_attempts: self.store_retry_attempts.or(Some(d.retry.max_attempts)),
            flush_retry_attempts: self
                .flush_retry_attempts
                .or(Some(d.flush_retry.max_attempts)),
            replay_publish: self.replay_publish.or(Some(match d.replay_publish {
                ReplayPublish::InBackground => Replay::Background,
                ReplayPublish::BeforeOpenReturns => Replay::BeforeOpen,
            })),
            use_table_defaults: self.use_table_defaults.or(Some(d.use_table_defaults)),
            producer_expiry_hours: self
                .producer_expiry_hours
                .or(Some(d.producer_expiry.as_secs() / 3600)),
            producer_limit: self.producer_limit.or(Some(d.producer_limit)),
            stall_slowdown_sstables: self
                .stall_slowdown_sstables
                .or(Some(d.stall_slowdown_sstables)),
            stall_stop_sstables: self.stall_stop_sstables.or(Some(d.stall_stop_sstables)),
            stall_max_delay_ms: self
                .stall_max_delay_ms
                .or(Some(d.stall_max_delay.as_millis() as u64)),
        }
    }
}

/// Parses `--writer KEY=VALUE` into a settings layer entry; VALUE is read
/// as a TOML value (`64`, `true`, `lance`), a bare word as a string.
pub fn parse_flag(flag: &str) -> Result<(String, serde_json::Value), String> {
    let (key, value) = flag
        .split_once('=')
        .filter(|(k, v)| !k.trim().is_empty() && !v.trim().is_empty())
        .ok_or_else(|| format!("--writer `{flag}`: expected KEY=VALUE"))?;
    let value = value.trim();
    let json = match value.parse::<u64>() {
        Ok(n) => n.into(),
        Err(_) => match value {
            "true" => true.into(),
            "false" => false.into(),
            s => s.trim_matches('"').into(),
        },
    };
    Ok((key.trim().to_string(), json))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Breaks if a key is not applied, or a bad value is accepted or its
    // error does not name the key.
    #[test]
    fn settings_apply_and_bad_values_are_named() {
        let s = WriterSettings {
            memtable_max_mib: Some(8),
            max_unflushed_mib: Some(32),
            max_unflushed_age_secs: Some(0),
            flush_concurrency: Some(3),
            sstable_compression: Some(Compression::Lance),
            close_timeout_secs: Some(5),
            replay_publish: Some(Replay::BeforeOpen),
            ..Default::default()
        };
        let c = s.to_config().unwrap();
        assert_eq!(c.memtable_max_bytes, 8 << 20);
        assert_eq!(c.max_unflushed_bytes, 32 << 20);
        assert_eq!(c.max_unflushed_age, None);
        assert_eq!(c.flush_concurrency, 3);
        assert_eq!(c.sstable_compression, SsTableCompression::Lance);
        assert_eq!(c.close_timeout, Duration::from_secs(5));
        assert_eq!(c.replay_publish, ReplayPublish::BeforeOpenReturns);
        assert_eq!(
            format!("{:?}", WriterSettings::default().to_config().unwrap()),
            format!("{:?}", ShardWriterConfig::default()),
            "nothing set: the writer's defaults"
        );
        let e = WriterSettings {
            flush_concurrency: Some(0),
            ..Default::default()
        }
        .to_config()
        .unwrap_err();
        assert!(e.contains("writer.flush_concurrency"), "{e}");
        let e = WriterSettings {
            memtable_max_mib: Some(512),
            ..Default::default()
        }
        .to_config()
        .unwrap_err();
        assert!(e.contains("max_unflushed_bytes"), "{e}");
        assert_eq!(
            parse_flag("flush_concurrency=4").unwrap(),
            ("flush_concurrency".into(), 4.into())
        );
        assert!(parse_flag("flush_concurrency").is_err());
    }
}
