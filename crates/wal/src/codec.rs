//! WAL entry bytes: one Arrow IPC stream per entry (docs/memwal-format.md "WAL").
//!
//! The stream's schema metadata carries `writer_epoch` (decimal),
//! `generation` (decimal; absent in upstream's WAL-only mode) and, for a
//! fence sentinel, `fence_sentinel = "true"`; the producer stamps of its
//! appends, when any is stamped, are on the schema's last field
//! (`memwal:producers`, [`crate::stamp`]). A sentinel is an empty-schema
//! stream with no batches. Decoding is strict about the stream itself (it
//! must decode completely and end with the end-of-stream marker) and
//! lenient about metadata it does not know.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::reader::StreamDecoder;
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{Schema, SchemaRef};
use bytes::Bytes;
use memwal_store::AlignedWriter;

use crate::stamp::{self, ProducerStamp};
use crate::{WalError, WalResult};

/// Schema metadata key holding the writer's epoch (decimal string).
pub const WRITER_EPOCH_KEY: &str = "writer_epoch";
/// Schema metadata key holding the memtable generation (decimal string).
pub const GENERATION_KEY: &str = "generation";
/// Schema metadata key marking a data-less fence sentinel (`"true"`).
pub const FENCE_SENTINEL_KEY: &str = "fence_sentinel";
/// Prefix of entry-level keys upstream may add (memtable targets); they
/// describe the entry, not the rows, and are removed from decoded schemas.
const UPSTREAM_ENTRY_KEY_PREFIX: &str = "mem_wal_";

/// One decoded WAL entry.
#[derive(Debug, Clone, PartialEq)]
pub struct WalEntry {
    /// The epoch of the writer that wrote it.
    pub epoch: u64,
    /// The memtable generation of its rows; `None` for upstream WAL-only
    /// entries and for sentinels.
    pub generation: Option<u64>,
    /// True for a data-less fence sentinel.
    pub is_sentinel: bool,
    /// The rows' schema, without the entry-level metadata keys.
    pub schema: SchemaRef,
    /// The rows in append order, each batch carrying `schema`. An appended
    /// batch larger than [`MESSAGE_BODY_BYTES`] reads back as consecutive
    /// slices ([`message_count`]).
    pub batches: Vec<RecordBatch>,
    /// The producer stamps of the entry's appends (empty when none was
    /// stamped, and for every upstream entry).
    pub producers: Vec<ProducerStamp>,
}

impl WalEntry {
    /// Total rows over all batches.
    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

fn is_entry_key(key: &str) -> bool {
    key == WRITER_EPOCH_KEY
        || key == GENERATION_KEY
        || key == FENCE_SENTINEL_KEY
        || key.starts_with(UPSTREAM_ENTRY_KEY_PREFIX)
}

/// Encodes a data entry: `batches` (which must share one non-empty schema)
/// as one IPC stream whose schema metadata is the batches' metadata minus
/// any entry-level keys, plus `writer_epoch` and `generation`.
///
/// Errors are [`WalError::InvalidInput`]: nothing about the store is involved.
pub fn encode_entry(
    epoch: u64,
    generation: Option<u64>,
    batches: &[RecordBatch],
) -> WalResult<Bytes> {
    encode_stamped_entry(epoch, generation, batches, &[])
}

/// [`encode_entry`] with the producer stamps of the entry's appends
/// (recorded under `memwal:producers` on the last field when not empty).
pub fn encode_stamped_entry(
    epoch: u64,
    generation: Option<u64>,
    batches: &[RecordBatch],
    producers: &[ProducerStamp],
) -> WalResult<Bytes> {
    let first = batches
        .first()
        .ok_or_else(|| WalError::invalid("a WAL entry needs at least one batch"))?;
    let schema = first.schema();
    if schema.fields().is_empty() {
        return Err(WalError::invalid(
            "batches without columns cannot be appended (they would read as a fence sentinel)",
        ));
    }
    if let Some(other) = batches
        .iter()
        .find(|b| b.schema().fields() != schema.fields())
    {
        return Err(WalError::invalid(format!(
            "batches in one entry must share a schema: {:?} vs {:?}",
            schema.fields(),
            other.schema().fields()
        )));
    }
    let mut metadata: HashMap<String, String> = schema
        .metadata()
        .iter()
        .filter(|(k, _)| !is_entry_key(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.insert(WRITER_EPOCH_KEY.into(), epoch.to_string());
    if let Some(g) = generation {
        metadata.insert(GENERATION_KEY.into(), g.to_string());
    }
    let fields = match stamp::encode(producers) {
        None => schema.fields().clone(),
        Some(p) => stamp::on_last_field(schema.fields(), p),
    };
    let entry_schema = Schema::new_with_metadata(fields, metadata);
    let estimate: usize = batches.iter().map(|b| b.get_array_memory_size()).sum();
    write_stream(&entry_schema, batches, estimate + 1024)
}

/// Encodes a fence sentinel in upstream's shape: an empty-schema IPC stream
/// with no batches and metadata `writer_epoch` and `fence_sentinel = "true"`.
/// Equal epochs give equal bytes (arrow writes metadata keys sorted).
pub fn encode_sentinel(epoch: u64) -> Bytes {
    let metadata = HashMap::from([
        (WRITER_EPOCH_KEY.to_string(), epoch.to_string()),
        (FENCE_SENTINEL_KEY.to_string(), "true".to_string()),
    ]);
    let schema = Schema::new_with_metadata(Vec::<arrow_schema::Field>::new(), metadata);
    write_stream(&schema, &[], 256).expect("an empty stream always encodes")
}

/// Largest body one IPC message of an entry carries, roughly: a larger
/// batch is written as consecutive slices of at most this many bytes.
///
/// arrow-ipc gathers each message's body into a fresh `Vec` before it is
/// written out; a body of many MiB is a fresh allocation of that size per
/// entry, which the allocator maps anew each time (a page fault per 4 KiB:
/// about a third of a 7 MiB put's time, measured). Bodies of this size are
/// reused from the allocator's free lists and stay in cache for the copy
/// into the aligned buffer. Readers see the same rows in the same order
/// (an entry is a stream of batches either way).
pub const MESSAGE_BODY_BYTES: usize = 1 << 20;

/// Rows per IPC message for `batch`: all of them when its body is at most
/// [`MESSAGE_BODY_BYTES`] (slice-aware: a small slice of a large batch is
/// one message), else about that many bytes' worth, at least one.
fn rows_per_message(batch: &RecordBatch) -> usize {
    let bytes: usize = batch
        .columns()
        .iter()
        .map(|c| {
            let data = c.to_data();
            data.get_slice_memory_size()
                .unwrap_or_else(|_| data.get_array_memory_size())
        })
        .sum();
    let rows = batch.num_rows();
    if bytes <= MESSAGE_BODY_BYTES {
        rows.max(1)
    } else {
        (rows as u128 * MESSAGE_BODY_BYTES as u128 / bytes as u128).max(1) as usize
    }
}

/// How many record batches `batch` reads back as from an entry: the IPC
/// messages [`encode_entry`] writes it as (one unless it is larger than
/// [`MESSAGE_BODY_BYTES`]).
pub fn message_count(batch: &RecordBatch) -> usize {
    batch.num_rows().div_ceil(rows_per_message(batch)).max(1)
}

/// `batch` as the consecutive slices [`message_count`] counts.
fn message_slices(batch: &RecordBatch) -> impl Iterator<Item = RecordBatch> + '_ {
    let rows = batch.num_rows();
    let per = rows_per_message(batch);
    (0..message_count(batch)).map(move |i| {
        let start = (i * per).min(rows);
        batch.slice(start, per.min(rows - start))
    })
}

fn write_stream(schema: &Schema, batches: &[RecordBatch], capacity: usize) -> WalResult<Bytes> {
    let encode = || -> Result<Bytes, arrow_schema::ArrowError> {
        // Encoded straight into a pooled aligned buffer: the local store
        // writes it through O_DIRECT without another copy.
        let mut writer = StreamWriter::try_new(AlignedWriter::with_capacity(capacity), schema)?;
        for batch in batches {
            for slice in message_slices(batch) {
                writer.write(&slice)?;
            }
        }
        writer.finish()?;
        writer.into_inner().map(AlignedWriter::into_bytes)
    };
    // arrow-ipc's stream writer panics instead of erroring on a few
    // malformed arrays; such input must fail its append, not the appender.
    match catch_unwind(AssertUnwindSafe(encode)) {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => Err(WalError::invalid(format!(
            "batches do not encode as Arrow IPC: {e}"
        ))),
        Err(_) => Err(WalError::invalid(
            "batches do not encode as Arrow IPC (encoder panicked)",
        )),
    }
}

/// The `writer_epoch` of an entry from a prefix of its bytes (the stream's
/// schema message comes first). `None` when the prefix does not hold a
/// complete schema message or it carries no decimal epoch; the caller then
/// reads the whole entry.
pub fn peek_epoch(prefix: &Bytes) -> Option<u64> {
    let peek = || {
        let mut decoder = StreamDecoder::new();
        let mut buf = Buffer::from(prefix.clone());
        while decoder.schema().is_none() && !buf.is_empty() {
            decoder.decode(&mut buf).ok()?;
        }
        decoder
            .schema()?
            .metadata()
            .get(WRITER_EPOCH_KEY)?
            .parse::<u64>()
            .ok()
    };
    catch_unwind(AssertUnwindSafe(peek)).ok().flatten()
}

/// Decodes an entry's bytes; `Err(reason)` when they are not a complete,
/// valid entry. See [`crate::WalLocation::read_entry`] for the typed error.
///
/// Accepts: entries with or without `generation`; sentinels marked by
/// `fence_sentinel = "true"` or shaped as an empty schema with no batches;
/// unknown metadata keys (kept in the decoded schema unless they are
/// upstream's entry-level `mem_wal_*` keys). Rejects: anything that is not
/// one complete IPC stream ending in the end-of-stream marker (truncation,
/// trailing or garbled bytes), a missing or non-decimal `writer_epoch`, a
/// non-decimal `generation`, and a sentinel that carries rows. Never panics:
/// arrow's IPC reader panics on some malformed inputs, which are reported
/// as undecodable here.
pub fn decode_entry(bytes: &Bytes) -> Result<WalEntry, String> {
    match catch_unwind(AssertUnwindSafe(|| decode_unguarded(bytes))) {
        Ok(result) => result,
        Err(_) => Err("malformed Arrow IPC stream (the decoder panicked)".into()),
    }
}

fn decode_unguarded(bytes: &Bytes) -> Result<WalEntry, String> {
    let mut decoder = StreamDecoder::new();
    let mut buf = Buffer::from(bytes.clone());
    let mut raw_batches = Vec::new();
    while !buf.is_empty() {
        match decoder.decode(&mut buf) {
            Ok(Some(batch)) => raw_batches.push(batch),
            Ok(None) => {}
            Err(e) => return Err(format!("not an Arrow IPC stream: {e}")),
        }
    }
    decoder
        .finish()
        .map_err(|e| format!("truncated Arrow IPC stream: {e}"))?;
    // `finish` also accepts a stream cut at a message boundary. Only a
    // decoder that saw the end-of-stream marker refuses more input.
    if decoder.decode(&mut Buffer::from(vec![0u8])).is_ok() {
        return Err("truncated Arrow IPC stream: no end-of-stream marker".into());
    }
    let raw_schema = decoder
        .schema()
        .ok_or_else(|| "Arrow IPC stream without a schema".to_string())?;
    let meta = raw_schema.metadata();
    let epoch = match meta.get(WRITER_EPOCH_KEY) {
        None => return Err(format!("schema metadata lacks `{WRITER_EPOCH_KEY}`")),
        Some(v) => v
            .parse::<u64>()
            .map_err(|_| format!("`{WRITER_EPOCH_KEY}` is not a decimal u64: {v:?}"))?,
    };
    let generation = match meta.get(GENERATION_KEY) {
        None => None,
        Some(v) => Some(
            v.parse::<u64>()
                .map_err(|_| format!("`{GENERATION_KEY}` is not a decimal u64: {v:?}"))?,
        ),
    };
    let (fields, producers) = stamp::take_from_fields(raw_schema.fields())?;
    let marked = meta.get(FENCE_SENTINEL_KEY).is_some_and(|v| v == "true");
    let empty_shape = raw_schema.fields().is_empty() && raw_batches.is_empty();
    if marked && !raw_batches.is_empty() {
        return Err("fence sentinel carries record batches".into());
    }
    let clean: HashMap<String, String> = meta
        .iter()
        .filter(|(k, _)| !is_entry_key(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let schema = Arc::new(Schema::new_with_metadata(fields, clean));
    let batches = raw_batches
        .into_iter()
        .map(|b| {
            RecordBatch::try_new_with_options(
                schema.clone(),
                b.columns().to_vec(),
                &arrow_array::RecordBatchOptions::new().with_row_count(Some(b.num_rows())),
            )
            .map_err(|e| format!("batch does not match the stream schema: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(WalEntry {
        epoch,
        generation,
        is_sentinel: marked || empty_shape,
        schema,
        batches,
        producers,
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn peek_epoch_reads_the_schema_message_only() {
        let sentinel = encode_sentinel(7);
        assert_eq!(peek_epoch(&sentinel), Some(7));
        let schema = std::sync::Arc::new(Schema::new(vec![arrow_schema::Field::new(
            "v",
            arrow_schema::DataType::Int64,
            false,
        )]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![std::sync::Arc::new(arrow_array::Int64Array::from(vec![
                1i64;
                4096
            ]))],
        )
        .unwrap();
        let bytes = encode_entry(42, Some(3), &[batch]).unwrap();
        // The first kilobyte holds the schema message, not the batch.
        assert!(bytes.len() > 4096);
        assert_eq!(peek_epoch(&bytes.slice(..1024)), Some(42));
        // Too short for the schema message, or garbage: unknown, not a guess.
        assert_eq!(peek_epoch(&bytes.slice(..8)), None);
        assert_eq!(peek_epoch(&Bytes::from_static(b"not an ipc stream")), None);
    }

    use super::*;
    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field};

    fn batch(ids: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new_with_metadata(
            vec![
                Field::new("id", DataType::Int64, false),
                Field::new("name", DataType::Utf8, true),
            ],
            HashMap::from([("user_key".to_string(), "kept".to_string())]),
        ));
        let names: Vec<String> = ids.iter().map(|i| format!("row-{i}")).collect();
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(StringArray::from(names)),
            ],
        )
        .unwrap()
    }

    fn stream_with(schema: Schema, batches: &[RecordBatch]) -> Bytes {
        let mut w = StreamWriter::try_new(Vec::new(), &schema).unwrap();
        for b in batches {
            w.write(b).unwrap();
        }
        w.finish().unwrap();
        Bytes::from(w.into_inner().unwrap())
    }

    // Breaks if epoch/generation are not written as metadata, if decoded
    // batches keep the entry-level keys (schemas would not round-trip), or
    // if user metadata is dropped.
    #[test]
    fn data_entries_round_trip() {
        let batches = vec![batch(&[1, 2]), batch(&[3])];
        let bytes = encode_entry(7, Some(3), &batches).unwrap();
        let e = decode_entry(&bytes).unwrap();
        assert_eq!((e.epoch, e.generation, e.is_sentinel), (7, Some(3), false));
        assert_eq!(e.batches, batches);
        assert_eq!(e.schema, batches[0].schema());
        assert_eq!(e.num_rows(), 3);
    }

    // Breaks if a large batch is written as one message (one body-sized
    // allocation per entry) or its slices lose, repeat or reorder rows, or
    // if a small slice of a large batch is split by its parent's size.
    #[test]
    fn large_batches_are_written_as_message_sized_slices() {
        let ids: Vec<i64> = (0..200_000).collect();
        let big = batch(&ids);
        let body: usize = big
            .columns()
            .iter()
            .map(|c| c.to_data().get_slice_memory_size().unwrap())
            .sum();
        assert!(body > 2 * MESSAGE_BODY_BYTES, "{body}");
        let small = big.slice(100, 10);
        let entry = decode_entry(&encode_entry(1, Some(1), &[big.clone(), small.clone()]).unwrap())
            .unwrap();
        let want = message_count(&big);
        assert!(want >= 2, "a {body}-byte batch is one message");
        assert_eq!(message_count(&small), 1);
        assert_eq!(entry.batches.len(), want + 1);
        let read =
            arrow_select::concat::concat_batches(&big.schema(), &entry.batches[..want]).unwrap();
        assert_eq!(read, big);
        assert_eq!(entry.batches[want], small);
    }

    // Breaks if stamps are not written, not read back, or leak into the
    // rows' schema (replayed batches would differ from the put ones), or if
    // a malformed stamp list decodes as "no stamps".
    #[test]
    fn producer_stamps_round_trip_outside_the_rows_schema() {
        let batches = vec![batch(&[1, 2]), batch(&[3])];
        let stamps = vec![
            ProducerStamp {
                producer: "p1".into(),
                epoch: 1,
                sequence: 9,
                at_ms: 5,
            },
            ProducerStamp {
                producer: "p2".into(),
                epoch: 3,
                sequence: 1,
                at_ms: 6,
            },
        ];
        let bytes = encode_stamped_entry(7, Some(3), &batches, &stamps).unwrap();
        let e = decode_entry(&bytes).unwrap();
        assert_eq!(e.producers, stamps);
        assert_eq!(e.batches, batches);
        assert_eq!(
            e.schema,
            batches[0].schema(),
            "no stamp left in the rows' schema"
        );
        let plain = decode_entry(&encode_entry(7, Some(3), &batches).unwrap()).unwrap();
        assert!(plain.producers.is_empty());
        let mut meta = batches[0].schema().metadata().clone();
        meta.insert(WRITER_EPOCH_KEY.into(), "1".into());
        let fields =
            stamp::on_last_field(batches[0].schema().fields(), "[{\"producer\":1}]".into());
        let s = Schema::new_with_metadata(fields, meta);
        let err = decode_entry(&stream_with(s, &batches)).unwrap_err();
        assert!(err.contains(stamp::PRODUCERS_KEY), "{err}");
    }

    // Breaks if entries stop being encoded into a pooled aligned buffer:
    // the local store would copy every entry once more (into fresh memory)
    // before its O_DIRECT write.
    #[test]
    fn entries_are_encoded_on_a_block_boundary() {
        let ids: Vec<i64> = (0..50_000).collect();
        let batches = vec![batch(&ids), batch(&[1])];
        let bytes = encode_entry(2, Some(1), &batches).unwrap();
        assert_eq!(bytes.as_ptr() as usize % 4096, 0);
        assert_eq!(decode_entry(&bytes).unwrap().batches, batches);
    }

    // Breaks if the sentinel is not upstream's shape or does not read back
    // as a sentinel.
    #[test]
    fn sentinels_round_trip_deterministically() {
        let s = encode_sentinel(4);
        assert_eq!(s, encode_sentinel(4));
        assert_ne!(s, encode_sentinel(5));
        let e = decode_entry(&s).unwrap();
        assert!(e.is_sentinel);
        assert_eq!((e.epoch, e.generation), (4, None));
        assert!(e.batches.is_empty() && e.schema.fields().is_empty());
    }

    // Breaks if decoding insists on `generation`, on `fence_sentinel`, or
    // chokes on keys it does not know.
    #[test]
    fn upstream_shapes_decode() {
        // Upstream's sentinel, built by hand: empty schema, no batches.
        let meta = HashMap::from([
            ("writer_epoch".to_string(), "9".to_string()),
            ("fence_sentinel".to_string(), "true".to_string()),
        ]);
        let s = stream_with(Schema::new_with_metadata(Vec::<Field>::new(), meta), &[]);
        let e = decode_entry(&s).unwrap();
        assert!(e.is_sentinel && e.epoch == 9 && e.generation.is_none());

        // An unmarked empty stream is a sentinel too.
        let meta = HashMap::from([("writer_epoch".to_string(), "2".to_string())]);
        let s = stream_with(Schema::new_with_metadata(Vec::<Field>::new(), meta), &[]);
        assert!(decode_entry(&s).unwrap().is_sentinel);

        // WAL-only data entry: no generation, plus unknown keys.
        let b = batch(&[10, 11]);
        let mut meta = b.schema().metadata().clone();
        meta.insert("writer_epoch".into(), "3".into());
        meta.insert("mem_wal_target_generation".into(), "5".into());
        meta.insert("some_future_key".into(), "x".into());
        let schema = Schema::new_with_metadata(b.schema().fields().clone(), meta);
        let e = decode_entry(&stream_with(schema, std::slice::from_ref(&b))).unwrap();
        assert_eq!((e.epoch, e.generation, e.is_sentinel), (3, None, false));
        assert_eq!(e.schema.metadata().get("some_future_key").unwrap(), "x");
        assert!(!e
            .schema
            .metadata()
            .contains_key("mem_wal_target_generation"));
        assert_eq!(e.batches[0].column(0), b.column(0));
    }

    // Breaks if any truncation (including one at a message boundary, which
    // arrow's own reader accepts as a shorter stream) or trailing garbage
    // decodes as a valid entry: rows would be silently lost.
    #[test]
    fn truncated_or_extended_streams_are_rejected() {
        let bytes = encode_entry(1, Some(1), &[batch(&[1]), batch(&[2]), batch(&[3])]).unwrap();
        for cut in 0..bytes.len() {
            let r = decode_entry(&bytes.slice(..cut));
            assert!(r.is_err(), "a stream cut at {cut}/{} decoded", bytes.len());
        }
        let mut longer = bytes.to_vec();
        longer.extend_from_slice(b"tail");
        assert!(decode_entry(&Bytes::from(longer)).is_err());
    }

    // Breaks if garbage is read as an entry, or if epoch/generation
    // problems are silently defaulted (upstream's old reader used 0).
    #[test]
    fn bad_bytes_and_bad_metadata_are_rejected() {
        assert!(decode_entry(&Bytes::from_static(
            b"\xff\xff\xff\xff\x10\x00\x00\x00garbage!"
        ))
        .is_err());
        assert!(decode_entry(&Bytes::new()).is_err());
        let b = batch(&[1]);
        for (k, v) in [
            ("writer_epoch", "x1"),
            ("writer_epoch", "-1"),
            ("generation", "two"),
        ] {
            let mut meta = HashMap::from([("writer_epoch".to_string(), "1".to_string())]);
            meta.insert(k.into(), v.into());
            let s = Schema::new_with_metadata(b.schema().fields().clone(), meta);
            let err = decode_entry(&stream_with(s, std::slice::from_ref(&b))).unwrap_err();
            assert!(err.contains(k), "{err}");
        }
        let s = Schema::new(b.schema().fields().clone());
        assert!(decode_entry(&stream_with(s, std::slice::from_ref(&b)))
            .unwrap_err()
            .contains("writer_epoch"));
        // A sentinel marker on an entry with rows.
        let meta = HashMap::from([
            ("writer_epoch".to_string(), "1".to_string()),
            ("fence_sentinel".to_string(), "true".to_string()),
        ]);
        let s = Schema::new_with_metadata(b.schema().fields().clone(), meta);
        assert!(decode_entry(&stream_with(s, std::slice::from_ref(&b))).is_err());
    }

    // Breaks if unusable input reaches the store instead of failing fast.
    #[test]
    fn invalid_appends_are_refused() {
        assert!(matches!(
            encode_entry(1, Some(1), &[]),
            Err(WalError::InvalidInput { .. })
        ));
        let other = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)])),
            vec![Arc::new(Int64Array::from(vec![1]))],
        )
        .unwrap();
        assert!(matches!(
            encode_entry(1, Some(1), &[batch(&[1]), other]),
            Err(WalError::InvalidInput { .. })
        ));
        let empty = RecordBatch::new_empty(Arc::new(Schema::empty()));
        assert!(matches!(
            encode_entry(1, Some(1), &[empty]),
            Err(WalError::InvalidInput { .. })
        ));
    }

    // Breaks if a garbled object can panic the decoder (replay, the
    // appender's collision check and the sentinel writer all decode what
    // they find in the store): arrow's IPC reader panics on some mutations.
    // The panic hook is left alone (it is global to the test process):
    // messages of the panics decode_entry catches go to this test's
    // captured output; a panic escaping decode_entry is counted here.
    #[test]
    fn mutated_entries_never_panic() {
        use rand::{Rng, SeedableRng};
        let good = encode_entry(3, Some(2), &[batch(&[1, 2, 3]), batch(&[4])]).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut escaped = 0;
        for _ in 0..3000 {
            let mut b = good.to_vec();
            for _ in 0..rng.random_range(1..4) {
                let i = rng.random_range(0..b.len());
                b[i] = rng.random();
            }
            let bytes = Bytes::from(b);
            if std::panic::catch_unwind(|| decode_entry(&bytes)).is_err() {
                escaped += 1;
            }
        }
        assert_eq!(
            escaped, 0,
            "decode_entry panicked on {escaped} mutated entries"
        );
    }
}
