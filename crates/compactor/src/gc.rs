//! Garbage collection of a table's MemWAL objects: compacted SSTables,
//! abandoned flush attempts, flushed WAL entries and old manifest
//! versions, each deleted only when no reader or writer can still need it.
//!
//! Rules, per shard (all ages from the object store's `last_modified`):
//!
//! - **Published SSTable directory**: deleted once its generation is in
//!   `compacted_sstables` of both the latest and the oldest retained base
//!   version (a reader may still open the oldest), every index a read may
//!   use has caught up to it, the latest shard manifest no longer lists
//!   it, and the manifest version that dropped it is older than the grace
//!   period (a reader holding an older manifest may still open it).
//! - **Unpublished directory** (a crashed or retried flush): only with a
//!   generation below the manifest's `current_generation` (a directory at
//!   or above it may be a flush in flight), listed by no retained manifest,
//!   and every object in it older than the grace period.
//! - **WAL entries** at or below `replay_after_wal_entry_position`, older
//!   than the grace period, except the first entry of every epoch's run
//!   (and the first entry left). Fencing relies on that: a writer of epoch
//!   `e` that stalled before a WAL PUT resumes at the slot holding the next
//!   epoch's fence sentinel (or first entry), the first slot of epoch
//!   `e + 1`'s run. Its put-if-not-exists must keep failing there, so that
//!   slot is never deleted; every other flushed slot is one no writer will
//!   ever PUT to again (a live writer's slots are all above the cursor,
//!   and a fenced writer's next slot is the run start that fenced it).
//!   Epochs along the WAL never decrease, so a run start is an entry whose
//!   epoch is above the nearest surviving entry below it.
//! - **Producer checkpoints** (`producers/`): every one below the newest
//!   checkpoint of a published generation (below the latest manifest's
//!   `current_generation`), older than the grace period. A claimer reads
//!   only that newest one (docs/design/idempotent-producers.md); ones at
//!   or above `current_generation` may belong to a flush in flight.
//! - **Manifest versions**: all but the newest `keep_manifest_versions`
//!   and any younger than the grace period, deleted oldest first so the
//!   survivors stay contiguous (discovery relies on that, and lists the
//!   directory when the versions from 1 up are gone). The latest version is
//!   never deleted.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::TryStreamExt;
use memwal_fencing::{
    parse_bitrev64, parse_producers_file, ManifestStore, ShardId, ShardLayout, ShardManifest,
    PRODUCERS_DIR,
};
use memwal_proto::MemWalIndexDetails;
use memwal_sstable::LanceStore;
use memwal_store::{RetryPolicy, StoreLocation};
use memwal_table::{compacted_generations, index_caught_up, list_shards, open_dataset, BaseTable};
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStoreExt};
use tracing::Instrument;

use crate::{CompactorError, Result};

/// Settings of [`collect_garbage`].
#[derive(Debug, Clone)]
pub struct GcConfig {
    /// Nothing younger than this is deleted, and nothing dropped from a
    /// manifest less than this long ago. Default 10 minutes: longer than a
    /// reader holds a snapshot or a writer trusts a cached manifest version.
    pub grace: Duration,
    /// Manifest versions kept per shard besides the grace rule. Default 10.
    pub keep_manifest_versions: usize,
    /// Base table versions older than this (and than `grace`: a reader's
    /// snapshot pairs a base version with manifests) are removed (lance's
    /// `cleanup_old_versions`; tagged versions stay) before SSTables are
    /// considered. An SSTable stays while any retained base version predates
    /// its compaction (a reader of that version needs it), so with `None`
    /// (the default: the base table's history is the owner's to prune)
    /// SSTables go only as the owner's own cleanup removes old versions.
    pub base_retention: Option<Duration>,
    /// Report what would be deleted, delete nothing.
    pub dry_run: bool,
    /// Retry policy of manifest reads.
    pub retry: RetryPolicy,
}

impl Default for GcConfig {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(600),
            keep_manifest_versions: 10,
            base_retention: None,
            dry_run: false,
            retry: RetryPolicy::default(),
        }
    }
}

/// What one shard's collection deleted (or, dry run, would delete).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// The shard (`None` only in [`Default`]).
    pub shard: Option<ShardId>,
    /// Published, compacted SSTable directories.
    pub sstables: Vec<String>,
    /// Directories of abandoned flush attempts.
    pub abandoned: Vec<String>,
    /// WAL positions.
    pub wal_entries: Vec<u64>,
    /// WAL positions kept because they start an epoch's run (among the
    /// entries up to the last one older than the grace period; younger
    /// ones are kept unread).
    pub wal_run_starts: Vec<u64>,
    /// Manifest versions.
    pub manifest_versions: Vec<u64>,
    /// Generations of producer checkpoints.
    pub producer_checkpoints: Vec<u64>,
    /// Staged files (`{object}#{n}`) a crashed local write left in the
    /// shard's directory, older than the grace period (local stores only;
    /// not counted in `objects` / `bytes`).
    pub staged: Vec<String>,
    /// Objects deleted in all.
    pub objects: u64,
    /// Bytes of those objects.
    pub bytes: u64,
}

/// Metric names of the collector.
mod names {
    pub const OBJECTS: &str = "memwal_gc_objects_deleted_total";
    pub const BYTES: &str = "memwal_gc_bytes_deleted_total";
}

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn older_than(meta: &ObjectMeta, grace: Duration) -> bool {
    now_millis() - meta.last_modified.timestamp_millis() >= grace.as_millis() as i64
}

/// What the base table says, once per collection.
struct BaseFacts {
    compacted_latest: BTreeMap<ShardId, u64>,
    compacted_oldest: BTreeMap<ShardId, u64>,
    /// Per index a read may use: its caught-up generation per shard.
    indexes: Vec<(String, BTreeMap<ShardId, u64>)>,
}

impl BaseFacts {
    /// Highest generation of `shard` every reader and index has.
    fn safe_generation(&self, shard: ShardId) -> u64 {
        let mut g = self
            .compacted_latest
            .get(&shard)
            .copied()
            .unwrap_or(0)
            .min(self.compacted_oldest.get(&shard).copied().unwrap_or(0));
        for (_, caught) in &self.indexes {
            g = g.min(caught.get(&shard).copied().unwrap_or(0));
        }
        g
    }
}

async fn base_facts(
    lance: &LanceStore,
    loc: &StoreLocation,
    config: &GcConfig,
) -> Result<BaseFacts> {
    let uri = loc.uri.as_str();
    let latest = open_dataset(lance, loc).await?;
    let table = BaseTable::of_dataset(&latest, uri).await?;
    let details: Option<&MemWalIndexDetails> = table.mem_wal.as_ref();
    if details.is_none() {
        return Err(CompactorError::invalid(
            uri,
            "the table has no `__lance_mem_wal` index; nothing is collected without it",
        ));
    }
    let compacted_latest = compacted_generations(uri, details)?;
    let retention = config.base_retention.map(|r| r.max(config.grace));
    let listed = latest
        .versions()
        .await
        .map_err(CompactorError::lance(uri, "listing base table versions"))?;
    let stamps: Vec<(u64, i64)> = listed
        .iter()
        .map(|v| (v.version, v.timestamp.timestamp_millis()))
        .collect();
    let keep_from =
        retention.map(|r| superseded_before(&stamps, now_millis() - r.as_millis() as i64));
    let removable: Vec<u64> = keep_from
        .map(|k| {
            stamps
                .iter()
                .map(|(v, _)| *v)
                .filter(|v| *v < k && *v != latest.version().version)
                .collect()
        })
        .unwrap_or_default();
    if !removable.is_empty() && !config.dry_run {
        let policy = lance::dataset::cleanup::CleanupPolicyBuilder::default()
            .error_if_tagged_old_versions(false)
            .versions(removable.clone())
            .map_err(CompactorError::lance(
                uri,
                "planning the base table cleanup",
            ))?
            .build();
        let removed = latest
            .cleanup_with_policy(policy)
            .await
            .map_err(CompactorError::lance(
                uri,
                "removing old base table versions",
            ))?;
        tracing::info!(
            versions = removed.old_versions,
            bytes = removed.bytes_removed,
            "base table cleanup"
        );
    }
    let versions = if removable.is_empty() || config.dry_run {
        listed
    } else {
        latest
            .versions()
            .await
            .map_err(CompactorError::lance(uri, "listing base table versions"))?
    };
    let oldest = versions
        .iter()
        .map(|v| v.version)
        .filter(|v| !config.dry_run || keep_from.is_none_or(|k| *v >= k))
        .min()
        .unwrap_or(latest.version().version);
    let compacted_oldest = if oldest == latest.version().version {
        compacted_latest.clone()
    } else {
        let old = latest
            .checkout_version(oldest)
            .await
            .map_err(CompactorError::lance(
                uri,
                "opening the oldest base version",
            ))?;
        let t = BaseTable::of_dataset(&old, uri).await?;
        compacted_generations(uri, t.mem_wal.as_ref())?
    };
    let mut indexes = Vec::new();
    for name in table.reader_indexes() {
        let caught = index_caught_up(uri, details, &name)?;
        indexes.push((name, caught));
    }
    Ok(BaseFacts {
        compacted_latest,
        compacted_oldest,
        indexes,
    })
}

/// The version that was current at `cutoff_ms` (the newest written
/// before it), given (version, written at ms) pairs; 0 when none was.
/// Every version below it was superseded before the cutoff, so no reader
/// that started after the cutoff reads it. A version's own timestamp is
/// when it was written, not when it stopped being the latest: a version
/// written before the cutoff may have been current until a moment ago.
fn superseded_before(versions: &[(u64, i64)], cutoff_ms: i64) -> u64 {
    versions
        .iter()
        .filter(|(_, at)| *at < cutoff_ms)
        .map(|(v, _)| *v)
        .max()
        .unwrap_or(0)
}

/// Collects garbage in every shard of the table at `loc`. A shard that
/// fails does not stop the others.
pub async fn collect_garbage(
    loc: &StoreLocation,
    config: &GcConfig,
) -> Result<Vec<std::result::Result<GcReport, CompactorError>>> {
    let span = tracing::info_span!("gc", table = %loc.uri, dry_run = config.dry_run);
    async {
        let lance = LanceStore::new(loc.store.clone());
        // Every shard's objects and manifests first, then the base: writers
        // drop an SSTable from their manifest only once the base they read
        // records it compacted, so a base read after the manifests covers
        // every SSTable they no longer list.
        let mut states = Vec::new();
        for shard in list_shards(loc).await? {
            states.push((shard, shard_state(loc, config, shard).await));
        }
        let facts = base_facts(&lance, loc, config).await?;
        let mut out = Vec::new();
        for (shard, state) in states {
            let r = match state {
                Ok(state) => collect_shard(loc, config, &facts, shard, state).await,
                Err(e) => Err(e),
            };
            let r = match r {
                Ok(report) => sweep_shard(loc, config, shard, report).await,
                Err(e) => Err(e),
            };
            if let Err(e) = &r {
                tracing::warn!(%shard, error = %e, "garbage collection of shard failed");
            }
            out.push(r);
        }
        Ok(out)
    }
    .instrument(span)
    .await
}

/// Removes the staged files a crashed local write left under the shard's
/// directory (LIST hides them, so the object rules above never see them).
async fn sweep_shard(
    loc: &StoreLocation,
    config: &GcConfig,
    shard: ShardId,
    mut report: GcReport,
) -> Result<GcReport> {
    let Some(root) = memwal_store::local_dir(loc) else {
        return Ok(report);
    };
    let layout = ShardLayout::new(&loc.root, shard);
    let rel = layout.shard_dir().parts().skip(loc.root.parts().count());
    let dir = rel.fold(root, |p, part| p.join(part.as_ref()));
    let (grace, dry_run) = (config.grace, config.dry_run);
    let shown = dir.clone();
    // The SSTable directories whose objects this run deleted: a local
    // store keeps the (now empty) directories, one per generation.
    let emptied: Vec<_> = if dry_run {
        Vec::new()
    } else {
        report
            .sstables
            .iter()
            .chain(&report.abandoned)
            .map(|name| dir.join(name))
            .collect()
    };
    let swept = tokio::task::spawn_blocking(move || {
        let swept = memwal_store::sweep_staged(&dir, grace, dry_run)?;
        for d in &emptied {
            memwal_store::remove_empty_dirs(d)?;
        }
        Ok(swept)
    })
    .await
    .map_err(|e| std::io::Error::other(e.to_string()))
    .and_then(|r| r)
    .map_err(|e| CompactorError::Store {
        path: shown.display().to_string(),
        source: Box::new(object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(e),
        }),
    })?;
    report.staged = swept.iter().map(|p| p.display().to_string()).collect();
    Ok(report)
}

/// The generation an SSTable directory name carries (`…_gen_N`).
fn dir_generation(name: &str) -> Option<u64> {
    name.rsplit_once("_gen_")?.1.parse().ok()
}

/// A shard's objects and retained manifests, read before the base.
struct ShardState {
    manifests: BTreeMap<u64, ObjectMeta>,
    wal: BTreeMap<u64, ObjectMeta>,
    dirs: BTreeMap<String, Vec<ObjectMeta>>,
    producers: BTreeMap<u64, ObjectMeta>,
    kept: BTreeMap<u64, ShardManifest>,
}

async fn shard_state(loc: &StoreLocation, config: &GcConfig, shard: ShardId) -> Result<ShardState> {
    let uri = loc.uri.as_str();
    let layout = ShardLayout::new(&loc.root, shard);
    let store_err = |path: &Path| {
        let path = path.to_string();
        move |source: object_store::Error| CompactorError::Store {
            path,
            source: Box::new(source),
        }
    };
    let objects: Vec<ObjectMeta> = loc
        .store
        .list(Some(layout.shard_dir()))
        .try_collect()
        .await
        .map_err(store_err(layout.shard_dir()))?;
    let shard_prefix = layout.shard_dir().parts().count();
    let mut manifests: BTreeMap<u64, ObjectMeta> = BTreeMap::new();
    let mut wal: BTreeMap<u64, ObjectMeta> = BTreeMap::new();
    let mut dirs: BTreeMap<String, Vec<ObjectMeta>> = BTreeMap::new();
    let mut producers: BTreeMap<u64, ObjectMeta> = BTreeMap::new();
    for meta in objects {
        let parts: Vec<String> = meta
            .location
            .parts()
            .skip(shard_prefix)
            .map(|p| p.as_ref().to_string())
            .collect();
        match parts.as_slice() {
            [d, file] if d == "manifest" => {
                if let Some(v) = file.strip_suffix(".binpb").and_then(parse_bitrev64) {
                    manifests.insert(v, meta);
                }
            }
            [d, file] if d == "wal" => {
                if let Some(p) = file.strip_suffix(".arrow").and_then(parse_bitrev64) {
                    wal.insert(p, meta);
                }
            }
            [d, file] if d == PRODUCERS_DIR => {
                if let Some(g) = parse_producers_file(file) {
                    producers.insert(g, meta);
                }
            }
            [d, ..] if d != "manifest" && d != "wal" && d != PRODUCERS_DIR => {
                dirs.entry(d.clone()).or_default().push(meta);
            }
            _ => {}
        }
    }
    let store = ManifestStore::new(loc.store.clone(), &loc.root, shard, config.retry.clone());
    let mut kept: BTreeMap<u64, ShardManifest> = BTreeMap::new();
    for &v in manifests.keys() {
        if let Some(m) = store
            .load_version(v)
            .await
            .map_err(|source| CompactorError::Manifest {
                uri: uri.to_string(),
                shard,
                source: Box::new(source),
            })?
        {
            kept.insert(v, m);
        }
    }
    Ok(ShardState {
        manifests,
        wal,
        dirs,
        producers,
        kept,
    })
}

async fn collect_shard(
    loc: &StoreLocation,
    config: &GcConfig,
    facts: &BaseFacts,
    shard: ShardId,
    state: ShardState,
) -> Result<GcReport> {
    let ShardState {
        manifests,
        wal,
        dirs,
        producers,
        kept,
    } = state;
    let layout = ShardLayout::new(&loc.root, shard);
    let mut report = GcReport {
        shard: Some(shard),
        ..Default::default()
    };
    let Some((&latest_version, latest)) = kept.iter().next_back() else {
        return Ok(report);
    };
    let latest = latest.clone();
    let safe = facts.safe_generation(shard);

    // SSTable directories.
    let mut delete: Vec<ObjectMeta> = Vec::new();
    let oldest_kept_old_enough = kept
        .keys()
        .next()
        .and_then(|v| manifests.get(v))
        .is_some_and(|m| older_than(m, config.grace));
    for (name, files) in &dirs {
        if latest.sstables.iter().any(|s| &s.path == name) {
            continue;
        }
        let Some(generation) = dir_generation(name) else {
            continue;
        };
        // The newest retained version that lists it, if any.
        let listed_in = kept
            .iter()
            .rev()
            .find(|(_, m)| m.sstables.iter().any(|s| &s.path == name))
            .map(|(v, _)| *v);
        let deletable = match listed_in {
            Some(v) => {
                let dropped_at = kept
                    .range(v + 1..)
                    .next()
                    .and_then(|(dv, _)| manifests.get(dv));
                generation <= safe && dropped_at.is_some_and(|m| older_than(m, config.grace))
            }
            None => {
                let untouched = files.iter().all(|f| older_than(f, config.grace));
                let below = generation < latest.current_generation;
                // Above the compacted generation: an attempt that never
                // published (a published one would still be listed). At or
                // below: a published generation dropped before every
                // retained manifest, or an attempt; readers must be done.
                let compacted = facts.compacted_latest.get(&shard).copied().unwrap_or(0);
                let readers_done =
                    generation > compacted || (generation <= safe && oldest_kept_old_enough);
                untouched && below && readers_done
            }
        };
        if !deletable {
            continue;
        }
        if listed_in.is_some()
            || generation <= facts.compacted_latest.get(&shard).copied().unwrap_or(0)
        {
            report.sstables.push(name.clone());
        } else {
            report.abandoned.push(name.clone());
        }
        delete.extend(files.iter().cloned());
    }

    // WAL entries. Only an entry older than the grace period can go, and
    // whether it starts a run depends only on the entries before it: the
    // young tail after the last old entry is kept without reading its
    // epochs (otherwise each entry was read again every cycle for as long
    // as it stayed young).
    let cursor = latest.replay_after_wal_entry_position;
    let last_old = wal
        .range(..=cursor)
        .rev()
        .find(|(_, meta)| older_than(meta, config.grace))
        .map_or(0, |(&position, _)| position);
    let mut prev_epoch: Option<u64> = None;
    for (&position, meta) in wal.range(..=last_old) {
        let epoch = entry_epoch(loc, meta).await?;
        let run_start = match (prev_epoch, epoch) {
            (None, _) | (_, None) => true,
            (Some(p), Some(e)) => e > p,
        };
        if let Some(e) = epoch {
            prev_epoch = Some(e);
        }
        if run_start {
            report.wal_run_starts.push(position);
        } else if older_than(meta, config.grace) {
            report.wal_entries.push(position);
            delete.push(meta.clone());
        }
    }

    // Producer checkpoints: below the newest one of a published generation.
    let newest_published = producers
        .range(..latest.current_generation)
        .next_back()
        .map(|(&g, _)| g);
    if let Some(newest) = newest_published {
        for (&g, meta) in producers.range(..newest) {
            if older_than(meta, config.grace) {
                report.producer_checkpoints.push(g);
                delete.push(meta.clone());
            }
        }
    }

    // Manifest versions: a contiguous prefix, never the latest.
    let keep_from = kept
        .len()
        .saturating_sub(config.keep_manifest_versions.max(1));
    for (i, (&v, meta)) in manifests.iter().enumerate() {
        if i >= keep_from || v == latest_version || !older_than(meta, config.grace) {
            break;
        }
        report.manifest_versions.push(v);
    }

    report.objects = delete.len() as u64 + report.manifest_versions.len() as u64;
    report.bytes = delete.iter().map(|m| m.size).sum::<u64>()
        + report
            .manifest_versions
            .iter()
            .filter_map(|v| manifests.get(v))
            .map(|m| m.size)
            .sum::<u64>();
    if config.dry_run {
        return Ok(report);
    }
    for meta in &delete {
        delete_object(loc, &meta.location).await?;
    }
    for v in &report.manifest_versions {
        delete_object(loc, &layout.manifest_path(*v)).await?;
    }
    metrics::counter!(names::OBJECTS).increment(report.objects);
    metrics::counter!(names::BYTES).increment(report.bytes);
    tracing::info!(
        %shard,
        sstables = report.sstables.len(),
        abandoned = report.abandoned.len(),
        wal_entries = report.wal_entries.len(),
        manifest_versions = report.manifest_versions.len(),
        producer_checkpoints = report.producer_checkpoints.len(),
        bytes = report.bytes,
        "collected"
    );
    Ok(report)
}

/// Deletes `path`; an object already gone counts as deleted.
async fn delete_object(loc: &StoreLocation, path: &Path) -> Result<()> {
    memwal_store::crash_point("gc::mid");
    match loc.store.delete(path).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(source) => Err(CompactorError::Store {
            path: path.to_string(),
            source: Box::new(source),
        }),
    }
}

/// Bytes read to find an entry's epoch before reading it whole.
const PEEK_BYTES: u64 = 64 << 10;

/// The epoch of the WAL entry at `meta` (`None`: it does not decode; such
/// an entry is kept).
async fn entry_epoch(loc: &StoreLocation, meta: &ObjectMeta) -> Result<Option<u64>> {
    let read = |range: Option<GetRange>| async move {
        let opts = GetOptions {
            range,
            ..Default::default()
        };
        let r = loc.store.get_opts(&meta.location, opts).await?;
        r.bytes().await
    };
    let err = |source: object_store::Error| CompactorError::Store {
        path: meta.location.to_string(),
        source: Box::new(source),
    };
    let prefix: Bytes = if meta.size > PEEK_BYTES {
        read(Some(GetRange::Bounded(0..PEEK_BYTES)))
            .await
            .map_err(err)?
    } else {
        read(None).await.map_err(err)?
    };
    if let Some(e) = memwal_wal::codec::peek_epoch(&prefix) {
        return Ok(Some(e));
    }
    if meta.size <= PEEK_BYTES {
        return Ok(None);
    }
    let whole = read(None).await.map_err(err)?;
    Ok(memwal_wal::codec::peek_epoch(&whole))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Breaks if a base version is removable because it was written before
    // the cutoff although it was current until after it (a reader that
    // started within the grace may still read it).
    #[test]
    fn only_versions_superseded_before_the_cutoff_are_removable() {
        let versions = [(1, 0), (2, 10), (3, 500)];
        // At 400 ms version 2 was current: only 1 was superseded by then.
        assert_eq!(superseded_before(&versions, 400), 2);
        assert_eq!(superseded_before(&versions, 5), 1);
        assert_eq!(superseded_before(&versions, 0), 0);
        assert_eq!(superseded_before(&versions, 1000), 3);
    }

    #[test]
    fn directory_generations_parse() {
        assert_eq!(dir_generation("0badcafe_gen_12"), Some(12));
        assert_eq!(dir_generation("x_gen_"), None);
        assert_eq!(dir_generation("manifest"), None);
    }
}
