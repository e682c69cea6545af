//! Faults and bad input: every failure is typed, bounded, and loses
//! nothing acknowledged.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray};
use arrow_schema::{Field, Schema};
use memwal::Error;
use memwal_testkit::{permission_denied, Action, Gate, InjectError, OpKind};
use object_store::{ObjectStoreExt, PutPayload};

use crate::support::*;

/// Rows whose `v` is `len` bytes long.
fn wide_rows(ids: &[i64], len: usize) -> RecordBatch {
    let vs: Vec<String> = ids.iter().map(|i| format!("{i:0>len$}")).collect();
    RecordBatch::try_new(
        base_schema(),
        vec![
            Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
            Arc::new(StringArray::from(vs)),
        ],
    )
    .unwrap()
}

fn model_wide(model: &mut Model, ids: &[i64], len: usize) {
    for i in ids {
        model.insert(*i, format!("{i:0>len$}"));
    }
}

/// Fails every write of an SSTable file with `action()`.
fn fail_sstable_writes(t: &TestTable, action: impl Fn() -> Action + Send + Sync + 'static) {
    t.fault.set_hook(move |op| {
        if matches!(op.kind, OpKind::Put | OpKind::Multipart) && op.path.contains("_gen_") {
            action()
        } else {
            Action::Pass
        }
    });
}

/// Guards against a hang: a call that should return does so within a minute.
async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"))
}

// Breaks if a put larger than the per-put maximum is acknowledged, or if
// a generation can grow past memtable_max_bytes (replay under the same
// config would then refuse the shard: acknowledged rows nobody can open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_generation_replays_under_the_same_config() {
    let t = TestTable::new().await;
    let mut cfg = config();
    cfg.memtable_max_bytes = 64 << 10;
    cfg.max_unflushed_bytes = 128 << 10;
    let w = t.open(cfg.clone()).await.unwrap();
    let schema = table_schema(&w);
    // Accepted, it would make generation 1 larger than max_unflushed_bytes.
    let big: Vec<i64> = (0..150).collect();
    let err = w.put(&wide_rows(&big, 1024)).await.unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput { reason, .. } if reason.contains("per-put maximum")),
        "{err}"
    );
    // Nothing publishes; puts of ~20 and ~50 KiB (together past
    // memtable_max_bytes) must not share a generation.
    fail_sstable_writes(&t, || Action::Fail);
    let mut model = Model::new();
    let (a, b): (Vec<i64>, Vec<i64>) = ((0..20).collect(), (20..70).collect());
    w.put(&wide_rows(&a, 1024)).await.unwrap();
    model_wide(&mut model, &a, 1024);
    let after_a = w.stats();
    assert_eq!(
        (after_a.generation, after_a.active_rows),
        (1, 20),
        "precondition: the first put leaves generation 1 active"
    );
    w.put(&wide_rows(&b, 1024)).await.unwrap();
    model_wide(&mut model, &b, 1024);
    let after_b = w.stats();
    assert_eq!(
        after_b.unpublished.first(),
        Some(&(1, 20)),
        "generation 1 was frozen before the second put went in: {after_b:?}"
    );
    w.abort();
    t.fault.clear_hook();
    let w2 = t.open(cfg).await.expect("reopens under the same config");
    assert_eq!(t.read_published(&schema).await, model);
    w2.close().await.unwrap();
}

// Breaks if a put in storage form whose field id matches no column is
// acknowledged (that column would be silently nulled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_form_put_with_an_unknown_field_id_is_refused() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    let storage = w.schema().storage_schema().clone();
    let mut fields: Vec<Field> = storage.fields().iter().map(|f| (**f).clone()).collect();
    let md: HashMap<String, String> = [("lance:field_id".to_string(), "77".to_string())].into();
    fields[1] = fields[1].clone().with_metadata(md);
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        vec![
            Arc::new(Int64Array::from(vec![1])) as ArrayRef,
            Arc::new(StringArray::from(vec!["lost?"])),
            Arc::new(BooleanArray::from(vec![false])),
        ],
    )
    .unwrap();
    let err = w.put(&batch).await.unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
    w.put(&rows(&[1], "ok")).await.unwrap();
    w.close().await.unwrap();
}

// Breaks if close() waits forever on an SSTable write that keeps failing
// (retries must be bounded once closing), or if that loses the rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_returns_when_flushes_keep_failing_and_the_wal_keeps_the_rows() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    let schema = table_schema(&w);
    let mut model = Model::new();
    w.put(&rows(&[1, 2], "a")).await.unwrap();
    model_put(&mut model, &[1, 2], "a");
    fail_sstable_writes(&t, || Action::Fail);
    let err = bounded("close", w.close()).await.unwrap_err();
    assert!(err.to_string().contains("injected"), "{err}");
    assert!(w.put(&rows(&[3], "x")).await.is_err(), "stopped");
    t.fault.clear_hook();
    let w2 = t.open(config()).await.unwrap();
    assert_eq!(t.read_published(&schema).await, model);
    w2.close().await.unwrap();
}

// Breaks if a definite refusal (permission denied) of an SSTable write is
// retried forever instead of stopping the writer with a non-transient
// storage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_sstable_write_is_terminal_at_once() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    w.put(&rows(&[1], "a")).await.unwrap();
    let dirs = Arc::new(parking_lot::Mutex::new(std::collections::BTreeSet::new()));
    {
        let dirs = dirs.clone();
        t.fault.set_hook(move |op| {
            if matches!(op.kind, OpKind::Put | OpKind::Multipart) && op.path.contains("_gen_") {
                let dir = op.path.split("_gen_").next().unwrap().to_string();
                dirs.lock().insert(dir);
                let path = op.path.clone();
                Action::FailWith(InjectError::new(move || permission_denied(&path)))
            } else {
                Action::Pass
            }
        });
    }
    let err = bounded("flush", w.flush()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Storage {
                transient: false,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        dirs.lock().len(),
        1,
        "one attempt, no retries: {:?}",
        dirs.lock()
    );
    assert!(w.put(&rows(&[2], "b")).await.is_err(), "terminal");
}

// Breaks if a writer whose flushes keep failing never learns that a newer
// writer took the shard (it would retry forever instead of stopping).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_flushes_recheck_the_fence() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    w.put(&rows(&[1], "a")).await.unwrap();
    let failures = Arc::new(AtomicUsize::new(0));
    {
        let failures = failures.clone();
        fail_sstable_writes(&t, move || {
            failures.fetch_add(1, Ordering::SeqCst);
            Action::Fail
        });
    }
    let flush = {
        let w = Arc::new(w);
        let w2 = w.clone();
        (w, tokio::spawn(async move { w2.flush().await }))
    };
    wait_until("the flush failed once", || {
        failures.load(Ordering::SeqCst) >= 1
    })
    .await;
    let newer = t.manifests().claim(None).await.unwrap();
    let err = bounded("flush", flush.1).await.unwrap().unwrap_err();
    match err {
        Error::Fenced { stored_epoch, .. } => assert_eq!(stored_epoch, newer.epoch),
        other => panic!("expected Fenced, got {other:?}"),
    }
}

// Breaks if the live path would publish a generation other than the
// manifest's current_generation (publishing must follow the manifest,
// not only the flusher's own order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_checks_the_manifests_current_generation() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    w.put(&rows(&[1], "a")).await.unwrap();
    // Someone holding our epoch (a bug, or a foreign tool) moved it on.
    t.manifests()
        .update(w.epoch(), |m| {
            m.current_generation += 5;
            Ok(())
        })
        .await
        .unwrap();
    let err = bounded("flush", w.flush()).await.unwrap_err();
    assert!(
        matches!(&err, Error::Corrupt { reason, .. } if reason.contains("strictly in order")),
        "{err}"
    );
    assert!(t.manifest().await.sstables.is_empty(), "nothing published");
}

// Breaks if a WAL entry holding a 0-row batch (other implementations
// write them) makes the shard unopenable, or its other rows are lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_row_batches_in_the_wal_are_skipped_on_replay() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    let schema = table_schema(&w);
    let mut model = Model::new();
    w.put(&rows(&[1], "a")).await.unwrap();
    model_put(&mut model, &[1], "a");
    let next = w.stats().last_durable_position + 1;
    let (epoch, generation) = (w.epoch(), w.stats().generation);
    let storage = schema.to_storage(&rows(&[2], "b")).unwrap();
    w.abort();
    let empty = storage.slice(0, 0);
    let bytes =
        memwal_wal::codec::encode_entry(epoch, Some(generation), &[empty, storage]).unwrap();
    t.mem
        .put(&t.layout().wal_path(next), PutPayload::from_bytes(bytes))
        .await
        .unwrap();
    model_put(&mut model, &[2], "b");
    let w2 = t.open(config()).await.expect("opens");
    assert_eq!(t.read_published(&schema).await, model);
    w2.close().await.unwrap();
}

// Breaks if a second close returns before the first has finished (the
// writer still flushing or its tasks still running), or with another
// outcome; current-thread runtime: after both return, nothing runs on.
#[tokio::test]
async fn concurrent_closes_wait_for_the_first() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    w.put(&rows(&[1], "a")).await.unwrap();
    let gate = Gate::new();
    {
        let gate = gate.clone();
        fail_sstable_writes(&t, move || {
            Action::Hold(gate.clone(), Box::new(Action::Pass))
        });
    }
    let first = w.close();
    let second = async {
        let r = w.close().await;
        (r, t.manifest().await.sstables.len())
    };
    let opener = async {
        gate.wait_arrived(1).await;
        gate.open();
    };
    let (r1, (r2, published), ()) = tokio::join!(first, second, opener);
    r1.unwrap();
    r2.unwrap();
    assert_eq!(
        published, 1,
        "the second close returned before the flush published"
    );
    let ops = t.fault.ops().len();
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
    assert_eq!(t.fault.ops().len(), ops, "no background work after close");
}
