//! The `replay` case: a WAL left by an aborted writer (memwal's or
//! upstream's), copied and reopened by each writer: open until ready, then
//! close.

use std::collections::BTreeMap;

use crate::cases;
use crate::stats::{num, Reps};
use crate::writers::{Durability, Variant};
use crate::{alternate, Bench};

impl Bench {
    pub(crate) async fn replay_case(&mut self) {
        let mut readers = vec![
            Variant::Ours(Durability::Fsync),
            Variant::Up(Durability::Fsync, 1),
            Variant::OursBeforeReady(Durability::Fsync),
            Variant::Ours(Durability::NoFsync),
            Variant::Up(Durability::NoFsync, 1),
        ];
        readers.retain(|v| self.args.keep(v));
        self.report.line("### Replay of the same WAL");
        self.report.line("");
        self.report.line(
            "A writer fills a fresh shard's WAL (4 producers x 1000-row puts, memtable limits above the WAL size so nothing \
             is flushed) and is aborted. Each repetition copies that table and opens each writer on the copy: `open` is \
             claim + fence + replay until the writer is ready for puts (memwal queues the replayed generation to its \
             flusher, which publishes it in the background; upstream holds it in its memtable), `close` flushes and \
             publishes what it holds. \
             Each open is checked to hold every row of the WAL. The copy is fresh in the page cache for both writers.",
        );
        self.report.line("");
        let mut table = Vec::new();
        for mb in self.args.replay_mb.clone() {
            for src_writer in self.args.replay_sources.clone() {
                let dir = self.base.path().join("replay-src");
                let src = match cases::fill_wal(dir.clone(), src_writer, &self.rows, mb * 1_000_000)
                    .await
                {
                    Ok(s) => s,
                    Err(e) => {
                        table.push(vec![
                            format!("{mb} MB by {}", src_writer.name()),
                            format!("fill failed: {e}"),
                        ]);
                        continue;
                    }
                };
                let mut runs: BTreeMap<String, Vec<cases::ReplayRun>> = BTreeMap::new();
                for rep in 0..self.args.reps {
                    for v in alternate(&readers, rep) {
                        let r = cases::replay_run(self.base.path(), &src, v).await;
                        eprintln!(
                            "  replay {mb} MB ({}) rep {rep} {:<24} open {:.3} s close {:.3} s{}",
                            src.writer.name(),
                            v.name(),
                            r.open_s,
                            r.close_s,
                            r.err
                                .as_deref()
                                .map(|e| format!(" error: {e}"))
                                .unwrap_or_default()
                        );
                        runs.entry(v.name()).or_default().push(r);
                    }
                }
                let _ = std::fs::remove_dir_all(&dir);
                let get = |v: Variant, f: &dyn Fn(&cases::ReplayRun) -> f64| {
                    Reps(
                        runs.get(&v.name())
                            .map_or(&[][..], |r| &r[..])
                            .iter()
                            .map(f)
                            .collect(),
                    )
                };
                let label = format!(
                    "{} MB / {} entries, by {}",
                    num(src.wal_bytes as f64 / 1e6, 0),
                    src.entries,
                    src.writer.name().trim_end_matches(" 1ms")
                );
                for v in readers.iter().copied() {
                    let open = get(v, &|r| r.open_s);
                    let both = get(v, &|r| r.open_s + r.close_s);
                    let (ratio_open, ratio_both) = if v.is_ours() {
                        let up = Variant::Up(v.durability(), 1);
                        (
                            open.ratio_to(&get(up, &|r| r.open_s)).show(2),
                            both.ratio_to(&get(up, &|r| r.open_s + r.close_s)).show(2),
                        )
                    } else {
                        ("".into(), "".into())
                    };
                    let mut errs: Vec<String> = runs
                        .get(&v.name())
                        .map_or(&[][..], |r| &r[..])
                        .iter()
                        .filter_map(|r| r.err.clone())
                        .collect();
                    errs.dedup();
                    table.push(vec![
                        label.clone(),
                        v.name().trim_end_matches(" 1ms").to_string(),
                        open.show(3),
                        Reps(
                            open.0
                                .iter()
                                .map(|s| src.wal_bytes as f64 / 1e6 / s)
                                .collect(),
                        )
                        .show(0),
                        get(v, &|r| r.close_s).show(3),
                        both.show(3),
                        ratio_open.clone(),
                        ratio_both,
                        errs.join("; "),
                    ]);
                    // Goals judge the default (background publish) only.
                    if matches!(v, Variant::Ours(_)) {
                        let up = Variant::Up(v.durability(), 1);
                        let ratio = open.ratio_to(&get(up, &|r| r.open_s));
                        self.goal(
                            format!(
                                "replay {label}, {}: memwal open / upstream open <= 1",
                                v.durability().name()
                            ),
                            &ratio,
                            2,
                            |m| m <= 1.0,
                        );
                        if mb >= 1000 && v.durability() == Durability::Fsync {
                            self.goal(
                                format!("replay {label}, fsync: memwal claim + replay < 5 s"),
                                &open,
                                2,
                                |m| m < 5.0,
                            );
                        }
                    }
                }
            }
        }
        self.report.table(
            &[
                "WAL",
                "writer",
                "open s",
                "open MB/s",
                "close s",
                "open + close s",
                "open / upstream",
                "open+close / upstream",
                "errors",
            ],
            &table,
        );
    }
}
