//! A held writer's unflushed rows as upstream's in-memory memtables, so
//! upstream's LSM planners search them together with the published levels:
//! one merge by primary key and one set of rules for every level (a newer
//! generation wins, tombstones hide rows).
//!
//! Built from a [`memwal::ReadSnapshot`]: the rows are shared (no copy);
//! the primary-key index and any full-text index are built over them. The
//! memtables built for a shard are kept ([`Memtables`]) and extended by the
//! next read with the batches put since, so a read indexes only new rows:
//! a snapshot's batches only grow at the end until a generation is
//! published (then they are built again). Vector search over these
//! memtables is exact (upstream's brute-force arm, used when a memtable
//! has no graph); full-text search goes through an in-memory inverted
//! index with the base index's tokenizer. The indexes are this module's
//! memory (the rows are the writers'): charged to the reads' account
//! (`kept.rs`) as each batch is indexed; when it has no room, the shard's
//! memtables are dropped and the read fails ([`Unbuilt::OverBudget`]).

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use datafusion::error::DataFusionError;
use datafusion::execution::memory_pool::MemoryPool;
use lance::dataset::mem_wal::scanner::{InMemoryMemTableRef, InMemoryMemTables};
use lance::dataset::mem_wal::write::{BatchStore, IndexStore};
use memwal_sstable::{IndexKind, IndexSpec};

use crate::reader::snapshot::field_id;

/// Batches a memtable built here has room for (more start a new one, a
/// newer generation).
const CAPACITY: usize = 4096;

/// The memtables last built per shard (and per set of full-text indexes).
#[derive(Default)]
pub(crate) struct Memtables {
    built: parking_lot::Mutex<HashMap<(memwal::ShardId, Vec<String>), Built>>,
}

/// Memtables built over a prefix of a shard's snapshot.
struct Built {
    published: u64,
    /// The snapshot batches they hold, in order.
    batches: Vec<RecordBatch>,
    tables: Vec<InMemoryMemTableRef>,
    /// Their indexes' bytes, charged.
    held: super::kept::Held,
}

/// Why a shard's unflushed rows could not be read as memtables.
#[derive(Debug)]
pub(crate) enum Unbuilt {
    /// Buffering or indexing the rows failed.
    Failed(String),
    /// The reads' account has no room for the indexes.
    OverBudget(DataFusionError),
}

impl Memtables {
    /// The bytes their indexes have charged.
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> usize {
        self.built.lock().values().map(|b| b.held.bytes()).sum()
    }

    /// Forgets the memtables of shards not in `live` (closed, or no
    /// longer held): their rows are published or in another writer.
    pub(crate) fn keep_only(&self, live: &std::collections::HashSet<memwal::ShardId>) {
        self.built
            .lock()
            .retain(|(shard, _), _| live.contains(shard));
    }

    /// `snapshot`'s rows as memtables above its published generation: one
    /// per run of batches of one schema (a schema change froze the memtable
    /// before it), oldest first, the last one active. `keys` are the
    /// table's primary-key columns (empty: append-only); `full_text` the
    /// inverted indexes to build over them. `None` when the snapshot holds
    /// no rows.
    ///
    /// The indexes are charged to `account` as each batch is indexed: when
    /// it has no room, the shard's memtables are dropped and
    /// [`Unbuilt::OverBudget`] returned.
    pub(crate) fn of(
        &self,
        snapshot: &memwal::ReadSnapshot,
        keys: &[String],
        full_text: &[&IndexSpec],
        account: Option<&Arc<dyn MemoryPool>>,
    ) -> Result<Option<InMemoryMemTables>, Unbuilt> {
        let rows: Vec<&RecordBatch> = snapshot
            .batches
            .iter()
            .filter(|b| b.num_rows() > 0)
            .collect();
        let id = (
            snapshot.shard,
            full_text.iter().map(|s| s.name.clone()).collect(),
        );
        let mut built = self.built.lock();
        let reusable = built.get(&id).is_some_and(|b| {
            b.published == snapshot.published_generation
                && b.batches.len() <= rows.len()
                && b.batches.iter().zip(&rows).all(|(x, y)| same(x, y))
        });
        if !reusable {
            built.insert(
                id.clone(),
                Built {
                    published: snapshot.published_generation,
                    batches: Vec::new(),
                    tables: Vec::new(),
                    held: Default::default(),
                },
            );
        }
        let entry = built
            .get_mut(&id)
            .ok_or_else(|| Unbuilt::Failed("the memtable cache lost an entry".to_string()))?;
        let what = format!("the indexes over shard {}'s unflushed rows", snapshot.shard);
        for b in &rows[entry.batches.len()..] {
            append(entry, b, snapshot.published_generation, keys, full_text)
                .map_err(Unbuilt::Failed)?;
            let bytes = entry
                .tables
                .iter()
                .map(|t| t.index_store.resident_bytes())
                .sum();
            if let Err(e) = entry.held.set(account, &what, bytes) {
                built.remove(&id);
                return Err(Unbuilt::OverBudget(e));
            }
        }
        let mut tables = entry.tables.clone();
        let Some(active) = tables.pop() else {
            return Ok(None);
        };
        Ok(Some(InMemoryMemTables {
            active,
            frozen: tables,
        }))
    }
}

impl crate::TableHost {
    /// The error of a read whose unflushed rows could not be read as
    /// memtables ([`Memtables::of`]).
    pub(crate) fn unbuilt(&self, e: Unbuilt) -> crate::ServerError {
        match e {
            Unbuilt::Failed(reason) => crate::ServerError::Setup {
                table: self.name().to_string(),
                reason: format!("reading unflushed rows: {reason}"),
            },
            Unbuilt::OverBudget(source) => crate::ServerError::OverBudget {
                table: self.name().to_string(),
                what: "indexing unflushed rows",
                source,
            },
        }
    }
}

/// The same batch of a writer's memtable (shared, never copied).
fn same(a: &RecordBatch, b: &RecordBatch) -> bool {
    a.num_rows() == b.num_rows()
        && a.num_columns() == b.num_columns()
        && a.num_columns() > 0
        && Arc::ptr_eq(a.column(0), b.column(0))
}

/// Adds `batch` to the last memtable of `entry`, or to a new one (the
/// next generation) when the schema changed or the last one is full.
fn append(
    entry: &mut Built,
    batch: &RecordBatch,
    published: u64,
    keys: &[String],
    full_text: &[&IndexSpec],
) -> Result<(), String> {
    let fits = entry
        .tables
        .last()
        .is_some_and(|t| t.schema == batch.schema() && !t.batch_store.is_full());
    if !fits {
        let generation = entry
            .tables
            .last()
            .map_or(published + 1, |t| t.generation + 1);
        entry
            .tables
            .push(memtable(&batch.schema(), generation, keys, full_text)?);
    }
    let table = entry
        .tables
        .last()
        .ok_or_else(|| "no memtable to add rows to".to_string())?;
    // `append` answers (batch position, row offset, estimated bytes): the
    // position is what the index counts as indexed, and so what readers see
    // (taking the size for it once hid every batch past a few hundred).
    let (position, row_offset, _bytes) = table
        .batch_store
        .append(batch.clone())
        .map_err(|e| format!("buffering unflushed rows: {e}"))?;
    table
        .index_store
        .insert_with_batch_position(batch, row_offset, Some(position))
        .map_err(|e| format!("indexing unflushed rows: {e}"))?;
    entry.batches.push(batch.clone());
    Ok(())
}

/// An empty memtable of `schema` with its indexes.
fn memtable(
    schema: &SchemaRef,
    generation: u64,
    keys: &[String],
    full_text: &[&IndexSpec],
) -> Result<InMemoryMemTableRef, String> {
    // A column is found by field id (a rename since these rows were
    // written keeps them), then by name.
    let stored = |name: &str, id: Option<i32>| -> Option<(String, i32)> {
        let by_id = id.and_then(|id| {
            schema
                .fields()
                .iter()
                .find(|f| field_id(f) == Some(id))
                .map(|f| (f.name().clone(), id))
        });
        by_id.or_else(|| {
            let at = schema.index_of(name).ok()?;
            let f = schema.field(at);
            Some((f.name().clone(), field_id(f).unwrap_or(at as i32)))
        })
    };
    let mut indexes = IndexStore::new();
    for spec in full_text {
        let IndexKind::Inverted(params) = &spec.kind else {
            continue;
        };
        // Rows written before the column existed hold no text to find.
        if let Some((column, id)) = stored(&spec.column, Some(spec.field_id)) {
            indexes
                .add_fts_with_params(spec.name.clone(), id, column, params.as_ref().clone())
                .map_err(|e| format!("full-text index `{}`: {e}", spec.name))?;
        }
    }
    let key_columns = keys
        .iter()
        .map(|k| stored(k, None).ok_or_else(|| format!("unflushed rows lack the key column `{k}`")))
        .collect::<Result<Vec<_>, _>>()?;
    if !key_columns.is_empty() {
        indexes.enable_pk_index(&key_columns);
    }
    Ok(InMemoryMemTableRef {
        batch_store: Arc::new(BatchStore::with_capacity(CAPACITY)),
        index_store: Arc::new(indexes),
        schema: schema.clone(),
        generation,
    })
}
