//! `memwal serve` as a process, driven by the Rust Arrow Flight client.

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::{FlightClient, FlightDescriptor};
use arrow_schema::{DataType, Field, Schema};
use futures::{StreamExt, TryStreamExt};

use common::*;

// Breaks if the daemon acknowledges before a batch is split and durable in
// every owning shard (the acks name one part per shard), loses a put,
// overwrite or delete across SIGTERM and restart, maps bad input to the
// wrong status or stops serving after it, or ignores the bearer token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_overwrite_delete_restart_and_compact_through_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let mut model = BTreeMap::new();

    let d = Daemon::start(&table, &["--token", "s3cret"]);
    let mut c = client(&d.flight, Some("s3cret")).await;
    let ids: Vec<i64> = (0..40).collect();
    let acks = put(&mut c, &["t"], vec![rows(&ids, "a"), rows(&ids[..10], "b")])
        .await
        .unwrap();
    assert_eq!(acks.len(), 2, "one ack per batch: {acks:?}");
    let parts = acks[0]["parts"].as_array().unwrap();
    assert_eq!(parts.len(), 4, "40 keys reach all four buckets: {acks:?}");
    assert_eq!(
        parts
            .iter()
            .map(|p| p["rows"].as_u64().unwrap())
            .sum::<u64>(),
        40
    );
    for i in &ids {
        model.insert(*i, format!("{}-{i}", if *i < 10 { "b" } else { "a" }));
    }
    let acks = put(&mut c, &["t", "delete"], vec![keys(&[5, 20, 21])])
        .await
        .unwrap();
    assert_eq!(acks.len(), 1);
    for i in [5, 20, 21] {
        model.remove(&i);
    }

    // Bad input: the right codes, and the daemon keeps serving.
    let e = put(&mut c, &["nope"], vec![rows(&[1], "x")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    let e = put(&mut c, &["t", "delete"], vec![rows(&[1], "x")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("table `t`"), "{e}");
    // A null primary key: refused naming the column, nothing of it written.
    let nullable = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("v", DataType::Utf8, true),
    ]));
    let null_key = RecordBatch::try_new(
        nullable,
        vec![
            Arc::new(Int64Array::from(vec![Some(500), None])) as ArrayRef,
            Arc::new(StringArray::from(vec!["n", "n"])),
        ],
    )
    .unwrap();
    let e = put(&mut c, &["t"], vec![null_key]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("`id`"), "{e}");
    let mut anonymous = client(&d.flight, None).await;
    let e = put(&mut anonymous, &["t"], vec![rows(&[1], "x")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
    let acks = put(&mut c, &["t"], vec![rows(&[100], "c")]).await.unwrap();
    assert_eq!(acks.len(), 1, "still serving after bad input");
    model.insert(100, "c-100".into());

    // HTTP: health open, the rest behind the token.
    assert_eq!(http_get(&d.http, "/healthz", None), 200);
    assert_eq!(http_get(&d.http, "/status", None), 401);
    assert_eq!(http_get(&d.http, "/status", Some("s3cret")), 200);
    let (code, metrics) = http_fetch(&d.http, "/metrics", Some("s3cret"));
    assert_eq!(code, 200);
    // Per-shard series: each of the four shards has its own put counter.
    let shards: std::collections::BTreeSet<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("memwal_writer_puts_total{"))
        .filter_map(|l| l.split("shard=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(shards.len(), 4, "{metrics}");
    assert_eq!(http_get(&d.http, "/readyz", Some("s3cret")), 200);

    assert!(d.stop().success(), "SIGTERM drains and exits 0");

    // Restart: the shards are found again; more writes.
    let d = Daemon::start(&table, &[]);
    let mut c = client(&d.flight, None).await;
    put(&mut c, &["t"], vec![rows(&[0, 1, 200], "d")])
        .await
        .unwrap();
    for i in [0, 1, 200] {
        model.insert(i, format!("d-{i}"));
    }
    put(&mut c, &["t", "delete"], vec![keys(&[30])])
        .await
        .unwrap();
    model.remove(&30);
    assert!(d.stop().success());

    let (ok, out, err) = memwal(&["compact", &table]);
    assert!(ok, "{out} {err}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("shard ")).count(),
        4,
        "four shards, no more after the restart: {out}"
    );
    assert!(
        out.lines().any(|l| l.starts_with("base: ")),
        "the cycle's base maintenance: {out}"
    );
    assert_eq!(base_rows(&table).await, model);

    // `inspect` reports what is stored: per shard two epochs (two daemon
    // starts), every WAL entry, SSTables compacted through the recorded
    // generation; `--shard` narrows to one, an unknown shard is refused.
    let (ok, out, err) = memwal(&["inspect", &table, "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let shards = v["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 4, "{v}");
    for s in shards {
        assert_eq!(s["manifest"]["epoch"], 2, "{s}");
        let wal = &s["wal"];
        assert!(wal["entries"].as_u64().unwrap() >= 3, "{s}");
        let tail = wal["tail"].as_array().unwrap();
        assert!(
            tail.iter()
                .any(|e| e["kind"] == "sentinel" && e["epoch"] == 2),
            "{s}"
        );
        let done = s["compacted_generation"].as_u64().unwrap();
        assert!(done >= 1, "{s}");
        for sst in s["sstables"].as_array().unwrap() {
            let compacted = sst["generation"].as_u64().unwrap() <= done;
            assert_eq!(sst["state"] == "compacted", compacted, "{s}");
        }
    }
    let one = shards[0]["shard"].as_str().unwrap();
    let (ok, out, err) = memwal(&["inspect", &table, "--shard", one]);
    assert!(ok, "{err}");
    assert_eq!(out.matches("\nshard ").count(), 1, "{out}");
    assert!(out.contains(one) && out.contains("SSTables"), "{out}");
    let (ok, _, err) = memwal(&[
        "inspect",
        &table,
        "--shard",
        "6f1c2a9e-4b7d-4f3a-9c1e-2d5b8a7e0f11",
    ]);
    assert!(!ok && err.contains("no shard"), "{err}");
}

// Breaks if ADBC's Flight SQL driver (`adbc_ingest`, no custom client code)
// cannot ingest through the daemon: GetSqlInfo must name the server, each
// ingest must report its row count only once durable (the rows survive a
// SIGKILL right after, replay on restart and are in the base table after
// compaction, read by pylance and by lance alike, last write wins), and
// mode "create", an unknown table and a wrong token must be refused with
// their codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adbc_bulk_ingest_writes_through_the_daemon_and_pylance_reads_it() {
    let Some(python) = test_python("ADBC") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let d = Daemon::start(&table, &["--token", "sesame"]);
    let out = run_python(&python, "adbc_ingest.py", &[&d.flight, "t", "sesame"]);
    let got: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(got["vendor_name"], "memwal", "{got}");
    assert_eq!(got["counts"], serde_json::json!([10, 10]), "{got}");
    for (key, code) in [
        ("create_refused", "ALREADY_EXISTS"),
        ("unknown_refused", "NOT_FOUND"),
        ("token_refused", "UNAUTHENTICATED"),
    ] {
        let msg = got[key].as_str().unwrap_or_else(|| panic!("{key}: {got}"));
        assert!(msg.contains(code), "{key}: {msg}");
    }
    // SIGKILL: nothing flushed; the reported rows must be in the WAL.
    let mut d = d;
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    assert!(Daemon::start(&table, &[]).stop().success());
    let (ok, out, err) = memwal(&["compact", &table]);
    assert!(ok, "{out} {err}");
    let mut model = BTreeMap::new();
    for i in 0..15i64 {
        let tag = if (5..10).contains(&i) { "a" } else { "b" };
        model.insert(i, format!("{tag}-{i}"));
    }
    assert_eq!(base_rows(&table).await, model);
    let read: BTreeMap<String, String> =
        serde_json::from_str(run_python(&python, "lance_read.py", &[&table]).trim()).unwrap();
    let read: BTreeMap<i64, String> = read
        .into_iter()
        .map(|(k, v)| (k.parse().unwrap(), v))
        .collect();
    assert_eq!(read, model, "pylance's view of the base table");
}

// Breaks if pyarrow's Flight client (a user's real client) cannot write
// through the daemon: per-batch acks in order with the request id echoed,
// deletes by key, and the rows in the base table after compaction. Needs
// MEMWAL_TEST_PYTHON (`eval "$(scripts/py-clients.sh)"`); required in CI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyarrow_flight_client_writes_through_the_daemon() {
    let Some(python) = test_python("pyarrow") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let d = Daemon::start(&table, &[]);
    let out = run_python(&python, "flight_put.py", &[&d.flight, "t"]);
    let acks: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(acks.len(), 5, "{acks:?}");
    for (n, ack) in acks[..3].iter().enumerate() {
        assert_eq!(ack["request_id"], format!("req-{n}"), "{ack}");
        assert_eq!(ack["batch"], n as u64 + 1, "{ack}");
    }
    assert_eq!(acks[3]["delete"], true);
    assert_eq!(acks[4]["request_id"], "big");
    assert_eq!(acks[4]["rows"], 8000, "one ack for the whole large batch");
    assert!(d.stop().success());
    let (ok, out, err) = memwal(&["compact", &table]);
    assert!(ok, "{out} {err}");
    let mut model = BTreeMap::new();
    for i in 0..20 {
        model.insert(
            i,
            format!(
                "py{}-{i}",
                if i < 5 {
                    2
                } else if i < 10 {
                    0
                } else {
                    1
                }
            ),
        );
    }
    model.remove(&7);
    let mut got = base_rows(&table).await;
    let big: Vec<i64> = got.range(1000..).map(|(k, _)| *k).collect();
    assert_eq!(big, (1000..9000).collect::<Vec<i64>>());
    assert!(got[&1000].starts_with("big-1000-"));
    got.retain(|k, _| *k < 1000);
    assert_eq!(got, model);
}

// Breaks if a SIGKILLed daemon loses an acknowledged row (the restarted one
// must replay every shard's WAL), or if a daemon whose shards a second
// daemon took over keeps acknowledging instead of refusing with
// FAILED_PRECONDITION naming the epochs, or stops serving altogether.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loses_nothing_and_a_taken_over_daemon_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let mut model = BTreeMap::new();
    let mut d = Daemon::start(&table, &[]);
    let mut c = client(&d.flight, None).await;
    for round in 0..5 {
        let ids: Vec<i64> = (round * 10..round * 10 + 15).collect();
        put(&mut c, &["t"], vec![rows(&ids, &format!("r{round}"))])
            .await
            .unwrap();
        for i in ids {
            model.insert(i, format!("r{round}-{i}"));
        }
    }
    d.child.kill().unwrap(); // SIGKILL: nothing flushed, only the WAL
    d.child.wait().unwrap();

    let a = Daemon::start(&table, &[]);
    let mut ca = client(&a.flight, None).await;
    put(&mut ca, &["t"], vec![rows(&[1000], "a")])
        .await
        .unwrap();
    model.insert(1000, "a-1000".into());
    // A second daemon takes every shard over.
    let b = Daemon::start(&table, &[]);
    let mut cb = client(&b.flight, None).await;
    let e = put(&mut ca, &["t"], vec![rows(&[1000], "lost")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
    assert!(e.message().contains("epoch"), "{e}");
    // Still up: status answers and names the lost shard.
    assert_eq!(http_get(&a.http, "/healthz", None), 200);
    put(&mut cb, &["t"], vec![rows(&[1001], "b")])
        .await
        .unwrap();
    model.insert(1001, "b-1001".into());
    assert!(b.stop().success());
    let _ = a.stop();
    let (ok, out, err) = memwal(&["compact", &table]);
    assert!(ok, "{out} {err}");
    assert_eq!(base_rows(&table).await, model);
}

// Breaks if `memwal load` reports rows the daemon did not acknowledge (the
// base after compaction must hold exactly them), or passes over a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memwal_load_writes_what_it_reports() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let d = Daemon::start(&table, &[]);
    let (ok, out, err) = memwal(&[
        "load",
        "--to",
        &d.flight,
        "--table",
        "t",
        "--rows",
        "3000",
        "--batch",
        "400",
        "--producers",
        "3",
    ]);
    assert!(ok, "{err}");
    assert!(out.starts_with("3000 rows in"), "{out}");
    assert!(out.contains("(8 batches of 400, 3 producers)"), "{out}");
    let (ok, _, err) = memwal(&["load", "--to", &d.flight, "--table", "nope", "--rows", "10"]);
    assert!(!ok && err.contains("no table `nope`"), "{err}");
    assert!(d.stop().success());
    let (ok, out, err) = memwal(&["compact", &table]);
    assert!(ok, "{out} {err}");
    let base = base_rows(&table).await;
    assert_eq!(base.len(), 3000);
    assert!(base.keys().copied().eq(0..3000), "keys 0..3000");
}

// Breaks if SIGTERM waits forever for a client that keeps its DoPut stream
// open (the daemon must cut it after --drain-secs and still close every
// shard and exit 0), if a batch sent on it after the drain is acknowledged
// or written (before the fix the ingest task outlived the cut), or if the
// batch acknowledged on that stream is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_cuts_a_stream_left_open_and_keeps_its_acknowledged_rows() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let d = Daemon::start(&table, &["--drain-secs", "1"]);
    let mut c = client(&d.flight, None).await;
    let (tx, rx) = futures::channel::mpsc::unbounded::<RecordBatch>();
    tx.unbounded_send(rows(&[1, 2, 3], "open")).unwrap();
    let stream = FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(FlightDescriptor::new_path(vec!["t".into()])))
        .build(rx.map(Ok));
    let mut acks = c.do_put(stream).await.unwrap();
    let first = acks.try_next().await.unwrap().expect("one ack");
    let ack: serde_json::Value = serde_json::from_slice(&first.app_metadata).unwrap();
    assert_eq!(ack["rows"], 3, "{ack}");
    // `tx` stays alive: the stream is open while the daemon stops.
    let pid = d.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    // Once the drain expires the daemon cuts the stream: a batch sent then
    // (keys of every bucket: shards were open, and it must not open any)
    // is not acknowledged and never written.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !d
        .log
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("cutting them"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the drain never expired"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // (A stream already cut cannot even take it: also not acknowledged.)
    let _ = tx.unbounded_send(rows(&[4, 5, 6, 7, 8, 9, 10, 11], "late"));
    let late = acks.try_next().await;
    assert!(
        !matches!(late, Ok(Some(_))),
        "a batch sent after the drain was acknowledged: {late:?}"
    );
    let status = tokio::time::timeout(
        std::time::Duration::from_secs(90),
        tokio::task::spawn_blocking(move || {
            let mut d = d;
            d.child.wait().unwrap()
        }),
    )
    .await
    .expect("the daemon exits despite the open stream")
    .unwrap();
    assert!(status.success(), "{status}");
    drop(tx);
    let (ok, out, err) = memwal(&["compact", &table]);
    assert!(ok, "{out} {err}");
    let got = base_rows(&table).await;
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3]);
}

// Breaks if `--tls-cert/--tls-key` do not serve Flight over TLS (a client
// trusting the certificate must put and get its ack; a plaintext client
// must not get through), or if a bad certificate file is accepted at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flight_over_tls_with_a_configured_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert_pem = cert.cert.pem();
    let cert_path = dir.path().join("server.pem");
    let key_path = dir.path().join("server.key");
    std::fs::write(&cert_path, &cert_pem).unwrap();
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
    let d = Daemon::start(
        &table,
        &[
            "--tls-cert",
            cert_path.to_str().unwrap(),
            "--tls-key",
            key_path.to_str().unwrap(),
        ],
    );
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&cert_pem))
        .domain_name("localhost");
    let channel = tonic::transport::Channel::from_shared(format!("https://{}", d.flight))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("a TLS connection");
    let mut c = FlightClient::new(channel);
    let acks = put(&mut c, &["t"], vec![rows(&[1, 2], "tls")])
        .await
        .unwrap();
    assert_eq!(acks.len(), 1, "{acks:?}");
    // Plaintext gRPC against the TLS port fails.
    let plain = tonic::transport::Channel::from_shared(format!("http://{}", d.flight))
        .unwrap()
        .connect()
        .await;
    if let Ok(channel) = plain {
        let mut c = FlightClient::new(channel);
        assert!(put(&mut c, &["t"], vec![rows(&[3], "plain")])
            .await
            .is_err());
    }
    // `memwal load` over TLS.
    let (ok, out, err) = memwal(&[
        "load",
        "--to",
        &d.flight,
        "--table",
        "t",
        "--rows",
        "1000",
        "--batch",
        "250",
        "--producers",
        "2",
        "--tls-ca",
        cert_path.to_str().unwrap(),
        "--tls-domain",
        "localhost",
    ]);
    assert!(ok, "{out} {err}");
    assert!(d.stop().success());

    std::fs::write(&cert_path, "not a certificate").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_memwal"))
        .args([
            "serve",
            "--table",
            &format!("t={table}"),
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--http", "127.0.0.1:0", "--no-compactor"])
        .args(["--tls-cert", cert_path.to_str().unwrap()])
        .args(["--tls-key", key_path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("TLS"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// Breaks if `memwal serve` does not run the compactor and GC by default:
// after a `flush` action, every shard's published generation must reach the
// base table (compaction lag 0 in /status) and the flushed WAL entries must
// be collected, with no CLI command run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_compacts_and_collects_garbage_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let d = Daemon::launch(
        &table,
        &["--compact-every-secs", "1", "--gc-grace-secs", "0"],
    );
    let mut c = client(&d.flight, None).await;
    let ids: Vec<i64> = (0..40).collect();
    for round in 0..3 {
        put(&mut c, &["t"], vec![rows(&ids, &format!("r{round}"))])
            .await
            .unwrap();
    }
    flush(&mut c).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let (_, body) = http_fetch(&d.http, "/status", None);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let shards = v["tables"]["t"]["shards"].as_array().unwrap().clone();
        let caught_up = shards.len() == 4
            && shards.iter().all(|s| {
                s["compacted_generation"].as_u64() >= Some(1)
                    && s["compaction_lag_generations"] == 0
            });
        if caught_up {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no compaction within 2 minutes: {v}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // GC runs right after the cycle that compacted: wait for it to have
    // collected the flushed WAL entries (each shard keeps only its epoch's
    // first slot, the sentinel).
    loop {
        let (ok, out, err) = memwal(&["inspect", &table, "--json"]);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let collected = v["shards"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["wal"]["entries"] == 1);
        if collected {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no GC within 2 minutes: {v}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(d.stop().success());
    let got = base_rows(&table).await;
    assert_eq!(got.len(), 40);
    assert!(got.values().all(|v| v.starts_with("r2-")), "{got:?}");
}

// Breaks if a normal run (ingest, flushes, compaction with base
// maintenance and GC, SQL reads) logs anything at ERROR: lance logs
// "Index __lance_mem_wal has no fields" at ERROR for the MemWAL system
// index on every compaction cycle and many reads, which the daemon's log
// filter drops. Also checks that /status reports the base's health after
// maintenance ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_normal_ingest_compaction_and_read_run_logs_no_error() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let d = Daemon::launch(
        &table,
        &[
            "--compact-every-secs",
            "1",
            "--gc-grace-secs",
            "0",
            "--min-flush-interval-ms",
            "0",
        ],
    );
    let mut c = client(&d.flight, None).await;
    for round in 0..4i64 {
        let ids: Vec<i64> = (round * 10..round * 10 + 40).collect();
        put(&mut c, &["t"], vec![rows(&ids, &format!("r{round}"))])
            .await
            .unwrap();
        flush(&mut c).await;
        let n = sql_rows(&d.flight, "SELECT count(*) AS n FROM t")
            .await
            .unwrap();
        assert_eq!(n[0].num_rows(), 1);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let status = loop {
        let (_, body) = http_fetch(&d.http, "/status", None);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let t = &v["tables"]["t"];
        let caught_up = t["shards"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["compaction_lag_generations"] == 0 && s["pending_sstables"] == 0);
        if caught_up && t["maintenance"]["base"]["live_rows"] == 70 {
            break v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not compacted and maintained within 2 minutes: {v}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let base = &status["tables"]["t"]["maintenance"]["base"];
    assert!(base["fragments"].as_u64().unwrap() >= 1, "{status}");
    let rows = sql_rows(&d.flight, "SELECT id, v FROM t WHERE id = 5")
        .await
        .unwrap();
    assert_eq!(rows[0].num_rows(), 1);
    let errors = d.errors.clone();
    d.stop_ok();
    let errors = errors.lock().unwrap().clone();
    assert!(
        errors.is_empty(),
        "lines logged at ERROR:\n{}",
        errors.join("\n")
    );
}

// A SIGTERM that arrives while the daemon is still claiming and replaying
// stops it gracefully once its tables are open (flushing what it
// replayed), instead of the default action killing it. Breaks if the
// signal handlers are installed only after the daemon starts serving.
#[test]
fn sigterm_while_opening_stops_gracefully() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let mut child = Command::new(env!("CARGO_BIN_EXE_memwal"))
        .args(["serve", "--table", &format!("t={table}"), "--no-compactor"])
        .args(["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let opening = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("opening tables"));
    assert!(opening.is_some(), "no `opening tables` line");
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}: {rest:?}");
    assert!(rest.iter().any(|l| l.contains("stopping")), "{rest:?}");
}

// Breaks if a shard no rows arrive for stays open for good with its metric
// series (identity sharding would grow both without bound): with
// `--shard-idle-secs 1` the shard is flushed, closed and forgotten (gone
// from /status), its `memwal_writer_*` series leave /metrics, its rows are
// published, and a later put opens it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_shard_is_closed_and_its_series_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let d = Daemon::start(&table, &["--shard-idle-secs", "1"]);
    let mut c = client(&d.flight, None).await;
    put(&mut c, &["t"], vec![rows(&[1], "a")]).await.unwrap();
    let (_, m) = http_fetch(&d.http, "/metrics", None);
    assert!(m.contains("memwal_writer_rows_total{"), "{m}");
    let shards = || {
        let (_, s) = http_fetch(&d.http, "/status", None);
        let s: serde_json::Value = serde_json::from_str(&s).unwrap();
        s["tables"]["t"]["shards"].as_array().unwrap().len()
    };
    assert_eq!(shards(), 1);
    // Closed after a second without rows; its series go a second later.
    // Polled, bounded: a shard still open after a minute fails.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (_, m) = http_fetch(&d.http, "/metrics", None);
        if shards() == 0 && !m.contains("memwal_writer_") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "after a minute idle: {} shards open; metrics:\n{m}",
            shards()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    put(&mut c, &["t"], vec![rows(&[2], "b")]).await.unwrap();
    assert_eq!(shards(), 1, "a put opens the shard again");
    d.stop_ok();
    let (ok, out, err) = memwal(&["compact", &table]);
    assert!(ok, "{out}{err}");
    let want: BTreeMap<i64, String> = [(1, "a-1"), (2, "b-2")]
        .map(|(k, v)| (k, v.to_string()))
        .into();
    assert_eq!(base_rows(&table).await, want);
}

// Breaks if a panic in a shard writer's flusher goes unseen: the writer
// must turn terminal with the panic as its error, so a `flush` action ends
// with an error instead of waiting for ever, /status names the panic, and
// the acknowledged rows stay durable (the next daemon replays them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flusher_panic_fails_its_shard_visibly() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table(&table);
    let d = Daemon::try_launch(
        &table,
        &["--no-compactor"],
        &[("FAILPOINTS", "writer::before_publish=1*panic")],
    )
    .expect("daemon ended before serving");
    let mut c = client(&d.flight, None).await;
    let ids: Vec<i64> = (0..20).collect();
    put(&mut c, &["t"], vec![rows(&ids, "a")]).await.unwrap();
    let flush = async {
        c.do_action(arrow_flight::Action::new("flush", "t"))
            .await?
            .try_collect::<Vec<_>>()
            .await
    };
    let flushed = tokio::time::timeout(std::time::Duration::from_secs(60), flush)
        .await
        .expect("the flush action waited a minute on a flusher that had panicked");
    assert!(flushed.is_err(), "a flush whose flusher panicked succeeded");
    let (_, status) = http_fetch(&d.http, "/status", None);
    assert!(status.contains("the flusher panicked"), "{status}");
    let _ = d.stop();
    Daemon::start(&table, &[]).stop_ok();
    let (ok, out, err) = memwal(&["compact", &table]);
    assert!(ok, "{out}{err}");
    assert_eq!(base_rows(&table).await.len(), ids.len());
}

#[path = "daemon/schema.rs"]
mod schema;

#[path = "daemon/reads.rs"]
mod reads;

#[path = "daemon/hostile_sql.rs"]
mod hostile_sql;

#[path = "daemon/producers.rs"]
mod producers;
