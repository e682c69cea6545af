//! What the writer's handle and its tasks share ([`Inner`]): the state
//! behind the one lock ([`State`]), the lifecycle, the storage operations
//! and the counters; how the writer turns terminal; the one way to wait
//! for the state to change.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use arrow_array::RecordBatch;
use memwal_fencing::{ShardId, ShardManifest};
use memwal_memtable::{FrozenMemTable, MemTable, TableSchema};
use memwal_sstable::WrittenSsTable;
use memwal_wal::WalAppender;
use parking_lot::Mutex;
use tokio::sync::Semaphore;
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::Instant;
use tracing::Instrument;

use crate::config::ShardWriterConfig;
use crate::lifecycle::{panic_text, Lifecycle, Phase};
use crate::resolve::Routing;
use crate::storage::Storage;
use crate::{Error, Result};

/// A frozen generation waiting to be published.
pub(crate) struct Frozen {
    pub generation: u64,
    pub memtable: FrozenMemTable,
    pub bytes: usize,
    pub frozen_at: Instant,
    pub job: AbortHandle,
}

/// What a generation's job hands the flusher: the last WAL position the
/// generation covers and its written (unpublished) SSTable, `None` for a
/// replayed generation that holds no rows.
pub(crate) type JobOutput = (u64, Option<WrittenSsTable>);

/// A generation's SSTable job, queued to the flusher in generation order.
pub(crate) struct Job {
    pub generation: u64,
    pub handle: JoinHandle<Result<JobOutput>>,
    /// Live generations publish strictly as the manifest's
    /// `current_generation`; replayed ones may skip numbers a previous
    /// writer left unused (never go below it).
    pub live: bool,
}

/// Everything the put path and the background tasks change, behind one
/// mutex: WAL submit and memtable insert happen under it, so rows enter
/// the memtable in WAL order and a generation switch is a clean barrier;
/// a frozen generation enters `frozen` and the job queue in the same
/// critical section, so both keep generation order.
pub(crate) struct State {
    /// `None` until `open` is ready for puts, and once terminal.
    pub appender: Option<WalAppender>,
    /// The append counts of the appender ([`State::start_appending`]),
    /// kept after it is gone (closed or terminal): what reads go by.
    ///
    /// Invariant (the visibility watermark): every append submitted to
    /// the appender is paired with exactly one batch inserted into the
    /// active memtable in the same critical section
    /// (`write_path::append_locked`; a failed insert makes the writer
    /// terminal), and nothing else submits. Appends are durable in submit
    /// order, and generations only leave `frozen` once published (after
    /// every earlier append is durable). So under this lock the last
    /// `appends.pending()` batches of the frozen generations (oldest
    /// first) then the active memtable are exactly the rows whose WAL
    /// write is not (yet) durable: never acknowledged, maybe never
    /// written. Replayed batches (inserted before the appender started)
    /// are durable. Reads leave the pending ones out
    /// ([`crate::ShardWriter::read_snapshot`]).
    pub appends: Option<Arc<memwal_wal::AppendCounts>>,
    /// Its schema ([`MemTable::schema`]) is the one puts are checked
    /// against now; a schema change swaps in an empty memtable of the new
    /// schema at a generation boundary (`evolve.rs`).
    pub active: MemTable,
    /// The routing check for rows of `active`'s schema (`None`: a manual
    /// shard, rows not routed); replaced together with the schema.
    pub routing: Option<Arc<Routing>>,
    /// Generation of `active`.
    pub generation: u64,
    /// When the first row of `active` arrived.
    pub active_since: Option<Instant>,
    /// Frozen, unpublished generations, ascending.
    pub frozen: VecDeque<Frozen>,
    /// Highest published generation.
    pub published_generation: u64,
    /// The error every call returns once set (the first one wins).
    pub terminal: Option<Error>,
    pub last_flush_error: Option<String>,
    /// The producers table puts with a producer sequence are admitted by
    /// (`producers.rs`): changed only here, with each stamped submit.
    pub producers: crate::producers::Producers,
    /// Feeds the flusher, in generation order; `None` once terminal.
    pub jobs: Option<tokio::sync::mpsc::UnboundedSender<Job>>,
}

impl State {
    pub(crate) fn check_usable(&self) -> Result<()> {
        match &self.terminal {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Whether the memtables may be read: while usable, and once closed
    /// ([`Error::Closed`]: closing or aborting stops writes and drops no
    /// row, so the memtables still hold every acknowledged row above
    /// `published_generation`). Any other terminal error (fenced, sealed,
    /// a storage failure, corrupt state) is returned.
    pub(crate) fn check_readable(&self) -> Result<()> {
        match &self.terminal {
            None | Some(Error::Closed { .. }) => Ok(()),
            Some(e) => Err(e.clone()),
        }
    }

    /// Makes `appender` the one puts go through, keeping its append counts
    /// (the visibility watermark, see [`State::appends`]).
    pub(crate) fn start_appending(&mut self, appender: WalAppender) {
        self.appends = Some(appender.counts());
        self.appender = Some(appender);
    }

    /// Every physical row not yet published (frozen generations oldest
    /// first, then the active memtable), in WAL order, without the last
    /// `pending` batches (rows whose WAL write is not durable).
    pub(crate) fn unpublished_batches(&self, pending: u64) -> Vec<RecordBatch> {
        let mut out: Vec<RecordBatch> = Vec::new();
        for f in &self.frozen {
            out.extend(f.memtable.batches().iter().cloned());
        }
        out.extend(self.active.batches().iter().cloned());
        let pending = usize::try_from(pending).unwrap_or(usize::MAX);
        out.truncate(out.len().saturating_sub(pending));
        out
    }

    /// Batches submitted to the WAL whose write is not yet durable (the
    /// last ones in the memtables; see [`State::appends`]).
    pub(crate) fn pending_appends(&self) -> u64 {
        self.appends.as_ref().map_or(0, |c| c.pending())
    }

    /// The schema and routing check puts are validated against now.
    pub(crate) fn shape(&self) -> (Arc<TableSchema>, Option<Arc<Routing>>) {
        (self.active.schema().clone(), self.routing.clone())
    }

    pub(crate) fn unflushed_bytes(&self) -> usize {
        self.active.memory_usage().total() + self.frozen.iter().map(|f| f.bytes).sum::<usize>()
    }
}

/// What the writer's handle and tasks share.
pub(crate) struct Inner {
    pub shard: ShardId,
    pub epoch: u64,
    pub sentinel: u64,
    pub config: ShardWriterConfig,
    pub storage: Storage,
    pub state: Mutex<State>,
    /// Latest manifest this writer wrote (or claimed).
    pub manifest: Mutex<ShardManifest>,
    pub life: Lifecycle,
    pub flush_permits: Arc<Semaphore>,
    pub puts: AtomicU64,
    pub rows: AtomicU64,
    pub publishes: AtomicU64,
    pub backpressure_waits: AtomicU64,
    /// SSTable writes and publishes that failed transiently.
    pub flush_failures: AtomicU64,
    /// The shard's compaction debt (write stalls).
    pub debt: crate::stall::Debt,
}

impl Inner {
    /// The shared state of a writer that claimed `manifest` at `epoch`
    /// (fence sentinel at `sentinel`): no WAL appender yet, an empty active
    /// memtable of `schema` in the manifest's `current_generation`, phase
    /// `Opening`. Returns the receiving end of the job queue, for the
    /// flusher the caller spawns.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        shard: ShardId,
        epoch: u64,
        sentinel: u64,
        config: ShardWriterConfig,
        storage: Storage,
        schema: Arc<TableSchema>,
        routing: Option<Routing>,
        manifest: ShardManifest,
    ) -> (Arc<Self>, tokio::sync::mpsc::UnboundedReceiver<Job>) {
        let (jobs_tx, jobs_rx) = tokio::sync::mpsc::unbounded_channel();
        let inner = Arc::new(Self {
            shard,
            epoch,
            sentinel,
            flush_permits: Arc::new(Semaphore::new(config.flush_concurrency)),
            config,
            storage,
            state: Mutex::new(State {
                appender: None,
                appends: None,
                active: MemTable::new(schema),
                routing: routing.map(Arc::new),
                generation: manifest.current_generation.max(1),
                active_since: None,
                frozen: VecDeque::new(),
                published_generation: manifest.current_generation.saturating_sub(1),
                terminal: None,
                last_flush_error: None,
                producers: Default::default(),
                jobs: Some(jobs_tx),
            }),
            manifest: Mutex::new(manifest),
            life: Lifecycle::new(),
            puts: AtomicU64::new(0),
            rows: AtomicU64::new(0),
            publishes: AtomicU64::new(0),
            backpressure_waits: AtomicU64::new(0),
            flush_failures: AtomicU64::new(0),
            debt: crate::stall::Debt::default(),
        });
        let listed = inner.manifest.lock().sstables.len();
        inner.debt.set(&inner, listed);
        (inner, jobs_rx)
    }

    /// Makes the writer terminal with `err` (the first error wins): the
    /// appender is dropped (nothing more is written or acknowledged through
    /// it), the job queue closed, unpublished jobs aborted, background
    /// tasks told to stop, waiters woken.
    pub(crate) fn fail_locked(&self, st: &mut State, err: Error) {
        if st.terminal.is_none() {
            if err.is_fenced() {
                self.storage.meters.fenced.increment(1);
                tracing::warn!(shard = %self.shard, epoch = self.epoch, error = %err, "shard writer fenced");
            } else if !matches!(err, Error::Closed { .. }) {
                tracing::error!(shard = %self.shard, epoch = self.epoch, error = %err, "shard writer failed");
            }
            st.terminal = Some(err);
        }
        st.jobs = None;
        drop(st.appender.take());
        for f in &st.frozen {
            f.job.abort();
        }
        self.life.advance(Phase::Stopped);
        self.life.bump();
    }

    /// [`Inner::fail_locked`] taking the lock.
    pub(crate) fn fail(&self, err: Error) {
        let mut st = self.state.lock();
        self.fail_locked(&mut st, err);
    }

    pub(crate) fn record_unflushed(&self, st: &State) {
        self.storage
            .meters
            .unflushed_bytes
            .set(st.unflushed_bytes() as f64);
    }

    /// Runs `check` under the state lock now and again after every
    /// progress bump (publish, flush failure, terminal transition) until it
    /// returns `Some`; `Ok(None)` once `deadline` passes first. A bump
    /// between two checks is never missed (the watch is subscribed before
    /// the first check and marked seen under the lock).
    pub(crate) async fn wait_until<T>(
        &self,
        deadline: Option<Instant>,
        mut check: impl FnMut(&mut State) -> Option<Result<T>>,
    ) -> Result<Option<T>> {
        let mut progress = self.life.watch_progress();
        loop {
            {
                let mut st = self.state.lock();
                progress.borrow_and_update();
                if let Some(r) = check(&mut st) {
                    return r.map(Some);
                }
            }
            let changed = match deadline {
                Some(d) => match tokio::time::timeout_at(d, progress.changed()).await {
                    Ok(r) => r,
                    Err(_) => return Ok(None),
                },
                None => progress.changed().await,
            };
            if changed.is_err() {
                return Err(Error::closed("the writer is gone"));
            }
        }
    }

    /// Spawns `work` as a task of this writer inside `span`, watched: if
    /// it panics, the panic becomes the writer's terminal error
    /// ([`Error::Corrupt`] naming `what`). Otherwise a waiting `flush` or
    /// backpressured put would wait on a task that is gone.
    pub(crate) fn spawn_monitored(
        self: &Arc<Self>,
        what: &'static str,
        span: tracing::Span,
        work: impl Future<Output = ()> + Send + 'static,
    ) {
        use futures::FutureExt;
        let inner = self.clone();
        self.life.spawn(
            async move {
                if let Err(panic) = std::panic::AssertUnwindSafe(work).catch_unwind().await {
                    inner.fail(Error::corrupt(format!(
                        "the {what} panicked: {}",
                        panic_text(&*panic)
                    )));
                }
            }
            .instrument(span),
        );
    }
}
