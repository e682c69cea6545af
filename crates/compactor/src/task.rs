//! The compactor as a background task with a clear shutdown.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::Compactor;

/// A running compaction loop: one cycle every `every` (the first at once),
/// until [`CompactorTask::stop`]. Failed cycles are logged and counted;
/// the loop keeps going (a rerun continues where the failed one stopped).
#[derive(Debug)]
pub struct CompactorTask {
    stop: watch::Sender<bool>,
    handle: JoinHandle<()>,
}

impl CompactorTask {
    /// Starts the loop on the current tokio runtime.
    pub fn spawn(compactor: Compactor, every: Duration) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let span = tracing::info_span!("compactor_task", table = %compactor.location().uri);
        let handle = tokio::spawn(
            async move {
                loop {
                    tokio::select! {
                        biased;
                        _ = stopped.wait_for(|s| *s) => break,
                        r = compactor.run_once() => {
                            if let Err(e) = r {
                                tracing::warn!(error = %e, "compaction cycle failed");
                            }
                        }
                    }
                    tokio::select! {
                        biased;
                        _ = stopped.wait_for(|s| *s) => break,
                        _ = tokio::time::sleep(every) => {}
                    }
                }
            }
            .instrument(span),
        );
        Self { stop, handle }
    }

    /// Stops the loop and waits until it has ended. A cycle in progress is
    /// abandoned at its next await point; what it committed stays, what it
    /// did not is redone by the next run (every step is idempotent).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.handle.await;
    }
}
