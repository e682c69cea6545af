//! The cluster layer's errors.

/// What failed talking to etcd, or in what it holds.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// etcd did not answer, or refused a request.
    #[error("etcd at {endpoints}: {what}: {source}")]
    Etcd {
        /// The endpoints configured.
        endpoints: String,
        /// What was being done.
        what: String,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// The configuration cannot work (no endpoint, a bad address).
    #[error("cluster configuration: {0}")]
    Config(String),
}

impl ClusterError {
    /// Whether retrying later may succeed (etcd unreachable or busy).
    pub fn is_transient(&self) -> bool {
        matches!(self, ClusterError::Etcd { .. })
    }
}
