//! Proof that the local store `open_store` returns really fsyncs: a durable
//! create is traced with strace and must fsync both the object's file and
//! the directory holding its entry; a large one (a WAL entry) must also be
//! written through `O_DIRECT`.
//!
//! The test re-runs its own binary as the traced child (selected by an
//! environment variable), so only the create under test is traced. Without
//! strace (or without permission to trace) it is skipped with a line on
//! the terminal, except under `CI=true`, where that is a failure (`.ci/run`
//! installs strace).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use std::io::Write;
use std::path::{Path as FsPath, PathBuf};
use std::process::Command;

use bytes::Bytes;
use memwal_store::{create_object, open_store, CreateOutcome, RetryPolicy};

/// Set in the traced child: the table directory to create the object in.
const CHILD_DIR_ENV: &str = "MEMWAL_FSYNC_PROBE_DIR";
/// Set in the traced child: the object's size in bytes.
const CHILD_LEN_ENV: &str = "MEMWAL_FSYNC_PROBE_LEN";
const TEST_NAME: &str = "local_create_fsyncs_the_file_and_its_directory";
const DIRECT_TEST_NAME: &str = "large_local_create_bypasses_the_page_cache_and_fsyncs";

/// A create through `open_store` on a local path makes the object durable:
/// its data (the staged file) and its directory entry (the parent
/// directory) are fsynced before it returns.
///
/// Breaks if `open_store` stops enabling fsync (e.g. `LocalFileSystem`
/// without `with_fsync(true)`: no fsync at all), or if object_store stops
/// syncing the file or the directory after linking it into place.
#[test]
fn local_create_fsyncs_the_file_and_its_directory() {
    let Some(trace) = traced_create(TEST_NAME, 13) else {
        return;
    };
    let synced = synced_paths(&trace.log);
    assert!(
        synced.iter().any(|p| p
            .to_string_lossy()
            .starts_with(&*trace.object.to_string_lossy())),
        "the object's file {} was never fsynced; fsynced: {synced:?}",
        trace.object.display()
    );
    assert!(
        synced.contains(&trace.dir),
        "the object's directory was never fsynced; fsynced: {synced:?}"
    );
}

/// A create of a WAL-entry-sized object opens its staged file with
/// `O_DIRECT`, fsyncs that file and then the directory holding the object.
///
/// Breaks if large creates stop bypassing the page cache (the local store
/// returned by `open_store` losing its direct path, or the threshold rising
/// above a 1 MiB entry), or if the direct path stops fsyncing the file or
/// the directory.
#[test]
fn large_local_create_bypasses_the_page_cache_and_fsyncs() {
    let Some(trace) = traced_create(DIRECT_TEST_NAME, (1 << 20) + 100) else {
        return;
    };
    let object = trace.object.to_string_lossy().into_owned();
    let direct_opens: Vec<&str> = trace
        .log
        .lines()
        .filter(|l| l.contains("openat(") && l.contains(&object) && l.contains("O_DIRECT"))
        .collect();
    assert!(
        !direct_opens.is_empty(),
        "the object's staged file was not opened with O_DIRECT:\n{}",
        trace.log
    );
    // An open refused with EINVAL (a file system without O_DIRECT) falls
    // back to the page cache: only a successful direct open counts. The
    // child also checked that the direct-write counter rose.
    assert!(
        direct_opens.iter().any(|l| opened_fd(l)),
        "no O_DIRECT open of the staged file succeeded:\n{}",
        direct_opens.join("\n")
    );
    let synced = synced_paths(&trace.log);
    let file_synced = synced
        .iter()
        .position(|p| p.to_string_lossy().starts_with(&*object));
    let dir_synced = synced.iter().rposition(|p| *p == trace.dir);
    assert!(
        matches!((file_synced, dir_synced), (Some(f), Some(d)) if f < d),
        "expected an fsync of the staged file, then of {}; fsynced: {synced:?}",
        trace.dir.display()
    );
}

/// Whether an strace `openat` line returned a descriptor (`) = 3</…>`),
/// not an error (`) = -1 EINVAL …`).
fn opened_fd(line: &str) -> bool {
    line.rsplit_once(") = ")
        .is_some_and(|(_, ret)| ret.starts_with(|c: char| c.is_ascii_digit()))
}

/// What a traced child did: its strace log, the object's file and the
/// directory holding it.
struct Trace {
    log: String,
    object: PathBuf,
    dir: PathBuf,
}

/// Runs `test` again as a child under strace creating one `len`-byte
/// object; `None` (after saying why) when strace cannot run outside CI.
fn traced_create(test: &str, len: usize) -> Option<Trace> {
    if let Ok(dir) = std::env::var(CHILD_DIR_ENV) {
        let len = std::env::var(CHILD_LEN_ENV).unwrap().parse().unwrap();
        durable_create(FsPath::new(&dir), len);
        return None;
    }
    if let Some(why) = strace_unusable() {
        if std::env::var("CI").is_ok_and(|ci| ci == "true") {
            panic!("strace is required under CI=true to prove fsync: {why} (.ci/run installs it)");
        }
        // Written to the process's stderr, not through the test harness's
        // capture, so the skip shows in `cargo test` output.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {test}: {why} (install strace, e.g. `apt-get install strace`)"
        );
        return None;
    }
    // Under /var/tmp rather than the temp dir: /tmp may be a tmpfs.
    let scratch =
        tempfile::tempdir_in(std::env::var("TMPDIR").unwrap_or("/var/tmp".into())).unwrap();
    let table = scratch.path().join("table");
    std::fs::create_dir_all(table.join("wal")).unwrap();
    let trace = scratch.path().join("strace.out");
    let child = Command::new("strace")
        .args([
            "-f",
            "-y",
            "-qq",
            "-e",
            "trace=openat,fsync,fdatasync",
            "-o",
        ])
        .arg(&trace)
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", test, "--test-threads=1", "--nocapture"])
        .env(CHILD_DIR_ENV, &table)
        .env(CHILD_LEN_ENV, len.to_string())
        .output()
        .unwrap();
    assert!(
        child.status.success(),
        "traced child failed ({}):\n{}\n{}",
        child.status,
        String::from_utf8_lossy(&child.stdout),
        String::from_utf8_lossy(&child.stderr)
    );
    let table = std::fs::canonicalize(&table).unwrap();
    Some(Trace {
        log: std::fs::read_to_string(&trace).unwrap(),
        object: table.join("wal").join("entry"),
        dir: table.join("wal"),
    })
}

/// The traced child: one put-if-not-exists of `len` bytes through
/// `open_store`; one at least `DIRECT_MIN_BYTES` long must count as a
/// direct write (`memwal_store_direct_writes_total`).
fn durable_create(table: &FsPath, len: usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    rt.block_on(async {
        let loc = open_store(table.to_str().unwrap()).unwrap();
        let out = create_object(
            loc.store.as_ref(),
            &loc.child("wal/entry"),
            Bytes::from((0..len).map(|i| (i * 131 % 251) as u8).collect::<Vec<u8>>()),
            &RetryPolicy::immediate(1),
        )
        .await
        .unwrap();
        assert_eq!(out, CreateOutcome::Created);
    });
    let direct: u64 = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "memwal_store_direct_writes_total")
        .map(|(.., v)| match v {
            metrics_util::debugging::DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum();
    let want = u64::from(len >= memwal_store::DIRECT_MIN_BYTES);
    assert_eq!(
        direct, want,
        "direct writes counted for a {len}-byte create"
    );
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
