//! Where queries run: a runtime of their own ("memwal-read", one worker
//! thread), so a query's CPU work (scans, merges, searches, DataFusion
//! operators) never queues ahead of ingest on the runtime that acks puts.
//! A query's task is aborted when its caller stops waiting (its time
//! limit, a client gone).

use std::future::Future;
use std::sync::OnceLock;

/// The query runtime, built on first use and never dropped.
fn runtime() -> Result<&'static tokio::runtime::Runtime, String> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("memwal-read")
                .enable_all()
                .build()
                .map_err(|e| format!("starting the query runtime: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Runs `work` on the query runtime and returns its output; `Err` names a
/// runtime that could not start or a task that panicked. Dropping the
/// returned future aborts `work`.
pub(crate) async fn on_read_runtime<F>(work: F) -> Result<F::Output, String>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    struct AbortOnDrop(tokio::task::AbortHandle);
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let handle = runtime()?.spawn(work);
    let _guard = AbortOnDrop(handle.abort_handle());
    handle.await.map_err(|e| match e.try_into_panic() {
        Ok(panic) => format!(
            "the query panicked: {}",
            crate::decode::panic_message(panic.as_ref())
        ),
        Err(e) => format!("the query was cancelled: {e}"),
    })
}
