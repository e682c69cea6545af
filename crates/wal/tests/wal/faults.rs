//! Store faults during appends: lost responses, exhausted retries, random
//! transient errors, and stopping the appender mid-PUT.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use memwal_fencing::{ManifestStore, ShardIdentity};
use memwal_store::{ObjectStore, Path, RetryPolicy, StoreError};
use memwal_testkit::{http_status_error, permission_denied, Action, Gate, InjectError, OpKind};
use memwal_wal::{write_fence_sentinel, WalAppender, WalConfig, WalError, WalLocation};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common::*;

/// A PUT that lands but reports a timeout is retried with the same bytes;
/// the retry's collision reads back our own bytes. Breaks if the appender
/// (or create_object) takes its own landed write for a peer's (false
/// fence), moves to the next position (duplicate entry / gap), or retries
/// with different bytes.
#[tokio::test]
async fn landed_put_reported_as_timeout_is_not_a_fence_duplicate_or_gap() {
    let inner = memory();
    let root = Path::from("t");
    let fs = faulty(&inner);
    let w = open_writer(fs.clone(), &root, shard(), WalConfig::default())
        .await
        .unwrap();
    let loc = WalLocation::of(&w.manifests);
    let (p2, p3) = (loc.path(2).to_string(), loc.path(3).to_string());
    let once = Arc::new(AtomicBool::new(true));
    fs.set_hook(move |op| match op.kind {
        // Position 2: the first PUT lands but its response is lost.
        OpKind::Put if op.path == p2 && once.swap(false, Ordering::SeqCst) => Action::LandThenFail,
        // Position 3: every PUT response is lost (the retry must still win).
        OpKind::Put if op.path == p3 => Action::LandThenFail,
        _ => Action::Pass,
    });
    let a1 = w.wal.append(vec![rows(&[1])]).await.unwrap();
    let a2 = w.wal.append(vec![rows(&[2])]).await.unwrap();
    assert_eq!((a1.position, a2.position), (2, 3));
    assert_eq!(
        fs.count(OpKind::Put, loc.path(2).as_ref()),
        2,
        "one retry at 2"
    );
    assert_eq!(
        fs.count(OpKind::Put, loc.path(3).as_ref()),
        2,
        "one retry at 3"
    );
    fs.clear_hook();
    assert_eq!(assert_contiguous(&loc).await, 3);
    let next = open_writer(
        inner.clone(),
        &root,
        w.manifests.shard(),
        WalConfig::default(),
    )
    .await
    .unwrap();
    assert_acks_replayed_once(&[(vec![1], a1), (vec![2], a2)], &next.replayed);
}

/// A PUT that fails on every attempt has an unknown outcome: the append
/// gets OutcomeUnknown (not a plain failure) and the appender is poisoned,
/// writing nothing more. Breaks if retries are unbounded, if exhaustion is
/// reported as a definite failure, or if later appends go on to N+1.
#[tokio::test]
async fn exhausted_retries_give_outcome_unknown_and_poison() {
    let inner = memory();
    let root = Path::from("t");
    let fs = faulty(&inner);
    let w = open_writer(fs.clone(), &root, shard(), WalConfig::default())
        .await
        .unwrap();
    let loc = WalLocation::of(&w.manifests);
    assert_eq!(w.wal.append(vec![rows(&[1])]).await.unwrap().position, 2);
    let p3 = loc.path(3).to_string();
    fs.set_hook(move |op| {
        if op.kind == OpKind::Put && op.path == p3 {
            Action::Fail
        } else {
            Action::Pass
        }
    });
    let queued_behind = {
        // The second append either shares the failing entry or waits behind
        // it; either way it gets the unknown outcome, never an ack.
        let t1 = w.wal.submit(vec![rows(&[2])]).unwrap();
        let t2 = w.wal.submit(vec![rows(&[3])]).unwrap();
        let e1 = t1.await.unwrap_err();
        assert!(
            matches!(e1, WalError::OutcomeUnknown { position: 3, .. }),
            "{e1}"
        );
        assert!(e1.may_be_durable());
        t2.await.unwrap_err()
    };
    assert!(
        matches!(queued_behind, WalError::OutcomeUnknown { position: 3, .. }),
        "{queued_behind}"
    );
    assert_eq!(
        fs.count(OpKind::Put, loc.path(3).as_ref()),
        4,
        "RetryPolicy::immediate(4)"
    );
    let err = w.wal.submit(vec![rows(&[4])]).unwrap_err();
    assert!(
        matches!(err, WalError::OutcomeUnknown { position: 3, .. }),
        "{err}"
    );
    assert!(matches!(
        w.wal.close().await,
        Err(WalError::OutcomeUnknown { .. })
    ));
    assert_eq!(
        fs.count(OpKind::Put, loc.path(4).as_ref()),
        0,
        "nothing past the unknown entry"
    );
}

/// A store that definitely refuses the entry's first PUT (a 403, or a 400
/// object_store passes as `Generic`): nothing was written, so the append
/// fails with `Storage` (not "may be durable"); the appender stops.
/// Breaks if a refusal is reported as `OutcomeUnknown` (a caller would have
/// to treat unwritten rows as possibly durable), if the 400 is retried as
/// transient, or if anything is written after it.
#[tokio::test]
async fn a_refused_put_is_a_definite_failure_not_maybe_durable() {
    let refusals = [
        InjectError::new(|| permission_denied("t/_mem_wal/wal")),
        InjectError::new(|| http_status_error(400, "Bad Request")),
    ];
    for refusal in refusals {
        let inner = memory();
        let root = Path::from("t");
        let fs = faulty(&inner);
        let w = open_writer(fs.clone(), &root, shard(), WalConfig::default())
            .await
            .unwrap();
        let loc = WalLocation::of(&w.manifests);
        let p2 = loc.path(2).to_string();
        fs.set_hook(move |op| {
            if op.kind == OpKind::Put && op.path == p2 {
                Action::FailWith(refusal.clone())
            } else {
                Action::Pass
            }
        });
        let err = w.wal.append(vec![rows(&[1])]).await.unwrap_err();
        assert!(
            matches!(&err, WalError::Storage(e) if matches!(**e, StoreError::Request { .. })),
            "expected a definite storage failure, got {err:?}"
        );
        assert!(!err.may_be_durable(), "{err}");
        assert_eq!(fs.count(OpKind::Put, loc.path(2).as_ref()), 1, "no retry");
        let later = w.wal.submit(vec![rows(&[2])]).unwrap_err();
        assert!(matches!(later, WalError::Storage(_)), "{later}");
        assert!(w.wal.close().await.is_err());
        fs.clear_hook();
        assert_eq!(assert_contiguous(&loc).await, 1, "only the sentinel");
    }
}

/// Random transient failures (seeded) on every kind of WAL request, with
/// concurrent appenders. Breaks if any retry path loses or duplicates an
/// entry, skips a position, or acknowledges something replay cannot find.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_transient_faults_keep_positions_contiguous_and_acks_exact() {
    for seed in [7u64, 0x5eed, 2024] {
        let inner = memory();
        let root = Path::from("t");
        let shard = shard();
        let fs = faulty(&inner);
        let store: Arc<dyn ObjectStore> = fs.clone();
        // Generous retries (here and for the successor below): the faults are transient by construction.
        let ms = Arc::new(ManifestStore::new(
            store,
            &root,
            shard,
            RetryPolicy::immediate(40),
        ));
        let claim = ms.claim(Some(&ShardIdentity::manual())).await.unwrap();
        let sentinel = write_fence_sentinel(&ms, claim.epoch, &claim.manifest)
            .await
            .unwrap();
        let wal = WalAppender::start(
            ms.clone(),
            claim.epoch,
            sentinel + 1,
            1,
            WalConfig::default(),
        )
        .unwrap();
        let rng = Mutex::new(StdRng::seed_from_u64(seed));
        let prefix = wal_prefix(&root, shard);
        fs.set_hook(move |op| {
            if !op.path.starts_with(&prefix) {
                return Action::Pass;
            }
            let r: f64 = rng.lock().random();
            match op.kind {
                OpKind::Put if r < 0.25 => Action::Fail,
                OpKind::Put if r < 0.45 => Action::LandThenFail,
                OpKind::Get | OpKind::Head | OpKind::List if r < 0.2 => Action::Fail,
                _ => Action::Pass,
            }
        });
        let tasks: Vec<_> = (0..8i64)
            .map(|t| {
                let wal = wal.clone();
                tokio::spawn(async move {
                    let mut acks = Vec::new();
                    for i in 0..20i64 {
                        let ids = vec![t * 1000 + i, t * 1000 + i + 500];
                        let ack = wal.append(vec![rows(&ids)]).await.unwrap();
                        acks.push((ids, ack));
                    }
                    acks
                })
            })
            .collect();
        let mut acks = Vec::new();
        for t in tasks {
            acks.extend(t.await.unwrap());
        }
        // A successor replays through the same faults (reads are retried).
        let store: Arc<dyn ObjectStore> = fs.clone();
        let ms = Arc::new(ManifestStore::new(
            store,
            &root,
            shard,
            RetryPolicy::immediate(40),
        ));
        let next = open_writer_with(ms, WalConfig::default()).await;
        fs.clear_hook();
        let next = next.unwrap();
        assert_acks_replayed_once(&acks, &next.replayed);
        let loc = WalLocation::of(&next.manifests);
        assert_eq!(assert_contiguous(&loc).await, next.sentinel, "seed {seed}");
    }
}

/// Dropping the last handle stops the task: the entry in flight resolves
/// as OutcomeUnknown (its PUT may still land), queued appends as Closed.
/// Breaks if the task is detached (tickets hang or get acked after the
/// appender is gone) or if an in-flight append is reported as plainly
/// failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_appender_stops_the_task() {
    let inner = memory();
    let root = Path::from("t");
    let fs = faulty(&inner);
    let w = open_writer(fs.clone(), &root, shard(), WalConfig::default())
        .await
        .unwrap();
    let gate = Gate::new();
    let path = WalLocation::of(&w.manifests).path(2).to_string();
    let g = gate.clone();
    fs.set_hook(move |op| {
        if op.kind == OpKind::Put && op.path == path {
            Action::Hold(g.clone(), Box::new(Action::Pass))
        } else {
            Action::Pass
        }
    });
    let in_flight = w.wal.submit(vec![rows(&[1])]).unwrap();
    gate.wait_arrived(1).await;
    let queued = w.wal.submit(vec![rows(&[2])]).unwrap();
    drop(w.wal);
    let e1 = in_flight.await.unwrap_err();
    assert!(
        matches!(e1, WalError::OutcomeUnknown { position: 2, .. }),
        "{e1}"
    );
    let e2 = queued.await.unwrap_err();
    assert!(matches!(e2, WalError::Closed), "{e2}");
    gate.open();
}

/// close() writes everything queued before stopping, then refuses new
/// appends. Breaks if close drops queued appends or returns before they
/// are durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_drains_the_queue() {
    let inner = memory();
    let root = Path::from("t");
    let fs = faulty(&inner);
    let w = open_writer(fs.clone(), &root, shard(), WalConfig::default())
        .await
        .unwrap();
    let gate = Gate::new();
    let g = gate.clone();
    fs.set_hook(move |op| {
        if op.kind == OpKind::Put {
            Action::Hold(g.clone(), Box::new(Action::Pass))
        } else {
            Action::Pass
        }
    });
    let tickets: Vec<_> = (0..5)
        .map(|i| w.wal.submit(vec![rows(&[i])]).unwrap())
        .collect();
    gate.wait_arrived(1).await;
    let (closed, ()) = tokio::join!(biased; w.wal.close(), async { gate.open() });
    closed.unwrap();
    for t in tickets {
        t.await.unwrap();
    }
    assert!(matches!(
        w.wal.submit(vec![rows(&[9])]),
        Err(WalError::Closed)
    ));
    w.wal.close().await.unwrap();
}
