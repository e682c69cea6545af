//! Opening a writer: validate -> claim -> fence sentinel -> replay ->
//! start the WAL appender and the background tasks.

use std::sync::Arc;

use memwal_fencing::{ManifestStore, ShardId};
use memwal_memtable::TableSchema;
use memwal_sstable::{LanceStore, SsTableWriter};
use memwal_store::{open_store, StoreLocation};
use memwal_table::BaseTable;
use memwal_wal::{write_fence_sentinel, WalAppender, WalConfig};
use tracing::Instrument;

use crate::config::ShardWriterConfig;
use crate::lifecycle::Phase;
use crate::resolve::{resolve_sharding, ResolvedSharding};
use crate::state::Inner;
use crate::storage::Storage;
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

/// Opens the writer's shared state, ready for puts (see
/// [`crate::ShardWriter::open`]).
pub(crate) async fn open(
    table: TableLocation,
    shard: ShardId,
    config: ShardWriterConfig,
) -> Result<Arc<Inner>> {
    let span = tracing::info_span!("open", %shard);
    open_inner(table, shard, config).instrument(span).await
}

/// Stops a half-opened writer's tasks when `open` fails or is cancelled
/// (its rows stay in the WAL for the next writer).
struct Abandon(Option<Arc<Inner>>);

impl Drop for Abandon {
    fn drop(&mut self) {
        if let Some(inner) = self.0.take() {
            inner.fail(Error::closed("the writer was aborted while opening"));
            inner.life.abort_tasks();
        }
    }
}

async fn open_inner(
    table: TableLocation,
    shard: ShardId,
    config: ShardWriterConfig,
) -> Result<Arc<Inner>> {
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
    let storage = Storage {
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
        indexes: Arc::new(parking_lot::Mutex::new(crate::storage::MaintainedSet {
            specs: maintained.specs.into(),
            warned: Default::default(),
        })),
    };

    // 3. The writer, without a WAL appender yet (nothing can put before
    //    `open` returns), and its flusher: replayed generations are
    //    flushed and published in the background, in generation order.
    let manifest = claim.manifest;
    let (inner, jobs_rx) = Inner::new(
        shard,
        epoch,
        sentinel,
        config.clone(),
        storage,
        schema,
        router,
        manifest.clone(),
    );
    inner.spawn_monitored(
        "flusher",
        tracing::info_span!("flusher", %shard, epoch),
        crate::flusher::flusher(inner.clone(), jobs_rx),
    );
    let mut guard = Abandon(Some(inner.clone()));

    // 4. The producers table as of the last published generation, then
    //    replay (on failure or cancellation, `guard` stops the tasks).
    let published = manifest.current_generation.saturating_sub(1);
    let mut producers = crate::checkpoint::load(&inner.storage, published).await?;
    producers.expire(crate::producers::now_ms(), config.producer_expiry);
    inner.state.lock().producers = producers;
    let generation = crate::replay::replay_wal(&inner, &manifest)
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
        st.start_appending(appender);
    }
    if let Some(age) = config.max_unflushed_age {
        inner.spawn_monitored(
            "age ticker",
            tracing::info_span!("age_ticker", %shard, epoch),
            crate::write_path::age_ticker(inner.clone(), age),
        );
    }
    inner.life.advance(Phase::Open);
    guard.0 = None;
    tracing::info!(%shard, epoch, sentinel, generation, "shard writer open");
    Ok(inner)
}
