//! Object-store access shared by every memwal crate.
//!
//! - [`open_store`] turns a table URI (local path, `file://`, `memory://`,
//!   `s3://`) into an object store plus the table's root path.
//! - [`create_object`] is the one put-if-not-exists primitive: it retries
//!   transient failures with the identical bytes and, on a collision, tells
//!   apart "the object holds exactly our bytes" from "someone else's".
//! - [`read_object`] / [`object_exists`] never read a failure as "absent".

mod error;
mod ops;
mod retry;
mod uri;

pub use error::{StoreError, StoreResult};
pub use object_store::{path::Path, ObjectStore};
pub use ops::{create_object, object_exists, put_overwrite, read_object, CreateOutcome};
pub use retry::RetryPolicy;
pub use uri::{open_store, StoreLocation};

/// True for errors that may pass if the same request is sent again.
///
/// Anything the store reports as a definite answer (missing, exists,
/// precondition, bad path, unsupported, denied) is permanent; generic
/// transport/IO failures and join errors are treated as transient.
pub fn is_transient(err: &object_store::Error) -> bool {
    use object_store::Error as E;
    !matches!(
        err,
        E::NotFound { .. }
            | E::AlreadyExists { .. }
            | E::Precondition { .. }
            | E::NotModified { .. }
            | E::InvalidPath { .. }
            | E::NotSupported { .. }
            | E::NotImplemented { .. }
            | E::PermissionDenied { .. }
            | E::Unauthenticated { .. }
            | E::UnknownConfigurationKey { .. }
    )
}
