//! Search from SQL, for any Flight SQL client with no client-side code:
//! two table functions over the served tables, run when the query runs
//! ([`TableHost::nearest`], [`TableHost::full_text`]), so a fresh,
//! unflushed row is found at once:
//!
//! ```sql
//! -- the 10 rows whose `vec` is nearest to the vector, nearest first
//! SELECT id, _distance FROM vector_search('docs', 'vec', '0.1,0.2,0.3', 10)
//! -- the rows whose `txt` matches, most relevant first (at most 20)
//! SELECT id, _score FROM fts('docs', 'txt', 'lance memwal', 20)
//! ```
//!
//! The vector is a string of comma-separated numbers; `fts`'s limit is
//! optional (absent: every match). Each result has the table's columns
//! plus `_distance` or `_score`, and takes further SQL (`WHERE`, `JOIN`,
//! ...) like any table.

use std::sync::Arc;

use arrow_schema::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{plan_err, DataFusionError, Result, ScalarValue};
use datafusion::datasource::TableType;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;

use crate::query::Hosts;
use crate::reader::search::{result_schema, DISTANCE_COLUMN, SCORE_COLUMN};
use crate::TableHost;

/// `vector_search(table, column, vector, k)`.
#[derive(Debug)]
pub(crate) struct VectorSearch {
    pub(crate) hosts: Arc<Hosts>,
    pub(crate) read_bytes: Arc<crate::query::ReadBudget>,
    /// The largest `k` served (`query_max_k`).
    pub(crate) max_k: usize,
}

/// `fts(table, column, query [, limit])`.
#[derive(Debug)]
pub(crate) struct FullText {
    pub(crate) hosts: Arc<Hosts>,
    pub(crate) read_bytes: Arc<crate::query::ReadBudget>,
}

fn text(f: &str, e: &Expr, what: &str) -> Result<String> {
    match e {
        Expr::Literal(ScalarValue::Utf8(Some(s)), _) => Ok(s.clone()),
        other => plan_err!("{f}: {what} must be a string literal, not {other}"),
    }
}

fn count(f: &str, e: &Expr, what: &str) -> Result<usize> {
    match e {
        Expr::Literal(ScalarValue::Int64(Some(k)), _) if *k > 0 => Ok(*k as usize),
        other => plan_err!("{f}: {what} must be a positive integer, not {other}"),
    }
}

fn host(f: &str, hosts: &Hosts, table: &str) -> Result<Arc<TableHost>> {
    match hosts.get(table) {
        Some(h) => Ok(h.clone()),
        None => plan_err!("{f}: no table `{table}`"),
    }
}

impl TableFunctionImpl for VectorSearch {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        const F: &str = "vector_search";
        let [table, column, vector, k] = args.exprs() else {
            return plan_err!(
                "vector_search takes (table, column, vector, k), e.g. \
                 vector_search('t', 'vec', '0.1,0.2', 10)"
            );
        };
        let host = host(F, &self.hosts, &text(F, table, "the table")?)?;
        let vector: Vec<f32> = text(F, vector, "the vector")?
            .split(',')
            .map(|x| x.trim().parse::<f32>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| DataFusionError::Plan(format!("vector_search: the vector: {e}")))?;
        Ok(Arc::new(Search {
            schema: result_schema(&host.schema(), DISTANCE_COLUMN),
            host,
            request: Request::Nearest {
                column: text(F, column, "the column")?,
                vector,
                k: match count(F, k, "k")? {
                    k if k > self.max_k => {
                        return plan_err!(
                            "vector_search: k = {k} is more than query_max_k = {}",
                            self.max_k
                        )
                    }
                    k => k,
                },
            },
            read_bytes: self.read_bytes.clone(),
        }))
    }
}

impl TableFunctionImpl for FullText {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        const F: &str = "fts";
        let (table, column, query, limit) = match args.exprs() {
            [t, c, q] => (t, c, q, None),
            [t, c, q, l] => (t, c, q, Some(count(F, l, "the limit")?)),
            _ => {
                return plan_err!(
                    "fts takes (table, column, query [, limit]), e.g. fts('t', 'txt', 'word', 10)"
                )
            }
        };
        let host = host(F, &self.hosts, &text(F, table, "the table")?)?;
        Ok(Arc::new(Search {
            schema: result_schema(&host.schema(), SCORE_COLUMN),
            host,
            request: Request::FullText {
                column: text(F, column, "the column")?,
                query: text(F, query, "the query")?,
                limit,
            },
            read_bytes: self.read_bytes.clone(),
        }))
    }
}

#[derive(Debug)]
enum Request {
    Nearest {
        column: String,
        vector: Vec<f32>,
        k: usize,
    },
    FullText {
        column: String,
        query: String,
        limit: Option<usize>,
    },
}

/// One search in one query: runs when the query is executed.
#[derive(Debug)]
struct Search {
    host: Arc<TableHost>,
    schema: SchemaRef,
    request: Request,
    read_bytes: Arc<crate::query::ReadBudget>,
}

#[async_trait]
impl TableProvider for Search {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let found = match &self.request {
            Request::Nearest { column, vector, k } => {
                use datafusion::execution::memory_pool::MemoryConsumer;
                let budget = MemoryConsumer::new("memwal exact vector search")
                    .register(&state.runtime_env().memory_pool);
                // Only the columns the query selects are read (the rest
                // are answered null and never shown).
                let wanted: Option<Vec<&str>> = projection.map(|p| {
                    p.iter()
                        .filter_map(|&i| self.schema.fields().get(i))
                        .map(|f| f.name().as_str())
                        .collect()
                });
                self.host
                    .nearest_within(column, vector, *k, None, Some(&budget), wanted.as_deref())
                    .await
            }
            Request::FullText {
                column,
                query,
                limit,
            } => self.host.full_text(column, query, *limit).await,
        };
        crate::provider::serve(
            found,
            &self.read_bytes,
            &self.schema,
            state,
            projection,
            limit,
        )
        .await
    }
}
