//! How SSTable data files are encoded (`SsTableCompression`): off by
//! default, lance's choices on request; the manifest schema is the table's
//! either way and both read back the same rows.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray};
use lance::dataset::Dataset;
use memwal_sstable::{SsTableCompression, SsTableReader, WrittenSsTable};

use crate::support::*;

const ROWS: i64 = 20_000;

/// Rows whose `name` is 200 bytes of highly repetitive text: lance's
/// default encoding (FSST) shrinks them several times over.
fn compressible_rows(schema: &memwal_memtable::TableSchema) -> RecordBatch {
    let ids: Vec<i64> = (0..ROWS).collect();
    let names: Vec<String> = ids
        .iter()
        .map(|i| format!("{}{i:08}", "the quick brown fox jumps over ".repeat(6)))
        .collect();
    RecordBatch::try_new(
        schema.table_schema().clone(),
        vec![
            Arc::new(Int64Array::from(ids)) as ArrayRef,
            Arc::new(StringArray::from(names)),
            Arc::new(Int32Array::from(vec![7; ROWS as usize])),
        ],
    )
    .unwrap()
}

/// lance-encoding's per-field compression key, which the writer sets on
/// the data file's fields only.
const COMPRESSION_KEY: &str = "lance-encoding:compression";

/// Every field's (nested ones too) name and metadata.
fn field_metadata(schema: &arrow_schema::Schema) -> Vec<(String, HashMap<String, String>)> {
    fn walk(f: &arrow_schema::Field, out: &mut Vec<(String, HashMap<String, String>)>) {
        out.push((f.name().clone(), f.metadata().clone()));
        if let arrow_schema::DataType::Struct(children) = f.data_type() {
            children.iter().for_each(|c| walk(c, out));
        }
    }
    let mut out = Vec::new();
    schema.fields().iter().for_each(|f| walk(f, &mut out));
    out
}

/// Bytes of the data files (`data/*.lance`) of an SSTable.
fn data_file_bytes(t: &LocalTable, written: &WrittenSsTable) -> u64 {
    let data = t.sstable_fs_dir(written).join("data");
    std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

// Breaks if the default stops turning compression off (its data file would
// be several times smaller than the raw strings), if `Lance` stops using
// lance's compression (both files would be the same size), if the encoding
// metadata leaks into the manifest schema that readers see, or if either
// encoding reads back different rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_writes_uncompressed_data_files_with_the_tables_schema() {
    let t = LocalTable::new();
    let schema = int_schema();
    let batch = compressible_rows(&schema);
    let raw_name_bytes: u64 = (ROWS as u64) * 188;
    let data = flush(&schema, &[Op::Put(batch)]);

    let off = t.writer().write(&schema, 1, &data).await.unwrap();
    let lance = t
        .writer()
        .with_compression(SsTableCompression::Lance)
        .write(&schema, 2, &data)
        .await
        .unwrap();

    let off_bytes = data_file_bytes(&t, &off);
    let lance_bytes = data_file_bytes(&t, &lance);
    assert!(
        off_bytes >= raw_name_bytes,
        "uncompressed data file {off_bytes} B < {raw_name_bytes} B of strings"
    );
    assert!(
        lance_bytes * 2 < off_bytes,
        "lance-compressed {lance_bytes} B vs uncompressed {off_bytes} B"
    );

    let mut scans = Vec::new();
    let mut schemas = Vec::new();
    for written in [&off, &lance] {
        let ds = Dataset::open(t.sstable_fs_dir(written).to_str().unwrap())
            .await
            .unwrap();
        schemas.push(field_metadata(&ds.schema().into()));
        let reader = SsTableReader::open_in(t.store.clone(), &t.layout, &written.dir_name, &schema)
            .await
            .unwrap();
        let rows = reader.scan().await.unwrap();
        scans.push(arrow_select::concat::concat_batches(&rows[0].schema(), &rows).unwrap());
    }
    assert_eq!(schemas[0], schemas[1], "manifest schemas differ");
    assert!(
        !schemas[0]
            .iter()
            .any(|(_, md)| md.contains_key(COMPRESSION_KEY)),
        "encoding metadata in the manifest schema: {:?}",
        schemas[0]
    );
    assert_eq!(scans[0].num_rows(), ROWS as usize);
    assert_eq!(scans[0], scans[1]);
}
