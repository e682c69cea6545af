//! Last-write-wins across several generations merged in one commit: which
//! generation holds each key's newest operation, and whether it is a
//! delete.

use std::collections::HashMap;

use arrow_array::cast::AsArray;
use arrow_array::{ArrayRef, BooleanArray};
use arrow_row::{OwnedRow, RowConverter, SortField};
use futures::StreamExt;
use lance::Dataset;
use memwal_memtable::TOMBSTONE_COLUMN;

use crate::{CompactorError, Result};

/// Each key's newest operation over a group of generations (index into the
/// group, tombstone or not).
pub(crate) struct Newest {
    converter: RowConverter,
    newest: HashMap<OwnedRow, (usize, bool)>,
}

impl Newest {
    /// Scans the key columns (`keys`: SSTable column names) and tombstones of
    /// every SSTable of the group, oldest first.
    pub(crate) async fn build(
        group: &[&Dataset],
        keys: &[String],
        key_types: Vec<arrow_schema::DataType>,
        has_tombstone: bool,
        uri: &str,
    ) -> Result<Self> {
        let converter = RowConverter::new(key_types.into_iter().map(SortField::new).collect())
            .map_err(|e| {
                CompactorError::invalid(uri, format!("primary key not comparable: {e}"))
            })?;
        let mut newest = HashMap::new();
        let mut project: Vec<&str> = keys.iter().map(String::as_str).collect();
        if has_tombstone {
            project.push(TOMBSTONE_COLUMN);
        }
        for (idx, sst) in group.iter().enumerate() {
            let mut scanner = sst.scan();
            scanner.project(&project).map_err(CompactorError::lance(
                uri,
                format!("projecting the keys of SSTable `{}`", sst.uri()),
            ))?;
            let mut stream = scanner
                .try_into_stream()
                .await
                .map_err(CompactorError::lance(
                    uri,
                    format!("scanning the keys of SSTable `{}`", sst.uri()),
                ))?;
            while let Some(batch) = stream.next().await {
                let batch = batch.map_err(|e| {
                    CompactorError::lance(
                        uri,
                        format!("scanning the keys of SSTable `{}`", sst.uri()),
                    )(e)
                })?;
                let n = keys.len();
                let rows = converter
                    .convert_columns(&batch.columns()[..n])
                    .map_err(|e| CompactorError::invalid(uri, format!("SSTable keys: {e}")))?;
                let tomb = if has_tombstone {
                    Some(batch.column(n).as_boolean_opt().ok_or_else(|| {
                        CompactorError::Corrupt {
                            uri: uri.to_string(),
                            reason: "an SSTable's `_tombstone` column is not boolean".into(),
                        }
                    })?)
                } else {
                    None
                };
                for i in 0..batch.num_rows() {
                    let t = tomb.is_some_and(|t| t.value(i));
                    newest.insert(rows.row(i).owned(), (idx, t));
                }
            }
        }
        Ok(Self { converter, newest })
    }

    /// (keys whose newest operation is a put, ... a delete).
    pub(crate) fn counts(&self) -> (u64, u64) {
        let deletes = self.newest.values().filter(|(_, t)| *t).count() as u64;
        (self.newest.len() as u64 - deletes, deletes)
    }

    /// Which rows of `keys` (from group member `idx`, all of kind
    /// `tombstone`) are their key's newest operation.
    pub(crate) fn keep(
        &self,
        idx: usize,
        tombstone: bool,
        keys: &[ArrayRef],
    ) -> std::result::Result<BooleanArray, arrow_schema::ArrowError> {
        let rows = self.converter.convert_columns(keys)?;
        Ok((0..rows.num_rows())
            .map(|i| {
                Some(
                    self.newest
                        .get(&rows.row(i).owned())
                        .is_some_and(|&(j, t)| j == idx && t == tombstone),
                )
            })
            .collect())
    }
}
