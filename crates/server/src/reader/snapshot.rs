//! Reading a served table back as of now: the base table, every shard's
//! published SSTables, and the memtables of the shard writers this daemon
//! holds, merged by primary key (last write wins, tombstones hide rows).
//!
//! Snapshot: each held writer is read first ([`memwal::ShardWriter::read_snapshot`]:
//! its published generation and its acknowledged unpublished rows, in one
//! instant); then the published view (`table_view`, manifests before the
//! base), of which only the SSTables up to that generation are read for
//! that shard, the rest being in the snapshot. Every put acknowledged
//! before the read began is in it, no row whose WAL write is not durable
//! is, and no key appears twice. A snapshot of a writer the view shows
//! fenced (its manifest names another epoch) is dropped. A shard whose
//! writer here is down (or whose state is corrupt) refuses the read. Every
//! shard of the view without a snapshot (another daemon's, one claimed
//! away from this daemon, one no writer holds) is read with its
//! unpublished rows from its WAL (`tails.rs`), so a read shows every
//! shard's acknowledged rows whichever daemon took them. Rows compacted
//! into the base after the read began may show (never older than the
//! snapshot). The rules and their tests: docs/design/fresh-reads.md.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_row::{RowConverter, SortField};
use arrow_schema::{Field, Schema, SchemaRef};

use crate::reader::tails::TailError;
use crate::slots::Slot;
use crate::{ServerError, TableHost};

/// The storage schema's tombstone column (memtable and WAL batches).
const TOMBSTONE: &str = memwal_memtable::TOMBSTONE_COLUMN;

/// Each held writer's snapshot, by shard.
pub(crate) type Snapshots = HashMap<memwal::ShardId, memwal::ReadSnapshot>;

/// How many times a read takes its snapshots and view when a shard
/// reopens here meanwhile ([`TableHost::snapshot_and_view`]).
const READ_ATTEMPTS: u32 = 3;

impl TableHost {
    /// The two reads every read starts with, in this order: each held
    /// writer's snapshot (its published generation and acknowledged
    /// unpublished rows), then the published view ([`Self::view_after`],
    /// which drops the snapshots of fenced writers).
    ///
    /// `index`: read for a search served by that index, whose view keeps
    /// the SSTables above the index's catch-up generation (`None`: above
    /// what the base holds). Refused ([`ServerError::Down`], or
    /// `DATA_LOSS` for corrupt state) while a shard this host holds is
    /// down or failed: see [`Self::snapshots`].
    ///
    /// When a snapshot is dropped as fenced while this host holds the
    /// shard's new writer (it reopened the shard during the read: its
    /// writer may hold the acknowledged rows it replayed, not yet
    /// published), both reads are taken again, up to [`READ_ATTEMPTS`]
    /// times in all; then the read is refused (`UNAVAILABLE`), never
    /// answered without those rows.
    pub(crate) async fn snapshot_and_view(
        &self,
        index: Option<&str>,
    ) -> Result<(Snapshots, memwal_table::TableView), ServerError> {
        let mut attempt = 1;
        loop {
            let mut snapshots = self.snapshots()?;
            let (view, retake) = self.view_after(&mut snapshots, index).await?;
            let why = if retake {
                "a shard reopened here"
            } else if self.read_tails(&mut snapshots, &view).await? {
                "a shard's WAL was published past what the read's view had"
            } else {
                return Ok((snapshots, view));
            };
            if attempt >= READ_ATTEMPTS {
                // Never answered from a state that may miss acknowledged rows.
                return Err(ServerError::Down {
                    table: self.name().to_string(),
                    shard: "changing during the read".into(),
                    cause: format!("{why} during each of {READ_ATTEMPTS} attempts of this read"),
                    down_secs: 0,
                    retry_in_ms: 0,
                });
            }
            tracing::debug!(table = %self.name(), attempt, why, "reading again");
            attempt += 1;
        }
    }

    /// Adds to `snapshots`, for every shard of `view` without one (held by
    /// another daemon, claimed away from this one, or by no writer), the
    /// rows its WAL holds above the view's replay cursor, of generations
    /// neither its SSTables in the view nor the view's base (or index)
    /// hold (`tails.rs`), as a snapshot at the view's writer epoch.
    ///
    /// Returns whether some shard's latest manifest has moved its cursor
    /// to or past the position that ended its WAL read: that position may
    /// have been deleted by a WAL GC rather than never written, so the read
    /// must be taken again.
    async fn read_tails(
        &self,
        snapshots: &mut Snapshots,
        view: &memwal_table::TableView,
    ) -> Result<bool, ServerError> {
        // The chaos suite's broken variant reads other writers' shards as
        // published (its read checks must catch it).
        if memwal_store::broken("broken::read_tails_skipped") {
            return Ok(false);
        }
        let shape = self.shape();
        let reader = self.reader();
        let account = reader.account.pool();
        let reads = view
            .shards
            .iter()
            .filter(|s| !snapshots.contains_key(&s.shard))
            .map(|s| {
                let schema = &shape.validator;
                let account = &account;
                async move {
                    let min_generation = s.current_generation.max(s.floor.saturating_add(1));
                    let snapshot = |batches| memwal::ReadSnapshot {
                        shard: s.shard,
                        epoch: s.writer_epoch,
                        published_generation: min_generation - 1,
                        batches,
                    };
                    if reader.tails.at_rest(s.shard, s.version) {
                        return Ok((snapshot(Vec::new()), false));
                    }
                    let wal = reader.owners.wal(self.loc(), s.shard);
                    let read = reader
                        .tails
                        .read(
                            &wal,
                            s.replay_after,
                            min_generation,
                            schema,
                            account.as_ref(),
                        )
                        .await
                        .map_err(|e| match e {
                            TailError::Wal(source) => ServerError::WalTail {
                                table: self.name().to_string(),
                                shard: s.shard.to_string(),
                                source: Box::new(source),
                            },
                            TailError::OverBudget(source) => ServerError::OverBudget {
                                table: self.name().to_string(),
                                what: "keeping another writer's unpublished rows",
                                source,
                            },
                        })?;
                    let latest = reader
                        .owners
                        .latest(self.loc(), s.shard)
                        .await
                        .map_err(|e| ServerError::Read {
                            table: self.name().to_string(),
                            what: "reading a shard's manifest",
                            source: memwal_table::TableError::Manifest {
                                uri: self.loc().uri.clone(),
                                shard: s.shard,
                                source: Box::new(e),
                            },
                        })?;
                    let moved = latest.is_some_and(|l| l.replay_after >= read.end);
                    Ok::<_, ServerError>((snapshot(read.batches), moved))
                }
            });
        let read = futures::future::try_join_all(reads).await?;
        let mut moved = false;
        let mut shards = HashSet::new();
        for (snapshot, m) in read {
            moved |= m;
            shards.insert(snapshot.shard);
            if !snapshot.batches.is_empty() {
                metrics::counter!("memwal_server_wal_tail_reads_total", "table" => self.name().to_string())
                    .increment(1);
            }
            snapshots.insert(snapshot.shard, snapshot);
        }
        reader.tails.keep_only(&shards);
        Ok(moved)
    }

    /// Each held writer's snapshot (its published generation and
    /// acknowledged unpublished rows), taken now; a writer closing (idle)
    /// or closed is read too (its memtables keep what it did not
    /// publish).
    ///
    /// A shard whose writer stopped on a storage failure (down, until a
    /// reopen replays its WAL) or whose stored state is corrupt (failed)
    /// holds acknowledged rows only in its WAL: reading it as published
    /// would answer from an older state, so the read is refused, naming
    /// the shard: [`ServerError::Down`] (`UNAVAILABLE`) or
    /// [`ServerError::Writer`] with [`memwal::Error::Corrupt`]
    /// (`DATA_LOSS`). A shard lost to another writer (fenced) is read as
    /// published: by its new owner.
    pub(crate) fn snapshots(&self) -> Result<Snapshots, ServerError> {
        let mut snapshots = HashMap::new();
        for (key, slot) in self.shards().snapshot() {
            let w = match &slot {
                Slot::Live(w) | Slot::Closing(w) => w,
                Slot::Lost { .. } => continue,
                Slot::Down { .. } | Slot::Failed { .. } => {
                    return Err(self.refused_read(&slot));
                }
            };
            match w.read_snapshot() {
                Ok(s) => {
                    snapshots.insert(s.shard, s);
                }
                Err(e) if e.is_fenced() => {
                    self.lose(&key, w.shard(), e.to_string());
                }
                Err(_) => {
                    // It stopped just now: the slot says how (down,
                    // failed, or lost).
                    match self.shards().cell(&key).current() {
                        Some(slot @ (Slot::Down { .. } | Slot::Failed { .. })) => {
                            return Err(self.refused_read(&slot));
                        }
                        Some(Slot::Lost { .. }) => {}
                        _ => return Err(self.refused_read(&slot)),
                    }
                }
            }
        }
        Ok(snapshots)
    }

    /// The refusal of a read that meets `slot` (down or failed), counted.
    fn refused_read(&self, slot: &Slot) -> ServerError {
        let e = self.refusal(slot);
        metrics::counter!("memwal_server_reads_refused_total", "table" => self.name().to_string())
            .increment(1);
        tracing::info!(table = %self.name(), shard = %slot.shard(), error = %e,
            "read refused: a shard's acknowledged rows are only in its WAL");
        e
    }

    /// The published view, read after `snapshots` were taken, of which a
    /// held shard keeps only the SSTables up to its snapshot's generation
    /// (the later ones repeat rows of the snapshot). See `index` at
    /// [`Self::snapshot_and_view`].
    ///
    /// A snapshot whose writer epoch is not its shard's `writer_epoch` in
    /// the view's manifest was taken from a fenced writer (another one
    /// claimed the shard; its rows may be overwritten, deleted or
    /// published by the new owner): it is removed from `snapshots`, the
    /// shard is read as published (every SSTable the view lists), and the
    /// writer's slot is marked lost. Returns the view and whether a
    /// dropped snapshot's shard is held here now by its new writer (the
    /// caller reads again).
    async fn view_after(
        &self,
        snapshots: &mut Snapshots,
        index: Option<&str>,
    ) -> Result<(memwal_table::TableView, bool), ServerError> {
        // Tests widen this window (`sleep`) to prove the order holds.
        memwal_store::crash_point("server::read_after_snapshots");
        let mut view =
            memwal_table::table_view(self.loc(), index, &memwal_store::RetryPolicy::default())
                .await
                .map_err(|source| ServerError::Read {
                    table: self.name().to_string(),
                    what: "reading the published view",
                    source,
                })?;
        let mut retake = false;
        for shard in &mut view.shards {
            let Some(s) = snapshots.get(&shard.shard) else {
                continue;
            };
            // The chaos suite's broken variant serves a fenced writer's
            // rows anyway (its read checks must catch it).
            if s.epoch != shard.writer_epoch
                && !memwal_store::broken("broken::read_fenced_memtable")
            {
                let (id, epoch) = (s.shard, s.epoch);
                snapshots.remove(&id);
                retake |= self.fenced_in_read(id, epoch, shard.writer_epoch);
                continue;
            }
            shard
                .sstables
                .retain(|t| t.generation <= s.published_generation);
        }
        Ok((view, retake))
    }

    /// A read found that the writer of `shard` at `epoch` is fenced (its
    /// manifest names `owner`): its slot, if still that writer's, is lost.
    /// Returns whether this host holds the shard's writer at `owner` now.
    fn fenced_in_read(&self, shard: memwal::ShardId, epoch: u64, owner: u64) -> bool {
        metrics::counter!("memwal_server_fenced_snapshots_dropped_total", "table" => self.name().to_string())
            .increment(1);
        let reason = format!(
            "the shard's manifest names writer epoch {owner}; this writer holds epoch {epoch} \
             (another writer claimed the shard)"
        );
        let mut held = false;
        for (key, cell) in self.shards().cells() {
            match cell.current() {
                Some(Slot::Live(w) | Slot::Closing(w)) if w.shard() == shard => {
                    if w.epoch() == owner {
                        held = true;
                    } else if w.epoch() == epoch && owner > epoch {
                        self.lose(&key, shard, reason.clone());
                    }
                }
                _ => {}
            }
        }
        if !held {
            tracing::warn!(table = %self.name(), %shard, epoch, owner,
                "a read dropped a fenced writer's unpublished rows; the shard is read as published");
        }
        held
    }
}

/// `published` (one row per key) overlaid with `unflushed` (storage
/// batches applied in order, tombstones deleting): one row per live key,
/// in `schema`.
pub(crate) fn merge(
    schema: &SchemaRef,
    keys: &[String],
    published: &RecordBatch,
    unflushed: &[RecordBatch],
) -> Result<RecordBatch, String> {
    // Sources share one all-nullable schema (a tombstone row has nulls in
    // the table's non-nullable value columns; it is never picked).
    let loose = Arc::new(Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    ));
    let project = |b: &RecordBatch| -> Result<RecordBatch, String> {
        let columns = loose
            .fields()
            .iter()
            .map(|f| column_or_nulls(b, f))
            .collect::<Vec<ArrayRef>>();
        RecordBatch::try_new(loose.clone(), columns).map_err(|e| e.to_string())
    };
    let mut sources = vec![project(published)?];
    let mut tombstones = vec![None];
    for b in unflushed {
        sources.push(project(b)?);
        let t = b
            .column_by_name(TOMBSTONE)
            .map(|c| c.as_boolean().clone())
            .ok_or_else(|| format!("an unflushed batch lacks `{TOMBSTONE}`"))?;
        tombstones.push(Some(t));
    }
    let key_columns: Vec<usize> = keys
        .iter()
        .map(|k| schema.index_of(k).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let converter = RowConverter::new(
        key_columns
            .iter()
            .map(|&i| SortField::new(schema.field(i).data_type().clone()))
            .collect(),
    )
    .map_err(|e| e.to_string())?;
    // Latest row per key (None: deleted), keys in first-seen order.
    let mut latest: HashMap<Box<[u8]>, Option<(usize, usize)>> = HashMap::new();
    let mut order: Vec<Box<[u8]>> = Vec::new();
    for (s, batch) in sources.iter().enumerate() {
        let cols: Vec<ArrayRef> = key_columns
            .iter()
            .map(|&i| batch.column(i).clone())
            .collect();
        let rows = converter
            .convert_columns(&cols)
            .map_err(|e| e.to_string())?;
        for r in 0..batch.num_rows() {
            let deleted = tombstones[s]
                .as_ref()
                .is_some_and(|t| t.is_valid(r) && t.value(r));
            let pick = (!deleted).then_some((s, r));
            match latest.entry(rows.row(r).as_ref().into()) {
                Entry::Occupied(mut e) => *e.get_mut() = pick,
                Entry::Vacant(e) => {
                    order.push(e.key().clone());
                    e.insert(pick);
                }
            }
        }
    }
    let picks: Vec<(usize, usize)> = order.iter().filter_map(|k| latest[k]).collect();
    let columns = (0..loose.fields().len())
        .map(|c| {
            let arrays: Vec<&dyn Array> = sources.iter().map(|b| b.column(c).as_ref()).collect();
            arrow_select::interleave::interleave(&arrays, &picks).map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| e.to_string())
}

/// `b`'s column for the table column `f`: matched by Lance field id where
/// both carry one (a column renamed since `b` was taken keeps its
/// values), else by name; nulls where `b` predates the column (a
/// generation taken before it was added).
pub(crate) fn column_or_nulls(b: &RecordBatch, f: &Field) -> ArrayRef {
    let schema = b.schema();
    let by_id = field_id(f).and_then(|want| {
        schema
            .fields()
            .iter()
            .position(|g| g.name() != TOMBSTONE && field_id(g) == Some(want))
    });
    let found = match by_id {
        Some(i) => Some(b.column(i).clone()),
        None => b.column_by_name(f.name()).cloned(),
    };
    found.unwrap_or_else(|| arrow_array::new_null_array(f.data_type(), b.num_rows()))
}

/// The Lance field id `f` carries, if any.
pub(crate) fn field_id(f: &Field) -> Option<i32> {
    f.metadata()
        .get(memwal_memtable::FIELD_ID_KEY)
        .and_then(|v| v.parse().ok())
}
