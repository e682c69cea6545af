//! Where queries run: a runtime of their own ("memwal-read", one worker
//! thread), so a query's CPU work (scans, merges, searches, DataFusion
//! operators) never queues ahead of ingest on the runtime that acks puts.
//! A query's task ends when its reader stops reading (a client gone) or
//! its time limit passes.

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

/// Runs `work` on the query runtime, detached: it ends by itself (a
/// query's task watches its reader and its deadline).
pub(crate) fn spawn<F>(work: F) -> Result<(), String>
where
    F: Future<Output = ()> + Send + 'static,
{
    runtime()?.spawn(work);
    Ok(())
}
