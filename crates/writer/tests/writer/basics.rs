//! Put / close / reopen; abort / reopen replays; last write wins.

use futures::StreamExt;
use memwal::Error;
use memwal_testkit::{Action, Gate, OpKind};
use object_store::ObjectStore;

use crate::support::*;

// Breaks if close does not flush+publish (no SSTables in the manifest), if
// the replay cursor is not advanced (reopen would republish), or if rows
// or deletes are lost / resurrected in the SSTables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_publishes_and_reopen_finds_everything() {
    let t = TestTable::new().await;
    let mut cfg = config();
    cfg.memtable_max_rows = 4; // several generations
    let w = t.open(cfg.clone()).await.unwrap();
    assert_eq!(w.epoch(), 1);
    let mut model = Model::new();
    let mut last = 0;
    for round in 0..3 {
        let v = format!("r{round}");
        let ids: Vec<i64> = (0..5).map(|i| i + round).collect();
        let pos = w.put(&rows(&ids, &v)).await.unwrap();
        assert!(pos > last, "positions grow");
        last = pos;
        model_put(&mut model, &ids, &v);
    }
    w.delete(&keys(&[1, 6])).await.unwrap();
    model.remove(&1);
    model.remove(&6);
    let schema = table_schema(&w);
    w.close().await.unwrap();
    assert!(matches!(
        w.put(&rows(&[1], "x")).await,
        Err(Error::Closed { .. })
    ));

    let m = t.manifest().await;
    assert!(
        m.sstables.len() >= 2,
        "several generations: {:?}",
        m.sstables
    );
    let gens: Vec<u64> = m.sstables.iter().map(|s| s.generation).collect();
    let mut sorted = gens.clone();
    sorted.sort();
    assert_eq!(gens, sorted, "published in generation order");
    assert_eq!(m.current_generation, gens.last().unwrap() + 1);
    assert!(m.replay_after_wal_entry_position >= last);
    assert_eq!(t.read_published(&schema).await, model);

    // Reopen: nothing to replay, same data.
    let w2 = t.reopen_inner(config()).await;
    assert_eq!(w2.epoch(), 2);
    assert_eq!(w2.stats().publishes, 0, "nothing left to replay");
    assert_eq!(t.read_published(&schema).await, model);
    w2.close().await.unwrap();
}

// Breaks if acknowledged rows are not replayed after an abort (or a drop),
// if replay does not apply last-write-wins across puts and deletes in WAL
// order, or if replayed rows are not flushed and published on open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_and_drop_then_reopen_replays_acknowledged_rows() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    let schema = table_schema(&w);
    let mut model = Model::new();
    w.put(&rows(&[1, 2, 3], "a")).await.unwrap();
    model_put(&mut model, &[1, 2, 3], "a");
    w.delete(&keys(&[2])).await.unwrap();
    model.remove(&2);
    w.put(&rows(&[3, 4], "b")).await.unwrap();
    model_put(&mut model, &[3, 4], "b");
    w.put(&rows(&[2], "c")).await.unwrap(); // re-insert after delete
    model_put(&mut model, &[2], "c");
    w.delete(&keys(&[4])).await.unwrap();
    model.remove(&4);
    w.abort();
    assert!(matches!(w.flush().await, Err(Error::Closed { .. })));
    assert!(
        t.manifest().await.sstables.is_empty(),
        "abort publishes nothing"
    );

    let w2 = t.open(config()).await.unwrap();
    assert_eq!(w2.stats().publishes, 1, "one recorded generation replayed");
    assert_eq!(t.read_published(&schema).await, model);

    // Drop without close = abort: rows stay in the WAL, tasks stop.
    w2.put(&rows(&[9], "d")).await.unwrap();
    model_put(&mut model, &[9], "d");
    drop(w2);
    let w3 = t.open(config()).await.unwrap();
    assert_eq!(t.read_published(&schema).await, model);
    w3.close().await.unwrap();
}

/// Every object under `prefix` on the store behind the fault store.
async fn landed(t: &TestTable) -> Vec<String> {
    let prefix = object_store::path::Path::from(t.shard_prefix().trim_end_matches('/'));
    let mut out: Vec<String> = t
        .mem
        .list(Some(&prefix))
        .map(|m| m.unwrap().location.to_string())
        .collect()
        .await;
    out.sort();
    out
}

// Breaks if a dropped writer's background work (a frozen generation's
// SSTable write, a queued WAL append) still writes once its held requests
// are released. Current-thread runtime: tasks run only while the test
// yields, so the bounded yields below give a live task every chance to
// land its writes.
#[tokio::test]
async fn dropped_writer_writes_nothing_more() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    let schema = table_schema(&w);
    let mut model = Model::new();
    w.put(&rows(&[1], "a")).await.unwrap();
    model_put(&mut model, &[1], "a");
    let gate = Gate::new();
    let (g, prefix) = (gate.clone(), t.shard_prefix());
    t.fault.set_hook(move |op| {
        if matches!(op.kind, OpKind::Put | OpKind::Multipart) && op.path.starts_with(&prefix) {
            Action::Hold(g.clone(), Box::new(Action::Pass))
        } else {
            Action::Pass
        }
    });
    // Freeze generation 1 (its SSTable write is held), then queue a put
    // (its WAL PUT is held).
    tokio::select! {
        r = w.flush() => panic!("flush finished through a closed gate: {r:?}"),
        _ = gate.wait_arrived(1) => {}
    }
    let pending = w.put_nowait(&rows(&[2], "b")).await.unwrap();
    gate.wait_arrived(2).await;
    let before = landed(&t).await;
    drop(w);
    gate.open();
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
    assert_eq!(landed(&t).await, before, "nothing written after drop");
    let outcome = pending.await;
    assert!(
        outcome.is_err(),
        "a put held at drop is never acknowledged: {outcome:?}"
    );
    t.fault.clear_hook();
    let w2 = t.open(config()).await.unwrap();
    assert_eq!(t.read_published(&schema).await, model);
    w2.close().await.unwrap();
}
