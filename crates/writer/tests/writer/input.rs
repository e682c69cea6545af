//! Bad input gets typed errors; the writer stays usable; doomed opens do
//! not fence a healthy writer.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use memwal::{Error, ShardingConfig};
use memwal_proto::{ShardingField, ShardingSpec};
use memwal_sharding::ShardRouter;

use crate::support::*;

fn bucket_spec() -> ShardingSpec {
    ShardingSpec {
        spec_id: 1,
        fields: vec![ShardingField {
            field_id: "bucket".into(),
            source_ids: vec![0], // `id`
            transform: Some("bucket".into()),
            result_type: "int32".into(),
            parameters: [("num_buckets".to_string(), "4".to_string())].into(),
            ..Default::default()
        }],
    }
}

// Breaks if schema errors, null keys or rows of another shard are not
// InvalidInput, or if such an error poisons the writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_typed_and_the_writer_stays_usable() {
    let t = TestTable::new().await;
    let spec = bucket_spec();
    let router = ShardRouter::new(&spec, &base_schema()).unwrap();
    let ours: BTreeMap<String, Vec<u8>> = router.row_values(&rows(&[1], "x"), 0).unwrap();
    let mut cfg = config();
    cfg.sharding = Some(ShardingConfig::with_spec(spec, ours.clone()));
    let w = t.open(cfg).await.unwrap();
    let other = (2..100)
        .find(|i| router.row_values(&rows(&[*i], "x"), 0).unwrap() != ours)
        .unwrap();

    let wrong_type = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Int32, true),
        ])),
        vec![
            Arc::new(Int64Array::from(vec![1])) as ArrayRef,
            Arc::new(Int32Array::from(vec![1])),
        ],
    )
    .unwrap();
    let null_key = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("v", DataType::Utf8, true),
        ])),
        vec![
            Arc::new(Int64Array::from(vec![Some(1), None])) as ArrayRef,
            Arc::new(StringArray::from(vec!["a", "b"])),
        ],
    )
    .unwrap();
    let missing_col = RecordBatch::try_from_iter(vec![(
        "v",
        Arc::new(StringArray::from(vec!["a"])) as ArrayRef,
    )])
    .unwrap();
    for (what, res) in [
        ("wrong type", w.put(&wrong_type).await),
        ("null key", w.put(&null_key).await),
        ("missing column", w.put(&missing_col).await),
        ("other shard", w.put(&rows(&[1, other], "x")).await),
        ("delete other shard", w.delete(&keys(&[other])).await),
        ("delete without key", w.delete(&missing_col).await),
    ] {
        assert!(
            matches!(res, Err(Error::InvalidInput { .. })),
            "{what}: {res:?}"
        );
    }
    let pos = w.put(&rows(&[1], "ok")).await.unwrap();
    assert!(pos > w.stats().sentinel_position);
    assert_eq!(w.stats().puts, 1);
    w.close().await.unwrap();
}

// Breaks if an open that must fail (bad config, identity mismatch)
// claims the shard first and so fences the healthy writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doomed_open_does_not_fence_the_live_writer() {
    let t = TestTable::new().await;
    let mut bad = config();
    bad.max_unflushed_bytes = bad.memtable_max_bytes - 1;
    assert!(matches!(t.open(bad).await, Err(Error::InvalidInput { .. })));
    assert!(
        t.manifests().load_latest().await.unwrap().is_none(),
        "nothing created"
    );

    let w = t.open(config()).await.unwrap();
    let mut other_shard = config();
    other_shard.sharding = Some(ShardingConfig::with_spec(
        bucket_spec(),
        [("bucket".to_string(), 0i32.to_le_bytes().to_vec())],
    ));
    let err = t.open(other_shard).await.unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
    assert_eq!(t.manifest().await.writer_epoch, w.epoch(), "not fenced");
    w.put(&rows(&[1], "still-mine")).await.unwrap();
    w.close().await.unwrap();
}
