//! Behaviour of `MemTable`: last write wins, deletes, validation errors,
//! append-only tables, storage-form input and the flush drain.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{
    Array, ArrayRef, BooleanArray, Int32Array, Int64Array, RecordBatch, StringArray,
};
use arrow_schema::{DataType, Field, Fields, Schema};
use common::*;
use memwal_memtable::key_codec::encoded_key;
use memwal_memtable::{
    KeyValue, MemTable, MemTableError, TableSchema, FIELD_ID_KEY, PRIMARY_KEY_KEY, TOMBSTONE_COLUMN,
};

fn key_batch(ids: &[i64]) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(ids.to_vec()))]).unwrap()
}

/// Ten puts of key 7 across batches, a delete, then a final put: only the
/// last put is visible and the deletion set hides exactly the older rows.
/// Breaks if the index keeps the oldest row instead of the newest, if a
/// tombstone is not treated as a delete, or if superseded rows are missed
/// or over-reported (e.g. the untouched key 8 or the newest row).
#[test]
fn last_write_wins_across_batches_and_deletes() {
    let schema = int_table();
    let mut mt = MemTable::new(table(schema.clone()));
    // Row 0: key 7 (put #0), row 1: key 8.
    mt.insert(&int_rows(&schema, &[7, 8], &[0, 800])).unwrap();
    // Rows 2..=10: puts #1..#9 of key 7.
    for v in 1..10 {
        mt.insert(&int_rows(&schema, &[7], &[v])).unwrap();
    }
    assert_eq!(
        int_of(&mt.get(&[KeyValue::Int64(7)]).unwrap().unwrap(), "v"),
        9
    );
    // Row 11: tombstone.
    assert_eq!(mt.delete(&key_batch(&[7])).unwrap(), 11..12);
    assert!(mt.get(&[KeyValue::Int64(7)]).unwrap().is_none());
    // Row 12: the final put.
    mt.insert(&int_rows(&schema, &[7], &[100])).unwrap();

    let frozen = mt.freeze();
    assert_eq!(
        int_of(&frozen.get(&[KeyValue::Int64(7)]).unwrap().unwrap(), "v"),
        100
    );
    assert_eq!(
        int_of(&frozen.get(&[KeyValue::Int64(8)]).unwrap().unwrap(), "v"),
        800
    );
    assert!(frozen.get(&[KeyValue::Int64(9)]).unwrap().is_none());
    assert_eq!(frozen.num_rows(), 13);
    assert_eq!(frozen.num_tombstones(), 1);
    assert_eq!(frozen.num_keys().unwrap(), Some(2));

    let flush = frozen.flush_data().unwrap();
    let mut expected: Vec<u32> = vec![0];
    expected.extend(2..=11);
    assert_eq!(flush.deleted_rows, expected);
    assert_eq!(flush.stats.physical_rows, 13);
    assert_eq!(
        flush
            .batches
            .iter()
            .map(RecordBatch::num_rows)
            .sum::<usize>(),
        13
    );
    let keys = flush.keys.expect("keyed table has flush keys");
    assert_eq!(keys.encoded.len(), 13);
    assert_eq!(keys.encoded.value(1), encoded_key(&[KeyValue::Int64(8)]));
    // Key 7 (rows 0,2..=12 ascending) sorts before key 8 (row 1).
    let mut by_key: Vec<u32> = vec![0];
    by_key.extend(2..=12);
    by_key.push(1);
    assert_eq!(keys.rows_by_key, by_key);
    // Visible scan: key 8 then the final put of key 7, in insert order.
    let visible = frozen.visible_batches().unwrap();
    let ids: Vec<i64> = visible
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    assert_eq!(ids, vec![8, 7]);
}

/// Duplicates inside one batch: the later row wins. Breaks if a batch is
/// indexed as a whole (first row wins) instead of row by row.
#[test]
fn later_row_of_one_batch_wins() {
    let schema = int_table();
    let mut mt = MemTable::new(table(schema.clone()));
    mt.insert(&int_rows(&schema, &[1, 1, 2, 1], &[10, 11, 20, 12]))
        .unwrap();
    assert_eq!(
        int_of(&mt.get(&[KeyValue::Int64(1)]).unwrap().unwrap(), "v"),
        12
    );
    assert_eq!(mt.freeze().flush_data().unwrap().deleted_rows, vec![0, 1]);
}

/// Composite keys `(a: Int32, b: Utf8)` declared with positions in reverse
/// column order: lookups take values in key (position) order, and keys that
/// share one component stay distinct. Breaks if key order follows column
/// order, or if the tuple encoding lets ("1","x") collide with others.
#[test]
fn composite_keys_are_distinct_and_ordered_by_position() {
    let schema = composite_table();
    let ts = table(schema.clone());
    assert_eq!(ts.key_names(), vec!["a", "b"]);
    let mut mt = MemTable::new(ts);
    mt.insert(&composite_rows(
        &schema,
        &[(1, "x"), (1, "y"), (2, "x"), (1, "x\0"), (1, "")],
        &[1, 2, 3, 4, 5],
    ))
    .unwrap();
    mt.insert(&composite_rows(&schema, &[(1, "x")], &[6]))
        .unwrap();
    let get = |mt: &MemTable, a: i32, b: &str| {
        mt.get(&[KeyValue::Int32(a), KeyValue::Utf8(b)])
            .unwrap()
            .map(|r| int_of(&r, "v"))
    };
    assert_eq!(get(&mt, 1, "x"), Some(6));
    assert_eq!(get(&mt, 1, "y"), Some(2));
    assert_eq!(get(&mt, 2, "x"), Some(3));
    assert_eq!(get(&mt, 1, "x\0"), Some(4));
    assert_eq!(get(&mt, 1, ""), Some(5));
    assert_eq!(get(&mt, 2, "y"), None);
    assert_eq!(mt.num_keys().unwrap(), Some(5));
    // Deleting by a batch carrying the key columns in any order.
    let keys = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("b", DataType::Utf8, false),
            Field::new("a", DataType::Int32, false),
        ])),
        vec![
            Arc::new(StringArray::from(vec!["y"])) as ArrayRef,
            Arc::new(Int32Array::from(vec![1])),
        ],
    )
    .unwrap();
    mt.delete(&keys).unwrap();
    assert_eq!(get(&mt, 1, "y"), None);
    assert_eq!(get(&mt, 1, "x"), Some(6));
    let flush = mt.freeze().flush_data().unwrap();
    assert_eq!(flush.deleted_rows, vec![0, 1]);
    // Key column payload: Int32 (4 B) + Utf8 (offsets 4 B + bytes) per row.
    assert!(flush.stats.primary_key_bytes.unwrap() > 7 * 8);
}

/// A null key value is refused naming the column and the first null row,
/// and nothing of the batch is stored. Breaks if nulls are accepted (they
/// would all collapse to one key) or the error points elsewhere.
#[test]
fn null_keys_are_rejected_with_column_and_row() {
    let schema = composite_table();
    let mut mt = MemTable::new(table(schema.clone()));
    let nullable = Arc::new(Schema::new(vec![
        Field::new("v", DataType::Int64, true),
        Field::new("b", DataType::Utf8, true),
        Field::new("a", DataType::Int32, true),
    ]));
    let batch = RecordBatch::try_new(
        nullable,
        vec![
            Arc::new(Int64Array::from(vec![1, 2, 3])) as ArrayRef,
            Arc::new(StringArray::from(vec![Some("x"), Some("y"), None])),
            Arc::new(Int32Array::from(vec![Some(1), Some(2), Some(3)])),
        ],
    )
    .unwrap();
    assert_eq!(
        mt.insert(&batch).unwrap_err(),
        MemTableError::NullKey {
            column: "b".into(),
            row: 2
        }
    );
    assert!(mt.is_empty());
}

/// Non-nullable non-key columns refuse nulls in user batches, naming the
/// column and row. Breaks if the table's nullability is not enforced at put.
#[test]
fn null_in_non_nullable_column_is_rejected() {
    let schema = int_table();
    let mut mt = MemTable::new(table(schema.clone()));
    let loose = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("v", DataType::Int64, true),
    ]));
    let batch = RecordBatch::try_new(
        loose,
        vec![
            Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef,
            Arc::new(StringArray::from(vec!["a", "b"])),
            Arc::new(Int64Array::from(vec![Some(1), None])),
        ],
    )
    .unwrap();
    assert_eq!(
        mt.insert(&batch).unwrap_err(),
        MemTableError::NullValue {
            column: "v".into(),
            row: 1
        }
    );
}

/// Wrong column set, order or type is refused with a reason naming the
/// column. Breaks if batches are matched loosely (by position only, or
/// without type checks).
#[test]
fn schema_mismatches_are_rejected() {
    let schema = int_table();
    let mut mt = MemTable::new(table(schema.clone()));
    let mut reason = |batch: RecordBatch| match mt.insert(&batch).unwrap_err() {
        MemTableError::SchemaMismatch { reason } => reason,
        other => panic!("expected SchemaMismatch, got {other:?}"),
    };
    let col_i64 = || Arc::new(Int64Array::from(vec![1])) as ArrayRef;
    let col_str = || Arc::new(StringArray::from(vec!["a"])) as ArrayRef;
    // Wrong type for `v`.
    let wrong_type = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("v", DataType::Utf8, false),
        ])),
        vec![col_i64(), col_str(), col_str()],
    )
    .unwrap();
    assert!(reason(wrong_type).contains("`v`"));
    // Swapped order.
    let swapped = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ])),
        vec![col_i64(), col_i64(), col_str()],
    )
    .unwrap();
    assert!(reason(swapped).contains("`v`"));
    // Missing column.
    let missing = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ])),
        vec![col_i64(), col_str()],
    )
    .unwrap();
    assert!(reason(missing).contains("2 columns"));
    assert!(mt.is_empty());
}

/// Empty batches are refused for puts and deletes. Breaks if a zero-row
/// batch slips into the store (an SSTable would get an empty batch).
#[test]
fn empty_batches_are_rejected() {
    let schema = int_table();
    let mut mt = MemTable::new(table(schema.clone()));
    assert_eq!(
        mt.insert(&int_rows(&schema, &[], &[])).unwrap_err(),
        MemTableError::EmptyBatch
    );
    assert_eq!(
        mt.delete(&key_batch(&[])).unwrap_err(),
        MemTableError::EmptyBatch
    );
    assert!(mt.is_empty());
    // The replay conversion refuses them too, in both input shapes.
    let ts = table(schema.clone());
    let empty_storage = RecordBatch::new_empty(ts.storage_schema().clone());
    for batch in [int_rows(&schema, &[], &[]), empty_storage] {
        assert_eq!(
            ts.to_storage_for_replay(&batch).unwrap_err(),
            MemTableError::EmptyBatch
        );
    }
}

/// A table without a primary key keeps every row, has no deletion set and
/// no key statistics; key operations are refused. Breaks if append-only
/// tables are deduplicated or report key bytes.
#[test]
fn append_only_tables_keep_every_row() {
    let schema = append_table();
    let ts = table(schema.clone());
    assert!(!ts.has_primary_key());
    let mut mt = MemTable::new(ts);
    mt.insert(&int_rows(&schema, &[1, 1, 1], &[1, 2, 3]))
        .unwrap();
    mt.insert(&int_rows(&schema, &[1], &[4])).unwrap();
    assert_eq!(mt.num_rows(), 4);
    assert_eq!(mt.num_keys().unwrap(), None);
    assert!(matches!(
        mt.get(&[KeyValue::Int64(1)]),
        Err(MemTableError::NoPrimaryKey { .. })
    ));
    assert!(matches!(
        mt.delete(&key_batch(&[1])),
        Err(MemTableError::NoPrimaryKey { .. })
    ));
    let frozen = mt.freeze();
    let visible: usize = frozen
        .visible_batches()
        .unwrap()
        .iter()
        .map(RecordBatch::num_rows)
        .sum();
    assert_eq!(visible, 4);
    let flush = frozen.flush_data().unwrap();
    assert!(flush.deleted_rows.is_empty());
    assert!(flush.keys.is_none());
    assert_eq!(flush.stats.primary_key_bytes, None);
    assert_eq!(flush.stats.physical_rows, 4);
}

/// The storage schema: field ids on every table column, non-key columns
/// nullable, key metadata kept, `_tombstone` last (non-null, no id). Breaks
/// if any of these properties of docs/memwal-format.md's storage schema is lost.
#[test]
fn storage_schema_shape() {
    let ts = table(int_table());
    let s = ts.storage_schema();
    let names: Vec<&str> = s.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, vec!["id", "name", "v", TOMBSTONE_COLUMN]);
    for (i, f) in s.fields().iter().take(3).enumerate() {
        assert_eq!(f.metadata().get(FIELD_ID_KEY), Some(&i.to_string()));
    }
    assert!(!s.field(0).is_nullable());
    assert_eq!(
        s.field(0)
            .metadata()
            .get(PRIMARY_KEY_KEY)
            .map(String::as_str),
        Some("true")
    );
    assert!(s.field(2).is_nullable(), "non-key columns become nullable");
    let t = s.field(3);
    assert_eq!(t.data_type(), &DataType::Boolean);
    assert!(!t.is_nullable());
    assert!(t.metadata().get(FIELD_ID_KEY).is_none());
    // A user batch becomes storage form with `_tombstone` = false, reusing
    // the caller's arrays.
    let batch = int_rows(&int_table(), &[1, 2], &[3, 4]);
    let stored = ts.to_storage(&batch).unwrap();
    assert!(Arc::ptr_eq(stored.column(1), batch.column(1)));
    assert_eq!(stored.column(3).as_boolean().true_count(), 0);
}

/// Key order and field ids follow Lance: positioned keys first by
/// position, then unpositioned ones by field id; without `lance:field_id`
/// ids are assigned in depth-first pre-order (0..n for flat schemas); a
/// schema with only some ids, a nullable key or a float key is refused. Breaks if composite key order or
/// id assignment diverges from upstream (keys would encode differently).
#[test]
fn key_order_and_field_ids_follow_lance() {
    let with_id = |f: Field, id: i32| {
        let mut md = f.metadata().clone();
        md.insert(FIELD_ID_KEY.into(), id.to_string());
        f.with_metadata(md)
    };
    let schema = Arc::new(Schema::new(vec![
        with_id(pk_at("a", DataType::Int64, 2), 0),
        with_id(pk_at("b", DataType::Int64, 1), 1),
        with_id(pk("c", DataType::Int64), 5),
        with_id(pk("d", DataType::Int64), 3),
        with_id(Field::new("e", DataType::Int64, true), 4),
    ]));
    let ts = TableSchema::new(schema).unwrap();
    assert_eq!(ts.key_names(), vec!["b", "a", "d", "c"]);
    assert_eq!(ts.field_ids(), &[0, 1, 5, 3, 4]);

    let nested = Arc::new(Schema::new(vec![
        Field::new("x", DataType::Int64, false),
        Field::new(
            "s",
            DataType::Struct(Fields::from(vec![
                Field::new("p", DataType::Int64, true),
                Field::new("q", DataType::Utf8, true),
            ])),
            true,
        ),
        Field::new("y", DataType::Int64, true),
    ]));
    let ts = TableSchema::new(nested).unwrap();
    assert_eq!(ts.field_ids(), &[0, 1, 4]);
    let DataType::Struct(children) = ts.storage_schema().field(1).data_type() else {
        panic!("struct expected")
    };
    assert_eq!(children[1].metadata().get(FIELD_ID_KEY), Some(&"3".into()));

    let mixed = Arc::new(Schema::new(vec![
        with_id(Field::new("x", DataType::Int64, false), 0),
        Field::new("y", DataType::Int64, false),
    ]));
    assert!(matches!(
        TableSchema::new(mixed),
        Err(MemTableError::InvalidSchema { .. })
    ));
    let nullable_key = Arc::new(Schema::new(vec![
        pk("k", DataType::Int64).with_nullable(true)
    ]));
    assert!(matches!(
        TableSchema::new(nullable_key),
        Err(MemTableError::InvalidSchema { .. })
    ));
    let bad_key = Arc::new(Schema::new(vec![pk("f", DataType::Float64)]));
    assert!(matches!(
        TableSchema::new(bad_key),
        Err(MemTableError::UnsupportedKeyType { .. })
    ));
}

fn with_id(name: &str, dt: DataType, nullable: bool, id: i32) -> Field {
    Field::new(name, dt, nullable)
        .with_metadata(HashMap::from([(FIELD_ID_KEY.to_string(), id.to_string())]))
}

/// A storage-form batch read back from the WAL is matched by field id, not
/// by name or position: renamed and reordered columns land in the right
/// place, a column unknown to the batch is null-filled, an id on
/// `_tombstone` is ignored, and a missing key column is refused. Breaks if
/// replayed batches are matched by name or position.
#[test]
fn replayed_batches_match_columns_by_field_id() {
    let ts = table(int_table());
    let mut mt = MemTable::new(ts.clone());
    // `v` (id 2) renamed to `value` and first; `name` (id 1) absent; an
    // unknown column with id 9; `_tombstone` carrying a stray id 1.
    let schema = Arc::new(Schema::new(vec![
        with_id("value", DataType::Int64, true, 2),
        with_id("zzz", DataType::Int64, true, 9),
        with_id("id", DataType::Int64, false, 0),
        with_id(TOMBSTONE_COLUMN, DataType::Boolean, false, 1),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from(vec![10, 20])) as ArrayRef,
            Arc::new(Int64Array::from(vec![0, 0])),
            Arc::new(Int64Array::from(vec![1, 2])),
            Arc::new(BooleanArray::from(vec![false, true])),
        ],
    )
    .unwrap();
    let storage = ts.to_storage_for_replay(&batch).unwrap();
    assert!(Arc::ptr_eq(&storage.schema(), ts.storage_schema()));
    mt.insert(&storage).unwrap();
    let row = mt.get(&[KeyValue::Int64(1)]).unwrap().unwrap();
    assert_eq!(row.schema(), *ts.storage_schema());
    assert_eq!(int_of(&row, "v"), 10);
    assert!(row.column(1).is_null(0));
    assert!(
        mt.get(&[KeyValue::Int64(2)]).unwrap().is_none(),
        "row 2 is a tombstone"
    );

    // Without the key column (id 0) the batch is refused.
    let no_key = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            with_id("v", DataType::Int64, true, 2),
            Field::new(TOMBSTONE_COLUMN, DataType::Boolean, false),
        ])),
        vec![
            Arc::new(Int64Array::from(vec![1])) as ArrayRef,
            Arc::new(BooleanArray::from(vec![false])),
        ],
    )
    .unwrap();
    let missing_key = MemTableError::MissingKeyColumn {
        column: "id".into(),
    };
    assert_eq!(ts.to_storage_for_replay(&no_key).unwrap_err(), missing_key);
    assert_eq!(ts.to_storage(&no_key).unwrap_err(), missing_key);
}

/// A storage-form batch offered for writing (`to_storage`, `insert`) must
/// carry every table column and nothing else: renamed and reordered
/// columns are matched by field id, but a column whose field id (or, without
/// one, name) matches no table column, a second column for the same table
/// column and a missing non-key column are refused with `SchemaMismatch`
/// naming the column, where the replay conversion drops resp. null-fills.
/// Breaks if a user put can silently lose or invent a column's values.
#[test]
fn written_storage_batches_must_cover_the_table_exactly() {
    let ts = table(int_table());
    let reason = |r: memwal_memtable::Result<RecordBatch>| match r {
        Err(MemTableError::SchemaMismatch { reason }) => reason,
        other => panic!("expected SchemaMismatch, got {other:?}"),
    };
    let ids = || Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef;
    let names = || Arc::new(StringArray::from(vec!["a", "b"])) as ArrayRef;
    let vs = || Arc::new(Int64Array::from(vec![10, 20])) as ArrayRef;
    let live = || Arc::new(BooleanArray::from(vec![false, false])) as ArrayRef;
    let tombstone = Field::new(TOMBSTONE_COLUMN, DataType::Boolean, false);

    // Every column present, renamed and reordered: accepted, by field id.
    let exact = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            with_id("value", DataType::Int64, true, 2),
            tombstone.clone(),
            with_id("key", DataType::Int64, false, 0),
            with_id("label", DataType::Utf8, true, 1),
        ])),
        vec![vs(), live(), ids(), names()],
    )
    .unwrap();
    let stored = ts.to_storage(&exact).unwrap();
    assert!(Arc::ptr_eq(stored.column(2), exact.column(0)));
    assert!(Arc::ptr_eq(stored.column(1), exact.column(3)));

    // `v` written under field id 7, which no table column has.
    let unknown_id = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            with_id("id", DataType::Int64, false, 0),
            with_id("name", DataType::Utf8, true, 1),
            with_id("v", DataType::Int64, true, 7),
            tombstone.clone(),
        ])),
        vec![ids(), names(), vs(), live()],
    )
    .unwrap();
    let r = reason(ts.to_storage(&unknown_id));
    assert!(r.contains("`v` (field id 7)"), "{r}");
    let mut mt = MemTable::new(ts.clone());
    assert!(matches!(
        mt.insert(&unknown_id),
        Err(MemTableError::SchemaMismatch { .. })
    ));
    assert!(mt.is_empty());
    // Replay drops the unknown column (and so has no `v`: null-filled).
    let replayed = ts.to_storage_for_replay(&unknown_id).unwrap();
    assert_eq!(replayed.num_columns(), 4);
    assert!(Arc::ptr_eq(replayed.column(1), unknown_id.column(1)));
    assert_eq!(replayed.column(2).null_count(), 2);

    // An extra column without a field id whose name is no table column's.
    let extra = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("v", DataType::Int64, true),
            Field::new("extra", DataType::Int64, true),
            tombstone.clone(),
        ])),
        vec![ids(), names(), vs(), vs(), live()],
    )
    .unwrap();
    let r = reason(ts.to_storage(&extra));
    assert!(r.contains("`extra` (no field id)"), "{r}");
    assert_eq!(ts.to_storage_for_replay(&extra).unwrap().num_columns(), 4);

    // Two columns for field id 2: the second matches nothing.
    let duplicate = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            with_id("id", DataType::Int64, false, 0),
            with_id("name", DataType::Utf8, true, 1),
            with_id("v", DataType::Int64, true, 2),
            with_id("v2", DataType::Int64, true, 2),
            tombstone.clone(),
        ])),
        vec![ids(), names(), vs(), vs(), live()],
    )
    .unwrap();
    let r = reason(ts.to_storage(&duplicate));
    assert!(r.contains("`v2` (field id 2)"), "{r}");

    // `name` (field id 1) missing.
    let missing = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            with_id("id", DataType::Int64, false, 0),
            with_id("v", DataType::Int64, true, 2),
            tombstone.clone(),
        ])),
        vec![ids(), vs(), live()],
    )
    .unwrap();
    let r = reason(ts.to_storage(&missing));
    assert!(r.contains("`name` (field id 1)"), "{r}");
    assert!(matches!(
        mt.insert(&missing),
        Err(MemTableError::SchemaMismatch { .. })
    ));
    assert!(mt.is_empty());
    // Replay null-fills it.
    let replayed = ts.to_storage_for_replay(&missing).unwrap();
    assert_eq!(replayed.column(1).null_count(), 2);
    assert!(Arc::ptr_eq(replayed.column(2), missing.column(1)));
}

/// A WAL batch without `_tombstone` is replayed as puts, its columns
/// matched by field id like any other replayed batch. Breaks if replay
/// treats such a batch as a positional user batch or as deletes.
#[test]
fn replayed_batches_without_tombstone_are_puts() {
    let ts = table(int_table());
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            with_id("value", DataType::Int64, true, 2),
            with_id("id", DataType::Int64, false, 0),
        ])),
        vec![
            Arc::new(Int64Array::from(vec![10])) as ArrayRef,
            Arc::new(Int64Array::from(vec![1])),
        ],
    )
    .unwrap();
    let stored = ts.to_storage_for_replay(&batch).unwrap();
    assert_eq!(int_of(&stored, "v"), 10);
    assert_eq!(stored.column(1).null_count(), 1);
    assert_eq!(stored.column(3).as_boolean().true_count(), 0);
    assert!(matches!(
        ts.to_storage(&batch),
        Err(MemTableError::SchemaMismatch { .. })
    ));
}

/// A batch survives an Arrow IPC round trip (the WAL's format) and is
/// accepted as storage input with identical content. Breaks if the storage
/// schema's metadata does not survive IPC or replay input is rejected.
#[test]
fn storage_batches_round_trip_through_ipc() {
    let schema = int_table();
    let ts = table(schema.clone());
    let stored = ts
        .to_storage(&int_rows(&schema, &[5, 6], &[50, 60]))
        .unwrap();
    let mut buf = Vec::new();
    {
        let mut w = arrow_ipc::writer::StreamWriter::try_new(&mut buf, &stored.schema()).unwrap();
        w.write(&stored).unwrap();
        w.finish().unwrap();
    }
    let read: Vec<RecordBatch> = arrow_ipc::reader::StreamReader::try_new(&buf[..], None)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut mt = MemTable::new(ts);
    mt.insert(&read[0]).unwrap();
    assert_eq!(mt.batches()[0], stored);
}

/// `get_encoded` with the tuple encoding agrees with `get`, and the wrong
/// number of key values is refused. Breaks if the index keys differ from
/// the public codec (the SSTable writer relies on it).
#[test]
fn encoded_lookup_matches_codec() {
    let schema = composite_table();
    let mut mt = MemTable::new(table(schema.clone()));
    mt.insert(&composite_rows(&schema, &[(3, "k")], &[33]))
        .unwrap();
    let enc = encoded_key(&[KeyValue::Int32(3), KeyValue::Utf8("k")]);
    assert_eq!(int_of(&mt.get_encoded(&enc).unwrap().unwrap(), "v"), 33);
    assert_eq!(
        mt.get(&[KeyValue::Int32(3)]).unwrap_err(),
        MemTableError::KeyArity {
            given: 1,
            expected: 2
        }
    );
}

/// A frozen memtable is shareable and answers like the active one; its
/// flush stats' payload equals the memory accounting's payload. Breaks if
/// freezing loses rows or the stats use a different measure.
#[test]
fn frozen_memtable_reads_and_stats() {
    let schema = int_table();
    let mut mt = MemTable::new(table(schema.clone()));
    mt.insert(&int_rows(&schema, &[1, 2, 3], &[1, 2, 3]))
        .unwrap();
    let usage = mt.memory_usage();
    let frozen = mt.freeze();
    let other = frozen.clone();
    assert!(other.ptr_eq(&frozen));
    assert_eq!(
        int_of(&other.get(&[KeyValue::Int64(2)]).unwrap().unwrap(), "v"),
        2
    );
    let flush = frozen.flush_data().unwrap();
    assert_eq!(flush.stats.in_memory_bytes, usage.payload_bytes as u64);
    // id column: 3 * 8 bytes of values.
    assert_eq!(flush.stats.primary_key_bytes, Some(24));
}

/// The flush's per-row bloom hashes are the key codec's hash of each
/// physical row (tombstones included), and frozen memtables can be shared
/// across threads. Breaks if hashes skip rows, follow another column
/// order, or the frozen state stops being `Send + Sync`.
#[test]
fn bloom_hashes_cover_every_physical_row() {
    fn shareable<T: Send + Sync + Clone>(_: &T) {}
    let schema = int_table();
    let mut mt = MemTable::new(table(schema.clone()));
    mt.insert(&int_rows(&schema, &[4, 5], &[1, 2])).unwrap();
    mt.delete(&key_batch(&[4])).unwrap();
    let frozen = mt.freeze();
    shareable(&frozen);
    let hashes = frozen.bloom_hashes().unwrap().unwrap();
    let expect: Vec<u64> = [4i64, 5, 4]
        .iter()
        .map(|&k| memwal_memtable::key_codec::bloom_hash(&[KeyValue::Int64(k)]).unwrap())
        .collect();
    assert_eq!(hashes, expect);
    let append = MemTable::new(table(append_table())).freeze();
    assert_eq!(append.bloom_hashes().unwrap(), None);
}
