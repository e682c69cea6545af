//! Object-store access shared by every memwal crate.
//!
//! - [`open_store`] turns a table URI (local path, `file://`, `memory://`,
//!   `s3://`) into an object store plus the table's root path.
//! - [`create_object`] is the one put-if-not-exists primitive: it retries
//!   transient failures with the identical bytes and, on a collision, tells
//!   apart "the object holds exactly our bytes" from "someone else's".
//!   A definite refusal on the first try is [`StoreError::Request`]; any
//!   failure after which the object may have been written (retries ran out,
//!   a failed fsync) is [`StoreError::OutcomeUnknown`].
//! - [`read_object`] / [`object_exists`] never read a failure as "absent".
//! - [`is_transient`], [`http_status`], [`is_sync_failure`] classify
//!   object_store errors (retry, refusal, unknown outcome);
//!   [`is_transient_cause`] finds one behind a higher layer's error.
//! - [`sweep_staged`] removes the staged files a crash left in a local
//!   store (hidden from LIST, so only the file system shows them).

mod aligned;
mod classify;
mod direct;
mod direct_upload;
mod error;
mod failpoint;
mod ops;
mod retry;
mod staged;
mod uri;

pub use aligned::AlignedWriter;
pub use classify::{http_status, is_sync_failure, is_transient, is_transient_cause};
pub use direct::DIRECT_MIN_BYTES;
pub use error::{StoreError, StoreResult};
pub use failpoint::{broken, crash_point, failpoints_from_env, pause};
pub use object_store::{path::Path, ObjectStore};
pub use ops::{create_object, object_exists, put_overwrite, read_object, CreateOutcome};
pub use retry::RetryPolicy;
pub use staged::{is_staged_name, local_dir, remove_empty_dirs, sweep_staged};
pub use uri::{open_store, StoreLocation};
