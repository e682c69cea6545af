//! How `create_object` and `put_overwrite` report failures, with errors
//! injected in exactly the shapes object_store produces: a failed fsync is
//! an unknown outcome at once (never retried into `Identical`), a refusal
//! on the first attempt is a refusal, never an unknown outcome.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use memwal_store::{
    create_object, open_store, put_overwrite, read_object, CreateOutcome, Path, RetryPolicy,
    StoreError,
};
use memwal_testkit::{
    http_status_error, local_rename_error, local_sync_error, permission_denied, Action, FaultStore,
    InjectError, OpKind,
};
use object_store::ObjectStore;

/// A local store with fsync (what `open_store` gives for a path) and its
/// directory.
fn local() -> (Arc<dyn ObjectStore>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path().to_str().unwrap()).unwrap().store;
    (store, dir)
}

/// The first PUT to `path` gets `first`, later ones `rest`; everything
/// else passes.
fn on_puts(faulty: &FaultStore, path: &Path, first: Action, rest: Action) {
    let path = path.to_string();
    let fired = Arc::new(AtomicUsize::new(0));
    faulty.set_hook(move |op| {
        if op.kind != OpKind::Put || op.path != path {
            Action::Pass
        } else if fired.fetch_add(1, Ordering::SeqCst) == 0 {
            first.clone()
        } else {
            rest.clone()
        }
    });
}

/// object_store's two local shapes of "written, maybe not durable": a
/// failed fsync (`UnableToSyncFile`) and a failed publish step
/// (`UnableToRenameFile`, which 0.14 also uses for the directory fsync
/// after a create's hard link).
fn sync_failures(fs_path: &std::path::Path) -> Vec<(&'static str, InjectError)> {
    let shown = fs_path.join("sync#1").display().to_string();
    vec![
        ("sync", InjectError::new(move || local_sync_error(&shown))),
        ("rename", InjectError::new(local_rename_error)),
    ]
}

/// The PUT lands on disk, then reports a failed fsync: `create_object`
/// must answer `OutcomeUnknown` after that one attempt.
///
/// Breaks if a sync failure counts as transient: the retry would collide
/// with our own (unsynced) object, read back identical bytes and report
/// `Identical`, i.e. acknowledge as durable a write whose fsync failed.
#[tokio::test]
async fn failed_fsync_after_landing_is_unknown_never_identical() {
    let (inner, dir) = local();
    for (name, error) in sync_failures(&dir.path().join("wal")) {
        let faulty = FaultStore::new(inner.clone());
        let path = Path::from(format!("wal/{name}"));
        on_puts(
            &faulty,
            &path,
            Action::LandThenFailWith(error),
            Action::Pass,
        );
        let bytes = Bytes::from_static(b"entry bytes");
        let err = create_object(
            faulty.as_ref(),
            &path,
            bytes.clone(),
            &RetryPolicy::immediate(4),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(err, StoreError::OutcomeUnknown { attempts: 1, .. }),
            "{name}: expected OutcomeUnknown after 1 attempt, got {err:?}"
        );
        assert_eq!(
            faulty.count(OpKind::Put, path.as_ref()),
            1,
            "{name}: no retry"
        );
        // The object did land: a retry would have found exactly our bytes.
        let landed = read_object(inner.as_ref(), &path, &RetryPolicy::immediate(1)).await;
        assert_eq!(landed.unwrap(), Some(bytes), "{name}");
    }
}

/// The same for an unconditional PUT: a failed fsync is an unknown outcome
/// (the object may be in place), not a refusal, and is not retried.
///
/// Breaks if `put_overwrite` retries a sync failure or reports it as
/// `Request` (which means "nothing was written").
#[tokio::test]
async fn failed_fsync_of_an_overwrite_is_unknown() {
    let (inner, dir) = local();
    for (name, error) in sync_failures(dir.path()) {
        let faulty = FaultStore::new(inner.clone());
        let path = Path::from(format!("hint-{name}"));
        on_puts(
            &faulty,
            &path,
            Action::LandThenFailWith(error),
            Action::Pass,
        );
        let err = put_overwrite(
            faulty.as_ref(),
            &path,
            Bytes::from_static(b"{}"),
            &RetryPolicy::immediate(4),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(err, StoreError::OutcomeUnknown { attempts: 1, .. }),
            "{name}: {err:?}"
        );
        assert_eq!(faulty.count(OpKind::Put, path.as_ref()), 1, "{name}");
    }
}

/// Refusals on the first attempt, as object_store reports them: a 403
/// (`PermissionDenied`) and a 400 (`Generic` carrying the status text).
fn refusals() -> Vec<(&'static str, InjectError)> {
    vec![
        (
            "403",
            InjectError::new(|| permission_denied("t/_mem_wal/x")),
        ),
        (
            "400",
            InjectError::new(|| http_status_error(400, "Bad Request")),
        ),
    ]
}

/// A definite refusal of the first PUT is `Request` (nothing written),
/// sent once, for both creates and overwrites.
///
/// Breaks if a 4xx answer hidden in `Error::Generic` is taken for a
/// transient failure (it would be retried until retries run out and then
/// reported as `OutcomeUnknown`, "may be durable"), or if a typed refusal
/// is reported as an unknown outcome.
#[tokio::test]
async fn first_attempt_refusals_are_refusals() {
    for (name, error) in refusals() {
        let faulty = FaultStore::new(local().0);
        let path = Path::from("wal/entry");
        on_puts(
            &faulty,
            &path,
            Action::FailWith(error.clone()),
            Action::FailWith(error),
        );
        let retry = RetryPolicy::immediate(4);
        let err = create_object(faulty.as_ref(), &path, Bytes::from_static(b"x"), &retry)
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Request { op: "put", .. }),
            "{name}: expected a refusal, got {err:?}"
        );
        let err = put_overwrite(faulty.as_ref(), &path, Bytes::from_static(b"x"), &retry)
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Request { op: "put", .. }),
            "{name}: {err:?}"
        );
        assert_eq!(
            faulty.count(OpKind::Put, path.as_ref()),
            2,
            "{name}: one PUT each"
        );
    }
}

/// A refusal after a transient failure may hide the earlier attempt's
/// landed write: still `OutcomeUnknown`. Throttling (429) and request
/// timeouts (408) are retried like other transient failures.
///
/// Breaks if the refusal of a retry is reported as "nothing written"
/// (the first attempt's bytes are in the store), or if 408/429 stop being
/// retried.
#[tokio::test]
async fn refusals_after_a_landed_attempt_stay_unknown_and_throttling_is_retried() {
    for (name, error) in refusals() {
        let (inner, _dir) = local();
        let faulty = FaultStore::new(inner.clone());
        let path = Path::from("wal/entry");
        on_puts(
            &faulty,
            &path,
            Action::LandThenFail,
            Action::FailWith(error),
        );
        // The retry's AlreadyExists is not reached: the refusal comes first.
        let err = create_object(
            faulty.as_ref(),
            &path,
            Bytes::from_static(b"x"),
            &RetryPolicy::immediate(4),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(err, StoreError::OutcomeUnknown { attempts: 2, .. }),
            "{name}: {err:?}"
        );
    }
    for status in [(408, "Request Timeout"), (429, "Too Many Requests")] {
        let faulty = FaultStore::new(local().0);
        let path = Path::from("wal/entry");
        on_puts(
            &faulty,
            &path,
            Action::FailWith(InjectError::new(move || {
                http_status_error(status.0, status.1)
            })),
            Action::Pass,
        );
        let out = create_object(
            faulty.as_ref(),
            &path,
            Bytes::from_static(b"x"),
            &RetryPolicy::immediate(4),
        )
        .await
        .unwrap();
        assert_eq!(out, CreateOutcome::Created, "{status:?}");
        assert_eq!(faulty.count(OpKind::Put, path.as_ref()), 2, "{status:?}");
    }
}
