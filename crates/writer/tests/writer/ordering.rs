//! Publish order: generation g+1 is never published while g is not.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use memwal_testkit::{Action, OpKind};

use crate::support::*;

// Breaks if the flusher publishes generations in completion order instead
// of generation order (g+1's SSTable is written while g's keeps failing),
// or if a crash in between loses g's or g+1's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_generation_waits_for_failing_earlier_one() {
    let t = TestTable::new().await;
    let mut cfg = config();
    cfg.memtable_max_rows = 2; // every put below freezes its generation
    cfg.flush_concurrency = 2;
    let w = t.open(cfg).await.unwrap();
    let schema = table_schema(&w);
    let g1_failures = Arc::new(AtomicUsize::new(0));
    let failing = Arc::new(AtomicBool::new(true));
    {
        let g1_failures = g1_failures.clone();
        let failing = failing.clone();
        t.fault.set_hook(move |op| {
            let write = matches!(op.kind, OpKind::Put | OpKind::Multipart);
            if write && op.path.contains("_gen_1/") && failing.load(Ordering::SeqCst) {
                g1_failures.fetch_add(1, Ordering::SeqCst);
                return Action::Fail;
            }
            Action::Pass
        });
    }
    let mut model = Model::new();
    w.put(&rows(&[1, 2], "g1")).await.unwrap();
    model_put(&mut model, &[1, 2], "g1");
    w.put(&rows(&[2, 3], "g2")).await.unwrap();
    model_put(&mut model, &[2, 3], "g2");
    assert_eq!(w.stats().generation, 3, "two generations frozen");

    // Let g1 fail repeatedly (each retry is a fresh directory, backoff
    // capped at 20 ms) while g2's SSTable is written.
    let gen2_prefix = t.shard_prefix();
    wait_until("g1 failed 8 times and g2's SSTable is written", || {
        g1_failures.load(Ordering::SeqCst) >= 8
            && t.fault.ops().iter().any(|o| {
                matches!(o.kind, OpKind::Put | OpKind::Multipart)
                    && o.path.starts_with(&gen2_prefix)
                    && o.path.contains("_gen_2/_pk_index")
            })
    })
    .await;
    // Give g2's job every chance to finish and (wrongly) publish.
    wait_until("g1 failed 16 times", || {
        g1_failures.load(Ordering::SeqCst) >= 16
    })
    .await;
    let stats = w.stats();
    assert_eq!(stats.published_generation, 0, "{stats:?}");
    assert!(stats
        .last_flush_error
        .as_deref()
        .unwrap_or("")
        .contains("injected"));
    assert!(
        t.manifest().await.sstables.is_empty(),
        "g2 published before g1"
    );

    // Crash now: both generations come back from the WAL.
    t.fault.cut_power();
    w.abort();
    let w2 = t.reopen_inner(config()).await;
    let m = t.manifest().await;
    let gens: Vec<u64> = m.sstables.iter().map(|s| s.generation).collect();
    assert_eq!(
        gens,
        vec![1, 2],
        "recorded generations rebuilt, not renumbered"
    );
    assert_eq!(t.read_published(&schema).await, model);
    w2.close().await.unwrap();
    failing.store(false, Ordering::SeqCst);
}

// Breaks if a recovered flush does not publish g and then g+1 in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn earlier_generation_recovers_then_both_publish_in_order() {
    let t = TestTable::new().await;
    let mut cfg = config();
    cfg.memtable_max_rows = 2;
    let w = t.open(cfg).await.unwrap();
    let schema = table_schema(&w);
    let g1_failures = Arc::new(AtomicUsize::new(0));
    {
        let g1_failures = g1_failures.clone();
        t.fault.set_hook(move |op| {
            let write = matches!(op.kind, OpKind::Put | OpKind::Multipart);
            if write && op.path.contains("_gen_1/") && g1_failures.load(Ordering::SeqCst) < 3 {
                g1_failures.fetch_add(1, Ordering::SeqCst);
                return Action::Fail;
            }
            Action::Pass
        });
    }
    let mut model = Model::new();
    w.put(&rows(&[1, 2], "g1")).await.unwrap();
    w.put(&rows(&[2, 3], "g2")).await.unwrap();
    model_put(&mut model, &[1, 2], "g1");
    model_put(&mut model, &[2, 3], "g2");
    w.flush().await.unwrap();
    assert_eq!(g1_failures.load(Ordering::SeqCst), 3, "the fault fired");
    let m = t.manifest().await;
    let gens: Vec<u64> = m.sstables.iter().map(|s| s.generation).collect();
    assert_eq!(gens, vec![1, 2]);
    assert_eq!(t.read_published(&schema).await, model);
    w.close().await.unwrap();
}
