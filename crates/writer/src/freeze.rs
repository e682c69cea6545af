//! Freezing the active memtable: a WAL generation barrier plus a memtable
//! swap in one critical section; size, row and age triggers; `flush`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use memwal_memtable::MemTable;
use tracing::Instrument;

use crate::writer::{Frozen, Inner, State};
use crate::{Error, Result};

/// Freezes the active memtable if it holds rows: switches the WAL to
/// generation g+1 and swaps in an empty memtable under the caller's state
/// lock, so every append submitted before belongs to g and every later one
/// to g+1 (each generation one contiguous run of WAL positions). The frozen
/// memtable's SSTable job starts at once; the flusher publishes it in order.
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
    let bytes = memtable.memory_usage().total();
    let handle = tokio::spawn(
        crate::flush::job(inner.clone(), generation, memtable.clone(), ticket).instrument(
            tracing::info_span!("flush_job", shard = %inner.shard, epoch = inner.epoch, generation),
        ),
    );
    st.frozen.push_back(Frozen {
        generation,
        memtable,
        bytes,
        frozen_at: Instant::now(),
        job: handle.abort_handle(),
    });
    inner.ctx.meters.freeze(reason);
    tracing::debug!(generation, bytes, reason, "memtable frozen");
    match &st.jobs {
        Some(tx)
            if tx
                .send(crate::flush::Job {
                    generation,
                    handle,
                    live: true,
                })
                .is_ok() =>
        {
            Ok(())
        }
        _ => {
            let err = Error::closed("the flusher is not running");
            inner.fail_locked(st, err.clone());
            Err(err)
        }
    }
}

/// Freezes the active memtable and waits until every generation frozen so
/// far is published (or the writer fails).
pub(crate) async fn flush_all(inner: &Arc<Inner>) -> Result<()> {
    let mut progress = inner.progress.subscribe();
    let target = {
        let mut st = inner.state.lock();
        st.check_usable()?;
        freeze_locked(inner, &mut st, "flush")?;
        match st.frozen.back() {
            Some(f) => f.generation,
            None => return Ok(()),
        }
    };
    loop {
        {
            let st = inner.state.lock();
            progress.borrow_and_update();
            if st.published_generation >= target {
                return Ok(());
            }
            st.check_usable()?;
        }
        if progress.changed().await.is_err() {
            return Err(Error::closed("the writer is gone"));
        }
    }
}

/// Background task: freezes the active memtable once its oldest row is
/// older than `max_age`. Checks at a quarter of `max_age` (10 ms .. 1 s).
pub(crate) async fn age_ticker(inner: Arc<Inner>, max_age: Duration) {
    let period = (max_age / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut shutdown = inner.shutdown.subscribe();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.wait_for(|s| *s) => return,
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
