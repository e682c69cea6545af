//! Table setup: a base Lance table with the `__lance_mem_wal` index, made
//! through lance's own `initialize_mem_wal` so upstream readers and writers
//! see exactly what they would have created.

use std::sync::Arc;

use arrow_array::{RecordBatch, RecordBatchIterator};
use arrow_schema::{ArrowError, SchemaRef};
use lance::dataset::mem_wal::DatasetMemWalExt;
use lance::dataset::{WriteMode, WriteParams};
use lance::Dataset;
use memwal_sstable::LanceStore;
use memwal_store::StoreLocation;

use crate::{BaseTable, Result, TableError};

/// How the rows of a new table are spread over shards (the table's one
/// sharding spec; shards are created on first use by writers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableSharding {
    /// One shard for the whole table.
    Unsharded,
    /// `bucket(column, buckets)`: Iceberg-style murmur3 bucket of a key column.
    Bucket {
        /// The source column (must be a primary-key column of a keyed table).
        column: String,
        /// Number of buckets, 1..=1024 (lance's limit).
        buckets: u32,
    },
    /// `identity(column)`: one shard per distinct value of a column.
    Identity {
        /// The source column.
        column: String,
    },
}

impl std::str::FromStr for TableSharding {
    type Err = String;

    /// Parses `unsharded`, `bucket(COL, N)` or `identity(COL)`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let s = s.trim();
        if s == "unsharded" {
            return Ok(Self::Unsharded);
        }
        let call = |name: &str| -> Option<Vec<String>> {
            let inner = s
                .strip_prefix(name)?
                .trim()
                .strip_prefix('(')?
                .strip_suffix(')')?;
            Some(inner.split(',').map(|a| a.trim().to_string()).collect())
        };
        if let Some(args) = call("bucket") {
            if let [column, n] = args.as_slice() {
                let buckets = n
                    .parse()
                    .map_err(|_| format!("bucket count `{n}` is not a number"))?;
                if !column.is_empty() {
                    return Ok(Self::Bucket {
                        column: column.clone(),
                        buckets,
                    });
                }
            }
            return Err(format!("`{s}`: expected bucket(COLUMN, N)"));
        }
        if let Some(args) = call("identity") {
            if let [column] = args.as_slice() {
                if !column.is_empty() {
                    return Ok(Self::Identity {
                        column: column.clone(),
                    });
                }
            }
            return Err(format!("`{s}`: expected identity(COLUMN)"));
        }
        Err(format!(
            "unknown sharding `{s}`: expected unsharded, bucket(COLUMN, N) or identity(COLUMN)"
        ))
    }
}

/// Creates an empty base table at `loc` with `schema` and installs the
/// MemWAL index with `sharding`; returns what the new table declares.
///
/// Primary-key columns are the fields whose metadata carries
/// `lance-schema:unenforced-primary-key` (none: an append-only table).
/// Fails with [`TableError::InvalidInput`] when a table already exists
/// there or lance refuses the schema or the sharding (e.g. a nullable key,
/// an unknown column); nothing is left behind in the latter case other than
/// an empty dataset without the index, which a retry refuses as existing.
pub async fn create_table(
    loc: &StoreLocation,
    schema: SchemaRef,
    sharding: &TableSharding,
) -> Result<BaseTable> {
    let lance = LanceStore::new(loc.store.clone());
    if BaseTable::load(&lance, &loc.root).await.is_ok() {
        return Err(invalid(&loc.uri, "a table already exists there"));
    }
    let params = WriteParams {
        mode: WriteMode::Create,
        session: Some(lance.session().clone()),
        commit_handler: Some(lance.commit_handler()),
        ..Default::default()
    };
    let empty: Vec<std::result::Result<RecordBatch, ArrowError>> = Vec::new();
    let mut ds = Dataset::write(
        RecordBatchIterator::new(empty, schema),
        &lance.uri(&loc.root),
        Some(params),
    )
    .await
    .map_err(|e| match e {
        lance::Error::DatasetAlreadyExists { .. } => {
            invalid(&loc.uri, "a table already exists there")
        }
        e => invalid(&loc.uri, format!("lance refuses the schema: {e}")),
    })?;
    install_mem_wal(&mut ds, &loc.uri, sharding).await?;
    BaseTable::of_dataset(&ds, &loc.uri).await
}

/// Installs the MemWAL index with `sharding` on an existing table;
/// [`TableError::InvalidInput`] when lance refuses (a table that has one
/// already, a sharding spec that does not fit its schema).
pub async fn install_mem_wal(ds: &mut Dataset, uri: &str, sharding: &TableSharding) -> Result<()> {
    let init = ds.initialize_mem_wal();
    let init = match sharding {
        TableSharding::Unsharded => init.unsharded(),
        TableSharding::Bucket { column, buckets } => init.bucket_sharding(column, *buckets),
        TableSharding::Identity { column } => init.identity_sharding(column),
    };
    init.execute()
        .await
        .map_err(|e| invalid(uri, format!("installing the MemWAL index: {e}")))
}

fn invalid(uri: &str, reason: impl Into<String>) -> TableError {
    TableError::InvalidInput {
        uri: uri.to_string(),
        reason: reason.into(),
    }
}

/// Opens the latest version of the table's dataset at `loc` through
/// `lance` (its session and commit handler, so commits made through it
/// are seen); [`TableError::Read`] when lance cannot.
pub async fn open_dataset(lance: &LanceStore, loc: &StoreLocation) -> Result<Arc<Dataset>> {
    lance::dataset::builder::DatasetBuilder::from_uri(lance.uri(&loc.root))
        .with_session(lance.session().clone())
        .with_commit_handler(lance.commit_handler())
        .load()
        .await
        .map(Arc::new)
        .map_err(|source| TableError::Read {
            uri: loc.uri.clone(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharding_specs_parse_and_bad_ones_are_named() {
        assert_eq!("unsharded".parse(), Ok(TableSharding::Unsharded));
        assert_eq!(
            " bucket( id , 4 )".parse(),
            Ok(TableSharding::Bucket {
                column: "id".into(),
                buckets: 4
            })
        );
        assert_eq!(
            "identity(region)".parse(),
            Ok(TableSharding::Identity {
                column: "region".into()
            })
        );
        for bad in ["bucket(id)", "bucket(id, x)", "identity()", "hash(id)", ""] {
            let e = bad.parse::<TableSharding>().unwrap_err();
            assert!(e.contains('`') || e.contains("bucket"), "{bad}: {e}");
        }
    }
}
