//! SQL over the served tables (Flight SQL `CommandStatementQuery` and
//! prepared statements): DataFusion plans and runs the query over each
//! table as [`TableHost::read_rows`] reads it (published data plus this
//! daemon's memtables), so a query sent after an ack sees the acked rows.
//!
//! `vector_search(table, column, vector, k)` is a table function for
//! nearest-neighbour search ([`crate::search`]).
//!
//! Only queries: DDL, DML and other statements are refused. Each query
//! runs within a memory pool of [`QUERY_MEMORY_BYTES`] and a time limit of
//! [`QUERY_TIMEOUT`]; a table read for it counts its rows against
//! [`QUERY_MEMORY_BYTES`] too. Bad SQL is `INVALID_ARGUMENT` naming the
//! error, past the budget `RESOURCE_EXHAUSTED`, past the time
//! `DEADLINE_EXCEEDED`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use datafusion::datasource::MemTable;
use datafusion::error::DataFusionError;
use datafusion::execution::context::{SQLOptions, SessionConfig, SessionContext};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use tonic::Status;

use crate::TableHost;

/// Memory one query may use (DataFusion's pool, and the table rows read
/// for it).
pub const QUERY_MEMORY_BYTES: usize = 512 << 20;

/// How long one query may run.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

/// The catalog and schema the served tables are in (`memwal.public.t`
/// and plain `t` both name table `t`).
pub const CATALOG: &str = "memwal";
/// See [`CATALOG`].
pub const SCHEMA: &str = "public";

/// The served tables, by name.
pub(crate) type Hosts = HashMap<String, Arc<TableHost>>;

/// The result schema of `sql` (planned over empty tables: nothing read).
pub(crate) async fn plan(hosts: &Hosts, sql: &str) -> Result<SchemaRef, Status> {
    let ctx = context(hosts, sql, false).await?;
    let df = ctx
        .sql_with_options(sql, options())
        .await
        .map_err(|e| refused(sql, e))?;
    Ok(Arc::new(df.schema().as_arrow().clone()))
}

/// Runs `sql` over the tables as of now.
pub(crate) async fn run(hosts: &Hosts, sql: &str) -> Result<(SchemaRef, Vec<RecordBatch>), Status> {
    let work = async {
        let ctx = context(hosts, sql, true).await?;
        let df = ctx
            .sql_with_options(sql, options())
            .await
            .map_err(|e| refused(sql, e))?;
        let schema = Arc::new(df.schema().as_arrow().clone());
        let batches = df.collect().await.map_err(|e| refused(sql, e))?;
        Ok::<_, Status>((schema, batches))
    };
    tokio::time::timeout(QUERY_TIMEOUT, work)
        .await
        .map_err(|_| {
            Status::deadline_exceeded(format!("query ran past its {QUERY_TIMEOUT:?} limit: {sql}"))
        })?
}

fn options() -> SQLOptions {
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
}

/// A session with every served table registered: read now (`read`) for
/// the tables `sql` names, empty otherwise.
async fn context(hosts: &Hosts, sql: &str, read: bool) -> Result<SessionContext, Status> {
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_limit(QUERY_MEMORY_BYTES, 1.0)
        .build_arc()
        .map_err(|e| Status::internal(e.to_string()))?;
    let config = SessionConfig::new().with_default_catalog_and_schema(CATALOG, SCHEMA);
    let ctx = SessionContext::new_with_config_rt(config, runtime);
    let lowered = sql.to_lowercase();
    let mut read_bytes = 0usize;
    let mut read_tables = HashMap::new();
    for (name, host) in hosts {
        let rows = if read && lowered.contains(&name.to_lowercase()) {
            let batch = host.read_rows().await.map_err(Status::from)?;
            read_bytes += batch.get_array_memory_size();
            if read_bytes > QUERY_MEMORY_BYTES {
                return Err(Status::resource_exhausted(format!(
                    "the tables this query reads hold more than its {} MiB budget",
                    QUERY_MEMORY_BYTES >> 20
                )));
            }
            read_tables.insert(name.clone(), batch.clone());
            vec![batch]
        } else {
            read_tables.insert(name.clone(), RecordBatch::new_empty(host.schema().clone()));
            vec![]
        };
        let table = MemTable::try_new(host.schema().clone(), vec![rows])
            .map_err(|e| Status::internal(format!("table `{name}`: {e}")))?;
        ctx.register_table(name.as_str(), Arc::new(table))
            .map_err(|e| Status::internal(format!("table `{name}`: {e}")))?;
    }
    ctx.register_udtf(
        "vector_search",
        Arc::new(crate::search::VectorSearch {
            tables: read_tables,
        }),
    );
    Ok(ctx)
}

/// The status for a query DataFusion refused or failed.
fn refused(sql: &str, e: DataFusionError) -> Status {
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
