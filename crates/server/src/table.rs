//! One served table: its shards' writers, and puts split by the table's
//! sharding spec and acknowledged once every part is durable.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use memwal::{ShardId, ShardWriter, ShardWriterConfig, ShardingConfig, StoreLocation};
use memwal_fencing::ShardIdentity;
use memwal_sharding::ShardRouter;
use memwal_sstable::LanceStore;
use memwal_store::RetryPolicy;
use memwal_table::BaseTable;
use serde::Serialize;

use crate::ServerError;

/// Shard field values identifying a shard under the table's spec.
pub type ShardKey = BTreeMap<String, Vec<u8>>;

/// A shard this daemon serves, served until another writer took it, or
/// could not open because its stored state is corrupt.
enum Slot {
    Live(Arc<ShardWriter>),
    Lost {
        shard: ShardId,
        reason: String,
    },
    /// Refuses its rows with `error` (naming the object) until the daemon
    /// is restarted; the table's other shards keep serving.
    Failed {
        shard: ShardId,
        error: memwal::Error,
    },
}

/// What one part of a put reached.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PartAck {
    /// The shard.
    pub shard: String,
    /// Rows of the part.
    pub rows: usize,
    /// The WAL position holding them.
    pub wal_position: u64,
}

/// One shard in `/status`.
#[derive(Debug, Clone, Serialize)]
pub struct ShardStatus {
    /// The shard id.
    pub shard: String,
    /// Its shard field values (hex).
    pub values: BTreeMap<String, String>,
    /// `serving`, `lost` (to another writer) or `failed` (corrupt stored
    /// state: see `last_error`).
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
        }
    }
}

/// A table the daemon serves.
pub struct TableHost {
    name: String,
    loc: StoreLocation,
    schema: SchemaRef,
    key_schema: SchemaRef,
    /// Validates whole batches before they are split (a bad row must fail
    /// the batch, not only its shard's part).
    validator: memwal_memtable::TableSchema,
    spec_id: u32,
    /// `None` for an unsharded table (one shard, no routing).
    router: Option<(ShardRouter, ShardRouter)>,
    config: ShardWriterConfig,
    /// The shards this daemon may claim (`None`: all of them).
    owned: Option<Owned>,
    /// Every shard key the spec can produce, when it can be enumerated (an
    /// unsharded table, one bucket field): how a shard whose manifest does
    /// not decode is tied to its rows.
    enumerable: Option<Vec<ShardKey>>,
    shards: tokio::sync::Mutex<HashMap<ShardKey, Slot>>,
    /// The table's compactor, when the daemon runs one (status only).
    compactor: std::sync::OnceLock<memwal_compactor::Compactor>,
}

/// A configured subset of a bucket-sharded table's shards.
struct Owned {
    keys: std::collections::BTreeSet<ShardKey>,
    /// The owned bucket numbers (sorted), for messages.
    buckets: Vec<u32>,
}

/// The bucket count of a one-field `bucket` spec.
fn num_buckets(spec: &memwal_proto::ShardingSpec) -> Result<u32, String> {
    let [field] = spec.fields.as_slice() else {
        return Err(format!(
            "a shard subset names buckets; this table's spec has {} fields",
            spec.fields.len()
        ));
    };
    if field.transform.as_deref() != Some("bucket") {
        return Err(format!(
            "a shard subset names buckets; this table is sharded by `{}`",
            field.transform.as_deref().unwrap_or("an expression")
        ));
    }
    field
        .parameters
        .get("num_buckets")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| "the bucket spec has no valid `num_buckets`".to_string())
}

/// The shard keys of `buckets` under a one-field `bucket` spec.
fn bucket_keys(spec: &memwal_proto::ShardingSpec, buckets: &[u32]) -> Result<Owned, String> {
    let n = num_buckets(spec)?;
    let field = &spec.fields[0];
    if let Some(b) = buckets.iter().find(|&&b| b >= n) {
        return Err(format!("bucket {b} does not exist (the table has {n})"));
    }
    let mut sorted = buckets.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    Ok(Owned {
        keys: sorted
            .iter()
            .map(|&b| [(field.field_id.clone(), (b as i32).to_le_bytes().to_vec())].into())
            .collect(),
        buckets: sorted,
    })
}

impl std::fmt::Debug for TableHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableHost")
            .field("name", &self.name)
            .field("uri", &self.loc.uri)
            .finish_non_exhaustive()
    }
}

/// A manifest that was read but does not decode (not a storage failure).
fn is_corrupt(e: &memwal_compactor::CompactorError) -> bool {
    matches!(
        e,
        memwal_compactor::CompactorError::Manifest { source, .. }
            if matches!(**source, memwal_fencing::FencingError::Corrupt { .. })
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl TableHost {
    /// Opens the table `name` at `loc`: reads its MemWAL configuration and
    /// claims (and replays) every existing shard of its spec. A table without
    /// the `__lance_mem_wal` index or with manual sharding is refused.
    pub async fn open(
        name: &str,
        loc: StoreLocation,
        config: ShardWriterConfig,
    ) -> Result<Self, ServerError> {
        Self::open_buckets(name, loc, config, None).await
    }

    /// [`TableHost::open`], owning only the shards of `buckets` (a table
    /// sharded by one `bucket` field; `None`: every shard). Shards of other
    /// buckets are never claimed: rows routed to them are refused with
    /// [`ServerError::ServedElsewhere`]. Several daemons split a table this
    /// way; an overlap is safe (fencing), only wasteful.
    pub async fn open_buckets(
        name: &str,
        loc: StoreLocation,
        config: ShardWriterConfig,
        buckets: Option<&[u32]>,
    ) -> Result<Self, ServerError> {
        let setup = |reason: String| ServerError::Setup {
            table: name.to_string(),
            reason,
        };
        let lance = LanceStore::new(loc.store.clone());
        let base = BaseTable::load(&lance, &loc.root)
            .await
            .map_err(|e| setup(e.to_string()))?;
        let spec = base
            .sharding_spec()
            .map_err(|e| setup(e.to_string()))?
            .cloned()
            .ok_or_else(|| {
                setup("the table has no MemWAL sharding spec (create it with `memwal init`)".into())
            })?;
        let schema = base.schema.clone();
        let keys: Vec<usize> = schema
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| {
                f.metadata()
                    .contains_key("lance-schema:unenforced-primary-key")
            })
            .map(|(i, _)| i)
            .collect();
        let key_schema = Arc::new(schema.project(&keys).map_err(|e| setup(e.to_string()))?);
        let owned = buckets
            .map(|b| bucket_keys(&spec, b))
            .transpose()
            .map_err(setup)?;
        let router = ShardRouter::new(&spec, &schema).map_err(|e| setup(e.to_string()))?;
        let router = if router.constant_values().is_some() {
            None
        } else {
            let key_router =
                ShardRouter::new(&spec, &key_schema).map_err(|e| setup(e.to_string()))?;
            Some((router, key_router))
        };
        let validator =
            memwal_memtable::TableSchema::new(schema.clone()).map_err(|e| setup(e.to_string()))?;
        let enumerable = if router.is_none() {
            Some(vec![ShardKey::new()])
        } else {
            num_buckets(&spec)
                .ok()
                .and_then(|n| bucket_keys(&spec, &(0..n).collect::<Vec<_>>()).ok())
                .map(|o| o.keys.into_iter().collect())
        };
        let host = Self {
            name: name.to_string(),
            loc,
            schema,
            key_schema,
            validator,
            spec_id: spec.spec_id,
            router,
            config,
            owned,
            enumerable,
            shards: tokio::sync::Mutex::new(HashMap::new()),
            compactor: std::sync::OnceLock::new(),
        };
        host.open_existing().await?;
        Ok(host)
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The table's Arrow schema (what a put sends).
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The primary-key columns (what a delete sends).
    pub fn key_schema(&self) -> &SchemaRef {
        &self.key_schema
    }

    async fn open_existing(&self) -> Result<(), ServerError> {
        let shards = memwal_compactor::list_shards(&self.loc)
            .await
            .map_err(|e| self.setup(e.to_string()))?;
        let mut found: BTreeMap<ShardKey, ShardId> = BTreeMap::new();
        let mut failed: BTreeMap<ShardKey, Slot> = BTreeMap::new();
        for shard in shards {
            let m = match memwal_compactor::latest_manifest(
                &self.loc,
                shard,
                &RetryPolicy::default(),
            )
            .await
            {
                Ok(Some(m)) => m,
                Ok(None) => continue,
                Err(e @ memwal_compactor::CompactorError::Manifest { .. }) if is_corrupt(&e) => {
                    // Whose rows the shard holds is in the manifest that does
                    // not decode; a shard id derived from a known key ties it
                    // to them. Any other shard is refused with the table:
                    // serving its key from a new shard would split it.
                    let key = self
                        .enumerable
                        .iter()
                        .flatten()
                        .find(|k| ShardId::for_values(self.spec_id, k) == shard);
                    let Some(key) = key else {
                        return Err(self.setup(e.to_string()));
                    };
                    tracing::error!(table = %self.name, %shard, error = %e, "shard manifest corrupt; its rows are refused");
                    let error = memwal::Error::Corrupt {
                        reason: e.to_string(),
                    };
                    failed.insert(key.clone(), Slot::Failed { shard, error });
                    continue;
                }
                Err(e) => return Err(self.setup(e.to_string())),
            };
            let identity = ShardIdentity::of_manifest(&m);
            if identity.spec_id != self.spec_id {
                tracing::warn!(%shard, spec_id = identity.spec_id, "shard of another spec; not served");
                continue;
            }
            let key = self.key_of(identity.field_values);
            if self.owned.as_ref().is_some_and(|o| !o.keys.contains(&key)) {
                tracing::debug!(%shard, "shard outside this daemon's buckets; not claimed");
                continue;
            }
            if let Some(first) = found.get(&key) {
                tracing::warn!(%shard, kept = %first, "a second shard with the same values; not served");
                continue;
            }
            found.insert(key, shard);
        }
        let mut slots = self.shards.lock().await;
        slots.extend(failed);
        for (key, shard) in found {
            match self.open_writer(shard, &key).await {
                Ok(w) => slots.insert(key, Slot::Live(Arc::new(w))),
                // Corrupt stored state does not heal by retrying: refuse
                // this shard's rows, serve the rest.
                Err(ServerError::Writer {
                    source: error @ memwal::Error::Corrupt { .. },
                    ..
                }) => {
                    tracing::error!(table = %self.name, %shard, %error, "shard state corrupt; its rows are refused");
                    slots.insert(key, Slot::Failed { shard, error })
                }
                Err(e) => return Err(e),
            };
        }
        Ok(())
    }

    /// Unsharded tables have one shard whatever its manifest records.
    fn key_of(&self, values: ShardKey) -> ShardKey {
        if self.router.is_none() {
            ShardKey::new()
        } else {
            values
        }
    }

    fn setup(&self, reason: String) -> ServerError {
        ServerError::Setup {
            table: self.name.clone(),
            reason,
        }
    }

    async fn open_writer(
        &self,
        shard: ShardId,
        key: &ShardKey,
    ) -> Result<ShardWriter, ServerError> {
        let mut config = self.config.clone();
        if !key.is_empty() {
            config.sharding = Some(ShardingConfig::with_values(key.clone()));
        }
        ShardWriter::open(self.loc.clone(), shard, config)
            .await
            .map_err(|source| ServerError::Writer {
                table: self.name.clone(),
                shard: shard.to_string(),
                source,
            })
    }

    /// The writer of shard `key`, creating the shard on first use.
    async fn writer(&self, key: &ShardKey) -> Result<Arc<ShardWriter>, ServerError> {
        let mut slots = self.shards.lock().await;
        match slots.get(key) {
            Some(Slot::Live(w)) => return Ok(w.clone()),
            Some(Slot::Lost { shard, reason }) => {
                return Err(ServerError::ServedElsewhere {
                    table: self.name.clone(),
                    shard: shard.to_string(),
                    reason: reason.clone(),
                })
            }
            Some(Slot::Failed { shard, error }) => {
                return Err(ServerError::Writer {
                    table: self.name.clone(),
                    shard: shard.to_string(),
                    source: error.clone(),
                })
            }
            None => {}
        }
        if let Some(owned) = &self.owned {
            if !owned.keys.contains(key) {
                let values: Vec<String> =
                    key.iter().map(|(k, v)| format!("{k}={}", hex(v))).collect();
                return Err(ServerError::ServedElsewhere {
                    table: self.name.clone(),
                    shard: format!("of {}", values.join(",")),
                    reason: format!("this daemon owns buckets {:?} only", owned.buckets),
                });
            }
        }
        // The id follows from the values: a peer creating this bucket's
        // shard at the same time creates the same one (and fencing decides).
        let shard = ShardId::for_values(self.spec_id, key);
        let w = Arc::new(self.open_writer(shard, key).await?);
        slots.insert(key.clone(), Slot::Live(w.clone()));
        Ok(w)
    }

    fn check_schema(&self, batch: &RecordBatch, delete: bool) -> Result<(), ServerError> {
        let want: &Schema = if delete {
            &self.key_schema
        } else {
            &self.schema
        };
        let got = batch.schema();
        let bad = |reason: String| ServerError::InvalidInput {
            table: self.name.clone(),
            reason,
        };
        if got.fields().len() != want.fields().len() {
            return Err(bad(format!(
                "{} sends {} columns ({}), the table wants {} ({})",
                if delete { "a delete" } else { "a put" },
                got.fields().len(),
                names(&got),
                want.fields().len(),
                names(want)
            )));
        }
        for (g, w) in got.fields().iter().zip(want.fields()) {
            if g.name() != w.name() || g.data_type() != w.data_type() {
                return Err(bad(format!(
                    "column `{}` ({}) where the table has `{}` ({})",
                    g.name(),
                    g.data_type(),
                    w.name(),
                    w.data_type()
                )));
            }
        }
        Ok(())
    }

    /// Writes `batch` (rows, or key-only deletes): validated as a whole
    /// (schema, null keys, nulls in non-nullable columns: nothing of an
    /// invalid batch is written), split by shard, every part handed to its
    /// shard's writer at once; returns once every part is durable. Any part failing fails the call; parts that succeeded
    /// stay durable and the error ([`ServerError::Partial`]) lists them.
    pub async fn write(
        &self,
        batch: &RecordBatch,
        delete: bool,
    ) -> Result<Vec<PartAck>, ServerError> {
        let started = std::time::Instant::now();
        // The process tests arm this with `panic` to prove a failing put
        // never ends its call with OK.
        memwal_store::crash_point("server::before_write");
        let result = self.write_parts(batch, delete).await;
        metrics::histogram!("memwal_server_put_seconds", "table" => self.name.clone())
            .record(started.elapsed().as_secs_f64());
        if result.is_ok() {
            metrics::counter!("memwal_server_rows_total", "table" => self.name.clone())
                .increment(batch.num_rows() as u64);
        }
        result
    }

    async fn write_parts(
        &self,
        batch: &RecordBatch,
        delete: bool,
    ) -> Result<Vec<PartAck>, ServerError> {
        self.check_schema(batch, delete)?;
        if batch.num_rows() == 0 {
            return Ok(Vec::new());
        }
        // Null keys, nulls in non-nullable columns: refused for the whole
        // batch before any part reaches a shard. (Unsharded: one part, and
        // its writer refuses it whole.)
        if self.router.is_some() {
            let checked = if delete {
                self.validator.tombstone_batch(batch)
            } else {
                self.validator.to_storage(batch)
            };
            checked.map_err(|e| ServerError::InvalidInput {
                table: self.name.clone(),
                reason: e.to_string(),
            })?;
        }
        let parts: Vec<(ShardKey, RecordBatch)> = match &self.router {
            None => vec![(ShardKey::new(), batch.clone())],
            Some((rows, keys)) => {
                let router = if delete { keys } else { rows };
                router.split(batch).map_err(|e| ServerError::InvalidInput {
                    table: self.name.clone(),
                    reason: e.to_string(),
                })?
            }
        };
        let writes = parts.into_iter().map(|(key, part)| async move {
            let w = self.writer(&key).await?;
            let r = if delete {
                w.delete(&part).await
            } else {
                w.put(&part).await
            };
            match r {
                Ok(position) => Ok(PartAck {
                    shard: w.shard().to_string(),
                    rows: part.num_rows(),
                    wal_position: position,
                }),
                Err(source) => {
                    if source.is_fenced() {
                        self.lose(&key, w.shard(), source.to_string()).await;
                    }
                    Err(ServerError::Writer {
                        table: self.name.clone(),
                        shard: w.shard().to_string(),
                        source,
                    })
                }
            }
        });
        let results = futures::future::join_all(writes).await;
        let mut done = Vec::new();
        let mut failed = None;
        for r in results {
            match r {
                Ok(part) => done.push(part),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            None => Ok(done),
            Some(e) if done.is_empty() => Err(e),
            Some(e) => Err(ServerError::Partial {
                source: Box::new(e),
                durable: done
                    .iter()
                    .map(|p| format!("{}: {} rows at {}", p.shard, p.rows, p.wal_position))
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    async fn lose(&self, key: &ShardKey, shard: ShardId, reason: String) {
        metrics::counter!("memwal_server_shards_lost_total", "table" => self.name.clone())
            .increment(1);
        tracing::warn!(table = %self.name, %shard, %reason, "shard taken over; no longer served");
        let mut slots = self.shards.lock().await;
        if let Some(Slot::Live(w)) = slots.get(key) {
            if w.shard() == shard {
                slots.insert(key.clone(), Slot::Lost { shard, reason });
            }
        }
    }

    /// Flushes every served shard (frozen and published).
    pub async fn flush(&self) -> Result<(), ServerError> {
        for w in self.live().await {
            w.flush().await.map_err(|source| ServerError::Writer {
                table: self.name.clone(),
                shard: w.shard().to_string(),
                source,
            })?;
        }
        Ok(())
    }

    async fn live(&self) -> Vec<Arc<ShardWriter>> {
        self.shards
            .lock()
            .await
            .values()
            .filter_map(|s| match s {
                Slot::Live(w) => Some(w.clone()),
                Slot::Lost { .. } | Slot::Failed { .. } => None,
            })
            .collect()
    }

    /// Closes every served shard at once (flush, publish, stop), each
    /// bounded by the writer's `close_timeout`, reporting the first failure
    /// after trying all. Rows a failed close could not flush stay in the WAL.
    pub async fn close(&self) -> Result<(), ServerError> {
        let live = self.live().await;
        let results = futures::future::join_all(live.iter().map(|w| w.close())).await;
        let mut first = None;
        for (w, r) in live.iter().zip(results) {
            if let Err(source) = r {
                first.get_or_insert(ServerError::Writer {
                    table: self.name.clone(),
                    shard: w.shard().to_string(),
                    source,
                });
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Every shard's state, with its compaction progress read from the base
    /// table.
    pub async fn status(&self) -> Vec<ShardStatus> {
        let lance = LanceStore::new(self.loc.store.clone());
        let base = match BaseTable::load(&lance, &self.loc.root).await {
            Ok(b) => Some(b),
            Err(e) => {
                tracing::warn!(table = %self.name, error = %e, "status: base table unreadable");
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
        let slots = self.shards.lock().await;
        let mut out: Vec<ShardStatus> = slots
            .iter()
            .map(|(key, slot)| {
                let values = key.iter().map(|(k, v)| (k.clone(), hex(v))).collect();
                let shard = match slot {
                    Slot::Live(w) => w.shard(),
                    Slot::Lost { shard, .. } | Slot::Failed { shard, .. } => *shard,
                };
                let mut status = match slot {
                    Slot::Live(w) => {
                        let s = w.stats();
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
                        }
                    }
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
                };
                status.index_catchup = catchup(shard);
                status
            })
            .collect();
        out.sort_by(|a, b| a.values.cmp(&b.values));
        out
    }

    /// Hands the host the table's compactor, whose index catch-ups
    /// [`Self::index_catchup`] reports (the first one given is kept).
    pub fn attach_compactor(&self, compactor: memwal_compactor::Compactor) {
        let _ = self.compactor.set(compactor);
    }

    /// The attached compactor's index catch-ups, as JSON: `last` (the
    /// last run: which indexes were behind and by how many generations,
    /// whether it committed, its seconds; or `error`) and `last_commit`
    /// (the last run that committed: what the work cost); `None` without a
    /// compactor.
    pub fn index_catchup(&self) -> Option<serde_json::Value> {
        let c = self.compactor.get()?;
        let report = |r: &memwal_compactor::CatchupReport| {
            serde_json::json!({
                "seconds": r.seconds,
                "behind": r.behind,
                "committed": r.committed,
                "conflicts": r.conflicts,
            })
        };
        let last = c.last_index_catchup().map(|l| match l {
            Ok(r) => report(&r),
            Err(e) => serde_json::json!({ "error": e }),
        });
        let last_commit = c.last_index_catchup_commit().map(|r| report(&r));
        Some(serde_json::json!({ "last": last, "last_commit": last_commit }))
    }
}

fn names(s: &Schema) -> String {
    s.fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
