//! Which of the base table's indexes every SSTable carries (docs/memwal-format.md
//! "Maintained indexes"), resolved as upstream's writer resolves them:
//!
//! - `maintain_all_indexes` set: every index of the base table but the
//!   system ones (`__lance_mem_wal`, `__lance_frag_reuse`), by name, read
//!   again from each base version loaded (an index created while a writer
//!   runs is picked up by its next flush, a dropped one falls out); an
//!   index memwal cannot mirror is left out with a reason;
//! - otherwise `maintained_indexes` as given: a listed index missing from
//!   the base is left out with a reason, one memwal cannot mirror is
//!   refused ([`TableError::Unsupported`] naming it).
//!
//! memwal mirrors vector indexes (on a top-level `FixedSizeList<Float32>`
//! column), inverted (full-text) and btree indexes, each on one top-level
//! column.

use std::collections::BTreeMap;

use arrow_schema::DataType;
use lance::index::DatasetIndexInternalExt;
use lance::Dataset;
use lance_index::metrics::NoOpMetricsCollector;
use lance_index::scalar::InvertedIndexParams;
use lance_table::format::IndexMetadata;
use memwal_memtable::FIELD_ID_KEY;
use memwal_sstable::{DistanceType, IndexKind, IndexSpec, VectorIndexSpec};
use prost::Message;

use crate::{BaseTable, Result, TableError};

/// One index of the base table, as loaded (the first segment of its name).
#[derive(Debug, Clone)]
pub struct BaseIndex {
    /// The index name.
    pub name: String,
    /// The field ids it covers.
    pub field_ids: Vec<i32>,
    /// What it is: the last component of its details' type URL
    /// (`VectorIndexDetails`, `InvertedIndexDetails`, `BTreeIndexDetails`,
    /// ...); empty when it has no details.
    pub details_type: String,
    /// Its details' bytes.
    pub details: Vec<u8>,
    /// Its `index_version`.
    pub index_version: i32,
    /// A vector index's distance type (from its details, or read from the
    /// index itself when its details are the legacy empty ones).
    pub distance: Option<DistanceType>,
}

/// The resolved maintained set of one base table version.
#[derive(Debug, Clone, Default)]
pub struct MaintainedIndexes {
    /// What every SSTable flushed now carries, sorted by name.
    pub specs: Vec<IndexSpec>,
    /// Indexes left out, with why.
    pub skipped: Vec<(String, String)>,
}

/// Whether an index is one of lance's system indexes (by name, as lance
/// decides).
fn is_system(name: &str) -> bool {
    name == crate::MEM_WAL_INDEX_NAME || name == "__lance_frag_reuse"
}

/// The base table's indexes, one entry per name (its first segment).
pub(crate) async fn base_indexes(
    ds: &Dataset,
    indices: &[IndexMetadata],
    uri: &str,
) -> Result<Vec<BaseIndex>> {
    let mut by_name: BTreeMap<&str, &IndexMetadata> = BTreeMap::new();
    for m in indices.iter().filter(|m| !is_system(&m.name)) {
        by_name.entry(m.name.as_str()).or_insert(m);
    }
    let mut out = Vec::with_capacity(by_name.len());
    for (name, m) in by_name {
        let (details_type, details) = match &m.index_details {
            Some(d) => (
                d.type_url
                    .rsplit(['/', '.'])
                    .next()
                    .unwrap_or_default()
                    .to_string(),
                d.value.to_vec(),
            ),
            None => (String::new(), Vec::new()),
        };
        let distance = if details_type == "VectorIndexDetails" {
            vector_distance(ds, m, &details, uri).await?
        } else {
            None
        };
        out.push(BaseIndex {
            name: name.to_string(),
            field_ids: m.fields.clone(),
            details_type,
            details,
            index_version: m.index_version,
            distance,
        });
    }
    Ok(out)
}

/// A vector index's distance type: from its details, or (legacy empty
/// details) from the index itself; `None` when neither says.
async fn vector_distance(
    ds: &Dataset,
    m: &IndexMetadata,
    details: &[u8],
    uri: &str,
) -> Result<Option<DistanceType>> {
    if !details.is_empty() {
        let d = lance_index::pb::VectorIndexDetails::decode(details).map_err(|e| {
            TableError::Corrupt {
                uri: uri.to_string(),
                reason: format!("index `{}`: vector details do not decode: {e}", m.name),
            }
        })?;
        let metric = lance_index::pb::VectorMetricType::try_from(d.metric_type).map_err(|_| {
            TableError::Unsupported {
                uri: uri.to_string(),
                reason: format!(
                    "index `{}`: unknown distance type {}",
                    m.name, d.metric_type
                ),
            }
        })?;
        return Ok(Some(DistanceType::from(metric)));
    }
    let Some(column) = m
        .fields
        .first()
        .and_then(|id| ds.schema().field_by_id(*id))
        .map(|f| f.name.clone())
    else {
        return Ok(None);
    };
    match ds
        .open_vector_index(&column, &m.uuid, &NoOpMetricsCollector)
        .await
    {
        Ok(index) => Ok(Some(index.metric_type())),
        Err(e) => {
            tracing::warn!(index = %m.name, error = %e, "cannot read a legacy vector index's distance type");
            Ok(None)
        }
    }
}

impl BaseTable {
    /// The indexes a read of this table may be served by, whose catch-up
    /// bounds which SSTables readers still need: under
    /// `maintain_all_indexes` every non-system index of the table, else the
    /// listed ones the table has (a listed name the table lacks serves no
    /// read). Sorted.
    pub fn reader_indexes(&self) -> Vec<String> {
        let Some(details) = &self.mem_wal else {
            return Vec::new();
        };
        let mut names: Vec<String> = if details.maintain_all_indexes == Some(true) {
            self.indexes.iter().map(|i| i.name.clone()).collect()
        } else {
            details
                .maintained_indexes
                .iter()
                .filter(|n| self.indexes.iter().any(|i| &i.name == *n))
                .cloned()
                .collect()
        };
        names.sort();
        names.dedup();
        names
    }

    /// The generation of shard `shard_uuid` (its 16 raw bytes) base index
    /// `index` has caught up to (`index_catchup`; 0: none recorded).
    pub fn index_caught_up(&self, index: &str, shard_uuid: &[u8]) -> u64 {
        self.mem_wal
            .iter()
            .flat_map(|d| d.index_catchup.iter())
            .filter(|p| p.index_name == index)
            .flat_map(|p| p.caught_up_generations.iter())
            .filter(|c| c.shard_id.as_ref().is_some_and(|u| u.uuid == shard_uuid))
            .map(|c| c.generation)
            .max()
            .unwrap_or(0)
    }

    /// The highest generation of shard `shard_uuid` no read needs an
    /// SSTable for any more: compacted into the base
    /// (`compacted_sstables`) and covered by every reader index
    /// ([`Self::reader_indexes`]) there. SSTables at or below it may be
    /// dropped from the shard's manifest.
    pub fn covered_generation(&self, shard_uuid: &[u8]) -> u64 {
        let compacted = self.compacted_generation(shard_uuid).unwrap_or(0);
        self.reader_indexes()
            .iter()
            .map(|name| self.index_caught_up(name, shard_uuid))
            .fold(compacted, u64::min)
    }

    /// The indexes every SSTable flushed against this table version must
    /// carry (see the module doc). [`TableError::Unsupported`] names a
    /// listed index memwal cannot mirror, or a bad HNSW setting in the
    /// writer defaults.
    pub fn maintained_indexes(&self) -> Result<MaintainedIndexes> {
        let Some(details) = &self.mem_wal else {
            return Ok(MaintainedIndexes::default());
        };
        let all = details.maintain_all_indexes == Some(true);
        let names: Vec<String> = if all {
            self.indexes.iter().map(|i| i.name.clone()).collect()
        } else {
            let mut listed = details.maintained_indexes.clone();
            listed.sort();
            listed.dedup();
            listed
        };
        let mut out = MaintainedIndexes::default();
        for name in names {
            let Some(index) = self.indexes.iter().find(|i| i.name == name) else {
                out.skipped.push((
                    name,
                    "listed as maintained, but the base table has no such index".into(),
                ));
                continue;
            };
            match self.mirror(index) {
                Ok(spec) => out.specs.push(spec),
                Err(reason) if all => out.skipped.push((name, reason)),
                Err(reason) => {
                    return Err(TableError::Unsupported {
                        uri: self.uri.clone(),
                        reason: format!("maintained index `{name}`: {reason}"),
                    })
                }
            }
        }
        for spec in &mut out.specs {
            if let IndexKind::Vector(v) = &mut spec.kind {
                self.hnsw_defaults(&spec.name, v)?;
            }
        }
        Ok(out)
    }

    /// What an SSTable builds to mirror `index`, or why it cannot.
    fn mirror(&self, index: &BaseIndex) -> std::result::Result<IndexSpec, String> {
        let [field_id] = index.field_ids.as_slice() else {
            return Err(format!(
                "it covers {} columns; memwal mirrors one-column indexes",
                index.field_ids.len()
            ));
        };
        let field = self
            .schema
            .fields()
            .iter()
            .find(|f| f.metadata().get(FIELD_ID_KEY).and_then(|v| v.parse().ok()) == Some(*field_id))
            .ok_or_else(|| {
                format!("its field {field_id} is not a top-level column; memwal mirrors indexes on top-level columns")
            })?;
        let kind = match index.details_type.as_str() {
            "VectorIndexDetails" => {
                let float_vectors = matches!(field.data_type(),
                    DataType::FixedSizeList(item, dim) if *dim > 0 && item.data_type() == &DataType::Float32);
                if !float_vectors {
                    return Err(format!(
                        "a vector index on `{}` ({}); memwal mirrors vector indexes on FixedSizeList<Float32> columns",
                        field.name(),
                        field.data_type()
                    ));
                }
                let distance = index
                    .distance
                    .ok_or_else(|| "its distance type cannot be read".to_string())?;
                IndexKind::Vector(VectorIndexSpec::new(distance))
            }
            "InvertedIndexDetails" => IndexKind::Inverted(Box::new(inverted_params(index)?)),
            "BTreeIndexDetails" => IndexKind::BTree,
            "" => return Err("it has no index details (an index kind memwal cannot tell)".into()),
            other => {
                return Err(format!(
                "a `{other}` index; memwal mirrors vector, inverted (full-text) and btree indexes"
            ))
            }
        };
        Ok(IndexSpec {
            name: index.name.clone(),
            column: field.name().clone(),
            field_id: *field_id,
            kind,
        })
    }

    /// The writer defaults' `hnsw.{index}.num_edges`, `.ef_construction`
    /// and `.max_level` (what upstream's `initialize_mem_wal` records).
    fn hnsw_defaults(&self, index: &str, spec: &mut VectorIndexSpec) -> Result<()> {
        for (key, value) in self.writer_config_defaults() {
            let Some(setting) = key
                .strip_prefix("hnsw.")
                .and_then(|k| k.strip_prefix(index))
                .and_then(|k| k.strip_prefix('.'))
            else {
                continue;
            };
            let bad = || TableError::Unsupported {
                uri: self.uri.clone(),
                reason: format!("writer default `{key}` = `{value}` is not a positive integer"),
            };
            let n: usize = value.parse().ok().filter(|n| *n > 0).ok_or_else(bad)?;
            match setting {
                "num_edges" => spec.num_edges = n,
                "ef_construction" => spec.ef_construction = n,
                "max_level" => spec.max_level = u16::try_from(n).map_err(|_| bad())?,
                _ => {}
            }
        }
        Ok(())
    }
}

/// The tokenizer parameters of an inverted index, as its details record
/// them (an absent posting format follows from the index version, as lance
/// reads it).
fn inverted_params(index: &BaseIndex) -> std::result::Result<InvertedIndexParams, String> {
    let mut details = lance_index::pbold::InvertedIndexDetails::decode(index.details.as_slice())
        .map_err(|e| format!("its inverted index details do not decode: {e}"))?;
    if details.posting_format_version.is_none() {
        details.posting_format_version = Some(match index.index_version {
            0 | 1 => 1,
            2 => 2,
            3 => 3,
            v => {
                return Err(format!(
                    "inverted index version {v} is not one memwal knows"
                ))
            }
        });
    }
    InvertedIndexParams::try_from(&details).map_err(|e| format!("its tokenizer parameters: {e}"))
}
