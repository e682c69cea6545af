//! Reading the WAL back after a claim (docs/memwal-format.md "WAL": recovery).

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use futures::stream::{self, BoxStream, StreamExt};
use memwal_fencing::ShardManifest;

use crate::{WalError, WalLocation, WalResult};

/// Default number of entries [`replay`] reads ahead.
pub const DEFAULT_REPLAY_PREFETCH: usize = 8;

/// A data entry to rebuild memtables from.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayEntry {
    /// Its WAL position.
    pub position: u64,
    /// The epoch of the writer that wrote it (ours or lower).
    pub epoch: u64,
    /// Its memtable generation (`None` for upstream WAL-only entries).
    pub generation: Option<u64>,
    /// The rows' schema.
    pub schema: SchemaRef,
    /// The rows.
    pub batches: Vec<RecordBatch>,
    /// The producer stamps of its appends.
    pub producers: Vec<crate::ProducerStamp>,
}

/// What [`replay`] reads: positions `after + 1 .. until` of one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayRange {
    /// The manifest's `replay_after_wal_entry_position`.
    pub after: u64,
    /// The reader's own fence sentinel position (exclusive end).
    pub until: u64,
    /// The manifest's `current_generation`: entries of lower generations
    /// are already published and skipped.
    pub min_generation: u64,
    /// The reader's epoch: any entry above it aborts the replay.
    pub epoch: u64,
}

impl ReplayRange {
    /// The range a writer that claimed `manifest` at `epoch` and wrote its
    /// sentinel at `sentinel_position` must replay.
    pub fn new(manifest: &ShardManifest, epoch: u64, sentinel_position: u64) -> Self {
        Self {
            after: manifest.replay_after_wal_entry_position,
            until: sentinel_position,
            min_generation: manifest.current_generation,
            epoch,
        }
    }
}

/// Replays `range` in position order as a stream of data entries.
///
/// Reads exactly positions `after + 1 .. until`. Guarantees:
///
/// - a missing position in that range ends the stream with
///   [`WalError::Gap`] (never taken for the end); a read failure (after
///   retries) or an undecodable entry ends it with that error;
/// - any entry, sentinel or data, whose epoch is above `range.epoch` ends
///   it with [`WalError::Fenced`];
/// - a generation that goes backwards along positions ends it with
///   [`WalError::Corrupt`] (each generation is one contiguous run);
/// - sentinels, entries without rows (no batches, or only 0-row batches,
///   which upstream may write), and entries whose generation is below
///   `min_generation` are skipped; everything else is yielded once, with
///   its batches as stored (a yielded entry may still hold 0-row batches
///   next to others);
/// - nothing is yielded after the first error.
///
/// Up to `prefetch` (at least 1) entries are fetched concurrently ahead of
/// the consumer, so memory is bounded by `prefetch` entries.
pub fn replay(
    loc: WalLocation,
    range: ReplayRange,
    prefetch: usize,
) -> BoxStream<'static, WalResult<ReplayEntry>> {
    let start = range.after.saturating_add(1);
    let end = range.until.max(start);
    let fetch_loc = loc.clone();
    let fetched = stream::iter(start..end)
        .map(move |position| {
            let loc = fetch_loc.clone();
            async move { (position, loc.read_entry(position).await) }
        })
        .buffered(prefetch.max(1));
    let mut state = ReplayState {
        loc,
        range,
        last_generation: None,
        failed: false,
    };
    fetched
        .filter_map(move |(position, read)| {
            let out = state.next(position, read);
            futures::future::ready(out)
        })
        .take_while(|item| futures::future::ready(item.is_some()))
        .map(|item| item.expect("take_while stops at None"))
        .boxed()
}

struct ReplayState {
    loc: WalLocation,
    range: ReplayRange,
    last_generation: Option<u64>,
    failed: bool,
}

impl ReplayState {
    /// `None`: skip this position; `Some(None)`: the stream is over;
    /// `Some(Some(item))`: yield it.
    fn next(
        &mut self,
        position: u64,
        read: WalResult<Option<crate::WalEntry>>,
    ) -> Option<Option<WalResult<ReplayEntry>>> {
        if self.failed {
            return Some(None);
        }
        match self.check(position, read) {
            Ok(None) => None,
            Ok(Some(entry)) => Some(Some(Ok(entry))),
            Err(e) => {
                self.failed = true;
                Some(Some(Err(e)))
            }
        }
    }

    fn check(
        &mut self,
        position: u64,
        read: WalResult<Option<crate::WalEntry>>,
    ) -> WalResult<Option<ReplayEntry>> {
        let entry = read?.ok_or_else(|| WalError::Gap {
            shard: self.loc.shard(),
            position,
            path: self.loc.path(position).to_string(),
        })?;
        if entry.epoch > self.range.epoch {
            return Err(WalError::Fenced {
                shard: self.loc.shard(),
                local_epoch: self.range.epoch,
                stored_epoch: entry.epoch,
            });
        }
        if let Some(g) = entry.generation {
            if let Some(last) = self.last_generation.filter(|last| g < *last) {
                return Err(WalError::Corrupt {
                    shard: self.loc.shard(),
                    position,
                    path: self.loc.path(position).to_string(),
                    reason: format!("generation {g} follows an entry of generation {last}"),
                });
            }
            self.last_generation = Some(g);
        }
        let published = entry
            .generation
            .is_some_and(|g| g < self.range.min_generation);
        if entry.is_sentinel || entry.num_rows() == 0 || published {
            metrics::counter!("memwal_wal_replay_skipped_total").increment(1);
            return Ok(None);
        }
        metrics::counter!("memwal_wal_replay_entries_total").increment(1);
        Ok(Some(ReplayEntry {
            position,
            epoch: entry.epoch,
            generation: entry.generation,
            schema: entry.schema,
            batches: entry.batches,
            producers: entry.producers,
        }))
    }
}
