//! How many shards a table holds open, and closing the idle ones: the cap
//! a new shard's first rows are checked against ([`ShardLimits::max_open`],
//! enforced when a slot is created) and the idle close the host's monitor
//! runs ([`crate::TableHost::close_idle_shards`]).

use crate::shards::ShardSet;
use crate::slots::Slot;

/// How many shards a table keeps open, and when an idle one closes
/// ([`crate::TableHost::set_shard_limits`]).
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

impl ShardSet {
    /// The idle close: see [`crate::TableHost::close_idle_shards`].
    /// Returns how many shards closed, and each one whose close published
    /// every row, with the version of the manifest its close left.
    pub(crate) async fn close_idle(&self) -> (usize, Vec<(memwal::ShardId, u64)>) {
        let Some(idle) = self.limits().idle_close else {
            return (0, Vec::new());
        };
        let mut closed = 0;
        let mut at_rest = Vec::new();
        for (key, cell) in self.cells() {
            if cell.idle_for() < idle || !matches!(cell.current(), Some(Slot::Live(_))) {
                continue;
            }
            // A shard opening or closing now is not idle.
            let Ok(_turn) = cell.opening.try_lock() else {
                continue;
            };
            if cell.idle_for() < idle || self.is_closing() {
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
                    tracing::info!(table = %self.table(), %shard, "idle shard closed");
                    at_rest.push((shard, w.manifest().version));
                    cell.take_writer(&w);
                    self.forget_if_empty(&key, &cell);
                }
                Some(e) => {
                    tracing::warn!(table = %self.table(), %shard, error = %e,
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
            metrics::counter!("memwal_server_idle_shards_closed_total", "table" => self.table().to_string())
                .increment(1);
            closed += 1;
        }
        (closed, at_rest)
    }

    /// Sets every live writer's gauges again: see
    /// [`crate::TableHost::refresh_gauges`].
    pub(crate) fn refresh_gauges(&self) {
        for w in self.live() {
            w.refresh_gauges();
        }
    }
}
