//! The claim protocol over the S3 API (moto in CI). Sequential on purpose:
//! moto's conditional put is check-then-put, not atomic, so this shows that
//! collisions are detected over S3, not that S3 arbitrates races.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use memwal_fencing::{FencingError, ManifestStore, ShardId, ShardIdentity};
use memwal_store::RetryPolicy;
use memwal_testkit::{s3_test_location, Action, FaultStore, Gate, OpKind};
use object_store::ObjectStore;

fn manifests(
    store: Arc<dyn ObjectStore>,
    root: &object_store::path::Path,
    shard: ShardId,
) -> ManifestStore {
    ManifestStore::new(store, root, shard, RetryPolicy::immediate(3))
}

/// Holds the first PUT to `path` at `gate`; everything else passes.
fn hold_first_put(faulty: &Arc<FaultStore>, path: String, gate: Gate) {
    let fired = Arc::new(AtomicUsize::new(0));
    faulty.set_hook(move |op| {
        if op.kind == OpKind::Put && op.path == path && fired.fetch_add(1, Ordering::SeqCst) == 0 {
            Action::Hold(gate.clone(), Box::new(Action::Pass))
        } else {
            Action::Pass
        }
    });
}

// Breaks if put-if-not-exists is not honoured over S3 (a colliding claim would
// overwrite the winner's manifest instead of losing), if our own landed write
// is not recognised over S3, or if fencing does not hold.
#[tokio::test]
#[cfg_attr(
    not(memwal_s3_tests),
    ignore = "needs an S3 server: MEMWAL_TEST_S3_URI unset (eval \"$(scripts/s3-server.sh start)\")"
)]
async fn claims_collide_and_fence_over_s3() {
    let Some(loc) = s3_test_location("fencing-claims") else {
        return;
    };
    let shard = ShardId::random();
    let root = loc.root.clone();
    let a = manifests(loc.store.clone(), &root, shard);
    let first = a.claim(Some(&ShardIdentity::manual())).await.unwrap();
    assert_eq!((first.epoch, first.manifest.version), (1, 2));

    // B claims between A's read of version 2 and A's PUT of version 3: A's
    // PUT is held at a gate while B claims.
    let faulty = FaultStore::new(loc.store.clone());
    let a = Arc::new(manifests(faulty.clone(), &root, shard));
    let gate = Gate::new();
    hold_first_put(
        &faulty,
        a.layout().manifest_path(3).to_string(),
        gate.clone(),
    );
    let a_claim = tokio::spawn({
        let a = a.clone();
        async move { a.claim(None).await }
    });
    gate.wait_arrived(1).await;
    manifests(loc.store.clone(), &root, shard)
        .claim(None)
        .await
        .unwrap();
    gate.open();
    match a_claim.await.unwrap() {
        Err(FencingError::ClaimLost {
            wanted_epoch: 2,
            stored_epoch: 2,
            ..
        }) => {}
        other => panic!("expected ClaimLost over S3, got {other:?}"),
    }
    faulty.clear_hook();
    assert!(matches!(
        a.check_fenced(first.epoch).await,
        Err(FencingError::Fenced {
            local_epoch: 1,
            stored_epoch: 2,
            ..
        })
    ));

    // An update whose response is lost after it landed is recognised as ours.
    let b = manifests(faulty.clone(), &root, shard);
    let v4 = b.layout().manifest_path(4).to_string();
    let fired = Arc::new(AtomicUsize::new(0));
    faulty.set_hook(move |op| {
        if op.kind == OpKind::Put && op.path == v4 && fired.fetch_add(1, Ordering::SeqCst) == 0 {
            Action::LandThenFail
        } else {
            Action::Pass
        }
    });
    let updated = b
        .update(2, |m| {
            m.current_generation = 2;
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(updated.version, 4);
    let fresh = manifests(loc.store.clone(), &root, shard);
    assert_eq!(fresh.latest_version().await.unwrap(), 4);
    assert_eq!(
        fresh
            .load_latest()
            .await
            .unwrap()
            .unwrap()
            .current_generation,
        2
    );

    // Seal over S3 fences the writer at epoch 2.
    fresh.seal().await.unwrap();
    assert!(matches!(
        fresh.check_fenced(2).await,
        Err(FencingError::Sealed { .. })
    ));
}
