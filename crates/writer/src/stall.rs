//! Write stalls: puts slow down, then are refused, while the shard's
//! compaction debt is high.
//!
//! The debt is the number of published SSTables that reads still merge:
//! the ones the shard's manifest lists above the base table's covered
//! generation (compacted, and caught up by every reader index). Every read
//! pays for each of them, so a compactor that falls behind would make
//! reads degrade without bound. Past `stall_slowdown_sstables` each put
//! waits before it is admitted (the wait grows linearly to
//! `stall_max_delay` at `stall_stop_sstables`); at `stall_stop_sstables`
//! puts are refused with [`Error::Backpressure`] (RESOURCE_EXHAUSTED,
//! nothing written) naming the setting, as RocksDB's
//! `level0_slowdown_writes_trigger` / `level0_stop_writes_trigger` do.
//!
//! The count is set at every publish (from the manifest it wrote, whose
//! covered SSTables it dropped) and, while a stall is on, read again from
//! the base table at most once per [`REFRESH`], so a stall ends when the
//! compactor catches up even if nothing is published meanwhile.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::state::Inner;
use crate::{Error, Result};

/// How often a stalled writer reads the base table's progress again.
pub(crate) const REFRESH: Duration = Duration::from_secs(1);

/// The shard's compaction debt and what stalls did.
#[derive(Debug, Default)]
pub(crate) struct Debt {
    /// Published SSTables not yet covered by the base table.
    pending: AtomicUsize,
    /// When the base was last read for the count.
    refreshed: parking_lot::Mutex<Option<Instant>>,
    /// Puts delayed by a slowdown.
    pub delayed: AtomicU64,
    /// Puts refused at the stop trigger.
    pub refused: AtomicU64,
}

impl Debt {
    /// The debt as the last publish or refresh left it.
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Sets the debt from a manifest this writer just wrote (its covered
    /// SSTables already dropped).
    pub(crate) fn set(&self, inner: &Inner, pending: usize) {
        self.pending.store(pending, Ordering::Relaxed);
        inner.storage.meters.pending_sstables.set(pending as f64);
    }
}

/// Waits (slowdown) or refuses (stop) a put while the debt is high; does
/// nothing below `stall_slowdown_sstables` (or with both triggers 0).
pub(crate) async fn admit(inner: &Arc<Inner>) -> Result<()> {
    let (slowdown, stop) = (
        inner.config.stall_slowdown_sstables,
        inner.config.stall_stop_sstables,
    );
    let trigger = match (slowdown, stop) {
        (0, 0) => return Ok(()),
        (0, s) | (s, 0) => s,
        (a, b) => a.min(b),
    };
    if inner.debt.pending() < trigger {
        return Ok(());
    }
    refresh_if_stale(inner).await;
    let pending = inner.debt.pending();
    if stop > 0 && pending >= stop {
        inner.debt.refused.fetch_add(1, Ordering::Relaxed);
        inner.storage.meters.stalled_puts("refused");
        return Err(Error::Backpressure {
            reason: format!(
                "compaction is behind: {pending} SSTables of shard {} are not yet compacted \
                 into the base table, at writer.stall_stop_sstables = {stop}; nothing was \
                 written, retry once the compactor catches up",
                inner.shard
            ),
        });
    }
    if slowdown > 0 && pending >= slowdown {
        let span = stop.max(slowdown + 1) - slowdown;
        let steps = (pending - slowdown + 1).min(span) as u32;
        let delay = inner.config.stall_max_delay * steps / span as u32;
        inner.debt.delayed.fetch_add(1, Ordering::Relaxed);
        inner.storage.meters.stalled_puts("delayed");
        tracing::debug!(pending, ?delay, "put delayed: compaction is behind");
        tokio::time::sleep(delay).await;
    }
    Ok(())
}

/// Reads the base table's covered generation again when the last read is
/// older than [`REFRESH`] (one caller reads; the others go on with the
/// current count). A base that cannot be read leaves the count as it is.
async fn refresh_if_stale(inner: &Arc<Inner>) {
    {
        let mut at = inner.debt.refreshed.lock();
        if at.is_some_and(|t| t.elapsed() < REFRESH) {
            return;
        }
        *at = Some(Instant::now());
    }
    if let Some(covered) = inner.storage.covered_generation().await {
        inner.debt.set(inner, pending_above(inner, covered));
    }
}

/// The SSTables the writer's manifest lists above `covered` (the base's
/// covered generation of the shard).
pub(crate) fn pending_above(inner: &Inner, covered: u64) -> usize {
    inner
        .manifest
        .lock()
        .sstables
        .iter()
        .filter(|s| s.generation > covered)
        .count()
}
