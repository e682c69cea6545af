//! Following the base table's schema: a live writer moves onto a new
//! version of the table's schema at a generation boundary (docs/design/
//! schema-changes.md).

use std::sync::Arc;

use arrow_schema::SchemaRef;
use memwal_memtable::{MemTable, TableSchema};
use memwal_table::BaseTable;

use crate::state::Inner;
use crate::{Error, Result};

/// [`crate::ShardWriter::evolve_to`]: the check, the freeze and the swap
/// under the state lock.
pub(crate) fn evolve_to(inner: &Arc<Inner>, base_schema: SchemaRef) -> Result<Option<u64>> {
    let next = Arc::new(
        TableSchema::new(base_schema)
            .map_err(|e| Error::invalid(format!("the new base table schema: {e}")))?,
    );
    let mut st = inner.state.lock();
    st.check_usable()?;
    let current = st.active.schema().clone();
    if current.storage_schema().fields() == next.storage_schema().fields() {
        return Ok(None);
    }
    check_same_key(&current, &next)?;
    let routing = st
        .routing
        .as_ref()
        .map(|r| r.for_schema(&next).map(Arc::new))
        .transpose()?;
    crate::write_path::freeze_locked(inner, &mut st, "schema")?;
    if !st.active.is_empty() {
        // Never: a freeze leaves the active memtable empty. Replacing a
        // non-empty one would drop acknowledged rows from memory.
        return Err(Error::corrupt(
            "the active memtable still holds rows after its freeze",
        ));
    }
    st.active = MemTable::new(next.clone());
    st.routing = routing;
    let generation = st.generation;
    drop(st);
    inner.storage.meters.schema_changes.increment(1);
    tracing::info!(
        shard = %inner.shard,
        generation,
        columns = ?next.table_schema().fields().iter().map(|f| f.name()).collect::<Vec<_>>(),
        "shard writer follows a new table schema"
    );
    Ok(Some(generation))
}

/// Reads the base table's latest version and moves onto its schema
/// ([`evolve_to`]).
pub(crate) async fn evolve(inner: &Arc<Inner>) -> Result<Option<u64>> {
    let storage = &inner.storage;
    let base = BaseTable::load(&storage.base, &storage.base_root)
        .await
        .map_err(Error::from_table)?;
    evolve_to(inner, base.schema.clone())
}

/// Refuses a schema whose primary key is not the current one.
fn check_same_key(current: &TableSchema, next: &TableSchema) -> Result<()> {
    let key = |s: &TableSchema| -> Vec<(String, i32, arrow_schema::DataType)> {
        s.key_indices()
            .iter()
            .map(|&i| {
                let f = s.table_schema().field(i);
                (f.name().clone(), s.field_ids()[i], f.data_type().clone())
            })
            .collect()
    };
    let (was, now) = (key(current), key(next));
    if was != now {
        return Err(Error::invalid(format!(
            "the base table's primary key changed from {was:?} to {now:?}: a live writer \
             cannot follow (rows of one key would split); reopen the shard"
        )));
    }
    Ok(())
}
