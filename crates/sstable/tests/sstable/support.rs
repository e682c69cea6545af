//! Shared fixtures: table schemas with non-contiguous field ids, local
//! tables in temp directories, memtables built from put/delete operations.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use memwal_fencing::{ShardId, ShardLayout};
use memwal_memtable::{FlushData, MemTable, TableSchema};
use memwal_sstable::{LanceFileVersion, SsTableWriter, WrittenSsTable};
use object_store::path::Path;
use object_store::ObjectStore;
use tempfile::TempDir;

/// A column with a field id and, for key columns, its key position.
pub fn field(name: &str, dt: DataType, id: i32, key_pos: Option<u32>) -> Field {
    let mut md = HashMap::from([("lance:field_id".to_string(), id.to_string())]);
    if let Some(pos) = key_pos {
        md.insert(
            "lance-schema:unenforced-primary-key".to_string(),
            "true".to_string(),
        );
        md.insert(
            "lance-schema:unenforced-primary-key:position".to_string(),
            pos.to_string(),
        );
    }
    Field::new(name, dt, key_pos.is_none()).with_metadata(md)
}

/// `id` Int64 key (field id 3), `name` Utf8 (7), `v` Int32 (11).
pub fn int_schema() -> Arc<TableSchema> {
    Arc::new(
        TableSchema::new(Arc::new(Schema::new(vec![
            field("id", DataType::Int64, 3, Some(1)),
            field("name", DataType::Utf8, 7, None),
            field("v", DataType::Int32, 11, None),
        ])))
        .unwrap(),
    )
}

/// `k` Utf8 key (field id 2), `n` Int64 (5).
pub fn utf8_schema() -> Arc<TableSchema> {
    Arc::new(
        TableSchema::new(Arc::new(Schema::new(vec![
            field("k", DataType::Utf8, 2, Some(1)),
            field("n", DataType::Int64, 5, None),
        ])))
        .unwrap(),
    )
}

/// Composite key (`tenant` Utf8 position 1, field id 4; `id` Int64
/// position 2, field id 1) and `val` Utf8 (9). Column order differs from
/// key order on purpose.
pub fn composite_schema() -> Arc<TableSchema> {
    Arc::new(
        TableSchema::new(Arc::new(Schema::new(vec![
            field("id", DataType::Int64, 1, Some(2)),
            field("tenant", DataType::Utf8, 4, Some(1)),
            field("val", DataType::Utf8, 9, None),
        ])))
        .unwrap(),
    )
}

/// A user batch for [`int_schema`].
pub fn int_rows(schema: &TableSchema, ids: &[i64], v: i32) -> RecordBatch {
    let names: Vec<String> = ids.iter().map(|i| format!("name-{i}-{v}")).collect();
    RecordBatch::try_new(
        schema.table_schema().clone(),
        vec![
            Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
            Arc::new(StringArray::from(names)),
            Arc::new(Int32Array::from(vec![v; ids.len()])),
        ],
    )
    .unwrap()
}

/// A key-only batch (for deletes) of `schema` from columns by name.
pub fn keys_batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
    RecordBatch::try_from_iter(columns).unwrap()
}

/// A table rooted in a temp directory, through memwal's own local store
/// (fsync on), with one shard.
pub struct LocalTable {
    pub dir: TempDir,
    pub store: Arc<dyn ObjectStore>,
    pub layout: ShardLayout,
    pub shard: ShardId,
}

impl LocalTable {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let loc = memwal_store::open_store(dir.path().to_str().unwrap()).unwrap();
        let shard = ShardId::random();
        let layout = ShardLayout::new(&loc.root, shard);
        Self {
            dir,
            store: loc.store,
            layout,
            shard,
        }
    }

    /// The table root as a plain path (what upstream lance opens).
    pub fn uri(&self) -> String {
        self.dir.path().to_str().unwrap().to_string()
    }

    pub fn writer(&self) -> SsTableWriter {
        SsTableWriter::new(
            self.store.clone(),
            self.layout.clone(),
            LanceFileVersion::V2_2,
        )
    }

    /// The on-disk directory of an SSTable.
    pub fn sstable_fs_dir(&self, written: &WrittenSsTable) -> std::path::PathBuf {
        let mut p = self.dir.path().to_path_buf();
        for part in written.dir.parts() {
            p.push(part.as_ref());
        }
        p
    }
}

/// One memtable operation.
#[derive(Debug, Clone)]
pub enum Op {
    Put(RecordBatch),
    Delete(RecordBatch),
}

/// The flush data of a memtable that saw `ops`.
pub fn flush(schema: &Arc<TableSchema>, ops: &[Op]) -> FlushData {
    let mut mt = MemTable::new(schema.clone());
    for op in ops {
        match op {
            Op::Put(b) => {
                mt.insert(b).unwrap();
            }
            Op::Delete(k) => {
                mt.delete(k).unwrap();
            }
        }
    }
    mt.freeze().flush_data().unwrap()
}

/// Every file below `dir` on disk, relative to `root`, `/`-separated.
pub fn files_below(root: &std::path::Path, dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let p = entry.path();
            if entry.file_type().unwrap().is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap();
                out.push(
                    rel.components()
                        .map(|c| c.as_os_str().to_str().unwrap().to_string())
                        .collect::<Vec<_>>()
                        .join("/"),
                );
            }
        }
    }
    out.sort();
    out
}

/// A store path's string form.
pub fn p(path: &Path) -> String {
    path.to_string()
}
