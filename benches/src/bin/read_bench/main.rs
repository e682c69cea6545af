//! Fresh reads: the daemon's read path (`TableHost`) against upstream
//! lance's LSM readers on the same shape of data, in one run.
//!
//! Each side gets its own unsharded table: `--base` rows in the base
//! table, `--sstable` rows flushed into one published SSTable, `--memtable`
//! rows unflushed (held by the side's writer). memwal's side is a
//! `TableHost` (what the daemon serves) writing with memwal's writer;
//! upstream's is lance's own `ShardWriter`, read by its planners with the
//! writer's in-memory memtables (read-your-writes in its process).
//!
//! Measured, alternating memwal / upstream call by call:
//! 1. point lookups of one key per level: `TableHost::lookup_rows` against
//!    `LsmPointLookupPlanner::lookup` over a view loaded once
//!    (`upstream, view held`) and over a view read per lookup (`upstream,
//!    view per read`: what memwal does, so every read sees every ack);
//! 2. whole-table scans: `TableHost::read_rows` against `LsmScanner`;
//! 3. freshness: a row put, then looked up at once: is it visible;
//! 4. the same lookup as SQL over Flight SQL (`SELECT * FROM t WHERE id =
//!    k`, a local gRPC server) against the embedded call;
//! 5. memwal's put latency alone and while a task scans the table in a
//!    loop;
//! 6. the query forms of a table larger than the query budget (64 MiB
//!    here): `count(*)`, a full scan, one column, a selective filter,
//!    `LIMIT 10`, a `GROUP BY` over every row, as SQL over Flight SQL
//!    against `LsmScanner` in process, with each side's peak RSS;
//! 7. vector search over unflushed rows (`--vector-rows` of `--dim`
//!    float32s, 1000 indexed base rows): `TableHost::nearest` (its
//!    memtable arm is exact) against `LsmScanner::nearest` with upstream's
//!    writer's memtables (which it indexes with HNSW as rows arrive).
//!
//! `cargo run --release -p memwal-benches --bin read_bench -- [--base 100000] [--sstable 50000] [--memtable 20000] [--lookups 500] [--scans 5] [--secs 3] [--vector-rows 100000] [--dim 128] [--dir /var/tmp/read-bench]`

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{ArrayRef, Int64Array, RecordBatch, RecordBatchIterator, StringArray};
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use datafusion::scalar::ScalarValue;
use futures::TryStreamExt;
use lance::dataset::mem_wal::scanner::{LsmDataSourceCollector, LsmPointLookupPlanner};
use lance::dataset::mem_wal::{DatasetMemWalExt, LsmScanner, ShardWriter as UpWriter};
use lance::dataset::{Dataset, WriteParams};
use memwal::ShardWriterConfig;
use memwal_server::TableHost;
use memwal_table::TableView;
use uuid::Uuid;

mod forms;

struct Args {
    base: i64,
    sstable: i64,
    memtable: i64,
    lookups: usize,
    scans: usize,
    secs: u64,
    vector_rows: i64,
    dim: i32,
    dir: PathBuf,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        base: 100_000,
        sstable: 50_000,
        memtable: 20_000,
        lookups: 500,
        scans: 5,
        secs: 3,
        vector_rows: 100_000,
        dim: 128,
        dir: PathBuf::from("/var/tmp/read-bench"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = || value.parse::<i64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--base" => a.base = num()?,
            "--sstable" => a.sstable = num()?,
            "--memtable" => a.memtable = num()?,
            "--lookups" => a.lookups = num()? as usize,
            "--scans" => a.scans = num()? as usize,
            "--secs" => a.secs = num()? as u64,
            "--vector-rows" => a.vector_rows = num()?,
            "--dim" => a.dim = num()? as i32,
            "--dir" => a.dir = PathBuf::from(value),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false).with_metadata(
            [(
                "lance-schema:unenforced-primary-key".to_string(),
                "true".to_string(),
            )]
            .into(),
        ),
        Field::new("v", DataType::Utf8, true),
    ]))
}

/// Rows `from..to`, each with a distinct 100-byte value.
fn rows(from: i64, to: i64) -> RecordBatch {
    let ids: Vec<i64> = (from..to).collect();
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(ids.clone())) as ArrayRef,
            Arc::new(StringArray::from_iter_values(
                ids.iter().map(|i| format!("{i:0>100}")),
            )),
        ],
    )
    .expect("rows")
}

/// `from..to` in batches of 1000 rows.
fn batches(from: i64, to: i64) -> Vec<RecordBatch> {
    (from..to)
        .step_by(1000)
        .map(|s| rows(s, (s + 1000).min(to)))
        .collect()
}

/// An unsharded table at `dir` holding rows `0..base`.
async fn base_table(dir: &Path, base: i64) -> Result<String, String> {
    unsharded_table(dir, schema(), batches(0, base), false).await
}

/// An unsharded table at `dir` (replaced) holding `rows`, with an
/// IVF_FLAT index `vec_idx` on `vec` when `vector_index`, and a MemWAL
/// index maintaining every index.
async fn unsharded_table(
    dir: &Path,
    schema: SchemaRef,
    rows: Vec<RecordBatch>,
    vector_index: bool,
) -> Result<String, String> {
    use lance::index::vector::VectorIndexParams;
    use lance::index::DatasetIndexExt;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let uri = dir.to_str().ok_or("path")?.to_string();
    let mut ds = Dataset::write(
        RecordBatchIterator::new(rows.into_iter().map(Ok), schema),
        &uri,
        Some(WriteParams::default()),
    )
    .await
    .map_err(|e| e.to_string())?;
    if vector_index {
        let params = VectorIndexParams::ivf_flat(1, memwal_sstable::DistanceType::L2);
        ds.create_index(
            &["vec"],
            lance_index::IndexType::Vector,
            Some("vec_idx".into()),
            &params,
            true,
        )
        .await
        .map_err(|e| e.to_string())?;
    }
    ds.initialize_mem_wal()
        .unsharded()
        .execute()
        .await
        .map_err(|e| e.to_string())?;
    Ok(uri)
}

fn big_memtables() -> ShardWriterConfig {
    ShardWriterConfig {
        memtable_max_rows: 1 << 22,
        memtable_max_bytes: 2 << 30,
        max_unflushed_bytes: 4 << 30,
        max_unflushed_age: None,
        ..Default::default()
    }
}

fn up_config(shard: Uuid) -> lance::dataset::mem_wal::ShardWriterConfig {
    lance::dataset::mem_wal::ShardWriterConfig::new(shard)
        .with_max_wal_flush_interval(Duration::from_millis(1))
        .with_max_memtable_rows(1 << 22)
        .with_max_memtable_size(2 << 30)
        .with_max_unflushed_memtable_bytes(4 << 30)
        .with_stats_log_interval(None)
}

/// Upstream's side: the table, its shard and the writer holding the
/// unflushed rows.
struct Upstream {
    uri: String,
    shard: Uuid,
    writer: UpWriter,
}

impl Upstream {
    async fn view(&self) -> Result<TableView, String> {
        let loc = memwal_store::open_store(&self.uri).map_err(|e| e.to_string())?;
        memwal_table::table_view(&loc, None, &memwal_store::RetryPolicy::default())
            .await
            .map_err(|e| e.to_string())
    }

    async fn lookup(&self, view: &TableView, key: i64) -> Result<usize, String> {
        let refs = self
            .writer
            .in_memory_memtable_refs()
            .await
            .map_err(|e| e.to_string())?;
        let collector = LsmDataSourceCollector::new(view.base.clone(), view.snapshots())
            .with_in_memory_memtables(self.shard, refs);
        let planner = LsmPointLookupPlanner::new(
            collector,
            vec!["id".into()],
            Arc::new(Schema::from(view.base.schema())),
        )
        .map_err(|e| e.to_string())?
        .with_session(view.base.session());
        let found = planner
            .lookup(&[ScalarValue::Int64(Some(key))], None)
            .await
            .map_err(|e| e.to_string())?;
        Ok(found.map_or(0, |b| b.num_rows()))
    }

    /// `LsmScanner` over `view` and this side's writer's memtables.
    async fn scanner(&self, view: &TableView) -> Result<LsmScanner, String> {
        let refs = self
            .writer
            .in_memory_memtable_refs()
            .await
            .map_err(|e| e.to_string())?;
        Ok(
            LsmScanner::new(view.base.clone(), view.snapshots(), vec!["id".into()])
                .with_in_memory_memtables(self.shard, refs),
        )
    }

    async fn scan(&self, view: &TableView) -> Result<usize, String> {
        let b = self
            .scanner(view)
            .await?
            .try_into_batch()
            .await
            .map_err(|e| e.to_string())?;
        Ok(b.num_rows())
    }
}

async fn setup(a: &Args) -> Result<(Arc<TableHost>, Upstream), String> {
    let (sst_end, mem_end) = (a.base + a.sstable, a.base + a.sstable + a.memtable);
    let ours_uri = base_table(&a.dir.join("ours"), a.base).await?;
    let loc = memwal_store::open_store(&ours_uri).map_err(|e| e.to_string())?;
    let host = Arc::new(
        TableHost::open("t", loc, big_memtables())
            .await
            .map_err(|e| e.to_string())?,
    );
    for b in batches(a.base, sst_end) {
        host.write(&b, false).await.map_err(|e| e.to_string())?;
    }
    host.flush().await.map_err(|e| e.to_string())?;
    for b in batches(sst_end, mem_end) {
        host.write(&b, false).await.map_err(|e| e.to_string())?;
    }

    let uri = base_table(&a.dir.join("upstream"), a.base).await?;
    let shard = Uuid::new_v4();
    let open = || async {
        let ds = Dataset::open(&uri).await.map_err(|e| e.to_string())?;
        ds.mem_wal_writer(shard, up_config(shard))
            .await
            .map_err(|e| e.to_string())
    };
    let w = open().await?;
    for b in batches(a.base, sst_end) {
        w.put(vec![b]).await.map_err(|e| e.to_string())?;
    }
    w.close().await.map_err(|e| e.to_string())?;
    let writer = open().await?;
    for b in batches(sst_end, mem_end) {
        writer.put(vec![b]).await.map_err(|e| e.to_string())?;
    }
    Ok((host, Upstream { uri, shard, writer }))
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A key of each level, by the lookup's index.
fn key(a: &Args, level: &str, i: usize) -> i64 {
    let spread = |n: i64| (i as i64 * 7919) % n;
    match level {
        "base" => spread(a.base),
        "sstable" => a.base + spread(a.sstable),
        _ => a.base + a.sstable + spread(a.memtable),
    }
}

async fn lookups(a: &Args, host: &TableHost, up: &Upstream) -> Result<(), String> {
    println!(
        "\n### Point lookups, one key ({} per level and reader)\n",
        a.lookups
    );
    println!("| level | reader | p50 ms | p99 ms | p50 / upstream view held | p50 / upstream view per read |");
    println!("|---|---|---|---|---|---|");
    let held = up.view().await?;
    for level in ["memtable", "sstable", "base"] {
        let (mut ours, mut up_held, mut up_read) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..a.lookups {
            let k = key(a, level, i);
            let t = Instant::now();
            let got = host
                .lookup_rows(&[ScalarValue::Int64(Some(k))])
                .await
                .map_err(|e| e.to_string())?;
            ours.push(ms(t.elapsed()));
            if got.num_rows() != 1 {
                return Err(format!("memwal lookup of {k}: {} rows", got.num_rows()));
            }
            let t = Instant::now();
            let n = up.lookup(&held, k).await?;
            up_held.push(ms(t.elapsed()));
            if n != 1 {
                return Err(format!("upstream lookup of {k}: {n} rows"));
            }
            let t = Instant::now();
            let view = up.view().await?;
            up.lookup(&view, k).await?;
            up_read.push(ms(t.elapsed()));
        }
        let (o50, o99) = (pct(&mut ours, 0.5), pct(&mut ours, 0.99));
        let (h50, h99) = (pct(&mut up_held, 0.5), pct(&mut up_held, 0.99));
        let (r50, r99) = (pct(&mut up_read, 0.5), pct(&mut up_read, 0.99));
        println!(
            "| {level} | memwal `lookup_rows` | {o50:.2} | {o99:.2} | **{:.2}** | **{:.2}** |",
            o50 / h50,
            o50 / r50
        );
        println!("| | upstream, view held | {h50:.2} | {h99:.2} | | |");
        println!("| | upstream, view per read | {r50:.2} | {r99:.2} | | |");
    }
    Ok(())
}

async fn scans(a: &Args, host: &TableHost, up: &Upstream) -> Result<(), String> {
    println!(
        "\n### Whole-table scans ({} per reader, alternating)\n",
        a.scans
    );
    println!("| reader | rows | median s | rows/s (median) |");
    println!("|---|---|---|---|");
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let (mut n_ours, mut n_up) = (0, 0);
    for _ in 0..a.scans {
        let t = Instant::now();
        n_ours = host
            .read_rows()
            .await
            .map_err(|e| e.to_string())?
            .num_rows();
        ours.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let view = up.view().await?;
        n_up = up.scan(&view).await?;
        theirs.push(t.elapsed().as_secs_f64());
    }
    let (o, u) = (pct(&mut ours, 0.5), pct(&mut theirs, 0.5));
    println!(
        "| memwal `read_rows` | {n_ours} | {o:.3} | {:.0} |",
        n_ours as f64 / o
    );
    println!(
        "| upstream `LsmScanner` (view per read) | {n_up} | {u:.3} | {:.0} |",
        n_up as f64 / u
    );
    println!(
        "\nScan rows/s, memwal / upstream: **{:.2}**",
        (n_ours as f64 / o) / (n_up as f64 / u)
    );
    Ok(())
}

async fn freshness(a: &Args, host: &TableHost, up: &Upstream) -> Result<(), String> {
    let next = a.base + a.sstable + a.memtable + 1_000_000;
    let (mut ours, mut theirs) = (0, 0);
    let n = 100;
    for i in 0..n {
        let k = next + i;
        host.write(&rows(k, k + 1), false)
            .await
            .map_err(|e| e.to_string())?;
        let got = host
            .lookup_rows(&[ScalarValue::Int64(Some(k))])
            .await
            .map_err(|e| e.to_string())?;
        ours += got.num_rows();
        up.writer
            .put(vec![rows(k, k + 1)])
            .await
            .map_err(|e| e.to_string())?;
        let view = up.view().await?;
        theirs += up.lookup(&view, k).await?;
    }
    println!("\n### Freshness\n");
    println!(
        "A row put, then looked up at once, {n} times: visible in the first read after the ack \
         {ours}/{n} (memwal), {theirs}/{n} (upstream, its writer's memtables): ack to visible 0 ms."
    );
    Ok(())
}

/// Serves `host` over Flight on a local port for the rest of the run.
async fn serve(host: &Arc<TableHost>) -> Result<std::net::SocketAddr, String> {
    let hosts = Arc::new(HashMap::from([("t".to_string(), host.clone())]));
    // A query budget well under a big table's size: scans must stream.
    let limits = memwal_server::QueryLimits {
        memory_bytes: 64 << 20,
        ..Default::default()
    };
    let service = memwal_server::IngestService::new(hosts, None).with_query_limits(limits);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(memwal_server::FlightServiceServer::new(service))
            .serve_with_incoming(memwal_server::limited_incoming(listener, 16)),
    );
    Ok(addr)
}

async fn sql_client(
    addr: std::net::SocketAddr,
) -> Result<FlightSqlServiceClient<tonic::transport::Channel>, String> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    Ok(FlightSqlServiceClient::new(channel))
}

/// Runs `sql`, returns the rows it answered.
async fn sql_rows(
    client: &mut FlightSqlServiceClient<tonic::transport::Channel>,
    sql: String,
) -> Result<usize, String> {
    let info = client.execute(sql, None).await.map_err(|e| e.to_string())?;
    let mut n = 0;
    for ep in info.endpoint {
        let ticket = ep.ticket.ok_or("no ticket")?;
        let got: Vec<RecordBatch> = client
            .do_get(ticket)
            .await
            .map_err(|e| e.to_string())?
            .try_collect()
            .await
            .map_err(|e| e.to_string())?;
        n += got.iter().map(|b| b.num_rows()).sum::<usize>();
    }
    Ok(n)
}

async fn flight_sql(
    a: &Args,
    host: &Arc<TableHost>,
    addr: std::net::SocketAddr,
) -> Result<(), String> {
    let mut client = sql_client(addr).await?;
    let (mut sql, mut embedded) = (Vec::new(), Vec::new());
    for i in 0..a.lookups {
        let k = key(a, "memtable", i);
        let t = Instant::now();
        let n = sql_rows(&mut client, format!("SELECT * FROM t WHERE id = {k}")).await?;
        sql.push(ms(t.elapsed()));
        if n != 1 {
            return Err(format!("SQL lookup of {k}: {n} rows"));
        }
        let t = Instant::now();
        host.lookup_rows(&[ScalarValue::Int64(Some(k))])
            .await
            .map_err(|e| e.to_string())?;
        embedded.push(ms(t.elapsed()));
    }
    let (s50, s99) = (pct(&mut sql, 0.5), pct(&mut sql, 0.99));
    let (e50, e99) = (pct(&mut embedded, 0.5), pct(&mut embedded, 0.99));
    println!(
        "\n### Flight SQL against the embedded call (a memtable key, {} each)\n",
        a.lookups
    );
    println!("| path | p50 ms | p99 ms |");
    println!("|---|---|---|");
    println!(
        "| `SELECT * FROM t WHERE id = k` over Flight SQL (plan + DoGet) | {s50:.2} | {s99:.2} |"
    );
    println!("| `TableHost::lookup_rows` | {e50:.2} | {e99:.2} |");
    println!("\np50 ratio SQL / embedded: **{:.2}**", s50 / e50);
    Ok(())
}

/// memwal's put latency for `secs`, 100-row puts, keys from `from`.
async fn puts(host: &TableHost, from: i64, secs: u64) -> Result<(Vec<f64>, i64), String> {
    let mut lat = Vec::new();
    let mut k = from;
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        let b = rows(k, k + 100);
        let t = Instant::now();
        host.write(&b, false).await.map_err(|e| e.to_string())?;
        lat.push(ms(t.elapsed()));
        k += 100;
    }
    Ok((lat, k))
}

/// Scans in a loop until `stop`: over Flight SQL (`SELECT count(*) FROM
/// t`, run on the daemon's query runtime) or embedded (`read_rows` on the
/// caller's runtime). Returns how many ran.
fn spawn_scans(
    host: Arc<TableHost>,
    sql: Option<std::net::SocketAddr>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<Result<u32, String>> {
    tokio::spawn(async move {
        let mut client = match sql {
            Some(addr) => Some(sql_client(addr).await?),
            None => None,
        };
        let mut n = 0u32;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            match &mut client {
                Some(c) => {
                    sql_rows(c, "SELECT count(*) FROM t".into()).await?;
                }
                None => {
                    host.read_rows().await.map_err(|e| e.to_string())?;
                }
            }
            n += 1;
        }
        Ok(n)
    })
}

async fn puts_under_scans(
    a: &Args,
    host: &Arc<TableHost>,
    addr: std::net::SocketAddr,
) -> Result<(), String> {
    println!(
        "\n### memwal put latency while scans run ({} s each, 100-row puts)\n",
        a.secs
    );
    println!("| case | scans | puts | p50 ms | p99 ms | p99 / alone |");
    println!("|---|---|---|---|---|---|");
    let mut next = a.base + a.sstable + a.memtable + 2_000_000;
    let (mut alone, k) = puts(host, next, a.secs).await?;
    next = k;
    let a99 = pct(&mut alone, 0.99);
    println!(
        "| puts alone | 0 | {} | {:.2} | {a99:.2} | 1.00 |",
        alone.len(),
        pct(&mut alone, 0.5)
    );
    for (label, sql) in [
        (
            "while a client scans over Flight SQL (`SELECT count(*)`)",
            Some(addr),
        ),
        (
            "while a task scans embedded (`read_rows`, same runtime)",
            None,
        ),
    ] {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let scanner = spawn_scans(host.clone(), sql, stop.clone());
        let (mut lat, k) = puts(host, next, a.secs).await?;
        next = k;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let scans = scanner.await.map_err(|e| e.to_string())??;
        let p99 = pct(&mut lat, 0.99);
        println!(
            "| {label} | {scans} | {} | {:.2} | {p99:.2} | **{:.2}** |",
            lat.len(),
            pct(&mut lat, 0.5),
            p99 / a99
        );
    }
    Ok(())
}

fn vector_schema(dim: i32) -> SchemaRef {
    let item = Arc::new(Field::new("item", DataType::Float32, true));
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false).with_metadata(
            [(
                "lance-schema:unenforced-primary-key".to_string(),
                "true".to_string(),
            )]
            .into(),
        ),
        Field::new("vec", DataType::FixedSizeList(item, dim), true),
    ]))
}

/// Rows `from..to` with pseudo-random vectors in [0, 1).
fn vector_rows(from: i64, to: i64, dim: i32) -> RecordBatch {
    let values: Vec<f32> = (from..to)
        .flat_map(|id| {
            (0..dim as u64).map(move |j| {
                let x = ((id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    ^ j.wrapping_mul(0xBF58_476D_1CE4_E5B9))
                .wrapping_mul(0x94D0_49BB_1331_11EB);
                (x >> 40) as f32 / (1u64 << 24) as f32
            })
        })
        .collect();
    let item = Arc::new(Field::new("item", DataType::Float32, true));
    RecordBatch::try_new(
        vector_schema(dim),
        vec![
            Arc::new(Int64Array::from_iter_values(from..to)) as ArrayRef,
            Arc::new(
                arrow_array::FixedSizeListArray::try_new(
                    item,
                    dim,
                    Arc::new(arrow_array::Float32Array::from(values)),
                    None,
                )
                .map_err(|e| e.to_string())
                .expect("vectors"),
            ),
        ],
    )
    .expect("vector rows")
}

/// A table of 1000 base rows with an IVF_FLAT index on `vec`, maintained.
async fn vector_table(dir: &Path, dim: i32) -> Result<String, String> {
    unsharded_table(
        dir,
        vector_schema(dim),
        vec![vector_rows(0, 1000, dim)],
        true,
    )
    .await
}

async fn vector_search(a: &Args) -> Result<(), String> {
    let (n, dim) = (a.vector_rows, a.dim);
    let end = 1000 + n;
    let ours_uri = vector_table(&a.dir.join("vec-ours"), dim).await?;
    let loc = memwal_store::open_store(&ours_uri).map_err(|e| e.to_string())?;
    let host = TableHost::open("v", loc, big_memtables())
        .await
        .map_err(|e| e.to_string())?;
    let t = Instant::now();
    for s in (1000..end).step_by(1000) {
        host.write(&vector_rows(s, (s + 1000).min(end), dim), false)
            .await
            .map_err(|e| e.to_string())?;
    }
    let our_put = t.elapsed().as_secs_f64();
    let up_uri = vector_table(&a.dir.join("vec-upstream"), dim).await?;
    let shard = Uuid::new_v4();
    let ds = Dataset::open(&up_uri).await.map_err(|e| e.to_string())?;
    let writer = ds
        .mem_wal_writer(shard, up_config(shard))
        .await
        .map_err(|e| e.to_string())?;
    let t = Instant::now();
    for s in (1000..end).step_by(1000) {
        writer
            .put(vec![vector_rows(s, (s + 1000).min(end), dim)])
            .await
            .map_err(|e| e.to_string())?;
    }
    let up_put = t.elapsed().as_secs_f64();
    let up = Upstream {
        uri: up_uri,
        shard,
        writer,
    };
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let (mut our_hits, mut up_hits) = (0, 0);
    let queries = 20;
    for q in 0..queries {
        let id = 1000 + (q * 7919) % n;
        let probe = vector_rows(id, id + 1, dim);
        let values = probe
            .column(1)
            .as_any()
            .downcast_ref::<arrow_array::FixedSizeListArray>()
            .ok_or("vectors")?
            .value(0);
        let query: Vec<f32> = values
            .as_any()
            .downcast_ref::<arrow_array::Float32Array>()
            .ok_or("floats")?
            .values()
            .to_vec();
        let t = Instant::now();
        let got = host
            .nearest("vec", &query, 10, None)
            .await
            .map_err(|e| e.to_string())?;
        ours.push(ms(t.elapsed()));
        our_hits += usize::from(first_id(&got) == Some(id));
        let t = Instant::now();
        let view = up.view().await?;
        let got = up
            .scanner(&view)
            .await?
            .nearest("vec", &arrow_array::Float32Array::from(query.clone()), 10)
            .map_err(|e| e.to_string())?
            .try_into_batch()
            .await
            .map_err(|e| e.to_string())?;
        theirs.push(ms(t.elapsed()));
        up_hits += usize::from(first_id(&got) == Some(id));
    }
    let (o50, o99) = (pct(&mut ours, 0.5), pct(&mut ours, 0.99));
    let (u50, u99) = (pct(&mut theirs, 0.5), pct(&mut theirs, 0.99));
    println!("\n### Vector search over unflushed rows ({n} rows of {dim} float32s in memory, k = 10, {queries} queries)\n");
    println!(
        "| reader | put s (all rows) | search p50 ms | search p99 ms | probe its own top hit |"
    );
    println!("|---|---|---|---|---|");
    println!("| memwal `TableHost::nearest` (memtable arm exact) | {our_put:.1} | {o50:.1} | {o99:.1} | {our_hits}/{queries} |");
    println!("| upstream `LsmScanner::nearest` (memtable HNSW) | {up_put:.1} | {u50:.1} | {u99:.1} | {up_hits}/{queries} |");
    println!("\nSearch p50 memwal / upstream: **{:.2}**", o50 / u50);
    host.close().await.map_err(|e| e.to_string())?;
    up.writer.close().await.map_err(|e| e.to_string())?;
    Ok(())
}

fn first_id(b: &RecordBatch) -> Option<i64> {
    let ids = b.column_by_name("id")?;
    let ids = ids.as_any().downcast_ref::<Int64Array>()?;
    (!ids.is_empty()).then(|| ids.value(0))
}

fn main() -> Result<(), String> {
    let a = args()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        println!(
            "read_bench: {} base rows, {} in one SSTable, {} unflushed (100-byte values), {}",
            a.base,
            a.sstable,
            a.memtable,
            a.dir.display()
        );
        let (host, up) = setup(&a).await?;
        lookups(&a, &host, &up).await?;
        scans(&a, &host, &up).await?;
        freshness(&a, &host, &up).await?;
        let addr = serve(&host).await?;
        forms::query_forms(&a, addr, &up).await?;
        flight_sql(&a, &host, addr).await?;
        puts_under_scans(&a, &host, addr).await?;
        host.close().await.map_err(|e| e.to_string())?;
        up.writer.close().await.map_err(|e| e.to_string())?;
        if a.vector_rows > 0 {
            vector_search(&a).await?;
        }
        Ok(())
    })
}
