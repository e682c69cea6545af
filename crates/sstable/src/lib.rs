//! MemWAL SSTables (docs/memwal-format.md "SSTable"): a frozen memtable flushed as a
//! Lance dataset directory `{random8hex}_gen_{g}` under the shard directory,
//! with a bloom filter (`bloom_filter.bin`) and a primary-key BTree
//! (`_pk_index/`) that upstream lance's LSM scanner and point-lookup planner
//! read.
//!
//! - [`SsTableWriter`]: writes one generation from a memtable's
//!   [`memwal_memtable::FlushData`]; durable through the given store before
//!   it returns; returns the manifest's `SsTable` entry.
//! - [`SsTableReader`]: point lookup (bloom, then index) and visible-row scan.
//! - [`LanceStore`]: how lance is made to read and write through our
//!   object store (a private URI scheme in the session's store registry).
//!
//! The bloom filter is sized by default exactly as upstream sizes it (8192
//! keys, fpp 0.00057, 32 KiB) whatever the row count, so memtables far above
//! 8192 keys get a filter with a much higher false-positive rate (about 0.69
//! at 100k keys; never false negatives).
//! [`SsTableWriter::with_bloom_sizing`] sizes it for more keys; upstream
//! readers accept any size.
//!
//! Data files are written without compression by default
//! ([`SsTableCompression`]): a flush is CPU the write path competes with,
//! and the compactor re-encodes the rows into the base table anyway.
//!
//! Our point lookup trusts a bloom "absent" only for keys made of Int32,
//! Int64, Utf8 and Binary columns: upstream lance 14.0.2's writer hashes
//! other key types by their null flag alone, so for them (in SSTables from
//! either writer) the lookup always goes on to `_pk_index/`.

mod bloom;
mod dataset;
mod error;
mod indexes;
mod lance_store;
mod pk_index;
mod reader;
mod writer;

pub use bloom::{decode_filter, BloomSizing, BLOOM_EXPECTED_KEYS, BLOOM_FILTER_FILE, BLOOM_FPP};
pub use dataset::{lance_schema, SsTableCompression};
pub use error::{Result, SsTableError};
pub use indexes::{DistanceType, IndexKind, IndexSpec, VectorIndexSpec};
pub use lance_file::version::LanceFileVersion;
pub use lance_store::LanceStore;
pub use pk_index::{PK_INDEX_DIR, PK_INDEX_PAGE_ROWS};
pub use reader::{Lookup, SsTableReader};
pub use writer::{SsTableWriter, WrittenSsTable};
