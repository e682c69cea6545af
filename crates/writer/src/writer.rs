//! [`ShardWriter`]: the public handle. Nothing in the crate imports this
//! module; the handle calls into the write path, the lifecycle and the
//! flusher through the shared state ([`crate::state::Inner`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use memwal_fencing::{ShardId, ShardManifest};
use memwal_memtable::TableSchema;

use crate::config::ShardWriterConfig;
use crate::lifecycle::Phase;
use crate::open::TableLocation;
use crate::producers::{Acked, Gaps, ProducerSeq};
use crate::put::PutHandle;
use crate::state::Inner;
use crate::stats::WriterStats;
use crate::{Error, Result};

/// A batch checked against one shard and in its storage form
/// ([`ShardWriter::prepare_put`]); nothing of it is written yet.
#[derive(Debug, Clone)]
pub struct PreparedPut {
    shard: ShardId,
    storage: RecordBatch,
}

impl PreparedPut {
    /// Rows it holds.
    pub fn num_rows(&self) -> usize {
        self.storage.num_rows()
    }
}

/// The single writer of one shard of a MemWAL table.
///
/// Created by [`ShardWriter::open`] (claim -> fence sentinel -> replay ->
/// WAL appender). Guarantees:
///
/// - `put`/`delete` return `Ok(position)` only once the rows are durable in
///   the WAL entry at `position`; rows enter the memtable in WAL order, so
///   replay after a crash picks the same winner per key (last write wins);
/// - each memtable generation is one contiguous run of WAL positions; its
///   SSTable is published with one manifest update that also moves the
///   replay cursor past it, strictly in generation order;
/// - fenced or sealed anywhere (WAL collision, manifest update, replay) =>
///   terminal: every later call returns that error, background work stops,
///   nothing acknowledged before is lost (it is in the WAL);
/// - dropping the writer without [`ShardWriter::close`] is
///   [`ShardWriter::abort`]: tasks stop, nothing more is written, unflushed
///   rows stay in the WAL for the next writer to replay.
///
/// Background work runs as tokio tasks, each inside a tracing span that
/// names it (tokio's own task names need `tokio_unstable`): `flusher`
/// (publishes in order), one `flush` job per frozen generation (SSTable
/// write), `age_ticker` (age trigger) and the WAL crate's `wal_appender`.
/// Their `JoinHandle`s are kept; `close` joins them, `abort`/drop aborts them.
pub struct ShardWriter {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for ShardWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardWriter")
            .field("shard", &self.inner.shard)
            .field("epoch", &self.inner.epoch)
            .finish()
    }
}

impl ShardWriter {
    /// Opens the writer of `shard` of the table at `table` (a URI such as
    /// `memory://name`, a local path, `s3://...`, or a [`memwal_store::StoreLocation`]).
    ///
    /// Everything that can be checked without side effects is checked
    /// first (config, base table schema and primary key, sharding spec,
    /// existing shard identity), so an open that is bound to fail never
    /// fences a healthy writer. Then: claim (epoch + 1), fence sentinel,
    /// replay of the WAL above the replay cursor (every recorded generation
    /// rebuilt whole and queued for publishing in the background, see the
    /// crate docs), and the WAL appender starts right after the sentinel.
    pub async fn open(
        table: impl Into<TableLocation>,
        shard: ShardId,
        config: ShardWriterConfig,
    ) -> Result<Self> {
        Ok(Self {
            inner: crate::open::open(table.into(), shard, config).await?,
        })
    }

    /// The shard.
    pub fn shard(&self) -> ShardId {
        self.inner.shard
    }

    /// The epoch (fencing token) this writer holds.
    pub fn epoch(&self) -> u64 {
        self.inner.epoch
    }

    /// The table schema rows are validated against now (it changes when
    /// the writer follows the base table's schema: [`Self::evolve_to`]).
    pub fn schema(&self) -> Arc<TableSchema> {
        self.inner.state.lock().active.schema().clone()
    }

    /// Moves this writer onto `base_schema` (the base table's Arrow schema
    /// with its field ids, as `memwal_table::BaseTable` reads it), if it
    /// differs from the one puts are checked against now. Returns the
    /// generation the new schema starts at, or `None` when nothing changed.
    ///
    /// Guarantees:
    /// - one generation never mixes schemas: the active memtable is frozen
    ///   first (its SSTable is written in the schema its rows were taken
    ///   in, carrying the maintained indexes whose columns it has), and the
    ///   next generation starts empty in the new schema;
    /// - a put checked against the old schema but not yet in the WAL when
    ///   the change lands is matched to the new one by field id (a column
    ///   added since is null, a dropped one left out), as replay would;
    /// - a put after the change that lacks a nullable column is written
    ///   with it null; one with a column the table no longer has is
    ///   refused, naming it.
    ///
    /// Refused ([`Error::InvalidInput`], the writer unchanged and usable)
    /// when the primary key differs (columns, order, field ids or types)
    /// or the sharding spec's columns are gone or no longer key columns.
    pub fn evolve_to(&self, base_schema: SchemaRef) -> Result<Option<u64>> {
        crate::evolve::evolve_to(&self.inner, base_schema)
    }

    /// Reads the base table's latest version and moves onto its schema
    /// ([`Self::evolve_to`]).
    pub async fn evolve(&self) -> Result<Option<u64>> {
        crate::evolve::evolve(&self.inner).await
    }

    /// The latest manifest this writer claimed or wrote (its view; another
    /// writer may have moved on since).
    pub fn manifest(&self) -> ShardManifest {
        self.inner.manifest.lock().clone()
    }

    /// Writes `batch` (the table's columns, or a storage batch with
    /// `_tombstone`) and waits until it is durable; returns its WAL position.
    /// [`Error::InvalidInput`] (writer still usable) for a batch that does
    /// not match the schema, has a null key or holds a row of another
    /// shard; [`Error::Backpressure`] when no room was made in time.
    pub async fn put(&self, batch: &RecordBatch) -> Result<u64> {
        self.put_nowait(batch).await?.await
    }

    /// Deletes the keys in `keys` (a batch holding the key columns by name)
    /// and waits until the tombstones are durable; returns the WAL position.
    pub async fn delete(&self, keys: &RecordBatch) -> Result<u64> {
        self.delete_nowait(keys).await?.await
    }

    /// Like [`ShardWriter::put`], but returns once the rows have their
    /// place in the WAL order (and are in the memtable), with a handle that
    /// resolves to the position once durable. Waits only for backpressure.
    /// Dropping the handle does not cancel the write.
    pub async fn put_nowait(&self, batch: &RecordBatch) -> Result<PutHandle> {
        let storage = crate::put::validate_put(&self.inner, batch)?;
        crate::put::submit(&self.inner, storage).await
    }

    /// Like [`ShardWriter::delete`], returning a [`PutHandle`].
    pub async fn delete_nowait(&self, keys: &RecordBatch) -> Result<PutHandle> {
        let storage = crate::put::validate_delete(&self.inner, keys)?;
        crate::put::submit(&self.inner, storage).await
    }

    /// Checks `batch` as [`ShardWriter::put`] would (schema, keys, nulls,
    /// the shard's routing, the per-put size) without writing anything:
    /// once every part of a larger write is prepared, none of them can be
    /// refused for what it holds. Only the writer's own state (fenced,
    /// closed, backpressure, storage) can still fail [`Self::put_prepared`].
    pub fn prepare_put(&self, batch: &RecordBatch) -> Result<PreparedPut> {
        let storage = crate::put::validate_put(&self.inner, batch)?;
        crate::put::check_size(&self.inner, &storage)?;
        Ok(PreparedPut {
            shard: self.inner.shard,
            storage,
        })
    }

    /// [`Self::prepare_put`] for the deletes of `keys`.
    pub fn prepare_delete(&self, keys: &RecordBatch) -> Result<PreparedPut> {
        let storage = crate::put::validate_delete(&self.inner, keys)?;
        crate::put::check_size(&self.inner, &storage)?;
        Ok(PreparedPut {
            shard: self.inner.shard,
            storage,
        })
    }

    /// Writes a batch [`Self::prepare_put`] (or `prepare_delete`) checked
    /// and waits until it is durable, as [`Self::put`]. A batch prepared
    /// by another shard's writer is refused ([`Error::InvalidInput`]).
    pub async fn put_prepared(&self, prepared: PreparedPut) -> Result<u64> {
        self.check_prepared(&prepared)?;
        crate::put::submit(&self.inner, prepared.storage)
            .await?
            .await
    }

    /// [`Self::put`] for an idempotent producer: writes `batch` as
    /// `seq.sequence` of producer `seq.producer` unless that sequence is
    /// already written at this shard, so a producer that retries every
    /// unknown outcome (with the same sequence, in order) writes each
    /// batch exactly once, across writer restarts, takeovers and
    /// flushes (docs/design/idempotent-producers.md).
    ///
    /// - A sequence at or below the producer's last one here is a
    ///   duplicate: nothing is written; [`Acked::duplicate`] with the
    ///   original WAL position (once that is durable; `None` when it is
    ///   older than the producer's last [`crate::PRODUCER_WINDOW`]).
    /// - An epoch below the one the producer last wrote with here, or a
    ///   sequence past `last + 1`, is [`Error::ProducerRefused`] (nothing
    ///   written, writer usable).
    /// - A producer not known here (first write, or expired after
    ///   `producer_expiry`) may start at any sequence.
    ///
    /// The batch of a retry must be the same as the original's: only the
    /// sequence is compared.
    pub async fn put_idempotent(&self, batch: &RecordBatch, seq: &ProducerSeq) -> Result<Acked> {
        let storage = crate::put::validate_put(&self.inner, batch)?;
        crate::put::put_as(&self.inner, storage, seq, Gaps::Refused).await
    }

    /// [`Self::delete`] for an idempotent producer, as
    /// [`Self::put_idempotent`].
    pub async fn delete_idempotent(&self, keys: &RecordBatch, seq: &ProducerSeq) -> Result<Acked> {
        let storage = crate::put::validate_delete(&self.inner, keys)?;
        crate::put::put_as(&self.inner, storage, seq, Gaps::Refused).await
    }

    /// [`Self::put_prepared`] for an idempotent producer, as
    /// [`Self::put_idempotent`]; with [`Gaps::Allowed`] a sequence past
    /// `last + 1` is written (the caller sends this shard a part of the
    /// producer's sequence and checks gaps itself).
    pub async fn put_prepared_as(
        &self,
        prepared: PreparedPut,
        seq: &ProducerSeq,
        gaps: Gaps,
    ) -> Result<Acked> {
        self.check_prepared(&prepared)?;
        crate::put::put_as(&self.inner, prepared.storage, seq, gaps).await
    }

    /// The epoch and last sequence this shard records for `producer`
    /// (`None`: not known here), e.g. for a restarted producer to learn
    /// where it stands.
    pub fn producer_state(&self, producer: &str) -> Option<(u64, u64)> {
        self.inner.state.lock().producers.last(producer)
    }

    fn check_prepared(&self, prepared: &PreparedPut) -> Result<()> {
        if prepared.shard != self.inner.shard {
            return Err(Error::invalid(format!(
                "a batch prepared for shard {} handed to shard {}",
                prepared.shard, self.inner.shard
            )));
        }
        Ok(())
    }

    /// A consistent read of what this writer holds, for readers that add
    /// it to the published view: the highest generation published and, in
    /// the same instant, every acknowledged row not yet published.
    /// Reading SSTables up to `published_generation` and then these rows
    /// in order gives the shard as of one WAL position: every put
    /// acknowledged before the call, and no row whose WAL write is not
    /// durable (a put submitted but not acknowledged, whose write may
    /// still fail: the visibility watermark, see `State::appends`).
    ///
    /// Works while the writer is usable, closing, and once closed (its
    /// memtables keep every acknowledged row that was not published; a
    /// row acknowledged by a close's drain is among them). Returns the
    /// terminal error of a writer that stopped otherwise (fenced, sealed,
    /// a storage failure, corrupt state): its acknowledged rows are in its
    /// WAL only for the next writer to replay. `epoch` is this writer's:
    /// a reader must drop the snapshot when the shard's manifest names
    /// another writer (this one is fenced and its rows may be stale).
    pub fn read_snapshot(&self) -> Result<ReadSnapshot> {
        let st = self.inner.state.lock();
        st.check_readable()?;
        // The chaos suite's broken variant shows rows not yet durable (its
        // read checks must catch it).
        let pending = match memwal_store::broken("broken::read_unacknowledged") {
            true => 0,
            false => st.pending_appends(),
        };
        Ok(ReadSnapshot {
            shard: self.inner.shard,
            epoch: self.inner.epoch,
            published_generation: st.published_generation,
            batches: st.unpublished_batches(pending),
        })
    }

    /// Every physical row not yet published (frozen generations oldest
    /// first, then the active memtable), in WAL order, storage schema
    /// (tombstones and overwritten rows included): applying them in order
    /// over the published SSTables gives the writer's current view. Unlike
    /// [`Self::read_snapshot`] this includes rows whose WAL write is still
    /// in flight.
    pub fn unflushed_batches(&self) -> Result<Vec<RecordBatch>> {
        let st = self.inner.state.lock();
        st.check_usable()?;
        Ok(st.unpublished_batches(0))
    }

    /// Freezes the active memtable (if it holds rows) and waits until it
    /// and every earlier generation are published. Returns the terminal
    /// error if the writer fails meanwhile.
    pub async fn flush(&self) -> Result<()> {
        crate::write_path::flush_all(&self.inner).await
    }

    /// Flushes and publishes everything acknowledged before the call, stops
    /// the background tasks and closes the WAL appender (appends racing the
    /// close are drained: if acknowledged they are durable in the WAL and
    /// the next writer replays them). Later calls return [`Error::Closed`]
    /// (or the error that stopped the writer first).
    ///
    /// Returns within `close_timeout` (plus the time to cancel background
    /// work): a flush that cannot finish by then (or whose retries,
    /// bounded while closing, run out) is abandoned, the writer stops
    /// anyway and the error is returned; rows not published stay in the
    /// WAL. Every background task, flush jobs included, has ended when it
    /// returns. Concurrent calls wait for the first and return its outcome.
    pub async fn close(&self) -> Result<()> {
        let inner = &self.inner;
        let mut outcome = inner.life.close_result.lock().await;
        if let Some(done) = &*outcome {
            return done.clone();
        }
        inner.life.advance(Phase::Closing);
        let limit = inner.config.close_timeout;
        let deadline = tokio::time::Instant::now() + limit;
        let flushed = match tokio::time::timeout_at(deadline, self.flush()).await {
            Ok(r) => r,
            Err(_) => {
                let last = inner.state.lock().last_flush_error.clone();
                Err(Error::storage(
                    "closing the writer",
                    std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "flushing did not finish within close_timeout {limit:?} (last flush \
                             error: {}); unpublished rows stay in the WAL",
                            last.as_deref().unwrap_or("none")
                        ),
                    ),
                ))
            }
        };
        let timed_out = |what: &str| {
            Error::storage(
                "closing the writer",
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "{what} did not stop within close_timeout {limit:?} and was abandoned; \
                         unpublished rows stay in the WAL"
                    ),
                ),
            )
        };
        let appender = inner.state.lock().appender.take();
        let appender_closed = match appender {
            Some(a) => match tokio::time::timeout_at(deadline, a.close()).await {
                Ok(r) => r.map_err(|e| Error::from_wal(e, "closing the WAL appender")),
                // Dropping it stops the appender; a pending put reports an
                // unknown outcome.
                Err(_) => Err(timed_out("the WAL appender")),
            },
            None => Ok(()),
        };
        inner.fail(Error::closed("the writer was closed"));
        // The failure stops every background task at its next step; one
        // stuck in a store call (a blackholed endpoint keeps retrying for
        // minutes) is aborted once the deadline (and a short grace) passed.
        let tasks = inner.life.take_tasks();
        let until = deadline.max(tokio::time::Instant::now()) + TASK_STOP_GRACE;
        let mut stuck = Ok(());
        for mut t in tasks {
            if tokio::time::timeout_at(until, &mut t).await.is_err() {
                t.abort();
                stuck = Err(timed_out("a background task (flush or publish)"));
            }
        }
        let result = flushed.and(appender_closed).and(stuck);
        *outcome = Some(result.clone());
        result
    }

    /// Stops without flushing: background tasks are aborted and no new
    /// request is started (a request already in flight may still land),
    /// unflushed rows stay in the WAL (the next writer replays them).
    /// Pending puts fail ([`Error::OutcomeUnknown`] if their entry was in
    /// flight). Later calls return [`Error::Closed`].
    pub fn abort(&self) {
        self.inner.fail(Error::closed("the writer was aborted"));
        self.inner.life.abort_tasks();
    }

    /// Sets the writer's gauges (epoch, unflushed bytes) again with their
    /// current values. A process whose metrics exporter drops series not
    /// updated for a while (the daemon does, so closed shards' series go)
    /// calls this periodically to keep a live, quiet writer's gauges.
    pub fn refresh_gauges(&self) {
        let inner = &self.inner;
        inner.storage.meters.epoch.set(inner.epoch as f64);
        inner.record_unflushed(&inner.state.lock());
    }

    /// Whether a write stall holds this shard's puts back now, and why:
    /// `stopped: ...` (puts refused) or `slowed: ...` (puts delayed);
    /// `None` below `stall_slowdown_sstables`. As of the last publish or
    /// stalled put; [`Self::stall_at`] answers for a fresher count.
    pub fn stall(&self) -> Option<String> {
        self.stall_at(self.inner.debt.pending())
    }

    /// The stall `pending` uncompacted SSTables put this shard in (see
    /// [`Self::stall`]).
    pub fn stall_at(&self, pending: usize) -> Option<String> {
        let c = &self.inner.config;
        if c.stall_stop_sstables > 0 && pending >= c.stall_stop_sstables {
            Some(format!(
                "stopped: {pending} SSTables wait for compaction (writer.stall_stop_sstables = {})",
                c.stall_stop_sstables
            ))
        } else if c.stall_slowdown_sstables > 0 && pending >= c.stall_slowdown_sstables {
            Some(format!(
                "slowed: {pending} SSTables wait for compaction (writer.stall_slowdown_sstables = {})",
                c.stall_slowdown_sstables
            ))
        } else {
            None
        }
    }

    /// The SSTables this writer's manifest lists above `covered` (the
    /// base table's covered generation of the shard, as a reader of the
    /// base just found it): what reads of the shard merge.
    pub fn pending_above(&self, covered: u64) -> usize {
        crate::stall::pending_above(&self.inner, covered)
    }

    /// A snapshot of the writer's state.
    pub fn stats(&self) -> WriterStats {
        let inner = &self.inner;
        let st = inner.state.lock();
        WriterStats {
            epoch: inner.epoch,
            generation: st.generation,
            published_generation: st.published_generation,
            active_rows: st.active.num_rows(),
            active_bytes: st.active.memory_usage().total(),
            unpublished: st
                .frozen
                .iter()
                .map(|f| (f.generation, f.memtable.num_rows()))
                .collect(),
            unflushed_bytes: st.unflushed_bytes(),
            last_durable_position: st
                .appender
                .as_ref()
                .map_or(0, |a| a.last_durable_position()),
            sentinel_position: inner.sentinel,
            puts: inner.puts.load(Ordering::Relaxed),
            rows: inner.rows.load(Ordering::Relaxed),
            publishes: inner.publishes.load(Ordering::Relaxed),
            backpressure_waits: inner.backpressure_waits.load(Ordering::Relaxed),
            flush_failures: inner.flush_failures.load(Ordering::Relaxed),
            last_flush_error: st.last_flush_error.clone(),
            pending_sstables: inner.debt.pending(),
            stalled_puts: inner.debt.delayed.load(Ordering::Relaxed),
            refused_puts: inner.debt.refused.load(Ordering::Relaxed),
            terminal: st.terminal.as_ref().map(|e| e.to_string()),
        }
    }
}

/// What [`ShardWriter::read_snapshot`] returns.
#[derive(Debug, Clone)]
pub struct ReadSnapshot {
    /// The shard.
    pub shard: ShardId,
    /// The epoch of the writer it was read from: valid only while the
    /// shard's latest manifest carries this `writer_epoch`.
    pub epoch: u64,
    /// Generations up to this one are published (in the manifest, or
    /// compacted into the base table).
    pub published_generation: u64,
    /// Every acknowledged physical row of the later generations, oldest
    /// first, in the storage schema (table columns plus `_tombstone`;
    /// overwritten rows included: apply them in order).
    pub batches: Vec<RecordBatch>,
}

/// How long past `close_timeout` a closing writer waits for a background
/// task to stop by itself before aborting it.
const TASK_STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

impl ShardWriter {
    /// The error that stopped this writer for good, if one did: fenced or
    /// sealed (another writer owns the shard), closed (closed or aborted),
    /// or the failure that made it terminal (a storage error past its
    /// retries, a failed fsync, corrupt state). Every later call returns it.
    pub fn terminal_error(&self) -> Option<Error> {
        self.inner.state.lock().terminal.clone()
    }
}

impl Drop for ShardWriter {
    /// Dropping without [`ShardWriter::close`] aborts (see [`ShardWriter::abort`]).
    fn drop(&mut self) {
        let open = self.inner.state.lock().terminal.is_none();
        if open {
            tracing::debug!(shard = %self.inner.shard, "shard writer dropped without close: aborting");
        }
        self.abort();
    }
}
