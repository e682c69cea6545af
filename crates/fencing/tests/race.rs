//! Many claimers on one shard, on a shared local store.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use std::collections::BTreeMap;

use memwal_fencing::{FencingError, ManifestStore, ShardId, ShardIdentity};
use memwal_store::{open_store, Path, RetryPolicy};

const TASKS: u64 = 8;
const CLAIMS_PER_TASK: u64 = 200;

// Breaks if two claimers can both believe they won the same epoch, if an
// epoch is skipped or reused, if a version gap appears, or if a loser gets
// anything but a typed ClaimLost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claims_have_exactly_one_winner_per_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path().to_str().unwrap()).unwrap().store;
    let shard = ShardId::random();
    let root = Path::from("table");
    ManifestStore::new(store.clone(), &root, shard, RetryPolicy::default())
        .initialize_shard(&ShardIdentity::manual())
        .await
        .unwrap();

    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let store = store.clone();
            let root = root.clone();
            tokio::spawn(async move {
                // Each task is its own process as far as caching goes.
                let m = ManifestStore::new(store, &root, shard, RetryPolicy::default());
                let mut wins = Vec::new();
                let mut losses = 0u64;
                for _ in 0..CLAIMS_PER_TASK {
                    match m.claim(None).await {
                        Ok(c) => wins.push((c.epoch, c.manifest.version, t)),
                        Err(FencingError::ClaimLost {
                            wanted_epoch,
                            stored_epoch,
                            ..
                        }) => {
                            assert!(stored_epoch >= wanted_epoch);
                            losses += 1;
                        }
                        Err(other) => panic!("untyped loss: {other:?}"),
                    }
                }
                (wins, losses)
            })
        })
        .collect();

    let mut winners: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut total_losses = 0;
    for t in tasks {
        let (wins, losses) = t.await.unwrap();
        total_losses += losses;
        for (epoch, version, task) in wins {
            assert!(
                winners.insert(epoch, (version, task)).is_none(),
                "epoch {epoch} has two winners"
            );
        }
    }
    assert_eq!(winners.len() as u64 + total_losses, TASKS * CLAIMS_PER_TASK);
    assert!(
        total_losses > 0,
        "8 racing tasks never collided: the race test raced nothing"
    );

    let m = ManifestStore::new(store.clone(), &root, shard, RetryPolicy::default());
    let latest = m.load_latest().await.unwrap().unwrap();
    // Only claims wrote after version 1, so version v holds epoch v - 1; every
    // version exists and every epoch 1..=latest has exactly one winner.
    assert_eq!(latest.writer_epoch, latest.version - 1);
    assert_eq!(
        winners.keys().copied().collect::<Vec<_>>(),
        (1..=latest.writer_epoch).collect::<Vec<_>>()
    );
    for v in 1..=latest.version {
        let m_v = m
            .load_version(v)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("gap at {v}"));
        assert_eq!(m_v.writer_epoch, v - 1);
        if v > 1 {
            assert_eq!(
                winners[&(v - 1)].0,
                v,
                "winner of epoch {} wrote version {v}",
                v - 1
            );
        }
    }
}
