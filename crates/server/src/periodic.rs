//! A host's periodic background work: one named task per duty.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Spawns a task, inside `span` (which names it), that runs `step(owner)`
/// every `every` until `stop` turns true. A step runs to its end: the stop
/// is seen between steps (the caller aborts the handle to cut one short).
pub(crate) fn spawn_every<T, F, Fut>(
    span: tracing::Span,
    every: Duration,
    mut stop: watch::Receiver<bool>,
    owner: Arc<T>,
    step: F,
) -> JoinHandle<()>
where
    T: Send + Sync + 'static,
    F: Fn(Arc<T>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    tokio::spawn(tracing::Instrument::instrument(
        async move {
            loop {
                tokio::select! {
                    biased;
                    _ = stop.wait_for(|s| *s) => break,
                    _ = tokio::time::sleep(every) => {}
                }
                step(owner.clone()).await;
            }
        },
        span,
    ))
}
