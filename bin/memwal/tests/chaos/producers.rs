//! Process chaos for idempotent producers (docs/design/idempotent-producers.md):
//! one producer writes numbered batches to an append-only `bucket(id, 4)`
//! table (a batch usually spans shards) through daemons that are
//! SIGKILLed, paused and taken over, or started with a random crash point,
//! with compactions in between. It retries every batch whose outcome it
//! did not learn, at the next daemon, and now and then restarts under a
//! new epoch and replays its last acknowledged batches (as an engine
//! restoring a checkpoint does). At the end every batch was acknowledged,
//! and the table must hold every row of every batch exactly once: an
//! append-only table shows any batch written twice.
//!
//! `a_daemon_ignoring_sequences_is_caught` runs the same check against a
//! daemon that ignores producer sequences (`broken::producer_sequences_ignored`).
//!
//! `MEMWAL_CHAOS_PRODUCER_KILLS` sets the kill iterations (default 40),
//! `MEMWAL_CHAOS_SEED` replays a run.

use super::*;

/// Rows of batch `s`: 1-4 ids from `8 s` (the same for every send of it).
fn batch_ids(s: u64) -> Vec<i64> {
    let k = 1 + (s * 7 % 4) as i64;
    (0..k).map(|i| s as i64 * 8 + i).collect()
}

/// The producer: what it acknowledged, and where it stands.
struct Producer {
    id: String,
    epoch: u64,
    /// The next batch to send.
    next: u64,
    /// Every batch up to this one is acknowledged.
    acked: u64,
    /// Batches in all.
    total: u64,
    /// Acknowledgements of batches written before (retries and replays).
    duplicates: u64,
    /// Replayed batches (at or below `acked`) a daemon wrote again.
    rewritten: Vec<u64>,
}

impl Producer {
    /// Sends batches in order through `addr` until `n` were acknowledged,
    /// all were, or one fails (or takes longer than 3 s: a paused daemon).
    async fn run(mut self, addr: String, n: u64, acks: Arc<AtomicU64>) -> Self {
        let Ok(channel) = tonic::transport::Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
        else {
            return self;
        };
        let mut c = FlightClient::new(channel);
        for _ in 0..n {
            if self.next > self.total {
                break;
            }
            let s = self.next;
            let sent = producer_put(
                &mut c,
                &["t"],
                rows(&batch_ids(s), &format!("s{s}")),
                (&self.id, self.epoch, s),
            );
            let Ok(Ok(ack)) = tokio::time::timeout(std::time::Duration::from_secs(3), sent).await
            else {
                return self;
            };
            let duplicate = ack["parts"]
                .as_array()
                .is_some_and(|p| p.iter().all(|p| p["duplicate"] == true));
            if duplicate {
                self.duplicates += 1;
            } else if s <= self.acked {
                self.rewritten.push(s);
            }
            self.acked = self.acked.max(s);
            self.next = s + 1;
            acks.fetch_add(1, Ordering::SeqCst);
        }
        self
    }

    /// Restarts under a new epoch and replays up to 3 acknowledged batches.
    fn restart(&mut self, rng: &mut StdRng) {
        self.epoch += 1;
        let back = rng.random_range(0..=self.acked.min(3));
        self.next = self.acked + 1 - back;
    }
}

/// Every way the table's rows contradict "every row of batches
/// `1..=total` exactly once".
fn exactly_once(view: &View, total: u64) -> Vec<String> {
    let mut errors: Vec<String> = view
        .duplicates
        .iter()
        .map(|k| format!("id {k} is in the table more than once"))
        .collect();
    let mut want = BTreeMap::new();
    for s in 1..=total {
        for id in batch_ids(s) {
            want.insert(id, format!("s{s}-{id}"));
        }
    }
    for (id, v) in &want {
        match view.rows.get(id) {
            None => errors.push(format!("id {id} ({v}) is missing")),
            Some(got) if got != v => errors.push(format!("id {id} is {got}, not {v}")),
            Some(_) => {}
        }
    }
    for id in view.rows.keys().filter(|id| !want.contains_key(id)) {
        errors.push(format!("id {id} was never sent"));
    }
    errors
}

/// The table's rows once every flushed level is compacted into the base.
async fn compacted(table: &str) -> View {
    let (ok, out, err) = memwal(&["compact", table]);
    assert!(ok, "{out} {err}");
    base_view(table).await
}

// Breaks if a batch whose outcome its producer did not learn (the daemon
// killed or paused around its WAL write, a crash point in a flush, a
// takeover) is written twice when retried, if a replayed batch is written
// again, or if a retried batch is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_producers_write_each_batch_once_through_kills() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    let kills: u64 = std::env::var("MEMWAL_CHAOS_PRODUCER_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let seed: u64 = std::env::var("MEMWAL_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    let replay = format!(
        "MEMWAL_CHAOS_SEED={seed} MEMWAL_CHAOS_PRODUCER_KILLS={kills} \
         cargo test -p memwal-cli --test chaos idempotent_producers"
    );
    eprintln!("producer chaos: seed {seed}, {kills} kills (replay: {replay})");
    let mut rng = StdRng::seed_from_u64(seed);
    init_append_only(&table, "bucket(id, 4)");
    let mut producer = Producer {
        id: "chaos-job".into(),
        epoch: 1,
        next: 1,
        acked: 0,
        total: kills * 6,
        duplicates: 0,
        rewritten: Vec::new(),
    };
    let acks = Arc::new(AtomicU64::new(0));
    let mut started = 0u32;
    let mut hits: BTreeMap<&'static str, u64> = BTreeMap::new();
    let (mut current, mut armed) = start_daemon(&table, &mut started, &mut rng, &mut hits);
    let (mut restarts, mut zombies) = (0u64, 0u64);
    for _ in 0..kills {
        if rng.random_ratio(1, 4) {
            producer.restart(&mut rng);
            restarts += 1;
        }
        let kill_after = acks.load(Ordering::SeqCst) + rng.random_range(0..8);
        let run = tokio::spawn(producer.run(current.flight.clone(), 12, acks.clone()));
        while acks.load(Ordering::SeqCst) < kill_after && !run.is_finished() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        if rng.random_ratio(1, 5) {
            // Paused with a batch maybe in flight; a successor takes the
            // shards over and the producer retries there.
            zombies += 1;
            signal(&current, "-STOP");
            let (successor, successor_armed) =
                start_daemon(&table, &mut started, &mut rng, &mut hits);
            producer = run.await.unwrap();
            producer = producer
                .run(successor.flight.clone(), 6, acks.clone())
                .await;
            signal(&current, "-CONT");
            if kill(std::mem::replace(&mut current, successor)) {
                *hits.entry(armed.unwrap_or("?")).or_default() += 1;
            }
            armed = successor_armed;
        } else {
            if kill(current) {
                *hits.entry(armed.unwrap_or("?")).or_default() += 1;
            }
            producer = run.await.unwrap();
            (current, armed) = start_daemon(&table, &mut started, &mut rng, &mut hits);
        }
        if rng.random_ratio(1, 6) {
            let (ok, out, err) = memwal(&["compact", &table]);
            assert!(ok, "{out} {err} ({replay})");
        }
    }
    if kill(current) {
        *hits.entry(armed.unwrap_or("?")).or_default() += 1;
    }
    // An unarmed daemon: the producer retries what is left, then SIGTERM
    // flushes everything.
    let last = Daemon::start(&table, &[]);
    for _ in 0..20 {
        if producer.next > producer.total {
            break;
        }
        let n = producer.total;
        producer = producer.run(last.flight.clone(), n, acks.clone()).await;
    }
    assert!(
        producer.next > producer.total,
        "the producer could not finish: at {} of {} ({replay})",
        producer.next,
        producer.total
    );
    last.stop_ok();
    let view = compacted(&table).await;
    let mut errors = exactly_once(&view, producer.total);
    if !producer.rewritten.is_empty() {
        errors.push(format!(
            "replayed batches written again: {:?}",
            producer.rewritten
        ));
    }
    eprintln!(
        "producer chaos: {kills} kills ({zombies} paused and taken over), {started} daemons, \
         {} batches, {} acknowledged as duplicates, {restarts} producer restarts; crash points \
         hit {hits:?}; {}",
        producer.total,
        producer.duplicates,
        if errors.is_empty() {
            "exactly once held"
        } else {
            "VIOLATED"
        }
    );
    assert_held(&errors, &replay);
}

// Breaks if the exactly-once check cannot see a daemon that ignores
// producer sequences: the retry of a batch durable before the crash is
// then written again. The same script against a sound daemon must pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_ignoring_sequences_is_caught() {
    for broken in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let table = dir.path().join("t").to_str().unwrap().to_string();
        init_append_only(&table, "bucket(id, 4)");
        let mut d = Daemon::try_launch(
            &table,
            &["--no-compactor"],
            &[("FAILPOINTS", "wal::after_put=1*return")],
        )
        .expect("daemon ended before serving");
        let mut c = client(&d.flight, None).await;
        let lost = producer_put(&mut c, &["t"], rows(&batch_ids(1), "s1"), ("p", 1, 1)).await;
        assert!(lost.is_err(), "{lost:?}");
        let _ = d.child.wait();
        let points = if broken {
            "broken::producer_sequences_ignored=return"
        } else {
            ""
        };
        let d = Daemon::try_launch(&table, &["--no-compactor"], &[("FAILPOINTS", points)])
            .expect("daemon ended before serving");
        let mut c = client(&d.flight, None).await;
        for s in 1..=2 {
            producer_put(
                &mut c,
                &["t"],
                rows(&batch_ids(s), &format!("s{s}")),
                ("p", 1, s),
            )
            .await
            .unwrap();
        }
        d.stop_ok();
        let errors = exactly_once(&compacted(&table).await, 2);
        if broken {
            assert!(
                errors.iter().any(|e| e.contains("more than once")),
                "the broken daemon went unseen: {errors:?}"
            );
        } else {
            assert!(errors.is_empty(), "{errors:?}");
        }
    }
}
