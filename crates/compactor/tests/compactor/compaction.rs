//! Compaction results: the base equals the model, the marker advances,
//! reruns change nothing, the writer prunes what is compacted.

use memwal_store::RetryPolicy;
use memwal_table::{table_view, TableSharding};

use crate::support::*;

// Breaks if a generation's tombstones or overwrites do not reach the base,
// if generations merge out of order (an older value wins), if the marker is
// not advanced with the data, or if a rerun applies anything twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_generations_compact_into_the_base_in_order() {
    keyed_generations(1).await;
}

// As above with the generations merged in one commit (last write wins
// resolved across them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_generations_compact_into_the_base_grouped() {
    keyed_generations(8).await;
}

async fn keyed_generations(max_group: usize) {
    let f = Fixture::new(true, TableSharding::Unsharded).await;
    let w = f.writer(None).await;
    let mut model = Model::new();
    let ids: Vec<i64> = (0..12).collect();
    three_generations(&w, &mut model, &ids, "a").await;
    assert_model(&f.view_rows().await, &model, "view before compaction");
    assert!(f.base_rows().await.0.is_empty(), "nothing compacted yet");

    let reports = f.compactor_grouping(max_group).run_once().await.unwrap();
    let r = reports.into_iter().next().unwrap().unwrap();
    assert_eq!(
        (r.compacted_before, r.compacted_after, r.merged.clone()),
        (0, 3, vec![1, 2, 3]),
        "{r:?}"
    );
    assert_model(&f.base_rows().await, &model, "base after compaction");
    assert_model(&f.view_rows().await, &model, "view after compaction");
    let view = table_view(&f.plain, None, &RetryPolicy::default())
        .await
        .unwrap();
    assert_eq!(view.shards[0].floor, 3);
    assert!(view.shards[0].sstables.is_empty(), "{:?}", view.shards[0]);

    // A rerun finds nothing to do and changes nothing.
    let version = lance::Dataset::open(&f.path)
        .await
        .unwrap()
        .version()
        .version;
    let r = f
        .compactor_grouping(max_group)
        .run_once()
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!((r.merged.len(), r.commits), (0, 0), "{r:?}");
    assert_eq!(
        lance::Dataset::open(&f.path)
            .await
            .unwrap()
            .version()
            .version,
        version
    );

    // More generations after compaction: overwrite a compacted key, delete
    // another, and compact again.
    put(&w, &mut model, &[3, 100], "b").await;
    delete(&w, &mut model, &[4]).await;
    w.flush().await.unwrap();
    assert_model(&f.view_rows().await, &model, "view with one new generation");
    let r = f
        .compactor_grouping(max_group)
        .run_once()
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!((r.compacted_before, r.compacted_after), (3, 4), "{r:?}");
    assert_model(
        &f.base_rows().await,
        &model,
        "base after the second compaction",
    );
    w.close().await.unwrap();
}

// Breaks if the writer keeps compacted SSTables in its manifest (it must
// drop them on its next update), or drops one the base does not hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_drops_compacted_sstables_from_its_manifest() {
    let f = Fixture::new(true, TableSharding::Unsharded).await;
    let w = f.writer(None).await;
    let mut model = Model::new();
    let ids: Vec<i64> = (0..12).collect();
    three_generations(&w, &mut model, &ids, "a").await;
    assert_eq!(w.manifest().sstables.len(), 3);
    f.compactor().run_once().await.unwrap().remove(0).unwrap();
    // Not yet: the writer learns of it at its next manifest update.
    assert_eq!(w.manifest().sstables.len(), 3);
    put(&w, &mut model, &[50], "c").await;
    w.flush().await.unwrap();
    let gens: Vec<u64> = w.manifest().sstables.iter().map(|s| s.generation).collect();
    assert_eq!(
        gens,
        vec![4],
        "compacted generations 1-3 are dropped, 4 is kept"
    );
    assert_model(&f.view_rows().await, &model, "view after pruning");
    w.close().await.unwrap();
}

// Breaks if shards of a sharded table interfere (one shard's marker
// covering another's), if a shard's rows are lost or duplicated, or if the
// shards' backlogs are merged commit by commit per shard instead of in
// shared commits (a cycle's cost would grow with the number of shards).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_shards_compact_into_one_base() {
    let f = Fixture::new(
        true,
        TableSharding::Bucket {
            column: "id".into(),
            buckets: BUCKETS,
        },
    )
    .await;
    let mut model = Model::new();
    let mut writers = Vec::new();
    for b in 0..BUCKETS as i32 {
        let ids: Vec<i64> = (0..400).filter(|i| bucket(*i) == b).take(12).collect();
        let w = f.writer(Some(b)).await;
        three_generations(&w, &mut model, &ids, &format!("s{b}")).await;
        writers.push(w);
    }
    let reports = f.compactor().run_once().await.unwrap();
    assert_eq!(reports.len(), BUCKETS as usize);
    let mut commits = 0;
    for r in reports {
        let r = r.unwrap();
        assert_eq!(r.compacted_after, 3, "{r:?}");
        // Every shard's backlog went in commits shared by the shards.
        assert_eq!(r.shared, vec![1, 2, 3], "{r:?}");
        commits += r.commits;
    }
    // One group: its delete pass and its upsert pass, not two per shard.
    assert_eq!(commits, 2);
    assert_model(&f.base_rows().await, &model, "base of four shards");
    assert_model(&f.view_rows().await, &model, "view of four shards");
    for w in writers {
        w.close().await.unwrap();
    }
}

// Breaks if an append-only table is deduplicated, or a rerun (or a second
// compactor) appends a generation twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_only_generations_append_exactly_once() {
    let f = Fixture::new(false, TableSharding::Unsharded).await;
    let w = f.writer(None).await;
    w.put(&rows(&[1, 2, 3], "a")).await.unwrap();
    w.flush().await.unwrap();
    w.put(&rows(&[1, 2], "b")).await.unwrap();
    w.flush().await.unwrap();
    let (a, b) = (f.compactor(), f.compactor());
    let (ra, rb) = tokio::join!(a.run_once(), b.run_once());
    let mut merged: Vec<u64> = [ra, rb]
        .into_iter()
        .flat_map(|r| r.unwrap().remove(0).unwrap().merged)
        .collect();
    merged.sort();
    assert_eq!(
        merged,
        vec![1, 2],
        "each generation merged by exactly one compactor"
    );
    f.compactor().run_once().await.unwrap().remove(0).unwrap();
    let (_, order) = f.base_rows().await;
    let mut got = order.clone();
    got.sort();
    assert_eq!(
        got,
        vec![1, 1, 2, 2, 3],
        "every row once, duplicates of a key kept"
    );
    w.close().await.unwrap();
}

// Breaks if two compactors at once apply a generation twice or out of
// order (e.g. a replanned delete pass removing a newer row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_compactors_apply_each_generation_once() {
    concurrent_compactors(1).await;
    concurrent_compactors(3).await;
}

async fn concurrent_compactors(max_group: usize) {
    let f = Fixture::new(true, TableSharding::Unsharded).await;
    let w = f.writer(None).await;
    let mut model = Model::new();
    let ids: Vec<i64> = (0..20).collect();
    three_generations(&w, &mut model, &ids, "a").await;
    // A key deleted in one generation and re-inserted in the next.
    delete(&w, &mut model, &[15]).await;
    w.flush().await.unwrap();
    put(&w, &mut model, &[15, 16], "back").await;
    w.flush().await.unwrap();
    let (a, b) = (
        f.compactor_grouping(max_group),
        f.compactor_grouping(max_group),
    );
    let (ra, rb) = tokio::join!(a.run_once(), b.run_once());
    let (ra, rb) = (
        ra.unwrap().remove(0).unwrap(),
        rb.unwrap().remove(0).unwrap(),
    );
    let mut merged: Vec<u64> = ra.merged.iter().chain(&rb.merged).copied().collect();
    merged.sort();
    assert_eq!(
        merged,
        vec![1, 2, 3, 4, 5],
        "each generation merged once: {ra:?} {rb:?}"
    );
    assert_eq!(ra.compacted_after.max(rb.compacted_after), 5);
    assert_model(&f.base_rows().await, &model, "base after two compactors");
    assert_model(&f.view_rows().await, &model, "view after two compactors");
    w.close().await.unwrap();
}

// Breaks if a table without the MemWAL index is compacted instead of
// refused with an error naming the missing index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_without_the_index_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t").to_str().unwrap().to_string();
    let empty: Vec<Result<arrow_array::RecordBatch, arrow_schema::ArrowError>> = vec![];
    lance::Dataset::write(
        arrow_array::RecordBatchIterator::new(empty, schema(true)),
        &path,
        None,
    )
    .await
    .unwrap();
    let loc = memwal_store::open_store(&path).unwrap();
    let c = memwal_compactor::Compactor::new(loc, Default::default());
    let e = c.run_once().await.unwrap_err();
    assert!(
        matches!(&e, memwal_compactor::CompactorError::InvalidInput { reason, .. } if reason.contains("__lance_mem_wal")),
        "{e}"
    );
}

// Breaks if the background task does not run a cycle at start, or if stop
// leaves it running (no more commits after stop returns).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_task_compacts_and_stops() {
    let f = Fixture::new(true, TableSharding::Unsharded).await;
    let w = f.writer(None).await;
    let mut model = Model::new();
    put(&w, &mut model, &[1, 2, 3], "a").await;
    w.flush().await.unwrap();
    let task =
        memwal_compactor::CompactorTask::spawn(f.compactor(), std::time::Duration::from_secs(3600));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while f.base_rows().await.0.len() < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no compaction within a minute"
        );
        tokio::task::yield_now().await;
    }
    task.stop().await;
    let version = lance::Dataset::open(&f.path)
        .await
        .unwrap()
        .version()
        .version;
    put(&w, &mut model, &[4], "b").await;
    w.flush().await.unwrap();
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        lance::Dataset::open(&f.path)
            .await
            .unwrap()
            .version()
            .version,
        version,
        "stopped"
    );
    assert_model(
        &f.base_rows().await,
        &[1, 2, 3].iter().map(|i| (*i, format!("a-{i}"))).collect(),
        "base",
    );
    w.close().await.unwrap();
}
