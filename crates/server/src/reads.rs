//! Where queries run: a runtime of their own ("memwal-read", two worker
//! threads), so a query's CPU work (planning, scans, merges, searches,
//! DataFusion operators) never queues ahead of ingest on the runtime that
//! acks puts, and one busy query thread does not stop the others. Its
//! threads have large stacks ([`STACK_BYTES`]): planning walks a
//! statement's expressions recursively, and the statement checks
//! (`crate::statement`) bound how deep that goes. A query's task is
//! cancelled when its [`QueryTask`] drops (its deadline passed, its reader
//! went away, or it ended).

use std::future::Future;
use std::sync::OnceLock;

/// Stack of each query thread: room for statements nesting up to the
/// depth cap (`query_max_expr_depth`, 1000 by default) in debug builds,
/// whose frames are several times larger than release builds'. Only the
/// pages a query touches are ever backed by memory.
pub(crate) const STACK_BYTES: usize = 64 << 20;

/// Query threads.
const WORKERS: usize = 2;

/// The query runtime, built on first use and never dropped.
fn runtime() -> Result<&'static tokio::runtime::Runtime, String> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(WORKERS)
                .thread_stack_size(STACK_BYTES)
                .thread_name("memwal-read")
                .enable_all()
                .build()
                .map_err(|e| format!("starting the query runtime: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// A query's task on the query runtime; dropping it cancels the task (at
/// its next yield: every operator yields per batch, `crate::cooperative`,
/// and the lookup loops yield per batch they filter).
#[derive(Debug)]
pub(crate) struct QueryTask(tokio::task::AbortHandle);

impl Drop for QueryTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs `work` on the query runtime until it ends or the returned
/// [`QueryTask`] drops.
pub(crate) fn spawn<F>(work: F) -> Result<QueryTask, String>
where
    F: Future<Output = ()> + Send + 'static,
{
    Ok(QueryTask(runtime()?.spawn(work).abort_handle()))
}
