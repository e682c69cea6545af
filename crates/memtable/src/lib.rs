//! The MemWAL memtable (docs/memwal-format.md "Rows, keys, deletes" and "SSTable").
//!
//! - [`TableSchema`]: the base table's columns, field ids and primary key,
//!   and the derived storage schema (`_tombstone` appended).
//! - [`TableSchema::to_storage`] / [`TableSchema::tombstone_batch`]: strict
//!   validation of batches offered for writing and zero-copy conversion to
//!   the storage form; [`TableSchema::to_storage_for_replay`]: the lenient
//!   conversion of batches read back from a WAL.
//! - [`key_codec`]: the order-preserving key tuple encoding and upstream's
//!   bloom-filter key hash (reused by the SSTable writer).
//! - [`MemTable`] / [`FrozenMemTable`]: rows in WAL order with a
//!   last-write-wins primary-key index, memory accounting, and the
//!   [`FlushData`] drain for the SSTable.

#![warn(missing_docs)]

mod convert;
mod error;
mod flush;
pub mod key_codec;
mod memory;
mod memtable;
mod pk_index;
mod schema;

pub use error::{MemTableError, Result};
pub use flush::{FlushData, FlushKeys, FlushStats};
pub use key_codec::KeyValue;
pub use memory::{array_payload_bytes, batch_payload_bytes, MemoryUsage};
pub use memtable::{FrozenMemTable, MemTable, RowLocation, MAX_ROWS};
pub use schema::{
    TableSchema, FIELD_ID_KEY, PRIMARY_KEY_KEY, PRIMARY_KEY_POSITION_KEY, TOMBSTONE_COLUMN,
};
