//! The one error type of this crate.

use arrow_schema::DataType;

/// Why a memtable operation refused its input. Every variant names the
/// column (and, where one row is at fault, the row) so a caller can report
/// the offending value without re-scanning the batch.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MemTableError {
    /// The table schema itself is unusable (duplicate names, mixed or
    /// malformed field ids, malformed primary-key metadata, ...).
    #[error("invalid table schema: {reason}")]
    InvalidSchema {
        /// What is wrong with it.
        reason: String,
    },
    /// A batch's columns do not match the table (set, order or types).
    #[error("batch does not match the table schema: {reason}")]
    SchemaMismatch {
        /// Which column differs and how.
        reason: String,
    },
    /// A batch without rows was offered; the memtable never stores one.
    #[error("empty batch: a batch must carry at least one row")]
    EmptyBatch,
    /// A primary-key column holds a null.
    #[error("primary-key column `{column}` is null at row {row}")]
    NullKey {
        /// The key column.
        column: String,
        /// The first row (0-based, within the offered batch) that is null.
        row: usize,
    },
    /// A column the table declares non-nullable holds a null in a user batch.
    #[error("column `{column}` is not nullable but is null at row {row}")]
    NullValue {
        /// The column.
        column: String,
        /// The first null row (0-based, within the offered batch).
        row: usize,
    },
    /// A batch lacks a primary-key column.
    #[error("batch lacks primary-key column `{column}`")]
    MissingKeyColumn {
        /// The key column that was not found.
        column: String,
    },
    /// The `_tombstone` column of a storage batch is malformed.
    #[error("invalid `_tombstone` column: {reason}")]
    InvalidTombstone {
        /// What is wrong with it.
        reason: String,
    },
    /// A primary-key column has a type the key codec or bloom hash cannot
    /// represent.
    #[error("primary-key column `{column}` has unsupported type {data_type}")]
    UnsupportedKeyType {
        /// The key column (or `#i` for a positional key value).
        column: String,
        /// Its type.
        data_type: DataType,
    },
    /// A key probe does not have one value per key column.
    #[error("key has {given} values but the primary key has {expected} columns")]
    KeyArity {
        /// Values given.
        given: usize,
        /// Key columns in the table.
        expected: usize,
    },
    /// The operation needs a primary key and the table has none.
    #[error("the table has no primary key (append-only): {operation} is not available")]
    NoPrimaryKey {
        /// The operation that was refused.
        operation: &'static str,
    },
    /// More rows than the memtable addresses (u32 row offsets per generation).
    #[error("memtable is full: {rows} rows exceed the per-generation limit")]
    TooManyRows {
        /// Rows the insert would have reached.
        rows: usize,
    },
    /// An Arrow kernel failed while rearranging already validated data.
    #[error("arrow error: {0}")]
    Arrow(String),
}

impl From<arrow_schema::ArrowError> for MemTableError {
    fn from(e: arrow_schema::ArrowError) -> Self {
        MemTableError::Arrow(e.to_string())
    }
}

/// Result alias of this crate.
pub type Result<T, E = MemTableError> = std::result::Result<T, E>;
