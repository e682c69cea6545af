//! Case 3: a live memwal writer taken over by upstream mid-load. A task
//! per shard puts and deletes in a loop (small memtables, so generations
//! freeze and publish in the background) and records every write memwal
//! acknowledges. Once each shard has `ACKS_BEFORE_TAKEOVER` acks, upstream
//! claims the shards while the loops keep going. Every write memwal
//! acknowledged must be in upstream's view; memwal must acknowledge nothing
//! it started after upstream's claim returned (those fail `Fenced`); a
//! write memwal failed must not show. No sleeps: the loops and the
//! takeover coordinate through watch channels, and every loop is bounded.

use std::sync::Arc;

use memwal::ShardWriter as OurWriter;
use tokio::sync::watch;

use crate::support::*;

/// Acks per shard before upstream starts claiming.
const ACKS_BEFORE_TAKEOVER: usize = 25;
/// Writes a loop issues before it stops to wait for the claim (bounds the
/// loop if upstream's open is slow).
const MAX_WRITES_BEFORE_CLAIM: usize = 400;
/// Writes a loop issues after it has seen the claim; each must fail.
const WRITES_AFTER_CLAIM: usize = 3;
/// memwal's memtable row limit under load (several generations).
const MEMTABLE_ROWS: usize = 24;

/// One write memwal acknowledged, in acknowledgement order.
#[derive(Debug, Clone)]
enum Acked {
    Put(Vec<i64>, String),
    Delete(Vec<i64>),
}

/// What a loop reports while it runs.
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    acks: usize,
    /// memwal returned a fence (it stays fenced).
    fenced: bool,
}

/// What a loop saw.
#[derive(Debug, Default)]
struct Report {
    acked: Vec<Acked>,
    /// The first error (a fence, or an unknown outcome while the fence
    /// lands).
    first_error: Option<memwal::Error>,
    /// The write whose outcome memwal reported as unknown, if any: keys
    /// and the put's tag (`None` for a delete).
    unknown: Option<(Vec<i64>, Option<String>)>,
    /// Writes issued after the loop saw the claim, and how each ended.
    after_claim: Vec<memwal::Result<u64>>,
}

/// Write `i` of a loop: mostly puts of two keys (overwrites, as the pool
/// is small), every fifth a delete of a key put recently.
fn write_of(shard: &Shard, i: usize) -> (Vec<i64>, Option<String>) {
    let n = shard.pool.len();
    if i % 5 == 4 {
        (vec![shard.pool[(i * 7 + 3) % n]], None)
    } else {
        let a = shard.pool[i % n];
        let b = shard.pool[(i * 3 + 1) % n];
        let ids = if a == b { vec![a] } else { vec![a, b] };
        (ids, Some(format!("live{:?}-{i}", shard.bucket)))
    }
}

async fn issue(w: &OurWriter, ids: &[i64], tag: &Option<String>) -> memwal::Result<u64> {
    match tag {
        Some(tag) => w.put(&rows(ids, tag)).await,
        None => w.delete(&keys(ids)).await,
    }
}

/// The load loop of one shard.
async fn load(
    w: Arc<OurWriter>,
    shard: Shard,
    mut claimed: watch::Receiver<bool>,
    progress: watch::Sender<Progress>,
) -> Report {
    let mut report = Report::default();
    let mut i = 0;
    loop {
        if report.first_error.is_some() || i >= MAX_WRITES_BEFORE_CLAIM {
            claimed
                .wait_for(|c| *c)
                .await
                .expect("the test keeps the claim sender");
        }
        let after_claim = *claimed.borrow();
        if after_claim && report.after_claim.len() == WRITES_AFTER_CLAIM {
            break;
        }
        let (ids, tag) = write_of(&shard, i);
        i += 1;
        let result = issue(&w, &ids, &tag).await;
        if after_claim {
            report.after_claim.push(result);
            continue;
        }
        match result {
            Ok(_) => {
                report.acked.push(match tag {
                    Some(tag) => Acked::Put(ids, tag),
                    None => Acked::Delete(ids),
                });
                progress.send_modify(|p| p.acks += 1);
            }
            Err(e) => {
                // The loop stops at its first error, so at most one write
                // per shard has an unknown outcome; the view settles it.
                if e.may_be_durable() {
                    report.unknown = Some((ids, tag));
                }
                if report.first_error.is_none() {
                    report.first_error = Some(e);
                }
                progress.send_modify(|p| p.fenced = true);
            }
        }
    }
    report
}

async fn live_memwal_taken_over_by_upstream(sharding: Sharding) {
    let (t, mut model) = Table::create(sharding, true).await;
    let shards = t.shards();

    let mut claims = Vec::new();
    let mut progress = Vec::new();
    let mut tasks = Vec::new();
    let mut writers = Vec::new();
    for s in &shards {
        let config = memwal::ShardWriterConfig {
            memtable_max_rows: MEMTABLE_ROWS,
            ..s.memwal_config()
        };
        let w = Arc::new(
            t.open_memwal(s, config)
                .await
                .unwrap_or_else(|e| panic!("memwal opens shard {:?}: {e}", s.bucket)),
        );
        let (claim_tx, claim_rx) = watch::channel(false);
        let (progress_tx, progress_rx) = watch::channel(Progress::default());
        tasks.push(tokio::spawn(load(
            w.clone(),
            s.clone(),
            claim_rx,
            progress_tx,
        )));
        claims.push(claim_tx);
        progress.push(progress_rx);
        writers.push(w);
    }

    // Start the takeover once every loop has enough acks (a loop that
    // stops early fails here, not by hanging).
    for (s, rx) in shards.iter().zip(progress.iter_mut()) {
        let p = rx
            .wait_for(|p| p.acks >= ACKS_BEFORE_TAKEOVER || p.fenced)
            .await
            .map(|p| *p);
        match p {
            Ok(p) => assert!(
                !p.fenced,
                "shard {:?}: memwal failed before any takeover (after {} acks)",
                s.bucket, p.acks
            ),
            Err(_) => panic!("shard {:?}: the load loop ended early", s.bucket),
        }
    }

    // Upstream claims every shard (concurrently) while the loops run;
    // each loop learns of its shard's claim once that open has returned.
    let opened = futures::future::join_all(shards.iter().zip(&claims).map(|(s, claim)| {
        let t = &t;
        async move {
            let up = t
                .open_upstream(s)
                .await
                .unwrap_or_else(|e| panic!("upstream claims live shard {:?}: {e}", s.bucket));
            claim.send_replace(true);
            up
        }
    }))
    .await;

    let mut reports = Vec::new();
    for task in tasks {
        reports.push(task.await.expect("load loop"));
    }
    for ((s, r), (w, up)) in shards.iter().zip(&reports).zip(writers.iter().zip(&opened)) {
        assert!(
            up.epoch() > w.epoch(),
            "shard {:?}: upstream's epoch {} is above memwal's {}",
            s.bucket,
            up.epoch(),
            w.epoch()
        );
        assert!(
            r.acked.len() >= ACKS_BEFORE_TAKEOVER,
            "shard {:?}: {} acks",
            s.bucket,
            r.acked.len()
        );
        if let Some(e) = &r.first_error {
            assert!(
                matches!(e, memwal::Error::Fenced { .. }) || e.may_be_durable(),
                "shard {:?}: memwal's first failure must be the fence or an unknown \
                 outcome while it lands, got: {e}",
                s.bucket
            );
        }
        assert_eq!(
            r.after_claim.len(),
            WRITES_AFTER_CLAIM,
            "shard {:?}",
            s.bucket
        );
        for (n, result) in r.after_claim.iter().enumerate() {
            assert!(
                matches!(result, Err(memwal::Error::Fenced { .. })),
                "shard {:?}: write {n} started after upstream's claim returned must fail \
                 Fenced, got {result:?}",
                s.bucket
            );
        }
        for a in &r.acked {
            match a {
                Acked::Put(ids, tag) => model.put(ids, tag),
                Acked::Delete(ids) => model.delete(ids),
            }
        }
    }

    // Every acknowledged write is in upstream's view once it has flushed
    // what it replayed; no failed write is.
    for (s, up) in shards.iter().zip(&opened) {
        run(
            Writer::Upstream(up),
            s,
            &[Step::Flush],
            &format!("up{:?}-replayed", s.bucket),
            &mut model,
        )
        .await;
    }
    let view = t.upstream_view(&shards).await;
    for (s, r) in shards.iter().zip(&reports) {
        if let Some((ids, tag)) = &r.unknown {
            model.settle_unknown(&view, ids, tag.as_deref(), &format!("shard {:?}", s.bucket));
        }
    }
    assert_view(
        &view,
        &model,
        "every write memwal acknowledged before upstream's claim",
    );

    for (s, up) in shards.iter().zip(opened) {
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
    drop(writers);
}

// Breaks if memwal acknowledges a write that upstream's replay misses
// (an ack before the entry is durable, an entry past upstream's sentinel,
// a generation memwal published that upstream then shadows with stale
// replayed rows), if memwal keeps acknowledging after upstream's claim,
// or if a write memwal reported as failed shows up anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsharded_live_memwal_taken_over_by_upstream() {
    live_memwal_taken_over_by_upstream(Sharding::Unsharded).await;
}

// As above on a `bucket(id, 4)` table: four memwal writers under load
// (shards memwal created with their bucket values), all four claimed by
// upstream at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_live_memwal_taken_over_by_upstream() {
    live_memwal_taken_over_by_upstream(Sharding::Bucket).await;
}
