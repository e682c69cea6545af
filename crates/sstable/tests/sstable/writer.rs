//! The SSTable as written: directory name, dataset shape, field ids,
//! deletion vector, sidecars, manifest entry; and our own reader.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int64Array};
use lance::dataset::Dataset;
use memwal_memtable::KeyValue;
use memwal_sstable::{Lookup, SsTableReader, BLOOM_FILTER_FILE, PK_INDEX_DIR};

use crate::support::*;

// Breaks if the directory name is not `{8 hex}_gen_{g}`, the manifest entry
// misreports rows/sizes, the dataset is not version 1 with one fragment,
// field ids are renumbered (3, 7, 11 would become 0, 1, 2), `_tombstone` is
// missing or numbered inside the table's range, the deletion vector is
// missing or wrong (visible rows != distinct keys), or a sidecar is missing.
// Read with plain upstream lance from the file path, not through our store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_one_fragment_with_table_field_ids_and_a_deletion_vector() {
    let t = LocalTable::new();
    let schema = int_schema();
    let data = flush(
        &schema,
        &[
            Op::Put(int_rows(&schema, &[1, 2, 3], 0)),
            Op::Put(int_rows(&schema, &[2, 3], 1)),
            Op::Delete(keys_batch(vec![(
                "id",
                Arc::new(Int64Array::from(vec![3])) as ArrayRef,
            )])),
        ],
    );
    let written = t.writer().write(&schema, 5, &data).await.unwrap();

    let (hex, gen) = written.dir_name.split_once("_gen_").unwrap();
    assert_eq!(gen, "5");
    assert_eq!(hex.len(), 8);
    assert!(hex
        .chars()
        .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    assert_eq!(written.sstable.path, written.dir_name);
    assert_eq!(written.sstable.generation, 5);
    assert_eq!(written.sstable.physical_rows, Some(6));
    assert_eq!(written.visible_rows, 3);
    assert!(written.sstable.in_memory_bytes.unwrap() > 0);
    assert_eq!(written.sstable.primary_key_bytes, Some(6 * 8));
    assert_eq!(
        p(&written.dir),
        format!("_mem_wal/{}/{}", t.shard, written.dir_name)
    );

    let fs_dir = t.sstable_fs_dir(&written);
    assert!(fs_dir.join(BLOOM_FILTER_FILE).is_file());
    assert!(fs_dir.join(PK_INDEX_DIR).join("page_data.lance").is_file());
    assert!(fs_dir
        .join(PK_INDEX_DIR)
        .join("page_lookup.lance")
        .is_file());
    // The BTree files carry what upstream's reader expects (column names and
    // page_lookup's schema metadata are stored verbatim in the files).
    let lookup = std::fs::read(fs_dir.join(PK_INDEX_DIR).join("page_lookup.lance")).unwrap();
    let data_file = std::fs::read(fs_dir.join(PK_INDEX_DIR).join("page_data.lance")).unwrap();
    let has = |bytes: &[u8], s: &str| bytes.windows(s.len()).any(|w| w == s.as_bytes());
    for s in [
        "min",
        "max",
        "null_count",
        "page_idx",
        "range_partitioned",
        "batch_size",
        "8192",
    ] {
        assert!(has(&lookup, s), "page_lookup.lance lacks {s}");
    }
    for s in ["values", "ids"] {
        assert!(has(&data_file, s), "page_data.lance lacks {s}");
    }
    assert_eq!(
        std::fs::metadata(fs_dir.join(BLOOM_FILTER_FILE))
            .unwrap()
            .len(),
        32 * 1024,
        "bloom filter sized as upstream's (8192 keys, fpp 0.00057)"
    );

    // Version 1 under lance's descending (V2) manifest naming.
    let versions: Vec<String> = std::fs::read_dir(fs_dir.join("_versions"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".manifest"))
        .collect();
    assert_eq!(versions, vec![format!("{}.manifest", u64::MAX - 1)]);

    let ds = Dataset::open(fs_dir.to_str().unwrap()).await.unwrap();
    assert_eq!(ds.version().version, 1);
    let ids: Vec<(String, i32)> = ds
        .schema()
        .fields
        .iter()
        .map(|f| (f.name.clone(), f.id))
        .collect();
    assert_eq!(
        ids,
        vec![
            ("id".to_string(), 3),
            ("name".to_string(), 7),
            ("v".to_string(), 11),
            ("_tombstone".to_string(), 12),
        ]
    );
    assert_eq!(
        ds.schema().unenforced_primary_key().len(),
        1,
        "primary-key metadata kept"
    );
    let frags = ds.get_fragments();
    assert_eq!(frags.len(), 1);
    let meta = frags[0].metadata();
    assert_eq!(meta.physical_rows, Some(6));
    assert_eq!(meta.files.len(), 1);
    assert_eq!(meta.files[0].fields.as_ref(), &[3, 7, 11, 12]);
    let dv = meta
        .deletion_file
        .as_ref()
        .expect("deletion file on fragment 0");
    assert_eq!(dv.num_deleted_rows, Some(3));
    assert_eq!(
        format!("{:?}", dv.file_type),
        "Bitmap",
        "bitmap deletion file, as upstream writes"
    );
    assert_eq!(
        ds.manifest()
            .data_storage_format
            .lance_file_format()
            .to_string(),
        "2.2"
    );
    assert_eq!(ds.count_rows(None).await.unwrap(), 3);

    // Visible rows: newest of each key, insert order: 1 (v0), 2 (v1), 3 (tombstone).
    let batch = ds.scan().try_into_batch().await.unwrap();
    let keys: Vec<i64> = batch
        .column_by_name("id")
        .unwrap()
        .as_primitive::<Int64Type>()
        .values()
        .to_vec();
    assert_eq!(keys, vec![1, 2, 3]);
    let tomb = batch.column_by_name("_tombstone").unwrap().as_boolean();
    assert_eq!(
        (0..3).map(|i| tomb.value(i)).collect::<Vec<_>>(),
        vec![false, false, true]
    );
}

// Breaks if a retried write reused the directory of an earlier attempt
// (a partial directory from a failed attempt would then be mixed in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_picks_a_new_directory() {
    let t = LocalTable::new();
    let schema = int_schema();
    let data = flush(&schema, &[Op::Put(int_rows(&schema, &[1], 0))]);
    let a = t.writer().write(&schema, 1, &data).await.unwrap();
    let b = t.writer().write(&schema, 1, &data).await.unwrap();
    assert_ne!(a.dir_name, b.dir_name);
}

// Breaks if our reader's point lookup misses a key, finds an absent one,
// returns an older version, or reports a deleted key as present; or if its
// scan shows hidden rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_finds_newest_versions_and_tombstones() {
    let t = LocalTable::new();
    let schema = int_schema();
    let mut ops: Vec<Op> = (0..10)
        .map(|v| Op::Put(int_rows(&schema, &[1, 2], v)))
        .collect();
    ops.push(Op::Delete(keys_batch(vec![(
        "id",
        Arc::new(Int64Array::from(vec![2])) as ArrayRef,
    )])));
    ops.push(Op::Put(int_rows(&schema, &[3], 99)));
    let data = flush(&schema, &ops);
    let written = t.writer().write(&schema, 2, &data).await.unwrap();

    let reader = SsTableReader::open_in(t.store.clone(), &t.layout, &written.dir_name, &schema)
        .await
        .unwrap();
    match reader.get(&[KeyValue::Int64(1)]).await.unwrap() {
        Lookup::Row(b) => {
            let v = b
                .column_by_name("v")
                .unwrap()
                .as_primitive::<arrow_array::types::Int32Type>();
            assert_eq!(v.value(0), 9, "newest of ten versions");
        }
        other => panic!("key 1: {other:?}"),
    }
    assert_eq!(
        reader.get(&[KeyValue::Int64(2)]).await.unwrap(),
        Lookup::Deleted
    );
    assert!(matches!(
        reader.get(&[KeyValue::Int64(3)]).await.unwrap(),
        Lookup::Row(_)
    ));
    for absent in [0, 4, -1, i64::MAX] {
        assert_eq!(
            reader.get(&[KeyValue::Int64(absent)]).await.unwrap(),
            Lookup::Absent,
            "key {absent}"
        );
    }
    let rows: usize = reader
        .scan()
        .await
        .unwrap()
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert_eq!(rows, 3);
}

// Breaks if a key type without an upstream bloom hash (Date32) made the
// flush fail, or produced a filter with false negatives: the filter must be
// saturated (every probe "maybe") and lookups must still find the rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn date_keys_get_a_saturated_bloom_filter() {
    use arrow_array::Date32Array;
    use arrow_schema::{DataType, Schema};
    use memwal_memtable::TableSchema;

    let t = LocalTable::new();
    let schema = Arc::new(
        TableSchema::new(Arc::new(Schema::new(vec![
            field("day", DataType::Date32, 0, Some(1)),
            field("n", DataType::Int64, 1, None),
        ])))
        .unwrap(),
    );
    let batch = arrow_array::RecordBatch::try_new(
        schema.table_schema().clone(),
        vec![
            Arc::new(Date32Array::from(vec![19000, 19001])) as ArrayRef,
            Arc::new(Int64Array::from(vec![1, 2])),
        ],
    )
    .unwrap();
    let w = t
        .writer()
        .write(&schema, 1, &flush(&schema, &[Op::Put(batch)]))
        .await
        .unwrap();
    let bytes = std::fs::read(t.sstable_fs_dir(&w).join(BLOOM_FILTER_FILE)).unwrap();
    assert!(
        bytes.iter().all(|b| *b == 0xff),
        "bloom filter not saturated"
    );
    let reader = SsTableReader::open_in(t.store.clone(), &t.layout, &w.dir_name, &schema)
        .await
        .unwrap();
    assert!(matches!(
        reader.get(&[KeyValue::Date32(19001)]).await.unwrap(),
        Lookup::Row(_)
    ));
    assert_eq!(
        reader.get(&[KeyValue::Date32(5)]).await.unwrap(),
        Lookup::Absent
    );
}

// Breaks if the writer trusted a deletion vector that disagrees with the
// keys (an SSTable with two visible rows of a key, or a lost newest row),
// or accepted an empty flush: both must be refused as invalid input,
// naming the SSTable directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inconsistent_or_empty_input_is_refused() {
    use memwal_sstable::SsTableError;

    let t = LocalTable::new();
    let schema = int_schema();
    let good = flush(
        &schema,
        &[
            Op::Put(int_rows(&schema, &[1, 2], 0)),
            Op::Put(int_rows(&schema, &[1], 1)),
        ],
    );
    assert_eq!(good.deleted_rows, vec![0]);
    for deleted in [vec![], vec![2], vec![0, 1]] {
        let mut bad = good.clone();
        bad.deleted_rows = deleted.clone();
        let err = t.writer().write(&schema, 1, &bad).await.unwrap_err();
        assert!(
            matches!(&err, SsTableError::InvalidInput { path, .. } if path.contains("_gen_1")),
            "{deleted:?}: {err:?}"
        );
    }
    let mut empty = good.clone();
    empty.batches.clear();
    empty.stats.physical_rows = 0;
    assert!(matches!(
        t.writer().write(&schema, 1, &empty).await.unwrap_err(),
        SsTableError::InvalidInput { .. }
    ));
}
