//! Where one shard's WAL lives and how its objects are read.

use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use memwal_fencing::{parse_bitrev64, ManifestStore, ShardId, ShardLayout};
use memwal_store::{object_exists, read_object, RetryPolicy, StoreError};
use object_store::path::Path;
use object_store::ObjectStore;

use crate::codec::{decode_entry, WalEntry};
use crate::{WalError, WalResult};

/// A shard's WAL directory in a store, with the retry policy for every
/// request made on it.
///
/// Reads never mistake a failure for a missing object: "missing" is only
/// what the store reports as not found, after transient errors have been
/// retried.
#[derive(Debug, Clone)]
pub struct WalLocation {
    store: Arc<dyn ObjectStore>,
    layout: ShardLayout,
    retry: RetryPolicy,
}

impl WalLocation {
    /// The WAL of `layout`'s shard in `store`.
    pub fn new(store: Arc<dyn ObjectStore>, layout: ShardLayout, retry: RetryPolicy) -> Self {
        Self {
            store,
            layout,
            retry,
        }
    }

    /// The WAL next to a manifest store: same store, layout and retry policy.
    pub fn of(manifests: &ManifestStore) -> Self {
        Self::new(
            manifests.store().clone(),
            manifests.layout().clone(),
            manifests.retry().clone(),
        )
    }

    /// The shard.
    pub fn shard(&self) -> ShardId {
        self.layout.shard()
    }

    /// The object store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The shard's paths.
    pub fn layout(&self) -> &ShardLayout {
        &self.layout
    }

    /// The retry policy.
    pub fn retry(&self) -> &RetryPolicy {
        &self.retry
    }

    /// `_mem_wal/{shard}/wal/{bitrev64(position)}.arrow` under the table root.
    pub fn path(&self, position: u64) -> Path {
        self.layout.wal_path(position)
    }

    /// The raw bytes at `position`; `Ok(None)` only when the store says the
    /// object does not exist.
    pub async fn read_bytes(&self, position: u64) -> WalResult<Option<Bytes>> {
        Ok(read_object(self.store.as_ref(), &self.path(position), &self.retry).await?)
    }

    /// The decoded entry at `position`; `Ok(None)` only when it does not
    /// exist, [`WalError::Corrupt`] (naming shard, position and path) when
    /// it does not decode.
    pub async fn read_entry(&self, position: u64) -> WalResult<Option<WalEntry>> {
        match self.read_bytes(position).await? {
            None => Ok(None),
            Some(bytes) => self.decode(position, &bytes).map(Some),
        }
    }

    /// Decodes bytes found at `position`, typing failures as
    /// [`WalError::Corrupt`].
    pub fn decode(&self, position: u64, bytes: &Bytes) -> WalResult<WalEntry> {
        decode_entry(bytes).map_err(|reason| WalError::Corrupt {
            shard: self.shard(),
            position,
            path: self.path(position).to_string(),
            reason,
        })
    }

    /// Whether an object exists at `position` (HEAD, retried).
    pub async fn exists(&self, position: u64) -> WalResult<bool> {
        Ok(object_exists(self.store.as_ref(), &self.path(position), &self.retry).await?)
    }

    /// The highest position named by a WAL object in a LIST of the WAL
    /// directory (objects whose names are not positions are ignored).
    /// Retried like every other request; a failure is returned.
    pub async fn max_listed_position(&self) -> WalResult<Option<u64>> {
        let dir = self.layout.wal_dir();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let listed: Result<Vec<_>, _> = self.store.list(Some(&dir)).try_collect().await;
            match listed {
                Ok(metas) => {
                    return Ok(metas
                        .iter()
                        .filter_map(|m| m.location.filename())
                        .filter_map(|name| name.strip_suffix(".arrow"))
                        .filter_map(parse_bitrev64)
                        .max())
                }
                Err(e) if memwal_store::is_transient(&e) && attempt < self.retry.attempts() => {
                    self.retry.backoff(attempt).await;
                }
                Err(e) => {
                    return Err(StoreError::Request {
                        op: "list",
                        path: dir.to_string(),
                        source: e,
                    }
                    .into())
                }
            }
        }
    }
}
