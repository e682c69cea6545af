//! Flush and publish: SSTable writes (several in flight) and manifest
//! publishes strictly in generation order.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use memwal_fencing::{ManifestStore, ShardManifest};
use memwal_memtable::{FlushData, FrozenMemTable, TableSchema};
use memwal_sstable::{SsTableWriter, WrittenSsTable};
use memwal_store::RetryPolicy;
use memwal_wal::SwitchTicket;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::stats::names;
use crate::writer::Inner;
use crate::{Error, Result};

/// What a generation's job hands the flusher: the last WAL position the
/// generation covers and its written (unpublished) SSTable.
pub(crate) type JobOutput = (u64, WrittenSsTable);

/// A generation's SSTable job, queued to the flusher in generation order.
pub(crate) struct Job {
    pub generation: u64,
    pub handle: JoinHandle<Result<JobOutput>>,
}

/// What writing and publishing need, shared by `open` (replayed
/// generations) and the background flusher.
#[derive(Debug, Clone)]
pub(crate) struct FlushCtx {
    pub manifests: Arc<ManifestStore>,
    pub epoch: u64,
    pub sstables: SsTableWriter,
    pub schema: Arc<TableSchema>,
}

impl FlushCtx {
    /// One attempt at writing generation `generation`'s SSTable (a fresh
    /// directory every time).
    pub(crate) async fn write(&self, generation: u64, data: &FlushData) -> Result<WrittenSsTable> {
        let span = tracing::info_span!("flush", generation, rows = data.stats.physical_rows);
        self.sstables
            .write(&self.schema, generation, data)
            .instrument(span)
            .await
            .map_err(|e| {
                Error::from_sstable(
                    e,
                    &format!("writing the SSTable of generation {generation}"),
                )
            })
    }

    /// One manifest update publishing `written` as generation `generation`,
    /// covering WAL positions up to `last_position`. Idempotent: a
    /// generation already listed is not added again; the cursor,
    /// `current_generation` and the WAL hint only move forward.
    pub(crate) async fn publish(
        &self,
        generation: u64,
        written: &WrittenSsTable,
        last_position: u64,
        last_seen: u64,
    ) -> Result<ShardManifest> {
        let span = tracing::info_span!("publish", generation, last_position);
        self.manifests
            .update(self.epoch, |m| {
                if !m.sstables.iter().any(|s| s.generation == generation) {
                    m.sstables.push(written.sstable.clone());
                }
                m.replay_after_wal_entry_position =
                    m.replay_after_wal_entry_position.max(last_position);
                m.current_generation = m.current_generation.max(generation + 1);
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

/// Whether a flush/publish failure is worth retrying (the writer is not
/// fenced, sealed, closed or looking at inconsistent state).
fn retryable(e: &Error) -> bool {
    matches!(
        e,
        Error::Storage { .. } | Error::OutcomeUnknown { .. } | Error::Backpressure { .. }
    )
}

fn note_flush_error(inner: &Inner, err: &Error) {
    metrics::counter!(names::FLUSH_ERRORS).increment(1);
    tracing::warn!(shard = %inner.shard, error = %err, "flush attempt failed; retrying");
    inner.state.lock().last_flush_error = Some(err.to_string());
    inner.bump_progress();
}

/// Waits the backoff for `attempt`, or returns false when the writer stops.
async fn backoff(inner: &Inner, retry: &RetryPolicy, attempt: u32) -> bool {
    let mut shutdown = inner.shutdown.subscribe();
    tokio::select! {
        _ = retry.backoff(attempt) => !inner.is_stopping(),
        _ = shutdown.wait_for(|s| *s) => false,
    }
}

/// A generation's job: writes its SSTable (retrying with backoff, at most
/// `flush_concurrency` jobs writing at once), then learns from the WAL
/// generation switch the last position the generation covers.
pub(crate) async fn job(
    inner: Arc<Inner>,
    generation: u64,
    memtable: FrozenMemTable,
    ticket: SwitchTicket,
) -> Result<JobOutput> {
    let data = memtable.flush_data();
    let written = {
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
            match inner.ctx.write(generation, &data).await {
                Ok(w) => break w,
                Err(e) if retryable(&e) => {
                    note_flush_error(&inner, &e);
                    if !backoff(&inner, &inner.config.flush_retry, attempt).await {
                        return Err(Error::closed("the writer stopped"));
                    }
                }
                Err(e) => return Err(e),
            }
        }
    };
    let switch = ticket
        .await
        .map_err(|e| Error::from_wal(e, "WAL generation switch"))?;
    Ok((switch.last_position, written))
}

/// Background task: takes the jobs in generation order and publishes each
/// once written, so generation g+1 is never published while g is not.
/// Any non-retryable failure makes the writer terminal.
pub(crate) async fn flusher(inner: Arc<Inner>, mut jobs: UnboundedReceiver<Job>) {
    let mut shutdown = inner.shutdown.subscribe();
    loop {
        let mut job = tokio::select! {
            j = jobs.recv() => match j { Some(j) => j, None => return },
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let out = tokio::select! {
            r = &mut job.handle => r,
            _ = shutdown.wait_for(|s| *s) => { job.handle.abort(); return }
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
        if let Err(e) = publish_in_order(&inner, job.generation, &written, last_position).await {
            return inner.fail(e);
        }
    }
}

/// Publishes `generation` (retrying transient failures), then drops its
/// frozen memtable and wakes waiters.
async fn publish_in_order(
    inner: &Arc<Inner>,
    generation: u64,
    written: &WrittenSsTable,
    last_position: u64,
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
        };
        match inner
            .ctx
            .publish(generation, written, last_position, last_seen)
            .await
        {
            Ok(m) => {
                *inner.manifest.lock() = m;
                let mut st = inner.state.lock();
                let frozen = st.frozen.pop_front();
                debug_assert_eq!(frozen.as_ref().map(|f| f.generation), Some(generation));
                if let Some(f) = frozen {
                    metrics::histogram!(names::FLUSH_SECONDS)
                        .record(f.frozen_at.elapsed().as_secs_f64());
                }
                st.published_generation = st.published_generation.max(generation);
                st.last_flush_error = None;
                inner.record_unflushed(&st);
                drop(st);
                inner.publishes.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(names::PUBLISHES).increment(1);
                tracing::info!(shard = %inner.shard, generation, last_position, sstable = %written.dir_name, "generation published");
                inner.bump_progress();
                return Ok(());
            }
            Err(e) if retryable(&e) => {
                note_flush_error(inner, &e);
                if !backoff(inner, &inner.config.flush_retry, attempt).await {
                    return Err(Error::closed("the writer stopped"));
                }
            }
            Err(e) => return Err(e),
        }
    }
}
