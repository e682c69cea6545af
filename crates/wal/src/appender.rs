//! The WAL appender: the handle callers append through.
//!
//! Appends are queued synchronously (enqueue order is WAL order) and
//! written by one background task, [`crate::commit`], with group commit:
//! at most one PUT is in flight, and the next PUT carries everything queued
//! meanwhile (bounded by [`WalConfig::max_entry_bytes`]).

use std::collections::VecDeque;
use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use memwal_fencing::{ManifestStore, ShardId};
use parking_lot::Mutex;
use tokio::sync::{oneshot, Notify};
use tokio::task::{AbortHandle, JoinHandle};
use tracing::Instrument;

use crate::commit::CommitTask;
use crate::stamp::ProducerStamp;
use crate::{WalError, WalLocation, WalResult};

/// Appender settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalConfig {
    /// Upper bound on the (in-memory) size of the appends one entry groups;
    /// a single larger append still goes alone in its own entry.
    pub max_entry_bytes: usize,
    /// How long the task waits, once work is queued and no PUT is in
    /// flight, before taking it. 0 (the default) means never wait.
    pub linger: Duration,
    /// Regrouping: when the previous entry carried N appends and fewer
    /// than N are queued once it is acknowledged, the task waits for the
    /// other producers to come back, for at most half the previous PUT's
    /// duration and at most this long, so concurrent producers keep
    /// sharing one entry instead of splitting into a small and a large
    /// one. A lone producer (N = 1) never waits; after a wait that timed
    /// out, N follows the smaller group. Default 1 ms; 0 disables.
    pub max_regroup_wait: Duration,
}

impl Default for WalConfig {
    /// 16 MiB entries, no linger, regrouping up to 1 ms.
    fn default() -> Self {
        Self {
            max_entry_bytes: 16 << 20,
            linger: Duration::ZERO,
            max_regroup_wait: Duration::from_millis(1),
        }
    }
}

/// A durable append: its rows are in the entry at `position`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendAck {
    /// The WAL position of the entry holding the rows.
    pub position: u64,
    /// The generation recorded in that entry.
    pub generation: u64,
    /// Indexes of this append's batches among the entry's decoded batches
    /// ([`crate::WalEntry::batches`]; a batch larger than
    /// [`crate::codec::MESSAGE_BODY_BYTES`] spans several).
    pub batches: Range<usize>,
}

/// A generation switch that took effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenerationSwitch {
    /// The generation appends got before the switch.
    pub previous_generation: u64,
    /// The generation appends get after it.
    pub generation: u64,
    /// The highest WAL position written before the switch (the appender's
    /// start position - 1 if none): every entry at or below it holds rows
    /// of `previous_generation` or older; every later entry holds newer ones.
    pub last_position: u64,
}

/// Resolves when an append is durable (or definitely failed, or its
/// outcome is unknown). Dropping it does not cancel the append.
#[derive(Debug)]
pub struct AppendTicket {
    rx: oneshot::Receiver<WalResult<AppendAck>>,
}

impl Future for AppendTicket {
    type Output = WalResult<AppendAck>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(WalError::Closed)))
    }
}

/// Resolves when a generation switch reaches the head of the queue.
#[derive(Debug)]
pub struct SwitchTicket {
    rx: oneshot::Receiver<WalResult<GenerationSwitch>>,
}

impl Future for SwitchTicket {
    type Output = WalResult<GenerationSwitch>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(WalError::Closed)))
    }
}

/// An append waiting in the queue.
pub(crate) struct Pending {
    pub batches: Vec<RecordBatch>,
    /// Recorded in the entry's `memwal:producers` metadata.
    pub stamp: Option<ProducerStamp>,
    pub schema: SchemaRef,
    pub bytes: usize,
    pub generation: u64,
    pub tx: oneshot::Sender<WalResult<AppendAck>>,
}

pub(crate) enum Item {
    Append(Pending),
    Switch {
        generation: u64,
        tx: oneshot::Sender<WalResult<GenerationSwitch>>,
    },
}

impl Item {
    pub(crate) fn fail(self, err: WalError) {
        match self {
            Item::Append(p) => drop(p.tx.send(Err(err))),
            Item::Switch { tx, .. } => drop(tx.send(Err(err))),
        }
    }
}

#[derive(Default)]
pub(crate) struct Queue {
    pub items: VecDeque<Item>,
    /// Generation given to the next submitted append.
    pub generation: u64,
    pub queued_appends: usize,
    pub closing: bool,
    pub poison: Option<WalError>,
}

/// How many appends a [`WalAppender`] took and how many of them are
/// durable ([`WalAppender::counts`]).
///
/// Guarantees: `durable() <= submitted()`; appends become durable in the
/// order they were submitted (group commit writes the queue's head first,
/// one entry at a time), so the durable ones are always the first
/// `durable()` submitted; an append's durable count is raised before its
/// ticket resolves `Ok`, so every acknowledged append is counted. An
/// append that fails (or whose outcome is unknown) is never counted, nor
/// is any submitted after it (the failure poisons the appender).
#[derive(Debug, Default)]
pub struct AppendCounts {
    submitted: AtomicU64,
    durable: AtomicU64,
}

impl AppendCounts {
    /// Appends submitted so far ([`WalAppender::submit`] returned a ticket).
    pub fn submitted(&self) -> u64 {
        self.submitted.load(Ordering::SeqCst)
    }

    /// Appends known durable so far: the first `durable()` submitted.
    pub fn durable(&self) -> u64 {
        self.durable.load(Ordering::SeqCst)
    }

    /// Submitted appends not (yet) durable: the last `pending()` submitted.
    /// Exact while no submit runs concurrently (a caller that submits only
    /// under its own lock reads it under that lock); the durable count may
    /// only grow meanwhile, never past the submitted one.
    pub fn pending(&self) -> u64 {
        let submitted = self.submitted();
        submitted.saturating_sub(self.durable())
    }

    pub(crate) fn submitted_one(&self) {
        self.submitted.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn made_durable(&self, appends: usize) {
        self.durable.fetch_add(appends as u64, Ordering::SeqCst);
    }
}

/// State shared by the handles and the task.
pub(crate) struct Shared {
    pub queue: Mutex<Queue>,
    pub wake: Notify,
    pub shard: ShardId,
    pub epoch: u64,
    /// Highest position acknowledged durable (start - 1 until the first).
    pub durable: AtomicU64,
    /// Appends submitted and made durable.
    pub counts: Arc<AppendCounts>,
}

struct Handle {
    shared: Arc<Shared>,
    task: tokio::sync::Mutex<Option<JoinHandle<()>>>,
    abort: AbortHandle,
}

impl Drop for Handle {
    /// The last handle going away stops the task: an entry in flight
    /// resolves its tickets as [`WalError::OutcomeUnknown`], queued appends
    /// as [`WalError::Closed`]. Use [`WalAppender::close`] to drain instead.
    fn drop(&mut self) {
        self.abort.abort();
    }
}

/// Appends record batches to one shard's WAL as the writer holding `epoch`.
///
/// Cheap to clone; all clones feed one queue and one background task (a
/// tokio task in the span `wal_appender`). Guarantees:
///
/// - an append resolves `Ok` only once its entry is durable (the store
///   acknowledged the PUT, or a retry found exactly our bytes there);
/// - positions are contiguous from the start position and entry N+1 is
///   never written before N succeeded (at most one PUT in flight);
/// - appends share an entry only if they have the same schema and the same
///   generation; each generation occupies one contiguous run of positions;
/// - a collision at the next position is resolved by reloading the
///   manifest: a newer epoch (in the manifest or the entry) is
///   [`WalError::Fenced`], a sealed shard [`WalError::Sealed`], other bytes
///   of our own epoch [`WalError::EpochConflict`]; only a data-less fence
///   sentinel of an older writer (a stale claimer's) is stepped over;
/// - a failure poisons the appender: every pending and later append fails
///   with the same error (e.g. [`WalError::Fenced`] after a collision with
///   a newer writer's entry), and nothing more is acknowledged. Appends in
///   an entry whose PUT outcome is unknown get [`WalError::OutcomeUnknown`];
///   a definite refusal of the store is [`WalError::Storage`] (not written).
///   Appends arrow cannot encode poison it too ([`WalError::Unencodable`]):
///   no later entry and no generation switch follows rows never logged.
#[derive(Clone)]
pub struct WalAppender {
    handle: Arc<Handle>,
}

impl std::fmt::Debug for WalAppender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalAppender")
            .field("shard", &self.handle.shared.shard)
            .field("epoch", &self.handle.shared.epoch)
            .finish()
    }
}

impl WalAppender {
    /// Starts the appender of the writer holding `epoch` (its won claim),
    /// writing its first entry at `first_position` (its fence sentinel's
    /// position + 1) with `generation`. Must be called within a tokio runtime.
    ///
    /// `manifests` is reloaded when a PUT collides, to tell a fence from a
    /// protocol violation.
    pub fn start(
        manifests: Arc<ManifestStore>,
        epoch: u64,
        first_position: u64,
        generation: u64,
        config: WalConfig,
    ) -> WalResult<Self> {
        if first_position == 0 {
            return Err(WalError::invalid("WAL positions are 1-based"));
        }
        let loc = WalLocation::of(&manifests);
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                generation,
                ..Default::default()
            }),
            wake: Notify::new(),
            shard: loc.shard(),
            epoch,
            durable: AtomicU64::new(first_position - 1),
            counts: Arc::default(),
        });
        let task = CommitTask::new(
            shared.clone(),
            loc,
            manifests,
            config,
            first_position,
            generation,
        );
        let span = tracing::info_span!("wal_appender", shard = %shared.shard, epoch);
        let join = tokio::spawn(task.run().instrument(span));
        let abort = join.abort_handle();
        Ok(Self {
            handle: Arc::new(Handle {
                shared,
                task: tokio::sync::Mutex::new(Some(join)),
                abort,
            }),
        })
    }

    /// The shard.
    pub fn shard(&self) -> ShardId {
        self.handle.shared.shard
    }

    /// The epoch this appender writes with.
    pub fn epoch(&self) -> u64 {
        self.handle.shared.epoch
    }

    /// The generation the next submitted append gets.
    pub fn generation(&self) -> u64 {
        self.handle.shared.queue.lock().generation
    }

    /// Appends waiting for a PUT (not counting those in flight).
    pub fn queued(&self) -> usize {
        self.handle.shared.queue.lock().queued_appends
    }

    /// The highest position acknowledged durable so far (start - 1 before
    /// the first).
    pub fn last_durable_position(&self) -> u64 {
        self.handle.shared.durable.load(Ordering::SeqCst)
    }

    /// This appender's append counts: how many appends were submitted and
    /// how many of them are durable (see [`AppendCounts`]). The handle
    /// stays valid after the appender closed or failed.
    pub fn counts(&self) -> Arc<AppendCounts> {
        self.handle.shared.counts.clone()
    }

    /// Enqueues an append now (its place in the WAL order is fixed when
    /// this returns) and returns a ticket for its outcome.
    ///
    /// `batches` must be non-empty, have at least one column and share one
    /// schema, else [`WalError::InvalidInput`]. A poisoned appender returns
    /// its poison error; a closing one [`WalError::Closed`].
    pub fn submit(&self, batches: Vec<RecordBatch>) -> WalResult<AppendTicket> {
        self.submit_stamped(batches, None)
    }

    /// [`WalAppender::submit`], recording `stamp` (who sent the append)
    /// in the entry that holds it: replay reads it back
    /// ([`crate::WalEntry::producers`]).
    pub fn submit_stamped(
        &self,
        batches: Vec<RecordBatch>,
        stamp: Option<ProducerStamp>,
    ) -> WalResult<AppendTicket> {
        let schema = validate(&batches)?;
        let bytes = batches.iter().map(RecordBatch::get_array_memory_size).sum();
        let (tx, rx) = oneshot::channel();
        {
            let mut q = self.handle.shared.queue.lock();
            check_open(&q)?;
            let generation = q.generation;
            q.items.push_back(Item::Append(Pending {
                batches,
                stamp,
                schema,
                bytes,
                generation,
                tx,
            }));
            q.queued_appends += 1;
            // Counted under the queue lock: the count follows queue order.
            self.handle.shared.counts.submitted_one();
        }
        self.handle.shared.wake.notify_one();
        Ok(AppendTicket { rx })
    }

    /// [`WalAppender::submit`], then waits for the outcome.
    pub async fn append(&self, batches: Vec<RecordBatch>) -> WalResult<AppendAck> {
        self.submit(batches)?.await
    }

    /// Enqueues a generation barrier: appends submitted after this call get
    /// `generation` and never share an entry with appends submitted before.
    /// The ticket resolves once every earlier append is durable, with the
    /// last position written before the switch.
    ///
    /// `generation` must be above the current one ([`WalError::InvalidInput`]).
    pub fn switch_generation(&self, generation: u64) -> WalResult<SwitchTicket> {
        let (tx, rx) = oneshot::channel();
        {
            let mut q = self.handle.shared.queue.lock();
            check_open(&q)?;
            if generation <= q.generation {
                return Err(WalError::invalid(format!(
                    "generation {generation} does not follow generation {}",
                    q.generation
                )));
            }
            q.generation = generation;
            q.items.push_back(Item::Switch { generation, tx });
        }
        self.handle.shared.wake.notify_one();
        Ok(SwitchTicket { rx })
    }

    /// Stops accepting appends, writes everything already queued, then
    /// stops the task and waits for it. `Ok` when the task drained cleanly;
    /// the poison error when the appender failed. Idempotent.
    pub async fn close(&self) -> WalResult<()> {
        self.handle.shared.queue.lock().closing = true;
        self.handle.shared.wake.notify_one();
        let mut task = self.handle.task.lock().await;
        if let Some(join) = task.take() {
            if let Err(e) = join.await {
                tracing::error!(shard = %self.shard(), error = %e, "WAL appender task failed");
                // A task that died mid-way leaves the next entry's fate open.
                let position = self.last_durable_position().saturating_add(1);
                let mut q = self.handle.shared.queue.lock();
                if q.poison.is_none() {
                    q.poison = Some(WalError::OutcomeUnknown {
                        shard: self.shard(),
                        position,
                        path: String::new(),
                        reason: format!("the WAL appender task failed: {e}"),
                    });
                }
            }
        }
        match &self.handle.shared.queue.lock().poison {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

fn check_open(q: &Queue) -> WalResult<()> {
    if let Some(e) = &q.poison {
        return Err(e.clone());
    }
    if q.closing {
        return Err(WalError::Closed);
    }
    Ok(())
}

fn validate(batches: &[RecordBatch]) -> WalResult<SchemaRef> {
    let first = batches
        .first()
        .ok_or_else(|| WalError::invalid("cannot append an empty batch list"))?;
    let schema = first.schema();
    if schema.fields().is_empty() {
        return Err(WalError::invalid("cannot append batches without columns"));
    }
    if batches.iter().any(|b| b.schema() != schema) {
        return Err(WalError::invalid(
            "all batches of one append must share a schema",
        ));
    }
    Ok(schema)
}
