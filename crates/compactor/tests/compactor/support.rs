//! Fixtures: a local base table made by `create_table`, memwal writers of
//! its shards, a model, and readers of the base and of the reader view.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use futures::TryStreamExt;
use lance::dataset::mem_wal::LsmScanner;
use lance::Dataset;
use memwal::{ShardId, ShardWriter, ShardWriterConfig, ShardingConfig, StoreLocation};
use memwal_compactor::{Compactor, CompactorConfig};
use memwal_sharding::{bucket_of, hash_i64};
use memwal_store::RetryPolicy;
use memwal_table::{create_table, table_view, TableSharding};
use memwal_testkit::FaultStore;
use tempfile::TempDir;

/// Buckets of a bucket-sharded fixture.
pub const BUCKETS: u32 = 4;

/// key -> value; a key absent is deleted or never written.
pub type Model = BTreeMap<i64, String>;

/// `id` Int64 (primary key when `keyed`), `v` Utf8.
pub fn schema(keyed: bool) -> SchemaRef {
    let mut id = Field::new("id", DataType::Int64, false);
    if keyed {
        id = id.with_metadata(HashMap::from([(
            "lance-schema:unenforced-primary-key".to_string(),
            "true".to_string(),
        )]));
    }
    Arc::new(Schema::new(vec![id, Field::new("v", DataType::Utf8, true)]))
}

pub fn rows(ids: &[i64], tag: &str) -> RecordBatch {
    RecordBatch::try_new(
        schema(false),
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
    let s = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    RecordBatch::try_new(
        s,
        vec![Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef],
    )
    .unwrap()
}

pub fn bucket(id: i64) -> i32 {
    bucket_of(hash_i64(id), BUCKETS as i32)
}

/// A local table (tempdir) seen through a FaultStore.
pub struct Fixture {
    _dir: TempDir,
    pub path: String,
    pub fault: Arc<FaultStore>,
    pub plain: StoreLocation,
    pub keyed: bool,
    pub sharding: TableSharding,
}

impl Fixture {
    pub async fn new(keyed: bool, sharding: TableSharding) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("table").to_str().unwrap().to_string();
        let plain = memwal_store::open_store(&path).unwrap();
        let fault = FaultStore::new(plain.store.clone());
        let f = Self {
            _dir: dir,
            path,
            fault,
            plain,
            keyed,
            sharding,
        };
        create_table(&f.plain, schema(keyed), &f.sharding)
            .await
            .expect("create_table");
        f
    }

    /// The table through the fault store.
    pub fn loc(&self) -> StoreLocation {
        StoreLocation {
            store: self.fault.clone(),
            root: self.plain.root.clone(),
            uri: self.path.clone(),
        }
    }

    /// A compactor with the default config (generations grouped).
    pub fn compactor(&self) -> Compactor {
        Compactor::new(self.loc(), CompactorConfig::default())
    }

    /// A compactor merging at most `max_group` generations per commit.
    pub fn compactor_grouping(&self, max_group: usize) -> Compactor {
        Compactor::new(
            self.loc(),
            CompactorConfig {
                max_group,
                ..CompactorConfig::default()
            },
        )
    }

    /// A writer of a new shard (bucket `b` on a bucket table).
    pub async fn writer(&self, b: Option<i32>) -> ShardWriter {
        self.open(ShardId::random(), b).await
    }

    pub async fn open(&self, shard: ShardId, b: Option<i32>) -> ShardWriter {
        let mut config = ShardWriterConfig {
            max_unflushed_age: None,
            ..ShardWriterConfig::default()
        };
        if let Some(b) = b {
            config.sharding = Some(ShardingConfig::with_values([(
                "bucket".to_string(),
                b.to_le_bytes().to_vec(),
            )]));
        }
        ShardWriter::open(self.loc(), shard, config)
            .await
            .expect("open writer")
    }

    /// The base table's rows (latest version): key -> value, and every key
    /// in scan order (to find duplicates).
    pub async fn base_rows(&self) -> (Model, Vec<i64>) {
        let ds = Dataset::open(&self.path).await.expect("open base");
        let batches: Vec<RecordBatch> = ds
            .scan()
            .try_into_stream()
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        collect(&batches)
    }

    /// The reader view through upstream's LsmScanner.
    pub async fn view_rows(&self) -> (Model, Vec<i64>) {
        let view = table_view(&self.plain, None, &RetryPolicy::default())
            .await
            .expect("table_view");
        self.read_view(&view).await
    }

    /// Reads `view` (possibly taken earlier) through upstream's LsmScanner
    /// at the base version it names.
    pub async fn read_view(&self, view: &memwal_table::TableView) -> (Model, Vec<i64>) {
        let snapshots = view.snapshots();
        // Upstream reads through its own store: the base opened by path,
        // at the view's version.
        let base = Dataset::open(&self.path).await.unwrap();
        let base = Arc::new(
            base.checkout_version(view.base.version().version)
                .await
                .unwrap(),
        );
        let on = if self.keyed {
            vec!["id".to_string()]
        } else {
            vec![]
        };
        let batch = LsmScanner::new(base, snapshots, on)
            .try_into_batch()
            .await
            .expect("LsmScanner");
        collect(&[batch])
    }
}

fn collect(batches: &[RecordBatch]) -> (Model, Vec<i64>) {
    let mut model = Model::new();
    let mut order = Vec::new();
    for b in batches {
        let ids = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
        let vs = b.column_by_name("v").unwrap().as_string::<i32>();
        for i in 0..b.num_rows() {
            model.insert(ids.value(i), vs.value(i).to_string());
            order.push(ids.value(i));
        }
    }
    (model, order)
}

/// Asserts `got` is `want` with every key once.
#[track_caller]
pub fn assert_model(got: &(Model, Vec<i64>), want: &Model, what: &str) {
    assert!(!want.is_empty(), "{what}: empty model proves nothing");
    let mut seen = std::collections::BTreeSet::new();
    let dups: Vec<i64> = got
        .1
        .iter()
        .filter(|k| !seen.insert(**k))
        .copied()
        .collect();
    assert!(dups.is_empty(), "{what}: keys seen twice: {dups:?}");
    let missing: Vec<_> = want.keys().filter(|k| !got.0.contains_key(k)).collect();
    let extra: Vec<_> = got.0.keys().filter(|k| !want.contains_key(k)).collect();
    let wrong: Vec<_> = want
        .iter()
        .filter(|(k, v)| got.0.get(k).is_some_and(|g| g != *v))
        .take(5)
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty() && wrong.is_empty(),
        "{what}: missing {missing:?}, unexpected {extra:?}, wrong values (first 5) {wrong:?}"
    );
}

/// One scripted step on one writer, applied to the model too.
pub async fn put(w: &ShardWriter, model: &mut Model, ids: &[i64], tag: &str) {
    w.put(&rows(ids, tag)).await.expect("put");
    for i in ids {
        model.insert(*i, format!("{tag}-{i}"));
    }
}

pub async fn delete(w: &ShardWriter, model: &mut Model, ids: &[i64]) {
    w.delete(&keys(ids)).await.expect("delete");
    for i in ids {
        model.remove(i);
    }
}

/// Three flushed generations of puts, overwrites and deletes over `ids`
/// (at least 10 keys), then one more put left only in the WAL and memtable
/// when `leave_unflushed`.
pub async fn three_generations(w: &ShardWriter, model: &mut Model, ids: &[i64], tag: &str) {
    assert!(ids.len() >= 10);
    put(w, model, &ids[..8], &format!("{tag}g1")).await;
    w.flush().await.unwrap();
    put(w, model, &ids[4..10], &format!("{tag}g2")).await;
    delete(w, model, &ids[..2]).await;
    w.flush().await.unwrap();
    delete(w, model, &ids[6..7]).await;
    put(w, model, &ids[..1], &format!("{tag}g3")).await;
    w.flush().await.unwrap();
}
