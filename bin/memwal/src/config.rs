//! `memwal serve` settings, layered: built-in defaults, then the TOML file
//! (`--config`), then flags, then `MEMWAL_*` environment variables (each
//! layer overrides the ones before it).
//!
//! File keys (all optional):
//!
//! ```toml
//! data_dir = "./data"            # serve (and create) the demo table here
//! listen = "127.0.0.1:50051"     # Arrow Flight
//! http = "127.0.0.1:9464"        # /healthz /readyz /status /metrics
//! compactor = true
//! gc = true                      # garbage collection after each compaction cycle
//! gc_grace_secs = 600            # keep unreachable objects this long (readers' snapshots)
//! compact_every_secs = 30
//! index_catchup = true           # bring the base indexes up to compacted rows
//! index_catchup_secs = 0         #   at most this often (0: every cycle)
//! maintenance = true             # keep the base healthy: rewrite small fragments by size tier,
//! target_fragment_rows = 1048576 #   up to this many rows, and fragments whose deleted
//! materialize_deletions_pct = 10 #   rows pass this share (docs/design/base-maintenance.md)
//! base_cleanup = true            # with gc: remove base-table versions older than gc_grace_secs
//! drain_secs = 10                # after SIGTERM, in-flight calls get this long
//! max_streams = 256              # ingest calls open at once (RESOURCE_EXHAUSTED past it)
//! max_connections = 512          # Flight connections open at once (more are closed on accept)
//! max_decoded_mib_in_flight = 1024  # decoded message bytes held at once, MiB
//! first_message_secs = 30        # a new ingest call must send its first message by then
//! min_flush_interval_ms = 1000   # `flush` actions start at most this often per table
//! max_open_shards = 1024         # per table; rows for one more: RESOURCE_EXHAUSTED
//! shard_idle_secs = 600          # close a shard no rows arrived for this long (0: never)
//! schema_poll_ms = 5000          # follow a base-table schema change within this (0: on `evolve` only)
//! query_memory_mib = 512         # one SQL query's memory (RESOURCE_EXHAUSTED past it)
//! query_timeout_ms = 30000       # one SQL query's time, planning included (DEADLINE_EXCEEDED past it)
//! query_total_memory_mib = 1024  # every running query's memory together (RESOURCE_EXHAUSTED past it)
//! query_max_concurrent = 16      # queries (and statements being prepared) at once (RESOURCE_EXHAUSTED past it)
//! query_max_sql_bytes = 1048576  # longest SQL statement (INVALID_ARGUMENT past it)
//! query_max_expr_depth = 1000    # deepest operator nesting of a statement (INVALID_ARGUMENT past it)
//! query_max_k = 10000            # largest k of vector_search (INVALID_ARGUMENT past it)
//! lance_io_buffer_mib = 64       # I/O one Lance scan may read ahead of its reader (read_ahead.rs)
//! lance_fragment_readahead = 4   # fragments one Lance scan reads at once
//! token = "…"                    # require `authorization: Bearer …`
//! token_file = "/run/memwal/token"  # ... read from this file instead (not in `ps`)
//! tls_cert = "server.pem"        # serve Flight over TLS (PEM certificate chain
//! tls_key = "server.key"         #   and private key; both or neither)
//! cluster = "http://etcd1:2379,http://etcd2:2379"  # join a cluster through etcd (shards placed and failed over)
//! advertise = "grpc://10.0.0.5:50051"  # how the other members reach this daemon's Flight service
//!                                #   (grpc+tls://HOST:PORT when it serves TLS)
//! cluster_tls_ca = "ca.pem"      # the CA that signed the members' TLS certificates (with tls_cert)
//! cluster_failover_ms = 10000    # a dead member's shards are served again within about this long
//! cluster_prefix = "/memwal"     # etcd key prefix shared by one cluster's daemons
//! [writer]                       # every shard writer's settings (writer_config.rs):
//! memtable_max_mib = 64          #   unset keys: built-in default or the table's
//! flush_concurrency = 2          #   writer_config_defaults
//! [tables]                       # NAME = URI; replaces the demo table
//! orders = "s3://bucket/orders"
//! [shards]                       # NAME = buckets this daemon owns (default: all)
//! orders = "0-1,3"
//! ```
//!
//! Environment: `MEMWAL_DATA_DIR`, `MEMWAL_LISTEN`, `MEMWAL_HTTP`,
//! `MEMWAL_COMPACTOR` (`true`/`false`), `MEMWAL_GC`, `MEMWAL_GC_GRACE_SECS`, `MEMWAL_COMPACT_EVERY_SECS`,
//! `MEMWAL_INDEX_CATCHUP`, `MEMWAL_INDEX_CATCHUP_SECS`, `MEMWAL_MAINTENANCE`, `MEMWAL_TARGET_FRAGMENT_ROWS`,
//! `MEMWAL_MATERIALIZE_DELETIONS_PCT`, `MEMWAL_BASE_CLEANUP`, `MEMWAL_DRAIN_SECS`,
//! `MEMWAL_MAX_STREAMS`, `MEMWAL_MAX_CONNECTIONS`, `MEMWAL_MAX_DECODED_MIB_IN_FLIGHT`, `MEMWAL_FIRST_MESSAGE_SECS`,
//! `MEMWAL_MIN_FLUSH_INTERVAL_MS`, `MEMWAL_MAX_OPEN_SHARDS`, `MEMWAL_SHARD_IDLE_SECS`, `MEMWAL_SCHEMA_POLL_MS`,
//! `MEMWAL_QUERY_MEMORY_MIB`, `MEMWAL_QUERY_TIMEOUT_MS`, `MEMWAL_QUERY_TOTAL_MEMORY_MIB`,
//! `MEMWAL_QUERY_MAX_CONCURRENT`, `MEMWAL_QUERY_MAX_SQL_BYTES`, `MEMWAL_QUERY_MAX_EXPR_DEPTH`,
//! `MEMWAL_QUERY_MAX_K`, `MEMWAL_LANCE_IO_BUFFER_MIB`, `MEMWAL_LANCE_FRAGMENT_READAHEAD`,
//! `MEMWAL_CLUSTER`, `MEMWAL_ADVERTISE`, `MEMWAL_CLUSTER_TLS_CA`, `MEMWAL_CLUSTER_FAILOVER_MS`, `MEMWAL_CLUSTER_PREFIX`,
//! `MEMWAL_TOKEN`, `MEMWAL_TOKEN_FILE`, `MEMWAL_TLS_CERT`, `MEMWAL_TLS_KEY`, `MEMWAL_TABLES` (`{orders="s3://bucket/orders"}`),
//! `MEMWAL_SHARDS` (`{orders="0-1,3"}`), and `MEMWAL_WRITER_<KEY>` for each
//! `[writer]` key (`MEMWAL_WRITER_FLUSH_CONCURRENCY=4`).
//!
//! `memwal serve --print-config` prints the merged settings (tokens
//! redacted) and exits; `docs/memwal.toml` is a documented example.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

use crate::writer_config::WriterSettings;

/// The resolved settings of `memwal serve`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
    /// Serves the demo table `demo` at `data_dir/demo` when `tables` is empty.
    pub data_dir: Option<String>,
    /// Tables to serve: name -> URI.
    pub tables: BTreeMap<String, String>,
    /// Buckets owned per table (`"0-1,3"`); a table not listed: all.
    pub shards: BTreeMap<String, String>,
    /// Arrow Flight address.
    pub listen: SocketAddr,
    /// HTTP address.
    pub http: SocketAddr,
    /// Run the compaction task.
    pub compactor: bool,
    /// Collect garbage after each compaction cycle.
    pub gc: bool,
    /// GC's grace period: nothing younger is deleted.
    pub gc_grace_secs: u64,
    /// Seconds between compaction cycles.
    pub compact_every_secs: u64,
    /// End compaction cycles by bringing the base table's indexes up to
    /// the compacted generations (SSTables are kept until they are).
    pub index_catchup: bool,
    /// ... at most once per this many seconds (0: every cycle).
    pub index_catchup_secs: u64,
    /// End compaction cycles with base maintenance (base-maintenance.md).
    pub maintenance: bool,
    /// Rows a base fragment grows to through maintenance.
    pub target_fragment_rows: usize,
    /// A base fragment past this percentage of deleted rows is rewritten.
    pub materialize_deletions_pct: u32,
    /// With `gc`: base versions superseded over `gc_grace_secs` ago go.
    pub base_cleanup: bool,
    /// Seconds in-flight Flight calls may run on after SIGTERM.
    pub drain_secs: u64,
    /// Ingest calls open at once.
    pub max_streams: usize,
    /// Flight connections open at once; one more is closed on accept.
    pub max_connections: usize,
    /// Decoded message bytes all calls hold at once, in MiB.
    pub max_decoded_mib_in_flight: usize,
    /// Seconds a new ingest call may take to send its first message.
    pub first_message_secs: u64,
    /// `flush` actions start at most once per this many milliseconds per
    /// table (0: one at a time, no spacing); more are refused with
    /// RESOURCE_EXHAUSTED.
    pub min_flush_interval_ms: u64,
    /// Shards each table keeps open at once; rows for one more are refused
    /// with RESOURCE_EXHAUSTED.
    pub max_open_shards: usize,
    /// A shard no rows arrived for in this many seconds is flushed and
    /// closed, and its metric series dropped (0: never).
    pub shard_idle_secs: u64,
    /// Every this many milliseconds the base table's schema is read and a
    /// change followed by every live shard (0: only on the `evolve` action).
    pub schema_poll_ms: u64,
    /// Memory one SQL query may use, in MiB (its operators and the table
    /// rows it reads); past it the query ends with RESOURCE_EXHAUSTED.
    pub query_memory_mib: usize,
    /// Milliseconds one SQL query may run; past it the query ends with
    /// DEADLINE_EXCEEDED.
    pub query_timeout_ms: u64,
    /// Memory every running SQL query together may use, in MiB; a query
    /// that would take more ends with RESOURCE_EXHAUSTED.
    pub query_total_memory_mib: usize,
    /// SQL queries (and statements being planned or prepared) running at
    /// once; one more is refused with RESOURCE_EXHAUSTED.
    pub query_max_concurrent: usize,
    /// Longest SQL statement, in bytes; a longer one is refused with
    /// INVALID_ARGUMENT before it is parsed.
    pub query_max_sql_bytes: usize,
    /// Deepest operator nesting of a SQL statement (a chain of N `OR`s or
    /// `+`s is N deep); a deeper one is refused with INVALID_ARGUMENT
    /// before it is parsed.
    pub query_max_expr_depth: usize,
    /// Largest `k` of `vector_search`; a larger one is refused with
    /// INVALID_ARGUMENT.
    pub query_max_k: usize,
    /// Bytes of I/O one Lance scan (each level of a query, a search, a
    /// compaction read) may have issued ahead of its reader, in MiB: what
    /// a reader that stops pulling leaves in memory (`read_ahead.rs`).
    pub lance_io_buffer_mib: u64,
    /// Fragments one Lance scan reads at once.
    pub lance_fragment_readahead: usize,
    /// Bearer token required on Flight and HTTP.
    pub token: Option<String>,
    /// A file holding the bearer token (its first line): keeps it out of
    /// the process list. Exclusive with `token`.
    pub token_file: Option<PathBuf>,
    /// PEM certificate chain: Flight is served over TLS.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// etcd endpoints (comma-separated `http://HOST:PORT`, or
    /// `etcd://HOST:PORT,...`): the daemon joins that cluster, and the
    /// tables' shards are spread over its live members and failed over.
    pub cluster: Option<String>,
    /// This daemon's Flight address as the other members reach it
    /// (`grpc://HOST:PORT`, or `grpc+tls://HOST:PORT` when it serves
    /// TLS); required with `cluster`.
    pub advertise: Option<String>,
    /// PEM certificates of the CA that signed the members' TLS
    /// certificates: forwards to a member verify its certificate against
    /// them, for the host name it advertises. Required with `cluster` and
    /// `tls_cert`.
    pub cluster_tls_ca: Option<PathBuf>,
    /// A member not heard from for about this long is gone, and its
    /// shards are claimed by the survivors (etcd lease TTL: 60% of it,
    /// whole seconds, at least 2 s; the rest covers the claim).
    pub cluster_failover_ms: u64,
    /// The etcd key prefix one cluster's daemons share.
    pub cluster_prefix: String,
    /// Every shard writer's settings (`[writer]`).
    pub writer: WriterSettings,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            data_dir: None,
            tables: BTreeMap::new(),
            shards: BTreeMap::new(),
            listen: "127.0.0.1:50051".parse().expect("static address"),
            http: "127.0.0.1:9464".parse().expect("static address"),
            compactor: true,
            gc: true,
            gc_grace_secs: 600,
            compact_every_secs: 30,
            index_catchup: true,
            index_catchup_secs: 0,
            maintenance: true,
            target_fragment_rows: 1 << 20,
            materialize_deletions_pct: 10,
            base_cleanup: true,
            drain_secs: 10,
            max_streams: 256,
            max_connections: 512,
            max_decoded_mib_in_flight: 1024,
            first_message_secs: 30,
            min_flush_interval_ms: 1000,
            max_open_shards: 1024,
            shard_idle_secs: 600,
            schema_poll_ms: 5000,
            query_memory_mib: 512,
            query_timeout_ms: 30_000,
            query_total_memory_mib: 1024,
            query_max_concurrent: 16,
            query_max_sql_bytes: 1 << 20,
            query_max_expr_depth: 1000,
            query_max_k: 10_000,
            lance_io_buffer_mib: 64,
            lance_fragment_readahead: 4,
            token: None,
            token_file: None,
            tls_cert: None,
            tls_key: None,
            cluster: None,
            advertise: None,
            cluster_tls_ca: None,
            cluster_failover_ms: 10_000,
            cluster_prefix: "/memwal".into(),
            writer: WriterSettings::default(),
        }
    }
}

/// The flags of `memwal serve` (each one only when given).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// A data directory: serves (and on first start creates) the demo table
    /// `demo` at DATA_DIR/demo (`id` int64 key, `payload` utf8,
    /// `bucket(id, 4)`), unless tables are configured.
    pub data_dir: Option<String>,
    /// A table to serve, NAME=URI (repeatable); it must exist (`memwal init`).
    #[arg(long = "table")]
    pub tables: Vec<String>,
    /// Own only these buckets of a `bucket`-sharded table, NAME=LIST
    /// (`orders=0-1,3`; repeatable). Other daemons own the rest; rows for a
    /// bucket not owned are refused with FAILED_PRECONDITION.
    #[arg(long = "shards")]
    pub shards: Vec<String>,
    /// Arrow Flight address [default: 127.0.0.1:50051].
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// HTTP address (/healthz, /readyz, /status, /metrics) [default: 127.0.0.1:9464].
    #[arg(long)]
    pub http: Option<SocketAddr>,
    /// Do not run the compactor.
    #[arg(long)]
    pub no_compactor: bool,
    /// Do not collect garbage (the compactor still runs).
    #[arg(long)]
    pub no_gc: bool,
    /// GC's grace period in seconds: objects unreachable for less are kept
    /// (readers holding an older snapshot still read) [default: 600].
    #[arg(long)]
    pub gc_grace_secs: Option<u64>,
    /// Seconds between compaction cycles [default: 30].
    #[arg(long)]
    pub compact_every_secs: Option<u64>,
    /// Do not bring the base table's indexes up to the compacted rows
    /// after compaction cycles (SSTables then stay until something else
    /// optimizes the indexes).
    #[arg(long)]
    pub no_index_catchup: bool,
    /// Bring the base indexes up to date at most once per this many seconds
    /// (0: after every compaction cycle) [default: 0].
    #[arg(long)]
    pub index_catchup_secs: Option<u64>,
    /// Do not maintain the base table after compaction cycles (its
    /// fragments and deleted rows then grow with every commit).
    #[arg(long)]
    pub no_maintenance: bool,
    /// Seconds in-flight calls may run on after SIGTERM before they are cut
    /// and every shard closes [default: 10].
    #[arg(long)]
    pub drain_secs: Option<u64>,
    /// Ingest calls open at once; more are refused with RESOURCE_EXHAUSTED
    /// [default: 256].
    #[arg(long)]
    pub max_streams: Option<usize>,
    /// Flight connections open at once; one more is closed on accept
    /// [default: 512].
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Decoded message bytes all ingest calls may hold at once, in MiB
    /// (a message past it is refused with RESOURCE_EXHAUSTED) [default: 1024].
    #[arg(long)]
    pub max_decoded_mib_in_flight: Option<usize>,
    /// Seconds a new ingest call may take to send its first message
    /// [default: 30].
    #[arg(long)]
    pub first_message_secs: Option<u64>,
    /// `flush` actions start at most once per this many milliseconds per
    /// table (0: one at a time) [default: 1000].
    #[arg(long)]
    pub min_flush_interval_ms: Option<u64>,
    /// Shards each table keeps open at once; rows for one more are refused
    /// with RESOURCE_EXHAUSTED [default: 1024].
    #[arg(long)]
    pub max_open_shards: Option<usize>,
    /// Close a shard no rows arrived for in this many seconds (0: never)
    /// [default: 600].
    #[arg(long)]
    pub shard_idle_secs: Option<u64>,
    /// Read the base table's schema this often and follow a change (a
    /// column added or dropped) on every live shard; 0: only on the
    /// `evolve` action [default: 5000].
    #[arg(long)]
    pub schema_poll_ms: Option<u64>,
    /// Memory one SQL query may use, in MiB; past it the query ends with
    /// RESOURCE_EXHAUSTED [default: 512].
    #[arg(long)]
    pub query_memory_mib: Option<usize>,
    /// Milliseconds one SQL query may run; past it the query ends with
    /// DEADLINE_EXCEEDED [default: 30000].
    #[arg(long)]
    pub query_timeout_ms: Option<u64>,
    /// Memory every running SQL query together may use, in MiB; past it
    /// a query ends with RESOURCE_EXHAUSTED [default: 1024].
    #[arg(long)]
    pub query_total_memory_mib: Option<usize>,
    /// SQL queries running at once; one more is refused with
    /// RESOURCE_EXHAUSTED [default: 16].
    #[arg(long)]
    pub query_max_concurrent: Option<usize>,
    /// Longest SQL statement in bytes; longer: INVALID_ARGUMENT
    /// [default: 1048576].
    #[arg(long)]
    pub query_max_sql_bytes: Option<usize>,
    /// Deepest operator nesting of a SQL statement; deeper:
    /// INVALID_ARGUMENT [default: 1000].
    #[arg(long)]
    pub query_max_expr_depth: Option<usize>,
    /// Largest k of vector_search; larger: INVALID_ARGUMENT
    /// [default: 10000].
    #[arg(long)]
    pub query_max_k: Option<usize>,
    /// I/O one Lance scan may read ahead of its reader, in MiB (a stalled
    /// query holds about this much per level it scans) [default: 64].
    #[arg(long)]
    pub lance_io_buffer_mib: Option<u64>,
    /// Fragments one Lance scan reads at once [default: 4].
    #[arg(long)]
    pub lance_fragment_readahead: Option<usize>,
    /// Require `authorization: Bearer TOKEN` on Flight and HTTP (visible in
    /// the process list: prefer --token-file or MEMWAL_TOKEN).
    #[arg(long)]
    pub token: Option<String>,
    /// Read the bearer token from the first line of this file.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Serve Flight over TLS with this PEM certificate chain (needs --tls-key).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Join a cluster through etcd: ENDPOINTS comma-separated
    /// (`etcd://10.0.0.1:2379,10.0.0.2:2379`); shards are spread over the
    /// live members, failed over, and any member takes any put.
    #[arg(long, value_name = "ENDPOINTS")]
    pub cluster: Option<String>,
    /// This daemon's Flight address as the other members reach it
    /// (`grpc://10.0.0.5:50051`; `grpc+tls://HOST:PORT` with --tls-cert);
    /// required with --cluster.
    #[arg(long, value_name = "URL")]
    pub advertise: Option<String>,
    /// The PEM CA that signed the members' TLS certificates (needed with
    /// --cluster and --tls-cert).
    #[arg(long, value_name = "PEM")]
    pub cluster_tls_ca: Option<PathBuf>,
    /// A dead member's shards are served again within about this many
    /// milliseconds [default: 10000].
    #[arg(long)]
    pub cluster_failover_ms: Option<u64>,
    /// The etcd key prefix of this cluster [default: /memwal].
    #[arg(long)]
    pub cluster_prefix: Option<String>,
    /// A shard writer setting, KEY=VALUE (repeatable): the `[writer]` keys
    /// of the settings file (`--writer memtable_max_mib=128`).
    #[arg(long = "writer", value_name = "KEY=VALUE")]
    pub writer: Vec<String>,
    /// A TOML settings file (docs/memwal.toml documents every key).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print the merged settings (defaults < file < flags < environment,
    /// tokens redacted) as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
}

/// The flags that were given, as a settings layer.
fn flag_layer(args: &ServeArgs) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let mut m = serde_json::Map::new();
    let mut put = |k: &str, v: serde_json::Value| {
        m.insert(k.to_string(), v);
    };
    if let Some(d) = &args.data_dir {
        put("data_dir", d.clone().into());
    }
    if !args.tables.is_empty() {
        let mut tables = serde_json::Map::new();
        for t in &args.tables {
            let (name, uri) = t
                .split_once('=')
                .filter(|(n, u)| !n.is_empty() && !u.is_empty())
                .ok_or_else(|| format!("--table `{t}`: expected NAME=URI"))?;
            tables.insert(name.to_string(), uri.to_string().into());
        }
        put("tables", tables.into());
    }
    if !args.shards.is_empty() {
        let mut shards = serde_json::Map::new();
        for t in &args.shards {
            let (name, list) = t
                .split_once('=')
                .filter(|(n, l)| !n.is_empty() && !l.is_empty())
                .ok_or_else(|| format!("--shards `{t}`: expected NAME=LIST (orders=0-1,3)"))?;
            shards.insert(name.to_string(), list.to_string().into());
        }
        put("shards", shards.into());
    }
    if let Some(a) = args.listen {
        put("listen", a.to_string().into());
    }
    if let Some(a) = args.http {
        put("http", a.to_string().into());
    }
    if args.no_compactor {
        put("compactor", false.into());
    }
    if args.no_gc {
        put("gc", false.into());
    }
    if let Some(s) = args.gc_grace_secs {
        put("gc_grace_secs", s.into());
    }
    if let Some(s) = args.compact_every_secs {
        put("compact_every_secs", s.into());
    }
    if args.no_index_catchup {
        put("index_catchup", false.into());
    }
    if let Some(s) = args.index_catchup_secs {
        put("index_catchup_secs", s.into());
    }
    if args.no_maintenance {
        put("maintenance", false.into());
    }
    if let Some(s) = args.drain_secs {
        put("drain_secs", s.into());
    }
    if let Some(n) = args.max_streams {
        put("max_streams", n.into());
    }
    if let Some(n) = args.max_connections {
        put("max_connections", n.into());
    }
    if let Some(n) = args.max_decoded_mib_in_flight {
        put("max_decoded_mib_in_flight", n.into());
    }
    if let Some(s) = args.first_message_secs {
        put("first_message_secs", s.into());
    }
    if let Some(s) = args.min_flush_interval_ms {
        put("min_flush_interval_ms", s.into());
    }
    if let Some(n) = args.max_open_shards {
        put("max_open_shards", n.into());
    }
    if let Some(s) = args.shard_idle_secs {
        put("shard_idle_secs", s.into());
    }
    if let Some(s) = args.schema_poll_ms {
        put("schema_poll_ms", s.into());
    }
    if let Some(n) = args.query_memory_mib {
        put("query_memory_mib", n.into());
    }
    if let Some(s) = args.query_timeout_ms {
        put("query_timeout_ms", s.into());
    }
    for (key, value) in [
        ("query_total_memory_mib", args.query_total_memory_mib),
        ("query_max_concurrent", args.query_max_concurrent),
        ("query_max_sql_bytes", args.query_max_sql_bytes),
        ("query_max_expr_depth", args.query_max_expr_depth),
        ("query_max_k", args.query_max_k),
        ("lance_fragment_readahead", args.lance_fragment_readahead),
    ] {
        if let Some(n) = value {
            put(key, n.into());
        }
    }
    if let Some(n) = args.lance_io_buffer_mib {
        put("lance_io_buffer_mib", n.into());
    }
    if let Some(t) = &args.token {
        put("token", t.clone().into());
    }
    for (k, v) in [
        ("cluster", &args.cluster),
        ("advertise", &args.advertise),
        ("cluster_prefix", &args.cluster_prefix),
    ] {
        if let Some(v) = v {
            put(k, v.clone().into());
        }
    }
    if let Some(ms) = args.cluster_failover_ms {
        put("cluster_failover_ms", ms.into());
    }
    if !args.writer.is_empty() {
        let mut writer = serde_json::Map::new();
        for flag in &args.writer {
            let (k, v) = crate::writer_config::parse_flag(flag)?;
            writer.insert(k, v);
        }
        put("writer", writer.into());
    }
    for (k, v) in [
        ("tls_cert", &args.tls_cert),
        ("tls_key", &args.tls_key),
        ("token_file", &args.token_file),
        ("cluster_tls_ca", &args.cluster_tls_ca),
    ] {
        if let Some(p) = v {
            put(k, p.to_string_lossy().into_owned().into());
        }
    }
    Ok(m)
}

/// Resolves the layers; errors name the offending key and source.
pub fn resolve(args: &ServeArgs) -> Result<ServeConfig, String> {
    let mut fig = Figment::from(Serialized::defaults(ServeConfig::default()));
    if let Some(path) = &args.config {
        if !path.exists() {
            return Err(format!("--config {}: no such file", path.display()));
        }
        fig = fig.merge(Toml::file(path));
    }
    let config: ServeConfig = fig
        .merge(Serialized::defaults(flag_layer(args)?))
        .merge(Env::prefixed("MEMWAL_").only(&[
            "data_dir",
            "tables",
            "shards",
            "listen",
            "http",
            "compactor",
            "gc",
            "gc_grace_secs",
            "compact_every_secs",
            "index_catchup",
            "index_catchup_secs",
            "maintenance",
            "target_fragment_rows",
            "materialize_deletions_pct",
            "base_cleanup",
            "drain_secs",
            "max_streams",
            "max_connections",
            "max_decoded_mib_in_flight",
            "first_message_secs",
            "min_flush_interval_ms",
            "max_open_shards",
            "shard_idle_secs",
            "schema_poll_ms",
            "query_memory_mib",
            "query_timeout_ms",
            "query_total_memory_mib",
            "query_max_concurrent",
            "query_max_sql_bytes",
            "query_max_expr_depth",
            "query_max_k",
            "lance_io_buffer_mib",
            "lance_fragment_readahead",
            "token",
            "token_file",
            "tls_cert",
            "tls_key",
            "cluster",
            "advertise",
            "cluster_tls_ca",
            "cluster_failover_ms",
            "cluster_prefix",
        ]))
        .merge(Env::prefixed("MEMWAL_WRITER_").map(|k| format!("writer.{k}").into()))
        .extract()
        .map_err(|e| format!("settings: {e}"))?;
    if config.tables.is_empty() && config.data_dir.is_none() {
        return Err(
            "give a data directory (memwal serve ./data) or tables (--table NAME=URI)".into(),
        );
    }
    let mut config = config;
    if let Some(path) = &config.token_file {
        if config.token.is_some() {
            return Err("give the token or token_file, not both".into());
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("token_file {}: {e}", path.display()))?;
        let token = text.lines().next().unwrap_or("").trim().to_string();
        if token.is_empty() {
            return Err(format!("token_file {}: empty", path.display()));
        }
        config.token = Some(token);
    }
    if config.token.as_deref() == Some("") {
        return Err("token: empty (unset it to serve without one)".into());
    }
    for (key, zero) in [
        ("max_streams", config.max_streams == 0),
        ("max_connections", config.max_connections == 0),
        (
            "max_decoded_mib_in_flight",
            config.max_decoded_mib_in_flight == 0,
        ),
        ("first_message_secs", config.first_message_secs == 0),
        ("max_open_shards", config.max_open_shards == 0),
        ("query_memory_mib", config.query_memory_mib == 0),
        ("query_timeout_ms", config.query_timeout_ms == 0),
        ("query_total_memory_mib", config.query_total_memory_mib == 0),
        ("query_max_concurrent", config.query_max_concurrent == 0),
        ("query_max_sql_bytes", config.query_max_sql_bytes == 0),
        ("query_max_expr_depth", config.query_max_expr_depth == 0),
        ("query_max_k", config.query_max_k == 0),
        ("lance_io_buffer_mib", config.lance_io_buffer_mib == 0),
        (
            "lance_fragment_readahead",
            config.lance_fragment_readahead == 0,
        ),
        ("target_fragment_rows", config.target_fragment_rows == 0),
    ] {
        if zero {
            return Err(format!("{key} must be at least 1"));
        }
    }
    if config.materialize_deletions_pct > 100 {
        return Err(format!(
            "materialize_deletions_pct must be within 0..=100, not {}",
            config.materialize_deletions_pct
        ));
    }
    if config.tls_cert.is_some() != config.tls_key.is_some() {
        return Err("TLS needs both tls_cert and tls_key (or neither)".into());
    }
    for (table, list) in &config.shards {
        parse_buckets(list).map_err(|e| format!("shards of `{table}`: {e}"))?;
    }
    if let Some(cluster) = &config.cluster {
        etcd_endpoints(cluster)?;
        if config.advertise.as_deref().is_none_or(str::is_empty) {
            return Err("cluster: give `advertise`, the Flight address the other members reach this daemon at (grpc://HOST:PORT)".into());
        }
        if !config.shards.is_empty() {
            return Err(
                "cluster: the cluster places shards; `shards` lists cannot be given with it".into(),
            );
        }
        let advertise = config.advertise.as_deref().unwrap_or_default();
        match (config.tls_cert.is_some(), advertise.split_once("://")) {
            (true, Some(("grpc+tls", _))) => {
                if config.cluster_tls_ca.is_none() {
                    return Err("cluster with TLS: give `cluster_tls_ca`, the PEM CA that signed the members' certificates (puts forwarded to a member verify its certificate)".into());
                }
            }
            (true, _) => {
                return Err(format!(
                    "cluster with TLS: `advertise` must be grpc+tls://HOST:PORT (HOST as named in tls_cert), not `{advertise}`"
                ))
            }
            (false, Some(("grpc", _))) => {}
            (false, _) => {
                return Err(format!(
                    "`advertise` must be grpc://HOST:PORT (grpc+tls:// only with tls_cert), not `{advertise}`"
                ))
            }
        }
        if let Some((_, rest)) = advertise.split_once("://") {
            if rest
                .rsplit_once(':')
                .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
            {
                return Err(format!(
                    "`advertise` `{advertise}`: give HOST:PORT after the scheme"
                ));
            }
        }
        if config.cluster_failover_ms < 3000 {
            return Err("cluster_failover_ms must be at least 3000 (etcd leases last whole seconds, at least 2)".into());
        }
        if !config.cluster_prefix.starts_with('/') || config.cluster_prefix.len() < 2 {
            return Err(format!(
                "cluster_prefix `{}`: must start with `/` and name something",
                config.cluster_prefix
            ));
        }
    } else if config.advertise.is_some() || config.cluster_tls_ca.is_some() {
        return Err("advertise and cluster_tls_ca are only used with cluster".into());
    }
    config.writer.to_config()?;
    Ok(config)
}

/// The merged settings as TOML, tokens redacted and every `[writer]` key
/// shown (unset ones at the built-in default).
pub fn print(config: &ServeConfig) -> Result<String, String> {
    let mut shown = config.clone();
    if shown.token.is_some() {
        shown.token = Some("<redacted>".into());
    }
    shown.writer = shown.writer.filled();
    toml::to_string(&shown).map_err(|e| format!("printing the settings: {e}"))
}

/// The etcd endpoints of a `cluster` setting: comma-separated, each
/// `etcd://HOST:PORT`, `http://HOST:PORT` or `HOST:PORT` (as `http://`).
pub fn etcd_endpoints(list: &str) -> Result<Vec<String>, String> {
    let endpoints: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| {
            let rest = e
                .strip_prefix("etcd://")
                .or_else(|| e.strip_prefix("http://"))
                .unwrap_or(e);
            if rest.contains("://") || !rest.contains(':') {
                return Err(format!(
                    "cluster: `{e}` is not an etcd endpoint (etcd://HOST:PORT)"
                ));
            }
            Ok(format!("http://{rest}"))
        })
        .collect::<Result<_, _>>()?;
    if endpoints.is_empty() {
        return Err("cluster: no etcd endpoint given".into());
    }
    Ok(endpoints)
}

/// Parses a bucket list: numbers and inclusive ranges, comma-separated
/// (`0-1,3`), sorted and deduplicated.
pub fn parse_buckets(list: &str) -> Result<Vec<u32>, String> {
    let mut out = std::collections::BTreeSet::new();
    for part in list.split(',').map(str::trim) {
        let num = |s: &str| {
            s.trim()
                .parse::<u32>()
                .map_err(|_| format!("`{s}` is not a bucket number (in `{list}`)"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("empty range `{part}`"));
                }
                out.extend(a..=b);
            }
            None => {
                out.insert(num(part)?);
            }
        }
    }
    Ok(out.into_iter().collect())
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
