//! Errors shaped exactly like the ones object_store produces, for fault
//! hooks ([`crate::Action::FailWith`], [`crate::Action::LandThenFailWith`]).
//!
//! object_store's own error types for these cases are private, so each is
//! mimicked by a type with the same `Display` text and source chain, wrapped
//! in the same public variant with the same store name.

use std::error::Error as StdError;
use std::fmt;
use std::io;

/// An error with a fixed text and an optional source.
#[derive(Debug)]
struct Shaped {
    text: String,
    source: Option<Box<dyn StdError + Send + Sync>>,
}

impl fmt::Display for Shaped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl StdError for Shaped {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(5) // EIO, what a failing disk reports
}

/// A failed fsync as object_store 0.14's `LocalFileSystem` reports it:
/// `Error::Generic { store: "LocalFileSystem", source }` whose source is
/// `local::Error::UnableToSyncFile` ("Unable to sync data to disk for
/// {path}: {io error}") carrying the `io::Error`.
pub fn local_sync_error(fs_path: &str) -> object_store::Error {
    let io = eio();
    object_store::Error::Generic {
        store: "LocalFileSystem",
        source: Box::new(Shaped {
            text: format!("Unable to sync data to disk for {fs_path}: {io}"),
            source: Some(Box::new(io)),
        }),
    }
}

/// A failed publish step as object_store 0.14's `LocalFileSystem` reports
/// it: `local::Error::UnableToRenameFile` ("Unable to rename file: {io
/// error}") inside `Error::Generic { store: "LocalFileSystem" }`. 0.14 also
/// reports a failed fsync of the parent directory after a create's hard
/// link (the object is then in place, but not durable) this way.
pub fn local_rename_error() -> object_store::Error {
    let io = eio();
    object_store::Error::Generic {
        store: "LocalFileSystem",
        source: Box::new(Shaped {
            text: format!("Unable to rename file: {io}"),
            source: Some(Box::new(io)),
        }),
    }
}

/// object_store's private `RetryError` for an HTTP answer `status reason`
/// (e.g. `400`, `"Bad Request"`), with its inner `RequestError::Status` as
/// source.
fn retry_error(status: u16, reason: &str) -> Shaped {
    let inner = Shaped {
        text: format!(
            "Server returned non-2xx status code: {status} {reason}: \
             <Error><Code>injected</Code></Error>"
        ),
        source: None,
    };
    Shaped {
        text: format!(
            "Error performing PUT http://127.0.0.1:5555/memwal-test/injected in 2.1ms - {inner}"
        ),
        source: Some(Box::new(inner)),
    }
}

/// An HTTP error answer that object_store's S3 client passes on as
/// `Error::Generic { store: "S3", source: RetryError }` (every status but
/// 304, 401, 403, 404, 409 and 412, which get their own variants); e.g.
/// `http_status_error(400, "Bad Request")`.
pub fn http_status_error(status: u16, reason: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: Box::new(retry_error(status, reason)),
    }
}

/// An HTTP 403 as object_store's S3 client reports it:
/// `Error::PermissionDenied` with the `RetryError` as source.
pub fn permission_denied(path: &str) -> object_store::Error {
    object_store::Error::PermissionDenied {
        path: path.to_string(),
        source: Box::new(retry_error(403, "Forbidden")),
    }
}
