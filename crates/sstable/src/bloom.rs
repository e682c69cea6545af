//! `bloom_filter.bin`: lance-core's split-block bloom filter over the
//! primary-key hashes of every physical row, serialized as its bitset.
//!
//! Sizing defaults to upstream lance 14.0.2 exactly: `Sbbf::with_ndv_fpp(8192,
//! 0.00057)` whatever the row count (32 KiB). Upstream readers only
//! deserialize the bitset, so they accept any size; [`BloomSizing`] lets a
//! writer size for larger memtables (see the crate docs for why).

use arrow_array::{ArrayRef, RecordBatch};
use lance_core::utils::bloomfilter::sbbf::Sbbf;
use memwal_memtable::key_codec::KeyColumns;

use crate::error::{Result, SsTableError};

/// File name of the bloom filter inside an SSTable directory.
pub const BLOOM_FILTER_FILE: &str = "bloom_filter.bin";
/// Distinct keys upstream sizes every SSTable bloom filter for.
pub const BLOOM_EXPECTED_KEYS: u64 = 8192;
/// False-positive probability upstream sizes the filter for.
pub const BLOOM_FPP: f64 = 0.00057;

/// How `bloom_filter.bin` is sized: `Sbbf::with_ndv_fpp(expected_keys,
/// fpp)` (lance rounds the bitset up to a power of two, 32 B to 128 MiB).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BloomSizing {
    /// Distinct keys the filter is sized for.
    pub expected_keys: u64,
    /// Target false-positive probability at `expected_keys` keys.
    pub fpp: f64,
}

impl BloomSizing {
    /// Upstream lance 14.0.2's sizing: 8192 keys at fpp 0.00057 (32 KiB).
    pub const UPSTREAM: Self = Self {
        expected_keys: BLOOM_EXPECTED_KEYS,
        fpp: BLOOM_FPP,
    };

    /// An empty filter of this size; `None` when lance refuses the sizing
    /// (fpp outside (0, 1)).
    pub fn new_filter(&self) -> Option<Sbbf> {
        Sbbf::with_ndv_fpp(self.expected_keys.max(1), self.fpp).ok()
    }
}

impl Default for BloomSizing {
    fn default() -> Self {
        Self::UPSTREAM
    }
}

/// The filter over the keys of every row of `batches` (`key_indices` in key
/// order, `key_names` for errors); empty for an append-only table.
///
/// Each row's key is inserted as [`memwal_memtable::key_codec::bloom_hash`],
/// the hash upstream's point lookup probes with, for every key type
/// [`memwal_memtable::key_codec::is_bloom_hashable`] accepts (all integer
/// widths, bool, utf8 and binary of both offset sizes). When a key column
/// has a type without such a hash (dates, fixed-size binary) the filter is
/// returned saturated (every bit set): every probe then answers "maybe",
/// so no reader ever skips a generation that holds the key, whatever hash
/// it computes.
pub fn build_filter(
    path: &str,
    sizing: BloomSizing,
    batches: &[RecordBatch],
    key_indices: &[usize],
    key_names: &[&str],
) -> Result<Sbbf> {
    let mut filter = sizing
        .new_filter()
        .ok_or_else(|| SsTableError::invalid(path, format!("invalid bloom sizing {sizing:?}")))?;
    if key_indices.is_empty() {
        return Ok(filter);
    }
    for batch in batches {
        let columns: Vec<&ArrayRef> = key_indices.iter().map(|&i| batch.column(i)).collect();
        let keys = KeyColumns::try_new(&columns, key_names).map_err(SsTableError::key(path))?;
        for row in 0..batch.num_rows() {
            match keys.bloom_hash_row(row) {
                Ok(hash) => filter.insert_hash(hash),
                Err(memwal_memtable::MemTableError::UnsupportedKeyType { .. }) => {
                    return Ok(saturated(&filter));
                }
                Err(e) => return Err(SsTableError::key(path)(e)),
            }
        }
    }
    Ok(filter)
}

fn saturated(like: &Sbbf) -> Sbbf {
    let bytes = vec![0xffu8; like.size_bytes()];
    Sbbf::new(&bytes).expect("a power-of-two bitset of a valid filter's size")
}

/// Decodes `bloom_filter.bin` bytes.
pub fn decode_filter(path: &str, bytes: &[u8]) -> Result<Sbbf> {
    Sbbf::new(bytes).map_err(|e| SsTableError::corrupt(path, format!("bad bloom filter: {e}")))
}
