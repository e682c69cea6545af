//! The chaos run's cluster mode: three `memwal serve --cluster` members
//! over one table and a real etcd; a client writes known values through a
//! random member (parts of other members' shards forwarded) while members
//! are SIGKILLed and replaced (their shards failed over), paused past
//! their lease and resumed (zombies, fenced by the members that claimed
//! their shards), and etcd is restarted. At the end a plain daemon claims
//! every shard, replays and flushes; the reader view must agree with
//! every acknowledgement (the invariants of `memwal_testkit::invariants`).
//! The members run their compactors and GC (one compacts the table at a
//! time, and that one moves with the events).
//!
//! The same checks run against members with a scripted forwarding bug
//! (`broken::forward_ack_unsent`), which they must catch.

use super::*;
use memwal_testkit::EtcdServer;
use std::time::Duration;

// Breaks if a member loses a write it acknowledged (its own or one it
// forwarded) across a kill, a failover, a handover, a zombie's resumption
// or an etcd restart; applies a refused one; or duplicates a row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(memwal_etcd_tests),
    ignore = "needs etcd (apt-get install etcd-server)"
)]
async fn a_cluster_under_kills_pauses_and_etcd_restarts_loses_nothing_acknowledged() {
    let rounds: u64 = std::env::var("MEMWAL_CHAOS_CLUSTER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let seed: u64 = std::env::var("MEMWAL_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    let replay = format!(
        "MEMWAL_CHAOS_SEED={seed} MEMWAL_CHAOS_CLUSTER_ROUNDS={rounds} cargo test -p memwal-cli \
         --test chaos a_cluster_under"
    );
    eprintln!("chaos (cluster): seed {seed}, {rounds} rounds (replay: {replay})");
    let (acked, errors) = run(rounds, seed, true, &[]).await;
    assert!(
        acked > 0,
        "no write was acknowledged: the run proved nothing ({replay})"
    );
    assert_held(&errors, &replay);
}

// Breaks if the cluster run's checks miss a member that acknowledges the
// parts it should forward without sending them: writes go through each
// member in turn, so some parts are forwarded whatever the placement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(memwal_etcd_tests),
    ignore = "needs etcd (apt-get install etcd-server)"
)]
async fn a_cluster_member_that_acks_unsent_parts_is_caught() {
    let broken = [("FAILPOINTS", "broken::forward_ack_unsent=return")];
    let (acked, errors) = run(3, rand::random(), false, &broken).await;
    assert!(acked > 0);
    assert!(
        errors.iter().any(|e| e.contains("invariant 1")),
        "the forwarding bug went unnoticed: {errors:?}"
    );
    eprintln!("broken: forward_ack_unsent: caught: {}", errors[0]);
}

/// A member with its compactor and GC on (a cycle a second, no grace): the
/// table's compactor moves with kills, pauses and joins, and compaction
/// and GC run under the events.
fn member(table: &str, etcd: &EtcdServer, env: &[(&str, &str)]) -> Daemon {
    cluster_member_full(table, &etcd.endpoint(), env, None, true)
}

/// One run: `rounds` of writes through a member (random, or each in turn
/// without `events`), with a random event after each when `events`; the
/// members started with `env`. Returns the writes acknowledged and the
/// violations found.
async fn run(rounds: u64, seed: u64, events: bool, env: &[(&str, &str)]) -> (usize, Vec<String>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut etcd = EtcdServer::start();
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let history = Arc::new(History::new());
    let flushes = Arc::new(AtomicU64::new(0));
    let mut started = 0u32;
    let mut members: Vec<(u32, Daemon)> = Vec::new();
    for _ in 0..3 {
        started += 1;
        members.push((started, member(&table, &etcd, env)));
    }
    let (mut kills, mut zombies, mut etcd_restarts) = (0, 0, 0);
    for round in 0..rounds {
        let pick = if events {
            rng.random_range(0..members.len())
        } else {
            round as usize % members.len()
        };
        let (writer, d) = &members[pick];
        let before = *history.acks.borrow();
        let client = tokio::spawn(client_run(
            d.flight.clone(),
            *writer,
            rng.random_range(10..40),
            rng.random(),
            history.clone(),
            flushes.clone(),
        ));
        acks_reach(&history, before + rng.random_range(1..8), &client).await;
        match if events { rng.random_range(0..4) } else { 3 } {
            0 => {
                let (_, d) = members.remove(rng.random_range(0..members.len()));
                kill(d);
                started += 1;
                members.push((started, member(&table, &etcd, env)));
                kills += 1;
            }
            1 => {
                // Past its 2 s lease: the others claim its shards.
                let (_, d) = &members[rng.random_range(0..members.len())];
                signal(d, "-STOP");
                tokio::time::sleep(Duration::from_secs(3)).await;
                signal(d, "-CONT");
                zombies += 1;
            }
            2 => {
                etcd.stop();
                tokio::time::sleep(Duration::from_millis(300)).await;
                etcd.start_again();
                etcd_restarts += 1;
            }
            _ => {}
        }
        let _ = tokio::time::timeout(Duration::from_secs(60), client).await;
    }
    for (_, d) in members {
        kill(d);
    }
    // What the members' compactor merged into the base under the events
    // (shown: compaction ran, and moved with its member).
    let (ok, out, err) = memwal(&["inspect", &table, "--json"]);
    assert!(ok, "{err}");
    let inspected: serde_json::Value = serde_json::from_str(&out).unwrap();
    let compacted: u64 = inspected["shards"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["compacted_generation"].as_u64())
        .sum();
    // Every shard claimed by one daemon, its WAL replayed, everything
    // flushed on SIGTERM.
    let last = Daemon::start(&table, &[]);
    signal(&last, "-TERM");
    let mut last = last;
    assert!(
        last.child.wait().unwrap().success(),
        "the last daemon failed"
    );

    let ops = history.ops.lock().unwrap().clone();
    let count = |o: Outcome| ops.iter().filter(|op| op.outcome == o).count();
    let mut errors = violations(&view_rows(&table).await, &ops, "reader view");
    errors.extend(sstable_duplicates(&table).await);
    eprintln!(
        "chaos (cluster): {rounds} rounds, {kills} kills, {zombies} zombies, {etcd_restarts} etcd \
         restarts, {started} members, {compacted} generations compacted by the members; {} writes \
         ({} acked, {} unknown, {} refused); invariants {}",
        ops.len(),
        count(Outcome::Acked),
        count(Outcome::Unknown),
        count(Outcome::Refused),
        if errors.is_empty() {
            "held"
        } else {
            "VIOLATED"
        }
    );
    (count(Outcome::Acked), errors)
}
