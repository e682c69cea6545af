//! The base table's maintained indexes, carried by every SSTable
//! (docs/memwal-format.md "Maintained indexes").
//!
//! Upstream's LSM planners search a flushed generation only through that
//! generation's own index (vector search with `fast_search`): a generation
//! flushed without it contributes no rows. So each SSTable holds one Lance
//! index per maintained index, under the base index's name and field id,
//! in its own version-1 manifest.
//!
//! Indexes are built by lance's own builders (`CreateIndexBuilder`, left
//! uncommitted) over the written dataset, which already hides superseded
//! rows with its deletion vector, and attached by rewriting the SSTable's
//! unpublished version-1 manifest in place, as the deletion vector was.
//! Kinds, as upstream's flush writes them:
//! - vector: `IVF_HNSW_SQ` with one IVF partition, 8-bit SQ, the base
//!   index's distance type and the HNSW settings of [`VectorIndexSpec`];
//! - inverted (full text): the base index's tokenizer parameters;
//! - btree: lance's default btree.

use lance::dataset::Dataset;
use lance::index::vector::VectorIndexParams;
use lance::index::CreateIndexBuilder;
use lance_index::scalar::{InvertedIndexParams, ScalarIndexParams};
use lance_index::vector::hnsw::builder::HnswBuildParams;
use lance_index::vector::ivf::IvfBuildParams;
use lance_index::vector::sq::builder::SQBuildParams;
use lance_index::{IndexParams, IndexType};
use lance_table::format::IndexMetadata;
use lance_table::io::commit::write_manifest_file_to_path;
use object_store::path::Path;

pub use lance_linalg::distance::DistanceType;

use crate::dataset::open_dataset;
use crate::error::{Result, SsTableError};
use crate::lance_store::LanceStore;

/// One index an SSTable carries, mirroring a maintained index of the base
/// table.
#[derive(Debug, Clone)]
pub struct IndexSpec {
    /// The base index's name (kept, so readers group it with the base's).
    pub name: String,
    /// The indexed top-level column, as the storage schema names it.
    pub column: String,
    /// The column's field id: readers find an index by it.
    pub field_id: i32,
    /// What is built.
    pub kind: IndexKind,
}

/// The kinds of index an SSTable can carry.
#[derive(Debug, Clone)]
pub enum IndexKind {
    /// A vector index (`IVF_HNSW_SQ`, one partition).
    Vector(VectorIndexSpec),
    /// A full-text (inverted) index with these tokenizer parameters.
    Inverted(Box<InvertedIndexParams>),
    /// A btree.
    BTree,
}

impl IndexKind {
    /// `vector`, `inverted` or `btree` (metric labels, messages).
    pub fn label(&self) -> &'static str {
        match self {
            Self::Vector(_) => "vector",
            Self::Inverted(_) => "inverted",
            Self::BTree => "btree",
        }
    }
}

/// How an SSTable's vector index is built.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VectorIndexSpec {
    /// The base index's distance type (queries must use the same one).
    pub distance: DistanceType,
    /// HNSW edges per node ("M").
    pub num_edges: usize,
    /// HNSW candidate list size while building.
    pub ef_construction: usize,
    /// HNSW levels.
    pub max_level: u16,
}

impl VectorIndexSpec {
    /// Upstream's flush settings for `distance` (M 16, ef_construction
    /// 100, 7 levels).
    pub fn new(distance: DistanceType) -> Self {
        Self {
            distance,
            num_edges: 16,
            ef_construction: 100,
            max_level: 7,
        }
    }
}

/// Builds every index of `specs` over the SSTable dataset at `dir` and
/// attaches them to its version-1 manifest; returns the names attached.
///
/// An index whose column holds no value in any visible row (a generation
/// of deletes only, say) is not built: no search could find one of its
/// rows. The dataset is opened with a session of its own, so no cached
/// manifest from before the rewrite is read back.
pub(crate) async fn attach_indexes(
    lance: &LanceStore,
    dir: &Path,
    specs: &[IndexSpec],
) -> Result<Vec<String>> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let own = LanceStore::new(lance.store().clone());
    let mut ds = open_dataset(&own, dir).await?;
    let mut built: Vec<IndexMetadata> = Vec::new();
    for spec in specs {
        let started = tokio::time::Instant::now();
        let Some(meta) = build_one(&mut ds, dir, spec).await? else {
            continue;
        };
        metrics::histogram!("memwal_sstable_index_build_seconds", "kind" => spec.kind.label())
            .record(started.elapsed().as_secs_f64());
        if meta.fields != [spec.field_id] || meta.name != spec.name {
            return Err(SsTableError::corrupt(
                dir,
                format!(
                    "index `{}` was built on fields {:?} as `{}`, expected field {}",
                    spec.name, meta.fields, meta.name, spec.field_id
                ),
            ));
        }
        built.push(meta);
    }
    let mut names: Vec<String> = built.iter().map(|m| m.name.clone()).collect();
    names.sort();
    if built.is_empty() {
        return Ok(names);
    }
    let mut manifest = ds.manifest().clone();
    manifest.index_section = None;
    manifest.transaction_section = None;
    manifest.transaction_file = None;
    let path = ds.manifest_location().path.clone();
    write_manifest_file_to_path(own.lance_store(), &mut manifest, Some(built), &path, None)
        .await
        .map_err(SsTableError::lance(&path))?;
    Ok(names)
}

/// Builds one index's files (uncommitted); `None` when the column has no
/// value to index.
async fn build_one(
    ds: &mut Dataset,
    dir: &Path,
    spec: &IndexSpec,
) -> Result<Option<IndexMetadata>> {
    let filter = format!("{} IS NOT NULL", quoted(&spec.column));
    let values = ds
        .count_rows(Some(filter))
        .await
        .map_err(SsTableError::lance(dir))?;
    if values == 0 {
        tracing::debug!(index = %spec.name, "no values to index in this generation");
        return Ok(None);
    }
    let vector;
    let btree;
    let (index_type, params): (IndexType, &dyn IndexParams) = match &spec.kind {
        IndexKind::Vector(v) => {
            let hnsw = HnswBuildParams::default()
                .num_edges(v.num_edges)
                .ef_construction(v.ef_construction)
                .max_level(v.max_level);
            vector = VectorIndexParams::with_ivf_hnsw_sq_params(
                v.distance,
                IvfBuildParams::new(1),
                hnsw,
                SQBuildParams::default(),
            );
            (IndexType::IvfHnswSq, &vector)
        }
        IndexKind::Inverted(p) => (IndexType::Inverted, p.as_ref()),
        IndexKind::BTree => {
            btree = ScalarIndexParams::default();
            (IndexType::BTree, &btree)
        }
    };
    let column = spec.column.as_str();
    CreateIndexBuilder::new(ds, &[column], index_type, params)
        .name(spec.name.clone())
        .execute_uncommitted()
        .await
        .map(Some)
        .map_err(|e| SsTableError::Lance {
            path: format!("{dir} (index `{}`)", spec.name),
            source: e,
        })
}

/// `name` as a SQL identifier for lance's filter parser.
fn quoted(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// The index names an SSTable's manifest lists (for checks and tests).
pub(crate) async fn index_names(ds: &Dataset, dir: &Path) -> Result<Vec<String>> {
    use lance::index::DatasetIndexExt;
    let indices = ds.load_indices().await.map_err(SsTableError::lance(dir))?;
    let mut names: Vec<String> = indices.iter().map(|m| m.name.clone()).collect();
    names.sort();
    names.dedup();
    Ok(names)
}
