//! Backpressure with a failing / blocked store.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use memwal::Error;
use memwal_testkit::{Action, OpKind};

use crate::support::*;

// Breaks if puts are not held back when unflushed memory reaches the
// limit (memory would grow without bound), if the timeout error is not
// the typed Backpressure naming the flush failure, or if the writer does
// not recover once the store does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_wait_then_fail_with_backpressure_and_recover() {
    let t = TestTable::new().await;
    let mut cfg = config();
    cfg.memtable_max_bytes = 16 << 10;
    cfg.max_unflushed_bytes = 64 << 10;
    cfg.backpressure_timeout = Duration::from_millis(300);
    let w = Arc::new(t.open(cfg.clone()).await.unwrap());
    let failing = Arc::new(AtomicBool::new(true));
    {
        let failing = failing.clone();
        t.fault.set_hook(move |op| {
            let write = matches!(op.kind, OpKind::Put | OpKind::Multipart);
            if write && op.path.contains("_gen_") && failing.load(Ordering::SeqCst) {
                return Action::Fail;
            }
            Action::Pass
        });
    }
    let mut model = Model::new();
    let mut err = None;
    let mut max_seen = 0;
    for i in 0..10_000i64 {
        let ids: Vec<i64> = (i * 50..i * 50 + 50).collect();
        match w.put(&rows(&ids, "bp")).await {
            Ok(_) => model_put(&mut model, &ids, "bp"),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
        max_seen = max_seen.max(w.stats().unflushed_bytes);
    }
    let err = err.expect("backpressure must stop the puts");
    let Error::Backpressure { reason } = &err else {
        panic!("expected Backpressure, got {err}");
    };
    assert!(reason.contains("injected fault"), "{reason}");
    assert!(w.stats().backpressure_waits >= 1);
    assert!(
        max_seen < cfg.max_unflushed_bytes + (32 << 10),
        "memory bounded: {max_seen}"
    );
    assert!(w.stats().published_generation == 0);

    // A put waiting for room completes once the store recovers.
    let waiting = {
        let w = w.clone();
        tokio::spawn(async move { w.put(&rows(&[-1], "late")).await })
    };
    wait_until("the late put waits for room", || {
        w.stats().backpressure_waits >= 2
    })
    .await;
    failing.store(false, Ordering::SeqCst);
    waiting.await.unwrap().unwrap();
    model_put(&mut model, &[-1], "late");
    w.flush().await.unwrap();
    let schema = table_schema(&w);
    assert_eq!(t.read_published(&schema).await, model);
    w.close().await.unwrap();
}

// Breaks if replay silently splits (renumbers) a recorded generation that
// does not fit max_unflushed_bytes instead of failing with a typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_generation_too_large_fails_open_naming_it() {
    let t = TestTable::new().await;
    let mut one_generation = config();
    one_generation.memtable_max_bytes = 64 << 20;
    one_generation.memtable_max_rows = 1 << 20;
    let w = t.open(one_generation).await.unwrap();
    for i in 0..20i64 {
        let ids: Vec<i64> = (i * 100..i * 100 + 100).collect();
        w.put(&rows(&ids, "big")).await.unwrap();
    }
    w.abort();
    let mut small = config();
    small.memtable_max_bytes = 8 << 10;
    small.max_unflushed_bytes = 16 << 10;
    let err = t.open(small).await.unwrap_err();
    let Error::Backpressure { reason } = &err else {
        panic!("expected Backpressure, got {err}");
    };
    assert!(reason.contains("generation 1"), "{reason}");
    // With enough memory the same WAL opens and publishes it whole.
    let w2 = t.open(config()).await.unwrap();
    assert_eq!(t.manifest().await.sstables.len(), 1);
    w2.close().await.unwrap();
}
