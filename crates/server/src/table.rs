//! One served table: its shards' writers, and puts split by the table's
//! sharding spec and acknowledged once every part is durable.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use memwal::{ShardId, ShardWriter, ShardWriterConfig, ShardingConfig, StoreLocation};
use memwal_fencing::ShardIdentity;
use memwal_sstable::LanceStore;
use memwal_store::RetryPolicy;
use memwal_table::BaseTable;
use serde::Serialize;

use crate::columns::Shape;
use crate::error::FailedPart;
use crate::limits::ShardLimits;
use crate::slots::{self, Slot, Slots};
use crate::ServerError;

/// Shard field values identifying a shard under the table's spec.
pub type ShardKey = BTreeMap<String, Vec<u8>>;

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
    pub(crate) loc: StoreLocation,
    /// The columns puts are checked and routed by: one version of the
    /// base table's schema, replaced whole by [`Self::evolve`].
    pub(crate) shape: parking_lot::RwLock<Arc<Shape>>,
    /// One schema change at a time.
    pub(crate) evolving: tokio::sync::Mutex<()>,
    pub(crate) spec: memwal_proto::ShardingSpec,
    spec_id: u32,
    /// An unsharded table: one shard, no routing.
    unsharded: bool,
    config: ShardWriterConfig,
    /// The shards this daemon may claim (`None`: all of them).
    owned: Option<Owned>,
    /// Every shard key the spec can produce, when it can be enumerated (an
    /// unsharded table, one bucket field): how a shard whose manifest does
    /// not decode is tied to its rows.
    enumerable: Option<Vec<ShardKey>>,
    pub(crate) slots: Slots,
    /// When the last `flush` action started, and whether one runs.
    flushes: parking_lot::Mutex<(Option<tokio::time::Instant>, bool)>,
    /// `flush` actions start at most once per this long.
    flush_interval: parking_lot::Mutex<std::time::Duration>,
    /// Caps on the shards this host holds open.
    pub(crate) shard_limits: parking_lot::Mutex<ShardLimits>,
    /// Set when [`Self::close`] starts: no shard opens and no row is taken
    /// after it.
    pub(crate) closing: std::sync::atomic::AtomicBool,
    /// The table's compactor, when the daemon runs one (status only).
    compactor: std::sync::OnceLock<memwal_compactor::Compactor>,
    /// Whole-table reads ([`Self::read_rows`]) and key lookups
    /// ([`Self::lookup_rows`]) served.
    pub(crate) scans: std::sync::atomic::AtomicU64,
    pub(crate) lookups: std::sync::atomic::AtomicU64,
    /// Published SSTables opened for key lookups (`lookup.rs`), kept while
    /// the view lists them: an SSTable never changes.
    pub(crate) sstables: crate::lookup::OpenSsTables,
    /// The held writers' unflushed rows as upstream memtables, kept and
    /// extended read by read (`memtables.rs`).
    pub(crate) memtables: crate::memtables::Memtables,
}

/// `flush` actions start at most this often per table, by default
/// ([`TableHost::set_min_flush_interval`]).
pub const MIN_FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// A `flush` action's turn ([`TableHost::begin_flush`]).
pub struct FlushTurn<'a>(&'a TableHost);

impl Drop for FlushTurn<'_> {
    fn drop(&mut self) {
        self.0.flushes.lock().1 = false;
    }
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
fn is_corrupt(e: &memwal_table::TableError) -> bool {
    matches!(
        e,
        memwal_table::TableError::Manifest { source, .. }
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
        let shape = Shape::build(&spec, base.schema.clone()).map_err(setup)?;
        let owned = buckets
            .map(|b| bucket_keys(&spec, b))
            .transpose()
            .map_err(setup)?;
        let unsharded = shape.router.is_none();
        let enumerable = if unsharded {
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
            shape: parking_lot::RwLock::new(Arc::new(shape)),
            evolving: Default::default(),
            spec_id: spec.spec_id,
            spec,
            unsharded,
            config,
            owned,
            enumerable,
            slots: Slots::default(),
            compactor: std::sync::OnceLock::new(),
            closing: Default::default(),
            flushes: Default::default(),
            flush_interval: parking_lot::Mutex::new(MIN_FLUSH_INTERVAL),
            shard_limits: Default::default(),
            scans: Default::default(),
            lookups: Default::default(),
            sstables: Default::default(),
            memtables: Default::default(),
        };
        host.open_existing().await?;
        Ok(host)
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The table's Arrow schema (what a put sends), as of the last schema
    /// change this host followed ([`Self::evolve`]).
    pub fn schema(&self) -> SchemaRef {
        self.shape.read().schema.clone()
    }

    /// The primary-key columns (what a delete sends).
    pub fn key_schema(&self) -> SchemaRef {
        self.shape.read().key_schema.clone()
    }

    /// How many whole-table reads and key lookups this host has served
    /// (a query whose filter names keys is a lookup).
    pub fn read_counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.scans.load(Relaxed), self.lookups.load(Relaxed))
    }

    /// The columns puts are checked and routed by now.
    pub(crate) fn shape(&self) -> Arc<Shape> {
        self.shape.read().clone()
    }

    async fn open_existing(&self) -> Result<(), ServerError> {
        let shards = memwal_table::list_shards(&self.loc)
            .await
            .map_err(|e| self.setup(e.to_string()))?;
        let mut found: BTreeMap<ShardKey, ShardId> = BTreeMap::new();
        let mut failed: BTreeMap<ShardKey, Slot> = BTreeMap::new();
        for shard in shards {
            let m = match memwal_table::latest_manifest(&self.loc, shard, &RetryPolicy::default())
                .await
            {
                Ok(Some(m)) => m,
                Ok(None) => continue,
                Err(e @ memwal_table::TableError::Manifest { .. }) if is_corrupt(&e) => {
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
                        source: Some(Arc::new(e)),
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
        for (key, slot) in failed {
            self.slots.cell(&key).set(slot);
        }
        for (key, shard) in found {
            let slot = match self.open_writer(shard, &key).await {
                Ok(w) => Slot::Live(Arc::new(w)),
                // Corrupt stored state does not heal by retrying: refuse
                // this shard's rows, serve the rest.
                Err(ServerError::Writer {
                    source: error @ memwal::Error::Corrupt { .. },
                    ..
                }) => {
                    tracing::error!(table = %self.name, %shard, %error, "shard state corrupt; its rows are refused");
                    Slot::Failed { shard, error }
                }
                Err(e) => return Err(e),
            };
            self.slots.cell(&key).set(slot);
        }
        Ok(())
    }

    /// Unsharded tables have one shard whatever its manifest records.
    fn key_of(&self, values: ShardKey) -> ShardKey {
        if self.unsharded {
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

    /// The writer of shard `key`, creating the shard on first use and
    /// reopening a shard that is down once its backoff has passed. Only
    /// this shard waits while it opens.
    async fn writer(&self, key: &ShardKey) -> Result<Arc<ShardWriter>, ServerError> {
        loop {
            if let Some(w) = self.writer_in_cell(key).await? {
                return Ok(w);
            }
            // The cell was retired (an idle close) while this put waited
            // for it: the next round takes the key's new cell.
        }
    }

    async fn writer_in_cell(
        &self,
        key: &ShardKey,
    ) -> Result<Option<Arc<ShardWriter>>, ServerError> {
        let cell = match self.slots.get(key) {
            Some(cell) => cell,
            None => {
                // Neither an unowned bucket nor one past the cap takes a cell.
                self.check_owned(key)?;
                let cap = self.shard_limits.lock().max_open;
                self.slots
                    .cell_capped(key, cap)
                    .map_err(|open| ServerError::ShardLimit {
                        table: self.name.clone(),
                        open,
                        cap,
                    })?
            }
        };
        cell.touch();
        match cell.current() {
            Some(Slot::Live(w)) => return Ok(Some(w)),
            // Closing (idle): wait for the close below, then open again.
            Some(Slot::Closing(_)) => {}
            Some(slot) if !self.due(&slot) => return Err(self.refusal(&slot)),
            Some(_) => {}
            None => self.check_owned(key)?,
        }
        let _opening = cell.opening.lock().await;
        if !self.slots.holds(key, &cell) {
            return Ok(None);
        }
        // No shard opens once the table closes (it would never be closed).
        self.check_open()?;
        // Another put may have opened it meanwhile.
        let attempts = match cell.current() {
            Some(Slot::Live(w)) => return Ok(Some(w)),
            Some(slot @ Slot::Down { .. }) if self.due(&slot) => match slot {
                Slot::Down { attempts, .. } => attempts + 1,
                _ => unreachable!(),
            },
            Some(slot) => return Err(self.refusal(&slot)),
            None => 0,
        };
        // The id follows from the values: a peer creating this bucket's
        // shard at the same time creates the same one (and fencing decides).
        let shard = ShardId::for_values(self.spec_id, key);
        match self.open_writer(shard, key).await {
            Ok(w) => {
                if attempts > 0 {
                    tracing::info!(table = %self.name, %shard, attempts, "shard reopened");
                    metrics::counter!("memwal_server_shard_reopens_total", "table" => self.name.clone())
                        .increment(1);
                }
                let w = Arc::new(w);
                // Tests hold a shard here, opened but not yet live.
                memwal_store::crash_point("server::shard_opened");
                self.go_live(&cell, w.clone()).await;
                Ok(Some(w))
            }
            Err(ServerError::Writer { source, .. }) => {
                let slot = match source {
                    e if e.is_fenced() => Slot::Lost {
                        shard,
                        reason: e.to_string(),
                    },
                    error @ memwal::Error::Corrupt { .. } => Slot::Failed { shard, error },
                    cause => {
                        tracing::warn!(table = %self.name, %shard, error = %cause, attempts, "shard could not open; retrying with backoff");
                        slots::down(shard, cause, attempts)
                    }
                };
                let refused = self.refusal(&slot);
                cell.set(slot);
                Err(refused)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether a slot that is not live should be (re)opened now.
    fn due(&self, slot: &Slot) -> bool {
        matches!(slot, Slot::Down { retry_at, .. } if *retry_at <= tokio::time::Instant::now())
    }

    fn check_open(&self) -> Result<(), ServerError> {
        if self.closing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ServerError::Stopping {
                table: self.name.clone(),
            });
        }
        Ok(())
    }

    /// Refuses rows of `key` when this daemon does not own its bucket.
    fn check_owned(&self, key: &ShardKey) -> Result<(), ServerError> {
        let Some(owned) = &self.owned else {
            return Ok(());
        };
        if owned.keys.contains(key) {
            return Ok(());
        }
        let values: Vec<String> = key.iter().map(|(k, v)| format!("{k}={}", hex(v))).collect();
        Err(ServerError::ServedElsewhere {
            table: self.name.clone(),
            shard: format!("of {}", values.join(",")),
            reason: format!("this daemon owns buckets {:?} only", owned.buckets),
        })
    }

    /// Why rows of a shard in `slot` (not live) are refused now, and why
    /// a read of the table is (down or failed shards).
    pub(crate) fn refusal(&self, slot: &Slot) -> ServerError {
        let shard = slot.shard().to_string();
        match slot {
            Slot::Lost { reason, .. } => ServerError::ServedElsewhere {
                table: self.name.clone(),
                shard,
                reason: reason.clone(),
            },
            Slot::Failed { error, .. } => ServerError::Writer {
                table: self.name.clone(),
                shard,
                source: error.clone(),
            },
            Slot::Down {
                cause,
                since,
                retry_at,
                ..
            } => ServerError::Down {
                table: self.name.clone(),
                shard,
                cause: cause.to_string(),
                down_secs: since.elapsed().as_secs(),
                retry_in_ms: retry_at
                    .saturating_duration_since(tokio::time::Instant::now())
                    .as_millis() as u64,
            },
            Slot::Live(w) | Slot::Closing(w) => ServerError::Writer {
                table: self.name.clone(),
                shard,
                source: w.terminal_error().unwrap_or_else(|| memwal::Error::Closed {
                    reason: "the shard is closing".into(),
                }),
            },
        }
    }

    /// Reopens every shard that is down and due (the host's monitor calls
    /// this; puts reopen a due shard too). Returns how many stay down.
    pub async fn reopen_down_shards(&self) -> usize {
        let mut still_down = 0;
        for (key, slot) in self.slots.snapshot() {
            if let Slot::Down { .. } = slot {
                if self.due(&slot) && self.writer(&key).await.is_ok() {
                    continue;
                }
                still_down += 1;
            }
        }
        still_down
    }

    /// Runs [`Self::reopen_down_shards`], [`Self::close_idle_shards`] and
    /// [`Self::refresh_gauges`] every `every` in a task of its own until
    /// `stop` turns true (the daemon's shutdown): a shard that went down
    /// comes back without waiting for its next put, and an idle one goes.
    pub fn spawn_reopener(
        self: &Arc<Self>,
        every: std::time::Duration,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let span = tracing::info_span!("reopener", table = %self.name);
        crate::periodic::spawn_every(span, every, stop, self.clone(), |host| async move {
            let down = host.reopen_down_shards().await;
            metrics::gauge!("memwal_server_shards_down", "table" => host.name.clone())
                .set(down as f64);
            host.close_idle_shards().await;
            host.refresh_gauges();
        })
    }

    /// The shards that are down, with why: what `/readyz` reports.
    pub fn down_shards(&self) -> Vec<String> {
        self.slots
            .snapshot()
            .into_iter()
            .filter_map(|(_, s)| match s {
                Slot::Down { shard, cause, .. } => {
                    Some(format!("table `{}`, shard {shard}: {cause}", self.name))
                }
                _ => None,
            })
            .collect()
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
        let started = tokio::time::Instant::now();
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
        self.check_open()?;
        // One version of the table's columns for the whole put (a schema
        // change landing meanwhile is met by the writers: see
        // `ShardWriter::evolve_to`).
        let shape = self.shape();
        let conformed = if delete {
            None
        } else {
            self.conform(&shape, batch)?
        };
        let batch = conformed.as_ref().unwrap_or(batch);
        self.check_schema(&shape, batch, delete)?;
        if batch.num_rows() == 0 {
            return Ok(Vec::new());
        }
        // Null keys, nulls in non-nullable columns: refused for the whole
        // batch before any part reaches a shard. (Unsharded: one part, and
        // its writer refuses it whole.)
        if shape.router.is_some() {
            let checked = if delete {
                shape.validator.tombstone_batch(batch)
            } else {
                shape.validator.to_storage(batch)
            };
            checked.map_err(|e| ServerError::InvalidInput {
                table: self.name.clone(),
                reason: e.to_string(),
            })?;
        }
        let parts: Vec<(ShardKey, RecordBatch)> = match &shape.router {
            None => vec![(ShardKey::new(), batch.clone())],
            Some((rows, keys)) => {
                let router = if delete { keys } else { rows };
                router.split(batch).map_err(|e| ServerError::InvalidInput {
                    table: self.name.clone(),
                    reason: e.to_string(),
                })?
            }
        };
        // 1. Everything that can refuse a part, for every part, before any
        //    is written: the shard's slot (owned, not lost, failed or down;
        //    opened if new) and the shard writer's own checks (its schema,
        //    keys, routing, size). A refusal here means nothing was written.
        let prepares = parts.into_iter().map(|(key, part)| async move {
            let w = self.writer(&key).await?;
            let prepared = if delete {
                w.prepare_delete(&part)
            } else {
                w.prepare_put(&part)
            };
            let prepared = prepared.map_err(|source| ServerError::Writer {
                table: self.name.clone(),
                shard: w.shard().to_string(),
                source,
            })?;
            Ok::<_, ServerError>((key, w, prepared))
        });
        let mut prepared = Vec::new();
        for r in futures::future::join_all(prepares).await {
            prepared.push(r?);
        }
        // 2. Every part at once. Only the writers' state can fail them now
        //    (fenced, closed, backpressure, storage).
        let writes = prepared.into_iter().map(|(key, w, part)| async move {
            let rows = part.num_rows();
            match w.put_prepared(part).await {
                Ok(position) => Ok(PartAck {
                    shard: w.shard().to_string(),
                    rows,
                    wal_position: position,
                }),
                Err(source) => {
                    if source.is_fenced() {
                        self.lose(&key, w.shard(), source.to_string());
                    }
                    Err((
                        rows,
                        ServerError::Writer {
                            table: self.name.clone(),
                            shard: w.shard().to_string(),
                            source,
                        },
                    ))
                }
            }
        });
        let mut done = Vec::new();
        let mut failed = Vec::new();
        for r in futures::future::join_all(writes).await {
            match r {
                Ok(part) => done.push(part),
                Err(e) => failed.push(e),
            }
        }
        if failed.is_empty() {
            return Ok(done);
        }
        if done.is_empty() {
            // Nothing durable: the first failure says what happened (an
            // unknown outcome where any part's is unknown).
            let unknown = failed.iter().position(|(_, e)| e.may_be_durable());
            return Err(failed.swap_remove(unknown.unwrap_or(0)).1);
        }
        Err(ServerError::Partial {
            table: self.name.clone(),
            durable: done,
            failed: failed
                .into_iter()
                .map(|(rows, e)| FailedPart {
                    shard: e.shard().unwrap_or_default().to_string(),
                    rows,
                    code: format!("{:?}", crate::error::code_of(&e)),
                    outcome_unknown: e.may_be_durable(),
                    error: e.to_string(),
                })
                .collect(),
        })
    }

    /// Marks the live writer of `shard` at `key` lost to another writer.
    pub(crate) fn lose(&self, key: &ShardKey, shard: ShardId, reason: String) {
        metrics::counter!("memwal_server_shards_lost_total", "table" => self.name.clone())
            .increment(1);
        tracing::warn!(table = %self.name, %shard, %reason, "shard taken over; no longer served");
        self.slots
            .cell(key)
            .replace_live(shard, Slot::Lost { shard, reason });
    }

    /// Sets how often `flush` actions may start (default
    /// [`MIN_FLUSH_INTERVAL`]; zero: only one at a time).
    pub fn set_min_flush_interval(&self, interval: std::time::Duration) {
        *self.flush_interval.lock() = interval;
    }

    /// Admits one `flush` action: refused (`RESOURCE_EXHAUSTED`) while
    /// another runs or within the minimum interval
    /// ([`Self::set_min_flush_interval`]) of the last one's start. The turn
    /// ends when the returned guard drops.
    pub fn begin_flush(&self) -> Result<FlushTurn<'_>, ServerError> {
        let interval = *self.flush_interval.lock();
        let mut f = self.flushes.lock();
        if f.1 {
            return Err(ServerError::TooFrequent {
                table: self.name.clone(),
                what: "a flush action runs; try again when it ends".into(),
            });
        }
        if let Some(left) =
            f.0.and_then(|at| interval.checked_sub(at.elapsed()))
                .filter(|l| !l.is_zero())
        {
            return Err(ServerError::TooFrequent {
                table: self.name.clone(),
                what: format!(
                    "flush actions start at most once per {interval:?}; try again in {left:?}"
                ),
            });
        }
        *f = (Some(tokio::time::Instant::now()), true);
        Ok(FlushTurn(self))
    }

    /// Flushes every served shard (frozen and published).
    pub async fn flush(&self) -> Result<(), ServerError> {
        for w in self.live_writers() {
            w.flush().await.map_err(|source| ServerError::Writer {
                table: self.name.clone(),
                shard: w.shard().to_string(),
                source,
            })?;
        }
        Ok(())
    }

    /// The writers this host holds now (readers add their memtables).
    pub(crate) fn live_writers(&self) -> Vec<Arc<ShardWriter>> {
        self.slots.live()
    }

    /// Closes every served shard at once (flush, publish, stop), each
    /// bounded by the writer's `close_timeout`, reporting the first failure
    /// after trying all. Rows a failed close could not flush stay in the WAL.
    /// A writer found fenced (another writer took the shard over, and
    /// replayed its acknowledged rows) is not a failure: the takeover is
    /// logged and the shard marked lost.
    pub async fn close(&self) -> Result<(), ServerError> {
        self.closing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // A shard opening right now finishes (under its cell's lock) before
        // it is listed; one not yet opening sees `closing` and refuses.
        for (key, _) in self.slots.snapshot() {
            let _ = self.slots.cell(&key).opening.lock().await;
        }
        let live: Vec<(ShardKey, Arc<ShardWriter>)> = self
            .slots
            .snapshot()
            .into_iter()
            .filter_map(|(key, slot)| match slot {
                Slot::Live(w) => Some((key, w)),
                _ => None,
            })
            .collect();
        let results = futures::future::join_all(live.iter().map(|(_, w)| w.close())).await;
        let mut first = None;
        for ((key, w), r) in live.iter().zip(results) {
            if let Err(source) = r {
                if source.is_fenced() {
                    self.lose(key, w.shard(), source.to_string());
                    continue;
                }
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
        let mut out: Vec<ShardStatus> = self
            .slots
            .snapshot()
            .iter()
            .map(|(key, slot)| {
                let values = key.iter().map(|(k, v)| (k.clone(), hex(v))).collect();
                let shard = slot.shard();
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
