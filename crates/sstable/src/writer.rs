//! Writing a frozen memtable's flush data as an SSTable directory.

use std::sync::Arc;

use arrow_array::Array;
use futures::StreamExt;

use lance_file::version::LanceFileVersion;
use memwal_fencing::ShardLayout;
use memwal_memtable::{FlushData, TableSchema, FIELD_ID_KEY};
use memwal_proto::SsTable;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use roaring::RoaringBitmap;

use crate::bloom::{build_filter, BloomSizing, BLOOM_FILTER_FILE};
use crate::dataset::{lance_schema, open_dataset, write_dataset, SsTableCompression};
use crate::error::{Result, SsTableError};
use crate::indexes::{attach_indexes, index_names, IndexSpec};
use crate::lance_store::LanceStore;
use crate::pk_index::{training_batch, write_index};

/// What a successful [`SsTableWriter::write`] produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenSsTable {
    /// The directory name (`{random8hex}_gen_{generation}`), also `sstable.path`.
    pub dir_name: String,
    /// The directory's object-store path.
    pub dir: Path,
    /// The manifest entry to publish for it.
    pub sstable: SsTable,
    /// Rows a scan of the SSTable returns (one per key for a keyed table,
    /// tombstones included; every row for an append-only table).
    pub visible_rows: u64,
    /// The indexes it carries, by name (sorted): those asked for, but for
    /// one whose column held no value.
    pub indexes: Vec<String>,
}

/// Writes SSTables into one shard's directory.
///
/// Guarantees of [`Self::write`] when it returns `Ok`:
/// - a new directory `{random8hex}_gen_{g}` under the shard directory holds a
///   Lance dataset at version 1 with one fragment, written with the given
///   data storage version, whose schema is the storage schema with the
///   table's field ids (`_tombstone` numbered above them), every physical
///   row in insert order, and a bitmap deletion vector on fragment 0 hiding
///   every row a newer row of the same key replaced: at most one visible row
///   per key, the newest (a tombstone if that is newest);
/// - its manifest lists one index per [`IndexSpec`] given to
///   [`Self::write_indexed`] (under the spec's name, on its field id), built
///   over the visible rows, unless the column held no value;
/// - `bloom_filter.bin` and (for a keyed table) `_pk_index/` are next to it;
/// - everything was written through the store given to [`Self::new`] and is
///   as durable as that store makes a returned write (fsynced for
///   `memwal_store::open_store`'s local store, PUT-durable for S3);
/// - the dataset was reopened and checked (version, fragment, field ids,
///   visible row count).
///
/// On `Err` the directory may be partly written; it is never reused (every
/// call picks a new random name) and is unreferenced until the caller
/// publishes it, so it is garbage to delete later.
#[derive(Debug, Clone)]
pub struct SsTableWriter {
    lance: LanceStore,
    layout: ShardLayout,
    storage_version: LanceFileVersion,
    bloom: BloomSizing,
    compression: SsTableCompression,
}

impl SsTableWriter {
    /// A writer for the shard `layout` in `store`, writing data files with
    /// the base table's data storage version `storage_version` (e.g.
    /// `dataset.manifest().data_storage_format.lance_file_format().to_selector()`).
    pub fn new(
        store: Arc<dyn ObjectStore>,
        layout: ShardLayout,
        storage_version: LanceFileVersion,
    ) -> Self {
        Self {
            lance: LanceStore::new(store),
            layout,
            storage_version,
            bloom: BloomSizing::UPSTREAM,
            compression: SsTableCompression::default(),
        }
    }

    /// Sizes `bloom_filter.bin` with `sizing` instead of upstream's fixed
    /// 8192 keys (readers accept any size; a memtable far above 8192 keys
    /// otherwise gets a filter with a high false-positive rate).
    pub fn with_bloom_sizing(mut self, sizing: BloomSizing) -> Self {
        self.bloom = sizing;
        self
    }

    /// Encodes data files as `compression` says (default:
    /// [`SsTableCompression::Off`]).
    pub fn with_compression(mut self, compression: SsTableCompression) -> Self {
        self.compression = compression;
        self
    }

    /// The lance view of the store this writer writes through.
    pub fn lance_store(&self) -> &LanceStore {
        &self.lance
    }

    /// Writes generation `generation`'s flush data, without indexes (see
    /// the type docs).
    pub async fn write(
        &self,
        schema: &TableSchema,
        generation: u64,
        data: &FlushData,
    ) -> Result<WrittenSsTable> {
        self.write_indexed(schema, generation, data, &[]).await
    }

    /// Writes generation `generation`'s flush data carrying `indexes` (the
    /// base table's maintained indexes; see the type docs).
    pub async fn write_indexed(
        &self,
        schema: &TableSchema,
        generation: u64,
        data: &FlushData,
        indexes: &[IndexSpec],
    ) -> Result<WrittenSsTable> {
        let (dir_name, dir) = self.fresh_dir(generation).await?;
        let path = dir.to_string();
        let physical_rows = check_input(&path, schema, data)?;
        let deleted = superseded_rows(&path, schema, data, physical_rows)?;
        let visible_rows = physical_rows - deleted.len();

        let lance_schema = lance_schema(&path, schema.storage_schema())?;
        write_dataset(
            &self.lance,
            &dir,
            &lance_schema,
            &data.batches,
            &deleted,
            self.storage_version,
            self.compression,
        )
        .await?;
        let indexes = attach_indexes(&self.lance, &dir, indexes).await?;
        memwal_store::crash_point("sstable::before_sidecars");

        let key_names = schema.key_names();
        let bloom = build_filter(
            &path,
            self.bloom,
            &data.batches,
            schema.key_indices(),
            &key_names,
        )?;
        let bloom_path = dir.clone().join(BLOOM_FILTER_FILE);
        self.lance
            .store()
            .put(&bloom_path, PutPayload::from(bloom.to_bytes()))
            .await
            .map_err(SsTableError::store(&bloom_path))?;

        if let Some(keys) = &data.keys {
            let training = training_batch(&path, &data.batches, schema.key_indices(), keys)?;
            write_index(&self.lance, &dir, training).await?;
        }

        self.verify(&dir, schema, physical_rows, visible_rows, &indexes)
            .await?;
        Ok(WrittenSsTable {
            sstable: SsTable {
                generation,
                path: dir_name.clone(),
                in_memory_bytes: Some(data.stats.in_memory_bytes).filter(|b| *b > 0),
                physical_rows: Some(physical_rows),
                primary_key_bytes: data.stats.primary_key_bytes.filter(|b| *b > 0),
            },
            dir_name,
            dir,
            visible_rows,
            indexes,
        })
    }

    /// A directory name for `generation` under which the store holds nothing
    /// yet (a random name is retried on the rare collision, so an earlier
    /// attempt's leftovers are never written into).
    async fn fresh_dir(&self, generation: u64) -> Result<(String, Path)> {
        for _ in 0..8 {
            let dir_name = format!("{:08x}_gen_{generation}", rand::random::<u32>());
            let dir = self.layout.sstable_dir(&dir_name);
            let mut listing = self.lance.store().list(Some(&dir));
            match listing.next().await {
                None => return Ok((dir_name, dir)),
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(SsTableError::store(&dir)(e)),
            }
        }
        Err(SsTableError::invalid(
            self.layout.shard_dir(),
            "no unused SSTable directory name after 8 tries",
        ))
    }

    /// Reopens the written dataset and checks what `write` promises.
    async fn verify(
        &self,
        dir: &Path,
        schema: &TableSchema,
        physical_rows: u64,
        visible_rows: u64,
        indexes: &[String],
    ) -> Result<()> {
        let ds = open_dataset(&self.lance, dir).await?;
        let bad = |reason: String| SsTableError::corrupt(dir, reason);
        if ds.version().version != 1 || ds.get_fragments().len() != 1 {
            return Err(bad(format!(
                "read back version {} with {} fragments, expected version 1 with 1",
                ds.version().version,
                ds.get_fragments().len()
            )));
        }
        for field in schema.storage_schema().fields() {
            let stored = ds.schema().field(field.name()).map(|f| f.id);
            let want = field
                .metadata()
                .get(FIELD_ID_KEY)
                .and_then(|v| v.parse::<i32>().ok());
            match (stored, want) {
                (None, _) => return Err(bad(format!("column `{}` missing", field.name()))),
                (Some(got), Some(want)) if got != want => {
                    return Err(bad(format!(
                        "column `{}` has field id {got}, expected {want}",
                        field.name()
                    )))
                }
                _ => {}
            }
        }
        let stored_physical = ds.manifest().fragments[0].physical_rows;
        let visible = ds
            .count_rows(None)
            .await
            .map_err(SsTableError::lance(dir))? as u64;
        if stored_physical != Some(physical_rows as usize) || visible != visible_rows {
            return Err(bad(format!(
                "read back {stored_physical:?} physical / {visible} visible rows, \
                 expected {physical_rows} / {visible_rows}"
            )));
        }
        let listed = index_names(&ds, dir).await?;
        if listed != indexes {
            return Err(bad(format!(
                "read back indexes {listed:?}, expected {indexes:?}"
            )));
        }
        Ok(())
    }
}

/// Checks the flush data against the schema; returns the physical row count.
fn check_input(path: &str, schema: &TableSchema, data: &FlushData) -> Result<u64> {
    let invalid = |reason: String| SsTableError::invalid(path, reason);
    let storage = schema.storage_schema();
    for (i, batch) in data.batches.iter().enumerate() {
        let same = batch.schema().fields().len() == storage.fields().len()
            && batch
                .schema()
                .fields()
                .iter()
                .zip(storage.fields())
                .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
        if !same {
            return Err(invalid(format!(
                "batch {i} does not have the storage schema's columns"
            )));
        }
    }
    let rows: u64 = data.batches.iter().map(|b| b.num_rows() as u64).sum();
    if rows == 0 {
        return Err(invalid("no rows to flush".into()));
    }
    if rows > u32::MAX as u64 {
        return Err(invalid(format!(
            "{rows} rows exceed one fragment's row addresses"
        )));
    }
    if data.stats.physical_rows != rows {
        return Err(invalid(format!(
            "stats count {} rows, batches hold {rows}",
            data.stats.physical_rows
        )));
    }
    match (&data.keys, schema.has_primary_key()) {
        (Some(keys), true) => {
            if keys.encoded.len() as u64 != rows || keys.rows_by_key.len() as u64 != rows {
                return Err(invalid(format!(
                    "key data covers {} / {} rows, batches hold {rows}",
                    keys.encoded.len(),
                    keys.rows_by_key.len()
                )));
            }
        }
        (None, false) => {}
        (Some(_), false) => return Err(invalid("key data for a table without a key".into())),
        (None, true) => return Err(invalid("no key data for a keyed table".into())),
    }
    Ok(rows)
}

/// The deletion vector: in each run of rows with equal keys (`rows_by_key`
/// order), every row but the newest. Recomputed here from the keys, so the
/// one-visible-row-per-key guarantee does not rest on the caller; a caller's
/// `deleted_rows` that disagrees is refused as inconsistent input.
fn superseded_rows(
    path: &str,
    schema: &TableSchema,
    data: &FlushData,
    rows: u64,
) -> Result<RoaringBitmap> {
    let invalid = |reason: String| SsTableError::invalid(path, reason);
    let mut deleted = RoaringBitmap::new();
    if let (Some(keys), true) = (&data.keys, schema.has_primary_key()) {
        let order = &keys.rows_by_key;
        let mut seen = RoaringBitmap::new();
        for (i, &row) in order.iter().enumerate() {
            if row as u64 >= rows || !seen.insert(row) {
                return Err(invalid(format!(
                    "rows_by_key holds row {row} twice or out of range"
                )));
            }
            let Some(&next) = order.get(i + 1) else { break };
            let (a, b) = (
                keys.encoded.value(row as usize),
                keys.encoded.value(next as usize),
            );
            match a.cmp(b) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal if row < next => {
                    deleted.insert(row);
                }
                _ => return Err(invalid(format!("rows_by_key not sorted at position {i}"))),
            }
        }
    }
    let given: RoaringBitmap = data.deleted_rows.iter().copied().collect();
    if given != deleted {
        return Err(invalid(format!(
            "deleted_rows ({} rows) disagrees with the keys ({} superseded rows)",
            given.len(),
            deleted.len()
        )));
    }
    Ok(deleted)
}
