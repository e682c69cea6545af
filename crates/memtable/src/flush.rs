//! Draining a frozen memtable for its SSTable (docs/memwal-format.md "SSTable").

use std::sync::Arc;

use arrow_array::{LargeBinaryArray, RecordBatch};
use arrow_buffer::{Buffer, OffsetBuffer, ScalarBuffer};

use crate::error::Result;
use crate::memtable::FrozenMemTable;
use crate::pk_index::key_columns;

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
    /// shared with the memtable (no row data is copied). For a keyed table
    /// every row's key is encoded once and the rows sorted by key; that
    /// order gives both the `_pk_index` and the deletion vector (in each run
    /// of equal keys every row but the last is superseded), so a flush never
    /// builds the lookup index.
    ///
    /// Errors only when a stored key column cannot be read as a key, which
    /// the insert already checked.
    pub fn flush_data(&self) -> Result<FlushData> {
        let store = &self.store;
        let (keys, deleted_rows) = match store.index {
            Some(_) => {
                let (keys, deleted) = sorted_keys(self)?;
                (Some(keys), deleted)
            }
            None => (None, Vec::new()),
        };
        Ok(FlushData {
            batches: store.batches.clone(),
            deleted_rows,
            stats: FlushStats {
                in_memory_bytes: store.payload_bytes as u64,
                physical_rows: store.rows as u64,
                primary_key_bytes: store.index.as_ref().map(|_| store.key_payload_bytes as u64),
            },
            keys,
        })
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
        let mut out = Vec::with_capacity(store.rows);
        for batch in &store.batches {
            let keys = key_columns(&store.schema, batch)?;
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

/// Every physical row's encoded key, the rows ordered by (key, row), and
/// the rows a later row of the same key supersedes (sorted, distinct).
fn sorted_keys(memtable: &FrozenMemTable) -> Result<(FlushKeys, Vec<u32>)> {
    let store = &memtable.store;
    let mut arena: Vec<u8> = Vec::with_capacity(store.key_payload_bytes + 2 * store.rows);
    let mut offsets: Vec<i64> = Vec::with_capacity(store.rows + 1);
    offsets.push(0);
    for batch in &store.batches {
        let keys = key_columns(&store.schema, batch)?;
        for row in 0..batch.num_rows() {
            keys.encode_row(row, &mut arena);
            offsets.push(arena.len() as i64);
        }
    }
    let key = |r: u32| {
        let r = r as usize;
        &arena[offsets[r] as usize..offsets[r + 1] as usize]
    };
    let mut rows_by_key: Vec<u32> = (0..store.rows as u32).collect();
    rows_by_key.sort_unstable_by(|&a, &b| key(a).cmp(key(b)).then(a.cmp(&b)));
    let mut deleted: Vec<u32> = rows_by_key
        .windows(2)
        .filter(|w| key(w[0]) == key(w[1]))
        .map(|w| w[0])
        .collect();
    deleted.sort_unstable();
    let encoded = LargeBinaryArray::new(
        OffsetBuffer::new(ScalarBuffer::from(offsets)),
        Buffer::from_vec(arena),
        None,
    );
    Ok((
        FlushKeys {
            encoded,
            rows_by_key,
        },
        deleted,
    ))
}
