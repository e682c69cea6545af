//! The local store `open_store` returns writes large objects through
//! `O_DIRECT` (its own staged-file path instead of object_store's): these
//! tests prove those writes keep the store's contract (exact bytes,
//! put-if-not-exists, overwrite, missing directories, hidden staging),
//! and that they really went through `O_DIRECT` (the direct-write
//! counters rise; the scratch directory is under /var/tmp, not a tmpfs /tmp, which
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

/// `memwal_store_direct_writes_total` in this process.
fn direct_writes() -> u64 {
    counter("memwal_store_direct_writes_total")
}

/// Bytes multipart uploads wrote through `O_DIRECT` in this process.
fn direct_upload_bytes() -> u64 {
    counter("memwal_store_direct_upload_bytes_total")
}

/// The counter `name`'s total in this process (a debugging recorder
/// installed on first use). A snapshot drains every counter of the
/// recorder, so each one's drained values are added up here, under one
/// lock: tests running at once never see each other's snapshots reset a
/// counter.
fn counter(name: &str) -> u64 {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static STATE: OnceLock<(Snapshotter, Mutex<HashMap<String, u64>>)> = OnceLock::new();
    let (snapshotter, totals) = STATE.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this test binary");
        (snapshotter, Mutex::new(HashMap::new()))
    });
    let mut totals = totals.lock().unwrap();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if let DebugValue::Counter(n) = value {
            *totals.entry(key.key().name().to_string()).or_default() += n;
        }
    }
    totals.get(name).copied().unwrap_or(0)
}

/// The names of the entries of directory `dir`.
fn names_in(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
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
    let names = names_in(&dir.path().join("_mem_wal/shard/wal"));
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

/// Breaks if bytes encoded into an `AlignedWriter` (every WAL entry) are
/// copied into a staging buffer again before the direct write, or if that
/// path loses, pads or reorders them.
#[tokio::test]
async fn aligned_entries_are_written_without_a_staging_copy() {
    use std::io::Write;
    let dir = scratch();
    let loc = open_store(dir.path().to_str().unwrap()).unwrap();
    let retry = RetryPolicy::immediate(2);
    for (i, len) in [(1usize << 20) + 123, 3 << 20].into_iter().enumerate() {
        let want = payload(len, 80 + i as u64);
        let mut w = memwal_store::AlignedWriter::with_capacity(1000);
        for piece in want.chunks(10_007) {
            w.write_all(piece).unwrap();
        }
        let bytes = w.into_bytes();
        let before = counter("memwal_store_direct_zero_copy_writes_total");
        let path = loc.child(&format!("wal/{i:04}.arrow"));
        let out = create_object(loc.store.as_ref(), &path, bytes, &retry)
            .await
            .unwrap();
        assert_eq!(out, CreateOutcome::Created);
        assert!(
            counter("memwal_store_direct_zero_copy_writes_total") > before,
            "{len} bytes were copied before the direct write"
        );
        let back = read_object(loc.store.as_ref(), &path, &retry)
            .await
            .unwrap();
        assert_eq!(back.as_deref(), Some(&want[..]), "{len} bytes read back");
    }
}

/// Part sizes of a multipart upload: lance's first part (5 MB) plus one,
/// odd sizes straddling the 8 MiB chunks, a one-byte part and a tail.
fn part_sizes() -> Vec<usize> {
    vec![5_000_001, (7 << 20) + 13, 1, 12 << 20, 4095, 100]
}

/// Breaks if a multipart upload (how lance writes every SSTable data file
/// past 5 MB) loses, pads or reorders bytes when its parts are written
/// concurrently, shows up in listings before `complete`, leaves its staged
/// file behind, or goes through the page cache instead of `O_DIRECT`.
#[tokio::test]
async fn multipart_uploads_read_back_exactly_through_o_direct() {
    let dir = scratch();
    let loc = open_store(dir.path().to_str().unwrap()).unwrap();
    let store = loc.store.as_ref();
    let path = loc.child("_mem_wal/shard/abcd_gen_1/data/0.lance");
    let parts: Vec<Bytes> = part_sizes()
        .into_iter()
        .enumerate()
        .map(|(i, n)| payload(n, 40 + i as u64))
        .collect();
    let whole: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
    let before = direct_upload_bytes();
    let mut upload = store.put_multipart(&path).await.unwrap();
    let writes: Vec<_> = parts
        .iter()
        .map(|p| upload.put_part(PutPayload::from_bytes(p.clone())))
        .collect();
    futures::future::try_join_all(writes).await.unwrap();
    let listed: Vec<Path> = store
        .list(None)
        .map_ok(|m| m.location)
        .try_collect()
        .await
        .unwrap();
    assert!(listed.is_empty(), "visible before complete: {listed:?}");
    let put = upload.complete().await.unwrap();
    let got = store.get(&path).await.unwrap();
    assert_eq!(got.meta.e_tag, put.e_tag, "the e-tag complete reports");
    assert_eq!(got.bytes().await.unwrap(), whole, "read back");
    let direct = direct_upload_bytes() - before;
    assert!(
        direct as usize >= whole.len() / 4096 * 4096,
        "{direct} of {} bytes went through O_DIRECT",
        whole.len()
    );
    let names = names_in(&dir.path().join("_mem_wal/shard/abcd_gen_1/data"));
    assert_eq!(names, vec!["0.lance".to_string()], "no staged file left");

    // A second upload to the same path replaces it (object_store's
    // multipart semantics), with no trace of the longer first file.
    let shorter = payload((9 << 20) + 3, 50);
    let mut again = store.put_multipart(&path).await.unwrap();
    again
        .put_part(PutPayload::from_bytes(shorter.clone()))
        .await
        .unwrap();
    again.complete().await.unwrap();
    assert_eq!(
        store.get(&path).await.unwrap().bytes().await.unwrap(),
        shorter
    );
}

/// Breaks if an aborted or dropped upload leaves its staged file (hidden
/// from listings, so only the file system would ever show the leak) or
/// publishes anything.
#[tokio::test]
async fn aborted_and_dropped_uploads_leave_nothing() {
    let dir = scratch();
    let loc = open_store(dir.path().to_str().unwrap()).unwrap();
    let store = loc.store.as_ref();
    for (i, abort) in [(0, true), (1, false)] {
        let path = loc.child(&format!("sst/{i}.lance"));
        let mut upload = store.put_multipart(&path).await.unwrap();
        upload
            .put_part(PutPayload::from_bytes(payload(9 << 20, i)))
            .await
            .unwrap();
        if abort {
            upload.abort().await.unwrap();
        } else {
            drop(upload);
        }
    }
    let left = names_in(&dir.path().join("sst"));
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Breaks if a part whose future the caller dropped unpolled stalls the
/// parts after it forever, or if `complete` then publishes a file with
/// that part's bytes missing.
#[tokio::test]
async fn a_dropped_part_fails_complete_instead_of_leaving_a_hole() {
    let dir = scratch();
    let loc = open_store(dir.path().to_str().unwrap()).unwrap();
    let store = loc.store.as_ref();
    let path = loc.child("holes/0.lance");
    let mut upload = store.put_multipart(&path).await.unwrap();
    let first = upload.put_part(PutPayload::from_bytes(payload(3 << 20, 70)));
    let dropped = upload.put_part(PutPayload::from_bytes(payload(3 << 20, 71)));
    let third = upload.put_part(PutPayload::from_bytes(payload(3 << 20, 72)));
    drop(dropped);
    tokio::time::timeout(
        std::time::Duration::from_secs(60),
        futures::future::try_join(first, third),
    )
    .await
    .expect("the parts after a dropped one still run")
    .unwrap();
    let err = upload.complete().await.expect_err("a part is missing");
    assert!(err.to_string().contains("bytes"), "{err}");
    assert!(
        store.head(&path).await.is_err(),
        "nothing is published under the name"
    );
    let left = names_in(&dir.path().join("holes"));
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A failed write of an upload's part is that part's error, and complete
/// after it publishes nothing once the caller aborts (lance's writer does).
///
/// Breaks if a part's write error is swallowed (an SSTable published with
/// a hole) or the failed upload leaves its staged file.
#[cfg(feature = "failpoints")]
#[tokio::test]
async fn a_failed_part_write_fails_the_upload_and_publishes_nothing() {
    let dir = scratch();
    let loc = open_store(dir.path().to_str().unwrap()).unwrap();
    let store = loc.store.as_ref();
    let path = loc.child("part-fault/0.lance");
    let mut upload = store.put_multipart(&path).await.unwrap();
    fail::cfg("store::stage_write", "return(5@part-fault)").unwrap();
    let failed = upload
        .put_part(PutPayload::from_bytes(payload(9 << 20, 60)))
        .await;
    fail::remove("store::stage_write");
    let err = failed.expect_err("the part's write failed");
    assert!(
        err.to_string().contains("unable to write the staged file"),
        "{err}"
    );
    upload.abort().await.unwrap();
    let left = walk(dir.path());
    assert!(left.iter().all(|p| !p.contains("0.lance")), "left {left:?}");
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
