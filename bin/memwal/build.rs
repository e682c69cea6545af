//! The `memwal` binary's build script: the S3- and etcd-tests cfgs shared
//! with the other crates, and `MEMWAL_GIT_COMMIT` for `memwal --version` (the
//! checkout's commit, `unknown` when built outside a git checkout).

#[path = "../../crates/testkit/s3_tests_cfg.rs"]
mod s3_tests_cfg;

#[path = "../../crates/testkit/etcd_tests_cfg.rs"]
mod etcd_tests_cfg;

fn main() {
    s3_tests_cfg::main();
    etcd_tests_cfg::main();
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo::rustc-env=MEMWAL_GIT_COMMIT={commit}");
    // Rebuilt when HEAD moves: HEAD itself (a checkout) and the ref it
    // names (a commit on the branch).
    // (Only files that exist: a missing one would rebuild every time.)
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        let dir = std::path::Path::new(&dir);
        let head_ref = git(&["symbolic-ref", "-q", "HEAD"]);
        let watched = [Some("HEAD"), head_ref.as_deref(), Some("packed-refs")];
        for path in watched.into_iter().flatten().map(|p| dir.join(p)) {
            if path.exists() {
                println!("cargo::rerun-if-changed={}", path.display());
            }
        }
    }
}
