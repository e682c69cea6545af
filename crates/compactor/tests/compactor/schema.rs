//! Compaction across schema versions of the base table: SSTables written
//! before a column was added or dropped merge into the new base.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use futures::TryStreamExt;
use lance::dataset::{Dataset, NewColumnTransform};
use memwal::ShardId;
use memwal_table::TableSharding;

use crate::support::*;

/// `id -> (v, extra)` of the base table (`extra` absent from its schema:
/// `None` for every row).
async fn base_with_extra(path: &str) -> BTreeMap<i64, (Option<String>, Option<String>)> {
    let ds = Dataset::open(path).await.unwrap();
    let batches: Vec<RecordBatch> = ds
        .scan()
        .try_into_stream()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    for b in &batches {
        let ids = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
        let text = |name: &str, i: usize| {
            b.column_by_name(name).and_then(|c| {
                let c = c.as_string::<i32>();
                c.is_valid(i).then(|| c.value(i).to_string())
            })
        };
        for i in 0..b.num_rows() {
            let old = out.insert(ids.value(i), (text("v", i), text("extra", i)));
            assert!(old.is_none(), "key {} twice", ids.value(i));
        }
    }
    out
}

fn with_extra(ids: &[i64], tag: &str) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", DataType::Utf8, true),
        Field::new("extra", DataType::Utf8, true),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
            Arc::new(StringArray::from_iter_values(
                ids.iter().map(|i| format!("{tag}-{i}")),
            )),
            Arc::new(StringArray::from_iter_values(
                ids.iter().map(|i| format!("x-{i}")),
            )),
        ],
    )
    .unwrap()
}

// Breaks if SSTables written under different schema versions cannot be
// compacted (they were refused as corrupt, "differ in their columns",
// stalling that shard's compaction for good), if a column added after a
// generation was written is not null for that generation's rows, or if a
// generation written before a column was dropped cannot be merged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_merges_generations_of_older_schemas() {
    let f = Fixture::new(true, TableSharding::Unsharded).await;
    let shard = ShardId::random();
    // Generation 1 under (id, v).
    let w = f.open(shard, None).await;
    let mut model = Model::new();
    put(&w, &mut model, &[1, 2, 3], "a").await;
    w.flush().await.unwrap();
    w.close().await.unwrap();
    // The base gains a nullable column; a new writer of the shard writes
    // generation 2 under (id, v, extra), overwriting key 2.
    let mut ds = Dataset::open(&f.path).await.unwrap();
    let extra = Arc::new(Schema::new(vec![Field::new("extra", DataType::Utf8, true)]));
    ds.add_columns(NewColumnTransform::AllNulls(extra), None, None)
        .await
        .unwrap();
    let w = f.open(shard, None).await;
    w.put(&with_extra(&[2, 4], "b")).await.unwrap();
    w.flush().await.unwrap();
    w.close().await.unwrap();

    // Both generations in one compaction group.
    f.compactor().run_once().await.unwrap().remove(0).unwrap();
    let s = |x: &str| Some(x.to_string());
    let want: BTreeMap<i64, (Option<String>, Option<String>)> = [
        (1, (s("a-1"), None)),
        (2, (s("b-2"), s("x-2"))),
        (3, (s("a-3"), None)),
        (4, (s("b-4"), s("x-4"))),
    ]
    .into();
    assert_eq!(base_with_extra(&f.path).await, want);

    // A generation written with `extra`, which the base then drops.
    let w = f.open(shard, None).await;
    w.put(&with_extra(&[5], "c")).await.unwrap();
    w.flush().await.unwrap();
    w.close().await.unwrap();
    let mut ds = Dataset::open(&f.path).await.unwrap();
    ds.drop_columns(&["extra"]).await.unwrap();
    f.compactor().run_once().await.unwrap().remove(0).unwrap();
    let got: BTreeMap<i64, Option<String>> = base_with_extra(&f.path)
        .await
        .into_iter()
        .map(|(k, (v, extra))| {
            assert_eq!(extra, None, "a dropped column came back");
            (k, v)
        })
        .collect();
    let want: BTreeMap<i64, Option<String>> =
        [(1, "a-1"), (2, "b-2"), (3, "a-3"), (4, "b-4"), (5, "c-5")]
            .map(|(k, v)| (k, s(v)))
            .into();
    assert_eq!(got, want);
}

// Breaks if one compaction group spanning three schema versions, written
// by one live writer that followed each change (`ShardWriter::evolve`),
// loses a row, fills a column for rows written before it existed, or
// keeps a dropped column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_group_spanning_three_schema_versions_merges() {
    let f = Fixture::new(true, TableSharding::Unsharded).await;
    let shard = ShardId::random();
    let w = f.open(shard, None).await;
    let mut model = Model::new();
    put(&w, &mut model, &[1, 2, 3], "a").await;
    let mut ds = Dataset::open(&f.path).await.unwrap();
    let extra = Arc::new(Schema::new(vec![Field::new("extra", DataType::Utf8, true)]));
    ds.add_columns(NewColumnTransform::AllNulls(extra), None, None)
        .await
        .unwrap();
    assert_eq!(w.evolve().await.unwrap(), Some(2));
    w.put(&with_extra(&[2, 4], "b")).await.unwrap();
    // The third version drops `v`.
    let mut ds = Dataset::open(&f.path).await.unwrap();
    ds.drop_columns(&["v"]).await.unwrap();
    assert_eq!(w.evolve().await.unwrap(), Some(3));
    let only_extra = RecordBatch::try_from_iter(vec![
        ("id", Arc::new(Int64Array::from(vec![3, 5])) as ArrayRef),
        (
            "extra",
            Arc::new(StringArray::from(vec!["y-3", "y-5"])) as ArrayRef,
        ),
    ])
    .unwrap();
    w.put(&only_extra).await.unwrap();
    w.close().await.unwrap();
    assert_eq!(
        w.stats().published_generation,
        3,
        "one generation per schema version"
    );
    f.compactor().run_once().await.unwrap().remove(0).unwrap();
    let s = |x: &str| Some(x.to_string());
    let want: BTreeMap<i64, (Option<String>, Option<String>)> = [
        (1, (None, None)),
        (2, (None, s("x-2"))),
        (3, (None, s("y-3"))),
        (4, (None, s("x-4"))),
        (5, (None, s("y-5"))),
    ]
    .into();
    assert_eq!(base_with_extra(&f.path).await, want);
    let ds = Dataset::open(&f.path).await.unwrap();
    assert!(
        ds.schema().field("v").is_none(),
        "the dropped column stays dropped"
    );
}
