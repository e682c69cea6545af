//! Flush and publish: SSTable writes (several in flight) and manifest
//! publishes strictly in generation order.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use memwal_fencing::{FencingError, ManifestStore, ShardManifest};
use memwal_memtable::{FlushData, FrozenMemTable, TableSchema};
use memwal_sstable::{IndexSpec, LanceStore, SsTableWriter, WrittenSsTable};
use memwal_store::RetryPolicy;
use memwal_table::BaseTable;
use memwal_wal::SwitchTicket;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::writer::Inner;
use crate::{Error, Result};

/// What a generation's job hands the flusher: the last WAL position the
/// generation covers and its written (unpublished) SSTable, `None` for a
/// replayed generation that holds no rows.
pub(crate) type JobOutput = (u64, Option<WrittenSsTable>);

/// A generation's SSTable job, queued to the flusher in generation order.
pub(crate) struct Job {
    pub generation: u64,
    pub handle: JoinHandle<Result<JobOutput>>,
    /// Live generations publish strictly as the manifest's
    /// `current_generation`; replayed ones may skip numbers a previous
    /// writer left unused (never go below it).
    pub live: bool,
}

/// What writing and publishing need, shared by `open` (replayed
/// generations) and the background flusher.
#[derive(Debug, Clone)]
pub(crate) struct FlushCtx {
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

impl FlushCtx {
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
        let next_generation = generation.checked_add(1).ok_or_else(|| Error::Corrupt {
            reason: format!("generation {generation} cannot be followed"),
        })?;
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

impl FlushCtx {
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
    /// later publish: it only keeps manifests small, nothing depends on it).
    async fn covered_generation(&self) -> Option<u64> {
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

/// Whether a flush/publish failure is worth retrying (a transient storage
/// failure, or a manifest write whose outcome is unknown: the update is
/// idempotent). Fenced, sealed, closed, corrupt and deterministic failures
/// are not.
fn retryable(e: &Error) -> bool {
    matches!(
        e,
        Error::Storage {
            transient: true,
            ..
        } | Error::OutcomeUnknown { .. }
    )
}

/// After this many failed attempts in a row (and every as many after),
/// the manifest is read to learn whether a newer writer took the shard.
const FENCE_CHECK_EVERY: u32 = 3;

/// Decides what follows failed attempt number `attempt` of `what`: `Ok`
/// to try again (after the backoff), `Err` to give up with that error.
/// Gives up on a non-retryable error, once the writer stops, once the
/// shard turns out fenced, and, while opening or closing, after
/// `flush_retry.max_attempts` attempts.
async fn after_failure(inner: &Inner, err: Error, attempt: u32) -> Result<()> {
    if !retryable(&err) {
        return Err(err);
    }
    inner.ctx.meters.flush_errors.increment(1);
    tracing::warn!(shard = %inner.shard, error = %err, attempt, "flush attempt failed");
    inner.state.lock().last_flush_error = Some(err.to_string());
    inner.bump_progress();
    let retry = &inner.config.flush_retry;
    let bounded = inner.closing.load(Ordering::SeqCst) || inner.opening.load(Ordering::SeqCst);
    if bounded && attempt >= retry.attempts() {
        return Err(err);
    }
    if attempt.is_multiple_of(FENCE_CHECK_EVERY) {
        match inner.ctx.manifests.check_fenced(inner.epoch).await {
            Ok(_) => {}
            Err(e @ (FencingError::Fenced { .. } | FencingError::Sealed { .. })) => {
                return Err(Error::from_fencing(
                    e,
                    "checking the fence after failed flushes",
                ))
            }
            Err(e) => tracing::warn!(shard = %inner.shard, error = %e, "fence check failed"),
        }
    }
    if backoff(inner, retry, attempt).await {
        Ok(())
    } else {
        Err(Error::closed("the writer stopped"))
    }
}

/// Waits the backoff for `attempt`, or returns false when the writer stops.
async fn backoff(inner: &Inner, retry: &RetryPolicy, attempt: u32) -> bool {
    let mut shutdown = inner.shutdown.subscribe();
    tokio::select! {
        _ = retry.backoff(attempt) => !inner.is_stopping(),
        _ = shutdown.wait_for(|s| *s) => false,
    }
}

/// A live generation's job: writes its SSTable (see [`write_retrying`]),
/// then learns from the WAL generation switch the last position the
/// generation covers.
pub(crate) async fn job(
    inner: Arc<Inner>,
    generation: u64,
    memtable: FrozenMemTable,
    ticket: SwitchTicket,
) -> Result<JobOutput> {
    let written = write_retrying(&inner, generation, &memtable).await?;
    let switch = ticket
        .await
        .map_err(|e| Error::from_wal(e, "WAL generation switch"))?;
    Ok((switch.last_position, Some(written)))
}

/// A replayed generation's job: its last WAL position is known from the
/// replay; a generation whose entries held no rows gets no SSTable (its
/// publish only moves the cursor past it).
pub(crate) async fn replayed_job(
    inner: Arc<Inner>,
    generation: u64,
    memtable: FrozenMemTable,
    last_position: u64,
) -> Result<JobOutput> {
    if memtable.is_empty() {
        return Ok((last_position, None));
    }
    let written = write_retrying(&inner, generation, &memtable).await?;
    Ok((last_position, Some(written)))
}

/// Writes `generation`'s SSTable, retrying with backoff, at most
/// `flush_concurrency` generations writing at once.
async fn write_retrying(
    inner: &Arc<Inner>,
    generation: u64,
    memtable: &FrozenMemTable,
) -> Result<WrittenSsTable> {
    let data = memtable.flush_data();
    let _permit = inner
        .flush_permits
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| Error::closed("flush permits closed"))?;
    let mut attempt = 0;
    loop {
        if inner.is_stopping() {
            return Err(Error::closed("the writer stopped"));
        }
        attempt += 1;
        match inner.ctx.write(generation, memtable.schema(), &data).await {
            Ok(w) => return Ok(w),
            Err(e) => after_failure(inner, e, attempt).await?,
        }
    }
}

/// [`flusher`], watched: if it panics, the panic becomes the writer's
/// terminal error. Otherwise the writer would never turn terminal, a
/// waiting `flush` or backpressured put would wait on a flusher that is
/// gone, and the next freeze would report only that it is not running.
pub(crate) async fn monitored_flusher(inner: Arc<Inner>, jobs: UnboundedReceiver<Job>) {
    use futures::FutureExt;
    let run = std::panic::AssertUnwindSafe(flusher(inner.clone(), jobs));
    if let Err(panic) = run.catch_unwind().await {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string payload".into());
        inner.fail(Error::Corrupt {
            reason: format!("the flusher panicked: {what}"),
        });
    }
}

/// Background task: takes the jobs in generation order and publishes each
/// once written, so generation g+1 is never published while g is not.
/// Any non-retryable failure makes the writer terminal.
pub(crate) async fn flusher(inner: Arc<Inner>, mut jobs: UnboundedReceiver<Job>) {
    run_flusher(&inner, &mut jobs).await;
    // Stopping: no job may outlive the writer. The writer is terminal, so
    // its job sender is gone; every job ever queued is in the channel.
    while let Some(job) = jobs.recv().await {
        job.handle.abort();
        let _ = job.handle.await;
    }
}

async fn run_flusher(inner: &Arc<Inner>, jobs: &mut UnboundedReceiver<Job>) {
    let mut shutdown = inner.shutdown.subscribe();
    loop {
        let mut job = tokio::select! {
            j = jobs.recv() => match j { Some(j) => j, None => return },
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let out = tokio::select! {
            r = &mut job.handle => Some(r),
            _ = shutdown.wait_for(|s| *s) => None,
        };
        let Some(out) = out else {
            job.handle.abort();
            let _ = job.handle.await;
            return;
        };
        let (last_position, written) = match out {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => return inner.fail(e),
            Err(join) if join.is_cancelled() => return,
            Err(join) => {
                return inner.fail(Error::Corrupt {
                    reason: format!(
                        "flush job of generation {} panicked: {join}",
                        job.generation
                    ),
                })
            }
        };
        let published = publish_in_order(
            inner,
            job.generation,
            written.as_ref(),
            last_position,
            job.live,
        );
        if let Err(e) = published.await {
            return inner.fail(e);
        }
    }
}

/// Publishes `generation` (retrying transient failures), then drops its
/// frozen memtable and wakes waiters.
async fn publish_in_order(
    inner: &Arc<Inner>,
    generation: u64,
    written: Option<&WrittenSsTable>,
    last_position: u64,
    live: bool,
) -> Result<()> {
    let mut attempt = 0;
    loop {
        if inner.is_stopping() {
            return Err(Error::closed("the writer stopped"));
        }
        attempt += 1;
        let last_seen = {
            let st = inner.state.lock();
            st.appender
                .as_ref()
                .map_or(last_position, |a| a.last_durable_position())
                .max(inner.sentinel)
        };
        memwal_store::crash_point("writer::before_publish");
        match inner
            .ctx
            .publish(generation, written, last_position, last_seen, live)
            .await
        {
            Ok(m) => {
                if !live {
                    memwal_store::crash_point("writer::mid_replay");
                }
                *inner.manifest.lock() = m;
                let mut st = inner.state.lock();
                let frozen = st.frozen.pop_front();
                debug_assert_eq!(frozen.as_ref().map(|f| f.generation), Some(generation));
                if let Some(f) = frozen {
                    inner
                        .ctx
                        .meters
                        .flush_seconds
                        .record(f.frozen_at.elapsed().as_secs_f64());
                }
                st.published_generation = st.published_generation.max(generation);
                st.last_flush_error = None;
                inner.record_unflushed(&st);
                drop(st);
                inner.publishes.fetch_add(1, Ordering::Relaxed);
                inner.ctx.meters.publishes.increment(1);
                let sstable = written.map_or("(no rows)", |w| w.dir_name.as_str());
                tracing::info!(shard = %inner.shard, generation, last_position, sstable, live, "generation published");
                inner.bump_progress();
                return Ok(());
            }
            Err(e) => after_failure(inner, e, attempt).await?,
        }
    }
}
