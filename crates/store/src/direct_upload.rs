//! Multipart uploads of the local store through `O_DIRECT`: how lance
//! writes every SSTable data file larger than its first part (5 MB).
//!
//! Why: a flush writes a generation's bytes once more (the WAL already
//! holds them), and nothing reads them back until a lookup or a compaction.
//! Copied through the page cache, those bytes cost the CPU and the fresh
//! pages that WAL puts need at the same moment: the tail latency of puts
//! while a flush runs (issue 30). Written directly, the CPU cost is one
//! copy into the upload's reused aligned buffer.
//!
//! Parts arrive in order but of any size, and the caller runs several
//! part futures at once. Each part takes its turn in call order (so one
//! aligned buffer of [`CHUNK_BYTES`] per upload suffices, whatever the
//! caller's concurrency); on a blocking thread it is copied into that
//! buffer, and each time the buffer fills it is written at its offset in
//! the staged file. Upload writes take turns across the whole store, so
//! the device never holds more than one chunk of flush bytes ahead of a
//! WAL put. `complete` writes the last partial chunk (its aligned blocks
//! directly, the tail under one block through the page cache), fsyncs the
//! file, renames it into place (a multipart upload overwrites, as
//! object_store's does) and fsyncs the directory. Before `complete`
//! returns nothing is visible: the staged name is hidden from listings,
//! and `abort` or a drop removes it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_trait::async_trait;
use futures::future::FutureExt;
use object_store::{MultipartUpload, PutPayload, PutResult, UploadPart};
use parking_lot::Mutex;
use rustix::fs::OFlags;
use tokio::sync::watch;

use crate::aligned::{AlignedBuf, ALIGN, POOL};
use crate::direct::{publish_staged, DirectStage, Publish, Shared, StageError, STORE_NAME};

/// Bytes per direct write of an upload: large enough to be bandwidth-bound,
/// small enough that a WAL entry queued behind one at the device waits
/// about 1.5 ms (at 1.4 GB/s).
pub(crate) const CHUNK_BYTES: usize = 2 << 20;

/// A multipart upload into a staged file opened with `O_DIRECT`.
#[derive(Debug)]
pub(crate) struct DirectUpload {
    shared: Arc<Shared>,
    /// `None` once completed or aborted.
    staged: Option<Arc<Staged>>,
    dest: PathBuf,
    /// Bytes not yet written, under the lock only the part whose turn it
    /// is (or `complete`) takes.
    pending: Arc<Mutex<Pending>>,
    /// The sequence number of the part whose turn it is.
    turn: Arc<watch::Sender<Turn>>,
    /// Parts handed out so far, and their bytes.
    issued: u64,
    issued_bytes: u64,
}

/// The staged file an upload writes into.
#[derive(Debug)]
struct Staged {
    file: File,
    path: PathBuf,
}

#[derive(Debug)]
struct Pending {
    buf: AlignedBuf,
    filled: usize,
    /// File offset of `buf`'s first byte.
    offset: u64,
    /// Set by the first failed write: every later part fails with it.
    failed: Option<String>,
}

impl DirectUpload {
    /// An upload into `file`, created (empty, `O_DIRECT`) at `staged`,
    /// to be published at `dest`.
    pub(crate) fn new(shared: Arc<Shared>, file: File, staged: PathBuf, dest: PathBuf) -> Self {
        let buf = POOL.take(CHUNK_BYTES);
        Self {
            shared,
            staged: Some(Arc::new(Staged { file, path: staged })),
            dest,
            pending: Arc::new(Mutex::new(Pending {
                buf,
                filled: 0,
                offset: 0,
                failed: None,
            })),
            turn: Arc::new(watch::channel(Turn::default()).0),
            issued: 0,
            issued_bytes: 0,
        }
    }

    fn remove_staged(&mut self) {
        if let Some(staged) = self.staged.take() {
            let _ = std::fs::remove_file(&staged.path);
        }
    }
}

fn generic(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> object_store::Error {
    object_store::Error::Generic {
        store: STORE_NAME,
        source: source.into(),
    }
}

/// Whose turn it is to write, and the parts whose futures were dropped
/// before their turn came (skipped when it does).
#[derive(Debug, Default)]
struct Turn {
    next: u64,
    skipped: std::collections::BTreeSet<u64>,
}

/// Part `seq`'s place in line. Dropped when the part's bytes are in (by
/// the blocking task that copies them, so dropping the part's future
/// while they are copied changes nothing), or when its future is dropped
/// (even unpolled) before its turn: the turn then passes on, so later
/// parts run (and `complete` sees the bytes missing) instead of waiting
/// forever.
struct TurnGuard {
    turn: Arc<watch::Sender<Turn>>,
    seq: u64,
}

impl Drop for TurnGuard {
    fn drop(&mut self) {
        let seq = self.seq;
        self.turn.send_modify(|t| {
            if t.next == seq {
                t.next += 1;
            } else if t.next < seq {
                t.skipped.insert(seq);
            }
            while t.skipped.remove(&t.next) {
                t.next += 1;
            }
        });
    }
}

#[async_trait]
impl MultipartUpload for DirectUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let Some(staged) = self.staged.clone() else {
            return futures::future::ready(Err(generic(
                "put_part after the upload completed or was aborted",
            )))
            .boxed();
        };
        let seq = self.issued;
        self.issued += 1;
        self.issued_bytes += data.content_length() as u64;
        let guard = TurnGuard {
            turn: self.turn.clone(),
            seq,
        };
        let pending = self.pending.clone();
        let shared = self.shared.clone();
        async move {
            let mut waiting = guard.turn.subscribe();
            // The guard holds the sender: the wait ends.
            let _ = waiting.wait_for(|t| t.next >= seq).await;
            tokio::task::spawn_blocking(move || {
                // The turn passes on only once this part's bytes are in:
                // a caller that drops this future now cannot let the next
                // part's bytes in ahead of them.
                let _turn = guard;
                append(&shared, &staged, &mut pending.lock(), &data)
            })
            .await
            .map_err(generic)?
        }
        .boxed()
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        let Some(staged) = self.staged.clone() else {
            return Err(generic(
                "complete after the upload completed or was aborted",
            ));
        };
        if self.turn.borrow().next != self.issued {
            self.remove_staged();
            return Err(generic(
                "complete before every part of the upload was written",
            ));
        }
        // From here the publish step owns the staged name.
        self.staged = None;
        let (shared, pending, dest) =
            (self.shared.clone(), self.pending.clone(), self.dest.clone());
        let expected = self.issued_bytes;
        let published = tokio::task::spawn_blocking(move || {
            let written = finish(&shared, &staged, &mut pending.lock(), expected);
            match written {
                Ok(()) => publish_staged(&staged.file, &staged.path, &dest, Publish::Rename)
                    .map_err(StageError::into_store),
                Err(e) => {
                    let _ = std::fs::remove_file(&staged.path);
                    Err(e)
                }
            }
        })
        .await
        .map_err(generic)??;
        metrics::counter!("memwal_store_direct_uploads_total").increment(1);
        Ok(published)
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.remove_staged();
        Ok(())
    }
}

impl Drop for DirectUpload {
    /// An upload dropped before `complete` leaves nothing behind.
    fn drop(&mut self) {
        self.remove_staged();
        if let Some(mut pending) = self.pending.try_lock() {
            let buf = std::mem::replace(&mut pending.buf, AlignedBuf::empty());
            POOL.give_back(buf);
        }
    }
}

/// Copies `data` into the pending chunk, writing each chunk that fills.
fn append(
    shared: &Shared,
    staged: &Staged,
    pending: &mut Pending,
    data: &PutPayload,
) -> object_store::Result<()> {
    if let Some(failed) = &pending.failed {
        return Err(generic(format!("an earlier part failed: {failed}")));
    }
    for chunk in data.iter() {
        let mut rest: &[u8] = chunk;
        while !rest.is_empty() {
            let n = (CHUNK_BYTES - pending.filled).min(rest.len());
            let at = pending.filled;
            pending.buf.bytes_mut()[at..at + n].copy_from_slice(&rest[..n]);
            pending.filled += n;
            rest = &rest[n..];
            if pending.filled == CHUNK_BYTES {
                write_pending(shared, staged, pending)?;
            }
        }
    }
    Ok(())
}

/// Writes what is pending (the last chunk) and checks the file holds
/// every byte the parts carried.
fn finish(
    shared: &Shared,
    staged: &Staged,
    pending: &mut Pending,
    expected: u64,
) -> object_store::Result<()> {
    if let Some(failed) = &pending.failed {
        return Err(generic(format!("a part failed: {failed}")));
    }
    if pending.filled > 0 {
        write_pending(shared, staged, pending)?;
    }
    if pending.offset != expected {
        return Err(generic(format!(
            "the parts carried {expected} bytes but {} were written (a part's future was dropped)",
            pending.offset
        )));
    }
    Ok(())
}

/// Writes the pending bytes at their offset and empties the chunk; a
/// failure is kept for every later part.
fn write_pending(
    shared: &Shared,
    staged: &Staged,
    pending: &mut Pending,
) -> object_store::Result<()> {
    let len = pending.filled;
    let offset = pending.offset;
    match write_at(
        shared,
        &staged.file,
        &staged.path,
        &pending.buf.bytes_mut()[..len],
        offset,
    ) {
        Ok(()) => {
            pending.filled = 0;
            pending.offset += len as u64;
            Ok(())
        }
        Err(e) => {
            pending.failed = Some(e.to_string());
            Err(e)
        }
    }
}

/// Writes `bytes` at `offset` of the staged `file`: the aligned prefix
/// directly, the tail (under one block: only an upload's last write has
/// one) through the page cache. A file system that refuses the direct
/// write gets it, and every later one, buffered.
fn write_at(
    shared: &Shared,
    file: &File,
    staged: &FsPath,
    bytes: &[u8],
    offset: u64,
) -> object_store::Result<()> {
    if let Some(e) = crate::failpoint::io_fault("store::stage_write", staged) {
        return Err(DirectStage::Write.error(staged, e));
    }
    let _one_at_a_time = shared.upload_io.lock();
    let aligned = bytes.len() / ALIGN * ALIGN;
    let mut direct_done = 0;
    if aligned > 0 && !shared.direct_unsupported.load(Ordering::Relaxed) {
        match file.write_all_at(&bytes[..aligned], offset) {
            Ok(()) => direct_done = aligned,
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
                shared.direct_unsupported.store(true, Ordering::Relaxed);
                tracing::warn!(
                    path = %staged.display(),
                    "the file system refused O_DIRECT; large local writes go through the page cache"
                );
            }
            Err(e) => return Err(DirectStage::Write.error(staged, e)),
        }
    }
    if direct_done < bytes.len() {
        // A tail (or a refused direct write): the same descriptor, buffered.
        // Only an upload's last write has a tail, and parts write in turn,
        // so clearing O_DIRECT races with no direct write of this file.
        let flags = rustix::fs::fcntl_getfl(file)
            .map_err(|e| DirectStage::Write.error(staged, e.into()))?;
        if flags.contains(OFlags::DIRECT) {
            rustix::fs::fcntl_setfl(file, flags - OFlags::DIRECT)
                .map_err(|e| DirectStage::Write.error(staged, e.into()))?;
        }
        file.write_all_at(&bytes[direct_done..], offset + direct_done as u64)
            .map_err(|e| DirectStage::Write.error(staged, e))?;
    }
    metrics::counter!("memwal_store_direct_upload_bytes_total").increment(direct_done as u64);
    Ok(())
}
