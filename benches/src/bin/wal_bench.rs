//! WAL append throughput and latency next to raw put-if-not-exists, on the
//! local store (fsync on) in a temporary directory under /var/tmp.
//!
//! Run by hand: `cargo run --release -p memwal-benches --bin wal_bench`.
//! Not part of CI. Each throughput case runs for at most `CASE_SECS` or
//! `CASE_MAX_BYTES`, whichever comes first; files are deleted between cases.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{BinaryArray, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use bytes::Bytes;
use memwal_fencing::{ManifestStore, ShardId, ShardIdentity};
use memwal_store::{create_object, open_store, RetryPolicy, StoreLocation};
use memwal_wal::{write_fence_sentinel, WalAppender, WalConfig};

const CASE_SECS: f64 = 3.0;
const CASE_MAX_BYTES: u64 = 1 << 30;
const LATENCY_SAMPLES: usize = 200;

#[derive(Clone, Copy)]
enum Kind {
    Raw,
    Wal,
}

struct Outcome {
    ops: u64,
    bytes: u64,
    secs: f64,
    puts: u64,
}

fn payload_batch(size: usize) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![Field::new(
        "payload",
        DataType::Binary,
        false,
    )]));
    let value: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
    RecordBatch::try_new(
        schema,
        vec![Arc::new(BinaryArray::from(vec![value.as_slice()]))],
    )
    .unwrap()
}

fn fresh_location(base: &std::path::Path, name: &str) -> StoreLocation {
    let dir = base.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    open_store(dir.to_str().unwrap()).unwrap()
}

async fn open_wal(loc: &StoreLocation) -> WalAppender {
    let shard = ShardId::random();
    let manifests = Arc::new(ManifestStore::new(
        loc.store.clone(),
        &loc.root,
        shard,
        RetryPolicy::default(),
    ));
    let claim = manifests
        .claim(Some(&ShardIdentity::manual()))
        .await
        .unwrap();
    let sentinel = write_fence_sentinel(&manifests, claim.epoch, &claim.manifest)
        .await
        .unwrap();
    WalAppender::start(
        manifests,
        claim.epoch,
        sentinel + 1,
        claim.manifest.current_generation,
        WalConfig::default(),
    )
    .unwrap()
}

/// Runs `concurrency` workers doing back-to-back operations until the time
/// or byte budget is spent.
async fn throughput(kind: Kind, loc: &StoreLocation, size: usize, concurrency: usize) -> Outcome {
    let ops = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(CASE_SECS);
    let max_ops = CASE_MAX_BYTES / size as u64;
    let started = Instant::now();
    let wal = match kind {
        Kind::Wal => Some(open_wal(loc).await),
        Kind::Raw => None,
    };
    let start_pos = wal.as_ref().map_or(0, |w| w.last_durable_position());
    let batch = payload_batch(size);
    let raw = Bytes::from(vec![7u8; size]);
    let workers: Vec<_> = (0..concurrency)
        .map(|w| {
            let (ops, wal, batch, raw) = (ops.clone(), wal.clone(), batch.clone(), raw.clone());
            let (store, root) = (loc.store.clone(), loc.root.clone());
            tokio::spawn(async move {
                let retry = RetryPolicy::default();
                let mut i = 0u64;
                while Instant::now() < deadline && ops.load(Ordering::Relaxed) < max_ops {
                    match &wal {
                        Some(wal) => {
                            wal.append(vec![batch.clone()]).await.unwrap();
                        }
                        None => {
                            let path = root.clone().join("raw").join(format!("{w}-{i}"));
                            create_object(store.as_ref(), &path, raw.clone(), &retry)
                                .await
                                .unwrap();
                        }
                    }
                    i += 1;
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    let n = ops.load(Ordering::Relaxed);
    let puts = match &wal {
        Some(w) => w.last_durable_position() - start_pos,
        None => n,
    };
    if let Some(w) = wal {
        w.close().await.unwrap();
    }
    Outcome {
        ops: n,
        bytes: n * size as u64,
        secs,
        puts,
    }
}

/// Latencies of lone operations (nothing else in flight), raw and WAL
/// samples interleaved so both see the same disk state. Sorted.
async fn latencies(loc: &StoreLocation, size: usize) -> (Vec<Duration>, Vec<Duration>) {
    let wal = open_wal(loc).await;
    let batch = payload_batch(size);
    let raw = Bytes::from(vec![7u8; size]);
    let retry = RetryPolicy::default();
    let (mut raw_lat, mut wal_lat) = (Vec::new(), Vec::new());
    for i in 0..LATENCY_SAMPLES {
        let t = Instant::now();
        let path = loc.root.clone().join("lat").join(i.to_string());
        create_object(loc.store.as_ref(), &path, raw.clone(), &retry)
            .await
            .unwrap();
        raw_lat.push(t.elapsed());
        let t = Instant::now();
        wal.append(vec![batch.clone()]).await.unwrap();
        wal_lat.push(t.elapsed());
    }
    wal.close().await.unwrap();
    raw_lat.sort_unstable();
    wal_lat.sort_unstable();
    (raw_lat, wal_lat)
}

/// Flushes dirty pages so one case's writeback does not slow the next.
fn settle() {
    let _ = std::process::Command::new("sync").status();
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx].as_secs_f64() * 1e3
}

fn label(size: usize) -> String {
    if size >= 1 << 20 {
        format!("{} MiB", size >> 20)
    } else {
        format!("{} KiB", size >> 10)
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let base = tempfile::Builder::new()
        .prefix("memwal-wal-bench-")
        .tempdir_in("/var/tmp")
        .unwrap();
    println!("local store with fsync under {}", base.path().display());
    println!(
        "each case: {CASE_SECS} s or {} MiB, whichever first\n",
        CASE_MAX_BYTES >> 20
    );
    println!(
        "{:<8} {:>4} | {:>10} {:>9} | {:>10} {:>9} {:>9} | {:>8}",
        "payload", "conc", "raw ops/s", "raw MB/s", "wal ops/s", "wal MB/s", "appnd/PUT", "wal/raw"
    );
    let mut case = 0;
    for size in [1 << 20, 64 << 10] {
        for conc in [1, 16] {
            case += 1;
            settle();
            let raw_loc = fresh_location(base.path(), &format!("raw-{case}"));
            let raw = throughput(Kind::Raw, &raw_loc, size, conc).await;
            drop(raw_loc);
            let _ = std::fs::remove_dir_all(base.path().join(format!("raw-{case}")));
            settle();
            let wal_loc = fresh_location(base.path(), &format!("wal-{case}"));
            let wal = throughput(Kind::Wal, &wal_loc, size, conc).await;
            drop(wal_loc);
            let _ = std::fs::remove_dir_all(base.path().join(format!("wal-{case}")));
            let rate = |o: &Outcome| o.ops as f64 / o.secs;
            let mbps = |o: &Outcome| o.bytes as f64 / o.secs / 1e6;
            println!(
                "{:<8} {:>4} | {:>10.0} {:>9.1} | {:>10.0} {:>9.1} {:>9.2} | {:>8.2}",
                label(size),
                conc,
                rate(&raw),
                mbps(&raw),
                rate(&wal),
                mbps(&wal),
                wal.ops as f64 / wal.puts.max(1) as f64,
                rate(&wal) / rate(&raw),
            );
        }
    }
    println!("\nlone operation latency ({LATENCY_SAMPLES} sequential samples), ms");
    println!(
        "{:<8} | {:>9} {:>9} | {:>9} {:>9}",
        "payload", "raw p50", "raw p99", "wal p50", "wal p99"
    );
    for size in [1 << 20, 64 << 10] {
        settle();
        let loc = fresh_location(base.path(), "latency");
        let (raw, wal) = latencies(&loc, size).await;
        println!(
            "{:<8} | {:>9.2} {:>9.2} | {:>9.2} {:>9.2}",
            label(size),
            pct(&raw, 0.5),
            pct(&raw, 0.99),
            pct(&wal, 0.5),
            pct(&wal, 0.99),
        );
        let _ = std::fs::remove_dir_all(base.path().join("latency"));
    }
}
