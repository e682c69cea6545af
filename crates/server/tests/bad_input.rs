//! The bad-input corpus: corrupt, truncated and foreign objects where a
//! shard's WAL entries, manifests, version hint and SSTables live, a base
//! table declaring reader features this build does not know, and batches
//! that do not fit the table.
//!
//! Each case writes acknowledged rows to every shard of a `bucket(id, 4)`
//! table, damages one shard's object (keeping a copy), and opens the table
//! again as the daemon does (`TableHost`): the damaged shard's rows are
//! refused with a typed error naming the object (DATA_LOSS), every other
//! shard keeps serving, and once the object is restored a fresh host's view
//! holds every acknowledged row (the invariants of
//! `memwal_testkit::invariants`): nothing was skipped, repaired or guessed.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use lance::dataset::mem_wal::LsmScanner;
use memwal::ShardWriterConfig;
use memwal_compactor::{Compactor, CompactorConfig};
use memwal_server::{ServerError, TableHost};
use memwal_store::{RetryPolicy, StoreLocation};
use memwal_table::{create_table, TableSharding};
use memwal_testkit::invariants::{check, Op, Outcome, View};

const KEYS: i64 = 40;

fn rows(ids: &[i64], tag: &str) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", DataType::Utf8, true),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
            Arc::new(StringArray::from_iter_values(
                ids.iter().map(|i| format!("{tag}-{i}")),
            )),
        ],
    )
    .unwrap()
}

/// A table, the writes made to it and their outcomes.
struct Case {
    _dir: tempfile::TempDir,
    path: PathBuf,
    loc: StoreLocation,
    ops: Vec<Op>,
}

impl Case {
    /// A `bucket(id, 4)` table whose four shards hold acknowledged rows
    /// `a-0..a-39`, in the WAL only (the host is dropped, as by a crash),
    /// or flushed to SSTables with `flushed`.
    async fn new(flushed: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let loc = memwal_store::open_store(path.to_str().unwrap()).unwrap();
        let key = Field::new("id", DataType::Int64, false).with_metadata(
            [(
                "lance-schema:unenforced-primary-key".to_string(),
                "true".to_string(),
            )]
            .into(),
        );
        let schema = Arc::new(Schema::new(vec![
            key,
            Field::new("v", DataType::Utf8, true),
        ]));
        let sharding = TableSharding::Bucket {
            column: "id".into(),
            buckets: 4,
        };
        create_table(&loc, schema, &sharding).await.unwrap();
        let mut case = Self {
            _dir: dir,
            path,
            loc,
            ops: Vec::new(),
        };
        let host = case.open().await.unwrap();
        case.write_each(&host, "a", 1).await;
        assert!(case.ops.iter().all(|o| o.outcome == Outcome::Acked));
        if flushed {
            host.flush().await.unwrap();
        }
        drop(host);
        case
    }

    async fn open(&self) -> Result<TableHost, ServerError> {
        TableHost::open("t", self.loc.clone(), ShardWriterConfig::default()).await
    }

    /// Writes every key on its own through `host` (writer `writer`),
    /// recording each outcome; the refusals, as gRPC statuses.
    async fn write_each(&mut self, host: &TableHost, tag: &str, writer: u32) -> Vec<tonic::Status> {
        let mut refused = Vec::new();
        for key in 0..KEYS {
            let outcome = match host.write(&rows(&[key], tag), false).await {
                Ok(_) => Outcome::Acked,
                Err(e) => {
                    let status = tonic::Status::from(e);
                    let outcome = match status.code() {
                        tonic::Code::DataLoss | tonic::Code::InvalidArgument => Outcome::Refused,
                        _ => Outcome::Unknown,
                    };
                    refused.push(status);
                    outcome
                }
            };
            self.ops.push(Op {
                seq: self.ops.len() as u64,
                key,
                value: Some(format!("{tag}-{key}")),
                outcome,
                writer,
            });
        }
        refused
    }

    /// The shard directory whose objects a case damages (the first by id).
    fn victim(&self) -> PathBuf {
        let mut shards: Vec<PathBuf> = std::fs::read_dir(self.path.join("_mem_wal"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        shards.sort();
        assert_eq!(shards.len(), 4, "{shards:?}");
        shards.remove(0)
    }

    /// Opens the table after damage: the victim's rows must be refused
    /// with DATA_LOSS naming `needle`, every other shard must serve, and
    /// `/status` must show the victim failed.
    async fn refused_only_where_damaged(&mut self, needle: &str) {
        let host = self
            .open()
            .await
            .expect("the table opens around a damaged shard");
        let refused = self.write_each(&host, "b", 2).await;
        assert!(!refused.is_empty(), "the damaged shard ({needle}) served");
        assert!(refused.len() < KEYS as usize, "no shard served");
        for s in &refused {
            assert_eq!(s.code(), tonic::Code::DataLoss, "{s}");
            assert!(s.message().contains(needle), "`{needle}` not named: {s}");
        }
        let status = host.status().await;
        let failed: Vec<_> = status.iter().filter(|s| s.state == "failed").collect();
        assert_eq!(failed.len(), 1, "{status:?}");
        assert!(failed[0].last_error.as_deref().unwrap().contains(needle));
        host.close().await.unwrap();
    }

    /// Once the damage is undone, a fresh host replays and flushes
    /// everything; the reader view must hold every acknowledgement.
    async fn all_acks_hold(&self) {
        let host = self.open().await.unwrap();
        host.close().await.unwrap();
        let view = view(&self.loc).await;
        let violations = check(&view, &self.ops, 0..KEYS);
        assert!(violations.is_empty(), "{violations:?}");
    }
}

/// Base + SSTables through upstream's `LsmScanner`.
async fn view(loc: &StoreLocation) -> View {
    let view = memwal_table::table_view(loc, None, &RetryPolicy::default())
        .await
        .unwrap();
    let snapshots = view.snapshots();
    let batch = LsmScanner::new(view.base.clone(), snapshots, vec!["id".to_string()])
        .try_into_batch()
        .await
        .unwrap();
    let mut out = View::default();
    let ids = batch
        .column_by_name("id")
        .unwrap()
        .as_primitive::<Int64Type>();
    let vs = batch.column_by_name("v").unwrap().as_string::<i32>();
    for i in 0..batch.num_rows() {
        out.push(ids.value(i), vs.value(i).to_string());
    }
    out
}

/// A copy of every file under `dir`, to put back after the damage.
struct Backup(BTreeMap<PathBuf, Vec<u8>>);

impl Backup {
    fn of(dir: &Path) -> Self {
        let mut files = BTreeMap::new();
        let mut todo = vec![dir.to_path_buf()];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    todo.push(p);
                } else {
                    files.insert(p.clone(), std::fs::read(&p).unwrap());
                }
            }
        }
        Self(files)
    }

    fn restore(&self) {
        for (p, bytes) in &self.0 {
            std::fs::write(p, bytes).unwrap();
        }
    }
}

/// The object at the highest position (bit-reversed binary names) in
/// `dir` with extension `ext`, and its position.
fn newest(dir: &Path, ext: &str) -> (PathBuf, u64) {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .map(|p| {
            let stem: String = p
                .file_stem()
                .unwrap()
                .to_str()
                .unwrap()
                .chars()
                .rev()
                .collect();
            let position = u64::from_str_radix(&stem, 2).unwrap();
            (p, position)
        })
        .max_by_key(|(_, n)| *n)
        .unwrap()
}

/// The largest WAL entry of the shard at `shard` (a data entry, not a
/// sentinel).
fn data_entry(shard: &Path) -> PathBuf {
    std::fs::read_dir(shard.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap()
}

fn name(p: &Path) -> String {
    p.file_name().unwrap().to_str().unwrap().to_string()
}

fn truncate(p: &Path) {
    let bytes = std::fs::read(p).unwrap();
    std::fs::write(p, &bytes[..bytes.len() / 2]).unwrap();
}

/// An Arrow IPC stream that is not a WAL entry: another schema, no epoch.
fn foreign_ipc() -> Vec<u8> {
    let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Float64, true)]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(arrow_array::Float64Array::from(vec![1.5])) as ArrayRef],
    )
    .unwrap();
    let mut out = Vec::new();
    let mut w = arrow_ipc::writer::StreamWriter::try_new(&mut out, &schema).unwrap();
    w.write(&batch).unwrap();
    w.finish().unwrap();
    drop(w);
    out
}

/// How a case damages an object in place.
type Damage = fn(&Path);

/// One damage case: `object` (found in the victim shard's directory) is
/// damaged, must make only its shard refuse (naming it), and once restored
/// every acknowledgement must hold.
async fn damaged_object_refuses_its_shard(
    what: &str,
    object: impl Fn(&Path) -> PathBuf,
    damage: Damage,
) {
    let mut case = Case::new(false).await;
    let shard = case.victim();
    let target = object(&shard);
    let backup = Backup::of(&shard);
    damage(&target);
    eprintln!("{what}: {}", target.display());
    case.refused_only_where_damaged(&name(&target)).await;
    backup.restore();
    case.all_acks_hold().await;
}

// Breaks if a WAL entry that does not decode (garbage, cut short, or
// another program's Arrow stream) is skipped or guessed at during replay,
// if the error does not name the object, if it takes the whole table down
// instead of its shard, or if the other shards' acknowledged rows are lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_wal_entries_refuse_their_shard_only() {
    let cases: [(&str, Damage); 3] = [
        ("garbage", |p| {
            std::fs::write(p, b"not an arrow stream").unwrap()
        }),
        ("truncated", truncate),
        ("foreign", |p| std::fs::write(p, foreign_ipc()).unwrap()),
    ];
    for (what, damage) in cases {
        damaged_object_refuses_its_shard(what, data_entry, damage).await;
    }
}

// Breaks if a shard manifest that does not decode (garbage or cut short) is
// read as "no shard" or replaced by an older version (either would let a
// new claim start over and hide acknowledged rows), if the error does not
// name the object, or if the other shards stop serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_shard_manifests_refuse_their_shard_only() {
    let cases: [(&str, Damage); 2] = [
        ("garbage", |p| {
            std::fs::write(p, b"\xff\xfe not a manifest").unwrap()
        }),
        ("truncated", truncate),
    ];
    for (what, damage) in cases {
        let manifest = |shard: &Path| newest(&shard.join("manifest"), "binpb").0;
        damaged_object_refuses_its_shard(what, manifest, damage).await;
    }
}

// The version hint only speeds up finding the newest manifest: a hint that
// does not decode, or points past the newest, must not stop the shard or
// make it use an older manifest. Breaks if a bad hint fails the shard or
// loses acknowledged rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_version_hint_is_only_a_slower_lookup() {
    for hint in [&b"{ not json"[..], br#"{"latest_version": 999999}"#] {
        let mut case = Case::new(false).await;
        let shard = case.victim();
        std::fs::write(shard.join("manifest/version_hint.json"), hint).unwrap();
        let host = case.open().await.unwrap();
        let refused = case.write_each(&host, "b", 2).await;
        assert!(refused.is_empty(), "{refused:?}");
        host.close().await.unwrap();
        case.all_acks_hold().await;
    }
}

// Breaks if an SSTable whose data file is damaged is read past or merged
// partially by the compactor (it must fail that shard with an error naming
// the SSTable and leave the base table and the other shards' compaction
// alone), or if the writer refuses to serve because of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_sstable_stops_only_its_shards_compaction() {
    let mut case = Case::new(true).await;
    let shard = case.victim();
    let dir = std::fs::read_dir(&shard)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir() && name(p).contains("_gen_"))
        .expect("a flushed SSTable");
    let data = std::fs::read_dir(dir.join("data"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .next()
        .unwrap();
    let backup = Backup::of(&shard);
    std::fs::write(&data, b"garbage where lance data was").unwrap();

    // The writer does not read its published SSTables: it serves on.
    let host = case.open().await.unwrap();
    let refused = case.write_each(&host, "b", 2).await;
    assert!(refused.is_empty(), "{refused:?}");
    host.flush().await.unwrap();
    host.close().await.unwrap();

    let before = lance::Dataset::open(case.path.to_str().unwrap())
        .await
        .unwrap();
    let compactor = Compactor::new(case.loc.clone(), CompactorConfig::default());
    let results = compactor.run_once().await.unwrap();
    let failed: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].contains(name(&dir).as_str()), "{failed:?}");
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 3);
    let after = lance::Dataset::open(case.path.to_str().unwrap())
        .await
        .unwrap();
    assert!(after.version().version > before.version().version);

    backup.restore();
    let results = compactor.run_once().await.unwrap();
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    case.all_acks_hold().await;
}

/// Adds reader feature flag `flag` to the newest manifest of the Lance
/// dataset at `table`, in place (a table written by a newer lance).
fn set_reader_flag(table: &Path, flag: u64) {
    use prost::Message;
    let versions = table.join("_versions");
    let latest = std::fs::read_dir(&versions)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "manifest"))
        .max_by_key(|p| std::fs::metadata(p).unwrap().modified().unwrap())
        .unwrap();
    let mut bytes = std::fs::read(&latest).unwrap();
    let n = bytes.len();
    assert_eq!(&bytes[n - 4..], b"LANC");
    let pos = u64::from_le_bytes(bytes[n - 16..n - 8].try_into().unwrap()) as usize;
    let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
    let mut m = lance_table::format::pb::Manifest::decode(&bytes[pos + 4..pos + 4 + len]).unwrap();
    m.reader_feature_flags |= flag;
    let encoded = m.encode_to_vec();
    let footer = bytes[n - 16..].to_vec();
    bytes.truncate(n - 16);
    let new_pos = bytes.len() as u64;
    bytes.extend_from_slice(&(encoded.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&encoded);
    bytes.extend_from_slice(&new_pos.to_le_bytes());
    bytes.extend_from_slice(&footer[8..]);
    std::fs::write(&latest, bytes).unwrap();
}

// The spec's rule for `reader_feature_flags`: a reader that does not know a
// flag must not read the table. Breaks if the host, a shard writer or the
// compactor opens a base table declaring an unknown reader feature (they
// would read, and then commit over, data they cannot interpret), or if the
// refusal does not say why; and, once the flag is gone, if any
// acknowledged row was lost on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_base_table_with_unknown_reader_features_is_refused() {
    let case = Case::new(false).await;
    let base = case.path.join("_versions");
    let backup = Backup::of(&base);
    set_reader_flag(&case.path, 1 << 40);

    let e = case.open().await.unwrap_err();
    assert!(matches!(e, ServerError::Setup { .. }), "{e}");
    assert!(e.to_string().contains("unsupported base table"), "{e}");
    assert!(e.to_string().contains("Flags"), "{e}");
    let shard = memwal_table::list_shards(&case.loc).await.unwrap()[0];
    let e = memwal::ShardWriter::open(case.loc.clone(), shard, ShardWriterConfig::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("unsupported base table"), "{e}");
    let e = Compactor::new(case.loc.clone(), CompactorConfig::default())
        .run_once()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("cannot be read"), "{e}");

    backup.restore();
    case.all_acks_hold().await;
}

// Breaks if a batch that does not fit the table (wrong type, missing key
// column, extra column, null key) is accepted, refused with another code
// than INVALID_ARGUMENT or without naming the column, or leaves the host
// unable to serve or the rows acknowledged before it lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_that_do_not_fit_are_invalid_and_nothing_is_lost() {
    let mut case = Case::new(false).await;
    let host = case.open().await.unwrap();
    let int_v = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Int64, true),
        ])),
        vec![
            Arc::new(Int64Array::from(vec![1])) as ArrayRef,
            Arc::new(Int64Array::from(vec![1])),
        ],
    )
    .unwrap();
    // (A batch lacking the nullable `v` is a put with `v` null: see
    // host.rs, puts_are_matched_to_the_table_by_column_name.)
    let no_id = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("v", DataType::Utf8, true)])),
        vec![Arc::new(StringArray::from(vec!["x"])) as ArrayRef],
    )
    .unwrap();
    let extra = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Utf8, true),
            Field::new("w", DataType::Utf8, true),
        ])),
        vec![
            Arc::new(Int64Array::from(vec![1])) as ArrayRef,
            Arc::new(StringArray::from(vec!["x"])),
            Arc::new(StringArray::from(vec!["y"])),
        ],
    )
    .unwrap();
    let null_key = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("v", DataType::Utf8, true),
        ])),
        vec![
            Arc::new(Int64Array::from(vec![Some(1), None, Some(2)])) as ArrayRef,
            Arc::new(StringArray::from(vec!["x", "y", "z"])),
        ],
    )
    .unwrap();
    for (batch, needle) in [(int_v, "v"), (no_id, "id"), (extra, "w"), (null_key, "id")] {
        let e = host.write(&batch, false).await.unwrap_err();
        let status = tonic::Status::from(e);
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
        assert!(status.message().contains(needle), "{needle}: {status}");
    }
    assert!(case.write_each(&host, "b", 2).await.is_empty());
    host.close().await.unwrap();
    case.all_acks_hold().await;
}
