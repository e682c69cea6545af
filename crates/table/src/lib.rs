//! The base table a MemWAL belongs to (docs/memwal-format.md "Compaction into the base
//! table"): its schema with Lance field ids and primary key, its data
//! storage version, and the configuration the `__lance_mem_wal` system
//! index carries (sharding specs, writer defaults, compaction progress).
//!
//! Every writer, compactor and the daemon reads the table through
//! [`BaseTable::load`], so they agree on what the table declares.

#![warn(missing_docs)]

mod error;
mod load;
mod maintained;

pub use error::{Result, TableError};
pub use load::BaseTable;
pub use maintained::{BaseIndex, MaintainedIndexes};

/// Name of the system index that holds a table's MemWAL configuration.
pub const MEM_WAL_INDEX_NAME: &str = "__lance_mem_wal";
