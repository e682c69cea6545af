//! Idempotent producers through `memwal serve`
//! (docs/design/idempotent-producers.md): a batch durable in the WAL whose
//! acknowledgement never reached the producer (the daemon was killed, or
//! stalled and was taken over) is acknowledged again when retried, and
//! written once.

use super::*;

const PRODUCER: &str = "ingest-7";

/// Every `(id, v)` of table `t` through the daemon at `addr` (SQL), sorted.
async fn all_rows(addr: &str) -> Vec<(i64, String)> {
    let batches = sql_rows(addr, "SELECT id, v FROM t").await.unwrap();
    let mut out = Vec::new();
    for b in batches {
        let ids =
            arrow_array::cast::AsArray::as_primitive::<arrow_array::types::Int64Type>(b.column(0));
        let vs = arrow_array::cast::AsArray::as_string::<i32>(b.column(1));
        out.extend((0..b.num_rows()).map(|i| (ids.value(i), vs.value(i).to_string())));
    }
    out.sort();
    out
}

fn duplicate(ack: &serde_json::Value) -> bool {
    let parts = ack["parts"].as_array().unwrap();
    assert!(!parts.is_empty(), "{ack}");
    let dup: Vec<bool> = parts
        .iter()
        .map(|p| p["duplicate"].as_bool().unwrap_or(false))
        .collect();
    assert!(dup.iter().all(|d| *d == dup[0]), "mixed parts: {ack}");
    dup[0]
}

// Breaks if a batch that was durable when the daemon died is written again
// by its retry (the append-only table would hold its rows twice), if the
// retry is not acknowledged as a duplicate, or if a gap is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_kill_between_wal_write_and_ack_is_written_once() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_append_only(&table, "unsharded");
    let mut d = Daemon::try_launch(
        &table,
        &["--no-compactor"],
        &[("FAILPOINTS", "wal::after_put=1*return")],
    )
    .expect("daemon ended before serving");
    let mut c = client(&d.flight, None).await;
    let first = rows(&[1, 2], "a");
    let lost = producer_put(&mut c, &["t"], first.clone(), (PRODUCER, 1, 1)).await;
    assert!(
        lost.is_err(),
        "the daemon died before acknowledging: {lost:?}"
    );
    assert!(
        !d.child.wait().unwrap().success(),
        "killed at the crash point"
    );

    let d = Daemon::start(&table, &[]);
    let mut c = client(&d.flight, None).await;
    let again = producer_put(&mut c, &["t"], first, (PRODUCER, 1, 1))
        .await
        .unwrap();
    assert!(duplicate(&again), "{again}");
    assert!(
        again["parts"][0]["wal_position"].as_u64().is_some(),
        "{again}"
    );
    let next = producer_put(&mut c, &["t"], rows(&[3], "b"), (PRODUCER, 1, 2))
        .await
        .unwrap();
    assert!(!duplicate(&next), "{next}");
    let gap = producer_put(&mut c, &["t"], rows(&[9], "gap"), (PRODUCER, 1, 4))
        .await
        .unwrap_err();
    assert_eq!(gap.code(), tonic::Code::FailedPrecondition, "{gap:?}");
    assert_eq!(gap.metadata().get("memwal-expected-sequence").unwrap(), "3");
    let want: Vec<(i64, String)> = [(1, "a-1"), (2, "a-2"), (3, "b-3")]
        .map(|(k, v)| (k, v.to_string()))
        .into();
    assert_eq!(all_rows(&d.flight).await, want);
    d.stop_ok();
}

// Breaks if a producer replaying its batches after a crash (from its last
// checkpoint, as Flink or Spark do) moves a key back to an older value on
// a keyed table, because the daemon died after the newer batch was
// durable and before it was acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaying_producer_never_moves_a_key_back() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let d = Daemon::start(&table, &[]);
    let mut c = client(&d.flight, None).await;
    producer_put(&mut c, &["t"], rows(&[1, 2], "old"), (PRODUCER, 1, 1))
        .await
        .unwrap();
    d.stop_ok();
    let mut d = Daemon::try_launch(
        &table,
        &["--no-compactor"],
        &[("FAILPOINTS", "wal::after_put=1*return")],
    )
    .expect("daemon ended before serving");
    let mut c = client(&d.flight, None).await;
    let lost = producer_put(&mut c, &["t"], rows(&[1], "new"), (PRODUCER, 1, 2)).await;
    assert!(lost.is_err(), "{lost:?}");
    let _ = d.child.wait();

    let d = Daemon::start(&table, &[]);
    let mut c = client(&d.flight, None).await;
    // The producer restarted (a new epoch) and replays from its checkpoint.
    for (s, batch) in [(1, rows(&[1, 2], "old")), (2, rows(&[1], "new"))] {
        let ack = producer_put(&mut c, &["t"], batch, (PRODUCER, 2, s))
            .await
            .unwrap();
        assert!(duplicate(&ack), "sequence {s}: {ack}");
        let want: Vec<(i64, String)> = [(1, "new-1"), (2, "old-2")]
            .map(|(k, v)| (k, v.to_string()))
            .into();
        assert_eq!(all_rows(&d.flight).await, want, "after replaying {s}");
    }
    // The new epoch fences the old incarnation.
    let stale = producer_put(&mut c, &["t"], rows(&[1], "zombie"), (PRODUCER, 1, 3))
        .await
        .unwrap_err();
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition, "{stale:?}");
    d.stop_ok();
}

// Breaks if the successor of a stalled daemon writes a retried batch again
// (it must find the batch's stamp in the WAL it replays when it claims the
// shard), or if the stalled daemon's late write shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_a_stalled_daemon_never_acknowledged_is_a_duplicate_at_its_successor() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_append_only(&table, "unsharded");
    // The first WAL write lands, then its thread stalls past the client's
    // patience.
    let a = Daemon::try_launch(
        &table,
        &["--no-compactor"],
        &[("FAILPOINTS", "wal::after_put=1*sleep(2500)")],
    )
    .expect("daemon ended before serving");
    let mut ca = client(&a.flight, None).await;
    let batch = rows(&[1, 2, 3], "a");
    let waited = tokio::time::timeout(
        std::time::Duration::from_millis(700),
        producer_put(&mut ca, &["t"], batch.clone(), (PRODUCER, 1, 1)),
    )
    .await;
    assert!(
        waited.is_err(),
        "the stalled daemon acknowledged: {waited:?}"
    );

    let b = Daemon::start(&table, &[]);
    let mut cb = client(&b.flight, None).await;
    let again = producer_put(&mut cb, &["t"], batch, (PRODUCER, 1, 1))
        .await
        .unwrap();
    assert!(duplicate(&again), "{again}");
    producer_put(&mut cb, &["t"], rows(&[4], "b"), (PRODUCER, 1, 2))
        .await
        .unwrap();
    let want: Vec<(i64, String)> = [(1, "a-1"), (2, "a-2"), (3, "a-3"), (4, "b-4")]
        .map(|(k, v)| (k, v.to_string()))
        .into();
    assert_eq!(all_rows(&b.flight).await, want);
    // The stalled daemon wakes fenced: its next put is refused.
    let late = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        producer_put(&mut ca, &["t"], rows(&[5], "late"), (PRODUCER, 1, 3)),
    )
    .await
    .expect("the fenced daemon answers");
    assert!(late.is_err(), "{late:?}");
    let _ = a.stop();
    assert_eq!(all_rows(&b.flight).await, want);
    b.stop_ok();
}

// Breaks if `memwal load --producer-id` does not send its batches as an
// idempotent producer's: run twice (a producer replaying everything), the
// append-only table must hold each row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memwal_load_as_a_producer_replayed_writes_each_row_once() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_append_only(&table, "unsharded");
    let d = Daemon::start(&table, &[]);
    let args = [
        "load",
        "--to",
        &d.flight,
        "--table",
        "t",
        "--rows",
        "600",
        "--batch",
        "100",
        "--producers",
        "2",
        "--payload",
        "10",
        "--producer-id",
        "bulk",
    ];
    for run in 0..2 {
        let (ok, out, err) = memwal(&args);
        assert!(ok, "run {run}: {err}");
        assert!(out.starts_with("600 rows in"), "run {run}: {out}");
    }
    let rows = all_rows(&d.flight).await;
    assert_eq!(rows.len(), 600, "each row once");
    assert!(rows.iter().map(|(id, _)| *id).eq(0..600));
    d.stop_ok();
}

// Breaks if the documented clients cannot be idempotent producers:
// pyarrow's Flight client (sequences in each batch's app_metadata) and
// ADBC's Flight SQL driver (request headers): a retried batch or ingest
// must be acknowledged as written before and not written again (the
// append-only table ends with 7 rows, not 11), and a gap refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyarrow_and_adbc_clients_are_idempotent_producers() {
    let Some(python) = test_python("pyarrow and ADBC") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_append_only(&table, "unsharded");
    let d = Daemon::start(&table, &[]);
    let out = run_python(&python, "producer_put.py", &[&d.flight, "t"]);
    let out: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let first = out["first"].as_array().unwrap();
    assert_eq!(first.len(), 3, "{out}");
    assert!(first.iter().all(|a| !duplicate(a)), "{out}");
    let retry = &out["retry"][0];
    assert!(duplicate(retry), "{out}");
    assert_eq!(
        retry["parts"][0]["wal_position"], first[1]["parts"][0]["wal_position"],
        "the retry is acknowledged with the original's position: {out}"
    );
    let gap = out["gap"].as_str().unwrap_or_default();
    assert!(gap.contains("the next expected is 4"), "{out}");
    assert_eq!(out["ingests"], serde_json::json!([3, 3]), "{out}");
    assert_eq!(out["count"], 7, "{out}");
    let want: Vec<(i64, String)> = [
        (1, "a-1"),
        (2, "a-2"),
        (3, "b-3"),
        (4, "c-4"),
        (5, "d-5"),
        (6, "d-6"),
        (7, "d-7"),
    ]
    .map(|(k, v)| (k, v.to_string()))
    .into();
    assert_eq!(all_rows(&d.flight).await, want);
    d.stop_ok();
}
