//! A served table as DataFusion sees it: read when the query runs, as a
//! key lookup ([`TableHost::lookup_keys`]) when the filters name
//! primary-key values (`id = 4`, `id IN (1, 2)`, `a = 1 AND b = 2` for a
//! composite key), else as a stream of every level
//! ([`TableHost::scan_plan`]: the columns asked for, the filters Lance can
//! evaluate, a limit). Filters are pushed down `Inexact`: DataFusion
//! still applies them, so a lookup or a level's scan only has to return a
//! superset of the matching rows.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::datasource::{MemTable, TableType};
use datafusion::logical_expr::{BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;

use crate::query::ReadBudget;
use crate::reader::lookup::KeyTuples;
use crate::TableHost;

/// One served table in one query's session.
#[derive(Debug)]
pub(crate) struct HostTable {
    host: Arc<TableHost>,
    /// The table's schema when the query was planned.
    schema: SchemaRef,
    /// This query's budget for table reads (shared by its tables).
    read_bytes: Arc<ReadBudget>,
}

impl HostTable {
    pub(crate) fn new(host: Arc<TableHost>, read_bytes: Arc<ReadBudget>) -> Self {
        Self {
            schema: host.schema(),
            host,
            read_bytes,
        }
    }

    /// The key tuples `filters` restrict the table to, when they do: one
    /// filter that is a key restriction itself ([`Self::keys_of`]), else
    /// the filters (DataFusion splits a top-level `AND`) that restrict key
    /// columns to literals, combined when they restrict every key column.
    fn keys_of_filters(&self, filters: &[Expr]) -> Option<KeyTuples> {
        if let Some(keys) = filters.iter().find_map(|f| self.keys_of(f)) {
            return Some(keys);
        }
        let mut values = ColumnValues::new();
        for f in filters {
            if let Some(v) = self.values_of(f) {
                values = merge_values(values, v)?;
            }
        }
        self.tuples(values)
    }

    /// The key tuples `filter` restricts the table to, when it restricts
    /// every key column to literals (`=`, a non-negated `IN` list, `AND`s
    /// of those), or is an `OR` of such restrictions; `None` past
    /// [`MAX_LOOKUP_KEYS`] tuples. Chains of `OR` and `AND` are walked
    /// without recursion (a statement's depth is capped before planning,
    /// `crate::statement`, but nothing here relies on it).
    fn keys_of(&self, filter: &Expr) -> Option<KeyTuples> {
        let mut keys = KeyTuples::new();
        // DataFusion rewrites a short `IN` list as `OR`ed equalities.
        for disjunct in operands(filter, Operator::Or) {
            keys.extend(self.tuples(self.values_of(disjunct)?)?);
            if keys.len() > MAX_LOOKUP_KEYS {
                return None;
            }
        }
        Some(keys)
    }

    /// The literal values `filter` restricts key columns to (by key
    /// position), when it is an `AND` of equalities, `IN` lists and `OR`s
    /// of those on one column, on key columns only; `None` past
    /// [`MAX_LOOKUP_KEYS`] values for a column.
    fn values_of(&self, filter: &Expr) -> Option<ColumnValues> {
        let disjuncts = operands(filter, Operator::Or);
        if disjuncts.len() > 1 {
            // `a IN (1, 2)`, rewritten by DataFusion as `a = 1 OR a = 2`:
            // every disjunct restricts the same column.
            let mut column: Option<(usize, Vec<ScalarValue>)> = None;
            for d in disjuncts {
                let (at, values) = self.restriction(d)?;
                match &mut column {
                    None => column = Some((at, values)),
                    Some((first, all)) if *first == at => all.extend(values),
                    Some(_) => return None,
                }
                if column
                    .as_ref()
                    .is_some_and(|(_, v)| v.len() > MAX_LOOKUP_KEYS)
                {
                    return None;
                }
            }
            return column.map(|(at, values)| ColumnValues::from([(at, values)]));
        }
        let mut values = ColumnValues::new();
        for conjunct in operands(filter, Operator::And) {
            let more = match conjunct {
                // One level down: its disjuncts must be restrictions.
                Expr::BinaryExpr(BinaryExpr {
                    op: Operator::Or, ..
                }) => self.values_of(conjunct)?,
                other => ColumnValues::from([self.restriction(other)?]),
            };
            values = merge_values(values, more)?;
        }
        Some(values)
    }

    /// The key column (by position) and values `e` restricts it to, when
    /// it is `column = literal` (either way round) or a non-negated `IN`
    /// list of at most [`MAX_LOOKUP_KEYS`] literals.
    fn restriction(&self, e: &Expr) -> Option<(usize, Vec<ScalarValue>)> {
        let key_schema = self.host.key_schema();
        let position = |e: &Expr| match e {
            Expr::Column(c) => key_schema.index_of(&c.name).ok(),
            _ => None,
        };
        let literal = |e: &Expr| match e {
            Expr::Literal(v, _) => Some(v.clone()),
            _ => None,
        };
        match e {
            Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::Eq,
                right,
            }) => match (position(left), position(right)) {
                (Some(at), None) => Some((at, vec![literal(right)?])),
                (None, Some(at)) => Some((at, vec![literal(left)?])),
                _ => None,
            },
            Expr::InList(list) if !list.negated && list.list.len() <= MAX_LOOKUP_KEYS => {
                let at = position(&list.expr)?;
                let values = list.list.iter().map(literal).collect::<Option<Vec<_>>>()?;
                Some((at, values))
            }
            _ => None,
        }
    }

    /// Every combination of `values`, when they restrict every key column
    /// (and the combinations are at most [`MAX_LOOKUP_KEYS`]).
    fn tuples(&self, values: ColumnValues) -> Option<KeyTuples> {
        let width = self.host.key_schema().fields().len();
        if width == 0 || values.len() != width {
            return None;
        }
        let mut tuples: KeyTuples = vec![Vec::new()];
        for at in 0..width {
            let column = values.get(&at)?;
            if tuples.len() * column.len() > MAX_LOOKUP_KEYS {
                return None;
            }
            tuples = tuples
                .into_iter()
                .flat_map(|t| {
                    column.iter().map(move |v| {
                        let mut t = t.clone();
                        t.push(v.clone());
                        t
                    })
                })
                .collect();
        }
        Some(tuples)
    }
}

/// Literal values per key column (by position in the primary key).
type ColumnValues = std::collections::BTreeMap<usize, Vec<ScalarValue>>;

/// A filter naming more key combinations than this is a scan, not a lookup.
const MAX_LOOKUP_KEYS: usize = 4096;

/// `a` and `b` together; `None` when both restrict one column (the
/// filter is then left to DataFusion).
fn merge_values(mut a: ColumnValues, b: ColumnValues) -> Option<ColumnValues> {
    for (at, v) in b {
        if a.insert(at, v).is_some() {
            return None;
        }
    }
    Some(a)
}

/// `e`'s operands under `op`, in order (`a OR b OR c`: `[a, b, c]`;
/// anything else: `[e]`), flattened with a stack of its own.
fn operands(e: &Expr, op: Operator) -> Vec<&Expr> {
    let mut out = Vec::new();
    let mut pending = vec![e];
    while let Some(e) = pending.pop() {
        match e {
            Expr::BinaryExpr(BinaryExpr { left, op: o, right }) if *o == op => {
                pending.push(right);
                pending.push(left);
            }
            other => out.push(other),
        }
    }
    out
}

/// What a table read for a query (`read`, in `schema`) gives the query:
/// its failure, or its rows counted against the query's memory pool
/// (`budget` holds them until the query ends) and scanned from memory.
pub(crate) async fn serve(
    read: std::result::Result<RecordBatch, crate::ServerError>,
    budget: &ReadBudget,
    schema: &SchemaRef,
    state: &dyn Session,
    projection: Option<&Vec<usize>>,
    limit: Option<usize>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let batch = read.map_err(|e| DataFusionError::External(Box::new(e)))?;
    // Read in the table's schema as of now; answered in the schema the
    // query was planned with (a column added meanwhile is left out, one
    // dropped meanwhile reads as nulls).
    let batch = if batch.schema().fields() == schema.fields() {
        batch
    } else {
        let columns = schema
            .fields()
            .iter()
            .map(|f| crate::reader::snapshot::column_or_nulls(&batch, f))
            .collect();
        RecordBatch::try_new(schema.clone(), columns)?
    };
    budget.charge(
        &state.runtime_env().memory_pool,
        "memwal table read",
        batch.get_array_memory_size(),
    )?;
    MemTable::try_new(schema.clone(), vec![vec![batch]])?
        .scan(state, projection, &[], limit)
        .await
}

#[async_trait]
impl TableProvider for HostTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| {
                match self.keys_of(f).is_some()
                    || self.values_of(f).is_some()
                    || crate::reader::scan::pushable(f)
                {
                    true => TableProviderFilterPushDown::Inexact,
                    false => TableProviderFilterPushDown::Unsupported,
                }
            })
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if let Some(keys) = self.keys_of_filters(filters) {
            let read = self.host.lookup_keys(&keys).await;
            return serve(
                read,
                &self.read_bytes,
                &self.schema,
                state,
                projection,
                limit,
            )
            .await;
        }
        let out = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => self.schema.clone(),
        };
        let pushed: Vec<&Expr> = filters
            .iter()
            .filter(|f| crate::reader::scan::pushable(f))
            .collect();
        let req = crate::reader::scan::ScanRequest {
            out,
            filter: crate::reader::scan::conjunction(&pushed),
            limit,
            key_budget: crate::reader::scan::key_budget(
                match state.runtime_env().memory_pool.memory_limit() {
                    datafusion::execution::memory_pool::MemoryLimit::Finite(n) => Some(n),
                    _ => None,
                },
            ),
        };
        self.host
            .scan_plan(&req)
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;

    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;

    /// A `bucket(id, 4)` table `t` in `dir`: `id` int64 key, `v` utf8.
    pub(crate) async fn table(dir: &tempfile::TempDir) -> Arc<TableHost> {
        table_with(dir, Vec::new()).await
    }

    /// [`table`] with `extra` columns after `v`.
    pub(crate) async fn table_with(dir: &tempfile::TempDir, extra: Vec<Field>) -> Arc<TableHost> {
        let path = dir.path().join("t").to_str().unwrap().to_string();
        let loc = memwal_store::open_store(&path).unwrap();
        let key = Field::new("id", DataType::Int64, false).with_metadata(
            [(
                memwal_memtable::PRIMARY_KEY_KEY.to_string(),
                "true".to_string(),
            )]
            .into(),
        );
        let mut fields = vec![key, Field::new("v", DataType::Utf8, true)];
        fields.extend(extra);
        let schema = Arc::new(Schema::new(fields));
        let sharding = memwal_table::TableSharding::Bucket {
            column: "id".into(),
            buckets: 4,
        };
        memwal_table::create_table(&loc, schema, &sharding)
            .await
            .unwrap();
        Arc::new(
            TableHost::open("t", loc, memwal::ShardWriterConfig::default())
                .await
                .unwrap(),
        )
    }

    /// Merges every published SSTable of `host`'s table into its base
    /// (one compactor pass, each shard's result checked).
    pub(crate) async fn compact(host: &TableHost) {
        let compactor = memwal_compactor::Compactor::new(
            host.loc().clone(),
            memwal_compactor::CompactorConfig::default(),
        );
        for r in compactor.run_once().await.unwrap() {
            r.unwrap();
        }
    }

    fn pairs(batches: &[RecordBatch]) -> Vec<(i64, String)> {
        let mut out = Vec::new();
        for b in batches {
            let ids = b.column(0).as_primitive::<Int64Type>();
            let vs = b.column(1).as_string::<i32>();
            for i in 0..b.num_rows() {
                out.push((ids.value(i), vs.value(i).to_string()));
            }
        }
        out
    }

    /// Rows of `ids` for `host`'s table, `v` = `value(id)`.
    pub(crate) fn rows(
        host: &TableHost,
        ids: &[i64],
        value: impl Fn(i64) -> String,
    ) -> RecordBatch {
        RecordBatch::try_new(
            host.schema(),
            vec![
                Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
                Arc::new(StringArray::from_iter_values(ids.iter().map(|&i| value(i)))),
            ],
        )
        .unwrap()
    }

    // Breaks if a query filtering on primary-key values scans the table
    // instead of looking the keys up, if the lookup's rows differ from the
    // scan's, or if another filter is taken for a lookup.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_filter_is_a_lookup_and_other_filters_scan() {
        let dir = tempfile::tempdir().unwrap();
        let host = table(&dir).await;
        let ids: Vec<i64> = (0..20).collect();
        let batch = rows(&host, &ids, |i| format!("v{i}"));
        host.write(&batch, false).await.unwrap();
        let hosts = HashMap::from([("t".to_string(), host.clone())]);
        let run = |sql: &'static str| {
            let hosts = hosts.clone();
            async move {
                let limits = crate::query::QueryLimits::default();
                crate::query::run(&hosts, &limits, sql).await.unwrap().1
            }
        };
        let got = run("SELECT id, v FROM t WHERE id IN (3, 7, 99) ORDER BY id").await;
        assert_eq!(pairs(&got), [(3, "v3".into()), (7, "v7".into())]);
        assert_eq!(host.read_counts(), (0, 1), "a lookup, no scan");
        let got = run("SELECT id, v FROM t WHERE 4 = id").await;
        assert_eq!(pairs(&got), [(4, "v4".into())]);
        assert_eq!(host.read_counts(), (0, 2));
        let got = run("SELECT id, v FROM t WHERE v = 'v5'").await;
        assert_eq!(pairs(&got), [(5, "v5".into())]);
        assert_eq!(host.read_counts(), (1, 2), "not a key filter: a scan");
        let got = run("SELECT id, v FROM t WHERE id > 17 ORDER BY id").await;
        assert_eq!(pairs(&got), [(18, "v18".into()), (19, "v19".into())]);
        assert_eq!(host.read_counts(), (2, 2));
        host.close().await.unwrap();
    }

    // Breaks if every query opens every fresh SSTable again (a backlog of
    // small SSTables then costs each query one manifest read per SSTable),
    // or if SSTables compacted away stay open.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fresh_sstables_are_opened_once_while_the_view_lists_them() {
        let dir = tempfile::tempdir().unwrap();
        let host = table(&dir).await;
        for g in 0..3i64 {
            let ids: Vec<i64> = (g * 10..g * 10 + 20).collect();
            host.write(&rows(&host, &ids, |i| format!("g{g}-{i}")), false)
                .await
                .unwrap();
            host.flush().await.unwrap();
        }
        let hosts = HashMap::from([("t".to_string(), host.clone())]);
        let count = || {
            let hosts = hosts.clone();
            async move {
                let limits = crate::query::QueryLimits::default();
                let got = crate::query::run(&hosts, &limits, "SELECT count(*) AS n FROM t")
                    .await
                    .unwrap()
                    .1;
                got[0].column(0).as_primitive::<Int64Type>().value(0)
            }
        };
        assert_eq!(count().await, 40);
        let (kept, opened) = host.reader().opened_sstables();
        assert!(kept >= 3 && opened == kept as u64, "{kept} {opened}");
        assert_eq!(count().await, 40);
        assert_eq!(
            host.reader().opened_sstables(),
            (kept, opened),
            "the second query opened nothing"
        );
        compact(&host).await;
        assert_eq!(count().await, 40);
        assert_eq!(
            host.reader().opened_sstables().0,
            0,
            "compacted ones dropped"
        );
        host.close().await.unwrap();
    }

    /// The `id -> v` rows a scan of `host` with `filter` returns.
    async fn scanned(host: &TableHost, filter: Expr) -> HashMap<i64, String> {
        let req = crate::reader::scan::ScanRequest {
            out: host.schema(),
            filter: Some(filter),
            limit: None,
            key_budget: crate::reader::scan::key_budget(None),
        };
        let plan = host.scan_plan(&req).await.unwrap();
        let ctx = datafusion::prelude::SessionContext::new();
        let batches = datafusion::physical_plan::collect(plan, ctx.task_ctx())
            .await
            .unwrap();
        let mut out = HashMap::new();
        for b in batches {
            let ids = b.column(0).as_primitive::<Int64Type>();
            let vs = b.column(1).as_string::<i32>();
            for r in 0..b.num_rows() {
                assert!(out.insert(ids.value(r), vs.value(r).to_string()).is_none());
            }
        }
        out
    }

    // Breaks if a filter is not pushed into the levels' scans (rows it
    // rejects come back), if one brings back an older version of a key
    // whose newest version it rejects, or if a filter Lance cannot plan
    // fails the scan instead of being left to the query (it is pushed
    // `Inexact`: the query applies it again).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn filters_run_inside_each_level_or_are_left_to_the_query() {
        use datafusion::prelude::{col, lit};
        let dir = tempfile::tempdir().unwrap();
        let host = table(&dir).await;
        host.write(&rows(&host, &[1, 2, 3], |i| format!("v{i}")), false)
            .await
            .unwrap();
        host.flush().await.unwrap();
        host.write(&rows(&host, &[3, 4], |i| format!("w{i}")), false)
            .await
            .unwrap();
        let one = |k: i64, v: &str| HashMap::from([(k, v.to_string())]);
        assert_eq!(scanned(&host, col("v").eq(lit("w3"))).await, one(3, "w3"));
        assert_eq!(scanned(&host, col("v").eq(lit("v2"))).await, one(2, "v2"));
        // Key 3's newest value is w3: its published v3 must not show.
        assert_eq!(scanned(&host, col("v").eq(lit("v3"))).await, HashMap::new());
        // Lance refuses an `Int64 IN (Utf8)` filter (DataFusion's SQL
        // planner would have coerced it): every row, for the query to filter.
        let all: HashMap<i64, String> = [(1, "v1"), (2, "v2"), (3, "w3"), (4, "w4")]
            .into_iter()
            .map(|(k, v)| (k, v.to_string()))
            .collect();
        let refused = col("id").in_list(vec![lit("x")], false);
        assert_eq!(scanned(&host, refused).await, all);
        host.close().await.unwrap();
    }

    // Breaks if a query planned before a column was added fails when its
    // table is read after the host followed the change (the read comes in
    // the new schema, the plan expects the old one).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_query_planned_before_a_schema_change_reads_in_its_planned_schema() {
        let dir = tempfile::tempdir().unwrap();
        let host = table(&dir).await;
        let ids: Vec<i64> = (0..5).collect();
        let batch = rows(&host, &ids, |i| format!("v{i}"));
        host.write(&batch, false).await.unwrap();
        let planned = HostTable::new(host.clone(), Arc::new(ReadBudget::default()));
        let path = dir.path().join("t");
        let mut ds = lance::Dataset::open(path.to_str().unwrap()).await.unwrap();
        let extra = Arc::new(Schema::new(vec![Field::new("extra", DataType::Utf8, true)]));
        ds.add_columns(
            lance::dataset::NewColumnTransform::AllNulls(extra),
            None,
            None,
        )
        .await
        .unwrap();
        assert!(host.evolve().await.unwrap(), "the host follows the change");
        assert_eq!(host.schema().fields().len(), 3);
        let ctx = datafusion::prelude::SessionContext::new();
        let plan = planned.scan(&ctx.state(), None, &[], None).await.unwrap();
        let got = datafusion::physical_plan::collect(plan, ctx.task_ctx())
            .await
            .unwrap();
        assert_eq!(pairs(&got).len(), 5);
        assert!(got.iter().all(|b| b.num_columns() == 2));
        host.close().await.unwrap();
    }

    // Breaks if filters restricting every column of a composite key
    // (split by DataFusion into one filter per column, or one `OR` of
    // `AND`s) scan the table instead of looking the tuples up, or if
    // filters on part of the key are taken for a lookup.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn filters_naming_every_column_of_a_composite_key_are_a_lookup() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t").to_str().unwrap().to_string();
        let loc = memwal_store::open_store(&path).unwrap();
        let key = |name: &str, t: DataType, at: &str| {
            Field::new(name, t, false).with_metadata(
                [
                    (
                        memwal_memtable::PRIMARY_KEY_KEY.to_string(),
                        "true".to_string(),
                    ),
                    (
                        memwal_memtable::PRIMARY_KEY_POSITION_KEY.to_string(),
                        at.to_string(),
                    ),
                ]
                .into(),
            )
        };
        let schema = Arc::new(Schema::new(vec![
            key("a", DataType::Int64, "1"),
            key("b", DataType::Utf8, "2"),
            Field::new("v", DataType::Utf8, true),
        ]));
        memwal_table::create_table(
            &loc,
            schema.clone(),
            &memwal_table::TableSharding::Unsharded,
        )
        .await
        .unwrap();
        let host = Arc::new(
            TableHost::open("t", loc, memwal::ShardWriterConfig::default())
                .await
                .unwrap(),
        );
        let batch = RecordBatch::try_new(
            host.schema(),
            vec![
                Arc::new(Int64Array::from(vec![1, 1, 2, 2])) as ArrayRef,
                Arc::new(StringArray::from(vec!["x", "y", "x", "y"])),
                Arc::new(StringArray::from(vec!["1x", "1y", "2x", "2y"])),
            ],
        )
        .unwrap();
        host.write(&batch, false).await.unwrap();
        let hosts = HashMap::from([("t".to_string(), host.clone())]);
        let run = |sql: &'static str| {
            let hosts = hosts.clone();
            async move {
                let limits = crate::query::QueryLimits::default();
                let batches = crate::query::run(&hosts, &limits, sql).await.unwrap().1;
                let mut out = Vec::new();
                for b in batches {
                    let v = b.column(0).as_string::<i32>();
                    out.extend((0..b.num_rows()).map(|i| v.value(i).to_string()));
                }
                out.sort();
                out
            }
        };
        assert_eq!(run("SELECT v FROM t WHERE a = 1 AND b = 'y'").await, ["1y"]);
        assert_eq!(host.read_counts(), (0, 1), "a lookup, no scan");
        assert_eq!(
            run("SELECT v FROM t WHERE (a = 1 AND b = 'x') OR (b = 'y' AND a = 2)").await,
            ["1x", "2y"]
        );
        assert_eq!(host.read_counts(), (0, 2));
        assert_eq!(
            run("SELECT v FROM t WHERE a IN (1, 2) AND b = 'x'").await,
            ["1x", "2x"]
        );
        assert_eq!(host.read_counts(), (0, 3));
        assert_eq!(run("SELECT v FROM t WHERE a = 2").await, ["2x", "2y"]);
        assert_eq!(host.read_counts(), (1, 3), "part of the key: a scan");
        // `OR`ed restrictions naming more than MAX_LOOKUP_KEYS tuples in
        // all are not a lookup (each alone is under the cap).
        let list =
            |r: std::ops::Range<usize>| r.map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        let many = format!(
            "SELECT v FROM t WHERE (a IN ({}) AND b = 'x') OR (a IN ({}) AND b = 'y')",
            list(0..3000),
            list(2..3002)
        );
        let limits = crate::query::QueryLimits::default();
        let got = crate::query::run(&hosts, &limits, &many).await.unwrap().1;
        assert_eq!(
            got.iter().map(|b| b.num_rows()).sum::<usize>(),
            3,
            "1x, 2x, 2y"
        );
        assert_eq!(host.read_counts(), (2, 3), "6000 tuples: a scan");
        host.close().await.unwrap();
    }
}
