//! Helpers shared by the process-level tests of `memwal serve`.
#![allow(dead_code)] // each test binary uses its own subset

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::{FlightClient, FlightDescriptor};
use arrow_schema::{DataType, Field, Schema};
use futures::TryStreamExt;

pub fn memwal(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memwal"))
        .args(args)
        .output()
        .expect("run memwal");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A running daemon and its Flight address.
pub struct Daemon {
    pub child: Child,
    pub flight: String,
    pub http: String,
    /// The daemon's stderr, its last [`LOG_LINES`] lines.
    pub log: Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
    /// Every line the daemon logged at ERROR.
    pub errors: Arc<std::sync::Mutex<Vec<String>>>,
    /// The thread draining stderr (ends when the daemon does).
    drain: Option<std::thread::JoinHandle<()>>,
}

/// How much of a daemon's stderr [`Daemon::log`] keeps.
pub const LOG_LINES: usize = 40;

impl Daemon {
    /// A daemon serving `table` as `t`, without its compactor.
    pub fn start(table: &str, extra: &[&str]) -> Self {
        Self::launch(table, &[&["--no-compactor"], extra].concat())
    }

    /// A daemon serving `table` as `t` with `args` after the addresses.
    pub fn launch(table: &str, args: &[&str]) -> Self {
        Self::try_launch(table, args, &[]).expect("daemon ended before serving")
    }

    /// [`Daemon::launch`] with extra environment (`--listen` in `args`
    /// replaces the default `127.0.0.1:0`); `Err` with the exit
    /// status when the daemon ends before serving (a crash point hit while
    /// opening, say).
    pub fn try_launch(
        table: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self, std::process::ExitStatus> {
        let table = format!("t={table}");
        let full = [
            &["serve", "--table", &table, "--http", "127.0.0.1:0"][..],
            if args.contains(&"--listen") {
                &[]
            } else {
                &["--listen", "127.0.0.1:0"]
            },
            args,
        ]
        .concat();
        let mut child = Command::new(env!("CARGO_BIN_EXE_memwal"))
            .args(full)
            .envs(env.iter().copied())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start memwal serve");
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        let line = loop {
            match lines.next() {
                // Complete: it ends with the HTTP address. A daemon that
                // aborted while writing it leaves a cut line and then EOF.
                Some(Ok(l)) if l.contains("serving") && l.contains(" http://") => break l,
                Some(Ok(_)) => continue,
                _ => return Err(child.wait().expect("wait for the daemon")),
            }
        };
        // Keep draining stderr so the daemon never blocks on it, keeping
        // the tail for failure messages.
        let log = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
        let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
        let tail = log.clone();
        let logged_errors = errors.clone();
        let drain = std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                // The level as the daemon prints it (no colours: stderr is
                // not a terminal here).
                if l.contains(" ERROR ") {
                    logged_errors.lock().unwrap().push(l.clone());
                }
                let mut t = tail.lock().unwrap();
                if t.len() == LOG_LINES {
                    t.pop_front();
                }
                t.push_back(l);
            }
        });
        let addr = |scheme: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(scheme))
                .unwrap_or_else(|| panic!("no {scheme} in `{line}`"))
                .to_string()
        };
        let flight = if line.contains("grpc+tls://") {
            addr("grpc+tls://")
        } else {
            addr("grpc://")
        };
        Ok(Self {
            flight,
            http: addr("http://"),
            child,
            log,
            errors,
            drain: Some(drain),
        })
    }

    /// SIGTERM, then the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        self.child.wait().unwrap()
    }

    /// SIGTERM; panics with the daemon's last log lines unless it exits 0.
    pub fn stop_ok(mut self) {
        let log = self.log.clone();
        let drain = self.drain.take();
        let status = self.stop();
        if let Some(d) = drain {
            let _ = d.join();
        }
        let tail: Vec<String> = log.lock().unwrap().iter().cloned().collect();
        assert!(
            status.success(),
            "daemon exited with {status}; its last lines:\n{}",
            tail.join("\n")
        );
    }
}

/// A cluster member serving `table` as `t`, through the etcd at
/// `etcd_endpoint` (`http://HOST:PORT`), on a port of its own that it
/// advertises, without its compactor; failover in 3 s (2 s leases), calls
/// drained for 2 s on SIGTERM.
pub fn cluster_member(table: &str, etcd_endpoint: &str) -> Daemon {
    cluster_member_with(table, etcd_endpoint, &[])
}

/// [`cluster_member`] with extra environment (`FAILPOINTS`).
pub fn cluster_member_with(table: &str, etcd_endpoint: &str, env: &[(&str, &str)]) -> Daemon {
    cluster_member_full(table, etcd_endpoint, env, None, false)
}

/// TLS for a cluster member: its certificate and key files (the
/// certificate names `localhost`), and the CA file that signed every
/// member's certificate.
pub struct MemberTls<'a> {
    pub cert: &'a str,
    pub key: &'a str,
    pub ca: &'a str,
}

/// [`cluster_member_with`], serving TLS with `tls` when given (advertised
/// as `grpc+tls://localhost:PORT`), and with its compactor when `compactor`
/// (a cycle every second, GC on with no grace).
pub fn cluster_member_full(
    table: &str,
    etcd_endpoint: &str,
    env: &[(&str, &str)],
    tls: Option<MemberTls>,
    compactor: bool,
) -> Daemon {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free local port")
        .port();
    let listen = format!("127.0.0.1:{port}");
    let advertise = match tls {
        Some(_) => format!("grpc+tls://localhost:{port}"),
        None => format!("grpc://{listen}"),
    };
    let cluster = etcd_endpoint.replace("http://", "etcd://");
    let mut args = if compactor {
        vec!["--compact-every-secs", "1", "--gc-grace-secs", "0"]
    } else {
        vec!["--no-compactor"]
    };
    args.extend([
        "--listen",
        &listen,
        "--cluster",
        &cluster,
        "--advertise",
        &advertise,
        "--cluster-failover-ms",
        "3000",
        "--drain-secs",
        "2",
    ]);
    if let Some(t) = &tls {
        args.extend([
            "--tls-cert",
            t.cert,
            "--tls-key",
            t.key,
            "--cluster-tls-ca",
            t.ca,
        ]);
    }
    Daemon::try_launch(table, &args, env).expect("daemon ended before serving")
}

/// A daemon a test leaves running (it failed before stopping it) is killed,
/// so it does not outlive the test run.
impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub async fn client(addr: &str, token: Option<&str>) -> FlightClient {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect to the daemon");
    let mut c = FlightClient::new(channel);
    if let Some(t) = token {
        c.add_header("authorization", &format!("Bearer {t}"))
            .unwrap();
    }
    c
}

pub fn rows(ids: &[i64], tag: &str) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", DataType::Utf8, true),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
            Arc::new(StringArray::from_iter_values(
                ids.iter().map(|i| format!("{tag}-{i}")),
            )),
        ],
    )
    .unwrap()
}

pub fn keys(ids: &[i64]) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    RecordBatch::try_new(
        schema,
        vec![Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef],
    )
    .unwrap()
}

/// DoPut of `batches` to `path`; one ack (JSON) per batch, or the status.
pub async fn put(
    c: &mut FlightClient,
    path: &[&str],
    batches: Vec<RecordBatch>,
) -> Result<Vec<serde_json::Value>, tonic::Status> {
    let descriptor = FlightDescriptor::new_path(path.iter().map(|s| s.to_string()).collect());
    let stream = FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(descriptor))
        .build(futures::stream::iter(batches.into_iter().map(Ok)));
    let acks = c.do_put(stream).await.map_err(status)?;
    acks.map_err(status)
        .map_ok(|r| serde_json::from_slice(&r.app_metadata).expect("ack metadata is JSON"))
        .try_collect()
        .await
}

/// The `flush` action on table `t`: returns once every shard's unflushed
/// rows are published; panics unless it answered one result.
pub async fn flush(c: &mut FlightClient) {
    let acks: Vec<_> = c
        .do_action(arrow_flight::Action::new("flush", "t"))
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(acks.len(), 1);
}

pub fn status(e: arrow_flight::error::FlightError) -> tonic::Status {
    match e {
        arrow_flight::error::FlightError::Tonic(s) => *s,
        other => tonic::Status::unknown(other.to_string()),
    }
}

/// The status code of `GET path` (HTTP/1.1, one request per connection).
pub fn http_get(addr: &str, path: &str, token: Option<&str>) -> u16 {
    http_fetch(addr, path, token).0
}

/// The status code and body of `GET path`.
pub fn http_fetch(addr: &str, path: &str, token: Option<&str>) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the HTTP port");
    let auth = token
        .map(|t| format!("authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: {addr}\r\n{auth}connection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let code = reply
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP reply: {reply:?}"));
    let body = reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// Every row of the base table at `table`, as lance scans it.
pub async fn base_batches(table: &str) -> Vec<RecordBatch> {
    let ds = lance::Dataset::open(table).await.unwrap();
    ds.scan()
        .try_into_stream()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// The table's published view as `ShardSnapshot` JSON for the Python
/// readers (`lsm_read.py`, `lsm_search.py`): per shard its id, spec id,
/// current generation and `[generation, dir]` of each SSTable, read with
/// `index` caught up as `table_view` reads it.
pub async fn view_snapshots(table: &str, index: Option<&str>) -> Vec<serde_json::Value> {
    let loc = memwal_store::open_store(table).unwrap();
    let view = memwal_table::table_view(&loc, index, &Default::default())
        .await
        .unwrap();
    view.shards
        .iter()
        .map(|s| {
            serde_json::json!({
                "shard": s.shard.to_string(),
                "spec_id": s.spec_id,
                "current_generation": s.current_generation,
                "sstables": s.sstables.iter().map(|t| (t.generation, t.path.clone())).collect::<Vec<_>>(),
            })
        })
        .collect()
}

pub async fn base_rows(table: &str) -> BTreeMap<i64, String> {
    let batches = base_batches(table).await;
    let mut out = BTreeMap::new();
    for b in batches {
        let ids = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
        let vs = b.column_by_name("v").unwrap().as_string::<i32>();
        for i in 0..b.num_rows() {
            assert!(
                out.insert(ids.value(i), vs.value(i).to_string()).is_none(),
                "key twice"
            );
        }
    }
    out
}

/// A `bucket(id, 4)` table with `id` int64 key and `v` utf8, by `memwal init`.
pub fn init_bucket_table(table: &str) {
    init_bucket_table_of(table, 4);
}

/// [`init_bucket_table`] with `buckets` buckets.
pub fn init_bucket_table_of(table: &str, buckets: usize) {
    let sharding = format!("bucket(id, {buckets})");
    let (ok, _, err) = memwal(&[
        "init",
        table,
        "--column",
        "id:int64:key",
        "--column",
        "v:utf8",
        "--sharding",
        &sharding,
    ]);
    assert!(ok, "{err}");
}

/// An append-only table (`id` int64, `v` utf8, no primary key) sharded by
/// `sharding` (e.g. `unsharded`, `bucket(id, 4)`), by `memwal init`.
pub fn init_append_only(table: &str, sharding: &str) {
    let (ok, _, err) = memwal(&[
        "init",
        table,
        "--column",
        "id:int64",
        "--column",
        "v:utf8",
        "--sharding",
        sharding,
    ]);
    assert!(ok, "{err}");
}

/// The Python with the pinned clients (`MEMWAL_TEST_PYTHON`), or `None`
/// (the test is skipped) outside CI; under CI a missing one is a failure.
pub fn test_python(test: &str) -> Option<String> {
    let python = std::env::var("MEMWAL_TEST_PYTHON")
        .ok()
        .filter(|p| !p.is_empty());
    if python.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI must run the {test} test: MEMWAL_TEST_PYTHON is unset (scripts/py-clients.sh)"
        );
        eprintln!(
            "SKIPPED {test} test: MEMWAL_TEST_PYTHON unset (eval \"$(scripts/py-clients.sh)\")"
        );
    }
    python
}

/// Runs a client script, killed after 120 s (coreutils `timeout`) so a
/// client stuck on a refused stream fails the test instead of hanging it.
pub fn run_python(python: &str, script: &str, args: &[&str]) -> String {
    let path = format!("{}/tests/python/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("timeout")
        .args(["120", python, &path])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A Flight SQL client of the daemon at `addr`, sending and receiving
/// messages of any size.
pub async fn sql_client(
    addr: &str,
) -> arrow_flight::sql::client::FlightSqlServiceClient<tonic::transport::Channel> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect to the daemon");
    arrow_flight::sql::client::FlightSqlServiceClient::new_from_inner(
        arrow_flight::flight_service_client::FlightServiceClient::new(channel)
            .max_encoding_message_size(usize::MAX)
            .max_decoding_message_size(usize::MAX),
    )
}

/// The rows `sql` returns through the daemon at `addr` (Flight SQL), or
/// the status the query (or the connection) ended with.
pub async fn sql_rows(addr: &str, sql: &str) -> Result<Vec<RecordBatch>, tonic::Status> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut c = arrow_flight::sql::client::FlightSqlServiceClient::new(channel);
    let info = c.execute(sql.to_string(), None).await.map_err(status)?;
    let ticket = info.endpoint[0]
        .ticket
        .clone()
        .ok_or_else(|| tonic::Status::internal("no ticket"))?;
    c.do_get(ticket)
        .await
        .map_err(status)?
        .try_collect()
        .await
        .map_err(status)
}

/// DoPut of one `batch` to `path` as sequence `sequence` of idempotent
/// producer `producer` (epoch `epoch`), in the batch's `app_metadata`;
/// its ack (JSON), or the status.
pub async fn producer_put(
    c: &mut FlightClient,
    path: &[&str],
    batch: RecordBatch,
    (producer, epoch, sequence): (&str, u64, u64),
) -> Result<serde_json::Value, tonic::Status> {
    use futures::StreamExt;
    let meta = serde_json::json!({
        "producer_id": producer,
        "producer_epoch": epoch,
        "sequence": sequence,
    })
    .to_string();
    let descriptor = FlightDescriptor::new_path(path.iter().map(|s| s.to_string()).collect());
    let stream = FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(descriptor))
        .build(futures::stream::iter([Ok(batch)]))
        .map(move |m| {
            m.map(|mut fd| {
                // The batch's message (not the schema's) carries it.
                if !fd.data_body.is_empty() {
                    fd.app_metadata = meta.clone().into();
                }
                fd
            })
        });
    let acks: Vec<serde_json::Value> = c
        .do_put(stream)
        .await
        .map_err(status)?
        .map_err(status)
        .map_ok(|r| serde_json::from_slice(&r.app_metadata).expect("ack metadata is JSON"))
        .try_collect()
        .await?;
    acks.into_iter()
        .next()
        .ok_or_else(|| tonic::Status::internal("no ack"))
}
