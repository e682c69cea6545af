//! The bench's rows: 1 KiB each, an Int64 primary key `id` and a
//! 1016-byte Utf8 `v` cut from a random pool at an offset derived from the
//! key, so no two rows of a run carry the same string (encodings cannot
//! collapse them).

use std::sync::Arc;

use arrow_array::builder::StringBuilder;
use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};

/// Bytes of one row: 8 (id) + PAYLOAD.
pub const ROW_BYTES: usize = 1024;
pub const PAYLOAD: usize = ROW_BYTES - 8;
/// Random pool the payloads are cut from; offsets `id * STRIDE mod len`
/// repeat only after ~16 M keys.
const POOL_BYTES: usize = 16 << 20;
const STRIDE: usize = 1031;

pub fn table_schema() -> Arc<Schema> {
    let key_md = std::collections::HashMap::from([(
        "lance-schema:unenforced-primary-key".to_string(),
        "true".to_string(),
    )]);
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false).with_metadata(key_md),
        Field::new("v", DataType::Utf8, true),
    ]))
}

/// Builds batches of distinct rows.
#[derive(Clone)]
pub struct Rows {
    schema: Arc<Schema>,
    pool: Arc<[u8]>,
}

impl Rows {
    pub fn new() -> Self {
        // splitmix64 over the pool, mapped to lowercase ASCII (valid UTF-8).
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let pool: Vec<u8> = (0..POOL_BYTES)
            .map(|_| {
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^= z >> 31;
                b'a' + (z % 26) as u8
            })
            .collect();
        Self {
            schema: table_schema(),
            pool: pool.into(),
        }
    }

    /// `n` rows with ids `first..first+n`.
    pub fn batch(&self, first: i64, n: usize) -> RecordBatch {
        let ids = Int64Array::from_iter_values(first..first + n as i64);
        let span = self.pool.len() - PAYLOAD;
        let mut vs = StringBuilder::with_capacity(n, n * PAYLOAD);
        for id in first..first + n as i64 {
            let at = (id as usize).wrapping_mul(STRIDE) % span;
            let s = std::str::from_utf8(&self.pool[at..at + PAYLOAD]).expect("ASCII pool");
            vs.append_value(s);
        }
        RecordBatch::try_new(
            self.schema.clone(),
            vec![Arc::new(ids) as ArrayRef, Arc::new(vs.finish())],
        )
        .expect("batch matches the schema")
    }
}
