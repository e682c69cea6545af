//! Primary-key codec (docs/memwal-format.md "SSTable"): the order-preserving binary
//! tuple encoding used for the memtable index and a composite `_pk_index`,
//! and the 64-bit bloom-filter hash upstream lance computes for a key.
//!
//! Encoding, per key column in key order: `0x00` for null, else `0x01`
//! followed by the value: signed integers and dates as 8-byte big-endian
//! with the sign bit flipped, unsigned integers as 8-byte big-endian, bool
//! as one byte, utf8/binary bytes with each `0x00` escaped as `0x00 0xff`
//! and terminated by `0x00 0x00`. Byte order of encodings equals tuple
//! order (nulls first), and distinct tuples never encode equal.

use std::hash::{Hash, Hasher};

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Date64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type,
    UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef, PrimitiveArray};
use arrow_schema::DataType;

use crate::error::{MemTableError, Result};

/// One primary-key value, borrowed from an array or from the caller.
///
/// Integer widths are kept apart because the bloom hash feeds each width
/// through its own `Hash` impl; the tuple encoding widens them all to 8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KeyValue<'a> {
    /// A null key column value (never stored; encodes as `0x00`).
    Null,
    /// Boolean.
    Boolean(bool),
    /// Int8.
    Int8(i8),
    /// Int16.
    Int16(i16),
    /// Int32.
    Int32(i32),
    /// Int64.
    Int64(i64),
    /// UInt8.
    UInt8(u8),
    /// UInt16.
    UInt16(u16),
    /// UInt32.
    UInt32(u32),
    /// UInt64.
    UInt64(u64),
    /// Date32 (days since the epoch).
    Date32(i32),
    /// Date64 (milliseconds since the epoch).
    Date64(i64),
    /// Utf8 or LargeUtf8.
    Utf8(&'a str),
    /// Binary, LargeBinary or FixedSizeBinary.
    Binary(&'a [u8]),
}

/// Whether a column of `data_type` can be a primary-key column here.
pub fn is_encodable(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
            | DataType::Date32
            | DataType::Date64
            | DataType::Boolean
            | DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Binary
            | DataType::LargeBinary
            | DataType::FixedSizeBinary(_)
    )
}

/// Whether [`bloom_hash`] is defined for keys of `data_type`: every
/// encodable type except dates and fixed-size binary, i.e. the types for
/// which the hash equals the one upstream lance 14.0.2's point lookup
/// probes with. A bloom filter over a key with a column of another type is
/// written saturated (see [`KeyColumns::bloom_hash_row`]).
///
/// This says nothing about filters *upstream* wrote; see
/// [`is_bloom_probe_exact`] for which types a reader may trust a "no" for.
pub fn is_bloom_hashable(data_type: &DataType) -> bool {
    is_encodable(data_type)
        && !matches!(
            data_type,
            DataType::Date32 | DataType::Date64 | DataType::FixedSizeBinary(_)
        )
}

/// Whether a bloom filter written by memwal *or* by upstream lance 14.0.2
/// holds [`bloom_hash`] of every key it was built over, for a key column of
/// `data_type`: true only for Int32, Int64, Utf8 and Binary.
///
/// Upstream's SSTable writer feeds the hasher a value only for those four
/// types; for every other type it feeds just the null flag, so its filter
/// never holds [`bloom_hash`] of a present key. A reader that cannot tell
/// who wrote an SSTable must therefore answer "maybe present" for a key
/// with any column of another type, and may treat a failed probe as
/// "absent" only when every key column passes this check.
pub fn is_bloom_probe_exact(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Int32 | DataType::Int64 | DataType::Utf8 | DataType::Binary
    )
}

#[inline]
fn push_signed(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&((v as u64) ^ (1u64 << 63)).to_be_bytes());
}

#[inline]
fn push_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let mut rest = bytes;
    while let Some(zero) = rest.iter().position(|&b| b == 0) {
        out.extend_from_slice(&rest[..=zero]);
        out.push(0xff);
        rest = &rest[zero + 1..];
    }
    out.extend_from_slice(rest);
    out.extend_from_slice(&[0x00, 0x00]);
}

/// Appends the encoding of one key column value to `out`.
#[inline]
pub fn encode_value(value: &KeyValue<'_>, out: &mut Vec<u8>) {
    if let KeyValue::Null = value {
        out.push(0x00);
        return;
    }
    out.push(0x01);
    match *value {
        KeyValue::Null => {}
        KeyValue::Boolean(b) => out.push(b as u8),
        KeyValue::Int8(v) => push_signed(out, v as i64),
        KeyValue::Int16(v) => push_signed(out, v as i64),
        KeyValue::Int32(v) | KeyValue::Date32(v) => push_signed(out, v as i64),
        KeyValue::Int64(v) | KeyValue::Date64(v) => push_signed(out, v),
        KeyValue::UInt8(v) => out.extend_from_slice(&(v as u64).to_be_bytes()),
        KeyValue::UInt16(v) => out.extend_from_slice(&(v as u64).to_be_bytes()),
        KeyValue::UInt32(v) => out.extend_from_slice(&(v as u64).to_be_bytes()),
        KeyValue::UInt64(v) => out.extend_from_slice(&v.to_be_bytes()),
        KeyValue::Utf8(s) => push_bytes(out, s.as_bytes()),
        KeyValue::Binary(b) => push_bytes(out, b),
    }
}

/// Appends the encoding of a whole key tuple (values in key order) to `out`.
pub fn encode_key(values: &[KeyValue<'_>], out: &mut Vec<u8>) {
    for v in values {
        encode_value(v, out);
    }
}

/// The encoding of a key tuple as a fresh vector.
pub fn encoded_key(values: &[KeyValue<'_>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * 9);
    encode_key(values, &mut out);
    out
}

/// The bloom-filter hash of a key tuple, as upstream lance's readers compute
/// it (`compute_pk_hash`, `compute_pk_hash_from_scalars`):
/// `std::collections::hash_map::DefaultHasher::new()` fed, per key column in
/// key order, `is_null: bool` and then (when not null) the value through its
/// own `Hash` impl (`i8`..`u64`, `bool`, `str`, `[u8]`). This is what memwal's
/// SSTable writer inserts, so upstream's point lookup finds every key memwal
/// wrote.
///
/// Upstream's SSTable *writer* agrees only for Int32, Int64, Utf8 and Binary
/// columns (other types get just the null flag): a probe with this hash is
/// conclusive only under [`is_bloom_probe_exact`]. Dates have no upstream
/// definition and are refused. A [`KeyValue::Binary`] is hashed as binary
/// whatever column it came from: for a fixed-size binary column (which has
/// no upstream definition either) the caller must check the column type
/// ([`is_bloom_hashable`]); [`KeyColumns::bloom_hash_row`] does. std does not
/// promise this hash across Rust releases; writer and reader must share a
/// toolchain.
pub fn bloom_hash(values: &[KeyValue<'_>]) -> Result<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (i, v) in values.iter().enumerate() {
        let is_null = matches!(v, KeyValue::Null);
        is_null.hash(&mut h);
        match *v {
            KeyValue::Null => {}
            KeyValue::Boolean(b) => b.hash(&mut h),
            KeyValue::Int8(x) => x.hash(&mut h),
            KeyValue::Int16(x) => x.hash(&mut h),
            KeyValue::Int32(x) => x.hash(&mut h),
            KeyValue::Int64(x) => x.hash(&mut h),
            KeyValue::UInt8(x) => x.hash(&mut h),
            KeyValue::UInt16(x) => x.hash(&mut h),
            KeyValue::UInt32(x) => x.hash(&mut h),
            KeyValue::UInt64(x) => x.hash(&mut h),
            KeyValue::Utf8(s) => s.hash(&mut h),
            KeyValue::Binary(b) => b.hash(&mut h),
            KeyValue::Date32(_) | KeyValue::Date64(_) => {
                return Err(MemTableError::UnsupportedKeyType {
                    column: format!("#{i}"),
                    data_type: if matches!(v, KeyValue::Date32(_)) {
                        DataType::Date32
                    } else {
                        DataType::Date64
                    },
                })
            }
        }
    }
    Ok(h.finish())
}

/// A typed view of one key column, so per-row access needs no downcast.
#[derive(Debug, Clone, Copy)]
enum ColumnView<'a> {
    I8(&'a PrimitiveArray<Int8Type>),
    I16(&'a PrimitiveArray<Int16Type>),
    I32(&'a PrimitiveArray<Int32Type>),
    I64(&'a PrimitiveArray<Int64Type>),
    U8(&'a PrimitiveArray<UInt8Type>),
    U16(&'a PrimitiveArray<UInt16Type>),
    U32(&'a PrimitiveArray<UInt32Type>),
    U64(&'a PrimitiveArray<UInt64Type>),
    D32(&'a PrimitiveArray<Date32Type>),
    D64(&'a PrimitiveArray<Date64Type>),
    Bool(&'a arrow_array::BooleanArray),
    Utf8(&'a arrow_array::StringArray),
    LargeUtf8(&'a arrow_array::LargeStringArray),
    Binary(&'a arrow_array::BinaryArray),
    LargeBinary(&'a arrow_array::LargeBinaryArray),
    Fixed(&'a arrow_array::FixedSizeBinaryArray),
}

impl<'a> ColumnView<'a> {
    fn new(array: &'a dyn Array) -> Option<Self> {
        Some(match array.data_type() {
            DataType::Int8 => Self::I8(array.as_primitive()),
            DataType::Int16 => Self::I16(array.as_primitive()),
            DataType::Int32 => Self::I32(array.as_primitive()),
            DataType::Int64 => Self::I64(array.as_primitive()),
            DataType::UInt8 => Self::U8(array.as_primitive()),
            DataType::UInt16 => Self::U16(array.as_primitive()),
            DataType::UInt32 => Self::U32(array.as_primitive()),
            DataType::UInt64 => Self::U64(array.as_primitive()),
            DataType::Date32 => Self::D32(array.as_primitive()),
            DataType::Date64 => Self::D64(array.as_primitive()),
            DataType::Boolean => Self::Bool(array.as_boolean()),
            DataType::Utf8 => Self::Utf8(array.as_string()),
            DataType::LargeUtf8 => Self::LargeUtf8(array.as_string()),
            DataType::Binary => Self::Binary(array.as_binary()),
            DataType::LargeBinary => Self::LargeBinary(array.as_binary()),
            DataType::FixedSizeBinary(_) => Self::Fixed(array.as_fixed_size_binary()),
            _ => return None,
        })
    }

    #[inline]
    fn value(&self, row: usize) -> KeyValue<'a> {
        macro_rules! get {
            ($a:expr, $variant:ident) => {
                if $a.is_null(row) {
                    KeyValue::Null
                } else {
                    KeyValue::$variant($a.value(row))
                }
            };
        }
        match *self {
            Self::I8(a) => get!(a, Int8),
            Self::I16(a) => get!(a, Int16),
            Self::I32(a) => get!(a, Int32),
            Self::I64(a) => get!(a, Int64),
            Self::U8(a) => get!(a, UInt8),
            Self::U16(a) => get!(a, UInt16),
            Self::U32(a) => get!(a, UInt32),
            Self::U64(a) => get!(a, UInt64),
            Self::D32(a) => get!(a, Date32),
            Self::D64(a) => get!(a, Date64),
            Self::Bool(a) => get!(a, Boolean),
            Self::Utf8(a) => get!(a, Utf8),
            Self::LargeUtf8(a) => get!(a, Utf8),
            Self::Binary(a) => get!(a, Binary),
            Self::LargeBinary(a) => get!(a, Binary),
            Self::Fixed(a) => get!(a, Binary),
        }
    }
}

/// Typed access to the key columns of one batch: per-row key values,
/// encodings and bloom hashes without per-row downcasts or allocations.
#[derive(Debug, Clone)]
pub struct KeyColumns<'a> {
    columns: Vec<ColumnView<'a>>,
}

impl<'a> KeyColumns<'a> {
    /// Views `columns` (key order) for row access; `names` label errors.
    /// Fails with [`MemTableError::UnsupportedKeyType`] for a type outside
    /// [`is_encodable`].
    pub fn try_new(columns: &[&'a ArrayRef], names: &[&str]) -> Result<Self> {
        let columns = columns
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                let array: &'a dyn Array = a.as_ref();
                ColumnView::new(array).ok_or_else(|| MemTableError::UnsupportedKeyType {
                    column: names
                        .get(i)
                        .map_or_else(|| format!("#{i}"), |n| n.to_string()),
                    data_type: a.data_type().clone(),
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self { columns })
    }

    /// Number of key columns.
    pub fn len(&self) -> usize {
        self.columns.len()
    }

    /// True when there are no key columns.
    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
    }

    /// The key value of column `col` at `row`.
    #[inline]
    pub fn value(&self, col: usize, row: usize) -> KeyValue<'a> {
        self.columns[col].value(row)
    }

    /// The key tuple at `row` as a vector of values.
    pub fn values(&self, row: usize) -> Vec<KeyValue<'a>> {
        self.columns.iter().map(|c| c.value(row)).collect()
    }

    /// Appends the tuple encoding of `row` to `out` (no other allocation).
    #[inline]
    pub fn encode_row(&self, row: usize, out: &mut Vec<u8>) {
        for c in &self.columns {
            encode_value(&c.value(row), out);
        }
    }

    /// The bloom hash of `row` (see [`bloom_hash`]). Fails with
    /// [`MemTableError::UnsupportedKeyType`] when a key column's type is not
    /// [`is_bloom_hashable`] (dates, fixed-size binary), whatever the row.
    pub fn bloom_hash_row(&self, row: usize) -> Result<u64> {
        for (i, c) in self.columns.iter().enumerate() {
            if let ColumnView::Fixed(a) = c {
                return Err(MemTableError::UnsupportedKeyType {
                    column: format!("#{i}"),
                    data_type: a.data_type().clone(),
                });
            }
        }
        let mut buf = [KeyValue::Null; 4];
        if self.columns.len() <= buf.len() {
            for (slot, c) in buf.iter_mut().zip(&self.columns) {
                *slot = c.value(row);
            }
            bloom_hash(&buf[..self.columns.len()])
        } else {
            bloom_hash(&self.values(row))
        }
    }
}

/// The key value at `row` of an array of an encodable type; `None` when the
/// type is not encodable.
pub fn value_at(array: &dyn Array, row: usize) -> Option<KeyValue<'_>> {
    ColumnView::new(array).map(|v| v.value(row))
}
