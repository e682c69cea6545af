//! The crate's error type.

use memwal_fencing::ShardId;

/// Result alias for [`TableError`].
pub type Result<T, E = TableError> = std::result::Result<T, E>;

/// Why a base table could not be created, read or used, or its shards not
/// listed. Every variant names the table (and the shard where one is
/// involved); storage and lance failures keep their source.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// No Lance dataset exists at the table's location.
    #[error("no Lance table at `{uri}`")]
    NotFound {
        /// The table location.
        uri: String,
    },
    /// The dataset or its indexes could not be read (storage or lance).
    #[error("reading the base table at `{uri}`: {source}")]
    Read {
        /// The table location.
        uri: String,
        /// What lance reported.
        #[source]
        source: lance::Error,
    },
    /// Stored table metadata does not decode or contradicts itself.
    #[error("corrupt base table metadata at `{uri}`: {reason}")]
    Corrupt {
        /// The table location.
        uri: String,
        /// What was found.
        reason: String,
    },
    /// The table declares something this implementation cannot honour.
    #[error("unsupported base table at `{uri}`: {reason}")]
    Unsupported {
        /// The table location.
        uri: String,
        /// What it declares.
        reason: String,
    },
    /// A table to create is unusable (one exists there already, lance
    /// refuses the schema or the sharding spec).
    #[error("invalid input for table `{uri}`: {reason}")]
    InvalidInput {
        /// The table location.
        uri: String,
        /// What was wrong.
        reason: String,
    },
    /// A shard manifest could not be read (or does not decode).
    #[error("shard {shard} of table `{uri}`: {source}")]
    Manifest {
        /// The table location.
        uri: String,
        /// The shard.
        shard: ShardId,
        /// What the manifest store reported.
        #[source]
        source: Box<memwal_fencing::FencingError>,
    },
    /// Listing the table's shards failed.
    #[error("object store at `{path}`: {source}")]
    Store {
        /// The path listed.
        path: String,
        /// What the store reported.
        #[source]
        source: Box<object_store::Error>,
    },
}

impl TableError {
    /// Whether the failure is a storage failure that may pass if the read
    /// is tried again: the first object_store error behind it is transient
    /// by [`memwal_store::is_transient`] (timeouts, connection failures,
    /// throttling, 5xx). False for everything else: a missing or corrupt
    /// table, a refusal, a lance failure that names no store error.
    pub fn is_transient(&self) -> bool {
        memwal_store::is_transient_cause(self)
    }
}
