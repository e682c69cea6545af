//! Reading back through the daemon: SQL over Flight SQL (ADBC,
//! `memwal query`) and the limits every query runs within.

use arrow_array::RecordBatch;
use futures::StreamExt;

use crate::common::*;

// Breaks if a user cannot read back with SQL what they just wrote, through
// ADBC's Flight SQL driver with no custom code (`cursor.execute` begins
// with a prepared statement): the first query must see unflushed rows,
// later ones the overwrite and the delete (newest value only, the deleted
// keys absent, no key twice), and a bad query must be refused with
// INVALID_ARGUMENT naming the column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adbc_reads_back_what_it_wrote_at_once_with_sql() {
    let Some(python) = test_python("ADBC query") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let d = Daemon::start(&table, &[]);
    let out = run_python(&python, "adbc_query.py", &[&d.flight, "t"]);
    let got: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(got["table_schema"], serde_json::json!(["id", "v"]), "{got}");
    assert_eq!(got["key_4_first"], serde_json::json!([["a-4"]]), "{got}");
    assert_eq!(got["key_4"], serde_json::json!([["b-4"]]), "{got}");
    assert_eq!(got["count"], 8, "{got}");
    let want: Vec<serde_json::Value> = [0, 1, 2, 3, 4, 7, 8, 9]
        .iter()
        .map(|&i| {
            let tag = if i < 5 { "b" } else { "a" };
            serde_json::json!([i, format!("{tag}-{i}")])
        })
        .collect();
    assert_eq!(got["rows"], serde_json::Value::Array(want), "{got}");
    let bad = got["bad_query"].as_str().unwrap_or_else(|| panic!("{got}"));
    assert!(
        bad.contains("INVALID_ARGUMENT") || bad.contains("InvalidArgument") || bad.contains("nope"),
        "{bad}"
    );
    d.stop_ok();
}

// Breaks if `memwal query` cannot read back acknowledged, unflushed rows
// (JSON lines and the table form), or a bad query does not fail naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memwal_query_reads_back_acked_rows() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let d = Daemon::start(&table, &[]);
    let mut c = client(&d.flight, None).await;
    put(&mut c, &["t"], vec![rows(&[1, 2, 3], "a"), rows(&[2], "b")])
        .await
        .unwrap();
    let sql = "SELECT id, v FROM t ORDER BY id";
    let (ok, out, err) = memwal(&["query", "--to", &d.flight, "--json", sql]);
    assert!(ok, "{out}{err}");
    let got: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        got,
        vec![
            serde_json::json!({"id": 1, "v": "a-1"}),
            serde_json::json!({"id": 2, "v": "b-2"}),
            serde_json::json!({"id": 3, "v": "a-3"}),
        ]
    );
    let (ok, out, err) = memwal(&["query", "--to", &d.flight, sql]);
    assert!(
        ok && out.contains("b-2") && out.contains("(3 rows)"),
        "{out}{err}"
    );
    let (ok, out, err) = memwal(&["query", "--to", &d.flight, "SELECT nope FROM t"]);
    assert!(!ok && err.contains("nope"), "{out}{err}");
    d.stop_ok();
}

// Breaks if a query past its memory budget or time limit does not end
// with RESOURCE_EXHAUSTED or DEADLINE_EXCEEDED naming the limit, if a
// result is not streamed (rows reach the client before the query ends),
// or if the daemon stops answering queries after one did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_past_their_limits_get_a_clear_status_and_the_daemon_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let d = Daemon::start(
        &table,
        &["--query-memory-mib", "1", "--query-timeout-ms", "500"],
    );
    let mut c = client(&d.flight, None).await;
    // ~2 MiB of rows: sorting them all is over the 1 MiB budget.
    let ids: Vec<i64> = (0..20_000).collect();
    let wide = "x".repeat(100);
    let batches: Vec<RecordBatch> = ids.chunks(5_000).map(|c| rows(c, &wide)).collect();
    put(&mut c, &["t"], batches).await.unwrap();
    let sorted = "SELECT * FROM t ORDER BY v DESC";
    let (ok, out, err) = memwal(&["query", "--to", &d.flight, sorted]);
    assert!(
        // tonic's text of RESOURCE_EXHAUSTED, then ours.
        !ok && err.contains("resource has been exhausted") && err.contains("memory budget"),
        "{out}{err}"
    );
    // A key lookup reads a row, well within the budget.
    let one = "SELECT id FROM t WHERE id = 7";
    let (ok, out, err) = memwal(&["query", "--to", &d.flight, "--json", one]);
    assert!(ok && out.trim() == r#"{"id":7}"#, "{out}{err}");
    // A sum over a 3 x 10^9-row cross join (its build side, 30000 rows,
    // within the memory budget) runs far past 500 ms (a sum, not a
    // count: no statistics answer it without running it). It must end
    // near its limit: a cross join emits batches without polling its
    // input, so unless every operator yields (`cooperative.rs`) the limit
    // could not cut it for seconds (about 5 s here, against 0.55 s).
    let slow = "SELECT sum(a.value * b.value) FROM generate_series(1, 30000) a, \
                generate_series(1, 100000) b";
    let started = std::time::Instant::now();
    let (ok, out, err) = memwal(&["query", "--to", &d.flight, slow]);
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(3),
        "ended after {took:?}"
    );
    assert!(
        // tonic's text of DEADLINE_EXCEEDED, then ours.
        !ok && err.contains("Deadline expired") && err.contains("500ms limit"),
        "{out}{err}"
    );
    // Results are streamed: rows of a query running past its limit reach
    // the client before the limit ends it (a result collected whole first
    // would send none).
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", d.flight))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut sql = arrow_flight::sql::client::FlightSqlServiceClient::new(channel);
    let info = sql
        .execute(
            "SELECT value FROM generate_series(1, 1000000000000)".into(),
            None,
        )
        .await
        .unwrap();
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    let mut rows = sql.do_get(ticket).await.unwrap();
    let mut received = 0;
    let ended = loop {
        match rows.next().await {
            Some(Ok(b)) => received += b.num_rows(),
            Some(Err(e)) => break e.to_string(),
            None => panic!("a 10^12-row result ended after {received} rows"),
        }
    };
    assert!(
        received > 0 && ended.contains("500ms limit"),
        "{received} rows, then {ended}"
    );
    let (ok, out, err) = memwal(&["query", "--to", &d.flight, "--json", one]);
    assert!(ok && out.trim() == r#"{"id":7}"#, "{out}{err}");
    d.stop_ok();
}

/// Puts rows `range` tagged `t`, 2,500 per batch.
async fn send(c: &mut arrow_flight::FlightClient, range: std::ops::Range<i64>, t: String) {
    let ids: Vec<i64> = range.collect();
    let batches: Vec<RecordBatch> = ids.chunks(2_500).map(|ids| rows(ids, &t)).collect();
    put(c, &["t"], batches).await.unwrap();
}

/// `sql`'s rows as `(text of column 0, int64 column 1)` pairs.
async fn pairs(addr: &str, sql: &str) -> Vec<(String, i64)> {
    use arrow_array::cast::AsArray;
    let batches = sql_rows(addr, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let mut out = Vec::new();
    for b in batches {
        let text = arrow_cast::cast(b.column(0), &arrow_schema::DataType::Utf8).unwrap();
        let n = arrow_cast::cast(b.column(1), &arrow_schema::DataType::Int64).unwrap();
        for r in 0..b.num_rows() {
            out.push((
                text.as_string::<i32>().value(r).to_string(),
                n.as_primitive::<arrow_array::types::Int64Type>().value(r),
            ));
        }
    }
    out
}

// Breaks if a query needs memory that grows with the table (the whole
// table read into memory, as every non-lookup query once was): the table
// here is ~12 MiB over three levels (the base, SSTables, unflushed rows),
// the query budget 4 MiB (room for the few batches in flight), and every
// query form must answer exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_larger_than_the_query_budget_answers_every_query() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let d = Daemon::launch(
        &table,
        &[
            "--query-memory-mib",
            "4",
            "--query-total-memory-mib",
            "4",
            "--compact-every-secs",
            "1",
        ],
    );
    let mut c = client(&d.flight, None).await;
    let tag = |t: &str| format!("{t}{}", "x".repeat(120));
    // The base: 80,000 rows, flushed and compacted.
    send(&mut c, 0..80_000, tag("a")).await;
    flush(&mut c).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while base_rows(&table).await.len() < 80_000 {
        assert!(
            std::time::Instant::now() < deadline,
            "no compaction in 120 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // SSTables: 30,000 rows, 20,000 of them overwriting the base's.
    send(&mut c, 60_000..90_000, tag("b")).await;
    flush(&mut c).await;
    // Unflushed: 1,000 rows, 500 overwriting the SSTables'.
    send(&mut c, 89_500..90_500, tag("c")).await;

    let q = |sql: &'static str| pairs(&d.flight, sql);
    assert_eq!(
        q("SELECT 'all', count(*) FROM t").await,
        [("all".to_string(), 90_500)]
    );
    let by_level = "SELECT substr(v, 1, 1) AS level, count(*) FROM t GROUP BY level ORDER BY level";
    assert_eq!(
        q(by_level).await,
        [
            ("a".to_string(), 60_000),
            ("b".to_string(), 29_500),
            ("c".to_string(), 1_000),
        ]
    );
    // A filter Lance evaluates in every level's scan, and one it cannot.
    assert_eq!(
        q("SELECT 'b', sum(id) FROM t WHERE v LIKE 'b%' AND id >= 89000").await,
        [("b".to_string(), (89_000..89_500).sum::<i64>())]
    );
    assert_eq!(
        q("SELECT 'c', count(*) FROM t WHERE starts_with(v, 'c')").await,
        [("c".to_string(), 1_000)]
    );
    // A projection and a limit.
    let limited = q("SELECT v, id FROM t LIMIT 10").await;
    assert_eq!(limited.len(), 10);
    for (v, id) in &limited {
        let level = match id {
            89_500.. => "c",
            60_000.. => "b",
            _ => "a",
        };
        assert_eq!(
            v,
            &format!("{}-{id}", tag(level)),
            "the newest value of {id}"
        );
    }
    d.stop_ok();
}

// Breaks if a reader that stops pulling lets the daemon read the table
// ahead of it without bound (Lance's own read-ahead: up to 256 MiB of I/O
// per scan on a local disk, 2 GiB on an object store, 16 or 128 fragments
// at once), held in memory outside every query budget. The table is 32
// fragments, ~155 MB on disk, the read-ahead set to 4 MiB of I/O and one
// fragment. With Lance's defaults the daemon read 93 MB of it before the
// stalled client took its second batch; bounded, ~20 MB (a few fragments,
// what the client's own buffers hold included). Every row still arrives
// once the client reads on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_holds_only_the_scan_read_ahead() {
    let Some(python) = test_python("stalled reader") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let written = run_python(&python, "stalled_scan.py", &["write", &table, "32", "5000"]);
    let table_bytes: u64 = written.trim().parse().unwrap();
    let d = Daemon::start(
        &table,
        &[
            "--lance-io-buffer-mib",
            "4",
            "--lance-fragment-readahead",
            "1",
        ],
    );
    let pid = d.child.id().to_string();
    let out = run_python(&python, "stalled_scan.py", &["stall", &d.flight, "t", &pid]);
    let got: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(got["rows"], 160_000, "{got}");
    let read_ahead = got["read_ahead"].as_u64().unwrap();
    assert!(
        read_ahead < table_bytes / 4,
        "the daemon read {read_ahead} bytes of a {table_bytes}-byte table ahead of a \
         reader that stopped after one batch"
    );
    d.stop_ok();
}

// Breaks if a query through a daemon one of whose shards is down (its
// writer stopped on a storage failure: whatever it acknowledged would
// only be in its WAL) is answered from the published state instead of
// refused with UNAVAILABLE naming the shard, or if the daemon stops
// answering what it can: a query touching no table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_over_a_down_shard_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    // Every large WAL write fails (EIO; a write of at least 64 KiB is
    // staged, where the fault point is): the first large put takes its
    // shard down.
    let wal_fails = "store::stage_write=return(5@/wal/)";
    let d = Daemon::try_launch(&table, &["--no-compactor"], &[("FAILPOINTS", wal_fails)])
        .expect("the daemon serves");
    let mut c = client(&d.flight, None).await;
    let large = rows(&[4; 100], &format!("a{}", "x".repeat(1000)));
    let e = put(&mut c, &["t"], vec![large])
        .await
        .expect_err("a put whose WAL write fails");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e}");
    let down: Vec<String> = {
        let (_, body) = http_fetch(&d.http, "/status", None);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["tables"]["t"]["shards"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["state"] == "down")
            .map(|s| s["shard"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(down.len(), 1, "one shard down: {down:?}");
    for sql in [
        "SELECT count(*) FROM t",
        "SELECT * FROM t WHERE id = 4",
        "SELECT v FROM t WHERE v LIKE 'a%' LIMIT 1",
    ] {
        let e = sql_rows(&d.flight, sql).await.expect_err(sql);
        assert!(
            e.code() == tonic::Code::Unavailable && e.message().contains(&down[0]),
            "{sql}: {:?} {}",
            e.code(),
            e.message()
        );
    }
    let one = sql_rows(&d.flight, "SELECT 1").await.unwrap();
    assert_eq!(one[0].num_rows(), 1);
    d.stop();
}
