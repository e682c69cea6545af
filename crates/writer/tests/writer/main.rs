//! Integration tests of the shard writer (one binary: linking lance is slow).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod backpressure;
mod basics;
mod concurrency;
mod crash;
mod faults;
mod fencing;
mod input;
mod lifecycle;
mod ordering;
mod producers;
mod reads;
mod replay;
mod replay_background;
mod schema;
mod support;
mod table_config;
