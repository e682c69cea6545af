//! MemTable insert throughput next to the floor of just concatenating the
//! same Arrow batches, and the memtable's memory per payload byte.
//!
//! Run by hand: `cargo run --release -p memwal-benches --bin memtable_bench`.
//! Not part of CI. Rows are ~1 KiB: a key (int64, or a 32-byte string), an
//! int64 and a 1000-byte binary payload; batches of `BATCH_ROWS` rows. Each
//! case runs `REPEATS` times on fresh memtables and reports the best run.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use memwal_memtable::{MemTable, TableSchema, PRIMARY_KEY_KEY};

const TOTAL_ROWS: usize = 100_000;
const BATCH_ROWS: usize = 1_000;
const PAYLOAD: usize = 1000;
const REPEATS: usize = 3;

#[derive(Clone, Copy)]
enum KeyKind {
    Int64,
    Str32,
}

fn schema(kind: KeyKind) -> SchemaRef {
    let key_type = match kind {
        KeyKind::Int64 => DataType::Int64,
        KeyKind::Str32 => DataType::Utf8,
    };
    let key = Field::new("id", key_type, false).with_metadata(
        [(PRIMARY_KEY_KEY.to_string(), "true".to_string())]
            .into_iter()
            .collect(),
    );
    Arc::new(Schema::new(vec![
        key,
        Field::new("ts", DataType::Int64, false),
        Field::new("payload", DataType::Binary, true),
    ]))
}

/// `TOTAL_ROWS` rows in batches; keys are unique except that `dup_every`-th
/// rows rewrite an earlier key (0 = all unique).
fn batches(kind: KeyKind, dup_every: usize) -> Vec<RecordBatch> {
    let schema = schema(kind);
    let payload = vec![0xabu8; PAYLOAD];
    (0..TOTAL_ROWS / BATCH_ROWS)
        .map(|b| {
            let ids: Vec<i64> = (0..BATCH_ROWS)
                .map(|i| {
                    let n = (b * BATCH_ROWS + i) as i64;
                    if dup_every > 0 && (n as usize).is_multiple_of(dup_every) {
                        n / 2
                    } else {
                        n
                    }
                })
                .collect();
            let key: ArrayRef = match kind {
                KeyKind::Int64 => Arc::new(Int64Array::from(ids.clone())),
                KeyKind::Str32 => Arc::new(StringArray::from(
                    ids.iter()
                        .map(|i| format!("user-{i:027}"))
                        .collect::<Vec<_>>(),
                )),
            };
            let payloads = BinaryArray::from_iter_values(ids.iter().map(|_| payload.as_slice()));
            RecordBatch::try_new(
                schema.clone(),
                vec![key, Arc::new(Int64Array::from(ids)), Arc::new(payloads)],
            )
            .unwrap()
        })
        .collect()
}

fn best<F: FnMut() -> f64>(mut f: F) -> f64 {
    (0..REPEATS).map(|_| f()).fold(f64::INFINITY, f64::min)
}

fn case(label: &str, kind: KeyKind, dup_every: usize) {
    let input = batches(kind, dup_every);
    let ts = Arc::new(TableSchema::new(schema(kind)).unwrap());
    let payload: usize = input.iter().map(memwal_memtable::batch_payload_bytes).sum();
    let mb = payload as f64 / 1e6;

    let concat = best(|| {
        let t = Instant::now();
        let out = arrow_select::concat::concat_batches(&input[0].schema(), &input).unwrap();
        let secs = t.elapsed().as_secs_f64();
        black_box(out);
        secs
    });
    let mut last = None;
    let insert = best(|| {
        let mut mt = MemTable::new(ts.clone());
        let t = Instant::now();
        for b in &input {
            mt.insert(b).unwrap();
        }
        let secs = t.elapsed().as_secs_f64();
        last = Some(mt);
        secs
    });
    let mt = last.unwrap();
    let usage = mt.memory_usage();
    let rows = TOTAL_ROWS as f64;
    println!(
        "{label:<28} insert {:>6.2} M rows/s {:>7.0} MB/s | concat floor {:>6.2} M rows/s {:>7.0} MB/s | insert/concat time {:>5.2}x",
        rows / insert / 1e6,
        mb / insert,
        rows / concat / 1e6,
        mb / concat,
        insert / concat,
    );
    println!(
        "{:<28} memory: payload {:.1} MB, retained {:.1} MB, index {:.2} MB, total/payload {:.3} ({} keys, {} rows)",
        "",
        usage.payload_bytes as f64 / 1e6,
        usage.retained_bytes as f64 / 1e6,
        usage.index_bytes as f64 / 1e6,
        usage.total() as f64 / usage.payload_bytes as f64,
        mt.num_keys().ok().flatten().unwrap_or(0),
        mt.num_rows(),
    );
}

fn main() {
    println!(
        "memtable_bench: {TOTAL_ROWS} rows of ~{} B in batches of {BATCH_ROWS}, best of {REPEATS}",
        PAYLOAD + 16 + 4
    );
    case("int64 key, unique", KeyKind::Int64, 0);
    case("int64 key, 25% rewrites", KeyKind::Int64, 4);
    case("32-byte utf8 key, unique", KeyKind::Str32, 0);
    case("32-byte utf8 key, 25% rewr.", KeyKind::Str32, 4);
}
