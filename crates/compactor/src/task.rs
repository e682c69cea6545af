//! The compactor (and garbage collection) as a background task with a
//! clear shutdown.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::{collect_garbage, Compactor, GcConfig};

/// Whether this process should run a compaction cycle now
/// ([`CompactorTask::spawn_gated`]).
pub type Gate = Arc<dyn Fn() -> bool + Send + Sync>;

/// A running compaction loop: one cycle every `every` (the first at once),
/// each a compaction of every shard followed, when configured, by garbage
/// collection, until [`CompactorTask::stop`]. Failed cycles are logged and
/// counted; the loop keeps going (a rerun continues where the failed one
/// stopped).
#[derive(Debug)]
pub struct CompactorTask {
    stop: watch::Sender<bool>,
    cycles: watch::Receiver<u64>,
    handle: JoinHandle<()>,
}

impl CompactorTask {
    /// Starts the loop (compaction only) on the current tokio runtime.
    pub fn spawn(compactor: Compactor, every: Duration) -> Self {
        Self::spawn_with_gc(compactor, every, None)
    }

    /// Starts the loop on the current tokio runtime; with `gc`, every cycle
    /// ends with [`collect_garbage`] under that configuration.
    pub fn spawn_with_gc(compactor: Compactor, every: Duration, gc: Option<GcConfig>) -> Self {
        Self::spawn_gated(compactor, every, gc, None)
    }

    /// [`Self::spawn_with_gc`], where each cycle runs only while `gate`
    /// (when given) answers true when the cycle is due; a cycle it refuses
    /// is skipped until the next one is due. For a cluster, where one
    /// member compacts each table: a moment when two members both run is
    /// safe (concurrent compactors apply each generation once,
    /// `docs/design/compaction-commits.md`), only wasteful.
    pub fn spawn_gated(
        compactor: Compactor,
        every: Duration,
        gc: Option<GcConfig>,
        gate: Option<Gate>,
    ) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let (done, cycles) = watch::channel(0u64);
        let span = tracing::info_span!("compactor_task", table = %compactor.location().uri);
        let handle = tokio::spawn(
            async move {
                loop {
                    if gate.as_ref().is_some_and(|runs| !runs()) {
                        tracing::trace!("compaction cycle skipped: another member compacts");
                        tokio::select! {
                            biased;
                            _ = stopped.wait_for(|s| *s) => break,
                            _ = tokio::time::sleep(every) => continue,
                        }
                    }
                    metrics::counter!(crate::names::CYCLES).increment(1);
                    let cycle = async {
                        if let Err(e) = compactor.run_once().await {
                            tracing::warn!(error = %e, "compaction cycle failed");
                        }
                        if let Some(gc) = &gc {
                            match collect_garbage(compactor.location(), gc).await {
                                Ok(reports) => {
                                    for r in reports.iter().filter_map(|r| r.as_ref().err()) {
                                        tracing::warn!(error = %r, "gc of a shard failed");
                                    }
                                }
                                Err(e) => tracing::warn!(error = %e, "gc cycle failed"),
                            }
                        }
                    };
                    tokio::select! {
                        biased;
                        _ = stopped.wait_for(|s| *s) => break,
                        _ = cycle => done.send_modify(|c| *c += 1),
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
        Self {
            stop,
            cycles,
            handle,
        }
    }

    /// Counts the cycles finished so far (each one compaction plus, when
    /// configured, GC); changes after every cycle.
    pub fn cycles(&self) -> watch::Receiver<u64> {
        self.cycles.clone()
    }

    /// Stops the loop and waits until it has ended. A cycle in progress is
    /// abandoned at its next await point; what it committed or deleted
    /// stays, what it did not is redone by the next run (every step is
    /// idempotent).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.handle.await;
    }
}
