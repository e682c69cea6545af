//! `_pk_index/`: lance's on-disk BTree over the primary key, mapping every
//! physical row's key to its row address (fragment 0, so the row offset).
//!
//! Built with lance-index's own BTree trainer from `(value, _rowaddr)` rows
//! sorted by (key, row), which yields exactly what upstream writes and
//! reads: `page_data.lance` (`values` sorted, `ids`) and `page_lookup.lance`
//! (`min`, `max`, `null_count`, `page_idx`; one row per page of 8192). The
//! indexed value is the key column itself for a single-column key and the
//! order-preserving tuple encoding (`Binary`) for a composite key.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, BinaryArray, RecordBatch, UInt32Array, UInt64Array};
use arrow_schema::{DataType, Field, Schema};
use datafusion::common::ScalarValue;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use lance_core::cache::LanceCache;
use lance_index::metrics::NoOpMetricsCollector;
use lance_index::registry::IndexPluginRegistry;
use lance_index::scalar::btree::{train_btree_index, BTREE_INDEX_VERSION};
use lance_index::scalar::lance_format::LanceIndexStore;
use lance_index::scalar::registry::VALUE_COLUMN_NAME;
use lance_index::scalar::{IndexStore, SargableQuery, ScalarIndex, SearchResult};
use memwal_memtable::{FlushKeys, KeyValue};
use object_store::path::Path;

use crate::error::{Result, SsTableError};
use crate::lance_store::LanceStore;

/// Directory of the primary-key index inside an SSTable directory.
pub const PK_INDEX_DIR: &str = "_pk_index";
/// Rows per BTree page, as upstream builds it.
pub const PK_INDEX_PAGE_ROWS: u64 = 8192;

/// The sorted `(value, _rowaddr)` batch the BTree is trained from.
pub(crate) fn training_batch(
    path: &str,
    batches: &[RecordBatch],
    key_indices: &[usize],
    keys: &FlushKeys,
) -> Result<RecordBatch> {
    let rows = &keys.rows_by_key;
    let values: ArrayRef = if let [column] = key_indices {
        let parts: Vec<&dyn Array> = batches.iter().map(|b| b.column(*column).as_ref()).collect();
        let all = arrow_select::concat::concat(&parts).map_err(SsTableError::arrow(path))?;
        let order = UInt32Array::from(rows.clone());
        arrow_select::take::take(all.as_ref(), &order, None).map_err(SsTableError::arrow(path))?
    } else {
        Arc::new(BinaryArray::from_iter_values(
            rows.iter().map(|&r| keys.encoded.value(r as usize)),
        ))
    };
    let ids = UInt64Array::from_iter_values(rows.iter().map(|&r| r as u64));
    let schema = Arc::new(Schema::new(vec![
        Field::new(VALUE_COLUMN_NAME, values.data_type().clone(), true),
        Field::new(lance_core::ROW_ADDR, DataType::UInt64, false),
    ]));
    RecordBatch::try_new(schema, vec![values, Arc::new(ids)]).map_err(SsTableError::arrow(path))
}

/// Writes `_pk_index/` under `dir` from a [`training_batch`].
pub(crate) async fn write_index(
    lance: &LanceStore,
    dir: &Path,
    training: RecordBatch,
) -> Result<()> {
    let index_dir = dir.clone().join(PK_INDEX_DIR);
    let store = LanceIndexStore::new(
        lance.lance_store().clone(),
        index_dir.clone(),
        Arc::new(LanceCache::no_cache()),
    );
    let stream = Box::pin(RecordBatchStreamAdapter::new(
        training.schema(),
        futures::stream::iter(vec![Ok(training)]),
    ));
    train_btree_index(stream, &store, PK_INDEX_PAGE_ROWS, None, None)
        .await
        .map_err(SsTableError::lance(&index_dir))?;
    Ok(())
}

/// An opened `_pk_index/`.
pub(crate) struct PkIndex {
    index: Arc<dyn ScalarIndex>,
    path: Path,
}

impl PkIndex {
    pub(crate) async fn open(lance: &LanceStore, dir: &Path) -> Result<Self> {
        let path = dir.clone().join(PK_INDEX_DIR);
        let store: Arc<dyn IndexStore> = Arc::new(LanceIndexStore::new(
            lance.lance_store().clone(),
            path.clone(),
            Arc::new(LanceCache::no_cache()),
        ));
        let registry = IndexPluginRegistry::with_default_plugins();
        let plugin = registry
            .get_plugin_by_name("BTree")
            .map_err(SsTableError::lance(&path))?;
        let details = prost_types::Any::from_msg(&lance_index::pbold::BTreeIndexDetails::default())
            .map_err(|e| SsTableError::corrupt(&path, e.to_string()))?;
        let index = plugin
            .load_index(
                store,
                &details,
                BTREE_INDEX_VERSION,
                None,
                &LanceCache::no_cache(),
            )
            .await
            .map_err(SsTableError::lance(&path))?;
        Ok(Self { index, path })
    }

    /// Row offsets (in fragment 0) of every physical row whose key equals
    /// `key`, ascending.
    pub(crate) async fn rows_of(&self, key: ScalarValue) -> Result<Vec<u64>> {
        let result = self
            .index
            .search(&SargableQuery::Equals(key), &NoOpMetricsCollector)
            .await
            .map_err(SsTableError::lance(&self.path))?;
        let set = match result {
            SearchResult::Exact(set) | SearchResult::AtMost(set) => set,
            SearchResult::AtLeast(_) => {
                return Err(SsTableError::corrupt(
                    &self.path,
                    "BTree equality answered AtLeast",
                ))
            }
        };
        let rows = set.true_rows();
        let Some(addrs) = rows.row_addrs() else {
            return Err(SsTableError::corrupt(
                &self.path,
                "BTree equality matched a whole fragment",
            ));
        };
        let mut out: Vec<u64> = addrs.map(u64::from).collect();
        out.sort_unstable();
        Ok(out)
    }
}

/// The value the index holds for `key`: the typed value of a single-column
/// key of type `data_type`, the tuple encoding for a composite key.
pub(crate) fn index_value(key: &[KeyValue<'_>], single_type: Option<&DataType>) -> ScalarValue {
    match (key, single_type) {
        ([value], Some(data_type)) => typed_scalar(value, data_type),
        _ => ScalarValue::Binary(Some(memwal_memtable::key_codec::encoded_key(key))),
    }
}

fn typed_scalar(value: &KeyValue<'_>, data_type: &DataType) -> ScalarValue {
    match (*value, data_type) {
        (KeyValue::Null, dt) => ScalarValue::try_from(dt).unwrap_or(ScalarValue::Null),
        (KeyValue::Boolean(v), _) => ScalarValue::Boolean(Some(v)),
        (KeyValue::Int8(v), _) => ScalarValue::Int8(Some(v)),
        (KeyValue::Int16(v), _) => ScalarValue::Int16(Some(v)),
        (KeyValue::Int32(v), _) => ScalarValue::Int32(Some(v)),
        (KeyValue::Int64(v), _) => ScalarValue::Int64(Some(v)),
        (KeyValue::UInt8(v), _) => ScalarValue::UInt8(Some(v)),
        (KeyValue::UInt16(v), _) => ScalarValue::UInt16(Some(v)),
        (KeyValue::UInt32(v), _) => ScalarValue::UInt32(Some(v)),
        (KeyValue::UInt64(v), _) => ScalarValue::UInt64(Some(v)),
        (KeyValue::Date32(v), _) => ScalarValue::Date32(Some(v)),
        (KeyValue::Date64(v), _) => ScalarValue::Date64(Some(v)),
        (KeyValue::Utf8(s), DataType::LargeUtf8) => ScalarValue::LargeUtf8(Some(s.to_string())),
        (KeyValue::Utf8(s), _) => ScalarValue::Utf8(Some(s.to_string())),
        (KeyValue::Binary(b), DataType::LargeBinary) => ScalarValue::LargeBinary(Some(b.to_vec())),
        (KeyValue::Binary(b), DataType::FixedSizeBinary(n)) => {
            ScalarValue::FixedSizeBinary(*n, Some(b.to_vec()))
        }
        (KeyValue::Binary(b), _) => ScalarValue::Binary(Some(b.to_vec())),
    }
}
