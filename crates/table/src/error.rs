//! The crate's error type.

/// Result alias for [`TableError`].
pub type Result<T, E = TableError> = std::result::Result<T, E>;

/// Why a base table could not be read or used.
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
}
