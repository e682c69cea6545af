//! Integration tests of memwal-wal. One test binary (fast to link); each
//! module covers one behaviour.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;
mod faults;
mod fencing;
mod group_commit;
mod s3;
mod tail_replay;
