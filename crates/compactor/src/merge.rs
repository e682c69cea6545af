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
    /// SSTable column names to read, base names to write, for every
    /// non-tombstone column.
    read: Vec<String>,
    /// Output schema (base names, SSTable types, no metadata).
    out: SchemaRef,
    /// Positions (in `read`) of the primary-key columns.
    keys: Vec<usize>,
    /// Whether the SSTable has a `_tombstone` column.
    has_tombstone: bool,
}

fn columns(base: &Dataset, sst: &Dataset, uri: &str, dir: &str) -> Result<Columns> {
    let base_names: HashMap<i32, &str> = base
        .schema()
        .fields
        .iter()
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
    let mut has_tombstone = false;
    for f in &sst.schema().fields {
        if f.name == TOMBSTONE_COLUMN {
            has_tombstone = true;
            continue;
        }
        let name = base_names
            .get(&f.id)
            .ok_or_else(|| CompactorError::Corrupt {
                uri: uri.to_string(),
                reason: format!(
                    "SSTable `{dir}` column `{}` (field id {}) has no base-table field",
                    f.name, f.id
                ),
            })?;
        if key_ids.contains(&f.id) {
            keys.push(read.len());
        }
        read.push(f.name.clone());
        let arrow = Field::from(f);
        fields.push(Field::new(
            *name,
            arrow.data_type().clone(),
            arrow.is_nullable(),
        ));
    }
    if keys.len() != key_ids.len() {
        return Err(CompactorError::Corrupt {
            uri: uri.to_string(),
            reason: format!("SSTable `{dir}` lacks primary-key columns of the base table"),
        });
    }
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
    let mut project: Vec<String> = if keys_only {
        cols.keys.iter().map(|&i| cols.read[i].clone()).collect()
    } else {
        cols.read.clone()
    };
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
    let key_positions: Vec<usize> = if keys_only {
        (0..cols.keys.len()).collect()
    } else {
        cols.keys.clone()
    };
    let mapped = stream
        .map_err(|e| DataFusionError::External(Box::new(e)))
        .and_then(move |batch| {
            let schema = schema.clone();
            let newest = newest.clone();
            let key_positions = key_positions.clone();
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
                Ok(RecordBatch::try_new(schema, selected.columns().to_vec())?)
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

/// Merges the SSTable datasets of `group` (consecutive generations of
/// `shard`, oldest first, the last one `generation`; `dirs` names them)
/// into `base` in one set of passes, committing against `base`'s version.
/// With more than one member, each key's newest operation across the group
/// is the only one applied (last write wins across generations).
pub(crate) async fn merge_sstables(
    base: Arc<Dataset>,
    group: &[&Dataset],
    shard: ShardId,
    generation: u64,
    dirs: &str,
    uri: &str,
) -> std::result::Result<(Arc<Dataset>, Merged), Attempt> {
    let cols: Vec<Columns> = group
        .iter()
        .map(|sst| columns(&base, sst, uri, dirs))
        .collect::<Result<_>>()?;
    if cols
        .iter()
        .any(|c| c.out != cols[0].out || c.has_tombstone != cols[0].has_tombstone)
    {
        return Err(Attempt::Failed(CompactorError::Corrupt {
            uri: uri.to_string(),
            reason: format!("SSTables {dirs} of shard {shard} differ in their columns"),
        }));
    }
    let marker = vec![CompactedSsTable::new(shard.uuid(), generation)];
    let keyed = !base.schema().unenforced_primary_key().is_empty();
    let newest = if keyed && group.len() > 1 {
        let key_names: Vec<String> = cols[0]
            .keys
            .iter()
            .map(|&i| cols[0].read[i].clone())
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
