//! Opening a writer: validate -> claim -> fence sentinel -> replay ->
//! start the WAL appender and the background tasks.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use memwal_fencing::{ManifestStore, ShardId, ShardManifest};
use memwal_memtable::{MemTable, TableSchema};
use memwal_sstable::{LanceStore, SsTableWriter};
use memwal_store::{open_store, StoreLocation};
use memwal_table::BaseTable;
use memwal_wal::{
    replay, write_fence_sentinel, ReplayRange, WalAppender, WalConfig, WalLocation,
    DEFAULT_REPLAY_PREFETCH,
};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch, Semaphore};
use tracing::Instrument;

use crate::config::{ReplayPublish, ShardWriterConfig};
use crate::flush::FlushCtx;
use crate::resolve::{resolve_sharding, ResolvedSharding};
use crate::writer::{Frozen, Inner, ShardWriter, State};
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
    let base = BaseTable::load(&lance, &loc.root)
        .await
        .map_err(Error::from_table)?;
    let config = config.apply_table_defaults(base.writer_config_defaults())?;
    // A listed maintained index memwal cannot mirror is refused here.
    let maintained = base.maintained_indexes().map_err(Error::from_table)?;
    let storage_version = base.storage_version;
    let schema = Arc::new(
        TableSchema::new(base.schema.clone())
            .map_err(|e| Error::invalid(format!("base table schema: {e}")))?,
    );
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
    if existing.is_none() && !config.create_if_missing {
        return Err(Error::invalid(format!(
            "shard {shard} does not exist and create_if_missing is false"
        )));
    }
    let ResolvedSharding { identity, router } =
        resolve_sharding(&config, &base, &schema, shard, existing.as_ref())?;

    // 2. Claim and fence.
    let claim = manifests
        .claim(Some(&identity))
        .await
        .map_err(|e| Error::from_fencing(e, "claiming the shard"))?;
    let epoch = claim.epoch;
    let meters = Arc::new(crate::stats::Meters::new(&shard));
    meters.epoch.set(epoch as f64);
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
        )
        .with_compression(config.sstable_compression),
        base: Arc::new(lance),
        base_root: loc.root.clone(),
        meters,
        indexes: Arc::new(parking_lot::Mutex::new(crate::flush::MaintainedSet {
            specs: maintained.specs.into(),
            warned: Default::default(),
        })),
    };

    // 3. The writer, without a WAL appender yet (nothing can put before
    //    `open` returns), and its flusher: replayed generations are
    //    flushed and published in the background, in generation order.
    let manifest = claim.manifest;
    let (jobs_tx, jobs_rx) = mpsc::unbounded_channel();
    let inner = Arc::new(Inner {
        shard,
        epoch,
        sentinel,
        flush_permits: Arc::new(Semaphore::new(config.flush_concurrency)),
        config: config.clone(),
        ctx,
        state: Mutex::new(State {
            appender: None,
            active: MemTable::new(schema.clone()),
            routing: router.map(Arc::new),
            generation: manifest.current_generation.max(1),
            active_since: None,
            frozen: VecDeque::new(),
            published_generation: manifest.current_generation.saturating_sub(1),
            terminal: None,
            last_flush_error: None,
            jobs: Some(jobs_tx),
        }),
        manifest: Mutex::new(manifest.clone()),
        progress: watch::channel(0).0,
        shutdown: watch::channel(false).0,
        closing: AtomicBool::new(false),
        opening: AtomicBool::new(true),
        close_result: tokio::sync::Mutex::new(None),
        tasks: Mutex::new(Vec::new()),
        puts: AtomicU64::new(0),
        rows: AtomicU64::new(0),
        publishes: AtomicU64::new(0),
        backpressure_waits: AtomicU64::new(0),
    });
    inner.tasks.lock().push(tokio::spawn(
        crate::flush::monitored_flusher(inner.clone(), jobs_rx)
            .instrument(tracing::info_span!("flusher", %shard, epoch)),
    ));
    let writer = ShardWriter { inner };
    let inner = &writer.inner;

    // 4. Replay (on failure, dropping `writer` stops its tasks).
    let generation = replay_wal(inner, &manifest)
        .instrument(tracing::info_span!("replay", epoch, sentinel))
        .await?;

    // 5. Start writing, right after the sentinel, in the generation after
    //    every replayed one.
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
    {
        let mut st = inner.state.lock();
        st.check_usable()?;
        st.generation = generation;
        st.appender = Some(appender);
    }
    if let Some(age) = config.max_unflushed_age {
        inner.tasks.lock().push(tokio::spawn(
            crate::freeze::age_ticker(inner.clone(), age)
                .instrument(tracing::info_span!("age_ticker", %shard, epoch)),
        ));
    }
    inner.opening.store(false, Ordering::SeqCst);
    tracing::info!(%shard, epoch, sentinel, generation, "shard writer open");
    Ok(writer)
}

/// Replays the WAL between the replay cursor and our sentinel. Each
/// recorded generation is rebuilt whole as one memtable (never
/// renumbered) and, once complete (the next generation starts, or the WAL
/// ends), frozen and queued to the flusher, which publishes it in
/// generation order in the background; replay waits while the queued
/// generations hold more than `max_unflushed_bytes` (with
/// [`ReplayPublish::BeforeOpenReturns`]: until each is published). Entries without a
/// `generation` (upstream WAL-only entries) belong to the generation being
/// rebuilt (the manifest's `current_generation` if none is). A generation
/// whose memtable exceeds `max_unflushed_bytes` fails with
/// [`Error::Backpressure`] naming it. Returns the first generation after
/// every replayed one.
async fn replay_wal(inner: &Arc<Inner>, manifest: &ShardManifest) -> Result<u64> {
    let ctx = &inner.ctx;
    let config = &inner.config;
    let range = ReplayRange::new(manifest, ctx.epoch, inner.sentinel);
    let mut entries = replay(
        WalLocation::of(&ctx.manifests),
        range,
        DEFAULT_REPLAY_PREFETCH,
    );
    if memwal_store::broken("broken::replay_reversed") {
        let mut all: Vec<_> = entries.collect().await;
        all.reverse();
        entries = Box::pin(futures::stream::iter(all));
    }
    // Entries are matched to the schema the writer opened with by field id
    // (an entry written before a column was added or dropped replays:
    // missing columns null, dropped ones ignored).
    let schema = inner.state.lock().active.schema().clone();
    let mut next_generation = manifest.current_generation.max(1);
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
            next_generation = next_generation.max(queue_replayed(inner, done).await?);
        }
        let rebuild = current.get_or_insert_with(|| Rebuild {
            generation,
            memtable: MemTable::new(schema.clone()),
            first_position: entry.position,
            last_position: entry.position,
        });
        for batch in entry.batches.iter().filter(|b| b.num_rows() > 0) {
            let storage = schema
                .to_storage_for_replay(batch)
                .map_err(|e| Error::Corrupt {
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
        // The live path keeps every generation's payload within
        // `memtable_max_bytes` (<= `max_unflushed_bytes`), so what this
        // writer's config acknowledged always replays under it.
        let bytes = rebuild.memtable.memory_usage().payload_bytes;
        if bytes > config.max_unflushed_bytes {
            return Err(Error::Backpressure {
                reason: format!(
                    "replay: recorded generation {} (WAL positions {}..={}) holds {bytes} bytes \
                     of rows, more than max_unflushed_bytes {}; a generation is rebuilt whole, \
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
        next_generation = next_generation.max(queue_replayed(inner, done).await?);
    }
    Ok(next_generation)
}

/// Freezes a rebuilt generation and queues it to the flusher (its SSTable
/// write starts at once), then waits until the generations still queued
/// hold at most `max_unflushed_bytes` (or, with
/// [`ReplayPublish::BeforeOpenReturns`], until it is published). Returns
/// the generation after it.
async fn queue_replayed(inner: &Arc<Inner>, done: Rebuild) -> Result<u64> {
    let generation = done.generation;
    let next = generation.checked_add(1).ok_or_else(|| Error::Corrupt {
        reason: format!("replayed generation {generation} cannot be followed"),
    })?;
    let mut progress = inner.progress.subscribe();
    {
        let mut st = inner.state.lock();
        st.check_usable()?;
        let memtable = done.memtable.freeze();
        let bytes = memtable.memory_usage().total();
        let handle = tokio::spawn(
            crate::flush::replayed_job(
                inner.clone(),
                generation,
                memtable.clone(),
                done.last_position,
            )
            .instrument(tracing::info_span!(
                "replayed_flush_job",
                shard = %inner.shard,
                epoch = inner.epoch,
                generation
            )),
        );
        st.frozen.push_back(Frozen {
            generation,
            memtable,
            bytes,
            frozen_at: Instant::now(),
            job: handle.abort_handle(),
        });
        let job = crate::flush::Job {
            generation,
            handle,
            live: false,
        };
        if st.jobs.as_ref().is_none_or(|tx| tx.send(job).is_err()) {
            let err = Error::closed("the flusher is not running");
            inner.fail_locked(&mut st, err.clone());
            return Err(err);
        }
        inner.record_unflushed(&st);
        tracing::debug!(
            generation,
            bytes,
            last_position = done.last_position,
            "replayed generation queued"
        );
    }
    let before_ready = inner.config.replay_publish == ReplayPublish::BeforeOpenReturns;
    loop {
        {
            let st = inner.state.lock();
            st.check_usable()?;
            progress.borrow_and_update();
            let done = if before_ready {
                st.published_generation >= generation
            } else {
                st.unflushed_bytes() <= inner.config.max_unflushed_bytes
            };
            if done {
                return Ok(next);
            }
        }
        if progress.changed().await.is_err() {
            return Err(Error::closed("the writer is gone"));
        }
    }
}
