//! The memtable: batches in insert order with a last-write-wins key index.

use std::ops::Range;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{BooleanArray, RecordBatch};
use arrow_buffer::BooleanBufferBuilder;
use parking_lot::MutexGuard;

use crate::error::{MemTableError, Result};
use crate::key_codec::{encode_key, KeyValue};
use crate::memory::{batch_payload_bytes, BufferTracker, MemoryUsage};
use crate::pk_index::{key_columns, Indexed, LazyPkIndex};
use crate::schema::TableSchema;

/// Most physical rows one memtable holds (row offsets are `u32`, as in the
/// SSTable's deletion vector).
pub const MAX_ROWS: usize = u32::MAX as usize;

/// Where a physical row lives: batch number and row within that batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowLocation {
    /// Index of the batch in insert order.
    pub batch: usize,
    /// Row within that batch.
    pub row: usize,
}

/// State shared by [`MemTable`] and [`FrozenMemTable`].
#[derive(Debug)]
pub(crate) struct Store {
    pub(crate) schema: Arc<TableSchema>,
    pub(crate) batches: Vec<RecordBatch>,
    /// Offset of each batch's first row.
    starts: Vec<u32>,
    pub(crate) rows: usize,
    pub(crate) tombstone_rows: usize,
    pub(crate) payload_bytes: usize,
    pub(crate) key_payload_bytes: usize,
    tracker: BufferTracker,
    /// The key index (`None` for an append-only table), built by the
    /// lookups that need it, not by inserts.
    pub(crate) index: Option<LazyPkIndex>,
}

impl Store {
    fn new(schema: Arc<TableSchema>) -> Self {
        let index = schema.has_primary_key().then(LazyPkIndex::default);
        Self {
            schema,
            batches: Vec::new(),
            starts: Vec::new(),
            rows: 0,
            tombstone_rows: 0,
            payload_bytes: 0,
            key_payload_bytes: 0,
            tracker: BufferTracker::default(),
            index,
        }
    }

    fn insert(&mut self, batch: &RecordBatch) -> Result<Range<usize>> {
        let batch = self.schema.to_storage(batch)?;
        let n = batch.num_rows();
        let total = self.rows + n;
        if total > MAX_ROWS {
            return Err(MemTableError::TooManyRows { rows: total });
        }
        let first = self.rows as u32;
        if self.index.is_some() {
            // Checks the key types (the index reads them the same way
            // later); the keys themselves are indexed by the first lookup.
            key_columns(&self.schema, &batch)?;
            self.key_payload_bytes += self
                .schema
                .key_indices()
                .iter()
                .map(|&i| crate::memory::array_payload_bytes(batch.column(i).as_ref()))
                .sum::<usize>();
        }
        self.tombstone_rows += batch
            .column(self.schema.tombstone_index())
            .as_boolean()
            .true_count();
        self.payload_bytes += batch_payload_bytes(&batch);
        self.tracker.charge(&batch);
        self.starts.push(first);
        self.batches.push(batch);
        self.rows = total;
        Ok(first as usize..total)
    }

    pub(crate) fn locate(&self, row: u32) -> RowLocation {
        let batch = self.starts.partition_point(|&s| s <= row) - 1;
        RowLocation {
            batch,
            row: (row - self.starts[batch]) as usize,
        }
    }

    /// The key index caught up with every batch, held locked.
    pub(crate) fn index(&self, operation: &'static str) -> Result<MutexGuard<'_, Indexed>> {
        self.index
            .as_ref()
            .ok_or(MemTableError::NoPrimaryKey { operation })?
            .caught_up(&self.schema, &self.batches, &self.starts)
    }

    fn is_tombstone(&self, loc: RowLocation) -> bool {
        self.batches[loc.batch]
            .column(self.schema.tombstone_index())
            .as_boolean()
            .value(loc.row)
    }

    fn newest_row(&self, key: &[KeyValue<'_>]) -> Result<Option<u32>> {
        let index = self.index("get")?;
        let expected = self.schema.key_indices().len();
        if key.len() != expected {
            return Err(MemTableError::KeyArity {
                given: key.len(),
                expected,
            });
        }
        let mut buf = Vec::with_capacity(expected * 10);
        encode_key(key, &mut buf);
        Ok(index.index().newest(&buf))
    }

    fn get(&self, key: &[KeyValue<'_>]) -> Result<Option<RecordBatch>> {
        let Some(row) = self.newest_row(key)? else {
            return Ok(None);
        };
        let loc = self.locate(row);
        if self.is_tombstone(loc) {
            return Ok(None);
        }
        Ok(Some(self.batches[loc.batch].slice(loc.row, 1)))
    }

    fn get_encoded(&self, key: &[u8]) -> Result<Option<RecordBatch>> {
        let Some(row) = self.index("get")?.index().newest(key) else {
            return Ok(None);
        };
        let loc = self.locate(row);
        if self.is_tombstone(loc) {
            return Ok(None);
        }
        Ok(Some(self.batches[loc.batch].slice(loc.row, 1)))
    }

    /// Per physical row: true when it is the newest of its key and not a
    /// tombstone (append-only tables: every row).
    fn visible_mask(&self) -> Result<Vec<BooleanArray>> {
        let mut hidden = BooleanBufferBuilder::new(self.rows);
        hidden.append_n(self.rows, false);
        if self.index.is_some() {
            for r in self.index("visible_batches")?.index().superseded_sorted() {
                hidden.set_bit(r as usize, true);
            }
        }
        let hidden = hidden.finish();
        Ok(self
            .batches
            .iter()
            .zip(&self.starts)
            .map(|(b, &s)| {
                let tomb = b.column(self.schema.tombstone_index()).as_boolean();
                let old = hidden.slice(s as usize, b.num_rows());
                BooleanArray::new(!&(&old | tomb.values()), None)
            })
            .collect())
    }

    fn visible_batches(&self) -> Result<Vec<RecordBatch>> {
        let masks = self.visible_mask()?;
        let mut out = Vec::with_capacity(self.batches.len());
        for (b, m) in self.batches.iter().zip(&masks) {
            let f = arrow_select::filter::filter_record_batch(b, m)?;
            if f.num_rows() > 0 {
                out.push(f);
            }
        }
        Ok(out)
    }

    fn memory(&self) -> MemoryUsage {
        let index = self.index.as_ref().map_or(0, LazyPkIndex::heap_bytes);
        let lists = self.batches.capacity() * std::mem::size_of::<RecordBatch>()
            + self.starts.capacity() * std::mem::size_of::<u32>();
        MemoryUsage {
            payload_bytes: self.payload_bytes,
            retained_bytes: self.tracker.retained(),
            index_bytes: index + lists + self.tracker.overhead(),
        }
    }
}

macro_rules! read_api {
    () => {
        /// The table schema this memtable validates against.
        pub fn schema(&self) -> &Arc<TableSchema> {
            &self.store().schema
        }

        /// The newest visible row for `key` (values in key order), as a
        /// one-row storage-schema batch (a zero-copy slice); `None` when the
        /// key was never written or its newest row is a tombstone.
        ///
        /// The key index is built here, not by inserts: the first lookup
        /// after inserts indexes their rows (cost proportional to the rows
        /// added since the last lookup), so puts never pay for lookups.
        /// Errors: [`MemTableError::NoPrimaryKey`], [`MemTableError::KeyArity`].
        pub fn get(&self, key: &[KeyValue<'_>]) -> Result<Option<RecordBatch>> {
            self.store().get(key)
        }

        /// Like [`Self::get`], for a key already in the tuple encoding
        /// ([`crate::key_codec::encode_key`]).
        pub fn get_encoded(&self, key: &[u8]) -> Result<Option<RecordBatch>> {
            self.store().get_encoded(key)
        }

        /// All physical rows (tombstones and overwritten rows included) as
        /// the stored batches, in insert order, storage schema.
        pub fn batches(&self) -> &[RecordBatch] {
            &self.store().batches
        }

        /// Only the visible rows: for each key its newest row unless that is a
        /// tombstone (every row of an append-only table), in insert order.
        pub fn visible_batches(&self) -> Result<Vec<RecordBatch>> {
            self.store().visible_batches()
        }

        /// Physical rows held (tombstones and overwritten rows included).
        pub fn num_rows(&self) -> usize {
            self.store().rows
        }

        /// Physical rows that are tombstones.
        pub fn num_tombstones(&self) -> usize {
            self.store().tombstone_rows
        }

        /// Distinct keys held (`None` for an append-only table). Builds the
        /// key index (see [`Self::get`]).
        pub fn num_keys(&self) -> Result<Option<usize>> {
            let store = self.store();
            if store.index.is_none() {
                return Ok(None);
            }
            Ok(Some(store.index("num_keys")?.index().distinct_keys()))
        }

        /// True when no row was inserted.
        pub fn is_empty(&self) -> bool {
            self.store().rows == 0
        }

        /// Memory this memtable keeps alive (see [`MemoryUsage`]).
        pub fn memory_usage(&self) -> MemoryUsage {
            self.store().memory()
        }

        /// Where physical row `row` (offset in insert order) is stored.
        /// Panics when `row >= num_rows()`.
        pub fn locate(&self, row: u32) -> RowLocation {
            assert!((row as usize) < self.store().rows, "row {row} out of range");
            self.store().locate(row)
        }
    };
}

/// The active, writable memtable of one generation.
///
/// Rows are kept in the order [`MemTable::insert`] receives them (the writer
/// inserts in WAL order). For a table with a primary key, the last write per
/// key wins for [`MemTable::get`] and for the flush; an append-only table
/// keeps and shows every row.
#[derive(Debug)]
pub struct MemTable {
    store: Store,
}

impl MemTable {
    /// An empty memtable for `schema`.
    pub fn new(schema: Arc<TableSchema>) -> Self {
        Self {
            store: Store::new(schema),
        }
    }

    fn store(&self) -> &Store {
        &self.store
    }

    /// Validates `batch` (user or storage form, see
    /// [`TableSchema::to_storage`]) and appends its rows after all earlier
    /// ones. Nothing is stored when it fails. Returns the physical row
    /// offsets its rows got.
    ///
    /// A writer that logs before inserting converts first
    /// ([`TableSchema::to_storage`] / [`TableSchema::tombstone_batch`]),
    /// writes that batch to the WAL and inserts the same batch: a batch
    /// carrying this table's storage schema `Arc` takes a fast path (only
    /// key nulls and `_tombstone` are re-checked) and can then only fail
    /// with [`MemTableError::TooManyRows`] (see [`MAX_ROWS`]). WAL replay
    /// converts with [`TableSchema::to_storage_for_replay`] and inserts its
    /// output the same way.
    pub fn insert(&mut self, batch: &RecordBatch) -> Result<Range<usize>> {
        self.store.insert(batch)
    }

    /// Deletes the keys in `keys` (a batch holding at least the key columns,
    /// by name): appends tombstone rows (see [`TableSchema::tombstone_batch`]).
    pub fn delete(&mut self, keys: &RecordBatch) -> Result<Range<usize>> {
        let tombstones = self.store.schema.tombstone_batch(keys)?;
        self.store.insert(&tombstones)
    }

    /// Ends writes: the memtable becomes an immutable, cheaply cloneable
    /// [`FrozenMemTable`] that still answers reads while it is flushed.
    pub fn freeze(self) -> FrozenMemTable {
        FrozenMemTable {
            store: Arc::new(self.store),
        }
    }

    read_api!();
}

/// An immutable memtable: reads and the flush drain; clones share it.
#[derive(Debug, Clone)]
pub struct FrozenMemTable {
    pub(crate) store: Arc<Store>,
}

impl FrozenMemTable {
    fn store(&self) -> &Store {
        &self.store
    }

    read_api!();
}
