//! A held writer's unflushed rows as upstream's in-memory memtables, so
//! upstream's LSM planners search them together with the published levels:
//! one merge by primary key and one set of rules for every level (a newer
//! generation wins, tombstones hide rows).
//!
//! Built per search from a [`memwal::ReadSnapshot`]: the rows are shared
//! (no copy), the primary-key index and any full-text index are built over
//! them. Vector search over these memtables is exact (upstream's
//! brute-force arm, used when a memtable has no graph); full-text search
//! goes through an in-memory inverted index with the base index's tokenizer.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use lance::dataset::mem_wal::scanner::{InMemoryMemTableRef, InMemoryMemTables};
use lance::dataset::mem_wal::write::{BatchStore, IndexStore};
use memwal_sstable::{IndexKind, IndexSpec};

use crate::read::field_id;

/// `snapshot`'s rows as memtables above its published generation: one per
/// run of batches of one schema (a schema change froze the memtable
/// before it), oldest first, the last one active. `keys` are the table's
/// primary-key columns (empty: append-only); `full_text` the inverted
/// indexes to build over them. `None` when the snapshot holds no rows.
pub(crate) fn in_memory(
    snapshot: &memwal::ReadSnapshot,
    keys: &[String],
    full_text: &[&IndexSpec],
) -> Result<Option<InMemoryMemTables>, String> {
    let mut runs: Vec<Vec<&RecordBatch>> = Vec::new();
    for b in snapshot.batches.iter().filter(|b| b.num_rows() > 0) {
        match runs.last_mut() {
            Some(run) if run[0].schema() == b.schema() => run.push(b),
            _ => runs.push(vec![b]),
        }
    }
    let mut tables = Vec::with_capacity(runs.len());
    for (i, run) in runs.iter().enumerate() {
        let generation = snapshot.published_generation + 1 + i as u64;
        tables.push(memtable(run, generation, keys, full_text)?);
    }
    let Some(active) = tables.pop() else {
        return Ok(None);
    };
    Ok(Some(InMemoryMemTables {
        active,
        frozen: tables,
    }))
}

/// One memtable over `batches` (all of one schema).
fn memtable(
    batches: &[&RecordBatch],
    generation: u64,
    keys: &[String],
    full_text: &[&IndexSpec],
) -> Result<InMemoryMemTableRef, String> {
    let schema: SchemaRef = batches[0].schema();
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
    let store = Arc::new(BatchStore::with_capacity(batches.len()));
    for b in batches {
        let (_, row_offset, position) = store
            .append((*b).clone())
            .map_err(|e| format!("buffering unflushed rows: {e}"))?;
        indexes
            .insert_with_batch_position(b, row_offset, Some(position))
            .map_err(|e| format!("indexing unflushed rows: {e}"))?;
    }
    Ok(InMemoryMemTableRef {
        batch_store: store,
        index_store: Arc::new(indexes),
        schema,
        generation,
    })
}
