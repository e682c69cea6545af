//! The other direction: SSTables written by upstream lance's own
//! `ShardWriter` flush, found through the shard manifest it published (read
//! with memwal-fencing) and read with our `SsTableReader`.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{
    Array, ArrayRef, BooleanArray, Int16Array, Int32Array, Int64Array, Int8Array, LargeBinaryArray,
    LargeStringArray, RecordBatch, UInt16Array, UInt32Array, UInt64Array, UInt8Array,
};
use arrow_schema::{DataType, Schema};
use lance::dataset::mem_wal::{ShardWriter, ShardWriterConfig};
use memwal_fencing::{ManifestStore, ShardId, ShardLayout};
use memwal_memtable::{KeyValue, TableSchema};
use memwal_sstable::{Lookup, SsTableReader};
use memwal_store::RetryPolicy;

use crate::support::*;

// Breaks if our reader cannot open what upstream flushes (its field ids,
// `_tombstone`, deletion vector, `bloom_filter.bin` or `_pk_index/`), finds
// an older version or a deleted key, or if memwal-fencing cannot read the
// shard manifest upstream published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_reader_reads_sstables_upstream_flushed() {
    let t = LocalTable::new();
    let schema = int_schema();
    let shard = uuid::Uuid::new_v4();
    let (store, base_path) = lance_io::object_store::ObjectStore::from_uri(&t.uri())
        .await
        .unwrap();
    let writer = ShardWriter::open(
        store,
        base_path,
        t.uri(),
        ShardWriterConfig {
            shard_id: shard,
            durable_write: true,
            ..Default::default()
        },
        schema.table_schema().clone(),
        vec![],
    )
    .await
    .unwrap();
    for v in 0..5 {
        writer
            .put(vec![int_rows(&schema, &[1, 2, 3], v)])
            .await
            .unwrap();
    }
    writer
        .delete(vec![keys_batch(vec![(
            "id",
            Arc::new(Int64Array::from(vec![2])) as ArrayRef,
        )])])
        .await
        .unwrap();
    writer.put(vec![int_rows(&schema, &[4], 9)]).await.unwrap();
    writer
        .force_freeze_active()
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();

    let shard_id = ShardId::parse(&shard.to_string()).unwrap();
    let manifests = ManifestStore::new(
        t.store.clone(),
        &object_store::path::Path::default(),
        shard_id,
        RetryPolicy::immediate(3),
    );
    let manifest = manifests.load_latest().await.unwrap().expect("a manifest");
    writer.close().await.unwrap();
    assert_eq!(manifest.sstables.len(), 1, "{manifest:?}");
    let sst = &manifest.sstables[0];

    let layout = ShardLayout::new(&object_store::path::Path::default(), shard_id);
    let reader = SsTableReader::open_in(t.store.clone(), &layout, &sst.path, &schema)
        .await
        .unwrap();
    let v = |l: Lookup| match l {
        Lookup::Row(b) => Some(
            b.column_by_name("v")
                .unwrap()
                .as_primitive::<Int32Type>()
                .value(0),
        ),
        Lookup::Deleted => None,
        Lookup::Absent => panic!("absent"),
    };
    assert_eq!(v(reader.get(&[KeyValue::Int64(1)]).await.unwrap()), Some(4));
    assert_eq!(v(reader.get(&[KeyValue::Int64(2)]).await.unwrap()), None);
    assert_eq!(v(reader.get(&[KeyValue::Int64(4)]).await.unwrap()), Some(9));
    assert_eq!(
        reader.get(&[KeyValue::Int64(5)]).await.unwrap(),
        Lookup::Absent
    );
    let mut seen = BTreeMap::new();
    for b in reader.scan().await.unwrap() {
        let id = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
        let tomb = b.column_by_name("_tombstone").unwrap().as_boolean();
        for i in 0..b.num_rows() {
            assert!(seen.insert(id.value(i), tomb.value(i)).is_none());
        }
    }
    assert_eq!(
        seen,
        BTreeMap::from([(1, false), (2, true), (3, false), (4, false)])
    );
}

/// Flushes `batches` (user form) through upstream lance's own `ShardWriter`
/// and returns the path of the one SSTable it published.
async fn upstream_flush(t: &LocalTable, schema: &TableSchema, batches: Vec<RecordBatch>) -> String {
    let shard = t.shard.uuid();
    let (store, base_path) = lance_io::object_store::ObjectStore::from_uri(&t.uri())
        .await
        .unwrap();
    let writer = ShardWriter::open(
        store,
        base_path,
        t.uri(),
        ShardWriterConfig {
            shard_id: shard,
            durable_write: true,
            ..Default::default()
        },
        schema.table_schema().clone(),
        vec![],
    )
    .await
    .unwrap();
    writer.put(batches).await.unwrap();
    writer
        .force_freeze_active()
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    let manifests = ManifestStore::new(
        t.store.clone(),
        &object_store::path::Path::default(),
        t.shard,
        RetryPolicy::immediate(3),
    );
    let manifest = manifests.load_latest().await.unwrap().expect("a manifest");
    writer.close().await.unwrap();
    assert_eq!(manifest.sstables.len(), 1, "{manifest:?}");
    manifest.sstables[0].path.clone()
}

/// A table `k` (key, `key_type`, field id 0) and `v` Int32 (field id 1).
fn keyed_by(key_type: DataType) -> Arc<TableSchema> {
    Arc::new(
        TableSchema::new(Arc::new(Schema::new(vec![
            field("k", key_type, 0, Some(1)),
            field("v", DataType::Int32, 1, None),
        ])))
        .unwrap(),
    )
}

// Breaks if our point lookup trusts the bloom filter of an upstream-flushed
// SSTable for a key type upstream's writer hashes by its null flag alone
// (everything but Int32/Int64/Utf8/Binary): every present key of such a
// table would be reported absent. Absent keys must still be absent (the
// `_pk_index` answers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_lookup_finds_keys_upstream_flushed_for_every_key_type() {
    let cases: Vec<(ArrayRef, Vec<KeyValue<'static>>, Vec<KeyValue<'static>>)> = vec![
        (
            Arc::new(UInt64Array::from(vec![0, 7, u64::MAX])),
            vec![
                KeyValue::UInt64(0),
                KeyValue::UInt64(7),
                KeyValue::UInt64(u64::MAX),
            ],
            vec![KeyValue::UInt64(1)],
        ),
        (
            Arc::new(Int16Array::from(vec![-3, 0, 300])),
            vec![
                KeyValue::Int16(-3),
                KeyValue::Int16(0),
                KeyValue::Int16(300),
            ],
            vec![KeyValue::Int16(1)],
        ),
        (
            Arc::new(BooleanArray::from(vec![true])),
            vec![KeyValue::Boolean(true)],
            vec![KeyValue::Boolean(false)],
        ),
        (
            Arc::new(LargeStringArray::from(vec!["", "a", "bb"])),
            vec![
                KeyValue::Utf8(""),
                KeyValue::Utf8("a"),
                KeyValue::Utf8("bb"),
            ],
            vec![KeyValue::Utf8("c")],
        ),
        (
            Arc::new(Int8Array::from(vec![-1, 5])),
            vec![KeyValue::Int8(-1), KeyValue::Int8(5)],
            vec![KeyValue::Int8(6)],
        ),
        (
            Arc::new(UInt8Array::from(vec![200])),
            vec![KeyValue::UInt8(200)],
            vec![KeyValue::UInt8(1)],
        ),
        (
            Arc::new(UInt16Array::from(vec![65535])),
            vec![KeyValue::UInt16(65535)],
            vec![KeyValue::UInt16(1)],
        ),
        (
            Arc::new(UInt32Array::from(vec![4_000_000_000])),
            vec![KeyValue::UInt32(4_000_000_000)],
            vec![KeyValue::UInt32(1)],
        ),
        (
            Arc::new(LargeBinaryArray::from(vec![
                b"\0x".as_slice(),
                b"y".as_slice(),
            ])),
            vec![KeyValue::Binary(b"\0x"), KeyValue::Binary(b"y")],
            vec![KeyValue::Binary(b"z")],
        ),
    ];
    for (keys, present, absent) in cases {
        let key_type = keys.data_type().clone();
        let t = LocalTable::new();
        let schema = keyed_by(key_type.clone());
        let n = keys.len();
        let batch = RecordBatch::try_new(
            schema.table_schema().clone(),
            vec![keys, Arc::new(Int32Array::from_iter_values(0..n as i32))],
        )
        .unwrap();
        let path = upstream_flush(&t, &schema, vec![batch]).await;
        let reader = SsTableReader::open_in(t.store.clone(), &t.layout, &path, &schema)
            .await
            .unwrap();
        for (i, k) in present.iter().enumerate() {
            match reader.get(&[*k]).await.unwrap() {
                Lookup::Row(b) => assert_eq!(
                    b.column_by_name("v")
                        .unwrap()
                        .as_primitive::<Int32Type>()
                        .value(0),
                    i as i32,
                    "{key_type}: {k:?}"
                ),
                other => panic!("{key_type}: {k:?} is present, got {other:?}"),
            }
        }
        for k in &absent {
            assert_eq!(
                reader.get(&[*k]).await.unwrap(),
                Lookup::Absent,
                "{key_type}: {k:?}"
            );
        }
    }
}
