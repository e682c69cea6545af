//! Compaction throughput: memwal's compactor merging generations into the
//! base table, next to the floor measured in the same run (one plain lance
//! merge-insert, or append, of the same final rows into an empty table).
//!
//! Rows are 1 KiB (Int64 `id` + 1016-byte distinct Utf8 `v`). Cases:
//! - `keyed0`: keyed table, generations with disjoint keys (0% overlap);
//! - `keyed50`: keyed table, each generation overwrites half of the
//!   previous one's keys (50% overlap);
//! - `append`: append-only table.
//!
//! Setup (not timed): memwal's writer puts every generation (1000-row
//! puts) and flushes it, on the fsync'd local store under /var/tmp. Timed:
//! `Compactor::run_once` over all generations; then, on a fresh empty table
//! in the same store, the floor. Ratio = floor seconds / ours seconds (the
//! goal: >= 0.7).
//!
//! `cargo run --release -p memwal-benches --bin compact_bench -- [--rows N]
//! [--gens G] [--cases keyed0,keyed50,append] [--reps R]`; unknown flags
//! are an error. Not part of CI.

use std::sync::Arc;
use std::time::Instant;

use arrow_array::builder::StringBuilder;
use arrow_array::{ArrayRef, Int64Array, RecordBatch, RecordBatchIterator};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use lance::dataset::builder::DatasetBuilder;
use lance::dataset::{
    InsertBuilder, MergeInsertBuilder, WhenMatched, WhenNotMatched, WriteMode, WriteParams,
};
use lance::Dataset;
use memwal::{ShardId, ShardWriter, ShardWriterConfig};
use memwal_compactor::{Compactor, CompactorConfig};
use memwal_sstable::LanceStore;
use memwal_store::{open_store, StoreLocation};
use memwal_table::{create_table, TableSharding};

const ROW_BYTES: usize = 1024;
const PAYLOAD: usize = ROW_BYTES - 8;
const PUT_ROWS: usize = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Keyed0,
    Keyed50,
    Append,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Keyed0 => "keyed0",
            Case::Keyed50 => "keyed50",
            Case::Append => "append",
        }
    }
    fn keyed(self) -> bool {
        self != Case::Append
    }
    /// First key of generation `g` (of `per` rows).
    fn first_key(self, g: usize, per: usize) -> usize {
        match self {
            Case::Keyed50 => g * per / 2,
            _ => g * per,
        }
    }
}

struct Args {
    rows: usize,
    gens: usize,
    cases: Vec<Case>,
    reps: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        rows: 1_000_000,
        gens: 10,
        cases: vec![Case::Keyed0, Case::Keyed50, Case::Append],
        reps: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--rows" => a.rows = value()?.parse().map_err(|e| format!("--rows: {e}"))?,
            "--gens" => a.gens = value()?.parse().map_err(|e| format!("--gens: {e}"))?,
            "--reps" => a.reps = value()?.parse().map_err(|e| format!("--reps: {e}"))?,
            "--cases" => {
                a.cases = value()?
                    .split(',')
                    .map(|c| match c {
                        "keyed0" => Ok(Case::Keyed0),
                        "keyed50" => Ok(Case::Keyed50),
                        "append" => Ok(Case::Append),
                        other => Err(format!("unknown case `{other}`")),
                    })
                    .collect::<Result<_, _>>()?
            }
            other => return Err(format!("unknown flag `{other}`")),
        }
    }
    if a.gens == 0 || a.rows < a.gens * PUT_ROWS || a.reps == 0 {
        return Err("need --gens >= 1, --rows >= gens * 1000, --reps >= 1".into());
    }
    Ok(a)
}

fn schema(keyed: bool) -> SchemaRef {
    let mut id = Field::new("id", DataType::Int64, false);
    if keyed {
        id = id.with_metadata(
            [(
                "lance-schema:unenforced-primary-key".to_string(),
                "true".to_string(),
            )]
            .into(),
        );
    }
    Arc::new(Schema::new(vec![
        id,
        Field::new("v", DataType::Utf8, false),
    ]))
}

/// Rows `ids` as written by generation `g` (distinct payloads).
fn batch(keyed: bool, ids: impl Iterator<Item = (usize, usize)>) -> RecordBatch {
    let mut keys = Vec::new();
    let mut v = StringBuilder::new();
    let filler = "x".repeat(PAYLOAD);
    for (id, g) in ids {
        keys.push(id as i64);
        let head = format!("g{g}-k{id}-");
        v.append_value(format!("{head}{}", &filler[head.len()..]));
    }
    RecordBatch::try_new(
        schema(keyed),
        vec![
            Arc::new(Int64Array::from(keys)) as ArrayRef,
            Arc::new(v.finish()),
        ],
    )
    .unwrap()
}

struct Table {
    _dir: tempfile::TempDir,
    loc: StoreLocation,
}

async fn table(keyed: bool) -> Table {
    let dir = tempfile::Builder::new()
        .prefix("compact_bench")
        .tempdir_in("/var/tmp")
        .unwrap();
    let loc = open_store(dir.path().join("t").to_str().unwrap()).unwrap();
    create_table(&loc, schema(keyed), &TableSharding::Unsharded)
        .await
        .unwrap();
    Table { _dir: dir, loc }
}

/// Writes every generation with memwal's writer; returns the rows written.
async fn fill(t: &Table, case: Case, rows: usize, gens: usize) -> usize {
    let per = rows / gens;
    let config = ShardWriterConfig {
        memtable_max_bytes: 2 * per * ROW_BYTES + (64 << 20),
        memtable_max_rows: 2 * per + PUT_ROWS,
        max_unflushed_bytes: 4 * per * ROW_BYTES + (256 << 20),
        max_unflushed_age: None,
        ..ShardWriterConfig::default()
    };
    let w = ShardWriter::open(t.loc.clone(), ShardId::random(), config)
        .await
        .unwrap();
    for g in 0..gens {
        let first = case.first_key(g, per);
        for start in (0..per).step_by(PUT_ROWS) {
            let n = PUT_ROWS.min(per - start);
            let ids = (first + start..first + start + n).map(|k| (k, g));
            w.put(&batch(case.keyed(), ids)).await.unwrap();
        }
        w.flush().await.unwrap();
    }
    w.close().await.unwrap();
    per * gens
}

/// The rows a reader must see at the end, in key order (append: every row).
fn final_rows(case: Case, rows: usize, gens: usize) -> Vec<RecordBatch> {
    let per = rows / gens;
    let mut all: Vec<(usize, usize)> = Vec::new();
    match case {
        Case::Append | Case::Keyed0 => {
            for g in 0..gens {
                let first = case.first_key(g, per);
                all.extend((first..first + per).map(|k| (k, g)));
            }
        }
        Case::Keyed50 => {
            let last = case.first_key(gens - 1, per) + per;
            all.extend((0..last).map(|k| (k, (k / (per / 2).max(1)).min(gens - 1))));
        }
    }
    all.chunks(8192)
        .map(|c| batch(case.keyed(), c.iter().copied()))
        .collect()
}

async fn open(loc: &StoreLocation) -> Arc<Dataset> {
    let lance = LanceStore::new(loc.store.clone());
    Arc::new(
        DatasetBuilder::from_uri(lance.uri(&loc.root))
            .with_session(lance.session().clone())
            .with_commit_handler(lance.commit_handler())
            .load()
            .await
            .unwrap(),
    )
}

/// One merge-insert (keyed) or append of `rows` into the empty table;
/// returns its seconds.
async fn floor(t: &Table, case: Case, rows: Vec<RecordBatch>) -> f64 {
    let ds = open(&t.loc).await;
    let n: usize = rows.iter().map(RecordBatch::num_rows).sum();
    let reader = RecordBatchIterator::new(
        rows.into_iter().map(Ok::<_, ArrowError>),
        schema(case.keyed()),
    );
    let started = Instant::now();
    if case.keyed() {
        let mut b = MergeInsertBuilder::try_new(ds, vec!["id".into()]).unwrap();
        b.when_matched(WhenMatched::UpdateAll)
            .when_not_matched(WhenNotMatched::InsertAll);
        b.try_build()
            .unwrap()
            .execute_reader(Box::new(reader) as Box<dyn arrow_array::RecordBatchReader + Send>)
            .await
            .unwrap();
    } else {
        let params = WriteParams {
            mode: WriteMode::Append,
            ..Default::default()
        };
        InsertBuilder::new(ds)
            .with_params(&params)
            .execute_stream(Box::new(reader) as Box<dyn arrow_array::RecordBatchReader + Send>)
            .await
            .unwrap();
    }
    let _ = n;
    started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("compact_bench: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "compact_bench: {} rows of {ROW_BYTES} B in {} generations, {} rep(s)\n",
        args.rows, args.gens, args.reps
    );
    println!("| case | rows written | final rows | ours s | ours rows/s (written) | floor s | floor s / ours s |");
    println!("|---|---|---|---|---|---|---|");
    for case in &args.cases {
        for _ in 0..args.reps {
            let t = table(case.keyed()).await;
            let written = fill(&t, *case, args.rows, args.gens).await;
            let started = Instant::now();
            let reports = Compactor::new(t.loc.clone(), CompactorConfig::default())
                .run_once()
                .await
                .unwrap();
            let secs = started.elapsed().as_secs_f64();
            for r in reports {
                let r = r.unwrap();
                assert_eq!(r.merged.len(), args.gens, "{r:?}");
            }
            let ours = written as f64 / secs;
            let expected = final_rows(*case, args.rows, args.gens);
            let base = open(&t.loc).await;
            let want: usize = expected.iter().map(RecordBatch::num_rows).sum();
            assert_eq!(base.count_rows(None).await.unwrap(), want, "compacted rows");
            drop(base);
            let f = table(case.keyed()).await;
            let fl = floor(&f, *case, expected).await;
            println!(
                "| {} | {written} | {want} | {secs:.2} | {ours:.0} | {fl:.2} | {:.2} |",
                case.name(),
                fl / secs
            );
        }
    }
}
