//! Ingest into an indexed table: memwal against upstream lance's
//! `ShardWriter`, in one run, alternating repetitions.
//!
//! The table (per vector dimension) has an `id` Int64 primary key, a
//! `vec` FixedSizeList<Float32, dim> column with an IVF_PQ index, a `txt`
//! column with an INVERTED index, and an unsharded MemWAL index that
//! maintains every index (pylance's default). Each repetition copies that
//! table and runs, for each writer:
//!
//! 1. window: one producer puts `--batch`-row batches for `--secs`
//!    seconds, generations freezing every `--gen-rows` rows; then `close`
//!    (every row flushed and indexed). Reports in-window rows/s, rows/s
//!    counting close, put p50/p99.
//! 2. flush: a second shard takes `--gen-rows` rows (nothing freezes),
//!    then one explicit flush: its wall time and the process CPU it used.
//!    Upstream builds its memtable indexes while rows are put (that CPU is
//!    in its put figures); memwal builds them here.
//! 3. recall: 50 queries (fresh vectors, slightly perturbed) against that
//!    generation's SSTable, top 10 through its own index (`fast_search`)
//!    against brute force, at lance's default search breadth (ef = 1.5 k,
//!    what upstream's LSM planner uses), at ef = 100, and re-ranked with
//!    `refine` 4; once on that generation (uniform random vectors) and once
//!    on a second one whose vectors lie near a 16-d linear manifold (the
//!    low intrinsic dimension of real embeddings).
//!
//! Writers: `memwal` (fsync, its default local store), `memwal noindex`
//! (the same table with an empty maintained list: the put path without
//! index work) and `upstream 1ms` (lance's writer through an fsync'd
//! `LocalFileSystem`, WAL flush tick 1 ms: equal durability, its best
//! tick). Usage:
//!
//! `cargo run --release -p memwal-benches --bin index_bench -- [--dims 128,768] [--reps 3] [--secs 5] [--batch 200] [--gen-rows 20000] [--base 5000] [--dir /var/tmp/index-bench]`

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{
    ArrayRef, FixedSizeListArray, Float32Array, Int64Array, RecordBatch, RecordBatchIterator,
    StringArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use futures::TryStreamExt;
use lance::dataset::builder::DatasetBuilder;
use lance::dataset::mem_wal::{
    DatasetMemWalExt, ShardWriter as UpWriter, ShardWriterConfig as UpConfig,
};
use lance::dataset::{Dataset, WriteParams};
use lance::index::vector::VectorIndexParams;
use lance::index::DatasetIndexExt;
use lance_index::scalar::InvertedIndexParams;
use lance_index::IndexType;
use memwal::{ShardId, ShardWriter as OurWriter, ShardWriterConfig as OurConfig};
use memwal_sstable::{DistanceType, LanceStore};
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjPath;
use uuid::Uuid;

struct Args {
    dims: Vec<i32>,
    reps: usize,
    secs: u64,
    batch: usize,
    gen_rows: usize,
    base: usize,
    dir: PathBuf,
}

fn args() -> Args {
    let mut a = Args {
        dims: vec![128, 768],
        reps: 3,
        secs: 5,
        batch: 200,
        gen_rows: 20_000,
        base: 5_000,
        dir: PathBuf::from("/var/tmp/index-bench"),
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let (k, v) = (
            pair[0].as_str(),
            pair.get(1).map(String::as_str).unwrap_or(""),
        );
        match k {
            "--dims" => a.dims = v.split(',').map(|d| d.parse().expect("--dims")).collect(),
            "--reps" => a.reps = v.parse().expect("--reps"),
            "--secs" => a.secs = v.parse().expect("--secs"),
            "--batch" => a.batch = v.parse().expect("--batch"),
            "--gen-rows" => a.gen_rows = v.parse().expect("--gen-rows"),
            "--base" => a.base = v.parse().expect("--base"),
            "--dir" => a.dir = PathBuf::from(v),
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

fn schema(dim: i32) -> SchemaRef {
    let key = Field::new("id", DataType::Int64, false).with_metadata(
        [(
            "lance-schema:unenforced-primary-key".to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    Arc::new(Schema::new(vec![
        key,
        Field::new(
            "vec",
            DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), dim),
            true,
        ),
        Field::new("txt", DataType::Utf8, true),
    ]))
}

/// A deterministic value in [0, 1) for (id, j).
fn unit(id: i64, j: u64) -> f32 {
    let x = (id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ j.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (x.wrapping_mul(0x94D0_49BB_1331_11EB) >> 40) as f32 / (1u64 << 24) as f32
}

/// Row `id`'s vector: uniform random in [0, 1)^dim.
fn vector(id: i64, dim: i32) -> impl Iterator<Item = f32> {
    (0..dim as u64).map(move |j| unit(id, j))
}

/// Latent dimensions of [`Data::Manifold`] vectors.
const LATENT: u64 = 16;

/// What the vectors of a generation look like.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Data {
    /// Uniform random: no neighbourhood structure (the worst case for any
    /// graph index: every point's neighbours are nearly equidistant).
    Uniform,
    /// A fixed random linear map of 16-d uniform latent vectors into `dim`
    /// dimensions, plus 1% noise: the low intrinsic dimension of real
    /// embeddings.
    Manifold,
}

impl Data {
    fn vector(self, id: i64, dim: i32) -> Vec<f32> {
        match self {
            Data::Uniform => vector(id, dim).collect(),
            Data::Manifold => {
                let z: Vec<f32> = (0..LATENT).map(|i| unit(id, 5000 + i) - 0.5).collect();
                (0..dim as u64)
                    .map(|j| {
                        let x: f32 = z
                            .iter()
                            .enumerate()
                            .map(|(i, zi)| {
                                zi * (unit(-1 - (j * LATENT) as i64 - i as i64, 7) - 0.5)
                            })
                            .sum();
                        x + 0.01 * (unit(id, j) - 0.5)
                    })
                    .collect()
            }
        }
    }

    /// A query near row `id`: its vector moved a little (in latent space
    /// for the manifold, so the query stays on it).
    fn query(self, id: i64, dim: i32) -> Vec<f32> {
        match self {
            Data::Uniform => vector(id, dim)
                .enumerate()
                .map(|(j, x)| x + 0.01 * unit(id + 7, j as u64))
                .collect(),
            Data::Manifold => {
                let near = self.vector(id, dim);
                let other = self.vector(id + 7, dim);
                near.iter()
                    .zip(other)
                    .map(|(a, b)| a + 0.02 * (b - a))
                    .collect()
            }
        }
    }
}

const WORDS: usize = 2000;

fn batch(ids: std::ops::Range<i64>, dim: i32) -> RecordBatch {
    batch_of(Data::Uniform, ids, dim)
}

fn batch_of(data: Data, ids: std::ops::Range<i64>, dim: i32) -> RecordBatch {
    let values: Vec<f32> = ids.clone().flat_map(|id| data.vector(id, dim)).collect();
    let vecs = FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Float32, true)),
        dim,
        Arc::new(Float32Array::from(values)),
        None,
    )
    .unwrap();
    let txt = ids.clone().map(|id| {
        (0..8)
            .map(|j| format!("w{}", (unit(id, 1000 + j) * WORDS as f32) as usize))
            .collect::<Vec<_>>()
            .join(" ")
    });
    RecordBatch::try_new(
        schema(dim),
        vec![
            Arc::new(Int64Array::from_iter_values(ids)) as ArrayRef,
            Arc::new(vecs),
            Arc::new(StringArray::from_iter_values(txt)),
        ],
    )
    .unwrap()
}

/// The template table of `dim`, with (`indexed`) or without maintained
/// indexes.
async fn template(a: &Args, dim: i32, indexed: bool) -> PathBuf {
    let dir = a.dir.join(format!(
        "template-{dim}-{}",
        if indexed { "idx" } else { "noidx" }
    ));
    if dir.join("_versions").exists() {
        return dir;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let uri = dir.to_str().unwrap();
    let base = batch(0..a.base as i64, dim);
    let mut ds = Dataset::write(
        RecordBatchIterator::new(vec![Ok(base)], schema(dim)),
        uri,
        Some(WriteParams::default()),
    )
    .await
    .unwrap();
    let params = VectorIndexParams::ivf_pq(16, 8, (dim / 8) as usize, DistanceType::L2, 20);
    ds.create_index(
        &["vec"],
        IndexType::Vector,
        Some("vec_idx".into()),
        &params,
        true,
    )
    .await
    .unwrap();
    ds.create_index(
        &["txt"],
        IndexType::Inverted,
        Some("txt_fts".into()),
        &InvertedIndexParams::default(),
        true,
    )
    .await
    .unwrap();
    let mut init = ds.initialize_mem_wal().unsharded();
    if !indexed {
        init = init.maintained_indexes(Vec::<String>::new());
    }
    init.execute().await.unwrap();
    dir
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Variant {
    Memwal,
    MemwalNoIndex,
    Upstream,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Memwal => "memwal",
            Variant::MemwalNoIndex => "memwal noindex",
            Variant::Upstream => "upstream 1ms",
        }
    }
}

enum Writer {
    Ours(OurWriter),
    Up(Box<UpWriter>),
}

async fn open(v: Variant, dir: &Path, shard: Uuid, memtable_rows: usize) -> Writer {
    match v {
        Variant::Memwal | Variant::MemwalNoIndex => {
            let config = OurConfig {
                memtable_max_rows: memtable_rows,
                memtable_max_bytes: 4 << 30,
                max_unflushed_bytes: 8 << 30,
                max_unflushed_age: None,
                ..Default::default()
            };
            Writer::Ours(
                OurWriter::open(dir.to_str().unwrap(), ShardId::from(shard), config)
                    .await
                    .unwrap(),
            )
        }
        Variant::Upstream => {
            let fs = LocalFileSystem::new_with_prefix(dir)
                .unwrap()
                .with_fsync(true);
            let lance = LanceStore::new(Arc::new(fs));
            let ds = DatasetBuilder::from_uri(lance.uri(&ObjPath::default()))
                .with_session(lance.session().clone())
                .load()
                .await
                .unwrap();
            let config = UpConfig::new(shard)
                .with_max_wal_flush_interval(Duration::from_millis(1))
                .with_max_memtable_rows(memtable_rows)
                .with_max_memtable_size(4 << 30)
                .with_max_unflushed_memtable_bytes(8 << 30)
                .with_stats_log_interval(None);
            Writer::Up(Box::new(ds.mem_wal_writer(shard, config).await.unwrap()))
        }
    }
}

impl Writer {
    async fn put(&self, b: RecordBatch) {
        match self {
            Writer::Ours(w) => {
                w.put(&b).await.unwrap();
            }
            Writer::Up(w) => {
                w.put(vec![b]).await.unwrap();
            }
        }
    }

    async fn flush(&self) {
        match self {
            Writer::Ours(w) => w.flush().await.unwrap(),
            Writer::Up(w) => w.force_freeze_active().await.unwrap().wait().await.unwrap(),
        }
    }

    async fn close(self) {
        match self {
            Writer::Ours(w) => w.close().await.unwrap(),
            Writer::Up(w) => (*w).close().await.unwrap(),
        }
    }
}

/// The process's CPU time so far (user + system, all threads).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks: f64 = fields.get(11).and_then(|f| f.parse().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|f| f.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

#[derive(Default)]
struct Figures(BTreeMap<(&'static str, Variant), Vec<f64>>);

impl Figures {
    fn push(&mut self, what: &'static str, v: Variant, x: f64) {
        self.0.entry((what, v)).or_default().push(x);
    }
    fn median(&self, what: &'static str, v: Variant) -> f64 {
        let mut xs = self.0.get(&(what, v)).cloned().unwrap_or_default();
        xs.sort_by(f64::total_cmp);
        xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
    }
    /// Median of per-repetition ratios a/b.
    fn ratio(&self, what: &'static str, a: Variant, b: Variant) -> f64 {
        let (xa, xb) = (self.0.get(&(what, a)), self.0.get(&(what, b)));
        let mut r: Vec<f64> = match (xa, xb) {
            (Some(xa), Some(xb)) => xa.iter().zip(xb).map(|(x, y)| x / y).collect(),
            _ => return f64::NAN,
        };
        r.sort_by(f64::total_cmp);
        r.get(r.len() / 2).copied().unwrap_or(f64::NAN)
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// The one SSTable directory of `shard` under `table`.
fn sstable_dir(table: &Path, shard: Uuid) -> PathBuf {
    let dir = table.join("_mem_wal").join(shard.to_string());
    std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains("_gen_"))
        })
        .unwrap_or_else(|| panic!("no SSTable under {}", dir.display()))
}

/// How a recall query searches: `ef` is the HNSW search breadth (`None`:
/// lance's default, 1.5 k), `refine` re-ranks that many times k candidates
/// by exact distance (lance's `refine_factor`, which upstream's LSM planner
/// passes to SSTable arms).
#[derive(Clone, Copy)]
struct Search {
    ef: Option<usize>,
    refine: Option<u32>,
}

/// The recall columns: each data kind at each search setting.
const RECALLS: [(&str, Data, Search); 6] = [
    (
        "recall@10",
        Data::Uniform,
        Search {
            ef: None,
            refine: None,
        },
    ),
    (
        "recall@10 ef=100",
        Data::Uniform,
        Search {
            ef: Some(100),
            refine: None,
        },
    ),
    (
        "recall@10 refine=4",
        Data::Uniform,
        Search {
            ef: None,
            refine: Some(4),
        },
    ),
    (
        "manifold recall@10",
        Data::Manifold,
        Search {
            ef: None,
            refine: None,
        },
    ),
    (
        "manifold recall@10 ef=100",
        Data::Manifold,
        Search {
            ef: Some(100),
            refine: None,
        },
    ),
    (
        "manifold recall@10 refine=4",
        Data::Manifold,
        Search {
            ef: None,
            refine: Some(4),
        },
    ),
];

async fn recall_at_10(
    sst: &Path,
    first: i64,
    rows: usize,
    dim: i32,
    data: Data,
    search: Search,
) -> f64 {
    let ds = Dataset::open(sst.to_str().unwrap()).await.unwrap();
    let queries = 50;
    let mut hits = 0usize;
    for i in 0..queries {
        let id = first + (i * rows / queries) as i64;
        let q = Float32Array::from(data.query(id, dim));
        let ids = |b: Vec<RecordBatch>| -> Vec<i64> {
            b.iter()
                .flat_map(|b| {
                    b.column_by_name("id")
                        .unwrap()
                        .as_primitive::<Int64Type>()
                        .values()
                        .to_vec()
                })
                .collect()
        };
        let mut ann = ds.scan();
        ann.project(&["id"])
            .unwrap()
            .nearest("vec", &q, 10)
            .unwrap()
            .fast_search();
        if let Some(ef) = search.ef {
            ann.ef(ef);
        }
        if let Some(factor) = search.refine {
            ann.refine(factor);
        }
        let got = ids(ann
            .try_into_stream()
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap());
        let mut exact = ds.scan();
        exact
            .project(&["id"])
            .unwrap()
            .nearest("vec", &q, 10)
            .unwrap()
            .use_index(false);
        let want = ids(exact
            .try_into_stream()
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap());
        hits += got.iter().filter(|g| want.contains(g)).count();
    }
    hits as f64 / (queries * 10) as f64
}

async fn run_one(a: &Args, dim: i32, v: Variant, rep: usize, f: &mut Figures) {
    let template = template(a, dim, v != Variant::MemwalNoIndex).await;
    let dir = a
        .dir
        .join(format!("run-{dim}-{rep}-{}", v.name().replace(' ', "-")));
    let _ = std::fs::remove_dir_all(&dir);
    let ok = std::process::Command::new("cp")
        .arg("-a")
        .arg(&template)
        .arg(&dir)
        .status()
        .unwrap();
    assert!(ok.success());

    // 1. The window.
    let w = open(v, &dir, Uuid::new_v4(), a.gen_rows).await;
    let start = Instant::now();
    let mut next = 1_000_000_000i64;
    let mut lat = Vec::new();
    while start.elapsed() < Duration::from_secs(a.secs) {
        let b = batch(next..next + a.batch as i64, dim);
        next += a.batch as i64;
        let t = Instant::now();
        w.put(b).await;
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let window = start.elapsed().as_secs_f64();
    let rows = (next - 1_000_000_000) as f64;
    let t = Instant::now();
    w.close().await;
    let close = t.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    f.push("rows/s", v, rows / window);
    f.push("rows/s incl. close", v, rows / (window + close));
    f.push("p50 ms", v, pct(&lat, 0.5));
    f.push("p99 ms", v, pct(&lat, 0.99));
    f.push("close s", v, close);

    // 2. One generation, flushed explicitly.
    let first = 2_000_000_000i64;
    let (shard, cpu) = one_generation(v, &dir, a, dim, Data::Uniform, first).await;
    for (what, x) in [
        ("gen put s", cpu.put_s),
        ("gen put CPU s", cpu.put_cpu_s),
        ("flush s", cpu.flush_s),
        ("flush CPU s", cpu.flush_cpu_s),
    ] {
        f.push(what, v, x);
    }

    // 3. Recall of a generation's own index: that one (uniform vectors),
    // and one of manifold vectors.
    if v != Variant::MemwalNoIndex {
        let (manifold, _) = one_generation(v, &dir, a, dim, Data::Manifold, first).await;
        for (col, data, search) in RECALLS {
            let sst = sstable_dir(
                &dir,
                if data == Data::Uniform {
                    shard
                } else {
                    manifold
                },
            );
            f.push(
                col,
                v,
                recall_at_10(&sst, first, a.gen_rows, dim, data, search).await,
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Wall and CPU time of one generation's puts and its explicit flush.
struct GenerationCost {
    put_s: f64,
    put_cpu_s: f64,
    flush_s: f64,
    flush_cpu_s: f64,
}

/// A fresh shard takes `--gen-rows` rows of `data` (nothing freezes), one
/// explicit flush publishes them as one SSTable, and the writer closes.
async fn one_generation(
    v: Variant,
    dir: &Path,
    a: &Args,
    dim: i32,
    data: Data,
    first: i64,
) -> (Uuid, GenerationCost) {
    let shard = Uuid::new_v4();
    let w = open(v, dir, shard, a.gen_rows * 4).await;
    let cpu0 = cpu_seconds();
    let t = Instant::now();
    for s in (0..a.gen_rows).step_by(a.batch) {
        let n = a.batch.min(a.gen_rows - s) as i64;
        let ids = first + s as i64..first + s as i64 + n;
        w.put(batch_of(data, ids, dim)).await;
    }
    let put_cpu_s = cpu_seconds() - cpu0;
    let put_s = t.elapsed().as_secs_f64();
    let cpu1 = cpu_seconds();
    let t = Instant::now();
    w.flush().await;
    let cost = GenerationCost {
        put_s,
        put_cpu_s,
        flush_s: t.elapsed().as_secs_f64(),
        flush_cpu_s: cpu_seconds() - cpu1,
    };
    w.close().await;
    (shard, cost)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let a = args();
    std::fs::create_dir_all(&a.dir).unwrap();
    let variants = [Variant::Memwal, Variant::Upstream, Variant::MemwalNoIndex];
    for &dim in &a.dims {
        let mut f = Figures::default();
        for rep in 0..a.reps {
            // Alternate the order so neither writer always runs first.
            let order: Vec<Variant> = if rep % 2 == 0 {
                variants.to_vec()
            } else {
                variants.iter().rev().copied().collect()
            };
            for v in order {
                eprintln!("dim {dim} rep {rep}: {}", v.name());
                run_one(&a, dim, v, rep, &mut f).await;
            }
        }
        println!(
            "\n## dim {dim}: {} reps, {} s window, {}-row batches, {} rows per generation, {} base rows (medians)\n",
            a.reps, a.secs, a.batch, a.gen_rows, a.base
        );
        let mut cols = vec![
            "rows/s",
            "rows/s incl. close",
            "p50 ms",
            "p99 ms",
            "close s",
            "gen put CPU s",
            "flush s",
            "flush CPU s",
        ];
        cols.extend(RECALLS.iter().map(|(col, ..)| *col));
        println!("| writer | {} |", cols.join(" | "));
        println!("|---|{}", "---|".repeat(cols.len()));
        for v in variants {
            let cells: Vec<String> = cols
                .iter()
                .map(|c| {
                    let m = f.median(c, v);
                    if m.is_nan() {
                        "-".into()
                    } else if m >= 100.0 {
                        format!("{m:.0}")
                    } else {
                        format!("{m:.3}")
                    }
                })
                .collect();
            println!("| {} | {} |", v.name(), cells.join(" | "));
        }
        println!(
            "\nmemwal / upstream (median of per-rep ratios): rows/s {:.2}x, rows/s incl. close {:.2}x, p50 {:.2}x, p99 {:.2}x; memwal p50 indexed / noindex {:.2}x",
            f.ratio("rows/s", Variant::Memwal, Variant::Upstream),
            f.ratio("rows/s incl. close", Variant::Memwal, Variant::Upstream),
            f.ratio("p50 ms", Variant::Memwal, Variant::Upstream),
            f.ratio("p99 ms", Variant::Memwal, Variant::Upstream),
            f.ratio("p50 ms", Variant::Memwal, Variant::MemwalNoIndex),
        );
    }
}
