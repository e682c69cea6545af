//! The unflushed rows of shards this daemon holds no writer for (another
//! daemon's, one that claimed a shard away from this daemon, one being
//! opened here, or none), read from their WALs: a put is acknowledged
//! only once its WAL entry is durable, so the entries above a shard's
//! replay cursor hold every acknowledged row its manifest has not
//! published yet, whoever wrote them.
//!
//! What is read, for a shard whose manifest (in the read's view) has
//! cursor `c` and `current_generation` `g`, over a base holding its
//! generations up to `f`: the entries at `c + 1, c + 2, ...` up to the
//! first missing position (entries above the cursor have no gaps), whose
//! generation is at least `g` and above `f` (or that record none:
//! upstream's WAL-only entries), sentinels and row-less entries skipped.
//! Every entry there is one a claim would replay: a fenced writer's PUT
//! lands below its successor's fence sentinel or not at all
//! (docs/design/wal.md), so no entry above the cursor is ever discarded.
//!
//! What the read must check afterwards (`snapshot.rs`): the missing
//! position that ended it may be one a WAL GC deleted after the writer
//! moved the cursor past it (the view's manifest being older); the
//! shard's latest manifest says whether its cursor is now at or past that
//! position, and then the read is taken again.
//!
//! A shard this host's writer closed with every row published is not
//! read while its manifest stays at the version that close left
//! ([`Tails::at_rest`]): no writer can add to its WAL without claiming it
//! first, which writes a new version (the single-daemon case: shards
//! closed when idle cost a read nothing).
//!
//! Entries never change, so those read are kept per shard (decoded, and
//! in the table's storage schema) and the next read fetches only the
//! positions after them; entries at or below a newer cursor are dropped.
//! Memory: the shard's unpublished WAL entries (bounded by its writer's
//! unflushed-rows limit), charged while kept to the reads' account
//! (`kept.rs`: the daemon's `query_total_memory_mib`) entry by entry as
//! they are read; an entry the account has no room for fails the read
//! ([`TailError::OverBudget`]) and the shard's kept entries are dropped. A
//! shard no longer read this way is forgotten at the next read.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use datafusion::error::DataFusionError;
use datafusion::execution::memory_pool::MemoryPool;
use memwal::ShardId;
use memwal_memtable::TableSchema;
use memwal_wal::{WalError, WalLocation};

/// At most this many WAL positions are fetched at once while reading a
/// tail (the first fetch is of one: most reads find nothing new).
const READ_AHEAD: u64 = 8;

/// The WAL entries read so far per shard.
#[derive(Default)]
pub(crate) struct Tails {
    shards: parking_lot::Mutex<HashMap<ShardId, Arc<tokio::sync::Mutex<Tail>>>>,
    /// Shards whose writer here closed with every row published, with
    /// the manifest version the close left.
    rested: parking_lot::Mutex<HashMap<ShardId, u64>>,
}

/// One shard's entries above a replay cursor, every position read so far.
#[derive(Default)]
struct Tail {
    /// The cursor they are above.
    after: u64,
    /// Positions `after + 1 ..` in order (sentinels and row-less entries
    /// as entries without rows).
    entries: Vec<Entry>,
    /// Their bytes, charged.
    held: super::kept::Held,
}

impl Tail {
    fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.bytes).sum()
    }
}

struct Entry {
    position: u64,
    generation: Option<u64>,
    /// Memory its batches hold.
    bytes: usize,
    /// Its batches with rows, as stored.
    stored: Vec<RecordBatch>,
    /// Those in the storage schema they were last converted to.
    rows: Option<(SchemaRef, Vec<RecordBatch>)>,
}

/// Why a tail read failed.
#[derive(Debug)]
pub(crate) enum TailError {
    /// Reading or decoding the WAL failed.
    Wal(WalError),
    /// The reads' account has no room for the entries read.
    OverBudget(DataFusionError),
}

/// What a tail read found.
#[derive(Debug)]
pub(crate) struct TailRead {
    /// The unpublished rows, oldest first, in the table's storage schema
    /// (apply them in order: later rows overwrite, tombstones delete).
    pub batches: Vec<RecordBatch>,
    /// The position found missing that ended the read.
    pub end: u64,
}

impl Tails {
    /// The bytes the kept entries have charged (shards being read now
    /// not counted).
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> usize {
        self.shards
            .lock()
            .values()
            .filter_map(|t| t.try_lock().ok().map(|t| t.held.bytes()))
            .sum()
    }

    /// Records that this host's writer of `shard` closed with every row
    /// published, its manifest left at `version`.
    pub(crate) fn closed_at_rest(&self, shard: ShardId, version: u64) {
        self.rested.lock().insert(shard, version);
    }

    /// Whether `shard`, whose manifest is at `version`, is known to hold
    /// nothing in its WAL above its cursor: this host's writer closed it
    /// with every row published, leaving that very version. Any writer
    /// that could have written since claimed the shard first, which moves
    /// the version (then the record is dropped and the WAL read); a view
    /// older than the close reads the WAL and keeps the record.
    pub(crate) fn at_rest(&self, shard: ShardId, version: u64) -> bool {
        let mut rested = self.rested.lock();
        match rested.get(&shard) {
            Some(&v) if v == version => true,
            // Claimed since: the record is void. (An older version is a
            // view read before the close ended; the record stands.)
            Some(&v) if version > v => {
                rested.remove(&shard);
                false
            }
            _ => false,
        }
    }

    /// Forgets the shards not in `read` (held here again, or gone).
    pub(crate) fn keep_only(&self, read: &HashSet<ShardId>) {
        self.shards.lock().retain(|shard, _| read.contains(shard));
    }

    /// The rows of `wal`'s entries above position `after` of generation
    /// `min_generation` or later (or of none), up to the first missing
    /// position, converted to `schema`'s storage form (by field id:
    /// entries written under older schemas read with nulls in newer
    /// columns), the entries kept charged to `account`. Fails on a read
    /// failure (after retries) or an entry that does not decode or fit the
    /// table ([`WalError::Corrupt`]): what was read before it is kept for
    /// the next read; or when `account` has no room for an entry
    /// ([`TailError::OverBudget`]): nothing is kept.
    pub(crate) async fn read(
        &self,
        wal: &WalLocation,
        after: u64,
        min_generation: u64,
        schema: &TableSchema,
        account: Option<&Arc<dyn MemoryPool>>,
    ) -> Result<TailRead, TailError> {
        let cell = self.shards.lock().entry(wal.shard()).or_default().clone();
        let mut tail = cell.lock().await;
        if tail.after > after {
            // A read with a newer view moved past this one's cursor and
            // dropped entries it needs.
            *tail = Tail::default();
        }
        tail.entries.retain(|e| e.position > after);
        tail.after = after;
        let what = format!("the unpublished WAL rows of shard {}", wal.shard());
        let kept = tail.bytes();
        if let Err(e) = tail.held.set(account, &what, kept) {
            *tail = Tail::default();
            return Err(TailError::OverBudget(e));
        }
        let end = match extend(&mut tail, wal, account, &what).await {
            Ok(end) => end,
            Err(e @ TailError::OverBudget(_)) => {
                *tail = Tail::default();
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let storage = schema.storage_schema();
        let mut batches = Vec::new();
        for e in &mut tail.entries {
            if e.stored.is_empty() || e.generation.is_some_and(|g| g < min_generation) {
                continue;
            }
            let fresh = e
                .rows
                .as_ref()
                .is_some_and(|(s, _)| Arc::ptr_eq(s, storage));
            if !fresh {
                let converted = e
                    .stored
                    .iter()
                    .map(|b| schema.to_storage_for_replay(b))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|source| {
                        TailError::Wal(WalError::Corrupt {
                            shard: wal.shard(),
                            position: e.position,
                            path: wal.path(e.position).to_string(),
                            reason: format!("the entry does not fit the table's schema: {source}"),
                        })
                    })?;
                e.rows = Some((storage.clone(), converted));
            }
            if let Some((_, rows)) = &e.rows {
                batches.extend(rows.iter().cloned());
            }
        }
        Ok(TailRead { batches, end })
    }
}

/// Reads the positions after `tail`'s last until one is missing, which it
/// returns: one, then twice as many at a time, up to [`READ_AHEAD`]. Each
/// entry is charged to `account` as `what` before it is kept.
async fn extend(
    tail: &mut Tail,
    wal: &WalLocation,
    account: Option<&Arc<dyn MemoryPool>>,
    what: &str,
) -> Result<u64, TailError> {
    let mut next = tail
        .entries
        .last()
        .map_or(tail.after, |e| e.position)
        .saturating_add(1);
    let mut width = 1;
    let mut kept = tail.bytes();
    loop {
        let positions: Vec<u64> = (0..width).filter_map(|i| next.checked_add(i)).collect();
        let reads = futures::future::join_all(positions.iter().map(|&p| wal.read_entry(p))).await;
        for (&position, read) in positions.iter().zip(reads) {
            let Some(entry) = read.map_err(TailError::Wal)? else {
                return Ok(position);
            };
            metrics::counter!("memwal_server_wal_tail_entries_read_total").increment(1);
            let stored = if entry.is_sentinel {
                Vec::new()
            } else {
                entry
                    .batches
                    .into_iter()
                    .filter(|b| b.num_rows() > 0)
                    .collect()
            };
            let bytes: usize = stored.iter().map(|b| b.get_array_memory_size()).sum();
            kept += bytes;
            tail.held
                .set(account, what, kept)
                .map_err(TailError::OverBudget)?;
            tail.entries.push(Entry {
                position,
                generation: entry.generation,
                bytes,
                stored,
                rows: None,
            });
        }
        width = (width * 2).min(READ_AHEAD);
        match positions.last().and_then(|p| p.checked_add(1)) {
            Some(n) => next = n,
            // Every position up to the last one exists.
            None => return Ok(u64::MAX),
        }
    }
}
