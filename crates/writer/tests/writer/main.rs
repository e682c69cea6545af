//! Integration tests of the shard writer (one binary: linking lance is slow).

mod backpressure;
mod basics;
mod concurrency;
mod crash;
mod faults;
mod fencing;
mod input;
mod lifecycle;
mod ordering;
mod replay;
mod replay_background;
mod schema;
mod support;
mod table_config;
