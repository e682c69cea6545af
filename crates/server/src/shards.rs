//! The shard set of one served table: which shards this daemon owns, one
//! slot per shard key (`slots.rs`), each opened, reopened after a failure
//! and closed on its own, the caps on how many are open (`limits.rs`), and
//! what each is doing (`status.rs`). Its state is private to this file;
//! the host, ingest and reads use it through the methods below.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use memwal::{ShardId, ShardWriter, ShardWriterConfig, ShardingConfig, StoreLocation};
use memwal_fencing::ShardIdentity;
use memwal_store::RetryPolicy;

use crate::limits::ShardLimits;
use crate::slots::{self, Cell, Slot, Slots};
use crate::table::ShardKey;
use crate::ServerError;

/// What puts a writer that just opened into its slot: the host, on the
/// schema it serves (`TableHost::go_live`). Called with the cell's
/// `opening` lock held; it must leave `cell` holding `w` live.
pub(crate) trait GoLive: Sync {
    /// Makes `w` live in `cell`.
    fn go_live<'a>(&'a self, cell: &'a Cell, w: Arc<ShardWriter>) -> BoxFuture<'a, ()>;
}

/// The shards of one table this daemon holds, and how they open.
pub(crate) struct ShardSet {
    /// The table's name (messages, metrics).
    table: String,
    loc: StoreLocation,
    spec_id: u32,
    /// An unsharded table: one shard, no routing.
    unsharded: bool,
    config: ShardWriterConfig,
    /// The shards this daemon may claim.
    owned: Ownership,
    /// Every shard key the spec can produce, when it can be enumerated (an
    /// unsharded table, one bucket field): how a shard whose manifest does
    /// not decode is tied to its rows.
    enumerable: Option<Vec<ShardKey>>,
    slots: Slots,
    /// Caps on the shards held open.
    limits: parking_lot::Mutex<ShardLimits>,
    /// Set when [`Self::close`] starts: no shard opens after it.
    closing: AtomicBool,
}

/// Which shards of the table this daemon may claim.
enum Ownership {
    /// Every shard (one daemon per table).
    All,
    /// A configured subset of the buckets (`--shards`).
    Buckets(Owned),
    /// Those the cluster places here (`placement.rs`).
    Cluster(crate::placement::Placement),
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

/// A manifest that was read but does not decode (not a storage failure).
fn is_corrupt(e: &memwal_table::TableError) -> bool {
    matches!(
        e,
        memwal_table::TableError::Manifest { source, .. }
            if matches!(**source, memwal_fencing::FencingError::Corrupt { .. })
    )
}

/// Bytes as lower-case hex (shard field values in messages and status).
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl ShardSet {
    /// An empty set for table `table` at `loc` under `spec` (no shard
    /// open yet: see [`Self::open_existing`]); `buckets` limits it to those
    /// buckets of a one-field `bucket` spec (`None`: every shard). `Err`
    /// says why `buckets` does not fit the spec.
    pub(crate) fn new(
        table: &str,
        loc: StoreLocation,
        spec: &memwal_proto::ShardingSpec,
        unsharded: bool,
        config: ShardWriterConfig,
        buckets: Option<&[u32]>,
    ) -> Result<Self, String> {
        let owned = match buckets {
            Some(b) => Ownership::Buckets(bucket_keys(spec, b)?),
            None => Ownership::All,
        };
        let enumerable = if unsharded {
            Some(vec![ShardKey::new()])
        } else {
            num_buckets(spec)
                .ok()
                .and_then(|n| bucket_keys(spec, &(0..n).collect::<Vec<_>>()).ok())
                .map(|o| o.keys.into_iter().collect())
        };
        Ok(Self {
            table: table.to_string(),
            loc,
            spec_id: spec.spec_id,
            unsharded,
            config,
            owned,
            enumerable,
            slots: Slots::default(),
            limits: Default::default(),
            closing: Default::default(),
        })
    }

    /// The table's name.
    pub(crate) fn table(&self) -> &str {
        &self.table
    }

    /// The table's location.
    pub(crate) fn loc(&self) -> &StoreLocation {
        &self.loc
    }

    /// The sharding spec's id.
    pub(crate) fn spec_id(&self) -> u32 {
        self.spec_id
    }

    /// Places this set's shards through a cluster (`placement.rs`): from
    /// now on it claims only the shards the cluster assigns it. Called
    /// once, before any shard opens.
    pub(crate) fn join_cluster(&mut self, placement: crate::placement::Placement) {
        self.owned = Ownership::Cluster(placement);
    }

    /// The cluster placement, when the set is in one.
    pub(crate) fn placement(&self) -> Option<&crate::placement::Placement> {
        match &self.owned {
            Ownership::Cluster(p) => Some(p),
            _ => None,
        }
    }

    /// Every opened slot, by key (a live writer's state folded in).
    pub(crate) fn snapshot(&self) -> Vec<(ShardKey, Slot)> {
        self.slots.snapshot()
    }

    /// Every cell, by key.
    pub(crate) fn cells(&self) -> Vec<(ShardKey, Arc<Cell>)> {
        self.slots.cells()
    }

    /// The cell of `key`, if it has one.
    pub(crate) fn cell_if_any(&self, key: &ShardKey) -> Option<Arc<Cell>> {
        self.slots.get(key)
    }

    /// The cell of `key`, created empty on first use.
    pub(crate) fn cell(&self, key: &ShardKey) -> Arc<Cell> {
        self.slots.cell(key)
    }

    /// The live writers.
    pub(crate) fn live(&self) -> Vec<Arc<ShardWriter>> {
        self.slots.live()
    }

    /// Forgets `key`'s cell if it is still `cell` and empty (it counts
    /// against [`ShardLimits::max_open`] no more).
    pub(crate) fn forget_if_empty(&self, key: &ShardKey, cell: &Arc<Cell>) {
        self.slots.remove_if_empty(key, cell)
    }

    /// The caps in force.
    pub(crate) fn limits(&self) -> ShardLimits {
        *self.limits.lock()
    }

    /// Sets the caps (see [`ShardLimits`]).
    pub(crate) fn set_limits(&self, limits: ShardLimits) {
        *self.limits.lock() = limits;
    }

    /// Whether [`Self::close`] has started.
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// Claims (and replays) every existing shard of the spec this set may
    /// own. A shard of another spec, outside the owned buckets, or a second
    /// one with the same values is skipped (logged). A shard whose manifest
    /// or stored state is corrupt is kept as failed (its rows refused) when
    /// its key is known; otherwise the table is refused. Any other failure
    /// fails the call.
    pub(crate) async fn open_existing(&self) -> Result<(), ServerError> {
        if let Ownership::Cluster(_) = self.owned {
            // The cluster's placement claims this daemon's shards.
            return Ok(());
        }
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
                    tracing::error!(table = %self.table, %shard, error = %e, "shard manifest corrupt; its rows are refused");
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
            if matches!(&self.owned, Ownership::Buckets(o) if !o.keys.contains(&key)) {
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
                    tracing::error!(table = %self.table, %shard, %error, "shard state corrupt; its rows are refused");
                    Slot::Failed { shard, error }
                }
                Err(e) => return Err(e),
            };
            self.slots.cell(&key).set(slot);
        }
        Ok(())
    }

    /// Unsharded tables have one shard whatever its manifest records.
    pub(crate) fn key_of(&self, values: ShardKey) -> ShardKey {
        if self.unsharded {
            ShardKey::new()
        } else {
            values
        }
    }

    fn setup(&self, reason: String) -> ServerError {
        ServerError::Setup {
            table: self.table.clone(),
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
                table: self.table.clone(),
                shard: shard.to_string(),
                source,
            })
    }

    /// The writer of shard `key`, creating the shard on first use and
    /// reopening a shard that is down once its backoff has passed; a new
    /// writer goes live through `live`. Only this shard waits while it
    /// opens. Refused, nothing opened, when this daemon does not own the
    /// key ([`ServerError::ServedElsewhere`]), one more shard would pass
    /// [`ShardLimits::max_open`] ([`ServerError::ShardLimit`]), the set is
    /// closing ([`ServerError::Stopping`]), or the slot is lost, failed or
    /// down and not due ([`Self::refusal`]).
    pub(crate) async fn writer(
        &self,
        key: &ShardKey,
        live: &dyn GoLive,
    ) -> Result<Arc<ShardWriter>, ServerError> {
        loop {
            if let Some(w) = self.writer_in_cell(key, live).await? {
                return Ok(w);
            }
            // The cell was retired (an idle close) while this put waited
            // for it: the next round takes the key's new cell.
        }
    }

    async fn writer_in_cell(
        &self,
        key: &ShardKey,
        live: &dyn GoLive,
    ) -> Result<Option<Arc<ShardWriter>>, ServerError> {
        let cell = match self.slots.get(key) {
            Some(cell) => cell,
            None => {
                // Neither an unowned bucket nor one past the cap takes a cell.
                self.check_owned(key)?;
                let cap = self.limits.lock().max_open;
                self.slots
                    .cell_capped(key, cap)
                    .map_err(|open| ServerError::ShardLimit {
                        table: self.table.clone(),
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
            Some(slot) if !due(&slot) => return Err(self.refusal(&slot)),
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
            Some(slot @ Slot::Down { .. }) if due(&slot) => match slot {
                Slot::Down { attempts, .. } => attempts + 1,
                _ => unreachable!(),
            },
            Some(slot) => return Err(self.refusal(&slot)),
            None => 0,
        };
        // The id follows from the values: a peer creating this bucket's
        // shard at the same time creates the same one (and fencing decides).
        let shard = ShardId::for_values(self.spec_id, key);
        // In a cluster, this daemon records itself as the owner first (only
        // if nobody is): a claim by a daemon the cluster does not place the
        // shard on would only fence its owner.
        if let Ownership::Cluster(p) = &self.owned {
            if let Err(e) = p.acquire(&self.table, shard, key).await {
                drop(_opening);
                self.forget_if_empty(key, &cell);
                return Err(e);
            }
        }
        match self.open_writer(shard, key).await {
            Ok(w) => {
                if attempts > 0 {
                    tracing::info!(table = %self.table, %shard, attempts, "shard reopened");
                    metrics::counter!("memwal_server_shard_reopens_total", "table" => self.table.clone())
                        .increment(1);
                }
                let w = Arc::new(w);
                // Tests hold a shard here, opened but not yet live.
                memwal_store::crash_point("server::shard_opened");
                live.go_live(&cell, w.clone()).await;
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
                        tracing::warn!(table = %self.table, %shard, error = %cause, attempts, "shard could not open; retrying with backoff");
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

    /// [`ServerError::Stopping`] once [`Self::close`] has started.
    pub(crate) fn check_open(&self) -> Result<(), ServerError> {
        if self.is_closing() {
            return Err(ServerError::Stopping {
                table: self.table.clone(),
            });
        }
        Ok(())
    }

    /// Refuses rows of `key` when this daemon does not own its bucket (or,
    /// in a cluster, is not placed to serve it now).
    fn check_owned(&self, key: &ShardKey) -> Result<(), ServerError> {
        let owned = match &self.owned {
            Ownership::All => return Ok(()),
            Ownership::Buckets(owned) => owned,
            Ownership::Cluster(p) => {
                let shard = ShardId::for_values(self.spec_id, key);
                return match p.locate(&self.table, shard) {
                    crate::placement::Located::Here => Ok(()),
                    crate::placement::Located::At(m) => Err(ServerError::Moving {
                        table: self.table.clone(),
                        shard: shard.to_string(),
                        reason: format!("owned by {}", m.advertise),
                    }),
                    crate::placement::Located::Moving(reason) => Err(ServerError::Moving {
                        table: self.table.clone(),
                        shard: shard.to_string(),
                        reason,
                    }),
                };
            }
        };
        if owned.keys.contains(key) {
            return Ok(());
        }
        let values: Vec<String> = key.iter().map(|(k, v)| format!("{k}={}", hex(v))).collect();
        Err(ServerError::ServedElsewhere {
            table: self.table.clone(),
            shard: format!("of {}", values.join(",")),
            reason: format!("this daemon owns buckets {:?} only", owned.buckets),
        })
    }

    /// Why rows of a shard in `slot` (not live) are refused now, and why
    /// a read of the table is (down or failed shards).
    pub(crate) fn refusal(&self, slot: &Slot) -> ServerError {
        let table = self.table.clone();
        let shard = slot.shard().to_string();
        match slot {
            // In a cluster the shard moved: a retry finds its new owner.
            Slot::Lost { reason, .. } if self.placement().is_some() => ServerError::Moving {
                table,
                shard,
                reason: format!("claimed by another member ({reason})"),
            },
            Slot::Lost { reason, .. } => ServerError::ServedElsewhere {
                table,
                shard,
                reason: reason.clone(),
            },
            Slot::Failed { error, .. } => ServerError::Writer {
                table,
                shard,
                source: error.clone(),
            },
            Slot::Down {
                cause,
                since,
                retry_at,
                ..
            } => ServerError::Down {
                table,
                shard,
                cause: cause.to_string(),
                down_secs: since.elapsed().as_secs(),
                retry_in_ms: retry_at
                    .saturating_duration_since(tokio::time::Instant::now())
                    .as_millis() as u64,
            },
            Slot::Live(w) | Slot::Closing(w) => ServerError::Writer {
                table,
                shard,
                source: w.terminal_error().unwrap_or_else(|| memwal::Error::Closed {
                    reason: "the shard is closing".into(),
                }),
            },
        }
    }

    /// Marks the live writer of `shard` at `key` lost to another writer
    /// (only that writer: a newer one in the slot stays).
    pub(crate) fn lose(&self, key: &ShardKey, shard: ShardId, reason: String) {
        metrics::counter!("memwal_server_shards_lost_total", "table" => self.table.clone())
            .increment(1);
        tracing::warn!(table = %self.table, %shard, %reason, "shard taken over; no longer served");
        self.slots
            .cell(key)
            .replace_live(shard, Slot::Lost { shard, reason });
    }

    /// See [`crate::TableHost::reopen_down_shards`].
    pub(crate) async fn reopen_down(&self, live: &dyn GoLive) -> usize {
        let mut still_down = 0;
        for (key, slot) in self.slots.snapshot() {
            if let Slot::Down { .. } = slot {
                if due(&slot) && self.writer(&key, live).await.is_ok() {
                    continue;
                }
                still_down += 1;
            }
        }
        still_down
    }

    /// See [`crate::TableHost::down_shards`].
    pub(crate) fn down_shards(&self) -> Vec<String> {
        self.slots
            .snapshot()
            .into_iter()
            .filter_map(|(_, s)| match s {
                Slot::Down { shard, cause, .. } => {
                    Some(format!("table `{}`, shard {shard}: {cause}", self.table))
                }
                _ => None,
            })
            .collect()
    }

    /// See [`crate::TableHost::close`].
    pub(crate) async fn close(&self) -> Result<(), ServerError> {
        self.closing.store(true, Ordering::SeqCst);
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
                    table: self.table.clone(),
                    shard: w.shard().to_string(),
                    source,
                });
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// Whether a slot that is not live should be (re)opened now.
fn due(slot: &Slot) -> bool {
    matches!(slot, Slot::Down { retry_at, .. } if *retry_at <= tokio::time::Instant::now())
}
