use memwal_store::StoreError;
use thiserror::Error;

use crate::ShardId;

/// Result alias for [`FencingError`].
pub type FencingResult<T> = Result<T, FencingError>;

/// Everything that can go wrong while reading or changing a shard manifest.
#[derive(Debug, Error)]
pub enum FencingError {
    /// A shard id that is not a UUID; rejected before touching storage.
    #[error("invalid shard id `{input}`: {reason}")]
    InvalidShardId {
        /// What was given.
        input: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A newer writer claimed the shard: this writer must stop and
    /// acknowledge nothing more.
    #[error("shard {shard} is fenced: this writer holds epoch {local_epoch}, the manifest has epoch {stored_epoch}")]
    Fenced {
        /// The shard.
        shard: ShardId,
        /// The epoch this writer claimed.
        local_epoch: u64,
        /// The epoch the manifest records.
        stored_epoch: u64,
    },
    /// The shard is SEALED (a drop is in flight): no claims, no writes.
    #[error("shard {shard} is sealed")]
    Sealed {
        /// The shard.
        shard: ShardId,
    },
    /// Another claimer reached our epoch first; this claim did not happen.
    #[error("claim of shard {shard} lost: wanted epoch {wanted_epoch}, another claimer already holds epoch {stored_epoch}")]
    ClaimLost {
        /// The shard.
        shard: ShardId,
        /// The epoch this claim tried to take.
        wanted_epoch: u64,
        /// The epoch found in the colliding manifest.
        stored_epoch: u64,
    },
    /// An operation that needs an existing shard found no manifest.
    #[error("shard {shard} does not exist (no manifest)")]
    ShardNotFound {
        /// The shard.
        shard: ShardId,
    },
    /// The shard exists with a different spec id or shard field values.
    #[error("shard {shard} exists with a different identity: {reason}")]
    IdentityMismatch {
        /// The shard.
        shard: ShardId,
        /// What differs.
        reason: String,
    },
    /// The manifest records an epoch below the one this writer holds: the
    /// store lost a version or another process wrote around the protocol.
    #[error("shard {shard} manifest went backwards: this writer holds epoch {local_epoch}, the manifest has {stored_epoch}")]
    EpochRegressed {
        /// The shard.
        shard: ShardId,
        /// The epoch this writer claimed.
        local_epoch: u64,
        /// The (lower) epoch found.
        stored_epoch: u64,
    },
    /// An object that should be a manifest does not decode, contradicts
    /// its own path, or holds a counter (`version`, `writer_epoch`) at
    /// `u64::MAX` that the next version would have to increment. Never
    /// treated as missing.
    #[error("corrupt shard manifest at `{path}`: {reason}")]
    Corrupt {
        /// The object path.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// Writers kept racing this update until the retry bound ran out.
    #[error("shard {shard}: gave up after {attempts} lost races updating the manifest")]
    Contended {
        /// The shard.
        shard: ShardId,
        /// How many times the update was attempted.
        attempts: u32,
    },
    /// The object store failed (after retries), or a write's outcome is unknown.
    #[error(transparent)]
    Storage(#[from] StoreError),
}

impl FencingError {
    /// True when the write that failed may nevertheless have landed.
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, Self::Storage(StoreError::OutcomeUnknown { .. }))
    }
}
