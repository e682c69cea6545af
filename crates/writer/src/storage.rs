//! The writer's storage operations: one SSTable write (with the
//! maintained indexes of the generation's schema) and one manifest update
//! publishing a generation. No retries and no ordering here: `flusher.rs`
//! decides when and how often these run.

use std::sync::Arc;

use memwal_fencing::{FencingError, ManifestStore, ShardManifest};
use memwal_memtable::{FlushData, TableSchema};
use memwal_sstable::{IndexSpec, LanceStore, SsTableWriter, WrittenSsTable};
use memwal_table::BaseTable;
use tracing::Instrument;

use crate::{Error, Result};

/// What writing and publishing need, shared by `open` (replayed
/// generations) and the background flusher.
#[derive(Debug, Clone)]
pub(crate) struct Storage {
    pub manifests: Arc<ManifestStore>,
    pub epoch: u64,
    pub sstables: SsTableWriter,
    /// The base table, read at each publish for the shard's compaction
    /// progress (SSTables it holds are dropped from the manifest).
    pub base: Arc<LanceStore>,
    pub base_root: object_store::path::Path,
    /// The shard's metric handles.
    pub meters: Arc<crate::stats::Meters>,
    /// The maintained indexes the latest base-table read resolved (what
    /// the next SSTable carries if the base cannot be read then).
    pub indexes: Arc<parking_lot::Mutex<MaintainedSet>>,
}

/// The maintained indexes as last resolved, and the names already warned
/// about (each skipped index is reported once).
#[derive(Debug, Default)]
pub(crate) struct MaintainedSet {
    pub specs: Arc<[IndexSpec]>,
    pub warned: std::collections::BTreeSet<String>,
}

impl Storage {
    /// One attempt at writing generation `generation`'s SSTable (a fresh
    /// directory every time) in `schema`, the schema its rows were taken
    /// in.
    pub(crate) async fn write(
        &self,
        generation: u64,
        schema: &TableSchema,
        data: &FlushData,
    ) -> Result<WrittenSsTable> {
        let span = tracing::info_span!("flush", generation, rows = data.stats.physical_rows);
        let indexes = self.maintained_indexes(schema).await;
        self.sstables
            .write_indexed(schema, generation, data, &indexes)
            .instrument(span)
            .await
            .map_err(|e| {
                Error::from_sstable(
                    e,
                    &format!("writing the SSTable of generation {generation}"),
                )
            })
    }

    /// One manifest update publishing `written` as generation `generation`
    /// (`None`: a generation that holds no rows, which only moves the
    /// cursor and the generation counter), covering WAL positions up to
    /// `last_position`. Idempotent: a generation already listed is not
    /// added again; the cursor, `current_generation` and the WAL hint only
    /// move forward. Refuses ([`Error::Corrupt`]) a generation that is not
    /// the manifest's `current_generation` (`in_order`, the live path) or
    /// is below it (replay, which may skip numbers another writer left).
    pub(crate) async fn publish(
        &self,
        generation: u64,
        written: Option<&WrittenSsTable>,
        last_position: u64,
        last_seen: u64,
        in_order: bool,
    ) -> Result<ShardManifest> {
        let span = tracing::info_span!("publish", generation, last_position);
        let next_generation = generation
            .checked_add(1)
            .ok_or_else(|| Error::corrupt(format!("generation {generation} cannot be followed")))?;
        let manifest_dir = self.manifests.layout().manifest_dir().to_string();
        let covered = self.covered_generation().await;
        self.manifests
            .update(self.epoch, |m| {
                if let Some(c) = covered {
                    m.sstables.retain(|s| s.generation > c);
                }
                let listed = m.sstables.iter().any(|s| s.generation == generation);
                if !listed {
                    let out_of_order = if in_order {
                        m.current_generation != generation
                    } else {
                        m.current_generation > generation
                    };
                    if out_of_order {
                        return Err(FencingError::Corrupt {
                            path: manifest_dir.clone(),
                            reason: format!(
                                "publishing generation {generation}, but the manifest's \
                                 current_generation is {}: generations publish strictly in order",
                                m.current_generation
                            ),
                        });
                    }
                    if let Some(w) = written {
                        m.sstables.push(w.sstable.clone());
                    }
                }
                m.replay_after_wal_entry_position =
                    m.replay_after_wal_entry_position.max(last_position);
                m.current_generation = m.current_generation.max(next_generation);
                m.wal_entry_position_last_seen = m
                    .wal_entry_position_last_seen
                    .max(last_seen)
                    .max(last_position);
                Ok(())
            })
            .instrument(span)
            .await
            .map_err(|e| Error::from_fencing(e, &format!("publishing generation {generation}")))
    }
}

impl Storage {
    /// The indexes an SSTable written now carries: the base table's
    /// maintained set as of its latest version (under `maintain_all_indexes`
    /// an index created since the last flush is included, a dropped one
    /// left out), restricted to columns `schema` (the generation's) has,
    /// under the same field id; the last set resolved when the base cannot
    /// be read or resolved now.
    async fn maintained_indexes(&self, schema: &TableSchema) -> Arc<[IndexSpec]> {
        let resolved = BaseTable::load(&self.base, &self.base_root)
            .await
            .and_then(|t| t.maintained_indexes());
        let mut set = self.indexes.lock();
        match resolved {
            Ok(m) => {
                let mut specs = Vec::with_capacity(m.specs.len());
                let mut skipped = m.skipped;
                for spec in m.specs {
                    match schema.storage_schema().field_with_name(&spec.column) {
                        Ok(f)
                            if f.metadata().get(memwal_memtable::FIELD_ID_KEY)
                                == Some(&spec.field_id.to_string()) =>
                        {
                            specs.push(spec)
                        }
                        _ => skipped.push((
                            spec.name,
                            format!(
                                "its column `{}` is not in this writer's schema",
                                spec.column
                            ),
                        )),
                    }
                }
                for (name, reason) in skipped {
                    if set.warned.insert(name.clone()) {
                        self.meters.indexes_skipped.increment(1);
                        tracing::warn!(index = %name, %reason, "a base-table index is not mirrored into SSTables");
                    }
                }
                set.specs = specs.into();
            }
            Err(e) => {
                tracing::warn!(error = %e, "resolving the maintained indexes; using the last resolved set")
            }
        }
        set.specs.clone()
    }

    /// The highest generation of the shard no read needs an SSTable for
    /// any more, in the latest base table version: compacted and covered
    /// by every index reads may use ([`BaseTable::covered_generation`]);
    /// `None` when the base cannot be read now (pruning then waits for a
    /// later publish: it only keeps manifests small, nothing depends on it;
    /// a stall's refresh keeps its count).
    pub(crate) async fn covered_generation(&self) -> Option<u64> {
        let shard = self.manifests.shard().uuid();
        match BaseTable::load(&self.base, &self.base_root).await {
            Ok(table) => Some(table.covered_generation(shard.as_bytes())),
            Err(e) => {
                tracing::warn!(error = %e, "reading the base table's compaction progress");
                None
            }
        }
    }
}
