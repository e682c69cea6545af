//! Integration tests of memwal-sstable, in one binary (each test binary
//! links all of lance).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod bloom;
mod compression;
mod durability;
mod interop;
mod model;
mod stores;
mod support;
mod upstream;
mod wire;
mod writer;
