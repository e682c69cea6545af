//! A served table following its base table's schema without a restart
//! (`TableHost::evolve`): a column added or dropped while shards are open.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use futures::TryStreamExt;
use memwal::ShardWriterConfig;
use memwal_server::{ServerError, TableHost};

use super::{bucket_table, compact, tagged};

/// `tagged(ids, tag)` with `extra` = `x<id>`.
fn with_extra(ids: &[i64], tag: &str) -> RecordBatch {
    let b = tagged(ids, tag);
    let mut fields: Vec<Field> = b
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("extra", DataType::Utf8, true));
    let mut columns = b.columns().to_vec();
    columns.push(Arc::new(StringArray::from_iter_values(
        ids.iter().map(|i| format!("x{i}")),
    )) as ArrayRef);
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

/// `id -> (v, extra)` of batches that have both columns (or `extra` absent).
fn rows_of(batches: &[RecordBatch]) -> BTreeMap<i64, (Option<String>, Option<String>)> {
    let mut out = BTreeMap::new();
    for b in batches {
        let ids = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
        let text = |name: &str, i: usize| {
            b.column_by_name(name).and_then(|c| {
                let c = c.as_string::<i32>();
                c.is_valid(i).then(|| c.value(i).to_string())
            })
        };
        for i in 0..b.num_rows() {
            let prev = out.insert(ids.value(i), (text("v", i), text("extra", i)));
            assert!(prev.is_none(), "key {} twice", ids.value(i));
        }
    }
    out
}

async fn base_rows(path: &std::path::Path) -> Vec<RecordBatch> {
    let ds = lance::Dataset::open(path.to_str().unwrap()).await.unwrap();
    ds.scan()
        .try_into_stream()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// Adds a nullable Utf8 column `extra` to the base table at `path`.
async fn add_extra(path: &std::path::Path) {
    let mut ds = lance::Dataset::open(path.to_str().unwrap()).await.unwrap();
    let extra = Arc::new(Schema::new(vec![Field::new("extra", DataType::Utf8, true)]));
    ds.add_columns(
        lance::dataset::NewColumnTransform::AllNulls(extra),
        None,
        None,
    )
    .await
    .unwrap();
}

/// Refused as invalid (nothing written), naming `column`.
#[track_caller]
fn assert_invalid_naming(e: ServerError, column: &str) {
    let text = e.to_string();
    assert!(!e.may_be_durable(), "{text}");
    assert_eq!(
        tonic::Status::from(e).code(),
        tonic::Code::InvalidArgument,
        "{text}"
    );
    assert!(text.contains(column), "{text}");
}

// Breaks if a column added to the base while shards are open does not
// reach them without a restart (a put with it refused, or refused by
// some shards), if a producer still sending the old columns is refused
// after the change, if a put with a column the table lacks is accepted
// or refused without its name, or if the rows written across the change
// do not all reach the base through compaction with nulls where nothing
// was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_added_column_reaches_every_open_shard_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let host = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    let ids: Vec<i64> = (0..40).collect();
    host.write(&tagged(&ids, "a"), false).await.unwrap();
    assert_eq!(host.status().await.len(), 4, "every bucket's shard is open");
    let path = dir.path().join("t");
    add_extra(&path).await;

    // Not noticed yet: the served schema is the old one.
    let e = host.write(&with_extra(&ids, "b"), false).await.unwrap_err();
    assert_invalid_naming(e, "extra");
    assert!(host.evolve().await.unwrap(), "the schema changed");
    assert!(!host.evolve().await.unwrap(), "and only once");
    assert!(host.schema().field_with_name("extra").is_ok());

    let (new, old): (Vec<i64>, Vec<i64>) = ids.iter().partition(|i| *i % 2 == 0);
    host.write(&with_extra(&new, "b"), false).await.unwrap();
    host.write(&tagged(&old, "c"), false).await.unwrap();
    let unknown = RecordBatch::try_from_iter(vec![
        ("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
        ("nope", Arc::new(StringArray::from(vec!["?"])) as ArrayRef),
    ])
    .unwrap();
    let e = host.write(&unknown, false).await.unwrap_err();
    assert_invalid_naming(e, "nope");

    let mut want = BTreeMap::new();
    for &i in &new {
        want.insert(i, (Some(format!("b{i}")), Some(format!("x{i}"))));
    }
    for &i in &old {
        want.insert(i, (Some(format!("c{i}")), None));
    }
    assert_eq!(rows_of(&[host.read_rows().await.unwrap()]), want);
    host.flush().await.unwrap();
    compact(&loc).await;
    assert_eq!(rows_of(&base_rows(&path).await), want);
    host.close().await.unwrap();
}

// Breaks if a column dropped from the base while shards are open is still
// accepted (or a put without it refused), or if compaction of the shards'
// generations of both schemas fails or loses rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_column_reaches_every_open_shard_and_compaction_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let host = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    let ids: Vec<i64> = (0..40).collect();
    host.write(&tagged(&ids[..20], "a"), false).await.unwrap();
    host.flush().await.unwrap();
    host.write(&tagged(&ids[10..30], "b"), false).await.unwrap();
    let path = dir.path().join("t");
    let mut ds = lance::Dataset::open(path.to_str().unwrap()).await.unwrap();
    ds.drop_columns(&["v"]).await.unwrap();
    assert!(host.evolve().await.unwrap());
    let e = host.write(&tagged(&ids, "c"), false).await.unwrap_err();
    assert_invalid_naming(e, "v");
    let keys_only = RecordBatch::try_from_iter(vec![(
        "id",
        Arc::new(Int64Array::from(ids[20..].to_vec())) as ArrayRef,
    )])
    .unwrap();
    host.write(&keys_only, false).await.unwrap();
    host.flush().await.unwrap();
    compact(&loc).await;
    let got: Vec<i64> = rows_of(&base_rows(&path).await).into_keys().collect();
    assert_eq!(got, ids);
    host.close().await.unwrap();
}

// Breaks if a renamed column (same field id) loses its values anywhere: in
// reads of unflushed rows taken under the old name, in published SSTables
// written under it, or in compaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_column_keeps_its_values_in_reads_and_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let host = TableHost::open("t", loc.clone(), ShardWriterConfig::default())
        .await
        .unwrap();
    let ids: Vec<i64> = (0..40).collect();
    host.write(&tagged(&ids[..20], "a"), false).await.unwrap();
    host.flush().await.unwrap();
    host.write(&tagged(&ids[20..], "b"), false).await.unwrap();
    let path = dir.path().join("t");
    let mut ds = lance::Dataset::open(path.to_str().unwrap()).await.unwrap();
    ds.alter_columns(&[lance::dataset::ColumnAlteration::new("v".into()).rename("w".into())])
        .await
        .unwrap();
    assert!(host.evolve().await.unwrap());
    let e = host.write(&tagged(&[99], "c"), false).await.unwrap_err();
    assert_invalid_naming(e, "v");
    let want: BTreeMap<i64, String> = ids
        .iter()
        .map(|&i| (i, format!("{}{i}", if i < 20 { "a" } else { "b" })))
        .collect();
    let read = host.read_rows().await.unwrap();
    let w = |b: &RecordBatch| -> BTreeMap<i64, String> {
        let ids = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
        let w = b
            .column_by_name("w")
            .expect("the new name")
            .as_string::<i32>();
        (0..b.num_rows())
            .map(|i| {
                let v = if w.is_valid(i) { w.value(i) } else { "" };
                (ids.value(i), v.to_string())
            })
            .collect()
    };
    assert_eq!(w(&read), want, "read");
    host.flush().await.unwrap();
    compact(&loc).await;
    let mut stored = BTreeMap::new();
    for b in base_rows(&path).await {
        stored.extend(w(&b));
    }
    assert_eq!(stored, want, "compacted");
    host.close().await.unwrap();
}

// Breaks if a shard that opened on the old schema while the host followed
// a new one (opened, not yet live, so `evolve` did not move it) stays on
// the old schema: the host then sends it puts in the new schema, and it
// refuses those of both schemas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_opening_during_a_schema_change_follows_it() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let host = Arc::new(
        TableHost::open("t", loc.clone(), ShardWriterConfig::default())
            .await
            .unwrap(),
    );
    // Hold the first shard to open between its open and going live.
    let (arrived_tx, arrived_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (arrived_tx, go_rx) = (
        std::sync::Mutex::new(Some(arrived_tx)),
        std::sync::Mutex::new(Some(go_rx)),
    );
    fail::cfg_callback("server::shard_opened", move || {
        if let (Some(arrived), Some(go)) = (
            arrived_tx.lock().unwrap().take(),
            go_rx.lock().unwrap().take(),
        ) {
            arrived.send(()).unwrap();
            go.recv().unwrap();
        }
    })
    .unwrap();
    let opening = {
        let host = host.clone();
        tokio::spawn(async move { host.write(&tagged(&[1], "a"), false).await })
    };
    tokio::task::spawn_blocking(move || arrived_rx.recv().unwrap())
        .await
        .unwrap();
    let path = dir.path().join("t");
    add_extra(&path).await;
    assert!(host.evolve().await.unwrap(), "the host follows the change");
    go_tx.send(()).unwrap();
    opening.await.unwrap().unwrap();
    fail::remove("server::shard_opened");
    // The shard of id 1 takes both schemas.
    host.write(&tagged(&[1], "b"), false).await.unwrap();
    host.write(&with_extra(&[1], "c"), false).await.unwrap();
    let got = rows_of(&[host.read_rows().await.unwrap()]);
    assert_eq!(got[&1], (Some("c1".into()), Some("x1".into())));
    host.close().await.unwrap();
}
