//! The two writers under test, each at two durabilities, and the table
//! they share.
//!
//! - memwal fsync: `ShardWriter::open` on a local path (memwal's default
//!   store: every object write fsyncs the file and its directory entry).
//! - memwal fsync buffered: the same writer handed object_store's
//!   `LocalFileSystem::with_fsync(true)`, the default local store before
//!   large writes bypassed the page cache (same durability, every write
//!   through the page cache).
//! - memwal nofsync: the same writer handed an object_store
//!   `LocalFileSystem` without fsync.
//! - upstream fsync: lance's `Dataset::mem_wal_writer`, the dataset opened
//!   through a session whose registry maps a private scheme to
//!   `LocalFileSystem::with_fsync(true)` (memwal's `LanceStore`): its WAL
//!   entries, shard manifests and SSTables are all written through it.
//! - upstream nofsync: the same on a plain local path (lance's own local
//!   store, which does not fsync): what its users run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{RecordBatch, RecordBatchIterator};
use lance::dataset::builder::DatasetBuilder;
use lance::dataset::mem_wal::{
    DatasetMemWalExt, ShardWriter as UpWriter, ShardWriterConfig as UpConfig,
};
use lance::dataset::{Dataset, WriteParams};
use memwal::{
    ReplayPublish, ShardId, ShardWriter as OurWriter, ShardWriterConfig as OurConfig,
    SsTableCompression, StoreLocation,
};
use memwal_sstable::LanceStore;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjPath;
use uuid::Uuid;

use crate::rows::{table_schema, ROW_BYTES};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Durability {
    Fsync,
    NoFsync,
}

impl Durability {
    pub fn name(self) -> &'static str {
        match self {
            Durability::Fsync => "fsync",
            Durability::NoFsync => "nofsync",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Variant {
    Ours(Durability),
    /// memwal with `ReplayPublish::BeforeOpenReturns` (replay case only).
    OursBeforeReady(Durability),
    /// memwal with `SsTableCompression::Lance` (lone and multi cases only):
    /// SSTables encoded as upstream encodes them, memwal's default before
    /// this bench.
    OursSsTableLance(Durability),
    /// memwal on `LocalFileSystem::with_fsync(true)` (lone, multi and large
    /// cases): the same durability as its default local store, without its
    /// `O_DIRECT` writes.
    OursBuffered(Durability),
    /// Upstream with its WAL flush tick in milliseconds.
    Up(Durability, u64),
}

impl Variant {
    pub fn name(self) -> String {
        match self {
            Variant::Ours(d) => format!("memwal {}", d.name()),
            Variant::OursBeforeReady(d) => format!("memwal {} publish-before-ready", d.name()),
            Variant::OursSsTableLance(d) => format!("memwal {} sstable-lance", d.name()),
            Variant::OursBuffered(d) => format!("memwal {} buffered", d.name()),
            Variant::Up(d, tick) => format!("upstream {} {tick}ms", d.name()),
        }
    }

    pub fn durability(self) -> Durability {
        match self {
            Variant::Ours(d)
            | Variant::OursBeforeReady(d)
            | Variant::OursSsTableLance(d)
            | Variant::OursBuffered(d)
            | Variant::Up(d, _) => d,
        }
    }

    pub fn is_ours(self) -> bool {
        !matches!(self, Variant::Up(..))
    }
}

/// Memtable limits, the same for both writers.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A generation is frozen and flushed at this many rows.
    pub memtable_rows: usize,
    /// ... or at this many bytes.
    pub memtable_bytes: usize,
    /// Puts wait while this much is unflushed.
    pub unflushed_bytes: usize,
}

impl Limits {
    /// 64 Ki rows (64 MiB of 1 KiB rows) per generation, 1 GiB unflushed
    /// at most (upstream's default): both writers flush at the same rows.
    pub fn equal() -> Self {
        Self {
            memtable_rows: 64 << 10,
            memtable_bytes: 256 << 20,
            unflushed_bytes: 1 << 30,
        }
    }

    /// Room for `bytes` of rows in one generation (nothing flushes).
    pub fn absorb(bytes: u64) -> Self {
        let rows = (2 * bytes / ROW_BYTES as u64) as usize + 1024;
        Self {
            memtable_rows: rows,
            memtable_bytes: 4 << 30,
            unflushed_bytes: 8 << 30,
        }
    }

    fn ours(self) -> OurConfig {
        OurConfig {
            memtable_max_rows: self.memtable_rows,
            memtable_max_bytes: self.memtable_bytes,
            max_unflushed_bytes: self.unflushed_bytes,
            max_unflushed_age: None,
            ..Default::default()
        }
    }

    fn upstream(self, shard: Uuid, tick_ms: u64) -> UpConfig {
        UpConfig::new(shard)
            .with_max_wal_flush_interval(Duration::from_millis(tick_ms))
            .with_max_memtable_rows(self.memtable_rows)
            .with_max_memtable_size(self.memtable_bytes)
            .with_max_unflushed_memtable_bytes(self.unflushed_bytes)
            .with_stats_log_interval(None)
    }
}

/// A table directory and the shard both writers use.
pub struct Target {
    pub dir: PathBuf,
    pub shard: Uuid,
}

/// An empty base table with the primary key and an unsharded MemWAL
/// index at `dir` (replaced if present).
pub async fn create_table(dir: &Path) -> Result<Target, String> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let reader = RecordBatchIterator::new(Vec::<Result<RecordBatch, _>>::new(), table_schema());
    let mut ds = Dataset::write(reader, &path_str(dir)?, Some(WriteParams::default()))
        .await
        .map_err(|e| format!("base table: {e}"))?;
    ds.initialize_mem_wal()
        .unsharded()
        .execute()
        .await
        .map_err(|e| format!("initialize_mem_wal: {e}"))?;
    Ok(Target {
        dir: dir.to_path_buf(),
        shard: Uuid::new_v4(),
    })
}

fn path_str(dir: &Path) -> Result<String, String> {
    dir.to_str()
        .map(str::to_string)
        .ok_or_else(|| format!("{} is not UTF-8", dir.display()))
}

#[derive(Clone)]
pub enum Writer {
    Ours(Arc<OurWriter>),
    Up(Arc<UpWriter>),
}

impl Writer {
    pub async fn open(variant: Variant, t: &Target, limits: Limits) -> Result<Self, String> {
        match variant {
            Variant::Ours(d)
            | Variant::OursBeforeReady(d)
            | Variant::OursSsTableLance(d)
            | Variant::OursBuffered(d) => {
                let shard = ShardId::from(t.shard);
                let mut config = limits.ours();
                if matches!(variant, Variant::OursBeforeReady(_)) {
                    config.replay_publish = ReplayPublish::BeforeOpenReturns;
                }
                if matches!(variant, Variant::OursSsTableLance(_)) {
                    config.sstable_compression = SsTableCompression::Lance;
                }
                let buffered = matches!(variant, Variant::OursBuffered(_));
                let w = match d {
                    Durability::Fsync if !buffered => {
                        OurWriter::open(path_str(&t.dir)?.as_str(), shard, config).await
                    }
                    _ => {
                        let fs = LocalFileSystem::new_with_prefix(&t.dir)
                            .map_err(|e| e.to_string())?
                            .with_fsync(d == Durability::Fsync);
                        let loc = StoreLocation {
                            store: Arc::new(fs),
                            root: ObjPath::default(),
                            uri: format!("file://{}", t.dir.display()),
                        };
                        OurWriter::open(loc, shard, config).await
                    }
                };
                w.map(|w| Writer::Ours(Arc::new(w)))
                    .map_err(|e| e.to_string())
            }
            Variant::Up(d, tick) => {
                let ds = match d {
                    Durability::NoFsync => Dataset::open(&path_str(&t.dir)?)
                        .await
                        .map_err(|e| e.to_string())?,
                    Durability::Fsync => {
                        let fs = LocalFileSystem::new_with_prefix(&t.dir)
                            .map_err(|e| e.to_string())?
                            .with_fsync(true);
                        let lance = LanceStore::new(Arc::new(fs));
                        DatasetBuilder::from_uri(lance.uri(&ObjPath::default()))
                            .with_session(lance.session().clone())
                            .load()
                            .await
                            .map_err(|e| e.to_string())?
                    }
                };
                ds.mem_wal_writer(t.shard, limits.upstream(t.shard, tick))
                    .await
                    .map(|w| Writer::Up(Arc::new(w)))
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// Returns once the rows are durable (as the writer defines it).
    pub async fn put(&self, batch: RecordBatch) -> Result<(), String> {
        match self {
            Writer::Ours(w) => w.put(&batch).await.map(|_| ()).map_err(|e| e.to_string()),
            Writer::Up(w) => w
                .put(vec![batch])
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
        }
    }

    /// Flushes what is left and stops.
    pub async fn close(self) -> Result<(), String> {
        match self {
            Writer::Ours(w) => w.close().await.map_err(|e| e.to_string()),
            Writer::Up(w) => match Arc::try_unwrap(w) {
                Ok(w) => w.close().await.map_err(|e| e.to_string()),
                Err(_) => Err("upstream writer still shared at close".into()),
            },
        }
    }

    /// Stops without flushing (acknowledged rows stay in the WAL only).
    pub async fn abort(self) -> Result<(), String> {
        match self {
            Writer::Ours(w) => {
                w.abort();
                Ok(())
            }
            Writer::Up(w) => w.abort().await.map_err(|e| e.to_string()),
        }
    }

    /// Rows the writer holds after opening on a WAL: memwal's replayed
    /// generations are published (SSTable rows) or queued to publish in the
    /// background (frozen rows); upstream keeps the replayed rows in its
    /// active memtable.
    pub async fn replayed_rows(&self) -> Result<u64, String> {
        match self {
            Writer::Ours(w) => {
                let published: u64 = w
                    .manifest()
                    .sstables
                    .iter()
                    .map(|s| s.physical_rows.unwrap_or(0))
                    .sum();
                let queued: usize = w.stats().unpublished.iter().map(|(_, rows)| rows).sum();
                Ok(published + queued as u64)
            }
            Writer::Up(w) => w
                .memtable_stats()
                .await
                .map(|s| s.row_count as u64)
                .map_err(|e| e.to_string()),
        }
    }

    /// Puts that waited for room (memwal only; upstream does not say).
    pub fn backpressure_waits(&self) -> Option<u64> {
        match self {
            Writer::Ours(w) => Some(w.stats().backpressure_waits),
            Writer::Up(_) => None,
        }
    }
}
