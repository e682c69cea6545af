//! Build script shared by the crates with etcd tests (`build =
//! "../testkit/etcd_tests_cfg.rs"` in their Cargo.toml).
//!
//! Sets `cfg(memwal_etcd_tests)` when an `etcd` binary can be found
//! (`MEMWAL_TEST_ETCD_BIN`, or `etcd` on `PATH`) or under `CI=true` (where a
//! missing etcd must fail the cluster tests, not skip them). Tests mark
//! themselves `#[cfg_attr(not(memwal_etcd_tests), ignore = "...")]`, so
//! without etcd `cargo test` reports them as ignored, with the reason.

pub fn main() {
    println!("cargo::rustc-check-cfg=cfg(memwal_etcd_tests)");
    println!("cargo::rerun-if-env-changed=MEMWAL_TEST_ETCD_BIN");
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-env-changed=CI");
    let named = std::env::var("MEMWAL_TEST_ETCD_BIN").is_ok_and(|b| !b.trim().is_empty());
    let on_path = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("etcd").is_file()));
    let ci = std::env::var("CI").is_ok_and(|ci| ci == "true");
    if named || on_path || ci {
        println!("cargo::rustc-cfg=memwal_etcd_tests");
    }
}
