//! Reading an SSTable: point lookups (bloom filter, then `_pk_index`) and
//! scans of the visible rows.

use arrow_array::cast::AsArray;
use arrow_array::RecordBatch;
use futures::TryStreamExt;
use lance::dataset::Dataset;
use lance_core::utils::bloomfilter::sbbf::Sbbf;
use memwal_fencing::ShardLayout;
use memwal_memtable::key_codec::{bloom_hash, is_bloom_probe_exact};
use memwal_memtable::{KeyValue, TableSchema, TOMBSTONE_COLUMN};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use crate::bloom::{decode_filter, BLOOM_FILTER_FILE};
use crate::dataset::open_dataset;
use crate::error::{Result, SsTableError};
use crate::lance_store::LanceStore;
use crate::pk_index::{index_value, PkIndex};

/// Answer of a point lookup in one SSTable.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    /// The SSTable holds no row of the key.
    Absent,
    /// The key's newest row here is a delete (tombstone).
    Deleted,
    /// The key's newest row (storage schema, one row, `_tombstone` false).
    Row(RecordBatch),
}

/// An opened SSTable.
pub struct SsTableReader {
    dir: Path,
    dataset: Dataset,
    bloom: Sbbf,
    pk: Option<PkIndex>,
    schema: TableSchema,
    /// Whether a failed bloom probe proves absence (every key column
    /// [`is_bloom_probe_exact`]).
    bloom_exact: bool,
}

impl std::fmt::Debug for SsTableReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SsTableReader")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl SsTableReader {
    /// Opens SSTable `dir_name` of the shard `layout` in `lance`'s store. A
    /// keyed table's SSTable must have both sidecars; a missing or unreadable
    /// one is an error, never "empty".
    pub async fn open(
        lance: &LanceStore,
        layout: &ShardLayout,
        dir_name: &str,
        schema: &TableSchema,
    ) -> Result<Self> {
        let dir = layout.sstable_dir(dir_name);
        let dataset = open_dataset(lance, &dir).await?;
        let bloom_path = dir.clone().join(BLOOM_FILTER_FILE);
        let bytes = lance
            .store()
            .get(&bloom_path)
            .await
            .map_err(SsTableError::store(&bloom_path))?
            .bytes()
            .await
            .map_err(SsTableError::store(&bloom_path))?;
        let bloom = decode_filter(bloom_path.as_ref(), &bytes)?;
        let pk = if schema.has_primary_key() {
            Some(PkIndex::open(lance, &dir).await?)
        } else {
            None
        };
        let table = schema.table_schema();
        let bloom_exact = schema
            .key_indices()
            .iter()
            .all(|&i| is_bloom_probe_exact(table.field(i).data_type()));
        Ok(Self {
            dir,
            dataset,
            bloom,
            pk,
            schema: schema.clone(),
            bloom_exact,
        })
    }

    /// Opens with a fresh [`LanceStore`] over `store`.
    pub async fn open_in(
        store: std::sync::Arc<dyn ObjectStore>,
        layout: &ShardLayout,
        dir_name: &str,
        schema: &TableSchema,
    ) -> Result<Self> {
        Self::open(&LanceStore::new(store), layout, dir_name, schema).await
    }

    /// The SSTable's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The Lance dataset (deletion vector applied by its scans).
    pub fn dataset(&self) -> &Dataset {
        &self.dataset
    }

    /// False only when the bloom filter proves `key` (key order) absent.
    ///
    /// The filter can prove that only when every key column of the table is
    /// Int32, Int64, Utf8 or Binary
    /// ([`memwal_memtable::key_codec::is_bloom_probe_exact`]): for other key
    /// types upstream's SSTable writer does not insert the hash we probe
    /// with, and an SSTable does not say who wrote it, so the answer is then
    /// always true (as it is for a key [`bloom_hash`] refuses).
    pub fn might_contain(&self, key: &[KeyValue<'_>]) -> bool {
        if !self.bloom_exact {
            return true;
        }
        match bloom_hash(key) {
            Ok(hash) => self.bloom.check_hash(hash),
            Err(_) => true,
        }
    }

    /// The newest row of `key` (values in key order): bloom filter first,
    /// then the primary-key index, then one row read by address.
    pub async fn get(&self, key: &[KeyValue<'_>]) -> Result<Lookup> {
        let Some(pk) = &self.pk else {
            return Err(SsTableError::invalid(
                &self.dir,
                "point lookup in an SSTable of a table without a primary key",
            ));
        };
        if key.len() != self.schema.key_indices().len() {
            return Err(SsTableError::invalid(
                &self.dir,
                format!(
                    "key has {} values, the primary key {} columns",
                    key.len(),
                    self.schema.key_indices().len()
                ),
            ));
        }
        if !self.might_contain(key) {
            return Ok(Lookup::Absent);
        }
        let single_type = match self.schema.key_indices() {
            [i] => Some(self.schema.storage_schema().field(*i).data_type()),
            _ => None,
        };
        let rows = pk.rows_of(index_value(key, single_type)).await?;
        let Some(&newest) = rows.last() else {
            return Ok(Lookup::Absent);
        };
        let batch = self
            .dataset
            .take_rows(&[newest], self.dataset.schema().clone())
            .await
            .map_err(SsTableError::lance(&self.dir))?;
        if batch.num_rows() != 1 {
            return Err(SsTableError::corrupt(
                &self.dir,
                format!(
                    "row {newest} from the index read back {} rows",
                    batch.num_rows()
                ),
            ));
        }
        let tombstone = batch
            .column_by_name(TOMBSTONE_COLUMN)
            .and_then(|c| c.as_boolean_opt().map(|b| b.value(0)))
            .ok_or_else(|| SsTableError::corrupt(&self.dir, "no boolean `_tombstone` column"))?;
        Ok(if tombstone {
            Lookup::Deleted
        } else {
            Lookup::Row(batch)
        })
    }

    /// Every visible row (deletion vector applied; tombstones included, as
    /// `_tombstone = true`), in insert order.
    pub async fn scan(&self) -> Result<Vec<RecordBatch>> {
        let mut scanner = self.dataset.scan();
        scanner.scan_in_order(true);
        scanner
            .try_into_stream()
            .await
            .map_err(SsTableError::lance(&self.dir))?
            .try_collect()
            .await
            .map_err(SsTableError::lance(&self.dir))
    }
}
