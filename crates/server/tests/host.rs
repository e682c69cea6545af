//! `TableHost` on a local table: routing, partial failures, takeover.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use memwal::ShardWriterConfig;
use memwal_server::{ServerError, TableHost};
use memwal_table::{create_table, TableSharding};

fn rows(ids: &[i64]) -> RecordBatch {
    tagged(ids, "v")
}

fn tagged(ids: &[i64], tag: &str) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", DataType::Utf8, true),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
            Arc::new(StringArray::from_iter_values(
                ids.iter().map(|i| format!("{tag}{i}")),
            )),
        ],
    )
    .unwrap()
}

/// One compaction cycle over every shard of the table at `loc`, each
/// shard's result required to be Ok.
async fn compact(loc: &memwal_store::StoreLocation) {
    let compactor =
        memwal_compactor::Compactor::new(loc.clone(), memwal_compactor::CompactorConfig::default());
    for r in compactor.run_once().await.unwrap() {
        r.unwrap();
    }
}

/// A `bucket(id, 4)` table with `id` int64 key and `v` utf8.
async fn bucket_table(dir: &tempfile::TempDir) -> memwal_store::StoreLocation {
    keyed_table(
        dir,
        TableSharding::Bucket {
            column: "id".into(),
            buckets: 4,
        },
    )
    .await
}

/// A table at `dir/t` with `id` int64 key and `v` utf8, sharded by
/// `sharding`.
async fn keyed_table(
    dir: &tempfile::TempDir,
    sharding: TableSharding,
) -> memwal_store::StoreLocation {
    let path = dir.path().join("t").to_str().unwrap().to_string();
    let loc = memwal_store::open_store(&path).unwrap();
    let key = Field::new("id", DataType::Int64, false).with_metadata(
        [(
            "lance-schema:unenforced-primary-key".to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    let schema = Arc::new(Schema::new(vec![
        key,
        Field::new("v", DataType::Utf8, true),
    ]));
    create_table(&loc, schema, &sharding).await.unwrap();
    loc
}

// Breaks if /readyz says ready (or /status hides that tables are still
// opening) before every table is open, or stays unready after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_unavailable_until_every_table_is_open() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let state = memwal_server::http::HttpState {
        tables: Default::default(),
        ready: Arc::new(AtomicBool::new(false)),
        metrics: None,
        token: None,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = memwal_server::http::router(state.clone());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let get = |path: &'static str| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).await.unwrap();
        let code: u16 = reply.split_whitespace().nth(1).unwrap().parse().unwrap();
        let body = reply.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
        (code, body)
    };
    assert_eq!(get("/healthz").await.0, 200);
    assert_eq!(get("/readyz").await.0, 503);
    let (code, body) = get("/status").await;
    assert_eq!(code, 200);
    assert!(body.contains("\"opening\":true"), "{body}");

    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let host = TableHost::open("t", loc, ShardWriterConfig::default())
        .await
        .unwrap();
    host.write(&rows(&[1, 2, 3]), false).await.unwrap();
    host.flush().await.unwrap();
    let tables: std::collections::HashMap<_, _> =
        [("t".to_string(), Arc::new(host))].into_iter().collect();
    assert!(state.tables.set(Arc::new(tables)).is_ok());
    state.ready.store(true, Ordering::SeqCst);
    assert_eq!(get("/readyz").await.0, 200);
    let (_, body) = get("/status").await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["opening"], false, "{v}");
    let shards = v["tables"]["t"]["shards"].as_array().unwrap();
    assert!(!shards.is_empty(), "{v}");
    for s in shards {
        assert_eq!(s["compacted_generation"], 0, "{s}");
        assert_eq!(s["published_generation"], 1, "{s}");
        assert_eq!(s["compaction_lag_generations"], 1, "{s}");
    }
    server.abort();
    state.tables.get().unwrap()["t"].close().await.unwrap();
}

// Breaks if a put larger than a shard may hold is not refused as invalid
// input (INVALID_ARGUMENT, naming the limit), or if the host stops serving
// after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_put_is_invalid_and_the_table_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let config = ShardWriterConfig {
        memtable_max_bytes: 4 << 10,
        ..ShardWriterConfig::default()
    };
    let host = TableHost::open("t", loc, config).await.unwrap();
    let big: Vec<i64> = (0..4000).collect();
    let e = host.write(&rows(&big), false).await.unwrap_err();
    let status = tonic::Status::from(e);
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
    assert!(status.message().contains("memtable_max_bytes"), "{status}");
    let parts = host.write(&rows(&[1, 2]), false).await.unwrap();
    assert!(!parts.is_empty());
    host.close().await.unwrap();
}

// Breaks if a batch is checked only against the table-level schema: here
// two shards opened before a column was dropped from the base and two open
// after it (their writers no longer have it), so the old-schema batch
// fits the first two and not the others. Before the fix the first two
// parts became durable and the batch failed INVALID_ARGUMENT anyway (a
// retry duplicates them on an append-only table); now nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_one_shard_refuses_fails_the_batch_before_any_part_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let host = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    let bucket = |id: &i64| memwal_sharding::bucket_of(memwal_sharding::hash_i64(*id), 4);
    let ids: Vec<i64> = (0..40).collect();
    let early: Vec<i64> = ids.iter().copied().filter(|i| bucket(i) < 2).collect();
    host.write(&rows(&early), false).await.unwrap();
    let positions = |status: Vec<memwal_server::ShardStatus>| -> Vec<(String, Option<u64>)> {
        status
            .into_iter()
            .map(|s| (s.shard, s.wal_position))
            .collect()
    };
    let before = positions(host.status().await);
    assert_eq!(before.len(), 2);

    let path = dir.path().join("t");
    let mut ds = lance::Dataset::open(path.to_str().unwrap()).await.unwrap();
    ds.drop_columns(&["v"]).await.unwrap();

    let e = host.write(&tagged(&ids, "x"), false).await.unwrap_err();
    assert!(!e.may_be_durable(), "{e}");
    assert!(matches!(e, ServerError::Writer { .. }), "{e}");
    assert_eq!(tonic::Status::from(e).code(), tonic::Code::InvalidArgument);
    let after: Vec<_> = positions(host.status().await)
        .into_iter()
        .filter(|(shard, _)| before.iter().any(|(s, _)| s == shard))
        .collect();
    assert_eq!(after, before, "no part of the refused batch reached a WAL");
    host.close().await.unwrap();
}

// Breaks if a shard whose writer stopped on a storage failure stays down
// (every later put UNAVAILABLE until a restart), if /status and /readyz
// do not show it down with its cause, or if the reopen (a new claim and a
// replay) loses an acknowledged row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_down_on_a_storage_failure_is_reported_and_reopened() {
    use memwal_testkit::{Action, FaultStore, OpKind};
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let faults = FaultStore::new(loc.store.clone());
    let faulty = memwal_store::StoreLocation {
        store: faults.clone(),
        ..loc.clone()
    };
    let config = ShardWriterConfig {
        retry: memwal_store::RetryPolicy {
            max_attempts: 2,
            initial_backoff: std::time::Duration::from_millis(1),
            max_backoff: std::time::Duration::from_millis(2),
        },
        ..ShardWriterConfig::default()
    };
    let host = Arc::new(TableHost::open("t", faulty, config).await.unwrap());
    host.write(&rows(&[1, 2, 3]), false).await.unwrap();
    let shard_of_1 = host.write(&rows(&[1]), false).await.unwrap()[0]
        .shard
        .clone();

    // Every WAL write fails: the shard of key 1 goes down.
    faults.set_hook(|op| {
        if op.kind == OpKind::Put && op.path.contains("/wal/") {
            Action::Fail
        } else {
            Action::Pass
        }
    });
    let e = host.write(&tagged(&[1], "lost"), false).await.unwrap_err();
    assert_eq!(tonic::Status::from(e).code(), tonic::Code::Unavailable);
    let e = host.write(&rows(&[1]), false).await.unwrap_err();
    assert!(matches!(e, ServerError::Down { .. }), "{e}");
    let down = host.down_shards();
    assert_eq!(down.len(), 1, "{down:?}");
    assert!(down[0].contains(&shard_of_1), "{down:?}");
    let status = host.status().await;
    let s = status.iter().find(|s| s.shard == shard_of_1).unwrap();
    assert_eq!(s.state, "down", "{s:?}");
    assert!(
        s.last_error.as_deref().unwrap_or("").contains("down for"),
        "{s:?}"
    );
    let readyz = || async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let tables: memwal_server::http::Tables = Default::default();
        let _ = tables.set(Arc::new([("t".to_string(), host.clone())].into()));
        let state = memwal_server::http::HttpState {
            tables,
            ready: Arc::new(std::sync::atomic::AtomicBool::new(true)),
            metrics: None,
            token: None,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server =
            tokio::spawn(
                async move { axum::serve(listener, memwal_server::http::router(state)).await },
            );
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /readyz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut reply = String::new();
        c.read_to_string(&mut reply).await.unwrap();
        server.abort();
        reply
    };
    let reply = readyz().await;
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    assert!(reply.contains(&shard_of_1), "{reply}");

    // The store heals: the reopener brings the shard back (after its
    // backoff), the rows acknowledged before are still there, and puts are
    // served again.
    faults.clear_hook();
    reopen_down(&host).await;
    assert!(host.down_shards().is_empty());
    assert!(readyz().await.starts_with("HTTP/1.1 200"));
    host.write(&rows(&[1, 4]), false).await.unwrap();
    host.close().await.unwrap();
    let all = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    all.close().await.unwrap();
    compact(&loc).await;
    let path = dir.path().join("t");
    let ds = lance::Dataset::open(path.to_str().unwrap()).await.unwrap();
    assert_eq!(ds.count_rows(None).await.unwrap(), 4);
}

// Breaks if opening one shard (a claim and a replay, here held forever by
// a hung store) holds a table-wide lock: puts to the table's open shards,
// and /status, must go on while it hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_shard_open_holds_up_only_that_shard() {
    use memwal_testkit::{Action, FaultStore, Gate, OpKind};
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let faults = FaultStore::new(loc.store.clone());
    let faulty = memwal_store::StoreLocation {
        store: faults.clone(),
        ..loc.clone()
    };
    let host = Arc::new(
        TableHost::open("t", faulty, ShardWriterConfig::default())
            .await
            .unwrap(),
    );
    let bucket = |id: &i64| memwal_sharding::bucket_of(memwal_sharding::hash_i64(*id), 4);
    let ids: Vec<i64> = (0..40).collect();
    let zero: Vec<i64> = ids.iter().copied().filter(|i| bucket(i) == 0).collect();
    let three: Vec<i64> = ids.iter().copied().filter(|i| bucket(i) == 3).collect();
    host.write(&rows(&zero), false).await.unwrap();
    let open_shard = host.status().await[0].shard.clone();

    // Every request of another shard's manifest (its creation and claim)
    // hangs at the gate.
    let gate = Gate::new();
    let held = gate.clone();
    faults.set_hook(move |op| {
        if op.kind != OpKind::List
            && op.path.contains("/manifest/")
            && !op.path.contains(&open_shard)
        {
            Action::Hold(held.clone(), Box::new(Action::Pass))
        } else {
            Action::Pass
        }
    });
    let opening = {
        let host = host.clone();
        tokio::spawn(async move { host.write(&rows(&three), false).await })
    };
    gate.wait_arrived(1).await;
    let served = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        host.write(&rows(&zero), false).await.unwrap();
        host.status().await
    })
    .await
    .expect("the open shard and /status are served while another shard opens");
    assert_eq!(served.len(), 1, "{served:?}");
    gate.open();
    opening.await.unwrap().unwrap();
    assert_eq!(host.status().await.len(), 2);
    host.close().await.unwrap();
}

// Breaks if a table takes rows after `close` began: a put for a shard not
// yet open would claim it after the close listed its shards, and nothing
// would ever close it (its rows only in the WAL, the claim fencing the
// next daemon's writer for nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_table_takes_no_rows_and_opens_no_shard() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let host = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    let bucket = |id: &i64| memwal_sharding::bucket_of(memwal_sharding::hash_i64(*id), 4);
    let ids: Vec<i64> = (0..40).collect();
    let zero: Vec<i64> = ids.iter().copied().filter(|i| bucket(i) == 0).collect();
    let three: Vec<i64> = ids.iter().copied().filter(|i| bucket(i) == 3).collect();
    host.write(&rows(&zero), false).await.unwrap();
    host.close().await.unwrap();
    let e = host.write(&rows(&three), false).await.unwrap_err();
    assert!(matches!(e, ServerError::Stopping { .. }), "{e}");
    assert_eq!(tonic::Status::from(e).code(), tonic::Code::Unavailable);
    let shards = memwal_table::list_shards(&loc).await.unwrap();
    assert_eq!(
        shards.len(),
        1,
        "a shard was claimed after close: {shards:?}"
    );
}

// Breaks if `flush` actions can be triggered back to back (a client could
// keep the flusher and the store busy): one at a time, at most one per
// MIN_FLUSH_INTERVAL, refused with RESOURCE_EXHAUSTED otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_actions_are_rate_limited() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let host = TableHost::open("t", loc, ShardWriterConfig::default())
        .await
        .unwrap();
    let turn = host.begin_flush().unwrap();
    let e = host.begin_flush().map(|_| ()).unwrap_err();
    assert_eq!(
        tonic::Status::from(e).code(),
        tonic::Code::ResourceExhausted
    );
    drop(turn);
    assert!(
        host.begin_flush().is_err(),
        "a second flush within the interval"
    );
    // With no spacing configured, still one at a time, but back to back.
    host.set_min_flush_interval(std::time::Duration::ZERO);
    let turn = host.begin_flush().unwrap();
    assert!(host.begin_flush().is_err(), "two flushes at once");
    drop(turn);
    drop(host.begin_flush().unwrap());
    host.close().await.unwrap();
}

// Breaks if identity sharding opens shards without bound (each new value
// claims a shard with its tasks, memtable and metric series, kept
// forever): past `max_open` a batch touching a new value must be
// RESOURCE_EXHAUSTED naming the cap with nothing of it written; idle
// shards must be flushed, closed and forgotten, which frees the cap, their
// rows intact; a row for a closed shard opens it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_shards_are_capped_and_idle_ones_close() {
    use memwal_server::ShardLimits;
    let dir = tempfile::tempdir().unwrap();
    let loc = keyed_table(
        &dir,
        TableSharding::Identity {
            column: "id".into(),
        },
    )
    .await;
    let host = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    let limits = |idle: u64| ShardLimits {
        max_open: 2,
        idle_close: Some(std::time::Duration::from_secs(idle)),
    };
    host.set_shard_limits(limits(3600));
    host.write(&rows(&[1]), false).await.unwrap();
    host.write(&rows(&[2]), false).await.unwrap();
    let e = host.write(&tagged(&[1, 3], "x"), false).await.unwrap_err();
    assert!(!e.may_be_durable(), "{e}");
    assert!(e.to_string().contains("max_open_shards"), "{e}");
    assert_eq!(
        tonic::Status::from(e).code(),
        tonic::Code::ResourceExhausted
    );
    assert_eq!(host.status().await.len(), 2, "no third shard");
    assert_eq!(host.close_idle_shards().await, 0, "nothing is idle yet");

    host.set_shard_limits(limits(0));
    assert_eq!(host.close_idle_shards().await, 2);
    assert!(
        host.status().await.is_empty(),
        "closed shards are forgotten"
    );
    host.set_shard_limits(limits(3600));
    host.write(&tagged(&[3], "x"), false).await.unwrap();
    host.write(&tagged(&[1], "y"), false).await.unwrap();
    assert_eq!(host.status().await.len(), 2);
    host.close().await.unwrap();

    compact(&loc).await;
    let ds = lance::Dataset::open(dir.path().join("t").to_str().unwrap())
        .await
        .unwrap();
    let batches: Vec<RecordBatch> =
        futures::TryStreamExt::try_collect(ds.scan().try_into_stream().await.unwrap())
            .await
            .unwrap();
    let mut got = std::collections::BTreeMap::new();
    for b in &batches {
        let ids = arrow_array::cast::AsArray::as_primitive::<arrow_array::types::Int64Type>(
            b.column_by_name("id").unwrap(),
        );
        let vs = arrow_array::cast::AsArray::as_string::<i32>(b.column_by_name("v").unwrap());
        for i in 0..b.num_rows() {
            got.insert(ids.value(i), vs.value(i).to_string());
        }
    }
    let want: std::collections::BTreeMap<i64, String> = [(1, "y1"), (2, "v2"), (3, "x3")]
        .map(|(k, v)| (k, v.to_string()))
        .into();
    assert_eq!(got, want);
}

/// Deletes of `ids` (the key column only).
fn deletes(ids: &[i64]) -> RecordBatch {
    RecordBatch::try_from_iter(vec![(
        "id",
        Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
    )])
    .unwrap()
}

/// `ids` as lookup keys.
fn keys(ids: &[i64]) -> Vec<datafusion::scalar::ScalarValue> {
    ids.iter()
        .map(|&k| datafusion::scalar::ScalarValue::Int64(Some(k)))
        .collect()
}

/// `model` restricted to `ids`.
fn only(model: &BTreeMap<i64, String>, ids: &[i64]) -> BTreeMap<i64, String> {
    model
        .iter()
        .filter(|(k, _)| ids.contains(k))
        .map(|(k, v)| (*k, v.clone()))
        .collect()
}

/// Writes `tag` rows of `ids` into `model`.
fn put(model: &mut BTreeMap<i64, String>, ids: &[i64], tag: &str) {
    for i in ids {
        model.insert(*i, format!("{tag}{i}"));
    }
}

/// `loc` through a fault store (same objects): the store, and the location
/// a host opens to have its requests seen and faulted.
fn through_faults(
    loc: &memwal_store::StoreLocation,
) -> (Arc<memwal_testkit::FaultStore>, memwal_store::StoreLocation) {
    let faults = memwal_testkit::FaultStore::new(loc.store.clone());
    let faulty = memwal_store::StoreLocation {
        store: faults.clone(),
        ..loc.clone()
    };
    (faults, faulty)
}

/// Reopens the host's down shards until none is down (each after its
/// backoff); fails the test after 30 s.
async fn reopen_down(host: &TableHost) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while host.reopen_down_shards().await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            host.down_shards()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// `id -> v` of a read.
fn as_map(b: &RecordBatch) -> std::collections::BTreeMap<i64, String> {
    let ids = arrow_array::cast::AsArray::as_primitive::<arrow_array::types::Int64Type>(
        b.column_by_name("id").unwrap(),
    );
    let vs = arrow_array::cast::AsArray::as_string::<i32>(b.column_by_name("v").unwrap());
    let mut out = std::collections::BTreeMap::new();
    for i in 0..b.num_rows() {
        assert!(
            out.insert(ids.value(i), vs.value(i).to_string()).is_none(),
            "key {} twice",
            ids.value(i)
        );
    }
    out
}

// Breaks if a read misses acknowledged rows that are only in a memtable
// (nothing flushed), shows a key twice (published and unflushed), shows an
// overwritten value or a deleted key, or loses published rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_see_acked_rows_at_once_newest_value_only() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let host = TableHost::open("t", loc, ShardWriterConfig::default())
        .await
        .unwrap();
    let ids: Vec<i64> = (0..20).collect();
    host.write(&tagged(&ids, "a"), false).await.unwrap();
    let read = as_map(&host.read_rows().await.unwrap());
    let want: std::collections::BTreeMap<i64, String> =
        ids.iter().map(|&i| (i, format!("a{i}"))).collect();
    assert_eq!(read, want, "unflushed rows, read at once");

    host.flush().await.unwrap();
    host.write(&tagged(&[3, 4], "b"), false).await.unwrap();
    let keys = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    let delete = RecordBatch::try_new(
        keys,
        vec![Arc::new(Int64Array::from(vec![5, 6])) as ArrayRef],
    )
    .unwrap();
    host.write(&delete, true).await.unwrap();
    let mut want = want;
    want.insert(3, "b3".into());
    want.insert(4, "b4".into());
    want.remove(&5);
    want.remove(&6);
    assert_eq!(as_map(&host.read_rows().await.unwrap()), want);
    host.flush().await.unwrap();
    assert_eq!(
        as_map(&host.read_rows().await.unwrap()),
        want,
        "after a flush"
    );
    host.close().await.unwrap();
}

// Breaks if a put that lacks a nullable column of the table is refused (a
// producer not yet upgraded after a column was added would lose its
// writes) instead of being written with that column null, if columns sent
// in another order are refused, or if a column the table does not have is
// accepted or refused without naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_are_matched_to_the_table_by_column_name() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let host = TableHost::open("t", loc, ShardWriterConfig::default())
        .await
        .unwrap();
    let ids_only = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)])),
        vec![Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef],
    )
    .unwrap();
    host.write(&ids_only, false).await.unwrap();
    let reordered = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("v", DataType::Utf8, true),
            Field::new("id", DataType::Int64, false),
        ])),
        vec![
            Arc::new(StringArray::from(vec!["r3"])) as ArrayRef,
            Arc::new(Int64Array::from(vec![3])) as ArrayRef,
        ],
    )
    .unwrap();
    host.write(&reordered, false).await.unwrap();
    let extra = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Utf8, true),
            Field::new("bogus", DataType::Utf8, true),
        ])),
        vec![
            Arc::new(Int64Array::from(vec![4])) as ArrayRef,
            Arc::new(StringArray::from(vec!["x"])) as ArrayRef,
            Arc::new(StringArray::from(vec!["y"])) as ArrayRef,
        ],
    )
    .unwrap();
    let e = host.write(&extra, false).await.unwrap_err();
    assert!(e.to_string().contains("bogus"), "{e}");
    assert_eq!(tonic::Status::from(e).code(), tonic::Code::InvalidArgument);
    let read = host.read_rows().await.unwrap();
    let ids = arrow_array::cast::AsArray::as_primitive::<arrow_array::types::Int64Type>(
        read.column_by_name("id").unwrap(),
    );
    let vs = arrow_array::cast::AsArray::as_string::<i32>(read.column_by_name("v").unwrap());
    let mut got: Vec<(i64, Option<String>)> = (0..read.num_rows())
        .map(|i| {
            let v = arrow_array::Array::is_valid(vs, i).then(|| vs.value(i).to_string());
            (ids.value(i), v)
        })
        .collect();
    got.sort();
    assert_eq!(got, vec![(1, None), (2, None), (3, Some("r3".to_string()))]);
    host.close().await.unwrap();
}

// Breaks if, after a column is added to the base while the daemon runs,
// shards opened after the change refuse the old schema (the issue's
// measurement: one bucket then took no rows at all until a restart): a
// batch spanning shards opened before and after must be written whole,
// the new column null for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_the_host_follows_an_added_column_every_shard_takes_the_old_schema() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let host = TableHost::open("t", loc, ShardWriterConfig::default())
        .await
        .unwrap();
    let bucket = |id: &i64| memwal_sharding::bucket_of(memwal_sharding::hash_i64(*id), 4);
    let ids: Vec<i64> = (0..40).collect();
    let early: Vec<i64> = ids.iter().copied().filter(|i| bucket(i) < 2).collect();
    host.write(&tagged(&early, "a"), false).await.unwrap();
    assert_eq!(host.status().await.len(), 2);
    let mut ds = lance::Dataset::open(dir.path().join("t").to_str().unwrap())
        .await
        .unwrap();
    let extra = Arc::new(Schema::new(vec![Field::new("extra", DataType::Utf8, true)]));
    ds.add_columns(
        lance::dataset::NewColumnTransform::AllNulls(extra),
        None,
        None,
    )
    .await
    .unwrap();
    host.write(&tagged(&ids, "b"), false).await.unwrap();
    assert_eq!(
        host.status().await.len(),
        4,
        "two shards opened after the change"
    );
    let read = as_map(&host.read_rows().await.unwrap());
    let want: std::collections::BTreeMap<i64, String> =
        ids.iter().map(|&i| (i, format!("b{i}"))).collect();
    assert_eq!(read, want);
    host.close().await.unwrap();
}

// Breaks if a read taken while writers put, freeze and publish misses a
// row acknowledged before it began (a generation published between the
// writer snapshot and the view read, say), shows a key twice, or shows a
// value older than the newest one acknowledged before it began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_during_writes_and_flushes_hold_the_snapshot_rules() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    // Tiny memtables: generations freeze and publish all through the run.
    let config = ShardWriterConfig {
        memtable_max_rows: 16,
        ..ShardWriterConfig::default()
    };
    let host = Arc::new(TableHost::open("t", loc, config).await.unwrap());
    // key -> newest acknowledged version, updated after each ack.
    let acked = Arc::new(parking_lot::Mutex::new(std::collections::BTreeMap::<
        i64,
        u64,
    >::new()));
    let writer = {
        let (host, acked) = (host.clone(), acked.clone());
        tokio::spawn(async move {
            for version in 1..=60u64 {
                let ids: Vec<i64> = (0..12).map(|i| (i * 7 + version as i64) % 24).collect();
                host.write(&tagged(&ids, &format!("{version:03}-")), false)
                    .await
                    .unwrap();
                let mut a = acked.lock();
                for id in ids {
                    a.insert(id, version);
                }
            }
        })
    };
    // Widen the window between a read's writer snapshots and its view of
    // what is published, so generations publish inside it.
    fail::cfg("server::read_after_snapshots", "sleep(150)").unwrap();
    let mut reads = 0;
    while !writer.is_finished() || reads < 5 {
        let before = acked.lock().clone();
        let read = as_map(&host.read_rows().await.unwrap()); // panics on a key twice
        for (id, version) in &before {
            let got = read
                .get(id)
                .unwrap_or_else(|| panic!("key {id}, acked at version {version}, missing"));
            let got_version: u64 = got[..3].parse().unwrap();
            assert!(
                got_version >= *version,
                "key {id}: read version {got_version}, acked {version} before the read"
            );
        }
        reads += 1;
    }
    fail::remove("server::read_after_snapshots");
    writer.await.unwrap();
    assert!(reads >= 5);
    host.close().await.unwrap();
}

#[path = "host/schema.rs"]
mod schema;

#[path = "host/lookup.rs"]
mod lookup;

#[path = "host/search.rs"]
mod search;

#[path = "host/isolation.rs"]
mod isolation;

#[path = "host/small_puts.rs"]
mod small_puts;

#[path = "host/across.rs"]
mod across;

#[path = "host/producers.rs"]
mod producers;

#[path = "host/append_only.rs"]
mod append_only;
