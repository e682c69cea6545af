//! Matching a batch's columns to its table: one version of the table's
//! columns ([`Shape`]), puts conformed to it by column name
//! ([`TableHost::conform`]), then checked ([`TableHost::check_schema`]).

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use memwal_sharding::ShardRouter;

use crate::{ServerError, TableHost};

/// One version of a served table's columns, and what is derived from it:
/// the key columns, the whole-batch validator and the routers. Replaced
/// whole when the table's schema changes, so one put sees one version.
pub(crate) struct Shape {
    pub schema: SchemaRef,
    /// The primary-key columns (what a delete sends).
    pub key_schema: SchemaRef,
    /// Validates whole batches before they are split (a bad row must fail
    /// the batch, not only its shard's part).
    pub validator: memwal_memtable::TableSchema,
    /// Rows' and keys' routers; `None` for an unsharded table (one shard,
    /// no routing).
    pub router: Option<(ShardRouter, ShardRouter)>,
}

impl Shape {
    /// The shape of `schema` (the base table's, with field ids) under `spec`.
    pub(crate) fn build(
        spec: &memwal_proto::ShardingSpec,
        schema: SchemaRef,
    ) -> Result<Self, String> {
        let keys: Vec<usize> = schema
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| f.metadata().contains_key(memwal_memtable::PRIMARY_KEY_KEY))
            .map(|(i, _)| i)
            .collect();
        let key_schema = Arc::new(schema.project(&keys).map_err(|e| e.to_string())?);
        let router = ShardRouter::new(spec, &schema).map_err(|e| e.to_string())?;
        let router = if router.constant_values().is_some() {
            None
        } else {
            // An append-only table has no key columns (and takes no
            // deletes: they are refused before routing); its spec routes
            // by a row column the key schema lacks.
            let key_router = if keys.is_empty() {
                ShardRouter::new(spec, &schema)
            } else {
                ShardRouter::new(spec, &key_schema)
            }
            .map_err(|e| e.to_string())?;
            Some((router, key_router))
        };
        let validator =
            memwal_memtable::TableSchema::new(schema.clone()).map_err(|e| e.to_string())?;
        Ok(Self {
            schema,
            key_schema,
            validator,
            router,
        })
    }
}

impl TableHost {
    /// A put batch in the table's column order with every table column:
    /// columns matched by name, a nullable column the batch lacks filled
    /// with nulls (a producer not yet upgraded after a column was added),
    /// a column the table does not have refused, naming it. `None`: the
    /// batch has exactly the table's columns in order already (or cannot
    /// be conformed by name: [`Self::check_schema`] then says why).
    pub(crate) fn conform(
        &self,
        shape: &Shape,
        batch: &RecordBatch,
    ) -> Result<Option<RecordBatch>, ServerError> {
        let got = batch.schema();
        let want = &shape.schema;
        let same = got.fields().len() == want.fields().len()
            && got
                .fields()
                .iter()
                .zip(want.fields())
                .all(|(g, w)| g.name() == w.name());
        if same {
            return Ok(None);
        }
        let bad = |reason: String| ServerError::InvalidInput {
            table: self.name().to_string(),
            reason,
        };
        let unknown: Vec<&str> = got
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .filter(|n| want.index_of(n).is_err())
            .collect();
        if !unknown.is_empty() {
            return Err(bad(format!(
                "a put sends column(s) {} the table does not have (it has {})",
                unknown.join(", "),
                names(want)
            )));
        }
        let mut columns = Vec::with_capacity(want.fields().len());
        for f in want.fields() {
            match got.index_of(f.name()) {
                Ok(i) => columns.push(batch.column(i).clone()),
                Err(_) if f.is_nullable() => {
                    columns.push(arrow_array::new_null_array(f.data_type(), batch.num_rows()))
                }
                Err(_) => {
                    return Err(bad(format!(
                        "a put lacks column `{}`, which the table declares non-nullable",
                        f.name()
                    )))
                }
            }
        }
        let fields: Vec<arrow_schema::FieldRef> = want
            .fields()
            .iter()
            .map(|w| match got.index_of(w.name()) {
                Ok(i) => got.fields()[i].clone(),
                Err(_) => w.clone(),
            })
            .collect();
        let schema = Arc::new(arrow_schema::Schema::new_with_metadata(
            fields,
            got.metadata().clone(),
        ));
        RecordBatch::try_new(schema, columns)
            .map(Some)
            .map_err(|e| bad(e.to_string()))
    }

    pub(crate) fn check_schema(
        &self,
        shape: &Shape,
        batch: &RecordBatch,
        delete: bool,
    ) -> Result<(), ServerError> {
        let want: &Schema = if delete {
            &shape.key_schema
        } else {
            &shape.schema
        };
        let got = batch.schema();
        let bad = |reason: String| ServerError::InvalidInput {
            table: self.name().to_string(),
            reason,
        };
        if got.fields().len() != want.fields().len() {
            return Err(bad(format!(
                "{} sends {} columns ({}), the table wants {} ({})",
                if delete { "a delete" } else { "a put" },
                got.fields().len(),
                names(&got),
                want.fields().len(),
                names(want)
            )));
        }
        for (g, w) in got.fields().iter().zip(want.fields()) {
            if g.name() != w.name() || g.data_type() != w.data_type() {
                return Err(bad(format!(
                    "column `{}` ({}) where the table has `{}` ({})",
                    g.name(),
                    g.data_type(),
                    w.name(),
                    w.data_type()
                )));
            }
        }
        Ok(())
    }
}

fn names(s: &Schema) -> String {
    s.fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
