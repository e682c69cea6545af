//! Proof that the local store `open_store` returns really fsyncs: a durable
//! create is traced with strace and must fsync both the object's file and
//! the directory holding its entry.
//!
//! The test re-runs its own binary as the traced child (selected by an
//! environment variable), so only the create under test is traced. Without
//! strace (or without permission to trace) it is skipped with a line on
//! the terminal, except under `CI=true`, where that is a failure (`.ci/run`
//! installs strace).

use std::io::Write;
use std::path::{Path as FsPath, PathBuf};
use std::process::Command;

use bytes::Bytes;
use memwal_store::{create_object, open_store, CreateOutcome, RetryPolicy};

/// Set in the traced child: the table directory to create the object in.
const CHILD_DIR_ENV: &str = "MEMWAL_FSYNC_PROBE_DIR";
const TEST_NAME: &str = "local_create_fsyncs_the_file_and_its_directory";

/// A create through `open_store` on a local path makes the object durable:
/// its data (the staged file) and its directory entry (the parent
/// directory) are fsynced before it returns.
///
/// Breaks if `open_store` stops enabling fsync (e.g. `LocalFileSystem`
/// without `with_fsync(true)`: no fsync at all), or if object_store stops
/// syncing the file or the directory after linking it into place.
#[test]
fn local_create_fsyncs_the_file_and_its_directory() {
    if let Ok(dir) = std::env::var(CHILD_DIR_ENV) {
        durable_create(FsPath::new(&dir));
        return;
    }
    if let Some(why) = strace_unusable() {
        if std::env::var("CI").is_ok_and(|ci| ci == "true") {
            panic!("strace is required under CI=true to prove fsync: {why} (.ci/run installs it)");
        }
        // Written to the process's stderr, not through the test harness's
        // capture, so the skip shows in `cargo test` output.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {TEST_NAME}: {why} (install strace, e.g. `apt-get install strace`)"
        );
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let table = scratch.path().join("table");
    std::fs::create_dir_all(table.join("wal")).unwrap();
    let trace = scratch.path().join("strace.out");
    let child = Command::new("strace")
        .args(["-f", "-y", "-qq", "-e", "trace=fsync,fdatasync", "-o"])
        .arg(&trace)
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", TEST_NAME, "--test-threads=1", "--nocapture"])
        .env(CHILD_DIR_ENV, &table)
        .output()
        .unwrap();
    assert!(
        child.status.success(),
        "traced child failed ({}):\n{}\n{}",
        child.status,
        String::from_utf8_lossy(&child.stdout),
        String::from_utf8_lossy(&child.stderr)
    );
    let synced = synced_paths(&std::fs::read_to_string(&trace).unwrap());
    let table = std::fs::canonicalize(&table).unwrap();
    let object = table.join("wal").join("entry");
    assert!(
        synced
            .iter()
            .any(|p| p.to_string_lossy().starts_with(&*object.to_string_lossy())),
        "the object's file {} was never fsynced; fsynced: {synced:?}",
        object.display()
    );
    assert!(
        synced.contains(&table.join("wal")),
        "the object's directory was never fsynced; fsynced: {synced:?}"
    );
}

/// The traced child: one put-if-not-exists through `open_store`.
fn durable_create(table: &FsPath) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let loc = open_store(table.to_str().unwrap()).unwrap();
        let out = create_object(
            loc.store.as_ref(),
            &loc.child("wal/entry"),
            Bytes::from_static(b"durable bytes"),
            &RetryPolicy::immediate(1),
        )
        .await
        .unwrap();
        assert_eq!(out, CreateOutcome::Created);
    });
}

/// Why strace cannot trace here, or `None` when it can.
fn strace_unusable() -> Option<String> {
    match Command::new("strace")
        .args(["-qq", "-o", "/dev/null", "true"])
        .output()
    {
        Err(e) => Some(format!("strace not runnable: {e}")),
        Ok(out) if !out.status.success() => Some(format!(
            "strace cannot trace here: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Ok(_) => None,
    }
}

/// The paths of every file descriptor fsynced or fdatasynced in an
/// `strace -y` log (`fsync(7</dir/file>) = 0`).
fn synced_paths(trace: &str) -> Vec<PathBuf> {
    trace
        .lines()
        .filter_map(|line| {
            let call = line.find("fsync(").or_else(|| line.find("fdatasync("))?;
            let rest = &line[call..];
            let start = rest.find('<')? + 1;
            let end = start + rest[start..].find(">)")?;
            Some(PathBuf::from(&rest[start..end]))
        })
        .collect()
}
