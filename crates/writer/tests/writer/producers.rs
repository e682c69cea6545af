//! Idempotent producers at one shard (docs/design/idempotent-producers.md):
//! retries of a sequence are acknowledged again and never written twice,
//! across flushes, reopens, WAL garbage collection and a retry racing its
//! original.

use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use memwal::{Acked, Error, ProducerSeq};
use memwal_testkit::{Action, Gate, OpKind};
use object_store::{ObjectStore, ObjectStoreExt};

use crate::support::*;

fn seq(sequence: u64) -> ProducerSeq {
    ProducerSeq::new("job-1", 1, sequence)
}

fn written(a: Acked) -> u64 {
    assert!(!a.duplicate, "{a:?}");
    a.position.unwrap()
}

/// The visible rows: published, then the writer's unflushed ones.
async fn visible(t: &TestTable, w: &memwal::ShardWriter) -> Model {
    let schema = table_schema(w);
    let mut model = t.read_published(&schema).await;
    apply(&mut model, &w.unflushed_batches().unwrap());
    model
}

// Breaks if a retried sequence is written again (key 7 would go back to
// its older value: a reordering on a keyed table), if a retry loses its
// original position, or if the producer state does not survive a flush
// and an abandoned writer (the checkpoint of a published generation, the
// stamps of the WAL above it).
#[tokio::test]
async fn retries_are_written_once_across_flushes_and_reopens() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    let p1 = written(w.put_idempotent(&rows(&[7], "a"), &seq(1)).await.unwrap());
    let p2 = written(w.put_idempotent(&rows(&[7], "b"), &seq(2)).await.unwrap());
    assert_eq!(
        w.put_idempotent(&rows(&[7], "a"), &seq(1)).await.unwrap(),
        Acked {
            position: Some(p1),
            duplicate: true
        }
    );
    w.flush().await.unwrap();
    let p3 = written(w.put_idempotent(&rows(&[8], "c"), &seq(3)).await.unwrap());
    assert_eq!(w.producer_state("job-1"), Some((1, 3)));
    drop(w); // abandoned: seq 3 is only in the WAL

    let w = t.open(config()).await.unwrap();
    assert_eq!(w.producer_state("job-1"), Some((1, 3)), "rebuilt on open");
    for (s, v, at) in [(1, "a", p1), (2, "b", p2), (3, "c", p3)] {
        let again = w.put_idempotent(&rows(&[7], v), &seq(s)).await.unwrap();
        assert_eq!(
            again,
            Acked {
                position: Some(at),
                duplicate: true
            },
            "sequence {s}"
        );
    }
    let expected: Model = [(7, "b-7".to_string()), (8, "c-8".to_string())].into();
    assert_eq!(visible(&t, &w).await, expected);
    // The rules after a reopen: a gap and an older epoch are refused and
    // write nothing; the next sequence is written.
    match w.put_idempotent(&rows(&[9], "gap"), &seq(5)).await {
        Err(Error::ProducerRefused {
            expected: Some(4), ..
        }) => {}
        other => panic!("a gap must be refused naming 4: {other:?}"),
    }
    let stale = ProducerSeq::new("job-1", 0, 4);
    match w.put_idempotent(&rows(&[9], "stale"), &stale).await {
        Err(Error::ProducerRefused { expected: None, .. }) => {}
        other => panic!("an older epoch must be refused: {other:?}"),
    }
    written(w.put_idempotent(&rows(&[9], "d"), &seq(4)).await.unwrap());
    w.close().await.unwrap();
    let w = t.open(config()).await.unwrap();
    let expected: Model = [(7, "b-7"), (8, "c-8"), (9, "d-9")]
        .map(|(k, v)| (k, v.to_string()))
        .into();
    assert_eq!(visible(&t, &w).await, expected);
    assert_eq!(w.producer_state("job-1"), Some((1, 4)));
}

// Breaks if the producer state lives only in the WAL: once a GC deleted
// the entries below the replay cursor, a reopened writer would write the
// retried sequences again.
#[tokio::test]
async fn the_state_survives_the_wal_entries_a_gc_deletes() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    for s in 1..=3 {
        w.put_idempotent(&rows(&[s as i64], "orig"), &seq(s))
            .await
            .unwrap();
    }
    w.close().await.unwrap();
    let m = t.manifest().await;
    assert!(m.replay_after_wal_entry_position >= 3, "{m:?}");
    let wal: Vec<_> = t
        .mem
        .list(Some(&t.layout().wal_dir()))
        .try_collect()
        .await
        .unwrap();
    // As a GC may: every entry below the cursor (replay reads none of
    // them; only the cursor's own entry stays, as GC keeps run starts).
    let cursor = m.replay_after_wal_entry_position;
    let mut deleted = 0;
    for o in wal {
        let position = o
            .location
            .filename()
            .and_then(|f| f.strip_suffix(".arrow"))
            .and_then(memwal_fencing::parse_bitrev64)
            .unwrap();
        if position < cursor {
            t.mem.delete(&o.location).await.unwrap();
            deleted += 1;
        }
    }
    assert!(deleted >= 2, "{deleted}");
    let w = t.open(config()).await.unwrap();
    for s in 1..=3 {
        let a = w
            .put_idempotent(&rows(&[s as i64], "retry"), &seq(s))
            .await
            .unwrap();
        assert!(
            a.duplicate,
            "sequence {s} must be known without its WAL entry"
        );
    }
    let expected: Model = (1..=3).map(|k| (k, format!("orig-{k}"))).collect();
    assert_eq!(visible(&t, &w).await, expected);
}

// Breaks if a retry arriving while its original is still being written is
// written again, or acknowledged before the original is durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_racing_its_original_waits_for_it() {
    let t = TestTable::new().await;
    let w = Arc::new(t.open(config()).await.unwrap());
    let gate = Gate::new();
    {
        let gate = gate.clone();
        t.fault.set_hook(move |op| {
            if op.kind == OpKind::Put && op.path.contains("/wal/") {
                Action::Hold(gate.clone(), Box::new(Action::Pass))
            } else {
                Action::Pass
            }
        });
    }
    let original = tokio::spawn({
        let w = w.clone();
        async move { w.put_idempotent(&rows(&[1], "x"), &seq(1)).await }
    });
    tokio::time::timeout(Duration::from_secs(30), gate.wait_arrived(1))
        .await
        .expect("the original's WAL write starts");
    let retry = tokio::spawn({
        let w = w.clone();
        async move { w.put_idempotent(&rows(&[1], "x"), &seq(1)).await }
    });
    tokio::task::yield_now().await;
    assert!(
        !retry.is_finished(),
        "acknowledged before the original is durable"
    );
    gate.open();
    let original = original.await.unwrap().unwrap();
    let retry = retry.await.unwrap().unwrap();
    assert!(!original.duplicate);
    assert_eq!(
        retry,
        Acked {
            position: original.position,
            duplicate: true
        }
    );
    assert_eq!(gate.arrived(), 1, "one WAL write for both");
}

// Breaks if a producer id that cannot be recorded is taken.
#[tokio::test]
async fn bad_producer_ids_are_refused() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    for id in ["", "a b", &"x".repeat(257)] {
        let r = w
            .put_idempotent(&rows(&[1], "x"), &ProducerSeq::new(id, 1, 1))
            .await;
        assert!(
            matches!(r, Err(Error::InvalidInput { .. })),
            "{id:?}: {r:?}"
        );
    }
    assert!(w.unflushed_batches().unwrap().is_empty());
}
