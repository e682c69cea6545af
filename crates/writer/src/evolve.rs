//! Following the base table's schema: a live writer moves onto a new
//! version of the table's schema at a generation boundary (docs/design/
//! schema-changes.md).

use std::sync::Arc;

use arrow_schema::SchemaRef;
use memwal_memtable::{MemTable, TableSchema};
use memwal_table::BaseTable;

use crate::writer::ShardWriter;
use crate::{Error, Result};

impl ShardWriter {
    /// Moves this writer onto `base_schema` (the base table's Arrow schema
    /// with its field ids, as [`BaseTable`] reads it), if it differs from
    /// the one puts are checked against now. Returns the generation the
    /// new schema starts at, or `None` when nothing changed.
    ///
    /// Guarantees:
    /// - one generation never mixes schemas: the active memtable is frozen
    ///   first (its SSTable is written in the schema its rows were taken
    ///   in, carrying the maintained indexes whose columns it has), and the
    ///   next generation starts empty in the new schema;
    /// - a put checked against the old schema but not yet in the WAL when
    ///   the change lands is matched to the new one by field id (a column
    ///   added since is null, a dropped one left out), as replay would;
    /// - a put after the change that lacks a nullable column is written
    ///   with it null; one with a column the table no longer has is
    ///   refused, naming it.
    ///
    /// Refused ([`Error::InvalidInput`], the writer unchanged and usable)
    /// when the primary key differs (columns, order, field ids or types)
    /// or the sharding spec's columns are gone or no longer key columns.
    pub fn evolve_to(&self, base_schema: SchemaRef) -> Result<Option<u64>> {
        let inner = &self.inner;
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
        crate::freeze::freeze_locked(inner, &mut st, "schema")?;
        debug_assert!(st.active.is_empty());
        st.active = MemTable::new(next.clone());
        st.routing = routing;
        let generation = st.generation;
        drop(st);
        inner.ctx.meters.schema_changes.increment(1);
        tracing::info!(
            shard = %inner.shard,
            generation,
            columns = ?next.table_schema().fields().iter().map(|f| f.name()).collect::<Vec<_>>(),
            "shard writer follows a new table schema"
        );
        Ok(Some(generation))
    }

    /// Reads the base table's latest version and moves onto its schema
    /// ([`Self::evolve_to`]).
    pub async fn evolve(&self) -> Result<Option<u64>> {
        let ctx = &self.inner.ctx;
        let base = BaseTable::load(&ctx.base, &ctx.base_root)
            .await
            .map_err(Error::from_table)?;
        self.evolve_to(base.schema.clone())
    }
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
