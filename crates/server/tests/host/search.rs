//! Searching a served table (`TableHost::nearest`, `TableHost::full_text`)
//! at every level: unflushed rows, published SSTables, the base after
//! compaction, with overwrites and deletes.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int64Type};
use arrow_array::{
    ArrayRef, FixedSizeListArray, Float32Array, Int64Array, RecordBatch, RecordBatchIterator,
    StringArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use lance::dataset::mem_wal::DatasetMemWalExt;
use lance::dataset::{Dataset, WriteParams};
use lance::index::vector::VectorIndexParams;
use lance::index::DatasetIndexExt;
use lance_index::scalar::InvertedIndexParams;
use lance_index::IndexType;
use memwal::ShardWriterConfig;
use memwal_server::{ServerError, TableHost};

use super::compact;

const DIM: i32 = 8;
const FRESH: i64 = 100_000;

fn schema() -> SchemaRef {
    let item = Arc::new(Field::new("item", DataType::Float32, true));
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false).with_metadata(
            [(
                "lance-schema:unenforced-primary-key".to_string(),
                "true".to_string(),
            )]
            .into(),
        ),
        Field::new("vec", DataType::FixedSizeList(item.clone(), DIM), true),
        Field::new("raw", DataType::FixedSizeList(item, DIM), true),
        Field::new("txt", DataType::Utf8, true),
    ]))
}

/// Row `id`'s vector as put `tag` wrote it: base rows in [0, 1), fresh
/// rows in [50, 60), each tag a different vector.
fn vector(id: i64, tag: &str) -> Vec<f32> {
    let seed = tag
        .bytes()
        .fold(id as u64, |h, b| h.wrapping_mul(131).wrapping_add(b as u64));
    let (offset, scale) = if id >= FRESH {
        (50.0, 10.0)
    } else {
        (0.0, 1.0)
    };
    (0..DIM as u64)
        .map(|j| {
            let x = (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ j.wrapping_mul(0xBF58_476D_1CE4_E5B9))
            .wrapping_mul(0x94D0_49BB_1331_11EB);
            offset + scale * ((x >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

fn vectors(ids: &[i64], tag: &str) -> ArrayRef {
    let values: Vec<f32> = ids.iter().flat_map(|id| vector(*id, tag)).collect();
    Arc::new(
        FixedSizeListArray::try_new(
            Arc::new(Field::new("item", DataType::Float32, true)),
            DIM,
            Arc::new(Float32Array::from(values)),
            None,
        )
        .unwrap(),
    )
}

/// Rows `ids` as put `tag` writes them; `txt` holds a word unique to the
/// row and the tag (`{tag}w{id}`) and one every row shares.
fn rows(ids: &[i64], tag: &str) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
            vectors(ids, tag),
            vectors(ids, tag),
            Arc::new(StringArray::from_iter_values(
                ids.iter().map(|id| format!("{tag}w{id} common")),
            )),
        ],
    )
    .unwrap()
}

/// An unsharded table of 300 base rows with an IVF_FLAT index on `vec` and
/// an inverted index on `txt` (`raw` unindexed), both maintained.
async fn indexed_table(dir: &tempfile::TempDir) -> memwal_store::StoreLocation {
    let uri = dir.path().join("t").to_str().unwrap().to_string();
    let ids: Vec<i64> = (0..300).collect();
    let mut ds = Dataset::write(
        RecordBatchIterator::new(vec![Ok(rows(&ids, "base"))], schema()),
        &uri,
        Some(WriteParams::default()),
    )
    .await
    .unwrap();
    // IVF_FLAT with one partition: the base index ranks exactly, so every
    // probe's own row is its top hit once compaction moved it there (PQ
    // codes trained on base rows would place the far fresh rows roughly).
    let params = VectorIndexParams::ivf_flat(1, lance_linalg::distance::DistanceType::L2);
    ds.create_index(
        &["vec"],
        IndexType::Vector,
        Some("vec_idx".into()),
        &params,
        true,
    )
    .await
    .unwrap();
    ds.create_index(
        &["txt"],
        IndexType::Inverted,
        Some("txt_fts".into()),
        &InvertedIndexParams::default(),
        true,
    )
    .await
    .unwrap();
    ds.initialize_mem_wal().unsharded().execute().await.unwrap();
    memwal_store::open_store(&uri).unwrap()
}

/// The ids of a search result, in its order, with each row's `vec`.
fn hits(b: &RecordBatch, column: &str) -> Vec<(i64, Vec<f32>)> {
    let ids = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
    let vecs = b.column_by_name(column).unwrap().as_fixed_size_list();
    (0..b.num_rows())
        .map(|r| {
            let v = vecs.value(r);
            (
                ids.value(r),
                v.as_primitive::<Float32Type>().values().to_vec(),
            )
        })
        .collect()
}

/// Checks every search against `model` (the live vector tag of each fresh
/// key; absent: deleted or never written).
async fn check(host: &TableHost, model: &BTreeMap<i64, &str>, stage: &str) {
    for (&id, &tag) in model.iter().step_by(7) {
        let probe = vector(id, tag);
        for column in ["vec", "raw"] {
            let found = host.nearest(column, &probe, 10, None).await.unwrap();
            let got = hits(&found, column);
            assert_eq!(got[0].0, id, "{stage}: {column} search for {id}: {got:?}");
            // Exact on the unindexed column; through an index the distance
            // is the index's estimate (an SSTable's SQ codes).
            let distance = found
                .column_by_name("_distance")
                .unwrap()
                .as_primitive::<Float32Type>();
            if column == "raw" {
                assert_eq!(distance.value(0), 0.0, "{stage}: exact distance");
            }
            for (hit, v) in &got {
                if *hit >= FRESH {
                    let live = model.get(hit).unwrap_or_else(|| {
                        panic!("{stage}: deleted {hit} returned by {column} search")
                    });
                    assert_eq!(v, &vector(*hit, live), "{stage}: stale version of {hit}");
                }
            }
        }
        // A prefilter leaving the probe's own row out: the 10 nearest of
        // the others, none of them stale or deleted.
        for column in ["vec", "raw"] {
            let others = datafusion::prelude::col("id").not_eq(datafusion::prelude::lit(id));
            let found = host
                .nearest(column, &probe, 10, Some(others))
                .await
                .unwrap();
            let got = hits(&found, column);
            assert_eq!(got.len(), 10, "{stage}: filtered {column} search");
            for (hit, v) in &got {
                assert_ne!(*hit, id, "{stage}: the filter let {id} through");
                if *hit >= FRESH {
                    assert_eq!(Some(v), model.get(hit).map(|t| vector(*hit, t)).as_ref());
                }
            }
        }
        let found = host
            .full_text("txt", &format!("{tag}w{id}"), Some(5))
            .await
            .unwrap();
        let ids = found
            .column_by_name("id")
            .unwrap()
            .as_primitive::<Int64Type>();
        assert_eq!(
            ids.values().to_vec(),
            vec![id],
            "{stage}: full text {tag}w{id}"
        );
    }
    // Words of overwritten versions and deleted rows find nothing.
    for word in ["aw100003", "aw100010", "aw100011"] {
        let found = host.full_text("txt", word, None).await.unwrap();
        assert_eq!(found.num_rows(), 0, "{stage}: {word} found {found:?}");
    }
    let common = host.full_text("txt", "common", None).await.unwrap();
    assert_eq!(
        common.num_rows(),
        300 + model.len(),
        "{stage}: every live row"
    );
}

// Breaks if a search misses an acknowledged row at any level (unflushed,
// in an SSTable through its own index, in the base after compaction),
// returns an overwritten version or a deleted row, or if a vector column
// without an index is not searched exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn searches_find_every_live_row_at_every_level() {
    let dir = tempfile::tempdir().unwrap();
    let loc = indexed_table(&dir).await;
    let host = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    let ids: Vec<i64> = (FRESH..FRESH + 60).collect();
    host.write(&rows(&ids, "a"), false).await.unwrap();
    host.write(&rows(&[FRESH + 3, FRESH + 17], "b"), false)
        .await
        .unwrap();
    let deletes = RecordBatch::try_from_iter(vec![(
        "id",
        Arc::new(Int64Array::from(vec![FRESH + 10, FRESH + 11])) as ArrayRef,
    )])
    .unwrap();
    host.write(&deletes, true).await.unwrap();
    let mut model: BTreeMap<i64, &str> = ids.iter().map(|&i| (i, "a")).collect();
    model.insert(FRESH + 3, "b");
    model.insert(FRESH + 17, "b");
    model.remove(&(FRESH + 10));
    model.remove(&(FRESH + 11));
    check(&host, &model, "unflushed").await;
    host.flush().await.unwrap();
    check(&host, &model, "published").await;
    // One more overwrite left unflushed over the published generation.
    host.write(&rows(&[FRESH + 21], "c"), false).await.unwrap();
    model.insert(FRESH + 21, "c");
    check(&host, &model, "published + unflushed").await;
    host.flush().await.unwrap();
    // Merged into the base, its indexes not caught up: the index's view
    // still reads the SSTables (the base index holds none of these rows).
    let compactor = memwal_compactor::Compactor::new(
        loc.clone(),
        memwal_compactor::CompactorConfig {
            index_catchup: None,
            ..Default::default()
        },
    );
    for r in compactor.run_once().await.unwrap() {
        r.unwrap();
    }
    check(&host, &model, "compacted, index behind").await;
    compactor.catch_up_indexes().await.unwrap();
    check(&host, &model, "compacted, index caught up").await;
    host.write(&rows(&[FRESH + 30], "d"), false).await.unwrap();
    model.insert(FRESH + 30, "d");
    compact(&loc).await;
    check(&host, &model, "compacted again").await;
    host.close().await.unwrap();
}

// Breaks if a bad search is not refused as invalid input naming what is
// wrong (or is refused with another kind).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_searches_are_invalid_input_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let loc = indexed_table(&dir).await;
    let host = TableHost::open("t", loc, ShardWriterConfig::default())
        .await
        .unwrap();
    let invalid = |r: Result<RecordBatch, ServerError>, want: &str| match r {
        Err(ServerError::InvalidInput { reason, .. }) => {
            assert!(reason.contains(want), "{reason} lacks {want}")
        }
        other => panic!("expected InvalidInput naming {want}, got {other:?}"),
    };
    invalid(host.nearest("nope", &[0.0; 8], 3, None).await, "`nope`");
    invalid(
        host.nearest("txt", &[0.0; 8], 3, None).await,
        "not a vector",
    );
    invalid(host.nearest("vec", &[0.0; 3], 3, None).await, "3 values");
    invalid(host.nearest("vec", &[0.0; 8], 0, None).await, "k > 0");
    let unknown = Some(datafusion::prelude::col("nope").eq(datafusion::prelude::lit(1)));
    invalid(
        host.nearest("vec", &[0.0; 8], 3, unknown.clone()).await,
        "nope",
    );
    invalid(
        host.nearest("raw", &[0.0; 8], 3, unknown.clone()).await,
        "nope",
    );
    invalid(host.scan(unknown, None, None).await, "nope");
    invalid(host.scan(None, Some(&["nope"]), None).await, "nope");
    invalid(host.full_text("raw", "x", None).await, "INVERTED");
    invalid(host.full_text("nope", "x", None).await, "`nope`");
    host.close().await.unwrap();
}

// Breaks if a daemon whose shard another daemon claimed (fencing its idle
// writer) searches its stale memtable: the overwritten versions and the
// deleted rows of the new owner would be found, its published SSTable
// above the fenced writer's published generation left out. Searches
// through the fenced host (indexed and exact vector search, prefiltered,
// full text) must find exactly the new owner's state. Fails without the
// epoch check in `TableHost::view_after`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_host_searches_the_new_owners_state() {
    let dir = tempfile::tempdir().unwrap();
    let loc = indexed_table(&dir).await;
    let a = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    let ids: Vec<i64> = (FRESH..FRESH + 60).collect();
    a.write(&rows(&ids, "a"), false).await.unwrap();
    let mut model: BTreeMap<i64, &str> = ids.iter().map(|&i| (i, "a")).collect();

    // B claims the shard, overwrites, deletes and publishes; A is idle.
    let b = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    b.write(&rows(&[FRESH + 3, FRESH + 17], "b"), false)
        .await
        .unwrap();
    let deletes = RecordBatch::try_from_iter(vec![(
        "id",
        Arc::new(Int64Array::from(vec![FRESH + 10, FRESH + 11])) as ArrayRef,
    )])
    .unwrap();
    b.write(&deletes, true).await.unwrap();
    b.flush().await.unwrap();
    model.insert(FRESH + 3, "b");
    model.insert(FRESH + 17, "b");
    model.remove(&(FRESH + 10));
    model.remove(&(FRESH + 11));
    check(&b, &model, "B").await;
    check(&a, &model, "through the fenced host").await;
    b.close().await.unwrap();
    a.close().await.unwrap();
}
