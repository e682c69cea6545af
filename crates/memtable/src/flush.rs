//! Draining a frozen memtable for its SSTable (docs/memwal-format.md "SSTable").

use std::sync::Arc;

use arrow_array::{ArrayRef, LargeBinaryArray, RecordBatch};
use arrow_buffer::{Buffer, OffsetBuffer, ScalarBuffer};

use crate::error::Result;
use crate::key_codec::KeyColumns;
use crate::memtable::FrozenMemTable;

/// Sizes recorded in the shard manifest's `SsTable` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushStats {
    /// Payload bytes of all physical rows, as [`crate::MemoryUsage::payload_bytes`].
    pub in_memory_bytes: u64,
    /// Physical rows written (tombstones and hidden duplicates included).
    pub physical_rows: u64,
    /// Payload bytes of the key columns over all physical rows; `None` for
    /// a table without a primary key.
    pub primary_key_bytes: Option<u64>,
}

/// Encoded primary keys of a flush, for the SSTable's `_pk_index`.
#[derive(Debug, Clone)]
pub struct FlushKeys {
    /// The tuple-encoded key ([`crate::key_codec`]) of every physical row, in
    /// row order (`encoded.value(r)` is row r's key).
    pub encoded: LargeBinaryArray,
    /// Every physical row offset, ordered by encoded key (equal keys by
    /// ascending row). Encoded order equals value order, so this is also
    /// the order of a single-column key's typed values.
    pub rows_by_key: Vec<u32>,
}

/// Everything a flush writes for one memtable.
///
/// Matches upstream's SSTable layout: `batches` hold all physical rows in
/// insert order (storage schema, tombstones included) and `deleted_rows`
/// is the deletion vector hiding every row a newer row of the same key
/// replaced. Rows not in `deleted_rows` are exactly one per key (the newest,
/// possibly a tombstone) for a keyed table, and every row for an
/// append-only one.
#[derive(Debug, Clone)]
pub struct FlushData {
    /// All physical rows, insert order, storage schema.
    pub batches: Vec<RecordBatch>,
    /// Sorted, distinct offsets (0-based over `batches`) of superseded rows.
    pub deleted_rows: Vec<u32>,
    /// Manifest statistics.
    pub stats: FlushStats,
    /// Keys for the `_pk_index`; `None` for an append-only table.
    pub keys: Option<FlushKeys>,
}

impl FrozenMemTable {
    /// The data of this memtable's SSTable (see [`FlushData`]). Batches are
    /// shared with the memtable (no row data is copied); the keys are copied
    /// once out of the index arena.
    pub fn flush_data(&self) -> FlushData {
        let store = &self.store;
        let keys = store.index.as_ref().map(|index| {
            let (arena, ends) = index.raw();
            let mut offsets = Vec::with_capacity(ends.len() + 1);
            offsets.push(0i64);
            offsets.extend(ends.iter().map(|&e| e as i64));
            let encoded = LargeBinaryArray::new(
                OffsetBuffer::new(ScalarBuffer::from(offsets)),
                Buffer::from(arena.to_vec()),
                None,
            );
            let mut rows_by_key: Vec<u32> = (0..ends.len() as u32).collect();
            rows_by_key.sort_by(|&a, &b| index.key(a).cmp(index.key(b)));
            FlushKeys {
                encoded,
                rows_by_key,
            }
        });
        FlushData {
            batches: store.batches.clone(),
            deleted_rows: store
                .index
                .as_ref()
                .map(|i| i.superseded_sorted())
                .unwrap_or_default(),
            stats: FlushStats {
                in_memory_bytes: store.payload_bytes as u64,
                physical_rows: store.rows as u64,
                primary_key_bytes: store.index.as_ref().map(|_| store.key_payload_bytes as u64),
            },
            keys,
        }
    }

    /// The bloom-filter hash ([`crate::key_codec::bloom_hash`]) of every
    /// physical row's key, in row order (upstream inserts every row's hash,
    /// tombstones and overwritten rows included). `None` for an append-only
    /// table; an error for key types without a bloom hash (dates,
    /// fixed-size binary).
    pub fn bloom_hashes(&self) -> Result<Option<Vec<u64>>> {
        let store = &self.store;
        if store.index.is_none() {
            return Ok(None);
        }
        let names = store.schema.key_names();
        let mut out = Vec::with_capacity(store.rows);
        for batch in &store.batches {
            let cols: Vec<&ArrayRef> = store
                .schema
                .key_indices()
                .iter()
                .map(|&i| batch.column(i))
                .collect();
            let keys = KeyColumns::try_new(&cols, &names)?;
            for row in 0..batch.num_rows() {
                out.push(keys.bloom_hash_row(row)?);
            }
        }
        Ok(Some(out))
    }

    /// True when `other` is a clone of this frozen memtable (same data).
    pub fn ptr_eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.store, &other.store)
    }
}
