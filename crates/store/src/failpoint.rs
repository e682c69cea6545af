//! Named crash points on the write path, for the chaos tests.
//!
//! Compiled in only with the `failpoints` feature (which the process-level
//! tests enable); without it [`crash_point`] is an empty inline function.
//! With it, points are armed through the `FAILPOINTS` environment variable
//! read by [`failpoints_from_env`] at process start (the `fail` crate's
//! syntax: `wal::after_put=10%return;writer::before_publish=sleep(2000)`):
//! `return` aborts the process on the spot (as a crash or SIGKILL would),
//! `panic` panics the calling task (`1*panic`: once), `sleep(MS)` pauses
//! the calling thread, `off` disarms.
//!
//! Points: `wal::before_put`, `wal::after_put` (durable, not yet
//! acknowledged), `sstable::before_sidecars` (data written, bloom filter
//! and key index not), `writer::before_publish` (SSTable complete, manifest
//! not updated), `writer::mid_replay` (a replayed generation published,
//! the rest of the WAL not), `server::before_write` (a decoded put, not yet
//! split into shards), `server::read_after_snapshots` (a read took its
//! writers' snapshots, not yet the published view),
//! `compactor::between_passes` (delete pass committed, upsert pass not),
//! `compactor::after_commit` (base committed, the writer has not pruned),
//! `gc::mid` (some objects deleted, not all). Pauses that only the calling
//! task waits out: [`pause`].

/// Passes the named point: with `failpoints` compiled in and the point
/// armed, aborts the process (`return`) or pauses (`sleep`).
#[inline(always)]
pub fn crash_point(name: &str) {
    #[cfg(feature = "failpoints")]
    fail::fail_point!(name, |_| {
        eprintln!("memwal: failpoint {name}: aborting");
        std::process::abort()
    });
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}

/// Whether the deliberately broken behaviour `name` is switched on: each
/// names a bug the chaos suite must catch (its checks are only trusted
/// because each is seen failing against one). Always `false` without the
/// `failpoints` feature; with it, only when `FAILPOINTS` arms `name` with
/// `return`. Behaviours: `broken::wal_ack_before_put` (acknowledge an entry
/// before its PUT, and delay the PUT), `broken::wal_conflict_is_success`
/// (take a lost put-if-not-exists for our own write: no fencing),
/// `broken::replay_reversed` (replay WAL entries newest first),
/// `broken::compactor_upsert_appends` (compact a keyed table by appending),
/// `broken::read_fenced_memtable` (a read serves a fenced writer's
/// memtable over its successor's published rows),
/// `broken::read_unacknowledged` (a read shows rows whose WAL write is not
/// durable), `broken::read_levels_unmerged` (a read of a keyed table
/// concatenates its levels instead of merging them by key),
/// `broken::producer_sequences_ignored` (write every put of an idempotent
/// producer, as if its sequence were new), `broken::forward_ack_unsent`
/// (a cluster member acknowledges the parts it should forward without
/// sending them).
#[inline(always)]
pub fn broken(name: &str) -> bool {
    #[cfg(feature = "failpoints")]
    fail::fail_point!(name, |_| true);
    let _ = name;
    false
}

/// The I/O error the fault point `name` injects into a local write of
/// `path`, if armed (`failpoints` feature only): `return(ERRNO)` fails
/// every such write with that errno, `return(ERRNO@TEXT)` only writes
/// whose path contains TEXT (so parallel tests do not see each other's
/// faults); fail's counts and odds apply (`2*return(28)`, `5%return(28)`).
/// Points: `store::stage_write` (the staged file's write: nothing
/// published), `store::publish` (the link or rename into place),
/// `store::dir_sync` (the fsync of a directory a write created).
#[inline(always)]
pub fn io_fault(name: &str, path: &std::path::Path) -> Option<std::io::Error> {
    #[cfg(feature = "failpoints")]
    fail::fail_point!(name, |arg| {
        let arg = arg.unwrap_or_default();
        let (errno, only) = arg.split_once('@').unwrap_or((&arg, ""));
        let errno = errno.trim().parse().unwrap_or(5);
        path.to_string_lossy()
            .contains(only)
            .then(|| std::io::Error::from_raw_os_error(errno))
    });
    let _ = (name, path);
    None
}

/// How long the calling task should pause at the point `name`, if armed
/// with `return(MS)` (`failpoints` feature only). Unlike `sleep` at a
/// [`crash_point`], which blocks the calling thread (and with it whatever
/// that runtime thread was about to run), the caller awaits the pause, so
/// only its own task waits. Points: `server::ingest_end` (an ingest call's
/// task has ended, its `max_streams` place not yet freed).
#[inline(always)]
pub fn pause(name: &str) -> Option<std::time::Duration> {
    #[cfg(feature = "failpoints")]
    fail::fail_point!(name, |arg| {
        let ms = arg.and_then(|a| a.trim().parse().ok()).unwrap_or(100);
        Some(std::time::Duration::from_millis(ms))
    });
    let _ = name;
    None
}

/// Arms the points `FAILPOINTS` names, for the rest of the process (no-op
/// without the `failpoints` feature). Call once, at start.
pub fn failpoints_from_env() {
    #[cfg(feature = "failpoints")]
    std::mem::forget(fail::FailScenario::setup());
}
