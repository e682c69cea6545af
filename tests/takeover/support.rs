//! Fixtures shared by the takeover tests: a base table created by upstream
//! lance (with its MemWAL index), the shards of that table, one script of
//! puts / overwrites / deletes / flushes that either implementation runs,
//! the acknowledged-state model, and upstream's `LsmScanner` view of base
//! table + published SSTables.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, Int64Type};
use arrow_array::{
    ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, RecordBatchIterator, StringArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use lance::dataset::mem_wal::{
    DatasetMemWalExt, LsmScanner, ShardManifestStore, ShardSnapshot, ShardWriter as UpWriter,
    ShardWriterConfig as UpConfig,
};
use lance::dataset::{Dataset, WriteParams};
use memwal::{ShardId, ShardWriter as OurWriter, ShardWriterConfig as OurConfig, ShardingConfig};
use memwal_sharding::{bucket_of, hash_i64};
use tempfile::TempDir;
use uuid::Uuid;

/// Buckets of the `bucket(id, 4)` tables.
pub const NUM_BUCKETS: i32 = 4;
/// The field metadata that declares the primary key.
pub const PRIMARY_KEY: &str = "lance-schema:unenforced-primary-key";
/// The shard field id both implementations use for the one sharding field.
pub const BUCKET_FIELD: &str = "bucket";
/// Keys per shard the scripts draw from.
const POOL: usize = 48;
/// The smallest key of every pool (negative keys on purpose).
const FIRST_KEY: i64 = -100;
/// Base-table rows of tables created `with_base`: the first keys of the
/// key space, so the scripts overwrite and delete some of them.
pub const BASE_KEYS: std::ops::Range<i64> = FIRST_KEY..FIRST_KEY + 12;

/// How the table is sharded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharding {
    /// `initialize_mem_wal().unsharded()`: one shard.
    Unsharded,
    /// `initialize_mem_wal().bucket_sharding("id", 4)`: one shard per bucket.
    Bucket,
}

/// The non-key values of one row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub payload: String,
    pub v: i32,
    pub score: f64,
}

impl Row {
    /// The row a put of key `id` tagged `tag` writes (every put has its own
    /// tag, so an overwrite always changes the values).
    pub fn of(id: i64, tag: &str) -> Self {
        Self {
            payload: format!(
                "{tag}/{id}/ünï✓/{}",
                "x".repeat((id.rem_euclid(7) * 9) as usize)
            ),
            v: (id as i32).wrapping_mul(31).wrapping_add(tag.len() as i32),
            score: id as f64 * 0.5 + tag.len() as f64,
        }
    }
}

/// Visible state: key -> row.
pub type View = BTreeMap<i64, Row>;

/// The acknowledged state: key -> row, `None` once deleted. The last
/// acknowledged write of a key wins.
#[derive(Debug, Clone, Default)]
pub struct Model {
    entries: BTreeMap<i64, Option<Row>>,
}

impl Model {
    /// Records an acknowledged put of `rows(ids, tag)`.
    pub fn put(&mut self, ids: &[i64], tag: &str) {
        for id in ids {
            self.entries.insert(*id, Some(Row::of(*id, tag)));
        }
    }

    /// Records an acknowledged delete of `ids`.
    pub fn delete(&mut self, ids: &[i64]) {
        for id in ids {
            self.entries.insert(*id, None);
        }
    }

    /// Resolves a write whose outcome memwal reported as unknown (it may or
    /// may not be durable): for each key it touched, `got` must show either
    /// the model's current state or the write's (`tag` for a put, absent
    /// for a delete), and the model adopts what `got` shows. Panics on any
    /// third value (a lost acknowledged write or a row nobody sent).
    #[track_caller]
    pub fn settle_unknown(&mut self, got: &View, ids: &[i64], tag: Option<&str>, what: &str) {
        for id in ids {
            let before = self.entries.get(id).cloned().flatten();
            let written = tag.map(|t| Row::of(*id, t));
            let seen = got.get(id).cloned();
            assert!(
                seen == before || seen == written,
                "{what}: key {id} after a write of unknown outcome shows {seen:?}; \
                 allowed: the acknowledged {before:?} or the unknown write's {written:?}"
            );
            self.entries.insert(*id, seen);
        }
    }

    /// What a reader must see.
    pub fn visible(&self) -> View {
        self.entries
            .iter()
            .filter_map(|(k, v)| v.clone().map(|v| (*k, v)))
            .collect()
    }

    /// Keys whose last acknowledged write is a delete.
    pub fn deleted(&self) -> Vec<i64> {
        self.entries
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| *k)
            .collect()
    }
}

/// The table schema: `id` Int64 primary key, `payload` Utf8, `v` Int32,
/// `score` Float64.
pub fn table_schema() -> SchemaRef {
    let key_md = HashMap::from([(PRIMARY_KEY.to_string(), "true".to_string())]);
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false).with_metadata(key_md),
        Field::new("payload", DataType::Utf8, true),
        Field::new("v", DataType::Int32, true),
        Field::new("score", DataType::Float64, true),
    ]))
}

/// A user batch (table columns, table order) putting `ids` tagged `tag`.
pub fn rows(ids: &[i64], tag: &str) -> RecordBatch {
    let r: Vec<Row> = ids.iter().map(|id| Row::of(*id, tag)).collect();
    RecordBatch::try_new(
        table_schema(),
        vec![
            Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
            Arc::new(StringArray::from_iter_values(
                r.iter().map(|r| r.payload.as_str()),
            )),
            Arc::new(Int32Array::from_iter_values(r.iter().map(|r| r.v))),
            Arc::new(Float64Array::from_iter_values(r.iter().map(|r| r.score))),
        ],
    )
    .unwrap()
}

/// A key-only batch for deletes.
pub fn keys(ids: &[i64]) -> RecordBatch {
    RecordBatch::try_from_iter(vec![(
        "id",
        Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
    )])
    .unwrap()
}

/// The bucket of key `id` by memwal's hash.
pub fn memwal_bucket(id: i64) -> i32 {
    bucket_of(hash_i64(id), NUM_BUCKETS)
}

/// One shard of a table and the keys that belong to it.
#[derive(Debug, Clone)]
pub struct Shard {
    pub uuid: Uuid,
    /// `Some(b)` for bucket `b` of a bucket table.
    pub bucket: Option<i32>,
    /// Keys routed to this shard (by memwal's router), ascending.
    pub pool: Vec<i64>,
}

impl Shard {
    pub fn id(&self) -> ShardId {
        ShardId::from(self.uuid)
    }

    /// The pool keys at `idx`.
    pub fn keys(&self, idx: &[usize]) -> Vec<i64> {
        idx.iter().map(|i| self.pool[*i]).collect()
    }

    /// The memwal config for this shard (no age trigger: no timing).
    pub fn memwal_config(&self) -> OurConfig {
        OurConfig {
            sharding: self.bucket.map(|b| {
                ShardingConfig::with_values([(BUCKET_FIELD.to_string(), b.to_le_bytes().to_vec())])
            }),
            max_unflushed_age: None,
            ..Default::default()
        }
    }
}

/// Upstream's writer config: 5 ms WAL flush ticks (a durable put waits for
/// the next tick), no periodic stats logging.
pub fn upstream_config(shard: Uuid) -> UpConfig {
    UpConfig::new(shard)
        .with_max_wal_flush_interval(Duration::from_millis(5))
        .with_stats_log_interval(None)
}

/// What the tests look at in a shard manifest (read with upstream's store).
#[derive(Debug, Clone)]
pub struct ManifestInfo {
    pub version: u64,
    pub writer_epoch: u64,
    pub shard_spec_id: u32,
    pub shard_field_values: HashMap<String, Vec<u8>>,
    pub current_generation: u64,
    pub replay_after_wal_entry_position: u64,
    /// (generation, directory) of every published SSTable.
    pub sstables: Vec<(u64, String)>,
}

/// A base table in a temp directory, created by upstream lance.
pub struct Table {
    _dir: TempDir,
    /// The table root as a plain local path (memwal's local store fsyncs).
    pub uri: String,
    pub sharding: Sharding,
}

impl Table {
    /// Creates the base table (with `BASE_KEYS` rows when `with_base`) and
    /// installs the MemWAL index; returns it and the model of the base rows.
    pub async fn create(sharding: Sharding, with_base: bool) -> (Self, Model) {
        let dir = tempfile::tempdir().unwrap();
        let uri = dir.path().join("table").to_str().unwrap().to_string();
        let base: Vec<i64> = if with_base {
            BASE_KEYS.collect()
        } else {
            Vec::new()
        };
        let batches: Vec<Result<RecordBatch, arrow_schema::ArrowError>> = if base.is_empty() {
            Vec::new()
        } else {
            vec![Ok(rows(&base, "base"))]
        };
        let mut ds = Dataset::write(
            RecordBatchIterator::new(batches, table_schema()),
            &uri,
            Some(WriteParams::default()),
        )
        .await
        .expect("writing the base table");
        let init = ds.initialize_mem_wal();
        let init = match sharding {
            Sharding::Unsharded => init.unsharded(),
            Sharding::Bucket => init.bucket_sharding("id", NUM_BUCKETS as u32),
        };
        init.execute().await.expect("initialize_mem_wal");
        let mut model = Model::default();
        model.put(&base, "base");
        (
            Self {
                _dir: dir,
                uri,
                sharding,
            },
            model,
        )
    }

    /// The table's shards: one for an unsharded table, one per bucket.
    pub fn shards(&self) -> Vec<Shard> {
        let buckets: Vec<Option<i32>> = match self.sharding {
            Sharding::Unsharded => vec![None],
            Sharding::Bucket => (0..NUM_BUCKETS).map(Some).collect(),
        };
        buckets
            .into_iter()
            .map(|bucket| Shard {
                uuid: Uuid::new_v4(),
                bucket,
                pool: (FIRST_KEY..)
                    .filter(|id| bucket.is_none_or(|b| memwal_bucket(*id) == b))
                    .take(POOL)
                    .collect(),
            })
            .collect()
    }

    /// memwal's writer of `shard` with `config`.
    pub async fn open_memwal(&self, shard: &Shard, config: OurConfig) -> memwal::Result<OurWriter> {
        OurWriter::open(self.uri.as_str(), shard.id(), config).await
    }

    /// Upstream's writer of `shard`, the way its dataset API opens one
    /// (`Dataset::mem_wal_writer`: claims, fences, replays).
    pub async fn open_upstream(&self, shard: &Shard) -> lance::Result<UpWriter> {
        let ds = Dataset::open(&self.uri).await?;
        ds.mem_wal_writer(shard.uuid, upstream_config(shard.uuid))
            .await
    }

    async fn manifest_store(&self, shard: &Shard) -> ShardManifestStore {
        let (store, base_path) = lance_io::object_store::ObjectStore::from_uri(&self.uri)
            .await
            .expect("upstream object store");
        ShardManifestStore::new(store, &base_path, shard.uuid, 2)
    }

    /// Upstream's full system: the bucket shard is created (version 1,
    /// epoch 0) with its field value before any writer claims it.
    pub async fn initialize_bucket_shard(&self, shard: &Shard) {
        let bucket = shard.bucket.expect("a bucket shard");
        let m = self
            .manifest_store(shard)
            .await
            .initialize_shard(
                1,
                HashMap::from([(BUCKET_FIELD.to_string(), bucket.to_le_bytes().to_vec())]),
            )
            .await
            .expect("initialize_shard");
        assert_eq!((m.version, m.writer_epoch), (1, 0), "{m:?}");
    }

    /// The shard's latest manifest as upstream reads it.
    pub async fn manifest(&self, shard: &Shard) -> ManifestInfo {
        let m = self
            .manifest_store(shard)
            .await
            .refresh_latest()
            .await
            .expect("reading the shard manifest")
            .unwrap_or_else(|| panic!("shard {} has no manifest", shard.uuid));
        ManifestInfo {
            version: m.version,
            writer_epoch: m.writer_epoch,
            shard_spec_id: m.shard_spec_id,
            shard_field_values: m.shard_field_values.clone(),
            current_generation: m.current_generation,
            replay_after_wal_entry_position: m.replay_after_wal_entry_position,
            sstables: m
                .sstables
                .iter()
                .map(|s| (s.generation, s.path.clone()))
                .collect(),
        }
    }

    /// Upstream's `LsmScanner` over the base table and every SSTable the
    /// shards' manifests publish (nothing in memory: writers must have
    /// published what they acknowledged). Fails on a key seen twice.
    pub async fn upstream_view(&self, shards: &[Shard]) -> View {
        let ds = Arc::new(
            Dataset::open(&self.uri)
                .await
                .expect("opening the base table"),
        );
        let mut snapshots = Vec::new();
        for shard in shards {
            let m = self.manifest(shard).await;
            let mut snap = ShardSnapshot::new(shard.uuid)
                .with_spec_id(m.shard_spec_id)
                .with_current_generation(m.current_generation);
            for (generation, path) in m.sstables {
                snap = snap.with_sstable(generation, path);
            }
            snapshots.push(snap);
        }
        let batch = LsmScanner::new(ds, snapshots, vec!["id".to_string()])
            .try_into_batch()
            .await
            .expect("upstream LsmScanner scan");
        let ids = batch
            .column_by_name("id")
            .unwrap()
            .as_primitive::<Int64Type>();
        let payload = batch.column_by_name("payload").unwrap().as_string::<i32>();
        let v = batch
            .column_by_name("v")
            .unwrap()
            .as_primitive::<Int32Type>();
        let score = batch
            .column_by_name("score")
            .unwrap()
            .as_primitive::<Float64Type>();
        let mut out = View::new();
        for i in 0..batch.num_rows() {
            let row = Row {
                payload: payload.value(i).to_string(),
                v: v.value(i),
                score: score.value(i),
            };
            if let Some(prev) = out.insert(ids.value(i), row) {
                panic!(
                    "key {} returned twice by the scan (one was {prev:?})",
                    ids.value(i)
                );
            }
        }
        out
    }
}

/// Asserts `got == model.visible()`, naming the differing keys; also that
/// the expectation is not trivially empty and that at least one key
/// written as deleted exists (so a lost delete would show).
#[track_caller]
pub fn assert_view(got: &View, model: &Model, what: &str) {
    let want = model.visible();
    assert!(
        !want.is_empty(),
        "{what}: the model is empty; the test proves nothing"
    );
    assert!(
        !model.deleted().is_empty(),
        "{what}: the model has no deletes; the test proves nothing about them"
    );
    let missing: Vec<i64> = want
        .keys()
        .filter(|k| !got.contains_key(k))
        .copied()
        .collect();
    let extra: Vec<i64> = got
        .keys()
        .filter(|k| !want.contains_key(k))
        .copied()
        .collect();
    let wrong: Vec<(i64, &Row, &Row)> = want
        .iter()
        .filter_map(|(k, w)| got.get(k).filter(|g| *g != w).map(|g| (*k, w, g)))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty() && wrong.is_empty(),
        "{what}: view differs from the acknowledged state\n  missing keys (acknowledged, not visible): {missing:?}\n  \
         unexpected keys (deleted or never acknowledged): {extra:?}\n  wrong values (key, want, got), first 5: {:?}\n  \
         ({} keys wanted, {} seen)",
        &wrong[..wrong.len().min(5)],
        want.len(),
        got.len()
    );
}

/// A writer of either implementation.
#[derive(Clone, Copy)]
pub enum Writer<'a> {
    Upstream(&'a UpWriter),
    Memwal(&'a OurWriter),
}

/// One step of a script; keys are indices into the shard's pool.
#[derive(Debug, Clone)]
pub enum Step {
    Put(Vec<usize>),
    Delete(Vec<usize>),
    /// Freeze the active memtable and wait until it is published.
    Flush,
}

/// Three generations: two flushed (published as SSTables), the third
/// left only in the WAL. Overwrites within and across generations,
/// deletes of keys put earlier (and of base keys), a re-put after a delete.
pub fn three_generations() -> Vec<Step> {
    use Step::*;
    vec![
        Put((0..8).collect()),
        Put((2..5).collect()),
        Delete(vec![3, 7]),
        Put(vec![5]),
        Flush,
        Put((8..14).collect()),
        Put(vec![0, 1]),
        Delete(vec![8]),
        Put(vec![3]),
        Flush,
        Put(vec![9, 10]),
        Delete(vec![0, 12]),
        Put((20..24).collect()),
        Put(vec![2]),
        Delete(vec![21, 4]),
    ]
}

/// What the new owner writes after a takeover (overwrites and deletes of
/// the predecessor's keys, new keys), left unflushed.
pub fn after_takeover() -> Vec<Step> {
    use Step::*;
    vec![
        Put((30..34).collect()),
        Delete(vec![1, 9]),
        Put(vec![7, 8, 20]),
        Delete(vec![31]),
    ]
}

/// Runs `steps` on `w` for `shard`, recording every acknowledged write in
/// `model`; any error fails the test. Tags are `{label}-{step}`.
pub async fn run(w: Writer<'_>, shard: &Shard, steps: &[Step], label: &str, model: &mut Model) {
    for (i, step) in steps.iter().enumerate() {
        let tag = format!("{label}-{i}");
        let ctx = format!("{label}: step {i} {step:?} on shard {:?}", shard.bucket);
        match step {
            Step::Put(idx) => {
                let ids = shard.keys(idx);
                let batch = rows(&ids, &tag);
                match w {
                    Writer::Upstream(u) => {
                        u.put(vec![batch])
                            .await
                            .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    }
                    Writer::Memwal(m) => {
                        m.put(&batch).await.unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    }
                }
                model.put(&ids, &tag);
            }
            Step::Delete(idx) => {
                let ids = shard.keys(idx);
                let batch = keys(&ids);
                match w {
                    Writer::Upstream(u) => {
                        u.delete(vec![batch])
                            .await
                            .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    }
                    Writer::Memwal(m) => {
                        m.delete(&batch)
                            .await
                            .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    }
                }
                model.delete(&ids);
            }
            Step::Flush => match w {
                Writer::Upstream(u) => {
                    u.force_freeze_active()
                        .await
                        .unwrap_or_else(|e| panic!("{ctx}: freeze: {e}"))
                        .wait()
                        .await
                        .unwrap_or_else(|e| panic!("{ctx}: flush: {e}"));
                }
                Writer::Memwal(m) => m.flush().await.unwrap_or_else(|e| panic!("{ctx}: {e}")),
            },
        }
    }
}

/// Number of `Flush` steps in a script.
pub fn flushes(steps: &[Step]) -> usize {
    steps.iter().filter(|s| matches!(s, Step::Flush)).count()
}

/// Asserts that `e` is upstream's typed fence for a peer's claim.
#[track_caller]
pub fn assert_upstream_fenced(e: &lance::Error, what: &str) {
    assert_eq!(
        e.fence_reason(),
        Some(lance_core::FenceReason::PeerClaimedEpoch),
        "{what}: expected upstream's peer fence, got: {e}"
    );
    assert!(
        e.to_string().to_lowercase().contains("fenced"),
        "{what}: the fence error does not say so: {e}"
    );
}

/// Asserts that `r` is memwal's `Error::Fenced`.
#[track_caller]
pub fn assert_memwal_fenced<T: std::fmt::Debug>(r: memwal::Result<T>, what: &str) {
    match r {
        Err(e @ memwal::Error::Fenced { .. }) => assert!(e.is_fenced(), "{what}: {e}"),
        other => panic!("{what}: expected memwal::Error::Fenced, got {other:?}"),
    }
}
