//! The one error type of this crate.

use memwal_memtable::MemTableError;

/// Result alias of this crate.
pub type Result<T, E = SsTableError> = std::result::Result<T, E>;

/// Everything that can go wrong writing or reading an SSTable. Every variant
/// names the object-store path (SSTable directory or file) it concerns.
#[derive(Debug, thiserror::Error)]
pub enum SsTableError {
    /// The flush input cannot be written as an SSTable (empty, rows that do
    /// not match the storage schema, inconsistent key data).
    #[error("cannot write SSTable {path}: {reason}")]
    InvalidInput {
        /// SSTable directory.
        path: String,
        /// What is wrong with the input.
        reason: String,
    },
    /// A Lance operation (dataset write/commit/open/scan, index build or
    /// probe) failed.
    #[error("lance failed on {path}: {source}")]
    Lance {
        /// Path the operation was about.
        path: String,
        /// Lance's error.
        #[source]
        source: lance_core::Error,
    },
    /// A direct object-store operation failed (bloom filter put/get).
    #[error("object store failed on {path}: {source}")]
    Store {
        /// Object path.
        path: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
    /// An Arrow kernel failed while preparing rows or keys.
    #[error("arrow failed on {path}: {source}")]
    Arrow {
        /// SSTable directory.
        path: String,
        /// Arrow's error.
        #[source]
        source: arrow_schema::ArrowError,
    },
    /// A key could not be encoded or hashed.
    #[error("key error on {path}: {source}")]
    Key {
        /// SSTable directory.
        path: String,
        /// The key codec's error.
        #[source]
        source: MemTableError,
    },
    /// What is stored does not look like an SSTable this crate can read, or
    /// a freshly written one failed its read-back check.
    #[error("corrupt SSTable {path}: {reason}")]
    Corrupt {
        /// SSTable directory or file.
        path: String,
        /// What was found.
        reason: String,
    },
}

impl SsTableError {
    pub(crate) fn lance(path: impl ToString) -> impl FnOnce(lance_core::Error) -> Self {
        let path = path.to_string();
        move |source| Self::Lance { path, source }
    }

    pub(crate) fn store(path: impl ToString) -> impl FnOnce(object_store::Error) -> Self {
        let path = path.to_string();
        move |source| Self::Store { path, source }
    }

    pub(crate) fn arrow(path: impl ToString) -> impl FnOnce(arrow_schema::ArrowError) -> Self {
        let path = path.to_string();
        move |source| Self::Arrow { path, source }
    }

    pub(crate) fn key(path: impl ToString) -> impl FnOnce(MemTableError) -> Self {
        let path = path.to_string();
        move |source| Self::Key { path, source }
    }

    pub(crate) fn corrupt(path: impl ToString, reason: impl Into<String>) -> Self {
        Self::Corrupt {
            path: path.to_string(),
            reason: reason.into(),
        }
    }

    pub(crate) fn invalid(path: impl ToString, reason: impl Into<String>) -> Self {
        Self::InvalidInput {
            path: path.to_string(),
            reason: reason.into(),
        }
    }
}
