//! The key index is built by lookups, not by inserts.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::*;
use memwal_memtable::{KeyValue, MemTable};

/// Inserting rows into a keyed memtable grows no per-row index: 200,000
/// rows in 100 batches leave the memtable's own structures at a few KiB (a
/// per-insert key index would hold at least an encoded key, an offset and
/// a hash slot per row: several MB). The first lookup then indexes every
/// row and answers exactly. Breaks if inserts index their keys again.
#[test]
fn inserts_build_no_key_index_until_a_lookup() {
    let schema = int_table();
    let mut mt = MemTable::new(table(schema.clone()));
    let per_batch = 2_000i64;
    for b in 0..100i64 {
        let ids: Vec<i64> = (0..per_batch)
            .map(|i| (b * per_batch + i) % 150_000)
            .collect();
        let vs: Vec<i64> = (0..per_batch).map(|i| b * per_batch + i).collect();
        mt.insert(&int_rows(&schema, &ids, &vs)).unwrap();
    }
    let before = mt.memory_usage().index_bytes;
    assert!(
        before < 64 * 1024,
        "200,000 inserted rows cost {before} bytes of index before any lookup"
    );
    // Key 10 was written at rows 10 and 150,010: the later wins.
    let row = mt.get(&[KeyValue::Int64(10)]).unwrap().unwrap();
    assert_eq!(int_of(&row, "v"), 150_010);
    assert_eq!(mt.num_keys().unwrap(), Some(150_000));
    let after = mt.memory_usage().index_bytes;
    assert!(
        after > before + 200_000 * 4,
        "a lookup builds the index and its memory is counted ({before} -> {after})"
    );
}

/// Lookups between inserts see exactly the rows inserted before them: the
/// index catches up with each batch added since the previous lookup, and
/// a frozen memtable looked up from several threads at once answers the
/// same. Breaks if a catch-up skips, repeats or reorders batches.
#[test]
fn lookups_between_inserts_catch_up_with_every_batch() {
    let schema = int_table();
    let mut mt = MemTable::new(table(schema.clone()));
    for round in 0..50i64 {
        mt.insert(&int_rows(
            &schema,
            &[round % 7, 100 + round],
            &[round, round],
        ))
        .unwrap();
        if round % 3 == 0 {
            mt.delete(&int_rows(&schema, &[(round + 1) % 7], &[0]))
                .unwrap();
        }
        let got = mt.get(&[KeyValue::Int64(round % 7)]).unwrap().unwrap();
        assert_eq!(int_of(&got, "v"), round);
        assert!(mt.get(&[KeyValue::Int64(100 + round)]).unwrap().is_some());
        if round % 3 == 0 {
            assert!(mt
                .get(&[KeyValue::Int64((round + 1) % 7)])
                .unwrap()
                .is_none());
        }
    }
    // Not yet indexed when the threads start: they race to catch up.
    let late: Vec<i64> = (150..160).collect();
    mt.insert(&int_rows(&schema, &late, &late)).unwrap();
    let frozen = mt.freeze();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for k in 100..150 {
                    let got = frozen.get(&[KeyValue::Int64(k)]).unwrap().unwrap();
                    assert_eq!(int_of(&got, "v"), k - 100);
                }
                for k in 150..160 {
                    let got = frozen.get(&[KeyValue::Int64(k)]).unwrap().unwrap();
                    assert_eq!(int_of(&got, "v"), k);
                }
            });
        }
    });
}
