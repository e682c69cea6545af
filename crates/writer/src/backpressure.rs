//! Backpressure: puts wait while unflushed memory is at
//! `max_unflushed_bytes` (see `put::submit`, which waits for a publish
//! under the state lock's accounting, so memory stays bounded by
//! `max_unflushed_bytes` plus one batch).

use std::sync::atomic::Ordering;

use crate::state::Inner;
use crate::Error;

/// Counts a put that had to wait for room.
pub(crate) fn note_wait(inner: &Inner) {
    inner.backpressure_waits.fetch_add(1, Ordering::Relaxed);
    inner.storage.meters.backpressure_waits.increment(1);
}

/// The [`Error::Backpressure`] a put gives up with, saying why flushing is
/// stuck: the last flush error, else how long the oldest frozen generation
/// has been flushing.
pub(crate) fn error(inner: &Inner) -> Error {
    let st = inner.state.lock();
    let why = match &st.last_flush_error {
        Some(e) => format!("the last flush failed: {e}"),
        None => match st.frozen.front() {
            Some(f) => format!(
                "generation {} has been flushing for {:?} without an error yet (slow store?)",
                f.generation,
                f.frozen_at.elapsed()
            ),
            None => "no flush is pending".into(),
        },
    };
    Error::Backpressure {
        reason: format!(
            "{} unflushed bytes reached max_unflushed_bytes {} and nothing was published \
             within {:?}; {why}",
            st.unflushed_bytes(),
            inner.config.max_unflushed_bytes,
            inner.config.backpressure_timeout
        ),
    }
}
