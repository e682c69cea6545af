//! `memwal-store` against a real S3-compatible server (moto under `.ci/run`).
//!
//! Each test gets a fresh prefix from `memwal_testkit::s3_test_location`.
//! Without `MEMWAL_TEST_S3_URI` they are reported as ignored (see
//! `crates/testkit/s3_tests_cfg.rs`); under `CI=true` they run and fail in
//! that case. See `scripts/s3-server.sh`.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use bytes::Bytes;
use memwal_store::{create_object, object_exists, read_object, CreateOutcome, RetryPolicy};
use memwal_testkit::s3_test_location;
use object_store::{PutMode, PutOptions, PutPayload};

/// put-if-not-exists over S3: first writer wins, a loser gets the winner's
/// bytes back, and a retry with the same bytes is recognised as identical.
///
/// Fails if the S3 client does not send a conditional PUT (the second create
/// would overwrite and report `Created`), if the server's 412 is not mapped
/// to `AlreadyExists` (create_object would return an error or retry into
/// `OutcomeUnknown`), or if the collision read-back compares the wrong bytes.
#[tokio::test]
#[cfg_attr(
    not(memwal_s3_tests),
    ignore = "needs an S3 server: MEMWAL_TEST_S3_URI unset (eval \"$(scripts/s3-server.sh start)\")"
)]
async fn create_object_is_put_if_not_exists_on_s3() {
    let Some(loc) = s3_test_location("store-create-object") else {
        return;
    };
    let retry = RetryPolicy::default();
    let path = loc.child("manifest/v1");
    let first = Bytes::from_static(b"first writer");
    let second = Bytes::from_static(b"second writer");

    let outcome = create_object(loc.store.as_ref(), &path, first.clone(), &retry)
        .await
        .unwrap();
    assert_eq!(outcome, CreateOutcome::Created);

    let outcome = create_object(loc.store.as_ref(), &path, second, &retry)
        .await
        .unwrap();
    assert_eq!(outcome, CreateOutcome::Conflict(first.clone()));

    let outcome = create_object(loc.store.as_ref(), &path, first.clone(), &retry)
        .await
        .unwrap();
    assert_eq!(outcome, CreateOutcome::Identical);

    // The losing writes changed nothing.
    let stored = read_object(loc.store.as_ref(), &path, &retry)
        .await
        .unwrap();
    assert_eq!(stored, Some(first));
}

/// The raw client behaviour `create_object` relies on: a `PutMode::Create`
/// onto an existing key fails with `object_store::Error::AlreadyExists`.
///
/// Fails if object_store's default S3 conditional-put mode changes (no
/// `If-None-Match: *`), or if the server answers a collision with something
/// other than 412/304 (object_store would then report another variant).
#[tokio::test]
#[cfg_attr(
    not(memwal_s3_tests),
    ignore = "needs an S3 server: MEMWAL_TEST_S3_URI unset (eval \"$(scripts/s3-server.sh start)\")"
)]
async fn s3_create_collision_is_already_exists() {
    let Some(loc) = s3_test_location("store-raw-collision") else {
        return;
    };
    let path = loc.child("x");
    let create = || PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    loc.store
        .put_opts(&path, PutPayload::from_static(b"a"), create())
        .await
        .unwrap();
    let err = loc
        .store
        .put_opts(&path, PutPayload::from_static(b"b"), create())
        .await
        .unwrap_err();
    assert!(
        matches!(err, object_store::Error::AlreadyExists { .. }),
        "expected AlreadyExists, got {err:?}"
    );
}

/// A missing object reads as `Ok(None)` / `Ok(false)`, not as an error.
///
/// Fails if the server's 404 for a missing key is not mapped to
/// `object_store::Error::NotFound` (read_object would return `Err`), or if
/// the location is not a fresh, empty prefix.
#[tokio::test]
#[cfg_attr(
    not(memwal_s3_tests),
    ignore = "needs an S3 server: MEMWAL_TEST_S3_URI unset (eval \"$(scripts/s3-server.sh start)\")"
)]
async fn missing_object_reads_as_none_on_s3() {
    let Some(loc) = s3_test_location("store-read-missing") else {
        return;
    };
    let retry = RetryPolicy::default();
    let path = loc.child("wal/absent");
    assert_eq!(
        read_object(loc.store.as_ref(), &path, &retry)
            .await
            .unwrap(),
        None
    );
    assert!(!object_exists(loc.store.as_ref(), &path, &retry)
        .await
        .unwrap());
}
