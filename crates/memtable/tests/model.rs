//! Random put/delete sequences against a `BTreeMap` model.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{Array, ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use common::*;
use memwal_memtable::{FrozenMemTable, KeyValue, MemTable};
use proptest::prelude::*;

type Key = (i32, String);

#[derive(Debug, Clone)]
enum Op {
    Put(Vec<(Key, i64)>),
    Delete(Vec<Key>),
}

fn key() -> impl Strategy<Value = Key> {
    // A small key space with strings that stress the codec's escaping.
    (
        0..3i32,
        prop_oneof![Just(""), Just("a"), Just("a\0"), Just("\0")],
    )
        .prop_map(|(a, b)| (a, b.to_string()))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => prop::collection::vec((key(), any::<i64>()), 1..5).prop_map(Op::Put),
        1 => prop::collection::vec(key(), 1..3).prop_map(Op::Delete),
    ]
}

fn put_batch(schema: &Arc<Schema>, rows: &[(Key, i64)]) -> RecordBatch {
    let keys: Vec<(i32, &str)> = rows.iter().map(|((a, b), _)| (*a, b.as_str())).collect();
    let vs: Vec<i64> = rows.iter().map(|(_, v)| *v).collect();
    composite_rows(schema, &keys, &vs)
}

fn delete_batch(keys: &[Key]) -> RecordBatch {
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int32, false),
            Field::new("b", DataType::Utf8, false),
        ])),
        vec![
            Arc::new(Int32Array::from(
                keys.iter().map(|k| k.0).collect::<Vec<_>>(),
            )) as ArrayRef,
            Arc::new(StringArray::from(
                keys.iter().map(|k| k.1.as_str()).collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap()
}

/// The rows a flush would leave visible: all physical rows minus
/// `deleted_rows`, tombstones dropped, as key -> value.
fn flushed_view(frozen: &FrozenMemTable) -> BTreeMap<Key, i64> {
    let flush = frozen.flush_data().unwrap();
    let deleted: BTreeSet<u32> = flush.deleted_rows.iter().copied().collect();
    assert_eq!(
        deleted.len(),
        flush.deleted_rows.len(),
        "deleted rows are distinct"
    );
    assert!(flush.deleted_rows.windows(2).all(|w| w[0] < w[1]), "sorted");
    let mut seen = BTreeSet::new();
    let mut out = BTreeMap::new();
    let mut row = 0u32;
    for b in &flush.batches {
        let v = b.column(0).as_primitive::<Int64Type>();
        let kb = b.column(1).as_string::<i32>();
        let ka = b.column(2).as_primitive::<Int32Type>();
        let tomb = b.column(3).as_boolean();
        for i in 0..b.num_rows() {
            if !deleted.contains(&row) {
                let k = (ka.value(i), kb.value(i).to_string());
                assert!(seen.insert(k.clone()), "at most one undeleted row per key");
                if !tomb.value(i) {
                    assert!(v.is_valid(i));
                    out.insert(k, v.value(i));
                }
            }
            row += 1;
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// After any sequence of put/delete batches (duplicates inside a batch
    /// included), `get` for every key in the space and the flush view (rows
    /// minus deleted_rows, tombstones dropped) both equal the model; so does
    /// the visible scan. Breaks on any LWW, tombstone, deletion-set or key
    /// codec collision bug.
    #[test]
    fn memtable_matches_model(ops in prop::collection::vec(op(), 1..12)) {
        let schema = composite_table();
        let mut mt = MemTable::new(table(schema.clone()));
        let mut model: BTreeMap<Key, i64> = BTreeMap::new();
        for op in &ops {
            match op {
                Op::Put(rows) => {
                    mt.insert(&put_batch(&schema, rows)).unwrap();
                    for (k, v) in rows {
                        model.insert(k.clone(), *v);
                    }
                }
                Op::Delete(keys) => {
                    mt.delete(&delete_batch(keys)).unwrap();
                    for k in keys {
                        model.remove(k);
                    }
                }
            }
        }
        let frozen = mt.freeze();
        for a in 0..3 {
            for b in ["", "a", "a\0", "\0"] {
                let got = frozen
                    .get(&[KeyValue::Int32(a), KeyValue::Utf8(b)])
                    .unwrap()
                    .map(|r| int_of(&r, "v"));
                prop_assert_eq!(got, model.get(&(a, b.to_string())).copied());
            }
        }
        prop_assert_eq!(&flushed_view(&frozen), &model);
        let visible: usize = frozen.visible_batches().unwrap().iter().map(RecordBatch::num_rows).sum();
        prop_assert_eq!(visible, model.len());
        // `rows_by_key` is a permutation sorted by encoded key.
        let keys = frozen.flush_data().unwrap().keys.unwrap();
        let mut sorted = keys.rows_by_key.clone();
        sorted.sort_unstable();
        prop_assert_eq!(sorted, (0..frozen.num_rows() as u32).collect::<Vec<_>>());
        let ordered = keys.rows_by_key.windows(2).all(|w| {
            let (x, y) = (keys.encoded.value(w[0] as usize), keys.encoded.value(w[1] as usize));
            x < y || (x == y && w[0] < w[1])
        });
        prop_assert!(ordered, "rows_by_key is ordered by (key, row)");
    }

    /// `get` between the batches (the key index built lazily, a batch at a
    /// time) agrees with the model after every put and delete, and the
    /// flush view still does at the end. Breaks if a lookup's catch-up
    /// misses or repeats a batch.
    #[test]
    fn lookups_between_batches_match_model(ops in prop::collection::vec(op(), 1..12)) {
        let schema = composite_table();
        let mut mt = MemTable::new(table(schema.clone()));
        let mut model: BTreeMap<Key, i64> = BTreeMap::new();
        for op in &ops {
            match op {
                Op::Put(rows) => {
                    mt.insert(&put_batch(&schema, rows)).unwrap();
                    for (k, v) in rows {
                        model.insert(k.clone(), *v);
                    }
                }
                Op::Delete(keys) => {
                    mt.delete(&delete_batch(keys)).unwrap();
                    for k in keys {
                        model.remove(k);
                    }
                }
            }
            for a in 0..3 {
                for b in ["", "a", "a\0", "\0"] {
                    let got = mt
                        .get(&[KeyValue::Int32(a), KeyValue::Utf8(b)])
                        .unwrap()
                        .map(|r| int_of(&r, "v"));
                    prop_assert_eq!(got, model.get(&(a, b.to_string())).copied());
                }
            }
        }
        prop_assert_eq!(&flushed_view(&mt.freeze()), &model);
    }

    /// Same for a single Int64 key over append + delete: `get` equals the
    /// model. Breaks if single-column keys take a different (wrong) path.
    #[test]
    fn single_key_matches_model(ops in prop::collection::vec((0..6i64, any::<i64>(), any::<bool>()), 1..40)) {
        let schema = int_table();
        let mut mt = MemTable::new(table(schema.clone()));
        let mut model = BTreeMap::new();
        for (k, v, del) in ops {
            if del {
                let keys = RecordBatch::try_new(
                    Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)])),
                    vec![Arc::new(Int64Array::from(vec![k])) as ArrayRef],
                ).unwrap();
                mt.delete(&keys).unwrap();
                model.remove(&k);
            } else {
                mt.insert(&int_rows(&schema, &[k], &[v])).unwrap();
                model.insert(k, v);
            }
        }
        for k in 0..6 {
            let got = mt.get(&[KeyValue::Int64(k)]).unwrap().map(|r| int_of(&r, "v"));
            prop_assert_eq!(got, model.get(&k).copied());
        }
    }
}
