//! `memwal serve --cluster`: several daemons over one table and a real etcd
//! (`memwal_testkit::EtcdServer`), driven as a client would.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use common::*;
use memwal_testkit::EtcdServer;

/// The table's shards (buckets).
const SHARDS: usize = 32;

/// A real etcd and a `bucket(id, 32)` table (`id` int64 key, `v` utf8)
/// in a temporary directory (kept while the returned guard lives): enough
/// shards that each of three members gets some (with 8, one gets none for
/// about 12% of random member ids).
fn etcd_and_table() -> (EtcdServer, tempfile::TempDir, String) {
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t").to_str().unwrap().to_string();
    init_bucket_table_of(&table, SHARDS);
    (etcd, dir, table)
}

/// A cluster member serving `table` as `t` (failover in 3 s: 2 s leases).
fn member(table: &str, etcd: &EtcdServer) -> Daemon {
    cluster_member(table, &etcd.endpoint())
}

/// `t`'s cluster section of a daemon's `/status`.
fn cluster_status(d: &Daemon) -> serde_json::Value {
    let (code, body) = http_fetch(&d.http, "/status", None);
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["tables"]["t"]["cluster"].clone()
}

/// Waits (up to 30 s) until every daemon sees `n` members and all
/// shards recorded on the member the cluster places them on; returns the
/// owners (shard -> member id) and each daemon's member id.
fn settled(daemons: &[&Daemon], n: usize) -> (BTreeMap<String, String>, Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let views: Vec<serde_json::Value> = daemons.iter().map(|d| cluster_status(d)).collect();
        let ok = views.iter().all(|v| {
            let shards = v["shards"].as_object().unwrap();
            v["members"].as_array().unwrap().len() == n
                && shards.len() == SHARDS
                && shards.values().all(|s| s["owner"] == s["desired"])
        }) && views.windows(2).all(|w| w[0]["shards"] == w[1]["shards"]);
        if ok {
            let owners = views[0]["shards"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(s, o)| (s.clone(), o["owner"].as_str().unwrap().to_string()))
                .collect();
            let ids = views
                .iter()
                .map(|v| v["member"].as_str().unwrap().to_string())
                .collect();
            return (owners, ids);
        }
        assert!(
            Instant::now() < deadline,
            "the cluster did not settle on {n} members within 30 s: {views:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Puts `ids` (tag `tag`) through `d`, retrying while a shard moves
/// (UNAVAILABLE; or ABORTED: some parts durable, the rest moving); panics
/// on any other error or after `within`. Returns how long it took.
async fn put_until_ok(d: &Daemon, ids: &[i64], tag: &str, within: Duration) -> Duration {
    put_until_ok_via(d, None, ids, tag, within).await
}

/// A channel to `d`'s Flight service: TLS verified against the CA
/// `tls_ca` (PEM, for `localhost`) when given.
async fn channel_to(d: &Daemon, tls_ca: Option<&str>) -> tonic::transport::Channel {
    match tls_ca {
        None => tonic::transport::Channel::from_shared(format!("http://{}", d.flight)).unwrap(),
        Some(ca) => tonic::transport::Channel::from_shared(format!("https://{}", d.flight))
            .unwrap()
            .tls_config(
                tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(ca))
                    .domain_name("localhost"),
            )
            .unwrap(),
    }
    .connect()
    .await
    .expect("connect to the daemon")
}

/// [`put_until_ok`] over TLS when `tls_ca` is given.
async fn put_until_ok_via(
    d: &Daemon,
    tls_ca: Option<&str>,
    ids: &[i64],
    tag: &str,
    within: Duration,
) -> Duration {
    let started = Instant::now();
    loop {
        let mut c = arrow_flight::FlightClient::new(channel_to(d, tls_ca).await);
        match put(&mut c, &["t"], vec![rows(ids, tag)]).await {
            Ok(acks) => {
                let parts = acks[0]["parts"].as_array().unwrap();
                let acked: u64 = parts.iter().map(|p| p["rows"].as_u64().unwrap()).sum();
                assert_eq!(
                    acked,
                    ids.len() as u64,
                    "every row acknowledged once: {acks:?}"
                );
                return started.elapsed();
            }
            Err(s) if matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Aborted) => {
                assert!(
                    started.elapsed() < within,
                    "put still refused after {within:?}: {s}; daemon log: {:?}",
                    d.log.lock().unwrap()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(s) => panic!("put failed: {s}"),
        }
    }
}

/// Every row of `t` as `d` reads it (SQL).
async fn read_all(d: &Daemon) -> BTreeMap<i64, String> {
    read_all_via(d, None).await
}

/// [`read_all`] over TLS when `tls_ca` is given.
async fn read_all_via(d: &Daemon, tls_ca: Option<&str>) -> BTreeMap<i64, String> {
    let mut c = arrow_flight::sql::client::FlightSqlServiceClient::new(channel_to(d, tls_ca).await);
    let info = c.execute("SELECT id, v FROM t".into(), None).await.unwrap();
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    let batches: Vec<arrow_array::RecordBatch> =
        futures::TryStreamExt::try_collect(c.do_get(ticket).await.unwrap())
            .await
            .unwrap();
    let mut out = BTreeMap::new();
    for b in batches {
        let ids = b.column(0).as_primitive::<Int64Type>();
        let vs = b.column(1).as_string::<i32>();
        for i in 0..b.num_rows() {
            assert!(
                out.insert(ids.value(i), vs.value(i).to_string()).is_none(),
                "key twice"
            );
        }
    }
    out
}

fn model_put(model: &mut BTreeMap<i64, String>, ids: &[i64], tag: &str) {
    for i in ids {
        model.insert(*i, format!("{tag}-{i}"));
    }
}

/// A metric's value summed over its series in `d`'s `/metrics`.
fn metric(d: &Daemon, name: &str) -> f64 {
    let (code, body) = http_fetch(&d.http, "/metrics", None);
    assert_eq!(code, 200);
    body.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

// Breaks if a daemon refuses or loses rows of shards another member owns
// (no forwarding), if reads on one member miss rows written through
// another, if a killed member's shards are not served again (no failover)
// or its acknowledged rows are lost or doubled, or if a woken zombie
// acknowledges a write it lost to its successor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(memwal_etcd_tests),
    ignore = "needs etcd (apt-get install etcd-server)"
)]
async fn three_daemons_take_any_put_and_fail_over_a_killed_one() {
    let (etcd, _dir, table) = etcd_and_table();
    let a = member(&table, &etcd);
    let b = member(&table, &etcd);
    let mut c = member(&table, &etcd);
    // Shards are created by the first rows for them.
    let mut model = BTreeMap::new();
    let batch: Vec<i64> = (1000..1400).collect();
    put_until_ok(&a, &batch, "z", Duration::from_secs(20)).await;
    model_put(&mut model, &batch, "z");
    let (owners, ids) = settled(&[&a, &b, &c], 3);
    assert!(
        ids.iter().all(|id| owners.values().any(|o| o == id)),
        "the shards spread over three members: {owners:?}"
    );

    // GetFlightInfo: one endpoint per shard, at its owner.
    let advertised: BTreeMap<String, String> = cluster_status(&a)["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_string(),
                m["advertise"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let info = client(&b.flight, None)
        .await
        .get_flight_info(arrow_flight::FlightDescriptor::new_path(vec!["t".into()]))
        .await
        .unwrap();
    assert_eq!(info.endpoint.len(), SHARDS, "{info:?}");
    for e in &info.endpoint {
        let meta: serde_json::Value = serde_json::from_slice(&e.app_metadata).unwrap();
        let owner = &owners[meta["shard"].as_str().unwrap()];
        assert_eq!(e.location[0].uri, advertised[owner], "{meta}");
    }

    // A producer that only knows daemon a: every row lands, acknowledged
    // once per part, and every member reads them all.
    let batch: Vec<i64> = (0..400).collect();
    put_until_ok(&a, &batch, "a", Duration::from_secs(20)).await;
    model_put(&mut model, &batch, "a");
    let forwarded = metric(&b, "memwal_server_forwarded_puts_received_total")
        + metric(&c, "memwal_server_forwarded_puts_received_total");
    assert!(forwarded >= 1.0, "a's put reached the other owners");
    for d in [&a, &b, &c] {
        assert_eq!(read_all(d).await, model, "every member reads every row");
    }

    // SIGKILL c: its shards are claimed by a or b and served again.
    let c_id = ids[2].clone();
    let c_shards: Vec<&String> = owners
        .iter()
        .filter(|(_, o)| **o == c_id)
        .map(|(s, _)| s)
        .collect();
    c.child.kill().unwrap();
    c.child.wait().unwrap();
    let killed = Instant::now();
    let batch: Vec<i64> = (200..600).collect();
    let took = put_until_ok(&a, &batch, "b", Duration::from_secs(20)).await;
    model_put(&mut model, &batch, "b");
    eprintln!(
        "c owned {} shards; a put for every shard succeeded {:?} after the kill ({took:?} of retries)",
        c_shards.len(),
        killed.elapsed()
    );
    let (owners_after, _) = settled(&[&a, &b], 2);
    assert!(
        owners_after.values().all(|o| *o != c_id),
        "{owners_after:?}"
    );
    for d in [&a, &b] {
        assert_eq!(
            read_all(d).await,
            model,
            "nothing acknowledged is lost or doubled"
        );
    }

    // A zombie: b paused past its lease. a claims b's shards; b, woken,
    // is fenced there and acknowledges nothing it lost.
    let b_pid = b.child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-STOP", &b_pid])
        .status()
        .unwrap()
        .success());
    let (owners_alone, _) = settled(&[&a], 1);
    assert_eq!(owners_alone.len(), SHARDS);
    let batch: Vec<i64> = (500..700).collect();
    put_until_ok(&a, &batch, "c", Duration::from_secs(20)).await;
    model_put(&mut model, &batch, "c");
    assert!(std::process::Command::new("kill")
        .args(["-CONT", &b_pid])
        .status()
        .unwrap()
        .success());
    // Puts through the woken b: each is acknowledged only where it is
    // durable (its writers are fenced; it rejoins and forwards or claims).
    let batch: Vec<i64> = (650..800).collect();
    put_until_ok(&b, &batch, "d", Duration::from_secs(30)).await;
    model_put(&mut model, &batch, "d");
    settled(&[&a, &b], 2);
    for d in [&a, &b] {
        assert_eq!(
            read_all(d).await,
            model,
            "the zombie lost nothing it acknowledged"
        );
    }
    a.stop_ok();
    b.stop_ok();
}

// Breaks if a joining daemon never gets shards (no rebalance), if the
// handover loses or doubles rows, if SIGTERM does not hand a member's
// shards back before it exits, or if the daemons stop serving what they
// own while etcd restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(memwal_etcd_tests),
    ignore = "needs etcd (apt-get install etcd-server)"
)]
async fn a_joining_daemon_takes_shards_and_sigterm_hands_them_back() {
    let (mut etcd, _dir, table) = etcd_and_table();
    let a = member(&table, &etcd);
    let b = member(&table, &etcd);
    let mut model = BTreeMap::new();
    let batch: Vec<i64> = (0..300).collect();
    put_until_ok(&b, &batch, "a", Duration::from_secs(20)).await;
    model_put(&mut model, &batch, "a");
    settled(&[&a, &b], 2);

    // c joins: shards move to it with a clean handover (flush, close,
    // claim), and writes through any member keep landing.
    let c = member(&table, &etcd);
    let (owners, ids) = settled(&[&a, &b, &c], 3);
    assert!(
        owners.values().any(|o| *o == ids[2]),
        "c took shards: {owners:?}"
    );
    assert!(
        metric(&a, "memwal_server_cluster_handovers_total")
            + metric(&b, "memwal_server_cluster_handovers_total")
            >= 1.0,
        "the shards c took were handed over"
    );
    // `memwal status --cluster` reads the same from etcd.
    let endpoint = etcd.endpoint().replace("http://", "etcd://");
    let (ok, out, err) = memwal(&["status", "--cluster", &endpoint, "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["members"].as_array().unwrap().len(), 3, "{v}");
    assert_eq!(v["compactors"]["t"], cluster_status(&a)["compactor"], "{v}");
    let listed: BTreeMap<String, String> = v["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["shard"].as_str().unwrap().to_string(),
                s["owner"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(listed, owners);
    let batch: Vec<i64> = (100..400).collect();
    put_until_ok(&a, &batch, "b", Duration::from_secs(20)).await;
    model_put(&mut model, &batch, "b");
    assert_eq!(read_all(&c).await, model);

    // etcd restarts: the members keep serving (their leases survive).
    etcd.stop();
    let batch: Vec<i64> = (0..50).collect();
    put_until_ok(&c, &batch, "c", Duration::from_secs(20)).await;
    model_put(&mut model, &batch, "c");
    etcd.start_again();
    settled(&[&a, &b, &c], 3);

    // SIGTERM c: it flushes, closes and leaves; a and b claim its shards
    // at once (no lease expiry to wait for).
    let c_id = ids[2].clone();
    c.stop_ok();
    let (owners, _) = settled(&[&a, &b], 2);
    assert!(owners.values().all(|o| *o != c_id), "{owners:?}");
    let batch: Vec<i64> = (350..450).collect();
    put_until_ok(&b, &batch, "d", Duration::from_secs(20)).await;
    model_put(&mut model, &batch, "d");
    for d in [&a, &b] {
        assert_eq!(read_all(d).await, model);
    }
    a.stop_ok();
    b.stop_ok();
}

// Breaks if members serving TLS cannot forward to each other (the settings
// refused, or a forward that does not verify a member's certificate against
// `cluster_tls_ca` for the host it advertises): a producer that reaches one
// TLS member only must get every row acknowledged, and the other member
// must read them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(memwal_etcd_tests),
    ignore = "needs etcd (apt-get install etcd-server)"
)]
async fn members_serving_tls_forward_to_each_other() {
    let (etcd, dir, table) = etcd_and_table();
    let _ = rustls::crypto::ring::default_provider().install_default();
    // One certificate for `localhost`, self-signed: it is also the CA.
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let ca = cert.cert.pem();
    let cert_path = dir.path().join("member.pem");
    let key_path = dir.path().join("member.key");
    std::fs::write(&cert_path, &ca).unwrap();
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
    let tls = || MemberTls {
        cert: cert_path.to_str().unwrap(),
        key: key_path.to_str().unwrap(),
        ca: cert_path.to_str().unwrap(),
    };
    let endpoint = etcd.endpoint();
    let a = cluster_member_full(&table, &endpoint, &[], Some(tls()), false);
    let b = cluster_member_full(&table, &endpoint, &[], Some(tls()), false);
    let mut model = BTreeMap::new();
    let batch: Vec<i64> = (0..400).collect();
    put_until_ok_via(&a, Some(&ca), &batch, "a", Duration::from_secs(20)).await;
    model_put(&mut model, &batch, "a");
    let (owners, ids) = settled(&[&a, &b], 2);
    assert!(
        owners.values().any(|o| *o == ids[1]),
        "b owns shards: {owners:?}"
    );
    assert!(
        cluster_status(&a)["members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["advertise"]
                .as_str()
                .unwrap()
                .starts_with("grpc+tls://localhost:")),
        "members advertise TLS"
    );
    let batch: Vec<i64> = (200..600).collect();
    put_until_ok_via(&a, Some(&ca), &batch, "b", Duration::from_secs(20)).await;
    model_put(&mut model, &batch, "b");
    assert!(
        metric(&b, "memwal_server_forwarded_puts_received_total") >= 1.0,
        "a forwarded b's parts to b over TLS"
    );
    assert_eq!(
        read_all_via(&b, Some(&ca)).await,
        model,
        "b reads every row"
    );
    a.stop_ok();
    b.stop_ok();
}

// Breaks if every member compacts the table (the members' commits would
// race on the base table), if no member does, or if compaction stops when
// the member running it leaves: exactly one member's compactor runs cycles,
// and after it stops another one compacts what is published next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(memwal_etcd_tests),
    ignore = "needs etcd (apt-get install etcd-server)"
)]
async fn one_member_compacts_the_table_and_another_takes_over() {
    let (etcd, _dir, table) = etcd_and_table();
    let endpoint = etcd.endpoint();
    let a = cluster_member_full(&table, &endpoint, &[], None, true);
    let b = cluster_member_full(&table, &endpoint, &[], None, true);
    let mut model = BTreeMap::new();
    let batch: Vec<i64> = (0..300).collect();
    put_until_ok(&a, &batch, "a", Duration::from_secs(20)).await;
    model_put(&mut model, &batch, "a");
    let (_, ids) = settled(&[&a, &b], 2);
    let compactor = cluster_status(&a)["compactor"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(cluster_status(&b)["compactor"], compactor.as_str());
    let (runner, idle) = if compactor == ids[0] { (a, b) } else { (b, a) };
    // Everything published reaches the base, through the runner only
    // (the first member may have compacted while it was alone: counted
    // from here).
    let cycles = |d: &Daemon| metric(d, "memwal_compactor_cycles_total");
    let (runner_before, idle_before) = (cycles(&runner), cycles(&idle));
    for d in [&runner, &idle] {
        flush_until_ok(d).await;
    }
    base_holds(&table, &model).await;
    assert!(cycles(&runner) > runner_before, "the compactor ran");
    assert_eq!(cycles(&idle), idle_before, "only one member compacts");

    // The runner leaves: the other member compacts what comes next.
    runner.stop_ok();
    let batch: Vec<i64> = (200..500).collect();
    put_until_ok(&idle, &batch, "b", Duration::from_secs(20)).await;
    model_put(&mut model, &batch, "b");
    let idle_before = cycles(&idle);
    flush_until_ok(&idle).await;
    base_holds(&table, &model).await;
    assert!(
        cycles(&idle) > idle_before,
        "the survivor took compaction over"
    );
    idle.stop_ok();
}

/// The `flush` action on `t` through `d`, retried (up to 20 s) while a
/// shard moves.
async fn flush_until_ok(d: &Daemon) {
    let started = Instant::now();
    loop {
        let mut c = client(&d.flight, None).await;
        let answer = match c.do_action(arrow_flight::Action::new("flush", "t")).await {
            Ok(results) => futures::TryStreamExt::try_collect::<Vec<_>>(results).await,
            Err(e) => Err(e),
        };
        match answer {
            Ok(results) => {
                assert_eq!(results.len(), 1);
                return;
            }
            Err(e) if started.elapsed() < Duration::from_secs(20) => {
                eprintln!("flush refused, retrying: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("flush refused for 20 s: {e}"),
        }
    }
}

/// Waits (up to 60 s) until the base table alone holds `model`.
async fn base_holds(table: &str, model: &BTreeMap<i64, String>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = base_rows(table).await;
        if got == *model {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the base table does not hold every flushed row within 60 s: {} of {} rows",
            got.len(),
            model.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// Breaks if a daemon that joined the cluster and then failed to open its
// tables exits still a member (its lease would keep shards placed on it,
// refused as moving, until it expired): once it has exited, the cluster
// lists only the member that runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(memwal_etcd_tests),
    ignore = "needs etcd (apt-get install etcd-server)"
)]
async fn a_member_whose_tables_do_not_open_leaves_at_once() {
    let (etcd, dir, table) = etcd_and_table();
    let a = member(&table, &etcd);
    let cluster = etcd.endpoint().replace("http://", "etcd://");
    let missing = dir.path().join("missing");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_memwal"))
        .args(["serve", "--table", &format!("t={}", missing.display())])
        .args(["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .args(["--cluster", &cluster, "--advertise", "grpc://127.0.0.1:1"])
        .args(["--cluster-failover-ms", "10000", "--no-compactor"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("joined the cluster"), "{err}");
    let (ok, out, err) = memwal(&["status", "--cluster", &cluster, "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let members: Vec<&str> = v["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["advertise"].as_str().unwrap())
        .collect();
    assert_eq!(members, [format!("grpc://{}", a.flight)], "{v}");
    a.stop_ok();
}
