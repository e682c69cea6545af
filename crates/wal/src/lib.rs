//! The MemWAL write-ahead log of one shard (docs/memwal-format.md "WAL").
//!
//! - [`codec`]: one Arrow IPC stream per entry with `writer_epoch`,
//!   `generation` and `fence_sentinel` schema metadata; decodes upstream's
//!   shapes too.
//! - [`stamp`]: producer stamps (who sent an append, with what sequence),
//!   recorded per entry (on the entry schema's last field) for
//!   exactly-once retries.
//! - [`WalAppender`]: concurrent appends with group commit; an append
//!   resolves only once durable; positions contiguous, one PUT in flight;
//!   collisions are resolved against the manifest (fenced, sealed, or a
//!   protocol violation) and poison the appender. [`AppendCounts`]: how
//!   many appends were submitted and how many are durable (in submit
//!   order, counted before acknowledged), the writer's visibility
//!   watermark.
//! - [`write_fence_sentinel`]: after a claim, the data-less entry at the
//!   WAL tip that makes the previous writer's next append collide.
//! - [`find_tail`]: the last entry, from the manifest's hint, never below
//!   the replay cursor; read errors are never "missing".
//! - [`replay`]: the entries a new writer must rebuild, exactly up to its
//!   sentinel, with gaps and newer epochs as typed errors.
//!
//! A writer's recovery is: `ManifestStore::claim` -> [`write_fence_sentinel`]
//! -> [`replay`] (rebuild every replayed generation, published in order) ->
//! [`WalAppender::start`] at sentinel + 1 with a generation above every
//! replayed one: a lower one would put newer rows in an older generation
//! and make the next replay fail with a generation going backwards.
//! A drop uses [`seal_and_fence`], not `ManifestStore::seal` alone.

#![warn(missing_docs)]

mod appender;
pub mod codec;
mod commit;
mod error;
mod location;
mod replay;
mod sentinel;
pub mod stamp;
mod tail;

pub use appender::{
    AppendAck, AppendCounts, AppendTicket, GenerationSwitch, SwitchTicket, WalAppender, WalConfig,
};
pub use codec::WalEntry;
pub use error::{WalError, WalResult};
pub use location::WalLocation;
pub use replay::{replay, ReplayEntry, ReplayRange, DEFAULT_REPLAY_PREFETCH};
pub use sentinel::{seal_and_fence, write_fence_sentinel};
pub use stamp::{check_producer_id, ProducerStamp};
pub use tail::{find_tail, find_tail_for};
