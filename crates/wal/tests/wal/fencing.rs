//! Fencing between a predecessor and a successor writer.

use std::sync::Arc;

use memwal_store::{ObjectStore, Path};
use memwal_testkit::{Action, Gate, OpKind};
use memwal_wal::{
    seal_and_fence, write_fence_sentinel, WalAppender, WalConfig, WalError, WalLocation,
};
use object_store::ObjectStoreExt;

use crate::common::*;

/// Installs a hook on `store` holding every PUT to `path` at `gate`.
fn hold_puts_to(store: &memwal_testkit::FaultStore, path: String, gate: &Gate) {
    let gate = gate.clone();
    store.set_hook(move |op| {
        if op.kind == OpKind::Put && op.path == path {
            Action::Hold(gate.clone(), Box::new(Action::Pass))
        } else {
            Action::Pass
        }
    });
}

/// The fencing order, step by step, on any store (memory here, S3 in s3.rs).
///
/// The predecessor (epoch 1) lands one PUT between the successor's claim and
/// its sentinel (position 4), and races the sentinel for position 5 and
/// wins. The successor's sentinel must move past both, its replay must hold
/// both, and the predecessor's next append must fail Fenced with nothing
/// more written.
///
/// Breaks if: tail discovery misses an entry (the sentinel would collide
/// where it need not, or replay would stop short); the sentinel stops at a
/// lower-epoch collision or overwrites; replay ends before the sentinel;
/// the predecessor's collision is not resolved against the manifest (no
/// Fenced, or a false success); a poisoned appender keeps writing.
pub async fn fencing_scenario(inner: Arc<dyn ObjectStore>, root: Path) {
    let shard = shard();
    let fa = faulty(&inner); // the predecessor's view of the store
    let fb = faulty(&inner); // the successor's view
    let a = open_writer(fa.clone(), &root, shard, WalConfig::default())
        .await
        .unwrap();
    assert_eq!((a.epoch(), a.sentinel), (1, 1));
    let mut acked = Vec::new();
    for id in [1, 2] {
        let ack = a.wal.append(vec![rows(&[id])]).await.unwrap();
        acked.push((vec![id], ack));
    }

    let mb = manifests(fb.clone(), &root, shard);
    let claim_b = mb.claim(None).await.unwrap();
    assert_eq!(claim_b.epoch, 2);

    // Lands after the claim, before the sentinel: the predecessor does not
    // read the manifest on the happy path.
    let ack = a.wal.append(vec![rows(&[3])]).await.unwrap();
    assert_eq!(ack.position, 4);
    acked.push((vec![3], ack));

    // Both writers go for position 5; the predecessor's PUT lands first.
    let loc = WalLocation::of(&mb);
    let (gate_a, gate_b) = (Gate::new(), Gate::new());
    hold_puts_to(&fa, loc.path(5).to_string(), &gate_a);
    let racing = a.wal.submit(vec![rows(&[4])]).unwrap();
    gate_a.wait_arrived(1).await;
    hold_puts_to(&fb, loc.path(5).to_string(), &gate_b);
    let sentinel = tokio::spawn(async move {
        let s = write_fence_sentinel(&mb, claim_b.epoch, &claim_b.manifest).await;
        (s, mb, claim_b)
    });
    gate_b.wait_arrived(1).await;
    gate_a.open();
    let ack = racing.await.unwrap();
    assert_eq!(ack.position, 5);
    acked.push((vec![4], ack));
    gate_b.open();
    let (s, mb, claim_b) = sentinel.await.unwrap();
    let sentinel_b = s.unwrap();
    assert_eq!(
        sentinel_b, 6,
        "the sentinel moves past both predecessor entries"
    );
    fa.clear_hook();
    fb.clear_hook();

    let replayed = replay_all(&mb, &claim_b, sentinel_b).await.unwrap();
    assert_eq!(
        replayed.iter().map(|e| e.position).collect::<Vec<_>>(),
        vec![2, 3, 4, 5]
    );
    assert!(replayed.iter().all(|e| e.epoch == 1));
    assert_acks_replayed_once(&acked, &replayed);

    // The predecessor's next append collides with the sentinel.
    let err = a.wal.append(vec![rows(&[5])]).await.unwrap_err();
    assert!(
        matches!(
            err,
            WalError::Fenced {
                local_epoch: 1,
                stored_epoch: 2,
                ..
            }
        ),
        "{err}"
    );
    let wal = wal_prefix(&root, shard);
    let puts = fa.count(OpKind::Put, &wal);
    let err = a.wal.submit(vec![rows(&[6])]).unwrap_err();
    assert!(matches!(err, WalError::Fenced { .. }), "{err}");
    assert_eq!(
        fa.count(OpKind::Put, &wal),
        puts,
        "a fenced appender writes nothing more"
    );
    assert!(matches!(a.wal.close().await, Err(WalError::Fenced { .. })));

    // The successor continues right after its sentinel.
    let wal_b = WalAppender::start(
        manifests(fb.clone(), &root, shard),
        2,
        sentinel_b + 1,
        claim_b.manifest.current_generation,
        WalConfig::default(),
    )
    .unwrap();
    assert_eq!(wal_b.append(vec![rows(&[7])]).await.unwrap().position, 7);
    assert_eq!(assert_contiguous(&loc).await, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn successor_sentinel_moves_past_racing_predecessor_puts() {
    fencing_scenario(memory(), Path::from("table")).await;
}

/// Breaks if a collision on a SEALED shard is reported as anything but
/// Sealed (a drop in flight must stop the writer with that reason), or if
/// `seal_and_fence` leaves the WAL tip open (the append would succeed).
#[tokio::test]
async fn collision_on_a_sealed_shard_is_sealed() {
    let store = memory();
    let root = Path::from("t");
    let shard = shard();
    let a = open_writer(store.clone(), &root, shard, WalConfig::default())
        .await
        .unwrap();
    // The drop seals the shard and fences the WAL tip in one call.
    let (sealed, sentinel) = seal_and_fence(&manifests(store.clone(), &root, shard))
        .await
        .unwrap();
    assert_eq!(sealed.writer_epoch, a.epoch() + 1);
    assert_eq!(sentinel, a.wal.last_durable_position() + 1);
    let err = a.wal.append(vec![rows(&[1])]).await.unwrap_err();
    assert!(matches!(err, WalError::Sealed { .. }), "{err}");
    assert!(matches!(
        a.wal.submit(vec![rows(&[2])]),
        Err(WalError::Sealed { .. })
    ));
}

/// Two appenders with the same epoch (a bug elsewhere: both think they own
/// it) collide: the loser must stop with EpochConflict, not take the other's
/// entry as its own or move on. Breaks if "same epoch" is read as "our
/// landed write" without comparing bytes, or if data of our epoch is
/// stepped over like a sentinel.
#[tokio::test]
async fn same_epoch_different_bytes_is_an_epoch_conflict() {
    let store = memory();
    let root = Path::from("t");
    let a = open_writer(store.clone(), &root, shard(), WalConfig::default())
        .await
        .unwrap();
    let twin = WalAppender::start(
        a.manifests.clone(),
        a.epoch(),
        a.sentinel + 1,
        1,
        WalConfig::default(),
    )
    .unwrap();
    assert_eq!(a.wal.append(vec![rows(&[1])]).await.unwrap().position, 2);
    let err = twin.append(vec![rows(&[2])]).await.unwrap_err();
    assert!(
        matches!(
            err,
            WalError::EpochConflict {
                position: 2,
                epoch: 1,
                found_epoch: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(!err.may_be_durable());
    // The twin's rows are not in the WAL.
    let entry = WalLocation::of(&a.manifests)
        .read_entry(2)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ids_in(&entry.batches), vec![1]);
}

/// A stale claimer (epoch 1) writes its sentinel after the successor's
/// (epoch 2): its replay must see the successor's sentinel and fail Fenced,
/// and the successor's appender must step over the stale sentinel instead of
/// poisoning itself. Breaks if replay ignores sentinel epochs, or if the
/// appender treats an older writer's data-less sentinel as a conflict.
#[tokio::test]
async fn stale_claimer_sentinel_is_fenced_on_replay_and_stepped_over() {
    let store = memory();
    let root = Path::from("t");
    let shard = shard();
    let ma = manifests(store.clone(), &root, shard);
    let claim_a = ma
        .claim(Some(&memwal_fencing::ShardIdentity::manual()))
        .await
        .unwrap();
    let b = open_writer(store.clone(), &root, shard, WalConfig::default())
        .await
        .unwrap();
    assert_eq!((b.epoch(), b.sentinel), (2, 1));
    let sentinel_a = write_fence_sentinel(&ma, claim_a.epoch, &claim_a.manifest)
        .await
        .unwrap();
    assert_eq!(sentinel_a, 2);
    let err = replay_all(&ma, &claim_a, sentinel_a).await.unwrap_err();
    assert!(
        matches!(
            err,
            WalError::Fenced {
                local_epoch: 1,
                stored_epoch: 2,
                ..
            }
        ),
        "{err}"
    );

    let ack = b.wal.append(vec![rows(&[1])]).await.unwrap();
    assert_eq!(ack.position, 3);
    let c = open_writer(store.clone(), &root, shard, WalConfig::default())
        .await
        .unwrap();
    assert_eq!(c.sentinel, 4);
    assert_acks_replayed_once(&[(vec![1], ack)], &c.replayed);
}

/// A sentinel whose slot is taken by a newer writer's entry must fail
/// Fenced rather than move past it. Breaks if the sentinel moves past
/// every collision regardless of epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_colliding_with_a_newer_entry_is_fenced() {
    let inner = memory();
    let root = Path::from("t");
    let shard = shard();
    let fa = faulty(&inner);
    let ma = manifests(fa.clone(), &root, shard);
    let claim_a = ma
        .claim(Some(&memwal_fencing::ShardIdentity::manual()))
        .await
        .unwrap();
    let gate = Gate::new();
    hold_puts_to(&fa, WalLocation::of(&ma).path(1).to_string(), &gate);
    let sentinel =
        tokio::spawn(
            async move { write_fence_sentinel(&ma, claim_a.epoch, &claim_a.manifest).await },
        );
    gate.wait_arrived(1).await;
    // The successor claims and writes position 1 first.
    let b = open_writer(inner.clone(), &root, shard, WalConfig::default())
        .await
        .unwrap();
    assert_eq!(b.sentinel, 1);
    gate.open();
    let err = sentinel.await.unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            WalError::Fenced {
                local_epoch: 1,
                stored_epoch: 2,
                ..
            }
        ),
        "{err}"
    );
}

/// A stray object at WAL position `u64::MAX - 1` (named by the manifest's
/// hint): no sentinel can go after it and still leave the appender a
/// position, so the sentinel reports Corrupt instead of returning
/// `u64::MAX` (whose `+ 1`, the appender's first position, overflows).
/// Breaks if the sentinel is written at the last position or the position
/// arithmetic wraps or panics.
#[tokio::test]
async fn a_stray_object_at_the_last_positions_is_corrupt_not_an_overflow() {
    let inner = memory();
    let root = Path::from("t");
    let m = manifests(inner.clone(), &root, shard());
    let claim = m
        .claim(Some(&memwal_fencing::ShardIdentity::manual()))
        .await
        .unwrap();
    let loc = WalLocation::of(&m);
    let stray = u64::MAX - 1;
    inner
        .put(
            &loc.path(stray),
            memwal_wal::codec::encode_sentinel(0).into(),
        )
        .await
        .unwrap();
    let hinted = m
        .update(claim.epoch, |next| {
            next.wal_entry_position_last_seen = stray;
            Ok(())
        })
        .await
        .unwrap();
    let err = write_fence_sentinel(&m, claim.epoch, &hinted)
        .await
        .unwrap_err();
    assert!(
        matches!(err, WalError::Corrupt { position, .. } if position == stray),
        "{err:?}"
    );
    assert!(
        inner.head(&loc.path(u64::MAX)).await.is_err(),
        "nothing written at the last position"
    );
}
