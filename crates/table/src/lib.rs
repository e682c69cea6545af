//! The base table a MemWAL belongs to (docs/memwal-format.md "Compaction into the base
//! table"): its schema with Lance field ids and primary key, its data
//! storage version, and the configuration the `__lance_mem_wal` system
//! index carries (sharding specs, writer defaults, compaction progress).
//!
//! Every writer, compactor and the daemon reads the table through
//! [`BaseTable::load`], so they agree on what the table declares.
//!
//! Also here, for readers, the daemon and the compactor alike: creating a
//! base table with the MemWAL index ([`create_table`], [`install_mem_wal`]),
//! listing its shards and their manifests ([`list_shards`],
//! [`latest_manifest`]), and the read view a reader should use
//! ([`table_view`]): the base plus the SSTables it does not contain yet.

#![warn(missing_docs)]

mod error;
mod init;
mod load;
mod maintained;
mod shards;
mod view;

pub use error::{Result, TableError};
pub use init::{create_table, install_mem_wal, open_dataset, TableSharding};
pub use load::BaseTable;
pub use maintained::{BaseIndex, MaintainedIndexes};
pub use shards::{compacted_generations, index_caught_up, latest_manifest, list_shards};
pub use view::{table_view, ShardView, TableView};

/// Name of the system index that holds a table's MemWAL configuration.
pub const MEM_WAL_INDEX_NAME: &str = "__lance_mem_wal";
