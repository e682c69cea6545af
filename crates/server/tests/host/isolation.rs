//! Read isolation (docs/design/fresh-reads.md): a read shows only
//! acknowledged rows, never a fenced writer's memtable, refuses a shard
//! whose writer is down, and keeps an idle shard readable while it closes.

use std::collections::BTreeMap;
use std::sync::Arc;

use memwal::ShardWriterConfig;
use memwal_server::{ServerError, ShardLimits, TableHost};
use memwal_table::TableSharding;
use memwal_testkit::{permission_denied, Action, FaultStore, Gate, InjectError, OpKind};

use super::{as_map, bucket_table, deletes, keyed_table, keys, only, put, tagged};

/// A refusal of the store (HTTP 403): not retried, nothing written.
fn refused() -> Action {
    Action::FailWith(InjectError::new(|| permission_denied("injected")))
}

/// Fast-failing retries, so a storage fault stops a writer at once.
fn quick_config() -> ShardWriterConfig {
    ShardWriterConfig {
        retry: memwal_store::RetryPolicy {
            max_attempts: 2,
            initial_backoff: std::time::Duration::from_millis(1),
            max_backoff: std::time::Duration::from_millis(2),
        },
        ..ShardWriterConfig::default()
    }
}

/// Asserts `r` is a read refused with `UNAVAILABLE` naming `shard`.
fn assert_unavailable<T: std::fmt::Debug>(r: Result<T, ServerError>, shard: &str, what: &str) {
    let e = r.expect_err(what);
    assert!(e.to_string().contains(shard), "{what}: {e}");
    assert_eq!(
        tonic::Status::from(e).code(),
        tonic::Code::Unavailable,
        "{what}"
    );
}

// Breaks if a daemon whose shards another daemon claimed (fencing its
// idle writers) answers reads from its stale memtables: old values of
// keys the new owner overwrote, keys it deleted, or (worse) without the
// new owner's SSTables above the fenced writer's published generation.
// Every read kind (whole read, key lookup, filtered scan) through the
// fenced host must show exactly the new owner's state. Fails without the
// epoch check in `TableHost::view_after`, and, for a lookup the fenced
// writer's unflushed rows answer in full, without the check of each
// answering shard's latest manifest (`reader/owners.rs`, whose cache was
// filled by the same lookup before the takeover).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_host_reads_the_new_owners_state() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let a = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    let ids: Vec<i64> = (0..40).collect();
    a.write(&tagged(&ids, "a"), false).await.unwrap();
    a.flush().await.unwrap();
    a.write(&tagged(&ids[..20], "x"), false).await.unwrap();
    let mut model = BTreeMap::new();
    put(&mut model, &ids, "a");
    put(&mut model, &ids[..20], "x");
    assert_eq!(as_map(&a.read_rows().await.unwrap()), model);
    // Keys only A's unflushed rows answer: no view read, only the owners.
    let unflushed = [0, 5, 12, 19];
    let got = as_map(&a.lookup_rows(&keys(&unflushed)).await.unwrap());
    assert_eq!(got, only(&model, &unflushed));

    // B claims every shard (fencing A's writers, idle from now on),
    // overwrites and deletes, and publishes.
    let b = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    b.write(&tagged(&ids[5..25], "b"), false).await.unwrap();
    b.write(&deletes(&[1, 7, 30]), true).await.unwrap();
    b.flush().await.unwrap();
    put(&mut model, &ids[5..25], "b");
    for k in [1, 7, 30] {
        model.remove(&k);
    }
    assert_eq!(as_map(&b.read_rows().await.unwrap()), model, "B's state");

    // The same keys again: A's writers are fenced, so B's values.
    let got = as_map(&a.lookup_rows(&keys(&unflushed)).await.unwrap());
    assert_eq!(
        got,
        only(&model, &unflushed),
        "a lookup A's stale unflushed rows would answer"
    );
    // Keys A's memtables hold, keys only published, a deleted key, a
    // missing one.
    let probe = [0, 1, 5, 7, 12, 19, 22, 30, 35, 99];
    let got = as_map(&a.lookup_rows(&keys(&probe)).await.unwrap());
    assert_eq!(
        got,
        only(&model, &probe),
        "a lookup through the fenced host"
    );
    assert_eq!(
        as_map(&a.read_rows().await.unwrap()),
        model,
        "a whole read through the fenced host"
    );
    let low = datafusion::prelude::col("id").lt(datafusion::prelude::lit(20i64));
    let got = as_map(&a.scan(Some(low), None, None).await.unwrap());
    assert_eq!(
        got,
        only(&model, &ids[..20]),
        "a scan through the fenced host"
    );
    // A read found the takeover: A's shards are lost (puts refused).
    let lost = a
        .status()
        .await
        .into_iter()
        .filter(|s| s.state == "lost")
        .count();
    assert_eq!(lost, 4);
    assert!(a.write(&tagged(&[0], "z"), false).await.is_err());
    b.close().await.unwrap();
    a.close().await.unwrap();
}

// Breaks if a read shows a row whose WAL write has not completed (here
// held at the store, then refused: the client is told nothing was
// written), or if a shard whose writer then stopped on that storage
// failure is read as published (its overwrite acknowledged before, only
// in the WAL now, would be answered with the older published value)
// instead of refused with UNAVAILABLE naming the shard; or if, once the
// shard reopened, a read misses an acknowledged row. The first part fails
// without the visibility watermark (`ShardWriter::read_snapshot`), the
// second without refusing down shards (`TableHost::snapshots`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_put_is_never_read_and_a_down_shard_refuses_reads_until_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let faults = FaultStore::new(loc.store.clone());
    let faulty = memwal_store::StoreLocation {
        store: faults.clone(),
        ..loc.clone()
    };
    let host = Arc::new(TableHost::open("t", faulty, quick_config()).await.unwrap());
    let ids: Vec<i64> = (0..20).collect();
    host.write(&tagged(&ids, "a"), false).await.unwrap();
    host.flush().await.unwrap();
    let shard = host.write(&tagged(&[1], "b"), false).await.unwrap()[0]
        .shard
        .clone();
    let mut model = BTreeMap::new();
    put(&mut model, &ids, "a");
    put(&mut model, &[1], "b");

    // The next WAL write of that shard is held at the store, then refused.
    let gate = Gate::new();
    let held = gate.clone();
    let wal = format!("{shard}/wal/");
    faults.set_hook(move |op| {
        if op.kind == OpKind::Put && op.path.contains(&wal) {
            Action::Hold(held.clone(), Box::new(refused()))
        } else {
            Action::Pass
        }
    });
    let failing = {
        let host = host.clone();
        tokio::spawn(async move { host.write(&tagged(&[1], "lost"), false).await })
    };
    gate.wait_arrived(1).await;
    assert_eq!(
        as_map(&host.read_rows().await.unwrap()),
        model,
        "a put in flight is not read"
    );
    assert_eq!(
        as_map(&host.lookup_rows(&keys(&[1, 2])).await.unwrap()),
        only(&model, &[1, 2]),
        "nor looked up"
    );
    gate.open();
    let e = failing.await.unwrap().unwrap_err();
    assert!(!e.may_be_durable(), "{e}");

    // The shard is down: its acknowledged overwrite of 1 is only in its
    // WAL. Every read kind refuses, naming it.
    assert_unavailable(host.read_rows().await, &shard, "a whole read");
    assert_unavailable(host.lookup_rows(&keys(&[1])).await, &shard, "a lookup");
    assert_unavailable(host.scan(None, None, Some(1)).await, &shard, "a scan");
    let retry_in = match host.write(&tagged(&[1], "z"), false).await {
        Err(ServerError::Down { retry_in_ms, .. }) => retry_in_ms,
        other => panic!("expected the shard down, got {other:?}"),
    };

    // Healed and reopened (after its backoff): every acked row is read.
    faults.clear_hook();
    tokio::time::sleep(std::time::Duration::from_millis(retry_in + 1)).await;
    assert_eq!(
        host.reopen_down_shards().await,
        0,
        "{:?}",
        host.down_shards()
    );
    assert_eq!(as_map(&host.read_rows().await.unwrap()), model);
    assert_eq!(
        as_map(&host.lookup_rows(&keys(&[1, 2])).await.unwrap()),
        only(&model, &[1, 2])
    );
    host.close().await.unwrap();
}

/// An unsharded table through a fault store, with `a` rows 0..10
/// published and `b` overwrites of 0..5 plus a delete of 9 unflushed;
/// idle shards close at once. Returns the host, the faults and the model.
async fn idle_host(
    dir: &tempfile::TempDir,
) -> (Arc<TableHost>, Arc<FaultStore>, BTreeMap<i64, String>) {
    let loc = keyed_table(dir, TableSharding::Unsharded).await;
    let faults = FaultStore::new(loc.store.clone());
    let faulty = memwal_store::StoreLocation {
        store: faults.clone(),
        ..loc
    };
    let host = Arc::new(TableHost::open("t", faulty, quick_config()).await.unwrap());
    let ids: Vec<i64> = (0..10).collect();
    host.write(&tagged(&ids, "a"), false).await.unwrap();
    host.flush().await.unwrap();
    host.write(&tagged(&ids[..5], "b"), false).await.unwrap();
    host.write(&deletes(&[9]), true).await.unwrap();
    let mut model = BTreeMap::new();
    put(&mut model, &ids[..9], "a");
    put(&mut model, &ids[..5], "b");
    host.set_shard_limits(ShardLimits {
        max_open: 8,
        idle_close: Some(std::time::Duration::ZERO),
    });
    (host, faults, model)
}

/// Makes every SSTable write `action()`.
fn on_sstable_writes(faults: &FaultStore, action: impl Fn() -> Action + Send + Sync + 'static) {
    faults.set_hook(move |op| {
        if matches!(op.kind, OpKind::Put | OpKind::Multipart) && op.path.contains("_gen_") {
            action()
        } else {
            Action::Pass
        }
    });
}

// Breaks if an idle shard leaves its slot before its close published its
// rows: reads during the close (held here at its SSTable write) would
// miss the unflushed overwrite and delete and show the older published
// values. Also breaks if a put arriving meanwhile is refused instead of
// waiting for the close and opening the shard again. Fails with the
// writer taken out of its slot before `close()` (`limits.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_shard_is_read_while_it_closes_and_puts_wait_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let (host, faults, mut model) = idle_host(&dir).await;
    let gate = Gate::new();
    let held = gate.clone();
    on_sstable_writes(&faults, move || {
        Action::Hold(held.clone(), Box::new(Action::Pass))
    });
    let closer = {
        let host = host.clone();
        tokio::spawn(async move { host.close_idle_shards().await })
    };
    gate.wait_arrived(1).await;
    assert_eq!(
        as_map(&host.read_rows().await.unwrap()),
        model,
        "read while closing"
    );
    let status = host.status().await;
    assert_eq!(status[0].state, "closing", "{status:?}");
    assert_eq!(
        as_map(&host.lookup_rows(&keys(&[0, 6, 9])).await.unwrap()),
        only(&model, &[0, 6, 9]),
        "looked up while closing"
    );
    let putting = {
        let host = host.clone();
        tokio::spawn(async move { host.write(&tagged(&[20], "c"), false).await })
    };
    // The close cannot end before the gate opens: the put waits for it.
    assert_eq!(
        as_map(&host.read_rows().await.unwrap()),
        model,
        "read again while closing"
    );
    assert!(!putting.is_finished(), "the put waits for the close");
    gate.open();
    assert_eq!(closer.await.unwrap(), 1);
    putting.await.unwrap().unwrap();
    put(&mut model, &[20], "c");
    assert_eq!(as_map(&host.read_rows().await.unwrap()), model);
    host.close().await.unwrap();
}

// Breaks if an idle shard whose close failed (its SSTable write refused,
// so its overwrite and delete are only in the WAL) is forgotten and read
// as published, showing the older values, instead of staying down
// (reads refused with UNAVAILABLE naming it) until the next put reopens
// it and replays its WAL. Fails when the slot is removed whatever the
// close's outcome (`limits.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_idle_close_leaves_the_shard_down_until_a_put_reopens_it() {
    let dir = tempfile::tempdir().unwrap();
    let (host, faults, mut model) = idle_host(&dir).await;
    let shard = host.status().await[0].shard.clone();
    on_sstable_writes(&faults, refused);
    assert_eq!(host.close_idle_shards().await, 1);
    assert_unavailable(host.read_rows().await, &shard, "a whole read");
    assert_unavailable(host.lookup_rows(&keys(&[0])).await, &shard, "a lookup");
    let status = host.status().await;
    assert_eq!(status[0].state, "down", "{status:?}");

    // The next put reopens it at once (a new claim, a replay of its WAL).
    faults.clear_hook();
    host.write(&tagged(&[20], "c"), false).await.unwrap();
    put(&mut model, &[20], "c");
    assert_eq!(as_map(&host.read_rows().await.unwrap()), model);
    host.close().await.unwrap();
}

// Breaks if a host whose shards another host took over (its writers
// fenced, with unflushed rows the new owner replayed) fails its close: a
// takeover is not a failure of this daemon (its exit status on SIGTERM),
// only logged, the shards marked lost. Fails when a fenced writer's close
// error is reported as the table's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_shards_were_taken_over_closes_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let a = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    let ids: Vec<i64> = (0..40).collect();
    a.write(&tagged(&ids, "a"), false).await.unwrap();
    let b = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    a.close().await.unwrap();
    let lost = a
        .status()
        .await
        .into_iter()
        .filter(|s| s.state == "lost")
        .count();
    assert_eq!(lost, 4);
    let mut model = BTreeMap::new();
    put(&mut model, &ids, "a");
    assert_eq!(as_map(&b.read_rows().await.unwrap()), model);
    b.close().await.unwrap();
}

// Breaks if a read whose writer snapshot turned stale because this host
// reopened the shard meanwhile (the writer stopped on a storage failure,
// a put reopened it: a new claim, its WAL replayed into the new writer,
// not yet published) drops the stale snapshot and reads the shard as
// published, missing the acknowledged rows only the new writer holds;
// it must read again and take the new writer's snapshot. The read is
// held at its view's listing of the shards while all this happens, the
// new writer's publish at its SSTable write. Fails without the second
// read in `TableHost::snapshot_and_view`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_across_a_reopen_here_reads_the_new_writer() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let dir = tempfile::tempdir().unwrap();
    let loc = keyed_table(&dir, TableSharding::Unsharded).await;
    let faults = FaultStore::new(loc.store.clone());
    let faulty = memwal_store::StoreLocation {
        store: faults.clone(),
        ..loc
    };
    let host = Arc::new(TableHost::open("t", faulty, quick_config()).await.unwrap());
    let ids: Vec<i64> = (0..10).collect();
    host.write(&tagged(&ids, "a"), false).await.unwrap();
    host.flush().await.unwrap();
    host.write(&tagged(&ids[..5], "b"), false).await.unwrap();
    let mut model = BTreeMap::new();
    put(&mut model, &ids, "a");
    put(&mut model, &ids[..5], "b");

    let (view_gate, sstable_gate) = (Gate::new(), Gate::new());
    let hold_view = Arc::new(AtomicBool::new(true));
    let fail_wal = Arc::new(AtomicBool::new(false));
    {
        let (view_gate, sstable_gate) = (view_gate.clone(), sstable_gate.clone());
        let (hold_view, fail_wal) = (hold_view.clone(), fail_wal.clone());
        faults.set_hook(move |op| {
            let write = matches!(op.kind, OpKind::Put | OpKind::Multipart);
            if op.kind == OpKind::List
                && op.path.ends_with("_mem_wal")
                && hold_view.swap(false, SeqCst)
            {
                Action::Hold(view_gate.clone(), Box::new(Action::Pass))
            } else if write && op.path.contains("/wal/") && fail_wal.load(SeqCst) {
                refused()
            } else if write && op.path.contains("_gen_") {
                Action::Hold(sstable_gate.clone(), Box::new(Action::Pass))
            } else {
                Action::Pass
            }
        });
    }
    // The read took its snapshot of the writer; its view waits.
    let reader = {
        let host = host.clone();
        tokio::spawn(async move { host.read_rows().await })
    };
    view_gate.wait_arrived(1).await;

    // The writer stops on a storage failure; after its backoff the shard
    // reopens here (its WAL replayed, the publish held).
    fail_wal.store(true, SeqCst);
    host.write(&tagged(&[7], "lost"), false).await.unwrap_err();
    fail_wal.store(false, SeqCst);
    let retry_in = match host.write(&tagged(&[7], "z"), false).await {
        Err(ServerError::Down { retry_in_ms, .. }) => retry_in_ms,
        other => panic!("expected the shard down, got {other:?}"),
    };
    tokio::time::sleep(std::time::Duration::from_millis(retry_in + 1)).await;
    assert_eq!(
        host.reopen_down_shards().await,
        0,
        "{:?}",
        host.down_shards()
    );

    view_gate.open();
    let read = reader.await.unwrap().unwrap();
    assert_eq!(as_map(&read), model, "the read across the reopen");
    sstable_gate.open();
    assert_eq!(as_map(&host.read_rows().await.unwrap()), model);
    host.close().await.unwrap();
}
