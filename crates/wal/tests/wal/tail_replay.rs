//! Tail discovery and the replay reader, on hand-built WALs.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_ipc::writer::StreamWriter;
use arrow_schema::Schema;
use bytes::Bytes;
use futures::StreamExt;
use memwal_fencing::{ShardId, ShardLayout};
use memwal_store::{create_object, ObjectStore, Path, RetryPolicy};
use memwal_testkit::{Action, FaultStore, OpKind};
use memwal_wal::{
    codec, find_tail, replay, ReplayEntry, ReplayRange, WalError, WalLocation, WalResult,
};
use object_store::ObjectStoreExt;

use crate::common::*;

fn location(store: Arc<dyn ObjectStore>) -> WalLocation {
    WalLocation::new(
        store,
        ShardLayout::new(&Path::from("t"), ShardId::random()),
        RetryPolicy::immediate(3),
    )
}

fn at(loc: &WalLocation, store: Arc<dyn ObjectStore>) -> WalLocation {
    WalLocation::new(store, loc.layout().clone(), loc.retry().clone())
}

async fn put_bytes(loc: &WalLocation, position: u64, bytes: Bytes) {
    create_object(
        loc.store().as_ref(),
        &loc.path(position),
        bytes,
        loc.retry(),
    )
    .await
    .unwrap();
}

async fn put_data(loc: &WalLocation, position: u64, epoch: u64, generation: Option<u64>) {
    let bytes = codec::encode_entry(epoch, generation, &[rows(&[position as i64])]).unwrap();
    put_bytes(loc, position, bytes).await;
}

async fn delete(loc: &WalLocation, positions: std::ops::RangeInclusive<u64>) {
    for p in positions {
        loc.store().delete(&loc.path(p)).await.unwrap();
    }
}

/// Positions replayed when the replay ends cleanly (panics on an error).
async fn clean(loc: &WalLocation, range: ReplayRange) -> Vec<u64> {
    let (positions, err) = collect(loc, range).await;
    assert!(err.is_none(), "{err:?}");
    positions
}

async fn collect(loc: &WalLocation, range: ReplayRange) -> (Vec<u64>, Option<WalError>) {
    let items: Vec<WalResult<ReplayEntry>> = replay(loc.clone(), range, 3).collect().await;
    let mut positions = Vec::new();
    let mut err = None;
    for (i, item) in items.iter().enumerate() {
        match item {
            Ok(e) => {
                assert_eq!(
                    ids_in(&e.batches),
                    vec![e.position as i64],
                    "rows of {}",
                    e.position
                );
                positions.push(e.position);
            }
            Err(e) => {
                assert_eq!(i, items.len() - 1, "nothing after an error");
                err = Some(e.clone());
            }
        }
    }
    (positions, err)
}

fn range(after: u64, until: u64, min_generation: u64, epoch: u64) -> ReplayRange {
    ReplayRange {
        after,
        until,
        min_generation,
        epoch,
    }
}

/// The tail is found whatever the hint. Breaks if probing trusts a stale
/// hint, stops at a hint past the tail, or misses the tail of an empty WAL.
#[tokio::test]
async fn find_tail_is_exact_for_any_hint() {
    let loc = location(memory());
    for floor in [0, 7] {
        assert_eq!(find_tail(&loc, floor, 0).await.unwrap(), floor, "empty WAL");
        assert_eq!(
            find_tail(&loc, floor, 40).await.unwrap(),
            floor,
            "empty WAL, hint past it"
        );
    }
    for p in 1..=20 {
        put_data(&loc, p, 1, Some(1)).await;
    }
    for hint in [0, 1, 5, 19, 20, 21, 33, 1 << 40, u64::MAX] {
        assert_eq!(find_tail(&loc, 0, hint).await.unwrap(), 20, "hint {hint}");
    }
}

/// With a GC'd prefix: nothing at or below the floor is ever probed, and
/// the tail is still found when the floor is stale (older than the GC),
/// through the LIST fallback. The LIST is not used when probing can decide.
/// Breaks if probing starts below the floor (the failing hook would turn
/// it into an error), if a missing floor + 1 is taken for an empty WAL, or
/// if every lookup LISTs.
#[tokio::test]
async fn find_tail_respects_the_gc_floor() {
    let inner = memory();
    let loc = location(inner.clone());
    for p in 1..=20 {
        put_data(&loc, p, 1, Some(1)).await;
    }
    delete(&loc, 1..=10).await;
    let fs = FaultStore::new(inner.clone());
    let below: Vec<String> = (1..=10).map(|p| loc.path(p).to_string()).collect();
    fs.set_hook(move |op| {
        if below.contains(&op.path) {
            Action::Fail
        } else {
            Action::Pass
        }
    });
    let floored = at(&loc, fs.clone());
    for hint in [0, 3, 10, 11, 15, 20, 21, 50] {
        assert_eq!(
            find_tail(&floored, 10, hint).await.unwrap(),
            20,
            "floor 10, hint {hint}"
        );
    }
    fs.clear_hook();
    let lists = fs.count(OpKind::List, "");
    assert_eq!(find_tail(&floored, 10, 20).await.unwrap(), 20);
    assert_eq!(find_tail(&floored, 10, 12).await.unwrap(), 20);
    assert_eq!(
        fs.count(OpKind::List, ""),
        lists,
        "no LIST when probing decides"
    );
    // A stale floor (0) below a GC'd prefix.
    for hint in [0, 4, 12, 30] {
        assert_eq!(
            find_tail(&floored, 0, hint).await.unwrap(),
            20,
            "stale floor, hint {hint}"
        );
    }
    // Everything up to the floor deleted, nothing after: the tail is the floor.
    delete(&loc, 11..=20).await;
    assert_eq!(find_tail(&floored, 20, 5).await.unwrap(), 20);
}

/// A failing HEAD or LIST is an error, never "missing". Breaks if a read
/// error ends the probe (the sentinel would land inside the WAL's body).
#[tokio::test]
async fn find_tail_read_errors_are_errors() {
    let inner = memory();
    let loc = location(inner.clone());
    for p in 1..=3 {
        put_data(&loc, p, 1, Some(1)).await;
    }
    // Galloping from 0 probes 1, 3, 7: make the probe of 3 fail.
    let fs = FaultStore::new(inner.clone());
    let p3 = loc.path(3).to_string();
    fs.set_hook(move |op| {
        if op.path == p3 {
            Action::Fail
        } else {
            Action::Pass
        }
    });
    let err = find_tail(&at(&loc, fs.clone()), 0, 0).await.unwrap_err();
    assert!(matches!(err, WalError::Storage(_)), "{err}");
    // An empty WAL is confirmed by LIST; a failing LIST is an error too.
    let empty = location(inner.clone());
    let fs = FaultStore::new(inner);
    fs.set_hook(|op| {
        if op.kind == OpKind::List {
            Action::Fail
        } else {
            Action::Pass
        }
    });
    let err = find_tail(&at(&empty, fs.clone()), 0, 0).await.unwrap_err();
    assert!(matches!(err, WalError::Storage(_)), "{err}");
}

/// Replay covers exactly after+1 .. sentinel, skipping sentinels and
/// published generations, and a missing position is a Gap. Breaks if
/// replay reads past the sentinel (a successor's entries), stops at the
/// first missing position silently, replays already-published rows, or
/// starts below the cursor.
#[tokio::test]
async fn replay_stops_at_the_sentinel_and_reports_gaps() {
    let loc = location(memory());
    put_data(&loc, 1, 1, Some(1)).await;
    put_data(&loc, 2, 1, Some(1)).await;
    put_bytes(&loc, 3, codec::encode_sentinel(1)).await;
    put_data(&loc, 4, 1, Some(2)).await;
    put_data(&loc, 5, 1, Some(2)).await;
    put_bytes(&loc, 6, codec::encode_sentinel(2)).await; // the reader's sentinel
    put_data(&loc, 7, 2, Some(2)).await; // after it: the reader's own appends

    assert_eq!(clean(&loc, range(0, 6, 1, 2)).await, vec![1, 2, 4, 5]);
    assert_eq!(clean(&loc, range(1, 6, 1, 2)).await, vec![2, 4, 5]);
    // Generation 1 is published: its entries are skipped even past the cursor.
    assert_eq!(clean(&loc, range(0, 6, 2, 2)).await, vec![4, 5]);
    assert_eq!(clean(&loc, range(5, 6, 1, 2)).await, Vec::<u64>::new());

    delete(&loc, 4..=4).await;
    let (positions, err) = collect(&loc, range(0, 6, 1, 2)).await;
    assert_eq!(positions, vec![1, 2]);
    assert!(
        matches!(err, Some(WalError::Gap { position: 4, .. })),
        "{err:?}"
    );
}

/// An entry (data or sentinel) from a newer epoch aborts replay. Breaks if
/// sentinels are skipped before their epoch is checked, or if newer data
/// is replayed as ours.
#[tokio::test]
async fn replay_aborts_on_a_newer_epoch() {
    let loc = location(memory());
    put_data(&loc, 1, 1, Some(1)).await;
    put_bytes(&loc, 2, codec::encode_sentinel(3)).await;
    put_data(&loc, 3, 3, Some(1)).await;
    let (positions, err) = collect(&loc, range(0, 4, 1, 2)).await;
    assert_eq!(positions, vec![1]);
    assert!(
        matches!(
            err,
            Some(WalError::Fenced {
                local_epoch: 2,
                stored_epoch: 3,
                ..
            })
        ),
        "{err:?}"
    );
    let (_, err) = collect(&loc, range(2, 4, 1, 2)).await;
    assert!(matches!(err, Some(WalError::Fenced { .. })), "{err:?}");
}

/// Corrupt, truncated and backwards-generation entries are typed Corrupt
/// errors naming shard, position and path; a read failure is a Storage
/// error, not a Gap. Breaks if any of them is skipped or read as the end.
#[tokio::test]
async fn corrupt_entries_and_read_errors_are_typed() {
    let inner = memory();
    let loc = location(inner.clone());
    put_data(&loc, 1, 1, Some(1)).await;
    let good = codec::encode_entry(1, Some(1), &[rows(&[2])]).unwrap();
    put_bytes(&loc, 2, good.slice(..good.len() - 8)).await; // EOS marker cut off
    put_bytes(&loc, 3, Bytes::from_static(b"not arrow at all")).await;
    let (positions, err) = collect(&loc, range(0, 4, 1, 1)).await;
    assert_eq!(positions, vec![1]);
    match err {
        Some(WalError::Corrupt {
            shard,
            position: 2,
            path,
            ..
        }) => {
            assert_eq!(shard, loc.shard());
            assert_eq!(path, loc.path(2).to_string());
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        loc.read_entry(3).await,
        Err(WalError::Corrupt { position: 3, .. })
    ));

    let loc = location(inner.clone());
    put_data(&loc, 1, 1, Some(2)).await;
    put_data(&loc, 2, 1, Some(1)).await;
    let (_, err) = collect(&loc, range(0, 3, 1, 1)).await;
    assert!(
        matches!(err, Some(WalError::Corrupt { position: 2, .. })),
        "{err:?}"
    );

    let loc = location(inner.clone());
    put_data(&loc, 1, 1, Some(1)).await;
    put_data(&loc, 2, 1, Some(1)).await;
    let fs = FaultStore::new(inner.clone());
    let p2 = loc.path(2).to_string();
    fs.set_hook(move |op| {
        if op.path == p2 {
            Action::Fail
        } else {
            Action::Pass
        }
    });
    let (positions, err) = collect(&at(&loc, fs), range(0, 3, 1, 1)).await;
    assert_eq!(positions, vec![1]);
    assert!(matches!(err, Some(WalError::Storage(_))), "{err:?}");
}

/// Upstream's shapes replay: its sentinel (empty schema, metadata
/// `writer_epoch` + `fence_sentinel` only) is skipped and its WAL-only
/// entries (no generation, extra keys) are yielded with generation None.
/// Breaks if decoding insists on our own optional keys.
#[tokio::test]
async fn upstream_shaped_entries_replay() {
    let loc = location(memory());
    let meta = HashMap::from([
        ("writer_epoch".to_string(), "1".to_string()),
        ("fence_sentinel".to_string(), "true".to_string()),
    ]);
    let mut w = StreamWriter::try_new(
        Vec::new(),
        &Schema::new_with_metadata(Vec::<arrow_schema::Field>::new(), meta),
    )
    .unwrap();
    w.finish().unwrap();
    put_bytes(&loc, 1, Bytes::from(w.into_inner().unwrap())).await;
    put_data(&loc, 2, 1, None).await;
    let items: Vec<_> = replay(loc.clone(), range(0, 3, 5, 1), 2).collect().await;
    assert_eq!(items.len(), 1);
    let e = items[0].as_ref().unwrap();
    assert_eq!((e.position, e.epoch, e.generation), (2, 1, None));
}

/// A foreign (upstream-written) WAL-only entry whose only batch has 0 rows
/// decodes and is skipped as an entry without rows; an entry holding a
/// 0-row batch next to real rows is yielded with its rows. Breaks if a
/// 0-row batch fails to decode or replay, or if an entry with no rows is
/// yielded as if it carried data.
#[tokio::test]
async fn upstream_entries_with_zero_row_batches_replay() {
    let loc = location(memory());
    let foreign = |batches: &[arrow_array::RecordBatch]| {
        let mut meta = HashMap::from([
            ("writer_epoch".to_string(), "1".to_string()),
            ("mem_wal_target_generation".to_string(), "4".to_string()),
        ]);
        meta.extend(schema().metadata().clone());
        let s = Schema::new_with_metadata(schema().fields().clone(), meta);
        let mut w = StreamWriter::try_new(Vec::new(), &s).unwrap();
        for b in batches {
            w.write(b).unwrap();
        }
        w.finish().unwrap();
        Bytes::from(w.into_inner().unwrap())
    };
    let empty = foreign(&[rows(&[])]);
    let decoded = codec::decode_entry(&empty).unwrap();
    assert_eq!(decoded.batches.len(), 1);
    assert_eq!((decoded.num_rows(), decoded.is_sentinel), (0, false));
    put_bytes(&loc, 1, empty).await;
    put_bytes(&loc, 2, foreign(&[rows(&[]), rows(&[2])])).await;
    put_data(&loc, 3, 1, None).await;
    assert_eq!(clean(&loc, range(0, 4, 1, 1)).await, vec![2, 3]);
}
