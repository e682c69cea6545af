//! The other direction: SSTables written by upstream lance's own
//! `ShardWriter` flush, found through the shard manifest it published (read
//! with memwal-fencing) and read with our `SsTableReader`.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{ArrayRef, Int64Array};
use lance::dataset::mem_wal::{ShardWriter, ShardWriterConfig};
use memwal_fencing::{ManifestStore, ShardId, ShardLayout};
use memwal_memtable::KeyValue;
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
