//! Reads of a served table, with the state they keep: the snapshot and
//! view every read starts from (`snapshot.rs`), scans streamed level by
//! level (`scan.rs`), key lookups (`lookup.rs`), searches (`search.rs`)
//! the held writers' rows as upstream memtables (`memtables.rs`), and
//! the unpublished rows of shards held elsewhere, from their WALs
//! (`tails.rs`).
//! The rules every read keeps and their tests: docs/design/fresh-reads.md.
//!
//! The state is [`Reader`]'s, private to this module: the rest of the
//! server reads through `TableHost`'s read methods.

pub(crate) mod kept;
pub(crate) mod lookup;
pub(crate) mod memtables;
pub(crate) mod merge;
pub(crate) mod opened;
pub(crate) mod owners;
pub(crate) mod scan;
pub(crate) mod search;
pub(crate) mod snapshot;
pub(crate) mod tails;

use std::sync::atomic::{AtomicU64, Ordering};

/// What a table's reads keep between reads, and count.
#[derive(Default)]
pub(crate) struct Reader {
    /// Scans planned (SQL queries that are not lookups, `scan`,
    /// `read_rows`, exact vector searches).
    scans: AtomicU64,
    /// Key lookups served.
    lookups: AtomicU64,
    /// Published SSTables opened for key lookups, kept while the view
    /// lists them: an SSTable never changes.
    sstables: lookup::OpenSsTables,
    /// Published SSTables opened for scans, kept while the view lists
    /// them (`opened.rs`).
    opened: opened::Opened,
    /// The held writers' unflushed rows as upstream memtables, kept and
    /// extended read by read.
    memtables: memtables::Memtables,
    /// The last manifest version and writer epoch seen per shard, for
    /// lookups that only need to know who owns a shard.
    owners: owners::Owners,
    /// The WAL entries read of shards held by no writer here, kept and
    /// extended read by read.
    tails: tails::Tails,
    /// Where what is kept between reads (`tails`, the indexes of
    /// `memtables`) is charged (`kept.rs`).
    account: kept::Account,
}

impl Reader {
    /// `shard`'s writer here closed with every row published, leaving its
    /// manifest at `version` (see [`tails::Tails::at_rest`]).
    pub(crate) fn closed_at_rest(&self, shard: memwal::ShardId, version: u64) {
        self.tails.closed_at_rest(shard, version)
    }

    /// See [`crate::TableHost::charge_reads_to`].
    pub(crate) fn charge_to(
        &self,
        pool: std::sync::Arc<dyn datafusion::execution::memory_pool::MemoryPool>,
    ) {
        self.account.set(pool)
    }

    /// The bytes what reads keep between queries has charged to the
    /// account (`kept.rs`).
    #[cfg(test)]
    pub(crate) fn kept_bytes(&self) -> usize {
        self.memtables.held_bytes() + self.tails.held_bytes()
    }

    /// Published SSTables kept open for scans, and opened so far.
    #[cfg(test)]
    pub(crate) fn opened_sstables(&self) -> (usize, u64) {
        self.opened.counts()
    }

    /// Scans and key lookups served so far.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.scans.load(Ordering::Relaxed),
            self.lookups.load(Ordering::Relaxed),
        )
    }
}
