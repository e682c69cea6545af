//! Backpressure with a failing / blocked store.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use memwal::Error;
use memwal_testkit::{Action, OpKind};

use crate::support::*;

// Breaks if puts are not held back when unflushed memory reaches the
// limit (memory would grow without bound), or if a put waiting for room
// does not complete once the store recovers (its rows then published).
// The timeout and its typed error are proven in paused time by the unit
// test `a_put_without_room_fails_with_backpressure_after_the_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_wait_for_room_and_complete_once_the_store_recovers() {
    let t = TestTable::new().await;
    let mut cfg = config();
    cfg.memtable_max_bytes = 16 << 10;
    cfg.max_unflushed_bytes = 64 << 10;
    cfg.backpressure_timeout = Duration::from_secs(600);
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
    // Puts run until one waits for room; it stays waiting (no timeout).
    let producer = {
        let w = w.clone();
        tokio::spawn(async move {
            let mut model = Model::new();
            let mut max_seen = 0;
            for i in 0..400i64 {
                let ids: Vec<i64> = (i * 50..i * 50 + 50).collect();
                w.put(&rows(&ids, "bp")).await.unwrap();
                model_put(&mut model, &ids, "bp");
                max_seen = max_seen.max(w.stats().unflushed_bytes);
            }
            (model, max_seen)
        })
    };
    // The first upload failure may be recorded after the put starts waiting.
    wait_until("a put waits for room while uploads fail", || {
        let s = w.stats();
        s.backpressure_waits >= 1 && s.last_flush_error.is_some()
    })
    .await;
    let held = w.stats().unflushed_bytes;
    assert!(
        held <= cfg.max_unflushed_bytes + (32 << 10),
        "memory bounded: {held}"
    );
    assert_eq!(w.stats().published_generation, 0);
    failing.store(false, Ordering::SeqCst);
    let (model, max_seen) = producer.await.unwrap();
    assert!(
        max_seen < cfg.max_unflushed_bytes + (32 << 10),
        "memory bounded: {max_seen}"
    );
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
