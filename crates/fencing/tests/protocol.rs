//! The manifest store and claim protocol, on the in-memory and local stores,
//! with and without injected faults. Each test names what would break it.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use memwal_fencing::{
    FencingError, ManifestStore, ShardId, ShardIdentity, ShardManifest, ShardStatus,
};
use memwal_proto::SsTable;
use memwal_store::{open_store, Path, RetryPolicy, StoreError};
use memwal_testkit::{
    http_status_error, permission_denied, Action, FaultStore, Gate, InjectError, OpKind,
};
use object_store::{ObjectStore, ObjectStoreExt};

/// A fresh store of each kind: in-memory, and local disk with fsync.
fn backends() -> Vec<(
    &'static str,
    Arc<dyn ObjectStore>,
    Option<tempfile::TempDir>,
)> {
    let dir = tempfile::tempdir().unwrap();
    let local = open_store(dir.path().to_str().unwrap()).unwrap().store;
    let mem = open_store(&format!("memory://fencing-{}", ShardId::random()))
        .unwrap()
        .store;
    vec![("memory", mem, None), ("local", local, Some(dir))]
}

fn manifests(store: Arc<dyn ObjectStore>, shard: ShardId) -> ManifestStore {
    ManifestStore::new(
        store,
        &Path::from("table"),
        shard,
        RetryPolicy::immediate(3),
    )
}

fn identity() -> ShardIdentity {
    let mut id = ShardIdentity {
        spec_id: 1,
        ..Default::default()
    };
    id.field_values
        .insert("bucket".into(), 3i32.to_le_bytes().to_vec());
    id
}

// Breaks if the first claim does not create version 1 (epoch 0) and then
// write version 2 with epoch 1, or if later claims do not bump by one.
#[tokio::test]
async fn claim_creates_a_missing_shard_then_bumps_the_epoch() {
    for (name, store, _dir) in backends() {
        let shard = ShardId::random();
        let m = manifests(store.clone(), shard);
        assert!(m.load_latest().await.unwrap().is_none(), "{name}");
        let c1 = m.claim(Some(&identity())).await.unwrap();
        assert_eq!((c1.epoch, c1.manifest.version), (1, 2), "{name}");
        let v1 = m.load_version(1).await.unwrap().unwrap();
        assert_eq!(v1.writer_epoch, 0);
        assert_eq!(v1.current_generation, 1);
        assert_eq!(ShardIdentity::of_manifest(&v1), identity());
        assert_eq!(
            ShardId::from_proto(v1.shard_id.as_ref().unwrap()),
            Some(shard)
        );
        let c2 = manifests(store.clone(), shard).claim(None).await.unwrap();
        assert_eq!((c2.epoch, c2.manifest.version), (2, 3), "{name}");
        // The identity is immutable and carried forward.
        assert_eq!(ShardIdentity::of_manifest(&c2.manifest), identity());
    }
}

// Breaks if initialize is not idempotent, or accepts a different identity.
#[tokio::test]
async fn initialize_is_idempotent_and_identity_is_immutable() {
    for (name, store, _dir) in backends() {
        let shard = ShardId::random();
        let m = manifests(store.clone(), shard);
        let a = m.initialize_shard(&identity()).await.unwrap();
        let b = manifests(store.clone(), shard)
            .initialize_shard(&identity())
            .await
            .unwrap();
        assert_eq!(a, b, "{name}");
        assert_eq!(m.latest_version().await.unwrap(), 1);
        let other = ShardIdentity::manual();
        assert!(
            matches!(
                m.initialize_shard(&other).await,
                Err(FencingError::IdentityMismatch { .. })
            ),
            "{name}"
        );
        assert!(matches!(
            m.claim(Some(&other)).await,
            Err(FencingError::IdentityMismatch { .. })
        ));
        // A claim without an identity on a missing shard creates nothing.
        let missing = manifests(store.clone(), ShardId::random());
        assert!(matches!(
            missing.claim(None).await,
            Err(FencingError::ShardNotFound { .. })
        ));
        assert_eq!(missing.latest_version().await.unwrap(), 0);
    }
}

async fn write_versions(m: &ManifestStore, n: u64) {
    let c = m.claim(Some(&identity())).await.unwrap();
    while m.latest_version().await.unwrap() < n {
        m.update(c.epoch, |_| Ok(())).await.unwrap();
    }
}

// Breaks if discovery trusts the hint (missing, stale, ahead, garbage) instead
// of probing, or stops at the hint when more versions exist.
#[tokio::test]
async fn latest_version_is_found_whatever_the_hint_says() {
    for (name, store, _dir) in backends() {
        let shard = ShardId::random();
        let writer = manifests(store.clone(), shard);
        write_versions(&writer, 13).await;
        let hint = writer.layout().version_hint_path();
        let cases: [(&str, Option<&[u8]>); 6] = [
            ("exact", Some(br#"{"version":13}"#)),
            ("missing", None),
            ("stale", Some(br#"{"version":2}"#)),
            ("ahead", Some(br#"{"version":1000}"#)),
            ("just-ahead", Some(br#"{"version":14}"#)),
            ("garbage", Some(b"not json")),
        ];
        for (case, body) in cases {
            match body {
                Some(b) => {
                    store.put(&hint, b.to_vec().into()).await.unwrap();
                }
                None => store.delete(&hint).await.unwrap(),
            }
            // A fresh instance has no cached knowledge of the tail.
            let reader = manifests(store.clone(), shard);
            assert_eq!(reader.latest_version().await.unwrap(), 13, "{name}/{case}");
            assert_eq!(reader.load_latest().await.unwrap().unwrap().version, 13);
        }
    }
}

// Breaks if discovery gives up when the versions below the tail were pruned:
// the LIST fallback must still find the surviving tail.
#[tokio::test]
async fn latest_version_survives_a_pruned_prefix() {
    let (_, store, _dir) = backends().remove(0);
    let shard = ShardId::random();
    let writer = manifests(store.clone(), shard);
    write_versions(&writer, 6).await;
    for v in 1..=3 {
        store
            .delete(&writer.layout().manifest_path(v))
            .await
            .unwrap();
    }
    store
        .delete(&writer.layout().version_hint_path())
        .await
        .unwrap();
    assert_eq!(manifests(store, shard).latest_version().await.unwrap(), 6);
}

// Breaks if a failed read is taken as "no manifest" (which would let a
// claimer re-create a shard, or a writer believe it is unfenced).
#[tokio::test]
async fn read_errors_are_returned_not_read_as_missing() {
    for (name, store, _dir) in backends() {
        let shard = ShardId::random();
        manifests(store.clone(), shard)
            .claim(Some(&identity()))
            .await
            .unwrap();
        let faulty = FaultStore::new(store.clone());
        faulty.set_hook(|op| match op.kind {
            OpKind::Get | OpKind::Head | OpKind::List => Action::Fail,
            _ => Action::Pass,
        });
        let m = manifests(faulty.clone(), shard);
        let err = m.load_latest().await.unwrap_err();
        assert!(
            matches!(err, FencingError::Storage(StoreError::Request { .. })),
            "{name}: {err}"
        );
        assert!(matches!(
            m.claim(Some(&identity())).await,
            Err(FencingError::Storage(_))
        ));
        assert!(matches!(
            m.check_fenced(1).await,
            Err(FencingError::Storage(_))
        ));
        // Nothing was written by the failed claim.
        assert_eq!(
            manifests(store.clone(), shard)
                .latest_version()
                .await
                .unwrap(),
            2
        );

        // Transient failures within the retry budget are retried through.
        let failures = Arc::new(AtomicUsize::new(0));
        let f = failures.clone();
        faulty.set_hook(move |op| {
            if matches!(op.kind, OpKind::Get | OpKind::Head)
                && f.fetch_add(1, Ordering::SeqCst) % 3 < 2
            {
                Action::Fail
            } else {
                Action::Pass
            }
        });
        let m = manifests(faulty.clone(), shard);
        assert_eq!(m.load_latest().await.unwrap().unwrap().version, 2, "{name}");
    }
}

// Breaks if an undecodable manifest is skipped or read as missing.
#[tokio::test]
async fn corrupt_manifest_is_a_typed_error_naming_the_path() {
    for (name, store, _dir) in backends() {
        let shard = ShardId::random();
        let m = manifests(store.clone(), shard);
        m.claim(Some(&identity())).await.unwrap();
        let path = m.layout().manifest_path(3);
        store
            .put(&path, b"\x0a\xff\xff\xff".to_vec().into())
            .await
            .unwrap();
        let fresh = manifests(store.clone(), shard);
        match fresh.load_latest().await {
            Err(FencingError::Corrupt { path: p, .. }) => assert_eq!(p, path.to_string(), "{name}"),
            other => panic!("{name}: expected Corrupt, got {other:?}"),
        }
        assert!(matches!(
            fresh.claim(None).await,
            Err(FencingError::Corrupt { .. })
        ));
    }
}

// Breaks if an older epoch is not reported as fenced, or the error loses
// either epoch number.
#[tokio::test]
async fn a_newer_claim_fences_the_older_writer() {
    for (name, store, _dir) in backends() {
        let shard = ShardId::random();
        let old = manifests(store.clone(), shard);
        let new = manifests(store.clone(), shard);
        let c_old = old.claim(Some(&identity())).await.unwrap();
        old.check_fenced(c_old.epoch).await.unwrap();
        let c_new = new.claim(None).await.unwrap();
        match old.check_fenced(c_old.epoch).await {
            Err(FencingError::Fenced {
                local_epoch,
                stored_epoch,
                ..
            }) => {
                assert_eq!(
                    (local_epoch, stored_epoch),
                    (c_old.epoch, c_new.epoch),
                    "{name}"
                )
            }
            other => panic!("{name}: expected Fenced, got {other:?}"),
        }
        // The fenced writer cannot publish, and wrote nothing trying.
        let before = new.latest_version().await.unwrap();
        assert!(matches!(
            old.update(c_old.epoch, |m| {
                m.current_generation += 1;
                Ok(())
            })
            .await,
            Err(FencingError::Fenced { .. })
        ));
        assert_eq!(new.latest_version().await.unwrap(), before);
        new.update(c_new.epoch, |_| Ok(())).await.unwrap();
    }
}

fn add_sstable(generation: u64) -> impl FnMut(&mut ShardManifest) -> Result<(), FencingError> {
    move |m| {
        if !m.sstables.iter().any(|s| s.generation == generation) {
            m.sstables.push(SsTable {
                generation,
                path: format!("abcd0123_gen_{generation}"),
                ..Default::default()
            });
        }
        Ok(())
    }
}

// Breaks if a lost update race is not retried on the new version, if the
// retry duplicates an entry, or if versions get a gap.
#[tokio::test]
async fn racing_updates_all_land_once_without_gaps() {
    for (name, store, _dir) in backends() {
        let shard = ShardId::random();
        let m = Arc::new(manifests(store.clone(), shard));
        let c = m.claim(Some(&identity())).await.unwrap();
        let tasks: Vec<_> = (1..=10u64)
            .map(|g| {
                let m = Arc::new(manifests(store.clone(), shard));
                tokio::spawn(async move { m.update(c.epoch, add_sstable(g)).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let latest = m.load_latest().await.unwrap().unwrap();
        assert_eq!(latest.version, 12, "{name}");
        let mut gens: Vec<u64> = latest.sstables.iter().map(|s| s.generation).collect();
        gens.sort();
        assert_eq!(gens, (1..=10).collect::<Vec<_>>(), "{name}");
        for v in 1..=12 {
            assert!(
                m.load_version(v).await.unwrap().is_some(),
                "{name}: gap at {v}"
            );
        }
    }
}

// Breaks if update lets the change rewrite fields it does not own (epoch,
// status, identity, version).
#[tokio::test]
async fn update_keeps_fields_it_does_not_own() {
    let (_, store, _dir) = backends().remove(0);
    let m = manifests(store, ShardId::random());
    let c = m.claim(Some(&identity())).await.unwrap();
    let out = m
        .update(c.epoch, |m| {
            m.writer_epoch = 99;
            m.status = ShardStatus::Sealed as i32;
            m.shard_spec_id = 42;
            m.version = 77;
            m.current_generation = 5;
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(out.writer_epoch, c.epoch);
    assert_eq!(out.status, ShardStatus::Active as i32);
    assert_eq!(out.shard_spec_id, 1);
    assert_eq!(out.version, 3);
    assert_eq!(out.current_generation, 5);
    assert_eq!(m.load_latest().await.unwrap().unwrap(), out);
}

/// Decides the PUTs to `path`: the first gets `first`, later ones `rest`;
/// every other request passes.
fn on_puts_to(faulty: &Arc<FaultStore>, path: String, first: Action, rest: Action) {
    let fired = Arc::new(AtomicUsize::new(0));
    faulty.set_hook(move |op| {
        if op.kind != OpKind::Put || op.path != path {
            Action::Pass
        } else if fired.fetch_add(1, Ordering::SeqCst) == 0 {
            first.clone()
        } else {
            rest.clone()
        }
    });
}

// Breaks if our own landed update (PUT succeeded, response lost, retry hit
// AlreadyExists) is mistaken for a peer's: that would re-apply the change at
// the next version (a duplicate) or report a false conflict.
#[tokio::test]
async fn own_landed_update_is_recognised_after_a_lost_response() {
    for (name, store, _dir) in backends() {
        let shard = ShardId::random();
        let faulty = FaultStore::new(store.clone());
        let m = manifests(faulty.clone(), shard);
        let c = m.claim(Some(&identity())).await.unwrap();
        on_puts_to(
            &faulty,
            m.layout().manifest_path(3).to_string(),
            Action::LandThenFail,
            Action::Pass,
        );
        let out = m.update(c.epoch, add_sstable(1)).await.unwrap();
        assert_eq!(out.version, 3, "{name}");
        assert_eq!(
            faulty.count(OpKind::Put, m.layout().manifest_path(3).as_ref()),
            2
        );
        let fresh = manifests(store.clone(), shard);
        assert_eq!(
            fresh.latest_version().await.unwrap(),
            3,
            "{name}: no duplicate version"
        );
        assert_eq!(
            fresh.load_latest().await.unwrap().unwrap().sstables.len(),
            1
        );
    }
}

// Breaks if a claim whose response was lost is either assumed won without
// proof, turned into a spurious loss, or "settled" by claiming again above
// its own landed write (an epoch war with itself).
#[tokio::test]
async fn claim_with_lost_response_is_proven_or_redone_never_assumed() {
    for (name, store, _dir) in backends() {
        let shard = ShardId::random();
        manifests(store.clone(), shard)
            .initialize_shard(&identity())
            .await
            .unwrap();
        let faulty = FaultStore::new(store.clone());
        let m = manifests(faulty.clone(), shard);
        on_puts_to(
            &faulty,
            m.layout().manifest_path(2).to_string(),
            Action::LandThenFail,
            Action::Pass,
        );
        let c = m.claim(None).await.unwrap();
        let latest = manifests(store.clone(), shard)
            .load_latest()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            latest.writer_epoch, c.epoch,
            "{name}: claimer holds the newest epoch"
        );
        assert_eq!(latest.version, c.manifest.version);
        manifests(store.clone(), shard)
            .check_fenced(c.epoch)
            .await
            .unwrap();

        // Retries exhausted after the PUT landed: the outcome is unknown.
        let shard = ShardId::random();
        manifests(store.clone(), shard)
            .initialize_shard(&identity())
            .await
            .unwrap();
        let faulty = FaultStore::new(store.clone());
        let m = manifests(faulty.clone(), shard);
        let v2 = m.layout().manifest_path(2).to_string();
        on_puts_to(&faulty, v2, Action::LandThenFail, Action::Fail);
        // The slot is read back: our token is there and no one claimed
        // since, so the claim is proven without bumping the epoch again.
        let c = m.claim(None).await.unwrap();
        assert_eq!(
            (c.epoch, c.manifest.version),
            (1, 2),
            "{name}: proven by its token"
        );
        assert_eq!(m.latest_version().await.unwrap(), 2, "{name}: no epoch war");
    }
}

// Breaks if a claimer that collides with a peer's claim from the same base
// (identical manifest content) takes the peer's win for its own. The token
// in a claim's bytes tells them apart, so this must be ClaimLost.
#[tokio::test]
async fn identical_peer_claim_is_a_lost_claim_not_a_win() {
    for (name, store, _dir) in backends() {
        let shard = ShardId::random();
        manifests(store.clone(), shard)
            .initialize_shard(&identity())
            .await
            .unwrap();
        let faulty = FaultStore::new(store.clone());
        let m = manifests(faulty.clone(), shard);
        // Our claim has read version 1; the peer claims while our PUT of
        // version 2 is held at a gate.
        let gate = Gate::new();
        let path = m.layout().manifest_path(2).to_string();
        let held = Action::Hold(gate.clone(), Box::new(Action::Pass));
        on_puts_to(&faulty, path, held, Action::Pass);
        let m = Arc::new(m);
        let ours = tokio::spawn({
            let m = m.clone();
            async move { m.claim(None).await }
        });
        gate.wait_arrived(1).await;
        let peer = manifests(store.clone(), shard).claim(None).await.unwrap();
        gate.open();
        let err = ours.await.unwrap().unwrap_err();
        assert_eq!(peer.epoch, 1, "{name}");
        match err {
            FencingError::ClaimLost {
                wanted_epoch,
                stored_epoch,
                ..
            } => {
                assert_eq!((wanted_epoch, stored_epoch), (1, 1), "{name}")
            }
            other => panic!("{name}: expected ClaimLost, got {other:?}"),
        }
        manifests(store.clone(), shard)
            .check_fenced(peer.epoch)
            .await
            .unwrap();
    }
}

// Breaks if seal does not fence the live writer, if a sealed shard accepts
// claims or writes, or if unseal does not make it claimable again.
#[tokio::test]
async fn seal_fences_and_refuses_claims_until_unsealed() {
    for (name, store, _dir) in backends() {
        let shard = ShardId::random();
        let writer = manifests(store.clone(), shard);
        let c = writer.claim(Some(&identity())).await.unwrap();
        let admin = manifests(store.clone(), shard);
        let sealed = admin.seal().await.unwrap();
        assert_eq!(sealed.status, ShardStatus::Sealed as i32);
        assert!(
            sealed.writer_epoch > c.epoch,
            "{name}: seal bumps the epoch"
        );
        assert_eq!(
            admin.seal().await.unwrap(),
            sealed,
            "{name}: seal is idempotent"
        );
        assert!(matches!(
            writer.check_fenced(c.epoch).await,
            Err(FencingError::Sealed { .. })
        ));
        assert!(matches!(
            writer.update(c.epoch, |_| Ok(())).await,
            Err(FencingError::Sealed { .. })
        ));
        assert!(matches!(
            admin.claim(None).await,
            Err(FencingError::Sealed { .. })
        ));
        let active = admin.unseal().await.unwrap();
        assert_eq!(active.status, ShardStatus::Active as i32);
        let c2 = admin.claim(None).await.unwrap();
        assert!(c2.epoch > sealed.writer_epoch, "{name}");
        // The old writer is still fenced after unseal.
        assert!(matches!(
            writer.check_fenced(c.epoch).await,
            Err(FencingError::Fenced { .. })
        ));
    }
}

// Breaks if a shard whose first versions were pruned can be created again
// (a second version 1 would give a second writer its own epoch 1), or if an
// instance that cached a pruned version stays stuck on it.
#[tokio::test]
async fn a_pruned_prefix_is_neither_recreated_nor_a_dead_end() {
    let (_, store, _dir) = backends().remove(0);
    let shard = ShardId::random();
    let owner = manifests(store.clone(), shard);
    let c = owner.claim(Some(&identity())).await.unwrap();
    for _ in 0..4 {
        owner.update(c.epoch, |_| Ok(())).await.unwrap();
    }
    let cached = manifests(store.clone(), shard);
    assert_eq!(cached.latest_version().await.unwrap(), 6);
    for v in 1..=5 {
        store
            .delete(&owner.layout().manifest_path(v))
            .await
            .unwrap();
    }
    store
        .delete(&owner.layout().version_hint_path())
        .await
        .unwrap();
    let other = manifests(store.clone(), shard);
    let found = other.initialize_shard(&identity()).await.unwrap();
    assert_eq!(found.version, 6);
    assert!(
        other.load_version(1).await.unwrap().is_none(),
        "version 1 recreated"
    );
    // Version 6 is still the latest for an instance that knew of it.
    owner.update(c.epoch, |_| Ok(())).await.unwrap();
    assert_eq!(cached.load_latest().await.unwrap().unwrap().version, 7);
}

// Breaks if a claim that collides with a seal reports a lost claim instead
// of the reason it can never win: the shard is sealed.
#[tokio::test]
async fn a_claim_colliding_with_a_seal_is_sealed() {
    let (_, store, _dir) = backends().remove(0);
    let shard = ShardId::random();
    manifests(store.clone(), shard)
        .claim(Some(&identity()))
        .await
        .unwrap();
    let faulty = FaultStore::new(store.clone());
    let m = Arc::new(manifests(faulty.clone(), shard));
    let gate = Gate::new();
    let path = m.layout().manifest_path(3).to_string();
    let held = Action::Hold(gate.clone(), Box::new(Action::Pass));
    on_puts_to(&faulty, path, held, Action::Pass);
    let claim = tokio::spawn({
        let m = m.clone();
        async move { m.claim(None).await }
    });
    gate.wait_arrived(1).await;
    manifests(store.clone(), shard).seal().await.unwrap();
    gate.open();
    assert!(matches!(
        claim.await.unwrap(),
        Err(FencingError::Sealed { .. })
    ));
}

// Breaks if a claimer whose PUT outcome is unknown claims again above a
// peer that took the slot meanwhile (an epoch war that fences the real
// winner): it must report ClaimLost.
#[tokio::test]
async fn unknown_outcome_claim_does_not_fence_the_real_winner() {
    let (_, store, _dir) = backends().remove(0);
    let shard = ShardId::random();
    manifests(store.clone(), shard)
        .initialize_shard(&identity())
        .await
        .unwrap();
    let faulty = FaultStore::new(store.clone());
    let m = Arc::new(manifests(faulty.clone(), shard));
    let gate = Gate::new();
    let v2 = m.layout().manifest_path(2).to_string();
    let held = Action::Hold(gate.clone(), Box::new(Action::Fail));
    on_puts_to(&faulty, v2, held, Action::Fail);
    let ours = tokio::spawn({
        let m = m.clone();
        async move { m.claim(None).await }
    });
    gate.wait_arrived(1).await;
    let peer = manifests(store.clone(), shard).claim(None).await.unwrap();
    gate.open();
    match ours.await.unwrap() {
        Err(FencingError::ClaimLost {
            wanted_epoch: 1,
            stored_epoch: 1,
            ..
        }) => {}
        other => panic!("expected ClaimLost, got {other:?}"),
    }
    manifests(store.clone(), shard)
        .check_fenced(peer.epoch)
        .await
        .unwrap();
}

/// Stores `m` as its version of `shard`, bypassing the protocol (a manifest
/// some other process, or corruption, left behind).
async fn put_raw_manifest(store: &Arc<dyn ObjectStore>, shard: ShardId, m: &ShardManifest) {
    use prost::Message;
    let path = manifests(store.clone(), shard)
        .layout()
        .manifest_path(m.version);
    store.put(&path, m.encode_to_vec().into()).await.unwrap();
}

fn raw_manifest(shard: ShardId, version: u64, writer_epoch: u64) -> ShardManifest {
    ShardManifest {
        shard_id: Some(shard.to_proto()),
        version,
        shard_spec_id: identity().spec_id,
        shard_field_entries: identity().entries(),
        writer_epoch,
        current_generation: 1,
        status: ShardStatus::Active as i32,
        ..Default::default()
    }
}

// Breaks if a counter at u64::MAX is incremented unchecked: the claim (or
// seal, or update) would panic on overflow, or wrap to 0 in a release
// build (an epoch going back to 0 un-fences every old writer; a version
// of 0 breaks discovery). It must be Corrupt, naming shard and field.
#[tokio::test]
async fn counters_at_u64_max_are_corrupt_never_wrapped() {
    for (name, store, _dir) in backends() {
        // writer_epoch = u64::MAX at version 1.
        let shard = ShardId::random();
        put_raw_manifest(&store, shard, &raw_manifest(shard, 1, u64::MAX)).await;
        let m = manifests(store.clone(), shard);
        let assert_corrupt = |what: &str, field: &str, r: Result<_, FencingError>| match r {
            Err(FencingError::Corrupt { reason, .. }) => {
                assert!(reason.contains(field), "{name} {what}: {reason}");
                assert!(
                    reason.contains(&shard.to_string()),
                    "{name} {what}: {reason}"
                );
            }
            other => panic!("{name} {what}: expected Corrupt, got {other:?}"),
        };
        assert_corrupt("claim", "writer_epoch", m.claim(None).await.map(|_| ()));
        assert_corrupt("seal", "writer_epoch", m.seal().await.map(|_| ()));
        assert_eq!(
            m.latest_version().await.unwrap(),
            1,
            "{name}: nothing written"
        );

        // version = u64::MAX (found by LIST: probing from 1 finds nothing).
        let shard = ShardId::random();
        put_raw_manifest(&store, shard, &raw_manifest(shard, u64::MAX, 1)).await;
        let m = manifests(store.clone(), shard);
        assert_eq!(m.latest_version().await.unwrap(), u64::MAX, "{name}");
        let assert_corrupt = |what: &str, r: Result<_, FencingError>| match r {
            Err(FencingError::Corrupt { reason, .. }) => {
                assert!(reason.contains("`version`"), "{name} {what}: {reason}");
                assert!(
                    reason.contains(&shard.to_string()),
                    "{name} {what}: {reason}"
                );
            }
            other => panic!("{name} {what}: expected Corrupt, got {other:?}"),
        };
        assert_corrupt("claim", m.claim(None).await.map(|_| ()));
        assert_corrupt("update", m.update(1, |_| Ok(())).await.map(|_| ()));
        assert_corrupt("seal", m.seal().await.map(|_| ()));
    }
}

// Breaks if a store's definite refusal of the claim's PUT (403, or a 400
// object_store reports as `Generic`) is reported as an unknown outcome (a
// caller would have to assume the claim may have fenced the old writer)
// or retried as transient. The claim failed and wrote nothing.
#[tokio::test]
async fn a_refused_claim_is_a_definite_error() {
    let refusals = [
        InjectError::new(|| permission_denied("table/_mem_wal")),
        InjectError::new(|| http_status_error(400, "Bad Request")),
    ];
    for refusal in refusals {
        let (name, store, _dir) = backends().remove(1);
        let shard = ShardId::random();
        manifests(store.clone(), shard)
            .initialize_shard(&identity())
            .await
            .unwrap();
        let faulty = FaultStore::new(store.clone());
        let m = manifests(faulty.clone(), shard);
        let v2 = m.layout().manifest_path(2).to_string();
        on_puts_to(
            &faulty,
            v2.clone(),
            Action::FailWith(refusal.clone()),
            Action::FailWith(refusal),
        );
        let err = m.claim(None).await.unwrap_err();
        assert!(
            matches!(err, FencingError::Storage(StoreError::Request { .. })),
            "{name}: expected a refusal, got {err:?}"
        );
        assert!(!err.is_outcome_unknown(), "{name}");
        assert_eq!(faulty.count(OpKind::Put, &v2), 1, "{name}: sent once");
        assert_eq!(
            manifests(store.clone(), shard)
                .latest_version()
                .await
                .unwrap(),
            1,
            "{name}"
        );
    }
}
