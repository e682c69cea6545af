//! Append-only tables (no primary key): every row written is kept.

use super::*;

/// A host of an append-only table at `dir/t` (`id` int64, `v` utf8, no
/// primary key) sharded by `sharding`.
async fn append_only_host(dir: &tempfile::TempDir, sharding: TableSharding) -> TableHost {
    let path = dir.path().join("t").to_str().unwrap().to_string();
    let loc = memwal_store::open_store(&path).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", DataType::Utf8, true),
    ]));
    create_table(&loc, schema, &sharding).await.unwrap();
    TableHost::open("t", loc, ShardWriterConfig::default())
        .await
        .unwrap()
}

// Breaks if a read of an append-only table (no primary key) is refused,
// misses unflushed or published rows, or merges rows that share a value
// (an append-only table keeps every row written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_only_table_reads_every_row_written() {
    let dir = tempfile::tempdir().unwrap();
    let host = append_only_host(&dir, TableSharding::Unsharded).await;
    host.write(&tagged(&[1, 2], "a"), false).await.unwrap();
    host.flush().await.unwrap();
    host.write(&tagged(&[1, 3], "b"), false).await.unwrap();
    let read = host.read_rows().await.unwrap();
    let vs = arrow_array::cast::AsArray::as_string::<i32>(read.column_by_name("v").unwrap());
    let mut got: Vec<String> = (0..read.num_rows())
        .map(|i| vs.value(i).to_string())
        .collect();
    got.sort();
    assert_eq!(got, vec!["a1", "a2", "b1", "b3"]);
    host.close().await.unwrap();
}

// Breaks if a bucket-sharded append-only table cannot be served (its
// spec routes by a column the empty key schema lacks: opening the table
// failed "source field id 0 is not a column of the table"), or if a
// delete, which such a table cannot take, is not refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_sharded_append_only_table_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let sharding = TableSharding::Bucket {
        column: "id".into(),
        buckets: 4,
    };
    let host = append_only_host(&dir, sharding).await;
    let ids: Vec<i64> = (0..16).collect();
    let parts = host.write(&tagged(&ids, "a"), false).await.unwrap();
    assert_eq!(parts.len(), 4, "{parts:?}");
    host.write(&tagged(&[1], "b"), false).await.unwrap();
    let read = host.read_rows().await.unwrap();
    assert_eq!(read.num_rows(), 17, "both rows of key 1 are kept");
    let e = host.write(&deletes(&[1]), true).await.unwrap_err();
    assert_eq!(tonic::Status::from(e).code(), tonic::Code::InvalidArgument);
    host.close().await.unwrap();
}
