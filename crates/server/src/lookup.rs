//! Primary-key lookups: the rows of given keys as of now, without reading
//! the whole table. Unflushed rows come from the writers' snapshots (only
//! the requested keys kept); published rows from upstream's
//! `LsmPointLookupPlanner` over the base table and the published SSTables
//! (newest generation first, each SSTable's primary-key index and bloom
//! filter instead of a scan). The snapshot rules are those of
//! [`TableHost::read_rows`] (docs/design/fresh-reads.md).

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch};
use arrow_schema::DataType;
use datafusion::scalar::ScalarValue;
use lance::dataset::mem_wal::scanner::{LsmDataSourceCollector, LsmPointLookupPlanner};

use crate::{ServerError, TableHost};

impl TableHost {
    /// The live rows whose (one-column) primary key is in `keys`, as of
    /// now: every put acknowledged before the call, the newest value per
    /// key, deleted keys absent, missing keys absent. Keys of another type
    /// than the key column are cast to it; a null key matches nothing.
    /// Refused ([`ServerError::InvalidInput`]) for a table without a
    /// one-column primary key.
    pub async fn lookup_rows(&self, keys: &[ScalarValue]) -> Result<RecordBatch, ServerError> {
        let invalid = |reason: String| ServerError::InvalidInput {
            table: self.name().to_string(),
            reason,
        };
        let key_schema = self.key_schema();
        let [key_field] = key_schema.fields().as_ref() else {
            return Err(invalid(format!(
                "a key lookup needs a one-column primary key; the table's is ({})",
                key_schema
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        let keys = cast_keys(keys, key_field.data_type())
            .map_err(|e| invalid(format!("lookup keys for `{}`: {e}", key_field.name())))?;
        self.lookups
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        metrics::counter!("memwal_server_reads_total", "table" => self.name().to_string(), "kind" => "lookup")
            .increment(1);
        let schema = self.schema();
        if keys.is_empty() {
            // Only null keys: nothing to read.
            return Ok(RecordBatch::new_empty(schema));
        }
        let (snapshots, view) = self.snapshot_and_view(None).await?;
        let failed = |what: &str, e: String| ServerError::Setup {
            table: self.name().to_string(),
            reason: format!("{what}: {e}"),
        };
        let base_schema = Arc::new(arrow_schema::Schema::from(view.base.schema()));
        // SSTables open through the base table's session and store (our
        // store behind a private scheme), as `LsmScanner` does by default.
        let mut planner = LsmPointLookupPlanner::new(
            LsmDataSourceCollector::new(view.base.clone(), view.snapshots()),
            vec![key_field.name().clone()],
            base_schema,
        )
        .map_err(|e| failed("planning the lookup", e.to_string()))?
        .with_session(view.base.session());
        if let Some(params) = view.base.store_params() {
            planner = planner.with_store_params(params.clone());
        }
        let published = planner
            .lookup_many(&keys, None)
            .await
            .map_err(|e| failed("looking up published rows", e.to_string()))?;
        let wanted = ScalarValue::iter_to_array(keys.iter().cloned())
            .map_err(|e| failed("lookup keys", e.to_string()))?;
        let mut unflushed = Vec::new();
        for s in snapshots.into_values() {
            for b in s.batches {
                if let Some(kept) = rows_with_keys(&b, key_field.name(), &wanted)
                    .map_err(|e| failed("filtering unflushed rows", e))?
                {
                    unflushed.push(kept);
                }
            }
        }
        crate::read::merge(&schema, &[key_field.name().clone()], &published, &unflushed)
            .map_err(|e| failed("merging the levels", e))
    }
}

/// `keys` cast to the key column's type, nulls left out.
fn cast_keys(keys: &[ScalarValue], to: &DataType) -> Result<Vec<ScalarValue>, String> {
    keys.iter()
        .filter(|k| !k.is_null())
        .map(|k| k.cast_to(to).map_err(|e| format!("{k}: {e}")))
        .collect()
}

/// The rows of `batch` whose `key` column is one of `wanted`; `None` when
/// there are none.
fn rows_with_keys(
    batch: &RecordBatch,
    key: &str,
    wanted: &ArrayRef,
) -> Result<Option<RecordBatch>, String> {
    let Some(column) = batch.column_by_name(key) else {
        return Err(format!("an unflushed batch lacks the key column `{key}`"));
    };
    let mut keep = BooleanArray::from(vec![false; batch.num_rows()]);
    for i in 0..wanted.len() {
        let one = arrow_array::Scalar::new(wanted.slice(i, 1));
        let hit = datafusion::arrow::compute::kernels::cmp::eq(column, &one)
            .map_err(|e| e.to_string())?;
        keep = datafusion::arrow::compute::kernels::boolean::or(&keep, &hit)
            .map_err(|e| e.to_string())?;
    }
    if keep.true_count() == 0 {
        return Ok(None);
    }
    arrow_select::filter::filter_record_batch(batch, &keep)
        .map(Some)
        .map_err(|e| e.to_string())
}
