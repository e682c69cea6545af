//! Durability: every object of an SSTable is written through the store the
//! writer was given (for memwal's local store: fsync on every write), and a
//! failed attempt never reuses its directory.

use std::collections::BTreeSet;
use std::sync::Arc;

use memwal_sstable::{SsTableError, SsTableWriter};
use memwal_testkit::{Action, FaultStore, OpKind};
use object_store::ObjectStore;

use crate::support::*;

/// A local table whose store is wrapped in a logging [`FaultStore`].
fn logged_table() -> (LocalTable, Arc<FaultStore>) {
    let t = LocalTable::new();
    let fault = FaultStore::new(t.store.clone());
    (t, fault)
}

// Breaks if lance wrote any file of the SSTable (data file, manifest,
// deletion file, transaction file, bloom filter, BTree pages) by itself,
// e.g. through its direct non-fsync local writer, instead of through our
// store: such a file is on disk but absent from the store's write log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_file_of_the_sstable_is_written_through_our_store() {
    let (t, fault) = logged_table();
    let schema = int_schema();
    let data = flush(
        &schema,
        &[
            Op::Put(int_rows(&schema, &[1, 2, 3], 0)),
            Op::Put(int_rows(&schema, &[1], 1)),
        ],
    );
    let store: Arc<dyn ObjectStore> = fault.clone();
    let writer = SsTableWriter::new(
        store,
        t.layout.clone(),
        memwal_sstable::LanceFileVersion::V2_2,
    );
    let written = writer.write(&schema, 1, &data).await.unwrap();

    let on_disk = files_below(t.dir.path(), &t.sstable_fs_dir(&written));
    let written_through: BTreeSet<String> = fault
        .ops()
        .into_iter()
        .filter(|op| matches!(op.kind, OpKind::Put | OpKind::Multipart | OpKind::Copy))
        .map(|op| op.path)
        .collect();
    assert!(
        on_disk.len() >= 6,
        "data, manifest, deletion file, bloom, 2 BTree files: {on_disk:?}"
    );
    for file in &on_disk {
        assert!(
            written_through.contains(file),
            "{file} reached the disk without going through our store; \
             store saw {written_through:?}"
        );
    }
    for kind in [
        "_versions/",
        "data/",
        "_deletions/",
        "bloom_filter.bin",
        "_pk_index/page_data.lance",
        "_pk_index/page_lookup.lance",
    ] {
        assert!(
            on_disk.iter().any(|f| f.contains(kind)),
            "no {kind} file in {on_disk:?}"
        );
    }
}

// Breaks if a failure while writing the sidecars were swallowed (write
// returning Ok with an incomplete SSTable), if the error did not name the
// SSTable path, or if the retry reused the failed attempt's directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_errors_and_the_retry_uses_a_new_directory() {
    let (t, fault) = logged_table();
    let schema = int_schema();
    let data = flush(&schema, &[Op::Put(int_rows(&schema, &[1, 2], 0))]);
    let store: Arc<dyn ObjectStore> = fault.clone();
    let writer = SsTableWriter::new(
        store,
        t.layout.clone(),
        memwal_sstable::LanceFileVersion::V2_2,
    );

    fault.set_hook(|op| {
        if op.path.contains("_pk_index") && matches!(op.kind, OpKind::Put | OpKind::Multipart) {
            Action::Fail
        } else {
            Action::Pass
        }
    });
    let err = writer.write(&schema, 1, &data).await.unwrap_err();
    assert!(
        matches!(err, SsTableError::Lance { .. }),
        "unexpected error {err:?}"
    );
    let failed_dir = fault
        .ops()
        .iter()
        .find(|op| op.path.contains("_pk_index"))
        .map(|op| op.path.split("/_pk_index").next().unwrap().to_string())
        .unwrap();
    assert!(
        err.to_string().contains(&failed_dir),
        "{err} names {failed_dir}"
    );

    fault.clear_hook();
    let ok = writer.write(&schema, 1, &data).await.unwrap();
    assert_ne!(p(&ok.dir), failed_dir, "retry reused the failed directory");
}
