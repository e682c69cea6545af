//! The default replay: `open` is ready once the WAL is read; replayed
//! generations are written and published in the background, in order,
//! before anything written after `open`.

use std::time::Duration;

use memwal_testkit::{Action, Gate, OpKind};

use crate::support::*;

/// Holds every SSTable write (objects under a `*_gen_*` directory).
fn hold_sstables(t: &TestTable, gate: &Gate) {
    let (g, prefix) = (gate.clone(), t.shard_prefix());
    t.fault.set_hook(move |op| {
        let sstable = op.path.starts_with(&prefix) && op.path.contains("_gen_");
        if matches!(op.kind, OpKind::Put | OpKind::Multipart) && sstable {
            Action::Hold(g.clone(), Box::new(Action::Pass))
        } else {
            Action::Pass
        }
    });
}

// Breaks if open waits for the replayed generation's SSTable (it would
// hang on the held write), if replayed rows are not readable meanwhile, if
// a put after open joins the replayed generation, or if the live
// generation is published before (or instead of) the replayed one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_is_ready_while_the_replayed_generation_publishes_behind_it() {
    let t = TestTable::new().await;
    let w1 = t.open(background_config()).await.unwrap();
    let schema = table_schema(&w1);
    let mut model = Model::new();
    w1.put(&rows(&[1, 2], "a")).await.unwrap();
    w1.put(&rows(&[3], "a")).await.unwrap();
    model_put(&mut model, &[1, 2, 3], "a");
    w1.abort();

    let gate = Gate::new();
    hold_sstables(&t, &gate);
    let w2 = tokio::time::timeout(Duration::from_secs(60), t.open(background_config()))
        .await
        .expect("open waited for a held SSTable write")
        .unwrap();
    gate.wait_arrived(1).await;
    let m = t.manifest().await;
    assert!(m.sstables.is_empty(), "nothing published yet: {m:?}");
    assert_eq!(m.replay_after_wal_entry_position, 0, "{m:?}");
    let mut held = Model::new();
    apply(&mut held, &w2.unflushed_batches().unwrap());
    assert_eq!(held, model, "replayed rows are readable before publish");
    let stats = w2.stats();
    assert_eq!(stats.unpublished, vec![(1, 3)], "{stats:?}");
    assert_eq!(stats.generation, 2, "live puts go to the next generation");

    w2.put(&rows(&[3], "c")).await.unwrap();
    model_put(&mut model, &[3], "c");
    gate.open();
    w2.close().await.unwrap();
    let m = t.manifest().await;
    let gens: Vec<u64> = m.sstables.iter().map(|s| s.generation).collect();
    assert_eq!(
        gens,
        vec![1, 2],
        "replayed generation first, then the live one"
    );
    assert_eq!(t.read_published(&schema).await, model);
}

// Breaks if replay queues generations without bound (open would return
// while the held first generation and the second exceed
// max_unflushed_bytes together), or never continues once the first is
// published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_waits_while_queued_generations_exceed_max_unflushed_bytes() {
    let t = TestTable::new().await;
    let cfg = background_config();
    let w1 = t.open(cfg.clone()).await.unwrap();
    let schema = table_schema(&w1);
    let mut model = Model::new();
    // Two recorded generations (1000 rows each freeze at the row limit),
    // neither published: their SSTable writes are held, then w1 aborts.
    let gate1 = Gate::new();
    hold_sstables(&t, &gate1);
    let first: Vec<i64> = (0..1000).collect();
    let second: Vec<i64> = (1000..2000).collect();
    w1.put(&rows(&first, "a")).await.unwrap();
    let one_generation = w1.stats().unflushed_bytes;
    w1.put(&rows(&second, "b")).await.unwrap();
    model_put(&mut model, &first, "a");
    model_put(&mut model, &second, "b");
    assert_eq!(w1.stats().unpublished.len(), 2, "{:?}", w1.stats());
    w1.abort();
    gate1.open();
    t.fault.clear_hook();

    // Room for one and a half generations: the second waits for the first.
    let limit = one_generation * 3 / 2;
    let cfg = memwal::ShardWriterConfig {
        memtable_max_bytes: limit,
        max_unflushed_bytes: limit,
        ..cfg
    };
    let gate = Gate::new();
    hold_sstables(&t, &gate);
    let mut open = Box::pin(t.open(cfg));
    tokio::select! {
        r = &mut open => panic!("open returned with two generations queued over the limit: {r:?}"),
        _ = gate.wait_arrived(1) => {}
    }
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
    assert!(
        futures::poll!(&mut open).is_pending(),
        "open must wait for room"
    );
    gate.open();
    let w2 = open.await.unwrap();
    w2.close().await.unwrap();
    let m = t.manifest().await;
    let gens: Vec<u64> = m.sstables.iter().map(|s| s.generation).collect();
    assert_eq!(gens, vec![1, 2]);
    assert_eq!(t.read_published(&schema).await, model);
}
