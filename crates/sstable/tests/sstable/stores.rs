//! SSTables through non-local stores: memwal's in-memory store and S3
//! (moto in CI). Lance sees only our store, so what it writes lands there.

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array};
use memwal_fencing::{ShardId, ShardLayout};
use memwal_memtable::KeyValue;
use memwal_sstable::{LanceFileVersion, Lookup, SsTableReader, SsTableWriter};
use memwal_store::StoreLocation;
use memwal_testkit::s3_test_location;
use object_store::ObjectStore;

use crate::support::*;

async fn round_trip(loc: StoreLocation) {
    let schema = int_schema();
    let shard = ShardId::random();
    let layout = ShardLayout::new(&loc.root, shard);
    let store: Arc<dyn ObjectStore> = loc.store.clone();
    let writer = SsTableWriter::new(store.clone(), layout.clone(), LanceFileVersion::V2_2);
    let data = flush(
        &schema,
        &[
            Op::Put(int_rows(&schema, &[1, 2, 3], 0)),
            Op::Put(int_rows(&schema, &[2], 1)),
            Op::Delete(keys_batch(vec![(
                "id",
                Arc::new(Int64Array::from(vec![3])) as ArrayRef,
            )])),
        ],
    );
    let w = writer.write(&schema, 1, &data).await.unwrap();
    assert!(
        w.dir.as_ref().starts_with(loc.root.as_ref()),
        "{} not under the table root {}",
        w.dir,
        loc.root
    );
    let reader = SsTableReader::open_in(store, &layout, &w.dir_name, &schema)
        .await
        .unwrap();
    assert!(matches!(
        reader.get(&[KeyValue::Int64(2)]).await.unwrap(),
        Lookup::Row(_)
    ));
    assert_eq!(
        reader.get(&[KeyValue::Int64(3)]).await.unwrap(),
        Lookup::Deleted
    );
    assert_eq!(
        reader.get(&[KeyValue::Int64(4)]).await.unwrap(),
        Lookup::Absent
    );
    let rows: usize = reader
        .scan()
        .await
        .unwrap()
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert_eq!(rows, 3);
}

// Breaks if lance bypassed our store for a non-file scheme (it would write
// into a store of its own and the read back through ours would find
// nothing), or if paths under a table root are mangled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sstable_round_trips_through_the_memory_store() {
    let uri = format!("memory://sstable-{}", ShardId::random());
    round_trip(memwal_store::open_store(&uri).unwrap()).await;
}

// Same over the S3 API, under a key prefix (skipped without a server,
// required under CI=true).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sstable_round_trips_through_s3() {
    let Some(loc) = s3_test_location("sstable-round-trip") else {
        return;
    };
    round_trip(loc).await;
}
