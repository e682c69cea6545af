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
    /// `idle_close` (the host's monitor calls this). Rows for such a shard
    /// wait while it closes, then open it again. A close that fails leaves
    /// its rows in the WAL, where the next open replays them. Returns how
    /// many shards closed.
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
            cell.take();
            let shard = w.shard();
            match w.close().await {
                Ok(()) => tracing::info!(table = %self.name(), %shard, "idle shard closed"),
                Err(e) => tracing::warn!(table = %self.name(), %shard, error = %e,
                    "idle shard's close failed; its rows stay in the WAL for the next open"),
            }
            metrics::counter!("memwal_server_idle_shards_closed_total", "table" => self.name().to_string())
                .increment(1);
            self.slots.remove_if_empty(&key, &cell);
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
