//! Searching what the daemon ingested: an indexed table made by pylance,
//! fresh rows fed through `memwal serve`, found at once over SQL
//! (`vector_search`, `fts`, ADBC) and, once published, by pylance's
//! `LsmVectorSearchPlanner` over the read view.

mod common;

use std::sync::Arc;

use arrow_array::{
    ArrayRef, FixedSizeListArray, Float32Array, Int64Array, RecordBatch, StringArray,
};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::FlightDescriptor;
use arrow_schema::{DataType, Field, Schema};
use futures::TryStreamExt;

use common::*;

const FRESH: i64 = 100_000;

/// Fresh row `id`'s vector: in [50, 60), far from the base rows' [0, 1).
fn vector(id: i64) -> Vec<f32> {
    (0..16u64)
        .map(|j| {
            let x = ((id as u64) ^ (j << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            50.0 + 10.0 * ((x >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

fn fresh(ids: &[i64]) -> RecordBatch {
    let item = Arc::new(Field::new("item", DataType::Float32, true));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("vec", DataType::FixedSizeList(item.clone(), 16), true),
        Field::new("txt", DataType::Utf8, true),
        Field::new("n", DataType::Int64, true),
    ]));
    let values: Vec<f32> = ids.iter().flat_map(|id| vector(*id)).collect();
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
            Arc::new(
                FixedSizeListArray::try_new(item, 16, Arc::new(Float32Array::from(values)), None)
                    .unwrap(),
            ),
            Arc::new(StringArray::from_iter_values(
                ids.iter().map(|id| format!("fresh{id} common")),
            )),
            Arc::new(Int64Array::from(ids.to_vec())),
        ],
    )
    .unwrap()
}

// Breaks if the SSTables the daemon flushes lack the table's maintained
// indexes: pylance's planner then returns base rows for every probe (0 of
// 30 top hits) and base rows for a search filtered to fresh rows, and
// pylance lists no index on them; or if `vector_search` and `fts` over SQL
// do not find a fresh, unflushed row (its own top hit, its word's only
// match).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pylance_lsm_vector_search_finds_rows_fed_through_the_daemon() {
    let Some(python) = test_python("pylance search") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    let made = run_python(&python, "indexed_table.py", &[&table]);
    assert!(made.contains("vec_idx"), "{made}");

    let d = Daemon::start(&table, &[]);
    let mut c = client(&d.flight, None).await;
    let ids: Vec<i64> = (FRESH..FRESH + 300).collect();
    let batches: Vec<RecordBatch> = ids.chunks(100).map(fresh).collect();
    let stream = FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(FlightDescriptor::new_path(vec!["t".into()])))
        .build(futures::stream::iter(batches.into_iter().map(Ok)));
    let acks: Vec<_> = c
        .do_put(stream)
        .await
        .map_err(status)
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(acks.len(), 3);
    // Over SQL, at once (the rows are still in the daemon's memtables):
    // each probe's own row is its top hit.
    let sql_probes: Vec<serde_json::Value> = ids
        .iter()
        .step_by(30)
        .map(|id| serde_json::json!([id, vector(*id), format!("fresh{id}")]))
        .collect();
    let out = run_python(
        &python,
        "adbc_vector.py",
        &[&d.flight, "t", &serde_json::to_string(&sql_probes).unwrap()],
    );
    let got: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let want: Vec<i64> = ids.iter().step_by(30).copied().collect();
    assert_eq!(got["top"], serde_json::json!(want), "{got}");
    let each: Vec<Vec<i64>> = want.iter().map(|id| vec![*id]).collect();
    assert_eq!(got["fts"], serde_json::json!(each), "{got}");
    d.stop_ok();

    let snapshots = view_snapshots(&table, Some("vec_idx")).await;
    assert!(
        snapshots
            .iter()
            .any(|s| !s["sstables"].as_array().unwrap().is_empty()),
        "the daemon published its rows: {snapshots:?}"
    );
    let probes: Vec<serde_json::Value> = ids
        .iter()
        .step_by(10)
        .map(|id| serde_json::json!([id, vector(*id), format!("fresh{id}")]))
        .collect();
    let out = run_python(
        &python,
        "lsm_search.py",
        &[
            &table,
            &serde_json::to_string(&snapshots).unwrap(),
            &serde_json::to_string(&probes).unwrap(),
        ],
    );
    let got: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(got["top_hits"], probes.len(), "{got}");
    assert_eq!(got["filtered_fresh_only"], true, "{got}");
    assert_eq!(got["fts_hits"], probes.len(), "{got}");
    for names in got["sstable_indexes"].as_array().unwrap() {
        assert_eq!(
            names,
            &serde_json::json!(["n_btree", "txt_fts", "vec_idx"]),
            "{got}"
        );
    }

    // The daemon's compactor merges the rows and brings every index up to
    // them; /status reports each shard's catch-up and what it cost.
    let d = Daemon::launch(&table, &["--compact-every-secs", "1"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let status = loop {
        let (code, body) = http_fetch(&d.http, "/status", None);
        assert_eq!(code, 200, "{body}");
        let s: serde_json::Value = serde_json::from_str(&body).unwrap();
        let t = &s["tables"]["t"];
        let caught_up = t["shards"].as_array().is_some_and(|shards| {
            !shards.is_empty()
                && shards.iter().all(|sh| {
                    let done = sh["compacted_generation"].as_u64().unwrap_or(0);
                    done >= 1
                        && ["n_btree", "txt_fts", "vec_idx"]
                            .iter()
                            .all(|i| sh["index_catchup"][i].as_u64() == Some(done))
                })
        });
        if caught_up && t["index_catchup"]["last_commit"]["committed"] == true {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the indexes did not catch up: {s}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(
        status["tables"]["t"]["index_catchup"]["last_commit"]["seconds"].as_f64() > Some(0.0),
        "{status}"
    );
    d.stop_ok();
}

/// Rows `ids` as put number `tag` writes them: a vector in [50, 60) per
/// (id, tag), `txt` `t{tag}w{id} common`, `n` `id + tag * 10^6`.
fn tagged(ids: &[i64], tag: i64) -> RecordBatch {
    let item = Arc::new(Field::new("item", DataType::Float32, true));
    let values: Vec<f32> = ids
        .iter()
        .flat_map(|id| vector(id + tag * 1_000_000))
        .collect();
    RecordBatch::try_new(
        fresh(&[]).schema(),
        vec![
            Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
            Arc::new(
                FixedSizeListArray::try_new(item, 16, Arc::new(Float32Array::from(values)), None)
                    .unwrap(),
            ),
            Arc::new(StringArray::from_iter_values(
                ids.iter().map(|id| format!("t{tag}w{id} common")),
            )),
            Arc::new(Int64Array::from_iter_values(
                ids.iter().map(|id| id + tag * 1_000_000),
            )),
        ],
    )
    .unwrap()
}

/// Panics naming the keys where two reads (`levels_compare.py` objects)
/// differ, section by section.
fn same(got: &serde_json::Value, want: &serde_json::Value, what: &str) {
    for section in ["rows", "lookups", "nearest"] {
        let (g, w) = (&got[section], &want[section]);
        let keys: std::collections::BTreeSet<&String> = g
            .as_object()
            .into_iter()
            .chain(w.as_object())
            .flat_map(|m| m.keys())
            .collect();
        let differ: Vec<String> = keys
            .into_iter()
            .filter(|k| g.get(k.as_str()) != w.get(k.as_str()))
            .map(|k| format!("{k}: {:?} vs {:?}", g.get(k.as_str()), w.get(k.as_str())))
            .take(10)
            .collect();
        assert!(differ.is_empty(), "{what}: {section} differ: {differ:?}");
    }
}

/// `levels_compare.py`: the reads over SQL (from `flight`, when given) and
/// with pylance over the published view (when `pylance`).
async fn reads(
    python: &str,
    flight: Option<&str>,
    table: &str,
    pylance: bool,
    keys: &[i64],
    probes: &serde_json::Value,
) -> serde_json::Value {
    let (snaps, vec_snaps) = if pylance {
        (
            serde_json::to_string(&view_snapshots(table, None).await).unwrap(),
            serde_json::to_string(&view_snapshots(table, Some("vec_idx")).await).unwrap(),
        )
    } else {
        ("-".to_string(), "[]".to_string())
    };
    let out = run_python(
        python,
        "levels_compare.py",
        &[
            flight.unwrap_or("-"),
            table,
            &snaps,
            &vec_snaps,
            &serde_json::to_string(keys).unwrap(),
            &probes.to_string(),
        ],
    );
    serde_json::from_str(out.trim()).unwrap()
}

// Breaks if a SQL read through the daemon (every row, key lookups, vector
// search) differs between unflushed, published, and compacted + GC'd
// data, or from what pylance's `LsmScanner`, `LsmPointLookupPlanner` and
// `LsmVectorSearchPlanner` read from the same table; or if an overwrite
// or delete (of fresh and of base rows) is not what every read shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_reads_agree_with_pylance_before_and_after_flush_compaction_and_gc() {
    let Some(python) = test_python("pylance reads") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    run_python(&python, "indexed_table.py", &[&table]);
    let d = Daemon::start(&table, &[]);
    let mut c = client(&d.flight, None).await;
    let ids: Vec<i64> = (FRESH..FRESH + 300).collect();
    put(
        &mut c,
        &["t"],
        ids.chunks(100).map(|c| tagged(c, 1)).collect(),
    )
    .await
    .unwrap();
    let rewritten: Vec<i64> = (FRESH..FRESH + 30).chain([5, 6, 7]).collect();
    put(&mut c, &["t"], vec![tagged(&rewritten, 2)])
        .await
        .unwrap();
    let deleted: Vec<i64> = (FRESH + 40..FRESH + 50).chain([8, 9]).collect();
    put(&mut c, &["t", "delete"], vec![keys(&deleted)])
        .await
        .unwrap();
    let lookups = [
        0,
        5,
        8,
        9,
        FRESH,
        FRESH + 35,
        FRESH + 45,
        FRESH + 299,
        999_999,
    ];
    let live = |id: i64| -> Option<i64> {
        if deleted.contains(&id) {
            None
        } else if rewritten.contains(&id) {
            Some(2)
        } else {
            Some(1)
        }
    };
    let probe_ids = [FRESH, FRESH + 29, FRESH + 100, FRESH + 250, 5];
    let probes = serde_json::Value::Array(
        probe_ids
            .iter()
            .map(|&id| {
                let tag = live(id).unwrap();
                serde_json::json!([id, vector(id + tag * 1_000_000)])
            })
            .collect(),
    );

    // Unflushed: what the model says.
    let unflushed = reads(&python, Some(&d.flight), &table, false, &lookups, &probes).await;
    let sql = &unflushed["sql"];
    assert_eq!(sql["rows"].as_object().unwrap().len(), 3000 + 300 - 12);
    for k in lookups {
        let want = match (k, live(k)) {
            (999_999, _) | (_, None) => serde_json::Value::Null,
            (k, Some(_)) if k < 3000 && !rewritten.contains(&k) => {
                serde_json::json!([format!("base{k} common"), k])
            }
            (k, Some(tag)) => {
                serde_json::json!([format!("t{tag}w{k} common"), k + tag * 1_000_000])
            }
        };
        assert_eq!(sql["lookups"][k.to_string()], want, "key {k}: {sql}");
        assert_eq!(
            sql["rows"].get(k.to_string()),
            want.as_array().map(|_| &want)
        );
    }
    for id in probe_ids {
        assert_eq!(sql["nearest"][id.to_string()], id, "probe {id}");
    }
    d.stop_ok();

    // Published (the daemon flushed on stop): the same over SQL, and the
    // same with pylance.
    let d = Daemon::start(&table, &[]);
    let published = reads(&python, Some(&d.flight), &table, true, &lookups, &probes).await;
    same(&published["sql"], &unflushed["sql"], "published, SQL");
    same(
        &published["pylance"],
        &unflushed["sql"],
        "published, pylance",
    );
    d.stop_ok();

    // Compacted (the base indexes caught up) and collected.
    let (ok, out, err) = memwal(&["compact", &table]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = memwal(&["gc", &table, "--grace", "0s"]);
    assert!(ok, "{out}{err}");
    let d = Daemon::start(&table, &[]);
    let compacted = reads(&python, Some(&d.flight), &table, true, &lookups, &probes).await;
    // Nearest rows through the base's IVF_PQ index now (codes trained on
    // the base's [0, 1) vectors place the far fresh ones roughly): both
    // readers must rank alike, not as the model.
    let mut model = unflushed["sql"].clone();
    model["nearest"] = compacted["pylance"]["nearest"].clone();
    same(&compacted["sql"], &model, "compacted, SQL");
    same(&compacted["pylance"], &model, "compacted, pylance");
    d.stop_ok();
}

// Breaks if a daemon whose shard another daemon claimed answers SQL reads
// from its stale memtables (issue 35, read isolation across daemons):
// through the fenced daemon, every row, key lookups and `vector_search`
// must show the new owner's state, not the fenced writer's rows
// (overwritten and deleted since), before and after the new owner
// publishes. Fails without the epoch check of `TableHost::view_after`
// (the fenced daemon finds the deleted rows), and before the publish
// without the WAL tail reads of `reader/tails.rs` (it misses the new
// owner's rows and the ones it replayed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_daemon_reads_and_searches_the_new_owners_state() {
    let Some(python) = test_python("fenced reads") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    run_python(&python, "indexed_table.py", &[&table]);
    let a = Daemon::start(&table, &[]);
    let mut to_a = client(&a.flight, None).await;
    let ids: Vec<i64> = (FRESH..FRESH + 100).collect();
    put(&mut to_a, &["t"], vec![tagged(&ids, 1)]).await.unwrap();

    // B claims the shard (replaying A's acknowledged rows), overwrites,
    // deletes and publishes; A's writer, idle, is fenced.
    let b = Daemon::start(&table, &[]);
    let mut to_b = client(&b.flight, None).await;
    let rewritten: Vec<i64> = (FRESH..FRESH + 20).collect();
    put(&mut to_b, &["t"], vec![tagged(&rewritten, 2)])
        .await
        .unwrap();
    let deleted: Vec<i64> = (FRESH + 40..FRESH + 50).chain([8]).collect();
    put(&mut to_b, &["t", "delete"], vec![keys(&deleted)])
        .await
        .unwrap();

    let lookups = [5, 8, FRESH, FRESH + 30, FRESH + 45, FRESH + 99];
    // Each probe is the vector its row had in A's memtable.
    let probes = serde_json::Value::Array(
        [FRESH, FRESH + 10, FRESH + 30, FRESH + 42, FRESH + 47]
            .iter()
            .map(|&id| serde_json::json!([id, vector(id + 1_000_000)]))
            .collect(),
    );
    // Before B publishes, its rows (and A's, which it replayed) are only
    // in its memtables and the WAL: A reads them from the WAL.
    let unpublished = reads(&python, Some(&b.flight), &table, false, &lookups, &probes).await;
    let unpublished = &unpublished["sql"];
    assert_eq!(
        unpublished["rows"].as_object().unwrap().len(),
        3000 + 100 - 11
    );
    let through_a = reads(&python, Some(&a.flight), &table, false, &lookups, &probes).await;
    let through_a = &through_a["sql"];
    assert_eq!(
        through_a["nearest"], unpublished["nearest"],
        "vector_search through the fenced daemon, B's rows unpublished"
    );
    assert_eq!(
        through_a["lookups"], unpublished["lookups"],
        "lookups through the fenced daemon, B's rows unpublished"
    );
    same(
        through_a,
        unpublished,
        "through the fenced daemon, B's rows unpublished",
    );
    flush(&mut to_b).await;

    let through_b = reads(&python, Some(&b.flight), &table, false, &lookups, &probes).await;
    let sql = &through_b["sql"];
    assert_eq!(sql["rows"].as_object().unwrap().len(), 3000 + 100 - 11);
    assert_eq!(
        sql["lookups"][(FRESH + 45).to_string()],
        serde_json::Value::Null
    );
    assert_eq!(sql["nearest"][(FRESH + 30).to_string()], FRESH + 30);
    assert_ne!(sql["nearest"][(FRESH + 42).to_string()], FRESH + 42);
    let through_a = reads(&python, Some(&a.flight), &table, false, &lookups, &probes).await;
    let through_a = &through_a["sql"];
    assert_eq!(
        through_a["nearest"], sql["nearest"],
        "vector_search through the fenced daemon"
    );
    assert_eq!(
        through_a["lookups"], sql["lookups"],
        "lookups through the fenced daemon"
    );
    same(through_a, sql, "through the fenced daemon");
    a.stop_ok();
    b.stop_ok();
}
