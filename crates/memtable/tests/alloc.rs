//! Memory accounting checked against a counting global allocator.
//!
//! The allocator counts, per thread, bytes allocated minus bytes freed, so
//! each test measures only its own heap; `live_bytes_during` reports what a
//! closure leaves allocated. Tolerance: the reported total must be within
//! ±25% of the measured live heap.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use common::*;
use memwal_memtable::MemTable;

struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

fn add(delta: isize) {
    let _ = LIVE.try_with(|c| c.set(c.get() + delta));
}

#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add(-(layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size as isize - layout.size() as isize);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> isize {
    LIVE.with(Cell::get)
}

fn assert_within(reported: usize, measured: isize, what: &str) {
    let measured = measured as f64;
    let ratio = reported as f64 / measured;
    eprintln!("{what}: reported {reported}, measured {measured}, ratio {ratio:.3}");
    assert!(
        (0.75..=1.25).contains(&ratio),
        "{what}: reported {reported} bytes, allocator measured {measured} (ratio {ratio:.3})"
    );
}

fn payload_batch(
    schema: &arrow_schema::SchemaRef,
    start: i64,
    rows: usize,
    width: usize,
) -> RecordBatch {
    let ids: Vec<i64> = (start..start + rows as i64).collect();
    let names: Vec<String> = ids.iter().map(|i| format!("{i:0width$}")).collect();
    RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from(ids.clone())) as ArrayRef,
            Arc::new(StringArray::from(names)),
            Arc::new(Int64Array::from(ids)),
        ],
    )
    .unwrap()
}

/// Building 50 batches of 1,000 rows (~200 B each) and inserting them: the
/// memtable's total equals the live heap within ±25%. Breaks if retained
/// buffers are undercounted (e.g. only slice windows), double counted, or
/// the index overhead is ignored.
#[test]
fn total_matches_allocator_for_keyed_inserts() {
    let schema = int_table();
    let ts = table(schema.clone());
    let before = live();
    let mut mt = MemTable::new(ts);
    for b in 0..50 {
        // Half the keys repeat the previous batch's keys (overwrites).
        let batch = payload_batch(&schema, b * 500, 1000, 200);
        mt.insert(&batch).unwrap();
    }
    let measured = live() - before;
    let usage = mt.memory_usage();
    assert!(usage.index_bytes > 0);
    assert!(usage.payload_bytes <= usage.retained_bytes);
    assert_within(usage.total(), measured, "keyed inserts");
}

/// A 10-row slice of a 200,000-row batch keeps the whole parent alive:
/// after the parent is dropped the allocator still sees it, and the
/// memtable reports at least the parent's buffers; a second slice of the
/// same parent adds nothing. Breaks if retained memory is measured by
/// slice window (it would report a few hundred bytes) or slices of one
/// parent are charged twice.
#[test]
fn slices_charge_their_parent_buffers_once() {
    let schema = int_table();
    let ts = table(schema.clone());
    let before = live();
    let mut mt = MemTable::new(ts);
    let parent = payload_batch(&schema, 0, 200_000, 16);
    let parent_bytes = parent.get_array_memory_size();
    mt.insert(&parent.slice(1000, 10)).unwrap();
    let first = mt.memory_usage();
    mt.insert(&parent.slice(5000, 10)).unwrap();
    drop(parent);
    let measured = live() - before;
    let usage = mt.memory_usage();
    assert!(usage.payload_bytes < 2_000, "payload is the windows only");
    assert!(
        usage.retained_bytes >= parent_bytes * 9 / 10,
        "retained {} < parent {}",
        usage.retained_bytes,
        parent_bytes
    );
    // Only the second `_tombstone` bitmap is new.
    assert!(usage.retained_bytes - first.retained_bytes < 256);
    assert_within(usage.total(), measured, "sliced inserts");
}

/// Batches decoded from one Arrow IPC message (as WAL replay produces them)
/// keep all their columns in one allocation: it is charged once at its
/// capacity. Breaks if buffers are deduplicated by slice address instead of
/// allocation address (every column would charge the whole message again).
#[test]
fn ipc_decoded_batches_charge_the_message_once() {
    let schema = int_table();
    let ts = table(schema.clone());
    let stored = ts
        .to_storage(&payload_batch(&schema, 0, 20_000, 64))
        .unwrap();
    let mut ipc = Vec::new();
    {
        let mut w = arrow_ipc::writer::StreamWriter::try_new(&mut ipc, &stored.schema()).unwrap();
        w.write(&stored).unwrap();
        w.finish().unwrap();
    }
    drop(stored);
    let before = live();
    let mut mt = MemTable::new(ts);
    {
        let decoded: Vec<RecordBatch> = arrow_ipc::reader::StreamReader::try_new(&ipc[..], None)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        mt.insert(&decoded[0]).unwrap();
    }
    let measured = live() - before;
    let usage = mt.memory_usage();
    assert!(usage.retained_bytes < ipc.len() * 2);
    assert_within(usage.total(), measured, "IPC-decoded insert");
}
