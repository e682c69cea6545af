//! Helpers shared by the WAL tests.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use futures::TryStreamExt;
use memwal_fencing::{Claim, ManifestStore, ShardId, ShardIdentity};
use memwal_store::{ObjectStore, Path, RetryPolicy};
use memwal_testkit::FaultStore;
use memwal_wal::{
    replay, write_fence_sentinel, AppendAck, ReplayEntry, ReplayRange, WalAppender, WalConfig,
    WalEntry, WalError, WalLocation,
};
use object_store::memory::InMemory;

pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("note", DataType::Utf8, true),
    ]))
}

/// One batch holding `ids` (the test's unique row identities).
pub fn rows(ids: &[i64]) -> RecordBatch {
    let notes: Vec<String> = ids.iter().map(|i| format!("row {i}")).collect();
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(ids.to_vec())),
            Arc::new(StringArray::from(notes)),
        ],
    )
    .unwrap()
}

/// A batch with the schema of [`rows`] that arrow cannot encode as IPC: its
/// `note` column's offsets point past its value bytes, so arrow's IPC
/// writer panics slicing them (which the codec reports as an encode error).
#[allow(unsafe_code)]
pub fn unencodable() -> RecordBatch {
    use arrow_buffer::{Buffer, OffsetBuffer, ScalarBuffer};
    // SAFETY: deliberately invalid (offsets beyond the values) and only
    // handed to the WAL encoder, whose arrow writer bounds-checks the
    // slice and panics; nothing reads the values unchecked.
    let notes = unsafe {
        StringArray::new_unchecked(
            OffsetBuffer::new_unchecked(ScalarBuffer::from(vec![0i32, 1000])),
            Buffer::from(b"abc".to_vec()),
            None,
        )
    };
    RecordBatch::try_new(
        schema(),
        vec![Arc::new(Int64Array::from(vec![-1])), Arc::new(notes)],
    )
    .unwrap()
}

pub fn ids_in(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            let col = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            (0..col.len()).map(|i| col.value(i)).collect::<Vec<_>>()
        })
        .collect()
}

pub fn memory() -> Arc<dyn ObjectStore> {
    Arc::new(InMemory::new())
}

pub fn faulty(inner: &Arc<dyn ObjectStore>) -> Arc<FaultStore> {
    FaultStore::new(inner.clone())
}

pub fn shard() -> ShardId {
    ShardId::random()
}

pub fn manifests(store: Arc<dyn ObjectStore>, root: &Path, shard: ShardId) -> Arc<ManifestStore> {
    Arc::new(ManifestStore::new(
        store,
        root,
        shard,
        RetryPolicy::immediate(4),
    ))
}

pub fn wal_prefix(root: &Path, shard: ShardId) -> String {
    memwal_fencing::ShardLayout::new(root, shard)
        .wal_dir()
        .to_string()
}

/// A writer that went through claim -> sentinel -> replay -> appender.
pub struct Writer {
    pub manifests: Arc<ManifestStore>,
    pub claim: Claim,
    pub sentinel: u64,
    pub replayed: Vec<ReplayEntry>,
    pub wal: WalAppender,
}

impl Writer {
    pub fn epoch(&self) -> u64 {
        self.claim.epoch
    }
}

/// Claims the shard (creating it if needed), writes the fence sentinel,
/// replays, and starts an appender just past the sentinel.
pub async fn open_writer(
    store: Arc<dyn ObjectStore>,
    root: &Path,
    shard: ShardId,
    config: WalConfig,
) -> Result<Writer, WalError> {
    open_writer_with(manifests(store, root, shard), config).await
}

/// [`open_writer`] over a given manifest store (its retry policy applies).
pub async fn open_writer_with(
    manifests: Arc<ManifestStore>,
    config: WalConfig,
) -> Result<Writer, WalError> {
    let claim = manifests.claim(Some(&ShardIdentity::manual())).await?;
    let sentinel = write_fence_sentinel(&manifests, claim.epoch, &claim.manifest).await?;
    let replayed = replay_all(&manifests, &claim, sentinel).await?;
    let wal = WalAppender::start(
        manifests.clone(),
        claim.epoch,
        sentinel + 1,
        claim.manifest.current_generation,
        config,
    )?;
    Ok(Writer {
        manifests,
        claim,
        sentinel,
        replayed,
        wal,
    })
}

pub async fn replay_all(
    manifests: &ManifestStore,
    claim: &Claim,
    sentinel: u64,
) -> Result<Vec<ReplayEntry>, WalError> {
    let range = ReplayRange::new(&claim.manifest, claim.epoch, sentinel);
    replay(WalLocation::of(manifests), range, 4)
        .try_collect()
        .await
}

/// Every entry from position 1 up to the first missing one (raw view).
pub async fn read_all(loc: &WalLocation) -> BTreeMap<u64, WalEntry> {
    let mut out = BTreeMap::new();
    let mut p = 1;
    while let Some(e) = loc.read_entry(p).await.unwrap() {
        out.insert(p, e);
        p += 1;
    }
    out
}

/// Asserts the WAL holds positions exactly `1..=n` (a LIST, no gaps) and
/// returns n.
pub async fn assert_contiguous(loc: &WalLocation) -> u64 {
    let listed: Vec<_> = loc
        .store()
        .list(Some(&loc.layout().wal_dir()))
        .try_collect()
        .await
        .unwrap();
    let mut positions: Vec<u64> = listed
        .iter()
        .filter_map(|m| m.location.filename())
        .filter_map(|n| n.strip_suffix(".arrow"))
        .filter_map(memwal_fencing::parse_bitrev64)
        .collect();
    positions.sort_unstable();
    let n = positions.len() as u64;
    assert_eq!(
        positions,
        (1..=n).collect::<Vec<_>>(),
        "WAL positions are not 1..=n"
    );
    n
}

/// Asserts that each acknowledged append's ids are in the replayed entry at
/// its acknowledged position and batch range, and that every replayed id
/// belongs to exactly one acknowledged append (nothing twice, nothing else).
pub fn assert_acks_replayed_once(acks: &[(Vec<i64>, AppendAck)], replayed: &[ReplayEntry]) {
    let by_pos: BTreeMap<u64, &ReplayEntry> = replayed.iter().map(|e| (e.position, e)).collect();
    for (ids, ack) in acks {
        let entry = by_pos
            .get(&ack.position)
            .unwrap_or_else(|| panic!("acked position {} not replayed", ack.position));
        assert_eq!(entry.generation, Some(ack.generation));
        assert_eq!(
            &ids_in(&entry.batches[ack.batches.clone()]),
            ids,
            "rows at {ack:?}"
        );
    }
    let mut all: Vec<i64> = replayed.iter().flat_map(|e| ids_in(&e.batches)).collect();
    let mut acked: Vec<i64> = acks.iter().flat_map(|(ids, _)| ids.clone()).collect();
    all.sort_unstable();
    acked.sort_unstable();
    assert_eq!(
        all, acked,
        "replay must hold every acked row exactly once and nothing else"
    );
}
