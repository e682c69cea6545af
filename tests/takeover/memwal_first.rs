//! Case 2: memwal writes (two generations published, one only in the WAL)
//! and is abandoned without closing; upstream opens the same shard with
//! `Dataset::mem_wal_writer` and replays memwal's WAL. Upstream's view
//! once it has flushed (and after its own writes and close) must equal the
//! acknowledged state, and memwal's next write must fail `Fenced`.

use crate::support::*;

async fn memwal_abandoned_then_upstream_takes_over(sharding: Sharding) {
    let (t, mut model) = Table::create(sharding, false).await;
    let shards = t.shards();
    let script = three_generations();

    // Buckets 0 and 1 are created by upstream's full system
    // (`initialize_shard`, epoch 0, with the bucket value) and only claimed
    // by memwal; memwal creates the other shards itself.
    let pre_initialized = |s: &Shard| s.bucket.is_some_and(|b| b < 2);
    for s in shards.iter().filter(|s| pre_initialized(s)) {
        t.initialize_bucket_shard(s).await;
    }

    let mut ours = Vec::new();
    for s in &shards {
        let w = t
            .open_memwal(s, s.memwal_config())
            .await
            .unwrap_or_else(|e| panic!("memwal opens shard {:?}: {e}", s.bucket));
        run(
            Writer::Memwal(&w),
            s,
            &script,
            &format!("mw{:?}", s.bucket),
            &mut model,
        )
        .await;
        let m = t.manifest(s).await;
        assert_eq!(
            m.sstables.len(),
            flushes(&script),
            "memwal published its flushed generations: {m:?}"
        );
        assert_eq!(m.writer_epoch, w.epoch(), "{m:?}");
        assert_eq!(m.shard_spec_id, 1, "the table's spec: {m:?}");
        ours.push(w);
    }
    let before = t.upstream_view(&shards).await;
    assert_ne!(
        before,
        model.visible(),
        "the last generation must still be only in the WAL"
    );

    let mut upstream = Vec::new();
    for (s, w) in shards.iter().zip(&ours) {
        let up = t
            .open_upstream(s)
            .await
            .unwrap_or_else(|e| panic!("upstream opens memwal's shard {:?}: {e}", s.bucket));
        assert!(
            up.epoch() > w.epoch(),
            "upstream claims a newer epoch ({} vs memwal's {})",
            up.epoch(),
            w.epoch()
        );
        upstream.push(up);
    }

    // memwal's abandoned writers are fenced at their next write; a fenced
    // write is not acknowledged and must never show (key 40 is in no
    // script, key 2 is visible in the model).
    for (s, w) in shards.iter().zip(&ours) {
        let what = format!("memwal put on shard {:?} after upstream's claim", s.bucket);
        assert_memwal_fenced(w.put(&rows(&s.keys(&[40]), "stale")).await, &what);
        let what = format!(
            "memwal delete on shard {:?} after upstream's claim",
            s.bucket
        );
        assert_memwal_fenced(w.delete(&keys(&s.keys(&[2]))).await, &what);
    }

    // What upstream replayed, once it has flushed it.
    for (s, up) in shards.iter().zip(&upstream) {
        run(
            Writer::Upstream(up),
            s,
            &[Step::Flush],
            &format!("up{:?}-replayed", s.bucket),
            &mut model,
        )
        .await;
    }
    assert_view(
        &t.upstream_view(&shards).await,
        &model,
        "after upstream replayed memwal's WAL and flushed",
    );

    // Upstream is the owner now; its close flushes.
    for (s, up) in shards.iter().zip(upstream) {
        run(
            Writer::Upstream(&up),
            s,
            &after_takeover(),
            &format!("up{:?}", s.bucket),
            &mut model,
        )
        .await;
        up.close()
            .await
            .unwrap_or_else(|e| panic!("upstream close on shard {:?}: {e}", s.bucket));
    }
    assert_view(
        &t.upstream_view(&shards).await,
        &model,
        "after upstream's own writes and close",
    );
    for (s, w) in shards.iter().zip(&ours) {
        let what = format!("memwal put on shard {:?} after upstream closed", s.bucket);
        assert_memwal_fenced(w.put(&rows(&s.keys(&[41]), "stale")).await, &what);
    }
    drop(ours);
}

// Breaks if upstream cannot claim a shard memwal created or claimed
// (manifest bytes, claim token field, epochs), cannot replay memwal's WAL
// entries (schema metadata, field ids, `_tombstone`, generations) or
// merges memwal's SSTables wrongly with its own; or if memwal does not
// notice upstream's fence sentinel and acknowledges a write after the
// takeover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsharded_memwal_abandoned_upstream_takes_over() {
    memwal_abandoned_then_upstream_takes_over(Sharding::Unsharded).await;
}

// As above on a `bucket(id, 4)` table: buckets 0 and 1 initialised by
// upstream's `initialize_shard` (memwal claims them with its configured
// bucket, which must agree), buckets 2 and 3 created by memwal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_memwal_abandoned_upstream_takes_over() {
    memwal_abandoned_then_upstream_takes_over(Sharding::Bucket).await;
}

// Breaks if upstream cannot replay an entry memwal wrote as several IPC
// messages (a put larger than `codec::MESSAGE_BODY_BYTES`), or replays its
// slices out of order or only in part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_replays_a_put_memwal_wrote_as_several_messages() {
    let (t, mut model) = Table::create(Sharding::Unsharded, false).await;
    let shards = t.shards();
    let s = &shards[0];
    let ours = t
        .open_memwal(s, s.memwal_config())
        .await
        .unwrap_or_else(|e| panic!("memwal opens the shard: {e}"));
    // The put's last rows overwrite its first keys under another tag, so a
    // replay that reorders or drops slices shows the wrong row.
    let (first, last): (Vec<i64>, Vec<i64>) =
        ((100_000..103_000).collect(), (100_000..100_010).collect());
    let (tag, later) = ("big".repeat(400), "later".to_string());
    let batch = arrow_select::concat::concat_batches(
        &table_schema(),
        &[rows(&first, &tag), rows(&last, &later)],
    )
    .unwrap_or_else(|e| panic!("one put of both: {e}"));
    let messages = memwal_wal::codec::message_count(&batch);
    assert!(
        messages >= 3,
        "a {}-row put is {messages} message(s)",
        batch.num_rows()
    );
    ours.put(&batch)
        .await
        .unwrap_or_else(|e| panic!("memwal put: {e}"));
    model.put(&first, &tag);
    model.put(&last, &later);
    // And a delete of keys the large put wrote (replayed after it).
    let gone = [100_020, 102_999];
    ours.delete(&keys(&gone))
        .await
        .unwrap_or_else(|e| panic!("memwal delete: {e}"));
    model.delete(&gone);
    let up = t
        .open_upstream(s)
        .await
        .unwrap_or_else(|e| panic!("upstream opens memwal's shard: {e}"));
    run(
        Writer::Upstream(&up),
        s,
        &[Step::Flush],
        "up-replayed",
        &mut model,
    )
    .await;
    assert_view(
        &t.upstream_view(&shards).await,
        &model,
        "after upstream replayed a put written as several messages",
    );
    up.close()
        .await
        .unwrap_or_else(|e| panic!("upstream close: {e}"));
    drop(ours);
}
