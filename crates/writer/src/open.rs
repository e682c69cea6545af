//! Opening a writer: validate -> claim -> fence sentinel -> replay ->
//! start the WAL appender and the background tasks.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use arrow_schema::{Field, Schema};
use futures::StreamExt;
use lance::dataset::builder::DatasetBuilder;
use memwal_fencing::{ManifestStore, ShardId, ShardIdentity, ShardManifest};
use memwal_memtable::{
    MemTable, TableSchema, FIELD_ID_KEY, PRIMARY_KEY_KEY, PRIMARY_KEY_POSITION_KEY,
};
use memwal_sharding::ShardRouter;
use memwal_sstable::{LanceFileVersion, LanceStore, SsTableWriter};
use memwal_store::{open_store, StoreLocation};
use memwal_wal::{
    replay, write_fence_sentinel, ReplayRange, WalAppender, WalConfig, WalLocation,
    DEFAULT_REPLAY_PREFETCH,
};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch, Semaphore};
use tracing::Instrument;

use crate::config::ShardWriterConfig;
use crate::flush::FlushCtx;
use crate::stats::names;
use crate::writer::{Inner, ShardWriter, State};
use crate::{Error, Result};

/// Where the table is: a URI for [`memwal_store::open_store`], or a store
/// and root the caller built (e.g. wrapped in a test store).
#[derive(Debug, Clone)]
pub enum TableLocation {
    /// A table URI (local path, `file://`, `memory://`, `s3://`).
    Uri(String),
    /// An opened store and the table root in it.
    Store(StoreLocation),
}

impl From<&str> for TableLocation {
    fn from(s: &str) -> Self {
        Self::Uri(s.to_string())
    }
}

impl From<String> for TableLocation {
    fn from(s: String) -> Self {
        Self::Uri(s)
    }
}

impl From<StoreLocation> for TableLocation {
    fn from(l: StoreLocation) -> Self {
        Self::Store(l)
    }
}

impl TableLocation {
    fn resolve(self) -> Result<StoreLocation> {
        match self {
            Self::Store(l) => Ok(l),
            Self::Uri(uri) => open_store(&uri).map_err(|e| Error::invalid(e.to_string())),
        }
    }
}

/// The base table's schema (Arrow, with `lance:field_id` on every column
/// and the primary-key metadata) and its data storage version.
pub(crate) async fn load_base_table(
    lance: &LanceStore,
    root: &object_store::path::Path,
) -> Result<(Schema, LanceFileVersion)> {
    let uri = lance.uri(root);
    let ds = DatasetBuilder::from_uri(&uri)
        .with_session(lance.session().clone())
        .load()
        .await
        .map_err(|e| Error::storage(format!("opening the base table at `{root}`"), e))?;
    let fields: Vec<Field> = ds
        .schema()
        .fields
        .iter()
        .map(|f| {
            let mut md: HashMap<String, String> = f.metadata.clone();
            md.insert(FIELD_ID_KEY.to_string(), f.id.to_string());
            if let Some(pos) = f.unenforced_primary_key_position {
                md.entry(PRIMARY_KEY_KEY.to_string())
                    .or_insert_with(|| "true".to_string());
                if pos > 0 {
                    md.entry(PRIMARY_KEY_POSITION_KEY.to_string())
                        .or_insert_with(|| pos.to_string());
                }
            }
            Field::from(f).with_metadata(md)
        })
        .collect();
    let schema = Schema::new_with_metadata(fields, ds.schema().metadata.clone());
    let version = ds
        .manifest()
        .data_storage_format
        .lance_file_format()
        .to_selector();
    Ok((schema, version))
}

/// A generation being rebuilt from the WAL.
struct Rebuild {
    generation: u64,
    memtable: MemTable,
    first_position: u64,
    last_position: u64,
}

pub(crate) async fn open(
    table: TableLocation,
    shard: ShardId,
    config: ShardWriterConfig,
) -> Result<ShardWriter> {
    let span = tracing::info_span!("open", %shard);
    open_inner(table, shard, config).instrument(span).await
}

async fn open_inner(
    table: TableLocation,
    shard: ShardId,
    config: ShardWriterConfig,
) -> Result<ShardWriter> {
    // 1. Everything that can fail without side effects.
    config.validate()?;
    let loc = table.resolve()?;
    let lance = LanceStore::new(loc.store.clone());
    let (arrow, storage_version) = load_base_table(&lance, &loc.root).await?;
    let schema = Arc::new(
        TableSchema::new(Arc::new(arrow))
            .map_err(|e| Error::invalid(format!("base table schema: {e}")))?,
    );
    let router = match &config.sharding {
        Some(s) => Some((
            ShardRouter::new(&s.spec, schema.table_schema()).map_err(Error::from_sharding)?,
            s.identity.field_values.clone(),
        )),
        None => None,
    };
    let identity = config.identity();
    let manifests = Arc::new(ManifestStore::new(
        loc.store.clone(),
        &loc.root,
        shard,
        config.retry.clone(),
    ));
    let existing = manifests
        .load_latest()
        .await
        .map_err(|e| Error::from_fencing(e, "loading the shard manifest"))?;
    match &existing {
        None if !config.create_if_missing => {
            return Err(Error::invalid(format!(
                "shard {shard} does not exist and create_if_missing is false"
            )))
        }
        Some(m) if ShardIdentity::of_manifest(m) != identity => {
            return Err(Error::invalid(format!(
                "shard {shard} was created with {:?}, the config gives {identity:?}",
                ShardIdentity::of_manifest(m)
            )))
        }
        _ => {}
    }

    // 2. Claim and fence.
    let claim = manifests
        .claim(Some(&identity))
        .await
        .map_err(|e| Error::from_fencing(e, "claiming the shard"))?;
    let epoch = claim.epoch;
    metrics::gauge!(names::EPOCH).set(epoch as f64);
    let sentinel = write_fence_sentinel(&manifests, epoch, &claim.manifest)
        .await
        .map_err(|e| Error::from_wal(e, "writing the fence sentinel"))?;
    let ctx = FlushCtx {
        manifests: manifests.clone(),
        epoch,
        sstables: SsTableWriter::new(
            loc.store.clone(),
            manifests.layout().clone(),
            storage_version,
        ),
        schema: schema.clone(),
    };

    // 3. Replay.
    let mut manifest = claim.manifest;
    let mut publishes = 0;
    replay_wal(&ctx, &config, &mut manifest, sentinel, &mut publishes)
        .instrument(tracing::info_span!("replay", epoch, sentinel))
        .await?;

    // 4. Start writing.
    let generation = manifest.current_generation.max(1);
    let appender = WalAppender::start(
        manifests.clone(),
        epoch,
        sentinel + 1,
        generation,
        WalConfig {
            max_entry_bytes: config.wal_max_entry_bytes,
            ..Default::default()
        },
    )
    .map_err(|e| Error::from_wal(e, "starting the WAL appender"))?;
    let (jobs_tx, jobs_rx) = mpsc::unbounded_channel();
    let inner = Arc::new(Inner {
        shard,
        epoch,
        sentinel,
        schema: schema.clone(),
        router,
        flush_permits: Arc::new(Semaphore::new(config.flush_concurrency)),
        config: config.clone(),
        ctx,
        state: Mutex::new(State {
            appender: Some(appender),
            active: MemTable::new(schema),
            generation,
            active_since: None,
            frozen: VecDeque::new(),
            published_generation: generation - 1,
            terminal: None,
            last_flush_error: None,
            jobs: Some(jobs_tx),
        }),
        manifest: Mutex::new(manifest),
        progress: watch::channel(0).0,
        shutdown: watch::channel(false).0,
        tasks: Mutex::new(Vec::new()),
        puts: AtomicU64::new(0),
        rows: AtomicU64::new(0),
        publishes: AtomicU64::new(publishes),
        backpressure_waits: AtomicU64::new(0),
    });
    let mut tasks = vec![tokio::spawn(
        crate::flush::flusher(inner.clone(), jobs_rx)
            .instrument(tracing::info_span!("flusher", %shard, epoch)),
    )];
    if let Some(age) = config.max_unflushed_age {
        tasks.push(tokio::spawn(
            crate::freeze::age_ticker(inner.clone(), age)
                .instrument(tracing::info_span!("age_ticker", %shard, epoch)),
        ));
    }
    *inner.tasks.lock() = tasks;
    tracing::info!(%shard, epoch, sentinel, generation, "shard writer open");
    Ok(ShardWriter { inner })
}

/// Replays the WAL between the replay cursor and our sentinel. Each
/// recorded generation is rebuilt whole as one memtable (never
/// renumbered) and, once complete (the next generation starts, or the WAL
/// ends), flushed and published before replay continues: memory holds
/// one generation at a time, and every replayed row is published when
/// `open` returns. Entries without a `generation` (upstream WAL-only
/// entries) belong to the generation being rebuilt (the manifest's
/// `current_generation` if none is). A generation whose memtable exceeds
/// `max_unflushed_bytes` fails with [`Error::Backpressure`] naming it.
async fn replay_wal(
    ctx: &FlushCtx,
    config: &ShardWriterConfig,
    manifest: &mut ShardManifest,
    sentinel: u64,
    publishes: &mut u64,
) -> Result<()> {
    let range = ReplayRange::new(manifest, ctx.epoch, sentinel);
    let mut entries = replay(
        WalLocation::of(&ctx.manifests),
        range,
        DEFAULT_REPLAY_PREFETCH,
    );
    let mut current: Option<Rebuild> = None;
    while let Some(entry) = entries.next().await {
        let entry = entry.map_err(|e| Error::from_wal(e, "replaying the WAL"))?;
        let generation = entry.generation.unwrap_or_else(|| {
            current
                .as_ref()
                .map_or(manifest.current_generation, |c| c.generation)
        });
        if current.as_ref().is_some_and(|c| c.generation != generation) {
            let done = current.take().expect("checked");
            *manifest = publish_replayed(ctx, config, done, sentinel).await?;
            *publishes += 1;
        }
        let rebuild = current.get_or_insert_with(|| Rebuild {
            generation,
            memtable: MemTable::new(ctx.schema.clone()),
            first_position: entry.position,
            last_position: entry.position,
        });
        for batch in &entry.batches {
            let storage = ctx.schema.to_storage(batch).map_err(|e| Error::Corrupt {
                reason: format!(
                    "WAL entry {} does not fit the table schema: {e}",
                    entry.position
                ),
            })?;
            rebuild
                .memtable
                .insert(&storage)
                .map_err(|e| Error::Corrupt {
                    reason: format!("WAL entry {}: {e}", entry.position),
                })?;
        }
        rebuild.last_position = entry.position;
        let bytes = rebuild.memtable.memory_usage().total();
        if bytes > config.max_unflushed_bytes {
            return Err(Error::Backpressure {
                reason: format!(
                    "replay: recorded generation {} (WAL positions {}..={}) needs {bytes} bytes \
                     in memory, more than max_unflushed_bytes {}; a generation is rebuilt whole, \
                     so raise max_unflushed_bytes to open this shard",
                    rebuild.generation,
                    rebuild.first_position,
                    rebuild.last_position,
                    config.max_unflushed_bytes
                ),
            });
        }
    }
    if let Some(done) = current {
        *manifest = publish_replayed(ctx, config, done, sentinel).await?;
        *publishes += 1;
    }
    Ok(())
}

/// Writes and publishes one replayed generation, retrying failed SSTable
/// writes up to `flush_retry.max_attempts` times.
async fn publish_replayed(
    ctx: &FlushCtx,
    config: &ShardWriterConfig,
    done: Rebuild,
    sentinel: u64,
) -> Result<ShardManifest> {
    let data = done.memtable.freeze().flush_data();
    let mut attempt = 0;
    let written = loop {
        attempt += 1;
        match ctx.write(done.generation, &data).await {
            Ok(w) => break w,
            Err(e @ Error::Storage { .. }) if attempt < config.flush_retry.attempts() => {
                tracing::warn!(error = %e, attempt, "replayed generation flush failed; retrying");
                config.flush_retry.backoff(attempt).await;
            }
            Err(e) => return Err(e),
        }
    };
    let m = ctx
        .publish(done.generation, &written, done.last_position, sentinel)
        .await?;
    tracing::info!(
        generation = done.generation,
        last_position = done.last_position,
        sstable = %written.dir_name,
        "replayed generation published"
    );
    metrics::counter!(names::PUBLISHES).increment(1);
    Ok(m)
}
