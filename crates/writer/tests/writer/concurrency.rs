//! Freezes under 16 concurrent putters.

use std::collections::BTreeMap;
use std::sync::Arc;

use memwal_testkit::{Action, Gate, OpKind};
use memwal_wal::WalLocation;

use crate::support::*;

// Breaks if a freeze is not a barrier between the WAL and the memtable
// (a put logged under generation g but inserted into g+1's memtable, or
// the reverse), or if rows enter the memtable in an order other than WAL
// order (replay would then pick another winner for some key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freezes_under_concurrent_putters_keep_wal_and_memtables_aligned() {
    let t = TestTable::new().await;
    let mut cfg = config();
    cfg.memtable_max_rows = 7;
    cfg.flush_concurrency = 4;
    let w = Arc::new(t.open(cfg).await.unwrap());
    let schema = table_schema(&w);
    let sentinel = w.stats().sentinel_position;
    // Nothing is published: every generation stays in memory, so the
    // live view is exactly the memtables.
    let gate = Gate::new();
    {
        let gate = gate.clone();
        t.fault.set_hook(move |op| {
            if op.kind == OpKind::Put && op.path.contains("/manifest/") {
                Action::Hold(gate.clone(), Box::new(Action::Pass))
            } else {
                Action::Pass
            }
        });
    }
    let mut tasks = Vec::new();
    for p in 0..16i64 {
        let w = w.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..25i64 {
                let a = (p * 7 + i) % 40;
                let b = (p * 3 + i * 11) % 40;
                let ids = if a == b { vec![a] } else { vec![a, b] };
                w.put(&rows(&ids, &format!("p{p}i{i}"))).await.unwrap();
                if i % 9 == 8 {
                    w.delete(&keys(&[(p + i) % 40])).await.unwrap();
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let stats = w.stats();
    assert!(stats.unpublished.len() >= 5, "many freezes: {stats:?}");
    assert_eq!(stats.published_generation, 0);
    let mut live = Model::new();
    apply(&mut live, &w.unflushed_batches().unwrap());
    let mut live_rows: BTreeMap<u64, usize> = stats.unpublished.iter().copied().collect();
    if stats.active_rows > 0 {
        live_rows.insert(stats.generation, stats.active_rows);
    }

    // The WAL: one generation per entry, generations ascending, and the
    // rows per generation equal to each memtable's.
    let loc = WalLocation::new(t.mem.clone(), t.layout(), memwal::RetryPolicy::immediate(2));
    let mut wal_rows: BTreeMap<u64, usize> = BTreeMap::new();
    let mut last_gen = 0;
    let mut pos = sentinel + 1;
    while let Some(entry) = loc.read_entry(pos).await.unwrap() {
        let g = entry
            .generation
            .expect("our entries record their generation");
        assert!(g >= last_gen, "generation went back at position {pos}");
        last_gen = g;
        *wal_rows.entry(g).or_default() += entry.num_rows();
        pos += 1;
    }
    assert_eq!(wal_rows, live_rows, "WAL vs memtables per generation");

    // Crash (drop = abort) and replay: same winner per key, same
    // generations, same rows per generation.
    drop(w);
    let w2 = t.reopen_inner(config()).await;
    assert_eq!(t.read_published(&schema).await, live);
    let m = t.manifest().await;
    let published: BTreeMap<u64, usize> = m
        .sstables
        .iter()
        .map(|s| (s.generation, s.physical_rows.unwrap() as usize))
        .collect();
    assert_eq!(published, live_rows, "replay rebuilt the same generations");
    w2.close().await.unwrap();
}
