//! Hostile and careless SQL against `memwal serve` as a process: no
//! statement a client can send aborts, freezes or starves the daemon, and
//! puts keep being acknowledged while such statements run.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_flight::sql::client::FlightSqlServiceClient;
use tonic::transport::Channel;
use tonic::Code;

use crate::common::*;

/// The one int64 value `sql` returns, or the status it ended with.
async fn scalar(addr: &str, sql: &str) -> Result<i64, tonic::Status> {
    let batches = sql_rows(addr, sql).await?;
    let values: Vec<i64> = batches
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    assert_eq!(values.len(), 1, "{sql}: {values:?}");
    Ok(values[0])
}

/// Asserts `r` failed with `code`, naming `what`.
fn refused<T: std::fmt::Debug>(r: Result<T, tonic::Status>, code: Code, what: &str) {
    match r {
        Err(e) => assert!(
            e.code() == code && e.message().contains(what),
            "expected {code:?} naming {what}, got {:?}: {}",
            e.code(),
            &e.message()[..e.message().len().min(300)]
        ),
        Ok(v) => panic!("expected {code:?} naming {what}, got {v:?}"),
    }
}

/// A producer putting 100-row batches until `stop`: counts its acks.
fn producer(
    addr: String,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicI64>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut c = client(&addr, None).await;
        let mut next = 1_000_000i64;
        while !stop.load(Ordering::SeqCst) {
            let ids: Vec<i64> = (next..next + 100).collect();
            put(&mut c, &["t"], vec![rows(&ids, "p")])
                .await
                .expect("a put refused while queries ran");
            acked.fetch_add(100, Ordering::SeqCst);
            next += 100;
        }
    })
}

// Breaks if a statement 200,000 operators deep, a filter of 100,000 `OR`s
// or a 200 MiB statement (sent as a query or prepared) aborts the daemon
// (it did: a stack overflow, ingest gone with it) or is not refused with
// INVALID_ARGUMENT naming its limit, or if puts stop being acknowledged
// while such statements arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_statement_aborts_the_daemon_and_puts_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    // Statements up to 4 MiB: the 1.4 MB chain of ORs is refused for its
    // depth, not its size.
    let d = Daemon::start(&table, &["--query-max-sql-bytes", "4194304"]);
    let (stop, acked) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicI64::new(0)),
    );
    let producing = producer(d.flight.clone(), stop.clone(), acked.clone());

    let deep = format!("SELECT 1{}", "+1".repeat(200_000));
    let ors: Vec<String> = (0..100_000).map(|i| format!("id = {i}")).collect();
    let or_chain = format!("SELECT count(*) FROM t WHERE {}", ors.join(" OR "));
    let huge = format!("SELECT '{}'", "x".repeat(200 << 20));
    let mut c = sql_client(&d.flight).await;
    for (sql, limit) in [
        (&deep, "query_max_expr_depth"),
        (&or_chain, "query_max_expr_depth"),
        (&huge, "query_max_sql_bytes"),
    ] {
        refused(
            c.execute(sql.clone(), None).await.map_err(status),
            Code::InvalidArgument,
            limit,
        );
        refused(
            c.prepare(sql.clone(), None)
                .await
                .map(|_| ())
                .map_err(status),
            Code::InvalidArgument,
            limit,
        );
        // Still serving reads: an unfiltered count.
        let n = scalar(&d.flight, "SELECT count(*) FROM t").await.unwrap();
        assert!(n <= acked.load(Ordering::SeqCst) + 100, "{n}");
    }
    drop(huge);
    stop.store(true, Ordering::SeqCst);
    producing.await.unwrap();
    let acked = acked.load(Ordering::SeqCst);
    assert!(
        acked > 0,
        "no put was acknowledged while the statements ran"
    );
    // Every acknowledged row is there, once.
    assert_eq!(
        scalar(&d.flight, "SELECT count(*) FROM t").await.unwrap(),
        acked
    );
    d.stop_ok();
}

// Breaks if a key lookup over many unflushed batches freezes the query
// threads past its deadline (it filtered keys x batches without yielding),
// if queries cut at their deadline keep running and make the next ones
// time out too, or if 16 concurrent readers of a small table time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_and_heavy_queries_leave_the_next_ones_answered() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let d = Daemon::start(&table, &["--query-timeout-ms", "3000"]);
    let mut c = client(&d.flight, None).await;
    // 2,000 unflushed batches of 5 rows: 10,000 keys.
    let ids: Vec<i64> = (0..10_000).collect();
    for chunk in ids.chunks(1000) {
        let batches = chunk.chunks(5).map(|k| rows(k, "a")).collect();
        put(&mut c, &["t"], batches).await.unwrap();
    }
    // A lookup of 4,000 keys over those batches: answered.
    let keys: Vec<String> = (0..4000).map(|i| (i * 2).to_string()).collect();
    let lookup = format!("SELECT count(*) FROM t WHERE id IN ({})", keys.join(","));
    assert_eq!(scalar(&d.flight, &lookup).await.unwrap(), 4000);
    // Six heavy queries at once, each cut at its deadline...
    let heavy = "SELECT sum(a.value * b.value) FROM generate_series(1, 30000) a, \
                 generate_series(1, 1000000) b";
    let cut = futures::future::join_all((0..6).map(|_| scalar(&d.flight, heavy))).await;
    for r in cut {
        refused(r, Code::DeadlineExceeded, "3s limit");
    }
    // ... and then a lookup and a count are answered within theirs.
    let one = scalar(&d.flight, "SELECT count(*) FROM t WHERE id = 7").await;
    assert_eq!(one.unwrap(), 1);
    let all = scalar(&d.flight, "SELECT count(*) FROM t").await;
    assert_eq!(all.unwrap(), 10_000);
    // 16 readers at once of the table flushed (10,000 rows in SSTables,
    // not 8,000 memtable batches: a whole read of those costs each reader
    // a merge of every batch), every one answered.
    flush(&mut c).await;
    let like = "SELECT count(*) FROM t WHERE v LIKE 'a-1%'";
    let answers = futures::future::join_all((0..16).map(|_| scalar(&d.flight, like))).await;
    for a in answers {
        assert_eq!(a.unwrap(), 1111, "a-1, a-10.., a-100.., a-1000..");
    }
    d.stop_ok();
}

/// Prepares (and never executes) a key lookup of `n`.
async fn prepare(sql: &mut FlightSqlServiceClient<Channel>, n: usize) {
    let stmt = format!("SELECT id, v FROM t WHERE id = {n}");
    sql.prepare(stmt, None).await.map(|_| ()).unwrap();
}

/// The daemon's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

// Breaks if preparing a statement holds memory after it is answered (3000
// prepared statements, never executed, grew the daemon by 1.99 GB), or
// if preparing reads the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_hold_no_memory_and_read_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let d = Daemon::start(&table, &[]);
    let mut c = client(&d.flight, None).await;
    let ids: Vec<i64> = (0..20_000).collect();
    let batches = ids.chunks(5_000).map(|k| rows(k, "a")).collect();
    put(&mut c, &["t"], batches).await.unwrap();
    let mut sql = sql_client(&d.flight).await;
    // Warm up (the query runtime, DataFusion's registries), then measure.
    for n in 0..100 {
        prepare(&mut sql, n).await;
    }
    let before = rss_kib(d.child.id());
    for n in 0..2000 {
        prepare(&mut sql, n).await;
    }
    let grown = rss_kib(d.child.id()).saturating_sub(before);
    assert!(
        grown < 128 << 10,
        "2000 prepared statements grew the daemon by {grown} KiB"
    );
    // Nothing was read to prepare them.
    let (_, metrics) = http_fetch(&d.http, "/metrics", None);
    let reads: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("memwal_server_reads_total"))
        .collect();
    assert!(reads.is_empty(), "{reads:?}");
    d.stop_ok();
}
