//! Local-path URIs, non-waiting puts, sealing, the age trigger, unknown
//! WAL outcomes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arrow_array::RecordBatchIterator;
use lance::dataset::{Dataset, WriteParams};
use memwal::{Error, ShardId, ShardWriter};
use memwal_sstable::{LanceStore, SsTableReader};
use memwal_testkit::{Action, OpKind};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;

use crate::support::*;

// Breaks if opening by a plain local path (fsyncing local store) does not
// find the base table through our store, or if the flushed SSTables are
// not readable there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_path_uri_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let uri = dir.path().to_str().unwrap().to_string();
    let loc = memwal_store::open_store(&uri).unwrap();
    let lance = LanceStore::new(loc.store.clone());
    let empty = RecordBatchIterator::new(Vec::new(), base_schema());
    Dataset::write(
        empty,
        lance.uri(&loc.root).as_str(),
        Some(WriteParams {
            session: Some(lance.session().clone()),
            ..Default::default()
        }),
    )
    .await
    .unwrap();
    let shard = ShardId::random();
    let w = ShardWriter::open(uri.as_str(), shard, config())
        .await
        .unwrap();
    w.put(&rows(&[1, 2], "a")).await.unwrap();
    w.delete(&keys(&[1])).await.unwrap();
    let schema = table_schema(&w);
    w.close().await.unwrap();

    let w2 = ShardWriter::open(uri.as_str(), shard, config())
        .await
        .unwrap();
    let m = w2.manifest();
    assert_eq!(m.sstables.len(), 1);
    let layout = memwal_fencing::ShardLayout::new(&loc.root, shard);
    let reader = SsTableReader::open_in(loc.store.clone(), &layout, &m.sstables[0].path, &schema)
        .await
        .unwrap();
    let mut got = Model::new();
    apply(&mut got, &reader.scan().await.unwrap());
    let mut want = Model::new();
    model_put(&mut want, &[2], "a");
    assert_eq!(got, want);
    w2.close().await.unwrap();
}

// Breaks if put_nowait does not fix the WAL order at call time (positions
// must not go backwards in submit order) or if its handles do not resolve
// once durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_nowait_handles_resolve_in_wal_order() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    let schema = table_schema(&w);
    let mut handles = Vec::new();
    for i in 0..50i64 {
        handles.push(
            w.put_nowait(&rows(&[i % 7], &format!("n{i}")))
                .await
                .unwrap(),
        );
    }
    let mut last = 0;
    for h in handles {
        let pos = h.await.unwrap();
        assert!(pos >= last, "WAL order follows submit order");
        last = pos;
    }
    let mut model = Model::new();
    for i in 0..50i64 {
        model_put(&mut model, &[i % 7], &format!("n{i}"));
    }
    w.close().await.unwrap();
    assert_eq!(t.read_published(&schema).await, model);
}

// Breaks if a seal is not detected at the next publish, or if the writer
// keeps accepting writes after it learned the shard is sealed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_shard_is_terminal_at_the_next_publish() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    w.put(&rows(&[1], "a")).await.unwrap();
    t.manifests().seal().await.unwrap();
    let err = w.flush().await.unwrap_err();
    assert!(matches!(err, Error::Sealed { .. }), "{err}");
    assert!(matches!(
        w.put(&rows(&[2], "b")).await,
        Err(Error::Sealed { .. })
    ));
    // A sealed shard refuses new writers too.
    assert!(matches!(t.open(config()).await, Err(Error::Sealed { .. })));
}

// Breaks if a WAL PUT whose outcome is unknown is reported as a plain
// failure or success, or does not make the writer terminal; and if the
// row that did land is not recovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_wal_outcome_is_terminal_and_recovered() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    let schema = table_schema(&w);
    w.put(&rows(&[1], "a")).await.unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    {
        let seen = seen.clone();
        t.fault.set_hook(move |op| {
            let wal = op.kind == OpKind::Put && op.path.contains("/wal/");
            if !wal {
                return Action::Pass;
            }
            // The first attempt lands but its response is lost; every
            // retry (and the read-back) fails.
            if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                Action::LandThenFail
            } else {
                Action::Fail
            }
        });
    }
    let err = w.put(&rows(&[2], "b")).await.unwrap_err();
    assert!(matches!(err, Error::OutcomeUnknown { .. }), "{err}");
    assert!(err.may_be_durable());
    assert!(matches!(w.put(&rows(&[3], "c")).await, Err(e) if e.is_terminal()));
    drop(w);
    t.fault.clear_hook();
    let w2 = t.reopen_inner(config()).await;
    let got = t.read_published(&schema).await;
    assert_eq!(got.get(&1).map(String::as_str), Some("a-1"));
    // The entry did land: its row is recovered although never acknowledged.
    assert_eq!(got.get(&2).map(String::as_str), Some("b-2"));
    assert!(!got.contains_key(&3));
    w2.close().await.unwrap();
}

// Breaks if a table without a primary key is deduplicated (append-only
// tables keep every row) or if deletes are not refused for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_only_table_keeps_every_row() {
    let schema = Arc::new(arrow_schema::Schema::new(vec![
        arrow_schema::Field::new("id", arrow_schema::DataType::Int64, false),
        arrow_schema::Field::new("v", arrow_schema::DataType::Utf8, true),
    ]));
    let t = TestTable::with_schema(schema.clone()).await;
    let w = t.open(config()).await.unwrap();
    let batch = |v: &str| {
        arrow_array::RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(arrow_array::Int64Array::from(vec![1, 1])) as arrow_array::ArrayRef,
                Arc::new(arrow_array::StringArray::from(vec![v, v])),
            ],
        )
        .unwrap()
    };
    w.put(&batch("a")).await.unwrap();
    w.put(&batch("b")).await.unwrap();
    assert!(matches!(
        w.delete(&keys(&[1])).await,
        Err(Error::InvalidInput { .. })
    ));
    w.abort();
    let w2 = t.reopen_inner(config()).await;
    let m = t.manifest().await;
    assert_eq!(m.sstables.len(), 1);
    assert_eq!(
        m.sstables[0].physical_rows,
        Some(4),
        "no dedup without a key"
    );
    // Every row stays visible: no deletion vector hides a duplicate.
    let reader = memwal_sstable::SsTableReader::open_in(
        t.mem.clone(),
        &t.layout(),
        &m.sstables[0].path,
        &table_schema(&w2),
    )
    .await
    .unwrap();
    let mut visible = Vec::new();
    for b in reader.scan().await.unwrap() {
        let ids = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
        let vs = b.column_by_name("v").unwrap().as_string::<i32>();
        for r in 0..b.num_rows() {
            visible.push((ids.value(r), vs.value(r).to_string()));
        }
    }
    let expected: Vec<(i64, String)> = ["a", "a", "b", "b"]
        .iter()
        .map(|v| (1, v.to_string()))
        .collect();
    assert_eq!(visible, expected, "every appended row is visible, in order");
    w2.close().await.unwrap();
}
