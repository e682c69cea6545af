//! Shard manifests and epoch fencing for MemWAL (docs/memwal-format.md "Shard manifest").
//!
//! A shard's state lives in immutable, gap-free manifest versions written
//! with put-if-not-exists. [`ManifestStore`] finds the latest version,
//! creates shards, and runs the claim protocol: a writer that [`claim`]s
//! holds the next `writer_epoch`, and every later manifest write checks that
//! epoch against the version it replaces, so a fenced writer can never
//! publish. Guarantees:
//!
//! - a write that collides is re-read and compared byte for byte, so our own
//!   landed write (a retried PUT) is never mistaken for a peer's;
//! - a claim that may or may not have landed is never assumed won;
//! - a manifest that does not decode is [`FencingError::Corrupt`], never
//!   "missing"; a read failure is returned, never "missing";
//! - a SEALED shard refuses claims and writes ([`FencingError::Sealed`]).
//!
//! [`claim`]: ManifestStore::claim

mod codec;
mod error;
mod layout;
mod manifest_store;
mod protocol;
mod shard;

pub use error::{FencingError, FencingResult};
pub use layout::{bitrev64, parse_bitrev64, parse_producers_file, ShardLayout, PRODUCERS_DIR};
pub use manifest_store::ManifestStore;
pub use memwal_proto::{ShardManifest, ShardStatus};
pub use protocol::Claim;
pub use shard::{ShardId, ShardIdentity};
