//! The bloom filter: upstream's hash, no false negatives, measured
//! false-positive rate.

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use datafusion::common::ScalarValue;
use lance::dataset::mem_wal::scanner::exec::compute_pk_hash_from_scalars;
use lance_core::utils::bloomfilter::sbbf::Sbbf;
use memwal_memtable::key_codec::bloom_hash;
use memwal_memtable::KeyValue;
use memwal_sstable::{
    BloomSizing, SsTableReader, SsTableWriter, BLOOM_EXPECTED_KEYS, BLOOM_FILTER_FILE, BLOOM_FPP,
};

use crate::support::*;

// Breaks if the memtable's bloom hash (which we insert) differs from the one
// upstream's point lookup probes with: upstream would then skip SSTables
// that hold the key.
#[test]
fn our_bloom_hash_is_upstreams() {
    let cases: Vec<(Vec<KeyValue<'_>>, Vec<ScalarValue>)> = vec![
        (
            vec![KeyValue::Int64(-5)],
            vec![ScalarValue::Int64(Some(-5))],
        ),
        (vec![KeyValue::Int32(7)], vec![ScalarValue::Int32(Some(7))]),
        (
            vec![KeyValue::UInt64(u64::MAX)],
            vec![ScalarValue::UInt64(Some(u64::MAX))],
        ),
        (
            vec![KeyValue::Boolean(true)],
            vec![ScalarValue::Boolean(Some(true))],
        ),
        (
            vec![KeyValue::Utf8("héllo")],
            vec![ScalarValue::Utf8(Some("héllo".into()))],
        ),
        (
            vec![KeyValue::Binary(b"\0\x01")],
            vec![ScalarValue::Binary(Some(vec![0, 1]))],
        ),
        (
            vec![KeyValue::Int16(-2)],
            vec![ScalarValue::Int16(Some(-2))],
        ),
        (vec![KeyValue::UInt8(9)], vec![ScalarValue::UInt8(Some(9))]),
        (
            vec![KeyValue::Utf8("large")],
            vec![ScalarValue::LargeUtf8(Some("large".into()))],
        ),
        (
            vec![KeyValue::Binary(b"large")],
            vec![ScalarValue::LargeBinary(Some(b"large".to_vec()))],
        ),
        (
            vec![KeyValue::Utf8("t1"), KeyValue::Int64(3)],
            vec![
                ScalarValue::Utf8(Some("t1".into())),
                ScalarValue::Int64(Some(3)),
            ],
        ),
    ];
    for (ours, theirs) in cases {
        assert_eq!(
            bloom_hash(&ours).unwrap(),
            compute_pk_hash_from_scalars(&theirs),
            "{ours:?}"
        );
    }
}

async fn write_int_keys(t: &LocalTable, keys: &[i64]) -> Sbbf {
    write_int_keys_with(t, t.writer(), keys).await
}

async fn write_int_keys_with(t: &LocalTable, writer: SsTableWriter, keys: &[i64]) -> Sbbf {
    let schema = int_schema();
    let batch = RecordBatch::try_new(
        schema.table_schema().clone(),
        vec![
            Arc::new(Int64Array::from(keys.to_vec())) as ArrayRef,
            Arc::new(StringArray::from(vec![None::<&str>; keys.len()])),
            Arc::new(arrow_array::Int32Array::from(vec![None; keys.len()])),
        ],
    )
    .unwrap();
    let w = writer
        .write(&schema, 1, &flush(&schema, &[Op::Put(batch)]))
        .await
        .unwrap();
    let bytes = std::fs::read(t.sstable_fs_dir(&w).join(BLOOM_FILTER_FILE)).unwrap();
    let reader = SsTableReader::open_in(t.store.clone(), &t.layout, &w.dir_name, &schema)
        .await
        .unwrap();
    // Our reader and the raw bytes agree on a sample.
    for k in keys.iter().take(100) {
        assert!(reader.might_contain(&[KeyValue::Int64(*k)]));
    }
    Sbbf::new(&bytes).unwrap()
}

fn hash(k: i64) -> u64 {
    compute_pk_hash_from_scalars(&[ScalarValue::Int64(Some(k))])
}

// Breaks if any written key is missing from bloom_filter.bin as upstream
// probes it (a false negative makes upstream's point lookup skip the
// SSTable and lose the row). 100k keys, far above the filter's design size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_false_negatives_over_100k_keys() {
    let t = LocalTable::new();
    let keys: Vec<i64> = (0..100_000).map(|i| i * 31 + 7).collect();
    let filter = write_int_keys(&t, &keys).await;
    let missing = keys
        .iter()
        .filter(|k| !filter.check_hash(hash(**k)))
        .count();
    assert_eq!(missing, 0);
}

// Breaks if the filter is sized or filled differently from upstream's
// (8192 keys at fpp 0.00057): at its design load the measured
// false-positive rate over 100k absent keys must be within 2x of the
// configured rate. Also reports the rate at 100k keys, which upstream's
// fixed sizing makes far worse (informational, not asserted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn false_positive_rate_at_design_load_is_within_2x_of_configured() {
    let t = LocalTable::new();
    let keys: Vec<i64> = (0..BLOOM_EXPECTED_KEYS as i64).collect();
    let filter = write_int_keys(&t, &keys).await;
    let probes = 100_000i64;
    let fp = (0..probes)
        .map(|i| 1_000_000_000 + i)
        .filter(|k| filter.check_hash(hash(*k)))
        .count();
    let rate = fp as f64 / probes as f64;
    eprintln!(
        "bloom fpr at {} keys: {rate:.6} (configured {BLOOM_FPP})",
        keys.len()
    );
    assert!(
        rate <= 2.0 * BLOOM_FPP,
        "false-positive rate {rate} > 2 x {BLOOM_FPP}"
    );

    let big = LocalTable::new();
    let keys: Vec<i64> = (0..100_000).collect();
    let filter = write_int_keys(&big, &keys).await;
    let fp = (0..probes)
        .map(|i| 1_000_000_000 + i)
        .filter(|k| filter.check_hash(hash(*k)))
        .count();
    eprintln!(
        "bloom fpr at 100000 keys (upstream's fixed 32 KiB sizing): {:.4}",
        fp as f64 / probes as f64
    );
}

// Breaks if `with_bloom_sizing` is ignored or mis-sized: a filter sized for
// 100k keys must, at 100k keys, have no false negatives and a measured
// false-positive rate within 2x of its configured rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_sized_for_100k_keys_meets_its_rate_at_100k_keys() {
    let t = LocalTable::new();
    let sizing = BloomSizing {
        expected_keys: 100_000,
        fpp: BLOOM_FPP,
    };
    let keys: Vec<i64> = (0..100_000).map(|i| i * 3).collect();
    let filter = write_int_keys_with(&t, t.writer().with_bloom_sizing(sizing), &keys).await;
    assert!(
        keys.iter().all(|k| filter.check_hash(hash(*k))),
        "false negative"
    );
    let probes = 200_000i64;
    let fp = (0..probes)
        .map(|i| -1 - i)
        .filter(|k| filter.check_hash(hash(*k)))
        .count();
    let rate = fp as f64 / probes as f64;
    eprintln!(
        "bloom fpr at 100000 keys sized for 100000 ({} bytes): {rate:.6}",
        filter.size_bytes()
    );
    assert!(
        rate <= 2.0 * BLOOM_FPP,
        "false-positive rate {rate} > 2 x {BLOOM_FPP}"
    );
}

// Breaks if our reader stops trusting the bloom filter for key types both
// writers hash by value (Int64 here): absent keys would no longer be
// proven absent without an index probe; or if it trusts it for a UInt64
// key, which upstream's writer hashes by its null flag alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bloom_absence_is_trusted_only_for_exact_key_types() {
    let t = LocalTable::new();
    let schema = int_schema();
    let keys: Vec<i64> = (0..100).collect();
    let w = t
        .writer()
        .write(
            &schema,
            1,
            &flush(&schema, &[Op::Put(int_rows(&schema, &keys, 0))]),
        )
        .await
        .unwrap();
    let reader = SsTableReader::open_in(t.store.clone(), &t.layout, &w.dir_name, &schema)
        .await
        .unwrap();
    let proven = (1000..1100)
        .filter(|k| !reader.might_contain(&[KeyValue::Int64(*k)]))
        .count();
    assert!(
        proven >= 90,
        "only {proven} of 100 absent keys proven absent"
    );

    let t = LocalTable::new();
    let schema = Arc::new(
        memwal_memtable::TableSchema::new(Arc::new(arrow_schema::Schema::new(vec![field(
            "k",
            arrow_schema::DataType::UInt64,
            0,
            Some(1),
        )])))
        .unwrap(),
    );
    let batch = RecordBatch::try_new(
        schema.table_schema().clone(),
        vec![Arc::new(arrow_array::UInt64Array::from_iter_values(0..100)) as ArrayRef],
    )
    .unwrap();
    let w = t
        .writer()
        .write(&schema, 1, &flush(&schema, &[Op::Put(batch)]))
        .await
        .unwrap();
    let reader = SsTableReader::open_in(t.store.clone(), &t.layout, &w.dir_name, &schema)
        .await
        .unwrap();
    assert!((1000..1100).all(|k| reader.might_contain(&[KeyValue::UInt64(k)])));
}
