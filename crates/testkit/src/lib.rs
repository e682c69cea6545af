//! Test support shared by memwal's crates: an object store wrapper that
//! injects faults, holds requests at gates, counts requests and can "cut
//! power", errors shaped like object_store's (failed fsync, HTTP
//! refusals) for hooks to inject, and
//! [`s3_test_location`] for tests that run against a real S3-compatible
//! server (see [`s3`] for the environment it reads), and the durability
//! [`invariants`] every reliability test checks its runs against, and
//! what a read taken while writes run may show ([`reads`]).
//!
//! Faults are decided by a hook the test installs; nothing here sleeps or
//! depends on timing unless a hook asks for a delay.

mod errors;
pub mod etcd;
mod fault_store;
mod gate;
pub mod invariants;
pub mod reads;
pub mod s3;

pub use errors::{http_status_error, local_rename_error, local_sync_error, permission_denied};
pub use etcd::EtcdServer;
pub use fault_store::{Action, FaultStore, InjectError, Op, OpKind};
pub use gate::Gate;
pub use s3::{s3_test_location, S3_URI_ENV};

/// The error a fault hook injects: a transient, generic store failure that
/// looks like a timeout to the code under test.
pub fn injected_error(what: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "fault-injection",
        source: format!("injected fault: {what}").into(),
    }
}
