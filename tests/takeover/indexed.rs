//! Indexed tables: memwal's SSTables carry the base table's maintained
//! indexes, so upstream's LSM planners (`LsmScanner::nearest` and
//! `full_text_search`, which run `LsmVectorSearchPlanner` and
//! `LsmFtsSearchPlanner`) find fresh rows as they find rows pylance's own
//! writer flushed. Upstream searches a flushed generation only through its
//! own vector index (`fast_search`): without it, fresh rows are invisible.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int64Type};
use arrow_array::{
    Array, ArrayRef, FixedSizeListArray, Float32Array, Int64Array, RecordBatch,
    RecordBatchIterator, StringArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use lance::dataset::mem_wal::{DatasetMemWalExt, LsmScanner, ShardManifestStore, ShardSnapshot};
use lance::dataset::{Dataset, WriteParams};
use lance::index::vector::VectorIndexParams;
use lance::index::DatasetIndexExt;
use lance_index::scalar::{FullTextSearchQuery, InvertedIndexParams, ScalarIndexParams};
use lance_index::IndexType;
use memwal::{ShardId, ShardWriter, ShardWriterConfig};
use tempfile::TempDir;
use uuid::Uuid;

use crate::support::PRIMARY_KEY;

mod both_ways;

pub const DIM: i32 = 16;
/// Rows of the base table (enough to train its IVF_PQ index).
pub const BASE_ROWS: i64 = 300;
/// The first key of fresh rows, far above the base's keys.
pub const FRESH: i64 = 100_000;

/// `id` Int64 key, `vec` FixedSizeList<Float32, 16>, `txt` Utf8, `n` Int64.
pub fn schema() -> SchemaRef {
    let key_md = HashMap::from([(PRIMARY_KEY.to_string(), "true".to_string())]);
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false).with_metadata(key_md),
        Field::new(
            "vec",
            DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), DIM),
            true,
        ),
        Field::new("txt", DataType::Utf8, true),
        Field::new("n", DataType::Int64, true),
    ]))
}

/// Row `id`'s vector as written by the put tagged `tag`: base rows in
/// [0, 1), fresh rows in [50, 60) (far from every base row), each tag a
/// different vector.
pub fn vector(id: i64, tag: &str) -> Vec<f32> {
    let seed = tag
        .bytes()
        .fold(id as u64, |h, b| h.wrapping_mul(131).wrapping_add(b as u64));
    let offset = if id >= FRESH { 50.0 } else { 0.0 };
    let scale = if id >= FRESH { 10.0 } else { 1.0 };
    (0..DIM as u64)
        .map(|j| {
            let x = (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ j.wrapping_mul(0xBF58_476D_1CE4_E5B9))
            .wrapping_mul(0x94D0_49BB_1331_11EB);
            offset + scale * ((x >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

/// Row `id`'s text as written by the put tagged `tag`: one word unique to
/// the row and the tag, and one shared by every row.
pub fn text(id: i64, tag: &str) -> String {
    format!("{tag}x{id} common")
}

pub fn batch(ids: &[i64], tag: &str) -> RecordBatch {
    let values: Vec<f32> = ids.iter().flat_map(|id| vector(*id, tag)).collect();
    let vecs = FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Float32, true)),
        DIM,
        Arc::new(Float32Array::from(values)),
        None,
    )
    .unwrap();
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
            Arc::new(vecs),
            Arc::new(StringArray::from_iter_values(
                ids.iter().map(|id| text(*id, tag)),
            )),
            Arc::new(Int64Array::from(ids.to_vec())),
        ],
    )
    .unwrap()
}

pub fn key_batch(ids: &[i64]) -> RecordBatch {
    RecordBatch::try_from_iter(vec![(
        "id",
        Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
    )])
    .unwrap()
}

/// Which indexes the base table gets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Indexes {
    pub vector: bool,
    pub fts: bool,
    pub btree: bool,
}

impl Indexes {
    pub const ALL: Self = Self {
        vector: true,
        fts: true,
        btree: true,
    };
}

/// An unsharded base table with `BASE_ROWS` rows, created by upstream
/// lance with the chosen indexes and the MemWAL index (maintaining every
/// index unless `listed` names them).
pub struct IndexedTable {
    _dir: TempDir,
    pub uri: String,
}

impl IndexedTable {
    pub async fn create(indexes: Indexes, listed: Option<Vec<String>>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let uri = dir.path().join("t").to_str().unwrap().to_string();
        let ids: Vec<i64> = (0..BASE_ROWS).collect();
        let mut ds = Dataset::write(
            RecordBatchIterator::new(vec![Ok(batch(&ids, "base"))], schema()),
            &uri,
            Some(WriteParams::default()),
        )
        .await
        .unwrap();
        if indexes.vector {
            let params =
                VectorIndexParams::ivf_pq(2, 8, 4, lance_linalg::distance::DistanceType::L2, 20);
            ds.create_index(
                &["vec"],
                IndexType::Vector,
                Some("vec_idx".into()),
                &params,
                true,
            )
            .await
            .unwrap();
        }
        if indexes.fts {
            create_fts(&mut ds).await;
        }
        if indexes.btree {
            ds.create_index(
                &["n"],
                IndexType::BTree,
                Some("n_btree".into()),
                &ScalarIndexParams::default(),
                true,
            )
            .await
            .unwrap();
        }
        let mut init = ds.initialize_mem_wal().unsharded();
        if let Some(list) = listed {
            init = init.maintained_indexes(list);
        }
        init.execute().await.expect("initialize_mem_wal");
        Self { _dir: dir, uri }
    }

    pub async fn dataset(&self) -> Dataset {
        Dataset::open(&self.uri).await.unwrap()
    }

    pub async fn open(&self, shard: Uuid) -> memwal::Result<ShardWriter> {
        let config = ShardWriterConfig {
            max_unflushed_age: None,
            ..Default::default()
        };
        ShardWriter::open(self.uri.as_str(), ShardId::from(shard), config).await
    }

    /// The shard's published SSTables: (generation, directory).
    pub async fn sstables(&self, shard: Uuid) -> (u32, u64, Vec<(u64, String)>) {
        let (store, base) = lance_io::object_store::ObjectStore::from_uri(&self.uri)
            .await
            .unwrap();
        let m = ShardManifestStore::new(store, &base, shard, 2)
            .refresh_latest()
            .await
            .unwrap()
            .expect("the shard has a manifest");
        (
            m.shard_spec_id,
            m.current_generation,
            m.sstables
                .iter()
                .map(|s| (s.generation, s.path.clone()))
                .collect(),
        )
    }

    /// The indexes an SSTable's manifest lists: name -> lance's statistics
    /// of it (JSON, naming its type).
    pub async fn sstable_indexes(&self, shard: Uuid, dir: &str) -> BTreeMap<String, String> {
        let path = format!("{}/_mem_wal/{shard}/{dir}", self.uri);
        let ds = Dataset::open(&path).await.unwrap();
        let mut out = BTreeMap::new();
        for m in ds.load_indices().await.unwrap().iter() {
            let stats = ds.index_statistics(&m.name).await.unwrap();
            out.insert(m.name.clone(), stats);
        }
        out
    }

    /// Upstream's scanner over the base table and the shard's SSTables
    /// above `compacted` (what a reader hands it).
    pub async fn scanner(&self, shards: &[Uuid]) -> LsmScanner {
        let ds = Arc::new(self.dataset().await);
        let mut snapshots = Vec::new();
        for shard in shards {
            let (spec, current, sstables) = self.sstables(*shard).await;
            let mut snap = ShardSnapshot::new(*shard)
                .with_spec_id(spec)
                .with_current_generation(current);
            for (g, p) in sstables {
                snap = snap.with_sstable(g, p);
            }
            snapshots.push(snap);
        }
        LsmScanner::new(ds, snapshots, vec!["id".to_string()])
    }

    /// The `k` rows nearest `q` (L2): (id, vector), nearest first.
    pub async fn nearest(
        &self,
        shards: &[Uuid],
        q: &[f32],
        k: usize,
        filter: Option<&str>,
    ) -> Vec<(i64, Vec<f32>)> {
        let mut s = self.scanner(shards).await;
        if let Some(f) = filter {
            s = s.filter(f).unwrap();
        }
        let s = s
            .nearest("vec", &Float32Array::from(q.to_vec()), k)
            .unwrap();
        let out = s.try_into_batch().await.expect("upstream vector search");
        rows_of(&out)
    }

    /// The ids whose `txt` matches `query` (full-text search).
    pub async fn search_text(&self, shards: &[Uuid], query: &str) -> Vec<i64> {
        let q = FullTextSearchQuery::new(query.to_string())
            .with_column("txt".to_string())
            .unwrap();
        let s = self.scanner(shards).await.full_text_search(q).unwrap();
        let out = s.try_into_batch().await.expect("upstream full-text search");
        let mut ids: Vec<i64> = rows_of(&out).into_iter().map(|(id, _)| id).collect();
        ids.sort();
        ids
    }
}

pub async fn create_fts(ds: &mut Dataset) {
    ds.create_index(
        &["txt"],
        IndexType::Inverted,
        Some("txt_fts".into()),
        &InvertedIndexParams::default(),
        true,
    )
    .await
    .unwrap();
}

fn rows_of(b: &RecordBatch) -> Vec<(i64, Vec<f32>)> {
    let ids = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
    let vecs = b
        .column_by_name("vec")
        .map(|c| c.as_fixed_size_list().clone());
    (0..b.num_rows())
        .map(|i| {
            let v = vecs
                .as_ref()
                .filter(|v| v.is_valid(i))
                .map(|v| v.value(i).as_primitive::<Float32Type>().values().to_vec())
                .unwrap_or_default();
            (ids.value(i), v)
        })
        .collect()
}

/// The acknowledged state of fresh keys: key -> the tag of its last put,
/// `None` once deleted.
type Model = BTreeMap<i64, Option<String>>;

fn put(model: &mut Model, ids: &[i64], tag: &str) {
    for id in ids {
        model.insert(*id, Some(tag.to_string()));
    }
}

// Breaks if memwal's SSTables carry no maintained index (upstream's vector
// search then returns base rows for every fresh probe), carry them under
// other names or field ids, index superseded or deleted rows so a search
// returns them, or lose a btree-filtered search's fresh rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_rows_are_found_by_vector_fts_and_btree_search_in_memwal_sstables() {
    let t = IndexedTable::create(Indexes::ALL, None).await;
    let shard = Uuid::new_v4();
    let w = t.open(shard).await.unwrap();
    let mut model = Model::new();
    // Generation 1: 200 rows, 20 overwritten and 10 deleted within it.
    let g1: Vec<i64> = (FRESH..FRESH + 200).collect();
    w.put(&batch(&g1, "a")).await.unwrap();
    put(&mut model, &g1, "a");
    w.put(&batch(&g1[..20], "b")).await.unwrap();
    put(&mut model, &g1[..20], "b");
    w.delete(&key_batch(&g1[20..30])).await.unwrap();
    g1[20..30].iter().for_each(|id| {
        model.insert(*id, None);
    });
    w.flush().await.unwrap();
    // Generation 2: new rows, and overwrites and deletes of generation 1's.
    let g2: Vec<i64> = (FRESH + 200..FRESH + 300).collect();
    w.put(&batch(&g2, "c")).await.unwrap();
    put(&mut model, &g2, "c");
    w.put(&batch(&g1[30..50], "d")).await.unwrap();
    put(&mut model, &g1[30..50], "d");
    w.delete(&key_batch(&g1[50..60])).await.unwrap();
    g1[50..60].iter().for_each(|id| {
        model.insert(*id, None);
    });
    w.close().await.unwrap();

    let (_, _, sstables) = t.sstables(shard).await;
    assert_eq!(sstables.len(), 2, "{sstables:?}");
    for (_, dir) in &sstables {
        let idx = t.sstable_indexes(shard, dir).await;
        assert_eq!(
            idx.keys().cloned().collect::<Vec<_>>(),
            ["n_btree", "txt_fts", "vec_idx"],
            "SSTable {dir} carries every maintained index under its base name: {idx:?}"
        );
        assert!(idx["vec_idx"].contains("IVF_HNSW_SQ"), "{idx:?}");
    }

    // Every live fresh row is the top hit for its own vector; no search
    // returns a row's superseded vector or a deleted key.
    let live: Vec<(i64, String)> = model
        .iter()
        .filter_map(|(id, tag)| tag.clone().map(|t| (*id, t)))
        .collect();
    let mut found = 0;
    let probes: Vec<&(i64, String)> = live.iter().step_by(live.len() / 30).take(30).collect();
    for (id, tag) in &probes {
        let hits = t.nearest(&[shard], &vector(*id, tag), 10, None).await;
        if hits.first().map(|h| h.0) == Some(*id) {
            found += 1;
        }
        for (hit, v) in &hits {
            if *hit >= FRESH {
                let tag = model[hit]
                    .as_deref()
                    .unwrap_or_else(|| panic!("deleted key {hit} returned"));
                assert_eq!(
                    v,
                    &vector(*hit, tag),
                    "key {hit}: a superseded vector returned"
                );
            }
        }
    }
    assert_eq!(
        found,
        probes.len(),
        "fresh rows found as top hit by vector search"
    );
    for (id, old) in [(g1[0], "a"), (g1[35], "a"), (g1[25], "a"), (g1[55], "a")] {
        let hits = t.nearest(&[shard], &vector(id, old), 3, None).await;
        for (hit, v) in &hits {
            if *hit == id {
                assert_ne!(
                    v,
                    &vector(id, old),
                    "key {id}: its superseded vector was returned"
                );
            }
        }
        assert!(
            hits.iter()
                .all(|(hit, _)| model.get(hit).is_none_or(|t| t.is_some())),
            "a deleted key returned: {hits:?}"
        );
    }

    // A btree-filtered vector search keeps only fresh rows and finds them.
    let (id, tag) = probes[3];
    let hits = t
        .nearest(
            &[shard],
            &vector(*id, tag),
            10,
            Some(&format!("n >= {FRESH}")),
        )
        .await;
    assert_eq!(hits.first().map(|h| h.0), Some(*id), "{hits:?}");
    assert!(hits.iter().all(|(h, _)| *h >= FRESH), "{hits:?}");
    let count = t
        .scanner(&[shard])
        .await
        .filter(&format!("n >= {FRESH}"))
        .unwrap()
        .count_rows()
        .await
        .unwrap();
    assert_eq!(
        count as usize,
        live.len(),
        "a btree-filtered scan returns every live fresh row"
    );

    // Full-text search finds a row by its current text only.
    for (id, tag) in probes.iter().take(10) {
        assert_eq!(
            t.search_text(&[shard], &format!("{tag}x{id}")).await,
            vec![*id]
        );
    }
    for (id, old) in [(g1[0], "a"), (g1[35], "a"), (g1[25], "a"), (g1[55], "a")] {
        assert!(
            t.search_text(&[shard], &format!("{old}x{id}"))
                .await
                .is_empty(),
            "key {id}: superseded or deleted text found"
        );
    }
}

// Breaks if maintain-all mode resolves the set only once: an index created
// on the base table after the shard opened must be in the next generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintain_all_picks_up_an_index_created_after_the_shard_opened() {
    let t = IndexedTable::create(
        Indexes {
            vector: true,
            fts: false,
            btree: false,
        },
        None,
    )
    .await;
    let shard = Uuid::new_v4();
    let w = t.open(shard).await.unwrap();
    w.put(&batch(&[FRESH, FRESH + 1], "a")).await.unwrap();
    w.flush().await.unwrap();
    let mut ds = t.dataset().await;
    create_fts(&mut ds).await;
    w.put(&batch(&[FRESH + 2], "b")).await.unwrap();
    w.close().await.unwrap();
    let (_, _, sstables) = t.sstables(shard).await;
    let names = |m: BTreeMap<String, String>| m.into_keys().collect::<Vec<_>>();
    assert_eq!(
        names(t.sstable_indexes(shard, &sstables[0].1).await),
        ["vec_idx"]
    );
    assert_eq!(
        names(t.sstable_indexes(shard, &sstables[1].1).await),
        ["txt_fts", "vec_idx"],
        "the FTS index created after open is in the next generation"
    );
    assert_eq!(
        t.search_text(&[shard], &format!("bx{}", FRESH + 2)).await,
        vec![FRESH + 2]
    );
}

// Breaks if an index created with a schema change (on the new column) is
// not in the first generation of the new schema, or if the generation
// frozen at the change (rows without the column) claims it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_on_a_column_added_while_writing_joins_at_the_schema_boundary() {
    let t = IndexedTable::create(
        Indexes {
            vector: true,
            fts: false,
            btree: false,
        },
        None,
    )
    .await;
    let shard = Uuid::new_v4();
    let w = t.open(shard).await.unwrap();
    w.put(&batch(&[FRESH, FRESH + 1], "a")).await.unwrap();
    let mut ds = t.dataset().await;
    let m = Arc::new(Schema::new(vec![Field::new("m", DataType::Int64, true)]));
    ds.add_columns(lance::dataset::NewColumnTransform::AllNulls(m), None, None)
        .await
        .unwrap();
    ds.create_index(
        &["m"],
        IndexType::BTree,
        Some("m_btree".into()),
        &ScalarIndexParams::default(),
        true,
    )
    .await
    .unwrap();
    assert_eq!(w.evolve().await.unwrap(), Some(2));
    let plain = batch(&[FRESH + 2, FRESH + 3], "b");
    let mut fields: Vec<Field> = plain
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("m", DataType::Int64, true));
    let mut columns = plain.columns().to_vec();
    columns.push(Arc::new(Int64Array::from(vec![7, 8])) as ArrayRef);
    let with_m = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
    w.put(&with_m).await.unwrap();
    w.close().await.unwrap();
    let (_, _, sstables) = t.sstables(shard).await;
    let names = |m: BTreeMap<String, String>| m.into_keys().collect::<Vec<_>>();
    assert_eq!(
        names(t.sstable_indexes(shard, &sstables[0].1).await),
        ["vec_idx"],
        "the generation frozen at the change has no `m`"
    );
    assert_eq!(
        names(t.sstable_indexes(shard, &sstables[1].1).await),
        ["m_btree", "vec_idx"],
        "the first generation of the new schema carries the new index"
    );
    let found = t
        .scanner(&[shard])
        .await
        .filter("m = 8")
        .unwrap()
        .try_into_batch()
        .await
        .unwrap();
    let ids: Vec<i64> = rows_of(&found).into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids, vec![FRESH + 3]);
}

// Breaks if a listed maintained index of a kind memwal cannot mirror is
// accepted (its SSTables would silently lack it), or if maintain-all mode
// refuses instead of skipping such an index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_kind_memwal_cannot_mirror_is_refused_when_listed_and_skipped_otherwise() {
    // Listed: `n_btree` is maintained, then replaced by a bitmap index of
    // the same name.
    let t = IndexedTable::create(
        Indexes {
            vector: false,
            fts: false,
            btree: true,
        },
        Some(vec!["n_btree".into()]),
    )
    .await;
    let mut ds = t.dataset().await;
    ds.drop_index("n_btree").await.unwrap();
    ds.create_index(
        &["n"],
        IndexType::Bitmap,
        Some("n_btree".into()),
        &ScalarIndexParams::for_builtin(lance_index::scalar::BuiltinIndexType::Bitmap),
        true,
    )
    .await
    .unwrap();
    let e = t.open(Uuid::new_v4()).await.map(|_| ()).unwrap_err();
    assert!(matches!(e, memwal::Error::InvalidInput { .. }), "{e}");
    assert!(e.to_string().contains("n_btree"), "{e}");

    // Maintain-all: the bitmap index is skipped, the vector index kept.
    let t = IndexedTable::create(
        Indexes {
            vector: true,
            fts: false,
            btree: false,
        },
        None,
    )
    .await;
    let mut ds = t.dataset().await;
    ds.create_index(
        &["n"],
        IndexType::Bitmap,
        Some("n_bitmap".into()),
        &ScalarIndexParams::for_builtin(lance_index::scalar::BuiltinIndexType::Bitmap),
        true,
    )
    .await
    .unwrap();
    let shard = Uuid::new_v4();
    let w = t.open(shard).await.unwrap();
    w.put(&batch(&[FRESH], "a")).await.unwrap();
    w.close().await.unwrap();
    let (_, _, sstables) = t.sstables(shard).await;
    let idx = t.sstable_indexes(shard, &sstables[0].1).await;
    assert_eq!(idx.into_keys().collect::<Vec<_>>(), ["vec_idx"]);
}

/// Upstream's scanner over the read view memwal's compactor crate computes
/// for an index-served read (`index`) or a data scan (`None`).
async fn view_scanner(uri: &str, index: Option<&str>) -> LsmScanner {
    let loc = memwal_store::open_store(uri).unwrap();
    let view = memwal_table::table_view(&loc, index, &memwal_store::RetryPolicy::default())
        .await
        .unwrap();
    let base = Arc::new(Dataset::open(uri).await.unwrap());
    LsmScanner::new(base, view.snapshots(), vec!["id".to_string()])
}

/// How many of `probes` an index-served search of the read view of
/// [`view_scanner`] can return at all: each probe is searched for its own
/// vector restricted to its own key (a prefilter), so it comes back exactly
/// when some level's index covers it (`fast_search` skips unindexed rows).
/// Ranking plays no part: the base index is IVF_PQ, trained on base rows
/// in [0, 1), which ranks fresh rows far away only coarsely.
async fn found(uri: &str, index: Option<&str>, probes: &[(i64, String)]) -> usize {
    let mut n = 0;
    for (id, tag) in probes {
        let q = Float32Array::from(vector(*id, tag));
        let s = view_scanner(uri, index).await;
        let out = s
            .filter(&format!("id = {id}"))
            .unwrap()
            .nearest("vec", &q, 1)
            .unwrap()
            .nprobes(2)
            .try_into_batch()
            .await
            .unwrap();
        if rows_of(&out).first().map(|r| r.0) == Some(*id) {
            n += 1;
        }
    }
    n
}

// Breaks if compaction leaves the base indexes behind (merged rows are then
// invisible to index-served search once their SSTables go), if the writer
// or GC drops an SSTable an index has not caught up past, or if the read
// view for an index-served read omits it: vector search must find every
// row at every step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_catches_up_the_indexes_and_sstables_stay_until_then() {
    let t = IndexedTable::create(Indexes::ALL, None).await;
    let shard = Uuid::new_v4();
    let loc = memwal_store::open_store(&t.uri).unwrap();
    let w = t.open(shard).await.unwrap();
    let g1: Vec<i64> = (FRESH..FRESH + 100).collect();
    w.put(&batch(&g1, "a")).await.unwrap();
    w.flush().await.unwrap();
    let probes: Vec<(i64, String)> = g1
        .iter()
        .step_by(10)
        .map(|id| (*id, "a".to_string()))
        .collect();
    let by_index = Some("vec_idx");
    assert_eq!(
        found(&t.uri, by_index, &probes).await,
        probes.len(),
        "in the SSTable"
    );

    // Compacted, the indexes not caught up: the SSTable stays in the
    // manifest (the next publish must not prune it), GC keeps it, and an
    // index-served read still reads it.
    let no_catchup = memwal_compactor::CompactorConfig {
        index_catchup: None,
        ..Default::default()
    };
    let compactor = memwal_compactor::Compactor::new(loc.clone(), no_catchup);
    for r in compactor.run_once().await.unwrap() {
        assert_eq!(r.unwrap().merged, vec![1]);
    }
    let g2: Vec<i64> = (FRESH + 100..FRESH + 110).collect();
    w.put(&batch(&g2, "b")).await.unwrap();
    w.flush().await.unwrap();
    let (_, _, sstables) = t.sstables(shard).await;
    assert_eq!(
        sstables.iter().map(|s| s.0).collect::<Vec<_>>(),
        [1, 2],
        "generation 1 is kept"
    );
    let gc = memwal_compactor::GcConfig {
        grace: std::time::Duration::ZERO,
        ..Default::default()
    };
    memwal_compactor::collect_garbage(&loc, &gc).await.unwrap();
    assert!(
        std::path::Path::new(&format!("{}/_mem_wal/{shard}/{}", t.uri, sstables[0].1)).exists(),
        "GC deleted an SSTable the indexes have not caught up past"
    );
    assert_eq!(
        found(&t.uri, by_index, &probes).await,
        probes.len(),
        "compacted, not indexed in the base"
    );
    // The data-scan view (floor: compacted) lacks generation 1: a vector
    // search through it misses those rows. This is what the catch-up fixes.
    assert!(found(&t.uri, None, &probes).await < probes.len());

    // The catch-up: every index records generation 2 in index_catchup.
    let compactor = memwal_compactor::Compactor::new(loc.clone(), Default::default());
    compactor.run_once().await.unwrap();
    let report = compactor.last_index_catchup().unwrap().unwrap();
    assert!(report.committed, "{report:?}");
    let lance = memwal_sstable::LanceStore::new(loc.store.clone());
    let table = memwal_table::BaseTable::load(&lance, &loc.root)
        .await
        .unwrap();
    for index in ["n_btree", "txt_fts", "vec_idx"] {
        assert_eq!(table.index_caught_up(index, shard.as_bytes()), 2, "{index}");
    }
    assert_eq!(
        found(&t.uri, by_index, &probes).await,
        probes.len(),
        "served by the base index"
    );

    // Now the writer prunes both generations and GC removes them.
    w.put(&batch(&[FRESH + 500], "c")).await.unwrap();
    w.close().await.unwrap();
    let (_, _, sstables) = t.sstables(shard).await;
    assert_eq!(
        sstables.iter().map(|s| s.0).collect::<Vec<_>>(),
        [3],
        "{sstables:?}"
    );
    assert_eq!(
        found(&t.uri, by_index, &probes).await,
        probes.len(),
        "after pruning"
    );
}
