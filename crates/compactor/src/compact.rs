//! The compaction cycle: for each shard, the published SSTables above the
//! recorded `compacted_sstables` generation, merged into the base table in
//! ascending generation order. The compactor never writes shard manifests
//! (it never claims: that would fence the live writer).

use std::sync::Arc;
use tokio::time::Instant;

use lance::Dataset;
use memwal_fencing::{ShardId, ShardLayout};
use memwal_memtable::TableSchema;
use memwal_sstable::{LanceStore, SsTableReader};
use memwal_store::{RetryPolicy, StoreLocation};
use memwal_table::{compacted_generations, latest_manifest, list_shards, open_dataset, BaseTable};
use tracing::Instrument;

use crate::catchup::CatchupReport;
use crate::maintain::{MaintenanceConfig, MaintenanceReport};
use crate::merge::{merge_sstables, Attempt, Merged};
use crate::{names, CompactorError, Result};

/// Settings of a [`Compactor`].
#[derive(Debug, Clone)]
pub struct CompactorConfig {
    /// Retry policy of shard manifest reads.
    pub retry: RetryPolicy,
    /// How many times one generation is attempted when concurrent commits
    /// get in the way before the cycle gives up on that shard with
    /// [`CompactorError::Contention`]. Default 10.
    pub max_conflicts: u32,
    /// Consecutive generations of a shard merged in one commit (last write
    /// wins resolved across them first), at most. Default 256: a backlog is
    /// merged in steps bounded by `max_commit_bytes`, so a compactor that
    /// fell behind catches up in fewer, larger commits. 1 merges one
    /// generation per commit.
    pub max_group: usize,
    /// ... and at most this much of their in-memory size (the memory a
    /// commit's key resolution and passes work over). Default 256 MiB.
    pub max_commit_bytes: u64,
    /// Base maintenance after each cycle's merges and index catch-up
    /// ([`Compactor::maintain_base`]); `None`: never (the base's fragments
    /// and deletions then grow with every commit). Default: on, with
    /// [`MaintenanceConfig::default`].
    pub maintenance: Option<MaintenanceConfig>,
    /// How often a cycle ([`Compactor::run_once`]) ends by bringing the
    /// base table's indexes up to the compacted generations
    /// ([`Compactor::catch_up_indexes`]): at most once per this interval
    /// (zero: every cycle). `None`: never (SSTables then stay until
    /// something else optimizes the indexes). Default: every cycle.
    pub index_catchup: Option<std::time::Duration>,
}

impl Default for CompactorConfig {
    fn default() -> Self {
        Self {
            retry: RetryPolicy::default(),
            max_conflicts: 10,
            max_group: 256,
            max_commit_bytes: 256 << 20,
            maintenance: Some(MaintenanceConfig::default()),
            index_catchup: Some(std::time::Duration::ZERO),
        }
    }
}

/// What one shard's compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardReport {
    /// The shard (`None` only in [`Default`]).
    pub shard: Option<ShardId>,
    /// `compacted_sstables` of the shard before and after.
    pub compacted_before: u64,
    /// See `compacted_before`.
    pub compacted_after: u64,
    /// Generations this run merged, ascending (not ones another compactor
    /// merged meanwhile).
    pub merged: Vec<u64>,
    /// Live rows upserted or appended.
    pub rows_written: u64,
    /// Tombstones applied.
    pub tombstones: u64,
    /// Base-table commits made.
    pub commits: u32,
    /// Generations found already compacted by a concurrent compactor.
    pub skipped: Vec<u64>,
    /// Those of `merged` that went in commits shared with other shards
    /// (`together.rs`). A shared commit's rows, tombstones and commits are
    /// counted once, in the report of its first shard, so sums over the
    /// reports of a cycle are exact.
    pub shared: Vec<u64>,
}

impl ShardReport {
    /// This report followed by `later` (a later run over the same shard).
    fn then(mut self, later: ShardReport) -> ShardReport {
        self.compacted_after = later.compacted_after.max(self.compacted_after);
        self.merged.extend(later.merged);
        self.rows_written += later.rows_written;
        self.tombstones += later.tombstones;
        self.commits += later.commits;
        self.skipped.extend(later.skipped);
        self.shared.extend(later.shared);
        self
    }
}

/// Merges published SSTables into the base table of one table.
#[derive(Clone)]
pub struct Compactor {
    pub(crate) loc: StoreLocation,
    pub(crate) lance: Arc<LanceStore>,
    pub(crate) config: CompactorConfig,
    /// When the last index catch-up ran and what it did, and the last one
    /// that committed.
    catchup: Arc<parking_lot::Mutex<CatchupHistory>>,
}

#[derive(Debug, Default)]
struct CatchupHistory {
    last: Option<(Instant, CatchupOutcome)>,
    last_commit: Option<CatchupReport>,
    /// The last maintenance run, and the last one that committed.
    maintenance: Option<MaintenanceOutcome>,
    maintenance_commit: Option<MaintenanceReport>,
}

/// What a maintenance run did, or why it failed.
pub type MaintenanceOutcome = std::result::Result<MaintenanceReport, String>;

/// What an index catch-up did, or why it failed.
pub type CatchupOutcome = std::result::Result<CatchupReport, String>;

impl std::fmt::Debug for Compactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compactor")
            .field("table", &self.loc.uri)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Compactor {
    /// A compactor of the table at `loc`. Nothing is read until a run.
    pub fn new(loc: StoreLocation, config: CompactorConfig) -> Self {
        let lance = Arc::new(LanceStore::new(loc.store.clone()));
        Self {
            loc,
            lance,
            config,
            catchup: Arc::default(),
        }
    }

    /// The last index catch-up a cycle ran: what it did, or why it failed.
    pub fn last_index_catchup(&self) -> Option<CatchupOutcome> {
        self.catchup.lock().last.as_ref().map(|(_, r)| r.clone())
    }

    /// The last index catch-up that committed (what the last real work
    /// cost).
    pub fn last_index_catchup_commit(&self) -> Option<CatchupReport> {
        self.catchup.lock().last_commit.clone()
    }

    /// The last base maintenance a cycle ran: what it did, or why it
    /// failed.
    pub fn last_maintenance(&self) -> Option<MaintenanceOutcome> {
        self.catchup.lock().maintenance.clone()
    }

    /// The last base maintenance that committed a rewrite.
    pub fn last_maintenance_commit(&self) -> Option<MaintenanceReport> {
        self.catchup.lock().maintenance_commit.clone()
    }

    /// Runs [`Self::maintain_base`] when maintenance is on; a failure is
    /// logged and counted (the next cycle tries again).
    async fn maintain_if_on(&self) {
        if self.config.maintenance.is_none() {
            return;
        }
        let result = self.maintain_base().await.map_err(|e| {
            metrics::counter!(names::MAINTENANCE_ERRORS).increment(1);
            tracing::warn!(error = %e, "base maintenance failed");
            e.to_string()
        });
        let mut history = self.catchup.lock();
        if let Ok(r) = &result {
            if r.committed {
                history.maintenance_commit = Some(r.clone());
            }
        }
        history.maintenance = Some(result);
    }

    /// Runs [`Self::catch_up_indexes`] when `index_catchup` says one is
    /// due; a failure is logged and counted (the next cycle tries again).
    async fn catch_up_if_due(&self) {
        let Some(every) = self.config.index_catchup else {
            return;
        };
        let due = self
            .catchup
            .lock()
            .last
            .as_ref()
            .is_none_or(|(at, _)| at.elapsed() >= every);
        if !due {
            return;
        }
        let result = self.catch_up_indexes().await.map_err(|e| {
            metrics::counter!(names::INDEX_CATCHUP_ERRORS).increment(1);
            tracing::warn!(error = %e, "index catch-up failed");
            e.to_string()
        });
        let mut history = self.catchup.lock();
        if let Ok(r) = &result {
            if r.committed {
                history.last_commit = Some(r.clone());
            }
        }
        history.last = Some((Instant::now(), result));
    }

    /// The table's location.
    pub fn location(&self) -> &StoreLocation {
        &self.loc
    }

    /// One cycle over every shard of the table, then (when due) an index
    /// catch-up, then (when on) base maintenance. A shard that fails does
    /// not stop the others: its error is returned alongside the reports of
    /// the shards that succeeded; a failed catch-up or maintenance run is
    /// logged and kept for [`Self::last_index_catchup`] /
    /// [`Self::last_maintenance`].
    ///
    /// Guarantees, whatever runs concurrently (writers, other compactors) and
    /// wherever this run stops: each generation's changes reach the base
    /// table exactly once in effect, in generation order per shard, and
    /// `compacted_sstables[shard]` never names a generation whose rows are
    /// not all in the base.
    pub async fn run_once(&self) -> Result<Vec<std::result::Result<ShardReport, CompactorError>>> {
        let span = tracing::info_span!("compact", table = %self.loc.uri);
        async {
            self.require_index().await?;
            let mut out = Vec::new();
            let shards = list_shards(&self.loc).await?;
            // Backlogs of several shards first, in shared commits; then
            // each shard alone for whatever is left.
            let mut together = self.compact_together(&shards).await;
            for shard in shards {
                let r =
                    self.compact_shard(shard)
                        .await
                        .map(|alone| match together.remove(&shard) {
                            Some(shared) => shared.then(alone),
                            None => alone,
                        });
                if let Err(e) = &r {
                    metrics::counter!(names::ERRORS).increment(1);
                    tracing::warn!(%shard, error = %e, "compaction of shard failed");
                }
                out.push(r);
            }
            self.catch_up_if_due().await;
            self.maintain_if_on().await;
            Ok(out)
        }
        .instrument(span)
        .await
    }

    /// Refuses a table without the `__lance_mem_wal` index.
    async fn require_index(&self) -> Result<BaseTable> {
        let table = BaseTable::load(&self.lance, &self.loc.root).await?;
        if table.mem_wal.is_none() {
            return Err(CompactorError::invalid(
                &self.loc.uri,
                "the table has no `__lance_mem_wal` index; compaction needs one \
                 (create the table with `memwal init`, or install it with lance's \
                 initialize_mem_wal)",
            ));
        }
        Ok(table)
    }

    /// Compacts every published SSTable of `shard` above its recorded
    /// generation.
    pub async fn compact_shard(&self, shard: ShardId) -> Result<ShardReport> {
        let span = tracing::info_span!("compact_shard", %shard);
        self.compact_shard_inner(shard).instrument(span).await
    }

    async fn compact_shard_inner(&self, shard: ShardId) -> Result<ShardReport> {
        let uri = self.loc.uri.as_str();
        let mut report = ShardReport {
            shard: Some(shard),
            ..Default::default()
        };
        let Some(manifest) = latest_manifest(&self.loc, shard, &self.config.retry).await? else {
            return Ok(report);
        };
        let mut base = open_dataset(&self.lance, &self.loc).await?;
        let (table, mut compacted) = self.progress(&base, shard).await?;
        report.compacted_before = compacted;
        let schema = TableSchema::new(table.schema.clone())
            .map_err(|e| CompactorError::invalid(uri, format!("base table schema: {e}")))?;
        let layout = ShardLayout::new(&self.loc.root, shard);
        let mut pending: Vec<_> = manifest
            .sstables
            .iter()
            .filter(|s| s.generation > compacted)
            .cloned()
            .collect();
        pending.sort_by_key(|s| s.generation);
        self.record_lag(shard, &pending, compacted);
        let mut next = 0;
        while next < pending.len() {
            if pending[next].generation <= compacted {
                next += 1;
                continue;
            }
            let group = self.group(&pending[next..]);
            let last = group.last().expect("a group is never empty").generation;
            let dirs = group
                .iter()
                .map(|s| s.path.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            let started = Instant::now();
            let mut readers = Vec::with_capacity(group.len());
            for sst in group {
                readers.push(
                    SsTableReader::open(&self.lance, &layout, &sst.path, &schema)
                        .await
                        .map_err(|source| CompactorError::SsTable {
                            shard,
                            dir: sst.path.clone(),
                            source: Box::new(source),
                        })?,
                );
            }
            let datasets: Vec<_> = readers.iter().map(|r| r.dataset()).collect();
            let mut attempts = 0u32;
            loop {
                attempts += 1;
                let step = tracing::info_span!(
                    "compact_generations",
                    first = group[0].generation,
                    last,
                    attempts
                );
                let result = merge_sstables(base.clone(), &datasets, &[(shard, last)], &dirs, uri)
                    .instrument(step)
                    .await;
                match result {
                    Ok((ds, merged)) => {
                        memwal_store::crash_point("compactor::after_commit");
                        base = ds;
                        compacted = last;
                        report.merged.extend(group.iter().map(|s| s.generation));
                        self.count(&mut report, merged, group.len(), started);
                        next += group.len();
                        break;
                    }
                    Err(Attempt::Failed(e)) => return Err(e),
                    Err(Attempt::Commit(e)) => {
                        // Whatever happened, the base decides: reload it
                        // and read the marker again.
                        base = open_dataset(&self.lance, &self.loc).await?;
                        let recorded = self.progress(&base, shard).await?.1;
                        if recorded > compacted {
                            tracing::info!(
                                recorded,
                                "generations compacted by a concurrent compactor"
                            );
                            report.skipped.extend(
                                group
                                    .iter()
                                    .map(|s| s.generation)
                                    .filter(|g| *g <= recorded),
                            );
                            compacted = recorded;
                            break;
                        }
                        if !is_conflict(&e) {
                            return Err(CompactorError::Lance {
                                uri: uri.to_string(),
                                what: format!(
                                    "merging generations {}..={last} of shard {shard}",
                                    group[0].generation
                                ),
                                source: Box::new(e),
                            });
                        }
                        metrics::counter!(names::CONFLICTS).increment(1);
                        if attempts >= self.config.max_conflicts {
                            return Err(CompactorError::Contention {
                                uri: uri.to_string(),
                                shard,
                                generation: group[0].generation,
                                attempts,
                            });
                        }
                        tracing::debug!(error = %e, "commit conflict; retrying the generations");
                    }
                }
            }
        }
        report.compacted_after = compacted;
        let left: Vec<_> = pending
            .into_iter()
            .filter(|s| s.generation > compacted)
            .collect();
        self.record_lag(shard, &left, compacted);
        Ok(report)
    }

    /// The table's declaration and the shard's recorded generation at
    /// `base`'s version.
    async fn progress(&self, base: &Dataset, shard: ShardId) -> Result<(BaseTable, u64)> {
        let table = BaseTable::of_dataset(base, &self.loc.uri).await?;
        let done = compacted_generations(&self.loc.uri, table.mem_wal.as_ref())?
            .get(&shard)
            .copied()
            .unwrap_or(0);
        Ok((table, done))
    }

    /// The longest prefix of `pending` merged in one commit: at most
    /// `max_group` generations and `max_commit_bytes` of their in-memory
    /// size (an SSTable that does not record it counts as 64 MiB); always
    /// at least one.
    fn group<'a>(&self, pending: &'a [memwal_proto::SsTable]) -> &'a [memwal_proto::SsTable] {
        let mut bytes = 0u64;
        let mut n = 0;
        for s in pending.iter().take(self.config.max_group.max(1)) {
            bytes += s.in_memory_bytes.unwrap_or(64 << 20);
            if n > 0 && bytes > self.config.max_commit_bytes {
                break;
            }
            n += 1;
        }
        &pending[..n.max(1)]
    }

    fn count(
        &self,
        report: &mut ShardReport,
        merged: Merged,
        generations: usize,
        started: Instant,
    ) {
        report.rows_written += merged.rows_written;
        report.tombstones += merged.tombstones;
        report.commits += merged.commits;
        metrics::counter!(names::GENERATIONS).increment(generations as u64);
        metrics::counter!(names::ROWS).increment(merged.rows_written);
        metrics::counter!(names::TOMBSTONES).increment(merged.tombstones);
        metrics::histogram!(names::GENERATION_SECONDS).record(started.elapsed().as_secs_f64());
    }

    fn record_lag(&self, shard: ShardId, pending: &[memwal_proto::SsTable], compacted: u64) {
        let bytes: u64 = pending.iter().filter_map(|s| s.in_memory_bytes).sum();
        let shard = shard.to_string();
        metrics::gauge!(names::LAG_GENERATIONS, "shard" => shard.clone()).set(pending.len() as f64);
        metrics::gauge!(names::LAG_BYTES, "shard" => shard.clone()).set(bytes as f64);
        metrics::gauge!(names::COMPACTED_GENERATION, "shard" => shard).set(compacted as f64);
    }
}

/// Whether a failed commit lost to a concurrent one (worth replanning).
pub(crate) fn is_conflict(e: &lance::Error) -> bool {
    matches!(
        e,
        lance::Error::CommitConflict { .. }
            | lance::Error::RetryableCommitConflict { .. }
            | lance::Error::IncompatibleTransaction { .. }
            | lance::Error::TooMuchWriteContention { .. }
    ) || e.to_string().contains("Stale SSTable compaction")
}
