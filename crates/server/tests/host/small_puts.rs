//! Reads over many small unflushed puts.

use super::*;

// Breaks if rows of a memtable past its first few hundred batches are
// hidden from reads: the memtables handed to upstream's scanner counted
// each batch's byte size as its position, so only a prefix of the batches
// was visible (10,000 acknowledged rows in 2-3-row parts read as 679).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_of_many_small_unflushed_puts_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let host = TableHost::open("t", loc, ShardWriterConfig::default())
        .await
        .unwrap();
    // 2,000 puts of 5 rows: about 7,000 batches of 1-2 rows over 4 shards.
    let ids: Vec<i64> = (0..10_000).collect();
    for chunk in ids.chunks(5) {
        host.write(&tagged(chunk, "a"), false).await.unwrap();
    }
    let read = as_map(&host.read_rows().await.unwrap());
    assert_eq!(read.len(), 10_000, "every acknowledged row");
    assert_eq!(read[&9_999], "a9999");
    // A second read extends the kept memtables with later puts only.
    host.write(&tagged(&[10_000, 3], "b"), false).await.unwrap();
    let read = as_map(&host.read_rows().await.unwrap());
    assert_eq!(read.len(), 10_001);
    assert_eq!(read[&3], "b3");
    host.close().await.unwrap();
}
