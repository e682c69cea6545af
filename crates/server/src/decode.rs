//! Client FlightData to record batches, safely.
//!
//! arrow-ipc trusts the message it decodes: a body-compressed buffer's first
//! 8 bytes declare its decompressed length and the decoder allocates that
//! much up front (an allocation failure aborts the process, which no task
//! boundary catches), and out-of-range buffer offsets trip assertions.
//! [`check_message`] therefore reads every message's IPC header before the
//! decoder sees it and refuses one whose buffers do not lie inside its body,
//! whose counts are negative, whose compression is unknown, or whose
//! declared decoded size is over [`IngestLimits::max_decoded_message_bytes`].
//! What is left (a well-formed header that still makes arrow-ipc panic) is
//! caught around each decode step by [`IngestInput::next`]. Either way the
//! call ends with a status naming the table; nothing of the message was
//! written.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_flight::FlightData;
use arrow_ipc::{BodyCompressionMethod, CompressionType, MessageHeader};
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use tonic::Status;

/// Bounds on what clients may make the daemon hold. Past any of them a
/// call is refused (`RESOURCE_EXHAUSTED`, or `DEADLINE_EXCEEDED` for a
/// silent stream) and nothing of it is written; the daemon keeps serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngestLimits {
    /// Largest decoded size one message may declare: the sum of its
    /// buffers, after decompression for a compressed body. Larger messages
    /// are refused before anything is allocated. Default 256 MiB (the
    /// largest message the daemon accepts: an uncompressed message that
    /// tonic accepts always fits).
    pub max_decoded_message_bytes: usize,
    /// Decoded bytes all streams together may hold at once: a message is
    /// counted from its check until its batch's write returned (including
    /// a wait under backpressure). A message that does not fit now is
    /// refused. Default 1 GiB.
    pub max_decoded_bytes_in_flight: usize,
    /// Ingest calls (DoPut, Flight SQL ingest) open at once. Default 256.
    pub max_streams: usize,
    /// How long a new ingest call may take to send its first message.
    /// Default 30 s.
    pub first_message_timeout: std::time::Duration,
}

impl Default for IngestLimits {
    fn default() -> Self {
        Self {
            max_decoded_message_bytes: 256 << 20,
            max_decoded_bytes_in_flight: 1 << 30,
            max_streams: 256,
            first_message_timeout: std::time::Duration::from_secs(30),
        }
    }
}

/// The daemon-wide counters [`IngestLimits`] bounds.
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    pub limits: IngestLimits,
    pub streams: Arc<tokio::sync::Semaphore>,
    pub bytes: Arc<tokio::sync::Semaphore>,
}

impl Budget {
    pub(crate) fn new(limits: IngestLimits) -> Self {
        let cap = tokio::sync::Semaphore::MAX_PERMITS;
        Self {
            limits,
            streams: Arc::new(tokio::sync::Semaphore::new(limits.max_streams.min(cap))),
            bytes: Arc::new(tokio::sync::Semaphore::new(
                limits.max_decoded_bytes_in_flight.min(cap),
            )),
        }
    }

    /// A place for one more ingest call, or `RESOURCE_EXHAUSTED`.
    pub(crate) fn admit_stream(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Status> {
        self.streams.clone().try_acquire_owned().map_err(|_| {
            metrics::counter!("memwal_server_refused_total", "limit" => "max_streams").increment(1);
            Status::resource_exhausted(format!(
                "{} ingest calls are open, the most this daemon takes (max_streams); retry later",
                self.limits.max_streams
            ))
        })
    }

    /// Room for `bytes` more decoded bytes, or `RESOURCE_EXHAUSTED`.
    fn admit_bytes(
        &self,
        bytes: usize,
    ) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, Status> {
        if bytes == 0 {
            return Ok(None);
        }
        let n = u32::try_from(bytes).unwrap_or(u32::MAX);
        self.bytes.clone().try_acquire_many_owned(n).map(Some).map_err(|_| {
            metrics::counter!("memwal_server_refused_total", "limit" => "max_decoded_bytes_in_flight")
                .increment(1);
            Status::resource_exhausted(format!(
                "a message of {bytes} decoded bytes does not fit in what the daemon holds at once \
                 (max_decoded_bytes_in_flight = {}); retry later or send smaller batches",
                self.limits.max_decoded_bytes_in_flight
            ))
        })
    }
}

/// Checks one client message before it is decoded (see the module doc);
/// returns the bytes decoding it will produce.
pub(crate) fn check_message(data: &FlightData, limits: &IngestLimits) -> Result<usize, Status> {
    let bad = |what: String| Status::invalid_argument(format!("malformed Flight data: {what}"));
    if data.data_header.is_empty() {
        // Metadata only (app_metadata, or the descriptor of an empty put).
        return Ok(0);
    }
    let message = arrow_ipc::root_as_message(&data.data_header)
        .map_err(|e| bad(format!("the data header is not an Arrow IPC message ({e})")))?;
    let batch = match message.header_type() {
        MessageHeader::RecordBatch => message.header_as_record_batch(),
        MessageHeader::DictionaryBatch => {
            message.header_as_dictionary_batch().and_then(|d| d.data())
        }
        MessageHeader::Schema | MessageHeader::NONE => return Ok(data.data_header.len()),
        other => {
            return Err(bad(format!(
                "unexpected IPC message `{}` (a put sends a schema, then record batches)",
                other.variant_name().unwrap_or("unknown")
            )))
        }
    };
    let batch = batch.ok_or_else(|| bad("a batch message without its batch".into()))?;
    let body = data.data_body.as_ref();
    if batch.length() < 0 {
        return Err(bad(format!("negative row count {}", batch.length())));
    }
    for (i, node) in batch.nodes().into_iter().flatten().enumerate() {
        if node.length() < 0 || node.null_count() < 0 || node.null_count() > node.length() {
            return Err(bad(format!(
                "array {i} declares length {} with {} nulls",
                node.length(),
                node.null_count()
            )));
        }
    }
    let buffers = batch.buffers();
    let n_buffers = buffers.as_ref().map_or(0, |b| b.len());
    let mut variadic = 0i64;
    for count in batch.variadicBufferCounts().into_iter().flatten() {
        if count < 0 {
            return Err(bad(format!("negative variadic buffer count {count}")));
        }
        variadic = variadic.saturating_add(count);
    }
    if variadic > n_buffers as i64 {
        return Err(bad(format!(
            "{variadic} variadic buffers declared, the message has {n_buffers} buffers"
        )));
    }
    let compressed = match batch.compression() {
        None => false,
        Some(c) => {
            if c.codec() != CompressionType::LZ4_FRAME && c.codec() != CompressionType::ZSTD {
                return Err(bad(format!("unknown compression codec {}", c.codec().0)));
            }
            if c.method() != BodyCompressionMethod::BUFFER {
                return Err(bad(format!("unknown compression method {}", c.method().0)));
            }
            true
        }
    };
    let mut decoded = 0usize;
    for (i, b) in buffers.into_iter().flatten().enumerate() {
        let (offset, length) = (b.offset(), b.length());
        let range = usize::try_from(offset)
            .ok()
            .zip(usize::try_from(length).ok())
            .and_then(|(o, l)| Some(o..o.checked_add(l)?))
            .filter(|r| r.end <= body.len())
            .ok_or_else(|| {
                bad(format!(
                    "buffer {i} (offset {offset}, length {length}) lies outside the {}-byte body",
                    body.len()
                ))
            })?;
        let size = if !compressed || range.is_empty() {
            range.len()
        } else {
            let prefix: [u8; 8] = body
                .get(range.start..range.start + 8)
                .filter(|_| range.len() >= 8)
                .and_then(|p| p.try_into().ok())
                .ok_or_else(|| {
                    bad(format!(
                        "compressed buffer {i} has {} bytes, less than its 8-byte length prefix",
                        range.len()
                    ))
                })?;
            match i64::from_le_bytes(prefix) {
                // Stored uncompressed after the prefix.
                -1 => range.len() - 8,
                n if n >= 0 => usize::try_from(n).unwrap_or(usize::MAX),
                n => {
                    return Err(bad(format!(
                        "compressed buffer {i} declares decompressed length {n}"
                    )))
                }
            }
        };
        decoded = decoded.saturating_add(size);
        if decoded > limits.max_decoded_message_bytes {
            return Err(Status::resource_exhausted(format!(
                "a Flight message declares more than {} decoded bytes (max_decoded_message_bytes); \
                 send smaller batches",
                limits.max_decoded_message_bytes
            )));
        }
    }
    Ok(decoded)
}

/// One decoded put: the batch and its message's `app_metadata`.
pub(crate) struct Put {
    pub batch: RecordBatch,
    pub app_metadata: Bytes,
    /// Its share of `max_decoded_bytes_in_flight`, released when the put
    /// is dropped (after its write returned).
    pub _budget: Vec<tokio::sync::OwnedSemaphorePermit>,
}

type Pending = Arc<parking_lot::Mutex<Vec<tokio::sync::OwnedSemaphorePermit>>>;

/// The record batches of one DoPut stream, each message checked before it
/// is decoded.
pub(crate) struct IngestInput {
    table: String,
    /// The client's messages, each checked ([`check_message`]) and its
    /// budget taken as it is read.
    messages: BoxStream<'static, Result<FlightData, Status>>,
    ipc: crate::flight_ipc::FlightIpc,
    /// Budget permits of the messages the decoder has taken since the last
    /// batch was returned.
    pending: Pending,
    /// Turns true when the daemon cuts open streams (its drain expired).
    cut: tokio::sync::watch::Receiver<bool>,
}

impl IngestInput {
    /// The stream `messages` (the first one already read by the handler)
    /// of a put into `table`.
    pub(crate) fn new<S>(
        table: &str,
        messages: S,
        budget: Budget,
        cut: tokio::sync::watch::Receiver<bool>,
    ) -> Self
    where
        S: Stream<Item = Result<FlightData, Status>> + Send + 'static,
    {
        let pending = Pending::default();
        let held = pending.clone();
        let checked = messages.map(move |m| {
            let m = m?;
            let bytes = check_message(&m, &budget.limits)?;
            if let Some(permit) = budget.admit_bytes(bytes)? {
                held.lock().push(permit);
            }
            Ok(m)
        });
        Self {
            table: table.to_string(),
            messages: checked.boxed(),
            ipc: Default::default(),
            pending,
            cut,
        }
    }

    /// The next batch, `None` at the end of the stream, or why the stream
    /// cannot go on: a status from the transport or [`check_message`] keeps
    /// its code; anything the decoder refuses, or panics on, is
    /// `INVALID_ARGUMENT`.
    ///
    /// Once the daemon cuts open streams, the next call ends the stream
    /// with `UNAVAILABLE` instead (a batch not acknowledged by then is not
    /// written: no write is in progress while the next message is awaited).
    pub(crate) async fn next(&mut self) -> Option<Result<Put, Status>> {
        loop {
            let message = tokio::select! {
                biased;
                // A dropped sender never cuts (the pattern disables the branch).
                Ok(_) = self.cut.wait_for(|c| *c) => {
                    return Some(Err(Status::unavailable(format!(
                        "table `{}`: the daemon is stopping and cut this stream after its \
                         drain; batches not acknowledged were not written",
                        self.table
                    ))));
                }
                m = self.messages.next() => m?,
            };
            let data = match message {
                Ok(data) => data,
                Err(status) => {
                    return Some(Err(Status::new(
                        status.code(),
                        format!("table `{}`: {}", self.table, status.message()),
                    )))
                }
            };
            let ipc = &mut self.ipc;
            let decoded = match std::panic::catch_unwind(AssertUnwindSafe(|| ipc.decode(&data))) {
                Ok(Ok(decoded)) => decoded,
                Ok(Err(reason)) => {
                    return Some(Err(Status::invalid_argument(format!(
                        "table `{}`: undecodable Flight data: {reason}",
                        self.table
                    ))))
                }
                Err(panic) => {
                    metrics::counter!("memwal_server_decode_panics_total", "table" => self.table.clone())
                        .increment(1);
                    return Some(Err(Status::invalid_argument(format!(
                        "table `{}`: undecodable Flight data (the IPC decoder failed: {})",
                        self.table,
                        panic_message(&panic)
                    ))));
                }
            };
            if let Some(batch) = decoded {
                return Some(Ok(Put {
                    batch,
                    app_metadata: data.app_metadata,
                    _budget: std::mem::take(&mut *self.pending.lock()),
                }));
            }
        }
    }
}

/// The text of a caught panic.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_string())
}
