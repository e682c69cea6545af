//! Scanning a served table as a stream: the plan a query runs to read the
//! table's live rows, level by level, never the whole table at once.
//!
//! The snapshot rules are those of [`crate::reader::snapshot`] (each held writer's
//! snapshot, then the published view): every put acknowledged before the
//! plan is made is in it, no unacknowledged row is, no fenced writer's row
//! is. A keyed table's levels (the base, the published SSTables above
//! what it holds, the held memtables) are merged so that no key appears
//! twice and the filter can run inside each level's scan: the base by a
//! hash anti-join against the fresh levels' keys (`merge.rs`), or, when
//! those keys would take too much of the query's memory, by upstream's
//! LSM planner over every level (`LsmScanner::create_plan`: each level
//! deduplicated on its own, a key's older copies dropped by the newer
//! levels' key indexes). An append-only table is the union of its
//! levels, each a scan of its own (in parallel partitions).
//!
//! What is pushed down: the columns asked for (a `count(*)` reads the key
//! columns only), the filters of [`pushable`] form (Lance evaluates them
//! in its scans, with its scalar indexes and statistics; they are pushed
//! `Inexact`, so the query applies them again), and a `LIMIT` (the scan
//! stops when it has that many rows). Memory: the levels stream batch by
//! batch; what a query keeps (sorts, aggregates) is charged to its
//! DataFusion pool by the operators that keep it. The held memtables are
//! the writers' own rows (shared, bounded by the writers' memtable
//! limits), not copied for a read.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions};
use arrow_schema::SchemaRef;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DataFusionError, Statistics};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Expr, Operator};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::limit::GlobalLimitExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use futures::StreamExt;

use crate::reader::snapshot::{column_or_nulls, Snapshots};
use crate::{ServerError, TableHost};

/// The decoded bytes a level's scan puts in one batch at most (Lance's
/// `batch_size_bytes`; by rows alone its batches here are 16,384 rows
/// whatever their width: 17 MB of data in 69 MB of buffers for 1 KB
/// rows). The batches a query has in flight (decoded ahead, queued for
/// its client) are what a full scan holds beyond the query's budget.
const SCAN_BATCH_BYTES: u64 = 4 << 20;

/// The rows a level's scan puts in one batch at most (Lance's default on
/// our stores; with only a byte limit, a narrow column's batches grow to
/// 512 K rows and a `count(*)` decodes fewer of them at once).
const SCAN_BATCH_ROWS: usize = 16_384;

/// The storage schema's tombstone column (memtable, WAL and SSTable rows).
const TOMBSTONE: &str = memwal_memtable::TOMBSTONE_COLUMN;

/// What a scan returns.
#[derive(Debug, Clone)]
pub(crate) struct ScanRequest {
    /// The columns, by name, in this order and these types: the table's
    /// schema (as the query was planned) projected. A column the table
    /// no longer has reads as nulls.
    pub(crate) out: SchemaRef,
    /// Rows failing it may be left out (it is of [`pushable`] form, over
    /// unqualified column names); `None`: no filter. Never exact: the
    /// caller filters again.
    pub(crate) filter: Option<Expr>,
    /// At most this many rows are needed. Only honoured without a
    /// filter (a level may fail to apply the filter, which is then left
    /// to the caller: a limit below it would cut rows it would keep).
    pub(crate) limit: Option<usize>,
    /// Bytes the fresh levels' keys may take in a hash table when a keyed
    /// table's levels are merged (`merge.rs`); past it the merge probes
    /// the fresh levels' key indexes instead. A share of the query's
    /// memory budget ([`key_budget`]).
    pub(crate) key_budget: usize,
}

/// The share of a query's memory (`limit`: its pool's limit, `None`:
/// unlimited) its scans' merges may give the fresh levels' keys: a
/// quarter, or [`UNBOUNDED_KEY_BUDGET`] without a limit.
pub(crate) fn key_budget(limit: Option<usize>) -> usize {
    limit.map_or(UNBOUNDED_KEY_BUDGET, |n| n / 4)
}

/// [`key_budget`] for a query whose memory is not limited (an embedded
/// [`TableHost::scan_stream`]).
const UNBOUNDED_KEY_BUDGET: usize = 256 << 20;

impl TableHost {
    /// A plan streaming the table's live rows as of now (see the module
    /// docs) in `req.out`'s columns. The snapshot and view are taken here;
    /// the levels are read when the plan runs. Refused as every read is
    /// while a held shard is down or failed ([`Self::snapshot_and_view`]).
    pub(crate) async fn scan_plan(
        &self,
        req: &ScanRequest,
    ) -> Result<Arc<dyn ExecutionPlan>, ServerError> {
        let keys: Vec<String> = self
            .key_schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        self.reader()
            .scans
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        metrics::counter!("memwal_server_reads_total", "table" => self.name().to_string(), "kind" => "scan")
            .increment(1);
        let req = &ScanRequest {
            limit: req.limit.filter(|_| req.filter.is_none()),
            ..req.clone()
        };
        let (snapshots, view) = self.snapshot_and_view(None).await?;
        tracing::debug!(table = %self.name(),
            sstables = view.shards.iter().map(|s| s.sstables.len()).sum::<usize>(),
            held_shards = snapshots.len(), columns = req.out.fields().len(),
            filter = req.filter.is_some(), limit = ?req.limit, "scan planned");
        // The chaos suite's broken variant reads a keyed table's levels
        // one after the other, unmerged (its read checks must catch it).
        let rows = match req.filter.is_none() && req.limit.is_none() && at_rest(&snapshots, &view) {
            // Only the base holds rows: its count is in its metadata.
            true => Some(
                view.base
                    .count_rows(None)
                    .await
                    .map_err(|e| self.read_failed("counting the base's rows", e))?,
            ),
            false => None,
        };
        let plan = if keys.is_empty() || memwal_store::broken("broken::read_levels_unmerged") {
            self.levels_unioned(req, snapshots, &view).await?
        } else {
            self.levels_merged(req, &keys, &snapshots, &view).await?
        };
        let plan: Arc<dyn ExecutionPlan> = match rows {
            Some(n) => Arc::new(Conformed::new(plan, req.out.clone()).with_rows(n)),
            None => plan,
        };
        Ok(match req.limit {
            Some(n) => {
                let one: Arc<dyn ExecutionPlan> =
                    match plan.properties().output_partitioning().partition_count() {
                        1 => plan,
                        _ => Arc::new(CoalescePartitionsExec::new(plan)),
                    };
                Arc::new(GlobalLimitExec::new(one, 0, Some(n)))
            }
            None => plan,
        })
    }

    /// A keyed table's levels merged: by a hash anti-join of the base
    /// against the fresh levels' keys when those fit the request's key
    /// budget (`merge.rs`), else by upstream's LSM planner over every level.
    async fn levels_merged(
        &self,
        req: &ScanRequest,
        keys: &[String],
        snapshots: &Snapshots,
        view: &memwal_table::TableView,
    ) -> Result<Arc<dyn ExecutionPlan>, ServerError> {
        self.reader()
            .memtables
            .keep_only(&snapshots.keys().copied().collect());
        if let Some(plan) = self.levels_joined(req, keys, snapshots, view).await? {
            return Ok(plan);
        }
        self.planned_merge(req, keys, snapshots, view, true).await
    }

    /// Upstream's LSM planner over the fresh levels of `view` and
    /// `snapshots`, and over the base when `with_base`. A filter Lance
    /// cannot plan is left to the query (it is never exact here).
    pub(super) async fn planned_merge(
        &self,
        req: &ScanRequest,
        keys: &[String],
        snapshots: &Snapshots,
        view: &memwal_table::TableView,
        with_base: bool,
    ) -> Result<Arc<dyn ExecutionPlan>, ServerError> {
        let base: arrow_schema::Schema = view.base.schema().into();
        let filter = req.filter.as_ref().filter(|f| applies_to(f, &base));
        let scanner =
            |filter| self.merged_scanner(req, keys, snapshots, view, &base, with_base, filter);
        let plan = match (scanner(filter)?.create_plan().await, filter) {
            (Ok(plan), _) => plan,
            (Err(e), Some(f)) => {
                tracing::debug!(table = %self.name(), filter = %f, error = %e,
                    "Lance cannot plan the filter; the query applies it");
                scanner(None)?
                    .create_plan()
                    .await
                    .map_err(|e| self.read_failed("planning the scan", e))?
            }
            (Err(e), None) => return Err(self.read_failed("planning the scan", e)),
        };
        Ok(Arc::new(Conformed::new(plan, req.out.clone())))
    }

    /// Upstream's scanner over `view` (whose base has the Arrow schema
    /// `base`; the base read only `with_base`) and `snapshots` for `req`,
    /// with `filter` pushed into every level.
    #[allow(clippy::too_many_arguments)]
    fn merged_scanner(
        &self,
        req: &ScanRequest,
        keys: &[String],
        snapshots: &Snapshots,
        view: &memwal_table::TableView,
        base: &arrow_schema::Schema,
        with_base: bool,
        filter: Option<&Expr>,
    ) -> Result<lance::dataset::mem_wal::LsmScanner, ServerError> {
        let failed = |what: &str, e: String| ServerError::Setup {
            table: self.name().to_string(),
            reason: format!("{what}: {e}"),
        };
        let mut scanner = match with_base {
            true => lance::dataset::mem_wal::LsmScanner::new(
                view.base.clone(),
                view.snapshots(),
                keys.to_vec(),
            ),
            false => fresh_only_scanner(view, base, keys),
        };
        let account = self.reader().account.pool();
        for s in snapshots.values() {
            if let Some(m) = self
                .reader()
                .memtables
                .of(s, keys, &[], account.as_ref())
                .map_err(|e| self.unbuilt(e))?
            {
                scanner = scanner.with_in_memory_memtables(s.shard.uuid(), m);
            }
        }
        // Only what the table has now; the rest reads as nulls.
        let columns = present(&req.out, base);
        scanner = scanner
            .project(&columns)
            .map_err(|e| failed("projecting the scan", e.to_string()))?;
        if let Some(f) = filter {
            scanner = scanner.filter_expr(f.clone());
        }
        if let Some(n) = req.limit {
            scanner = scanner
                .limit(Some(n as i64), None)
                .map_err(|e| failed("limiting the scan", e.to_string()))?;
        }
        Ok(scanner)
    }

    /// A level that could not be opened or planned, typed: `UNAVAILABLE`
    /// when storage failed in a way a retry may pass.
    pub(super) fn read_failed(&self, what: &'static str, source: lance::Error) -> ServerError {
        ServerError::Read {
            table: self.name().to_string(),
            what,
            source: memwal_table::TableError::Read {
                uri: self.loc().uri.clone(),
                source,
            },
        }
    }

    /// Every level's rows, unmerged (an append-only table has no key to
    /// merge by): the base, each shard's SSTables in the view, the held
    /// writers' unflushed rows; one partition per level.
    async fn levels_unioned(
        &self,
        req: &ScanRequest,
        snapshots: Snapshots,
        view: &memwal_table::TableView,
    ) -> Result<Arc<dyn ExecutionPlan>, ServerError> {
        let mut arms: Vec<Arc<dyn ExecutionPlan>> = Vec::new();
        // Only the base has no tombstones to drop after its scan: a limit
        // is pushed into its scan alone.
        arms.push(self.level_scan(&view.base, req, req.limit).await?);
        let opened = self
            .reader()
            .opened
            .open_view(self.loc(), view)
            .await
            .map_err(|e| self.read_failed("opening an SSTable", e))?;
        for ds in &opened {
            arms.push(self.level_scan(ds, req, None).await?);
        }
        let mut unflushed = Vec::new();
        for s in snapshots.into_values() {
            for b in &s.batches {
                let b = conform(b, &req.out).map_err(|e| ServerError::Setup {
                    table: self.name().to_string(),
                    reason: format!("reading unflushed rows: {e}"),
                })?;
                if b.num_rows() > 0 {
                    unflushed.push(b);
                }
            }
        }
        if !unflushed.is_empty() {
            let memory = datafusion::datasource::memory::MemorySourceConfig::try_new_exec(
                &[unflushed],
                req.out.clone(),
                None,
            )
            .map_err(|e| ServerError::Setup {
                table: self.name().to_string(),
                reason: format!("reading unflushed rows: {e}"),
            })?;
            arms.push(memory);
        }
        Ok(match arms.len() {
            1 => arms.remove(0),
            _ => UnionExec::try_new(arms).map_err(|e| ServerError::Setup {
                table: self.name().to_string(),
                reason: format!("planning the scan: {e}"),
            })?,
        })
    }

    /// One Lance dataset's rows in `req.out` (its tombstones dropped):
    /// the columns it has (and its tombstones), `req.filter` where every
    /// column it names is there, at most `limit` rows.
    pub(super) async fn level_scan(
        &self,
        ds: &Arc<lance::Dataset>,
        req: &ScanRequest,
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>, ServerError> {
        let failed = |e: lance::Error| self.read_failed("planning a level's scan", e);
        let schema: arrow_schema::Schema = ds.schema().into();
        let mut columns = present(&req.out, &schema);
        if schema.column_with_name(TOMBSTONE).is_some() {
            columns.push(TOMBSTONE.to_string());
        }
        if columns.is_empty() {
            // A row count needs some column: the narrowest will do.
            columns.extend(narrowest(&schema));
        }
        let filter = req.filter.as_ref().filter(|f| applies_to(f, &schema));
        let scanner = |filter: Option<&Expr>| {
            let mut scanner = ds.scan();
            scanner.project(&columns)?;
            scanner.batch_size(SCAN_BATCH_ROWS);
            scanner.batch_size_bytes(SCAN_BATCH_BYTES);
            if let Some(f) = filter {
                scanner.filter_expr(f.clone());
            }
            if limit.is_some() {
                scanner.limit(limit.map(|n| n as i64), None)?;
            }
            Ok::<_, lance::Error>(scanner)
        };
        let plan = match (scanner(filter).map_err(failed)?.create_plan().await, filter) {
            (Ok(plan), _) => plan,
            (Err(e), Some(f)) => {
                // Never exact here: the query applies it.
                tracing::debug!(table = %self.name(), filter = %f, error = %e,
                    "Lance cannot plan the filter; the query applies it");
                scanner(None)
                    .map_err(failed)?
                    .create_plan()
                    .await
                    .map_err(failed)?
            }
            (Err(e), None) => return Err(failed(e)),
        };
        Ok(Arc::new(Conformed::new(plan, req.out.clone())))
    }
}

impl TableHost {
    /// The live rows as of now (the rules of [`crate::reader::snapshot`]) that match
    /// `filter` (a DataFusion expression over the table's columns;
    /// `None`: every row), with only `columns` (`None`: all, in table
    /// order), at most `limit` of them, as a stream: the levels are read
    /// as it is polled, as a query reads them. [`ServerError::InvalidInput`]
    /// names a filter or a column that does not fit the table; a refused
    /// read is the refusal of [`Self::snapshot_and_view`].
    pub async fn scan_stream(
        &self,
        filter: Option<Expr>,
        columns: Option<&[&str]>,
        limit: Option<usize>,
    ) -> Result<SendableRecordBatchStream, ServerError> {
        let invalid = |e: DataFusionError| ServerError::InvalidInput {
            table: self.name().to_string(),
            reason: format!("scan: {e}"),
        };
        let schema = self.schema();
        let out = match columns {
            None => schema.clone(),
            Some(names) => {
                let at = names
                    .iter()
                    .map(|n| schema.index_of(n))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| invalid(e.into()))?;
                Arc::new(schema.project(&at).map_err(|e| invalid(e.into()))?)
            }
        };
        let state = datafusion::prelude::SessionContext::new().state();
        // Checked (and coerced to the columns' types) before anything is read.
        let predicate = match &filter {
            Some(f) => {
                let columns = datafusion::common::DFSchema::try_from(schema.as_ref().clone())
                    .map_err(invalid)?;
                let p = state
                    .create_physical_expr(f.clone(), &columns)
                    .map_err(invalid)?;
                match p.data_type(&schema).map_err(invalid)? {
                    arrow_schema::DataType::Boolean => Some(p),
                    other => {
                        return Err(invalid(DataFusionError::Plan(format!(
                            "the filter is {other}, not a boolean"
                        ))))
                    }
                }
            }
            None => None,
        };
        let pushed = filter.as_ref().filter(|f| pushable(f));
        let req = ScanRequest {
            out: if predicate.is_some() {
                schema
            } else {
                out.clone()
            },
            filter: pushed.and_then(|f| conjunction(&[f])),
            limit: if predicate.is_some() { None } else { limit },
            key_budget: key_budget(None),
        };
        let mut plan = self.scan_plan(&req).await?;
        if let Some(p) = predicate {
            let filtered =
                datafusion::physical_plan::filter::FilterExec::try_new(p, plan).map_err(invalid)?;
            plan = Arc::new(Conformed::new(Arc::new(filtered), out));
            if let Some(n) = limit {
                plan = Arc::new(GlobalLimitExec::new(
                    Arc::new(CoalescePartitionsExec::new(plan)),
                    0,
                    Some(n),
                ));
            }
        }
        datafusion::physical_plan::execute_stream(plan, state.task_ctx())
            .map_err(|e| self.query_failed(e))
    }

    /// [`Self::scan_stream`]'s rows, all of them, in one batch.
    pub async fn scan(
        &self,
        filter: Option<Expr>,
        columns: Option<&[&str]>,
        limit: Option<usize>,
    ) -> Result<RecordBatch, ServerError> {
        let stream = self.scan_stream(filter, columns, limit).await?;
        let schema = stream.schema();
        let batches: Vec<RecordBatch> = futures::TryStreamExt::try_collect(stream)
            .await
            .map_err(|e| self.query_failed(e))?;
        arrow_select::concat::concat_batches(&schema, &batches).map_err(|e| ServerError::Setup {
            table: self.name().to_string(),
            reason: format!("scan: {e}"),
        })
    }

    /// Every live row of the table as of now, in its schema (an
    /// append-only table: every row of every level).
    pub async fn read_rows(&self) -> Result<RecordBatch, ServerError> {
        self.scan(None, None, None).await
    }

    /// The error of a scan that failed while it ran: a read's own refusal
    /// or failure as it was raised, anything else named as a failed scan.
    pub(crate) fn query_failed(&self, e: DataFusionError) -> ServerError {
        let text = e.to_string();
        match raised(e, self) {
            Some(read) => read,
            None => ServerError::Setup {
                table: self.name().to_string(),
                reason: format!("scan: {text}"),
            },
        }
    }
}

/// The [`ServerError`] `e` carries (a table read's own error, or a
/// level's scan failing as it ran), if any.
fn raised(e: DataFusionError, host: &TableHost) -> Option<ServerError> {
    match e {
        DataFusionError::External(inner) => match inner.downcast::<ServerError>() {
            Ok(read) => Some(*read),
            Err(inner) => inner
                .downcast::<lance::Error>()
                .ok()
                .map(|e| host.read_failed("scanning a level", *e)),
        },
        DataFusionError::Context(_, inner) => raised(*inner, host),
        DataFusionError::Shared(shared) => {
            Arc::try_unwrap(shared).ok().and_then(|e| raised(e, host))
        }
        _ => None,
    }
}

/// Whether every row of the read is the base's: no held writer has an
/// unflushed row, no shard an SSTable the base does not hold.
fn at_rest(snapshots: &Snapshots, view: &memwal_table::TableView) -> bool {
    snapshots
        .values()
        .all(|s| s.batches.iter().all(|b| b.num_rows() == 0))
        && view.shards.iter().all(|s| s.sstables.is_empty())
}

/// Upstream's scanner over `view`'s fresh levels without its base: its
/// SSTables resolved under the base's URI with the base's session and
/// store parameters, its columns matched to the base's by field id, as
/// the scanner over every level would.
fn fresh_only_scanner(
    view: &memwal_table::TableView,
    base: &arrow_schema::Schema,
    keys: &[String],
) -> lance::dataset::mem_wal::LsmScanner {
    let mut scanner = lance::dataset::mem_wal::LsmScanner::without_base_table(
        Arc::new(base.clone()),
        view.base.uri(),
        view.snapshots(),
        keys.to_vec(),
    )
    .with_identity_schema(Arc::new(
        lance::dataset::mem_wal::arrow_schema_with_field_ids(view.base.schema()),
    ))
    .with_session(view.base.session());
    if let Some(params) = view.base.store_params() {
        // The base's own store binding would redirect every SSTable's
        // open to the base; the rest (options, credentials) carries over.
        #[allow(deprecated)]
        let params = lance::io::ObjectStoreParams {
            object_store: None,
            ..params.clone()
        };
        scanner = scanner.with_store_params(params);
    }
    scanner
}

/// The names of `out`'s columns that `schema` has, in `out`'s order.
fn present(out: &SchemaRef, schema: &arrow_schema::Schema) -> Vec<String> {
    out.fields()
        .iter()
        .filter(|f| schema.column_with_name(f.name()).is_some())
        .map(|f| f.name().clone())
        .collect()
}

/// The name of `schema`'s narrowest fixed-width column (else its first).
fn narrowest(schema: &arrow_schema::Schema) -> Option<String> {
    schema
        .fields()
        .iter()
        .filter(|f| f.name() != TOMBSTONE)
        .min_by_key(|f| f.data_type().primitive_width().unwrap_or(usize::MAX))
        .map(|f| f.name().clone())
}

/// Whether every column `filter` names is in `schema` (else the filter is
/// not pushed into that level's scan; the query applies it above).
fn applies_to(filter: &Expr, schema: &arrow_schema::Schema) -> bool {
    filter
        .column_refs()
        .iter()
        .all(|c| schema.column_with_name(&c.name).is_some())
}

/// Whether `filter` is of a form Lance's scans evaluate as DataFusion
/// does: columns, literals, comparisons, boolean logic, arithmetic,
/// `IS [NOT] NULL`, `BETWEEN`, `IN` lists, `LIKE` and casts. Anything
/// else (functions, subqueries), and a filter holding a long arithmetic
/// chain (`crate::long_arithmetic`), is left to the query.
pub(crate) fn pushable(filter: &Expr) -> bool {
    !crate::long_arithmetic::too_long(filter)
        && !filter
            .exists(|e| {
                Ok(!match e {
                    Expr::Column(_) | Expr::Literal(..) => true,
                    Expr::BinaryExpr(b) => matches!(
                        b.op,
                        Operator::Eq
                            | Operator::NotEq
                            | Operator::Lt
                            | Operator::LtEq
                            | Operator::Gt
                            | Operator::GtEq
                            | Operator::And
                            | Operator::Or
                            | Operator::Plus
                            | Operator::Minus
                            | Operator::Multiply
                            | Operator::Divide
                    ),
                    Expr::Not(_)
                    | Expr::IsNull(_)
                    | Expr::IsNotNull(_)
                    | Expr::Between(_)
                    | Expr::InList(_)
                    | Expr::Cast(_)
                    | Expr::Negative(_) => true,
                    Expr::Like(l) => !l.case_insensitive,
                    _ => false,
                })
            })
            .unwrap_or(true)
}

/// `filters` (each [`pushable`]) as one conjunction over unqualified
/// column names; `None` when there are none.
pub(crate) fn conjunction(filters: &[&Expr]) -> Option<Expr> {
    let unqualified = filters.iter().map(|f| {
        (*f).clone()
            .transform(|e| {
                Ok(match e {
                    Expr::Column(c) if c.relation.is_some() => {
                        Transformed::yes(Expr::Column(Column::new_unqualified(c.name)))
                    }
                    other => Transformed::no(other),
                })
            })
            .map(|t| t.data)
            .unwrap_or_else(|_| (*f).clone())
    });
    unqualified.reduce(|a, b| a.and(b))
}

/// `b` in `out`'s columns (matched by Lance field id, else name; a column
/// `b` lacks reads as nulls), its tombstoned rows dropped.
fn conform(b: &RecordBatch, out: &SchemaRef) -> Result<RecordBatch, arrow_schema::ArrowError> {
    let live = match b.column_by_name(TOMBSTONE) {
        Some(t) => {
            let live =
                BooleanArray::from_iter(t.as_boolean().iter().map(|x| Some(!x.unwrap_or(false))));
            arrow_select::filter::filter_record_batch(b, &live)?
        }
        None => b.clone(),
    };
    let columns = out
        .fields()
        .iter()
        .map(|f| column_or_nulls(&live, f))
        .collect::<Vec<ArrayRef>>();
    RecordBatch::try_new_with_options(
        out.clone(),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(live.num_rows())),
    )
}

/// A scan planned by Lance (upstream's LSM planner, or a dataset's
/// scanner), run as planned, its batches in the query's columns
/// ([`conform`]).
///
/// A leaf to the query's optimizer: the plan inside is not shown to it,
/// so it is not rewritten. It would be otherwise: DataFusion adds
/// round-robin repartitions under upstream's ordered concatenation of the
/// levels, which reads its inputs one after the other, and a repartition
/// whose second output is not read yet buffers it whole (a level's rows
/// in memory, past any query budget).
#[derive(Debug)]
pub(super) struct Conformed {
    input: Arc<dyn ExecutionPlan>,
    out: SchemaRef,
    properties: Arc<PlanProperties>,
    /// How many rows it returns, when that is known exactly before it
    /// runs (a count then needs no read: DataFusion answers `count(*)`
    /// from it).
    rows: Option<usize>,
}

impl Conformed {
    pub(super) fn new(input: Arc<dyn ExecutionPlan>, out: SchemaRef) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(out.clone()),
            input.properties().output_partitioning().clone(),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self {
            input,
            out,
            properties,
            rows: None,
        }
    }

    /// The plan it runs.
    #[cfg(test)]
    pub(super) fn inner(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }

    /// The same, known to return exactly `rows` rows.
    fn with_rows(mut self, rows: usize) -> Self {
        self.rows = Some(rows);
        self
    }
}

impl DisplayAs for Conformed {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let inner = datafusion::physical_plan::displayable(self.input.as_ref()).one_line();
        write!(f, "MemwalConformed: {}", inner.to_string().trim_end())
    }
}

impl ExecutionPlan for Conformed {
    fn name(&self) -> &str {
        "MemwalConformed"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        match children.len() {
            0 => Ok(self),
            n => Err(DataFusionError::Internal(format!(
                "MemwalConformed is a leaf, given {n} inputs"
            ))),
        }
    }

    fn partition_statistics(
        &self,
        partition: Option<usize>,
    ) -> datafusion::common::Result<Arc<Statistics>> {
        let mut stats = Statistics::new_unknown(&self.out);
        let whole = partition.is_none() || self.properties.partitioning.partition_count() == 1;
        if let (Some(n), true) = (self.rows, whole) {
            stats.num_rows = Precision::Exact(n);
        }
        Ok(Arc::new(stats))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> datafusion::common::Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let out = self.out.clone();
        let batches = input.map(move |b| {
            b.and_then(|b| {
                conform(&b, &out).map_err(|e| DataFusionError::ArrowError(Box::new(e), None))
            })
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.out.clone(),
            batches,
        )))
    }
}
