//! Case 1: upstream writes (two generations published, one only in the
//! WAL) and is abandoned without closing; memwal opens the shard, replays
//! upstream's WAL and publishes it before `open` returns. Upstream's
//! `LsmScanner` over base + published SSTables must then equal the
//! acknowledged state, and the abandoned upstream writer must be fenced.

use std::collections::HashMap;

use crate::support::*;

async fn upstream_abandoned_then_memwal_takes_over(sharding: Sharding) {
    let (t, mut model) = Table::create(sharding, true).await;
    let shards = t.shards();
    let script = three_generations();

    // Both ways a shard comes to exist upstream: buckets 0 and 1 are
    // created by the raw `mem_wal_writer` (version 1, epoch 1, no field
    // entries); buckets 2 and 3 first by `initialize_shard` with their
    // bucket value (version 1, epoch 0), then claimed by the writer.
    let pre_initialized = |s: &Shard| s.bucket.is_some_and(|b| b >= 2);
    for s in shards.iter().filter(|s| pre_initialized(s)) {
        t.initialize_bucket_shard(s).await;
    }

    let mut upstream = Vec::new();
    for s in &shards {
        let up = t
            .open_upstream(s)
            .await
            .unwrap_or_else(|e| panic!("upstream opens shard {:?}: {e}", s.bucket));
        run(
            Writer::Upstream(&up),
            s,
            &script,
            &format!("up{:?}", s.bucket),
            &mut model,
        )
        .await;
        let m = t.manifest(s).await;
        assert_eq!(
            m.sstables.len(),
            flushes(&script),
            "upstream published its flushed generations: {m:?}"
        );
        if pre_initialized(s) {
            let b = s.bucket.unwrap();
            assert_eq!(
                m.shard_field_values,
                HashMap::from([(BUCKET_FIELD.to_string(), b.to_le_bytes().to_vec())]),
                "{m:?}"
            );
            assert_eq!(up.epoch(), 1, "claimed over initialize_shard's epoch 0");
        } else {
            assert!(m.shard_field_values.is_empty(), "raw upstream shard: {m:?}");
            assert_eq!(up.epoch(), 1, "raw upstream shard starts at epoch 1");
        }
        upstream.push(up);
    }

    // The WAL-only generation is not visible yet: replay is what makes it so.
    let before = t.upstream_view(&shards).await;
    assert_ne!(
        before,
        model.visible(),
        "the last generation must still be only in the WAL"
    );

    let mut ours = Vec::new();
    for (s, up) in shards.iter().zip(&upstream) {
        let before = t.manifest(s).await;
        let w = t
            .open_memwal(s, s.memwal_config())
            .await
            .unwrap_or_else(|e| panic!("memwal opens upstream's shard {:?}: {e}", s.bucket));
        assert!(
            w.epoch() > up.epoch(),
            "memwal claims a newer epoch ({} vs upstream's {})",
            w.epoch(),
            up.epoch()
        );
        // open is ready once the WAL is read; the replayed generation
        // publishes in the background, which flush waits for.
        w.flush().await.unwrap();
        let after = t.manifest(s).await;
        assert_eq!(after.writer_epoch, w.epoch(), "{after:?}");
        assert!(
            after.version > before.version,
            "memwal's claim writes a newer manifest version: {before:?} -> {after:?}"
        );
        assert!(
            after.sstables.len() > before.sstables.len(),
            "memwal publishes the replayed generation: before {before:?}, after {after:?}"
        );
        assert!(
            after.replay_after_wal_entry_position > before.replay_after_wal_entry_position,
            "the replay cursor moves past upstream's WAL-only entries: {before:?} -> {after:?}"
        );
        ours.push(w);
    }
    assert_view(
        &t.upstream_view(&shards).await,
        &model,
        "after memwal replayed and published upstream's WAL",
    );

    // The abandoned upstream writers learn they are fenced at their next
    // WAL append (memwal's fence sentinel is in the way).
    for (s, up) in shards.iter().zip(&upstream) {
        let stale = s.keys(&[40]);
        let e = up
            .put(vec![rows(&stale, "stale")])
            .await
            .expect_err("the abandoned upstream writer must be fenced");
        assert_upstream_fenced(&e, &format!("upstream put on shard {:?}", s.bucket));
    }
    assert_view(
        &t.upstream_view(&shards).await,
        &model,
        "after the fenced upstream puts (nothing of them may show)",
    );

    // memwal is the owner now.
    for (s, w) in shards.iter().zip(&ours) {
        run(
            Writer::Memwal(w),
            s,
            &after_takeover(),
            &format!("mw{:?}", s.bucket),
            &mut model,
        )
        .await;
        w.close()
            .await
            .unwrap_or_else(|e| panic!("memwal close on shard {:?}: {e}", s.bucket));
    }
    assert_view(
        &t.upstream_view(&shards).await,
        &model,
        "after memwal's own writes and close",
    );
    drop(upstream);
}

// Breaks if memwal cannot open a shard upstream created (spec id 1, no
// field entries, epoch 1), cannot replay upstream's WAL entries (field ids,
// `_tombstone`, generations), skips or reorders them (an overwrite or a
// delete would be lost), never publishes the replayed rows (`flush` after `open`), or
// writes SSTables upstream's scanner cannot merge with upstream's own; or
// if its fence sentinel does not stop the abandoned upstream writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsharded_upstream_abandoned_memwal_takes_over() {
    upstream_abandoned_then_memwal_takes_over(Sharding::Unsharded).await;
}

// As above on a `bucket(id, 4)` table, one shard per bucket: two buckets
// created by upstream's raw writer (no field entries: memwal must accept
// its configured bucket), two by `initialize_shard` (field entries that
// must agree with memwal's config).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_upstream_abandoned_memwal_takes_over() {
    upstream_abandoned_then_memwal_takes_over(Sharding::Bucket).await;
}
