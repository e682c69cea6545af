//! Reading object_store errors: which may pass on a retry, which are
//! definite refusals, and which leave a write's outcome unknown.

use std::error::Error as StdError;

/// True for errors that may pass if the same request is sent again.
///
/// Permanent (false): every answer the store gives as a definite variant
/// (missing, exists, precondition, not modified, bad path, unsupported,
/// denied, unauthenticated, bad configuration); a local write refused
/// before anything was published ([`refused_errno`]: no room, no
/// permission, a read-only file system; or a new directory that could not
/// be synced), which a retry would only repeat; any HTTP 4xx status other
/// than 408 (timeout), 429 (throttled) and S3's `400 RequestTimeout` (the
/// upload stalled), found with [`http_status`]; and a failed fsync
/// ([`is_sync_failure`]), which a retry cannot undo.
/// Everything else (transport and IO failures, 5xx, join errors) is
/// treated as transient.
pub fn is_transient(err: &object_store::Error) -> bool {
    use object_store::Error as E;
    if matches!(
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
    ) {
        return false;
    }
    if is_sync_failure(err) {
        return false;
    }
    if refused_locally(err) {
        return false;
    }
    match http_status(err) {
        Some(408 | 429) => true,
        Some(400) => chain(err).any(|link| link.to_string().contains(S3_REQUEST_TIMEOUT)),
        Some(status) => !(400..500).contains(&status),
        None => true,
    }
}

/// True when the first object_store error in `err`'s source chain
/// (`err` itself included, boxed or not) is [`is_transient`]: a failure of
/// a higher layer (a manifest read, a lance read) that a retry of the whole
/// operation may pass. False when the chain holds no object_store error
/// (nothing says storage failed, so nothing says a retry helps).
pub fn is_transient_cause(err: &(dyn StdError + 'static)) -> bool {
    std::iter::successors(Some(err), |e: &&(dyn StdError + 'static)| (*e).source())
        .find_map(|link| {
            link.downcast_ref::<object_store::Error>().or_else(|| {
                link.downcast_ref::<Box<object_store::Error>>()
                    .map(|b| &**b)
            })
        })
        .is_some_and(is_transient)
}

/// S3 answers an upload that stalled mid-body with `400 Bad Request` and
/// this error code: nothing was stored and the request may be sent again.
const S3_REQUEST_TIMEOUT: &str = "<Code>RequestTimeout</Code>";

/// The text object_store's HTTP client error (`client::retry::RequestError::Status`)
/// puts before the status, e.g. `Server returned non-2xx status code: 400 Bad Request: …`.
const HTTP_STATUS_PREFIX: &str = "Server returned non-2xx status code: ";

/// The HTTP status the server answered a failed request with, when the
/// error carries one.
///
/// object_store turns 401, 403, 404, 304, 409 and 412 into their own
/// variants, but every other status arrives as `Error::Generic` whose
/// source is its private `RetryError`; the only public trace of the status
/// is that error's text ("Server returned non-2xx status code: 400 Bad
/// Request: …"). So the source chain is walked and the first link whose
/// text holds that phrase followed by a 3-digit status (100-599) decides.
pub fn http_status(err: &object_store::Error) -> Option<u16> {
    chain(err).find_map(|link| {
        let text = link.to_string();
        let at = text.find(HTTP_STATUS_PREFIX)? + HTTP_STATUS_PREFIX.len();
        let digits = text.get(at..at + 3)?;
        let status: u16 = digits.parse().ok()?;
        let ends = text[at + 3..]
            .chars()
            .next()
            .is_none_or(|c| !c.is_ascii_digit());
        ((100..600).contains(&status) && ends).then_some(status)
    })
}

/// Texts of object_store's `LocalFileSystem` errors after which a write may
/// have reached the file system without being made durable.
const UNSYNCED_WRITE_PREFIXES: [&str; 2] = [
    // `local::Error::UnableToSyncFile`: a file or directory fsync failed.
    "Unable to sync data to disk",
    // `local::Error::UnableToRenameFile`: publishing the staged file failed.
    // object_store 0.14 also reports the fsync of the parent directory
    // that follows a successful link or rename this way.
    "Unable to rename file",
];

/// True when `err` says a local write failed at or after its fsync: the
/// object may already be in place (object_store links it before it syncs
/// the directory) yet not durable, and a failed fsync cannot be retried
/// into durability (the kernel may have dropped the dirty pages and will
/// not report the loss again). Such a write's outcome is unknown, and a
/// retry that finds our bytes must not call them ours-and-durable.
///
/// object_store's `LocalFileSystem` (with `with_fsync(true)`) reports these
/// failures as `Error::Generic { store: "LocalFileSystem", .. }` whose
/// source is its private `local::Error`, so they are recognised by the text
/// a link of the source chain starts with ("Unable to sync data to disk
/// for …", "Unable to rename file: …"). The local store `open_store`
/// returns for a path reports its own direct writes' fsync and publish
/// failures as a typed error inside `Error::Generic`, recognised by type.
pub fn is_sync_failure(err: &object_store::Error) -> bool {
    chain(err).any(|link| {
        if let Some(direct) = link.downcast_ref::<crate::direct::DirectWriteError>() {
            return direct.may_have_landed();
        }
        let text = link.to_string();
        UNSYNCED_WRITE_PREFIXES
            .iter()
            .any(|prefix| text.starts_with(prefix))
    })
}

/// Errors a local file system gives when it refuses a write outright:
/// no room (`ENOSPC`, `EDQUOT`), no permission (`EPERM`, `EACCES`), a
/// read-only file system (`EROFS`). The refused call did nothing.
pub(crate) fn refused_errno(e: &std::io::Error) -> bool {
    use rustix::io::Errno;
    [
        Errno::NOSPC,
        Errno::DQUOT,
        Errno::PERM,
        Errno::ACCESS,
        Errno::ROFS,
    ]
    .iter()
    .any(|errno| e.raw_os_error() == Some(errno.raw_os_error()))
}

/// A local write that failed before publishing anything, in a way a
/// retry would repeat: a direct write's definite failure, or an
/// `io::Error` of [`refused_errno`] inside object_store's local errors
/// (whose "may have landed" failures [`is_sync_failure`] catches first).
fn refused_locally(err: &object_store::Error) -> bool {
    chain(err).any(|link| {
        if let Some(direct) = link.downcast_ref::<crate::direct::DirectWriteError>() {
            return direct.is_definite();
        }
        link.downcast_ref::<std::io::Error>()
            .is_some_and(refused_errno)
    })
}

/// `err` followed by its sources, outermost first.
fn chain<'a>(err: &'a object_store::Error) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    let first: &'a (dyn StdError + 'static) = err;
    std::iter::successors(Some(first), |e: &&'a (dyn StdError + 'static)| {
        (*e).source()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt;

    /// An error whose text and source mimic a private object_store error.
    #[derive(Debug)]
    struct Mimic(String, Option<Box<dyn StdError + Send + Sync>>);

    impl fmt::Display for Mimic {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl StdError for Mimic {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            self.1.as_deref().map(|e| e as &(dyn StdError + 'static))
        }
    }

    fn generic(store: &'static str, text: &str) -> object_store::Error {
        object_store::Error::Generic {
            store,
            source: Box::new(Mimic(text.into(), None)),
        }
    }

    fn status(code: &str) -> object_store::Error {
        let inner = Mimic(
            format!("Server returned non-2xx status code: {code}: body"),
            None,
        );
        let retry = Mimic(
            format!("Error performing PUT http://h/k in 3ms - {}", inner.0),
            Some(Box::new(inner)),
        );
        object_store::Error::Generic {
            store: "S3",
            source: Box::new(retry),
        }
    }

    // Breaks if the status is not found behind object_store's wrappers, or
    // if a number that merely starts like a status is taken for one.
    #[test]
    fn http_status_is_read_from_the_source_chain() {
        assert_eq!(http_status(&status("400 Bad Request")), Some(400));
        assert_eq!(http_status(&status("503 Service Unavailable")), Some(503));
        assert_eq!(http_status(&status("4000 nonsense")), None);
        assert_eq!(http_status(&generic("S3", "connection reset")), None);
    }

    // Breaks if a 4xx refusal is retried as transient (the retry would turn
    // a refusal into an unknown outcome), or if 408/429/5xx stop being retried.
    #[test]
    fn client_errors_are_permanent_except_timeout_and_throttling() {
        let stalled = status("400 Bad Request: <Error><Code>RequestTimeout</Code></Error>");
        assert!(is_transient(&stalled));
        for code in ["400 Bad Request", "403 Forbidden", "411 Length Required"] {
            assert!(!is_transient(&status(code)), "{code}");
        }
        for code in [
            "408 Request Timeout",
            "429 Too Many Requests",
            "500 Internal Server Error",
            "503 Slow Down",
        ] {
            assert!(is_transient(&status(code)), "{code}");
        }
        assert!(is_transient(&generic("S3", "connection reset")));
    }

    // Breaks if an object_store error wrapped by a higher layer (boxed or
    // not, behind other links) is not found, or if an error without one
    // in its chain is called transient.
    #[test]
    fn a_transient_store_error_is_found_behind_its_wrappers() {
        let wrap = |inner: object_store::Error| Mimic("reading it".into(), Some(Box::new(inner)));
        assert!(is_transient_cause(&wrap(generic("S3", "connection reset"))));
        assert!(is_transient_cause(&Box::new(status("503 Slow Down"))));
        assert!(!is_transient_cause(&wrap(status("403 Forbidden"))));
        assert!(!is_transient_cause(&Mimic("no store error".into(), None)));
    }

    // Breaks if a failed fsync is retried (a retry would find our unsynced
    // bytes and call them durable) or not recognised behind `Generic`.
    #[test]
    fn sync_failures_are_recognised_and_permanent() {
        let sync = generic(
            "LocalFileSystem",
            "Unable to sync data to disk for /t/x#1: Input/output error (os error 5)",
        );
        let rename = generic(
            "LocalFileSystem",
            "Unable to rename file: Input/output error (os error 5)",
        );
        for e in [&sync, &rename] {
            assert!(is_sync_failure(e), "{e}");
            assert!(!is_transient(e), "{e}");
        }
        assert!(!is_sync_failure(&generic("S3", "connection reset")));
    }
}
