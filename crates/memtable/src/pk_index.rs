//! The primary-key index: every physical row's encoded key in one arena,
//! and a hash table from key to the newest row holding it, built on demand
//! ([`LazyPkIndex`]) so that puts never pay for it.

use std::hash::BuildHasher;

use arrow_array::{ArrayRef, RecordBatch};
use hashbrown::hash_table::{Entry, HashTable};
use parking_lot::{Mutex, MutexGuard};

use crate::error::Result;
use crate::schema::TableSchema;

use crate::key_codec::KeyColumns;

/// The key columns of `batch` (storage schema of `schema`), for row access.
pub(crate) fn key_columns<'a>(
    schema: &TableSchema,
    batch: &'a RecordBatch,
) -> Result<KeyColumns<'a>> {
    let cols: Vec<&'a ArrayRef> = schema
        .key_indices()
        .iter()
        .map(|&i| batch.column(i))
        .collect();
    KeyColumns::try_new(&cols, &schema.key_names())
}

/// A [`PkIndex`] over a memtable's batches, brought up to date by the
/// lookup that needs it rather than by the insert that adds rows.
///
/// A memtable is written far more than it is looked up: the writer never
/// reads its own key index (readers merge the batches themselves, and the
/// flush sorts keys instead), so indexing each put's keys (a random probe
/// into a table of millions of keys per row) would be pure cost on the put
/// path. Guarantees: after [`LazyPkIndex::caught_up`] returns, the index
/// covers exactly the batches it was given, so every answer is the one an
/// index maintained at insert would give.
#[derive(Debug, Default)]
pub(crate) struct LazyPkIndex {
    inner: Mutex<Indexed>,
}

#[derive(Debug, Default)]
pub(crate) struct Indexed {
    index: PkIndex,
    /// Batches already in `index` (a prefix of the memtable's batches).
    batches: usize,
}

impl Indexed {
    /// The index, covering the batches it was caught up to.
    pub(crate) fn index(&self) -> &PkIndex {
        &self.index
    }
}

impl LazyPkIndex {
    /// The index covering every batch of `batches` (whose first rows are at
    /// `starts`), indexing those it has not seen yet; held locked.
    pub(crate) fn caught_up(
        &self,
        schema: &TableSchema,
        batches: &[RecordBatch],
        starts: &[u32],
    ) -> Result<MutexGuard<'_, Indexed>> {
        let mut indexed = self.inner.lock();
        while indexed.batches < batches.len() {
            let b = indexed.batches;
            let keys = key_columns(schema, &batches[b])?;
            indexed
                .index
                .insert(&keys, batches[b].num_rows(), starts[b]);
            indexed.batches += 1;
        }
        Ok(indexed)
    }

    /// Heap held by the index built so far.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.inner.lock().index.heap_bytes()
    }
}

/// Encoded keys of all physical rows plus key -> newest row.
///
/// Guarantees: `newest(k)` is the largest row offset whose key encodes to
/// `k`; every row that stopped being the newest for its key is listed in
/// `superseded` exactly once. Inserting a row allocates nothing per row
/// beyond amortised growth of the arena, offsets and table.
#[derive(Debug, Default)]
pub(crate) struct PkIndex {
    /// Concatenated encoded keys, row after row.
    arena: Vec<u8>,
    /// `ends[r]` is the end of row r's key in `arena` (start = `ends[r-1]`).
    ends: Vec<usize>,
    /// Row offsets, one per distinct key: the newest row of that key.
    table: HashTable<u32>,
    /// Rows that a newer row of the same key replaced, in replacement order.
    superseded: Vec<u32>,
    hasher: foldhash::fast::FixedState,
}

fn key_of<'a>(arena: &'a [u8], ends: &[usize], row: u32) -> &'a [u8] {
    let r = row as usize;
    let start = if r == 0 { 0 } else { ends[r - 1] };
    &arena[start..ends[r]]
}

impl PkIndex {
    /// Indexes the rows of one batch, whose first row gets offset `first_row`.
    /// Rows must be indexed in offset order without gaps.
    pub(crate) fn insert(&mut self, keys: &KeyColumns<'_>, rows: usize, first_row: u32) {
        debug_assert_eq!(self.ends.len(), first_row as usize);
        self.ends.reserve(rows);
        let Self {
            arena,
            ends,
            table,
            superseded,
            hasher,
        } = self;
        for i in 0..rows {
            let row = first_row + i as u32;
            let start = arena.len();
            keys.encode_row(i, arena);
            ends.push(arena.len());
            let key = &arena[start..];
            let hash = hasher.hash_one(key);
            let entry = table.entry(
                hash,
                |&r| key_of(arena, ends, r) == key,
                |&r| hasher.hash_one(key_of(arena, ends, r)),
            );
            match entry {
                Entry::Occupied(mut o) => {
                    superseded.push(*o.get());
                    *o.get_mut() = row;
                }
                Entry::Vacant(v) => {
                    v.insert(row);
                }
            }
        }
    }

    /// The newest row whose key encodes to `key`.
    pub(crate) fn newest(&self, key: &[u8]) -> Option<u32> {
        let hash = self.hasher.hash_one(key);
        self.table
            .find(hash, |&r| key_of(&self.arena, &self.ends, r) == key)
            .copied()
    }

    /// Rows replaced by a newer row of their key, sorted ascending.
    pub(crate) fn superseded_sorted(&self) -> Vec<u32> {
        let mut rows = self.superseded.clone();
        rows.sort_unstable();
        rows
    }

    /// Number of distinct keys.
    pub(crate) fn distinct_keys(&self) -> usize {
        self.table.len()
    }

    /// Heap held by the index, at allocated capacity.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.arena.capacity()
            + self.ends.capacity() * std::mem::size_of::<usize>()
            + self.table.allocation_size()
            + self.superseded.capacity() * std::mem::size_of::<u32>()
    }
}
