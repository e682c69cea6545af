//! A table's shards placed through a cluster (`memwal_cluster`): which
//! daemon serves each shard, and the moves that follow a member joining or
//! leaving.
//!
//! Rules, for shard `s` of the table, with `recorded` the owner record in
//! etcd and `desired` the rendezvous choice among live members:
//!
//! - rows for `s` are written here only when this daemon is `recorded`
//!   and `desired`, or nobody is recorded and this daemon is `desired`
//!   (it then records itself, only if still nobody is, before it claims:
//!   [`Placement::acquire`]);
//! - otherwise they go to the recorded owner (`desired` when nobody is
//!   recorded), or are refused with `UNAVAILABLE` while the shard moves;
//! - a live shard here that the cluster now places elsewhere is handed
//!   over: closed (flushed and published), then its record released; the
//!   desired member claims it once the record is gone;
//! - a shard desired here and recorded by nobody (its owner left, or
//!   died and its lease expired with its records) is claimed at once, its
//!   WAL replayed: acknowledged rows stay readable and writable.
//!
//! None of this makes a write safe by itself: two daemons that briefly
//! disagree both claim, and the later claim fences the earlier writer,
//! which then acknowledges nothing (`docs/design/cluster.md`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use memwal::ShardId;
use memwal_cluster::{Acquired, Cluster, Member};
use memwal_store::RetryPolicy;

use crate::shards::{hex, GoLive, ShardSet};
use crate::slots::Slot;
use crate::table::ShardKey;
use crate::ServerError;

/// Where rows of a shard go now.
pub(crate) enum Located {
    /// To this daemon's writer.
    Here,
    /// To this member (forwarded).
    At(Member),
    /// Nowhere until the move ends (`UNAVAILABLE`), for this reason.
    Moving(String),
}

/// A table's cluster placement: the membership, and every shard of the
/// table this daemon has heard of.
pub(crate) struct Placement {
    cluster: Arc<Cluster>,
    /// Every shard heard of (stored, recorded by any member, opened here):
    /// a dead member's records vanish with its lease, and the survivors
    /// must still know which shards to claim.
    known: parking_lot::Mutex<BTreeMap<ShardKey, ShardId>>,
    /// Connections to the other members (forwarded parts).
    peers: crate::forward::Peers,
}

impl Placement {
    /// Placement through `cluster`; forwarded parts reach the other
    /// members with `access`.
    pub(crate) fn new(cluster: Arc<Cluster>, access: crate::forward::PeerAccess) -> Self {
        Self {
            cluster,
            known: Default::default(),
            peers: crate::forward::Peers::new(access),
        }
    }

    /// The membership.
    pub(crate) fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    /// Connections to the other members.
    pub(crate) fn peers(&self) -> &crate::forward::Peers {
        &self.peers
    }

    /// Where rows of `shard` of `table` go now (see the module's rules).
    pub(crate) fn locate(&self, table: &str, shard: ShardId) -> Located {
        let view = self.cluster.view();
        let me = self.cluster.id();
        let shard = shard.to_string();
        let desired = view.desired(table, &shard);
        match (view.owner(table, &shard), desired) {
            (_, None) => Located::Moving(
                "no live cluster member (this daemon's lease is being renewed)".into(),
            ),
            (Some(o), Some(d)) if o.member == me => {
                if d.id == me {
                    Located::Here
                } else {
                    Located::Moving(format!("handing over to {}", d.advertise))
                }
            }
            (Some(o), Some(_)) => match view.member(&o.member) {
                Some(m) => Located::At(m.clone()),
                None => Located::Moving(format!(
                    "its owner {} left the cluster; a survivor claims it",
                    o.member
                )),
            },
            (None, Some(d)) if d.id == me => Located::Here,
            (None, Some(d)) => Located::At(d.clone()),
        }
    }

    /// Records this daemon as `shard`'s owner before it claims the shard;
    /// [`ServerError::Moving`] when the cluster does not place it here or
    /// another member holds the record.
    pub(crate) async fn acquire(
        &self,
        table: &str,
        shard: ShardId,
        key: &ShardKey,
    ) -> Result<(), ServerError> {
        let moving = |reason: String| ServerError::Moving {
            table: table.to_string(),
            shard: shard.to_string(),
            reason,
        };
        match self.locate(table, shard) {
            Located::Here => {}
            Located::At(m) => return Err(moving(format!("owned by {}", m.advertise))),
            Located::Moving(reason) => return Err(moving(reason)),
        }
        let values = key.iter().map(|(f, v)| (f.clone(), hex(v))).collect();
        match self
            .cluster
            .acquire(table, &shard.to_string(), values)
            .await
        {
            Ok(Acquired::Mine) => {
                self.known.lock().insert(key.clone(), shard);
                Ok(())
            }
            Ok(Acquired::Held(member)) => Err(moving(format!(
                "member {member} still holds it (a handover in progress)"
            ))),
            Err(e) => Err(moving(format!("etcd: {e}"))),
        }
    }

    /// Adds the shards recorded in the cluster's view to those known.
    fn learn_recorded(&self, table: &str) {
        let view = self.cluster.view();
        let mut known = self.known.lock();
        for (shard, owner) in view.owners_of(table) {
            let Ok(id) = shard.parse::<ShardId>() else {
                continue;
            };
            let key: Option<ShardKey> = owner
                .values
                .iter()
                .map(|(f, v)| unhex(v).map(|b| (f.clone(), b)))
                .collect();
            if let Some(key) = key {
                known.insert(key, id);
            }
        }
    }
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The member recorded as `shard`'s owner, as last seen.
fn recorded_by(p: &Placement, table: &str, shard: ShardId) -> Option<String> {
    p.cluster()
        .view()
        .owner(table, &shard.to_string())
        .map(|o| o.member.clone())
}

/// What one placement pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Moves {
    /// Shards claimed here.
    pub claimed: usize,
    /// Shards handed over.
    pub handed_over: usize,
}

impl ShardSet {
    /// Adds every stored shard of this table's spec to those the
    /// placement knows (a shard no member recorded: created before the
    /// cluster, or by a member that died before this daemon started).
    pub(crate) async fn learn_stored(&self) -> Result<(), ServerError> {
        let Some(p) = self.placement() else {
            return Ok(());
        };
        let setup = |reason: String| ServerError::Setup {
            table: self.table().to_string(),
            reason,
        };
        let shards = memwal_table::list_shards(self.loc())
            .await
            .map_err(|e| setup(e.to_string()))?;
        let known_ids: BTreeSet<ShardId> = p.known.lock().values().copied().collect();
        for shard in shards {
            if known_ids.contains(&shard) {
                continue;
            }
            let m = match memwal_table::latest_manifest(self.loc(), shard, &RetryPolicy::default())
                .await
            {
                Ok(Some(m)) => m,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(table = %self.table(), %shard, error = %e, "stored shard not readable; not placed");
                    continue;
                }
            };
            let identity = memwal_fencing::ShardIdentity::of_manifest(&m);
            if identity.spec_id != self.spec_id() {
                continue;
            }
            let key = self.key_of(identity.field_values);
            if ShardId::for_values(self.spec_id(), &key) != shard {
                // Not the id this daemon derives for those values (made by
                // another tool): claiming by values would create a second.
                tracing::warn!(table = %self.table(), %shard, "stored shard with a foreign id; not placed");
                continue;
            }
            p.known.lock().insert(key, shard);
        }
        Ok(())
    }

    /// One placement pass: hands over each live shard the cluster places
    /// elsewhere, drops stopped shards that are not this daemon's (or are
    /// again), and claims (with a replay) each known shard the cluster
    /// places here that nobody holds. Failures are logged and retried by
    /// the next pass.
    pub(crate) async fn place(&self, live: &dyn GoLive) -> Moves {
        let mut moves = Moves::default();
        let Some(p) = self.placement() else {
            return moves;
        };
        if self.is_closing() {
            return moves;
        }
        let table = self.table().to_string();
        p.learn_recorded(&table);
        let mut keys: BTreeMap<ShardKey, ShardId> = p.known.lock().clone();
        for (key, cell) in self.cells() {
            if let Some(slot) = cell.current() {
                keys.insert(key, slot.shard());
            }
        }
        for (key, shard) in keys {
            let located = p.locate(&table, shard);
            let slot = self.cell_if_any(&key).and_then(|c| c.current());
            match (slot, located) {
                (Some(Slot::Live(_)), Located::Here) => {
                    // Live here but recorded by nobody: this daemon's
                    // lease was lost and replaced, and its records with
                    // it. Record it again (peers forward to it meanwhile).
                    let view = p.cluster().view();
                    if view.owner(&table, &shard.to_string()).is_none() {
                        if let Err(e) = p.acquire(&table, shard, &key).await {
                            tracing::debug!(table, %shard, error = %e, "shard not recorded again yet");
                        }
                    }
                }
                (Some(Slot::Live(_)), Located::At(m)) => {
                    self.hand_over(&key, shard, &format!("owned by {}", m.advertise))
                        .await;
                    moves.handed_over += 1;
                }
                (Some(Slot::Live(_)), Located::Moving(reason)) => {
                    self.hand_over(&key, shard, &reason).await;
                    moves.handed_over += 1;
                }
                (Some(Slot::Lost { .. }), _) => {
                    // Fenced by the member that claimed it: forgotten, so it
                    // can be claimed again once placed here.
                    if let Some(cell) = self.cell_if_any(&key) {
                        cell.clear_stopped();
                        self.forget_if_empty(&key, &cell);
                    }
                }
                (Some(Slot::Down { .. }), Located::At(_) | Located::Moving(_)) => {
                    // Its rows are in the WAL: the new owner replays them.
                    if let Some(cell) = self.cell_if_any(&key) {
                        cell.clear_stopped();
                        self.forget_if_empty(&key, &cell);
                    }
                    if let Err(e) = p.cluster().release(&table, &shard.to_string()).await {
                        // Retried by the next pass (the record is released
                        // only while still this daemon's).
                        tracing::warn!(table, %shard, error = %e, "releasing the shard's record failed");
                    }
                }
                // Recorded by nobody (its owner left or died): claimed
                // at once, its WAL replayed. One recorded here and not
                // open (closed when idle) opens on its next put.
                (None, Located::Here) if recorded_by(p, &table, shard).is_none() => {
                    let started = tokio::time::Instant::now();
                    match self.writer(&key, live).await {
                        Ok(_) => {
                            let took = started.elapsed();
                            tracing::info!(table, %shard, ms = took.as_millis() as u64, "shard claimed (cluster placement)");
                            metrics::counter!("memwal_server_cluster_claims_total", "table" => table.clone())
                                .increment(1);
                            // Record, claim (epoch bump) and WAL replay.
                            metrics::histogram!("memwal_server_cluster_claim_seconds", "table" => table.clone())
                                .record(took.as_secs_f64());
                            moves.claimed += 1;
                        }
                        Err(e) => {
                            tracing::debug!(table, %shard, error = %e, "shard not claimed yet")
                        }
                    }
                }
                // Recorded here, not open, placed elsewhere (closed when
                // idle, or a release that failed): released, so that the
                // desired member can claim it.
                (None, Located::Moving(_))
                    if recorded_by(p, &table, shard).as_deref() == Some(p.cluster().id()) =>
                {
                    if let Err(e) = p.cluster().release(&table, &shard.to_string()).await {
                        tracing::warn!(table, %shard, error = %e, "releasing the shard's record failed");
                    }
                }
                // Closing, down here (the reopener's), failed (corrupt:
                // refused until a restart), or someone else's.
                _ => {}
            }
        }
        moves
    }

    /// Closes the live shard at `key` (flush, publish; rows a racing put
    /// added stay in the WAL for the next owner), forgets it, and releases
    /// its owner record. Puts for it wait on the cell while it closes,
    /// then find it placed elsewhere.
    async fn hand_over(&self, key: &ShardKey, shard: ShardId, reason: &str) {
        let Some(p) = self.placement() else {
            return;
        };
        let Some(cell) = self.cell_if_any(key) else {
            return;
        };
        {
            let _turn = cell.opening.lock().await;
            let Some(Slot::Live(w)) = cell.current() else {
                return;
            };
            if !cell.replace_writer(&w, Slot::Closing(w.clone())) {
                return;
            }
            let started = tokio::time::Instant::now();
            let result = w.close().await;
            cell.take_writer(&w);
            match result {
                Ok(()) => {
                    tracing::info!(table = %self.table(), %shard, reason, ms = started.elapsed().as_millis() as u64, "shard handed over")
                }
                Err(e) => tracing::warn!(table = %self.table(), %shard, reason, error = %e,
                    "shard handed over after a failed close; its rows stay in the WAL for the next owner"),
            }
            metrics::counter!("memwal_server_cluster_handovers_total", "table" => self.table().to_string())
                .increment(1);
            // The close: flush and publish of the shard's held rows.
            metrics::histogram!("memwal_server_cluster_handover_seconds", "table" => self.table().to_string())
                .record(started.elapsed().as_secs_f64());
        }
        self.forget_if_empty(key, &cell);
        if let Err(e) = p.cluster().release(self.table(), &shard.to_string()).await {
            // The record goes with this daemon's lease at worst.
            tracing::warn!(table = %self.table(), %shard, error = %e, "releasing the shard's record failed");
        }
    }
}
