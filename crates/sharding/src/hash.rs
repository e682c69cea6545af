//! The 32-bit bucket hash of docs/memwal-format.md "Sharding" (a Murmur3-style mix with
//! seed 0; every operation wraps at 32 bits, shifts are logical).

fn mix_k1(k: u32) -> u32 {
    k.wrapping_mul(0xcc9e_2d51)
        .rotate_left(15)
        .wrapping_mul(0x1b87_3593)
}

fn mix_h1(h: u32, k: u32) -> u32 {
    (h ^ k)
        .rotate_left(13)
        .wrapping_mul(5)
        .wrapping_add(0xe654_6b64)
}

fn fmix(mut h: u32, len: u32) -> u32 {
    h ^= len;
    h = (h ^ (h >> 16)).wrapping_mul(0x85eb_ca6b);
    h = (h ^ (h >> 13)).wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// Hash of a value that widens to 32 bits (bool, 8/16/32-bit integers,
/// date32, time32, float32 bits).
pub fn hash_i32(v: i32) -> i32 {
    fmix(mix_h1(0, mix_k1(v as u32)), 4) as i32
}

/// Hash of a value that widens to 64 bits (64-bit integers, timestamps,
/// time64, float64 bits).
pub fn hash_i64(v: i64) -> i32 {
    let v = v as u64;
    let h = mix_h1(0, mix_k1(v as u32));
    fmix(mix_h1(h, mix_k1((v >> 32) as u32)), 8) as i32
}

/// Hash of a byte string (utf8 / binary values).
pub fn hash_bytes(b: &[u8]) -> i32 {
    let mut chunks = b.chunks_exact(4);
    let mut h = 0u32;
    for c in &mut chunks {
        h = mix_h1(h, mix_k1(u32::from_le_bytes([c[0], c[1], c[2], c[3]])));
    }
    for &byte in chunks.remainder() {
        h = mix_h1(h, mix_k1(byte as i8 as i32 as u32));
    }
    fmix(h, b.len() as u32) as i32
}

/// Float32 bits with both zeros equal and one NaN.
pub fn canonical_f32_bits(v: f32) -> i32 {
    if v == 0.0 {
        0
    } else if v.is_nan() {
        0x7fc0_0000
    } else {
        v.to_bits() as i32
    }
}

/// Float64 bits with both zeros equal and one NaN.
pub fn canonical_f64_bits(v: f64) -> i64 {
    if v == 0.0 {
        0
    } else if v.is_nan() {
        0x7ff8_0000_0000_0000
    } else {
        v.to_bits() as i64
    }
}

/// The bucket of a hash: `(hash & i32::MAX) % num_buckets`.
pub fn bucket_of(hash: i32, num_buckets: i32) -> i32 {
    (hash & i32::MAX) % num_buckets
}
