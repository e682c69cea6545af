use thiserror::Error;

/// Result alias for [`StoreError`].
pub type StoreResult<T> = Result<T, StoreError>;

/// Failures of the object-store layer. Every variant names the URI or path.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The table URI could not be turned into a store.
    #[error("invalid table URI `{uri}`: {reason}")]
    InvalidUri {
        /// The URI as given.
        uri: String,
        /// What was wrong with it.
        reason: String,
    },
    /// A request failed definitively, or (for reads) kept failing until
    /// retries ran out. For a write this is a definite refusal on its first
    /// attempt: nothing was written.
    #[error("object store {op} of `{path}` failed: {source}")]
    Request {
        /// The operation (`get`, `head`, `put`, `list`).
        op: &'static str,
        /// The object path.
        path: String,
        /// The last error the store returned.
        #[source]
        source: object_store::Error,
    },
    /// A write failed in a way after which the object may or may not have
    /// been written (retries ran out, a refusal followed an attempt that may
    /// have landed, a failed fsync): the outcome is unknown.
    #[error("write of `{path}` has an unknown outcome after {attempts} attempts: {source}")]
    OutcomeUnknown {
        /// The object path.
        path: String,
        /// How many PUTs were sent.
        attempts: u32,
        /// The last error the store returned.
        #[source]
        source: object_store::Error,
    },
}

impl StoreError {
    pub(crate) fn request(
        op: &'static str,
        path: &object_store::path::Path,
        source: object_store::Error,
    ) -> Self {
        Self::Request {
            op,
            path: path.to_string(),
            source,
        }
    }
}
