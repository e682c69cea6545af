//! SQL over the served tables (Flight SQL `CommandStatementQuery` and
//! prepared statements): DataFusion plans and runs the query over each
//! table as [`TableHost::read_rows`] reads it (published data plus this
//! daemon's memtables), so a query sent after an ack sees the acked rows;
//! filters on primary-key values (`id = 4`, `id IN (..)`, every column
//! of a composite key) read only those keys ([`TableHost::lookup_keys`],
//! `provider.rs`). Queries run on their own runtime and stream their
//! results ([`stream`]).
//!
//! `vector_search(table, column, vector, k)` and `fts(table, column,
//! query [, limit])` are table functions for search
//! ([`crate::table_functions`]).
//!
//! Only queries: DDL, DML and other statements are refused. Each query
//! runs within a memory pool and a time limit ([`QueryLimits`]: by default
//! [`QUERY_MEMORY_BYTES`], [`QUERY_TIMEOUT`]); a table read for it counts
//! its rows against the memory limit too. Bad SQL is `INVALID_ARGUMENT` naming the
//! error, past the budget `RESOURCE_EXHAUSTED`, past the time
//! `DEADLINE_EXCEEDED`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use datafusion::error::DataFusionError;
use datafusion::execution::context::{SQLOptions, SessionConfig, SessionContext};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::SessionStateBuilder;
use futures::StreamExt;
use tonic::Status;

use crate::TableHost;

/// Memory one query may use by default (DataFusion's pool, and the table
/// rows read for it).
pub const QUERY_MEMORY_BYTES: usize = 512 << 20;

/// How long one query may run by default.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

/// What one query may use: past `memory_bytes` (DataFusion's pool, and
/// the table rows read for it) it ends with `RESOURCE_EXHAUSTED`, past
/// `timeout` with `DEADLINE_EXCEEDED`; either way nothing else is
/// affected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryLimits {
    /// Memory one query may use, in bytes.
    pub memory_bytes: usize,
    /// How long one query may run.
    pub timeout: Duration,
}

impl Default for QueryLimits {
    /// [`QUERY_MEMORY_BYTES`] and [`QUERY_TIMEOUT`].
    fn default() -> Self {
        Self {
            memory_bytes: QUERY_MEMORY_BYTES,
            timeout: QUERY_TIMEOUT,
        }
    }
}

/// The catalog and schema the served tables are in (`memwal.public.t`
/// and plain `t` both name table `t`).
pub const CATALOG: &str = "memwal";
/// See [`CATALOG`].
pub const SCHEMA: &str = "public";

/// The served tables, by name.
pub(crate) type Hosts = HashMap<String, Arc<TableHost>>;

/// The result schema of `sql` (planned over empty tables: nothing read).
pub(crate) async fn plan(
    hosts: &Hosts,
    limits: &QueryLimits,
    sql: &str,
) -> Result<SchemaRef, Status> {
    let ctx = context(hosts, limits)?;
    let df = ctx
        .sql_with_options(sql, options())
        .await
        .map_err(|e| refused(sql, e))?;
    Ok(Arc::new(df.schema().as_arrow().clone()))
}

/// The rows of `sql` over the tables as of now, all of them (see
/// [`stream`]).
#[cfg(test)]
pub(crate) async fn run(
    hosts: &Hosts,
    limits: &QueryLimits,
    sql: &str,
) -> Result<(SchemaRef, Vec<RecordBatch>), Status> {
    use futures::TryStreamExt;
    let (schema, batches) = stream(hosts, limits, sql).await?;
    Ok((schema, batches.try_collect().await?))
}

/// Batches of a query's result, as they are produced.
pub(crate) type RowStream = futures::stream::BoxStream<'static, Result<RecordBatch, Status>>;

/// Runs `sql` over the tables as of now on the query runtime
/// ([`crate::reads`]: its work never holds up ingest's runtime) and
/// streams its rows: its schema once planned, then each batch as an
/// operator produces it, at most two batches ahead of the reader. Past the
/// time limit (planning, running, or waiting for a slow reader) the stream
/// ends with `DEADLINE_EXCEEDED`; a reader that stops reading (a client
/// gone) stops the query.
pub(crate) async fn stream(
    hosts: &Hosts,
    limits: &QueryLimits,
    sql: &str,
) -> Result<(SchemaRef, RowStream), Status> {
    let deadline = tokio::time::Instant::now() + limits.timeout;
    let late = {
        let (timeout, sql) = (limits.timeout, sql.to_string());
        move || Status::deadline_exceeded(format!("query ran past its {timeout:?} limit: {sql}"))
    };
    let (hosts, limits_at, text) = (hosts.clone(), *limits, sql.to_string());
    let (planned_tx, planned_rx) = tokio::sync::oneshot::channel();
    let (tx, rx) = tokio::sync::mpsc::channel::<RecordBatch>(2);
    // How the query's task ended: `Ok` only once every batch is sent. The
    // reader checks it when the batches stop, so a query cut short (its
    // limit, a failure) never reads as a complete result.
    let outcome: Arc<parking_lot::Mutex<Option<Result<(), Status>>>> = Default::default();
    let ended = outcome.clone();
    let expired = late.clone();
    let work = async move {
        let planned = async {
            let ctx = context(&hosts, &limits_at)?;
            let df = ctx
                .sql_with_options(&text, options())
                .await
                .map_err(|e| refused(&text, e))?;
            let schema = Arc::new(df.schema().as_arrow().clone());
            let batches = df.execute_stream().await.map_err(|e| refused(&text, e))?;
            Ok::<_, Status>((schema, batches))
        };
        let planned = tokio::select! {
            p = planned => p,
            () = tokio::time::sleep_until(deadline) => Err(expired()),
        };
        let mut batches = match planned {
            Ok((schema, batches)) => {
                if planned_tx.send(Ok(schema)).is_err() {
                    return;
                }
                batches
            }
            Err(e) => {
                let _ = planned_tx.send(Err(e));
                return;
            }
        };
        let result = loop {
            let next = tokio::select! {
                next = batches.next() => next,
                () = tokio::time::sleep_until(deadline) => break Err(expired()),
                () = tx.closed() => break Ok(()),
            };
            let batch = match next {
                None => break Ok(()),
                Some(Err(e)) => break Err(refused(&text, e)),
                Some(Ok(batch)) => batch,
            };
            tokio::select! {
                sent = tx.send(batch) => if sent.is_err() { break Ok(()) },
                () = tokio::time::sleep_until(deadline) => break Err(expired()),
            }
        };
        *ended.lock() = Some(result);
    };
    crate::reads::spawn(work).map_err(Status::internal)?;
    let schema = match tokio::time::timeout_at(deadline, planned_rx).await {
        Err(_) => return Err(late()),
        Ok(Err(_)) => return Err(Status::internal("the query's task ended before planning")),
        Ok(Ok(planned)) => planned?,
    };
    Ok((schema, rows_of(rx, outcome)))
}

/// The batches `rx` receives, then the query's end: nothing more when it
/// finished, its error otherwise.
fn rows_of(
    rx: tokio::sync::mpsc::Receiver<RecordBatch>,
    outcome: Arc<parking_lot::Mutex<Option<Result<(), Status>>>>,
) -> RowStream {
    futures::stream::unfold(Some(rx), move |rx| {
        let outcome = outcome.clone();
        async move {
            let mut rx = rx?;
            match rx.recv().await {
                Some(batch) => Some((Ok(batch), Some(rx))),
                // The sender is gone: the task has recorded how it ended.
                None => match outcome.lock().take() {
                    Some(Ok(())) => None,
                    Some(Err(e)) => Some((Err(e), None)),
                    None => Some((
                        Err(Status::internal("the query stopped before it finished")),
                        None,
                    )),
                },
            }
        }
    })
    .boxed()
}

fn options() -> SQLOptions {
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
}

/// A session with every served table and the search table functions
/// registered; nothing is read until the query runs.
fn context(hosts: &Hosts, limits: &QueryLimits) -> Result<SessionContext, Status> {
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_limit(limits.memory_bytes, 1.0)
        .build_arc()
        .map_err(|e| Status::internal(e.to_string()))?;
    let config = SessionConfig::new().with_default_catalog_and_schema(CATALOG, SCHEMA);
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(runtime)
        .with_default_features()
        .with_physical_optimizer_rule(Arc::new(crate::cooperative::YieldEverywhere))
        .build();
    let ctx = SessionContext::new_with_state(state);
    // Tables are read when the query runs (`provider.rs`): a filter on
    // primary-key values is a lookup, anything else reads the table whole;
    // the search table functions search when the query runs too.
    let read_bytes = Arc::new(crate::provider::ReadBudget::new(limits.memory_bytes));
    for (name, host) in hosts {
        let table = crate::provider::HostTable::new(host.clone(), read_bytes.clone());
        ctx.register_table(name.as_str(), Arc::new(table))
            .map_err(|e| Status::internal(format!("table `{name}`: {e}")))?;
    }
    ctx.register_udtf(
        "vector_search",
        Arc::new(crate::table_functions::VectorSearch {
            hosts: hosts.clone(),
            read_bytes: read_bytes.clone(),
        }),
    );
    ctx.register_udtf(
        "fts",
        Arc::new(crate::table_functions::FullText {
            hosts: hosts.clone(),
            read_bytes,
        }),
    );
    Ok(ctx)
}

/// The status for a query DataFusion refused or failed.
fn refused(sql: &str, e: DataFusionError) -> Status {
    if let DataFusionError::External(inner) = e.find_root() {
        if let Some(read) = inner.downcast_ref::<crate::ServerError>() {
            // A table read failed (storage, a stopping daemon): its code.
            return Status::new(crate::error::code_of(read), format!("{read} ({sql})"));
        }
    }
    match e.find_root() {
        DataFusionError::ResourcesExhausted(m) => {
            Status::resource_exhausted(format!("query over its memory budget: {m}"))
        }
        DataFusionError::Execution(_) | DataFusionError::ArrowError(..) => {
            Status::internal(format!("query failed: {e} ({sql})"))
        }
        _ => Status::invalid_argument(format!("query refused: {e} ({sql})")),
    }
}
