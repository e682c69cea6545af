//! Searching a served table as of now: nearest neighbours and full-text
//! search over the base table, every shard's published SSTables and the
//! held writers' unflushed rows (docs/design/fresh-reads.md).
//!
//! A column with a maintained index is searched through it, the way
//! pylance searches a MemWAL table: upstream's `LsmScanner` runs its LSM
//! planners over the base index, each SSTable's own index (every SSTable
//! memwal flushes carries the maintained indexes) and the unflushed rows
//! ([`crate::reader::memtables`]: exact vector distances, an in-memory inverted
//! index), and keeps the newest version of each key. The view is the
//! index's: SSTables above its catch-up generation (`index_catchup`), so
//! rows merged into the base but not yet into its index are still found.
//!
//! A vector column without a maintained index is searched exactly: every
//! live row's distance ([`TableHost::read_rows`]). Full-text search needs
//! a maintained inverted index.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Float32Type;
use arrow_array::{Array, ArrayRef, Float32Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::logical_expr::{Expr, ExprSchemable};
use lance::dataset::mem_wal::LsmScanner;
use lance_index::scalar::FullTextSearchQuery;
use memwal_sstable::{DistanceType, IndexKind, IndexSpec};

use crate::{ServerError, TableHost};

/// The column a vector search adds: the distance to the query vector in
/// the index's metric (squared L2 for an exact search), smallest first.
pub const DISTANCE_COLUMN: &str = "_distance";
/// The column a full-text search adds: the BM25 relevance, largest first.
pub const SCORE_COLUMN: &str = "_score";

/// The schema of a search's result: the table's columns, then `extra`.
pub(crate) fn result_schema(table: &SchemaRef, extra: &str) -> SchemaRef {
    let mut fields: Vec<Arc<Field>> = table.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(extra, DataType::Float32, true)));
    Arc::new(Schema::new(fields))
}

impl TableHost {
    /// The `k` live rows matching `filter` (a DataFusion expression over
    /// the table's columns, applied before the search: a prefilter;
    /// `None`: every row) whose `column` is nearest to `vector`, nearest
    /// first, each with its [`DISTANCE_COLUMN`]; every put acknowledged
    /// before the call is searched. Served by the column's maintained
    /// vector index where it has one (approximate, in that index's
    /// metric), else exact (squared L2 over every live row).
    /// [`ServerError::InvalidInput`] names a missing column, a column that
    /// is not a `FixedSizeList<Float32>` of `vector`'s length, `k` 0, or a
    /// filter that does not fit the table.
    pub async fn nearest(
        &self,
        column: &str,
        vector: &[f32],
        k: usize,
        filter: Option<Expr>,
    ) -> Result<RecordBatch, ServerError> {
        self.nearest_within(column, vector, k, filter, None, None)
            .await
    }

    /// [`Self::nearest`] for a query: an exact search charges what it
    /// holds at each step (the `k` rows kept, the batch read, their
    /// concatenation) to `budget` before it takes it, and fails with
    /// [`ServerError::OverBudget`] past it. `budget` is empty again when
    /// the search returns (the caller charges the result it keeps).
    ///
    /// `wanted`: the columns the caller will use (`None`: all). An exact
    /// search then reads only those, the key columns, the non-nullable
    /// columns and `column` (a query selecting `id, _distance` does not
    /// read the table's other columns); the others come back null.
    pub(crate) async fn nearest_within(
        &self,
        column: &str,
        vector: &[f32],
        k: usize,
        filter: Option<Expr>,
        budget: Option<&MemoryReservation>,
        wanted: Option<&[&str]>,
    ) -> Result<RecordBatch, ServerError> {
        let invalid = |reason: String| ServerError::InvalidInput {
            table: self.name().to_string(),
            reason,
        };
        if k == 0 {
            return Err(invalid("a vector search needs k > 0".into()));
        }
        let schema = self.schema();
        let field = schema
            .field_with_name(column)
            .map_err(|_| invalid(format!("the table has no column `{column}`")))?;
        let DataType::FixedSizeList(item, dim) = field.data_type() else {
            return Err(invalid(format!(
                "`{column}` is {}, not a vector column",
                field.data_type()
            )));
        };
        if item.data_type() != &DataType::Float32 || *dim as usize != vector.len() {
            return Err(invalid(format!(
                "`{column}` holds {dim} x {}, the query vector has {} values",
                item.data_type(),
                vector.len()
            )));
        }
        if let Some(f) = &filter {
            let df_schema = datafusion::common::DFSchema::try_from(schema.as_ref().clone())
                .map_err(|e| invalid(e.to_string()))?;
            f.get_type(&df_schema)
                .map_err(|e| invalid(format!("vector search filter: {e}")))?;
        }
        self.count_read("vector");
        let out = result_schema(&schema, DISTANCE_COLUMN);
        let Some(spec) = self.maintained_index(column, "vector").await? else {
            let read: Option<Vec<&str>> = wanted.map(|wanted| {
                let keys = self.key_schema();
                schema
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .filter(|n| {
                        *n == column
                            || wanted.contains(n)
                            || keys.field_with_name(n).is_ok()
                            || schema.field_with_name(n).is_ok_and(|f| !f.is_nullable())
                    })
                    .collect()
            });
            let out = match &read {
                None => out,
                Some(names) => {
                    let at: Vec<usize> = names
                        .iter()
                        .filter_map(|n| schema.index_of(n).ok())
                        .collect();
                    let projected = schema
                        .project(&at)
                        .map_err(|e| self.failed("vector search", e.to_string()))?;
                    result_schema(&Arc::new(projected), DISTANCE_COLUMN)
                }
            };
            let found = self
                .exact_nearest(column, vector, k, filter, read.as_deref(), &out, budget)
                .await;
            if let Some(b) = budget {
                b.free();
            }
            return found;
        };
        let IndexKind::Vector(v) = &spec.kind else {
            return Err(invalid(format!("`{}` is not a vector index", spec.name)));
        };
        let distance: DistanceType = v.distance;
        let mut scanner = self.lsm_scanner(&spec).await?;
        if let Some(f) = filter {
            scanner = scanner.filter_expr(f);
        }
        let scanner = scanner
            .nearest(column, &Float32Array::from(vector.to_vec()), k)
            .map_err(|e| invalid(format!("vector search: {e}")))?
            .distance_metric(distance);
        let found = scanner
            .try_into_batch()
            .await
            .map_err(|e| self.failed("vector search", e.to_string()))?;
        ranked(&found, &out, false).map_err(|e| self.failed("vector search", e))
    }

    /// The live rows whose `column` matches the full-text `query` (the base
    /// index's tokenizer), most relevant first, each with its
    /// [`SCORE_COLUMN`]; at most `limit` when given. Every put acknowledged
    /// before the call is searched. [`ServerError::InvalidInput`] names a
    /// missing column or one without a maintained inverted index.
    pub async fn full_text(
        &self,
        column: &str,
        query: &str,
        limit: Option<usize>,
    ) -> Result<RecordBatch, ServerError> {
        let invalid = |reason: String| ServerError::InvalidInput {
            table: self.name().to_string(),
            reason,
        };
        let schema = self.schema();
        if schema.field_with_name(column).is_err() {
            return Err(invalid(format!("the table has no column `{column}`")));
        }
        if limit == Some(0) {
            return Err(invalid("a full-text search limit must be > 0".into()));
        }
        self.count_read("full_text");
        let Some(spec) = self.maintained_index(column, "inverted").await? else {
            return Err(invalid(format!(
                "`{column}` has no maintained full-text (INVERTED) index; create one on the \
                 base table (pylance: ds.create_scalar_index(\"{column}\", \"INVERTED\")) and \
                 maintain it (maintain_all_indexes, the default, or maintained_indexes)"
            )));
        };
        let mut q = FullTextSearchQuery::new(query.to_string())
            .with_column(column.to_string())
            .map_err(|e| invalid(format!("full-text query: {e}")))?;
        if let Some(limit) = limit {
            q = q.limit(Some(i64::try_from(limit).unwrap_or(i64::MAX)));
        }
        let scanner = self
            .lsm_scanner(&spec)
            .await?
            .full_text_search(q)
            .map_err(|e| invalid(format!("full-text query: {e}")))?;
        let found = scanner
            .try_into_batch()
            .await
            .map_err(|e| self.failed("full-text search", e.to_string()))?;
        let out = result_schema(&schema, SCORE_COLUMN);
        ranked(&found, &out, true).map_err(|e| self.failed("full-text search", e))
    }

    fn count_read(&self, kind: &'static str) {
        metrics::counter!("memwal_server_reads_total", "table" => self.name().to_string(), "kind" => kind)
            .increment(1);
    }

    fn failed(&self, what: &str, e: String) -> ServerError {
        ServerError::Setup {
            table: self.name().to_string(),
            reason: format!("{what}: {e}"),
        }
    }

    /// The `k` live rows matching `filter` nearest to `vector` in
    /// `column` by squared L2, nearest first, in `out`: every live row's
    /// distance, computed as the table streams by, keeping only the `k`
    /// best so far (memory: `k` rows and one batch, charged to `budget`
    /// step by step when given). `read`: the columns scanned (`out`'s,
    /// without the distance; `None`: every column).
    #[allow(clippy::too_many_arguments)]
    async fn exact_nearest(
        &self,
        column: &str,
        vector: &[f32],
        k: usize,
        filter: Option<Expr>,
        read: Option<&[&str]>,
        out: &SchemaRef,
        budget: Option<&MemoryReservation>,
    ) -> Result<RecordBatch, ServerError> {
        let mut rows = self.scan_stream(filter, read, None).await?;
        let mut best = RecordBatch::new_empty(out.clone());
        while let Some(batch) = futures::StreamExt::next(&mut rows).await {
            let batch = batch.map_err(|e| self.query_failed(e))?;
            if let Some(b) = budget {
                // The kept rows, the batch and its scored copy, and their
                // concatenation: what this step holds at once.
                let step = best.get_array_memory_size() + batch.get_array_memory_size();
                b.try_resize(step.saturating_mul(3))
                    .map_err(|source| ServerError::OverBudget {
                        table: self.name().to_string(),
                        what: "an exact vector search",
                        source,
                    })?;
            }
            let more = scored(&batch, column, vector, out)
                .and_then(|more| {
                    arrow_select::concat::concat_batches(out, [&best, &more])
                        .map_err(|e| e.to_string())
                })
                .and_then(|all| nearest_k(&all, k))
                .map_err(|e| self.failed("vector search", e))?;
            best = more;
        }
        Ok(best)
    }

    /// The maintained index of kind `label` (`vector`, `inverted`) on
    /// `column`, as the base table now lists it.
    async fn maintained_index(
        &self,
        column: &str,
        label: &str,
    ) -> Result<Option<IndexSpec>, ServerError> {
        let lance = memwal_sstable::LanceStore::new(self.loc().store.clone());
        let base = memwal_table::BaseTable::load(&lance, &self.loc().root)
            .await
            .map_err(|e| self.failed("reading the base table's indexes", e.to_string()))?;
        let maintained = base
            .maintained_indexes()
            .map_err(|e| self.failed("resolving the maintained indexes", e.to_string()))?;
        Ok(maintained
            .specs
            .into_iter()
            .find(|s| s.column == column && s.kind.label() == label))
    }

    /// Upstream's scanner over the read view of index `spec` (SSTables
    /// above its catch-up) and the held writers' unflushed rows.
    async fn lsm_scanner(&self, spec: &IndexSpec) -> Result<LsmScanner, ServerError> {
        let keys: Vec<String> = self
            .key_schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        let (snapshots, view) = self.snapshot_and_view(Some(&spec.name)).await?;
        let full_text: Vec<&IndexSpec> = match spec.kind {
            IndexKind::Inverted(_) => vec![spec],
            _ => Vec::new(),
        };
        let mut scanner = LsmScanner::new(view.base.clone(), view.snapshots(), keys.clone());
        let account = self.reader().account.pool();
        for s in snapshots.values() {
            let memtables = self
                .reader()
                .memtables
                .of(s, &keys, &full_text, account.as_ref())
                .map_err(|e| self.unbuilt(e))?;
            if let Some(m) = memtables {
                scanner = scanner.with_in_memory_memtables(s.shard.uuid(), m);
            }
        }
        Ok(scanner)
    }
}

/// `found` in `out`'s columns (matched by name; absent ones null), ordered
/// by its last column: descending when `descending`, else ascending.
fn ranked(found: &RecordBatch, out: &SchemaRef, descending: bool) -> Result<RecordBatch, String> {
    let columns = out
        .fields()
        .iter()
        .map(|f| match found.column_by_name(f.name()) {
            Some(c) if c.data_type() == f.data_type() => Ok(c.clone()),
            Some(c) => {
                datafusion::arrow::compute::cast(c, f.data_type()).map_err(|e| e.to_string())
            }
            None => Ok(arrow_array::new_null_array(f.data_type(), found.num_rows())),
        })
        .collect::<Result<Vec<ArrayRef>, String>>()?;
    let batch = RecordBatch::try_new(out.clone(), columns).map_err(|e| e.to_string())?;
    let Some(rank) = batch.columns().last() else {
        return Ok(batch);
    };
    let order = datafusion::arrow::compute::sort_to_indices(
        rank,
        Some(datafusion::arrow::compute::SortOptions {
            descending,
            nulls_first: false,
        }),
        None,
    )
    .map_err(|e| e.to_string())?;
    arrow_select::take::take_record_batch(&batch, &order).map_err(|e| e.to_string())
}

/// The rows of `rows` (in `out`: their columns plus the distance) whose
/// `column` is not null, each with its squared L2 distance to `query`.
fn scored(
    rows: &RecordBatch,
    column: &str,
    query: &[f32],
    out: &SchemaRef,
) -> Result<RecordBatch, String> {
    let values = rows
        .column_by_name(column)
        .ok_or_else(|| format!("the table has no column `{column}`"))?;
    let list = values
        .as_fixed_size_list_opt()
        .ok_or_else(|| format!("`{column}` is not a vector column"))?;
    let flat = list
        .values()
        .as_primitive_opt::<Float32Type>()
        .ok_or_else(|| format!("`{column}` does not hold float32 values"))?;
    let dim = query.len();
    let distances: Float32Array = (0..list.len())
        .map(|r| {
            list.is_valid(r).then(|| {
                let at = list.value_offset(r) as usize;
                let row = &flat.values()[at..at + dim];
                row.iter().zip(query).map(|(a, b)| (a - b) * (a - b)).sum()
            })
        })
        .collect();
    let mut columns = rows.columns().to_vec();
    columns.push(Arc::new(distances.clone()));
    let all = RecordBatch::try_new(out.clone(), columns).map_err(|e| e.to_string())?;
    let has_vector = arrow_array::BooleanArray::from_iter(
        (0..distances.len()).map(|r| Some(distances.is_valid(r))),
    );
    arrow_select::filter::filter_record_batch(&all, &has_vector).map_err(|e| e.to_string())
}

/// The `k` rows of `rows` (in `out`, distance last) nearest first.
fn nearest_k(rows: &RecordBatch, k: usize) -> Result<RecordBatch, String> {
    let Some(distance) = rows.columns().last() else {
        return Ok(rows.clone());
    };
    let order = datafusion::arrow::compute::sort_to_indices(
        distance,
        Some(datafusion::arrow::compute::SortOptions {
            descending: false,
            nulls_first: false,
        }),
        Some(k),
    )
    .map_err(|e| e.to_string())?;
    arrow_select::take::take_record_batch(rows, &order).map_err(|e| e.to_string())
}
