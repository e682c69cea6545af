//! Cross-implementation takeover tests: memwal's `ShardWriter` and upstream
//! lance 14.0.2's `mem_wal::ShardWriter` taking over each other's shards of
//! one table (unsharded and `bucket(id, 4)`), with upstream's `LsmScanner`
//! as the reader that decides what is visible. One binary: each test binary
//! links all of lance.

mod indexed;
mod live;
mod memwal_first;
mod producers;
mod routing;
mod schema;
mod support;
mod upstream_first;
