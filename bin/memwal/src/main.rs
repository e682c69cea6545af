//! `memwal`: command-line access to MemWAL shards of a Lance table.
//!
//! The ingestion daemon (`serve`), table setup (`init`), maintenance
//! (`compact`, `gc`), shard manifest operations (`shard …`), queries and
//! loads.

mod config;
mod inspect;
mod load;
mod logging;
mod query;
mod read_ahead;
mod serve;
mod table;
mod writer_config;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use memwal_fencing::{
    FencingError, ManifestStore, ShardId, ShardIdentity, ShardManifest, ShardStatus,
};
use memwal_store::{open_store, RetryPolicy};

/// `memwal --version`: the package version and the git commit it was
/// built from (`unknown` outside a git checkout).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("MEMWAL_GIT_COMMIT"),
    ")"
);

#[derive(Parser)]
#[command(
    name = "memwal",
    version = VERSION,
    about = "MemWAL shard tools for Lance tables"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the ingestion daemon: Arrow Flight on --listen, HTTP on --http.
    Serve(Box<config::ServeArgs>),
    /// Send synthetic rows to a running daemon and report rows/s and ack
    /// latencies.
    Load(load::LoadArgs),
    /// Run one SQL query against a running daemon (Flight SQL) and print
    /// the rows (`memwal query "SELECT * FROM demo WHERE id = 4"`).
    Query(query::QueryArgs),
    /// Create a base table with the MemWAL index (e.g. `memwal init ./data/t
    /// --column id:int64:key --column v:utf8 --bucket id:4`, or `memwal init
    /// ./data/t --schema schema.arrows --primary-key id --bucket id:4`).
    Init {
        /// Table URI: a local directory, file://, memory:// or s3://bucket/prefix.
        uri: String,
        /// A column as NAME:TYPE or NAME:TYPE:key (key columns form the
        /// primary key, in order; none: an append-only table).
        #[arg(
            long = "column",
            required_unless_present = "schema",
            conflicts_with = "schema"
        )]
        columns: Vec<String>,
        /// The schema as an Arrow IPC stream or file (any Arrow types; e.g.
        /// pyarrow: `pa.ipc.new_stream(open("s.arrows", "wb"), schema).close()`).
        #[arg(long)]
        schema: Option<std::path::PathBuf>,
        /// Primary-key columns of --schema, in order (comma-separated);
        /// without it, keys the schema's own metadata marks, else none.
        #[arg(long = "primary-key", requires = "schema", value_delimiter = ',')]
        primary_key: Vec<String>,
        /// unsharded, bucket(COLUMN, N) or identity(COLUMN).
        #[arg(long, conflicts_with_all = ["bucket", "identity"])]
        sharding: Option<String>,
        /// Shorthand for --sharding 'bucket(COLUMN, N)'.
        #[arg(long, value_name = "COLUMN:N", conflicts_with = "identity")]
        bucket: Option<String>,
        /// Shorthand for --sharding 'identity(COLUMN)'.
        #[arg(long, value_name = "COLUMN")]
        identity: Option<String>,
    },
    /// Per shard: epoch, manifest version, generations, WAL positions,
    /// SSTables and compaction progress.
    Status {
        /// Table URI (or give --cluster).
        #[arg(required_unless_present = "cluster")]
        uri: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// A cluster's members and shard owners, read from etcd
        /// (ENDPOINTS as for `serve --cluster`) instead of a table.
        #[arg(long, value_name = "ENDPOINTS", conflicts_with = "uri")]
        cluster: Option<String>,
        /// The cluster's etcd key prefix.
        #[arg(long, default_value = "/memwal")]
        cluster_prefix: String,
    },
    /// One table's shards in depth: manifest and stored versions, the WAL
    /// (entries, bytes, the newest ones decoded), SSTables and their
    /// compaction state. Read-only.
    Inspect {
        /// Table URI.
        uri: String,
        /// Only this shard (its UUID).
        #[arg(long)]
        shard: Option<String>,
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Merge every shard's published SSTables into the base table (one cycle).
    Compact {
        /// Table URI.
        uri: String,
    },
    /// Delete what no reader or writer can need any more: compacted
    /// SSTables, abandoned flushes, flushed WAL entries, old manifests.
    Gc {
        /// Table URI.
        uri: String,
        /// Report what would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Keep everything younger than this (e.g. 10m, 1h).
        #[arg(long, default_value = "10m", value_parser = table::parse_duration)]
        grace: std::time::Duration,
        /// Manifest versions kept per shard besides the grace rule.
        #[arg(long, default_value_t = 10)]
        keep_manifests: usize,
        /// Also remove base table versions older than this (lance cleanup);
        /// without it SSTables wait for the owner's own cleanup.
        #[arg(long, value_parser = table::parse_duration)]
        base_retention: Option<std::time::Duration>,
    },
    /// Shard manifest operations.
    Shard {
        #[command(subcommand)]
        op: ShardOp,
    },
}

#[derive(clap::Args)]
struct ShardArgs {
    /// Table URI: a local directory, file://, memory:// or s3://bucket/prefix.
    #[arg(long, env = "MEMWAL_TABLE")]
    table: String,
    /// Shard id (a UUID).
    #[arg(long)]
    shard: String,
}

#[derive(Subcommand)]
enum ShardOp {
    /// Create the shard (version 1, epoch 0) if it does not exist.
    Init {
        #[command(flatten)]
        args: ShardArgs,
        /// Sharding spec id (0 = manual shard).
        #[arg(long, default_value_t = 0)]
        spec_id: u32,
    },
    /// Claim the shard (creating it as a manual shard if missing), fencing
    /// the previous writer. Prints the new epoch.
    Claim {
        #[command(flatten)]
        args: ShardArgs,
        /// Claim this many times in a row, printing `won EPOCH` or `lost
        /// REASON` per round (a claim race tool; losing is not an error).
        #[arg(long, default_value_t = 1)]
        rounds: u32,
    },
    /// Seal the shard for a drop: refuse claims, bump the epoch and put a
    /// fence sentinel at the WAL tip so the live writer stops at its next
    /// append.
    Seal {
        #[command(flatten)]
        args: ShardArgs,
    },
    /// Return a sealed shard to ACTIVE.
    Unseal {
        #[command(flatten)]
        args: ShardArgs,
    },
    /// Print the latest manifest.
    Show {
        #[command(flatten)]
        args: ShardArgs,
    },
    /// Print a fresh random shard id.
    NewId,
}

fn manifests(args: &ShardArgs) -> Result<ManifestStore, String> {
    let shard = ShardId::parse(&args.shard).map_err(|e| e.to_string())?;
    let loc = open_store(&args.table).map_err(|e| e.to_string())?;
    Ok(ManifestStore::new(
        loc.store,
        &loc.root,
        shard,
        RetryPolicy::default(),
    ))
}

fn describe(m: &ShardManifest) -> String {
    let status = match ShardStatus::try_from(m.status) {
        Ok(ShardStatus::Active) => "ACTIVE",
        Ok(ShardStatus::Sealed) => "SEALED",
        Err(_) => "UNKNOWN",
    };
    let mut out = format!(
        "version: {}\nwriter_epoch: {}\nstatus: {status}\nshard_spec_id: {}\ncurrent_generation: {}\nreplay_after_wal_entry_position: {}\nwal_entry_position_last_seen: {}\nsstables: {}\n",
        m.version,
        m.writer_epoch,
        m.shard_spec_id,
        m.current_generation,
        m.replay_after_wal_entry_position,
        m.wal_entry_position_last_seen,
        m.sstables.len(),
    );
    for s in &m.sstables {
        out.push_str(&format!("  - generation {} at {}\n", s.generation, s.path));
    }
    out
}

async fn run(cli: Cli) -> Result<String, String> {
    let op = match cli.command {
        Command::Init {
            uri,
            columns,
            schema,
            primary_key,
            sharding,
            bucket,
            identity,
        } => {
            let schema = match schema {
                Some(path) => table::read_schema(&path, &primary_key)?,
                None => table::parse_schema(&columns)?,
            };
            let sharding = match (sharding, bucket, identity) {
                (Some(s), _, _) => s,
                (None, Some(b), _) => {
                    let (col, n) = b
                        .rsplit_once(':')
                        .ok_or_else(|| format!("--bucket `{b}`: expected COLUMN:N"))?;
                    format!("bucket({col}, {n})")
                }
                (None, None, Some(col)) => format!("identity({col})"),
                (None, None, None) => "unsharded".to_string(),
            };
            return table::init(&uri, schema, &sharding).await;
        }
        Command::Compact { uri } => return table::compact(&uri).await,
        Command::Status {
            uri,
            json,
            cluster,
            cluster_prefix,
        } => {
            return match (uri, cluster) {
                (_, Some(c)) => table::cluster_status(&c, &cluster_prefix, json).await,
                (Some(uri), None) => table::status(&uri, json).await,
                (None, None) => Err("give a table URI or --cluster".into()),
            }
        }
        Command::Inspect { uri, shard, json } => {
            return inspect::inspect(&uri, shard.as_deref(), json).await
        }
        Command::Serve(args) => return serve::serve(*args).await,
        Command::Load(args) => return load::load(args).await,
        Command::Query(args) => return query::query(args).await,
        Command::Gc {
            uri,
            dry_run,
            grace,
            keep_manifests,
            base_retention,
        } => return table::gc(&uri, dry_run, grace, keep_manifests, base_retention).await,
        Command::Shard { op } => op,
    };
    let err = |e: FencingError| e.to_string();
    match op {
        ShardOp::NewId => Ok(format!("{}\n", ShardId::random())),
        ShardOp::Init { args, spec_id } => {
            let identity = ShardIdentity {
                spec_id,
                ..Default::default()
            };
            let m = manifests(&args)?
                .initialize_shard(&identity)
                .await
                .map_err(err)?;
            Ok(describe(&m))
        }
        ShardOp::Claim { args, rounds } if rounds > 1 => {
            let store = manifests(&args)?;
            let mut out = String::new();
            for _ in 0..rounds {
                match store.claim(Some(&ShardIdentity::manual())).await {
                    Ok(c) => out.push_str(&format!("won {}\n", c.epoch)),
                    Err(e @ FencingError::ClaimLost { .. }) => out.push_str(&format!("lost {e}\n")),
                    Err(e) => return Err(format!("{out}{}", err(e))),
                }
            }
            Ok(out)
        }
        ShardOp::Claim { args, .. } => {
            let c = manifests(&args)?
                .claim(Some(&ShardIdentity::manual()))
                .await
                .map_err(err)?;
            Ok(format!(
                "claimed epoch {}\n{}",
                c.epoch,
                describe(&c.manifest)
            ))
        }
        ShardOp::Seal { args } => {
            let (m, sentinel) = memwal_wal::seal_and_fence(&manifests(&args)?)
                .await
                .map_err(|e| e.to_string())?;
            Ok(format!(
                "WAL fenced at position {sentinel}\n{}",
                describe(&m)
            ))
        }
        ShardOp::Unseal { args } => Ok(describe(&manifests(&args)?.unseal().await.map_err(err)?)),
        ShardOp::Show { args } => match manifests(&args)?.load_latest().await.map_err(err)? {
            Some(m) => Ok(describe(&m)),
            None => Err(format!(
                "shard {} has no manifest in {}",
                args.shard, args.table
            )),
        },
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Process-wide settings that change the environment, before any
    // thread exists (a bad setting is reported by `serve` itself).
    if let Command::Serve(args) = &cli.command {
        if let Ok(config) = config::resolve(args) {
            read_ahead::apply(&config);
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("memwal: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run_main(cli))
}

async fn run_main(cli: Cli) -> ExitCode {
    // Crash points named in FAILPOINTS (test builds only; see memwal_store).
    memwal_store::failpoints_from_env();
    logging::init();
    match run(cli).await {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("memwal: {e}");
            ExitCode::FAILURE
        }
    }
}
