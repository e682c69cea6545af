//! Buffers aligned for `O_DIRECT`, reused through a process-wide pool, and
//! [`AlignedWriter`], which encodes straight into one.
//!
//! Why: the local store writes large objects with `O_DIRECT`, which needs
//! the bytes on a 4096-byte boundary. Bytes that arrive elsewhere are
//! copied into a pooled buffer first. A WAL entry encoded into an
//! [`AlignedWriter`] and frozen with [`AlignedWriter::into_bytes`] skips
//! that copy, and lands in memory an earlier entry already touched: each
//! fresh allocation's first touch costs a page fault per 4 KiB (on a VM
//! whose memory the host backs lazily, a host fault as well).

use std::fmt;
use std::io;

use bytes::Bytes;
use parking_lot::Mutex;

/// Buffer address, file offset and length alignment for `O_DIRECT`: the
/// largest logical block size of common devices.
pub(crate) const ALIGN: usize = 4096;

/// Buffers the pool keeps, and the largest one it keeps.
const POOLED_BUFFERS: usize = 4;
const MAX_POOLED_BYTES: usize = 32 << 20;

/// One `O_DIRECT`-aligned block.
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct Block([u8; ALIGN]);

/// A heap buffer aligned for `O_DIRECT`.
pub(crate) struct AlignedBuf {
    blocks: Vec<Block>,
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.capacity())
    }
}

impl AlignedBuf {
    /// A buffer of no bytes (allocates nothing; never pooled).
    pub(crate) fn empty() -> Self {
        Self { blocks: Vec::new() }
    }

    fn with_capacity(bytes: usize) -> Self {
        Self {
            blocks: vec![Block([0; ALIGN]); bytes.div_ceil(ALIGN).max(1)],
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.blocks.len() * ALIGN
    }

    // The unsafe blocks of the library crates: an aligned buffer for
    // O_DIRECT viewed as bytes.
    #[allow(unsafe_code)]
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `Block` is a plain byte array with no padding, so the
        // vector's elements are `capacity()` initialised, contiguous bytes
        // owned by `self` and borrowed for the returned slice's lifetime.
        unsafe { std::slice::from_raw_parts(self.blocks.as_ptr().cast::<u8>(), self.capacity()) }
    }

    #[allow(unsafe_code)]
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.capacity();
        // SAFETY: as in `bytes`, borrowed mutably through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.blocks.as_mut_ptr().cast::<u8>(), len) }
    }
}

/// Aligned buffers kept for reuse.
#[derive(Debug)]
pub(crate) struct Pool {
    buffers: Mutex<Vec<AlignedBuf>>,
}

/// The pool every local store, upload and [`AlignedWriter`] of this
/// process shares.
pub(crate) static POOL: Pool = Pool::new();

impl Pool {
    pub(crate) const fn new() -> Self {
        Self {
            buffers: parking_lot::const_mutex(Vec::new()),
        }
    }

    /// The smallest pooled buffer of at least `len` bytes, or a new one.
    pub(crate) fn take(&self, len: usize) -> AlignedBuf {
        let mut pool = self.buffers.lock();
        let best = pool
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        match best {
            Some(i) => pool.swap_remove(i),
            None => {
                drop(pool);
                AlignedBuf::with_capacity(rounded(len))
            }
        }
    }

    /// Keeps `buf` for reuse if there is room (the smallest pooled buffer
    /// makes way for a larger one).
    pub(crate) fn give_back(&self, buf: AlignedBuf) {
        if buf.capacity() == 0 || buf.capacity() > MAX_POOLED_BYTES {
            return;
        }
        let mut pool = self.buffers.lock();
        if pool.len() < POOLED_BUFFERS {
            pool.push(buf);
        } else if let Some((i, _)) = pool
            .iter()
            .enumerate()
            .min_by_key(|(_, b)| b.capacity())
            .filter(|(_, b)| b.capacity() < buf.capacity())
        {
            pool[i] = buf;
        }
    }
}

/// `len` rounded up so buffers of growing sizes get reused: to 64 KiB up
/// to a MiB, to a MiB above.
fn rounded(len: usize) -> usize {
    const SMALL: usize = 64 << 10;
    const LARGE: usize = 1 << 20;
    if len <= LARGE {
        len.div_ceil(SMALL).max(1) * SMALL
    } else {
        len.div_ceil(LARGE) * LARGE
    }
}

/// An append-only byte buffer whose first byte sits on a 4096-byte
/// boundary, drawn from the process-wide pool.
///
/// Guarantees: [`Self::into_bytes`] hands out exactly the bytes written, in
/// order, without copying them, starting on a 4096-byte boundary; the
/// buffer goes back to the pool when the last clone of those `Bytes` is
/// dropped. The local store writes such `Bytes` (passed whole, as one
/// payload chunk) through `O_DIRECT` without a staging copy.
#[derive(Debug)]
pub struct AlignedWriter {
    buf: AlignedBuf,
    len: usize,
}

impl AlignedWriter {
    /// A writer with room for `bytes` before it grows.
    pub fn with_capacity(bytes: usize) -> Self {
        Self {
            buf: POOL.take(bytes),
            len: 0,
        }
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Nothing written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes written, without a copy.
    pub fn into_bytes(mut self) -> Bytes {
        let buf = std::mem::replace(&mut self.buf, AlignedBuf::empty());
        if self.len == 0 {
            POOL.give_back(buf);
            return Bytes::new();
        }
        Bytes::from_owner(Pooled { buf, len: self.len })
    }
}

impl io::Write for AlignedWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let need = self.len + data.len();
        if need > self.buf.capacity() {
            let mut bigger = POOL.take(need.max(self.buf.capacity() * 2));
            bigger.bytes_mut()[..self.len].copy_from_slice(&self.buf.bytes()[..self.len]);
            POOL.give_back(std::mem::replace(&mut self.buf, bigger));
        }
        self.buf.bytes_mut()[self.len..need].copy_from_slice(data);
        self.len = need;
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for AlignedWriter {
    fn drop(&mut self) {
        POOL.give_back(std::mem::replace(&mut self.buf, AlignedBuf::empty()));
    }
}

/// The owner behind [`AlignedWriter::into_bytes`]: returns its buffer to
/// the pool when the last `Bytes` sharing it is dropped.
struct Pooled {
    buf: AlignedBuf,
    len: usize,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf.bytes()[..self.len]
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        POOL.give_back(std::mem::replace(&mut self.buf, AlignedBuf::empty()));
    }
}

/// Whether `bytes` start on an `O_DIRECT` boundary.
pub(crate) fn is_aligned(bytes: &[u8]) -> bool {
    (bytes.as_ptr() as usize).is_multiple_of(ALIGN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    // Breaks if buffers stop being 4096-aligned (O_DIRECT writes would fail
    // with EINVAL and every write would fall back to the page cache), or
    // the pool stops reusing them (every write would touch fresh pages).
    #[test]
    fn buffers_are_aligned_and_reused() {
        let pool = Pool::new();
        let buf = pool.take(ALIGN + 1);
        assert_eq!(buf.bytes().as_ptr() as usize % ALIGN, 0);
        assert!(buf.capacity() > ALIGN);
        let addr = buf.bytes().as_ptr() as usize;
        pool.give_back(buf);
        let again = pool.take(100);
        assert_eq!(
            again.bytes().as_ptr() as usize,
            addr,
            "the pooled buffer is reused"
        );
        pool.give_back(again);
        let big = pool.take(MAX_POOLED_BYTES + 1);
        pool.give_back(big);
        assert!(pool
            .buffers
            .lock()
            .iter()
            .all(|b| b.capacity() <= MAX_POOLED_BYTES));
    }

    // Breaks if the writer loses, reorders or pads bytes when it grows, or
    // hands out bytes that do not start on a block boundary (the store
    // would copy them again).
    #[test]
    fn aligned_writer_keeps_every_byte_and_its_alignment() {
        let mut w = AlignedWriter::with_capacity(10);
        let mut want = Vec::new();
        for i in 0..200u32 {
            let piece: Vec<u8> = (0..(i * 97 % 9000)).map(|j| (i + j) as u8).collect();
            w.write_all(&piece).unwrap();
            want.extend_from_slice(&piece);
        }
        assert_eq!(w.len(), want.len());
        let bytes = w.into_bytes();
        assert!(is_aligned(&bytes));
        assert_eq!(&bytes[..], &want[..]);
        let tail = bytes.slice(5..);
        drop(bytes);
        assert_eq!(&tail[..], &want[5..], "a slice keeps the buffer alive");
        assert!(AlignedWriter::with_capacity(1).into_bytes().is_empty());
    }
}
