//! The write path: validate -> (backpressure) -> WAL submit + memtable
//! insert under one lock -> wait until durable.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use arrow_array::RecordBatch;
use memwal_memtable::{batch_payload_bytes, TableSchema, TOMBSTONE_COLUMN};
use memwal_wal::{AppendTicket, WalError};
use tracing::Instrument;

use crate::resolve::Routing;
use crate::writer::{Inner, State};
use crate::{Error, Result};

/// Resolves to the WAL position once the write is durable (or to the
/// error that made it fail). Dropping it does not cancel the write.
///
/// `Ok` means durable. [`Error::OutcomeUnknown`] means the rows may or may
/// not be durable; any other error means they were not written. Any error
/// here leaves the writer terminal (the WAL appender is poisoned).
#[must_use = "a put is acknowledged only when its handle resolves"]
pub struct PutHandle {
    ticket: AppendTicket,
    inner: Arc<Inner>,
    rows: usize,
    bytes: usize,
    started: Instant,
}

impl std::fmt::Debug for PutHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PutHandle")
            .field("rows", &self.rows)
            .finish_non_exhaustive()
    }
}

impl Future for PutHandle {
    type Output = Result<u64>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let out = match Pin::new(&mut self.ticket).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(r) => r,
        };
        Poll::Ready(match out {
            Ok(ack) => {
                let inner = &self.inner;
                inner.puts.fetch_add(1, Ordering::Relaxed);
                inner.rows.fetch_add(self.rows as u64, Ordering::Relaxed);
                let m = &inner.ctx.meters;
                m.puts.increment(1);
                m.rows.increment(self.rows as u64);
                m.bytes.increment(self.bytes as u64);
                m.put_seconds.record(self.started.elapsed().as_secs_f64());
                Ok(ack.position)
            }
            Err(e) => {
                let mut st = self.inner.state.lock();
                // Never written (queued when the writer stopped): report why
                // it stopped rather than "closed".
                let err = match (&e, &st.terminal) {
                    (WalError::Closed, Some(t)) => t.clone(),
                    _ => Error::from_wal(e, "WAL append"),
                };
                self.inner.fail_locked(&mut st, err.clone());
                Err(err)
            }
        })
    }
}

/// A user (or storage) batch in storage form, checked against the shard.
/// A user batch that lacks nullable columns of the table (and has no
/// column the table lacks) is written with them null: a producer that
/// predates a column added to the table keeps writing. A user batch with
/// a column the table does not have is refused, naming it.
pub(crate) fn validate_put(inner: &Inner, batch: &RecordBatch) -> Result<RecordBatch> {
    let (schema, routing) = shape(inner)?;
    let filled = fill_missing_nullable(schema.table_schema(), batch)?;
    let batch = filled.as_ref().unwrap_or(batch);
    let storage = schema.to_storage(batch).map_err(Error::from_memtable)?;
    check_shard(routing.as_deref(), &storage)?;
    Ok(storage)
}

fn shape(inner: &Inner) -> Result<(Arc<TableSchema>, Option<Arc<Routing>>)> {
    let st = inner.state.lock();
    st.check_usable()?;
    Ok(st.shape())
}

/// `batch` in `table`'s column order with its missing nullable columns
/// null-filled; `None` when there is nothing to fill or the batch cannot be
/// filled (a storage batch, a missing non-nullable column: validation then
/// refuses it, naming why). A user batch with a column the table lacks is
/// refused here, naming the column.
fn fill_missing_nullable(
    table: &arrow_schema::SchemaRef,
    batch: &RecordBatch,
) -> Result<Option<RecordBatch>> {
    let got = batch.schema();
    if got.column_with_name(TOMBSTONE_COLUMN).is_some() {
        return Ok(None);
    }
    let unknown: Vec<&str> = got
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .filter(|n| table.index_of(n).is_err())
        .collect();
    if !unknown.is_empty() {
        let has: Vec<&str> = table.fields().iter().map(|f| f.name().as_str()).collect();
        return Err(Error::invalid(format!(
            "a put sends column(s) {} the table does not have (it has {})",
            unknown.join(", "),
            has.join(", ")
        )));
    }
    if got.fields().len() >= table.fields().len() {
        return Ok(None);
    }
    let mut fields = Vec::with_capacity(table.fields().len());
    let mut columns = Vec::with_capacity(table.fields().len());
    for f in table.fields() {
        match got.index_of(f.name()) {
            Ok(i) => {
                fields.push(got.fields()[i].clone());
                columns.push(batch.column(i).clone());
            }
            Err(_) if f.is_nullable() => {
                fields.push(f.clone());
                columns.push(arrow_array::new_null_array(f.data_type(), batch.num_rows()));
            }
            Err(_) => return Ok(None),
        }
    }
    let schema = std::sync::Arc::new(arrow_schema::Schema::new(fields));
    Ok(RecordBatch::try_new(schema, columns).ok())
}

/// The tombstone batch for `keys`, checked against the shard (the sharding
/// columns must be key columns for deletes to route; docs/memwal-format.md: every
/// primary key maps to exactly one shard).
pub(crate) fn validate_delete(inner: &Inner, keys: &RecordBatch) -> Result<RecordBatch> {
    let (schema, routing) = shape(inner)?;
    let storage = schema.tombstone_batch(keys).map_err(Error::from_memtable)?;
    check_shard(routing.as_deref(), &storage)?;
    Ok(storage)
}

/// The payload bytes of a storage batch, refused when one put cannot hold
/// them.
pub(crate) fn check_size(inner: &Inner, storage: &RecordBatch) -> Result<usize> {
    let bytes = batch_payload_bytes(storage);
    if bytes > inner.config.memtable_max_bytes {
        return Err(Error::invalid(format!(
            "a put holds {bytes} bytes of rows, more than the per-put maximum \
             memtable_max_bytes = {} (one generation must fit within it): split the batch",
            inner.config.memtable_max_bytes
        )));
    }
    Ok(bytes)
}

fn check_shard(routing: Option<&Routing>, storage: &RecordBatch) -> Result<()> {
    routing.map_or(Ok(()), |r| r.check(storage))
}

/// `storage`, checked under the state lock against the active memtable's
/// schema: a batch validated against an older schema (the writer followed
/// a schema change in between) is matched to the new one by field id, as
/// replay would match its WAL entry (a column added since is null, one
/// dropped since is left out: the put is ordered before the change).
fn current_form(st: &State, storage: RecordBatch) -> Result<RecordBatch> {
    let schema = st.active.schema();
    if Arc::ptr_eq(&storage.schema(), schema.storage_schema()) {
        return Ok(storage);
    }
    let storage = schema
        .to_storage_for_replay(&storage)
        .map_err(Error::from_memtable)?;
    check_shard(st.routing.as_deref(), &storage)?;
    Ok(storage)
}

/// Waits for room (backpressure), then appends `storage` to the WAL and
/// inserts it into the active memtable under the state lock.
pub(crate) async fn submit(inner: &Arc<Inner>, mut storage: RecordBatch) -> Result<PutHandle> {
    let span = tracing::debug_span!("append", rows = storage.num_rows());
    async {
        let started = Instant::now();
        let bytes = check_size(inner, &storage)?;
        let deadline = tokio::time::Instant::now() + inner.config.backpressure_timeout;
        let mut progress = inner.progress.subscribe();
        let mut waited = false;
        loop {
            {
                let mut st = inner.state.lock();
                st.check_usable()?;
                if st.unflushed_bytes() < inner.config.max_unflushed_bytes {
                    storage = current_form(&st, storage)?;
                    let ticket = append_locked(inner, &mut st, &storage, bytes)?;
                    inner.record_unflushed(&st);
                    return Ok(PutHandle {
                        ticket,
                        inner: inner.clone(),
                        rows: storage.num_rows(),
                        bytes,
                        started,
                    });
                }
                // No room: make sure everything in memory is on its way out.
                crate::freeze::freeze_locked(inner, &mut st, "backpressure")?;
                progress.borrow_and_update();
            }
            if !waited {
                waited = true;
                crate::backpressure::note_wait(inner);
            }
            match tokio::time::timeout_at(deadline, progress.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) => return Err(Error::closed("the writer is gone")),
                Err(_) => {
                    inner.ctx.meters.backpressure_timeouts.increment(1);
                    return Err(crate::backpressure::error(inner));
                }
            }
        }
    }
    .instrument(span)
    .await
}

/// WAL submit then memtable insert, in one critical section: the WAL
/// order of submits is the memtable's insert order. A failure after the
/// submit makes the writer terminal, so rows in the memtable that were
/// never acknowledged can never be published.
///
/// A put whose `bytes` of rows would take the active generation past
/// `memtable_max_bytes` freezes it first, so every generation's rows fit
/// within `memtable_max_bytes` (<= `max_unflushed_bytes`) and replay under
/// the same config never refuses what was acknowledged.
fn append_locked(
    inner: &Arc<Inner>,
    st: &mut State,
    storage: &RecordBatch,
    bytes: usize,
) -> Result<AppendTicket> {
    let active_payload = st.active.memory_usage().payload_bytes;
    if !st.active.is_empty()
        && active_payload.saturating_add(bytes) > inner.config.memtable_max_bytes
    {
        crate::freeze::freeze_locked(inner, st, "bytes")?;
    }
    let Some(appender) = st.appender.as_ref() else {
        return Err(st
            .terminal
            .clone()
            .unwrap_or_else(|| Error::closed("no WAL appender")));
    };
    let ticket = match appender.submit(vec![storage.clone()]) {
        Ok(t) => t,
        Err(e) => {
            let err = Error::from_wal(e, "WAL submit");
            if err.is_terminal() {
                inner.fail_locked(st, err.clone());
            }
            return Err(err);
        }
    };
    if let Err(e) = st.active.insert(storage) {
        let err = Error::Corrupt {
            reason: format!("the memtable refused a batch already submitted to the WAL: {e}"),
        };
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
        crate::freeze::freeze_locked(inner, st, reason)?;
    }
    Ok(ticket)
}
