//! Reading a base table: schema, storage version, MemWAL configuration.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_schema::{Field, Schema};
use lance::dataset::builder::DatasetBuilder;
use lance::index::DatasetIndexExt;
use lance::Dataset;
use memwal_memtable::{FIELD_ID_KEY, PRIMARY_KEY_KEY, PRIMARY_KEY_POSITION_KEY};
use memwal_proto::{MemWalIndexDetails, ShardingSpec};
use memwal_sstable::{LanceFileVersion, LanceStore};
use object_store::path::Path;
use prost::Message;

use crate::maintained::{base_indexes, BaseIndex};
use crate::{Result, TableError, MEM_WAL_INDEX_NAME};
use lance_table::format::IndexMetadata;

/// What a base table declares, as of the version that was loaded.
#[derive(Debug, Clone)]
pub struct BaseTable {
    /// The table's location (for messages).
    pub uri: String,
    /// The dataset version read.
    pub version: u64,
    /// Arrow schema: every top-level column carries its Lance field id as
    /// `lance:field_id` and primary-key columns the unenforced-primary-key
    /// metadata (with the key position for composite keys).
    pub schema: Arc<Schema>,
    /// The data storage version SSTables must be written with.
    pub storage_version: LanceFileVersion,
    /// The `__lance_mem_wal` index details; `None` when the table has no
    /// MemWAL index.
    pub mem_wal: Option<MemWalIndexDetails>,
    /// The table's other indexes (one entry per name), from which
    /// [`BaseTable::maintained_indexes`] resolves what SSTables carry.
    pub indexes: Vec<BaseIndex>,
}

impl BaseTable {
    /// Loads the latest version of the table at `root` of `lance`'s store.
    ///
    /// [`TableError::NotFound`] when there is no dataset there;
    /// [`TableError::Corrupt`] when the MemWAL index is present but its
    /// details do not decode (never read as "no index").
    pub async fn load(lance: &LanceStore, root: &Path) -> Result<Self> {
        let uri = lance.uri(root);
        let ds = DatasetBuilder::from_uri(&uri)
            .with_session(lance.session().clone())
            .load()
            .await
            .map_err(|e| match e {
                lance::Error::DatasetNotFound { .. } | lance::Error::NotFound { .. } => {
                    TableError::NotFound {
                        uri: root.to_string(),
                    }
                }
                // Feature flags this lance does not know (or another
                // declared capability it lacks): refuse, never guess.
                e @ lance::Error::NotSupported { .. } => TableError::Unsupported {
                    uri: root.to_string(),
                    reason: e.to_string(),
                },
                source => TableError::Read {
                    uri: root.to_string(),
                    source,
                },
            })?;
        Self::of_dataset(&ds, root.as_ref()).await
    }

    /// Reads what an opened dataset declares; `uri` names it in errors.
    pub async fn of_dataset(ds: &Dataset, uri: &str) -> Result<Self> {
        let indices = ds.load_indices().await.map_err(|source| TableError::Read {
            uri: uri.to_string(),
            source,
        })?;
        let mem_wal = mem_wal_details(&indices, uri)?;
        let indexes = base_indexes(ds, &indices, uri).await?;
        Ok(Self {
            uri: uri.to_string(),
            version: ds.version().version,
            schema: Arc::new(arrow_schema_of(ds)),
            storage_version: ds
                .manifest()
                .data_storage_format
                .lance_file_format()
                .to_selector(),
            mem_wal,
            indexes,
        })
    }

    /// The sharding spec shards of this table belong to: `None` for a table
    /// without the MemWAL index or with manual sharding (no spec).
    /// [`TableError::Unsupported`] when the index lists more than one spec
    /// (spec evolution is not supported).
    pub fn sharding_spec(&self) -> Result<Option<&ShardingSpec>> {
        let Some(d) = &self.mem_wal else {
            return Ok(None);
        };
        match d.sharding_specs.as_slice() {
            [] => Ok(None),
            [spec] => Ok(Some(spec)),
            specs => Err(TableError::Unsupported {
                uri: self.uri.clone(),
                reason: format!(
                    "the MemWAL index lists {} sharding specs; writers support one",
                    specs.len()
                ),
            }),
        }
    }

    /// The highest generation of shard `shard_uuid` (its 16 raw bytes) the
    /// MemWAL index records as compacted into this table version (`None`:
    /// none, or no index).
    pub fn compacted_generation(&self, shard_uuid: &[u8]) -> Option<u64> {
        self.mem_wal
            .iter()
            .flat_map(|d| d.compacted_sstables.iter())
            .filter(|c| c.shard_id.as_ref().is_some_and(|u| u.uuid == shard_uuid))
            .map(|c| c.generation)
            .max()
    }

    /// The writer configuration defaults the MemWAL index records (empty
    /// without the index).
    pub fn writer_config_defaults(&self) -> impl Iterator<Item = (&str, &str)> {
        self.mem_wal
            .iter()
            .flat_map(|d| d.writer_config_defaults.iter())
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// The dataset's schema in Arrow form with field ids and key metadata.
fn arrow_schema_of(ds: &Dataset) -> Schema {
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
    Schema::new_with_metadata(fields, ds.schema().metadata.clone())
}

/// The MemWAL index details, decoded with our wire types.
fn mem_wal_details(indices: &[IndexMetadata], uri: &str) -> Result<Option<MemWalIndexDetails>> {
    let mut found = indices.iter().filter(|i| i.name == MEM_WAL_INDEX_NAME);
    let Some(index) = found.next() else {
        return Ok(None);
    };
    if found.next().is_some() {
        return Err(TableError::Corrupt {
            uri: uri.to_string(),
            reason: format!("more than one `{MEM_WAL_INDEX_NAME}` index entry"),
        });
    }
    let Some(details) = &index.index_details else {
        return Err(TableError::Corrupt {
            uri: uri.to_string(),
            reason: format!("`{MEM_WAL_INDEX_NAME}` has no index details"),
        });
    };
    MemWalIndexDetails::decode(details.value.as_slice())
        .map(Some)
        .map_err(|e| TableError::Corrupt {
            uri: uri.to_string(),
            reason: format!("`{MEM_WAL_INDEX_NAME}` details do not decode: {e}"),
        })
}
