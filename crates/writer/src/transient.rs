//! Whether a failed storage operation may succeed if tried again: the
//! retry decision of SSTable writes and publishes.

use std::error::Error as StdError;

/// True when `err` (or what it wraps) is a failure that may pass on a
/// retry: a transient object-store error, a lance I/O error or commit
/// conflict. Deterministic failures (invalid input, schema errors,
/// corrupt files, refused permissions, unsupported features) are not.
/// An error with nothing recognisable in its chain counts as transient.
pub(crate) fn is_transient(err: &(dyn StdError + 'static)) -> bool {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(os) = e.downcast_ref::<object_store::Error>() {
            return memwal_store::is_transient(os);
        }
        if let Some(le) = e.downcast_ref::<lance::Error>() {
            if let Some(decided) = lance_transient(le) {
                return decided;
            }
        }
        cur = e.source();
    }
    true
}

/// `Some(answer)` when the lance error kind decides it; `None` to look at
/// what it wraps.
fn lance_transient(e: &lance::Error) -> Option<bool> {
    use lance::Error as L;
    match e {
        L::InvalidInput { .. }
        | L::DatasetAlreadyExists { .. }
        | L::SchemaMismatch { .. }
        | L::CorruptFile { .. }
        | L::NotSupported { .. }
        | L::Internal { .. }
        | L::Arrow { .. }
        | L::Schema { .. }
        | L::FieldNotFound { .. }
        | L::InvalidTableLocation { .. }
        | L::Fenced { .. } => Some(false),
        L::CommitConflict { .. }
        | L::RetryableCommitConflict { .. }
        | L::TooMuchWriteContention { .. }
        | L::Timeout { .. } => Some(true),
        // I/O and wrappers: decided by the object-store error inside, if any.
        _ => None,
    }
}
