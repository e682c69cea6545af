//! One repetition of each case: a fresh table, a writer, a timed window.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::load::{drive, Load};
use crate::memory::{live_heap, rss, Sampler};
use crate::rows::{Rows, ROW_BYTES};
use crate::stats::pct_ms;
use crate::writers::{create_table, Limits, Target, Variant, Writer};

const OPEN_TIMEOUT: Duration = Duration::from_secs(600);
const CLOSE_TIMEOUT: Duration = Duration::from_secs(600);

/// Flushes dirty pages so one run's writeback does not slow the next.
pub fn settle() {
    let _ = std::process::Command::new("sync").status();
}

async fn open(variant: Variant, t: &Target, limits: Limits) -> Result<Writer, String> {
    match tokio::time::timeout(OPEN_TIMEOUT, Writer::open(variant, t, limits)).await {
        Ok(r) => r.map_err(|e| format!("open: {e}")),
        Err(_) => Err(format!("open timed out after {OPEN_TIMEOUT:?}")),
    }
}

async fn close(w: Writer) -> Result<f64, String> {
    let t = Instant::now();
    match tokio::time::timeout(CLOSE_TIMEOUT, w.close()).await {
        Ok(Ok(())) => Ok(t.elapsed().as_secs_f64()),
        Ok(Err(e)) => Err(format!("close: {e}")),
        Err(_) => Err(format!("close timed out after {CLOSE_TIMEOUT:?}")),
    }
}

fn dir_name(tag: &str, v: Variant) -> String {
    format!("{tag}-{}", v.name().replace(' ', "-"))
}

/// One timed window of puts.
pub struct PutRun {
    pub rows: u64,
    pub window_s: f64,
    pub rows_s: f64,
    pub mb_s: f64,
    /// MB/s over the time inside put calls (one producer: its bandwidth).
    pub in_put_mb_s: f64,
    pub p50: f64,
    pub p99: f64,
    pub puts: usize,
    /// Flushing what was left at close, not in the window.
    pub close_s: f64,
    pub err: Option<String>,
}

impl PutRun {
    /// Rows per second over the window plus the close that flushed what
    /// the window left unpublished (a writer that defers its flushes pays
    /// for them here).
    pub fn sustained_rows_s(&self) -> f64 {
        self.rows as f64 / (self.window_s + self.close_s)
    }

    fn failed(e: String) -> Self {
        Self {
            rows: 0,
            window_s: f64::NAN,
            rows_s: f64::NAN,
            mb_s: f64::NAN,
            in_put_mb_s: f64::NAN,
            p50: f64::NAN,
            p99: f64::NAN,
            puts: 0,
            close_s: f64::NAN,
            err: Some(e),
        }
    }

    fn of(load: &Load) -> Self {
        Self {
            rows: load.rows,
            window_s: load.secs,
            rows_s: load.rows_s(),
            mb_s: load.mb_s(),
            in_put_mb_s: load.in_put_mb_s(),
            p50: pct_ms(&load.lat, 0.5),
            p99: pct_ms(&load.lat, 0.99),
            puts: load.lat.len(),
            close_s: f64::NAN,
            err: load.err.clone(),
        }
    }
}

/// The shape of a put workload.
#[derive(Clone, Copy)]
pub struct Shape {
    pub producers: usize,
    pub rows_per_put: usize,
    pub secs: f64,
    pub max_bytes: u64,
    pub limits: Limits,
}

/// `variant` on a fresh table under `base`, one window of `shape`.
pub async fn put_run(
    base: &Path,
    tag: &str,
    variant: Variant,
    rows: &Rows,
    shape: Shape,
) -> PutRun {
    settle();
    let dir = base.join(dir_name(tag, variant));
    let run = async {
        let t = create_table(&dir).await?;
        let w = open(variant, &t, shape.limits).await?;
        let load = drive(
            &w,
            rows,
            0,
            shape.producers,
            shape.rows_per_put,
            shape.secs,
            shape.max_bytes,
        )
        .await;
        let mut run = PutRun::of(&load);
        match close(w).await {
            Ok(s) => run.close_s = s,
            Err(e) => run.err = Some(run.err.map_or(e.clone(), |p| format!("{p}; {e}"))),
        }
        Ok::<_, String>(run)
    };
    let run = run.await.unwrap_or_else(PutRun::failed);
    let _ = std::fs::remove_dir_all(&dir);
    run
}

/// A WAL left behind by an aborted writer, to replay.
pub struct WalSource {
    pub target: Target,
    pub writer: Variant,
    pub rows: u64,
    pub wal_bytes: u64,
    pub entries: u64,
}

/// Fills a fresh table's WAL with `bytes` of rows (4 producers x 1000-row
/// puts, nothing flushed) using `writer`, then aborts it.
pub async fn fill_wal(
    dir: PathBuf,
    writer: Variant,
    rows: &Rows,
    bytes: u64,
) -> Result<WalSource, String> {
    let target = create_table(&dir).await?;
    let limits = Limits::absorb(bytes);
    let w = open(writer, &target, limits).await?;
    let load = drive(&w, rows, 0, 4, 1000, 1800.0, bytes).await;
    if let Some(e) = load.err {
        return Err(format!("filling the WAL: {e}"));
    }
    w.abort().await?;
    settle();
    let (wal_bytes, entries) = wal_files(&dir.join("_mem_wal"));
    Ok(WalSource {
        target,
        writer,
        rows: load.rows,
        wal_bytes,
        entries,
    })
}

/// Bytes and count of the WAL entry files under `dir`.
fn wal_files(dir: &Path) -> (u64, u64) {
    let (mut bytes, mut n) = (0, 0);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(p),
                Ok(m) if p.extension().is_some_and(|x| x == "arrow") => {
                    bytes += m.len();
                    n += 1;
                }
                _ => {}
            }
        }
    }
    (bytes, n)
}

pub struct ReplayRun {
    /// open() until it returned: claim, fence, replay; ready for puts.
    pub open_s: f64,
    pub close_s: f64,
    pub err: Option<String>,
}

/// Copies the source table and opens `reader` on the copy (timed), checks
/// it holds every filled row, then closes it (timed).
pub async fn replay_run(base: &Path, src: &WalSource, reader: Variant) -> ReplayRun {
    let dir = base.join("replay-work");
    let _ = std::fs::remove_dir_all(&dir);
    let mut out = ReplayRun {
        open_s: f64::NAN,
        close_s: f64::NAN,
        err: None,
    };
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(&src.target.dir)
        .arg(&dir)
        .status();
    if !copied.is_ok_and(|s| s.success()) {
        out.err = Some("copying the source table failed".into());
        return out;
    }
    settle();
    let target = Target {
        dir: dir.clone(),
        shard: src.target.shard,
    };
    let limits = Limits::absorb(src.wal_bytes);
    let t = Instant::now();
    let result = async {
        let w = open(reader, &target, limits).await?;
        out.open_s = t.elapsed().as_secs_f64();
        let held = w.replayed_rows().await?;
        if held != src.rows {
            return Err(format!("replayed {held} rows, the WAL holds {}", src.rows));
        }
        out.close_s = close(w).await?;
        Ok::<_, String>(())
    }
    .await;
    out.err = result.err();
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// Live heap a writer holds for rows it acknowledged but has not flushed.
pub struct MemoryRun {
    pub payload_bytes: u64,
    pub heap_bytes: i64,
    pub rss_bytes: i64,
    pub err: Option<String>,
}

/// Puts `n_rows` (1000-row puts, one producer) into a writer that flushes
/// nothing and measures the live heap and RSS it gained.
pub async fn memory_run(base: &Path, variant: Variant, rows: &Rows, n_rows: u64) -> MemoryRun {
    settle();
    let dir = base.join(dir_name("memory", variant));
    let bytes = n_rows * ROW_BYTES as u64;
    let payload_per_put = memwal_memtable::batch_payload_bytes(&rows.batch(0, 1000)) as u64;
    let mut out = MemoryRun {
        payload_bytes: payload_per_put * (n_rows / 1000),
        heap_bytes: 0,
        rss_bytes: 0,
        err: None,
    };
    let result = async {
        let t = create_table(&dir).await?;
        let w = open(variant, &t, Limits::absorb(bytes)).await?;
        let (heap0, rss0) = (live_heap() as i64, rss() as i64);
        let load = drive(&w, rows, 0, 1, 1000, 600.0, bytes).await;
        if let Some(e) = load.err {
            return Err(e);
        }
        if load.rows != n_rows {
            return Err(format!("put {} rows of {n_rows}", load.rows));
        }
        out.heap_bytes = live_heap() as i64 - heap0;
        out.rss_bytes = rss() as i64 - rss0;
        w.abort().await
    }
    .await;
    out.err = result.err();
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// A producer outrunning the flusher: peak memory against the limit.
pub struct OverloadRun {
    pub put: PutRun,
    pub peak_heap_over_base: i64,
    pub peak_rss: usize,
    pub waits: Option<u64>,
}

pub async fn overload_run(base: &Path, variant: Variant, rows: &Rows, shape: Shape) -> OverloadRun {
    settle();
    let dir = base.join(dir_name("overload", variant));
    let mut out = OverloadRun {
        put: PutRun::failed(String::new()),
        peak_heap_over_base: 0,
        peak_rss: 0,
        waits: None,
    };
    let result = async {
        let t = create_table(&dir).await?;
        let w = open(variant, &t, shape.limits).await?;
        let heap0 = live_heap() as i64;
        let sampler = Sampler::start();
        let load = drive(
            &w,
            rows,
            0,
            shape.producers,
            shape.rows_per_put,
            shape.secs,
            shape.max_bytes,
        )
        .await;
        let (heap, rss_peak) = sampler.finish().await;
        out.put = PutRun::of(&load);
        out.peak_heap_over_base = heap as i64 - heap0;
        out.peak_rss = rss_peak;
        out.waits = w.backpressure_waits();
        out.put.close_s = close(w).await?;
        Ok::<_, String>(())
    }
    .await;
    if let Err(e) = result {
        out.put.err = Some(e);
    }
    let _ = std::fs::remove_dir_all(&dir);
    out
}
