//! The key tuple encoding (order, escaping, nulls) and the bloom hash.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use std::cmp::Ordering;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, FixedSizeBinaryArray, Int64Array, RecordBatch, StringArray};
use arrow_schema::DataType;
use memwal_memtable::key_codec::{
    bloom_hash, encoded_key, is_bloom_hashable, is_bloom_probe_exact, KeyColumns,
};
use memwal_memtable::{KeyValue, MemTableError};
use proptest::prelude::*;

fn enc(values: &[KeyValue<'_>]) -> Vec<u8> {
    encoded_key(values)
}

/// Exact bytes from docs/memwal-format.md for a few values. Breaks if the sign bit is
/// not flipped, widths are not 8 bytes, or the tags/terminator differ.
#[test]
fn encoding_bytes_match_the_spec() {
    assert_eq!(enc(&[KeyValue::Int64(0)]), [1, 0x80, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(
        enc(&[KeyValue::Int32(-1)]),
        [1, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]
    );
    assert_eq!(enc(&[KeyValue::UInt8(2)]), [1, 0, 0, 0, 0, 0, 0, 0, 2]);
    assert_eq!(enc(&[KeyValue::Boolean(true)]), [1, 1]);
    assert_eq!(enc(&[KeyValue::Null]), [0]);
    assert_eq!(enc(&[KeyValue::Utf8("ab")]), [1, b'a', b'b', 0, 0]);
    assert_eq!(
        enc(&[KeyValue::Date32(1), KeyValue::Null]),
        [1, 0x80, 0, 0, 0, 0, 0, 0, 1, 0]
    );
}

/// Each 0x00 inside a string is escaped as 0x00 0xff, so embedded zeros
/// neither collide nor break ordering against prefixes. Breaks if zeros are
/// copied raw (("a\0", "b") would then collide or misorder with ("a", ...)).
#[test]
fn zero_bytes_are_escaped() {
    assert_eq!(
        enc(&[KeyValue::Binary(&[0, 7, 0])]),
        [1, 0, 0xff, 7, 0, 0xff, 0, 0]
    );
    // ("a", "\0b") vs ("a\0", "b"): distinct, and ordered like the tuples.
    let x = enc(&[KeyValue::Utf8("a"), KeyValue::Utf8("\0b")]);
    let y = enc(&[KeyValue::Utf8("a\0"), KeyValue::Utf8("b")]);
    assert_ne!(x, y);
    assert!(x < y);
    // "" < "\0" < "\0\0" < "\x01".
    let order = ["", "\0", "\0\0", "\x01"];
    for w in order.windows(2) {
        assert!(enc(&[KeyValue::Utf8(w[0])]) < enc(&[KeyValue::Utf8(w[1])]));
    }
}

/// Nulls sort before every value of a column, including the smallest one
/// and the empty string. Breaks if the null tag is not below the value tag.
#[test]
fn nulls_sort_first() {
    assert!(enc(&[KeyValue::Null]) < enc(&[KeyValue::Int64(i64::MIN)]));
    assert!(enc(&[KeyValue::Null]) < enc(&[KeyValue::Utf8("")]));
    assert!(
        enc(&[KeyValue::Int64(1), KeyValue::Null]) < enc(&[KeyValue::Int64(1), KeyValue::Utf8("")])
    );
}

/// Bloom hashes equal the upstream recipe written out here: DefaultHasher,
/// per column `is_null` then the value through its own `Hash` impl. Breaks
/// if the null flag is dropped, a string is hashed as bytes (str adds a
/// 0xff terminator, [u8] a length prefix), widths are widened, or the
/// column order changes.
#[test]
fn bloom_hash_matches_upstream_recipe() {
    let reference = |feed: &dyn Fn(&mut DefaultHasher)| {
        let mut h = DefaultHasher::new();
        feed(&mut h);
        h.finish()
    };
    let int64 = reference(&|h| {
        false.hash(h);
        42i64.hash(h);
    });
    assert_eq!(bloom_hash(&[KeyValue::Int64(42)]).unwrap(), int64);
    let int32 = reference(&|h| {
        false.hash(h);
        42i32.hash(h);
    });
    assert_eq!(bloom_hash(&[KeyValue::Int32(42)]).unwrap(), int32);
    assert_ne!(int32, int64, "widths hash differently");
    let utf8 = reference(&|h| {
        false.hash(h);
        "user-17".hash(h);
    });
    assert_eq!(bloom_hash(&[KeyValue::Utf8("user-17")]).unwrap(), utf8);
    let binary = reference(&|h| {
        false.hash(h);
        b"user-17".as_slice().hash(h);
    });
    assert_eq!(bloom_hash(&[KeyValue::Binary(b"user-17")]).unwrap(), binary);
    assert_ne!(utf8, binary);
    let composite = reference(&|h| {
        false.hash(h);
        7i64.hash(h);
        false.hash(h);
        "x".hash(h);
    });
    assert_eq!(
        bloom_hash(&[KeyValue::Int64(7), KeyValue::Utf8("x")]).unwrap(),
        composite
    );
    let with_null = reference(&|h| {
        true.hash(h);
        false.hash(h);
        1u16.hash(h);
    });
    assert_eq!(
        bloom_hash(&[KeyValue::Null, KeyValue::UInt16(1)]).unwrap(),
        with_null
    );
    assert!(bloom_hash(&[KeyValue::Date32(1)]).is_err());

    // The row path over arrays hashes like the value path.
    let batch = RecordBatch::try_from_iter(vec![
        ("a", Arc::new(Int64Array::from(vec![7])) as ArrayRef),
        ("b", Arc::new(StringArray::from(vec!["x"])) as ArrayRef),
    ])
    .unwrap();
    let cols: Vec<&ArrayRef> = batch.columns().iter().collect();
    let keys = KeyColumns::try_new(&cols, &["a", "b"]).unwrap();
    assert_eq!(keys.bloom_hash_row(0).unwrap(), composite);
}

/// A fixed-size binary key column has no bloom hash upstream's point lookup
/// shares (it hashes such a value by its debug form), so the row path
/// refuses it (the SSTable writer then saturates the filter) instead of
/// hashing its bytes as binary. Breaks if `bloom_hash_row` hashes it.
#[test]
fn fixed_size_binary_keys_have_no_bloom_hash() {
    let fixed: ArrayRef = Arc::new(
        FixedSizeBinaryArray::try_from_iter([b"abcd".as_slice(), b"wxyz".as_slice()].into_iter())
            .unwrap(),
    );
    let ints: ArrayRef = Arc::new(Int64Array::from(vec![1, 2]));
    assert!(!is_bloom_hashable(fixed.data_type()));
    let keys = KeyColumns::try_new(&[&ints, &fixed], &["i", "f"]).unwrap();
    assert_eq!(
        keys.bloom_hash_row(0).unwrap_err(),
        MemTableError::UnsupportedKeyType {
            column: "#1".into(),
            data_type: DataType::FixedSizeBinary(4),
        }
    );
}

/// Only the four types upstream's SSTable writer hashes by value make a
/// probe conclusive. Breaks if a type upstream's writer hashes by its null
/// flag alone (a reader would then report present keys absent) is listed.
#[test]
fn bloom_probes_are_exact_only_for_the_types_upstream_writes_by_value() {
    let exact = [
        DataType::Int32,
        DataType::Int64,
        DataType::Utf8,
        DataType::Binary,
    ];
    let not_exact = [
        DataType::Int8,
        DataType::Int16,
        DataType::UInt8,
        DataType::UInt16,
        DataType::UInt32,
        DataType::UInt64,
        DataType::Boolean,
        DataType::LargeUtf8,
        DataType::LargeBinary,
        DataType::Date32,
        DataType::Date64,
        DataType::FixedSizeBinary(16),
    ];
    for t in &exact {
        assert!(is_bloom_probe_exact(t), "{t}");
    }
    for t in &not_exact {
        assert!(!is_bloom_probe_exact(t), "{t}");
    }
}

fn cmp_opt<T: Ord>(a: &Option<T>, b: &Option<T>) -> Ordering {
    // None (null) sorts first, as Option's own Ord does.
    a.cmp(b)
}

fn kv_i64(v: &Option<i64>) -> KeyValue<'_> {
    v.map_or(KeyValue::Null, KeyValue::Int64)
}

fn kv_bytes(v: &Option<Vec<u8>>) -> KeyValue<'_> {
    v.as_deref().map_or(KeyValue::Null, KeyValue::Binary)
}

fn bytes_with_zeros() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![Just(0u8), Just(1u8), Just(0xffu8), any::<u8>()],
        0..6,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Encoded order equals value order for composite (int64?, bytes?, bool)
    /// tuples, and equal encodings only for equal tuples. Breaks on any
    /// order or injectivity bug in the per-type encodings or escaping.
    #[test]
    fn composite_order_is_preserved(
        a in (proptest::option::of(any::<i64>()), proptest::option::of(bytes_with_zeros()), any::<bool>()),
        b in (proptest::option::of(any::<i64>()), proptest::option::of(bytes_with_zeros()), any::<bool>()),
    ) {
        let ea = enc(&[kv_i64(&a.0), kv_bytes(&a.1), KeyValue::Boolean(a.2)]);
        let eb = enc(&[kv_i64(&b.0), kv_bytes(&b.1), KeyValue::Boolean(b.2)]);
        let want = cmp_opt(&a.0, &b.0)
            .then_with(|| cmp_opt(&a.1, &b.1))
            .then_with(|| a.2.cmp(&b.2));
        prop_assert_eq!(ea.cmp(&eb), want);
    }

    /// Integer widths: signed values of every width and unsigned values order
    /// like their numbers. Breaks if a width is encoded little-endian or
    /// without the sign flip.
    #[test]
    fn integer_order_is_preserved(x in any::<i32>(), y in any::<i32>(), u in any::<u64>(), w in any::<u64>()) {
        prop_assert_eq!(enc(&[KeyValue::Int32(x)]).cmp(&enc(&[KeyValue::Int32(y)])), x.cmp(&y));
        prop_assert_eq!(
            enc(&[KeyValue::Int16(x as i16)]).cmp(&enc(&[KeyValue::Int16(y as i16)])),
            (x as i16).cmp(&(y as i16))
        );
        prop_assert_eq!(enc(&[KeyValue::UInt64(u)]).cmp(&enc(&[KeyValue::UInt64(w)])), u.cmp(&w));
        prop_assert_eq!(
            enc(&[KeyValue::UInt32(u as u32)]).cmp(&enc(&[KeyValue::UInt32(w as u32)])),
            (u as u32).cmp(&(w as u32))
        );
    }

    /// Strings order like their bytes, including multi-byte characters and
    /// embedded NULs. Breaks if escaping or the terminator break order.
    #[test]
    fn string_order_is_preserved(a in "[a\\x00\\u{e9}]{0,5}", b in "[a\\x00\\u{e9}]{0,5}") {
        prop_assert_eq!(
            enc(&[KeyValue::Utf8(&a), KeyValue::Int64(1)]).cmp(&enc(&[KeyValue::Utf8(&b), KeyValue::Int64(0)])),
            a.as_bytes().cmp(b.as_bytes()).then(Ordering::Greater)
        );
    }
}
