//! A live writer following the base table's schema (`evolve_to`): a column
//! added or dropped while writing, puts of both versions, replay across
//! the change.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use futures::TryStreamExt;
use lance::dataset::{Dataset, NewColumnTransform};
use memwal::Error;
use memwal_sstable::LanceStore;

use memwal_testkit::{Action, Gate, OpKind};

use crate::support::*;

async fn base(t: &TestTable) -> Dataset {
    let lance = LanceStore::new(t.mem.clone());
    lance::dataset::builder::DatasetBuilder::from_uri(lance.uri(&t.root).as_str())
        .with_session(lance.session().clone())
        .load()
        .await
        .unwrap()
}

async fn add_extra(t: &TestTable) {
    let extra = Arc::new(Schema::new(vec![Field::new("extra", DataType::Utf8, true)]));
    base(t)
        .await
        .add_columns(NewColumnTransform::AllNulls(extra), None, None)
        .await
        .unwrap();
}

async fn drop_column(t: &TestTable, name: &str) {
    base(t).await.drop_columns(&[name]).await.unwrap();
}

/// `(id, v, extra)` rows, in the base schema's order once `extra` exists.
fn rows_extra(ids: &[i64], v: &str, extra: &str) -> RecordBatch {
    let mut fields: Vec<Field> = base_schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("extra", DataType::Utf8, true));
    RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        vec![
            Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
            Arc::new(StringArray::from(
                ids.iter().map(|i| format!("{v}-{i}")).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                ids.iter()
                    .map(|i| format!("{extra}-{i}"))
                    .collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap()
}

/// Per published generation (ascending): its SSTable's column names and
/// each row's `(id, extra)` (`extra` `None` where null or absent).
type Published = Vec<(Vec<String>, BTreeMap<i64, Option<String>>)>;

async fn published(t: &TestTable) -> Published {
    let m = t.manifest().await;
    let mut ssts = m.sstables.clone();
    ssts.sort_by_key(|s| s.generation);
    let lance = LanceStore::new(t.mem.clone());
    let mut out = Vec::new();
    for s in &ssts {
        let dir = t.layout().sstable_dir(&s.path);
        let ds = lance::dataset::builder::DatasetBuilder::from_uri(lance.uri(&dir).as_str())
            .with_session(lance.session().clone())
            .load()
            .await
            .unwrap();
        let columns: Vec<String> = ds.schema().fields.iter().map(|f| f.name.clone()).collect();
        let batches: Vec<RecordBatch> = ds
            .scan()
            .try_into_stream()
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        let mut rows = BTreeMap::new();
        for b in &batches {
            let ids = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
            let extra = b
                .column_by_name("extra")
                .map(|c| c.as_string::<i32>().clone());
            for r in 0..b.num_rows() {
                let e = extra
                    .as_ref()
                    .and_then(|e| e.is_valid(r).then(|| e.value(r).to_string()));
                rows.insert(ids.value(r), e);
            }
        }
        out.push((columns, rows));
    }
    out
}

fn names(cols: &[&str]) -> Vec<String> {
    cols.iter().map(|c| c.to_string()).collect()
}

// Breaks if a live writer cannot follow a column added to the base (a put
// with it is refused), if one generation mixes schemas, if a producer
// still sending the old columns is refused afterwards, or if a column the
// table does not have is accepted or refused without its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_writer_follows_an_added_column_at_a_generation_boundary() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    w.put(&rows(&[1, 2], "a")).await.unwrap();
    add_extra(&t).await;
    assert_eq!(
        w.evolve().await.unwrap(),
        Some(2),
        "generation 2 starts anew"
    );
    assert_eq!(w.evolve().await.unwrap(), None, "nothing changed since");
    w.put(&rows_extra(&[3], "b", "x")).await.unwrap();
    // A producer not yet upgraded keeps writing; `extra` is null.
    w.put(&rows(&[4], "b")).await.unwrap();
    let unknown = RecordBatch::try_from_iter(vec![
        ("id", Arc::new(Int64Array::from(vec![5])) as ArrayRef),
        ("nope", Arc::new(StringArray::from(vec!["?"])) as ArrayRef),
    ])
    .unwrap();
    let err = w.put(&unknown).await.unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput { .. }) && err.to_string().contains("nope"),
        "{err}"
    );
    w.close().await.unwrap();
    let got = published(&t).await;
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].0, names(&["id", "v", "_tombstone"]));
    assert_eq!(got[0].1, BTreeMap::from([(1, None), (2, None)]));
    assert_eq!(got[1].0, names(&["id", "v", "extra", "_tombstone"]));
    assert_eq!(
        got[1].1,
        BTreeMap::from([(3, Some("x-3".to_string())), (4, None)])
    );
}

// Breaks if a put checked against one schema and written after the writer
// moved on is refused, written in the old schema into a new-schema
// generation, or loses a column the new schema still has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_prepared_before_a_schema_change_lands_in_the_new_schema() {
    let t = TestTable::new().await;
    add_extra(&t).await;
    let w = t.open(config()).await.unwrap();
    // Prepared with `extra`; the column is dropped before it is written.
    let with_extra = w.prepare_put(&rows_extra(&[1], "a", "x")).unwrap();
    drop_column(&t, "extra").await;
    assert_eq!(w.evolve().await.unwrap(), Some(1), "nothing to freeze");
    w.put_prepared(with_extra).await.unwrap();
    // Prepared without `extra`; the column is added back (a new field id).
    let without = w.prepare_put(&rows(&[2], "a")).unwrap();
    add_extra(&t).await;
    assert_eq!(w.evolve().await.unwrap(), Some(2));
    w.put_prepared(without).await.unwrap();
    w.close().await.unwrap();
    let got = published(&t).await;
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].0, names(&["id", "v", "_tombstone"]));
    assert_eq!(got[0].1, BTreeMap::from([(1, None)]));
    assert_eq!(got[1].0, names(&["id", "v", "extra", "_tombstone"]));
    assert_eq!(got[1].1, BTreeMap::from([(2, None)]));
    let mut model = Model::new();
    model_put(&mut model, &[1, 2], "a");
    let w = t.open(config()).await.unwrap();
    assert_eq!(t.read_published(&table_schema(&w)).await, model);
    w.close().await.unwrap();
}

// Breaks if a WAL whose entries span a schema change does not replay after
// a crash (entries matched by name or position instead of field id), if a
// replayed old entry loses its rows, or if a column dropped since the
// entry was written is carried into the new SSTable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_after_a_crash_spans_schema_changes() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    w.put(&rows(&[1, 2], "a")).await.unwrap();
    // Generation 1's SSTable write never finishes: both generations are
    // only in the WAL at the crash, entries of two schemas.
    let gate = Gate::new();
    {
        let gate = gate.clone();
        t.fault.set_hook(move |op| {
            if matches!(op.kind, OpKind::Put | OpKind::Multipart) && op.path.contains("_gen_") {
                Action::Hold(gate.clone(), Box::new(Action::Pass))
            } else {
                Action::Pass
            }
        });
    }
    add_extra(&t).await;
    w.evolve().await.unwrap();
    w.put(&rows_extra(&[2, 3], "b", "x")).await.unwrap();
    gate.wait_arrived(1).await;
    w.abort();
    drop(w);
    t.fault.clear_hook();
    gate.open();
    assert!(t.manifest().await.sstables.is_empty(), "nothing published");
    let w = t.open(config()).await.unwrap();
    let got = published(&t).await;
    assert_eq!(got.len(), 2, "both generations replayed: {got:?}");
    // Generation 1 is rebuilt in the schema the writer opened with.
    assert_eq!(got[0].0, names(&["id", "v", "extra", "_tombstone"]));
    assert_eq!(got[0].1, BTreeMap::from([(1, None), (2, None)]));
    let last = got.last().unwrap();
    assert_eq!(last.0, names(&["id", "v", "extra", "_tombstone"]));
    assert_eq!(last.1[&3], Some("x-3".to_string()));
    let mut model = Model::new();
    model_put(&mut model, &[1], "a");
    model_put(&mut model, &[2, 3], "b");
    assert_eq!(t.read_published(&table_schema(&w)).await, model);
    // Entries written with `extra`, replayed after it was dropped.
    w.put(&rows_extra(&[4], "c", "y")).await.unwrap();
    w.abort();
    drop(w);
    drop_column(&t, "extra").await;
    let w = t.open(config()).await.unwrap();
    let got = published(&t).await;
    let last = got.last().unwrap();
    assert_eq!(last.0, names(&["id", "v", "_tombstone"]));
    assert!(last.1.contains_key(&4), "{got:?}");
    model_put(&mut model, &[4], "c");
    assert_eq!(t.read_published(&table_schema(&w)).await, model);
    w.close().await.unwrap();
}

// Breaks if a schema with another primary key is followed (rows of one key
// would split between generations keyed differently) or the refusal
// leaves the writer unusable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_primary_key_is_refused_and_the_writer_goes_on() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    w.put(&rows(&[1], "a")).await.unwrap();
    let current = w.schema().table_schema().clone();
    let pk = memwal_memtable::PRIMARY_KEY_KEY;
    let rekeyed: Vec<Field> = current
        .fields()
        .iter()
        .map(|f| {
            let mut md = f.metadata().clone();
            let was_key = md.remove(pk).is_some();
            if !was_key {
                md.insert(pk.to_string(), "true".to_string());
            }
            f.as_ref().clone().with_nullable(was_key).with_metadata(md)
        })
        .collect();
    let err = w.evolve_to(Arc::new(Schema::new(rekeyed))).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput { .. }) && err.to_string().contains("primary key"),
        "{err}"
    );
    w.put(&rows(&[2], "a")).await.unwrap();
    w.close().await.unwrap();
    let mut model = Model::new();
    model_put(&mut model, &[1, 2], "a");
    let w = t.open(config()).await.unwrap();
    assert_eq!(t.read_published(&table_schema(&w)).await, model);
    w.close().await.unwrap();
}
