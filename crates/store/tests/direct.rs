//! The local store `open_store` returns writes large objects through
//! `O_DIRECT` (its own staged-file path instead of object_store's): these
//! tests prove those writes keep the store's contract (exact bytes,
//! put-if-not-exists, overwrite, missing directories, hidden staging).

use bytes::Bytes;
use futures::TryStreamExt;
use memwal_store::{
    create_object, open_store, read_object, CreateOutcome, Path, RetryPolicy, DIRECT_MIN_BYTES,
};
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

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
    let dir = tempfile::tempdir().unwrap();
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
    let dir = tempfile::tempdir().unwrap();
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
    let dir = tempfile::tempdir().unwrap();
    let loc = open_store(dir.path().to_str().unwrap()).unwrap();
    let store = loc.store.as_ref();
    let path = loc.child("_mem_wal/shard/wal/0001.arrow");
    let bytes = payload(1 << 20, 3);
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
    let dir = tempfile::tempdir().unwrap();
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
    let dir = tempfile::tempdir().unwrap();
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
