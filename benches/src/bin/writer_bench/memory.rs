//! Live heap bytes (a counting global allocator) and the process RSS.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

static LIVE: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting the bytes currently allocated.
pub struct Counting;

// SAFETY: forwards every call to `System` unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            LIVE.fetch_add(new_size, Ordering::Relaxed);
        }
        p
    }
}

/// Bytes currently allocated on the heap by the whole process.
pub fn live_heap() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Resident set size of this process in bytes (0 if unreadable).
pub fn rss() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Peak live heap and RSS growth (over the RSS at start) sampled every
/// 5 ms until stopped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(usize, usize)>,
}

impl Sampler {
    pub fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let rss0 = rss();
        let task = tokio::spawn(async move {
            let (mut heap, mut rss_peak) = (0, rss0);
            while !s.load(Ordering::Relaxed) {
                heap = heap.max(live_heap());
                rss_peak = rss_peak.max(rss());
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (heap, rss_peak - rss0)
        });
        Self { stop, task }
    }

    /// (peak live heap, peak RSS growth) in bytes.
    pub async fn finish(self) -> (usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or((0, 0))
    }
}
