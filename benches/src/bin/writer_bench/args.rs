//! Command-line flags of `writer_bench`; unknown flags are an error.

use std::path::PathBuf;

use crate::writers::{Durability, Variant};

/// One workload of the bench (`--cases`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Case {
    Lone,
    Multi,
    Large,
    Replay,
    Memory,
    Overload,
    Steady,
}

const ALL_CASES: [Case; 7] = [
    Case::Lone,
    Case::Multi,
    Case::Large,
    Case::Replay,
    Case::Memory,
    Case::Overload,
    Case::Steady,
];

impl Case {
    pub fn parse(s: &str) -> Result<Self, String> {
        Ok(match s {
            "lone" => Case::Lone,
            "multi" => Case::Multi,
            "large" => Case::Large,
            "replay" => Case::Replay,
            "memory" => Case::Memory,
            "overload" => Case::Overload,
            "steady" => Case::Steady,
            other => {
                return Err(format!(
                    "unknown case `{other}` (lone, multi, large, replay, memory, overload, steady)"
                ))
            }
        })
    }
}

/// The parsed command line.
pub struct Args {
    pub cases: Vec<Case>,
    pub reps: usize,
    pub secs: f64,
    pub ticks: Vec<u64>,
    pub replay_mb: Vec<u64>,
    pub replay_sources: Vec<Variant>,
    /// Only writers whose name starts with one of these (all when empty).
    pub writers: Vec<String>,
    /// lone/multi: memtables absorb the whole window (no flush inside it).
    pub no_flush: bool,
    /// The steady case's window, seconds.
    pub steady_secs: f64,
    pub data: PathBuf,
    pub out: PathBuf,
    pub command: String,
}

impl Args {
    /// Whether `--writers` selects `v`.
    pub fn keep(&self, v: &Variant) -> bool {
        self.writers.is_empty()
            || self
                .writers
                .iter()
                .any(|w| v.name().starts_with(w.as_str()))
    }
}

fn list<T>(v: &str, flag: &str, f: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    let out: Vec<T> = v
        .split(',')
        .map(|s| f(s.trim()))
        .collect::<Result<_, _>>()?;
    if out.is_empty() {
        return Err(format!("{flag} needs at least one value"));
    }
    Ok(out)
}

/// The flags of this process; `Err` holds the message to print (usage for
/// `--help`, or what was wrong).
pub fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        cases: ALL_CASES.to_vec(),
        reps: 5,
        secs: 5.0,
        ticks: vec![100, 5, 1],
        replay_mb: vec![200, 1000],
        replay_sources: vec![
            Variant::Ours(Durability::NoFsync),
            Variant::Up(Durability::NoFsync, 1),
        ],
        writers: Vec::new(),
        no_flush: false,
        steady_secs: 30.0,
        data: PathBuf::from("/var/tmp"),
        out: PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        command: std::env::args().skip(1).collect::<Vec<_>>().join(" "),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            return Err("usage: writer_bench [--cases lone,multi,large,replay,memory,overload,steady] [--reps N] [--secs S] [--steady-secs S] [--ticks 100,5,1] [--replay-mb 200,1000] [--replay-sources memwal,upstream] [--writers NAME-PREFIX,...] [--no-flush] [--data DIR] [--out DIR]".into());
        }
        if flag == "--no-flush" {
            a.no_flush = true;
            continue;
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let num_err = |e: std::num::ParseIntError| format!("{flag}: {e}");
        match flag.as_str() {
            "--cases" => a.cases = list(&value, &flag, Case::parse)?,
            "--reps" => a.reps = value.parse().map_err(num_err)?,
            "--secs" => a.secs = value.parse().map_err(|e| format!("{flag}: {e}"))?,
            "--steady-secs" => a.steady_secs = value.parse().map_err(|e| format!("{flag}: {e}"))?,
            "--ticks" => a.ticks = list(&value, &flag, |s| s.parse().map_err(num_err))?,
            "--replay-mb" => a.replay_mb = list(&value, &flag, |s| s.parse().map_err(num_err))?,
            "--replay-sources" => {
                a.replay_sources = list(&value, &flag, |s| match s {
                    "memwal" => Ok(Variant::Ours(Durability::NoFsync)),
                    "upstream" => Ok(Variant::Up(Durability::NoFsync, 1)),
                    other => Err(format!(
                        "unknown replay source `{other}` (memwal, upstream)"
                    )),
                })?
            }
            "--writers" => a.writers = list(&value, &flag, |s| Ok(s.to_string()))?,
            "--data" => a.data = PathBuf::from(value),
            "--out" => a.out = PathBuf::from(value),
            other => return Err(format!("unknown flag `{other}` (see --help)")),
        }
    }
    if a.reps == 0 || a.secs.is_nan() || a.secs <= 0.0 || a.ticks.contains(&0) {
        return Err("need --reps >= 1, --secs > 0, ticks > 0".into());
    }
    Ok(a)
}
