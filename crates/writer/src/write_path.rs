//! The write path under the state lock: append (WAL submit + memtable
//! insert in one critical section), freeze (WAL generation switch +
//! memtable swap + queueing the generation to the flusher), and the size,
//! row and age triggers; `flush`.
//!
//! Invariants kept here, and only here:
//! - rows enter the memtable in WAL order (submit and insert under one
//!   lock), so replay picks the same winner per key;
//! - one WAL submit, one memtable batch: so the appender's count of
//!   appends not yet durable is the number of trailing memtable batches
//!   reads must leave out (`State::appends`);
//! - each generation is one contiguous run of WAL positions (the switch
//!   and the swap under the same lock);
//! - a frozen generation enters the frozen queue and the flusher's job
//!   queue in one critical section ([`enqueue`]), so both hold generations
//!   in the same order, which is the order they publish in.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use memwal_memtable::{FrozenMemTable, MemTable};
use memwal_wal::ProducerStamp;
use tokio::time::Instant;
use tracing::Instrument;

use crate::put::Ticket;
use crate::state::{Frozen, Inner, Job, JobOutput, State};
use crate::{Error, Result};

/// `storage`, checked under the state lock against the active memtable's
/// schema: a batch validated against an older schema (the writer followed
/// a schema change in between) is matched to the new one by field id, as
/// replay would match its WAL entry (a column added since is null, one
/// dropped since is left out: the put is ordered before the change).
pub(crate) fn current_form(st: &State, storage: RecordBatch) -> Result<RecordBatch> {
    let schema = st.active.schema();
    if Arc::ptr_eq(&storage.schema(), schema.storage_schema()) {
        return Ok(storage);
    }
    let storage = schema
        .to_storage_for_replay(&storage)
        .map_err(Error::from_memtable)?;
    if let Some(r) = &st.routing {
        r.check(&storage)?;
    }
    Ok(storage)
}

/// WAL submit then memtable insert, in one critical section: the WAL
/// order of submits is the memtable's insert order. A failure after the
/// submit makes the writer terminal, so rows in the memtable that were
/// never acknowledged can never be published.
///
/// This is the only WAL submit of the writer, and each submit here is
/// paired with exactly one memtable batch (one `insert`): the invariant
/// reads rely on to leave out the rows not yet durable (the last
/// `pending` batches, see `State::appends`).
///
/// A put whose `bytes` of rows would take the active generation past
/// `memtable_max_bytes` freezes it first, so every generation's rows fit
/// within `memtable_max_bytes` (<= `max_unflushed_bytes`) and replay under
/// the same config never refuses what was acknowledged.
///
/// A `stamp` (the put's producer sequence) is recorded in the WAL entry
/// and in the producers table in the same critical section, before any
/// freeze the insert triggers: the table a generation's checkpoint is
/// taken from holds exactly the appends submitted up to its freeze.
pub(crate) fn append_locked(
    inner: &Arc<Inner>,
    st: &mut State,
    storage: &RecordBatch,
    bytes: usize,
    stamp: Option<ProducerStamp>,
) -> Result<Ticket> {
    let active_payload = st.active.memory_usage().payload_bytes;
    if !st.active.is_empty()
        && active_payload.saturating_add(bytes) > inner.config.memtable_max_bytes
    {
        freeze_locked(inner, st, "bytes")?;
    }
    let Some(appender) = st.appender.as_ref() else {
        return Err(st
            .terminal
            .clone()
            .unwrap_or_else(|| Error::closed("no WAL appender")));
    };
    let ticket = match appender.submit_stamped(vec![storage.clone()], stamp.clone()) {
        Ok(t) => t,
        Err(e) => {
            let err = Error::from_wal(e, "WAL submit");
            if err.is_terminal() {
                inner.fail_locked(st, err.clone());
            }
            return Err(err);
        }
    };
    let ticket = match stamp {
        None => Ticket::Own(ticket),
        Some(stamp) => {
            let shared = crate::producers::share(ticket);
            st.producers.submitted(&stamp, shared.clone());
            Ticket::Shared(shared)
        }
    };
    if let Err(e) = st.active.insert(storage) {
        let err = Error::corrupt_from(
            "the memtable refused a batch already submitted to the WAL",
            e,
        );
        inner.fail_locked(st, err.clone());
        return Err(err);
    }
    if st.active_since.is_none() {
        st.active_since = Some(Instant::now());
    }
    let full_bytes = st.active.memory_usage().total() >= inner.config.memtable_max_bytes;
    let full_rows = st.active.num_rows() >= inner.config.memtable_max_rows;
    if full_bytes || full_rows {
        let reason = if full_bytes { "bytes" } else { "rows" };
        freeze_locked(inner, st, reason)?;
    }
    Ok(ticket)
}

/// Freezes the active memtable if it holds rows: switches the WAL to
/// generation g+1 and swaps in an empty memtable (same schema) under the
/// caller's state lock, so every append submitted before belongs to g and
/// every later one to g+1. The frozen memtable's SSTable job starts at
/// once ([`enqueue`]); the flusher publishes it in order.
pub(crate) fn freeze_locked(
    inner: &Arc<Inner>,
    st: &mut State,
    reason: &'static str,
) -> Result<()> {
    if st.active.is_empty() {
        return Ok(());
    }
    let _span = tracing::debug_span!("freeze", generation = st.generation, reason).entered();
    let Some(appender) = st.appender.as_ref() else {
        return Err(st
            .terminal
            .clone()
            .unwrap_or_else(|| Error::closed("no WAL appender")));
    };
    let generation = st.generation;
    let ticket = match appender.switch_generation(generation + 1) {
        Ok(t) => t,
        Err(e) => {
            let err = Error::from_wal(e, "WAL generation switch");
            inner.fail_locked(st, err.clone());
            return Err(err);
        }
    };
    let schema = st.active.schema().clone();
    let active = std::mem::replace(&mut st.active, MemTable::new(schema));
    let memtable = active.freeze();
    st.generation = generation + 1;
    st.active_since = None;
    inner.storage.meters.freeze(reason);
    tracing::debug!(generation, reason, "memtable frozen");
    let producers = producers_as_of_freeze(inner, st);
    let job = crate::flusher::job(
        inner.clone(),
        generation,
        memtable.clone(),
        ticket,
        producers,
    );
    enqueue(inner, st, generation, memtable, job, true)
}

/// The producers table as the generation just frozen leaves it, for its
/// checkpoint (idle producers expired first); `None` while no producer
/// was ever known at the shard (no checkpoint is written).
pub(crate) fn producers_as_of_freeze(
    inner: &Inner,
    st: &mut State,
) -> Option<crate::producers::Producers> {
    expired(inner, &mut st.producers).then(|| st.producers.clone())
}

/// Expires `producers` idle for `producer_expiry`; whether a checkpoint
/// is to be written of them (any producer was ever known at the shard).
pub(crate) fn expired(inner: &Inner, producers: &mut crate::producers::Producers) -> bool {
    if !producers.is_seen() {
        return false;
    }
    producers.expire(crate::producers::now_ms(), inner.config.producer_expiry);
    inner.storage.meters.producers.set(producers.len() as f64);
    true
}

/// Queues frozen generation `generation`: its SSTable job (`job`) starts
/// now; the generation joins the frozen queue (readers and backpressure
/// see it there until published) and the flusher's job queue, in one
/// critical section (the caller's lock), so the two queues keep one order.
/// A flusher that is gone makes the writer terminal.
pub(crate) fn enqueue(
    inner: &Arc<Inner>,
    st: &mut State,
    generation: u64,
    memtable: FrozenMemTable,
    job: impl Future<Output = Result<JobOutput>> + Send + 'static,
    live: bool,
) -> Result<()> {
    let span = tracing::info_span!(
        "flush_job",
        shard = %inner.shard,
        epoch = inner.epoch,
        generation,
        live
    );
    let handle = tokio::spawn(job.instrument(span));
    let bytes = memtable.memory_usage().total();
    st.frozen.push_back(Frozen {
        generation,
        memtable,
        bytes,
        frozen_at: Instant::now(),
        job: handle.abort_handle(),
    });
    inner.record_unflushed(st);
    let job = Job {
        generation,
        handle,
        live,
    };
    if st.jobs.as_ref().is_some_and(|tx| tx.send(job).is_ok()) {
        return Ok(());
    }
    let err = Error::closed("the flusher is not running");
    inner.fail_locked(st, err.clone());
    Err(err)
}

/// Freezes the active memtable and waits until every generation frozen so
/// far is published (or the writer fails).
pub(crate) async fn flush_all(inner: &Arc<Inner>) -> Result<()> {
    let target = {
        let mut st = inner.state.lock();
        st.check_usable()?;
        freeze_locked(inner, &mut st, "flush")?;
        match st.frozen.back() {
            Some(f) => f.generation,
            None => return Ok(()),
        }
    };
    inner
        .wait_until(None, |st| {
            if st.published_generation >= target {
                return Some(Ok(()));
            }
            st.check_usable().err().map(Err)
        })
        .await
        .map(|_| ())
}

/// Background task: freezes the active memtable once its oldest row is
/// older than `max_age`. Checks at a quarter of `max_age` (10 ms .. 1 s).
pub(crate) async fn age_ticker(inner: Arc<Inner>, max_age: Duration) {
    let period = (max_age / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = inner.life.stopped() => return,
        }
        let mut st = inner.state.lock();
        if st.terminal.is_some() {
            return;
        }
        let old = st.active_since.is_some_and(|t| t.elapsed() >= max_age);
        if old && freeze_locked(&inner, &mut st, "age").is_err() {
            return;
        }
    }
}
