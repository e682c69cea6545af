//! Base maintenance: the base table keeps few fragments and few deleted
//! rows however many merge commits land, without losing, duplicating or
//! resurrecting a row, and without moving the compacted markers.

use memwal::{ShardWriterConfig, StoreLocation};
use memwal_compactor::{BaseHealth, Compactor, CompactorConfig, MaintenanceConfig};
use memwal_table::{compacted_generations, open_dataset, BaseTable, TableSharding};
use rand::{Rng, SeedableRng};

use crate::support::*;

/// Maintenance with a small target, so a test reaches every tier quickly.
fn maintaining(loc: StoreLocation) -> Compactor {
    Compactor::new(
        loc,
        CompactorConfig {
            maintenance: Some(MaintenanceConfig {
                target_rows_per_fragment: 512,
                tier_fanout: 4,
                ..MaintenanceConfig::default()
            }),
            ..CompactorConfig::default()
        },
    )
}

fn merging_only(loc: StoreLocation) -> Compactor {
    Compactor::new(
        loc,
        CompactorConfig {
            maintenance: None,
            ..CompactorConfig::default()
        },
    )
}

async fn health(f: &Fixture) -> BaseHealth {
    let lance = memwal_sstable::LanceStore::new(f.plain.store.clone());
    BaseHealth::of(&open_dataset(&lance, &f.plain).await.unwrap())
}

/// `rounds` rounds of random upserts of existing keys plus new keys (and
/// a few deletes), each flushed and compacted by `compactor`.
async fn churn(f: &Fixture, compactor: &Compactor, rounds: usize, seed: u64) -> Model {
    let w = f.writer(None).await;
    let mut model = Model::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let first: Vec<i64> = (0..400).collect();
    put(&w, &mut model, &first, "base").await;
    w.flush().await.unwrap();
    compactor.run_once().await.unwrap();
    let mut next = 400i64;
    for round in 0..rounds {
        let mut ids: Vec<i64> = (0..40).map(|_| rng.random_range(0..next)).collect();
        ids.extend(next..next + 10);
        next += 10;
        ids.sort_unstable();
        ids.dedup();
        put(&w, &mut model, &ids, &format!("r{round}")).await;
        let gone: Vec<i64> = (0..2).map(|_| rng.random_range(0..next)).collect();
        delete(&w, &mut model, &gone).await;
        w.flush().await.unwrap();
        for r in compactor.run_once().await.unwrap() {
            r.unwrap();
        }
        if let Some(Err(e)) = compactor.last_maintenance() {
            panic!("maintenance failed in round {round}: {e}");
        }
    }
    w.close().await.unwrap();
    model
}

// Breaks if nothing rewrites the base's small fragments or materializes
// its deletions (fragments and deleted rows then grow with every commit:
// the same run without maintenance is checked to grow), or if a rewrite
// loses, duplicates or resurrects a row, or moves a compacted marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_merge_commits_keep_the_base_small_and_its_deletions_materialized() {
    let rounds = 40;
    let f = Fixture::new(true, TableSharding::Unsharded).await;
    let model = churn(&f, &maintaining(f.loc()), rounds, 7).await;
    let kept = health(&f).await;
    assert_model(&f.base_rows().await, &model, "base with maintenance");
    assert_model(&f.view_rows().await, &model, "view with maintenance");
    // Fragments: at most fanout-1 per tier below the target, plus the
    // full-size ones.
    let full = (kept.live_rows as usize).div_ceil(512);
    assert!(
        kept.fragments <= full + 3 * 4,
        "{kept:?}: fragments not bounded"
    );
    assert!(
        kept.deleted_share() <= 0.1,
        "{kept:?}: deletions not materialized"
    );

    let g = Fixture::new(true, TableSharding::Unsharded).await;
    let same = churn(&g, &merging_only(g.loc()), rounds, 7).await;
    assert_eq!(same, model, "the same workload");
    let grown = health(&g).await;
    assert!(
        grown.fragments > 2 * kept.fragments && grown.deleted_rows > 2 * kept.deleted_rows,
        "without maintenance the base grows: {grown:?} vs {kept:?}"
    );

    // The markers are where the merges left them.
    let lance = memwal_sstable::LanceStore::new(f.plain.store.clone());
    let base = open_dataset(&lance, &f.plain).await.unwrap();
    let table = BaseTable::of_dataset(&base, &f.path).await.unwrap();
    let markers = compacted_generations(&f.path, table.mem_wal.as_ref()).unwrap();
    assert_eq!(
        markers.values().copied().collect::<Vec<_>>(),
        vec![rounds as u64 + 1],
        "every generation compacted, the marker kept by the rewrites"
    );
}

// Breaks if a maintenance rewrite and a merge commit racing on the same
// base lose or resurrect rows (a rewrite committed over deletions it did
// not see, or a merge re-executed onto a rewritten base).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_racing_merges_keeps_every_row_once() {
    let f = Fixture::new(true, TableSharding::Unsharded).await;
    let w = f.writer(None).await;
    let mut model = Model::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let (merger, maintainer) = (merging_only(f.loc()), maintaining(f.loc()));
    let first: Vec<i64> = (0..300).collect();
    put(&w, &mut model, &first, "base").await;
    w.flush().await.unwrap();
    merger.run_once().await.unwrap();
    let mut maintained = 0;
    for round in 0..24 {
        let ids: Vec<i64> = (0..60).map(|_| rng.random_range(0..300)).collect();
        let mut ids = ids;
        ids.sort_unstable();
        ids.dedup();
        put(&w, &mut model, &ids, &format!("r{round}")).await;
        delete(&w, &mut model, &[rng.random_range(0..300)]).await;
        w.flush().await.unwrap();
        let (merged, kept) = tokio::join!(merger.run_once(), maintainer.maintain_base());
        for r in merged.unwrap() {
            r.unwrap();
        }
        maintained += usize::from(kept.unwrap().committed);
    }
    for r in merger.run_once().await.unwrap() {
        r.unwrap();
    }
    assert!(maintained > 0, "no rewrite committed: the race was not run");
    assert_model(&f.base_rows().await, &model, "base after racing");
    assert_model(&f.view_rows().await, &model, "view after racing");
    w.close().await.unwrap();
}

// Breaks if puts are not refused once the shard's uncompacted SSTables
// reach `stall_stop_sstables` (reads would then merge an unbounded
// backlog), if the refusal does not name the setting, or if the stall does
// not end once the compactor catches up (without anything published).
#[tokio::test(flavor = "current_thread")]
async fn puts_stall_while_compaction_is_behind_and_resume_after_it_catches_up() {
    let f = Fixture::new(true, TableSharding::Unsharded).await;
    let config = ShardWriterConfig {
        max_unflushed_age: None,
        stall_slowdown_sstables: 2,
        stall_stop_sstables: 4,
        stall_max_delay: std::time::Duration::from_millis(1),
        ..ShardWriterConfig::default()
    };
    let w = memwal::ShardWriter::open(f.loc(), memwal::ShardId::random(), config)
        .await
        .unwrap();
    let mut model = Model::new();
    for g in 0..4i64 {
        put(&w, &mut model, &[g], "a").await;
        w.flush().await.unwrap();
    }
    assert_eq!(w.stats().pending_sstables, 4);
    assert!(w.stats().stalled_puts >= 2, "{:?}", w.stats());
    let e = w.put(&rows(&[99], "x")).await.unwrap_err();
    assert!(
        matches!(&e, memwal::Error::Backpressure { reason } if reason.contains("stall_stop_sstables = 4")),
        "{e}"
    );
    assert!(w.stall().unwrap().starts_with("stopped"), "{:?}", w.stall());

    f.compactor().run_once().await.unwrap();
    // The stalled writer reads the base's progress again once the refresh
    // interval has passed (the clock moved on instead of a sleep), and
    // takes puts again with nothing published meanwhile.
    tokio::time::pause();
    tokio::time::advance(std::time::Duration::from_secs(1)).await;
    tokio::time::resume();
    put(&w, &mut model, &[99], "x").await;
    assert_eq!(w.stats().pending_sstables, 0);
    assert_eq!(w.stats().refused_puts, 1);
    w.flush().await.unwrap();
    assert_model(&f.view_rows().await, &model, "view after the stall");
    w.close().await.unwrap();
}
