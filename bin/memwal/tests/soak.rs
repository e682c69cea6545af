//! A bounded soak: `memwal load` with 8 producers against one daemon for
//! 60 s (`MEMWAL_SOAK_SECS`) while its store fails and a second process
//! takes over one of its shards. The store injects bursts of ENOSPC on WAL
//! writes (a shard's writer stops, the shard goes down and is reopened)
//! and latency spikes before WAL puts (fault points armed through
//! `FAILPOINTS`; see `memwal_store::io_fault`), and three quarters in a
//! second daemon takes over bucket 0 (`--shards t=0`). Afterwards every row
//! `memwal load` saw acknowledged is in the table exactly once, the
//! daemon's RSS stayed within what its limits allow, and `/readyz`
//! reported the outages.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;

/// Resident set size of `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

// Breaks if, under ENOSPC bursts, latency spikes and a takeover, the daemon
// loses or duplicates an acknowledged row (`memwal load --acked` lists
// them), grows without bound (its memtables, in-flight messages and flushes
// are bounded by its settings), stays down after the disk recovers, or
// keeps /readyz at 200 while a shard is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soak_under_store_faults_and_a_takeover_keeps_every_acked_row_once() {
    let secs: u64 = std::env::var("MEMWAL_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    // WAL entries of 100 rows x 1 KiB go through the direct path, where
    // the ENOSPC bursts hit: three bursts of 40 writes, 300 writes apart.
    let faults = "store::stage_write=300*off->40*return(28)->300*off->40*return(28)->300*off->40*return(28)->off;\
                  wal::before_put=2%sleep(150)";
    let limits = [
        "--writer",
        "memtable_max_mib=8",
        "--writer",
        "max_unflushed_mib=32",
        "--max-decoded-mib-in-flight",
        "64",
        "--compact-every-secs",
        "10",
    ];
    let d = Daemon::try_launch(&table, &limits, &[("FAILPOINTS", faults)])
        .expect("daemon ended before serving");
    let pid = d.child.id();

    // Sampled every 100 ms while the load runs: peak RSS, /readyz.
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let not_ready = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, peak, not_ready, http) = (
            stop.clone(),
            peak.clone(),
            not_ready.clone(),
            d.http.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                peak.fetch_max(rss(pid), Ordering::SeqCst);
                if http_get(&http, "/readyz", None) != 200 {
                    not_ready.fetch_add(1, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };

    let acked = dir.path().join("acked");
    let load = std::process::Command::new(env!("CARGO_BIN_EXE_memwal"))
        .args([
            "load",
            "--to",
            &d.flight,
            "--table",
            "t",
            "--producers",
            "8",
        ])
        .args(["--batch", "100", "--payload", "1000", "--keep-going"])
        .args(["--secs", &secs.to_string(), "--acked"])
        .arg(&acked)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();

    // Three quarters in, a second daemon takes over bucket 0's shard.
    tokio::time::sleep(Duration::from_secs(secs * 3 / 4)).await;
    let second = Daemon::launch(&table, &["--no-compactor", "--shards", "t=0"]);

    let out = load.wait_with_output().unwrap();
    let load_out = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "memwal load failed: {load_out}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stop.store(true, Ordering::SeqCst);
    sampler.join().unwrap();
    let peak = peak.load(Ordering::SeqCst);
    let not_ready = not_ready.load(Ordering::SeqCst);
    let (_, metrics) = http_fetch(&d.http, "/metrics", None);
    let reopens = metrics
        .lines()
        .find(|l| l.starts_with("memwal_server_shard_reopens_total"))
        .unwrap_or("memwal_server_shard_reopens_total none")
        .to_string();
    d.stop_ok();
    second.stop_ok();

    // A fresh daemon claims every shard (the one taken over too) and
    // replays what is in their WALs; its SIGTERM flushes it all; then one
    // compaction puts it in the base table.
    Daemon::start(&table, &[]).stop_ok();
    let (ok, out, err) = memwal(&["compact", &table]);
    assert!(ok, "{out}{err}");
    let base: BTreeMap<i64, String> = base_rows(&table).await; // panics on a key twice

    let mut acked_rows = 0u64;
    let mut missing = Vec::new();
    for line in std::fs::read_to_string(&acked).unwrap().lines() {
        let (first, n) = line.split_once(' ').unwrap();
        let (first, n): (i64, i64) = (first.parse().unwrap(), n.parse().unwrap());
        for k in first..first + n {
            acked_rows += 1;
            match base.get(&k) {
                Some(v) if v.starts_with(&format!("row {k} ")) => {}
                other => missing.push((k, other.cloned())),
            }
        }
    }
    eprintln!(
        "soak: {secs} s, {acked_rows} rows acked, {} rows in the table, peak RSS {} MiB, \
         /readyz not 200 in {not_ready} samples, {reopens}; load: {load_out}",
        base.len(),
        peak >> 20
    );
    assert!(acked_rows > 0, "nothing was acknowledged");
    assert!(
        missing.is_empty(),
        "{} acknowledged rows missing or wrong, first: {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    // Budget: 4 shards x 32 MiB unflushed (x2 for the memtables' index and
    // flush copies), 64 MiB of decoded messages, and the process itself
    // (lance, runtime, caches).
    let budget = 4 * 32 * 2 + 64 + 512;
    assert!(
        peak < budget << 20,
        "peak RSS {} MiB over the {budget} MiB budget",
        peak >> 20
    );
    assert!(
        not_ready > 0,
        "/readyz never reported the shards ENOSPC took down"
    );
}
