//! Upstream lance's LSM readers (`LsmScanner`, `LsmPointLookupPlanner`)
//! reading SSTables we wrote, through plain file paths (lance's own local
//! store, not ours), given the shard's published (generation, path) list.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{Schema, SchemaRef};
use datafusion::common::ScalarValue;
use lance::dataset::mem_wal::scanner::{LsmDataSourceCollector, LsmPointLookupPlanner};
use lance::dataset::mem_wal::{LsmScanner, ShardSnapshot};
use lance_core::utils::bloomfilter::sbbf::Sbbf;
use memwal_memtable::TableSchema;
use memwal_sstable::{WrittenSsTable, BLOOM_FILTER_FILE};

use crate::support::*;

/// The table's columns with their field ids (storage schema minus `_tombstone`).
pub fn identity_schema(schema: &TableSchema) -> SchemaRef {
    let storage = schema.storage_schema();
    let fields: Vec<_> = storage.fields()[..schema.num_columns()].to_vec();
    Arc::new(Schema::new(fields))
}

/// The shard snapshot upstream readers take: our published SSTables.
pub fn snapshot(t: &LocalTable, written: &[&WrittenSsTable]) -> ShardSnapshot {
    let next = written
        .iter()
        .map(|w| w.sstable.generation)
        .max()
        .unwrap_or(0)
        + 1;
    let mut snap = ShardSnapshot::new(t.shard.uuid()).with_current_generation(next);
    for w in written {
        snap = snap.with_sstable(w.sstable.generation, w.sstable.path.clone());
    }
    snap
}

/// Upstream's LSM scan over our SSTables (no base table).
pub async fn upstream_scan(
    t: &LocalTable,
    schema: &TableSchema,
    written: &[&WrittenSsTable],
) -> Vec<RecordBatch> {
    let ids = identity_schema(schema);
    let pk: Vec<String> = schema.key_names().iter().map(|s| s.to_string()).collect();
    let scanner =
        LsmScanner::without_base_table(ids.clone(), t.uri(), vec![snapshot(t, written)], pk)
            .with_identity_schema(ids);
    vec![scanner.try_into_batch().await.unwrap()]
}

/// `(id, v)` pairs of an [`int_schema`] scan, sorted.
fn id_v(batches: &[RecordBatch]) -> BTreeMap<i64, i32> {
    let mut out = BTreeMap::new();
    for b in batches {
        let id = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
        let v = b.column_by_name("v").unwrap().as_primitive::<Int32Type>();
        for i in 0..b.num_rows() {
            assert!(
                out.insert(id.value(i), v.value(i)).is_none(),
                "key {} twice",
                id.value(i)
            );
        }
    }
    out
}

fn del(ids: &[i64]) -> Op {
    Op::Delete(keys_batch(vec![(
        "id",
        Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
    )]))
}

// Breaks if our deletion vector, `_tombstone`, field ids or `_pk_index`
// disagree with what upstream's scanner expects: an older version or a
// deleted key would show up, or the newest be lost. Within one SSTable: ten
// puts of key 7 in ten batches, a delete, one more put: only the last shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_scanner_sees_last_write_wins_within_one_sstable() {
    let t = LocalTable::new();
    let schema = int_schema();
    let mut ops: Vec<Op> = (0..10)
        .map(|v| Op::Put(int_rows(&schema, &[7, 100 + v as i64], v)))
        .collect();
    ops.push(del(&[7, 100]));
    ops.push(Op::Put(int_rows(&schema, &[7], 42)));
    let w = t
        .writer()
        .write(&schema, 1, &flush(&schema, &ops))
        .await
        .unwrap();

    let got = id_v(&upstream_scan(&t, &schema, &[&w]).await);
    let mut want: BTreeMap<i64, i32> = (1..10).map(|v| (100 + v as i64, v)).collect();
    want.insert(7, 42);
    assert_eq!(got, want);
}

// Breaks if generations are not merged newest-wins by upstream over our
// SSTables (cross-generation dedup goes through `_pk_index`): gen 1 has ten
// versions of key 7, gen 2 deletes it, gen 3 puts it once more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_scanner_sees_last_write_wins_across_generations() {
    let t = LocalTable::new();
    let schema = int_schema();
    let g1: Vec<Op> = (0..10)
        .map(|v| Op::Put(int_rows(&schema, &[7, 1, 2], v)))
        .collect();
    let w1 = t
        .writer()
        .write(&schema, 1, &flush(&schema, &g1))
        .await
        .unwrap();
    let w2 = t
        .writer()
        .write(
            &schema,
            2,
            &flush(
                &schema,
                &[del(&[7, 1]), Op::Put(int_rows(&schema, &[3], 20))],
            ),
        )
        .await
        .unwrap();
    let got = id_v(&upstream_scan(&t, &schema, &[&w1, &w2]).await);
    assert_eq!(got, BTreeMap::from([(2, 9), (3, 20)]), "after the delete");

    let w3 = t
        .writer()
        .write(
            &schema,
            3,
            &flush(&schema, &[Op::Put(int_rows(&schema, &[7], 30))]),
        )
        .await
        .unwrap();
    let got = id_v(&upstream_scan(&t, &schema, &[&w1, &w2, &w3]).await);
    assert_eq!(
        got,
        BTreeMap::from([(2, 9), (3, 20), (7, 30)]),
        "after the re-put"
    );
}

fn bloom_of(t: &LocalTable, w: &WrittenSsTable) -> Arc<Sbbf> {
    let bytes = std::fs::read(t.sstable_fs_dir(w).join(BLOOM_FILTER_FILE)).unwrap();
    Arc::new(Sbbf::new(&bytes).unwrap())
}

/// Upstream's point lookup (with our bloom filter installed) of each key.
async fn upstream_lookups(
    t: &LocalTable,
    schema: &TableSchema,
    w: &WrittenSsTable,
    keys: &[Vec<ScalarValue>],
) -> Vec<Option<RecordBatch>> {
    let ids = identity_schema(schema);
    let pk: Vec<String> = schema.key_names().iter().map(|s| s.to_string()).collect();
    let collector = LsmDataSourceCollector::without_base_table(t.uri(), vec![snapshot(t, &[w])]);
    let planner = LsmPointLookupPlanner::new(collector, pk, ids.clone())
        .unwrap()
        .with_identity_schema(ids)
        .with_bloom_filter(w.sstable.generation, bloom_of(t, w));
    let mut out = Vec::new();
    for k in keys {
        out.push(planner.lookup(k, None).await.unwrap());
    }
    out
}

/// Upstream's `_pk_index` membership probe (`LsmScanner::contains_pks`).
async fn upstream_contains(
    t: &LocalTable,
    schema: &TableSchema,
    w: &WrittenSsTable,
    keys: RecordBatch,
) -> Vec<bool> {
    let ids = identity_schema(schema);
    let pk: Vec<String> = schema.key_names().iter().map(|s| s.to_string()).collect();
    LsmScanner::without_base_table(ids.clone(), t.uri(), vec![snapshot(t, &[w])], pk)
        .with_identity_schema(ids)
        .contains_pks(&keys)
        .await
        .unwrap()
}

fn found(results: &[Option<RecordBatch>]) -> Vec<bool> {
    results
        .iter()
        .map(|r| r.as_ref().is_some_and(|b| b.num_rows() == 1))
        .collect()
}

// Breaks if upstream's point lookup (bloom guard over our bloom_filter.bin,
// then the SSTable scan) misses an int64 key we wrote or finds an absent
// one, or if upstream's probe of our `_pk_index` BTree disagrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_point_lookup_and_pk_index_int64() {
    let t = LocalTable::new();
    let schema = int_schema();
    let present: Vec<i64> = (0..300).map(|i| i * 7 - 500).collect();
    let ops: Vec<Op> = present
        .chunks(50)
        .enumerate()
        .map(|(i, c)| Op::Put(int_rows(&schema, c, i as i32)))
        .collect();
    let w = t
        .writer()
        .write(&schema, 4, &flush(&schema, &ops))
        .await
        .unwrap();
    let absent: Vec<i64> = vec![-501, 1, 2, 10_000, i64::MIN, i64::MAX];
    let all: Vec<i64> = present.iter().chain(&absent).copied().collect();
    let keys: Vec<Vec<ScalarValue>> = all
        .iter()
        .map(|k| vec![ScalarValue::Int64(Some(*k))])
        .collect();
    let hits = found(&upstream_lookups(&t, &schema, &w, &keys).await);
    let want: Vec<bool> = all.iter().map(|k| present.contains(k)).collect();
    assert_eq!(hits, want);
    let batch = keys_batch(vec![(
        "id",
        Arc::new(Int64Array::from(all.clone())) as ArrayRef,
    )]);
    assert_eq!(upstream_contains(&t, &schema, &w, batch).await, want);
}

fn utf8_rows(schema: &TableSchema, keys: &[String], n: i64) -> RecordBatch {
    RecordBatch::try_new(
        schema.table_schema().clone(),
        vec![
            Arc::new(StringArray::from(keys.to_vec())) as ArrayRef,
            Arc::new(Int64Array::from(vec![n; keys.len()])),
        ],
    )
    .unwrap()
}

// Breaks like the int64 case, for utf8 keys (including ones with NUL
// bytes, an empty string, and keys that are prefixes of others).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_point_lookup_and_pk_index_utf8() {
    let t = LocalTable::new();
    let schema = utf8_schema();
    let mut present: Vec<String> = (0..200).map(|i| format!("user:{i}")).collect();
    present.extend([
        "".into(),
        "a\0b".into(),
        "a".into(),
        "ab".into(),
        "é✓".into(),
    ]);
    let w = t
        .writer()
        .write(
            &schema,
            1,
            &flush(&schema, &[Op::Put(utf8_rows(&schema, &present, 1))]),
        )
        .await
        .unwrap();
    let absent: Vec<String> = ["user:200", "a\0", "b", "user:1 ", "USER:1"]
        .map(String::from)
        .to_vec();
    let all: Vec<String> = present.iter().chain(&absent).cloned().collect();
    let keys: Vec<Vec<ScalarValue>> = all
        .iter()
        .map(|k| vec![ScalarValue::Utf8(Some(k.clone()))])
        .collect();
    let want: Vec<bool> = all.iter().map(|k| present.contains(k)).collect();
    assert_eq!(found(&upstream_lookups(&t, &schema, &w, &keys).await), want);
    let batch = keys_batch(vec![(
        "k",
        Arc::new(StringArray::from(all.clone())) as ArrayRef,
    )]);
    assert_eq!(upstream_contains(&t, &schema, &w, batch).await, want);
}

// Breaks if a composite key's `_pk_index` values are not upstream's tuple
// encoding (in key order, not column order) or its bloom hash not
// upstream's: lookups would miss or `contains_pks` answer false.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_point_lookup_and_pk_index_composite() {
    let t = LocalTable::new();
    let schema = composite_schema();
    let present: Vec<(String, i64)> = (0..120)
        .map(|i| (format!("t{}", i % 4), i as i64 - 60))
        .collect();
    let batch = RecordBatch::try_new(
        schema.table_schema().clone(),
        vec![
            Arc::new(Int64Array::from(
                present.iter().map(|p| p.1).collect::<Vec<_>>(),
            )) as ArrayRef,
            Arc::new(StringArray::from(
                present.iter().map(|p| p.0.clone()).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(vec![Some("x"); present.len()])),
        ],
    )
    .unwrap();
    let w = t
        .writer()
        .write(
            &schema,
            2,
            &flush(&schema, &[Op::Put(batch.clone()), Op::Put(batch)]),
        )
        .await
        .unwrap();
    assert_eq!(w.visible_rows, 120);
    let absent: Vec<(String, i64)> = vec![("t0".into(), -59), ("t9".into(), 0), ("t1".into(), 61)];
    let all: Vec<(String, i64)> = present.iter().chain(&absent).cloned().collect();
    let keys: Vec<Vec<ScalarValue>> = all
        .iter()
        .map(|(s, i)| {
            vec![
                ScalarValue::Utf8(Some(s.clone())),
                ScalarValue::Int64(Some(*i)),
            ]
        })
        .collect();
    let want: Vec<bool> = all.iter().map(|k| present.contains(k)).collect();
    assert_eq!(found(&upstream_lookups(&t, &schema, &w, &keys).await), want);
    let probe = keys_batch(vec![
        (
            "tenant",
            Arc::new(StringArray::from(
                all.iter().map(|k| k.0.clone()).collect::<Vec<_>>(),
            )) as ArrayRef,
        ),
        (
            "id",
            Arc::new(Int64Array::from(
                all.iter().map(|k| k.1).collect::<Vec<_>>(),
            )),
        ),
    ]);
    assert_eq!(upstream_contains(&t, &schema, &w, probe).await, want);
}

// Breaks if the bloom filter we write for a key type other than
// Int32/Int64/Utf8/Binary does not hold the hash upstream's point lookup
// probes with (fixed-size binary: upstream hashes the value's debug form,
// so our filter must be saturated, not hold the bytes' hash): upstream would
// skip our SSTable and miss a present key. Our own lookup must agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_point_lookup_finds_keys_of_other_types_we_wrote() {
    use arrow_array::{
        BooleanArray, Date32Array, FixedSizeBinaryArray, Int16Array, Int32Array, LargeBinaryArray,
        LargeStringArray, UInt64Array,
    };
    use arrow_schema::DataType;
    use memwal_memtable::KeyValue;
    use memwal_sstable::{Lookup, SsTableReader};

    let fixed = |v: &[&[u8]]| -> ArrayRef {
        Arc::new(FixedSizeBinaryArray::try_from_iter(v.iter().copied()).unwrap())
    };
    type Case = (
        ArrayRef,
        Vec<ScalarValue>,
        Vec<KeyValue<'static>>,
        Vec<ScalarValue>,
        Vec<KeyValue<'static>>,
    );
    let cases: Vec<Case> = vec![
        (
            Arc::new(UInt64Array::from(vec![0, 7, u64::MAX])),
            [0, 7, u64::MAX]
                .map(|v| ScalarValue::UInt64(Some(v)))
                .to_vec(),
            [0, 7, u64::MAX].map(KeyValue::UInt64).to_vec(),
            vec![ScalarValue::UInt64(Some(1))],
            vec![KeyValue::UInt64(1)],
        ),
        (
            Arc::new(Int16Array::from(vec![-3, 300])),
            [-3, 300].map(|v| ScalarValue::Int16(Some(v))).to_vec(),
            [-3, 300].map(KeyValue::Int16).to_vec(),
            vec![ScalarValue::Int16(Some(1))],
            vec![KeyValue::Int16(1)],
        ),
        (
            Arc::new(BooleanArray::from(vec![true])),
            vec![ScalarValue::Boolean(Some(true))],
            vec![KeyValue::Boolean(true)],
            vec![ScalarValue::Boolean(Some(false))],
            vec![KeyValue::Boolean(false)],
        ),
        (
            Arc::new(LargeStringArray::from(vec!["", "a\0b"])),
            ["", "a\0b"]
                .map(|v| ScalarValue::LargeUtf8(Some(v.into())))
                .to_vec(),
            ["", "a\0b"].map(KeyValue::Utf8).to_vec(),
            vec![ScalarValue::LargeUtf8(Some("a".into()))],
            vec![KeyValue::Utf8("a")],
        ),
        (
            Arc::new(LargeBinaryArray::from(vec![b"x".as_slice()])),
            vec![ScalarValue::LargeBinary(Some(b"x".to_vec()))],
            vec![KeyValue::Binary(b"x")],
            vec![ScalarValue::LargeBinary(Some(b"y".to_vec()))],
            vec![KeyValue::Binary(b"y")],
        ),
        (
            fixed(&[b"abcd", b"wxyz"]),
            [b"abcd", b"wxyz"]
                .map(|v| ScalarValue::FixedSizeBinary(4, Some(v.to_vec())))
                .to_vec(),
            [b"abcd".as_slice(), b"wxyz".as_slice()]
                .map(KeyValue::Binary)
                .to_vec(),
            vec![ScalarValue::FixedSizeBinary(4, Some(b"abce".to_vec()))],
            vec![KeyValue::Binary(b"abce")],
        ),
        (
            Arc::new(Date32Array::from(vec![19000, -1])),
            [19000, -1].map(|v| ScalarValue::Date32(Some(v))).to_vec(),
            [19000, -1].map(KeyValue::Date32).to_vec(),
            vec![ScalarValue::Date32(Some(0))],
            vec![KeyValue::Date32(0)],
        ),
    ];
    for (keys, present, ours_present, absent, ours_absent) in cases {
        let key_type: DataType = keys.data_type().clone();
        let t = LocalTable::new();
        let schema = Arc::new(
            TableSchema::new(Arc::new(Schema::new(vec![
                field("k", key_type.clone(), 0, Some(1)),
                field("v", DataType::Int32, 1, None),
            ])))
            .unwrap(),
        );
        let n = keys.len();
        let batch = RecordBatch::try_new(
            schema.table_schema().clone(),
            vec![keys, Arc::new(Int32Array::from_iter_values(0..n as i32))],
        )
        .unwrap();
        let w = t
            .writer()
            .write(&schema, 1, &flush(&schema, &[Op::Put(batch)]))
            .await
            .unwrap();
        let probes: Vec<Vec<ScalarValue>> = present
            .iter()
            .chain(&absent)
            .map(|k| vec![k.clone()])
            .collect();
        let mut want = vec![true; present.len()];
        want.extend(vec![false; absent.len()]);
        assert_eq!(
            found(&upstream_lookups(&t, &schema, &w, &probes).await),
            want,
            "{key_type}"
        );
        let reader = SsTableReader::open_in(t.store.clone(), &t.layout, &w.dir_name, &schema)
            .await
            .unwrap();
        for k in &ours_present {
            assert!(
                matches!(reader.get(&[*k]).await.unwrap(), Lookup::Row(_)),
                "{key_type}: {k:?}"
            );
        }
        for k in &ours_absent {
            assert_eq!(
                reader.get(&[*k]).await.unwrap(),
                Lookup::Absent,
                "{key_type}: {k:?}"
            );
        }
    }
}
