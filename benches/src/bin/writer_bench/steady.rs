//! `steady`: a window long enough that both writers reach their
//! unflushed-bytes limit and must flush as fast as they ingest, with equal
//! memtable sizes and limits: the throughput and tail a long-running
//! ingestion service sees (the 3 s `lone` / `multi` windows compare
//! buffering policies instead).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::cases::settle;
use crate::load::drive;
use crate::rows::{Rows, ROW_BYTES};
use crate::stats::{pct_ms, Reps};
use crate::writers::{create_table, Durability, Limits, Variant, Writer};
use crate::{alternate, Bench};

/// Producers and rows per put of the steady case (16 x 100 rows).
const PRODUCERS: usize = 16;
const ROWS_PER_PUT: usize = 100;

/// 64 MiB generations, 256 MiB unflushed at most, for both writers: at a
/// few hundred MB/s both are at the limit within the first seconds.
fn limits() -> Limits {
    Limits {
        memtable_rows: 64 << 10,
        memtable_bytes: 64 << 20,
        unflushed_bytes: 256 << 20,
    }
}

/// A put slower than this counts as stalled (upstream does not report its
/// backpressure waits; this is what a client of either writer sees).
const STALL: Duration = Duration::from_millis(100);

struct SteadyRun {
    rows_s: f64,
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
    stalls: usize,
    waits: Option<u64>,
    err: Option<String>,
}

async fn run(base: &Path, v: Variant, rows: &Rows, secs: f64) -> SteadyRun {
    settle();
    let dir = base.join(format!("steady-{}", v.name().replace(' ', "-")));
    let r = async {
        let t = create_table(&dir).await?;
        let w = Writer::open(v, &t, limits()).await?;
        // Bytes only bound the run (the window ends it first).
        let load = drive(&w, rows, 0, PRODUCERS, ROWS_PER_PUT, secs, 64 << 30).await;
        let waits = w.backpressure_waits();
        let closed = w.close().await;
        let lat = &load.lat;
        Ok::<_, String>(SteadyRun {
            rows_s: load.rows_s(),
            p50: pct_ms(lat, 0.5),
            p99: pct_ms(lat, 0.99),
            p999: pct_ms(lat, 0.999),
            max: pct_ms(lat, 1.0),
            stalls: lat.iter().filter(|d| **d >= STALL).count(),
            waits,
            err: load.err.or(closed.err()),
        })
    };
    let out = r.await.unwrap_or_else(|e| SteadyRun {
        rows_s: f64::NAN,
        p50: f64::NAN,
        p99: f64::NAN,
        p999: f64::NAN,
        max: f64::NAN,
        stalls: 0,
        waits: None,
        err: Some(e),
    });
    let _ = std::fs::remove_dir_all(&dir);
    out
}

impl Bench {
    /// The steady-state case: memwal (fsync) against upstream (fsync) at
    /// each tick, `--steady-secs` windows, alternating.
    pub(crate) async fn steady_case(&mut self) {
        let mut variants = vec![Variant::Ours(Durability::Fsync)];
        variants.extend(
            self.args
                .ticks
                .iter()
                .map(|t| Variant::Up(Durability::Fsync, *t)),
        );
        variants.retain(|v| self.args.keep(v));
        let secs = self.args.steady_secs;
        let mut runs: BTreeMap<String, Vec<SteadyRun>> = BTreeMap::new();
        for v in &variants {
            run(self.base.path(), *v, &self.rows, secs.min(2.0)).await;
        }
        for rep in 0..self.args.reps {
            for v in alternate(&variants, rep) {
                let started = Instant::now();
                let r = run(self.base.path(), v, &self.rows, secs).await;
                eprintln!(
                    "  steady rep {rep} {:<24} {:>9.0} rows/s p50 {:.2} p99 {:.2} p99.9 {:.2} max {:.1} ms, \
                     {} puts >= {STALL:?}, waits {:?} ({:.0} s){}",
                    v.name(),
                    r.rows_s,
                    r.p50,
                    r.p99,
                    r.p999,
                    r.max,
                    r.stalls,
                    r.waits,
                    started.elapsed().as_secs_f64(),
                    r.err
                        .as_deref()
                        .map(|e| format!(" error: {e}"))
                        .unwrap_or_default()
                );
                runs.entry(v.name()).or_default().push(r);
            }
        }
        let reps = |v: &Variant, f: &dyn Fn(&SteadyRun) -> f64| {
            Reps(
                runs.get(&v.name())
                    .map_or(Vec::new(), |r| r.iter().map(f).collect()),
            )
        };
        let l = limits();
        let r = &mut self.report;
        r.line("### Steady state, 16 producers, 100 x 1 KiB rows per put");
        r.line("");
        r.line(format!(
            "{PRODUCERS} producers, back-to-back puts of {ROWS_PER_PUT} rows ({ROW_BYTES} B each) for {secs} s per \
             repetition; both writers freeze a generation at {} rows or {} MiB and hold at most {} MiB unflushed, \
             so after the first seconds each must flush as fast as it ingests. fsync on both sides. `stalls`: puts \
             that took {STALL:?} or more; `waits`: memwal's backpressure waits (upstream does not report its own).",
            l.memtable_rows,
            l.memtable_bytes >> 20,
            l.unflushed_bytes >> 20
        ));
        r.line("");
        let mut table = Vec::new();
        for v in &variants {
            let errors: Vec<String> = runs.get(&v.name()).map_or(Vec::new(), |r| {
                r.iter().filter_map(|x| x.err.clone()).collect()
            });
            table.push(vec![
                v.name(),
                reps(v, &|r| r.rows_s).show(0),
                reps(v, &|r| r.p50).show(2),
                reps(v, &|r| r.p99).show(2),
                reps(v, &|r| r.p999).show(2),
                reps(v, &|r| r.max).show(1),
                reps(v, &|r| r.stalls as f64).show(0),
                reps(v, &|r| r.waits.map_or(f64::NAN, |w| w as f64)).show(0),
                errors.join("; "),
            ]);
        }
        r.table(
            &[
                "writer", "rows/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "stalls", "waits",
                "errors",
            ],
            &table,
        );
        let ours = Variant::Ours(Durability::Fsync);
        let mut goals = Vec::new();
        for t in self.args.ticks.clone() {
            let up = Variant::Up(Durability::Fsync, t);
            let rows = reps(&ours, &|r| r.rows_s).ratio_to(&reps(&up, &|r| r.rows_s));
            let p99 = reps(&ours, &|r| r.p99).ratio_to(&reps(&up, &|r| r.p99));
            let p999 = reps(&ours, &|r| r.p999).ratio_to(&reps(&up, &|r| r.p999));
            self.report.line(format!(
                "memwal / upstream {t} ms, per repetition: rows/s **{}**, p99 **{}**, p99.9 **{}**.",
                rows.show(2),
                p99.show(2),
                p999.show(2)
            ));
            goals.push((
                format!("Steady state, fsync, upstream tick {t} ms: rows/s ratio >= 1.5"),
                rows,
                true,
            ));
            goals.push((
                format!("Steady state, fsync, upstream tick {t} ms: p99 ratio <= 1"),
                p99,
                false,
            ));
        }
        self.report.line("");
        for (what, m, at_least) in goals {
            if at_least {
                self.goal(what, &m, 2, |x| x >= 1.5);
            } else {
                self.goal(what, &m, 2, |x| x <= 1.0);
            }
        }
    }
}
