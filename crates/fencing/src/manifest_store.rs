//! Reading and writing manifest versions; finding the latest one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use memwal_proto::ShardManifest;
use memwal_store::{
    create_object, object_exists, put_overwrite, read_object, CreateOutcome, RetryPolicy,
    StoreError,
};
use object_store::path::Path;
use object_store::ObjectStore;
use serde::{Deserialize, Serialize};

use crate::layout::parse_bitrev64;
use crate::{codec, FencingError, FencingResult, ShardId, ShardLayout};

/// The versioned manifest of one shard in one store.
///
/// Versions start at 1 and have no gaps; each is written once with
/// put-if-not-exists. The latest version is found from
/// `version_hint.json` plus probing, so a missing, stale, unparsable or
/// too-high hint never yields a wrong answer, and a read error is returned,
/// never taken for a missing version.
#[derive(Debug)]
pub struct ManifestStore {
    store: Arc<dyn ObjectStore>,
    layout: ShardLayout,
    retry: RetryPolicy,
    /// Highest version this instance has seen exist (0 = none yet).
    known_version: AtomicU64,
    max_races: u32,
}

#[derive(Serialize, Deserialize)]
struct VersionHint {
    version: u64,
}

impl ManifestStore {
    /// The manifest store of `shard` in the table rooted at `table_root`.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        table_root: &Path,
        shard: ShardId,
        retry: RetryPolicy,
    ) -> Self {
        Self {
            store,
            layout: ShardLayout::new(table_root, shard),
            retry,
            known_version: AtomicU64::new(0),
            max_races: 64,
        }
    }

    /// Bounds how many lost races one update or claim tolerates before
    /// giving up with [`FencingError::Contended`] (default 64).
    pub fn with_max_races(mut self, max_races: u32) -> Self {
        self.max_races = max_races.max(1);
        self
    }

    /// The shard.
    pub fn shard(&self) -> ShardId {
        self.layout.shard()
    }

    /// Paths of the shard's objects.
    pub fn layout(&self) -> &ShardLayout {
        &self.layout
    }

    /// The object store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The retry policy used for every request.
    pub fn retry(&self) -> &RetryPolicy {
        &self.retry
    }

    pub(crate) fn max_races(&self) -> u32 {
        self.max_races
    }

    /// The latest manifest, or `None` when the shard has none.
    pub async fn load_latest(&self) -> FencingResult<Option<ShardManifest>> {
        let mut version = self.latest_version().await?;
        for rediscovered in [false, true] {
            if version == 0 {
                return Ok(None);
            }
            if let Some(m) = self.load_version(version).await? {
                return Ok(Some(m));
            }
            if rediscovered {
                break;
            }
            // The version we knew of is gone (a pruned prefix reached it):
            // forget it and search again from scratch.
            self.known_version.store(0, Ordering::SeqCst);
            version = self.latest_version().await?;
        }
        Err(FencingError::Corrupt {
            path: self.layout.manifest_path(version).to_string(),
            reason: "version was found by probing but is missing on read (deleted?)".into(),
        })
    }

    /// Manifest `version`, or `None` when it does not exist.
    pub async fn load_version(&self, version: u64) -> FencingResult<Option<ShardManifest>> {
        let path = self.layout.manifest_path(version);
        let Some(bytes) = read_object(self.store.as_ref(), &path, &self.retry).await? else {
            return Ok(None);
        };
        self.note_exists(version);
        codec::decode(path.as_ref(), &bytes, version, self.shard()).map(Some)
    }

    /// The highest existing version (0 when the shard has no manifest).
    pub async fn latest_version(&self) -> FencingResult<u64> {
        // `lo` is a version known to exist (or 0); `hi`, once set, one known
        // to be missing. Existence is monotone (no gaps), so search between.
        let mut lo = self.known_version.load(Ordering::SeqCst);
        let mut hi = None;
        if lo == 0 {
            if let Some(hint) = self.read_hint().await? {
                if hint > 0 {
                    if self.exists(hint).await? {
                        lo = hint;
                    } else {
                        hi = Some(hint);
                    }
                }
            }
        }
        let mut listed = false;
        loop {
            let hi_v = match hi {
                Some(h) => h,
                None => self.gallop_from(lo).await?,
            };
            lo = self.bisect(lo, hi_v).await?;
            if lo > 0 || listed {
                break;
            }
            // Nothing found from version 1 up: the prefix may have been
            // pruned. LIST once to find any surviving version.
            listed = true;
            match self.max_listed_version().await? {
                Some(v) => {
                    lo = v;
                    hi = None;
                }
                None => break,
            }
        }
        self.note_exists(lo);
        Ok(lo)
    }

    /// Smallest probed version above `lo` that is missing, galloping.
    async fn gallop_from(&self, mut lo: u64) -> FencingResult<u64> {
        let mut step = 1u64;
        loop {
            let v = lo.saturating_add(step);
            if v == lo {
                // Only a stray object named u64::MAX gets here; nothing
                // can follow it.
                return Ok(v);
            }
            if self.exists(v).await? {
                lo = v;
                step = step.saturating_mul(2);
            } else {
                return Ok(v);
            }
        }
    }

    /// Highest existing version in `[lo, hi)` given `lo` exists (or is 0)
    /// and `hi` does not.
    async fn bisect(&self, mut lo: u64, mut hi: u64) -> FencingResult<u64> {
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.exists(mid).await? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    async fn exists(&self, version: u64) -> FencingResult<bool> {
        let path = self.layout.manifest_path(version);
        Ok(object_exists(self.store.as_ref(), &path, &self.retry).await?)
    }

    async fn max_listed_version(&self) -> FencingResult<Option<u64>> {
        let dir = self.layout.manifest_dir();
        let metas: Vec<_> = self
            .store
            .list(Some(&dir))
            .try_collect()
            .await
            .map_err(|e| StoreError::Request {
                op: "list",
                path: dir.to_string(),
                source: e,
            })?;
        Ok(metas
            .iter()
            .filter_map(|m| m.location.filename())
            .filter_map(|name| name.strip_suffix(".binpb"))
            .filter_map(parse_bitrev64)
            .max())
    }

    async fn read_hint(&self) -> FencingResult<Option<u64>> {
        let path = self.layout.version_hint_path();
        let Some(bytes) = read_object(self.store.as_ref(), &path, &self.retry).await? else {
            return Ok(None);
        };
        match serde_json::from_slice::<VersionHint>(&bytes) {
            Ok(h) => Ok(Some(h.version)),
            Err(e) => {
                tracing::warn!(%path, error = %e, "ignoring unparsable manifest version hint");
                Ok(None)
            }
        }
    }

    fn note_exists(&self, version: u64) {
        self.known_version.fetch_max(version, Ordering::SeqCst);
    }

    /// Writes `bytes` as `version` with put-if-not-exists; on success
    /// refreshes the hint (best effort).
    pub(crate) async fn write_version(
        &self,
        version: u64,
        bytes: Bytes,
    ) -> FencingResult<CreateOutcome> {
        let path = self.layout.manifest_path(version);
        let outcome = create_object(self.store.as_ref(), &path, bytes, &self.retry).await;
        let label = match &outcome {
            Ok(CreateOutcome::Created) => "created",
            Ok(CreateOutcome::Identical) => "identical",
            Ok(CreateOutcome::Conflict(_)) => "conflict",
            Err(_) => "error",
        };
        metrics::counter!("memwal_manifest_writes_total", "outcome" => label).increment(1);
        let outcome = outcome?;
        match &outcome {
            CreateOutcome::Created | CreateOutcome::Identical => {
                self.note_exists(version);
                self.write_hint(version).await;
            }
            CreateOutcome::Conflict(_) => self.note_exists(version),
        }
        Ok(outcome)
    }

    async fn write_hint(&self, version: u64) {
        let path = self.layout.version_hint_path();
        let body = serde_json::to_vec(&VersionHint { version }).expect("plain struct serializes");
        let once = RetryPolicy::immediate(1);
        if let Err(e) = put_overwrite(self.store.as_ref(), &path, body.into(), &once).await {
            tracing::debug!(%path, error = %e, "manifest version hint not updated (best effort)");
        }
    }
}
