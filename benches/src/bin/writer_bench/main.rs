//! memwal's `ShardWriter` against upstream lance's
//! `lance::dataset::mem_wal::ShardWriter` (lance 14.0.2, public API only)
//! at equal durability, next to the disk's floor measured in the same run.
//!
//! Cases (`--cases`, comma-separated; default all):
//! - `lone`: 1 producer x 1000-row puts (1 MiB), every writer, plus one
//!   bare durable create of the same bytes as one WAL entry;
//! - `multi`: 16 producers x 100-row puts;
//! - `large`: 1 producer x 8000-row puts (8 MiB) with fsync, plus the disk's
//!   sequential fdatasync bandwidth in 8 MiB writes;
//! - `replay`: a WAL left by an aborted writer (memwal's and upstream's),
//!   copied and reopened by each writer: open until ready, then close;
//! - `memory`: live heap a writer holds per byte of Arrow payload it
//!   buffers;
//! - `overload`: 4 producers against small memory limits: peak heap and RSS;
//! - `steady`: 16 producers x 100-row puts for `--steady-secs` (30) with
//!   64 MiB generations and 256 MiB unflushed at most on both sides: the
//!   steady state, where both writers flush as fast as they ingest
//!   (p50, p99, p99.9, stalls, backpressure waits).
//!
//! Every case runs a warm-up, then `--reps` repetitions that alternate the
//! writers (ours, upstream, ..., reversed on odd repetitions); tables show
//! the median and the range over repetitions, ratios are taken per
//! repetition (pairs that ran back to back) and then summarized.
//!
//! Run by hand (release): `cargo run --release -p memwal-benches --bin
//! writer_bench -- [--cases lone,multi,large,replay,memory,overload,steady]
//! [--reps 5] [--secs 5] [--ticks 100,5,1] [--replay-mb 200,1000]
//! [--replay-sources memwal,upstream] [--data /var/tmp] [--out DIR]`.
//! The report is printed and written into `DIR/RESULTS.md` (default: this
//! crate's directory), replacing the bench's previous section.

mod args;
mod cases;
mod floor;
mod load;
mod memory;
mod replay;
mod report;
mod rows;
mod stats;
mod steady;
mod writers;

use std::collections::BTreeMap;

use args::{parse_args, Args, Case};
use cases::{PutRun, Shape};
use report::Report;
use rows::{Rows, ROW_BYTES};
use stats::{num, pct_ms, Reps};
use writers::{Durability, Limits, Variant};

#[global_allocator]
static ALLOC: memory::Counting = memory::Counting;

/// Every run of one writer in one case, in repetition order.
trait Series {
    fn reps(&self, f: impl Fn(&PutRun) -> f64) -> Reps;
    fn errors(&self) -> String;
}

impl Series for [PutRun] {
    fn reps(&self, f: impl Fn(&PutRun) -> f64) -> Reps {
        Reps(self.iter().map(f).collect())
    }
    fn errors(&self) -> String {
        let mut e: Vec<&str> = self.iter().filter_map(|r| r.err.as_deref()).collect();
        e.dedup();
        e.join("; ")
    }
}

/// The order of `items` in repetition `rep`: as given, reversed on odd ones.
fn alternate<T: Copy>(items: &[T], rep: usize) -> Vec<T> {
    let mut v = items.to_vec();
    if rep % 2 == 1 {
        v.reverse();
    }
    v
}

fn throughput_variants(ticks: &[u64]) -> Vec<Variant> {
    let mut v = Vec::new();
    for d in [Durability::Fsync, Durability::NoFsync] {
        v.push(Variant::Ours(d));
        if d == Durability::Fsync {
            v.push(Variant::OursBuffered(d));
            v.push(Variant::OursSsTableLance(d));
        }
        for t in ticks {
            v.push(Variant::Up(d, *t));
        }
    }
    v
}

/// A goal, the figure it is judged on, and whether it held.
struct Goal {
    what: String,
    measured: String,
    met: Option<bool>,
}

struct Bench {
    args: Args,
    rows: Rows,
    base: tempfile::TempDir,
    report: Report,
    goals: Vec<Goal>,
}

const LONE_MAX_BYTES: u64 = 2 << 30;
const LARGE_ROWS: usize = 8000;

impl Bench {
    fn goal(
        &mut self,
        what: impl Into<String>,
        measured: &Reps,
        prec: usize,
        ok: impl Fn(f64) -> bool,
    ) {
        let m = measured.median();
        self.goals.push(Goal {
            what: what.into(),
            measured: measured.show(prec),
            met: m.is_finite().then(|| ok(m)),
        });
    }

    /// Puts case: `lone` (with the bare create floor) or `multi`.
    async fn puts_case(&mut self, title: &str, tag: &str, producers: usize, rows_per_put: usize) {
        let mut variants = throughput_variants(&self.args.ticks);
        variants.retain(|v| self.args.keep(v));
        let shape = Shape {
            producers,
            rows_per_put,
            secs: self.args.secs,
            max_bytes: LONE_MAX_BYTES,
            limits: if self.args.no_flush {
                Limits::absorb(LONE_MAX_BYTES)
            } else {
                Limits::equal()
            },
        };
        let lone = producers == 1;
        let entry =
            memwal_wal::codec::encode_entry(1, Some(1), &[self.rows.batch(0, rows_per_put)])
                .expect("the bench's rows encode");
        let mut runs: BTreeMap<String, Vec<PutRun>> = BTreeMap::new();
        let (mut floor_fsync, mut floor_nofsync) = (Reps::default(), Reps::default());
        let warm = Shape {
            secs: (self.args.secs / 5.0).min(1.0),
            ..shape
        };
        for v in &variants {
            cases::put_run(self.base.path(), tag, *v, &self.rows, warm).await;
        }
        for rep in 0..self.args.reps {
            if lone {
                cases::settle();
                let dir = self.base.path().join("floor");
                match floor::bare_creates(&dir, &entry, 200, true) {
                    Ok(l) => floor_fsync.push(pct_ms(&l, 0.5)),
                    Err(e) => eprintln!("floor (fsync): {e}"),
                }
                cases::settle();
                match floor::bare_creates(&dir, &entry, 500, false) {
                    Ok(l) => floor_nofsync.push(pct_ms(&l, 0.5)),
                    Err(e) => eprintln!("floor (nofsync): {e}"),
                }
            }
            for v in alternate(&variants, rep) {
                let r = cases::put_run(self.base.path(), tag, v, &self.rows, shape).await;
                eprintln!(
                    "  {tag} rep {rep} {:<24} {:>9} rows/s p50 {:.2} p99 {:.2} ms ({} puts){}",
                    v.name(),
                    num(r.rows_s, 0),
                    r.p50,
                    r.p99,
                    r.puts,
                    r.err
                        .as_deref()
                        .map(|e| format!(" error: {e}"))
                        .unwrap_or_default()
                );
                runs.entry(v.name()).or_default().push(r);
            }
        }
        let r = &mut self.report;
        r.line(format!("### {title}"));
        r.line("");
        let flushing = if self.args.no_flush {
            "`--no-flush`: memtables hold the whole window (no flush inside it)"
        } else {
            "both writers flush a generation every 65,536 rows (1 GiB unflushed at most)"
        };
        r.line(format!(
            "{producers} producer(s), back-to-back puts of {rows_per_put} rows for {} s (or 2 GiB) per repetition; \
             {flushing}. A put's latency: call until it returns durable. `close` (flushing and publishing what the window left) is \
             outside the window; `rows/s incl. close` divides the same rows by window + close (a writer whose \
             flushes lag behind its puts pays for them there). A window this short compares buffering policies \
             (what each writer leaves for `close`); the `steady` case measures sustained throughput.",
            self.args.secs
        ));
        r.line("");
        let mut table = Vec::new();
        for v in &variants {
            let s = &runs.get(&v.name()).map_or(&[][..], |r| &r[..]);
            let p50 = s.reps(|r| r.p50);
            let mut row = vec![
                v.name(),
                s.reps(|r| r.rows_s).show(0),
                s.reps(|r| r.sustained_rows_s()).show(0),
                s.reps(|r| r.mb_s).show(0),
                p50.show(2),
                s.reps(|r| r.p99).show(2),
                s.reps(|r| r.puts as f64).show(0),
                s.reps(|r| r.close_s).show(2),
            ];
            if lone {
                let floor = match v.durability() {
                    Durability::Fsync => &floor_fsync,
                    Durability::NoFsync => &floor_nofsync,
                };
                row.push(p50.ratio_to(floor).show(2));
            }
            row.push(s.errors());
            table.push(row);
        }
        let mut header = vec![
            "writer",
            "rows/s",
            "rows/s incl. close",
            "MB/s",
            "p50 ms",
            "p99 ms",
            "puts/rep",
            "close s",
        ];
        if lone {
            header.push("p50 / bare create");
        }
        header.push("errors");
        r.table(&header, &table);
        if lone {
            r.line(format!(
                "Bare durable create of one WAL entry of these puts ({} bytes; temp file, write, fsync, link, \
                 directory fsync), p50 of 200 per repetition: **{} ms**; without the fsyncs (p50 of 500): **{} ms**.",
                entry.len(),
                floor_fsync.show(3),
                floor_nofsync.show(3)
            ));
            r.line("");
        }
        r.line("Ratios memwal / upstream at equal durability, per repetition (rows/s: > 1 = memwal faster; latency: < 1 = memwal faster):");
        r.line("");
        let mut ratios = Vec::new();
        for d in [Durability::Fsync, Durability::NoFsync] {
            let ours = &runs
                .get(&Variant::Ours(d).name())
                .map_or(&[][..], |r| &r[..]);
            for t in self.args.ticks.clone() {
                let up = &runs
                    .get(&Variant::Up(d, t).name())
                    .map_or(&[][..], |r| &r[..]);
                let rows_s = ours.reps(|r| r.rows_s).ratio_to(&up.reps(|r| r.rows_s));
                let sustained = ours
                    .reps(|r| r.sustained_rows_s())
                    .ratio_to(&up.reps(|r| r.sustained_rows_s()));
                let p50 = ours.reps(|r| r.p50).ratio_to(&up.reps(|r| r.p50));
                let p99 = ours.reps(|r| r.p99).ratio_to(&up.reps(|r| r.p99));
                ratios.push(vec![
                    d.name().to_string(),
                    format!("{t} ms"),
                    rows_s.show(2),
                    sustained.show(2),
                    p50.show(2),
                    p99.show(2),
                ]);
                if t <= 5 {
                    let label = format!("{title}, {}, upstream tick {t} ms", d.name());
                    self.goal(format!("{label}: rows/s ratio >= 1.5"), &rows_s, 2, |m| {
                        m >= 1.5
                    });
                    self.goal(
                        format!("{label}: rows/s incl. close ratio >= 1.5"),
                        &sustained,
                        2,
                        |m| m >= 1.5,
                    );
                    self.goal(format!("{label}: p50 ratio <= 1"), &p50, 2, |m| m <= 1.0);
                    self.goal(format!("{label}: p99 ratio <= 1"), &p99, 2, |m| m <= 1.0);
                }
            }
        }
        self.report.table(
            &[
                "durability",
                "upstream tick",
                "rows/s",
                "rows/s incl. close",
                "p50",
                "p99",
            ],
            &ratios,
        );
        if lone {
            for (d, floor) in [
                (Durability::Fsync, &floor_fsync),
                (Durability::NoFsync, &floor_nofsync),
            ] {
                let ratio = runs
                    .get(&Variant::Ours(d).name())
                    .map_or(&[][..], |r| &r[..])
                    .reps(|r| r.p50)
                    .ratio_to(floor);
                self.goal(
                    format!("{title}, {}: memwal p50 / bare create <= 1.5", d.name()),
                    &ratio,
                    2,
                    |m| m <= 1.5,
                );
            }
        }
    }

    async fn large_case(&mut self) {
        let mut variants = vec![
            Variant::Ours(Durability::Fsync),
            Variant::OursBuffered(Durability::Fsync),
        ];
        variants.extend(
            self.args
                .ticks
                .iter()
                .map(|t| Variant::Up(Durability::Fsync, *t)),
        );
        variants.retain(|v| self.args.keep(v));
        let shape = Shape {
            producers: 1,
            rows_per_put: LARGE_ROWS,
            secs: self.args.secs,
            max_bytes: LONE_MAX_BYTES,
            limits: Limits::absorb(LONE_MAX_BYTES),
        };
        let chunk = LARGE_ROWS * ROW_BYTES;
        let mut runs: BTreeMap<String, Vec<PutRun>> = BTreeMap::new();
        let mut bw = Reps::default();
        for rep in 0..self.args.reps {
            cases::settle();
            match floor::fdatasync_bandwidth(&self.base.path().join("floor"), 512 << 20, chunk) {
                Ok(b) => bw.push(b),
                Err(e) => eprintln!("fdatasync bandwidth: {e}"),
            }
            for v in alternate(&variants, rep) {
                let r = cases::put_run(self.base.path(), "large", v, &self.rows, shape).await;
                eprintln!("  large rep {rep} {:<24} {:.0} MB/s", v.name(), r.mb_s);
                runs.entry(v.name()).or_default().push(r);
            }
        }
        let r = &mut self.report;
        r.line("### Large puts with fsync");
        r.line("");
        r.line(format!(
            "1 producer, back-to-back puts of {LARGE_ROWS} rows ({} MiB) for {} s (or 2 GiB); memtables hold the whole \
             window (no flush inside it). Floor: sequential writes of {} MiB to one file, each followed by fdatasync \
             (512 MiB per repetition): **{} MB/s**. `MB/s` counts the whole window (the producer builds each batch \
             between puts); `in-put MB/s` the time inside put calls, which is what the floor measures and what \
             the goal is judged on.",
            chunk >> 20,
            self.args.secs,
            chunk >> 20,
            bw.show(0)
        ));
        r.line("");
        let mut table = Vec::new();
        for v in &variants {
            let s = &runs.get(&v.name()).map_or(&[][..], |r| &r[..]);
            let frac = s.reps(|r| r.in_put_mb_s).ratio_to(&bw);
            table.push(vec![
                v.name(),
                s.reps(|r| r.mb_s).show(0),
                s.reps(|r| r.in_put_mb_s).show(0),
                s.reps(|r| r.p50).show(1),
                s.reps(|r| r.p99).show(1),
                frac.show(2),
                s.errors(),
            ]);
            // The goal is judged on memwal's default store only.
            if matches!(v, Variant::Ours(_)) {
                self.goals.push(Goal {
                    what: "large puts, fsync: memwal in-put MB/s / fdatasync bandwidth >= 0.8"
                        .into(),
                    measured: frac.show(2),
                    met: frac.median().is_finite().then(|| frac.median() >= 0.8),
                });
            }
        }
        self.report.table(
            &[
                "writer",
                "MB/s",
                "in-put MB/s",
                "p50 ms",
                "p99 ms",
                "in-put / fdatasync bandwidth",
                "errors",
            ],
            &table,
        );
    }

    async fn memory_case(&mut self) {
        const N: u64 = 200_000;
        let variants = [
            Variant::Ours(Durability::NoFsync),
            Variant::Up(Durability::NoFsync, 1),
        ];
        let mut runs: BTreeMap<String, Vec<cases::MemoryRun>> = BTreeMap::new();
        for rep in 0..self.args.reps {
            for v in alternate(&variants, rep) {
                let r = cases::memory_run(self.base.path(), v, &self.rows, N).await;
                runs.entry(v.name()).or_default().push(r);
            }
        }
        let r = &mut self.report;
        r.line("### Memory per byte buffered");
        r.line("");
        r.line(format!(
            "{} rows put (1000-row puts) into a writer that flushes nothing; heap = live bytes the process allocated \
             more after the puts than before (a counting allocator), against the Arrow payload of the rows \
             (buffers of the put batches).",
            num(N as f64, 0)
        ));
        r.line("");
        let mut table = Vec::new();
        for v in variants.iter().copied() {
            let s = &runs.get(&v.name()).map_or(&[][..], |r| &r[..]);
            let ratio = Reps(
                s.iter()
                    .map(|m| m.heap_bytes as f64 / m.payload_bytes as f64)
                    .collect(),
            );
            let mut errs: Vec<String> = s.iter().filter_map(|m| m.err.clone()).collect();
            errs.dedup();
            table.push(vec![
                v.name().trim_end_matches(" 1ms").to_string(),
                num(
                    s.first().map_or(f64::NAN, |m| m.payload_bytes as f64 / 1e6),
                    1,
                ),
                Reps(s.iter().map(|m| m.heap_bytes as f64 / 1e6).collect()).show(1),
                ratio.show(3),
                Reps(s.iter().map(|m| m.rss_bytes as f64 / 1e6).collect()).show(1),
                errs.join("; "),
            ]);
            if v.is_ours() {
                self.goals.push(Goal {
                    what: "memtable memory / Arrow payload <= 1.3".into(),
                    measured: ratio.show(3),
                    met: ratio.median().is_finite().then(|| ratio.median() <= 1.3),
                });
            }
        }
        self.report.table(
            &[
                "writer",
                "payload MB",
                "heap MB",
                "heap / payload",
                "RSS growth MB",
                "errors",
            ],
            &table,
        );
    }

    async fn overload_case(&mut self) {
        // Upstream needs its memtable size plus its index reservation to fit
        // under the unflushed limit.
        let limits = Limits {
            memtable_rows: 16 << 10,
            memtable_bytes: 48 << 20,
            unflushed_bytes: 64 << 20,
        };
        let shape = Shape {
            producers: 4,
            rows_per_put: 1000,
            secs: self.args.secs,
            max_bytes: 8 << 30,
            limits,
        };
        let variants = [
            Variant::Ours(Durability::Fsync),
            Variant::Up(Durability::Fsync, 1),
        ];
        let mut runs: BTreeMap<String, Vec<cases::OverloadRun>> = BTreeMap::new();
        for rep in 0..self.args.reps {
            for v in alternate(&variants, rep) {
                let r = cases::overload_run(self.base.path(), v, &self.rows, shape).await;
                eprintln!(
                    "  overload rep {rep} {:<24} peak heap +{:.0} MB rss {:.0} MB waits {:?}",
                    v.name(),
                    r.peak_heap_over_base as f64 / 1e6,
                    r.peak_rss as f64 / 1e6,
                    r.waits
                );
                runs.entry(v.name()).or_default().push(r);
            }
        }
        let r = &mut self.report;
        r.line("### Memory under overload");
        r.line("");
        r.line(format!(
            "4 producers x 1000-row puts for {} s with fsync; generations of 16,384 rows (or 48 MiB), at most 64 MiB \
             unflushed (both writers). Peak heap / RSS: the most live heap bytes / resident bytes above the level when \
             the writer had opened, sampled every 5 ms.",
            self.args.secs
        ));
        r.line("");
        let limit = limits.unflushed_bytes as f64;
        let mut table = Vec::new();
        for v in variants.iter().copied() {
            let s = &runs.get(&v.name()).map_or(&[][..], |r| &r[..]);
            let peak = Reps(s.iter().map(|o| o.peak_heap_over_base as f64).collect());
            let ratio = Reps(peak.0.iter().map(|p| p / limit).collect());
            let mut errs: Vec<String> = s.iter().filter_map(|o| o.put.err.clone()).collect();
            errs.dedup();
            table.push(vec![
                v.name(),
                Reps(s.iter().map(|o| o.put.mb_s).collect()).show(0),
                Reps(peak.0.iter().map(|p| p / 1e6).collect()).show(0),
                ratio.show(2),
                Reps(s.iter().map(|o| o.peak_rss as f64 / 1e6).collect()).show(0),
                Reps(
                    s.iter()
                        .map(|o| o.waits.map_or(f64::NAN, |w| w as f64))
                        .collect(),
                )
                .show(0),
                errs.join("; "),
            ]);
            if v.is_ours() {
                self.goals.push(Goal {
                    what: "overload: memwal peak heap growth / max_unflushed_bytes <= 2".into(),
                    measured: ratio.show(2),
                    met: ratio.median().is_finite().then(|| ratio.median() <= 2.0),
                });
            }
        }
        self.report.table(
            &[
                "writer",
                "MB/s",
                "peak heap MB",
                "peak heap / unflushed limit",
                "peak RSS growth MB",
                "backpressure waits",
                "errors",
            ],
            &table,
        );
    }

    fn goals_table(&mut self) {
        let rows: Vec<Vec<String>> = self
            .goals
            .iter()
            .map(|g| {
                vec![
                    g.what.clone(),
                    g.measured.clone(),
                    match g.met {
                        Some(true) => "yes".into(),
                        Some(false) => "**no**".into(),
                        None => "-".into(),
                    },
                ]
            })
            .collect();
        self.report
            .line("### Goals (issue 12), judged on the median per-repetition figure");
        self.report.line("");
        self.report
            .table(&["goal", "measured: median (range)", "met"], &rows);
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("writer_bench: {e}");
            std::process::exit(2);
        }
    };
    // Create the report's directory before the run, not after it: a typo
    // in `--out` must not cost a half-hour run its figures.
    if let Err(e) = std::fs::create_dir_all(&args.out) {
        eprintln!(
            "writer_bench: cannot create the --out directory {}: {e}",
            args.out.display()
        );
        std::process::exit(2);
    }
    let base = match tempfile::Builder::new()
        .prefix("memwal-writer-bench-")
        .tempdir_in(&args.data)
    {
        Ok(d) => d,
        Err(e) => {
            eprintln!(
                "writer_bench: cannot create a directory under {}: {e}",
                args.data.display()
            );
            std::process::exit(2);
        }
    };
    let mut b = Bench {
        rows: Rows::new(),
        report: Report::default(),
        goals: Vec::new(),
        base,
        args,
    };
    b.report
        .line("## `writer_bench` (issue 12: memwal vs upstream lance `ShardWriter`)");
    b.report.line("");
    b.report.line(format!(
        "`cargo run --release -p memwal-benches --bin writer_bench -- {}`",
        b.args.command
    ));
    b.report.line("");
    for l in report::provenance(&b.args.data) {
        b.report.line(l);
    }
    b.report.line(format!(
        "- rows: {ROW_BYTES} B (Int64 primary key `id`, unique per run, + a distinct 1016-byte Utf8 `v`)"
    ));
    b.report.line(format!(
        "- {} repetitions after a warm-up, writers alternating; figures are `median (min-max)` over repetitions",
        b.args.reps
    ));
    b.report.line("- writers: `memwal fsync` (memwal's default local store: file and directory entry fsynced on every object write; \
        whole-object writes of 64 KiB or more, i.e. WAL entries, and multipart uploads, i.e. SSTable data files, through `O_DIRECT`), \
        `memwal nofsync` (object_store `LocalFileSystem` without fsync), `upstream fsync Nms` (lance 14.0.2 `Dataset::mem_wal_writer`, \
        the dataset opened through a session that maps a private scheme to `LocalFileSystem::with_fsync(true)`, WAL flush tick N ms), \
        `upstream nofsync Nms` (the same on a plain local path: lance's local store, no fsync); in the replay case also \
        `memwal fsync publish-before-ready` (`ReplayPublish::BeforeOpenReturns`: open returns once the replayed generation is published, \
        memwal's behaviour before this bench); in the lone and multi cases also `memwal fsync sstable-lance` \
        (`SsTableCompression::Lance`: SSTables encoded as upstream encodes them, memwal's default before this bench); in the lone, \
        multi and large cases also `memwal fsync buffered` (memwal on `LocalFileSystem::with_fsync(true)`: the same durability \
        without the default store's `O_DIRECT` writes of large objects, memwal's default before they were added)");
    b.report.line("- SSTables: each writer its default: memwal writes data files uncompressed (`SsTableCompression::Off`), \
        upstream with lance's default encodings (FSST and block compression)");
    b.report.line("");
    let cases = b.args.cases.clone();
    for c in cases {
        match c {
            Case::Lone => {
                b.puts_case("Lone producer, 1000 x 1 KiB rows per put", "lone", 1, 1000)
                    .await
            }
            Case::Multi => {
                b.puts_case("16 producers, 100 x 1 KiB rows per put", "multi", 16, 100)
                    .await
            }
            Case::Large => b.large_case().await,
            Case::Replay => b.replay_case().await,
            Case::Memory => b.memory_case().await,
            Case::Overload => b.overload_case().await,
            Case::Steady => b.steady_case().await,
        }
    }
    b.goals_table();
    let file = b.args.out.join("RESULTS.md");
    match b.report.write_section(&file) {
        Ok(()) => eprintln!("writer_bench: report written to {}", file.display()),
        Err(e) => {
            eprintln!("writer_bench: writing {}: {e}", file.display());
            std::process::exit(1);
        }
    }
}
