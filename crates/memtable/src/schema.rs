//! The table schema and the storage schema derived from it
//! (docs/memwal-format.md "WAL" and "Rows, keys, deletes").

use std::collections::HashSet;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};

use crate::error::{MemTableError, Result};

/// Field metadata key holding a column's Lance field id (decimal string).
pub const FIELD_ID_KEY: &str = "lance:field_id";
/// Field metadata key marking a primary-key column (any truthy value:
/// `true`, `1`, `yes`, `y`, `on`, case-insensitive, as Lance reads it).
pub const PRIMARY_KEY_KEY: &str = "lance-schema:unenforced-primary-key";
/// Field metadata key giving a key column's 1-based position in a composite key.
pub const PRIMARY_KEY_POSITION_KEY: &str = "lance-schema:unenforced-primary-key:position";
/// Name of the internal delete marker column that ends every storage schema.
pub const TOMBSTONE_COLUMN: &str = "_tombstone";

/// A base table's schema as the memtable sees it: its columns, their field
/// ids, its primary key (if any) and the derived storage schema.
///
/// Guarantees, once constructed:
/// - column names are unique and none is `_tombstone`;
/// - every top-level column has a distinct, non-negative field id;
/// - key columns are top-level columns of a type [`crate::key_codec`] encodes,
///   listed in key order (see [`TableSchema::new`]);
/// - [`TableSchema::storage_schema`] is the table's columns (same order and
///   types, each with `lance:field_id`; non-key columns nullable; key columns
///   keeping their primary-key metadata) followed by the non-nullable boolean
///   `_tombstone` without a field id.
#[derive(Debug, Clone)]
pub struct TableSchema {
    table: SchemaRef,
    storage: SchemaRef,
    field_ids: Vec<i32>,
    key_indices: Vec<usize>,
}

impl TableSchema {
    /// Builds the table schema from the base table's Arrow schema.
    ///
    /// Field ids: taken from `lance:field_id` when every top-level column
    /// carries one. When none does, ids are assigned the way Lance numbers a
    /// fresh schema: depth-first pre-order over the columns and their nested
    /// children, so a flat schema gets `0..n` in column order; the assigned
    /// ids are stamped on the storage schema's fields (nested children too).
    /// A schema where only some columns carry an id is refused: guessing the
    /// rest could collide with the base table's real ids.
    ///
    /// Primary key: a column is a key column when it carries a parseable
    /// `...:position` or a truthy `lance-schema:unenforced-primary-key`.
    /// Key order follows Lance: columns with a position > 0 first, by
    /// (position, field id); then the others by field id.
    pub fn new(table: SchemaRef) -> Result<Self> {
        let invalid = |reason: String| MemTableError::InvalidSchema { reason };
        let mut names = HashSet::new();
        for f in table.fields() {
            if f.name() == TOMBSTONE_COLUMN {
                return Err(invalid(format!(
                    "the table may not declare the internal column `{TOMBSTONE_COLUMN}`"
                )));
            }
            if !names.insert(f.name().as_str()) {
                return Err(invalid(format!("duplicate column `{}`", f.name())));
            }
        }
        let declared: Vec<Option<i32>> = table
            .fields()
            .iter()
            .map(|f| parse_field_id(f))
            .collect::<Result<_>>()?;
        let (fields, field_ids): (Vec<Field>, Vec<i32>) = if declared.iter().all(Option::is_some) {
            let ids: Vec<i32> = declared.iter().map(|id| id.unwrap_or_default()).collect();
            let fields = table
                .fields()
                .iter()
                .zip(&ids)
                .map(|(f, id)| with_field_id(f, *id))
                .collect();
            (fields, ids)
        } else if declared.iter().all(Option::is_none) {
            let mut next = 0;
            let mut ids = Vec::with_capacity(table.fields().len());
            let fields = table
                .fields()
                .iter()
                .map(|f| {
                    ids.push(next);
                    stamp_pre_order(f, &mut next)
                })
                .collect();
            (fields, ids)
        } else {
            return Err(invalid(
                "some columns carry `lance:field_id` and others do not".into(),
            ));
        };
        let mut seen = HashSet::new();
        for (f, id) in table.fields().iter().zip(&field_ids) {
            if !seen.insert(*id) {
                return Err(invalid(format!(
                    "field id {id} of column `{}` is not unique",
                    f.name()
                )));
            }
        }

        let mut keys: Vec<(u32, i32, usize)> = Vec::new();
        for (i, f) in table.fields().iter().enumerate() {
            if let Some(position) = key_position(f) {
                if !crate::key_codec::is_encodable(f.data_type()) {
                    return Err(MemTableError::UnsupportedKeyType {
                        column: f.name().clone(),
                        data_type: f.data_type().clone(),
                    });
                }
                if f.is_nullable() {
                    return Err(invalid(format!(
                        "primary-key column `{}` must not be nullable (Lance requires it)",
                        f.name()
                    )));
                }
                keys.push((position, field_ids[i], i));
            }
        }
        keys.sort_by_key(|&(pos, id, _)| {
            if pos > 0 {
                (false, pos as i64, id)
            } else {
                (true, id as i64, id)
            }
        });
        let key_indices: Vec<usize> = keys.iter().map(|k| k.2).collect();

        let mut storage_fields: Vec<Field> = fields
            .into_iter()
            .enumerate()
            .map(|(i, f)| {
                if key_indices.contains(&i) {
                    f
                } else {
                    f.with_nullable(true)
                }
            })
            .collect();
        storage_fields.push(Field::new(TOMBSTONE_COLUMN, DataType::Boolean, false));
        let storage = Arc::new(Schema::new_with_metadata(
            storage_fields,
            table.metadata().clone(),
        ));
        Ok(Self {
            table,
            storage,
            field_ids,
            key_indices,
        })
    }

    /// The base table's schema exactly as given.
    pub fn table_schema(&self) -> &SchemaRef {
        &self.table
    }

    /// The storage schema every batch in the memtable carries (see the type docs).
    pub fn storage_schema(&self) -> &SchemaRef {
        &self.storage
    }

    /// Number of table columns (the storage schema has one more: `_tombstone`).
    pub fn num_columns(&self) -> usize {
        self.table.fields().len()
    }

    /// Field id of each table column, in column order.
    pub fn field_ids(&self) -> &[i32] {
        &self.field_ids
    }

    /// Indices (into the table and storage columns) of the key columns, in
    /// key order. Empty for an append-only table.
    pub fn key_indices(&self) -> &[usize] {
        &self.key_indices
    }

    /// Names of the key columns in key order.
    pub fn key_names(&self) -> Vec<&str> {
        self.key_indices
            .iter()
            .map(|&i| self.table.field(i).name().as_str())
            .collect()
    }

    /// True when the table has a primary key (last write wins per key);
    /// false for an append-only table (every row kept).
    pub fn has_primary_key(&self) -> bool {
        !self.key_indices.is_empty()
    }

    /// Index of `_tombstone` in the storage schema (always the last column).
    pub fn tombstone_index(&self) -> usize {
        self.table.fields().len()
    }
}

/// Field id of `field` from its metadata; `None` when absent.
pub(crate) fn parse_field_id(field: &Field) -> Result<Option<i32>> {
    match field.metadata().get(FIELD_ID_KEY) {
        None => Ok(None),
        Some(v) => match v.parse::<i32>() {
            Ok(id) if id >= 0 => Ok(Some(id)),
            _ => Err(MemTableError::InvalidSchema {
                reason: format!(
                    "column `{}` has `{FIELD_ID_KEY}` = {v:?}, not a non-negative decimal",
                    field.name()
                ),
            }),
        },
    }
}

/// Lance's reading of the key metadata: `Some(position)` for a key column
/// (0 = no explicit position), `None` otherwise.
fn key_position(field: &Field) -> Option<u32> {
    let md = field.metadata();
    md.get(PRIMARY_KEY_POSITION_KEY)
        .and_then(|s| s.parse::<u32>().ok())
        .or_else(|| {
            md.get(PRIMARY_KEY_KEY)
                .filter(|s| {
                    ["1", "true", "on", "yes", "y"]
                        .iter()
                        .any(|t| s.eq_ignore_ascii_case(t))
                })
                .map(|_| 0)
        })
}

fn with_field_id(field: &Field, id: i32) -> Field {
    let mut md = field.metadata().clone();
    md.insert(FIELD_ID_KEY.to_string(), id.to_string());
    field.clone().with_metadata(md)
}

/// `field` and its nested children stamped with ids in depth-first pre-order.
fn stamp_pre_order(field: &Field, next: &mut i32) -> Field {
    let stamped = with_field_id(field, *next);
    *next += 1;
    let mut child = |f: &Field| Arc::new(stamp_pre_order(f, next));
    let data_type = match field.data_type() {
        DataType::Struct(children) => DataType::Struct(Fields::from(
            children.iter().map(|c| child(c)).collect::<Vec<_>>(),
        )),
        DataType::List(e) => DataType::List(child(e)),
        DataType::LargeList(e) => DataType::LargeList(child(e)),
        DataType::FixedSizeList(e, n) => DataType::FixedSizeList(child(e), *n),
        DataType::Map(e, sorted) => DataType::Map(child(e), *sorted),
        other => other.clone(),
    };
    stamped.with_data_type(data_type)
}
