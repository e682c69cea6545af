//! Group commit, generation and schema barriers, entry size bound.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use memwal_store::Path;
use memwal_testkit::{Action, FaultStore, Gate, OpKind};
use memwal_wal::{WalConfig, WalError, WalLocation};

use crate::common::*;

/// Holds the first WAL PUT made after this call at the returned gate.
fn hold_first_put(fs: &FaultStore, prefix: String) -> Gate {
    let gate = Gate::new();
    let g = gate.clone();
    let first = AtomicBool::new(true);
    fs.set_hook(move |op| {
        if op.kind == OpKind::Put
            && op.path.starts_with(&prefix)
            && first.swap(false, Ordering::SeqCst)
        {
            Action::Hold(g.clone(), Box::new(Action::Pass))
        } else {
            Action::Pass
        }
    });
    gate
}

/// Yields until `n` appends are queued; fails (instead of hanging) when
/// they are not within a minute of real time (a paused clock would not
/// move in a yield loop).
#[allow(clippy::disallowed_types)]
async fn wait_queued(wal: &memwal_wal::WalAppender, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while wal.queued() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "gave up waiting for {n} queued appends ({} queued)",
            wal.queued()
        );
        tokio::task::yield_now().await;
    }
}

/// 64 appends made while a PUT is held open go out together once it
/// completes, each acknowledged at the entry holding its rows. Breaks if
/// the appender issues one PUT per append, lets a second PUT start while
/// one is in flight, or hands out positions/batch ranges that do not
/// match the entry's contents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_made_during_a_held_put_share_few_entries() {
    let inner = memory();
    let root = Path::from("t");
    let shard = shard();
    let fs = faulty(&inner);
    let w = open_writer(fs.clone(), &root, shard, WalConfig::default())
        .await
        .unwrap();
    let prefix = wal_prefix(&root, shard);
    let gate = hold_first_put(&fs, prefix.clone());
    let first = w.wal.submit(vec![rows(&[-1])]).unwrap();
    gate.wait_arrived(1).await;
    let puts_before = fs.count(OpKind::Put, &prefix);
    let tasks: Vec<_> = (0..64i64)
        .map(|i| {
            let wal = w.wal.clone();
            tokio::spawn(async move {
                let ids = vec![i, 100 + i];
                let batches = vec![rows(&ids[..1]), rows(&ids[1..])];
                (ids, wal.append(batches).await.unwrap())
            })
        })
        .collect();
    wait_queued(&w.wal, 64).await;
    assert_eq!(
        fs.count(OpKind::Put, &prefix),
        puts_before,
        "no second PUT while one is in flight"
    );
    gate.open();
    let mut acks = vec![(vec![-1], first.await.unwrap())];
    for t in tasks {
        acks.push(t.await.unwrap());
    }
    let puts = fs.count(OpKind::Put, &prefix) - puts_before;
    assert!(puts <= 3, "64 concurrent appends took {puts} PUTs");
    assert_eq!(acks[0].1.position, 2);
    assert!(acks[1..]
        .iter()
        .all(|(_, a)| a.position >= 3 && a.position < 3 + puts as u64));
    let next = open_writer(inner.clone(), &root, shard, WalConfig::default())
        .await
        .unwrap();
    assert_acks_replayed_once(&acks, &next.replayed);
}

/// An append on an idle appender costs exactly one request: one PUT (no
/// HEAD, no GET, no LIST, no timer). Breaks if the durable path probes,
/// reads back, or re-checks the manifest on success.
#[tokio::test]
async fn a_lone_append_is_exactly_one_put() {
    let inner = memory();
    let root = Path::from("t");
    let shard = shard();
    let fs = faulty(&inner);
    let w = open_writer(fs.clone(), &root, shard, WalConfig::default())
        .await
        .unwrap();
    for i in 0..3 {
        let before = fs.ops().len();
        let puts = fs.count(OpKind::Put, &wal_prefix(&root, shard));
        w.wal.append(vec![rows(&[i])]).await.unwrap();
        assert_eq!(fs.count(OpKind::Put, &wal_prefix(&root, shard)), puts + 1);
        assert_eq!(fs.ops().len(), before + 1, "{:?}", &fs.ops()[before..]);
    }
}

/// Appends queued on both sides of generation switches never share an
/// entry, each generation is one run of positions, and each switch reports
/// the last position before it. Breaks if grouping ignores the barrier
/// (one entry would hold all three generations) or the switch resolves
/// before earlier appends are durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generation_switch_is_a_barrier() {
    let inner = memory();
    let root = Path::from("t");
    let shard = shard();
    let fs = faulty(&inner);
    let w = open_writer(fs.clone(), &root, shard, WalConfig::default())
        .await
        .unwrap();
    let gate = hold_first_put(&fs, wal_prefix(&root, shard));
    let t0 = w.wal.submit(vec![rows(&[0])]).unwrap();
    gate.wait_arrived(1).await;
    let mut tickets = Vec::new();
    let mut switches = Vec::new();
    for (g, ids) in [(1u64, [1, 2, 3]), (2, [4, 5, 6]), (3, [7, 8, 9])] {
        if g > 1 {
            switches.push(w.wal.switch_generation(g).unwrap());
        }
        for id in ids {
            tickets.push((g, id, w.wal.submit(vec![rows(&[id])]).unwrap()));
        }
    }
    assert!(matches!(
        w.wal.switch_generation(3),
        Err(WalError::InvalidInput { .. })
    ));
    assert_eq!(w.wal.generation(), 3);
    gate.open();
    assert_eq!(t0.await.unwrap().position, 2);
    for (g, _id, t) in tickets {
        let ack = t.await.unwrap();
        assert_eq!(ack.generation, g);
        assert_eq!(
            ack.position,
            2 + g,
            "generation {g} is one entry after the held one"
        );
    }
    let s2 = switches.remove(0).await.unwrap();
    let s3 = switches.remove(0).await.unwrap();
    assert_eq!(
        (s2.previous_generation, s2.generation, s2.last_position),
        (1, 2, 3)
    );
    assert_eq!(
        (s3.previous_generation, s3.generation, s3.last_position),
        (2, 3, 4)
    );
    let entries = read_all(&WalLocation::of(&w.manifests)).await;
    let gens: Vec<_> = entries.values().map(|e| e.generation).collect();
    assert_eq!(gens, vec![None, Some(1), Some(1), Some(2), Some(3)]);
}

/// Concurrent appenders and a task switching generations: every append's
/// rows sit in an entry of the generation it was submitted under, and
/// generations never go back along positions. Breaks if a switch lets
/// appends of two generations share an entry, or if an append is stamped
/// with a generation other than the one in force when it was enqueued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_with_switches_never_mix_generations() {
    let inner = memory();
    let root = Path::from("t");
    let shard = shard();
    let w = open_writer(inner.clone(), &root, shard, WalConfig::default())
        .await
        .unwrap();
    // Appenders read the generation and submit under a read lock; the
    // switcher switches under the write lock, so each append knows its
    // generation exactly.
    let lock = Arc::new(parking_lot::RwLock::new(()));
    let appenders: Vec<_> = (0..4i64)
        .map(|t| {
            let (wal, lock) = (w.wal.clone(), lock.clone());
            tokio::spawn(async move {
                let mut acks = Vec::new();
                for i in 0..40 {
                    let ids = vec![t * 1000 + i];
                    let (g, ticket) = {
                        let _r = lock.read();
                        (wal.generation(), wal.submit(vec![rows(&ids)]).unwrap())
                    };
                    let ack = ticket.await.unwrap();
                    assert_eq!(ack.generation, g);
                    acks.push((ids, ack));
                }
                acks
            })
        })
        .collect();
    let switcher = {
        let (wal, lock) = (w.wal.clone(), lock.clone());
        tokio::spawn(async move {
            let mut out = Vec::new();
            for g in 2..=6 {
                for _ in 0..10 {
                    tokio::task::yield_now().await;
                }
                let ticket = {
                    let _w = lock.write();
                    wal.switch_generation(g).unwrap()
                };
                out.push(ticket.await.unwrap());
            }
            out
        })
    };
    let mut acks = Vec::new();
    for a in appenders {
        acks.extend(a.await.unwrap());
    }
    let switches = switcher.await.unwrap();
    let entries = read_all(&WalLocation::of(&w.manifests)).await;
    for s in &switches {
        for (p, e) in &entries {
            if let Some(g) = e.generation {
                assert_eq!(
                    *p <= s.last_position,
                    g <= s.previous_generation,
                    "entry {p} vs {s:?}"
                );
            }
        }
    }
    let next = open_writer(inner.clone(), &root, shard, WalConfig::default())
        .await
        .unwrap();
    assert_acks_replayed_once(&acks, &next.replayed);
}

/// Appends with different schemas never share an entry (an IPC stream has
/// one schema), while same-schema neighbours still group. Breaks if
/// grouping ignores schemas (the entry would not encode or would garble
/// columns) or splits more than needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_change_is_a_barrier() {
    let inner = memory();
    let root = Path::from("t");
    let shard = shard();
    let fs = faulty(&inner);
    let w = open_writer(fs.clone(), &root, shard, WalConfig::default())
        .await
        .unwrap();
    let other = |v: i64| {
        let s = Arc::new(Schema::new(vec![Field::new(
            "other",
            DataType::Int64,
            false,
        )]));
        RecordBatch::try_new(s, vec![Arc::new(Int64Array::from(vec![v]))]).unwrap()
    };
    let gate = hold_first_put(&fs, wal_prefix(&root, shard));
    let t0 = w.wal.submit(vec![rows(&[0])]).unwrap();
    gate.wait_arrived(1).await;
    let ts = [
        w.wal.submit(vec![rows(&[1])]).unwrap(),
        w.wal.submit(vec![rows(&[2])]).unwrap(),
        w.wal.submit(vec![other(3)]).unwrap(),
        w.wal.submit(vec![other(4)]).unwrap(),
        w.wal.submit(vec![rows(&[5])]).unwrap(),
    ];
    gate.open();
    t0.await.unwrap();
    let mut positions = Vec::new();
    for t in ts {
        positions.push(t.await.unwrap().position);
    }
    assert_eq!(positions, vec![3, 3, 4, 4, 5]);
}

/// `max_entry_bytes` bounds how many queued appends one entry takes; an
/// append larger than the bound still goes (alone). Breaks if the bound
/// is ignored or if an oversized append is refused or stuck.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_entry_bytes_bounds_groups() {
    let inner = memory();
    let root = Path::from("t");
    let shard = shard();
    let fs = faulty(&inner);
    let one = rows(&[1]).get_array_memory_size();
    let config = WalConfig {
        max_entry_bytes: 2 * one,
        ..WalConfig::default()
    };
    let w = open_writer(fs.clone(), &root, shard, config).await.unwrap();
    let gate = hold_first_put(&fs, wal_prefix(&root, shard));
    let t0 = w.wal.submit(vec![rows(&[0])]).unwrap();
    gate.wait_arrived(1).await;
    let ts: Vec<_> = (1..=5)
        .map(|i| w.wal.submit(vec![rows(&[i])]).unwrap())
        .collect();
    let big = w
        .wal
        .submit(vec![rows(&[6]), rows(&[7]), rows(&[8])])
        .unwrap();
    gate.open();
    t0.await.unwrap();
    let mut positions = Vec::new();
    for t in ts {
        positions.push(t.await.unwrap().position);
    }
    assert_eq!(positions, vec![3, 3, 4, 4, 5]);
    assert_eq!(big.await.unwrap().position, 6);
}

/// An append arrow cannot encode poisons the appender: it fails saying the
/// entry could not be encoded, and the generation switch and the append
/// queued behind it fail too, as does every later call; nothing after it is
/// written. Breaks if the bad append fails alone and the appender goes on
/// (the writer holds its rows in memory: a later entry or a generation
/// switch that leads to publishing would follow rows never logged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unencodable_append_poisons_the_appender() {
    let inner = memory();
    let root = Path::from("t");
    let shard = shard();
    let fs = faulty(&inner);
    let w = open_writer(fs.clone(), &root, shard, WalConfig::default())
        .await
        .unwrap();
    let gate = hold_first_put(&fs, wal_prefix(&root, shard));
    let t0 = w.wal.submit(vec![rows(&[0])]).unwrap();
    gate.wait_arrived(1).await;
    // Queued behind the held PUT: the bad append, a switch, a good append.
    let bad = w.wal.submit(vec![unencodable()]).unwrap();
    let switch = w.wal.switch_generation(2).unwrap();
    let after = w.wal.submit(vec![rows(&[2])]).unwrap();
    gate.open();
    assert_eq!(t0.await.unwrap().position, 2);
    let err = bad.await.unwrap_err();
    assert!(
        matches!(err, WalError::Unencodable { position: 3, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("could not be encoded"), "{err}");
    assert!(!err.may_be_durable());
    let switched = switch.await.unwrap_err();
    assert!(
        matches!(switched, WalError::Unencodable { .. }),
        "{switched:?}"
    );
    let queued = after.await.unwrap_err();
    assert!(matches!(queued, WalError::Unencodable { .. }), "{queued:?}");
    assert!(matches!(
        w.wal.submit(vec![rows(&[3])]),
        Err(WalError::Unencodable { .. })
    ));
    assert!(matches!(
        w.wal.switch_generation(3),
        Err(WalError::Unencodable { .. })
    ));
    assert!(matches!(
        w.wal.close().await,
        Err(WalError::Unencodable { .. })
    ));
    let loc = WalLocation::of(&w.manifests);
    assert_eq!(
        assert_contiguous(&loc).await,
        2,
        "sentinel and entry 2 only"
    );
    assert_eq!(fs.count(OpKind::Put, loc.path(3).as_ref()), 0);
}

/// Producers that come back right after their entry is acknowledged share
/// the next entry again (regrouping), and a lone producer never waits.
/// Paused clock, every WAL PUT takes 10 ms. Breaks if the first returning
/// append is taken alone (the producers would split into a small and a
/// large entry), or if a lone producer's append waits for company.
#[tokio::test(start_paused = true)]
async fn producers_returning_after_an_ack_share_one_entry() {
    let inner = memory();
    let root = Path::from("t");
    let shard = shard();
    let fs = faulty(&inner);
    let w = open_writer(fs.clone(), &root, shard, WalConfig::default())
        .await
        .unwrap();
    let prefix = wal_prefix(&root, shard);
    fs.set_hook(move |op| {
        if op.kind == OpKind::Put && op.path.starts_with(&prefix) {
            Action::Delay(std::time::Duration::from_millis(10))
        } else {
            Action::Pass
        }
    });
    // Four producers in one entry.
    let tickets: Vec<_> = (0..4)
        .map(|i| w.wal.submit(vec![rows(&[i])]).unwrap())
        .collect();
    let mut first = Vec::new();
    for t in tickets {
        first.push(t.await.unwrap().position);
    }
    assert!(first.iter().all(|p| *p == first[0]), "{first:?}");
    // One comes back at once, the other three a moment later.
    let early = w.wal.submit(vec![rows(&[10])]).unwrap();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let late: Vec<_> = (11..14)
        .map(|i| w.wal.submit(vec![rows(&[i])]).unwrap())
        .collect();
    let mut second = vec![early.await.unwrap().position];
    for t in late {
        second.push(t.await.unwrap().position);
    }
    assert_eq!(
        second,
        vec![first[0] + 1; 4],
        "the four share the next entry"
    );
    // Alone now: one wait for company that does not come, then none.
    w.wal.append(vec![rows(&[20])]).await.unwrap();
    let t = tokio::time::Instant::now();
    w.wal.append(vec![rows(&[21])]).await.unwrap();
    assert_eq!(
        t.elapsed(),
        std::time::Duration::from_millis(10),
        "a lone producer's append costs its PUT only"
    );
}

/// The append counts readers go by: an append held in flight is submitted
/// but not durable; once its ticket resolves `Ok` it is counted durable
/// (counted before the ticket resolves, so a caller that saw the ack
/// always finds it counted); a failed append is never counted. Breaks if
/// the durable count runs ahead of the store's acknowledgement or behind
/// a ticket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_counts_follow_durability() {
    let inner = memory();
    let root = Path::from("t");
    let shard = shard();
    let fs = faulty(&inner);
    let w = open_writer(fs.clone(), &root, shard, WalConfig::default())
        .await
        .unwrap();
    let counts = w.wal.counts();
    assert_eq!((counts.submitted(), counts.durable()), (0, 0));
    let prefix = wal_prefix(&root, shard);
    let gate = hold_first_put(&fs, prefix.clone());
    let first = w.wal.submit(vec![rows(&[1])]).unwrap();
    gate.wait_arrived(1).await;
    let second = w.wal.submit(vec![rows(&[2])]).unwrap();
    assert_eq!((counts.submitted(), counts.durable()), (2, 0));
    assert_eq!(counts.pending(), 2);
    gate.open();
    first.await.unwrap();
    assert!(counts.durable() >= 1, "an acked append is counted");
    second.await.unwrap();
    assert_eq!((counts.submitted(), counts.durable()), (2, 2));

    // A refused write: submitted, never durable.
    fs.set_hook(move |op| {
        if op.kind == OpKind::Put && op.path.starts_with(&prefix) {
            Action::FailWith(memwal_testkit::InjectError::new(|| {
                memwal_testkit::permission_denied("wal")
            }))
        } else {
            Action::Pass
        }
    });
    w.wal.submit(vec![rows(&[3])]).unwrap().await.unwrap_err();
    assert_eq!((counts.submitted(), counts.durable()), (3, 2));
    assert_eq!(counts.pending(), 1);
}
