//! The local store `open_store` returns writes large objects through
//! `O_DIRECT` (its own staged-file path instead of object_store's): these
//! tests prove those writes keep the store's contract (exact bytes,
//! put-if-not-exists, overwrite, missing directories, hidden staging),
//! and that they really went through `O_DIRECT` (the direct-write counter
//! rises; the scratch directory is under /var/tmp, not a tmpfs /tmp, which
//! refuses `O_DIRECT`).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use bytes::Bytes;
use futures::TryStreamExt;
use memwal_store::{
    create_object, open_store, read_object, CreateOutcome, Path, RetryPolicy, DIRECT_MIN_BYTES,
};
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

/// A scratch directory on a file system that takes `O_DIRECT`:
/// `MEMWAL_TEST_DIRECT_DIR`, else /var/tmp (a fresh machine's /tmp may be
/// a tmpfs, where every direct write would fall back to buffered and these
/// tests would prove nothing).
fn scratch() -> tempfile::TempDir {
    let base = std::env::var("MEMWAL_TEST_DIRECT_DIR").unwrap_or_else(|_| "/var/tmp".into());
    tempfile::tempdir_in(base).unwrap()
}

/// `memwal_store_direct_writes_total` in this process (a debugging
/// recorder installed on first use).
fn direct_writes() -> u64 {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
    static SNAPSHOTTER: std::sync::OnceLock<Snapshotter> = std::sync::OnceLock::new();
    let snapshotter = SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this test binary");
        snapshotter
    });
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "memwal_store_direct_writes_total")
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum()
}

/// Distinct bytes (no run an encoding could hide a misplaced block in).
fn payload(len: usize, seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Sizes around the direct-write threshold and the 4096-byte alignment.
fn sizes() -> Vec<usize> {
    vec![
        DIRECT_MIN_BYTES - 1,
        DIRECT_MIN_BYTES,
        DIRECT_MIN_BYTES + 1,
        (1 << 20) + 123,
        3 << 20,
        (5 << 20) - 4095,
    ]
}

/// Breaks if a direct write loses, pads or reorders bytes (e.g. the tail
/// after the last aligned block), or reports a create that did not land.
#[tokio::test]
async fn large_creates_read_back_exactly() {
    let dir = scratch();
    let loc = open_store(dir.path().to_str().unwrap()).unwrap();
    let retry = RetryPolicy::immediate(2);
    for (i, len) in sizes().into_iter().enumerate() {
        let path = loc.child(&format!("wal/{i:04}.arrow"));
        let bytes = payload(len, i as u64);
        let out = create_object(loc.store.as_ref(), &path, bytes.clone(), &retry)
            .await
            .unwrap();
        assert_eq!(out, CreateOutcome::Created, "{len} bytes");
        let back = read_object(loc.store.as_ref(), &path, &retry)
            .await
            .unwrap();
        assert_eq!(back.as_deref(), Some(&bytes[..]), "{len} bytes read back");
        let on_disk = std::fs::read(dir.path().join(format!("wal/{i:04}.arrow"))).unwrap();
        assert_eq!(on_disk.len(), len, "file size of {len} bytes");
    }
}

/// Breaks if a large create replaces an existing object (put-if-not-exists
/// lost: a fenced writer could overwrite its successor's entry), or if a
/// retry of our own landed create stops reading back as `Identical`.
#[tokio::test]
async fn large_create_never_replaces_an_object() {
    let dir = scratch();
    let loc = open_store(dir.path().to_str().unwrap()).unwrap();
    let retry = RetryPolicy::immediate(2);
    let path = loc.child("wal/0001.arrow");
    let ours = payload(2 << 20, 1);
    let theirs = payload(2 << 20, 2);
    let store = loc.store.as_ref();
    assert_eq!(
        create_object(store, &path, ours.clone(), &retry)
            .await
            .unwrap(),
        CreateOutcome::Created
    );
    let raw = store
        .put_opts(
            &path,
            PutPayload::from_bytes(theirs.clone()),
            PutOptions {
                mode: PutMode::Create,
                ..Default::default()
            },
        )
        .await;
    assert!(
        matches!(raw, Err(object_store::Error::AlreadyExists { .. })),
        "{raw:?}"
    );
    assert_eq!(
        create_object(store, &path, theirs, &retry).await.unwrap(),
        CreateOutcome::Conflict(ours.clone())
    );
    assert_eq!(
        create_object(store, &path, ours.clone(), &retry)
            .await
            .unwrap(),
        CreateOutcome::Identical
    );
    assert_eq!(
        read_object(store, &path, &retry).await.unwrap().as_deref(),
        Some(&ours[..])
    );
}

/// Breaks if a large write into a directory that does not exist yet fails
/// (the first entry of a new shard's WAL), or if staged files are left
/// behind or show up in listings.
#[tokio::test]
async fn large_writes_create_directories_and_leave_no_staged_files() {
    let dir = scratch();
    let loc = open_store(dir.path().to_str().unwrap()).unwrap();
    let store = loc.store.as_ref();
    let path = loc.child("_mem_wal/shard/wal/0001.arrow");
    let bytes = payload(1 << 20, 3);
    let before = direct_writes();
    store
        .put_opts(
            &path,
            PutPayload::from_bytes(bytes.clone()),
            PutOptions {
                mode: PutMode::Create,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let listed: Vec<Path> = store
        .list(None)
        .map_ok(|m| m.location)
        .try_collect()
        .await
        .unwrap();
    assert_eq!(listed, vec![path.clone()]);
    assert!(
        direct_writes() > before,
        "the write did not go through O_DIRECT"
    );
    let names: Vec<_> = std::fs::read_dir(dir.path().join("_mem_wal/shard/wal"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec!["0001.arrow".to_string()], "no staged file left");
    assert_eq!(
        store.get(&path).await.unwrap().bytes().await.unwrap(),
        bytes
    );
}

/// Breaks if a large overwrite keeps the old bytes, mixes old and new, or
/// leaves a file of the old length.
#[tokio::test]
async fn large_overwrite_replaces_the_object() {
    let dir = scratch();
    let loc = open_store(dir.path().to_str().unwrap()).unwrap();
    let store = loc.store.as_ref();
    let path = loc.child("data/file.lance");
    let first = payload(3 << 20, 4);
    let second = payload((1 << 20) + 7, 5);
    store
        .put(&path, PutPayload::from_bytes(first))
        .await
        .unwrap();
    let put = store
        .put(&path, PutPayload::from_bytes(second.clone()))
        .await
        .unwrap();
    let got = store.get(&path).await.unwrap();
    assert_eq!(
        got.meta.e_tag, put.e_tag,
        "the e-tag a put reports is the file's"
    );
    assert_eq!(got.bytes().await.unwrap(), second);
}

/// Breaks if a payload made of several chunks is written out of order or
/// with a chunk missing.
#[tokio::test]
async fn multi_chunk_payloads_are_written_in_order() {
    let dir = scratch();
    let loc = open_store(dir.path().to_str().unwrap()).unwrap();
    let store = loc.store.as_ref();
    let path = loc.child("wal/0002.arrow");
    let parts: Vec<Bytes> = (0..5)
        .map(|i| payload(70_001 + i * 4096, i as u64))
        .collect();
    let whole: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
    let payload: PutPayload = parts.into_iter().collect();
    store.put(&path, payload).await.unwrap();
    assert_eq!(
        store.get(&path).await.unwrap().bytes().await.unwrap(),
        whole
    );
}

/// A local write refused for room or permission before anything was
/// published (the staged file's write, or its link into place), or whose
/// new directory could not be synced, is a definite refusal at once: no
/// retries, `StoreError::Request` (nothing written), no object, no staged
/// file, no half-made directory; once the fault is gone the same create
/// lands.
///
/// Breaks if such failures count as transient (retried until they become
/// `OutcomeUnknown`, which stops a writer and its shard for a disk that was
/// full for a moment) or as "may have landed" (a failed link), or if a
/// directory whose sync failed is left for a retry to trust.
#[cfg(feature = "failpoints")]
#[tokio::test]
async fn refused_local_writes_are_definite_and_publish_nothing() {
    use memwal_store::StoreError;
    for (point, errno, tag) in [
        ("store::stage_write", 28, "enospc-write"),
        ("store::stage_write", 1, "eperm-write"),
        ("store::publish", 28, "enospc-link"),
        ("store::publish", 1, "eperm-link"),
        ("store::publish", 13, "eacces-link"),
        ("store::dir_sync", 5, "eio-dir-sync"),
    ] {
        let dir = scratch();
        let loc = open_store(dir.path().to_str().unwrap()).unwrap();
        let path = loc.child(&format!("{tag}/wal/0001.arrow"));
        let bytes = payload(1 << 20, 9);
        // Scoped to this path: other tests' writes are not hit.
        fail::cfg(point, &format!("return({errno}@{tag})")).unwrap();
        let refused = create_object(
            loc.store.as_ref(),
            &path,
            bytes.clone(),
            &RetryPolicy::immediate(6),
        )
        .await;
        fail::remove(point);
        match &refused {
            Err(StoreError::Request { .. }) => {}
            other => panic!("{tag}: want a definite refusal, got {other:?}"),
        }
        let left: Vec<_> = walk(dir.path());
        assert!(
            left.iter().all(|p| !p.contains("0001.arrow")),
            "{tag}: left {left:?}"
        );
        if point == "store::dir_sync" {
            assert!(
                !dir.path().join(tag).exists(),
                "{tag}: the unsynced directory stayed: {left:?}"
            );
        }
        let out = create_object(
            loc.store.as_ref(),
            &path,
            bytes.clone(),
            &RetryPolicy::immediate(1),
        )
        .await
        .unwrap();
        assert_eq!(out, CreateOutcome::Created, "{tag}: after the fault");
    }
}

/// Every file and directory under `dir`, as paths relative to it.
#[cfg(feature = "failpoints")]
fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(dir).unwrap().to_string_lossy().into_owned());
            if p.is_dir() {
                todo.push(p);
            }
        }
    }
    out
}
