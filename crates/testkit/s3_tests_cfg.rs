//! Build script shared by the crates with S3 tests (`build =
//! "../testkit/s3_tests_cfg.rs"` in their Cargo.toml).
//!
//! Sets `cfg(memwal_s3_tests)` when an S3 test server is configured
//! (`MEMWAL_TEST_S3_URI` non-empty) or under `CI=true` (where a missing
//! server must fail the S3 tests, not skip them). Tests mark themselves
//! `#[cfg_attr(not(memwal_s3_tests), ignore = "...")]`, so without a server
//! `cargo test` reports them as ignored, with the reason, instead of
//! passing them silently. Cargo reruns this when either variable changes.

pub fn main() {
    println!("cargo::rustc-check-cfg=cfg(memwal_s3_tests)");
    println!("cargo::rerun-if-env-changed=MEMWAL_TEST_S3_URI");
    println!("cargo::rerun-if-env-changed=CI");
    let configured = std::env::var("MEMWAL_TEST_S3_URI").is_ok_and(|uri| !uri.trim().is_empty());
    let ci = std::env::var("CI").is_ok_and(|ci| ci == "true");
    if configured || ci {
        println!("cargo::rustc-cfg=memwal_s3_tests");
    }
}
