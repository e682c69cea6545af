//! What the base table decides: the sharding spec and this shard's field
//! values (from the `__lance_mem_wal` index and the shard's manifest), and
//! the writer defaults the index records.

use std::collections::BTreeMap;
use std::time::Duration;

use memwal_fencing::{ShardId, ShardIdentity, ShardManifest};
use memwal_memtable::TableSchema;
use memwal_proto::ShardingSpec;
use memwal_sharding::ShardRouter;
use memwal_table::BaseTable;

use crate::config::ShardWriterConfig;
use crate::{Error, Result};

/// The sharding a writer works under, resolved against the table and the
/// shard's stored manifest.
pub(crate) struct ResolvedSharding {
    /// What the shard is created with when missing (and must have).
    pub identity: ShardIdentity,
    /// The router and the values every row must map to; `None` for a
    /// manual shard (rows are not routed).
    pub router: Option<Routing>,
}

/// The check every row of a shard passes: the table's sharding spec
/// compiled against one version of the table's schema, and the shard
/// field values its rows must map to.
pub(crate) struct Routing {
    pub spec: ShardingSpec,
    pub router: ShardRouter,
    pub values: BTreeMap<String, Vec<u8>>,
}

impl Routing {
    /// The same spec and values compiled against `schema` (a later
    /// version of the table's schema): refused when the spec's columns
    /// are gone or no longer key columns.
    pub(crate) fn for_schema(&self, schema: &TableSchema) -> Result<Self> {
        let router =
            ShardRouter::new(&self.spec, schema.table_schema()).map_err(Error::from_sharding)?;
        check_sources_are_keys(&router, schema)?;
        Ok(Self {
            spec: self.spec.clone(),
            router,
            values: self.values.clone(),
        })
    }

    /// Refuses a storage batch holding a row of another shard.
    pub(crate) fn check(&self, storage: &arrow_array::RecordBatch) -> Result<()> {
        self.router
            .check_batch(storage, &self.values)
            .map_err(Error::from_sharding)
    }
}

/// Resolves the spec and this shard's field values. Refuses (with
/// [`Error::InvalidInput`]) a config that contradicts the table, a shard
/// of another spec or with other values, a spec reading non-key columns
/// of a keyed table, and a shard whose values nobody gives.
pub(crate) fn resolve_sharding(
    config: &ShardWriterConfig,
    table: &BaseTable,
    schema: &TableSchema,
    shard: ShardId,
    existing: Option<&ShardManifest>,
) -> Result<ResolvedSharding> {
    let given = config.sharding.clone().unwrap_or_default();
    let table_spec = table
        .sharding_spec()
        .map_err(|e| Error::invalid(e.to_string()))?;
    let spec: Option<ShardingSpec> = match (&table.mem_wal, table_spec, given.spec) {
        (None, _, spec) => spec,
        (Some(_), None, None) => None,
        (Some(_), None, Some(s)) => {
            return Err(Error::invalid(format!(
                "the config gives sharding spec {}, but the table's MemWAL index declares \
                 manual sharding (no spec)",
                s.spec_id
            )))
        }
        (Some(_), Some(t), None) => Some(t.clone()),
        (Some(_), Some(t), Some(s)) if &s == t => Some(s),
        (Some(_), Some(t), Some(s)) => {
            return Err(Error::invalid(format!(
                "the config's sharding spec {s:?} contradicts the table's MemWAL index spec {t:?}"
            )))
        }
    };
    let stored = existing.map(ShardIdentity::of_manifest);
    let Some(spec) = spec else {
        if !given.field_values.is_empty() {
            return Err(Error::invalid(format!(
                "the config gives shard field values {:?} but the table has no sharding spec",
                given.field_values
            )));
        }
        if let Some(s) = &stored {
            if s.spec_id != 0 {
                return Err(Error::invalid(format!(
                    "shard {shard} belongs to sharding spec {}, but the table has none (manual shards)",
                    s.spec_id
                )));
            }
        }
        return Ok(ResolvedSharding {
            identity: ShardIdentity::manual(),
            router: None,
        });
    };
    if spec.spec_id == 0 {
        return Err(Error::invalid(
            "a sharding spec has spec_id >= 1 (0 is a manual shard)".to_string(),
        ));
    }
    let router = ShardRouter::new(&spec, schema.table_schema()).map_err(Error::from_sharding)?;
    check_sources_are_keys(&router, schema)?;
    let constant = router.constant_values();
    // Upstream records no field values for the shards it creates itself
    // (and none for `unsharded`), so an empty record means "not recorded".
    let recorded = match &stored {
        Some(s) if s.spec_id != spec.spec_id => {
            return Err(Error::invalid(format!(
                "shard {shard} belongs to sharding spec {}, the table's is {}",
                s.spec_id, spec.spec_id
            )))
        }
        Some(s) if !s.field_values.is_empty() => Some(s.field_values.clone()),
        _ => None,
    };
    let given_values = (!given.field_values.is_empty()).then_some(given.field_values);
    let values = match (recorded, given_values) {
        (Some(r), Some(g)) if r != g => {
            return Err(Error::invalid(format!(
                "shard {shard} records field values {r:?}, the config gives {g:?}"
            )))
        }
        (Some(v), _) | (None, Some(v)) => v,
        (None, None) => constant.clone().ok_or_else(|| {
            Error::invalid(format!(
                "shard {shard} records no shard field values and the config gives none: \
                 say which shard it is (ShardingConfig::with_values, e.g. its bucket)"
            ))
        })?,
    };
    for id in router.field_ids() {
        if !values.contains_key(id) {
            return Err(Error::invalid(format!(
                "shard field values {values:?} lack shard field `{id}` of spec {}",
                spec.spec_id
            )));
        }
    }
    if let Some(extra) = values
        .keys()
        .find(|k| !router.field_ids().any(|id| id == *k))
    {
        return Err(Error::invalid(format!(
            "shard field `{extra}` is not a field of sharding spec {}",
            spec.spec_id
        )));
    }
    if let Some(c) = &constant {
        if c != &values {
            return Err(Error::invalid(format!(
                "spec {} has one shard with field values {c:?}, not {values:?}",
                spec.spec_id
            )));
        }
    }
    let identity = match &stored {
        // Keep what is stored (the claim checks it is unchanged).
        Some(s) => s.clone(),
        // Upstream writes no field entries for a spec with one shard.
        None if constant.is_some() => ShardIdentity {
            spec_id: spec.spec_id,
            field_values: BTreeMap::new(),
        },
        None => ShardIdentity {
            spec_id: spec.spec_id,
            field_values: values.clone(),
        },
    };
    Ok(ResolvedSharding {
        identity,
        router: Some(Routing {
            spec,
            router,
            values,
        }),
    })
}

/// Every primary key must map to one shard, and a delete carries only its
/// key: a keyed table may shard only by key columns.
fn check_sources_are_keys(router: &ShardRouter, schema: &TableSchema) -> Result<()> {
    if !schema.has_primary_key() {
        return Ok(());
    }
    let keys = schema.key_names();
    for column in router.source_columns() {
        if !keys.contains(&column) {
            return Err(Error::invalid(format!(
                "sharding spec {} reads column `{column}`, which is not a primary-key column \
                 (keys: {keys:?}): one key could land in two shards and deletes could not be routed",
                router.spec_id()
            )));
        }
    }
    Ok(())
}

impl ShardWriterConfig {
    /// `self` with the table's `writer_config_defaults` applied to every
    /// setting still at its built-in default (when `use_table_defaults`).
    ///
    /// Keys (upstream lance's names) and what they set:
    ///
    /// | key | setting |
    /// |---|---|
    /// | `max_memtable_size` | `memtable_max_bytes` |
    /// | `max_memtable_rows` | `memtable_max_rows` |
    /// | `max_unflushed_memtable_bytes` | `max_unflushed_bytes` |
    /// | `max_wal_buffer_size` | `wal_max_entry_bytes` |
    /// | `max_wal_persist_retries` | `retry.max_attempts` (= retries + 1) |
    /// | `wal_persist_retry_base_delay_ms` | `retry.initial_backoff` |
    /// | `memwal.max_unflushed_age_ms` | `max_unflushed_age` (0 = off) |
    /// | `memwal.flush_concurrency` | `flush_concurrency` |
    /// | `memwal.backpressure_timeout_ms` | `backpressure_timeout` |
    ///
    /// Keys without an equivalent are ignored (logged at debug):
    /// `durable_write` (memwal is always durable), `max_wal_flush_interval_ms`
    /// (group commit needs no timer), `enable_memtable`,
    /// `max_memtable_batches`, `manifest_scan_batch_size`,
    /// `backpressure_log_interval_ms`, `stats_log_interval_ms`, `hnsw.*`.
    /// A value that does not parse is [`Error::InvalidInput`] naming the key.
    pub fn apply_table_defaults<'a>(
        &self,
        defaults: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self> {
        let mut out = self.clone();
        if !self.use_table_defaults {
            return Ok(out);
        }
        let base = Self::default();
        for (key, value) in defaults {
            let num = || -> Result<u64> {
                value.trim().parse::<u64>().map_err(|_| {
                    Error::invalid(format!(
                        "table writer default `{key}` = `{value}` is not a non-negative integer"
                    ))
                })
            };
            let size = || -> Result<usize> {
                usize::try_from(num()?).map_err(|_| {
                    Error::invalid(format!(
                        "table writer default `{key}` = `{value}` is too large"
                    ))
                })
            };
            let millis = || num().map(Duration::from_millis);
            match key {
                "max_memtable_size" if self.memtable_max_bytes == base.memtable_max_bytes => {
                    out.memtable_max_bytes = size()?
                }
                "max_memtable_rows" if self.memtable_max_rows == base.memtable_max_rows => {
                    out.memtable_max_rows = size()?
                }
                "max_unflushed_memtable_bytes"
                    if self.max_unflushed_bytes == base.max_unflushed_bytes =>
                {
                    out.max_unflushed_bytes = size()?
                }
                "max_wal_buffer_size" if self.wal_max_entry_bytes == base.wal_max_entry_bytes => {
                    out.wal_max_entry_bytes = size()?
                }
                "max_wal_persist_retries" if self.retry.max_attempts == base.retry.max_attempts => {
                    out.retry.max_attempts = u32::try_from(num()?)
                        .ok()
                        .and_then(|r| r.checked_add(1))
                        .ok_or_else(|| {
                            Error::invalid(format!(
                                "table writer default `{key}` = `{value}` is too large"
                            ))
                        })?
                }
                "wal_persist_retry_base_delay_ms"
                    if self.retry.initial_backoff == base.retry.initial_backoff =>
                {
                    out.retry.initial_backoff = millis()?
                }
                "memwal.max_unflushed_age_ms"
                    if self.max_unflushed_age == base.max_unflushed_age =>
                {
                    let d = millis()?;
                    out.max_unflushed_age = (!d.is_zero()).then_some(d);
                }
                "memwal.flush_concurrency" if self.flush_concurrency == base.flush_concurrency => {
                    out.flush_concurrency = size()?
                }
                "memwal.backpressure_timeout_ms"
                    if self.backpressure_timeout == base.backpressure_timeout =>
                {
                    out.backpressure_timeout = millis()?
                }
                "max_memtable_size"
                | "max_memtable_rows"
                | "max_unflushed_memtable_bytes"
                | "max_wal_buffer_size"
                | "max_wal_persist_retries"
                | "wal_persist_retry_base_delay_ms"
                | "memwal.max_unflushed_age_ms"
                | "memwal.flush_concurrency"
                | "memwal.backpressure_timeout_ms" => {
                    tracing::debug!(key, value, "table writer default overridden by the config");
                }
                _ => tracing::debug!(
                    key,
                    value,
                    "table writer default has no memwal equivalent; ignored"
                ),
            }
        }
        out.validate().map_err(|e| match e {
            Error::InvalidInput { reason, source } => Error::InvalidInput {
                reason: format!("{reason} (after applying the table's writer_config_defaults)"),
                source,
            },
            e => e,
        })?;
        Ok(out)
    }
}
