//! Process chaos: `memwal serve` daemons SIGKILLed at random moments while a
//! client writes known values, sometimes paused instead (SIGSTOP, a
//! successor takes over, then SIGCONT: a zombie), with `memwal compact` and
//! `memwal gc --grace 0` run in between, a third of the daemons and half of
//! those runs armed with a random crash point (`memwal_store::crash_point`,
//! `FAILPOINTS`) that aborts the process there. At the end the reader view (base +
//! SSTables through upstream's `LsmScanner`), and the base after a final
//! compaction, must agree with every acknowledgement: the four invariants
//! of `memwal_testkit::invariants` (acknowledged writes visible with the
//! newest value, no duplicates or unsent values, unknown outcomes at most
//! once and never older than an ack, refused writes absent and a zombie's
//! acks durable).
//!
//! Reads run during the run too: through the daemon being written (while
//! its client writes), through a daemon just restarted, and through a
//! zombie once it resumed (after its successor flushed). Each must show a
//! state the history allows (`memwal_testkit::reads`: every write
//! acknowledged before it began, nothing refused, nothing older).
//!
//! Each invariant's check is also run against a daemon deliberately broken
//! in a way only that check catches (`memwal_store::broken`):
//! `each_broken_daemon_is_caught`.
//!
//! `MEMWAL_CHAOS_KILLS` sets the number of kill iterations (default 200),
//! `MEMWAL_CHAOS_SEED` replays a run; a failure prints both.

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::RecordBatch;
use arrow_flight::FlightClient;
use futures::TryStreamExt;
use lance::dataset::mem_wal::LsmScanner;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use common::*;
use memwal_testkit::invariants::{check, Op, Outcome, View, Violation};
use memwal_testkit::reads::{check_read, ReadWindow};

/// Keys written (over all four buckets).
const KEYS: i64 = 64;

#[derive(Default)]
struct Stats {
    iterations: u64,
    kills: u64,
    zombies: u64,
    zombie_acks: u64,
    compactions: u64,
    gcs: u64,
    flushes: u64,
}

/// Every operation issued, in issue order (`seq`).
struct History {
    seq: AtomicU64,
    ops: Mutex<Vec<Op>>,
    acks: tokio::sync::watch::Sender<u64>,
}

impl History {
    fn new() -> Self {
        Self {
            seq: AtomicU64::new(0),
            ops: Mutex::new(Vec::new()),
            acks: tokio::sync::watch::channel(0).0,
        }
    }

    fn record(&self, op: Op) {
        let acked = op.outcome == Outcome::Acked;
        self.ops.lock().unwrap().push(op);
        if acked {
            self.acks.send_modify(|a| *a += 1);
        }
    }
}

/// What a failed put's status says happened: the daemon's definite codes
/// mean nothing of the batch was written (the invariants then hold the
/// daemon to that: such a row must never show); every other code
/// (`UNAVAILABLE`, `INTERNAL`, `ABORTED`, a cut connection) leaves it
/// unknown.
fn classify(status: &tonic::Status) -> Outcome {
    use tonic::Code;
    match status.code() {
        Code::InvalidArgument
        | Code::NotFound
        | Code::FailedPrecondition
        | Code::ResourceExhausted => Outcome::Refused,
        _ => Outcome::Unknown,
    }
}

/// Issues up to `n` operations one at a time against daemon `daemon`,
/// ending early at the first failure (the daemon is gone or fenced).
async fn client_run(
    addr: String,
    daemon: u32,
    n: usize,
    seed: u64,
    history: Arc<History>,
    flushes: Arc<AtomicU64>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let Ok(channel) = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
    else {
        return;
    };
    let mut c = FlightClient::new(channel);
    for _ in 0..n {
        if rng.random_ratio(1, 12) {
            let r = c
                .do_action(arrow_flight::Action::new("flush", "t"))
                .await
                .map(|s| s.try_collect::<Vec<_>>());
            if let Ok(f) = r {
                if f.await.is_ok() {
                    flushes.fetch_add(1, Ordering::Relaxed);
                }
            }
            continue;
        }
        // One key, or (one time in four) several distinct keys: a batch
        // that usually spans shards, whose status must hold for all of it.
        let mut batch_keys = vec![rng.random_range(0..KEYS)];
        if rng.random_ratio(1, 4) {
            for _ in 0..rng.random_range(1..4) {
                let k = rng.random_range(0..KEYS);
                if !batch_keys.contains(&k) {
                    batch_keys.push(k);
                }
            }
        }
        let seqs: Vec<u64> = batch_keys
            .iter()
            .map(|_| history.seq.fetch_add(1, Ordering::SeqCst))
            .collect();
        let delete = rng.random_ratio(1, 5);
        let tag = format!("s{}", seqs[0]);
        let (path, batch) = if delete {
            (vec!["t", "delete"], keys(&batch_keys))
        } else {
            (vec!["t"], rows(&batch_keys, &tag))
        };
        let r = put(&mut c, &path, vec![batch]).await;
        // ABORTED (some parts durable) and every other code but the
        // definite ones: unknown for each key of the batch.
        let outcome = match &r {
            Ok(acks) if acks.len() == 1 => Outcome::Acked,
            Ok(acks) => panic!("one batch, {} acks: {acks:?}", acks.len()),
            Err(s) => classify(s),
        };
        for (&key, &seq) in batch_keys.iter().zip(&seqs) {
            history.record(Op {
                seq,
                key,
                value: (!delete).then(|| format!("{tag}-{key}")),
                outcome,
                writer: daemon,
            });
        }
        if r.is_err() {
            return;
        }
    }
}

/// A flush action through `d`; whether it succeeded (a daemon an armed
/// crash point ended does not).
async fn flush_through(d: &Daemon) -> bool {
    let Ok(channel) = tonic::transport::Channel::from_shared(format!("http://{}", d.flight))
        .unwrap()
        .connect()
        .await
    else {
        return false;
    };
    let mut c = FlightClient::new(channel);
    match c.do_action(arrow_flight::Action::new("flush", "t")).await {
        Ok(s) => s.try_collect::<Vec<_>>().await.is_ok(),
        Err(_) => false,
    }
}

fn signal(d: &Daemon, sig: &str) {
    let pid = d.child.id().to_string();
    assert!(Command::new("kill")
        .args([sig, &pid])
        .status()
        .unwrap()
        .success());
}

/// SIGKILL (unless it already ended); whether it had aborted at an armed
/// crash point instead.
fn kill(mut d: Daemon) -> bool {
    use std::os::unix::process::ExitStatusExt;
    let _ = d.child.kill();
    d.child.wait().unwrap().signal() == Some(6)
}

/// Crash points a daemon may be started with, and how they are armed
/// (`return` aborts the process; see memwal_store::crash_point).
const DAEMON_POINTS: [(&str, &str); 5] = [
    ("wal::before_put", "8%return"),
    ("wal::after_put", "8%return"),
    ("sstable::before_sidecars", "50%return"),
    ("writer::before_publish", "50%return"),
    ("writer::mid_replay", "return"),
];

/// Crash points of `memwal compact` and `memwal gc`.
const COMPACT_POINTS: [(&str, &str); 2] = [
    ("compactor::between_passes", "return"),
    ("compactor::after_commit", "50%return"),
];
const GC_POINT: (&str, &str) = ("gc::mid", "30%return");

/// Starts the next daemon, armed with a random crash point one time in
/// three; a daemon that aborts while opening (mid-replay) counts as a hit
/// and is started again unarmed.
fn start_daemon(
    table: &str,
    started: &mut u32,
    rng: &mut StdRng,
    hits: &mut BTreeMap<&'static str, u64>,
) -> (Daemon, Option<&'static str>) {
    *started += 1;
    if rng.random_ratio(1, 3) {
        let (point, action) = DAEMON_POINTS[rng.random_range(0..DAEMON_POINTS.len())];
        let armed = format!("{point}={action}");
        match Daemon::try_launch(table, &["--no-compactor"], &[("FAILPOINTS", &armed)]) {
            Ok(d) => return (d, Some(point)),
            Err(status) => {
                use std::os::unix::process::ExitStatusExt;
                assert_eq!(status.signal(), Some(6), "{point}: {status}");
                *hits.entry(point).or_default() += 1;
                *started += 1;
            }
        }
    }
    (Daemon::start(table, &[]), None)
}

/// Runs a `memwal` command, with a crash point armed; whether it aborted
/// there (otherwise it must succeed).
fn cli_armed(args: &[&str], point: Option<(&str, &str)>, replay: &str) -> bool {
    use std::os::unix::process::ExitStatusExt;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memwal"));
    cmd.args(args);
    if let Some((p, action)) = point {
        cmd.env("FAILPOINTS", format!("{p}={action}"));
    }
    let out = cmd.output().unwrap();
    if out.status.signal() == Some(6) && point.is_some() {
        return true;
    }
    assert!(
        out.status.success(),
        "memwal {args:?}: {} ({replay})",
        String::from_utf8_lossy(&out.stderr)
    );
    false
}

/// Waits until `n` acknowledgements were recorded or `client` ended.
async fn acks_reach(history: &History, n: u64, client: &tokio::task::JoinHandle<()>) {
    let mut acks = history.acks.subscribe();
    loop {
        if *acks.borrow_and_update() >= n || client.is_finished() {
            return;
        }
        tokio::select! {
            r = acks.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(std::time::Duration::from_millis(20)) => {}
        }
    }
}

/// The reader view: base plus every shard's SSTables above its compacted
/// generation, through upstream's `LsmScanner` (the base as the view
/// opened it, through memwal's store: local or S3 alike).
async fn view_rows(table: &str) -> View {
    let loc = memwal_store::open_store(table).unwrap();
    let view = memwal_table::table_view(&loc, None, &memwal_store::RetryPolicy::default())
        .await
        .unwrap();
    let snapshots = view.snapshots();
    let batch = LsmScanner::new(view.base.clone(), snapshots, vec!["id".to_string()])
        .try_into_batch()
        .await
        .unwrap();
    rows_of(&[batch])
}

/// Keys found twice inside one SSTable the reader view reads (read raw,
/// through memwal's store: local or S3 alike).
async fn sstable_duplicates(table: &str) -> Vec<String> {
    let loc = memwal_store::open_store(table).unwrap();
    let view = memwal_table::table_view(&loc, None, &memwal_store::RetryPolicy::default())
        .await
        .unwrap();
    let lance = memwal_sstable::LanceStore::new(loc.store.clone());
    let mut out = Vec::new();
    for shard in &view.shards {
        for t in &shard.sstables {
            let path =
                memwal_fencing::ShardLayout::new(&loc.root, shard.shard).sstable_dir(&t.path);
            let ds = lance::dataset::builder::DatasetBuilder::from_uri(lance.uri(&path))
                .with_session(lance.session().clone())
                .load()
                .await
                .unwrap_or_else(|e| panic!("SSTable {path}: {e}"));
            let batches: Vec<RecordBatch> = ds
                .scan()
                .try_into_stream()
                .await
                .unwrap()
                .try_collect()
                .await
                .unwrap();
            for key in rows_of(&batches).duplicates {
                out.push(format!(
                    "shard {}: SSTable {} holds key {key} twice",
                    shard.shard, t.path
                ));
            }
        }
    }
    out
}

/// The base table's latest rows (duplicates kept, unlike `base_rows`).
async fn base_view(table: &str) -> View {
    let loc = memwal_store::open_store(table).unwrap();
    let view = memwal_table::table_view(&loc, None, &memwal_store::RetryPolicy::default())
        .await
        .unwrap();
    let batches: Vec<RecordBatch> = view
        .base
        .scan()
        .try_into_stream()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    rows_of(&batches)
}

fn rows_of(batches: &[RecordBatch]) -> View {
    let mut out = View::default();
    for b in batches {
        let ids = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
        let vs = b.column_by_name("v").unwrap().as_string::<i32>();
        for i in 0..b.num_rows() {
            out.push(ids.value(i), vs.value(i).to_string());
        }
    }
    out
}

/// The violations of `got`, labelled with what was read.
fn violations(got: &View, ops: &[Op], what: &str) -> Vec<String> {
    check(got, ops, 0..KEYS)
        .iter()
        .map(|v| format!("{what}: invariant {}: {v}", v.invariant()))
        .collect()
}

// Breaks if a SIGKILLed or paused-then-resumed daemon ever loses an
// acknowledged write, applies a refused one, duplicates a row, or lets a
// zombie acknowledge something that is not durable, with compaction and GC
// running in between (see the module docs for the four invariants). A
// deliberately broken variant of each check: `each_broken_daemon_is_caught`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_paused_daemons_lose_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    chaos(
        &table,
        "MEMWAL_CHAOS_KILLS",
        200,
        "killed_and_paused_daemons_lose_nothing",
    )
    .await;
}

// The same run against the S3 test server (moto under `.ci/run`): every
// daemon, `memwal compact` and `memwal gc` on an s3:// table, where a
// put-if-not-exists is a conditional PUT and a listing is paginated.
// Fewer kills by default (`MEMWAL_CHAOS_S3_KILLS`, 30): each request is a
// round trip to the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(memwal_s3_tests),
    ignore = "needs an S3 server: MEMWAL_TEST_S3_URI unset (eval \"$(scripts/s3-server.sh start)\")"
)]
async fn killed_and_paused_daemons_on_s3_lose_nothing_acknowledged() {
    let Some(loc) = memwal_testkit::s3_test_location("chaos") else {
        return;
    };
    chaos(
        &loc.uri,
        "MEMWAL_CHAOS_S3_KILLS",
        30,
        "killed_and_paused_daemons_on_s3",
    )
    .await;
}

/// The chaos run on `table` (a path or s3:// URI): `kills_var` (default
/// `default_kills`) kill iterations, seeded by `MEMWAL_CHAOS_SEED`.
async fn chaos(table: &str, kills_var: &str, default_kills: u64, test: &str) {
    let table = table.to_string();
    let kills: u64 = std::env::var(kills_var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_kills);
    let seed: u64 = std::env::var("MEMWAL_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    let replay = format!(
        "MEMWAL_CHAOS_SEED={seed} {kills_var}={kills} \
         cargo test -p memwal-cli --test chaos {test}"
    );
    eprintln!("chaos: seed {seed}, {kills} kills on {table} (replay: {replay})");
    let mut rng = StdRng::seed_from_u64(seed);
    init_bucket_table(&table);
    let history = Arc::new(History::new());
    let flushes = Arc::new(AtomicU64::new(0));
    let mut stats = Stats::default();
    let mut started = 0u32;
    let mut hits: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut zombie_errors: Vec<String> = Vec::new();
    let mut reads: Vec<Read> = Vec::new();

    // Every bucket gets its shard before any zombie exists: two daemons
    // each creating a shard for the same bucket is outside what this run
    // checks (split tables use --shards).
    started += 1;
    let mut current = Daemon::start(&table, &[]);
    let mut armed: Option<&'static str> = None;
    let mut c = client(&current.flight, None).await;
    let warm: Vec<i64> = (0..KEYS).collect();
    put(&mut c, &["t"], vec![rows(&warm, "warm")])
        .await
        .unwrap();
    for key in warm {
        let seq = history.seq.fetch_add(1, Ordering::SeqCst);
        history.record(Op {
            seq,
            key,
            value: Some(format!("warm-{key}")),
            outcome: Outcome::Acked,
            writer: started,
        });
    }

    while stats.kills < kills {
        stats.iterations += 1;
        let n = rng.random_range(1..30);
        let kill_after = *history.acks.borrow() + rng.random_range(0..n as u64);
        let client = tokio::spawn(client_run(
            current.flight.clone(),
            started,
            n,
            rng.random(),
            history.clone(),
            flushes.clone(),
        ));
        acks_reach(&history, kill_after, &client).await;
        // A read while the client writes.
        reads.extend(read_through(&current, format!("daemon {started}, writing"), &history).await);
        if rng.random_ratio(1, 5) {
            // A zombie: paused while it may have a write in flight, a
            // successor takes over and writes, then the zombie resumes.
            stats.zombies += 1;
            signal(&current, "-STOP");
            let paused_at = history.seq.load(Ordering::SeqCst);
            let (successor, successor_armed) =
                start_daemon(&table, &mut started, &mut rng, &mut hits);
            client_run(
                successor.flight.clone(),
                started,
                rng.random_range(1..15),
                rng.random(),
                history.clone(),
                flushes.clone(),
            )
            .await;
            signal(&current, "-CONT");
            let _ = client.await;
            // The zombie is asked again; it must refuse (every shard it
            // held was claimed by the successor at its start).
            let zombie = started - 1;
            let asked_from = history.seq.load(Ordering::SeqCst);
            client_run(
                current.flight.clone(),
                zombie,
                3,
                rng.random(),
                history.clone(),
                flushes.clone(),
            )
            .await;
            let asked_acks: Vec<Op> = history
                .ops
                .lock()
                .unwrap()
                .iter()
                .filter(|o| {
                    o.writer == zombie && o.seq >= asked_from && o.outcome == Outcome::Acked
                })
                .cloned()
                .collect();
            if !asked_acks.is_empty() {
                zombie_errors.push(format!(
                    "daemon {zombie}, resumed after its successor took over, acknowledged {asked_acks:?}"
                ));
            }
            // Reads through the successor, and through the zombie once
            // the successor published everything acknowledged (a shard
            // another daemon holds is read as published).
            reads.extend(
                read_through(&successor, format!("daemon {started}, successor"), &history).await,
            );
            if flush_through(&successor).await {
                reads.extend(
                    read_through(&current, format!("daemon {zombie}, a zombie"), &history).await,
                );
            }
            stats.zombie_acks += history
                .ops
                .lock()
                .unwrap()
                .iter()
                .filter(|o| {
                    o.writer == zombie && o.outcome == Outcome::Acked && o.seq + 1 >= paused_at
                })
                .count() as u64;
            if kill(std::mem::replace(&mut current, successor)) {
                *hits.entry(armed.unwrap_or("?")).or_default() += 1;
            }
            armed = successor_armed;
        } else {
            if kill(current) {
                *hits.entry(armed.unwrap_or("?")).or_default() += 1;
            }
            let _ = client.await;
            (current, armed) = start_daemon(&table, &mut started, &mut rng, &mut hits);
            // A read through the daemon just started (its replay).
            reads.extend(
                read_through(&current, format!("daemon {started}, restarted"), &history).await,
            );
        }
        stats.kills += 1;
        if rng.random_ratio(1, 4) {
            let point = rng
                .random_ratio(1, 2)
                .then(|| COMPACT_POINTS[rng.random_range(0..COMPACT_POINTS.len())]);
            if cli_armed(&["compact", &table], point, &replay) {
                *hits.entry(point.unwrap().0).or_default() += 1;
            }
            stats.compactions += 1;
        }
        if rng.random_ratio(1, 8) {
            let point = rng.random_ratio(1, 2).then_some(GC_POINT);
            if cli_armed(&["gc", &table, "--grace", "0"], point, &replay) {
                *hits.entry(GC_POINT.0).or_default() += 1;
            }
            stats.gcs += 1;
        }
    }
    // The last daemon may be armed: replace it by an unarmed one that
    // replays and flushes everything on SIGTERM.
    if kill(current) {
        *hits.entry(armed.unwrap_or("?")).or_default() += 1;
    }
    started += 1;
    let current = Daemon::start(&table, &[]);
    signal(&current, "-TERM");
    let mut current = current;
    assert!(current.child.wait().unwrap().success(), "{replay}");
    stats.flushes = flushes.load(Ordering::Relaxed);

    let ops = history.ops.lock().unwrap().clone();
    let count = |o: Outcome| ops.iter().filter(|op| op.outcome == o).count();
    let mut errors = violations(&view_rows(&table).await, &ops, "reader view");
    errors.extend(zombie_errors);
    errors.extend(read_violations(&reads, &ops));
    // The reader view dedups by key: a key twice inside one SSTable shows
    // only in the raw data.
    errors.extend(sstable_duplicates(&table).await);
    let (ok, out, err) = memwal(&["compact", &table]);
    assert!(ok, "{out} {err}");
    let base = base_view(&table).await;
    errors.extend(violations(&base, &ops, "base"));
    let view = view_rows(&table).await;
    if view.rows != base.rows {
        errors.push("the view after the final compaction differs from the base".into());
    }
    eprintln!(
        "chaos: {} iterations, {} kills ({} as zombies, {} zombie acks around or after the pause), {} daemons, \
         {} writes ({} acked, {} unknown, {} refused), {} flushes, {} compactions, {} gcs; \
         crash points hit {:?}; {} reads; invariants {}",
        stats.iterations,
        stats.kills,
        stats.zombies,
        stats.zombie_acks,
        started,
        ops.len(),
        count(Outcome::Acked),
        count(Outcome::Unknown),
        count(Outcome::Refused),
        stats.flushes,
        stats.compactions,
        stats.gcs,
        hits,
        reads.len(),
        if errors.is_empty() {
            "held"
        } else {
            "VIOLATED"
        }
    );
    assert_held(&errors, &replay);
}

/// Fails the run with every violation found, and how to replay it.
fn assert_held(errors: &[String], replay: &str) {
    assert!(
        errors.is_empty(),
        "{} violations (replay: {replay}):\n{}",
        errors.len(),
        errors.join("\n")
    );
}

#[path = "chaos/broken.rs"]
mod broken;
use broken::Script;

#[path = "chaos/reads.rs"]
mod reads;
use reads::{read_through, read_violations, Read};

#[path = "chaos/producers.rs"]
mod producers;

// The cluster mode (etcd, three members, kills, zombies, etcd restarts).
#[path = "chaos/cluster.rs"]
mod cluster;
