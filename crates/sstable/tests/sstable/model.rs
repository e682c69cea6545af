//! Property test: random puts and deletes, flushed, read back equal a
//! `BTreeMap` model of last-write-wins (by our reader and by upstream's
//! scanner).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use memwal_memtable::KeyValue;
use memwal_sstable::{Lookup, SsTableReader};
use proptest::prelude::*;

use crate::interop::upstream_scan;
use crate::support::*;

#[derive(Debug, Clone)]
enum Step {
    Put(Vec<i64>),
    Delete(Vec<i64>),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => prop::collection::vec(0i64..40, 1..12).prop_map(|mut v| { v.sort(); v.dedup(); Step::Put(v) }),
        1 => prop::collection::vec(0i64..40, 1..6).prop_map(|mut v| { v.sort(); v.dedup(); Step::Delete(v) }),
    ]
}

/// key -> Some(v) for a live key, None for a deleted one (a tombstone the
/// SSTable must keep).
fn model(steps: &[Step]) -> BTreeMap<i64, Option<i32>> {
    let mut m = BTreeMap::new();
    for (i, s) in steps.iter().enumerate() {
        match s {
            Step::Put(keys) => keys.iter().for_each(|k| {
                m.insert(*k, Some(i as i32));
            }),
            Step::Delete(keys) => keys.iter().for_each(|k| {
                m.insert(*k, None);
            }),
        }
    }
    m
}

fn scan_map(batches: &[RecordBatch]) -> BTreeMap<i64, Option<i32>> {
    let mut out = BTreeMap::new();
    for b in batches {
        let id = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
        let v = b.column_by_name("v").unwrap().as_primitive::<Int32Type>();
        let tomb = b
            .column_by_name("_tombstone")
            .map(|c| c.as_boolean().clone());
        for i in 0..b.num_rows() {
            let dead = tomb.as_ref().is_some_and(|t| t.value(i));
            let prev = out.insert(id.value(i), (!dead).then(|| v.value(i)));
            assert!(prev.is_none(), "key {} visible twice", id.value(i));
        }
    }
    out
}

async fn check(steps: Vec<Step>) {
    let t = LocalTable::new();
    let schema = int_schema();
    let ops: Vec<Op> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| match s {
            Step::Put(keys) => Op::Put(int_rows(&schema, keys, i as i32)),
            Step::Delete(keys) => Op::Delete(keys_batch(vec![(
                "id",
                Arc::new(Int64Array::from(keys.clone())) as ArrayRef,
            )])),
        })
        .collect();
    let want = model(&steps);
    let w = t
        .writer()
        .write(&schema, 1, &flush(&schema, &ops))
        .await
        .unwrap();
    assert_eq!(w.visible_rows as usize, want.len());

    let reader = SsTableReader::open_in(t.store.clone(), &t.layout, &w.dir_name, &schema)
        .await
        .unwrap();
    assert_eq!(scan_map(&reader.scan().await.unwrap()), want, "our scan");
    for k in -1..41i64 {
        let got = match reader.get(&[KeyValue::Int64(k)]).await.unwrap() {
            Lookup::Absent => None,
            Lookup::Deleted => Some(None),
            Lookup::Row(b) => Some(Some(
                b.column_by_name("v")
                    .unwrap()
                    .as_primitive::<Int32Type>()
                    .value(0),
            )),
        };
        assert_eq!(got, want.get(&k).copied(), "lookup of {k}");
    }
    let live: BTreeMap<i64, Option<i32>> = want
        .iter()
        .filter(|(_, v)| v.is_some())
        .map(|(k, v)| (*k, *v))
        .collect();
    assert_eq!(
        scan_map(&upstream_scan(&t, &schema, &[&w]).await),
        live,
        "upstream scan"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]
    // Breaks if any put/delete interleaving leaves a flushed SSTable that
    // differs from last-write-wins: an older version visible, a key twice,
    // a tombstone lost (or shown as live), a live key missing, in our scan,
    // our point lookups or upstream's scan.
    #[test]
    fn flushed_sstable_equals_the_lww_model(steps in prop::collection::vec(step(), 1..25)) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(check(steps));
    }
}
