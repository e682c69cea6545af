//! Unit tests below `ShardWriter::open`: the flusher, the write path's
//! queues and the lifecycle on a shared state built by hand (an in-memory
//! store behind a `FaultStore`, no Lance table), in paused time (no real
//! sleeps: a backoff or a timeout elapses as soon as every task is idle).

use std::sync::Arc;
use std::time::Duration;

use arrow_schema::{DataType, Field, Schema};
use memwal_fencing::{ManifestStore, ShardId, ShardIdentity, ShardLayout};
use memwal_memtable::{MemTable, TableSchema};
use memwal_sstable::{LanceStore, SsTableWriter};
use memwal_store::RetryPolicy;
use memwal_testkit::{Action, FaultStore, Gate, OpKind};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStore;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::config::ShardWriterConfig;
use crate::lifecycle::Phase;
use crate::state::{Inner, JobOutput};
use crate::storage::Storage;
use crate::{Error, Result, ShardWriter};

/// A writer's shared state on an in-memory shard (claimed at epoch 1,
/// `current_generation` 1), its flusher running, no WAL appender.
struct Harness {
    inner: Arc<Inner>,
    mem: Arc<dyn ObjectStore>,
    fault: Arc<FaultStore>,
    root: Path,
    shard: ShardId,
}

fn config() -> ShardWriterConfig {
    ShardWriterConfig {
        max_unflushed_age: None,
        flush_retry: RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
        },
        close_timeout: Duration::from_secs(5),
        ..Default::default()
    }
}

async fn harness(config: ShardWriterConfig) -> Harness {
    let mem: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let fault = FaultStore::new(mem.clone());
    let root = Path::from("tbl");
    let shard = ShardId::random();
    let store: Arc<dyn ObjectStore> = fault.clone();
    let manifests = Arc::new(ManifestStore::new(
        store.clone(),
        &root,
        shard,
        RetryPolicy::immediate(1),
    ));
    let claim = manifests
        .claim(Some(&ShardIdentity::manual()))
        .await
        .unwrap();
    let schema = Arc::new(
        TableSchema::new(Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Utf8, true),
        ])))
        .unwrap(),
    );
    let storage = Storage {
        manifests: manifests.clone(),
        epoch: claim.epoch,
        sstables: SsTableWriter::new(
            store.clone(),
            ShardLayout::new(&root, shard),
            Default::default(),
        ),
        base: Arc::new(LanceStore::new(store)),
        base_root: root.clone(),
        meters: Arc::new(crate::stats::Meters::new(&shard)),
        indexes: Default::default(),
    };
    let (inner, jobs_rx) = Inner::new(
        shard,
        claim.epoch,
        0,
        config,
        storage,
        schema,
        None,
        claim.manifest,
    );
    inner.spawn_monitored(
        "flusher",
        tracing::info_span!("flusher"),
        crate::flusher::flusher(inner.clone(), jobs_rx),
    );
    inner.life.advance(Phase::Open);
    Harness {
        inner,
        mem,
        fault,
        root,
        shard,
    }
}

impl Harness {
    /// Queues an empty generation (the next number) whose job finishes
    /// when the returned sender fires (covering WAL position `g`).
    fn queue(&self) -> oneshot::Sender<()> {
        let (tx, rx) = oneshot::channel::<()>();
        let mut st = self.inner.state.lock();
        let generation = st.generation;
        st.generation += 1;
        let memtable = MemTable::new(st.active.schema().clone()).freeze();
        let job = async move {
            let _ = rx.await;
            Ok::<JobOutput, Error>((generation, None))
        };
        crate::write_path::enqueue(&self.inner, &mut st, generation, memtable, job, true).unwrap();
        tx
    }

    /// Queues a generation holding rows whose job writes its SSTable
    /// (with retries) as a replayed generation's job does.
    fn queue_rows(&self) {
        let mut st = self.inner.state.lock();
        let generation = st.generation;
        st.generation += 1;
        let schema = st.active.schema().clone();
        let batch = arrow_array::RecordBatch::try_new(
            schema.table_schema().clone(),
            vec![
                Arc::new(arrow_array::Int64Array::from(vec![1, 2])),
                Arc::new(arrow_array::StringArray::from(vec!["a", "b"])),
            ],
        )
        .unwrap();
        let mut memtable = MemTable::new(schema.clone());
        memtable
            .insert(&schema.to_storage(&batch).unwrap())
            .unwrap();
        let memtable = memtable.freeze();
        let job = crate::flusher::replayed_job(
            self.inner.clone(),
            generation,
            memtable.clone(),
            generation,
            None,
        );
        crate::write_path::enqueue(&self.inner, &mut st, generation, memtable, job, false).unwrap();
    }

    fn failures(&self) -> u64 {
        self.inner
            .flush_failures
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn published(&self) -> u64 {
        self.inner.state.lock().published_generation
    }

    fn terminal(&self) -> Option<Error> {
        self.inner.state.lock().terminal.clone()
    }

    async fn stored_generation(&self) -> u64 {
        ManifestStore::new(
            self.mem.clone(),
            &self.root,
            self.shard,
            RetryPolicy::immediate(1),
        )
        .load_latest()
        .await
        .unwrap()
        .unwrap()
        .current_generation
    }

    /// Fails every manifest write with a transient error.
    fn fail_manifest_writes(&self) {
        self.fault.set_hook(|op| {
            if op.kind == OpKind::Put && op.path.contains("/manifest/") {
                Action::Fail
            } else {
                Action::Pass
            }
        });
    }

    /// Waits (paused time: without sleeping) until the writer is terminal.
    async fn until_terminal(&self) -> Error {
        self.inner
            .wait_until(Some(Instant::now() + Duration::from_secs(3600)), |st| {
                st.terminal.clone().map(Ok)
            })
            .await
            .unwrap()
            .expect("the writer turned terminal")
    }
}

/// Lets every task run until all are idle (paused time advances then).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(10)).await;
}

// Breaks if a generation whose SSTable finished first is published before
// an older one still writing (publish order must be generation order).
#[tokio::test(start_paused = true)]
async fn generations_publish_in_order_whatever_order_their_jobs_finish() {
    let h = harness(config()).await;
    let first = h.queue();
    let second = h.queue();
    second.send(()).unwrap();
    settle().await;
    assert_eq!(h.published(), 0, "generation 2 waits for generation 1");
    assert_eq!(h.stored_generation().await, 1);
    first.send(()).unwrap();
    settle().await;
    assert_eq!(h.published(), 2);
    assert_eq!(h.stored_generation().await, 3);
    assert!(h.inner.state.lock().frozen.is_empty());
    assert!(h.terminal().is_none());
}

// Breaks if a closing writer retries a failing publish without bound (a
// close would never end) or gives up before `flush_retry` attempts.
#[tokio::test(start_paused = true)]
async fn while_closing_a_failing_publish_gives_up_after_the_retry_bound() {
    let h = harness(config()).await;
    h.fail_manifest_writes();
    h.inner.life.advance(Phase::Closing);
    h.queue().send(()).unwrap();
    let err = h.until_terminal().await;
    assert!(
        matches!(err, Error::Storage { .. } | Error::OutcomeUnknown { .. }),
        "{err:?}"
    );
    assert_eq!(h.failures(), 4, "flush_retry.max_attempts attempts");
    assert_eq!(h.published(), 0);
}

// Breaks if a writer whose SSTable writes keep failing never learns that a
// newer writer claimed the shard: it would retry forever (its memory held,
// puts backpressured) instead of turning fenced at the third failure's
// fence check.
#[tokio::test(start_paused = true)]
async fn repeated_flush_failures_recheck_the_fence() {
    let h = harness(config()).await;
    // A newer writer claims the shard on the real store.
    ManifestStore::new(h.mem.clone(), &h.root, h.shard, RetryPolicy::immediate(1))
        .claim(None)
        .await
        .unwrap();
    // Every request of an SSTable write fails at once (lance gives up
    // before encoding anything).
    h.fault.set_hook(|op| {
        if op.path.contains("_gen_") {
            Action::Fail
        } else {
            Action::Pass
        }
    });
    h.queue_rows();
    let err = h.until_terminal().await;
    assert!(err.is_fenced(), "{err:?}");
    assert_eq!(h.failures(), 3, "fenced at the third failure's check");
}

// Breaks if a panic in the flusher task leaves the writer looking healthy
// (a `flush` waiting forever, the panic lost) instead of terminal with it.
#[tokio::test(start_paused = true)]
async fn a_flusher_panic_becomes_the_terminal_error() {
    let h = harness(config()).await;
    h.fault.set_hook(|op| {
        if op.kind == OpKind::Put && op.path.contains("/manifest/") {
            panic!("injected flusher panic");
        }
        Action::Pass
    });
    h.queue().send(()).unwrap();
    let waiting = crate::write_path::flush_all(&h.inner);
    let err = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("flush returns")
        .unwrap_err();
    assert!(
        matches!(&err, Error::Corrupt { reason, .. } if reason.contains("flusher panicked")
            && reason.contains("injected flusher panic")),
        "{err:?}"
    );
    assert_eq!(h.terminal().map(|e| e.to_string()), Some(err.to_string()));
}

// Breaks if `close` waits for a publish that never returns (a blackholed
// store: the manifest update never answers, and object_store would retry
// for minutes) instead of ending after `close_timeout` plus the task grace,
// with an error naming the timeout and every task stopped.
#[tokio::test(start_paused = true)]
async fn close_ends_on_time_under_a_publish_that_never_returns() {
    let h = harness(config()).await.with_appender().await;
    let gate = Gate::new(); // never opened
    {
        let gate = gate.clone();
        h.fault.set_hook(move |op| {
            if op.kind == OpKind::Put && op.path.contains("/manifest/") {
                Action::Hold(gate.clone(), Box::new(Action::Pass))
            } else {
                Action::Pass
            }
        });
    }
    h.queue().send(()).unwrap();
    let w = ShardWriter {
        inner: h.inner.clone(),
    };
    let started = Instant::now();
    let closed: Result<()> = w.close().await;
    let took = started.elapsed();
    let err = closed.unwrap_err();
    assert!(err.to_string().contains("close_timeout"), "{err}");
    assert!(
        took >= Duration::from_secs(5) && took <= Duration::from_secs(7),
        "close took {took:?}"
    );
    assert_eq!(gate.arrived(), 1, "the publish was in flight");
    assert!(
        h.inner.life.take_tasks().is_empty(),
        "close joined its tasks"
    );
    assert!(h.terminal().is_some());
}

impl Harness {
    /// Starts a WAL appender (after a fence sentinel) so puts and freezes
    /// work; returns the harness.
    async fn with_appender(self) -> Self {
        let manifest = self.inner.manifest.lock().clone();
        let sentinel = memwal_wal::write_fence_sentinel(
            &self.inner.storage.manifests,
            self.inner.epoch,
            &manifest,
        )
        .await
        .unwrap();
        let generation = self.inner.state.lock().generation;
        let appender = memwal_wal::WalAppender::start(
            self.inner.storage.manifests.clone(),
            self.inner.epoch,
            sentinel + 1,
            generation,
            memwal_wal::WalConfig::default(),
        )
        .unwrap();
        self.inner.state.lock().start_appending(appender);
        self
    }

    /// Fails every request of an SSTable write at once (lance gives up
    /// before encoding anything, so nothing blocks outside the runtime).
    fn fail_sstable_writes(&self) {
        self.fault.set_hook(|op| {
            if op.path.contains("_gen_") {
                Action::Fail
            } else {
                Action::Pass
            }
        });
    }

    async fn put(&self, ids: std::ops::Range<i64>) -> Result<u64> {
        let schema = self.inner.state.lock().active.schema().clone();
        let n = ids.end - ids.start;
        let batch = arrow_array::RecordBatch::try_new(
            schema.table_schema().clone(),
            vec![
                Arc::new(arrow_array::Int64Array::from_iter_values(ids)),
                Arc::new(arrow_array::StringArray::from_iter_values(
                    (0..n).map(|i| format!("value-{i:0>64}")),
                )),
            ],
        )
        .unwrap();
        let storage = crate::put::validate_put(&self.inner, &batch)?;
        crate::put::submit(&self.inner, storage).await?.await
    }
}

// Breaks if the age trigger never freezes an idle memtable (rows would sit
// in memory, unpublished, until some other trigger).
#[tokio::test(start_paused = true)]
async fn the_age_trigger_freezes_an_idle_memtable() {
    let h = harness(ShardWriterConfig {
        max_unflushed_age: Some(Duration::from_secs(2)),
        ..config()
    })
    .await
    .with_appender()
    .await;
    h.fail_sstable_writes();
    h.inner.spawn_monitored(
        "age ticker",
        tracing::info_span!("age_ticker"),
        crate::write_path::age_ticker(h.inner.clone(), Duration::from_secs(2)),
    );
    h.put(0..10).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(h.inner.state.lock().generation, 1, "not old yet");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let st = h.inner.state.lock();
    assert_eq!(st.generation, 2, "frozen once older than max_unflushed_age");
    assert_eq!(st.frozen.len(), 1);
    assert!(st.active.is_empty());
}

// Breaks if puts are not held back once unflushed memory reaches
// `max_unflushed_bytes` (memory would grow without bound), or if a put
// that waited `backpressure_timeout` fails with anything but a typed
// `Backpressure` naming the flush failure (nothing written, the writer
// usable).
#[tokio::test(start_paused = true)]
async fn a_put_without_room_fails_with_backpressure_after_the_timeout() {
    let h = harness(ShardWriterConfig {
        memtable_max_bytes: 16 << 10,
        max_unflushed_bytes: 64 << 10,
        backpressure_timeout: Duration::from_secs(30),
        ..config()
    })
    .await
    .with_appender()
    .await;
    h.fail_sstable_writes();
    let mut err = None;
    let mut max_seen = 0;
    for i in 0..1000i64 {
        let started = Instant::now();
        match h.put(i * 50..i * 50 + 50).await {
            Ok(_) => {}
            Err(e) => {
                assert!(started.elapsed() >= Duration::from_secs(30), "{e}");
                err = Some(e);
                break;
            }
        }
        max_seen = max_seen.max(h.inner.state.lock().unflushed_bytes());
    }
    let err = err.expect("backpressure stops the puts");
    let Error::Backpressure { reason } = &err else {
        panic!("expected Backpressure, got {err}");
    };
    assert!(reason.contains("the last flush failed"), "{reason}");
    assert!(
        max_seen < (64 << 10) + (32 << 10),
        "memory bounded: {max_seen}"
    );
    assert!(h.terminal().is_none(), "the writer stays usable");
    assert!(
        h.inner
            .backpressure_waits
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
}
