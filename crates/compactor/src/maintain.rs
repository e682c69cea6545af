//! Base maintenance: keeping the base table's fragments few and its
//! deleted rows materialized while compaction commits keep landing.
//!
//! Every merge commit adds fragments (the upserted and appended rows) and
//! rewrites the deletion files of the fragments whose rows it superseded.
//! Left alone, fragments, deletion files and the manifest grow with every
//! commit and every read pays for them. A maintenance run rewrites:
//!
//! - every fragment whose deleted share is above
//!   `materialize_deletions_threshold` (its deletions materialized), and
//! - small fragments by size tier: fragments below
//!   `target_rows_per_fragment` fall into tiers a factor `tier_fanout`
//!   apart (tier 0 holds fragments of at least target/fanout rows, tier 1
//!   target/fanout² and so on); once one tier holds `tier_fanout`
//!   fragments, that tier and every smaller one are merged. A row is
//!   rewritten about once per tier on its way to a full-size fragment, so
//!   the write amplification is logarithmic in the target size, not
//!   linear in the number of commits.
//!
//! The rewrite itself is lance's (`compact_files`, fragments not chosen
//! excluded, index remapping included); its commit is a `Rewrite`, made
//! with the base's put-if-not-exists commit handler. A merge that lost the
//! race to it replans on the new version (`compact.rs`); a rewrite that
//! overlaps a merge committed meanwhile is refused by lance's conflict
//! check and tried again at the next cycle. The `__lance_mem_wal` index
//! details (the compacted markers, `index_catchup`) are carried over
//! unchanged: a rewrite changes where rows live, never which rows there
//! are. A run is skipped while any reader index is behind the compacted
//! generations (the catch-up runs first), so every rewritten fragment is
//! one the indexes cover and their coverage moves with it.

use std::collections::BTreeMap;

use lance::dataset::optimize::{compact_files, CompactionOptions};
use lance::Dataset;
use memwal_table::{compacted_generations, open_dataset, BaseTable};
use tokio::time::Instant;
use tracing::Instrument;

use crate::compact::is_conflict;
use crate::{names, Compactor, CompactorError, Result};

/// Settings of base maintenance ([`Compactor::maintain_base`]).
#[derive(Debug, Clone)]
pub struct MaintenanceConfig {
    /// Rows a fragment grows to: smaller ones are merged by size tier.
    /// Default 1,048,576 (lance's own default).
    pub target_rows_per_fragment: usize,
    /// Size ratio between tiers, and how many fragments of one tier are
    /// merged together. Default 8; at least 2.
    pub tier_fanout: usize,
    /// A fragment whose deleted rows are more than this share of its rows
    /// is rewritten without them. Default 0.1.
    pub materialize_deletions_threshold: f32,
    /// Rows one run rewrites at most (lance's `max_source_rows`; at least
    /// one rewrite task always runs). Default 4,194,304.
    pub max_rows_per_run: usize,
    /// Rewrite tasks one run executes at once. Default 1: maintenance
    /// shares the machine with ingest.
    pub threads: usize,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        Self {
            target_rows_per_fragment: 1 << 20,
            tier_fanout: 8,
            materialize_deletions_threshold: 0.1,
            max_rows_per_run: 4 << 20,
            threads: 1,
        }
    }
}

impl MaintenanceConfig {
    /// Checks the settings, naming the first bad one.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.target_rows_per_fragment == 0 {
            return Err("target_rows_per_fragment must be > 0".into());
        }
        if self.tier_fanout < 2 {
            return Err("tier_fanout must be >= 2".into());
        }
        if !(self.materialize_deletions_threshold >= 0.0
            && self.materialize_deletions_threshold <= 1.0)
        {
            return Err("materialize_deletions_threshold must be within 0..=1".into());
        }
        if self.max_rows_per_run == 0 || self.threads == 0 {
            return Err("max_rows_per_run and threads must be > 0".into());
        }
        Ok(())
    }
}

/// The shape of the base table at one version: what reads and commits pay
/// for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BaseHealth {
    /// The version read.
    pub version: u64,
    /// Fragments.
    pub fragments: usize,
    /// Rows readers see (physical minus deleted).
    pub live_rows: u64,
    /// Rows deleted but still stored (not yet materialized).
    pub deleted_rows: u64,
    /// Fragments with a deletion file.
    pub deletion_files: usize,
    /// Bytes of the version's data files, where the manifest records them.
    pub data_bytes: u64,
}

impl BaseHealth {
    /// The health of `base` from its manifest alone (no I/O).
    pub fn of(base: &Dataset) -> Self {
        let mut h = Self {
            version: base.manifest().version,
            ..Self::default()
        };
        for f in base.manifest().fragments.iter() {
            let physical = f.physical_rows.unwrap_or(0) as u64;
            let deleted = f
                .deletion_file
                .as_ref()
                .map(|d| d.num_deleted_rows.unwrap_or(0) as u64)
                .unwrap_or(0);
            h.fragments += 1;
            h.live_rows += physical.saturating_sub(deleted);
            h.deleted_rows += deleted;
            h.deletion_files += usize::from(f.deletion_file.is_some());
            h.data_bytes += f
                .files
                .iter()
                .filter_map(|d| d.file_size_bytes.get())
                .map(|n| n.get())
                .sum::<u64>();
        }
        h
    }

    /// Deleted rows as a share of live rows (0 for an empty table).
    pub fn deleted_share(&self) -> f64 {
        if self.live_rows == 0 {
            0.0
        } else {
            self.deleted_rows as f64 / self.live_rows as f64
        }
    }
}

/// What one maintenance run did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MaintenanceReport {
    /// The base before the run.
    pub before: BaseHealth,
    /// The base after it (equal to `before` when nothing was committed).
    pub after: BaseHealth,
    /// Fragments chosen for rewriting.
    pub chosen: usize,
    /// Fragments lance removed and added in the commit.
    pub fragments_removed: usize,
    /// See `fragments_removed`.
    pub fragments_added: usize,
    /// Whether a rewrite was committed.
    pub committed: bool,
    /// Why nothing was rewritten, when nothing was.
    pub skipped: Option<String>,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// One fragment as the planner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FragmentShape {
    pub id: u64,
    pub physical_rows: usize,
    pub deleted_rows: usize,
}

/// The fragments a run rewrites (ascending ids): those past the deletion
/// threshold, and the small ones of the largest tier holding
/// `tier_fanout` fragments together with every smaller one.
pub(crate) fn choose(fragments: &[FragmentShape], config: &MaintenanceConfig) -> Vec<u64> {
    let fanout = config.tier_fanout.max(2);
    let target = config.target_rows_per_fragment.max(1);
    let mut chosen = Vec::new();
    // Per tier, its small fragments (tier 0: the largest small ones).
    let mut tiers: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for f in fragments {
        let deleted_share = if f.physical_rows == 0 {
            1.0
        } else {
            f.deleted_rows as f32 / f.physical_rows as f32
        };
        if f.deleted_rows > 0 && deleted_share > config.materialize_deletions_threshold {
            chosen.push(f.id);
        } else if f.physical_rows < target {
            let mut tier = 0u32;
            let mut floor = target / fanout;
            while f.physical_rows < floor && floor > 0 && tier < 16 {
                tier += 1;
                floor /= fanout;
            }
            tiers.entry(tier).or_default().push(f.id);
        }
    }
    if let Some(full) = tiers
        .iter()
        .find(|(_, ids)| ids.len() >= fanout)
        .map(|(t, _)| *t)
    {
        for (_, ids) in tiers.range(full..) {
            chosen.extend(ids);
        }
    }
    chosen.sort_unstable();
    chosen
}

impl Compactor {
    /// One maintenance run over the base table: the fragments [`choose`]
    /// picks are rewritten by lance's `compact_files` in one `Rewrite`
    /// commit (see the module docs for the rules and why this is safe
    /// against concurrent merges, writers and readers). Nothing is
    /// committed when nothing is chosen, when a reader index is behind the
    /// compacted generations, or when the table has no `__lance_mem_wal`
    /// index. A rewrite that loses to a concurrent commit is reported as
    /// skipped (the next run plans again).
    pub async fn maintain_base(&self) -> Result<MaintenanceReport> {
        let span = tracing::info_span!("maintain_base", table = %self.loc.uri);
        let started = Instant::now();
        let out = self.maintain_inner().instrument(span).await;
        let mut report = out?;
        report.seconds = started.elapsed().as_secs_f64();
        record(&report);
        Ok(report)
    }

    async fn maintain_inner(&self) -> Result<MaintenanceReport> {
        let uri = self.loc.uri.as_str();
        let config = self.config.maintenance.clone().unwrap_or_default();
        config
            .validate()
            .map_err(|e| CompactorError::invalid(uri, format!("maintenance: {e}")))?;
        let base = open_dataset(&self.lance, &self.loc).await?;
        let health = BaseHealth::of(&base);
        let mut report = MaintenanceReport {
            before: health.clone(),
            after: health,
            ..Default::default()
        };
        let table = BaseTable::of_dataset(&base, uri).await?;
        if table.mem_wal.is_none() {
            report.skipped = Some("the table has no `__lance_mem_wal` index".into());
            return Ok(report);
        }
        let compacted = compacted_generations(uri, table.mem_wal.as_ref())?;
        let behind: Vec<String> = table
            .reader_indexes()
            .into_iter()
            .filter(|name| {
                compacted
                    .iter()
                    .any(|(shard, g)| table.index_caught_up(name, shard.uuid().as_bytes()) < *g)
            })
            .collect();
        if !behind.is_empty() {
            report.skipped = Some(format!(
                "indexes {behind:?} are behind the compacted generations"
            ));
            return Ok(report);
        }
        let shapes: Vec<FragmentShape> = base
            .manifest()
            .fragments
            .iter()
            .map(|f| FragmentShape {
                id: f.id,
                physical_rows: f.physical_rows.unwrap_or(0),
                deleted_rows: f
                    .deletion_file
                    .as_ref()
                    .and_then(|d| d.num_deleted_rows)
                    .unwrap_or(0),
            })
            .collect();
        let chosen = choose(&shapes, &config);
        report.chosen = chosen.len();
        if chosen.is_empty() {
            report.skipped = Some("nothing to rewrite".into());
            return Ok(report);
        }
        let excluded: Vec<u32> = shapes
            .iter()
            .filter(|f| chosen.binary_search(&f.id).is_err())
            .filter_map(|f| u32::try_from(f.id).ok())
            .collect();
        let options = CompactionOptions {
            target_rows_per_fragment: config.target_rows_per_fragment,
            materialize_deletions: true,
            materialize_deletions_threshold: config.materialize_deletions_threshold,
            num_threads: Some(config.threads),
            max_source_rows: Some(config.max_rows_per_run),
            excluded_fragment_ids: excluded,
            ..CompactionOptions::default()
        };
        let mut ds = (*base).clone();
        match compact_files(&mut ds, options, None).await {
            Ok(m) => {
                report.fragments_removed = m.fragments_removed;
                report.fragments_added = m.fragments_added;
                report.committed = m.fragments_removed > 0 || m.fragments_added > 0;
                if report.committed {
                    memwal_store::crash_point("compactor::after_maintenance");
                    report.after = BaseHealth::of(&ds);
                } else {
                    report.skipped = Some("lance planned no rewrite".into());
                }
                Ok(report)
            }
            Err(e) if is_conflict(&e) => {
                metrics::counter!(names::CONFLICTS).increment(1);
                tracing::debug!(error = %e, "maintenance lost a commit race; the next run plans again");
                report.skipped = Some(format!("lost a commit race: {e}"));
                Ok(report)
            }
            Err(e) => Err(CompactorError::Lance {
                uri: uri.to_string(),
                what: format!("rewriting {} fragments of the base table", chosen.len()),
                source: Box::new(e),
            }),
        }
    }
}

/// Sets the base-health gauges and counts the run.
fn record(report: &MaintenanceReport) {
    let h = &report.after;
    metrics::gauge!(names::BASE_FRAGMENTS).set(h.fragments as f64);
    metrics::gauge!(names::BASE_LIVE_ROWS).set(h.live_rows as f64);
    metrics::gauge!(names::BASE_DELETED_ROWS).set(h.deleted_rows as f64);
    metrics::gauge!(names::BASE_DELETION_FILES).set(h.deletion_files as f64);
    metrics::gauge!(names::BASE_DATA_BYTES).set(h.data_bytes as f64);
    if report.committed {
        metrics::counter!(names::MAINTENANCE_COMMITS).increment(1);
        metrics::counter!(names::MAINTENANCE_FRAGMENTS_REWRITTEN)
            .increment(report.fragments_removed as u64);
        metrics::histogram!(names::MAINTENANCE_SECONDS).record(report.seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frag(id: u64, rows: usize, deleted: usize) -> FragmentShape {
        FragmentShape {
            id,
            physical_rows: rows,
            deleted_rows: deleted,
        }
    }

    fn config() -> MaintenanceConfig {
        MaintenanceConfig {
            target_rows_per_fragment: 1 << 20,
            tier_fanout: 8,
            ..MaintenanceConfig::default()
        }
    }

    #[test]
    fn a_full_tier_is_merged_with_every_smaller_fragment_and_nothing_larger() {
        // One large fragment, one mid-size (tier 1: 16k..128k), seven small
        // ones (tier 2: 2k..16k) and one tiny one (tier 3).
        let mut frags = vec![frag(0, 900_000, 0), frag(1, 100_000, 0)];
        frags.extend((2..9).map(|i| frag(i, 10_000, 0)));
        frags.push(frag(9, 1_000, 0));
        // Tier 2 holds 7, tier 3 one: nothing is full.
        assert_eq!(choose(&frags, &config()), Vec::<u64>::new());
        // An eighth tier-2 fragment fills it: tiers 2 and 3 are merged, the
        // larger fragments are left alone.
        frags.push(frag(10, 10_000, 0));
        assert_eq!(choose(&frags, &config()), vec![2, 3, 4, 5, 6, 7, 8, 9, 10]);
    }

    #[test]
    fn fragments_past_the_deletion_threshold_are_rewritten_whatever_their_size() {
        let frags = vec![
            frag(0, 2_000_000, 150_000),
            frag(1, 2_000_000, 250_000),
            frag(2, 5_000, 501),
            frag(3, 5_000, 0),
        ];
        assert_eq!(choose(&frags, &config()), vec![1, 2]);
    }

    #[test]
    fn bad_settings_are_named() {
        let bad = MaintenanceConfig {
            tier_fanout: 1,
            ..config()
        };
        assert!(bad.validate().unwrap_err().contains("tier_fanout"));
        let bad = MaintenanceConfig {
            materialize_deletions_threshold: f32::NAN,
            ..config()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .contains("materialize_deletions_threshold"));
    }
}
