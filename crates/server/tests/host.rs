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

// Breaks if a batch whose shards are partly taken over is reported as a
// plain failure (the client could not tell that other parts are durable),
// maps to a code other than FAILED_PRECONDITION, or if the taken-over shard
// keeps being served (its status must say lost, the others serving).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partly_taken_over_batch_reports_its_durable_parts() {
    let dir = tempfile::tempdir().unwrap();
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
