//! The one public error type, and how the building blocks' errors map to it.

use std::sync::Arc;

use memwal_fencing::{FencingError, ShardId};
use memwal_memtable::MemTableError;
use memwal_sharding::ShardingError;
use memwal_sstable::SsTableError;
use memwal_store::StoreError;
use memwal_table::TableError;
use memwal_wal::WalError;

/// Result alias for [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A boxed underlying error, cloneable so one terminal error can be handed
/// to every caller.
pub type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Everything a [`crate::ShardWriter`] call can fail with.
///
/// Whether the rows of a failed `put`/`delete` may be durable is part of the
/// kind: only [`Error::OutcomeUnknown`] means "maybe"; for every other kind
/// returned by a write call the rows were not acknowledged and are not in
/// the WAL. ([`Error::Fenced`] and [`Error::Sealed`] make the writer
/// terminal; rows acknowledged before stay in the WAL and the next writer
/// replays them.)
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A newer writer owns the shard. Terminal: every later call returns it.
    #[error("shard {shard} is fenced: this writer holds epoch {local_epoch}, found epoch {stored_epoch} ({context})")]
    Fenced {
        /// The shard.
        shard: ShardId,
        /// The epoch this writer holds (or tried to claim).
        local_epoch: u64,
        /// The newer epoch found.
        stored_epoch: u64,
        /// Where it was detected.
        context: String,
    },
    /// The shard is SEALED (a drop is in flight). Terminal.
    #[error("shard {shard} is sealed ({context})")]
    Sealed {
        /// The shard.
        shard: ShardId,
        /// Where it was detected.
        context: String,
    },
    /// The caller's input or configuration is unusable (wrong schema, null
    /// key, row of another shard, bad config). Nothing was written; the
    /// writer stays usable.
    #[error("invalid input: {reason}")]
    InvalidInput {
        /// What was wrong.
        reason: String,
        /// The building block's error that said so, when one did.
        #[source]
        source: Option<Source>,
    },
    /// A put with a producer sequence ([`crate::ProducerSeq`]) was refused:
    /// the producer's epoch is older than one it already wrote with here
    /// (a newer incarnation fenced it), or the sequence leaves a gap
    /// (`expected` names the next sequence the shard takes). Nothing was
    /// written; the writer stays usable.
    #[error("producer {producer} refused: {reason}")]
    ProducerRefused {
        /// The producer's id.
        producer: String,
        /// Why.
        reason: String,
        /// For a gap: the sequence expected next.
        expected: Option<u64>,
    },
    /// Unflushed data reached `max_unflushed_bytes` and no flush made room
    /// within the backpressure timeout. Nothing was written; retry later.
    #[error("backpressure: {reason}")]
    Backpressure {
        /// Why flushing is stuck (the last flush error, if any).
        reason: String,
    },
    /// A WAL or manifest write failed in a way that may have landed: the
    /// rows may or may not be durable. The writer is terminal; a reopen
    /// (new claim and replay) tells.
    #[error("outcome unknown, rows may be durable: {reason}")]
    OutcomeUnknown {
        /// The failure seen.
        reason: String,
        /// The underlying error.
        #[source]
        source: Option<Source>,
    },
    /// The object store (or lance on top of it) failed after retries.
    #[error("storage failure ({context}): {source}")]
    Storage {
        /// What was being done.
        context: String,
        /// Whether the failure may pass if tried again (a timeout, a 5xx,
        /// a commit conflict), as opposed to a definite refusal or a
        /// deterministic failure (permission denied, invalid data).
        transient: bool,
        /// The underlying error.
        #[source]
        source: Source,
    },
    /// Stored state is inconsistent (undecodable entry, WAL gap, epoch
    /// conflict, manifest going backwards). Never treated as "missing".
    #[error("corrupt or inconsistent shard state: {reason}")]
    Corrupt {
        /// What was found.
        reason: String,
        /// The building block's error that found it, when one did.
        #[source]
        source: Option<Source>,
    },
    /// The writer was closed or aborted (or dropped).
    #[error("shard writer is closed: {reason}")]
    Closed {
        /// How it was closed.
        reason: String,
    },
}

impl Error {
    /// True for [`Error::Fenced`] and [`Error::Sealed`].
    pub fn is_fenced(&self) -> bool {
        matches!(self, Self::Fenced { .. } | Self::Sealed { .. })
    }

    /// True when a failed write's rows may nevertheless be durable.
    pub fn may_be_durable(&self) -> bool {
        matches!(self, Self::OutcomeUnknown { .. })
    }

    /// True when the error leaves the writer unusable (every later call
    /// fails): everything but [`Error::InvalidInput`],
    /// [`Error::ProducerRefused`] and [`Error::Backpressure`].
    pub fn is_terminal(&self) -> bool {
        !matches!(
            self,
            Self::InvalidInput { .. } | Self::ProducerRefused { .. } | Self::Backpressure { .. }
        )
    }

    pub(crate) fn invalid(reason: impl Into<String>) -> Self {
        Self::InvalidInput {
            reason: reason.into(),
            source: None,
        }
    }

    /// [`Error::InvalidInput`] saying `e` (prefixed with `context` when
    /// not empty), keeping `e` as its source.
    pub(crate) fn invalid_from(
        context: &str,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::InvalidInput {
            reason: with_context(context, &e),
            source: Some(Arc::new(e)),
        }
    }

    pub(crate) fn corrupt(reason: impl Into<String>) -> Self {
        Self::Corrupt {
            reason: reason.into(),
            source: None,
        }
    }

    /// [`Error::Corrupt`] saying `e` (prefixed with `context` when not
    /// empty), keeping `e` as its source.
    pub(crate) fn corrupt_from(
        context: &str,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Corrupt {
            reason: with_context(context, &e),
            source: Some(Arc::new(e)),
        }
    }

    /// [`Error::OutcomeUnknown`] saying `e` after `context`, keeping `e`.
    fn unknown_from(context: &str, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::OutcomeUnknown {
            reason: with_context(context, &e),
            source: Some(Arc::new(e)),
        }
    }

    pub(crate) fn closed(reason: impl Into<String>) -> Self {
        Self::Closed {
            reason: reason.into(),
        }
    }

    pub(crate) fn storage(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        let transient = crate::transient::is_transient(&source);
        Self::Storage {
            context: context.into(),
            transient,
            source: Arc::new(source),
        }
    }

    /// Maps a manifest error seen while doing `context`.
    pub(crate) fn from_fencing(e: FencingError, context: &str) -> Self {
        match e {
            FencingError::Fenced {
                shard,
                local_epoch,
                stored_epoch,
            } => Self::Fenced {
                shard,
                local_epoch,
                stored_epoch,
                context: context.into(),
            },
            FencingError::ClaimLost {
                shard,
                wanted_epoch,
                stored_epoch,
            } => Self::Fenced {
                shard,
                local_epoch: wanted_epoch,
                stored_epoch,
                context: format!("{context}: claim lost to a concurrent claimer"),
            },
            FencingError::Sealed { shard } => Self::Sealed {
                shard,
                context: context.into(),
            },
            e @ (FencingError::InvalidShardId { .. }
            | FencingError::ShardNotFound { .. }
            | FencingError::IdentityMismatch { .. }) => Self::invalid_from(context, e),
            e @ (FencingError::EpochRegressed { .. } | FencingError::Corrupt { .. }) => {
                Self::corrupt_from(context, e)
            }
            FencingError::Storage(s) => Self::from_store(s, context),
            e @ FencingError::Contended { .. } => Self::storage(context, e),
        }
    }

    /// Maps an object-store error seen while doing `context`.
    pub(crate) fn from_store(e: StoreError, context: &str) -> Self {
        match e {
            e @ StoreError::OutcomeUnknown { .. } => Self::unknown_from(context, e),
            e => Self::storage(context, e),
        }
    }

    /// Maps a WAL error seen while doing `context`.
    pub(crate) fn from_wal(e: WalError, context: &str) -> Self {
        match e {
            WalError::Fenced {
                shard,
                local_epoch,
                stored_epoch,
            } => Self::Fenced {
                shard,
                local_epoch,
                stored_epoch,
                context: context.into(),
            },
            WalError::Sealed { shard } => Self::Sealed {
                shard,
                context: context.into(),
            },
            e @ WalError::OutcomeUnknown { .. } => Self::unknown_from(context, e),
            e @ (WalError::Corrupt { .. }
            | WalError::Gap { .. }
            | WalError::EpochConflict { .. }) => Self::corrupt_from(context, e),
            e @ WalError::InvalidInput { .. } => Self::invalid_from(context, e),
            // Validated rows that arrow cannot encode: nothing was written,
            // and the appender is poisoned (the writer is terminal).
            e @ WalError::Unencodable { .. } => Self::Storage {
                context: context.into(),
                transient: false,
                source: Arc::new(e),
            },
            WalError::Closed => Self::closed(format!("{context}: WAL appender is closed")),
            WalError::Fencing(f) => match Arc::try_unwrap(f) {
                Ok(f) => Self::from_fencing(f, context),
                Err(f) => Self::Storage {
                    context: context.into(),
                    transient: crate::transient::is_transient(f.as_ref()),
                    source: f,
                },
            },
            e @ (WalError::Storage(_) | WalError::Contended { .. }) => Self::storage(context, e),
        }
    }

    /// Maps a memtable validation error (always the caller's input).
    pub(crate) fn from_memtable(e: MemTableError) -> Self {
        Self::invalid_from("", e)
    }

    /// Maps a sharding error (a row of another shard, or an unusable spec).
    pub(crate) fn from_sharding(e: ShardingError) -> Self {
        Self::invalid_from("", e)
    }

    /// Maps a base-table error (opening the table, reading its MemWAL index).
    pub(crate) fn from_table(e: TableError) -> Self {
        match e {
            e @ (TableError::NotFound { .. }
            | TableError::Unsupported { .. }
            | TableError::InvalidInput { .. }) => Self::invalid_from("", e),
            e @ TableError::Corrupt { .. } => Self::corrupt_from("", e),
            e @ (TableError::Read { .. }
            | TableError::Manifest { .. }
            | TableError::Store { .. }) => Self::storage("opening the base table", e),
        }
    }

    /// Maps an SSTable error seen while doing `context`.
    pub(crate) fn from_sstable(e: SsTableError, context: &str) -> Self {
        match e {
            e @ SsTableError::Corrupt { .. } => Self::corrupt_from(context, e),
            e => Self::storage(context, e),
        }
    }
}

/// `e`'s text after `context` (`context: e`), or alone for an empty one.
fn with_context(context: &str, e: &dyn std::error::Error) -> String {
    if context.is_empty() {
        e.to_string()
    } else {
        format!("{context}: {e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Breaks if a kind made from a building block's error keeps only its
    // text: callers (and error reporters walking `source()`) lose the
    // typed cause.
    #[test]
    fn corrupt_outcome_unknown_and_invalid_input_keep_their_source() {
        let unknown = StoreError::OutcomeUnknown {
            path: "p".into(),
            attempts: 2,
            source: object_store::Error::NotFound {
                path: "p".into(),
                source: "gone".into(),
            },
        };
        let corrupt = TableError::Corrupt {
            uri: "t".into(),
            reason: "bad".into(),
        };
        let cases = [
            Error::from_memtable(MemTableError::EmptyBatch),
            Error::from_store(unknown, "writing"),
            Error::from_table(corrupt),
        ];
        for e in &cases {
            let source = std::error::Error::source(e);
            assert!(source.is_some(), "{e:?} lost its source");
        }
        assert!(matches!(cases[0], Error::InvalidInput { .. }));
        assert!(cases[1].may_be_durable());
        assert!(matches!(cases[2], Error::Corrupt { .. }));
    }
}
