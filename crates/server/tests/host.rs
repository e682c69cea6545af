//! `TableHost` on a local table: routing, partial failures, takeover.

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use memwal::{ShardId, ShardWriter, ShardWriterConfig};
use memwal_compactor::{create_table, TableSharding};
use memwal_server::{ServerError, TableHost};

fn rows(ids: &[i64]) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", DataType::Utf8, true),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
            Arc::new(StringArray::from_iter_values(
                ids.iter().map(|i| format!("v{i}")),
            )),
        ],
    )
    .unwrap()
}

/// A `bucket(id, 4)` table with `id` int64 key and `v` utf8.
async fn bucket_table(dir: &tempfile::TempDir) -> memwal_store::StoreLocation {
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
    let sharding = TableSharding::Bucket {
        column: "id".into(),
        buckets: 4,
    };
    create_table(&loc, schema, &sharding).await.unwrap();
    loc
}

fn durable_parts(e: &ServerError) -> usize {
    match e {
        ServerError::Partial { durable, source } => {
            assert!(
                matches!(**source, ServerError::ServedElsewhere { .. }),
                "{e}"
            );
            durable.matches("rows at").count()
        }
        other => panic!("expected a partial failure, got {other}"),
    }
}

// Breaks if a daemon owning a bucket subset claims (and so fences) a shard
// of another daemon's buckets, at first use or when reopening, if rows of a
// bucket it does not own are accepted or refused with a code other than
// FAILED_PRECONDITION, or if the two halves do not together hold every row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemons_owning_bucket_subsets_split_a_table_without_fencing_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let open = |b: &'static [u32]| {
        TableHost::open_buckets("t", loc.clone(), ShardWriterConfig::default(), Some(b))
    };
    let a = open(&[0, 1]).await.unwrap();
    let b = open(&[2, 3]).await.unwrap();
    let ids: Vec<i64> = (0..40).collect();
    let e = a.write(&rows(&ids), false).await.unwrap_err();
    assert_eq!(durable_parts(&e), 2, "{e}");
    assert_eq!(
        tonic::Status::from(e).code(),
        tonic::Code::FailedPrecondition
    );
    assert_eq!(
        durable_parts(&b.write(&rows(&ids), false).await.unwrap_err()),
        2
    );
    // Reopening A must claim only its own two shards: B keeps writing.
    a.close().await.unwrap();
    let a = open(&[0, 1]).await.unwrap();
    assert_eq!(a.status().await.len(), 2);
    assert_eq!(
        durable_parts(&b.write(&rows(&ids), false).await.unwrap_err()),
        2
    );
    assert_eq!(
        durable_parts(&a.write(&rows(&ids), false).await.unwrap_err()),
        2
    );
    for s in a.status().await.iter().chain(b.status().await.iter()) {
        assert_eq!(s.state, "serving", "{s:?}");
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
    // A subset of a table not sharded by one bucket field, or a bucket
    // that does not exist, is refused at open.
    assert!(open(&[4])
        .await
        .unwrap_err()
        .to_string()
        .contains("bucket 4"));

    // Every row is in exactly one half: a full host sees four shards, and
    // after compaction the base holds all 40 rows.
    let all = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    assert_eq!(all.status().await.len(), 4);
    all.close().await.unwrap();
    let compactor =
        memwal_compactor::Compactor::new(loc.clone(), memwal_compactor::CompactorConfig::default());
    for r in compactor.run_once().await.unwrap() {
        r.unwrap();
    }
    let lance = memwal_sstable::LanceStore::new(loc.store.clone());
    let ds = lance::dataset::builder::DatasetBuilder::from_uri(lance.uri(&loc.root))
        .with_session(lance.session().clone())
        .load()
        .await
        .unwrap();
    assert_eq!(ds.count_rows(None).await.unwrap(), 40);
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

// Breaks if a batch whose shards are partly taken over is reported as a
// plain failure (the client could not tell that other parts are durable),
// maps to a code other than FAILED_PRECONDITION, or if the taken-over shard
// keeps being served (its status must say lost, the others serving).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partly_taken_over_batch_reports_its_durable_parts() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let host = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    let ids: Vec<i64> = (0..40).collect();
    let parts = host.write(&rows(&ids), false).await.unwrap();
    assert_eq!(parts.len(), 4, "{parts:?}");

    // Another writer claims one shard.
    let victim: ShardId = ShardId::parse(&parts[0].shard).unwrap();
    let other = ShardWriter::open(loc.clone(), victim, ShardWriterConfig::default())
        .await
        .unwrap();
    let e = host.write(&rows(&ids), false).await.unwrap_err();
    match &e {
        ServerError::Partial { durable, source } => {
            assert_eq!(durable.matches("rows at").count(), 3, "{e}");
            assert!(matches!(**source, ServerError::Writer { .. }), "{e}");
        }
        other => panic!("expected a partial failure, got {other}"),
    }
    assert_eq!(
        tonic::Status::from(e).code(),
        tonic::Code::FailedPrecondition
    );
    let status = host.status().await;
    let lost: Vec<_> = status.iter().filter(|s| s.state == "lost").collect();
    assert_eq!(lost.len(), 1, "{status:?}");
    assert_eq!(lost[0].shard, victim.to_string());
    assert!(lost[0]
        .last_error
        .as_deref()
        .unwrap_or("")
        .contains("epoch"));
    // Later writes to the lost shard are refused at once, the rest served.
    let e = host.write(&rows(&ids), false).await.unwrap_err();
    assert!(e.to_string().contains("served elsewhere"), "{e}");
    other.close().await.unwrap();
    host.close().await.unwrap();
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

// Breaks if two daemons that both meet a bucket for the first time create
// two shards for it (the bucket's rows would be split over shards no single
// writer orders); they must create the same shard, the later claim fencing
// the earlier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_creating_a_buckets_shard_create_the_same_one() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let a = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    let b = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    let ids: Vec<i64> = (0..40).collect();
    assert_eq!(a.write(&rows(&ids), false).await.unwrap().len(), 4);
    assert_eq!(b.write(&rows(&ids), false).await.unwrap().len(), 4);
    assert_eq!(memwal_compactor::list_shards(&loc).await.unwrap().len(), 4);
    let e = a.write(&rows(&ids), false).await.unwrap_err();
    assert_eq!(
        tonic::Status::from(e).code(),
        tonic::Code::FailedPrecondition
    );
    b.close().await.unwrap();
    a.close().await.unwrap();
}
