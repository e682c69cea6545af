//! Primary-key lookups: the rows of given keys as of now, without reading
//! the whole table, newest level first. Unflushed rows come from the
//! writers' snapshots (only the requested keys kept); a key they hold (a
//! row or a delete) is answered there and the published levels are not
//! read for it. When they answer every key, only the answering shards'
//! latest manifests are read (is each writer still the owner?), not the
//! view. Otherwise the view, read after the snapshots, drops a fenced
//! writer's rows, and the other keys are read from its SSTables, newest
//! generation first, each through its bloom filter and `_pk_index`
//! (opened once, kept while listed), then from the base (a filtered scan
//! on the key columns). The
//! snapshot rules are those of [`TableHost::read_rows`]
//! (docs/design/fresh-reads.md). Composite keys are looked up as tuples.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, RecordBatch};
use arrow_row::{RowConverter, SortField};
use arrow_schema::SchemaRef;
use datafusion::logical_expr::{col, lit, Expr};
use datafusion::scalar::ScalarValue;
use futures::TryStreamExt;
use memwal_memtable::key_codec::value_at;
use memwal_sstable::{Lookup, SsTableReader};

use crate::{ServerError, TableHost};

/// SSTables opened for lookups, by shard and directory name.
pub(crate) type OpenSsTables =
    parking_lot::Mutex<HashMap<(memwal::ShardId, String), Arc<SsTableReader>>>;

/// Keys to look up: one tuple of values per key, in primary-key order.
pub type KeyTuples = Vec<Vec<ScalarValue>>;

impl TableHost {
    /// The live rows whose one-column primary key is in `keys`: see
    /// [`Self::lookup_keys`].
    pub async fn lookup_rows(&self, keys: &[ScalarValue]) -> Result<RecordBatch, ServerError> {
        let tuples: KeyTuples = keys.iter().map(|k| vec![k.clone()]).collect();
        self.lookup_keys(&tuples).await
    }

    /// The live rows whose primary key is one of `keys` (each a tuple in
    /// primary-key order), as of now: every put acknowledged before the
    /// call, the newest value per key, deleted and missing keys absent.
    /// Values of another type than their key column are cast to it; a key
    /// with a null value matches nothing. [`ServerError::InvalidInput`]
    /// for a table without a primary key, or a tuple of the wrong length.
    pub async fn lookup_keys(&self, keys: &[Vec<ScalarValue>]) -> Result<RecordBatch, ServerError> {
        let invalid = |reason: String| ServerError::InvalidInput {
            table: self.name().to_string(),
            reason,
        };
        let key_schema = self.key_schema();
        let key_names: Vec<String> = key_schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        if key_names.is_empty() {
            return Err(invalid(
                "a key lookup needs a primary key; the table has none".into(),
            ));
        }
        let keys = cast_keys(keys, &key_schema)
            .map_err(|e| invalid(format!("lookup keys for ({}): {e}", key_names.join(", "))))?;
        self.reader()
            .lookups
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        metrics::counter!("memwal_server_reads_total", "table" => self.name().to_string(), "kind" => "lookup")
            .increment(1);
        let schema = self.schema();
        if keys.is_empty() {
            // Only keys with nulls: nothing to read.
            return Ok(RecordBatch::new_empty(schema));
        }
        let failed = |what: &str, e: String| ServerError::Setup {
            table: self.name().to_string(),
            reason: format!("{what}: {e}"),
        };
        let wanted = key_columns(&keys, key_names.len()).map_err(|e| failed("lookup keys", e))?;
        let wanted = WantedKeys::new(&wanted).map_err(|e| failed("lookup keys", e))?;
        // When the writers' unflushed rows answer every key, only those
        // writers' epochs need checking (their shards' latest manifests):
        // the published levels hold older versions of those keys at most.
        let snapshots = self.snapshots()?;
        let (unflushed, answering) = self.unflushed_of(&snapshots, &wanted, &key_names).await?;
        let remaining = unanswered(&keys, &unflushed, &key_names)
            .map_err(|e| failed("filtering unflushed rows", e))?;
        if remaining.is_empty() && self.still_own(&snapshots, &answering).await? {
            let none = RecordBatch::new_empty(schema.clone());
            return crate::reader::snapshot::merge(&schema, &key_names, &none, &unflushed)
                .map_err(|e| failed("merging the levels", e));
        }
        // Otherwise the view too, read after the snapshots: it tells which
        // snapshots are of fenced writers (dropped: their rows may be
        // stale) and holds the published levels.
        let (snapshots, view) = self.snapshot_and_view(None).await?;
        let (unflushed, _) = self.unflushed_of(&snapshots, &wanted, &key_names).await?;
        // A key with an unflushed row (or delete) is answered by it: the
        // published levels hold only older versions of it.
        let remaining = unanswered(&keys, &unflushed, &key_names)
            .map_err(|e| failed("filtering unflushed rows", e))?;
        let published = if remaining.is_empty() {
            RecordBatch::new_empty(schema.clone())
        } else {
            self.lookup_published(&view, &key_names, &remaining).await?
        };
        crate::reader::snapshot::merge(&schema, &key_names, &published, &unflushed)
            .map_err(|e| failed("merging the levels", e))
    }

    /// The rows of `wanted` keys in `snapshots`' unflushed batches (in
    /// WAL order per shard), and the shards they came from.
    async fn unflushed_of(
        &self,
        snapshots: &crate::reader::snapshot::Snapshots,
        wanted: &WantedKeys,
        key_names: &[String],
    ) -> Result<(Vec<RecordBatch>, Vec<memwal::ShardId>), ServerError> {
        let mut unflushed = Vec::new();
        let mut answering = Vec::new();
        for s in snapshots.values() {
            for b in &s.batches {
                let kept = wanted
                    .rows_of(b, key_names)
                    .map_err(|e| ServerError::Setup {
                        table: self.name().to_string(),
                        reason: format!("filtering unflushed rows: {e}"),
                    })?;
                if let Some(kept) = kept {
                    unflushed.push(kept);
                    if answering.last() != Some(&s.shard) {
                        answering.push(s.shard);
                    }
                }
                // One batch at a time: a lookup over many unflushed
                // batches lets other queries run, and its deadline cut it.
                tokio::task::yield_now().await;
            }
        }
        Ok((unflushed, answering))
    }

    /// Whether each of `shards` is still owned by the writer its snapshot
    /// in `snapshots` was taken from: its latest manifest, read now, names
    /// that writer's epoch. `false` sends the lookup to the full view,
    /// which drops a fenced writer's rows and reads its shard as
    /// published.
    async fn still_own(
        &self,
        snapshots: &crate::reader::snapshot::Snapshots,
        shards: &[memwal::ShardId],
    ) -> Result<bool, ServerError> {
        for shard in shards {
            let Some(s) = snapshots.get(shard) else {
                return Ok(false);
            };
            let epoch = self
                .reader()
                .owners
                .epoch(self.loc(), *shard)
                .await
                .map_err(|e| ServerError::Read {
                    table: self.name().to_string(),
                    what: "reading a shard's manifest",
                    source: memwal_table::TableError::Manifest {
                        uri: self.loc().uri.clone(),
                        shard: *shard,
                        source: Box::new(e),
                    },
                })?;
            if epoch != Some(s.epoch) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The published rows of `keys` (in the table's schema, one per key
    /// found, deletes left out): per key, the newest SSTable of the view
    /// holding it (by generation, as upstream's planners order levels)
    /// answers, through its bloom filter and `_pk_index`; keys no SSTable
    /// holds are read from the base.
    async fn lookup_published(
        &self,
        view: &memwal_table::TableView,
        key_names: &[String],
        keys: &[Vec<ScalarValue>],
    ) -> Result<RecordBatch, ServerError> {
        let failed = |what: &str, e: String| ServerError::Setup {
            table: self.name().to_string(),
            reason: format!("{what}: {e}"),
        };
        let schema = self.schema();
        let validator = self.shape().validator.clone();
        let mut tables: Vec<(u64, memwal::ShardId, String)> = view
            .shards
            .iter()
            .flat_map(|s| {
                s.sstables
                    .iter()
                    .map(|t| (t.generation, s.shard, t.path.clone()))
            })
            .collect();
        tables.sort_by_key(|t| std::cmp::Reverse(t.0));
        self.reader()
            .sstables
            .lock()
            .retain(|(shard, path), _| tables.iter().any(|t| t.1 == *shard && t.2 == *path));
        let wanted = key_columns(keys, key_names.len()).map_err(|e| failed("lookup keys", e))?;
        let mut found: Vec<RecordBatch> = Vec::new();
        let mut in_base: KeyTuples = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let value = wanted
                .iter()
                .map(|c| value_at(c.as_ref(), i))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| failed("lookup keys", format!("{k:?}: not a key type")))?;
            let mut answered = false;
            for (_, shard, path) in &tables {
                let reader = self.open_sstable(*shard, path, &validator).await?;
                match reader
                    .get(&value)
                    .await
                    .map_err(|e| failed("looking up published rows", e.to_string()))?
                {
                    Lookup::Absent => continue,
                    Lookup::Deleted => {}
                    Lookup::Row(b) => found.push(stamped(&b, reader.dataset())),
                }
                answered = true;
                break;
            }
            if !answered {
                in_base.push(k.clone());
            }
        }
        if !in_base.is_empty() {
            found.extend(
                base_rows(&view.base, key_names, &in_base)
                    .await
                    .map_err(|e| failed("looking up base rows", e))?,
            );
        }
        let projected = found
            .iter()
            .map(|b| {
                let columns = schema
                    .fields()
                    .iter()
                    .map(|f| crate::reader::snapshot::column_or_nulls(b, f))
                    .collect();
                RecordBatch::try_new(schema.clone(), columns)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| failed("reading published rows", e.to_string()))?;
        arrow_select::concat::concat_batches(&schema, &projected)
            .map_err(|e| failed("reading published rows", e.to_string()))
    }

    /// SSTable `path` of `shard`, opened once.
    async fn open_sstable(
        &self,
        shard: memwal::ShardId,
        path: &str,
        schema: &memwal_memtable::TableSchema,
    ) -> Result<Arc<SsTableReader>, ServerError> {
        let id = (shard, path.to_string());
        if let Some(r) = self.reader().sstables.lock().get(&id) {
            return Ok(r.clone());
        }
        let layout = memwal_fencing::ShardLayout::new(&self.loc().root, shard);
        let lance = memwal_sstable::LanceStore::new(self.loc().store.clone());
        let reader = SsTableReader::open(&lance, &layout, path, schema)
            .await
            .map_err(|e| ServerError::Setup {
                table: self.name().to_string(),
                reason: format!("opening SSTable {path} of shard {shard}: {e}"),
            })?;
        let reader = Arc::new(reader);
        self.reader().sstables.lock().insert(id, reader.clone());
        Ok(reader)
    }
}

/// `b` (read from `ds`) with each column's Lance field id in its metadata,
/// so a column renamed since the SSTable was written is matched by id.
fn stamped(b: &RecordBatch, ds: &lance::Dataset) -> RecordBatch {
    let ids = lance::dataset::mem_wal::arrow_schema_with_field_ids(ds.schema());
    let fields: Vec<arrow_schema::Field> = b
        .schema()
        .fields()
        .iter()
        .map(|f| match ids.field_with_name(f.name()) {
            Ok(g) => f.as_ref().clone().with_metadata(g.metadata().clone()),
            Err(_) => f.as_ref().clone(),
        })
        .collect();
    RecordBatch::try_new(
        Arc::new(arrow_schema::Schema::new(fields)),
        b.columns().to_vec(),
    )
    .unwrap_or_else(|_| b.clone())
}

/// The base rows of `keys`: a scan filtered on the key columns (the base
/// holds each key once).
async fn base_rows(
    base: &lance::Dataset,
    key_names: &[String],
    keys: &[Vec<ScalarValue>],
) -> Result<Vec<RecordBatch>, String> {
    let filter = match key_names {
        [one] => col(one.as_str()).in_list(keys.iter().map(|k| lit(k[0].clone())).collect(), false),
        _ => any_of(
            keys.iter()
                .map(|k| {
                    key_names
                        .iter()
                        .zip(k)
                        .map(|(n, v)| col(n.as_str()).eq(lit(v.clone())))
                        .reduce(Expr::and)
                        .unwrap_or_else(|| lit(false))
                })
                .collect(),
        ),
    };
    let mut scanner = base.scan();
    scanner.filter_expr(filter);
    scanner
        .try_into_stream()
        .await
        .map_err(|e| e.to_string())?
        .try_collect()
        .await
        .map_err(|e| e.to_string())
}

/// `exprs` `OR`ed as a balanced tree (`false` for none): its depth grows
/// with the log of their number, so a lookup of many composite keys never
/// hands the base's planner (which walks a filter recursively) a chain as
/// deep as the keys are many.
fn any_of(mut exprs: Vec<Expr>) -> Expr {
    while exprs.len() > 1 {
        let mut paired = Vec::with_capacity(exprs.len().div_ceil(2));
        let mut rest = exprs.into_iter();
        while let Some(a) = rest.next() {
            paired.push(match rest.next() {
                Some(b) => a.or(b),
                None => a,
            });
        }
        exprs = paired;
    }
    exprs.pop().unwrap_or_else(|| lit(false))
}

/// `keys` cast to the key columns' types; tuples with a null left out.
fn cast_keys(keys: &[Vec<ScalarValue>], key_schema: &SchemaRef) -> Result<KeyTuples, String> {
    let fields = key_schema.fields();
    let mut out = Vec::with_capacity(keys.len());
    for k in keys {
        if k.len() != fields.len() {
            return Err(format!(
                "a key has {} values, the primary key {} columns",
                k.len(),
                fields.len()
            ));
        }
        if k.iter().any(ScalarValue::is_null) {
            continue;
        }
        let cast = k
            .iter()
            .zip(fields.iter())
            .map(|(v, f)| v.cast_to(f.data_type()).map_err(|e| format!("{v}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        out.push(cast);
    }
    Ok(out)
}

/// One array per key column: column `j` holds value `j` of every tuple.
fn key_columns(keys: &[Vec<ScalarValue>], width: usize) -> Result<Vec<ArrayRef>, String> {
    (0..width)
        .map(|j| {
            ScalarValue::iter_to_array(keys.iter().map(|k| k[j].clone())).map_err(|e| e.to_string())
        })
        .collect()
}

/// The keys of `keys` that no row (or delete) of `unflushed` answers.
fn unanswered(
    keys: &[Vec<ScalarValue>],
    unflushed: &[RecordBatch],
    key_names: &[String],
) -> Result<KeyTuples, String> {
    let mut answered: HashSet<Vec<ScalarValue>> = HashSet::new();
    for b in unflushed {
        answered.extend(tuples_of(b, key_names)?);
    }
    Ok(keys
        .iter()
        .filter(|k| !answered.contains(*k))
        .cloned()
        .collect())
}

/// The key tuples of `batch`'s rows.
fn tuples_of(batch: &RecordBatch, key_names: &[String]) -> Result<Vec<Vec<ScalarValue>>, String> {
    let columns = key_names
        .iter()
        .map(|k| {
            batch
                .column_by_name(k)
                .ok_or_else(|| format!("an unflushed batch lacks the key column `{k}`"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    (0..batch.num_rows())
        .map(|i| {
            columns
                .iter()
                .map(|c| ScalarValue::try_from_array(c, i).map_err(|e| e.to_string()))
                .collect()
        })
        .collect()
}

/// At most this many keys are matched against unflushed rows by
/// comparing each key column with each key (vectorised); more, by
/// hashing each row's key.
const FEW_KEYS: usize = 16;

/// The keys a lookup wants, to keep the matching rows of unflushed
/// batches.
enum WantedKeys {
    /// Each key as one single-row array per key column.
    Few(Vec<Vec<ArrayRef>>),
    /// Each key's row encoding.
    Many {
        converter: RowConverter,
        rows: HashSet<Box<[u8]>>,
    },
}

impl WantedKeys {
    /// The keys of `wanted` (one array per key column).
    fn new(wanted: &[ArrayRef]) -> Result<Self, String> {
        let count = wanted.first().map_or(0, |c| c.len());
        if count <= FEW_KEYS {
            return Ok(Self::few(wanted));
        }
        Self::hashed(wanted)
    }

    /// [`Self::Few`] of `wanted`.
    fn few(wanted: &[ArrayRef]) -> Self {
        let count = wanted.first().map_or(0, |c| c.len());
        Self::Few(
            (0..count)
                .map(|k| wanted.iter().map(|c| c.slice(k, 1)).collect())
                .collect(),
        )
    }

    /// [`Self::Many`] of `wanted`.
    fn hashed(wanted: &[ArrayRef]) -> Result<Self, String> {
        let converter = RowConverter::new(
            wanted
                .iter()
                .map(|c| SortField::new(c.data_type().clone()))
                .collect(),
        )
        .map_err(|e| e.to_string())?;
        let rows = converter
            .convert_columns(wanted)
            .map_err(|e| e.to_string())?
            .iter()
            .map(|r| r.as_ref().into())
            .collect();
        Ok(Self::Many { converter, rows })
    }

    /// The rows of `batch` whose key is wanted; `None` when there are
    /// none.
    fn rows_of(
        &self,
        batch: &RecordBatch,
        key_names: &[String],
    ) -> Result<Option<RecordBatch>, String> {
        let columns = key_names
            .iter()
            .map(|k| {
                batch
                    .column_by_name(k)
                    .cloned()
                    .ok_or_else(|| format!("an unflushed batch lacks the key column `{k}`"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let keep = match self {
            Self::Few(keys) => few_matches(&columns, keys, batch.num_rows())?,
            Self::Many { converter, rows } => converter
                .convert_columns(&columns)
                .map_err(|e| e.to_string())?
                .iter()
                .map(|r| Some(rows.contains(r.as_ref())))
                .collect(),
        };
        if keep.true_count() == 0 {
            return Ok(None);
        }
        arrow_select::filter::filter_record_batch(batch, &keep)
            .map(Some)
            .map_err(|e| e.to_string())
    }
}

/// Which rows of `columns` (a batch's key columns, `len` rows) hold one of
/// `keys`: per key, every column equal to its value; any key. Key columns
/// hold no nulls.
fn few_matches(
    columns: &[ArrayRef],
    keys: &[Vec<ArrayRef>],
    len: usize,
) -> Result<BooleanArray, String> {
    use datafusion::arrow::array::Scalar;
    use datafusion::arrow::compute::kernels::cmp::eq;
    use datafusion::arrow::compute::{and, or};
    let mut any = BooleanArray::from(vec![false; len]);
    for key in keys {
        let mut all: Option<BooleanArray> = None;
        for (column, value) in columns.iter().zip(key) {
            let same = eq(column, &Scalar::new(value.clone())).map_err(|e| e.to_string())?;
            all = Some(match all {
                None => same,
                Some(a) => and(&a, &same).map_err(|e| e.to_string())?,
            });
        }
        if let Some(all) = all {
            any = or(&any, &all).map_err(|e| e.to_string())?;
        }
    }
    Ok(any)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, StringArray};

    // Breaks if matching a few keys by comparing columns keeps other rows
    // than matching them by hashing: one-column and two-column keys, keys
    // present once, twice and not at all.
    #[test]
    fn few_keys_match_the_rows_hashing_matches() {
        let ids: Vec<i64> = (0..1000).map(|i| i % 700).collect();
        let tags: Vec<String> = (0..1000).map(|i| format!("t{}", i % 3)).collect();
        let batch = RecordBatch::try_from_iter(vec![
            ("id", Arc::new(Int64Array::from(ids)) as ArrayRef),
            ("tag", Arc::new(StringArray::from(tags)) as ArrayRef),
        ])
        .unwrap();
        let one = vec![Arc::new(Int64Array::from(vec![3, 650, 699, 5000])) as ArrayRef];
        let two = vec![
            Arc::new(Int64Array::from(vec![3, 650, 4, 7])) as ArrayRef,
            Arc::new(StringArray::from(vec!["t0", "t2", "t1", "t0"])) as ArrayRef,
        ];
        for (wanted, names) in [
            (one, vec!["id".to_string()]),
            (two, vec!["id".to_string(), "tag".to_string()]),
        ] {
            let few = WantedKeys::few(&wanted).rows_of(&batch, &names).unwrap();
            let hashed = WantedKeys::hashed(&wanted)
                .unwrap()
                .rows_of(&batch, &names)
                .unwrap();
            assert!(few.as_ref().is_some_and(|b| b.num_rows() > 0), "{names:?}");
            assert_eq!(few, hashed, "{names:?}");
        }
    }
}
