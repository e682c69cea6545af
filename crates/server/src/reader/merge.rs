//! A keyed table's levels merged for a scan by a hash anti-join: the base
//! is read once, as a stream, and its rows whose key a fresh level holds
//! are dropped by probing a hash set of the fresh levels' keys.
//!
//! The fresh levels (each shard's published SSTables above the base, the
//! held writers' unflushed rows, other writers' WAL tails) are small next
//! to the base: they are what the compactor has not merged yet. Their
//! live rows, newest per key, come from upstream's LSM planner over them
//! alone (`LsmScanner::without_base_table`). Every key they hold, live or
//! deleted, supersedes the base's row of that key, so the base's arm is
//! the base without those keys ([`Unsuperseded`]: a set of the fresh
//! keys in Arrow's row format, charged to the query's memory pool, probed
//! batch by batch; a batch none of whose keys is in it passes as it is,
//! with no copy). Upstream's planner, used for the whole table, probes
//! the fresh levels' key indexes row by row of the base instead (a
//! `ScalarValue` and an index search per base row): a `count(*)` of 5 M
//! base rows took 1.2-2.6 s that way, 0.05 s this way. DataFusion's
//! `HashJoinExec` (`RIGHT ANTI`) would drop the same rows, but it takes
//! every surviving row into a new batch: 5 GB copied for a full scan.
//!
//! Chosen only when the fresh keys' estimated set fits
//! [`ScanRequest::key_budget`]; otherwise the scan keeps upstream's
//! planner, whose memory does not grow with the fresh levels. Both give
//! the same rows (`a_hash_merged_scan_answers_as_upstreams_merge`).

use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, RecordBatch};
use arrow_row::{RowConverter, SortField};
use arrow_schema::{Schema, SchemaRef};
use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};

use crate::reader::scan::{Conformed, ScanRequest};
use crate::reader::snapshot::Snapshots;
use crate::{ServerError, TableHost};

/// Bytes a fresh key takes in [`Unsuperseded`]'s set beyond its encoded
/// width: the box's pointer and length, the set's control byte and spare
/// capacity, the allocation's rounding.
const PER_KEY_OVERHEAD: usize = 48;

/// Width assumed for a key column without a fixed width (text, binary).
const VARIABLE_KEY_WIDTH: usize = 32;

/// The fresh levels of a read: the SSTables above the base, opened, and
/// how many rows they (deleted ones included) and the snapshots hold.
struct Fresh {
    sstables: Vec<Arc<lance::Dataset>>,
    rows: usize,
}

impl TableHost {
    /// The plan of a keyed table's live rows in `req.out` as a hash
    /// anti-join of the base against the fresh levels' keys (module
    /// docs), or `None` when the fresh keys would take more than
    /// `req.key_budget` (the caller merges with upstream's planner).
    pub(super) async fn levels_joined(
        &self,
        req: &ScanRequest,
        keys: &[String],
        snapshots: &Snapshots,
        view: &memwal_table::TableView,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>, ServerError> {
        let fresh = self.fresh_levels(snapshots, view).await?;
        let key_schema = self.key_schema();
        let per_key: usize = key_schema
            .fields()
            .iter()
            .map(|f| {
                f.data_type()
                    .primitive_width()
                    .unwrap_or(VARIABLE_KEY_WIDTH)
            })
            .sum::<usize>()
            + PER_KEY_OVERHEAD;
        let over = fresh.rows.saturating_mul(per_key) > req.key_budget;
        metrics::counter!("memwal_server_scan_merges_total", "table" => self.name().to_string(),
            "merge" => if over { "upstream" } else { "hash" })
        .increment(1);
        if over {
            tracing::debug!(table = %self.name(), fresh_rows = fresh.rows,
                budget = req.key_budget, "fresh keys over their budget: upstream's merge");
            return Ok(None);
        }
        if fresh.rows == 0 {
            // Nothing supersedes a base row.
            return Ok(Some(self.level_scan(&view.base, req, req.limit).await?));
        }
        let fresh_keys = self.fresh_keys(&key_schema, snapshots, &fresh).await?;
        // The base in the asked-for columns and the keys it is joined by.
        let mut with_keys: Vec<_> = req.out.fields().iter().cloned().collect();
        for k in key_schema.fields() {
            if req.out.column_with_name(k.name()).is_none() {
                with_keys.push(k.clone());
            }
        }
        let with_keys = Arc::new(Schema::new(with_keys));
        let base_req = ScanRequest {
            out: with_keys.clone(),
            filter: req.filter.clone(),
            limit: None,
            key_budget: req.key_budget,
        };
        let base = self.level_scan(&view.base, &base_req, None).await?;
        let failed = |e: String| ServerError::Setup {
            table: self.name().to_string(),
            reason: format!("planning the merge: {e}"),
        };
        let at = keys
            .iter()
            .map(|k| with_keys.index_of(k))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| failed(e.to_string()))?;
        let base_arm: Arc<dyn ExecutionPlan> = Arc::new(Conformed::new(
            Arc::new(Unsuperseded::new(fresh_keys, base, at)),
            req.out.clone(),
        ));
        let fresh_arm = self
            .planned_merge(req, keys, snapshots, view, false)
            .await?;
        let union =
            UnionExec::try_new(vec![fresh_arm, base_arm]).map_err(|e| failed(e.to_string()))?;
        // A leaf to the query's optimizer, as every scan is (`Conformed`).
        Ok(Some(Arc::new(Conformed::new(union, req.out.clone()))))
    }

    /// The SSTables of `view` above its base, opened (in parallel, with the
    /// base's session: its caches serve every read), and the rows they and
    /// `snapshots` hold.
    async fn fresh_levels(
        &self,
        snapshots: &Snapshots,
        view: &memwal_table::TableView,
    ) -> Result<Fresh, ServerError> {
        let opened: Vec<(Arc<lance::Dataset>, usize)> = self
            .reader()
            .opened
            .open_view(self.loc(), view)
            .await
            .map_err(|e| self.read_failed("opening an SSTable", e))?
            .into_iter()
            .map(|ds| {
                // Deleted rows included: an upper bound, with no read.
                let rows = ds
                    .fragments()
                    .iter()
                    .map(|f| f.physical_rows.unwrap_or(0))
                    .sum::<usize>();
                (ds, rows)
            })
            .collect();
        let mut rows: usize = snapshots
            .values()
            .flat_map(|s| s.batches.iter())
            .map(RecordBatch::num_rows)
            .sum();
        let mut sstables = Vec::with_capacity(opened.len());
        for (ds, n) in opened {
            rows += n;
            sstables.push(ds);
        }
        Ok(Fresh { sstables, rows })
    }

    /// One partition of every key the fresh levels hold, deleted ones
    /// included, in `key_schema`: the SSTables' key columns as Lance
    /// scans them, the snapshots' batches' key columns as they are.
    async fn fresh_keys(
        &self,
        key_schema: &SchemaRef,
        snapshots: &Snapshots,
        fresh: &Fresh,
    ) -> Result<Arc<dyn ExecutionPlan>, ServerError> {
        let setup = |e: String| ServerError::Setup {
            table: self.name().to_string(),
            reason: format!("reading the fresh levels' keys: {e}"),
        };
        let names: Vec<String> = key_schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        let mut arms: Vec<Arc<dyn ExecutionPlan>> = Vec::new();
        for ds in &fresh.sstables {
            let mut scanner = ds.scan();
            scanner
                .project(&names)
                .map_err(|e| self.read_failed("planning a level's keys", e))?;
            let plan = scanner
                .create_plan()
                .await
                .map_err(|e| self.read_failed("planning a level's keys", e))?;
            arms.push(Arc::new(Conformed::new(plan, key_schema.clone())));
        }
        let mut unflushed = Vec::new();
        for b in snapshots.values().flat_map(|s| s.batches.iter()) {
            if b.num_rows() == 0 {
                continue;
            }
            let columns = names
                .iter()
                .map(|n| {
                    b.column_by_name(n)
                        .cloned()
                        .ok_or_else(|| setup(format!("an unflushed batch lacks the key {n}")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            unflushed.push(
                RecordBatch::try_new(key_schema.clone(), columns)
                    .map_err(|e| setup(e.to_string()))?,
            );
        }
        if !unflushed.is_empty() {
            arms.push(
                datafusion::datasource::memory::MemorySourceConfig::try_new_exec(
                    &[unflushed],
                    key_schema.clone(),
                    None,
                )
                .map_err(|e| setup(e.to_string()))?,
            );
        }
        let all: Arc<dyn ExecutionPlan> = match arms.len() {
            1 => arms.remove(0),
            _ => UnionExec::try_new(arms).map_err(|e| setup(e.to_string()))?,
        };
        Ok(
            match all.properties().output_partitioning().partition_count() {
                1 => all,
                _ => Arc::new(CoalescePartitionsExec::new(all)),
            },
        )
    }
}

/// `input`'s rows whose key (its columns `at`) is not one of the rows of
/// `keys` (one partition, the key columns in the same order and types):
/// the base's rows no fresh level supersedes. The set of `keys` is read
/// once, when the first partition is first polled, and charged to the
/// query's memory pool (`RESOURCE_EXHAUSTED` past it) while the plan
/// lives. A batch none of whose keys is in the set is passed on as it is.
#[derive(Debug)]
struct Unsuperseded {
    keys: Arc<dyn ExecutionPlan>,
    input: Arc<dyn ExecutionPlan>,
    at: Vec<usize>,
    set: Arc<tokio::sync::OnceCell<Arc<KeySet>>>,
    properties: Arc<PlanProperties>,
}

/// Keys in Arrow's row format, and what they are charged.
#[derive(Debug)]
struct KeySet {
    converter: RowConverter,
    rows: hashbrown::HashSet<Box<[u8]>>,
    _charged: MemoryReservation,
}

impl Unsuperseded {
    fn new(keys: Arc<dyn ExecutionPlan>, input: Arc<dyn ExecutionPlan>, at: Vec<usize>) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(input.schema()),
            input.properties().output_partitioning().clone(),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self {
            keys,
            input,
            at,
            set: Arc::new(tokio::sync::OnceCell::new()),
            properties,
        }
    }
}

impl KeySet {
    /// Every row of `keys`' one partition, charged to `context`'s pool.
    async fn read(keys: Arc<dyn ExecutionPlan>, context: Arc<TaskContext>) -> DfResult<Self> {
        let types = keys
            .schema()
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        let converter = RowConverter::new(types)?;
        let charged = MemoryConsumer::new("memwal fresh keys").register(context.memory_pool());
        let mut rows = hashbrown::HashSet::new();
        let mut batches = keys.execute(0, context)?;
        while let Some(batch) = batches.next().await {
            let encoded = converter.convert_columns(batch?.columns())?;
            for row in encoded.iter() {
                if !rows.contains(row.as_ref()) {
                    charged.try_grow(row.as_ref().len() + PER_KEY_OVERHEAD)?;
                    rows.insert(Box::from(row.as_ref()));
                }
            }
        }
        Ok(Self {
            converter,
            rows,
            _charged: charged,
        })
    }

    /// `batch` without the rows whose columns `at` are a key of the set.
    fn drop_from(&self, batch: RecordBatch, at: &[usize]) -> DfResult<RecordBatch> {
        let columns: Vec<ArrayRef> = at.iter().map(|&i| batch.column(i).clone()).collect();
        let encoded = self.converter.convert_columns(&columns)?;
        let keep: BooleanArray = encoded
            .iter()
            .map(|row| Some(!self.rows.contains(row.as_ref())))
            .collect();
        match keep.true_count() == batch.num_rows() {
            true => compacted(batch),
            false => Ok(arrow_select::filter::filter_record_batch(&batch, &keep)?),
        }
    }
}

/// `batch`, copied into buffers of its own size when the buffers it
/// points into hold more than twice its rows' data. Lance's decoded
/// batches can be slices of larger decoded pages (a 16,384-row batch of
/// 1 KB text held 69 MB): passed on as they are, each batch a slow client
/// has not taken yet pins its pages (a full scan's daemon peaked at
/// 1.33 GB so, 0.95-0.99 GB with such batches copied: benches/RESULTS.md).
fn compacted(batch: RecordBatch) -> DfResult<RecordBatch> {
    let data = batch
        .columns()
        .iter()
        .map(|c| c.to_data().get_slice_memory_size())
        .sum::<Result<usize, _>>()?;
    if batch.get_array_memory_size() <= data.saturating_mul(2) {
        return Ok(batch);
    }
    let all = arrow_array::UInt32Array::from_iter_values(0..batch.num_rows() as u32);
    Ok(arrow_select::take::take_record_batch(&batch, &all)?)
}

impl DisplayAs for Unsuperseded {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "MemwalUnsuperseded: key columns {:?}", self.at)
    }
}

impl ExecutionPlan for Unsuperseded {
    fn name(&self) -> &str {
        "MemwalUnsuperseded"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.keys, &self.input]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        match <[_; 2]>::try_from(children) {
            Ok([keys, input]) => Ok(Arc::new(Self::new(keys, input, self.at.clone()))),
            Err(c) => Err(DataFusionError::Internal(format!(
                "MemwalUnsuperseded takes 2 inputs, given {}",
                c.len()
            ))),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context.clone())?;
        let (keys, set, at) = (self.keys.clone(), self.set.clone(), self.at.clone());
        let rows = futures::stream::once(async move {
            let set = set
                .get_or_try_init(|| async { KeySet::read(keys, context).await.map(Arc::new) })
                .await?
                .clone();
            Ok::<_, DataFusionError>(input.map(move |b| b.and_then(|b| set.drop_from(b, &at))))
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.input.schema(),
            rows,
        )))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::Array;
    use datafusion::logical_expr::Expr;
    use datafusion::prelude::{col, lit};

    use super::*;
    use crate::provider::tests::{rows, table};

    /// The names of `plan`'s nodes, those inside the leaves the query
    /// sees (`Conformed`) included.
    fn nodes(plan: &Arc<dyn ExecutionPlan>) -> Vec<String> {
        match plan.downcast_ref::<Conformed>() {
            Some(c) => nodes(c.inner()),
            None => std::iter::once(plan.name().to_string())
                .chain(plan.children().into_iter().flat_map(nodes))
                .collect(),
        }
    }

    /// What a scan of `host` for `req` returns: the plan's text and its
    /// rows as `id -> v` (of the columns it has; a key repeated fails).
    async fn scan(host: &TableHost, req: &ScanRequest) -> (String, usize, BTreeMap<i64, String>) {
        let plan = host.scan_plan(req).await.unwrap();
        let text = nodes(&plan).join(" ");
        let ctx = datafusion::prelude::SessionContext::new();
        let batches = datafusion::physical_plan::collect(plan, ctx.task_ctx())
            .await
            .unwrap();
        let mut n = 0;
        let mut out = BTreeMap::new();
        for b in &batches {
            n += b.num_rows();
            let (Some(ids), Some(vs)) = (b.column_by_name("id"), b.column_by_name("v")) else {
                continue;
            };
            let (ids, vs) = (ids.as_primitive::<Int64Type>(), vs.as_string::<i32>());
            for r in 0..b.num_rows() {
                let v = vs.is_valid(r).then(|| vs.value(r).to_string());
                let old = out.insert(ids.value(r), v.unwrap_or_default());
                assert!(old.is_none(), "key {} twice", ids.value(r));
            }
        }
        (text, n, out)
    }

    // Breaks if the set of fresh keys is not charged to the query's
    // memory pool (a pool too small for it must refuse the scan), or if
    // it keeps the charge past the plan, or drops base rows it should not.
    #[tokio::test]
    async fn the_fresh_keys_are_charged_to_the_querys_pool() {
        use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryPool};
        let schema = Arc::new(Schema::new(vec![arrow_schema::Field::new(
            "id",
            arrow_schema::DataType::Int64,
            false,
        )]));
        let ids = |r: std::ops::Range<i64>| {
            RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(arrow_array::Int64Array::from_iter_values(r)) as ArrayRef],
            )
            .unwrap()
        };
        let source = |b: RecordBatch| {
            datafusion::datasource::memory::MemorySourceConfig::try_new_exec(
                &[vec![b]],
                schema.clone(),
                None,
            )
            .unwrap() as Arc<dyn ExecutionPlan>
        };
        let run = |pool: Arc<dyn MemoryPool>| {
            let plan = Arc::new(Unsuperseded::new(
                source(ids(0..1_000)),
                source(ids(990..1_010)),
                vec![0],
            ));
            let context = Arc::new(
                TaskContext::default().with_runtime(Arc::new(
                    datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
                        .with_memory_pool(pool)
                        .build()
                        .unwrap(),
                )),
            );
            datafusion::physical_plan::collect(plan, context)
        };
        let small: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(10_000));
        let refused = run(small.clone()).await.unwrap_err();
        assert!(
            matches!(refused.find_root(), DataFusionError::ResourcesExhausted(_)),
            "{refused}"
        );
        assert_eq!(small.reserved(), 0, "a refused read keeps nothing");
        let big: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 20));
        let kept = run(big.clone()).await.unwrap();
        let kept: Vec<i64> = kept
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        assert_eq!(kept, (1_000..1_010).collect::<Vec<_>>());
        assert_eq!(big.reserved(), 0, "released with the plan");
    }

    // Breaks if the hash-joined merge keeps a base row whose key a fresh
    // level overwrote or deleted (in an SSTable or unflushed), drops one
    // no fresh level holds, returns a fresh row twice or an old version of
    // it, applies a filter or projection other than upstream's merge does,
    // or is not the plan chosen while the fresh keys fit their budget
    // (and upstream's when they do not).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hash_merged_scan_answers_as_upstreams_merge() {
        let dir = tempfile::tempdir().unwrap();
        let host = table(&dir).await;
        let base: Vec<i64> = (0..2_000).collect();
        host.write(&rows(&host, &base, |i| format!("base {i}")), false)
            .await
            .unwrap();
        host.flush().await.unwrap();
        crate::provider::tests::compact(&host).await;
        let deletes = |ids: Vec<i64>| {
            RecordBatch::try_new(
                host.key_schema(),
                vec![Arc::new(arrow_array::Int64Array::from(ids)) as _],
            )
            .unwrap()
        };
        // An SSTable: overwrites, deletes, new keys; then unflushed rows
        // overwriting some of both levels, deleting others, adding keys.
        let sst: Vec<i64> = (0..300).map(|i| i * 5).chain(2_000..2_100).collect();
        host.write(&rows(&host, &sst, |i| format!("sst {i}")), false)
            .await
            .unwrap();
        host.write(&deletes((1..100).map(|i| i * 7).collect()), true)
            .await
            .unwrap();
        host.flush().await.unwrap();
        let fresh: Vec<i64> = (0..200).map(|i| i * 3).chain(2_050..2_200).collect();
        host.write(&rows(&host, &fresh, |i| format!("mem {i}")), false)
            .await
            .unwrap();
        host.write(&deletes(vec![5, 10, 11, 2_001, 2_150]), true)
            .await
            .unwrap();
        // The expected rows, level by level.
        let mut want: BTreeMap<i64, String> =
            base.iter().map(|&i| (i, format!("base {i}"))).collect();
        want.extend(sst.iter().map(|&i| (i, format!("sst {i}"))));
        (1..100).for_each(|i| drop(want.remove(&(i * 7))));
        want.extend(fresh.iter().map(|&i| (i, format!("mem {i}"))));
        [5, 10, 11, 2_001, 2_150]
            .iter()
            .for_each(|i| drop(want.remove(i)));

        let schema = host.schema();
        let only_v = Arc::new(schema.project(&[1]).unwrap());
        let none = Arc::new(schema.project(&[]).unwrap());
        let like: Expr = col("v").like(lit("sst%"));
        let cases: Vec<(&str, SchemaRef, Option<Expr>, Option<usize>)> = vec![
            ("every column", schema.clone(), None, None),
            ("v alone", only_v, None, None),
            ("no column (a count)", none, None, None),
            ("a filter", schema.clone(), Some(like.clone()), None),
            ("a limit", schema.clone(), None, Some(10)),
        ];
        for (case, out, filter, limit) in cases {
            let req = |key_budget| ScanRequest {
                out: out.clone(),
                filter: filter.clone(),
                limit,
                key_budget,
            };
            let (joined_plan, joined_n, joined) = scan(&host, &req(usize::MAX)).await;
            let (upstream_plan, upstream_n, upstream) = scan(&host, &req(0)).await;
            assert!(
                joined_plan.contains("MemwalUnsuperseded"),
                "{case}: {joined_plan}"
            );
            assert!(
                !upstream_plan.contains("MemwalUnsuperseded")
                    && upstream_plan.contains("PkBlockFilterExec"),
                "{case}: {upstream_plan}"
            );
            match (filter.is_some(), limit) {
                (false, None) => {
                    assert_eq!(joined_n, want.len(), "{case}");
                    assert_eq!(upstream_n, want.len(), "{case}");
                    if out.column_with_name("id").is_some() {
                        assert_eq!(joined, want, "{case}");
                        assert_eq!(upstream, want, "{case}");
                    }
                }
                (true, _) => {
                    // Pushed inexact: each keeps at least what matches,
                    // and only newest versions.
                    let matching: BTreeMap<_, _> = want
                        .iter()
                        .filter(|(_, v)| v.starts_with("sst"))
                        .map(|(k, v)| (*k, v.clone()))
                        .collect();
                    for got in [&joined, &upstream] {
                        assert!(
                            matching.iter().all(|(k, v)| got.get(k) == Some(v)),
                            "{case}"
                        );
                        assert!(got.iter().all(|(k, v)| want.get(k) == Some(v)), "{case}");
                    }
                }
                (false, Some(n)) => {
                    assert_eq!((joined_n, upstream_n), (n, n), "{case}");
                    for got in [&joined, &upstream] {
                        assert!(got.iter().all(|(k, v)| want.get(k) == Some(v)), "{case}");
                    }
                }
            }
        }
        host.close().await.unwrap();
    }
}
