//! Backpressure bounds the process's memory, measured by a counting global
//! allocator, independently of the writer's own accounting. Its own test
//! binary so no other test's allocations are counted.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::atomic::{AtomicIsize, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, RecordBatchIterator, StringArray};
use arrow_schema::{DataType, Field, Schema};
use lance::dataset::{Dataset, WriteParams};
use memwal::{RetryPolicy, ShardId, ShardWriter, ShardWriterConfig, StoreLocation};
use memwal_sstable::LanceStore;
use memwal_testkit::{Action, FaultStore, OpKind};
use object_store::path::Path;
use object_store::ObjectStore;

/// Live heap bytes of the whole process, and their high-water mark.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

#[allow(unsafe_code)] // a counting allocator for the memory bound
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live =
                LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed) + layout.size() as isize;
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MAX_UNFLUSHED: usize = 4 << 20;
/// What the process may hold beyond the unflushed bound: the batch each
/// producer is putting, WAL entry buffers, an SSTable being encoded, lance's
/// and tokio's own state. Stated, not tuned: 12 MiB.
/// What the process may hold beyond the unflushed bound: the batch each
/// producer is putting, WAL entry buffers, the SSTables being encoded
/// (`flush_concurrency` of them), and lance's session caches and runtime.
/// Measured at about 22-28 MiB here whatever the volume written; stated
/// with headroom: 32 MiB.
const MARGIN: isize = 32 << 20;
/// How much the peak may still rise while a further 48 MiB is written
/// (lance's caches keep a little metadata per SSTable).
const GROWTH: isize = 8 << 20;
const PRODUCERS: usize = 4;

fn schema() -> Arc<Schema> {
    let key = HashMap::from([(
        "lance-schema:unenforced-primary-key".to_string(),
        "true".to_string(),
    )]);
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false).with_metadata(key),
        Field::new("v", DataType::Utf8, true),
    ]))
}

fn rows(first: i64, n: usize) -> RecordBatch {
    let ids: Vec<i64> = (first..first + n as i64).collect();
    let payload = "p".repeat(1000);
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(ids)) as ArrayRef,
            Arc::new(StringArray::from(vec![payload; n])),
        ],
    )
    .unwrap()
}

// Breaks if puts are not held back while flushing lags (the writer would
// buffer all 48 MiB), or if memory the writer does not account for (WAL
// buffers, frozen memtables kept after publish, SSTable writes) grows with
// the data written: the counting allocator sees the whole process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_memory_stays_bounded_under_a_slow_store() {
    let dir = tempfile::tempdir().unwrap();
    let local = memwal_store::open_store(dir.path().to_str().unwrap()).unwrap();
    let fault = FaultStore::new(local.store.clone());
    let store: Arc<dyn ObjectStore> = fault.clone();
    let root = Path::from("tbl");
    let lance = LanceStore::new(store.clone());
    let empty = RecordBatchIterator::new(Vec::<Result<RecordBatch, _>>::new(), schema());
    Dataset::write(
        empty,
        lance.uri(&root).as_str(),
        Some(WriteParams {
            session: Some(lance.session().clone()),
            ..Default::default()
        }),
    )
    .await
    .unwrap();

    let config = ShardWriterConfig {
        memtable_max_bytes: 1 << 20,
        max_unflushed_bytes: MAX_UNFLUSHED,
        max_unflushed_age: None,
        retry: RetryPolicy::immediate(3),
        backpressure_timeout: Duration::from_secs(60),
        ..Default::default()
    };
    let location = StoreLocation {
        store,
        root,
        uri: "fault://tbl".into(),
    };
    let writer = Arc::new(
        ShardWriter::open(location, ShardId::random(), config)
            .await
            .unwrap(),
    );
    // A slow store for SSTables: every object of a generation directory
    // takes 5 ms, so flushing lags far behind the producers.
    let delayed = Arc::new(AtomicU64::new(0));
    let d = delayed.clone();
    fault.set_hook(move |op| {
        if matches!(op.kind, OpKind::Put | OpKind::Multipart) && op.path.contains("_gen_") {
            d.fetch_add(1, Ordering::Relaxed);
            Action::Delay(Duration::from_millis(5))
        } else {
            Action::Pass
        }
    });

    let baseline = LIVE.load(Ordering::SeqCst);
    PEAK.store(baseline, Ordering::SeqCst);
    let mut next_id = 0i64;
    // Warm-up: 24 MiB, then the peak so far; then 48 MiB more.
    put_concurrently(&writer, &mut next_id, 24 << 20).await;
    let warm_peak = PEAK.load(Ordering::SeqCst) - baseline;
    put_concurrently(&writer, &mut next_id, 48 << 20).await;
    let peak = PEAK.load(Ordering::SeqCst) - baseline;
    let stats = writer.stats();
    writer.close().await.unwrap();

    assert!(
        delayed.load(Ordering::Relaxed) > 0,
        "the slow store never slowed anything"
    );
    assert!(
        stats.backpressure_waits > 0,
        "producers never had to wait: the test exerted no pressure"
    );
    assert!(
        peak < MAX_UNFLUSHED as isize + MARGIN,
        "process heap grew by {peak} bytes while writing 72 MiB: bound {MAX_UNFLUSHED} + margin {MARGIN}"
    );
    assert!(
        peak - warm_peak < GROWTH,
        "peak rose from {warm_peak} to {peak} bytes over the last 48 MiB: memory grows with the data"
    );
}

/// `PRODUCERS` tasks put `total` bytes of 100-row, 1 KiB-row batches.
async fn put_concurrently(writer: &Arc<ShardWriter>, next_id: &mut i64, total: usize) {
    let puts_per_producer = total / PRODUCERS / (100 * 1000);
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let w = writer.clone();
            let start = *next_id + (p * puts_per_producer * 100) as i64;
            tokio::spawn(async move {
                for i in 0..puts_per_producer {
                    w.put(&rows(start + (i * 100) as i64, 100)).await.unwrap();
                }
            })
        })
        .collect();
    for p in producers {
        p.await.unwrap();
    }
    *next_id += (PRODUCERS * puts_per_producer * 100) as i64;
}
