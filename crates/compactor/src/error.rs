//! The crate's error type.

/// Result alias for [`CompactorError`].
pub type Result<T, E = CompactorError> = std::result::Result<T, E>;

/// Why compaction, an index catch-up or garbage collection failed. Every
/// variant names the table (and the shard or SSTable where one is
/// involved).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompactorError {
    /// The request or the table's declaration is unusable (bad schema, bad
    /// sharding spec, a table without the `__lance_mem_wal` index asked to
    /// compact).
    #[error("invalid input for table `{uri}`: {reason}")]
    InvalidInput {
        /// The table location.
        uri: String,
        /// What was wrong.
        reason: String,
    },
    /// Reading the base table (its metadata, its dataset), listing its
    /// shards or reading a shard manifest failed (`memwal_table`).
    #[error(transparent)]
    Table(Box<memwal_table::TableError>),
    /// A shard manifest could not be read (or does not decode).
    #[error("shard {shard} of table `{uri}`: {source}")]
    Manifest {
        /// The table location.
        uri: String,
        /// The shard.
        shard: memwal_fencing::ShardId,
        /// What the manifest store reported.
        #[source]
        source: Box<memwal_fencing::FencingError>,
    },
    /// An SSTable could not be opened or read.
    #[error("SSTable `{dir}` of shard {shard}: {source}")]
    SsTable {
        /// The shard.
        shard: memwal_fencing::ShardId,
        /// The SSTable directory.
        dir: String,
        /// What the SSTable reader reported.
        #[source]
        source: Box<memwal_sstable::SsTableError>,
    },
    /// Listing or deleting objects failed.
    #[error("object store at `{path}`: {source}")]
    Store {
        /// The path involved.
        path: String,
        /// What the store reported.
        #[source]
        source: Box<object_store::Error>,
    },
    /// A lance read, write or commit on the base table failed.
    #[error("{what} on table `{uri}`: {source}")]
    Lance {
        /// The table location.
        uri: String,
        /// The operation.
        what: String,
        /// What lance reported.
        #[source]
        source: Box<lance::Error>,
    },
    /// Concurrent commits kept winning: the step gave up after its retries
    /// (nothing half-applied is recorded as compacted; a rerun continues).
    #[error("table `{uri}`, shard {shard}, generation {generation}: gave up after {attempts} conflicting commits")]
    Contention {
        /// The table location.
        uri: String,
        /// The shard.
        shard: memwal_fencing::ShardId,
        /// The generation being compacted.
        generation: u64,
        /// Attempts made.
        attempts: u32,
    },
    /// Stored data contradicts the format (e.g. an SSTable column with no
    /// base-table field).
    #[error("corrupt data in table `{uri}`: {reason}")]
    Corrupt {
        /// The table location.
        uri: String,
        /// What was found.
        reason: String,
    },
}

impl From<memwal_table::TableError> for CompactorError {
    fn from(e: memwal_table::TableError) -> Self {
        Self::Table(Box::new(e))
    }
}

impl CompactorError {
    pub(crate) fn lance(uri: &str, what: impl Into<String>) -> impl FnOnce(lance::Error) -> Self {
        let (uri, what) = (uri.to_string(), what.into());
        move |source| Self::Lance {
            uri,
            what,
            source: Box::new(source),
        }
    }

    pub(crate) fn invalid(uri: &str, reason: impl Into<String>) -> Self {
        Self::InvalidInput {
            uri: uri.to_string(),
            reason: reason.into(),
        }
    }
}
