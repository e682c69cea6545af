//! One served table: a thin façade over its parts, each holding its own
//! state in its own file:
//!
//! - the shard set (`shards.rs`, with `slots.rs`, `limits.rs` and
//!   `status.rs`): which shards this daemon owns, their writers, opening,
//!   reopening, idle closes, caps and status;
//! - ingest (`ingest.rs`): puts split by the table's sharding spec and
//!   acknowledged once every part is durable, and flush admission;
//! - the columns served and schema changes (`evolve.rs`, `columns.rs`);
//! - reads (`reader/`: snapshots and views, scans, lookups, searches,
//!   the memtables they keep).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_schema::SchemaRef;
use memwal::{ShardId, ShardWriterConfig, StoreLocation};
use memwal_sstable::LanceStore;
use memwal_table::BaseTable;

use crate::columns::Shape;
use crate::evolve::Following;
use crate::ingest::Ingest;
use crate::limits::ShardLimits;
use crate::shards::ShardSet;
use crate::slots::Slot;
use crate::status::ShardStatus;
use crate::ServerError;

/// Shard field values identifying a shard under the table's spec.
pub type ShardKey = BTreeMap<String, Vec<u8>>;

/// A table the daemon serves.
pub struct TableHost {
    name: String,
    /// The columns puts are checked and routed by, and schema changes.
    following: Following,
    /// The shards, their writers and their slots.
    shards: ShardSet,
    /// Flush admission.
    ingest: Ingest,
    /// The table's compactor, when the daemon runs one (status only).
    compactor: std::sync::OnceLock<memwal_compactor::Compactor>,
    /// Reads' state: kept SSTables and memtables, counts (`reader/`).
    reader: crate::reader::Reader,
}

impl std::fmt::Debug for TableHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableHost")
            .field("name", &self.name)
            .field("uri", &self.loc().uri)
            .finish_non_exhaustive()
    }
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
        Self::open_placed(name, loc, config, buckets, None).await
    }

    /// [`TableHost::open`] as a member of `cluster`: the table's shards are
    /// spread over the cluster's live members (`placement.rs`); none is
    /// claimed here until [`Self::spawn_placement`] runs. Rows of shards
    /// other members own are forwarded to them, reached with `access`
    /// (the cluster's token, and its CA when members serve TLS). Every
    /// member must serve the table under the same name.
    pub async fn open_cluster(
        name: &str,
        loc: StoreLocation,
        config: ShardWriterConfig,
        cluster: Arc<memwal_cluster::Cluster>,
        access: crate::forward::PeerAccess,
    ) -> Result<Self, ServerError> {
        if name.contains('/') {
            return Err(ServerError::Setup {
                table: name.to_string(),
                reason: "a clustered table's name cannot contain `/` (it is part of etcd keys)"
                    .into(),
            });
        }
        let placement = crate::placement::Placement::new(cluster, access);
        Self::open_placed(name, loc, config, None, Some(placement)).await
    }

    async fn open_placed(
        name: &str,
        loc: StoreLocation,
        config: ShardWriterConfig,
        buckets: Option<&[u32]>,
        placement: Option<crate::placement::Placement>,
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
        let unsharded = shape.router.is_none();
        let mut shards =
            ShardSet::new(name, loc, &spec, unsharded, config, buckets).map_err(setup)?;
        if let Some(placement) = placement {
            shards.join_cluster(placement);
            shards.learn_stored().await?;
        }
        let host = Self {
            name: name.to_string(),
            following: Following::new(spec, shape),
            shards,
            ingest: Ingest::default(),
            compactor: std::sync::OnceLock::new(),
            reader: Default::default(),
        };
        host.shards.open_existing().await?;
        Ok(host)
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The table's Arrow schema (what a put sends), as of the last schema
    /// change this host followed ([`Self::evolve`]).
    pub fn schema(&self) -> SchemaRef {
        self.shape().schema.clone()
    }

    /// The primary-key columns (what a delete sends).
    pub fn key_schema(&self) -> SchemaRef {
        self.shape().key_schema.clone()
    }

    /// How many scans and key lookups this host has served (a query
    /// whose filter names keys is a lookup, any other a scan).
    pub fn read_counts(&self) -> (u64, u64) {
        self.reader.counts()
    }

    /// The reads' state (`reader/`).
    pub(crate) fn reader(&self) -> &crate::reader::Reader {
        &self.reader
    }

    /// Charges what reads keep between queries (other writers' unpublished
    /// WAL rows, the indexes built over unflushed rows) to `pool` while
    /// they keep it: a read that would keep more than `pool` has free
    /// fails with [`ServerError::OverBudget`] (`RESOURCE_EXHAUSTED`) and
    /// keeps nothing. The daemon passes the memory all its queries share
    /// (`query_total_memory_mib`); without a call nothing is charged.
    pub fn charge_reads_to(
        &self,
        pool: std::sync::Arc<dyn datafusion::execution::memory_pool::MemoryPool>,
    ) {
        self.reader.charge_to(pool)
    }

    /// The columns puts are checked and routed by now.
    pub(crate) fn shape(&self) -> Arc<Shape> {
        self.following.current()
    }

    /// The table's location.
    pub(crate) fn loc(&self) -> &StoreLocation {
        self.shards.loc()
    }

    /// The shard set.
    pub(crate) fn shards(&self) -> &ShardSet {
        &self.shards
    }

    /// Ingest's state (flush admission).
    pub(crate) fn ingest(&self) -> &Ingest {
        &self.ingest
    }

    /// The columns served, and the schema-change lock.
    pub(crate) fn following(&self) -> &Following {
        &self.following
    }

    /// Marks the live writer of `shard` at `key` lost to another writer.
    pub(crate) fn lose(&self, key: &ShardKey, shard: ShardId, reason: String) {
        self.shards.lose(key, shard, reason)
    }

    /// Why rows of a shard in `slot` (not live) are refused now, and why
    /// a read of the table is (down or failed shards).
    pub(crate) fn refusal(&self, slot: &Slot) -> ServerError {
        self.shards.refusal(slot)
    }

    /// Reopens every shard that is down and due (the host's monitor calls
    /// this; puts reopen a due shard too). Returns how many stay down.
    pub async fn reopen_down_shards(&self) -> usize {
        self.shards.reopen_down(self).await
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

    /// In a cluster ([`Self::open_cluster`]): runs a placement pass at
    /// once, then after every change of the cluster's view and every
    /// second, until `stop` turns true: shards placed here and held by
    /// nobody are claimed (and replayed), shards placed elsewhere are
    /// handed over (see `placement.rs`). A pass that panics is logged and
    /// counted, and the next one runs. `None` outside a cluster.
    pub fn spawn_placement(
        self: &Arc<Self>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> Option<tokio::task::JoinHandle<()>> {
        use futures::FutureExt;
        let mut views = self.shards.placement()?.cluster().subscribe();
        let host = self.clone();
        let span = tracing::info_span!("placement", table = %self.name);
        Some(tokio::spawn(tracing::Instrument::instrument(
            async move {
                let mut members: Vec<String> = Vec::new();
                loop {
                    let view = views.borrow_and_update().clone();
                    let now: Vec<String> = view.members().map(|m| m.id.clone()).collect();
                    if now != members {
                        members = now;
                        // A member left: shards it created may be unknown
                        // here (created before this daemon watched).
                        if let Err(e) = host.shards.learn_stored().await {
                            tracing::warn!(error = %e, "listing stored shards failed");
                        }
                    }
                    let pass = std::panic::AssertUnwindSafe(host.shards.place(host.as_ref()))
                        .catch_unwind()
                        .await;
                    if pass.is_err() {
                        metrics::counter!("memwal_server_placement_panics_total", "table" => host.name.clone())
                            .increment(1);
                        tracing::error!("a placement pass panicked; the next one runs");
                    }
                    tokio::select! {
                        biased;
                        _ = stop.wait_for(|s| *s) => break,
                        _ = views.changed() => {}
                        _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                    }
                }
            },
            span,
        )))
    }

    /// In a cluster: each recorded shard of the table (id, field values as
    /// hex) with its owner's advertised address; empty outside a cluster.
    pub fn shard_owners(&self) -> Vec<(String, BTreeMap<String, String>, String)> {
        let Some(p) = self.shards.placement() else {
            return Vec::new();
        };
        let view = p.cluster().view();
        view.owners_of(&self.name)
            .filter_map(|(shard, o)| {
                let m = view.member(&o.member)?;
                Some((shard.to_string(), o.values.clone(), m.advertise.clone()))
            })
            .collect()
    }

    /// In a cluster: this member, the live members, and each recorded
    /// shard of the table with its owner and the member the cluster
    /// places it on now (a move is in progress where they differ), as
    /// JSON (`/status`); `None` outside a cluster.
    pub fn cluster_status(&self) -> Option<serde_json::Value> {
        let c = self.shards.placement()?.cluster();
        let view = c.view();
        let members: Vec<serde_json::Value> = view
            .members()
            .map(|m| serde_json::json!({ "id": m.id, "advertise": m.advertise }))
            .collect();
        let shards: serde_json::Map<String, serde_json::Value> = view
            .owners_of(&self.name)
            .map(|(shard, o)| {
                let desired = view.desired(&self.name, shard).map(|m| m.id.clone());
                // Recorded on one member, placed on another: being handed
                // over (or its owner's lease is about to expire).
                let moving = desired.as_deref() != Some(o.member.as_str());
                (
                    shard.to_string(),
                    serde_json::json!({
                        "owner": o.member,
                        "desired": desired,
                        "moving": moving,
                        "values": o.values,
                    }),
                )
            })
            .collect();
        let moving = shards.values().filter(|s| s["moving"] == true).count();
        Some(serde_json::json!({
            "member": c.id(),
            "advertise": c.advertise(),
            "revision": view.revision,
            "members": members,
            "moves_in_progress": moving,
            "compactor": view.compactor(&self.name).map(|m| m.id.clone()),
            "shards": shards,
        }))
    }

    /// The shards that are down, with why: what `/readyz` reports.
    pub fn down_shards(&self) -> Vec<String> {
        self.shards.down_shards()
    }

    /// Sets the caps on open shards (see [`ShardLimits`]).
    pub fn set_shard_limits(&self, limits: ShardLimits) {
        self.shards.set_limits(limits)
    }

    /// Flushes, closes and forgets every live shard no rows arrived for in
    /// `idle_close` (the host's monitor calls this). Returns how many
    /// shards closed.
    ///
    /// Guarantees: the writer stays in its slot, as closing,
    /// until its close ended, so reads keep taking its snapshot (its rows
    /// are not all published before the close ends); rows for the shard
    /// wait while it closes (on the cell's `opening` lock), then open it
    /// again. Only a close that published every row leaves the slot
    /// empty (the shard read as published). A close that failed, or left
    /// rows unpublished (a put that raced it), leaves the shard down (due
    /// at once): reads refuse it (its rows are only in the WAL) until the
    /// next put for it, or the host's reopener
    /// ([`Self::spawn_reopener`]), reopens it and replays them; a
    /// fenced writer leaves it lost.
    ///
    /// A shard whose close published every row is remembered by reads as
    /// at rest while its manifest stays at the version the close left (no
    /// writer has claimed it since, so its WAL holds nothing above the
    /// cursor): reads skip its WAL (`reader/tails.rs`).
    pub async fn close_idle_shards(&self) -> usize {
        let (closed, at_rest) = self.shards.close_idle().await;
        for (shard, version) in at_rest {
            self.reader.closed_at_rest(shard, version);
        }
        closed
    }

    /// Sets every live writer's gauges again (the daemon's metrics drop
    /// series not updated for a while; see [`memwal::ShardWriter::refresh_gauges`]).
    pub fn refresh_gauges(&self) {
        self.shards.refresh_gauges()
    }

    /// Closes every served shard at once (flush, publish, stop), each
    /// bounded by the writer's `close_timeout`, reporting the first failure
    /// after trying all. Rows a failed close could not flush stay in the WAL.
    /// A writer found fenced (another writer took the shard over, and
    /// replayed its acknowledged rows) is not a failure: the takeover is
    /// logged and the shard marked lost.
    pub async fn close(&self) -> Result<(), ServerError> {
        self.shards.close().await
    }

    /// Every shard's state, with its compaction progress read from the base
    /// table (`None` there when the base cannot be read), sorted by shard
    /// values.
    pub async fn status(&self) -> Vec<ShardStatus> {
        self.shards.status().await
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

    /// The attached compactor's base maintenance, as JSON: `base` (the
    /// base table's shape after the last run: fragments, live and deleted
    /// rows, deletion files, data bytes, version), `last` (what the last
    /// run did, or `error`) and `last_commit` (the last rewrite); `None`
    /// without a compactor.
    pub fn maintenance(&self) -> Option<serde_json::Value> {
        let c = self.compactor.get()?;
        let health = |h: &memwal_compactor::BaseHealth| {
            serde_json::json!({
                "version": h.version,
                "fragments": h.fragments,
                "live_rows": h.live_rows,
                "deleted_rows": h.deleted_rows,
                "deleted_share": h.deleted_share(),
                "deletion_files": h.deletion_files,
                "data_bytes": h.data_bytes,
            })
        };
        let report = |r: &memwal_compactor::MaintenanceReport| {
            serde_json::json!({
                "seconds": r.seconds,
                "committed": r.committed,
                "chosen": r.chosen,
                "fragments_removed": r.fragments_removed,
                "fragments_added": r.fragments_added,
                "skipped": r.skipped,
            })
        };
        let last = c.last_maintenance();
        let base = match &last {
            Some(Ok(r)) => Some(health(&r.after)),
            _ => None,
        };
        let last = last.map(|l| match l {
            Ok(r) => report(&r),
            Err(e) => serde_json::json!({ "error": e }),
        });
        let last_commit = c.last_maintenance_commit().map(|r| report(&r));
        Some(serde_json::json!({ "base": base, "last": last, "last_commit": last_commit }))
    }
}
