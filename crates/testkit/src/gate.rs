use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{watch, Notify};

/// A barrier that holds requests until the test opens it, and lets the test
/// wait until a given number of requests are being held.
#[derive(Debug, Clone)]
pub struct Gate {
    inner: Arc<GateInner>,
}

#[derive(Debug)]
struct GateInner {
    open: watch::Sender<bool>,
    arrived: AtomicUsize,
    arrival: Notify,
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(GateInner {
                open: watch::channel(false).0,
                arrived: AtomicUsize::new(0),
                arrival: Notify::new(),
            }),
        }
    }

    /// Lets every held and future request through.
    pub fn open(&self) {
        self.inner.open.send_replace(true);
    }

    /// How many requests have reached the gate so far.
    pub fn arrived(&self) -> usize {
        self.inner.arrived.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` requests have reached the gate.
    pub async fn wait_arrived(&self, n: usize) {
        loop {
            let notified = self.inner.arrival.notified();
            if self.arrived() >= n {
                return;
            }
            notified.await;
        }
    }

    /// Called by the store: records the arrival, then waits for `open`.
    pub async fn pass(&self) {
        let mut rx = self.inner.open.subscribe();
        self.inner.arrived.fetch_add(1, Ordering::SeqCst);
        self.inner.arrival.notify_waiters();
        // An error means the sender is gone, which cannot happen while self lives.
        let _ = rx.wait_for(|open| *open).await;
    }
}
