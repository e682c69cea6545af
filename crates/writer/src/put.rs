//! The write path: validate -> (backpressure) -> WAL submit + memtable
//! insert under one lock -> wait until durable.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::time::Instant;

use arrow_array::RecordBatch;
use memwal_memtable::{batch_payload_bytes, TableSchema, TOMBSTONE_COLUMN};
use memwal_wal::{AppendTicket, ProducerStamp, WalError};
use tracing::Instrument;

use crate::producers::{self, Acked, Admit, Gaps, Landing, ProducerSeq, SharedTicket};
use crate::resolve::Routing;
use crate::state::{Inner, State};
use crate::write_path;
use crate::{Error, Result};

/// Resolves to the WAL position once the write is durable (or to the
/// error that made it fail). Dropping it does not cancel the write.
///
/// `Ok` means durable. [`Error::OutcomeUnknown`] means the rows may or may
/// not be durable; any other error means they were not written. Any error
/// here leaves the writer terminal (the WAL appender is poisoned).
#[must_use = "a put is acknowledged only when its handle resolves"]
pub struct PutHandle {
    ticket: Ticket,
    inner: Arc<Inner>,
    rows: usize,
    bytes: usize,
    started: Instant,
}

/// A put's WAL ticket: its own, or shared with the producers table (a
/// retry of the same sequence awaits it too).
pub(crate) enum Ticket {
    Own(AppendTicket),
    Shared(SharedTicket),
}

impl Future for Ticket {
    type Output = std::result::Result<memwal_wal::AppendAck, WalError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Ticket::Own(t) => Pin::new(t).poll(cx),
            Ticket::Shared(t) => Pin::new(t).poll(cx),
        }
    }
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
                let m = &inner.storage.meters;
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
    // The common case, checked first: the table's columns, in order.
    let exact = got.fields().len() == table.fields().len()
        && got
            .fields()
            .iter()
            .zip(table.fields())
            .all(|(g, t)| g.name() == t.name());
    if exact || got.column_with_name(TOMBSTONE_COLUMN).is_some() {
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

/// Waits for room (backpressure), then appends `storage` to the WAL and
/// inserts it into the active memtable under the state lock
/// ([`write_path::append_locked`]). While there is no room, everything in
/// memory is made sure to be on its way out (frozen) and the put waits
/// for a publish, up to `backpressure_timeout`.
pub(crate) async fn submit(inner: &Arc<Inner>, storage: RecordBatch) -> Result<PutHandle> {
    match submit_as(inner, storage, None).await? {
        Submitted::Written(handle) => Ok(handle),
        Submitted::Duplicate(_) => Err(Error::corrupt("a put without a producer was a duplicate")),
    }
}

/// What [`submit_as`] did.
pub(crate) enum Submitted {
    /// Appended: the handle resolves once durable.
    Written(PutHandle),
    /// The producer's sequence was written before: nothing was appended.
    Duplicate(Option<Landing>),
}

/// [`submit`] for a put that may carry a producer sequence: admitted by
/// the producers table under the state lock before anything else (a
/// duplicate or a refusal never waits for room), then stamped into the
/// WAL entry and recorded in the same critical section as the append.
pub(crate) async fn submit_as(
    inner: &Arc<Inner>,
    storage: RecordBatch,
    seq: Option<(&ProducerSeq, Gaps)>,
) -> Result<Submitted> {
    let span = tracing::debug_span!("append", rows = storage.num_rows());
    async {
        let started = Instant::now();
        let bytes = check_size(inner, &storage)?;
        crate::stall::admit(inner).await?;
        let deadline = Instant::now() + inner.config.backpressure_timeout;
        let mut storage = Some(storage);
        let mut waited = false;
        let appended = inner
            .wait_until(Some(deadline), |st| {
                if let Err(e) = st.check_usable() {
                    return Some(Err(e));
                }
                if let Some((seq, gaps)) = seq {
                    match st.producers.admit(seq, gaps, inner.config.producer_limit) {
                        Ok(Admit::New) => {}
                        Ok(Admit::Duplicate(landing)) => {
                            inner.storage.meters.producer_duplicates.increment(1);
                            return Some(Ok(Err(landing)));
                        }
                        Err(e) => {
                            inner.storage.meters.producer_refusals.increment(1);
                            return Some(Err(e));
                        }
                    }
                }
                if st.unflushed_bytes() < inner.config.max_unflushed_bytes {
                    // Taken once: the wait ends with this check's answer.
                    return storage
                        .take()
                        .map(|b| append_now(inner, st, b, bytes, seq.map(|(s, _)| s)).map(Ok));
                }
                if let Err(e) = write_path::freeze_locked(inner, st, "backpressure") {
                    return Some(Err(e));
                }
                if !waited {
                    waited = true;
                    crate::backpressure::note_wait(inner);
                }
                None
            })
            .await?;
        let (ticket, rows) = match appended {
            Some(Ok(appended)) => appended,
            Some(Err(landing)) => return Ok(Submitted::Duplicate(landing)),
            None => {
                inner.storage.meters.backpressure_timeouts.increment(1);
                return Err(crate::backpressure::error(inner));
            }
        };
        Ok(Submitted::Written(PutHandle {
            ticket,
            inner: inner.clone(),
            rows,
            bytes,
            started,
        }))
    }
    .instrument(span)
    .await
}

/// [`submit_as`], then waits until the rows are durable (or, for a
/// duplicate, until the original append is).
pub(crate) async fn put_as(
    inner: &Arc<Inner>,
    storage: RecordBatch,
    seq: &ProducerSeq,
    gaps: Gaps,
) -> Result<Acked> {
    memwal_wal::check_producer_id(&seq.producer).map_err(Error::invalid)?;
    match submit_as(inner, storage, Some((seq, gaps))).await? {
        Submitted::Written(handle) => Ok(Acked {
            position: Some(handle.await?),
            duplicate: false,
        }),
        Submitted::Duplicate(None) => Ok(Acked {
            position: None,
            duplicate: true,
        }),
        Submitted::Duplicate(Some(Landing::At(p))) => Ok(Acked {
            position: Some(p),
            duplicate: true,
        }),
        // The original is still being written: acknowledged with it (its
        // failure made the writer terminal; that error is returned).
        Submitted::Duplicate(Some(Landing::InFlight(ticket))) => match ticket.await {
            Ok(ack) => Ok(Acked {
                position: Some(ack.position),
                duplicate: true,
            }),
            Err(e) => Err(inner
                .state
                .lock()
                .terminal
                .clone()
                .unwrap_or_else(|| Error::from_wal(e, "WAL append of the original put"))),
        },
    }
}

/// The append itself, under the state lock: the batch in the active
/// schema, then WAL submit + memtable insert.
fn append_now(
    inner: &Arc<Inner>,
    st: &mut State,
    storage: RecordBatch,
    bytes: usize,
    seq: Option<&ProducerSeq>,
) -> Result<(Ticket, usize)> {
    let storage = write_path::current_form(st, storage)?;
    let stamp = seq.map(|s| ProducerStamp {
        producer: s.producer.clone(),
        epoch: s.epoch,
        sequence: s.sequence,
        at_ms: producers::now_ms(),
    });
    let ticket = write_path::append_locked(inner, st, &storage, bytes, stamp)?;
    inner.record_unflushed(st);
    Ok((ticket, storage.num_rows()))
}
