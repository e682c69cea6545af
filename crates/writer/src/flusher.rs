//! The flusher: SSTable writes (several in flight, retried with backoff)
//! and manifest publishes strictly in generation order, by one task that
//! alone pops the frozen queue.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use memwal_fencing::FencingError;
use memwal_memtable::FrozenMemTable;
use memwal_sstable::WrittenSsTable;
use memwal_store::RetryPolicy;
use memwal_wal::SwitchTicket;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::checkpoint;
use crate::producers::Producers;
use crate::state::{Inner, Job, JobOutput};
use crate::{Error, Result};

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
    inner.storage.meters.flush_errors.increment(1);
    inner.flush_failures.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(shard = %inner.shard, error = %err, attempt, "flush attempt failed");
    inner.state.lock().last_flush_error = Some(err.to_string());
    inner.life.bump();
    let retry = &inner.config.flush_retry;
    if inner.life.retries_bounded() && attempt >= retry.attempts() {
        return Err(err);
    }
    if attempt.is_multiple_of(FENCE_CHECK_EVERY) {
        match inner.storage.manifests.check_fenced(inner.epoch).await {
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
    tokio::select! {
        _ = retry.backoff(attempt) => !inner.life.is_stopping(),
        _ = inner.life.stopped() => false,
    }
}

/// A live generation's job: writes its SSTable (see [`write_retrying`]),
/// then learns from the WAL generation switch the last position the
/// generation covers; once every append of the generation is durable
/// (the switch resolved), writes its producer checkpoint (`producers`:
/// the table as of its freeze; `None`, none written).
pub(crate) async fn job(
    inner: Arc<Inner>,
    generation: u64,
    memtable: FrozenMemTable,
    ticket: SwitchTicket,
    producers: Option<Producers>,
) -> Result<JobOutput> {
    let written = write_retrying(&inner, generation, &memtable).await?;
    let switch = ticket
        .await
        .map_err(|e| Error::from_wal(e, "WAL generation switch"))?;
    if let Some(p) = producers {
        checkpoint_retrying(&inner, generation, &p).await?;
    }
    Ok((switch.last_position, Some(written)))
}

/// Writes `generation`'s producer checkpoint, retrying with backoff as
/// SSTable writes are.
async fn checkpoint_retrying(
    inner: &Arc<Inner>,
    generation: u64,
    producers: &Producers,
) -> Result<()> {
    let bytes = checkpoint::encode(producers, generation).await?;
    let mut attempt = 0;
    loop {
        if inner.life.is_stopping() {
            return Err(Error::closed("the writer stopped"));
        }
        attempt += 1;
        match checkpoint::write(&inner.storage, generation, bytes.clone()).await {
            Ok(()) => return Ok(()),
            Err(e) => after_failure(inner, e, attempt).await?,
        }
    }
}

/// A replayed generation's job: its last WAL position is known from the
/// replay; a generation whose entries held no rows gets no SSTable (its
/// publish only moves the cursor past it).
pub(crate) async fn replayed_job(
    inner: Arc<Inner>,
    generation: u64,
    memtable: FrozenMemTable,
    last_position: u64,
    producers: Option<Producers>,
) -> Result<JobOutput> {
    if let Some(p) = producers {
        checkpoint_retrying(&inner, generation, &p).await?;
    }
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
    let data = memtable.flush_data().map_err(Error::from_memtable)?;
    let _permit = inner
        .flush_permits
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| Error::closed("flush permits closed"))?;
    let mut attempt = 0;
    loop {
        if inner.life.is_stopping() {
            return Err(Error::closed("the writer stopped"));
        }
        attempt += 1;
        match inner
            .storage
            .write(generation, memtable.schema(), &data)
            .await
        {
            Ok(w) => return Ok(w),
            Err(e) => after_failure(inner, e, attempt).await?,
        }
    }
}

/// Background task (spawned monitored: a panic becomes the writer's
/// terminal error): takes the jobs in generation order and publishes each
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
    loop {
        let mut job = tokio::select! {
            j = jobs.recv() => match j { Some(j) => j, None => return },
            _ = inner.life.stopped() => return,
        };
        let out = tokio::select! {
            r = &mut job.handle => Some(r),
            _ = inner.life.stopped() => None,
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
                return inner.fail(Error::corrupt_from(
                    &format!("flush job of generation {}", job.generation),
                    join,
                ))
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
        if inner.life.is_stopping() {
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
            .storage
            .publish(generation, written, last_position, last_seen, live)
            .await
        {
            Ok(m) => {
                if !live {
                    memwal_store::crash_point("writer::mid_replay");
                }
                inner.debt.set(inner, m.sstables.len());
                *inner.manifest.lock() = m;
                let mut st = inner.state.lock();
                // The frozen queue and the job queue are filled in one
                // critical section (`write_path::enqueue`), so the oldest
                // frozen generation is the one just published.
                let Some(frozen) = st.frozen.pop_front().filter(|f| f.generation == generation)
                else {
                    let err = Error::corrupt(format!(
                        "published generation {generation}, which is not the oldest \
                         frozen one: the frozen and job queues disagree"
                    ));
                    inner.fail_locked(&mut st, err.clone());
                    return Err(err);
                };
                inner
                    .storage
                    .meters
                    .flush_seconds
                    .record(frozen.frozen_at.elapsed().as_secs_f64());
                st.published_generation = st.published_generation.max(generation);
                st.last_flush_error = None;
                inner.record_unflushed(&st);
                drop(st);
                inner.publishes.fetch_add(1, Ordering::Relaxed);
                inner.storage.meters.publishes.increment(1);
                let sstable = written.map_or("(no rows)", |w| w.dir_name.as_str());
                tracing::info!(shard = %inner.shard, generation, last_position, sstable, live, "generation published");
                inner.life.bump();
                return Ok(());
            }
            Err(e) => after_failure(inner, e, attempt).await?,
        }
    }
}
