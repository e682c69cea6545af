//! The base table's `__lance_mem_wal` index drives the writer: sharding
//! spec, shard field values, writer defaults; contradictions are refused.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema};
use memwal::{Error, ShardWriterConfig, ShardingConfig};
use memwal_proto::{ShardingField, ShardingSpec};
use memwal_sharding::{bucket_of, hash_i64};

use crate::support::*;

fn bucket(id: i64) -> i32 {
    bucket_of(hash_i64(id), 4)
}

fn bucket_values(b: i32) -> BTreeMap<String, Vec<u8>> {
    BTreeMap::from([("bucket".to_string(), b.to_le_bytes().to_vec())])
}

/// Ids in bucket `b` (and some that are not).
fn ids_in(b: i32, n: usize) -> (Vec<i64>, Vec<i64>) {
    let (ins, outs): (Vec<i64>, Vec<i64>) = (0..200).partition(|i| bucket(*i) == b);
    (ins[..n].to_vec(), outs[..n].to_vec())
}

fn assert_invalid(res: memwal::Result<memwal::ShardWriter>, needle: &str) {
    match res {
        Err(Error::InvalidInput { reason, .. }) => {
            assert!(reason.contains(needle), "`{needle}` not in: {reason}")
        }
        other => panic!("expected InvalidInput containing `{needle}`, got {other:?}"),
    }
}

// Breaks if an unsharded table's shard is created as a manual (spec 0)
// shard, or with field entries upstream does not write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsharded_table_creates_shards_as_upstream_does() {
    let t = TestTable::with_mem_wal(base_schema(), MemWalSharding::Unsharded, &[]).await;
    let w = t.open(config()).await.unwrap();
    w.put(&rows(&[1, 2, 3], "a")).await.unwrap();
    let v1 = t.manifests().load_version(1).await.unwrap().expect("v1");
    assert_eq!(v1.shard_spec_id, 1, "the table's spec id");
    assert!(v1.shard_field_entries.is_empty(), "{v1:?}");
    assert_eq!(v1.writer_epoch, 0);
    w.close().await.unwrap();
}

// Breaks if a bucket shard can be opened without saying which bucket, if
// the bucket is not recorded, if a reopen cannot find it again, if rows of
// other buckets are accepted, or if a wrong bucket fences the live writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_table_records_and_enforces_the_shards_bucket() {
    let t = TestTable::with_mem_wal(base_schema(), MemWalSharding::Bucket("id", 4), &[]).await;
    assert_invalid(t.open(config()).await, "records no shard field values");
    assert!(t.manifests().load_latest().await.unwrap().is_none());

    let (mine, others) = ids_in(2, 5);
    let mut cfg = config();
    cfg.sharding = Some(ShardingConfig::with_values(bucket_values(2)));
    let w = t.open(cfg).await.unwrap();
    w.put(&rows(&mine, "a")).await.unwrap();
    let err = w.put(&rows(&others[..1], "x")).await.unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
    let v1 = t.manifests().load_version(1).await.unwrap().expect("v1");
    assert_eq!(v1.shard_spec_id, 1);
    assert_eq!(
        memwal::ShardIdentity::of_manifest(&v1).field_values,
        bucket_values(2)
    );

    // Another bucket for this shard: refused before claiming.
    let mut wrong = config();
    wrong.sharding = Some(ShardingConfig::with_values(bucket_values(1)));
    assert_invalid(t.open(wrong).await, "records field values");
    assert_eq!(t.manifest().await.writer_epoch, w.epoch(), "not fenced");
    w.put(&rows(&mine, "b")).await.unwrap();
    w.close().await.unwrap();

    // The recorded bucket is enough to reopen, and still enforced.
    let w2 = t.open(config()).await.unwrap();
    assert!(matches!(
        w2.delete(&keys(&others[..1])).await,
        Err(Error::InvalidInput { .. })
    ));
    w2.delete(&keys(&mine[..1])).await.unwrap();
    w2.close().await.unwrap();
}

// Breaks if a config whose spec contradicts the table's is accepted, or a
// spec is accepted on a table whose index declares manual sharding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_contradicting_the_table_is_refused() {
    let t = TestTable::with_mem_wal(base_schema(), MemWalSharding::Bucket("id", 4), &[]).await;
    let eight = ShardingSpec {
        spec_id: 1,
        fields: vec![ShardingField {
            field_id: "bucket".into(),
            source_ids: vec![0],
            transform: Some("bucket".into()),
            result_type: "int32".into(),
            parameters: [("num_buckets".to_string(), "8".to_string())].into(),
            ..Default::default()
        }],
    };
    let mut cfg = config();
    cfg.sharding = Some(ShardingConfig::with_spec(eight.clone(), bucket_values(0)));
    assert_invalid(t.open(cfg).await, "contradicts the table");

    let manual = TestTable::with_mem_wal(base_schema(), MemWalSharding::Manual, &[]).await;
    let mut cfg = config();
    cfg.sharding = Some(ShardingConfig::with_spec(eight, bucket_values(0)));
    assert_invalid(manual.open(cfg).await, "manual sharding");
    // Manual sharding itself works.
    let w = manual.open(config()).await.unwrap();
    w.put(&rows(&[1], "a")).await.unwrap();
    assert_eq!(manual.manifest().await.shard_spec_id, 0);
    w.close().await.unwrap();
}

// Breaks if a keyed table sharded by a non-key column is accepted (one key
// could land in two shards; deletes carry only the key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharding_by_a_non_key_column_is_refused() {
    let key_md = HashMap::from([(
        "lance-schema:unenforced-primary-key".to_string(),
        "true".to_string(),
    )]);
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false).with_metadata(key_md),
        Field::new("v", DataType::Utf8, true),
        Field::new("region", DataType::Int32, true),
    ]));
    let t = TestTable::with_mem_wal(schema, MemWalSharding::Bucket("region", 4), &[]).await;
    let mut cfg = config();
    cfg.sharding = Some(ShardingConfig::with_values(bucket_values(0)));
    assert_invalid(t.open(cfg).await, "not a primary-key column");
    assert!(t.manifests().load_latest().await.unwrap().is_none());
}

// Breaks if the table's writer defaults are ignored, if they override a
// setting the caller changed, or if a bad value is silently accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tables_writer_defaults_apply_unless_overridden() {
    let defaults = [
        ("max_memtable_rows", "3"),
        ("max_wal_persist_retries", "4"),
        ("durable_write", "false"),
        ("some_future_key", "x"),
    ];
    let t = TestTable::with_mem_wal(base_schema(), MemWalSharding::Unsharded, &defaults).await;
    // Built-in defaults (plus no age trigger): the table's apply.
    let cfg = ShardWriterConfig {
        max_unflushed_age: None,
        ..Default::default()
    };
    let w = t.open(cfg.clone()).await.unwrap();
    w.put(&rows(&[1, 2, 3], "a")).await.unwrap();
    assert_eq!(w.stats().generation, 2, "frozen at the table's 3 rows");
    w.close().await.unwrap();

    // A setting the caller changed wins.
    let w = t
        .open(ShardWriterConfig {
            memtable_max_rows: 10,
            ..cfg.clone()
        })
        .await
        .unwrap();
    w.put(&rows(&[1, 2, 3], "b")).await.unwrap();
    assert_eq!(w.stats().generation, w.manifest().current_generation);
    assert_eq!(w.stats().active_rows, 3, "not frozen at 3");
    w.close().await.unwrap();

    // Opting out ignores them.
    let w = t
        .open(ShardWriterConfig {
            use_table_defaults: false,
            ..cfg.clone()
        })
        .await
        .unwrap();
    w.put(&rows(&[1, 2, 3], "c")).await.unwrap();
    assert_eq!(w.stats().active_rows, 3);
    w.close().await.unwrap();

    let bad = TestTable::with_mem_wal(
        base_schema(),
        MemWalSharding::Unsharded,
        &[("max_memtable_rows", "many")],
    )
    .await;
    assert_invalid(bad.open(cfg).await, "max_memtable_rows");
}
