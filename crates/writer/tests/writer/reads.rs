//! What a reader of the writer sees ([`memwal::ShardWriter::read_snapshot`]):
//! acknowledged rows only.

use memwal_testkit::{permission_denied, Action, Gate, InjectError, OpKind};

use crate::support::*;

/// Holds every WAL write at `gate`, then lets it run as `then` decides.
fn hold_wal_writes(t: &TestTable, gate: &Gate, then: Action) {
    let gate = gate.clone();
    t.fault.set_hook(move |op| {
        if op.kind == OpKind::Put && op.path.contains("/wal/") {
            Action::Hold(gate.clone(), Box::new(then.clone()))
        } else {
            Action::Pass
        }
    });
}

/// The rows of a snapshot (published generations left out: nothing here
/// publishes).
fn snapshot_model(w: &memwal::ShardWriter) -> Model {
    let s = w.read_snapshot().unwrap();
    assert_eq!(s.epoch, w.epoch());
    let mut m = Model::new();
    apply(&mut m, &s.batches);
    m
}

// Breaks if a snapshot shows rows whose WAL write is not durable: a put
// submitted (in the memtable) but not acknowledged, whose write may still
// fail; here one is held at the store, then refused, and a reader in
// between must see neither it nor, after the failure, anything of the
// stopped writer. Fails without the visibility watermark
// (`State::appends`): the held rows show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_shows_only_acknowledged_rows() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    let mut acked = Model::new();
    w.put(&rows(&[1, 2], "a")).await.unwrap();
    model_put(&mut acked, &[1, 2], "a");
    assert_eq!(snapshot_model(&w), acked);

    // A write held at the store, then let through: invisible until acked.
    let gate = Gate::new();
    hold_wal_writes(&t, &gate, Action::Pass);
    let put = w.put_nowait(&rows(&[2, 3], "b")).await.unwrap();
    gate.wait_arrived(1).await;
    assert_eq!(snapshot_model(&w), acked, "a put in flight is not read");
    // A delete behind it, also in flight.
    let delete = w.delete_nowait(&keys(&[1])).await.unwrap();
    assert_eq!(snapshot_model(&w), acked, "nor a delete behind it");
    gate.open();
    put.await.unwrap();
    delete.await.unwrap();
    model_put(&mut acked, &[2, 3], "b");
    acked.remove(&1);
    assert_eq!(snapshot_model(&w), acked, "acknowledged: read");

    // A write held, then refused: never read.
    let gate = Gate::new();
    let refused = Action::FailWith(InjectError::new(|| permission_denied("wal")));
    hold_wal_writes(&t, &gate, refused);
    let put = w.put_nowait(&rows(&[3, 4], "c")).await.unwrap();
    gate.wait_arrived(1).await;
    assert_eq!(snapshot_model(&w), acked, "a put in flight is not read");
    gate.open();
    let e = put.await.unwrap_err();
    assert!(!e.may_be_durable(), "{e}");
    // The writer stopped; its rows are in the WAL only for the next one.
    let e = w.read_snapshot().unwrap_err();
    assert!(!matches!(e, memwal::Error::Closed { .. }), "{e}");
    t.fault.clear_hook();
    drop(w);
    let again = t.open(config()).await.unwrap();
    let mut read = t.read_published(&table_schema(&again)).await;
    apply(&mut read, &again.read_snapshot().unwrap().batches);
    assert_eq!(
        read, acked,
        "the next writer replays exactly the acked rows"
    );
    again.close().await.unwrap();
}

// Breaks if a closed writer stops being readable, or its snapshot misses
// acknowledged rows it did not publish: readers take a writer's snapshot
// while it closes (an idle close, a daemon stopping) and may find it
// closed meanwhile. Fails with `read_snapshot` refusing a closed writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_writer_stays_readable() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    w.put(&rows(&[1, 2], "a")).await.unwrap();
    // Stopped without publishing: the rows are only in its memtable (and
    // the WAL).
    w.abort();
    let mut want = Model::new();
    model_put(&mut want, &[1, 2], "a");
    assert_eq!(snapshot_model(&w), want, "aborted: unpublished rows read");
    drop(w);

    let w = t.open(config()).await.unwrap();
    w.put(&rows(&[3], "b")).await.unwrap();
    model_put(&mut want, &[3], "b");
    w.close().await.unwrap();
    let s = w.read_snapshot().unwrap();
    assert!(s.batches.is_empty(), "a clean close published everything");
    let mut m = t.read_published(&table_schema(&w)).await;
    apply(&mut m, &s.batches);
    assert_eq!(m, want);
}
