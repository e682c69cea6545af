//! The one error type of the WAL crate.

use std::sync::Arc;

use memwal_fencing::{FencingError, ShardId};
use memwal_store::StoreError;
use thiserror::Error;

/// Result alias for [`WalError`].
pub type WalResult<T> = Result<T, WalError>;

/// Everything that can go wrong writing, discovering or replaying a WAL.
///
/// The type is `Clone` (non-cloneable sources are behind `Arc`) so an
/// appender that is poisoned can hand the same error to every waiter.
///
/// Whether the rows of a failed append may be durable is part of the
/// variant: only [`WalError::OutcomeUnknown`] says "maybe"; every other
/// variant returned for an append means its rows were not written
/// (see [`WalError::may_be_durable`]).
#[derive(Debug, Clone, Error)]
pub enum WalError {
    /// A newer writer claimed the shard. The writer must stop; nothing more
    /// is acknowledged.
    #[error("shard {shard} is fenced: this writer holds epoch {local_epoch}, found epoch {stored_epoch}")]
    Fenced {
        /// The shard.
        shard: ShardId,
        /// The epoch this writer holds.
        local_epoch: u64,
        /// The higher epoch found (in the manifest or in a WAL entry).
        stored_epoch: u64,
    },
    /// The shard is SEALED (a drop is in flight): no more writes.
    #[error("shard {shard} is sealed")]
    Sealed {
        /// The shard.
        shard: ShardId,
    },
    /// Retries ran out on a PUT that may have landed: the entry at
    /// `position` may or may not exist, so the rows of the appends it
    /// carried may be durable. Only recovery (a new claim and replay) can tell.
    #[error("WAL entry {position} of shard {shard} (`{path}`) has an unknown outcome, its rows may be durable: {reason}")]
    OutcomeUnknown {
        /// The shard.
        shard: ShardId,
        /// The position whose PUT outcome is unknown.
        position: u64,
        /// The object path.
        path: String,
        /// The last failure seen.
        reason: String,
    },
    /// An object at a WAL position is not a valid entry (does not decode,
    /// is truncated, lacks or garbles `writer_epoch`/`generation`).
    /// Never treated as missing.
    #[error("corrupt WAL entry {position} of shard {shard} at `{path}`: {reason}")]
    Corrupt {
        /// The shard.
        shard: ShardId,
        /// The position.
        position: u64,
        /// The object path.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// Our PUT at `position` collided with an entry that the manifest does
    /// not explain as a newer writer's: another process wrote with our
    /// epoch (two writers believe they own it), or an older writer wrote
    /// above our fence sentinel. Protocol violation; the appender stops.
    #[error("WAL entry {position} of shard {shard} (`{path}`) holds other bytes written at epoch {found_epoch} while this writer owns epoch {epoch}")]
    EpochConflict {
        /// The shard.
        shard: ShardId,
        /// The contested position.
        position: u64,
        /// The object path.
        path: String,
        /// The epoch this writer holds.
        epoch: u64,
        /// The epoch recorded in the entry found there.
        found_epoch: u64,
    },
    /// A position below the replay end is missing: entries were lost or
    /// deleted. Never mistaken for the end of the WAL.
    #[error("WAL of shard {shard} has a gap: entry {position} (`{path}`) is missing")]
    Gap {
        /// The shard.
        shard: ShardId,
        /// The missing position.
        position: u64,
        /// The path that does not exist.
        path: String,
    },
    /// The caller passed something unusable (empty append, batches with
    /// different schemas, a generation that does not grow). Nothing was
    /// written and the appender goes on.
    #[error("invalid WAL input: {reason}")]
    InvalidInput {
        /// What was wrong.
        reason: String,
    },
    /// Arrow could not encode the appends grouped for the entry at
    /// `position` as an IPC stream. Nothing was written at or after it, and
    /// the appender is poisoned: the caller may already hold those rows in
    /// memory, so every pending and later append and generation switch
    /// fails with this error rather than letting later entries (or a
    /// generation switch that publishes) follow rows that were never logged.
    #[error("WAL entry {position} of shard {shard} could not be encoded, nothing was written and the appender is stopped: {reason}")]
    Unencodable {
        /// The shard.
        shard: ShardId,
        /// The position the entry would have taken.
        position: u64,
        /// What arrow reported.
        reason: String,
    },
    /// The fence sentinel kept colliding with entries landing ahead of it.
    #[error("shard {shard}: fence sentinel found no free WAL slot after {attempts} collisions")]
    Contended {
        /// The shard.
        shard: ShardId,
        /// Collisions seen.
        attempts: u32,
    },
    /// The object store failed definitively (after retries). For an append
    /// this means the PUT did not land.
    #[error(transparent)]
    Storage(Arc<StoreError>),
    /// Reading the manifest failed in a way not covered above.
    #[error(transparent)]
    Fencing(Arc<FencingError>),
    /// The appender was closed or dropped before the request was written.
    #[error("WAL appender is closed")]
    Closed,
}

impl WalError {
    /// True when the failed append's rows may nevertheless be durable.
    pub fn may_be_durable(&self) -> bool {
        matches!(self, Self::OutcomeUnknown { .. })
    }

    /// True for [`WalError::Fenced`] and [`WalError::Sealed`]: another
    /// process owns (or is dropping) the shard.
    pub fn is_fenced(&self) -> bool {
        matches!(self, Self::Fenced { .. } | Self::Sealed { .. })
    }

    pub(crate) fn invalid(reason: impl Into<String>) -> Self {
        Self::InvalidInput {
            reason: reason.into(),
        }
    }
}

impl From<StoreError> for WalError {
    fn from(e: StoreError) -> Self {
        Self::Storage(Arc::new(e))
    }
}

impl From<FencingError> for WalError {
    /// Fenced/Sealed/storage failures keep their meaning; the rest are wrapped.
    fn from(e: FencingError) -> Self {
        match e {
            FencingError::Fenced {
                shard,
                local_epoch,
                stored_epoch,
            } => Self::Fenced {
                shard,
                local_epoch,
                stored_epoch,
            },
            FencingError::Sealed { shard } => Self::Sealed { shard },
            FencingError::Storage(s) => Self::Storage(Arc::new(s)),
            other => Self::Fencing(Arc::new(other)),
        }
    }
}
