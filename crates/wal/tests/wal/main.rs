//! Integration tests of memwal-wal. One test binary (fast to link); each
//! module covers one behaviour.

mod common;
mod faults;
mod fencing;
mod group_commit;
mod s3;
mod tail_replay;
