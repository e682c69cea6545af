//! The SSTable's Lance dataset: one fragment, the storage schema with the
//! base table's field ids, every row in insert order, and a bitmap deletion
//! vector on fragment 0 hiding superseded rows.
//!
//! Lance's public API renumbers field ids when it creates a dataset (only
//! its crate-internal MemWAL flush may keep them). So the data file is
//! written with the id-carrying schema (`FragmentCreateBuilder`), committed
//! as version 1, and that brand-new, unpublished version-1 manifest is then
//! rewritten in place with the id-carrying schema, the fragment's original
//! field ids and the deletion file: the same in-place rewrite upstream uses
//! to attach its deletion vector.

use std::sync::Arc;

use arrow_array::{RecordBatch, RecordBatchIterator};
use lance::dataset::builder::DatasetBuilder;
use lance::dataset::fragment::write::FragmentCreateBuilder;
use lance::dataset::transaction::{Operation, Transaction};
use lance::dataset::{CommitBuilder, Dataset, WriteMode, WriteParams};
use lance_core::datatypes::Schema as LanceSchema;
use lance_core::utils::deletion::DeletionVector;
use lance_file::version::LanceFileVersion;
use lance_table::feature_flags::apply_feature_flags;
use lance_table::io::commit::{write_manifest_file_to_path, ConditionalPutCommitHandler};
use lance_table::io::deletion::write_deletion_file;
use object_store::path::Path;
use roaring::RoaringBitmap;

use crate::error::{Result, SsTableError};
use crate::lance_store::LanceStore;

/// The Lance schema of the storage schema, keeping the `lance:field_id` of
/// every column; fields without one (`_tombstone`, unnumbered nested
/// children) get ids above the largest given id.
pub fn lance_schema(path: &str, storage: &arrow_schema::Schema) -> Result<LanceSchema> {
    let mut schema = LanceSchema::try_from(storage).map_err(SsTableError::lance(path))?;
    schema
        .try_set_field_id(None)
        .map_err(SsTableError::lance(path))?;
    schema.validate().map_err(SsTableError::lance(path))?;
    Ok(schema)
}

/// Writes the dataset at `dir` (which must not exist yet).
pub(crate) async fn write_dataset(
    lance: &LanceStore,
    dir: &Path,
    schema: &LanceSchema,
    batches: &[RecordBatch],
    deleted: &RoaringBitmap,
    version: LanceFileVersion,
    compression: SsTableCompression,
) -> Result<()> {
    let uri = lance.uri(dir);
    let err = SsTableError::lance;
    let params = WriteParams {
        mode: WriteMode::Create,
        max_rows_per_file: usize::MAX,
        data_storage_version: Some(version),
        enable_v2_manifest_paths: true,
        session: Some(lance.session().clone()),
        ..Default::default()
    };
    let arrow_schema = batches[0].schema();
    let owned: Vec<RecordBatch> = batches.to_vec();
    let reader = RecordBatchIterator::new(owned.into_iter().map(Ok), arrow_schema);
    // The data file is encoded with `compression`'s field metadata; the
    // manifest keeps `schema` itself, so readers see the table's fields.
    let encode_schema = match compression {
        SsTableCompression::Off => uncompressed(schema),
        SsTableCompression::Lance => schema.clone(),
    };
    let fragment = FragmentCreateBuilder::new(&uri)
        .schema(&encode_schema)
        .write_params(&params)
        .write(reader, Some(0))
        .await
        .map_err(err(dir))?;

    let transaction = Transaction::new(
        0,
        Operation::Overwrite {
            fragments: vec![fragment.clone()],
            schema: schema.clone(),
            config_upsert_values: None,
            initial_bases: None,
        },
        None,
    );
    let committed = CommitBuilder::new(uri.as_str())
        .with_session(lance.session().clone())
        .with_storage_format(version)
        .enable_v2_manifest_paths(true)
        // Version 1 is created with put-if-not-exists: a directory that
        // somehow already holds a dataset fails instead of being overwritten.
        .with_commit_handler(Arc::new(ConditionalPutCommitHandler))
        .execute(transaction)
        .await
        .map_err(err(dir))?;

    let mut manifest = committed.manifest().clone();
    let manifest_path = committed.manifest_location().path.clone();
    let [committed_fragment] = manifest.fragments.as_slice() else {
        return Err(SsTableError::corrupt(
            dir,
            format!("commit produced {} fragments", manifest.fragments.len()),
        ));
    };
    let mut fragment_meta = committed_fragment.clone();
    // The data file as written: its field ids are the table's.
    fragment_meta.files = fragment.files.clone();
    fragment_meta.deletion_file = write_deletion_file(
        dir,
        fragment_meta.id,
        manifest.version,
        &DeletionVector::from(deleted.clone()),
        lance.lance_store(),
    )
    .await
    .map_err(err(dir))?;
    manifest.schema = schema.clone();
    manifest.fragments = Arc::new(vec![fragment_meta]);
    manifest.update_max_field_id();
    manifest.index_section = None;
    manifest.transaction_section = None;
    manifest.transaction_file = None;
    apply_feature_flags(&mut manifest, false, false).map_err(err(dir))?;
    write_manifest_file_to_path(
        lance.lance_store(),
        &mut manifest,
        None,
        &manifest_path,
        None,
    )
    .await
    .map_err(err(&manifest_path))?;
    Ok(())
}

/// How an SSTable's data file is encoded.
///
/// SSTables are short-lived: the compactor rewrites their rows into the
/// base table, which is encoded by the base table's own settings whatever
/// this says. Either way any lance reader (ours, upstream's LSM scanner)
/// reads the SSTable, and its manifest schema is the table's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SsTableCompression {
    /// Columns are written without compression (no FSST, no general-purpose
    /// block compression) unless a field's own metadata names a scheme
    /// (`lance-encoding:compression`): flushes spend far less CPU, at the
    /// price of SSTables as large as the Arrow data for compressible rows.
    #[default]
    Off,
    /// Lance's default encoding choices (as for any lance dataset).
    Lance,
}

/// lance-encoding's field metadata key choosing a column's compression
/// (`lance_encoding::constants::COMPRESSION_META_KEY` in lance 14).
const COMPRESSION_META_KEY: &str = "lance-encoding:compression";

/// `schema` with every field (nested ones too) asking lance's encoder for
/// no compression (`lance-encoding:compression = none`) unless it names a
/// scheme itself.
fn uncompressed(schema: &LanceSchema) -> LanceSchema {
    fn mark(field: &mut lance_core::datatypes::Field) {
        field
            .metadata
            .entry(COMPRESSION_META_KEY.to_string())
            .or_insert_with(|| "none".to_string());
        field.children.iter_mut().for_each(mark);
    }
    let mut out = schema.clone();
    out.fields.iter_mut().for_each(mark);
    out
}

/// Opens the dataset at `dir` through `lance`'s session.
pub(crate) async fn open_dataset(lance: &LanceStore, dir: &Path) -> Result<Dataset> {
    DatasetBuilder::from_uri(lance.uri(dir))
        .with_session(lance.session().clone())
        .load()
        .await
        .map_err(SsTableError::lance(dir))
}
