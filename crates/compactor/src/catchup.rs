//! Bringing the base table's indexes up to the compacted generations.
//!
//! Compaction merges SSTable rows into the base table, but an index-served
//! read of the base (vector search with `fast_search`) finds them only once
//! the base index covers the merged fragments. Lance's `optimize_indices`
//! builds that coverage and, in its own commit, records `index_catchup` in
//! the `__lance_mem_wal` index: per index and shard, the compacted
//! generation the index now covers. Until an index has caught up past a
//! generation, readers still need that generation's SSTable: the read view
//! ([`crate::table_view`] with an index), garbage collection and the
//! writer's manifest pruning all keep it.

use std::collections::BTreeMap;
use tokio::time::Instant;

use lance::index::DatasetIndexExt;
use lance_index::optimize::OptimizeOptions;
use memwal_table::{compacted_generations, open_dataset, BaseTable};
use tracing::Instrument;

use crate::compact::is_conflict;
use crate::{names, Compactor, CompactorError, Result};

/// What one index catch-up did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CatchupReport {
    /// Indexes that were behind a compacted generation, with the largest
    /// number of generations they lagged by (over shards), before the run.
    pub behind: BTreeMap<String, u64>,
    /// Whether an index commit was made (none when nothing was behind).
    pub committed: bool,
    /// Commits lost to concurrent ones and retried.
    pub conflicts: u32,
    /// Wall time of the run, seconds.
    pub seconds: f64,
}

impl Compactor {
    /// Brings every index reads may use ([`BaseTable::reader_indexes`])
    /// up to the table's `compacted_sstables` with lance's
    /// `optimize_indices`, which records `index_catchup` in the same
    /// commit. Does nothing when no index is behind. A commit that loses to
    /// a concurrent one is retried on the new version, up to
    /// `max_conflicts` times.
    pub async fn catch_up_indexes(&self) -> Result<CatchupReport> {
        let span = tracing::info_span!("index_catchup", table = %self.loc.uri);
        self.catch_up_inner().instrument(span).await
    }

    async fn catch_up_inner(&self) -> Result<CatchupReport> {
        let uri = self.loc.uri.as_str();
        let started = Instant::now();
        let mut report = CatchupReport::default();
        loop {
            let base = open_dataset(&self.lance, &self.loc).await?;
            let table = BaseTable::of_dataset(&base, uri).await?;
            let behind = lagging(&table, uri)?;
            record_lag(&table, uri)?;
            if report.behind.is_empty() {
                report.behind = behind.clone();
            }
            if behind.is_empty() {
                break;
            }
            let options = OptimizeOptions::new().index_names(behind.keys().cloned().collect());
            let mut ds = (*base).clone();
            match ds.optimize_indices(&options).await {
                Ok(()) => {
                    report.committed = true;
                    let after = BaseTable::of_dataset(&ds, uri).await?;
                    record_lag(&after, uri)?;
                    break;
                }
                Err(e) if is_conflict(&e) && report.conflicts < self.config.max_conflicts => {
                    report.conflicts += 1;
                    metrics::counter!(names::CONFLICTS).increment(1);
                    tracing::debug!(error = %e, "index catch-up lost a commit race; retrying");
                }
                Err(e) => {
                    return Err(CompactorError::Lance {
                        uri: uri.to_string(),
                        what: format!(
                            "bringing indexes {:?} up to the compacted generations",
                            behind.keys().collect::<Vec<_>>()
                        ),
                        source: Box::new(e),
                    })
                }
            }
        }
        report.seconds = started.elapsed().as_secs_f64();
        if report.committed {
            metrics::histogram!(names::INDEX_CATCHUP_SECONDS).record(report.seconds);
        }
        Ok(report)
    }
}

/// Reader indexes behind some shard's compacted generation, with their
/// largest lag in generations.
fn lagging(table: &BaseTable, uri: &str) -> Result<BTreeMap<String, u64>> {
    let compacted = compacted_generations(uri, table.mem_wal.as_ref())?;
    let mut out = BTreeMap::new();
    for name in table.reader_indexes() {
        let lag = compacted
            .iter()
            .map(|(shard, g)| {
                g.saturating_sub(table.index_caught_up(&name, shard.uuid().as_bytes()))
            })
            .max()
            .unwrap_or(0);
        if lag > 0 {
            out.insert(name, lag);
        }
    }
    Ok(out)
}

/// Sets the per-index lag gauge.
fn record_lag(table: &BaseTable, uri: &str) -> Result<()> {
    let lag = lagging(table, uri)?;
    for name in table.reader_indexes() {
        let behind = lag.get(&name).copied().unwrap_or(0);
        metrics::gauge!(names::INDEX_LAG_GENERATIONS, "index" => name).set(behind as f64);
    }
    Ok(())
}
