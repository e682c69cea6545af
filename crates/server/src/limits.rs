//! How many shards a table holds open, and closing the idle ones: the cap
//! a new shard's first rows are checked against ([`ShardLimits::max_open`],
//! enforced when a slot is created) and the idle close the host's monitor
//! runs ([`TableHost::close_idle_shards`]).

use crate::slots::Slot;
use crate::TableHost;

/// How many shards a table keeps open, and when an idle one closes
/// ([`TableHost::set_shard_limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardLimits {
    /// Shards open at once (live, opening, or down and being retried);
    /// rows for one more are refused with `RESOURCE_EXHAUSTED`. Default
    /// 1024.
    pub max_open: usize,
    /// A shard no rows arrived for in this long is flushed, closed and
    /// forgotten (the next row for it opens it again: a new claim).
    /// `None`: never. Default 600 s.
    pub idle_close: Option<std::time::Duration>,
}

impl Default for ShardLimits {
    fn default() -> Self {
        Self {
            max_open: 1024,
            idle_close: Some(std::time::Duration::from_secs(600)),
        }
    }
}

impl TableHost {
    /// Sets the caps on open shards (see [`ShardLimits`]).
    pub fn set_shard_limits(&self, limits: ShardLimits) {
        *self.shard_limits.lock() = limits;
    }

    /// Flushes, closes and forgets every live shard no rows arrived for in
    /// `idle_close` (the host's monitor calls this). Returns how many
    /// shards closed.
    ///
    /// Guarantees: the writer stays in its slot, as [`Slot::Closing`],
    /// until its close ended, so reads keep taking its snapshot (its rows
    /// are not all published before the close ends); rows for the shard
    /// wait while it closes (on the cell's `opening` lock), then open it
    /// again. Only a close that published every row leaves the slot
    /// empty (the shard read as published). A close that failed, or left
    /// rows unpublished (a put that raced it), leaves the shard down (due
    /// at once): reads refuse it (its rows are only in the WAL) until the
    /// next put for it, or the host's reopener
    /// ([`TableHost::spawn_reopener`]), reopens it and replays them; a
    /// fenced writer leaves it lost.
    pub async fn close_idle_shards(&self) -> usize {
        let Some(idle) = self.shard_limits.lock().idle_close else {
            return 0;
        };
        let mut closed = 0;
        for (key, cell) in self.slots.cells() {
            if cell.idle_for() < idle || !matches!(cell.current(), Some(Slot::Live(_))) {
                continue;
            }
            // A shard opening or closing now is not idle.
            let Ok(_turn) = cell.opening.try_lock() else {
                continue;
            };
            if cell.idle_for() < idle || self.closing.load(std::sync::atomic::Ordering::SeqCst) {
                continue;
            }
            let Some(Slot::Live(w)) = cell.current() else {
                continue;
            };
            if !cell.replace_writer(&w, Slot::Closing(w.clone())) {
                continue;
            }
            // A put that took the writer before it was marked closing
            // touched the cell first: seen here, the shard stays open.
            // Later puts find it closing and wait.
            if cell.idle_for() < idle {
                cell.replace_writer(&w, Slot::Live(w.clone()));
                continue;
            }
            let shard = w.shard();
            let result = w.close().await;
            // Rows a put racing the close got acknowledged (durable in the
            // WAL) after its flush, left unpublished in the memtable.
            let stats = w.stats();
            let unpublished = stats.active_rows + stats.unpublished.len();
            let outcome = match result {
                Ok(()) if unpublished == 0 => None,
                Ok(()) => Some(memwal::Error::Closed {
                    reason: format!(
                        "the idle close left {unpublished} rows or generations unpublished \
                         (a put raced it); they are in the WAL for the next open"
                    ),
                }),
                Err(e) => Some(e),
            };
            match outcome {
                None => {
                    tracing::info!(table = %self.name(), %shard, "idle shard closed");
                    cell.take_writer(&w);
                    self.slots.remove_if_empty(&key, &cell);
                }
                Some(e) => {
                    tracing::warn!(table = %self.name(), %shard, error = %e,
                        "idle shard's close did not publish every row; the shard is down until \
                         reopened (its rows stay in the WAL for the next open)");
                    let slot = match e {
                        e if e.is_fenced() => Slot::Lost {
                            shard,
                            reason: e.to_string(),
                        },
                        error @ memwal::Error::Corrupt { .. } => Slot::Failed { shard, error },
                        // Due at once: the next put reopens it.
                        cause => Slot::Down {
                            shard,
                            cause,
                            since: tokio::time::Instant::now(),
                            attempts: 0,
                            retry_at: tokio::time::Instant::now(),
                        },
                    };
                    cell.replace_writer(&w, slot);
                }
            }
            metrics::counter!("memwal_server_idle_shards_closed_total", "table" => self.name().to_string())
                .increment(1);
            closed += 1;
        }
        closed
    }

    /// Sets every live writer's gauges again (the daemon's metrics drop
    /// series not updated for a while; see [`ShardWriter::refresh_gauges`]).
    pub fn refresh_gauges(&self) {
        for w in self.slots.live() {
            w.refresh_gauges();
        }
    }
}
