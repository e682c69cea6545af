//! Merging one published SSTable into the base table, with the
//! `compacted_sstables` marker in the commit that carries its last change.
//!
//! Keyed tables (merge-insert knows nothing of `_tombstone`):
//! 1. a key-only `WhenMatched::Delete` pass for the SSTable's tombstones,
//! 2. an `UpdateAll` + `InsertAll` pass for its live rows,
//!
//! the marker riding on the last pass that changes data. An SSTable holds
//! one visible row per key, so the passes touch disjoint keys and a rerun
//! of either is a no-op. Append-only tables write new fragments and commit
//! them with the marker in one `Update`, so a rerun (whose marker is stale)
//! never appends twice. An SSTable with no visible rows only moves the
//! marker (`UpdateMemWalState`).
//!
//! Every pass is planned and committed against one base version, with
//! lance's own re-execution switched off: a concurrent commit makes the
//! pass fail, and the caller reloads, re-reads the marker and starts the
//! generation over. Re-executing a delete pass against a newer base (where
//! another compactor may already have applied a later generation that
//! re-inserted the key) would delete a newer row. Two compactors merging
//! the same generation cannot both record it: lance refuses a marker not
//! above the recorded one when it builds the commit on the latest version
//! (with put-if-not-exists commits, [`memwal_sstable::LanceStore::commit_handler`]).

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{BooleanArray, RecordBatch};
use arrow_schema::{Field, Schema, SchemaRef};
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{StreamExt, TryStreamExt};
use lance::dataset::transaction::{Operation, Transaction};
use lance::dataset::{
    CommitBuilder, InsertBuilder, MergeInsertBuilder, WhenMatched, WhenNotMatched, WriteMode,
    WriteParams,
};
use lance::Dataset;
use lance_index::mem_wal::CompactedSsTable;
use memwal_fencing::ShardId;
use memwal_memtable::TOMBSTONE_COLUMN;

use crate::resolve::Newest;
use crate::{CompactorError, Result};

/// What merging one SSTable did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Merged {
    /// Live rows upserted (keyed) or appended.
    pub rows_written: u64,
    /// Tombstones applied (keys deleted if present).
    pub tombstones: u64,
    /// Base-table commits made.
    pub commits: u32,
}

/// Why a merge attempt did not finish.
#[derive(Debug)]
pub(crate) enum Attempt {
    /// A commit failed; the caller reloads the base and decides (the
    /// generation may have been compacted by someone else, or a concurrent
    /// commit got in the way).
    Commit(lance::Error),
    /// Nothing to retry.
    Failed(CompactorError),
}

impl From<CompactorError> for Attempt {
    fn from(e: CompactorError) -> Self {
        Self::Failed(e)
    }
}

/// The SSTable's columns in base-table terms.
struct Columns {
    /// Per output column (the base table's columns, in its order): the
    /// SSTable column to read, or `None` when the SSTable predates the
    /// column (written as nulls).
    read: Vec<Option<String>>,
    /// Output schema: the base table's columns (base names and types, no
    /// metadata). The same for every SSTable of a base, whatever schema
    /// version wrote it.
    out: SchemaRef,
    /// Positions (in `out`) of the primary-key columns.
    keys: Vec<usize>,
    /// Whether the SSTable has a `_tombstone` column.
    has_tombstone: bool,
}

impl Columns {
    /// The SSTable column names a scan projects (the present ones).
    fn present(&self, positions: &[usize]) -> Vec<String> {
        positions
            .iter()
            .filter_map(|&i| self.read[i].clone())
            .collect()
    }
}

/// Maps an SSTable's columns onto the base table's, by field id: a base
/// column the SSTable lacks (added after it was written) is read as nulls,
/// an SSTable column the base no longer has (dropped) is ignored. A
/// schema difference is never corruption; only a missing primary-key
/// column, or a missing column the base declares non-nullable, is refused.
fn columns(base: &Dataset, sst: &Dataset, uri: &str, dir: &str) -> Result<Columns> {
    // `_tombstone` is not a table column: its field id (the next free one
    // when the SSTable was written) may be a base column's added later.
    let sst_names: HashMap<i32, &str> = sst
        .schema()
        .fields
        .iter()
        .filter(|f| f.name != TOMBSTONE_COLUMN)
        .map(|f| (f.id, f.name.as_str()))
        .collect();
    let key_ids: Vec<i32> = base
        .schema()
        .unenforced_primary_key()
        .iter()
        .map(|f| f.id)
        .collect();
    let mut read = Vec::new();
    let mut fields = Vec::new();
    let mut keys = Vec::new();
    for f in &base.schema().fields {
        let arrow = Field::from(f);
        let present = sst_names.get(&f.id).map(|n| n.to_string());
        if key_ids.contains(&f.id) {
            if present.is_none() {
                return Err(CompactorError::Corrupt {
                    uri: uri.to_string(),
                    reason: format!(
                        "SSTable `{dir}` lacks primary-key column `{}` of the base table",
                        f.name
                    ),
                });
            }
            keys.push(read.len());
        }
        if present.is_none() && !arrow.is_nullable() {
            // A schema change, not damage: the column was added (as
            // non-nullable) after this SSTable was written.
            return Err(CompactorError::InvalidInput {
                uri: uri.to_string(),
                reason: format!(
                    "SSTable `{dir}` predates column `{}`, which the base table declares \
                     non-nullable: its rows have no value for it. Columns added while \
                     ingesting must be nullable (make it nullable to compact)",
                    f.name
                ),
            });
        }
        read.push(present);
        fields.push(Field::new(
            f.name.as_str(),
            arrow.data_type().clone(),
            arrow.is_nullable(),
        ));
    }
    let has_tombstone = sst
        .schema()
        .fields
        .iter()
        .any(|f| f.name == TOMBSTONE_COLUMN);
    Ok(Columns {
        read,
        out: Arc::new(Schema::new(fields)),
        keys,
        has_tombstone,
    })
}

/// Which rows of a scan a pass takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rows {
    Live,
    Tombstones,
}

/// A stream of the SSTable's visible rows of one kind, in physical order,
/// renamed to base names (`keys_only`: only the primary-key columns).
async fn rows(
    sst: &Dataset,
    cols: &Columns,
    kind: Rows,
    keys_only: bool,
    uri: &str,
    newest: Option<(Arc<Newest>, usize)>,
) -> Result<SendableRecordBatchStream> {
    let positions: Vec<usize> = if keys_only {
        cols.keys.clone()
    } else {
        (0..cols.read.len()).collect()
    };
    let mut project = cols.present(&positions);
    // Output column j comes from projected column `fill[j]`, or is nulls.
    let mut next = 0;
    let fill: Vec<Option<usize>> = positions
        .iter()
        .map(|&i| {
            cols.read[i].as_ref().map(|_| {
                next += 1;
                next - 1
            })
        })
        .collect();
    let out: SchemaRef = if keys_only {
        Arc::new(
            cols.out
                .project(&cols.keys)
                .expect("key positions are in range"),
        )
    } else {
        cols.out.clone()
    };
    if cols.has_tombstone {
        project.push(TOMBSTONE_COLUMN.to_string());
    }
    let mut scanner = sst.scan();
    scanner.scan_in_order(true);
    scanner.project(&project).map_err(CompactorError::lance(
        uri,
        format!("projecting SSTable `{}`", sst.uri()),
    ))?;
    let stream = scanner
        .try_into_stream()
        .await
        .map_err(CompactorError::lance(
            uri,
            format!("scanning SSTable `{}`", sst.uri()),
        ))?;
    let has_tombstone = cols.has_tombstone;
    let schema = out.clone();
    // Key columns are always present: their positions among the
    // projected columns.
    let key_positions: Vec<usize> = if keys_only {
        (0..cols.keys.len()).collect()
    } else {
        cols.keys
            .iter()
            .map(|&i| fill[i].expect("key columns are present"))
            .collect()
    };
    let mapped = stream
        .map_err(|e| DataFusionError::External(Box::new(e)))
        .and_then(move |batch| {
            let schema = schema.clone();
            let newest = newest.clone();
            let key_positions = key_positions.clone();
            let fill = fill.clone();
            async move {
                let n = batch.num_columns() - usize::from(has_tombstone);
                let selected = if has_tombstone {
                    let tomb = batch.column(n).as_boolean_opt().ok_or_else(|| {
                        DataFusionError::Execution("`_tombstone` is not boolean".into())
                    })?;
                    let want: BooleanArray = tomb
                        .iter()
                        .map(|t| Some(t.unwrap_or(false) == (kind == Rows::Tombstones)))
                        .collect();
                    let kept = RecordBatch::try_new(
                        batch.schema().project(&(0..n).collect::<Vec<_>>())?.into(),
                        batch.columns()[..n].to_vec(),
                    )?;
                    arrow_select_filter(&kept, &want)?
                } else if kind == Rows::Tombstones {
                    batch.slice(0, 0).project(&(0..n).collect::<Vec<_>>())?
                } else {
                    batch
                };
                let selected = match &newest {
                    None => selected,
                    Some((newest, idx)) => {
                        let keys: Vec<_> = key_positions
                            .iter()
                            .map(|&i| selected.column(i).clone())
                            .collect();
                        let keep = newest.keep(*idx, kind == Rows::Tombstones, &keys)?;
                        arrow_select_filter(&selected, &keep)?
                    }
                };
                let rows = selected.num_rows();
                let columns = fill
                    .iter()
                    .zip(schema.fields())
                    .map(|(at, f)| match at {
                        Some(j) => selected.column(*j).clone(),
                        None => arrow_array::new_null_array(f.data_type(), rows),
                    })
                    .collect();
                Ok(RecordBatch::try_new(schema, columns)?)
            }
        })
        .try_filter(|b| futures::future::ready(b.num_rows() > 0));
    Ok(Box::pin(RecordBatchStreamAdapter::new(out, mapped)))
}

fn arrow_select_filter(
    batch: &RecordBatch,
    keep: &BooleanArray,
) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
    arrow_select::filter::filter_record_batch(batch, keep)
}

/// Counts of visible rows by kind: (live, tombstones).
async fn counts(sst: &Dataset, cols: &Columns, uri: &str) -> Result<(u64, u64)> {
    let total = sst.count_rows(None).await.map_err(CompactorError::lance(
        uri,
        format!("counting the rows of SSTable `{}`", sst.uri()),
    ))? as u64;
    if !cols.has_tombstone {
        return Ok((total, 0));
    }
    let mut scanner = sst.scan();
    scanner
        .project(&[TOMBSTONE_COLUMN])
        .map_err(CompactorError::lance(
            uri,
            format!("projecting the tombstones of SSTable `{}`", sst.uri()),
        ))?;
    let mut stream = scanner
        .try_into_stream()
        .await
        .map_err(CompactorError::lance(
            uri,
            format!("scanning the tombstones of SSTable `{}`", sst.uri()),
        ))?;
    let mut tombstones = 0u64;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|e| {
            CompactorError::lance(
                uri,
                format!("scanning the tombstones of SSTable `{}`", sst.uri()),
            )(e)
        })?;
        let col = batch
            .column(0)
            .as_boolean_opt()
            .ok_or_else(|| CompactorError::Corrupt {
                uri: uri.to_string(),
                reason: "an SSTable's `_tombstone` column is not boolean".into(),
            })?;
        tombstones += col.true_count() as u64;
    }
    Ok((total.saturating_sub(tombstones), tombstones))
}

/// The rows of one kind of every group member, as one stream.
async fn group_rows(
    group: &[&Dataset],
    cols: &[Columns],
    kind: Rows,
    keys_only: bool,
    uri: &str,
    newest: &Option<Arc<Newest>>,
) -> Result<SendableRecordBatchStream> {
    let mut streams = Vec::with_capacity(group.len());
    for (i, sst) in group.iter().enumerate() {
        let keep = newest.clone().map(|n| (n, i));
        streams.push(rows(sst, &cols[i], kind, keys_only, uri, keep).await?);
    }
    let schema = streams[0].schema();
    Ok(Box::pin(RecordBatchStreamAdapter::new(
        schema,
        futures::stream::iter(streams).flatten(),
    )))
}

/// Merges the SSTable datasets of `group` into `base` in one set of
/// passes, committing against `base`'s version, with the marker of every
/// shard in `markers` (shard, the last generation of it in the group). The
/// group holds, per shard, consecutive generations oldest first; shards of
/// a group own disjoint keys (routed shards), or there is one shard. With
/// more than one member, each key's newest operation across the group is
/// the only one applied (last write wins across generations). `dirs` names
/// the SSTables in errors.
pub(crate) async fn merge_sstables(
    base: Arc<Dataset>,
    group: &[&Dataset],
    markers: &[(ShardId, u64)],
    dirs: &str,
    uri: &str,
) -> std::result::Result<(Arc<Dataset>, Merged), Attempt> {
    let shards = markers
        .iter()
        .map(|(s, _)| s.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let cols: Vec<Columns> = group
        .iter()
        .map(|sst| columns(&base, sst, uri, dirs))
        .collect::<Result<_>>()?;
    // Every member maps onto the base's columns (`out` is the same for
    // all); only the tombstone column must agree.
    if cols
        .iter()
        .any(|c| c.has_tombstone != cols[0].has_tombstone)
    {
        return Err(Attempt::Failed(CompactorError::Corrupt {
            uri: uri.to_string(),
            reason: format!(
                "SSTables {dirs} of shard(s) {shards} disagree on the `{TOMBSTONE_COLUMN}` column"
            ),
        }));
    }
    let marker: Vec<CompactedSsTable> = markers
        .iter()
        .map(|(shard, generation)| CompactedSsTable::new(shard.uuid(), *generation))
        .collect();
    let keyed = !base.schema().unenforced_primary_key().is_empty();
    let newest = if keyed && group.len() > 1 {
        let key_names: Vec<String> = cols[0]
            .keys
            .iter()
            .map(|&i| cols[0].read[i].clone().expect("key columns are present"))
            .collect();
        let key_types = cols[0]
            .keys
            .iter()
            .map(|&i| cols[0].out.field(i).data_type().clone())
            .collect();
        Some(Arc::new(
            Newest::build(group, &key_names, key_types, cols[0].has_tombstone, uri).await?,
        ))
    } else {
        None
    };
    let (live, tombstones) = match &newest {
        Some(n) => n.counts(),
        None => {
            let mut total = (0, 0);
            for (sst, c) in group.iter().zip(&cols) {
                let (l, t) = counts(sst, c, uri).await?;
                total = (total.0 + l, total.1 + t);
            }
            total
        }
    };
    let mut merged = Merged::default();
    if live == 0 && tombstones == 0 {
        let txn = Transaction::new(
            base.manifest.version,
            Operation::UpdateMemWalState {
                compacted_sstables: marker,
            },
            None,
        );
        let ds = CommitBuilder::new(base)
            .execute(txn)
            .await
            .map_err(Attempt::Commit)?;
        merged.commits = 1;
        return Ok((Arc::new(ds), merged));
    }
    if !keyed {
        if tombstones > 0 {
            return Err(Attempt::Failed(CompactorError::Corrupt {
                uri: uri.to_string(),
                reason: format!("SSTables {dirs} of an append-only table hold deletes"),
            }));
        }
        let source = group_rows(group, &cols, Rows::Live, false, uri, &None).await?;
        let ds = append(base, source, marker, uri).await?;
        merged.rows_written = live;
        merged.commits = 1;
        return Ok((ds, merged));
    }
    let key_names: Vec<String> = cols[0]
        .keys
        .iter()
        .map(|&i| cols[0].out.field(i).name().clone())
        .collect();
    let mut ds = base;
    if tombstones > 0 {
        let source = group_rows(group, &cols, Rows::Tombstones, true, uri, &newest).await?;
        let mut b = MergeInsertBuilder::try_new(ds.clone(), key_names.clone())
            .map_err(CompactorError::lance(uri, "planning the delete pass"))?;
        b.when_matched(WhenMatched::Delete)
            .when_not_matched(WhenNotMatched::DoNothing)
            .conflict_retries(0);
        if live == 0 {
            b.mark_sstables_as_compacted(marker.clone());
        }
        let job = b
            .try_build()
            .map_err(CompactorError::lance(uri, "planning the delete pass"))?;
        let (next, _) = job.execute(source).await.map_err(Attempt::Commit)?;
        ds = next;
        memwal_store::crash_point("compactor::between_passes");
        merged.tombstones = tombstones;
        merged.commits += 1;
    }
    if live > 0 {
        let source = group_rows(group, &cols, Rows::Live, false, uri, &newest).await?;
        if memwal_store::broken("broken::compactor_upsert_appends") {
            let ds = append(ds, source, marker, uri).await?;
            merged.rows_written = live;
            merged.commits += 1;
            return Ok((ds, merged));
        }
        let mut b = MergeInsertBuilder::try_new(ds.clone(), key_names)
            .map_err(CompactorError::lance(uri, "planning the upsert pass"))?;
        b.when_matched(WhenMatched::UpdateAll)
            .when_not_matched(WhenNotMatched::InsertAll)
            .conflict_retries(0)
            .mark_sstables_as_compacted(marker);
        let job = b
            .try_build()
            .map_err(CompactorError::lance(uri, "planning the upsert pass"))?;
        let (next, _) = job.execute(source).await.map_err(Attempt::Commit)?;
        ds = next;
        merged.rows_written = live;
        merged.commits += 1;
    }
    Ok((ds, merged))
}

/// Append-only: new fragments plus the marker in one `Update` commit.
async fn append(
    base: Arc<Dataset>,
    source: SendableRecordBatchStream,
    marker: Vec<CompactedSsTable>,
    uri: &str,
) -> std::result::Result<Arc<Dataset>, Attempt> {
    let params = WriteParams {
        mode: WriteMode::Append,
        ..Default::default()
    };
    let written = InsertBuilder::new(base.clone())
        .with_params(&params)
        .execute_uncommitted_stream(source)
        .await
        .map_err(CompactorError::lance(uri, "writing appended fragments"))?;
    let Operation::Append { fragments } = written.operation else {
        return Err(Attempt::Failed(CompactorError::Corrupt {
            uri: uri.to_string(),
            reason: format!("lance planned a `{}` for an append", written.operation),
        }));
    };
    let txn = Transaction::new(
        base.manifest.version,
        Operation::Update {
            removed_fragment_ids: Vec::new(),
            updated_fragments: Vec::new(),
            new_fragments: fragments,
            fields_modified: Vec::new(),
            compacted_sstables: marker,
            fields_for_preserving_frag_bitmap: Vec::new(),
            update_mode: None,
            inserted_rows_filter: None,
            updated_fragment_offsets: None,
        },
        None,
    );
    CommitBuilder::new(base)
        .execute(txn)
        .await
        .map(Arc::new)
        .map_err(Attempt::Commit)
}
