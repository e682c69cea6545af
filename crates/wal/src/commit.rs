//! The appender's background task: group commit, one PUT at a time.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::time::Instant;

use arrow_array::RecordBatch;
use bytes::Bytes;
use memwal_fencing::{FencingError, ManifestStore, ShardId, ShardStatus};
use memwal_store::{create_object, CreateOutcome, StoreError};
use tokio::sync::oneshot;
use tracing::Instrument;

use crate::appender::{AppendAck, GenerationSwitch, Item, Pending, Shared, WalConfig};
use crate::codec::encode_stamped_entry;
use crate::{WalError, WalLocation, WalResult};

pub(crate) struct CommitTask {
    shared: Arc<Shared>,
    loc: WalLocation,
    manifests: Arc<ManifestStore>,
    config: WalConfig,
    /// Position of the next entry.
    next: u64,
    /// Generation of the appends at the head of the queue.
    generation: u64,
    meters: Meters,
    /// What the previous entry was: its appends, its PUT's duration and
    /// when it was acknowledged (regrouping, see `WalConfig`).
    previous: Option<Previous>,
}

#[derive(Clone, Copy)]
struct Previous {
    appends: usize,
    put: std::time::Duration,
    acked: tokio::time::Instant,
}

/// The appender's metric handles, labelled with its shard.
struct Meters {
    put_seconds: metrics::Histogram,
    entries: metrics::Counter,
    bytes: metrics::Counter,
    appends: metrics::Counter,
    appends_per_entry: metrics::Histogram,
}

impl Meters {
    fn new(shard: String) -> Self {
        let l = [("shard", shard)];
        Self {
            put_seconds: metrics::histogram!("memwal_wal_put_seconds", &l),
            entries: metrics::counter!("memwal_wal_entries_total", &l),
            bytes: metrics::counter!("memwal_wal_bytes_total", &l),
            appends: metrics::counter!("memwal_wal_appends_total", &l),
            appends_per_entry: metrics::histogram!("memwal_wal_appends_per_entry", &l),
        }
    }
}

/// Whatever happens to the task (normal end, abort, panic), appends still
/// queued when it ends fail as [`WalError::Closed`] and later submits are
/// refused: none of them was written.
struct DrainOnExit(Arc<Shared>);

impl Drop for DrainOnExit {
    fn drop(&mut self) {
        let items = {
            let mut q = self.0.queue.lock();
            q.closing = true;
            q.queued_appends = 0;
            std::mem::take(&mut q.items)
        };
        for item in items {
            item.fail(WalError::Closed);
        }
    }
}

/// The waiters of the entry being written. If the task stops before the
/// PUT's outcome is known (abort on drop, panic), they learn that the
/// outcome is unknown rather than seeing the appender vanish.
struct InFlight {
    shard: ShardId,
    position: u64,
    path: String,
    waiters: Vec<(oneshot::Sender<WalResult<AppendAck>>, Range<usize>)>,
}

impl InFlight {
    fn ack(mut self, generation: u64) {
        for (tx, batches) in self.waiters.drain(..) {
            let _ = tx.send(Ok(AppendAck {
                position: self.position,
                generation,
                batches,
            }));
        }
    }

    fn fail(mut self, err: &WalError) {
        for (tx, _) in self.waiters.drain(..) {
            let _ = tx.send(Err(err.clone()));
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        for (tx, _) in self.waiters.drain(..) {
            let _ = tx.send(Err(WalError::OutcomeUnknown {
                shard: self.shard,
                position: self.position,
                path: self.path.clone(),
                reason: "the appender stopped while the entry's PUT was in flight".into(),
            }));
        }
    }
}

impl CommitTask {
    pub(crate) fn new(
        shared: Arc<Shared>,
        loc: WalLocation,
        manifests: Arc<ManifestStore>,
        config: WalConfig,
        first_position: u64,
        generation: u64,
    ) -> Self {
        let meters = Meters::new(manifests.layout().shard().to_string());
        Self {
            shared,
            loc,
            manifests,
            config,
            next: first_position,
            generation,
            meters,
            previous: None,
        }
    }

    /// Until when to wait for more appends before taking `queued` of them
    /// (`None`: take them now).
    fn regroup_until(&self, queued: usize) -> Option<tokio::time::Instant> {
        let prev = self.previous?;
        if queued == 0 || queued >= prev.appends {
            return None;
        }
        let deadline = prev.acked + (prev.put / 2).min(self.config.max_regroup_wait);
        (tokio::time::Instant::now() < deadline).then_some(deadline)
    }

    pub(crate) async fn run(mut self) {
        let _drain = DrainOnExit(self.shared.clone());
        while let Some(group) = self.next_group().await {
            if self.write_group(group).await.is_err() {
                return;
            }
        }
        tracing::debug!(next = self.next, "WAL appender stopped");
    }

    /// Waits for work; resolves generation switches at the head of the
    /// queue (nothing is in flight, so every earlier entry is durable) and
    /// takes the next group of appends. `None` once closed and drained.
    async fn next_group(&mut self) -> Option<Vec<Pending>> {
        let mut lingered = self.config.linger.is_zero();
        loop {
            let mut switches = Vec::new();
            let mut group = Vec::new();
            let (closing, regroup) = {
                let mut q = self.shared.queue.lock();
                while matches!(q.items.front(), Some(Item::Switch { .. })) {
                    if let Some(Item::Switch { generation, tx }) = q.items.pop_front() {
                        switches.push((generation, tx));
                    }
                }
                let regroup = if lingered && !q.closing {
                    self.regroup_until(q.queued_appends)
                } else {
                    None
                };
                if lingered && regroup.is_none() {
                    take_group(&mut q.items, self.config.max_entry_bytes, &mut group);
                    q.queued_appends -= group.len();
                }
                (q.closing, regroup)
            };
            for (generation, tx) in switches {
                let previous_generation = self.generation;
                self.generation = generation;
                let _ = tx.send(Ok(GenerationSwitch {
                    previous_generation,
                    generation,
                    last_position: self.next - 1,
                }));
            }
            if !group.is_empty() {
                return Some(group);
            }
            if let Some(deadline) = regroup {
                let more = self.shared.wake.notified();
                if tokio::time::timeout_at(deadline, more).await.is_err() {
                    // Waited long enough: the producers that did not come
                    // back no longer count.
                    self.previous = None;
                }
                continue;
            }
            if !lingered && self.shared.queue.lock().queued_appends > 0 {
                tokio::time::sleep(self.config.linger).await;
                lingered = true;
                continue;
            }
            if closing && self.shared.queue.lock().items.is_empty() {
                return None;
            }
            self.shared.wake.notified().await;
        }
    }

    /// Encodes and writes one entry; acknowledges its appends once durable.
    /// An `Err` has poisoned the appender and failed the entry's appends.
    async fn write_group(&mut self, group: Vec<Pending>) -> WalResult<()> {
        let generation = group[0].generation;
        debug_assert_eq!(generation, self.generation);
        let (bytes, waiters) = match self.encode(group) {
            Ok(encoded) => encoded,
            Err((e, group)) => {
                // The writer may already hold these rows in memory: nothing
                // may follow them, or rows that were never logged could be
                // published. Poison first, then tell the entry's appends.
                self.poison(e.clone());
                for p in group {
                    let _ = p.tx.send(Err(e.clone()));
                }
                return Err(e);
            }
        };
        let appends = waiters.len();
        let mut inflight = InFlight {
            shard: self.shared.shard,
            position: self.next,
            path: self.loc.path(self.next).to_string(),
            waiters,
        };
        let len = bytes.len();
        let span = tracing::debug_span!(
            "wal_put",
            position = self.next,
            bytes = len,
            appends,
            generation
        );
        let started = Instant::now();
        let put_started = tokio::time::Instant::now();
        memwal_store::crash_point("wal::before_put");
        // Whether this entry's appends were counted durable already (only
        // the broken early acknowledgement does so before the PUT).
        let mut counted = false;
        if memwal_store::broken("broken::wal_ack_before_put") {
            self.shared.counts.made_durable(appends);
            counted = true;
            let early = InFlight {
                shard: inflight.shard,
                position: inflight.position,
                path: inflight.path.clone(),
                waiters: std::mem::take(&mut inflight.waiters),
            };
            early.ack(generation);
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
        let result = self.put(&mut inflight, bytes).instrument(span).await;
        self.meters
            .put_seconds
            .record(started.elapsed().as_secs_f64());
        match result {
            Ok(position) => {
                memwal_store::crash_point("wal::after_put");
                self.shared.durable.store(position, Ordering::SeqCst);
                // Counted before any ticket resolves: an acknowledged
                // append is always counted durable (readers show only
                // counted appends).
                if !counted {
                    self.shared.counts.made_durable(appends);
                }
                inflight.ack(generation);
                self.previous =
                    (self.config.max_regroup_wait > std::time::Duration::ZERO).then(|| Previous {
                        appends,
                        put: put_started.elapsed(),
                        acked: tokio::time::Instant::now(),
                    });
                self.meters.entries.increment(1);
                self.meters.bytes.increment(len as u64);
                self.meters.appends.increment(appends as u64);
                self.meters.appends_per_entry.record(appends as f64);
                // The entry is durable; only what follows it needs a position.
                match self.position_after(position) {
                    Ok(next) => {
                        self.next = next;
                        Ok(())
                    }
                    Err(e) => {
                        self.poison(e.clone());
                        Err(e)
                    }
                }
            }
            Err(e) => {
                // Poison before anyone hears of the failure, so a submit
                // made after a waiter saw it is refused too.
                self.poison(e.clone());
                inflight.fail(&e);
                Err(e)
            }
        }
    }

    /// The entry bytes for `group` and each append's batch range in it;
    /// when arrow cannot encode the group, [`WalError::Unencodable`] and
    /// the group back (its appends share one schema, so none is isolated).
    #[allow(clippy::type_complexity)]
    fn encode(
        &self,
        group: Vec<Pending>,
    ) -> Result<
        (
            Bytes,
            Vec<(oneshot::Sender<WalResult<AppendAck>>, Range<usize>)>,
        ),
        (WalError, Vec<Pending>),
    > {
        let generation = Some(group[0].generation);
        let all: Vec<RecordBatch> = group
            .iter()
            .flat_map(|p| p.batches.iter().cloned())
            .collect();
        let stamps: Vec<_> = group.iter().filter_map(|p| p.stamp.clone()).collect();
        let bytes = match encode_stamped_entry(self.shared.epoch, generation, &all, &stamps) {
            Ok(bytes) => bytes,
            Err(e) => {
                let reason = match e {
                    WalError::InvalidInput { reason } => reason,
                    other => other.to_string(),
                };
                let err = WalError::Unencodable {
                    shard: self.shared.shard,
                    position: self.next,
                    reason,
                };
                return Err((err, group));
            }
        };
        let mut offset = 0;
        let waiters = group
            .into_iter()
            .map(|p| {
                let messages: usize = p.batches.iter().map(crate::codec::message_count).sum();
                let range = offset..offset + messages;
                offset = range.end;
                (p.tx, range)
            })
            .collect();
        Ok((bytes, waiters))
    }

    /// PUT-if-not-exists at the next position; returns the position used.
    /// Transient failures are retried with the same bytes (so our own
    /// landed write reads back as identical).
    async fn put(&mut self, inflight: &mut InFlight, bytes: Bytes) -> WalResult<u64> {
        loop {
            let position = self.next;
            let path = self.loc.path(position);
            inflight.position = position;
            inflight.path = path.to_string();
            match create_object(
                self.loc.store().as_ref(),
                &path,
                bytes.clone(),
                self.loc.retry(),
            )
            .await
            {
                Ok(CreateOutcome::Created | CreateOutcome::Identical) => return Ok(position),
                Ok(CreateOutcome::Conflict(_))
                    if memwal_store::broken("broken::wal_conflict_is_success") =>
                {
                    return Ok(position)
                }
                Ok(CreateOutcome::Conflict(found)) => {
                    self.collision(position, &found).await?;
                    tracing::info!(position, "stepped over a fence sentinel of an older writer");
                    self.next = self.position_after(position)?;
                }
                // A definite refusal of the first attempt: nothing was
                // written, and the appends say so (not "may be durable").
                Err(e @ StoreError::Request { .. }) => return Err(e.into()),
                // Every other failure may hide a landed write of ours:
                // retries ran out, a refusal followed an attempt that may
                // have landed, a collision on a retry could not be read
                // back, an fsync failed. Never report such an append as
                // plainly failed.
                Err(e) => {
                    return Err(WalError::OutcomeUnknown {
                        shard: self.shared.shard,
                        position,
                        path: path.to_string(),
                        reason: e.to_string(),
                    })
                }
            }
        }
    }

    /// The position after `position`; [`WalError::Corrupt`] at `u64::MAX`
    /// (only a stray or corrupt object can put the WAL there).
    fn position_after(&self, position: u64) -> WalResult<u64> {
        position.checked_add(1).ok_or_else(|| WalError::Corrupt {
            shard: self.shared.shard,
            position,
            path: self.loc.path(position).to_string(),
            reason: "no WAL position follows the last possible one (u64::MAX)".into(),
        })
    }

    /// Explains another object at our next position. Our bytes are not
    /// there, so the appends of this entry were not written there.
    ///
    /// `Ok` only for a data-less sentinel of a writer not newer than us
    /// while the manifest confirms we own the shard: a stale claimer put it
    /// above our sentinel (its own replay will find ours and fence it), so
    /// stepping over it loses nothing. Everything else is the error that
    /// poisons the appender.
    async fn collision(&self, position: u64, found: &Bytes) -> WalResult<()> {
        let shard = self.shared.shard;
        let epoch = self.shared.epoch;
        let manifest = match self.manifests.load_latest().await {
            Ok(Some(m)) => m,
            Ok(None) => return Err(FencingError::ShardNotFound { shard }.into()),
            Err(e) => return Err(e.into()),
        };
        if manifest.status == ShardStatus::Sealed as i32 {
            return Err(WalError::Sealed { shard });
        }
        if manifest.writer_epoch > epoch {
            return Err(WalError::Fenced {
                shard,
                local_epoch: epoch,
                stored_epoch: manifest.writer_epoch,
            });
        }
        if manifest.writer_epoch < epoch {
            return Err(FencingError::EpochRegressed {
                shard,
                local_epoch: epoch,
                stored_epoch: manifest.writer_epoch,
            }
            .into());
        }
        let entry = self.loc.decode(position, found)?;
        if entry.epoch > epoch {
            return Err(WalError::Fenced {
                shard,
                local_epoch: epoch,
                stored_epoch: entry.epoch,
            });
        }
        if entry.is_sentinel {
            return Ok(());
        }
        Err(WalError::EpochConflict {
            shard,
            position,
            path: self.loc.path(position).to_string(),
            epoch,
            found_epoch: entry.epoch,
        })
    }

    /// Records `err` as the appender's fate and fails everything queued.
    fn poison(&self, err: WalError) {
        let kind = match &err {
            WalError::Fenced { .. } => "fenced",
            WalError::Sealed { .. } => "sealed",
            WalError::OutcomeUnknown { .. } => "outcome_unknown",
            WalError::EpochConflict { .. } => "epoch_conflict",
            WalError::Unencodable { .. } => "unencodable",
            _ => "other",
        };
        metrics::counter!("memwal_wal_appender_poisoned_total", "reason" => kind).increment(1);
        tracing::warn!(error = %err, "WAL appender poisoned");
        let items = {
            let mut q = self.shared.queue.lock();
            q.poison = Some(err.clone());
            q.queued_appends = 0;
            std::mem::take(&mut q.items)
        };
        for item in items {
            item.fail(err.clone());
        }
    }
}

/// Moves the appends at the head of `items` that may share one entry into
/// `group`: same generation, same schema, within `max_bytes` (the first
/// always goes, however large). Stops at a generation switch.
fn take_group(items: &mut VecDeque<Item>, max_bytes: usize, group: &mut Vec<Pending>) {
    let mut bytes = 0usize;
    while let Some(Item::Append(p)) = items.front() {
        if let Some(first) = group.first() {
            let same_schema = Arc::ptr_eq(&p.schema, &first.schema) || p.schema == first.schema;
            if !same_schema
                || p.generation != first.generation
                || bytes.saturating_add(p.bytes) > max_bytes
            {
                break;
            }
        }
        bytes = bytes.saturating_add(p.bytes);
        if let Some(Item::Append(p)) = items.pop_front() {
            group.push(p);
        }
    }
}
