//! Fixtures: an in-memory table behind a FaultStore, a base Lance table,
//! batches, and reading back everything published (newest generation wins).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int64Array, RecordBatch, RecordBatchIterator, StringArray};
use arrow_schema::{DataType, Field, Schema};
use lance::dataset::mem_wal::DatasetMemWalExt;
use lance::dataset::{Dataset, WriteParams};
use memwal::{
    ReplayPublish, RetryPolicy, ShardId, ShardManifest, ShardWriter, ShardWriterConfig,
    StoreLocation,
};
use memwal_fencing::{ManifestStore, ShardLayout};
use memwal_memtable::TableSchema;
use memwal_sstable::{LanceStore, SsTableReader};
use memwal_testkit::FaultStore;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStore;

/// The model of a table's visible state: key -> value.
pub type Model = BTreeMap<i64, String>;

/// The base table's Arrow schema: `id` Int64 primary key, `v` Utf8.
pub fn base_schema() -> Arc<Schema> {
    let key_md = HashMap::from([(
        "lance-schema:unenforced-primary-key".to_string(),
        "true".to_string(),
    )]);
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false).with_metadata(key_md),
        Field::new("v", DataType::Utf8, true),
    ]))
}

/// How [`TestTable::with_mem_wal`] shards the table.
pub enum MemWalSharding {
    /// No spec (manual shards).
    Manual,
    /// One shard.
    Unsharded,
    /// `bucket(column, n)`.
    Bucket(&'static str, u32),
}

/// One in-memory table (base Lance dataset at `tbl/`) and one shard, seen
/// through a FaultStore.
pub struct TestTable {
    pub mem: Arc<dyn ObjectStore>,
    pub fault: Arc<FaultStore>,
    pub root: Path,
    pub shard: ShardId,
}

impl TestTable {
    pub async fn new() -> Self {
        Self::with_schema(base_schema()).await
    }

    /// A table whose base dataset has `schema`.
    pub async fn with_schema(schema: Arc<Schema>) -> Self {
        let mem: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let root = Path::from("tbl");
        let lance = LanceStore::new(mem.clone());
        let reader = RecordBatchIterator::new(Vec::<Result<RecordBatch, _>>::new(), schema);
        Dataset::write(
            reader,
            lance.uri(&root).as_str(),
            Some(WriteParams {
                session: Some(lance.session().clone()),
                ..Default::default()
            }),
        )
        .await
        .expect("base table");
        Self {
            fault: FaultStore::new(mem.clone()),
            mem,
            root,
            shard: ShardId::random(),
        }
    }

    /// A table whose base dataset has `schema` and a `__lance_mem_wal`
    /// index installed by lance's own `initialize_mem_wal` with `sharding`
    /// and the writer defaults `defaults`.
    pub async fn with_mem_wal(
        schema: Arc<Schema>,
        sharding: MemWalSharding,
        defaults: &[(&str, &str)],
    ) -> Self {
        let t = Self::with_schema(schema).await;
        let lance = LanceStore::new(t.mem.clone());
        let mut ds = lance::dataset::builder::DatasetBuilder::from_uri(lance.uri(&t.root).as_str())
            .with_session(lance.session().clone())
            .load()
            .await
            .expect("base table");
        let mut b = ds.initialize_mem_wal();
        b = match sharding {
            MemWalSharding::Manual => b,
            MemWalSharding::Unsharded => b.unsharded(),
            MemWalSharding::Bucket(col, n) => b.bucket_sharding(col, n),
        };
        for (k, v) in defaults {
            b = b.add_writer_config_default(*k, *v);
        }
        b.execute().await.expect("initialize_mem_wal");
        t
    }

    /// The table through the fault store.
    pub fn location(&self) -> StoreLocation {
        StoreLocation {
            store: self.fault.clone(),
            root: self.root.clone(),
            uri: "fault://tbl".into(),
        }
    }

    /// The table on the underlying store (after a power cut: what survived).
    pub fn inner_location(&self) -> StoreLocation {
        StoreLocation {
            store: self.mem.clone(),
            root: self.root.clone(),
            uri: "memory://tbl".into(),
        }
    }

    pub async fn open(&self, config: ShardWriterConfig) -> memwal::Result<ShardWriter> {
        ShardWriter::open(self.location(), self.shard, config).await
    }

    /// Opens on the underlying store (no faults).
    pub async fn reopen_inner(&self, config: ShardWriterConfig) -> ShardWriter {
        ShardWriter::open(self.inner_location(), self.shard, config)
            .await
            .expect("reopen")
    }

    pub fn layout(&self) -> ShardLayout {
        ShardLayout::new(&self.root, self.shard)
    }

    /// `{root}/_mem_wal/{shard}/` as a string prefix.
    pub fn shard_prefix(&self) -> String {
        format!("{}/", self.layout().shard_dir())
    }

    pub fn manifests(&self) -> ManifestStore {
        ManifestStore::new(
            self.mem.clone(),
            &self.root,
            self.shard,
            RetryPolicy::immediate(3),
        )
    }

    pub async fn manifest(&self) -> ShardManifest {
        self.manifests()
            .load_latest()
            .await
            .unwrap()
            .expect("shard exists")
    }

    /// The visible state of everything published: SSTables applied in
    /// generation order (tombstones delete). Also checks each generation
    /// is listed once.
    pub async fn read_published(&self, schema: &TableSchema) -> Model {
        let m = self.manifest().await;
        let mut ssts = m.sstables.clone();
        ssts.sort_by_key(|s| s.generation);
        for w in ssts.windows(2) {
            assert!(
                w[0].generation < w[1].generation,
                "generation listed twice: {ssts:?}"
            );
        }
        let mut model = Model::new();
        for s in &ssts {
            let reader = SsTableReader::open_in(self.mem.clone(), &self.layout(), &s.path, schema)
                .await
                .unwrap();
            apply(&mut model, &reader.scan().await.unwrap());
        }
        model
    }
}

/// Applies storage batches (with `_tombstone`) in order to `model`.
pub fn apply(model: &mut Model, batches: &[RecordBatch]) {
    for b in batches {
        let ids = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
        let vs = b.column_by_name("v").unwrap().as_string::<i32>();
        let tomb = b.column_by_name("_tombstone").unwrap().as_boolean();
        for r in 0..b.num_rows() {
            if tomb.value(r) {
                model.remove(&ids.value(r));
            } else {
                model.insert(ids.value(r), vs.value(r).to_string());
            }
        }
    }
}

/// A user batch: `(id, v)` rows.
pub fn rows(ids: &[i64], v: &str) -> RecordBatch {
    let vs: Vec<String> = ids.iter().map(|i| format!("{v}-{i}")).collect();
    RecordBatch::try_new(
        base_schema(),
        vec![
            Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
            Arc::new(StringArray::from(vs)),
        ],
    )
    .unwrap()
}

/// The values `rows(ids, v)` writes, applied to `model`.
pub fn model_put(model: &mut Model, ids: &[i64], v: &str) {
    for i in ids {
        model.insert(*i, format!("{v}-{i}"));
    }
}

/// A key batch for deletes.
pub fn keys(ids: &[i64]) -> RecordBatch {
    RecordBatch::try_from_iter(vec![(
        "id",
        Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
    )])
    .unwrap()
}

/// Small thresholds, injected-fault friendly retries, no age trigger (no
/// timing in tests). Replayed generations are published before `open`
/// returns, so a test can read what a reopen published right after it;
/// `replay_background.rs` covers the default (publishing in the
/// background) with [`background_config`].
pub fn config() -> ShardWriterConfig {
    ShardWriterConfig {
        replay_publish: ReplayPublish::BeforeOpenReturns,
        ..background_config()
    }
}

/// [`config`] with the default replay: `open` is ready once the WAL is
/// read, replayed generations publish in the background.
pub fn background_config() -> ShardWriterConfig {
    ShardWriterConfig {
        memtable_max_bytes: 1 << 20,
        memtable_max_rows: 1000,
        max_unflushed_age: None,
        max_unflushed_bytes: 64 << 20,
        retry: RetryPolicy::immediate(2),
        flush_retry: RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(2),
            max_backoff: Duration::from_millis(20),
        },
        backpressure_timeout: Duration::from_secs(30),
        ..Default::default()
    }
}

/// The table schema the writer derives (for the SSTable reader).
pub fn table_schema(w: &ShardWriter) -> TableSchema {
    (*w.schema()).clone()
}

/// Yields until `cond` holds; fails the test (instead of hanging) when it
/// does not within a minute.
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting until {what}"
        );
        tokio::task::yield_now().await;
    }
}
