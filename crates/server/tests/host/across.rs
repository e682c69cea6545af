//! Several hosts on one table: bucket subsets, shards created or claimed
//! by two hosts, and reads across hosts (docs/design/fresh-reads.md: a
//! host reads the shards other hosts hold with their unpublished rows,
//! from their WALs, `reader/tails.rs`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use memwal::{ShardId, ShardWriter, ShardWriterConfig};
use memwal_server::{ServerError, TableHost};
use memwal_testkit::{Action, Gate, OpKind};

use super::{
    as_map, bucket_table, compact, deletes, keys, only, put, rows, tagged, through_faults,
};

fn bucket(id: i64) -> i32 {
    memwal_sharding::bucket_of(memwal_sharding::hash_i64(id), 4)
}

/// Asserts that a whole read, a lookup of `probe` and a filtered scan
/// through `host` each show exactly `model`.
async fn reads_show(host: &TableHost, model: &BTreeMap<i64, String>, probe: &[i64], what: &str) {
    assert_eq!(
        &as_map(&host.read_rows().await.unwrap()),
        model,
        "{what}: a whole read"
    );
    assert_eq!(
        as_map(&host.lookup_rows(&keys(probe)).await.unwrap()),
        only(model, probe),
        "{what}: a key lookup"
    );
    let low = datafusion::prelude::col("id").lt(datafusion::prelude::lit(30i64));
    let want: BTreeMap<i64, String> = model
        .iter()
        .filter(|(k, _)| **k < 30)
        .map(|(k, v)| (*k, v.clone()))
        .collect();
    assert_eq!(
        as_map(&host.scan(Some(low), None, None).await.unwrap()),
        want,
        "{what}: a filtered scan"
    );
}

// Breaks if a host reads the shards another host holds as published only
// (issue 35, "reads through any daemon"): two hosts split a table by
// buckets, and every put, overwrite and delete either of them
// acknowledged must show at once through both, unflushed, published or
// compacted, and after the other host closed. Fails without the WAL tail
// reads of `reader/tails.rs` (each host misses the other's unflushed
// rows and shows the older values of what it overwrote or deleted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_host_reads_every_hosts_acknowledged_rows() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let open = |b: &'static [u32]| {
        TableHost::open_buckets("t", loc.clone(), ShardWriterConfig::default(), Some(b))
    };
    let a = open(&[0, 1]).await.unwrap();
    let b = open(&[2, 3]).await.unwrap();
    let ids: Vec<i64> = (0..60).collect();
    let (own_a, own_b): (Vec<i64>, Vec<i64>) = ids.iter().partition(|&&i| bucket(i) < 2);
    let probe: Vec<i64> = (0..12).chain([40, 59, 99]).collect();
    let mut model = BTreeMap::new();

    // Each host's rows, unflushed.
    a.write(&tagged(&own_a, "a"), false).await.unwrap();
    b.write(&tagged(&own_b, "b"), false).await.unwrap();
    put(&mut model, &own_a, "a");
    put(&mut model, &own_b, "b");
    for (host, name) in [(&a, "A"), (&b, "B")] {
        reads_show(host, &model, &probe, &format!("unflushed, through {name}")).await;
    }

    // B publishes; then overwrites and deletes (unflushed), a generation
    // at a time, while A reads.
    b.flush().await.unwrap();
    reads_show(&a, &model, &probe, "B published").await;
    b.write(&tagged(&own_b[..10], "x"), false).await.unwrap();
    put(&mut model, &own_b[..10], "x");
    reads_show(&a, &model, &probe, "B overwrote").await;
    let gone: Vec<i64> = own_b[5..15].to_vec();
    b.write(&deletes(&gone), true).await.unwrap();
    for k in &gone {
        model.remove(k);
    }
    reads_show(&a, &model, &probe, "B deleted").await;
    a.write(&tagged(&own_a[..5], "y"), false).await.unwrap();
    put(&mut model, &own_a[..5], "y");
    reads_show(&b, &model, &probe, "A overwrote, through B").await;

    // The published levels move under the kept WAL reads: B publishes
    // part of it, the compactor merges, B writes again.
    b.flush().await.unwrap();
    compact(&loc).await;
    reads_show(&a, &model, &probe, "B's generations compacted").await;
    b.write(&tagged(&own_b[..3], "z"), false).await.unwrap();
    put(&mut model, &own_b[..3], "z");
    reads_show(&a, &model, &probe, "B wrote after the compaction").await;

    // B goes away: its close published everything.
    b.close().await.unwrap();
    reads_show(&a, &model, &probe, "B closed").await;
    a.close().await.unwrap();
}

// Breaks if a WAL tail read that ended at a position a WAL GC had
// deleted (the writer published and moved its cursor after the read's
// view was taken) is taken for the end of the WAL: the read would show
// neither the rows (pruned from the WAL) nor their SSTable (not in its
// view). Here A's read of B's shard is held at its first WAL request
// while B publishes and a GC prunes; the read must take its view again.
// Fails without the check of the shard's latest cursor in
// `TableHost::read_tails` (B's rows are missing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_tail_pruned_during_the_read_is_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let (faults, faulty) = through_faults(&loc);
    let a = TableHost::open_buckets("t", faulty, ShardWriterConfig::default(), Some(&[0, 1]))
        .await
        .unwrap();
    let b = TableHost::open_buckets("t", loc.clone(), ShardWriterConfig::default(), Some(&[2]))
        .await
        .unwrap();
    let mine: Vec<i64> = (0..80).filter(|&i| bucket(i) == 2).take(20).collect();
    let mut model = BTreeMap::new();
    for chunk in mine.chunks(4) {
        b.write(&tagged(chunk, "b"), false).await.unwrap();
    }
    put(&mut model, &mine, "b");

    let gate = Gate::new();
    let held = gate.clone();
    let armed = Arc::new(AtomicBool::new(true));
    faults.set_hook(move |op| {
        let wal_get = op.kind == OpKind::Get && op.path.contains("/wal/");
        if wal_get && armed.swap(false, Ordering::SeqCst) {
            Action::Hold(held.clone(), Box::new(Action::Pass))
        } else {
            Action::Pass
        }
    });
    let a = Arc::new(a);
    let reading = {
        let a = a.clone();
        tokio::spawn(async move { a.read_rows().await })
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), gate.wait_arrived(1))
        .await
        .expect("A's read never read B's WAL");
    b.flush().await.unwrap();
    let gc = memwal_compactor::GcConfig {
        grace: std::time::Duration::ZERO,
        ..Default::default()
    };
    let pruned: usize = memwal_compactor::collect_garbage(&loc, &gc)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap().wal_entries.len())
        .sum();
    assert!(pruned > 0, "the GC pruned the flushed WAL entries");
    gate.open();
    assert_eq!(
        as_map(&reading.await.unwrap().unwrap()),
        model,
        "a read whose WAL tail was pruned meanwhile"
    );
    b.close().await.unwrap();
    a.close().await.unwrap();
}

// Breaks if a host whose shards another host claimed reads them as
// published: the new owner's overwrites and deletes, and the fenced
// writer's own acknowledged rows that the new owner replayed, are all
// unpublished (in the new owner's memtables and the WAL) and must show
// through the fenced host at once, by every read kind. Fails without the
// WAL tail reads of `reader/tails.rs` (the fenced host shows the base
// rows only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_host_reads_the_new_owners_unpublished_rows() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let a = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    let ids: Vec<i64> = (0..40).collect();
    a.write(&tagged(&ids, "a"), false).await.unwrap();
    let mut model = BTreeMap::new();
    put(&mut model, &ids, "a");
    let probe: Vec<i64> = (0..12).chain([30, 35, 99]).collect();
    reads_show(&a, &model, &probe, "A's own rows").await;

    // B claims every shard (replaying A's rows, unpublished), overwrites
    // and deletes; nothing is flushed.
    let b = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    b.write(&tagged(&ids[5..25], "b"), false).await.unwrap();
    b.write(&deletes(&[1, 7, 30]), true).await.unwrap();
    put(&mut model, &ids[5..25], "b");
    for k in [1, 7, 30] {
        model.remove(&k);
    }
    reads_show(&a, &model, &probe, "through the fenced host").await;
    reads_show(&b, &model, &probe, "through the new owner").await;
    b.close().await.unwrap();
    a.close().await.unwrap();
}

// Breaks if a daemon owning a bucket subset claims (and so fences) a shard
// of another daemon's buckets, at first use or when reopening, if a batch
// with rows of a bucket it does not own is accepted, partly written (its
// owned parts durable: a definite code must mean nothing was written) or
// refused with a code other than FAILED_PRECONDITION, or if the two halves
// do not together hold every row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemons_owning_bucket_subsets_split_a_table_without_fencing_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let open = |b: &'static [u32]| {
        TableHost::open_buckets("t", loc.clone(), ShardWriterConfig::default(), Some(b))
    };
    let a = open(&[0, 1]).await.unwrap();
    let b = open(&[2, 3]).await.unwrap();
    let ids: Vec<i64> = (0..40).collect();
    let bucket = |id: &i64| memwal_sharding::bucket_of(memwal_sharding::hash_i64(*id), 4);
    let own_a: Vec<i64> = ids.iter().copied().filter(|i| bucket(i) < 2).collect();
    let own_b: Vec<i64> = ids.iter().copied().filter(|i| bucket(i) >= 2).collect();
    // A batch spanning both halves is refused whole by either daemon:
    // nothing of it is written (its `x` values never show below).
    for host in [&a, &b] {
        let e = host.write(&tagged(&ids, "x"), false).await.unwrap_err();
        assert!(matches!(e, ServerError::ServedElsewhere { .. }), "{e}");
        assert!(!e.may_be_durable(), "{e}");
        assert_eq!(
            tonic::Status::from(e).code(),
            tonic::Code::FailedPrecondition
        );
    }
    a.write(&rows(&own_a), false).await.unwrap();
    b.write(&rows(&own_b), false).await.unwrap();
    // Reopening A must claim only its own two shards: B keeps writing.
    a.close().await.unwrap();
    let a = open(&[0, 1]).await.unwrap();
    assert_eq!(a.status().await.len(), 2);
    b.write(&rows(&own_b), false).await.unwrap();
    a.write(&rows(&own_a), false).await.unwrap();
    assert!(a.write(&tagged(&ids, "x"), false).await.is_err());
    for s in a.status().await.iter().chain(b.status().await.iter()) {
        assert_eq!(s.state, "serving", "{s:?}");
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
    // A subset of a table not sharded by one bucket field, or a bucket
    // that does not exist, is refused at open.
    assert!(open(&[4])
        .await
        .unwrap_err()
        .to_string()
        .contains("bucket 4"));

    // Every row is in exactly one half: a full host sees four shards, and
    // after compaction the base holds all 40 rows.
    let all = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    assert_eq!(all.status().await.len(), 4);
    all.close().await.unwrap();
    compact(&loc).await;
    let lance = memwal_sstable::LanceStore::new(loc.store.clone());
    let ds = lance::dataset::builder::DatasetBuilder::from_uri(lance.uri(&loc.root))
        .with_session(lance.session().clone())
        .load()
        .await
        .unwrap();
    assert_eq!(ds.count_rows(None).await.unwrap(), 40);
    assert_eq!(
        ds.count_rows(Some("v LIKE 'x%'".into())).await.unwrap(),
        0,
        "a refused batch left rows"
    );
}

// Breaks if a batch whose shards are partly taken over is reported as a
// plain failure (the client could not tell that other parts are durable),
// maps to a definite code instead of ABORTED (partial) with the durable and
// failed parts in the status metadata, or if the taken-over shard
// keeps being served (its status must say lost, the others serving).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partly_taken_over_batch_reports_its_durable_parts() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
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
        ServerError::Partial {
            durable, failed, ..
        } => {
            assert_eq!(durable.len(), 3, "{e}");
            assert_eq!(failed.len(), 1, "{e}");
            assert_eq!(failed[0].shard, victim.to_string());
            assert_eq!(failed[0].code, "FailedPrecondition", "{e}");
        }
        other => panic!("expected a partial failure, got {other}"),
    }
    // The partial outcome has its own code, and the parts in metadata a
    // client can read.
    let status = tonic::Status::from(e);
    assert_eq!(status.code(), tonic::Code::Aborted);
    let durable: serde_json::Value = serde_json::from_str(
        status
            .metadata()
            .get("memwal-durable-parts")
            .unwrap()
            .to_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(durable.as_array().unwrap().len(), 3, "{durable}");
    let failed: serde_json::Value = serde_json::from_str(
        status
            .metadata()
            .get("memwal-failed-parts")
            .unwrap()
            .to_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(failed[0]["shard"], victim.to_string(), "{failed}");
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

// Breaks if two daemons that both meet a bucket for the first time create
// two shards for it (the bucket's rows would be split over shards no single
// writer orders); they must create the same shard, the later claim fencing
// the earlier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_creating_a_buckets_shard_create_the_same_one() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let a = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    let b = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    let ids: Vec<i64> = (0..40).collect();
    assert_eq!(a.write(&rows(&ids), false).await.unwrap().len(), 4);
    assert_eq!(b.write(&rows(&ids), false).await.unwrap().len(), 4);
    assert_eq!(memwal_table::list_shards(&loc).await.unwrap().len(), 4);
    let e = a.write(&rows(&ids), false).await.unwrap_err();
    assert_eq!(
        tonic::Status::from(e).code(),
        tonic::Code::FailedPrecondition
    );
    b.close().await.unwrap();
    a.close().await.unwrap();
}

// Breaks if a WAL entry of another host's shard that does not decode is
// skipped (its rows silently missing from the read) or fails the read
// with anything but DATA_LOSS naming the shard and the entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_wal_entry_of_another_hosts_shard_is_data_loss() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let open = |b: &'static [u32]| {
        TableHost::open_buckets("t", loc.clone(), ShardWriterConfig::default(), Some(b))
    };
    let a = open(&[0, 1]).await.unwrap();
    let b = open(&[2, 3]).await.unwrap();
    let theirs: Vec<i64> = (0..40).filter(|&i| bucket(i) >= 2).collect();
    b.write(&tagged(&theirs, "b"), false).await.unwrap();
    // Only B wrote: every WAL object is B's. Garble them all.
    let mut garbled = 0;
    for shard in std::fs::read_dir(dir.path().join("t/_mem_wal")).unwrap() {
        let wal = shard.unwrap().path().join("wal");
        for entry in std::fs::read_dir(&wal).into_iter().flatten() {
            std::fs::write(entry.unwrap().path(), b"not an Arrow IPC stream").unwrap();
            garbled += 1;
        }
    }
    assert!(garbled > 0);
    let e = a.read_rows().await.unwrap_err();
    let shard = e.shard().unwrap().to_string();
    assert!(e.to_string().contains("corrupt WAL entry"), "{e}");
    let status = tonic::Status::from(e);
    assert_eq!(status.code(), tonic::Code::DataLoss, "{status}");
    assert!(status.message().contains(&shard), "{status}");
    // B's own reads come from its memtables, not the WAL.
    assert_eq!(as_map(&b.read_rows().await.unwrap()).len(), theirs.len());
    b.close().await.unwrap();
    a.close().await.unwrap();
}

// Breaks if what reads keep between queries is not charged to the pool
// they are given (the daemon's `query_total_memory_mib`): another host's
// unpublished WAL rows, and the indexes over this host's unflushed rows,
// must each fail a read with RESOURCE_EXHAUSTED naming the setting when
// the pool has no room, keeping nothing (the pool back to empty), and be
// read, and charged while kept, once it has room. Fails without the
// charges (the reads over the small pool succeed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_reads_keep_is_charged_to_the_query_memory() {
    use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryPool};
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let open = |b: &'static [u32]| {
        TableHost::open_buckets("t", loc.clone(), ShardWriterConfig::default(), Some(b))
    };
    let a = open(&[0, 1]).await.unwrap();
    let b = open(&[2, 3]).await.unwrap();
    let small: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(16 << 10));
    let roomy: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(64 << 20));
    let ids: Vec<i64> = (0..4000).collect();
    let (own_a, own_b): (Vec<i64>, Vec<i64>) = ids.iter().partition(|&&i| bucket(i) < 2);
    let mut model = BTreeMap::new();
    let refused = |e: ServerError, what: &str| {
        let status = tonic::Status::from(e);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status}");
        assert!(
            status.message().contains("query_total_memory_mib") && status.message().contains(what),
            "{status}"
        );
    };

    // B's rows are only in its WAL as far as A is concerned.
    b.write(&tagged(&own_b, "b"), false).await.unwrap();
    put(&mut model, &own_b, "b");
    a.charge_reads_to(small.clone());
    refused(a.read_rows().await.unwrap_err(), "unpublished");
    assert_eq!(small.reserved(), 0, "nothing kept after the refusal");
    a.charge_reads_to(roomy.clone());
    assert_eq!(as_map(&a.read_rows().await.unwrap()), model);
    let kept = roomy.reserved();
    assert!(kept > 0, "B's WAL rows are charged while kept");
    // B publishes: the next read lets its WAL rows go.
    b.flush().await.unwrap();
    assert_eq!(as_map(&a.read_rows().await.unwrap()), model);
    assert!(roomy.reserved() < kept, "{} of {kept}", roomy.reserved());

    // A's own unflushed rows: the index the merge builds over them.
    a.write(&tagged(&own_a, "a"), false).await.unwrap();
    put(&mut model, &own_a, "a");
    a.charge_reads_to(small.clone());
    refused(a.read_rows().await.unwrap_err(), "indexing unflushed rows");
    assert_eq!(small.reserved(), 0, "nothing kept after the refusal");
    a.charge_reads_to(roomy.clone());
    assert_eq!(as_map(&a.read_rows().await.unwrap()), model);
    assert!(roomy.reserved() > 0, "the index is charged while kept");
    b.close().await.unwrap();
    a.close().await.unwrap();
}

// Breaks if a shard this host closed when idle (every row published) is
// still read from its WAL on every read (a GET per shard per read, for
// nothing: no writer can add to its WAL without claiming it), or if that
// shortcut outlives a claim: once another host claims the shards and
// writes, a read must show its unpublished rows. Fails without the
// at-rest record of `reader/tails.rs` (WAL GETs during the read), and
// with the record trusted whatever the manifest version (B's rows
// missing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_closed_at_rest_here_is_not_read_from_its_wal_until_claimed() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let (faults, faulty) = through_faults(&loc);
    let a = TableHost::open("t", faulty, ShardWriterConfig::default())
        .await
        .unwrap();
    let ids: Vec<i64> = (0..40).collect();
    a.write(&tagged(&ids, "a"), false).await.unwrap();
    let mut model = BTreeMap::new();
    put(&mut model, &ids, "a");
    a.set_shard_limits(memwal_server::ShardLimits {
        max_open: 8,
        idle_close: Some(std::time::Duration::ZERO),
    });
    assert_eq!(a.close_idle_shards().await, 4);
    let wal_gets = || {
        faults
            .ops()
            .iter()
            .filter(|op| op.kind == OpKind::Get && op.path.contains("/wal/"))
            .count()
    };
    let before = wal_gets();
    reads_show(&a, &model, &[0, 5, 39, 99], "closed at rest").await;
    assert_eq!(wal_gets(), before, "no WAL read for shards closed at rest");

    // B claims every shard and writes; A must read B's rows from the WAL.
    let b = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    b.write(&tagged(&ids[..10], "b"), false).await.unwrap();
    b.write(&deletes(&[20, 21]), true).await.unwrap();
    put(&mut model, &ids[..10], "b");
    model.remove(&20);
    model.remove(&21);
    reads_show(&a, &model, &[0, 5, 20, 39], "claimed by B").await;
    assert!(wal_gets() > before, "the claimed shards are read");
    b.close().await.unwrap();
    a.close().await.unwrap();
}
