//! Garbage collection: what is deleted, and that nothing a reader or
//! writer can still use is.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use memwal_compactor::{collect_garbage, GcConfig, GcReport};
use memwal_store::RetryPolicy;
use memwal_table::{table_view, TableSharding};
use memwal_testkit::{Action, Gate, OpKind};
use object_store::{ObjectStoreExt, PutPayload};
use rand::{Rng, SeedableRng};

use crate::support::*;

fn now_config() -> GcConfig {
    GcConfig {
        grace: Duration::ZERO,
        keep_manifest_versions: 2,
        base_retention: Some(Duration::ZERO),
        ..GcConfig::default()
    }
}

async fn gc(f: &Fixture, config: &GcConfig) -> GcReport {
    let mut r = collect_garbage(&f.plain, config).await.expect("gc");
    assert_eq!(r.len(), 1, "one shard");
    r.remove(0).expect("gc of the shard")
}

/// Objects under `_mem_wal/` (what GC reports on; base cleanup is lance's).
async fn object_count(f: &Fixture) -> usize {
    use futures::TryStreamExt;
    let dir = f.plain.child("_mem_wal");
    let all: Vec<_> = f.plain.store.list(Some(&dir)).try_collect().await.unwrap();
    all.len()
}

// Breaks if compacted SSTables, flushed WAL entries or old manifests are
// kept forever, if anything still reachable is deleted (the views and a
// reopened writer would then differ from the model), or if a dry run
// deletes anything or reports something else than the real run does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_reclaims_what_is_compacted_and_flushed_and_nothing_else() {
    let f = Fixture::new(true, TableSharding::Unsharded).await;
    let w = f.writer(None).await;
    let shard = w.shard();
    let mut model = Model::new();
    let ids: Vec<i64> = (0..12).collect();
    three_generations(&w, &mut model, &ids, "a").await;
    f.compactor().run_once().await.unwrap().remove(0).unwrap();
    put(&w, &mut model, &[40, 41], "g4").await; // gen 4 publish drops 1-3
    w.flush().await.unwrap();
    put(&w, &mut model, &[42], "wal-only").await;

    let sstable_dirs: Vec<std::path::PathBuf> = (1..=3)
        .map(|g| {
            let shard_dir = std::path::Path::new(&f.path)
                .join("_mem_wal")
                .join(shard.to_string());
            std::fs::read_dir(&shard_dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| p.to_string_lossy().ends_with(&format!("_gen_{g}")))
                .unwrap_or_else(|| panic!("no directory of generation {g} in {shard_dir:?}"))
        })
        .collect();
    let before = object_count(&f).await;
    let dry = gc(
        &f,
        &GcConfig {
            dry_run: true,
            ..now_config()
        },
    )
    .await;
    assert_eq!(object_count(&f).await, before, "a dry run deletes nothing");
    let r = gc(&f, &now_config()).await;
    assert_eq!(r, dry, "the dry run reports what the real run deletes");
    assert_eq!(r.sstables.len(), 3, "{r:?}");
    assert!(r.abandoned.is_empty(), "{r:?}");
    assert!(!r.wal_entries.is_empty(), "{r:?}");
    assert_eq!(
        r.wal_run_starts.first(),
        Some(&1),
        "the first entry is kept: {r:?}"
    );
    assert!(!r.manifest_versions.is_empty(), "{r:?}");
    assert_eq!(object_count(&f).await, before - r.objects as usize);
    // A local store keeps no empty directory of a collected SSTable.
    for d in &sstable_dirs {
        assert!(!d.exists(), "{d:?} left behind");
    }

    assert_model(
        &f.base_rows().await,
        &model.clone().into_iter().filter(|(k, _)| *k < 40).collect(),
        "base after gc",
    );
    // A second run finds nothing more.
    let again = gc(&f, &now_config()).await;
    assert!(
        again.sstables.is_empty() && again.wal_entries.is_empty(),
        "{again:?}"
    );
    // The wal-only row reaches the view once flushed.
    w.flush().await.unwrap();
    assert_model(&f.view_rows().await, &model, "view after gc");
    // A writer that reopens replays what is left correctly.
    put(&w, &mut model, &[43], "unflushed").await;
    w.abort();
    let w2 = f.open(shard, None).await;
    w2.flush().await.unwrap();
    assert_model(&f.view_rows().await, &model, "view after reopening past gc");
    put(&w2, &mut model, &[44], "after").await;
    w2.close().await.unwrap();
    assert_model(
        &f.view_rows().await,
        &model,
        "view after the reopened writer closed",
    );
}

// Breaks if GC deletes an SSTable a reader holding an older snapshot still
// lists before the grace period has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_of_an_old_snapshot_still_reads_within_the_grace_period() {
    let f = Fixture::new(true, TableSharding::Unsharded).await;
    let w = f.writer(None).await;
    let mut model = Model::new();
    three_generations(&w, &mut model, &(0..12).collect::<Vec<_>>(), "a").await;
    let old_view = table_view(&f.plain, None, &RetryPolicy::default())
        .await
        .unwrap();
    let old_model = model.clone();
    f.compactor().run_once().await.unwrap().remove(0).unwrap();
    put(&w, &mut model, &[40], "g4").await;
    w.flush().await.unwrap();

    let r = gc(
        &f,
        &GcConfig {
            base_retention: Some(Duration::ZERO),
            ..GcConfig::default()
        },
    )
    .await;
    assert!(r.sstables.is_empty(), "within the grace period: {r:?}");
    assert_model(
        &f.read_view(&old_view).await,
        &old_model,
        "the old snapshot",
    );
    // Once the grace period is over they go (so the rule above is what
    // protected the reader).
    let r = gc(&f, &now_config()).await;
    assert_eq!(r.sstables.len(), 3, "{r:?}");
    assert_model(&f.view_rows().await, &model, "the current view");
    w.close().await.unwrap();
}

// Breaks if GC deletes the slot a fenced writer's held WAL PUT targets (the
// run start of the epoch that fenced it): the PUT would then land and the
// fenced writer would acknowledge a write no replay will ever see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_writer_resumed_after_gc_stays_fenced() {
    let f = Fixture::new(true, TableSharding::Unsharded).await;
    let w1 = f.writer(None).await;
    let shard = w1.shard();
    let mut model = Model::new();
    put(&w1, &mut model, &[1, 2], "w1").await;
    w1.flush().await.unwrap();
    put(&w1, &mut model, &[3], "w1b").await;

    // Hold w1's next WAL PUT.
    let gate = Gate::new();
    let armed = Arc::new(AtomicBool::new(true));
    {
        let (gate, armed) = (gate.clone(), armed.clone());
        let wal_dir = format!("_mem_wal/{shard}/wal/");
        f.fault.set_hook(move |op| {
            if op.kind == OpKind::Put
                && op.path.contains(&wal_dir)
                && armed.swap(false, Ordering::SeqCst)
            {
                return Action::Hold(gate.clone(), Box::new(Action::Pass));
            }
            Action::Pass
        });
    }
    let held = w1.put_nowait(&rows(&[99], "zombie")).await.unwrap();
    gate.wait_arrived(1).await;

    // A new writer takes over, writes and flushes past the held slot.
    let w2 = f.open(shard, None).await;
    put(&w2, &mut model, &[4, 5], "w2").await;
    w2.flush().await.unwrap();
    put(&w2, &mut model, &[6], "w2b").await;
    w2.flush().await.unwrap();
    let r = gc(&f, &now_config()).await;
    assert!(
        !r.wal_entries.is_empty(),
        "gc deleted flushed entries: {r:?}"
    );
    assert!(
        r.wal_run_starts.len() >= 2,
        "each epoch's first slot kept: {r:?}"
    );

    gate.open();
    let outcome = held.await;
    assert!(
        matches!(outcome, Err(memwal::Error::Fenced { .. })),
        "the fenced writer must not acknowledge: {outcome:?}"
    );
    assert_model(
        &f.view_rows().await,
        &model,
        "view without the zombie's row",
    );
    w2.close().await.unwrap();
}

// Breaks if GC deletes a flush directory that may still be in flight (at or
// above current_generation) or keeps an abandoned one forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_flush_directories_below_the_current_generation_go() {
    let f = Fixture::new(true, TableSharding::Unsharded).await;
    let w = f.writer(None).await;
    let shard = w.shard();
    let mut model = Model::new();
    put(&w, &mut model, &[1], "a").await;
    w.flush().await.unwrap();
    put(&w, &mut model, &[2], "b").await;
    w.flush().await.unwrap();
    let current = w.manifest().current_generation;
    for (name, generation) in [("0badf00d", 1), ("0badf00e", current)] {
        let path = f.plain.child(&format!(
            "_mem_wal/{shard}/{name}_gen_{generation}/data/x.lance"
        ));
        f.plain
            .store
            .put(&path, PutPayload::from_static(b"junk"))
            .await
            .unwrap();
    }
    let r = gc(&f, &now_config()).await;
    assert_eq!(r.abandoned, vec!["0badf00d_gen_1".to_string()], "{r:?}");
    assert_model(&f.view_rows().await, &model, "view");
    w.close().await.unwrap();
}

// Breaks if any interleaving of writes, flushes, compactions, collections
// and writer restarts loses, resurrects or duplicates a row (nothing
// reachable is deleted). Prints the seed on failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_interleavings_keep_the_views_equal_to_the_model() {
    let seeds: Vec<u64> = match std::env::var("MEMWAL_GC_SEED") {
        Ok(s) => vec![s.parse().expect("MEMWAL_GC_SEED is a number")],
        Err(_) => vec![1, 2, 3],
    };
    for seed in seeds {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let f = Fixture::new(true, TableSharding::Unsharded).await;
        let mut w = f.writer(None).await;
        let shard = w.shard();
        let mut model = Model::new();
        let mut n = 0;
        for step in 0..30 {
            let what = format!("seed {seed} step {step} (rerun: MEMWAL_GC_SEED={seed})");
            match rng.random_range(0..10) {
                0..=3 => {
                    let ids: Vec<i64> = (0..rng.random_range(1..4))
                        .map(|_| rng.random_range(0..20))
                        .collect();
                    let mut ids = ids;
                    ids.sort();
                    ids.dedup();
                    n += 1;
                    put(&w, &mut model, &ids, &format!("s{step}n{n}")).await;
                }
                4 => {
                    let id = rng.random_range(0..20);
                    delete(&w, &mut model, &[id]).await;
                }
                5 | 6 => w.flush().await.unwrap(),
                7 => {
                    f.compactor().run_once().await.unwrap().remove(0).unwrap();
                }
                8 => {
                    gc(&f, &now_config()).await;
                }
                _ => {
                    if rng.random_bool(0.5) {
                        w.close().await.unwrap();
                    } else {
                        w.abort();
                    }
                    w = f.open(shard, None).await;
                }
            }
            if !model.is_empty() {
                w.flush().await.unwrap();
                assert_model(&f.view_rows().await, &model, &what);
            }
        }
        w.close().await.unwrap();
    }
}

// Breaks if the background task does not end a cycle with GC when given a
// GC configuration (flushed WAL entries must be gone after its first cycle,
// the base holding the rows), or collects garbage when given none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_task_collects_garbage_after_compacting() {
    use futures::TryStreamExt;
    let f = Fixture::new(true, TableSharding::Unsharded).await;
    let w = f.writer(None).await;
    let mut model = Model::new();
    put(&w, &mut model, &[1, 2], "a").await;
    w.flush().await.unwrap();
    put(&w, &mut model, &[3], "b").await;
    w.flush().await.unwrap();
    let wal_dir = f.plain.child(&format!("_mem_wal/{}/wal", w.shard()));
    let wal_entries = || async {
        let all: Vec<_> = f
            .plain
            .store
            .list(Some(&wal_dir))
            .try_collect()
            .await
            .unwrap();
        all.len()
    };
    let before = wal_entries().await;
    let every = Duration::from_secs(3600);

    let task = memwal_compactor::CompactorTask::spawn(f.compactor(), every);
    task.cycles().wait_for(|c| *c >= 1).await.unwrap();
    task.stop().await;
    assert_eq!(wal_entries().await, before, "no GC was asked for");

    let task =
        memwal_compactor::CompactorTask::spawn_with_gc(f.compactor(), every, Some(now_config()));
    task.cycles().wait_for(|c| *c >= 1).await.unwrap();
    task.stop().await;
    assert!(
        wal_entries().await < before,
        "flushed WAL entries collected"
    );
    assert_model(&f.base_rows().await, &model, "base");
    w.close().await.unwrap();
}

// Breaks if GC reads WAL entries that are too young to delete (each was
// read again on every cycle of its grace period, and compaction waited
// behind those reads), or stops reading the ones it may delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_does_not_read_wal_entries_too_young_to_delete() {
    let f = Fixture::new(true, TableSharding::Unsharded).await;
    let w = f.writer(None).await;
    let mut model = Model::new();
    three_generations(&w, &mut model, &(0..12).collect::<Vec<_>>(), "a").await;
    let wal_gets = || {
        f.fault
            .ops()
            .iter()
            .filter(|op| op.kind == OpKind::Get && op.path.contains("/wal/"))
            .count()
    };
    let young = GcConfig {
        grace: Duration::from_secs(3600),
        ..GcConfig::default()
    };
    for _ in 0..3 {
        let r = collect_garbage(&f.loc(), &young).await.unwrap();
        let r = r.into_iter().next().unwrap().unwrap();
        assert!(r.wal_entries.is_empty(), "{r:?}");
    }
    assert_eq!(wal_gets(), 0, "young WAL entries were read");
    // Past the grace period they are read (for their epochs) and go.
    let r = collect_garbage(&f.loc(), &now_config()).await.unwrap();
    let r = r.into_iter().next().unwrap().unwrap();
    assert!(!r.wal_entries.is_empty(), "{r:?}");
    assert!(wal_gets() > 0);
    w.close().await.unwrap();
}

// Breaks if the staged files a crashed local write leaves (`{object}#{n}`:
// hidden from LIST, so the object rules never see them) are kept forever,
// if a young one (a write in flight) is removed, if a dry run removes any,
// or if removing a second link a crash left between link and unlink takes
// the object with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_removes_staged_files_a_crash_left() {
    let f = Fixture::new(true, TableSharding::Unsharded).await;
    let w = f.writer(None).await;
    let mut model = Model::new();
    three_generations(&w, &mut model, &(0..12).collect::<Vec<_>>(), "a").await;
    let layout = memwal_fencing::ShardLayout::new(&f.plain.root, w.shard());
    let on_disk = |p: &object_store::path::Path| std::path::Path::new(&f.path).join(p.as_ref());
    let wal_dir = on_disk(&layout.wal_dir());
    let manifest = on_disk(&layout.version_hint_path())
        .parent()
        .unwrap()
        .to_path_buf();
    let latest = std::fs::read_dir(&manifest)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "binpb"))
        .unwrap();
    let old = std::time::SystemTime::now() - Duration::from_secs(7200);
    let age = |p: &std::path::Path, t| {
        std::fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(t)
            .unwrap()
    };
    // A staged copy of an entry that never got linked (old), one of a
    // write in flight (young), and a second link to a manifest.
    let stale =
        wal_dir.join("0000000000000000000000000000000000000000000000000000000000000111.arrow#1");
    std::fs::write(&stale, b"staged").unwrap();
    age(&stale, old);
    let young =
        wal_dir.join("0000000000000000000000000000000000000000000000000000000000000111.arrow#2");
    std::fs::write(&young, b"staged").unwrap();
    let link = latest.with_file_name(format!(
        "{}#1",
        latest.file_name().unwrap().to_string_lossy()
    ));
    std::fs::hard_link(&latest, &link).unwrap();
    age(&link, old);
    let config = GcConfig {
        grace: Duration::from_secs(3600),
        ..GcConfig::default()
    };

    let dry = collect_garbage(
        &f.loc(),
        &GcConfig {
            dry_run: true,
            ..config.clone()
        },
    )
    .await
    .unwrap()
    .remove(0)
    .unwrap();
    assert_eq!(dry.staged.len(), 2, "{dry:?}");
    assert!(stale.exists() && link.exists(), "a dry run removes nothing");
    let r = collect_garbage(&f.loc(), &config)
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(
        r.staged, dry.staged,
        "the dry run reports what the run removes"
    );
    assert!(!stale.exists(), "the stale staged file stayed");
    assert!(!link.exists(), "the second link stayed");
    assert!(
        young.exists(),
        "a young staged file (a write in flight) went"
    );
    assert!(latest.exists(), "the manifest went with its second link");
    w.close().await.unwrap();
    assert_model(&f.view_rows().await, &model, "the view after GC");
}

// Breaks if GC keeps every producer checkpoint forever, or deletes the one
// a claimer reads (the newest of a published generation): the reopened
// writer would then write a retried sequence again (key 1 back to "p1").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_keeps_only_the_newest_published_producer_checkpoint() {
    let f = Fixture::new(true, TableSharding::Unsharded).await;
    let w = f.writer(None).await;
    let shard = w.shard();
    let producer = |s| memwal::ProducerSeq::new("p", 1, s);
    for s in 1..=3u64 {
        let tag = format!("p{s}");
        w.put_idempotent(&rows(&[1], &tag), &producer(s))
            .await
            .unwrap();
        w.flush().await.unwrap();
    }
    w.close().await.unwrap();
    let r = gc(&f, &now_config()).await;
    assert_eq!(r.producer_checkpoints, vec![1, 2], "{r:?}");
    let again = gc(&f, &now_config()).await;
    assert!(again.producer_checkpoints.is_empty(), "{again:?}");
    let w = f.open(shard, None).await;
    let retried = w
        .put_idempotent(&rows(&[1], "p1"), &producer(1))
        .await
        .unwrap();
    assert!(
        retried.duplicate,
        "the kept checkpoint still knows sequence 1"
    );
    assert_eq!(w.producer_state("p"), Some((1, 3)));
    w.close().await.unwrap();
}
