//! The scenario as a process: a column added to the base table
//! while `memwal serve` ingests, producers of both schemas writing through
//! the change with no restart, a SIGKILL, and compaction.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use futures::StreamExt;

use crate::common::*;

/// key -> (v, extra, extra2) as stored.
type Stored = BTreeMap<i64, (String, Option<String>, Option<String>)>;

fn with_columns(ids: &[i64], tag: &str, names: &[&str]) -> RecordBatch {
    let b = rows(ids, tag);
    let mut fields: Vec<Field> = b
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let mut columns = b.columns().to_vec();
    for n in names {
        fields.push(Field::new(*n, DataType::Utf8, true));
        columns.push(Arc::new(StringArray::from_iter_values(
            ids.iter().map(|i| format!("{n}-{tag}-{i}")),
        )) as ArrayRef);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

fn expect(model: &mut Stored, ids: &[i64], tag: &str, names: &[&str]) {
    let has = |n: &str, i: i64| names.contains(&n).then(|| format!("{n}-{tag}-{i}"));
    for &i in ids {
        model.insert(i, (format!("{tag}-{i}"), has("extra", i), has("extra2", i)));
    }
}

async fn add_column(table: &str, name: &str) {
    let mut ds = lance::Dataset::open(table).await.unwrap();
    let col = Arc::new(Schema::new(vec![Field::new(name, DataType::Utf8, true)]));
    ds.add_columns(
        lance::dataset::NewColumnTransform::AllNulls(col),
        None,
        None,
    )
    .await
    .unwrap();
}

async fn stored(table: &str) -> Stored {
    let batches = base_batches(table).await;
    let mut out = Stored::new();
    for b in &batches {
        let ids = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
        let text = |n: &str, i: usize| {
            b.column_by_name(n).and_then(|c| {
                let c = c.as_string::<i32>();
                c.is_valid(i).then(|| c.value(i).to_string())
            })
        };
        for i in 0..b.num_rows() {
            let row = (text("v", i).unwrap(), text("extra", i), text("extra2", i));
            assert!(out.insert(ids.value(i), row).is_none(), "key twice");
        }
    }
    out
}

// Breaks if the daemon does not notice a column added to the base while it
// ingests (a put with it refused until a restart), if a producer still on
// the old columns is refused at any point, if some shard refuses either
// schema after the change, if the WAL spanning the change does not replay
// after SIGKILL, if the `evolve` action does not follow a change at once,
// or if compaction of generations of three schemas loses a row or fills a
// column wrongly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_added_while_ingesting_reaches_every_shard_and_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let d = Daemon::start(&table, &["--schema-poll-ms", "50"]);
    let model = Arc::new(std::sync::Mutex::new(Stored::new()));

    // The old-schema producer writes all through the change; every put
    // must be acknowledged.
    let stop = Arc::new(AtomicBool::new(false));
    let old_producer = {
        let (addr, model, stop) = (d.flight.clone(), model.clone(), stop.clone());
        tokio::spawn(async move {
            let mut c = client(&addr, None).await;
            let mut round = 0i64;
            while !stop.load(Ordering::SeqCst) || round < 3 {
                let ids: Vec<i64> = (0..8).map(|k| round * 8 + k).collect();
                let tag = format!("old{round}");
                put(&mut c, &["t"], vec![rows(&ids, &tag)])
                    .await
                    .unwrap_or_else(|e| panic!("old-schema put {round} refused: {e}"));
                expect(&mut model.lock().unwrap(), &ids, &tag, &[]);
                round += 1;
            }
            round
        })
    };

    add_column(&table, "extra").await;
    // The new-schema producer: refused (nothing written) until the daemon
    // follows the change, then always acknowledged, on every shard.
    let mut c = client(&d.flight, None).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut refused = 0;
    let mut acked = 0;
    let mut round = 0i64;
    while acked < 6 {
        let ids: Vec<i64> = (0..8).map(|k| 100_000 + round * 8 + k).collect();
        let tag = format!("new{round}");
        round += 1;
        match put(&mut c, &["t"], vec![with_columns(&ids, &tag, &["extra"])]).await {
            Ok(_) => {
                acked += 1;
                expect(&mut model.lock().unwrap(), &ids, &tag, &["extra"]);
            }
            Err(e) => {
                assert_eq!(acked, 0, "refused after the change was followed: {e}");
                assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
                assert!(e.message().contains("extra"), "{e}");
                refused += 1;
                assert!(
                    Instant::now() < deadline,
                    "the daemon never followed the new column"
                );
                tokio::task::yield_now().await;
            }
        }
    }
    let served = c
        .get_schema(arrow_flight::FlightDescriptor::new_path(vec!["t".into()]))
        .await
        .unwrap();
    let names: Vec<&str> = served.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(
        names,
        ["id", "v", "extra"],
        "GetSchema answers the new schema"
    );
    stop.store(true, Ordering::SeqCst);
    let old_rounds = old_producer.await.unwrap();
    assert!(old_rounds >= 3, "{old_rounds}");
    eprintln!("new-schema puts refused before the change was followed: {refused}");

    // SIGKILL: everything since the last publish is only in the WAL,
    // entries of both schemas.
    let mut d = d;
    d.child.kill().unwrap();
    d.child.wait().unwrap();

    // Restarted with no polling: the `evolve` action follows the next
    // change at once.
    let d = Daemon::start(&table, &["--schema-poll-ms", "0"]);
    let mut c = client(&d.flight, None).await;
    let mut model = model.lock().unwrap().clone();
    put(&mut c, &["t"], vec![rows(&[500_000], "after")])
        .await
        .unwrap();
    expect(&mut model, &[500_000], "after", &[]);
    add_column(&table, "extra2").await;
    let reply: Vec<arrow_flight::Result> = c
        .do_action(arrow_flight::Action::new("evolve", "t"))
        .await
        .unwrap()
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .map(|b| arrow_flight::Result { body: b })
        .collect();
    let body: serde_json::Value = serde_json::from_slice(&reply[0].body).unwrap();
    assert_eq!(body["changed"], true, "{body}");
    assert_eq!(
        body["columns"],
        serde_json::json!(["id", "v", "extra", "extra2"]),
        "{body}"
    );
    let ids: Vec<i64> = (600_000..600_016).collect();
    put(
        &mut c,
        &["t"],
        vec![with_columns(&ids, "both", &["extra", "extra2"])],
    )
    .await
    .unwrap();
    expect(&mut model, &ids, "both", &["extra", "extra2"]);
    let ids: Vec<i64> = (700_000..700_016).collect();
    put(&mut c, &["t"], vec![rows(&ids, "legacy")])
        .await
        .unwrap();
    expect(&mut model, &ids, "legacy", &[]);
    d.stop_ok();

    // pylance's `LsmScanner` reads generations of all three schemas.
    if let Some(python) = test_python("pylance LsmScanner") {
        let snapshots = view_snapshots(&table, None).await;
        let out = run_python(
            &python,
            "lsm_read.py",
            &[&table, &serde_json::to_string(&snapshots).unwrap()],
        );
        let got: BTreeMap<i64, serde_json::Value> =
            serde_json::from_str::<BTreeMap<String, serde_json::Value>>(out.trim())
                .unwrap()
                .into_iter()
                .map(|(k, v)| (k.parse().unwrap(), v))
                .collect();
        let want: BTreeMap<i64, serde_json::Value> = model
            .iter()
            .map(|(k, (v, e, e2))| (*k, serde_json::json!({"v": v, "extra": e, "extra2": e2})))
            .collect();
        assert_eq!(got, want, "pylance LsmScanner before compaction");
    }

    let (ok, out, err) = memwal(&["compact", &table]);
    assert!(ok, "{out} {err}");
    assert_eq!(stored(&table).await, model);
}
