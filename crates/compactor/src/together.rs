//! Merging several shards' backlogs in one commit.
//!
//! A keyed merge costs about the same whether it carries one shard's
//! generations or four: each pass joins its rows against the base's keys.
//! Committing shard after shard makes a cycle's cost grow with the number
//! of shards, and every commit is one more base version, one more deletion
//! file per touched fragment. So a cycle first merges the pending
//! generations of every shard together, in groups bounded by
//! `max_commit_bytes` (and `max_group` generations per shard), each group
//! one set of passes whose commit advances the marker of every shard in it
//! (`compacted_sstables` takes one entry per shard).
//!
//! Sound because the shards of a group own disjoint keys: rows are routed
//! to shards by the table's sharding spec, so no key has operations in two
//! shards, and last-write-wins within each shard is what the group's
//! resolution (`Newest`) applies. A keyed table with a manually created
//! shard (spec 0, rows not routed) is merged shard by shard only.
//!
//! Anything unusual ends the combined pass and leaves the rest to the
//! per-shard path (`compact.rs`), which isolates a damaged SSTable to its
//! own shard and reports each shard's error: a shard whose manifest or
//! SSTable cannot be read, a merge that fails for another reason than a
//! lost commit race, or a group that would hold one shard only.

use std::collections::BTreeMap;

use memwal_fencing::ShardId;
use memwal_memtable::TableSchema;
use memwal_sstable::SsTableReader;
use memwal_table::{compacted_generations, latest_manifest, open_dataset, BaseTable};
use tokio::time::Instant;
use tracing::Instrument;

use crate::compact::is_conflict;
use crate::merge::{merge_sstables, Attempt};
use crate::{names, Compactor, Result, ShardReport};

impl Compactor {
    /// Merges the pending generations of `shards` in commits shared by
    /// several shards, while at least two shards have pending generations;
    /// returns what it did per shard. Whatever it leaves (one shard's
    /// backlog, or everything after a failure) the per-shard path merges.
    /// The guarantees of [`Compactor::run_once`] hold for every commit.
    pub(crate) async fn compact_together(
        &self,
        shards: &[ShardId],
    ) -> BTreeMap<ShardId, ShardReport> {
        let mut reports = BTreeMap::new();
        if shards.len() < 2 {
            return reports;
        }
        let span = tracing::info_span!("compact_together", shards = shards.len());
        if let Err(e) = self
            .together_inner(shards, &mut reports)
            .instrument(span)
            .await
        {
            tracing::info!(error = %e, "merging shards together stopped; merging them one by one");
        }
        reports
    }

    async fn together_inner(
        &self,
        shards: &[ShardId],
        reports: &mut BTreeMap<ShardId, ShardReport>,
    ) -> Result<()> {
        let uri = self.loc.uri.as_str();
        let mut base = open_dataset(&self.lance, &self.loc).await?;
        let table = BaseTable::of_dataset(&base, uri).await?;
        let keyed = !base.schema().unenforced_primary_key().is_empty();
        let schema = TableSchema::new(table.schema.clone())
            .map_err(|e| crate::CompactorError::invalid(uri, format!("base table schema: {e}")))?;
        let mut compacted = compacted_generations(uri, table.mem_wal.as_ref())?;
        let mut pending = Vec::new();
        for &shard in shards {
            let Some(manifest) = latest_manifest(&self.loc, shard, &self.config.retry).await?
            else {
                continue;
            };
            if keyed && manifest.shard_spec_id == 0 {
                // A manual shard's keys may be any other shard's too.
                return Ok(());
            }
            let done = compacted.get(&shard).copied().unwrap_or(0);
            let mut list: Vec<_> = manifest
                .sstables
                .into_iter()
                .filter(|s| s.generation > done)
                .collect();
            list.sort_by_key(|s| s.generation);
            if !list.is_empty() {
                pending.push((shard, list));
            }
        }
        loop {
            let group = self.shared_group(&pending, &compacted);
            let in_group: std::collections::BTreeSet<_> = group.iter().map(|(s, _)| s).collect();
            if in_group.len() < 2 {
                return Ok(());
            }
            let started = Instant::now();
            let mut readers = Vec::with_capacity(group.len());
            for (shard, sst) in &group {
                let layout = memwal_fencing::ShardLayout::new(&self.loc.root, *shard);
                readers.push(
                    SsTableReader::open(&self.lance, &layout, &sst.path, &schema)
                        .await
                        .map_err(|source| crate::CompactorError::SsTable {
                            shard: *shard,
                            dir: sst.path.clone(),
                            source: Box::new(source),
                        })?,
                );
            }
            let datasets: Vec<_> = readers.iter().map(|r| r.dataset()).collect();
            let mut markers: BTreeMap<ShardId, u64> = BTreeMap::new();
            for (shard, sst) in &group {
                markers.insert(*shard, sst.generation);
            }
            let markers: Vec<(ShardId, u64)> = markers.into_iter().collect();
            let dirs = group
                .iter()
                .map(|(_, s)| s.path.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            let mut attempts = 0u32;
            loop {
                attempts += 1;
                let step = tracing::info_span!("compact_shared", shards = markers.len(), attempts);
                match merge_sstables(base.clone(), &datasets, &markers, &dirs, uri)
                    .instrument(step)
                    .await
                {
                    Ok((ds, merged)) => {
                        memwal_store::crash_point("compactor::after_commit");
                        base = ds;
                        for (i, (shard, last)) in markers.iter().enumerate() {
                            let before = compacted.get(shard).copied().unwrap_or(0);
                            compacted.insert(*shard, *last);
                            let r = reports.entry(*shard).or_insert_with(|| ShardReport {
                                shard: Some(*shard),
                                compacted_before: before,
                                ..Default::default()
                            });
                            r.compacted_after = *last;
                            let gens: Vec<u64> = group
                                .iter()
                                .filter(|(s, _)| s == shard)
                                .map(|(_, sst)| sst.generation)
                                .collect();
                            r.merged.extend(&gens);
                            r.shared.extend(&gens);
                            if i == 0 {
                                // The commit's rows once, in its first
                                // shard's report.
                                r.rows_written += merged.rows_written;
                                r.tombstones += merged.tombstones;
                                r.commits += merged.commits;
                            }
                        }
                        metrics::counter!(names::GENERATIONS).increment(group.len() as u64);
                        metrics::counter!(names::ROWS).increment(merged.rows_written);
                        metrics::counter!(names::TOMBSTONES).increment(merged.tombstones);
                        metrics::histogram!(names::GENERATION_SECONDS)
                            .record(started.elapsed().as_secs_f64());
                        break;
                    }
                    Err(Attempt::Failed(e)) => return Err(e),
                    Err(Attempt::Commit(e)) => {
                        base = open_dataset(&self.lance, &self.loc).await?;
                        let recorded = compacted_generations(
                            uri,
                            BaseTable::of_dataset(&base, uri).await?.mem_wal.as_ref(),
                        )?;
                        let moved = markers.iter().any(|(shard, _)| {
                            recorded.get(shard).copied().unwrap_or(0)
                                > compacted.get(shard).copied().unwrap_or(0)
                        });
                        if moved {
                            // Another compactor merged some of them: plan
                            // the group again above the new markers.
                            compacted = recorded;
                            break;
                        }
                        if !is_conflict(&e) || attempts >= self.config.max_conflicts {
                            return Err(crate::CompactorError::Lance {
                                uri: uri.to_string(),
                                what: format!("merging generations of shards {markers:?}"),
                                source: Box::new(e),
                            });
                        }
                        metrics::counter!(names::CONFLICTS).increment(1);
                        tracing::debug!(error = %e, "commit conflict; retrying the shared group");
                    }
                }
            }
        }
    }

    /// The next shared group: per shard in order, its pending generations
    /// above the marker (at most `max_group`), while their in-memory size
    /// stays within `max_commit_bytes` (an SSTable that does not record it
    /// counts as 64 MiB); always at least one.
    fn shared_group(
        &self,
        pending: &[(ShardId, Vec<memwal_proto::SsTable>)],
        compacted: &BTreeMap<ShardId, u64>,
    ) -> Vec<(ShardId, memwal_proto::SsTable)> {
        let mut group = Vec::new();
        let mut bytes = 0u64;
        'shards: for (shard, list) in pending {
            let done = compacted.get(shard).copied().unwrap_or(0);
            for sst in list
                .iter()
                .filter(|s| s.generation > done)
                .take(self.config.max_group.max(1))
            {
                bytes += sst.in_memory_bytes.unwrap_or(64 << 20);
                if !group.is_empty() && bytes > self.config.max_commit_bytes {
                    break 'shards;
                }
                group.push((*shard, sst.clone()));
            }
        }
        group
    }
}
