//! The chaos suite's scripted bugs: each run against a sound daemon (no
//! violation allowed) and against one with a deliberate bug, which the
//! checks must report as the invariant it breaks (`Script`,
//! `each_broken_daemon_is_caught`; the read rules' scripts are in
//! `reads.rs`).

use super::*;

/// One scripted run for `each_broken_daemon_is_caught`: the history and
/// what was read at the end, with the behaviour `broken` switched on (or
/// none: the same script must then hold every invariant).
pub(crate) struct Script {
    pub(crate) table: String,
    _dir: tempfile::TempDir,
    pub(crate) ops: Vec<Op>,
}

impl Script {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let table = dir.path().join("t").to_str().unwrap().to_string();
        init_bucket_table(&table);
        Self {
            table,
            _dir: dir,
            ops: Vec::new(),
        }
    }

    /// A daemon with `FAILPOINTS` set to `points` (empty: none); the
    /// scripts flush back to back, so flush actions are not spaced out.
    pub(crate) fn daemon(&self, points: &str) -> Daemon {
        Daemon::try_launch(
            &self.table,
            &["--no-compactor", "--min-flush-interval-ms", "0"],
            &[("FAILPOINTS", points)],
        )
        .expect("daemon ended before serving")
    }

    /// Puts `key = value` through `d` (writer `writer`) and records the outcome;
    /// gives up waiting after `wait` (the outcome is then unknown).
    pub(crate) async fn put(
        &mut self,
        d: &Daemon,
        writer: u32,
        key: i64,
        tag: &str,
        wait: u64,
    ) -> Outcome {
        let mut c = client(&d.flight, None).await;
        let r = tokio::time::timeout(
            std::time::Duration::from_millis(wait),
            put(&mut c, &["t"], vec![rows(&[key], tag)]),
        )
        .await;
        let outcome = match r {
            Ok(Ok(_)) => Outcome::Acked,
            Ok(Err(s)) => classify(&s),
            Err(_) => Outcome::Unknown,
        };
        self.ops.push(Op {
            seq: self.ops.len() as u64,
            key,
            value: Some(format!("{tag}-{key}")),
            outcome,
            writer,
        });
        outcome
    }

    pub(crate) async fn flush(&self, d: &Daemon) {
        let mut c = client(&d.flight, None).await;
        let r: Vec<_> = c
            .do_action(arrow_flight::Action::new("flush", "t"))
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        assert_eq!(r.len(), 1);
    }

    /// A clean daemon replays and flushes everything, then the reader view.
    pub(crate) async fn settle(&self) -> View {
        self.daemon("").stop_ok();
        view_rows(&self.table).await
    }
}

/// Invariant 1's bug: entries acknowledged before their PUT (which then
/// lags); a SIGKILL in between loses an acked write.
async fn script_ack_before_put(broken: bool) -> (Vec<Op>, View) {
    let mut s = Script::new();
    let d = s.daemon(if broken {
        "broken::wal_ack_before_put=return"
    } else {
        ""
    });
    assert_eq!(s.put(&d, 1, 1, "a", 10_000).await, Outcome::Acked);
    kill(d);
    (s.ops.clone(), s.settle().await)
}

/// Invariant 4's bug: a lost put-if-not-exists taken for our own write, so
/// a zombie writes "over" its successor's sentinel and acknowledges.
async fn script_zombie_acks(broken: bool) -> (Vec<Op>, View) {
    let mut s = Script::new();
    let zombie = s.daemon(if broken {
        "broken::wal_conflict_is_success=return"
    } else {
        ""
    });
    assert_eq!(s.put(&zombie, 1, 1, "a", 10_000).await, Outcome::Acked);
    let successor = s.daemon("");
    s.put(&zombie, 1, 1, "z", 10_000).await;
    kill(zombie);
    successor.stop_ok();
    (s.ops.clone(), s.settle().await)
}

/// Invariant 3's bug: replay applying the WAL newest entry first, so an
/// older write whose outcome was unknown beats a newer acknowledged one.
async fn script_stale_unknown(broken: bool) -> (Vec<Op>, View) {
    let mut s = Script::new();
    // The first WAL PUT is held 1 s: its client gives up (unknown) while
    // the entry still lands; the second write's entry queues behind it.
    let d = s.daemon("wal::before_put=1*sleep(1000)");
    assert_eq!(s.put(&d, 1, 1, "u", 200).await, Outcome::Unknown);
    assert_eq!(s.put(&d, 1, 1, "b", 10_000).await, Outcome::Acked);
    kill(d);
    let replayer = s.daemon(if broken {
        "broken::replay_reversed=return"
    } else {
        ""
    });
    replayer.stop_ok();
    (s.ops.clone(), s.settle().await)
}

/// Invariant 2's bug: the compactor appending a keyed table's rows instead
/// of upserting them, so an overwritten key appears twice in the base.
async fn script_duplicate(broken: bool) -> (Vec<Op>, View) {
    let mut s = Script::new();
    let d = s.daemon("");
    for tag in ["a", "b"] {
        assert_eq!(s.put(&d, 1, 1, tag, 10_000).await, Outcome::Acked);
        s.flush(&d).await;
        let point = broken.then_some(("broken::compactor_upsert_appends", "return"));
        assert!(!cli_armed(&["compact", &s.table], point, "scripted"));
    }
    d.stop_ok();
    (s.ops.clone(), base_view(&s.table).await)
}

// The chaos run's checks are trusted only because each is seen failing:
// every script runs twice, against sound daemons (no violation allowed)
// and against daemons with one deliberate bug, which must be reported as
// the invariant that bug breaks. Breaks if a check stops catching its bug,
// or if a script stops provoking it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_broken_daemon_is_caught() {
    for broken in [false, true] {
        let cases = [
            (
                1,
                "a write acked before its WAL PUT",
                script_ack_before_put(broken).await,
            ),
            (
                2,
                "a keyed compaction by append",
                script_duplicate(broken).await,
            ),
            (
                3,
                "replay newest entry first",
                script_stale_unknown(broken).await,
            ),
            (
                4,
                "fencing off (a lost create taken as ours)",
                script_zombie_acks(broken).await,
            ),
        ];
        for (invariant, bug, (ops, view)) in cases {
            let found = check(&view, &ops, 0..KEYS);
            if !broken {
                assert!(found.is_empty(), "sound daemons, {bug} script: {found:?}");
                continue;
            }
            let named = |v: &Violation| match v {
                // A lost ack is invariant 4 when its writer had been fenced
                // (writer 1 of the zombie script).
                Violation::LostAck { writer: 1, .. } if invariant == 4 => 4,
                v => v.invariant(),
            };
            assert!(
                found.iter().any(|v| named(v) == invariant),
                "{bug}: invariant {invariant} not reported; found {found:?} (view {view:?}, ops {ops:?})"
            );
            eprintln!("broken: {bug}: caught: {}", found[0]);
        }
    }
}
