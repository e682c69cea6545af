//! The query limits ([`QueryLimits`]) and what a cut query leaves behind.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use futures::{StreamExt, TryStreamExt};
use tonic::Code;

use super::*;

/// The provider tests' table `t` (`id` key, `v` text) holding `rows`
/// rows of about 100 bytes each.
async fn table(dir: &tempfile::TempDir, rows: i64) -> Arc<Hosts> {
    let host = crate::provider::tests::table(dir).await;
    let ids: Vec<i64> = (0..rows).collect();
    for chunk in ids.chunks(10_000) {
        let batch = crate::provider::tests::rows(&host, chunk, |i| format!("value {i:>20}"));
        host.write(&batch, false).await.unwrap();
    }
    Arc::new(HashMap::from([("t".to_string(), host)]))
}

async fn all(queries: &Queries, sql: &str) -> Result<Vec<RecordBatch>, Status> {
    queries.stream(sql).await?.1.try_collect().await
}

fn count(batches: &[RecordBatch]) -> i64 {
    use arrow_array::cast::AsArray;
    batches
        .iter()
        .map(|b| {
            b.column(0)
                .as_primitive::<arrow_array::types::Int64Type>()
                .value(0)
        })
        .sum()
}

fn refused(r: Result<Vec<RecordBatch>, Status>, code: Code, naming: &str) {
    match r {
        Ok(b) => panic!("expected {code:?} naming {naming}, got {} batches", b.len()),
        Err(e) => assert!(
            e.code() == code && e.message().contains(naming),
            "expected {code:?} naming {naming}: {e}"
        ),
    }
}

// Breaks if a statement past the size or depth cap reaches the parser
// (or crashes it), if `vector_search`'s k is unbounded, or if a statement
// at the depth cap does not plan and run on the query threads' stacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_past_their_caps_are_refused_and_those_within_run() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = table(&dir, 1000).await;
    let limits = QueryLimits {
        max_sql_bytes: 64 << 10,
        ..Default::default()
    };
    let queries = Queries::new(hosts.clone(), limits);
    let long = format!("SELECT '{}'", "x".repeat(64 << 10));
    refused(
        all(&queries, &long).await,
        Code::InvalidArgument,
        "query_max_sql_bytes",
    );
    refused(
        queries.plan(&long).await.map(|_| vec![]),
        Code::InvalidArgument,
        "query_max_sql_bytes",
    );
    let deep = format!("SELECT 1{}", "+1".repeat(20_000));
    refused(
        all(&queries, &deep).await,
        Code::InvalidArgument,
        "query_max_expr_depth",
    );
    // A chain of ORs at the cap (1000 - 1: `=` and `OR` per key) plans,
    // runs as a lookup and answers.
    let ors: Vec<String> = (0..500).map(|i| format!("id = {}", i * 2)).collect();
    let chain = format!("SELECT count(*) FROM t WHERE {}", ors.join(" OR "));
    assert_eq!(crate::statement::check(&chain, 1 << 20, 1000), Ok(()));
    assert_eq!(count(&all(&queries, &chain).await.unwrap()), 500);
    // A chain at the cap on a column that is not the key is a scan whose
    // filter is pushed into every level's Lance scan: it plans there and
    // answers too.
    let ors: Vec<String> = (0..500)
        .map(|i| format!("v = 'value {:>20}'", i * 2))
        .collect();
    let chain = format!("SELECT count(*) FROM t WHERE {}", ors.join(" OR "));
    assert_eq!(crate::statement::check(&chain, 1 << 20, 1000), Ok(()));
    assert_eq!(count(&all(&queries, &chain).await.unwrap()), 500);
    // So does an arithmetic chain 999 deep.
    let sum = format!("SELECT 1{} AS n", "+1".repeat(999));
    let got = all(&queries, &sum).await.unwrap();
    assert_eq!(count(&got), 1000);
    // A long statement that fails planning is quoted, not echoed whole
    // (a status travels in a header).
    let unknown = format!("SELECT nope, '{}'", "y".repeat(60_000));
    let e = all(&queries, &unknown).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert!(e.message().len() < 2000, "{} bytes", e.message().len());
    // vector_search's k is capped (before the column is even looked at).
    let search = "SELECT * FROM vector_search('t', 'v', '0.1,0.2', 10001)";
    refused(
        all(&queries, search).await,
        Code::InvalidArgument,
        "query_max_k",
    );
}

// Breaks if the concurrency cap is not enforced, or if a query cut by its
// deadline (or abandoned by its reader) keeps its slot or its memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_or_abandoned_query_gives_back_its_slot_and_memory() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = table(&dir, 1000).await;
    let limits = QueryLimits {
        max_concurrent: 1,
        timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let queries = Queries::new(hosts, limits);
    let endless = "SELECT value FROM generate_series(1, 1000000000000)";
    let (_, mut rows) = queries.stream(endless).await.unwrap();
    assert!(rows.next().await.unwrap().is_ok());
    // It holds the one slot: the next statement is refused, unparsed.
    refused(
        queries.plan("SELECT 1").await.map(|_| vec![]),
        Code::ResourceExhausted,
        "query_max_concurrent",
    );
    // Past its deadline it ends with DEADLINE_EXCEEDED.
    let ended = loop {
        match rows.next().await {
            Some(Ok(_)) => continue,
            Some(Err(e)) => break e,
            None => panic!("an endless query ended cleanly"),
        }
    };
    assert_eq!(ended.code(), Code::DeadlineExceeded, "{ended}");
    drop(rows);
    // Its task is cancelled: the slot comes back and the next query runs.
    let next = admitted(&queries, "SELECT count(*) FROM t").await;
    assert_eq!(count(&next), 1000);
    // A reader that walks away cancels its query too, long before its
    // deadline.
    let queries = Queries::new(
        queries.hosts.clone(),
        QueryLimits {
            timeout: Duration::from_secs(600),
            ..limits
        },
    );
    let (_, mut rows) = queries.stream(endless).await.unwrap();
    assert!(rows.next().await.unwrap().is_ok());
    drop(rows);
    let next = admitted(&queries, "SELECT count(*) FROM t").await;
    assert_eq!(count(&next), 1000);
    assert_eq!(queries.reserved(), 0, "every query's memory is given back");
}

/// `sql`'s rows once a slot is free (a cancelled query's task lets its
/// slot go as soon as the query runtime drops it).
async fn admitted(queries: &Queries, sql: &str) -> Vec<RecordBatch> {
    for _ in 0..500 {
        match all(queries, sql).await {
            Err(e) if e.code() == Code::ResourceExhausted => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            other => return other.unwrap(),
        }
    }
    panic!("a cancelled query kept its slot for 5 s");
}

// Breaks if a table read needs memory for the whole table (or any part
// of it that grows with the table) instead of streaming it: every query
// here reads ~6 MiB of rows under a 2 MiB budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_over_tables_larger_than_their_budget_stream() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = table(&dir, 60_000).await;
    hosts["t"].flush().await.unwrap();
    // Fresh rows too (a memtable above the SSTable), overwriting some.
    let ids: Vec<i64> = (59_000..61_000).collect();
    let fresh = crate::provider::tests::rows(&hosts["t"], &ids, |i| format!("fresh {i:>20}"));
    hosts["t"].write(&fresh, false).await.unwrap();
    let limits = QueryLimits {
        memory_bytes: 2 << 20,
        total_memory_bytes: 2 << 20,
        ..Default::default()
    };
    let queries = Queries::new(hosts.clone(), limits);
    let one = |sql: &'static str| {
        let queries = &queries;
        async move {
            let b = all(queries, sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            count(&b)
        }
    };
    assert_eq!(one("SELECT count(*) FROM t").await, 61_000);
    assert_eq!(
        one("SELECT count(*) FROM t WHERE v LIKE 'fresh%'").await,
        2_000
    );
    assert_eq!(one("SELECT count(*) FROM t WHERE v LIKE '%1'").await, 6_100);
    assert_eq!(one("SELECT count(v) FROM t WHERE id >= 58000").await, 3_000);
    assert_eq!(
        one("SELECT count(*) FROM (SELECT id FROM t LIMIT 10)").await,
        10
    );
    assert_eq!(
        one("SELECT count(*) FROM (SELECT substr(v, 1, 5) AS p, count(*) FROM t GROUP BY p)").await,
        2
    );
    assert_eq!(
        queries.reserved(),
        hosts["t"].reader().kept_bytes(),
        "only the index kept over the unflushed rows stays charged"
    );
}

// Breaks if queries together may take more than the shared memory budget,
// or if a query may spill to disk instead of staying within its budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_memory_budget_binds_every_query_and_nothing_spills() {
    let dir = tempfile::tempdir().unwrap();
    // ~3 MiB of rows, sorted whole by the query; published, so the
    // budget is the query's alone (no index kept over unflushed rows).
    let hosts = table(&dir, 30_000).await;
    hosts["t"].flush().await.unwrap();
    let limits = QueryLimits {
        memory_bytes: 64 << 20,
        total_memory_bytes: 1 << 20,
        ..Default::default()
    };
    let queries = Queries::new(hosts.clone(), limits);
    refused(
        all(&queries, "SELECT id FROM t ORDER BY v DESC").await,
        Code::ResourceExhausted,
        "query_total_memory_mib",
    );
    assert_eq!(queries.reserved(), hosts["t"].reader().kept_bytes());
    // A sort over more than its budget fails instead of spilling.
    let limits = QueryLimits {
        memory_bytes: 1 << 20,
        ..Default::default()
    };
    let queries = Queries::new(hosts, limits);
    let sort = "SELECT max(r) FROM (SELECT row_number() OVER (ORDER BY value DESC) AS r \
                FROM generate_series(1, 2000000))";
    let r = all(&queries, sort).await;
    assert!(
        matches!(&r, Err(e) if e.code() == Code::ResourceExhausted),
        "{:?}",
        r.map(|b| b.len())
    );
    assert_eq!(queries.reserved(), 0);
}

/// `sql`'s physical plan, as EXPLAIN prints it.
async fn physical_plan(queries: &Queries, sql: &str) -> String {
    let explained = all(queries, &format!("EXPLAIN {sql}")).await.unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&explained).unwrap();
    let text = text.to_string();
    text.split("physical_plan")
        .nth(1)
        .unwrap_or(&text)
        .to_string()
}

// Breaks if `count(*)` of a table whose rows are all in the base (no
// SSTable above it, no unflushed row) reads the table instead of taking
// the base's row count from its metadata, or if that count is not exact
// (the base's deleted rows left out), or if a table with fresh rows is
// counted from metadata.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_of_a_table_at_rest_reads_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = table(&dir, 5_000).await;
    let host = hosts["t"].clone();
    let deletes = RecordBatch::try_new(
        host.key_schema(),
        vec![std::sync::Arc::new(arrow_array::Int64Array::from(vec![
            3, 30, 300, 3000,
        ]))],
    )
    .unwrap();
    host.write(&deletes, true).await.unwrap();
    host.flush().await.unwrap();
    crate::provider::tests::compact(&host).await;
    let queries = Queries::new(hosts.clone(), QueryLimits::default());
    let sql = "SELECT count(*) FROM t";
    let plan = physical_plan(&queries, sql).await;
    assert!(!plan.contains("MemwalConformed"), "the table read: {plan}");
    assert_eq!(count(&all(&queries, sql).await.unwrap()), 4_996);
    // A fresh row: the levels are read (and counted) again.
    let one = crate::provider::tests::rows(&host, &[9_999], |i| format!("fresh {i}"));
    host.write(&one, false).await.unwrap();
    let plan = physical_plan(&queries, sql).await;
    assert!(
        plan.contains("MemwalConformed"),
        "a fresh row, not read: {plan}"
    );
    assert_eq!(count(&all(&queries, sql).await.unwrap()), 4_997);
}

// Breaks if a level's scan failing while a query runs (a Lance error
// raised as the stream is read) is not UNAVAILABLE when storage may
// recover and INTERNAL otherwise: it was INVALID_ARGUMENT, and a client
// would have dropped a query a retry may answer.
#[test]
fn a_scan_failing_as_it_runs_is_unavailable_only_when_storage_may_recover() {
    let failed = |e: object_store::Error| {
        let e = DataFusionError::External(Box::new(lance::Error::from(e)));
        super::refused("SELECT * FROM t", e, &QueryLimits::default()).code()
    };
    let reset = object_store::Error::Generic {
        store: "S3",
        source: "connection reset by peer".into(),
    };
    assert_eq!(failed(reset), Code::Unavailable);
    let denied = object_store::Error::PermissionDenied {
        path: "t/data/0.lance".into(),
        source: "403 Forbidden".into(),
    };
    assert_eq!(failed(denied), Code::Internal);
}

// Breaks if a filter holding a long arithmetic chain is planned with
// DataFusion's interval analysis (its cost grows as the cube of the
// chain: a 998-operator filter took 45 s to plan) or answers differently
// for it: the long chain's FilterExec must be outside what the analysis
// takes, a short one's inside it, and both count the right rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_arithmetic_filter_plans_without_interval_analysis() {
    use datafusion::physical_expr::intervals::utils::check_support;
    use datafusion::physical_plan::filter::FilterExec;
    let dir = tempfile::tempdir().unwrap();
    let hosts = table(&dir, 1000).await;
    let queries = Queries::new(hosts, QueryLimits::default());
    for (terms, analysed) in [(8usize, true), (400, false)] {
        let sql = format!(
            "SELECT count(*) FROM t WHERE id{} >= 998",
            " + 1".repeat(terms)
        );
        // Planned on the query runtime, whose threads' stacks take a
        // statement at the depth cap (`crate::reads`).
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (q, text) = (queries.clone(), sql.clone());
        let _task = crate::reads::spawn(async move {
            let (_, df) = q.logical(&text).await.unwrap();
            let plan = df.create_physical_plan().await.unwrap();
            let mut filters = Vec::new();
            let mut pending = vec![plan];
            while let Some(p) = pending.pop() {
                if let Some(f) = p.downcast_ref::<FilterExec>() {
                    filters.push(check_support(f.predicate(), &f.input().schema()));
                }
                pending.extend(p.children().into_iter().cloned());
            }
            let _ = tx.send(filters);
        })
        .unwrap();
        assert_eq!(rx.await.unwrap(), [analysed], "{terms} terms");
        let rows = count(&all(&queries, &sql).await.unwrap());
        assert_eq!(rows, 1000 - (998 - terms as i64), "{terms} terms");
    }
}

/// A `bucket(id, 4)` table `t` (`id` key, `v` text of `width` characters,
/// `vec` four float32s, all `id`; no index: searched exactly) holding
/// `rows` unflushed rows, written as one batch.
async fn vector_table(dir: &tempfile::TempDir, rows: i64, width: usize) -> Arc<Hosts> {
    use arrow_array::{ArrayRef, FixedSizeListArray, Float32Array, Int64Array, StringArray};
    use arrow_schema::{DataType, Field};
    let item = Arc::new(Field::new("item", DataType::Float32, true));
    let vec_field = Field::new("vec", DataType::FixedSizeList(item.clone(), 4), true);
    let host = crate::provider::tests::table_with(dir, vec![vec_field]).await;
    let schema = host.schema();
    let ids: Vec<i64> = (0..rows).collect();
    let values = Float32Array::from_iter_values(ids.iter().flat_map(|&i| [i as f32; 4]));
    let vectors = FixedSizeListArray::try_new(item, 4, Arc::new(values), None).unwrap();
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(ids.clone())) as ArrayRef,
            Arc::new(StringArray::from_iter_values(
                ids.iter().map(|i| format!("{i:0>width$}")),
            )),
            Arc::new(vectors),
        ],
    )
    .unwrap();
    host.write(&batch, false).await.unwrap();
    Arc::new(HashMap::from([("t".to_string(), host)]))
}

// Breaks if an exact vector search holds what it reads without charging
// the query's budget first (it charged only the k rows it returned, once
// the search was over): over a 1 MiB budget, a search of whole rows whose
// batches are ~4 MB must end RESOURCE_EXHAUSTED naming the budget, and
// give it back; within the default budget it finds the nearest rows. And
// if the search reads columns the query does not select: `SELECT id`
// under the same 1 MiB budget reads only the key and the vectors, and
// finds the same rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exact_vector_search_charges_what_it_holds_before_it_holds_it() {
    use arrow_array::cast::AsArray;
    let dir = tempfile::tempdir().unwrap();
    let hosts = vector_table(&dir, 2000, 2000).await;
    let sql = "SELECT id, v FROM vector_search('t', 'vec', '0,0,0,0', 3)";
    let narrow = "SELECT id FROM vector_search('t', 'vec', '0,0,0,0', 3)";
    let small = Queries::new(
        hosts.clone(),
        QueryLimits {
            memory_bytes: 1 << 20,
            ..Default::default()
        },
    );
    refused(
        all(&small, sql).await,
        Code::ResourceExhausted,
        "query_memory_mib",
    );
    assert_eq!(
        small.reserved(),
        hosts["t"].reader().kept_bytes(),
        "the search's memory is given back (the index kept over the unflushed rows stays)"
    );
    let ids = |batches: Vec<RecordBatch>| -> Vec<i64> {
        batches
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_primitive::<arrow_array::types::Int64Type>()
                    .values()
                    .to_vec()
            })
            .collect()
    };
    let found = all(&small, narrow).await;
    assert_eq!(
        ids(found.unwrap_or_else(|e| panic!("`{narrow}` under 1 MiB: {e}"))),
        [0, 1, 2]
    );
    let queries = Queries::new(hosts, QueryLimits::default());
    assert_eq!(ids(all(&queries, sql).await.unwrap()), [0, 1, 2]);
    assert_eq!(queries.reserved(), 0);
}
