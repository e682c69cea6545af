//! The writer's lifecycle: its phase, the progress signal every waiter
//! watches, and the background tasks it owns.
//!
//! The phase only moves forward: `Opening -> Open -> Closing -> Stopped`
//! (any phase may jump to `Stopped`, which is final). The error that
//! stopped the writer lives with the state it guards
//! (`State::terminal`, first error wins); this module owns when work
//! must stop and who is woken.

use std::future::Future;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Result;

/// Where the writer is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Phase {
    /// `open` has not returned: flush retries are bounded (a replayed
    /// generation that cannot be written fails `open`).
    Opening,
    /// Serving puts: flush retries are unbounded (backpressure, not data
    /// loss, is what a long outage costs).
    Open,
    /// `close` has started: flush retries are bounded again.
    Closing,
    /// Terminal (closed, aborted, fenced or failed): every task stops at
    /// its next step.
    Stopped,
}

/// The phase, the progress signal and the owned background tasks.
pub(crate) struct Lifecycle {
    phase: watch::Sender<Phase>,
    /// Bumped after every publish, flush failure and terminal transition:
    /// what every waiter (put under backpressure, `flush`, replay) waits on.
    progress: watch::Sender<u64>,
    /// One close at a time; holds the outcome of the finished one.
    pub close_result: tokio::sync::Mutex<Option<Result<()>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Lifecycle {
    pub(crate) fn new() -> Self {
        Self {
            phase: watch::channel(Phase::Opening).0,
            progress: watch::channel(0).0,
            close_result: tokio::sync::Mutex::new(None),
            tasks: Mutex::new(Vec::new()),
        }
    }

    /// The current phase.
    pub(crate) fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    /// Moves to `to` unless the writer is already past it (the phase never
    /// moves back).
    pub(crate) fn advance(&self, to: Phase) {
        self.phase.send_if_modified(|p| {
            let moved = *p < to;
            if moved {
                *p = to;
            }
            moved
        });
    }

    /// Whether background work must stop.
    pub(crate) fn is_stopping(&self) -> bool {
        self.phase() == Phase::Stopped
    }

    /// Whether failed flushes are retried a bounded number of times
    /// (while opening or closing) rather than until they succeed.
    pub(crate) fn retries_bounded(&self) -> bool {
        matches!(self.phase(), Phase::Opening | Phase::Closing)
    }

    /// Resolves once the writer is stopping.
    pub(crate) async fn stopped(&self) {
        let mut rx = self.phase.subscribe();
        let _ = rx.wait_for(|p| *p == Phase::Stopped).await;
    }

    /// Wakes every waiter to look at the state again.
    pub(crate) fn bump(&self) {
        self.progress.send_modify(|v| *v += 1);
    }

    /// A receiver that sees every later [`Self::bump`].
    pub(crate) fn watch_progress(&self) -> watch::Receiver<u64> {
        self.progress.subscribe()
    }

    /// Spawns `work` as a task this writer owns (joined by `close`,
    /// aborted by `abort`). `work` should watch [`Self::stopped`].
    pub(crate) fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        self.tasks.lock().push(tokio::spawn(work));
    }

    /// Takes the owned tasks (for `close` to join).
    pub(crate) fn take_tasks(&self) -> Vec<JoinHandle<()>> {
        std::mem::take(&mut *self.tasks.lock())
    }

    /// Aborts every owned task without waiting.
    pub(crate) fn abort_tasks(&self) {
        for t in self.tasks.lock().iter() {
            t.abort();
        }
    }
}

/// The text of a caught panic's payload.
pub(crate) fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string payload".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_phase_only_moves_forward() {
        let l = Lifecycle::new();
        assert!(l.retries_bounded(), "opening");
        l.advance(Phase::Open);
        assert!(!l.retries_bounded());
        l.advance(Phase::Closing);
        assert!(l.retries_bounded());
        l.advance(Phase::Open);
        assert_eq!(l.phase(), Phase::Closing, "never back");
        l.advance(Phase::Stopped);
        assert!(l.is_stopping());
        l.advance(Phase::Opening);
        assert_eq!(l.phase(), Phase::Stopped, "final");
    }
}
