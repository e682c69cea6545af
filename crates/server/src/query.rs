//! SQL over the served tables (Flight SQL `CommandStatementQuery` and
//! prepared statements): DataFusion plans and runs the query over each
//! table as it streams its levels ([`TableHost::scan_plan`]: published
//! data plus this daemon's memtables), so a query sent after an ack sees
//! the acked rows; filters on primary-key values (`id = 4`, `id IN (..)`,
//! every column of a composite key) read only those keys
//! ([`TableHost::lookup_keys`], `provider.rs`). Queries run on their own
//! runtime and stream their results ([`stream`]).
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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use datafusion::error::DataFusionError;
use datafusion::execution::context::{SQLOptions, SessionConfig, SessionContext};
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::{
    GreedyMemoryPool, MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
};
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

/// What queries may use. Past a limit a query ends with a status naming
/// it, and nothing else is affected: `memory_bytes` (one query: its
/// DataFusion operators and the table rows read for it) or
/// `total_memory_bytes` (every query at once) `RESOURCE_EXHAUSTED`;
/// `timeout` `DEADLINE_EXCEEDED`; `max_concurrent` queries running
/// `RESOURCE_EXHAUSTED`; a statement longer than `max_sql_bytes`, nesting
/// deeper than `max_expr_depth` (`crate::statement`), or a
/// `vector_search` for more than `max_k` rows `INVALID_ARGUMENT`.
/// Queries never spill to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryLimits {
    /// Memory one query may use, in bytes (`query_memory_mib`).
    pub memory_bytes: usize,
    /// How long one query may run, planning included (`query_timeout_ms`).
    pub timeout: Duration,
    /// Memory every query together may use, in bytes
    /// (`query_total_memory_mib`).
    pub total_memory_bytes: usize,
    /// Queries (and statements being planned or prepared) running at once
    /// (`query_max_concurrent`).
    pub max_concurrent: usize,
    /// Longest SQL statement, in bytes (`query_max_sql_bytes`).
    pub max_sql_bytes: usize,
    /// Deepest operator nesting a statement may have
    /// (`query_max_expr_depth`; see `crate::statement`).
    pub max_expr_depth: usize,
    /// Largest `k` of `vector_search` (`query_max_k`).
    pub max_k: usize,
}

impl Default for QueryLimits {
    /// [`QUERY_MEMORY_BYTES`] per query and twice that for all,
    /// [`QUERY_TIMEOUT`], 16 queries at once, statements up to 1 MiB and
    /// 1000 operators deep, `k` up to 10,000.
    fn default() -> Self {
        Self {
            memory_bytes: QUERY_MEMORY_BYTES,
            timeout: QUERY_TIMEOUT,
            total_memory_bytes: 2 * QUERY_MEMORY_BYTES,
            max_concurrent: 16,
            max_sql_bytes: 1 << 20,
            max_expr_depth: 1000,
            max_k: 10_000,
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

/// Where every SQL statement of a daemon is planned and run, under its
/// [`QueryLimits`]: one admission (size and depth checks, a slot among
/// `max_concurrent`), one memory pool shared by all queries, and each
/// query's work on the query runtime ([`crate::reads`]), cancelled from
/// the caller's side when its time is up or its client is gone.
#[derive(Clone)]
pub(crate) struct Queries {
    hosts: Arc<Hosts>,
    limits: QueryLimits,
    /// One permit per query running.
    running: Arc<tokio::sync::Semaphore>,
    /// Every query's memory, `total_memory_bytes` at most.
    shared: Arc<dyn MemoryPool>,
}

impl std::fmt::Debug for Queries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queries")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Queries {
    /// Also charges what the tables' reads keep between queries to the
    /// memory all queries share ([`TableHost::charge_reads_to`]).
    pub(crate) fn new(hosts: Arc<Hosts>, limits: QueryLimits) -> Self {
        let shared: Arc<dyn MemoryPool> =
            Arc::new(GreedyMemoryPool::new(limits.total_memory_bytes));
        for host in hosts.values() {
            host.charge_reads_to(shared.clone());
        }
        Self {
            hosts,
            limits,
            running: Arc::new(tokio::sync::Semaphore::new(limits.max_concurrent)),
            shared,
        }
    }

    /// The served tables.
    pub(crate) fn hosts(&self) -> &Hosts {
        &self.hosts
    }

    /// Memory all running queries hold now, in bytes.
    #[cfg(test)]
    pub(crate) fn reserved(&self) -> usize {
        self.shared.reserved()
    }

    /// Checks `sql` (size, depth) and takes a slot for it; both refusals
    /// happen before anything parses it.
    fn admit(&self, sql: &str) -> Result<tokio::sync::OwnedSemaphorePermit, Status> {
        crate::statement::check(sql, self.limits.max_sql_bytes, self.limits.max_expr_depth)
            .map_err(|e| Status::invalid_argument(format!("query refused: {e}")))?;
        self.running.clone().try_acquire_owned().map_err(|_| {
            metrics::counter!("memwal_server_queries_refused_total", "reason" => "concurrency")
                .increment(1);
            Status::resource_exhausted(format!(
                "{} queries are running, query_max_concurrent = {}: try again later",
                self.limits.max_concurrent, self.limits.max_concurrent
            ))
        })
    }

    /// The result schema of `sql`, planned on the query runtime within the
    /// time limit (planning reads nothing).
    pub(crate) async fn plan(&self, sql: &str) -> Result<SchemaRef, Status> {
        let permit = self.admit(sql)?;
        let deadline = tokio::time::Instant::now() + self.limits.timeout;
        let late = late(self.limits.timeout, sql);
        let (this, text) = (self.clone(), sql.to_string());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let work = async move {
            let planned = this
                .logical(&text)
                .await
                .map(|(_, df)| Arc::new(df.schema().as_arrow().clone()));
            drop(permit);
            let _ = tx.send(planned);
        };
        let _task = crate::reads::spawn(work).map_err(Status::internal)?;
        match tokio::time::timeout_at(deadline, rx).await {
            Err(_) => Err(late()),
            Ok(Err(_)) => Err(Status::internal("the query's task ended before planning")),
            Ok(Ok(planned)) => planned,
        }
    }

    /// Runs `sql` over the tables as of now on the query runtime
    /// ([`crate::reads`]: its work never holds up ingest's runtime) and
    /// streams its rows: its schema once planned, then each batch as an
    /// operator produces it, at most two batches ahead of the reader. Past
    /// the time limit (planning, running, or waiting for a slow reader)
    /// the stream ends with `DEADLINE_EXCEEDED`; the deadline is kept on
    /// the caller's side too, so it fires even while the query's thread
    /// is busy, and the query's task is cancelled then, as it is when the
    /// reader stops reading (a client gone).
    pub(crate) async fn stream(&self, sql: &str) -> Result<(SchemaRef, RowStream), Status> {
        let permit = self.admit(sql)?;
        let deadline = tokio::time::Instant::now() + self.limits.timeout;
        let late = late(self.limits.timeout, sql);
        let (this, text) = (self.clone(), sql.to_string());
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
                let (ctx, df) = this.logical(&text).await?;
                let schema = Arc::new(df.schema().as_arrow().clone());
                let batches = df
                    .execute_stream()
                    .await
                    .map_err(|e| refused(&text, e, &this.limits))?;
                // The session stays until the query ends: its tables hold
                // the memory reservations of the rows they read.
                Ok::<_, Status>((schema, batches, ctx))
            };
            let planned = tokio::select! {
                p = planned => p,
                () = tokio::time::sleep_until(deadline) => Err(expired()),
            };
            let (mut batches, session) = match planned {
                Ok((schema, batches, session)) => {
                    if planned_tx.send(Ok(schema)).is_err() {
                        return;
                    }
                    (batches, session)
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
                    Some(Err(e)) => break Err(refused(&text, e, &this.limits)),
                    Some(Ok(batch)) => batch,
                };
                tokio::select! {
                    sent = tx.send(batch) => if sent.is_err() { break Ok(()) },
                    () = tokio::time::sleep_until(deadline) => break Err(expired()),
                }
            };
            // Everything the query held is given back before its reader
            // learns it ended: its memory, then its slot.
            drop(batches);
            let pool = session.runtime_env().memory_pool.clone();
            drop(session);
            // Operators' spawned tasks (repartitions) free their buffers
            // when their runtime drops them, just after the abort.
            settled(pool.as_ref()).await;
            drop(permit);
            *ended.lock() = Some(result);
        };
        let task = crate::reads::spawn(work).map_err(Status::internal)?;
        let schema = match tokio::time::timeout_at(deadline, planned_rx).await {
            Err(_) => return Err(late()),
            Ok(Err(_)) => return Err(Status::internal("the query's task ended before planning")),
            Ok(Ok(planned)) => planned?,
        };
        let ending = Ending {
            outcome,
            deadline,
            late: Arc::new(late),
            _task: task,
        };
        Ok((schema, rows_of(rx, ending)))
    }

    /// `sql`'s logical plan, in a new session of its own ([`Self::context`]).
    async fn logical(
        &self,
        sql: &str,
    ) -> Result<(SessionContext, datafusion::dataframe::DataFrame), Status> {
        let ctx = self.context()?;
        let df = ctx
            .sql_with_options(sql, options())
            .await
            .map_err(|e| refused(sql, e, &self.limits))?;
        Ok((ctx, df))
    }

    /// A session with every served table and the search table functions
    /// registered, whose memory pool is this query's share of the shared
    /// one (no spilling); nothing is read until the query runs.
    fn context(&self) -> Result<SessionContext, Status> {
        let pool = Arc::new(QueryPool {
            shared: self.shared.clone(),
            used: AtomicUsize::new(0),
            limit: self.limits.memory_bytes,
            total: self.limits.total_memory_bytes,
        });
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(pool)
            .with_disk_manager_builder(
                DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled),
            )
            .build_arc()
            .map_err(|e| Status::internal(e.to_string()))?;
        // No round-robin repartitions: one over a table's stream buffers
        // whatever its slower output has not taken yet, without bound but
        // the query's budget (a GROUP BY over a 12 MiB table failed a
        // 4 MiB budget so). Scans are parallel inside (Lance's decoding,
        // one partition per level of an append-only table), and the hash
        // repartitions of aggregates and joins stay.
        let config = SessionConfig::new()
            .with_default_catalog_and_schema(CATALOG, SCHEMA)
            .with_round_robin_repartition(false);
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_runtime_env(runtime)
            .with_default_features()
            .with_optimizer_rule(Arc::new(crate::long_arithmetic::WithoutIntervalAnalysis))
            .with_physical_optimizer_rule(Arc::new(crate::cooperative::YieldEverywhere))
            .build();
        let ctx = SessionContext::new_with_state(state);
        // Tables are read when the query runs (`provider.rs`): a filter on
        // primary-key values is a lookup, anything else streams the table;
        // the search table functions search when the query runs too.
        let read_bytes = Arc::new(ReadBudget::default());
        for (name, host) in self.hosts.iter() {
            let table = crate::provider::HostTable::new(host.clone(), read_bytes.clone());
            ctx.register_table(name.as_str(), Arc::new(table))
                .map_err(|e| Status::internal(format!("table `{name}`: {e}")))?;
        }
        ctx.register_udtf(
            "vector_search",
            Arc::new(crate::table_functions::VectorSearch {
                hosts: self.hosts.clone(),
                read_bytes: read_bytes.clone(),
                max_k: self.limits.max_k,
            }),
        );
        ctx.register_udtf(
            "fts",
            Arc::new(crate::table_functions::FullText {
                hosts: self.hosts.clone(),
                read_bytes,
            }),
        );
        Ok(ctx)
    }
}

/// The rows of `sql` over the tables as of now, all of them (see
/// [`Queries::stream`]).
#[cfg(test)]
pub(crate) async fn run(
    hosts: &Hosts,
    limits: &QueryLimits,
    sql: &str,
) -> Result<(SchemaRef, Vec<RecordBatch>), Status> {
    use futures::TryStreamExt;
    let queries = Queries::new(Arc::new(hosts.clone()), *limits);
    let (schema, batches) = queries.stream(sql).await?;
    Ok((schema, batches.try_collect().await?))
}

/// Batches of a query's result, as they are produced.
pub(crate) type RowStream = futures::stream::BoxStream<'static, Result<RecordBatch, Status>>;

/// The status of a query past its time limit.
fn late(timeout: Duration, sql: &str) -> impl Fn() -> Status + Clone + Send + Sync + 'static {
    let sql = excerpt(sql);
    move || Status::deadline_exceeded(format!("query ran past its {timeout:?} limit: {sql}"))
}

/// Returns once `pool` holds nothing (the query's operators, their
/// spawned tasks included, gave back their memory), or after a second.
async fn settled(pool: &dyn MemoryPool) {
    let until = tokio::time::Instant::now() + Duration::from_secs(1);
    while pool.reserved() > 0 && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    if pool.reserved() > 0 {
        tracing::warn!(
            bytes = pool.reserved(),
            "a query ended still holding memory"
        );
    }
}

/// One query's memory: at most `limit` bytes of it, and what it takes is
/// taken from the pool every query shares.
#[derive(Debug)]
struct QueryPool {
    shared: Arc<dyn MemoryPool>,
    used: AtomicUsize,
    limit: usize,
    total: usize,
}

impl std::fmt::Display for QueryPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "memwal query pool ({} of {} bytes)",
            self.used.load(Ordering::Relaxed),
            self.limit
        )
    }
}

impl MemoryPool for QueryPool {
    fn name(&self) -> &str {
        "memwal query"
    }

    fn register(&self, consumer: &MemoryConsumer) {
        self.shared.register(consumer);
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.shared.unregister(consumer);
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.used.fetch_add(additional, Ordering::SeqCst);
        self.shared.grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.used.fetch_sub(shrink, Ordering::SeqCst);
        self.shared.shrink(reservation, shrink);
    }

    fn try_grow(
        &self,
        reservation: &MemoryReservation,
        additional: usize,
    ) -> datafusion::error::Result<()> {
        let held = self.used.fetch_add(additional, Ordering::SeqCst) + additional;
        if held > self.limit {
            self.used.fetch_sub(additional, Ordering::SeqCst);
            return Err(DataFusionError::ResourcesExhausted(format!(
                "{} ({} bytes) needs {held} bytes, more than its memory budget of {} bytes \
                 (query_memory_mib)",
                reservation.consumer().name(),
                additional,
                self.limit
            )));
        }
        if let Err(e) = self.shared.try_grow(reservation, additional) {
            self.used.fetch_sub(additional, Ordering::SeqCst);
            metrics::counter!("memwal_server_queries_refused_total", "reason" => "total_memory")
                .increment(1);
            return Err(DataFusionError::ResourcesExhausted(format!(
                "the queries running hold the whole memory budget of all queries, {} bytes \
                 (query_total_memory_mib): {e}",
                self.total
            )));
        }
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.limit)
    }
}

/// The rows one query's key lookups and searches read, held (and counted
/// in its memory pool) until the query ends.
#[derive(Debug, Default)]
pub(crate) struct ReadBudget {
    held: parking_lot::Mutex<Vec<MemoryReservation>>,
}

impl ReadBudget {
    /// Counts `bytes` read for a query against its memory pool (the
    /// session's); `Err` when that is past a limit.
    pub(crate) fn charge(
        &self,
        pool: &Arc<dyn MemoryPool>,
        what: &str,
        bytes: usize,
    ) -> datafusion::error::Result<()> {
        let reservation = MemoryConsumer::new(what.to_string()).register(pool);
        reservation.try_grow(bytes)?;
        self.held.lock().push(reservation);
        Ok(())
    }
}

/// How a query's stream ends, and what it holds while it runs.
struct Ending {
    outcome: Arc<parking_lot::Mutex<Option<Result<(), Status>>>>,
    deadline: tokio::time::Instant,
    late: Arc<dyn Fn() -> Status + Send + Sync>,
    /// The query's task, cancelled when this drops (the stream ended,
    /// timed out, or its reader went away).
    _task: crate::reads::QueryTask,
}

/// The batches `rx` receives, then the query's end: nothing more when it
/// finished, its error otherwise; `DEADLINE_EXCEEDED` when the next batch
/// is not there by the deadline (the query is cancelled then).
fn rows_of(rx: tokio::sync::mpsc::Receiver<RecordBatch>, ending: Ending) -> RowStream {
    futures::stream::unfold(Some((rx, ending)), move |state| async move {
        let (mut rx, ending) = state?;
        match tokio::time::timeout_at(ending.deadline, rx.recv()).await {
            Err(_) => Some((Err((ending.late)()), None)),
            Ok(Some(batch)) => Some((Ok(batch), Some((rx, ending)))),
            // The sender is gone: the task has recorded how it ended.
            Ok(None) => match ending.outcome.lock().take() {
                Some(Ok(())) => None,
                Some(Err(e)) => Some((Err(e), None)),
                None => Some((
                    Err(Status::internal("the query stopped before it finished")),
                    None,
                )),
            },
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

/// `sql` as a status message quotes it: at most 200 characters (a status
/// travels in a header; a statement may be a megabyte).
fn excerpt(sql: &str) -> String {
    const MAX: usize = 200;
    match sql.char_indices().nth(MAX) {
        None => sql.to_string(),
        Some((end, _)) => format!("{}... ({} bytes)", &sql[..end], sql.len()),
    }
}

/// The status for a query DataFusion refused or failed.
fn refused(sql: &str, e: DataFusionError, limits: &QueryLimits) -> Status {
    let sql = excerpt(sql);
    if let DataFusionError::External(inner) = e.find_root() {
        if let Some(read) = inner.downcast_ref::<crate::ServerError>() {
            // A table read failed (storage, a stopping daemon): its code.
            return Status::new(crate::error::code_of(read), format!("{read} ({sql})"));
        }
        if let Some(lance) = inner.downcast_ref::<lance::Error>() {
            // A level's scan failed as it ran (its files were read).
            let code = match memwal_store::is_transient_cause(lance) {
                true => tonic::Code::Unavailable,
                false => tonic::Code::Internal,
            };
            return Status::new(code, format!("reading the table failed: {lance} ({sql})"));
        }
    }
    match e.find_root() {
        DataFusionError::ResourcesExhausted(m) => {
            // An operator may report its own words (`while Sorting`): the
            // limits are named here whatever it says.
            Status::resource_exhausted(format!(
                "query over its memory budget (query_memory_mib: {} MiB for one query, \
                 query_total_memory_mib: {} MiB for all): {m}",
                limits.memory_bytes >> 20,
                limits.total_memory_bytes >> 20
            ))
        }
        DataFusionError::Execution(_) | DataFusionError::ArrowError(..) => {
            Status::internal(format!("query failed: {e} ({sql})"))
        }
        _ => Status::invalid_argument(format!("query refused: {e} ({sql})")),
    }
}

#[cfg(test)]
#[path = "query_tests.rs"]
mod tests;
