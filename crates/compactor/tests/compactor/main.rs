//! Compactor tests: memwal's writer produces generations on a local table,
//! the compactor merges them, and the base table (read with lance) and the
//! reader view (read with upstream's `LsmScanner`) are checked against a
//! last-write-wins model.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod compaction;
mod faults;
mod gc;
mod maintenance;
mod schema;
mod support;
mod workload;
