//! Validation of incoming batches and their conversion to the storage form.

use std::sync::Arc;

use arrow_array::{new_null_array, Array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions};
use arrow_buffer::BooleanBuffer;

use crate::error::{MemTableError, Result};
use crate::schema::{parse_field_id, TableSchema, TOMBSTONE_COLUMN};

fn first_null(array: &dyn Array) -> Option<usize> {
    if array.null_count() == 0 {
        return None;
    }
    (0..array.len()).find(|&i| array.is_null(i))
}

fn mismatch(reason: String) -> MemTableError {
    MemTableError::SchemaMismatch { reason }
}

fn constant_bool(value: bool, len: usize) -> ArrayRef {
    let bits = if value {
        BooleanBuffer::new_set(len)
    } else {
        BooleanBuffer::new_unset(len)
    };
    Arc::new(BooleanArray::new(bits, None))
}

/// How a storage-form batch (one with `_tombstone`) is matched to the table.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Columns {
    /// Input from a caller: every table column present, nothing else.
    Exact,
    /// Input read back from a WAL: missing non-key columns are null-filled,
    /// columns the table does not know are dropped.
    Lenient,
}

impl TableSchema {
    /// Validates a batch offered for writing and returns it in storage form,
    /// reusing its arrays (no data is copied; only the `_tombstone` bitmap is
    /// allocated for a user batch). Nothing the batch carries is dropped
    /// and no column is invented: a batch that does not cover the table's
    /// columns exactly is refused.
    ///
    /// Two input shapes are accepted:
    /// - a *user* batch (no `_tombstone` column): exactly the table's columns
    ///   by name, in order, with the table's types; `_tombstone` = false is
    ///   appended. Nulls are refused in key columns ([`MemTableError::NullKey`])
    ///   and in columns the table declares non-nullable
    ///   ([`MemTableError::NullValue`]).
    /// - a *storage* batch (has `_tombstone`): each table column is matched by
    ///   `lance:field_id` (by name where the batch column carries no id; any
    ///   id on `_tombstone` is ignored) and must have the table's type. Every
    ///   table column must be matched, a missing key column with
    ///   [`MemTableError::MissingKeyColumn`], a missing non-key column with
    ///   [`MemTableError::SchemaMismatch`]; a batch column that matches no
    ///   table column (an unknown field id, an unknown name, a second column
    ///   for the same table column) is refused with
    ///   [`MemTableError::SchemaMismatch`] naming it and its field id. Nulls
    ///   are refused in key columns; `_tombstone` must be boolean without
    ///   nulls ([`MemTableError::InvalidTombstone`]).
    ///
    /// An empty batch is refused with [`MemTableError::EmptyBatch`]. A batch
    /// whose schema is this table's [`TableSchema::storage_schema`] `Arc`
    /// (the output of this method) only has its key nulls and `_tombstone`
    /// re-checked.
    ///
    /// Entries read back from a WAL go through
    /// [`TableSchema::to_storage_for_replay`] instead.
    pub fn to_storage(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        if batch.num_rows() == 0 {
            return Err(MemTableError::EmptyBatch);
        }
        if let Some(stored) = self.already_storage(batch)? {
            return Ok(stored);
        }
        if batch.schema().column_with_name(TOMBSTONE_COLUMN).is_some() {
            self.convert_storage(batch, Columns::Exact)
        } else {
            self.convert_user(batch)
        }
    }

    /// Converts a batch read back from a WAL (docs/memwal-format.md "WAL") to storage
    /// form, reusing its arrays. Only for replay: the entry may have been
    /// written by another implementation or under an older version of the
    /// table's schema, so the match is lenient where
    /// [`TableSchema::to_storage`] is strict:
    ///
    /// - table columns are matched by `lance:field_id` (by name where the
    ///   batch column carries no id; any id on `_tombstone` is ignored) and
    ///   must have the table's type ([`MemTableError::SchemaMismatch`]);
    /// - a missing key column is refused ([`MemTableError::MissingKeyColumn`]);
    /// - a missing non-key column (added to the table after the entry was
    ///   written) is filled with nulls;
    /// - batch columns that match no table column (dropped from the table
    ///   since) are dropped;
    /// - `_tombstone` must be boolean without nulls; a batch without it is
    ///   read as puts only (`_tombstone` = false).
    ///
    /// Nulls are refused in key columns ([`MemTableError::NullKey`]); nulls in
    /// other columns are kept as written, whatever their declared
    /// nullability. An empty batch is refused with
    /// [`MemTableError::EmptyBatch`], as by [`TableSchema::to_storage`]: a
    /// replaying caller skips empty batches (a WAL entry may hold some).
    pub fn to_storage_for_replay(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        if batch.num_rows() == 0 {
            return Err(MemTableError::EmptyBatch);
        }
        if let Some(stored) = self.already_storage(batch)? {
            return Ok(stored);
        }
        self.convert_storage(batch, Columns::Lenient)
    }

    /// The fast path: `batch` already carries this table's storage schema.
    fn already_storage(&self, batch: &RecordBatch) -> Result<Option<RecordBatch>> {
        if !Arc::ptr_eq(&batch.schema(), self.storage_schema()) {
            return Ok(None);
        }
        self.check_keys(batch.columns())?;
        self.check_tombstone(batch.column(self.tombstone_index()))?;
        Ok(Some(batch.clone()))
    }

    /// A storage batch from columns already checked against the table. Nested
    /// field metadata (the stamped child field ids) may differ between the
    /// arrays and the storage schema, so nested names are not compared.
    fn assemble(&self, columns: Vec<ArrayRef>) -> Result<RecordBatch> {
        let options = RecordBatchOptions::new().with_match_field_names(false);
        Ok(RecordBatch::try_new_with_options(
            self.storage_schema().clone(),
            columns,
            &options,
        )?)
    }

    fn check_keys(&self, columns: &[ArrayRef]) -> Result<()> {
        for &k in self.key_indices() {
            if let Some(row) = first_null(columns[k].as_ref()) {
                return Err(MemTableError::NullKey {
                    column: self.table_schema().field(k).name().clone(),
                    row,
                });
            }
        }
        Ok(())
    }

    fn check_tombstone(&self, column: &ArrayRef) -> Result<()> {
        if column.data_type() != &arrow_schema::DataType::Boolean {
            return Err(MemTableError::InvalidTombstone {
                reason: format!("type is {}, not Boolean", column.data_type()),
            });
        }
        if let Some(row) = first_null(column.as_ref()) {
            return Err(MemTableError::InvalidTombstone {
                reason: format!("null at row {row}"),
            });
        }
        Ok(())
    }

    fn convert_user(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let table = self.table_schema();
        let schema = batch.schema();
        if schema.fields().len() != table.fields().len() {
            let names: Vec<&String> = schema.fields().iter().map(|f| f.name()).collect();
            let want: Vec<&String> = table.fields().iter().map(|f| f.name()).collect();
            return Err(mismatch(format!(
                "batch has {} columns {names:?}, the table has {} {want:?}",
                names.len(),
                want.len()
            )));
        }
        for (i, (got, want)) in schema.fields().iter().zip(table.fields()).enumerate() {
            if got.name() != want.name() {
                return Err(mismatch(format!(
                    "column {i} is `{}`, the table's column {i} is `{}`",
                    got.name(),
                    want.name()
                )));
            }
            if !got.data_type().equals_datatype(want.data_type()) {
                return Err(mismatch(format!(
                    "column `{}` has type {}, the table declares {}",
                    got.name(),
                    got.data_type(),
                    want.data_type()
                )));
            }
        }
        self.check_keys(batch.columns())?;
        for (i, f) in table.fields().iter().enumerate() {
            if !f.is_nullable() && !self.key_indices().contains(&i) {
                if let Some(row) = first_null(batch.column(i).as_ref()) {
                    return Err(MemTableError::NullValue {
                        column: f.name().clone(),
                        row,
                    });
                }
            }
        }
        let mut columns = batch.columns().to_vec();
        columns.push(constant_bool(false, batch.num_rows()));
        self.assemble(columns)
    }

    fn convert_storage(&self, batch: &RecordBatch, mode: Columns) -> Result<RecordBatch> {
        let schema = batch.schema();
        let n = batch.num_rows();
        // The first `_tombstone` column is the marker; any other one is an
        // ordinary (unmatched) column.
        let tombstone_at = schema.index_of(TOMBSTONE_COLUMN).ok();
        let mut source_ids = Vec::with_capacity(schema.fields().len());
        for (j, f) in schema.fields().iter().enumerate() {
            source_ids.push(if Some(j) == tombstone_at {
                None
            } else {
                parse_field_id(f).map_err(|e| mismatch(e.to_string()))?
            });
        }
        let mut used = vec![false; schema.fields().len()];
        let mut missing = Vec::new();
        if let Some(t) = tombstone_at {
            used[t] = true;
        }
        let mut columns = Vec::with_capacity(self.num_columns() + 1);
        for (i, want) in self.table_schema().fields().iter().enumerate() {
            let id = self.field_ids()[i];
            let found = source_ids.iter().position(|s| *s == Some(id)).or_else(|| {
                schema
                    .fields()
                    .iter()
                    .zip(&source_ids)
                    .enumerate()
                    .position(|(j, (f, s))| {
                        s.is_none() && Some(j) != tombstone_at && f.name() == want.name()
                    })
            });
            match found {
                Some(j) => {
                    let got = schema.field(j);
                    if !got.data_type().equals_datatype(want.data_type()) {
                        return Err(mismatch(format!(
                            "column `{}` (field id {id}) has type {}, the table declares {}",
                            got.name(),
                            got.data_type(),
                            want.data_type()
                        )));
                    }
                    used[j] = true;
                    columns.push(batch.column(j).clone());
                }
                None if self.key_indices().contains(&i) => {
                    return Err(MemTableError::MissingKeyColumn {
                        column: want.name().clone(),
                    })
                }
                None => {
                    if mode == Columns::Exact {
                        missing.push(format!("`{}` (field id {id})", want.name()));
                    }
                    columns.push(new_null_array(want.data_type(), n));
                }
            }
        }
        if mode == Columns::Exact {
            let unmatched: Vec<String> = (0..used.len())
                .filter(|&j| !used[j])
                .map(|j| match source_ids[j] {
                    Some(id) => format!("`{}` (field id {id})", schema.field(j).name()),
                    None => format!("`{}` (no field id)", schema.field(j).name()),
                })
                .collect();
            let mut problems = Vec::new();
            if !unmatched.is_empty() {
                problems.push(format!(
                    "batch columns {} match no table column",
                    unmatched.join(", ")
                ));
            }
            if !missing.is_empty() {
                problems.push(format!(
                    "table columns {} have no batch column",
                    missing.join(", ")
                ));
            }
            if !problems.is_empty() {
                return Err(mismatch(problems.join("; ")));
            }
        }
        self.check_keys(&columns)?;
        let tombstone = tombstone_at
            .map(|t| batch.column(t).clone())
            .unwrap_or_else(|| constant_bool(false, n));
        self.check_tombstone(&tombstone)?;
        columns.push(tombstone);
        self.assemble(columns)
    }

    /// The storage batch of delete markers for the keys in `keys`: key
    /// columns taken (by name, zero-copy) from `keys`, every other column
    /// null, `_tombstone` = true. Extra columns in `keys` are ignored.
    ///
    /// Errors: [`MemTableError::NoPrimaryKey`] for an append-only table,
    /// [`MemTableError::EmptyBatch`], [`MemTableError::MissingKeyColumn`],
    /// [`MemTableError::SchemaMismatch`] for a key column of another type,
    /// [`MemTableError::NullKey`].
    pub fn tombstone_batch(&self, keys: &RecordBatch) -> Result<RecordBatch> {
        if !self.has_primary_key() {
            return Err(MemTableError::NoPrimaryKey {
                operation: "delete",
            });
        }
        let n = keys.num_rows();
        if n == 0 {
            return Err(MemTableError::EmptyBatch);
        }
        let mut columns = Vec::with_capacity(self.num_columns() + 1);
        for (i, want) in self.table_schema().fields().iter().enumerate() {
            if self.key_indices().contains(&i) {
                let column = keys.column_by_name(want.name()).ok_or_else(|| {
                    MemTableError::MissingKeyColumn {
                        column: want.name().clone(),
                    }
                })?;
                if !column.data_type().equals_datatype(want.data_type()) {
                    return Err(mismatch(format!(
                        "key column `{}` has type {}, the table declares {}",
                        want.name(),
                        column.data_type(),
                        want.data_type()
                    )));
                }
                columns.push(column.clone());
            } else {
                columns.push(new_null_array(want.data_type(), n));
            }
        }
        self.check_keys(&columns)?;
        columns.push(constant_bool(true, n));
        self.assemble(columns)
    }
}
