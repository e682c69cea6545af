//! Key lookups (`TableHost::lookup_rows`) across every level of a table.

use std::collections::BTreeMap;

use datafusion::scalar::ScalarValue;
use memwal::ShardWriterConfig;
use memwal_server::TableHost;

use super::{as_map, bucket_table, compact, tagged};

// Breaks if a key lookup misses an acknowledged row in any level (base
// after compaction, published SSTables, unflushed memtables), returns an
// overwritten value or a deleted key, or differs from what a whole read
// shows for the same keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_lookups_agree_with_whole_reads_across_every_level() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let host = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    let ids: Vec<i64> = (0..40).collect();
    host.write(&tagged(&ids, "a"), false).await.unwrap();
    host.flush().await.unwrap();
    compact(&loc).await;
    host.write(&tagged(&ids[10..30], "b"), false).await.unwrap();
    host.flush().await.unwrap();
    host.write(&tagged(&ids[20..25], "c"), false).await.unwrap();
    let deletes = arrow_array::RecordBatch::try_from_iter(vec![(
        "id",
        std::sync::Arc::new(arrow_array::Int64Array::from(vec![5, 12, 21]))
            as arrow_array::ArrayRef,
    )])
    .unwrap();
    host.write(&deletes, true).await.unwrap();
    let keys: Vec<ScalarValue> = [0i64, 5, 12, 15, 21, 22, 35, 99]
        .into_iter()
        .map(|k| ScalarValue::Int64(Some(k)))
        .chain([ScalarValue::Int64(None), ScalarValue::Int32(Some(33))])
        .collect();
    let got = as_map(&host.lookup_rows(&keys).await.unwrap());
    let want: BTreeMap<i64, String> = [
        (0, "a0"),
        (15, "b15"),
        (22, "c22"),
        (33, "a33"),
        (35, "a35"),
    ]
    .map(|(k, v)| (k, v.to_string()))
    .into();
    assert_eq!(got, want);
    let whole: BTreeMap<i64, String> = as_map(&host.read_rows().await.unwrap())
        .into_iter()
        .filter(|(k, _)| [0, 5, 12, 15, 21, 22, 33, 35, 99].contains(k))
        .collect();
    assert_eq!(got, whole, "a lookup shows what a whole read shows");
    assert_eq!(host.read_counts(), (1, 1));
    host.close().await.unwrap();
}
