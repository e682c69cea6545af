use bytes::Bytes;
use object_store::{path::Path, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::{is_sync_failure, is_transient, RetryPolicy, StoreError, StoreResult};

/// What a conditional create found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateOutcome {
    /// The store accepted our PUT and reported success.
    Created,
    /// The object already existed and holds exactly the bytes we sent.
    ///
    /// This is our own write when a retry (ours, or the store client's) hit
    /// the object an earlier attempt had landed; it is also what a peer that
    /// wrote identical bytes leaves. Only the caller knows whether its bytes
    /// are unique to it.
    Identical,
    /// The object already existed with different bytes (returned).
    Conflict(Bytes),
}

/// Writes `bytes` to `path` only if nothing is there (put-if-not-exists).
///
/// Transient failures are retried with the identical bytes. A collision is
/// resolved by reading the object back and comparing it with what we sent,
/// so a PUT that landed but reported an error is never taken for a peer's.
///
/// Errors say whether the object may have been written:
///
/// - [`StoreError::Request`]: a definite refusal (denied, unauthenticated,
///   bad path, unsupported, any HTTP 4xx but 408/429) on the first attempt;
///   nothing was written;
/// - [`StoreError::OutcomeUnknown`]: retries ran out, a refusal came after
///   an earlier attempt that may have landed, a collision could not be read
///   back, or a failed fsync ([`crate::is_sync_failure`]). A failed fsync
///   is never retried: the object may be in place but not durable, and a
///   retry finding our bytes would wrongly report them as
///   [`CreateOutcome::Identical`].
pub async fn create_object(
    store: &dyn ObjectStore,
    path: &Path,
    bytes: Bytes,
    retry: &RetryPolicy,
) -> StoreResult<CreateOutcome> {
    let attempts = retry.attempts();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match store
            .put_opts(path, PutPayload::from_bytes(bytes.clone()), opts)
            .await
        {
            Ok(_) => return Ok(CreateOutcome::Created),
            Err(object_store::Error::AlreadyExists { .. }) => {
                // Whose object it is can only be told by reading it back; if
                // that fails, the collision may hide our own landed write.
                let existing = match read_object(store, path, retry).await {
                    Ok(existing) => existing,
                    Err(StoreError::Request { source, .. }) => {
                        return Err(StoreError::OutcomeUnknown {
                            path: path.to_string(),
                            attempts: attempt,
                            source,
                        })
                    }
                    Err(e) => return Err(e),
                };
                match existing {
                    Some(existing) if existing == bytes => return Ok(CreateOutcome::Identical),
                    Some(existing) => return Ok(CreateOutcome::Conflict(existing)),
                    // Reported as existing, yet missing on read: an earlier
                    // attempt of ours may still be landing (S3 answers a
                    // conditional PUT racing an in-flight one with a
                    // conflict), or someone deleted it. Either way the slot
                    // decides nothing yet: send the same bytes again.
                    None if attempt < attempts => {
                        tracing::debug!(%path, attempt, "collided object vanished; retrying");
                        retry.backoff(attempt).await;
                    }
                    None => return Err(StoreError::OutcomeUnknown {
                        path: path.to_string(),
                        attempts: attempt,
                        source: object_store::Error::Generic {
                            store: "memwal",
                            source:
                                "object reported as existing kept vanishing before it could be read"
                                    .into(),
                        },
                    }),
                }
            }
            Err(e) if is_transient(&e) && attempt < attempts => {
                tracing::debug!(%path, attempt, error = %e, "retrying conditional create");
                retry.backoff(attempt).await;
            }
            Err(e) => return Err(write_failure(path, attempt, e)),
        }
    }
}

/// Reads a whole object; `Ok(None)` only when the store says it is missing.
///
/// Transient failures are retried; when retries run out the error is
/// returned, never mistaken for "absent".
pub async fn read_object(
    store: &dyn ObjectStore,
    path: &Path,
    retry: &RetryPolicy,
) -> StoreResult<Option<Bytes>> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let result = match store.get(path).await {
            Ok(got) => got.bytes().await,
            Err(e) => Err(e),
        };
        match result {
            Ok(bytes) => return Ok(Some(bytes)),
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) if is_transient(&e) && attempt < retry.attempts() => {
                tracing::debug!(%path, attempt, error = %e, "retrying read");
                retry.backoff(attempt).await;
            }
            Err(e) => return Err(StoreError::request("get", path, e)),
        }
    }
}

/// Whether an object exists; `Ok(false)` only when the store says missing.
pub async fn object_exists(
    store: &dyn ObjectStore,
    path: &Path,
    retry: &RetryPolicy,
) -> StoreResult<bool> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match store.head(path).await {
            Ok(_) => return Ok(true),
            Err(object_store::Error::NotFound { .. }) => return Ok(false),
            Err(e) if is_transient(&e) && attempt < retry.attempts() => {
                retry.backoff(attempt).await;
            }
            Err(e) => return Err(StoreError::request("head", path, e)),
        }
    }
}

/// Unconditional PUT (for best-effort objects such as hints), retried on
/// transient failures.
///
/// Errors are classified like [`create_object`]'s: [`StoreError::Request`]
/// only for a definite refusal on the first attempt (nothing written),
/// [`StoreError::OutcomeUnknown`] when the object may have been written
/// (retries ran out, a refusal after an earlier attempt, a failed fsync,
/// which is never retried).
pub async fn put_overwrite(
    store: &dyn ObjectStore,
    path: &Path,
    bytes: Bytes,
    retry: &RetryPolicy,
) -> StoreResult<()> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match store.put(path, PutPayload::from_bytes(bytes.clone())).await {
            Ok(_) => return Ok(()),
            Err(e) if is_transient(&e) && attempt < retry.attempts() => {
                retry.backoff(attempt).await;
            }
            Err(e) => return Err(write_failure(path, attempt, e)),
        }
    }
}

/// The error for a write whose `attempt`-th PUT failed with `e` and will
/// not be retried.
///
/// A failed fsync leaves the object possibly in place but not durable, and
/// retries that ran out may each have landed: both are
/// [`StoreError::OutcomeUnknown`]. A definite refusal means this attempt
/// wrote nothing, so it is a [`StoreError::Request`] on the first attempt,
/// but after earlier attempts (which may have landed before their error)
/// the outcome is still unknown.
fn write_failure(path: &Path, attempt: u32, e: object_store::Error) -> StoreError {
    if is_sync_failure(&e) || is_transient(&e) || attempt > 1 {
        return StoreError::OutcomeUnknown {
            path: path.to_string(),
            attempts: attempt,
            source: e,
        };
    }
    StoreError::request("put", path, e)
}
