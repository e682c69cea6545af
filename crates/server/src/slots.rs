//! The shards of one served table: one slot per shard key, each opened on
//! its own (a slow or hung open, a claim plus a replay, holds up only that
//! shard's rows, never the table's other shards or `/status`), and each
//! reopened with backoff after its writer stopped on a failure that was
//! not a takeover.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use memwal::{ShardId, ShardWriter};

use crate::table::ShardKey;

/// What one shard key's slot holds.
#[derive(Clone)]
pub(crate) enum Slot {
    /// Served by this writer.
    Live(Arc<ShardWriter>),
    /// This writer is being closed because the shard went idle
    /// ([`crate::TableHost::close_idle_shards`]): reads still take its
    /// snapshot (its rows are not all published until the close ends);
    /// puts wait for the close (on the cell's `opening` lock), then open
    /// the shard again.
    Closing(Arc<ShardWriter>),
    /// Another writer took the shard over: its rows are refused
    /// (`FAILED_PRECONDITION`) until the daemon restarts.
    Lost { shard: ShardId, reason: String },
    /// Its stored state is corrupt: its rows are refused (`DATA_LOSS`)
    /// until the daemon restarts; retrying cannot heal it.
    Failed {
        shard: ShardId,
        error: memwal::Error,
    },
    /// Its writer stopped on a storage failure (or it failed to open):
    /// refused (`UNAVAILABLE`) until a reopen (a new claim and a replay)
    /// succeeds; reopening is tried at `retry_at`, then with doubling
    /// backoff.
    Down {
        shard: ShardId,
        cause: memwal::Error,
        since: Instant,
        attempts: u32,
        retry_at: Instant,
    },
}

impl Slot {
    pub(crate) fn shard(&self) -> ShardId {
        match self {
            Slot::Live(w) | Slot::Closing(w) => w.shard(),
            Slot::Lost { shard, .. } | Slot::Failed { shard, .. } | Slot::Down { shard, .. } => {
                *shard
            }
        }
    }

    /// The slot a live writer's state calls for: itself while usable;
    /// lost, failed or down once it stopped (a writer closed by the
    /// daemon stays as it is: the daemon is stopping).
    pub(crate) fn checked(self) -> Slot {
        let Slot::Live(w) = &self else {
            return self;
        };
        let Some(error) = w.terminal_error() else {
            return self;
        };
        let shard = w.shard();
        match error {
            e if e.is_fenced() => Slot::Lost {
                shard,
                reason: e.to_string(),
            },
            memwal::Error::Closed { .. } => self,
            e @ memwal::Error::Corrupt { .. } => Slot::Failed { shard, error: e },
            cause => down(shard, cause, 0),
        }
    }
}

/// First reopen delay after a shard went down, doubled per failed attempt.
const FIRST_RETRY: Duration = Duration::from_millis(500);
/// ... up to this.
const MAX_RETRY: Duration = Duration::from_secs(30);

/// A down slot after `attempts` failed reopens.
pub(crate) fn down(shard: ShardId, cause: memwal::Error, attempts: u32) -> Slot {
    let backoff = FIRST_RETRY
        .saturating_mul(1u32 << attempts.min(16))
        .min(MAX_RETRY);
    Slot::Down {
        shard,
        cause,
        since: Instant::now(),
        attempts,
        retry_at: Instant::now() + backoff,
    }
}

/// One shard key's slot: empty until first opened.
pub(crate) struct Cell {
    /// Held while this shard opens, reopens or closes (one at a time).
    pub opening: tokio::sync::Mutex<()>,
    slot: parking_lot::Mutex<Option<Slot>>,
    /// When rows for this shard last arrived (idle shards are closed).
    touched: parking_lot::Mutex<Instant>,
}

impl Default for Cell {
    fn default() -> Self {
        Self {
            opening: Default::default(),
            slot: Default::default(),
            touched: parking_lot::Mutex::new(Instant::now()),
        }
    }
}

impl Cell {
    /// The slot, with a live writer's state folded in (see
    /// [`Slot::checked`]); `None` before the shard was first opened.
    pub(crate) fn current(&self) -> Option<Slot> {
        let mut slot = self.slot.lock();
        let checked = slot.take()?.checked();
        *slot = Some(checked.clone());
        Some(checked)
    }

    pub(crate) fn set(&self, slot: Slot) {
        *self.slot.lock() = Some(slot);
    }

    /// Records that rows for this shard arrived now.
    pub(crate) fn touch(&self) {
        *self.touched.lock() = Instant::now();
    }

    /// How long ago rows for this shard last arrived.
    pub(crate) fn idle_for(&self) -> Duration {
        self.touched.lock().elapsed()
    }

    /// Replaces a live writer of `shard` (only that one) with `slot`.
    pub(crate) fn replace_live(&self, shard: ShardId, slot: Slot) {
        let mut current = self.slot.lock();
        if matches!(&*current, Some(Slot::Live(w)) if w.shard() == shard) {
            *current = Some(slot);
        }
    }

    /// Replaces the slot with `slot` if it holds exactly `writer` (live
    /// or closing); returns whether it did.
    pub(crate) fn replace_writer(&self, writer: &Arc<ShardWriter>, slot: Slot) -> bool {
        let mut current = self.slot.lock();
        let holds = matches!(
            &*current,
            Some(Slot::Live(w) | Slot::Closing(w)) if Arc::ptr_eq(w, writer)
        );
        if holds {
            *current = Some(slot);
        }
        holds
    }

    /// Empties the slot if it holds a stopped shard (lost or down): a
    /// cluster member drops it when the shard is no longer its to serve,
    /// or is its again. Returns whether it did.
    pub(crate) fn clear_stopped(&self) -> bool {
        let mut current = self.slot.lock();
        let stopped = matches!(&*current, Some(Slot::Lost { .. } | Slot::Down { .. }));
        if stopped {
            *current = None;
        }
        stopped
    }

    /// Empties the slot if it holds exactly `writer` (live or closing).
    pub(crate) fn take_writer(&self, writer: &Arc<ShardWriter>) {
        let mut current = self.slot.lock();
        if matches!(
            &*current,
            Some(Slot::Live(w) | Slot::Closing(w)) if Arc::ptr_eq(w, writer)
        ) {
            *current = None;
        }
    }
}

/// Every slot of a table, by shard key.
#[derive(Default)]
pub(crate) struct Slots {
    map: parking_lot::Mutex<HashMap<ShardKey, Arc<Cell>>>,
}

impl Slots {
    /// The cell of `key`, created empty on first use.
    pub(crate) fn cell(&self, key: &ShardKey) -> Arc<Cell> {
        self.map.lock().entry(key.clone()).or_default().clone()
    }

    /// The cell of `key`, if it has one.
    pub(crate) fn get(&self, key: &ShardKey) -> Option<Arc<Cell>> {
        self.map.lock().get(key).cloned()
    }

    /// The cell of `key`, created empty on first use unless `cap` cells
    /// exist already (`Err` with the count).
    pub(crate) fn cell_capped(&self, key: &ShardKey, cap: usize) -> Result<Arc<Cell>, usize> {
        let mut map = self.map.lock();
        if let Some(cell) = map.get(key) {
            return Ok(cell.clone());
        }
        if map.len() >= cap {
            return Err(map.len());
        }
        Ok(map.entry(key.clone()).or_default().clone())
    }

    /// Forgets `key`'s cell if it is still `cell` and empty (a closed idle
    /// shard: its key counts against the cap no more).
    pub(crate) fn remove_if_empty(&self, key: &ShardKey, cell: &Arc<Cell>) {
        let mut map = self.map.lock();
        if map.get(key).is_some_and(|c| Arc::ptr_eq(c, cell)) && cell.slot.lock().is_none() {
            map.remove(key);
        }
    }

    /// Whether `cell` is still `key`'s cell (not retired by an idle close).
    pub(crate) fn holds(&self, key: &ShardKey, cell: &Arc<Cell>) -> bool {
        self.map
            .lock()
            .get(key)
            .is_some_and(|c| Arc::ptr_eq(c, cell))
    }

    /// Every cell, by key.
    pub(crate) fn cells(&self) -> Vec<(ShardKey, Arc<Cell>)> {
        self.map
            .lock()
            .iter()
            .map(|(k, c)| (k.clone(), c.clone()))
            .collect()
    }

    /// Every opened slot, by key.
    pub(crate) fn snapshot(&self) -> Vec<(ShardKey, Slot)> {
        let cells: Vec<(ShardKey, Arc<Cell>)> = self
            .map
            .lock()
            .iter()
            .map(|(k, c)| (k.clone(), c.clone()))
            .collect();
        cells
            .into_iter()
            .filter_map(|(k, c)| c.current().map(|s| (k, s)))
            .collect()
    }

    /// The live writers.
    pub(crate) fn live(&self) -> Vec<Arc<ShardWriter>> {
        self.snapshot()
            .into_iter()
            .filter_map(|(_, s)| match s {
                Slot::Live(w) => Some(w),
                _ => None,
            })
            .collect()
    }
}
