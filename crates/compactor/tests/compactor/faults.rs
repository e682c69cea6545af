//! Compaction stopped part-way: a rerun loses nothing and duplicates
//! nothing.

use memwal_table::TableSharding;
use memwal_testkit::{Action, InjectError, OpKind};

use crate::support::*;

/// Makes every write of a lance manifest under the base table's
/// `_versions/` from the `n`-th (0-based) on fail without landing (a
/// compactor that stopped after `n` commits); the earlier ones pass.
fn fail_base_commit(f: &Fixture, n: usize) {
    let seen = std::sync::atomic::AtomicUsize::new(0);
    let prefix = format!("{}/", f.plain.child("_versions"));
    let prefix = prefix.trim_start_matches('/').to_string();
    f.fault.set_hook(move |op| {
        let manifest = op.kind == OpKind::Put
            && op.path.starts_with(&prefix)
            && op.path.ends_with(".manifest");
        if manifest && seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= n {
            return Action::FailWith(InjectError::new(|| {
                memwal_testkit::permission_denied("_versions")
            }));
        }
        Action::Pass
    });
}

// Breaks if the marker rides on the delete pass (a crash before the upsert
// would then skip the generation's live rows), or if a rerun after the
// delete pass duplicates or loses rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_between_the_passes_is_completed_by_the_rerun() {
    let f = Fixture::new(true, TableSharding::Unsharded).await;
    let w = f.writer(None).await;
    let mut model = Model::new();
    put(&w, &mut model, &(0..10).collect::<Vec<_>>(), "a").await;
    w.flush().await.unwrap();
    f.compactor_grouping(1)
        .run_once()
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    // Generation 2: deletes and upserts (two passes).
    delete(&w, &mut model, &[1, 2]).await;
    put(&w, &mut model, &[3, 20], "b").await;
    w.flush().await.unwrap();

    // The delete pass commits, the upsert pass's commit fails.
    fail_base_commit(&f, 1);
    let r = f.compactor_grouping(1).run_once().await.unwrap().remove(0);
    assert!(r.is_err(), "the failed upsert commit is reported: {r:?}");
    f.fault.clear_hook();
    let (base, _) = f.base_rows().await;
    assert!(
        !base.contains_key(&1) && base.get(&3).map(String::as_str) == Some("a-3"),
        "precondition: deletes applied, upserts not: {base:?}"
    );
    assert_model(&f.view_rows().await, &model, "view between the passes");

    let r = f
        .compactor_grouping(1)
        .run_once()
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!((r.compacted_before, r.compacted_after), (1, 2), "{r:?}");
    assert_model(&f.base_rows().await, &model, "base after the rerun");
    assert_model(&f.view_rows().await, &model, "view after the rerun");
    w.close().await.unwrap();
}

// Breaks if a generation whose commit failed is recorded anyway, or a
// later generation is merged past a failed one (one generation per commit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_generation_stops_the_shard_in_order() {
    let f = Fixture::new(true, TableSharding::Unsharded).await;
    let w = f.writer(None).await;
    let mut model = Model::new();
    let ids: Vec<i64> = (0..12).collect();
    three_generations(&w, &mut model, &ids, "a").await;
    // Generation 1 is puts only (one commit); fail generation 2's first.
    fail_base_commit(&f, 1);
    let r = f.compactor_grouping(1).run_once().await.unwrap().remove(0);
    assert!(r.is_err(), "{r:?}");
    f.fault.clear_hook();
    let view = memwal_table::table_view(&f.plain, None, &Default::default())
        .await
        .unwrap();
    assert_eq!(
        view.compacted.values().copied().collect::<Vec<_>>(),
        vec![1]
    );
    assert_model(&f.view_rows().await, &model, "view after the failure");
    let r = f
        .compactor_grouping(1)
        .run_once()
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!((r.compacted_before, r.compacted_after), (1, 3), "{r:?}");
    assert_model(&f.base_rows().await, &model, "base after the rerun");
    w.close().await.unwrap();
}

// Breaks if a group of generations (a key deleted in one and put again in
// the next, another put then deleted) is resolved wrongly across them, or a
// stop between the group's passes loses or duplicates rows on the rerun.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grouped_commit_stopped_between_passes_is_completed_by_the_rerun() {
    let f = Fixture::new(true, TableSharding::Unsharded).await;
    let w = f.writer(None).await;
    let mut model = Model::new();
    put(&w, &mut model, &(0..10).collect::<Vec<_>>(), "a").await;
    w.flush().await.unwrap();
    delete(&w, &mut model, &[1, 2]).await;
    put(&w, &mut model, &[11], "b").await;
    w.flush().await.unwrap();
    put(&w, &mut model, &[1], "c").await;
    delete(&w, &mut model, &[11, 3]).await;
    w.flush().await.unwrap();

    // Generations 1-3 go in one group: the delete pass commits, the upsert
    // pass fails.
    fail_base_commit(&f, 1);
    let r = f.compactor().run_once().await.unwrap().remove(0);
    assert!(r.is_err(), "{r:?}");
    f.fault.clear_hook();
    assert_model(&f.view_rows().await, &model, "view between the passes");
    let r = f.compactor().run_once().await.unwrap().remove(0).unwrap();
    assert_eq!(
        (r.merged.clone(), r.commits),
        (vec![1, 2, 3], 2),
        "one group: {r:?}"
    );
    assert_model(&f.base_rows().await, &model, "base after the rerun");
    w.close().await.unwrap();
}
