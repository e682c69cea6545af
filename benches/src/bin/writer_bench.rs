//! memwal's `ShardWriter` next to upstream lance's
//! `lance::dataset::mem_wal::ShardWriter` (lance 14.0.2, public API only),
//! same workloads, one run, local store under /var/tmp (a fresh directory
//! per case, deleted afterwards).
//!
//! Rows are 1 KiB: an Int64 primary key `id` plus a 1016-byte Utf8 `v`.
//!
//! - (a) 1 producer, 1000-row puts;
//! - (b) 16 producers, 100-row puts;
//!
//!   each until `CASE_SECS` or `CASE_MAX_BYTES` of rows, whichever first;
//!   throughput counts acknowledged (durable) puts only, `close` (flush of
//!   what is left) is timed separately;
//! - (c) reopen + replay: fill a WAL of ~200 MB (~50 MB with `--quick`;
//!   memtable limits large enough that nothing is flushed), abort the
//!   writer, then time the open of a new writer on the same shard until
//!   it returns (ready for puts), and after that its close.
//!
//! Writers:
//! - `ours fsync`: memwal on its default local store (`open_store` on a
//!   path: every object write fsynced, file and directory entry);
//! - `ours nofsync`: the same writer on an `object_store` `LocalFileSystem`
//!   without `with_fsync`, handed to `ShardWriter::open` as a
//!   `StoreLocation` (memwal's `open_store` has no fsync switch);
//! - `upstream`: lance's writer from `Dataset::mem_wal_writer` with
//!   `ShardWriterConfig::default()` (durable_write, 100 ms WAL flush tick,
//!   10 MB WAL buffer); lance's local store does not fsync;
//! - `upstream 10ms` (cases a/b): the same with a 10 ms WAL flush tick.
//!
//! Run by hand: `cargo run --release -p memwal-benches --bin writer_bench
//! [-- --quick] [--cases=abc]`. Not part of CI. Everything is bounded: a
//! deadline and byte budget per case, a timeout on every put, open, close.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::builder::StringBuilder;
use arrow_array::{ArrayRef, Int64Array, RecordBatch, RecordBatchIterator};
use arrow_schema::{DataType, Field, Schema};
use lance::dataset::mem_wal::{
    DatasetMemWalExt, ShardWriter as UpWriter, ShardWriterConfig as UpConfig,
};
use lance::dataset::{Dataset, WriteParams};
use memwal::{ShardId, ShardWriter as OurWriter, ShardWriterConfig as OurConfig, StoreLocation};
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjPath;

/// Bytes of one row: 8 (id) + PAYLOAD.
const ROW_BYTES: usize = 1024;
const PAYLOAD: usize = ROW_BYTES - 8;
const CASE_SECS: f64 = 5.0;
const CASE_MAX_BYTES: u64 = 100_000_000;
const PUT_TIMEOUT: Duration = Duration::from_secs(60);
const OPEN_TIMEOUT: Duration = Duration::from_secs(300);
const CLOSE_TIMEOUT: Duration = Duration::from_secs(300);
/// Bound on filling the WAL for the replay case.
const FILL_SECS: f64 = 180.0;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    OursFsync,
    OursNoFsync,
    Upstream,
    Upstream10ms,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::OursFsync => "ours fsync",
            Variant::OursNoFsync => "ours nofsync",
            Variant::Upstream => "upstream",
            Variant::Upstream10ms => "upstream 10ms",
        }
    }
    fn is_ours(self) -> bool {
        matches!(self, Variant::OursFsync | Variant::OursNoFsync)
    }
}

/// Memtable limits: the defaults for throughput cases, "never flush" for
/// filling a WAL to replay.
#[derive(Clone, Copy)]
enum Limits {
    Default,
    Huge { rows: usize },
}

#[derive(Clone)]
enum Writer {
    Ours(Arc<OurWriter>),
    Up(Arc<UpWriter>),
}

impl Writer {
    async fn put(&self, batch: RecordBatch) -> Result<(), String> {
        match self {
            Writer::Ours(w) => w.put(&batch).await.map(|_| ()).map_err(|e| e.to_string()),
            Writer::Up(w) => w
                .put(vec![batch])
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
        }
    }

    async fn close(self) -> Result<(), String> {
        match self {
            Writer::Ours(w) => w.close().await.map_err(|e| e.to_string()),
            Writer::Up(w) => match Arc::try_unwrap(w) {
                Ok(w) => w.close().await.map_err(|e| e.to_string()),
                Err(_) => Err("upstream writer still shared at close".into()),
            },
        }
    }

    /// Stops without flushing the memtable (acknowledged rows stay in the WAL).
    async fn abort(self) -> Result<(), String> {
        match self {
            Writer::Ours(w) => {
                w.abort();
                Ok(())
            }
            Writer::Up(w) => w.abort().await.map_err(|e| e.to_string()),
        }
    }

    /// Rows the writer holds after a replay: ours publishes every replayed
    /// generation during open (SSTable rows), upstream keeps the replayed
    /// tail in its active memtable.
    async fn replayed_rows(&self) -> Result<u64, String> {
        match self {
            Writer::Ours(w) => Ok(w
                .manifest()
                .sstables
                .iter()
                .map(|s| s.physical_rows.unwrap_or(0))
                .sum()),
            Writer::Up(w) => w
                .memtable_stats()
                .await
                .map(|s| s.row_count as u64)
                .map_err(|e| e.to_string()),
        }
    }
}

fn table_schema() -> Arc<Schema> {
    let key_md = std::collections::HashMap::from([(
        "lance-schema:unenforced-primary-key".to_string(),
        "true".to_string(),
    )]);
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false).with_metadata(key_md),
        Field::new("v", DataType::Utf8, true),
    ]))
}

fn payload_template() -> String {
    (0..PAYLOAD)
        .map(|i| (b'a' + (i * 7 % 26) as u8) as char)
        .collect()
}

/// `n` rows with ids `first..first+n`, each a fresh 1016-byte value.
fn make_batch(schema: &Arc<Schema>, template: &str, first: i64, n: usize) -> RecordBatch {
    let ids = Int64Array::from_iter_values(first..first + n as i64);
    let mut vs = StringBuilder::with_capacity(n, n * PAYLOAD);
    for _ in 0..n {
        vs.append_value(template);
    }
    RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(ids) as ArrayRef, Arc::new(vs.finish())],
    )
    .unwrap()
}

/// An empty base table with the primary key at `dir`; for upstream also
/// the MemWAL index (manual sharding). Returns the dataset.
async fn create_table(dir: &std::path::Path, with_mem_wal: bool) -> Result<Dataset, String> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let reader = RecordBatchIterator::new(Vec::<Result<RecordBatch, _>>::new(), table_schema());
    let mut ds = Dataset::write(reader, dir.to_str().unwrap(), Some(WriteParams::default()))
        .await
        .map_err(|e| format!("base table: {e}"))?;
    if with_mem_wal {
        ds.initialize_mem_wal()
            .execute()
            .await
            .map_err(|e| format!("initialize_mem_wal: {e}"))?;
    }
    Ok(ds)
}

fn our_config(limits: Limits) -> OurConfig {
    match limits {
        Limits::Default => OurConfig::default(),
        Limits::Huge { rows } => OurConfig {
            memtable_max_bytes: 4 << 30,
            memtable_max_rows: rows,
            max_unflushed_age: None,
            max_unflushed_bytes: 4 << 30,
            ..Default::default()
        },
    }
}

fn up_config(variant: Variant, limits: Limits) -> UpConfig {
    let mut c = UpConfig::default();
    if variant == Variant::Upstream10ms {
        c = c.with_max_wal_flush_interval(Duration::from_millis(10));
    }
    if let Limits::Huge { rows } = limits {
        c = c
            .with_max_memtable_size(4 << 30)
            .with_max_memtable_rows(rows)
            // Must exceed the memtable size plus its index reservation.
            .with_max_unflushed_memtable_bytes(8 << 30);
    }
    c
}

/// What a writer open needs to find its shard again.
struct Target {
    dir: std::path::PathBuf,
    our_shard: ShardId,
    /// Carries upstream's shard id (`shard_id`, a fresh UUID v4) without
    /// naming the uuid crate.
    up_ids: UpConfig,
}

async fn open_writer(variant: Variant, t: &Target, limits: Limits) -> Result<Writer, String> {
    match variant {
        Variant::OursFsync => {
            OurWriter::open(t.dir.to_str().unwrap(), t.our_shard, our_config(limits))
                .await
                .map(|w| Writer::Ours(Arc::new(w)))
                .map_err(|e| e.to_string())
        }
        Variant::OursNoFsync => {
            let fs = LocalFileSystem::new_with_prefix(&t.dir).map_err(|e| e.to_string())?;
            let loc = StoreLocation {
                store: Arc::new(fs),
                root: ObjPath::default(),
                uri: format!("file://{}", t.dir.display()),
            };
            OurWriter::open(loc, t.our_shard, our_config(limits))
                .await
                .map(|w| Writer::Ours(Arc::new(w)))
                .map_err(|e| e.to_string())
        }
        Variant::Upstream | Variant::Upstream10ms => {
            let ds = Dataset::open(t.dir.to_str().unwrap())
                .await
                .map_err(|e| e.to_string())?;
            ds.mem_wal_writer(t.up_ids.shard_id, up_config(variant, limits))
                .await
                .map(|w| Writer::Up(Arc::new(w)))
                .map_err(|e| e.to_string())
        }
    }
}

async fn fresh_target(
    base: &std::path::Path,
    name: &str,
    variant: Variant,
) -> Result<Target, String> {
    let dir = base.join(name);
    create_table(&dir, !variant.is_ours()).await?;
    Ok(Target {
        dir,
        our_shard: ShardId::random(),
        up_ids: UpConfig::default(),
    })
}

struct Load {
    rows: u64,
    puts: u64,
    secs: f64,
    lat: Vec<Duration>,
    err: Option<String>,
}

/// `producers` tasks doing back-to-back puts of `rows_per_put` rows until
/// `secs` have passed or `max_bytes` of rows were acknowledged.
async fn drive(
    w: &Writer,
    producers: usize,
    rows_per_put: usize,
    secs: f64,
    max_bytes: u64,
) -> Load {
    let schema = table_schema();
    let template: Arc<str> = payload_template().into();
    let next_id = Arc::new(AtomicI64::new(0));
    let rows_done = Arc::new(AtomicU64::new(0));
    let max_rows = max_bytes / ROW_BYTES as u64;
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = (0..producers)
        .map(|_| {
            let (w, schema, template) = (w.clone(), schema.clone(), template.clone());
            let (next_id, rows_done) = (next_id.clone(), rows_done.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut err = None;
                while Instant::now() < deadline {
                    // Reserve the rows first so the budget is never overshot.
                    let first = next_id.fetch_add(rows_per_put as i64, Ordering::Relaxed);
                    if first as u64 >= max_rows {
                        break;
                    }
                    let batch = make_batch(&schema, &template, first, rows_per_put);
                    let t = Instant::now();
                    match tokio::time::timeout(PUT_TIMEOUT, w.put(batch)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            err = Some(e);
                            break;
                        }
                        Err(_) => {
                            err = Some(format!("put timed out after {PUT_TIMEOUT:?}"));
                            break;
                        }
                    }
                    lat.push(t.elapsed());
                    rows_done.fetch_add(rows_per_put as u64, Ordering::Relaxed);
                }
                (lat, err)
            })
        })
        .collect();
    let mut lat = Vec::new();
    let mut err = None;
    for t in tasks {
        match t.await {
            Ok((l, e)) => {
                lat.extend(l);
                err = err.or(e);
            }
            Err(e) => err = err.or(Some(format!("producer panicked: {e}"))),
        }
    }
    let secs = started.elapsed().as_secs_f64();
    lat.sort_unstable();
    Load {
        rows: rows_done.load(Ordering::Relaxed),
        puts: lat.len() as u64,
        secs,
        lat,
        err,
    }
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx].as_secs_f64() * 1e3
}

/// Flushes dirty pages so one case's writeback does not slow the next.
fn settle() {
    let _ = std::process::Command::new("sync").status();
}

struct ThroughputRow {
    variant: Variant,
    rows_s: f64,
    mb_s: f64,
    p50: f64,
    p99: f64,
    puts: u64,
    close_s: f64,
    note: String,
}

async fn throughput_case(
    base: &std::path::Path,
    tag: &str,
    variant: Variant,
    producers: usize,
    rows_per_put: usize,
) -> ThroughputRow {
    let mut row = ThroughputRow {
        variant,
        rows_s: f64::NAN,
        mb_s: f64::NAN,
        p50: f64::NAN,
        p99: f64::NAN,
        puts: 0,
        close_s: f64::NAN,
        note: String::new(),
    };
    settle();
    let name = format!("{tag}-{}", variant.name().replace(' ', "-"));
    let target = match fresh_target(base, &name, variant).await {
        Ok(t) => t,
        Err(e) => {
            row.note = format!("setup failed: {e}");
            return row;
        }
    };
    let w = match tokio::time::timeout(OPEN_TIMEOUT, open_writer(variant, &target, Limits::Default))
        .await
    {
        Ok(Ok(w)) => w,
        Ok(Err(e)) => {
            row.note = format!("open failed: {e}");
            return row;
        }
        Err(_) => {
            row.note = "open timed out".into();
            return row;
        }
    };
    let load = drive(&w, producers, rows_per_put, CASE_SECS, CASE_MAX_BYTES).await;
    row.rows_s = load.rows as f64 / load.secs;
    row.mb_s = (load.rows * ROW_BYTES as u64) as f64 / load.secs / 1e6;
    row.p50 = pct(&load.lat, 0.5);
    row.p99 = pct(&load.lat, 0.99);
    row.puts = load.puts;
    if let Some(e) = load.err {
        row.note = format!("put error: {e}");
    }
    let t = Instant::now();
    match tokio::time::timeout(CLOSE_TIMEOUT, w.close()).await {
        Ok(Ok(())) => row.close_s = t.elapsed().as_secs_f64(),
        Ok(Err(e)) => row.note.push_str(&format!(" close error: {e}")),
        Err(_) => row.note.push_str(" close timed out"),
    }
    let _ = std::fs::remove_dir_all(&target.dir);
    row
}

struct ReplayRow {
    variant: Variant,
    wal_mb: f64,
    fill_s: f64,
    open_s: f64,
    rows: u64,
    replayed: u64,
    close_s: f64,
    note: String,
}

async fn replay_case(base: &std::path::Path, variant: Variant, bytes: u64) -> ReplayRow {
    let mut row = ReplayRow {
        variant,
        wal_mb: f64::NAN,
        fill_s: f64::NAN,
        open_s: f64::NAN,
        rows: 0,
        replayed: 0,
        close_s: f64::NAN,
        note: String::new(),
    };
    settle();
    let name = format!("replay-{}", variant.name().replace(' ', "-"));
    let target = match fresh_target(base, &name, variant).await {
        Ok(t) => t,
        Err(e) => {
            row.note = format!("setup failed: {e}");
            return row;
        }
    };
    // Room for every row in one memtable (x2 margin).
    let limits = Limits::Huge {
        rows: (2 * bytes / ROW_BYTES as u64) as usize,
    };
    let w = match tokio::time::timeout(OPEN_TIMEOUT, open_writer(variant, &target, limits)).await {
        Ok(Ok(w)) => w,
        Ok(Err(e)) => {
            row.note = format!("open failed: {e}");
            return row;
        }
        Err(_) => {
            row.note = "open timed out".into();
            return row;
        }
    };
    // Fill: 16 producers of 1000-row puts, bounded by FILL_SECS.
    let load = drive(&w, 16, 1000, FILL_SECS, bytes).await;
    row.fill_s = load.secs;
    row.rows = load.rows;
    if let Some(e) = &load.err {
        row.note = format!("fill put error: {e}; ");
    }
    if let Err(e) = w.abort().await {
        row.note.push_str(&format!("abort: {e}; "));
    }
    row.wal_mb = dir_bytes(&target.dir.join("_mem_wal")) as f64 / 1e6;
    settle();
    let t = Instant::now();
    let w = match tokio::time::timeout(OPEN_TIMEOUT, open_writer(variant, &target, limits)).await {
        Ok(Ok(w)) => w,
        Ok(Err(e)) => {
            row.note.push_str(&format!("reopen failed: {e}"));
            return row;
        }
        Err(_) => {
            row.note.push_str("reopen timed out");
            return row;
        }
    };
    row.open_s = t.elapsed().as_secs_f64();
    match w.replayed_rows().await {
        Ok(n) => row.replayed = n,
        Err(e) => row.note.push_str(&format!("stats: {e}; ")),
    }
    let t = Instant::now();
    match tokio::time::timeout(CLOSE_TIMEOUT, w.close()).await {
        Ok(Ok(())) => row.close_s = t.elapsed().as_secs_f64(),
        Ok(Err(e)) => row.note.push_str(&format!("close error: {e}")),
        Err(_) => row.note.push_str("close timed out"),
    }
    let _ = std::fs::remove_dir_all(&target.dir);
    row
}

/// Bytes of the files under `dir` (the WAL entries and shard manifests).
fn dir_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

fn ratio(a: f64, b: f64) -> String {
    if a.is_finite() && b.is_finite() && b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "-".into()
    }
}

fn f(v: f64, prec: usize) -> String {
    if v.is_finite() {
        format!("{v:.prec$}")
    } else {
        "-".into()
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // `--cases=abc` (default): which cases to run.
    let which: String = std::env::args()
        .find_map(|a| a.strip_prefix("--cases=").map(str::to_string))
        .unwrap_or_else(|| "abc".into());
    let replay_bytes: u64 = if quick { 50_000_000 } else { 200_000_000 };
    let base = tempfile::Builder::new()
        .prefix("memwal-writer-bench-")
        .tempdir_in("/var/tmp")
        .unwrap();
    println!("writer_bench: memwal ShardWriter vs lance 14.0.2 mem_wal::ShardWriter");
    println!(
        "mode: {}; local store under {} (fresh dir per case); {} cores",
        if quick { "quick" } else { "full" },
        base.path().display(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("rows: {ROW_BYTES} B (Int64 primary key `id` + {PAYLOAD}-byte Utf8 `v`), unique keys");
    println!("writers:");
    println!("  ours fsync     memwal, default local store (open_store): every write fsynced (file + dir entry); ShardWriterConfig::default()");
    println!("  ours nofsync   memwal on object_store LocalFileSystem WITHOUT fsync, passed as a StoreLocation");
    println!("                 (memwal's store has no fsync switch; the writer accepts any store)");
    println!("  upstream       lance Dataset::mem_wal_writer, ShardWriterConfig::default() (durable_write=true,");
    println!("                 100 ms WAL flush tick, 10 MB WAL buffer); lance's local store does NOT fsync");
    println!("  upstream 10ms  the same with max_wal_flush_interval = 10 ms (cases a/b only)");
    println!(
        "cases a/b: each <= {CASE_SECS} s or {} MB of acknowledged rows; a put's latency = put() call until it returns (durable)",
        CASE_MAX_BYTES / 1_000_000
    );
    println!("          close = flushing what remains to SSTables, not counted in rows/s\n");

    let variants = [
        Variant::OursFsync,
        Variant::OursNoFsync,
        Variant::Upstream,
        Variant::Upstream10ms,
    ];
    let cases: [(&str, &str, usize, usize); 2] = [
        ("a", "(a) 1 producer x 1000-row puts", 1, 1000),
        ("b", "(b) 16 producers x 100-row puts", 16, 100),
    ];
    for (tag, title, producers, rows_per_put) in cases {
        if !which.contains(tag) {
            continue;
        }
        println!("{title}");
        println!(
            "  {:<14} | {:>9} {:>8} | {:>8} {:>8} | {:>7} {:>8} | note",
            "writer", "rows/s", "MB/s", "p50 ms", "p99 ms", "puts", "close s"
        );
        let mut rows = Vec::new();
        for v in variants {
            let r = throughput_case(base.path(), tag, v, producers, rows_per_put).await;
            println!(
                "  {:<14} | {:>9} {:>8} | {:>8} {:>8} | {:>7} {:>8} | {}",
                r.variant.name(),
                f(r.rows_s, 0),
                f(r.mb_s, 1),
                f(r.p50, 2),
                f(r.p99, 2),
                r.puts,
                f(r.close_s, 2),
                r.note.trim()
            );
            rows.push(r);
        }
        println!("  ratios ours/upstream (rows/s: >1 = ours faster; latency: <1 = ours faster)");
        println!(
            "  {:<14} {:<14} | {:>7} {:>7} {:>7}",
            "ours", "vs", "rows/s", "p50", "p99"
        );
        for o in rows.iter().filter(|r| r.variant.is_ours()) {
            for u in rows.iter().filter(|r| !r.variant.is_ours()) {
                println!(
                    "  {:<14} {:<14} | {:>7} {:>7} {:>7}",
                    o.variant.name(),
                    u.variant.name(),
                    ratio(o.rows_s, u.rows_s),
                    ratio(o.p50, u.p50),
                    ratio(o.p99, u.p99)
                );
            }
        }
        println!();
    }

    if !which.contains('c') {
        return;
    }
    println!(
        "(c) reopen + replay of a ~{} MB WAL: fill with 16 producers x 1000-row puts (memtable limits raised, no flush),",
        replay_bytes / 1_000_000
    );
    println!("    abort, then time open() of a new writer on the shard until it returns, then its close()");
    println!("    note: ours publishes every replayed generation as an SSTable inside open (`replayed` = SSTable rows);");
    println!("          upstream's open replays into its active memtable (`replayed` = memtable rows) and flushes it at close");
    println!(
        "  {:<14} | {:>7} {:>7} {:>8} | {:>8} {:>8} {:>7} {:>9} | {:>8} | note",
        "writer", "WAL MB", "fill s", "rows", "open s", "MB/s", "close s", "replayed", "open+cls"
    );
    let mut rrows = Vec::new();
    for v in [Variant::OursFsync, Variant::OursNoFsync, Variant::Upstream] {
        let r = replay_case(base.path(), v, replay_bytes).await;
        println!(
            "  {:<14} | {:>7} {:>7} {:>8} | {:>8} {:>8} {:>7} {:>9} | {:>8} | {}",
            r.variant.name(),
            f(r.wal_mb, 1),
            f(r.fill_s, 2),
            r.rows,
            f(r.open_s, 3),
            f(r.wal_mb / r.open_s, 1),
            f(r.close_s, 3),
            r.replayed,
            f(r.open_s + r.close_s, 3),
            r.note.trim()
        );
        rrows.push(r);
    }
    if let Some(u) = rrows.iter().find(|r| r.variant == Variant::Upstream) {
        println!("  ratios ours/upstream (time: <1 = ours faster)");
        for o in rrows.iter().filter(|r| r.variant.is_ours()) {
            println!(
                "  {:<14} open time {:>6}   open+close time {:>6}",
                o.variant.name(),
                ratio(o.open_s, u.open_s),
                ratio(o.open_s + o.close_s, u.open_s + u.close_s)
            );
        }
    }
}
