//! Idempotent producers at one shard (docs/design/idempotent-producers.md):
//! per producer id, the epoch it last wrote with, its last sequence and
//! the WAL positions of its last [`WINDOW`] sequences; the rules a put
//! with a producer sequence is admitted by.
//!
//! The table changes only under the writer's state lock, at the moment a
//! stamped append is submitted (its place in the WAL is fixed then), so
//! it always describes exactly the appends submitted so far; an append
//! that then fails makes the writer terminal, and the next writer
//! rebuilds the table from storage ([`crate::checkpoint`] plus the WAL
//! entries' stamps), which hold durable appends only.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use futures::future::{FutureExt, Shared};
use memwal_wal::{AppendTicket, ProducerStamp};

use crate::{Error, Result};

/// WAL positions remembered per producer: a retry of one of its last
/// `WINDOW` sequences is acknowledged with its original position, an
/// older one without a position.
pub const WINDOW: usize = 16;

/// Who sent a put, for exactly-once retries: the producer's id, its epoch
/// (a restarted producer raises it to fence its older incarnation) and the
/// sequence number it gave the batch (increasing by one per batch).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProducerSeq {
    /// 1..=256 bytes of printable ASCII.
    pub producer: String,
    /// The producer's epoch.
    pub epoch: u64,
    /// The batch's sequence number.
    pub sequence: u64,
}

impl ProducerSeq {
    /// `producer`'s batch `sequence` under `epoch`.
    pub fn new(producer: impl Into<String>, epoch: u64, sequence: u64) -> Self {
        Self {
            producer: producer.into(),
            epoch,
            sequence,
        }
    }
}

/// Whether a sequence past the next expected one is refused at this shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gaps {
    /// Refused ([`Error::ProducerRefused`] naming the expected sequence):
    /// the producer sends every batch to this shard.
    Refused,
    /// Allowed: the shard sees a part of the producer's sequence (the
    /// daemon splits batches by shard and checks gaps over the whole
    /// sequence itself).
    Allowed,
}

/// How an idempotent put ended: written now, or found written before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acked {
    /// The WAL position holding the rows; `None` only for a duplicate of a
    /// sequence older than the last [`WINDOW`] of its producer.
    pub position: Option<u64>,
    /// True when the sequence was written before and nothing was written now.
    pub duplicate: bool,
}

/// An append whose ticket several waiters may await (the put, and retries
/// of the same sequence arriving while it is in flight).
pub(crate) type SharedTicket = Shared<AppendTicket>;

/// Where a sequence's rows are.
#[derive(Clone)]
pub(crate) enum Landing {
    /// Durable at this WAL position.
    At(u64),
    /// Submitted; the ticket resolves once durable.
    InFlight(SharedTicket),
}

#[cfg(test)]
impl Landing {
    /// The position, once known without waiting.
    pub(crate) fn position_now(&self) -> Option<u64> {
        match self {
            Landing::At(p) => Some(*p),
            Landing::InFlight(t) => t.peek().and_then(|r| r.as_ref().ok()).map(|a| a.position),
        }
    }
}

/// One producer's state at this shard.
#[derive(Clone)]
pub(crate) struct Record {
    pub epoch: u64,
    pub last: u64,
    /// When it last wrote (milliseconds since the Unix epoch).
    pub at_ms: u64,
    /// Its last sequences, ascending, with where they are.
    pub window: VecDeque<(u64, Landing)>,
}

impl Record {
    fn remember(&mut self, sequence: u64, landing: Landing) {
        if self.window.iter().any(|(s, _)| *s == sequence) {
            return;
        }
        let at = self.window.partition_point(|(s, _)| *s < sequence);
        self.window.insert(at, (sequence, landing));
        while self.window.len() > WINDOW {
            self.window.pop_front();
        }
    }
}

/// What [`Producers::admit`] decided.
pub(crate) enum Admit {
    /// Write it.
    New,
    /// Written before: acknowledge it again from here (`None`: older than
    /// the window).
    Duplicate(Option<Landing>),
}

/// The producers of one shard.
#[derive(Clone, Default)]
pub(crate) struct Producers {
    map: HashMap<String, Record>,
    /// Whether any producer was ever known here (loaded or written):
    /// checkpoints are written from then on, also once every record
    /// expired, so a claimer never falls back to an older checkpoint.
    seen: bool,
}

impl Producers {
    pub(crate) fn from_records(map: HashMap<String, Record>) -> Self {
        Self { map, seen: true }
    }

    pub(crate) fn records(&self) -> &HashMap<String, Record> {
        &self.map
    }

    pub(crate) fn is_seen(&self) -> bool {
        self.seen
    }

    /// The rules, in order: an epoch older than the producer's recorded
    /// one is refused (fenced); a sequence at or below its last one is a
    /// duplicate (whatever the epoch: a new incarnation retries its old
    /// batches); with [`Gaps::Refused`], one past `last + 1` is refused
    /// naming `last + 1`; anything else, and any sequence of a producer
    /// not known here, is new.
    ///
    /// A producer not known here while `limit` producers are is refused.
    pub(crate) fn admit(&self, seq: &ProducerSeq, gaps: Gaps, limit: usize) -> Result<Admit> {
        // The chaos suite's exactly-once check is seen failing against this.
        if memwal_store::broken("broken::producer_sequences_ignored") {
            return Ok(Admit::New);
        }
        let Some(r) = self.map.get(&seq.producer) else {
            if self.map.len() >= limit {
                return Err(Error::ProducerRefused {
                    producer: seq.producer.clone(),
                    reason: format!(
                        "the shard keeps {} producers, its producer_limit: a new one is \
                         taken once idle ones expire (producer_expiry)",
                        self.map.len()
                    ),
                    expected: None,
                });
            }
            return Ok(Admit::New);
        };
        if seq.epoch < r.epoch {
            return Err(Error::ProducerRefused {
                producer: seq.producer.clone(),
                reason: format!(
                    "epoch {} is fenced: the producer wrote with epoch {} here",
                    seq.epoch, r.epoch
                ),
                expected: None,
            });
        }
        if seq.sequence <= r.last {
            let landing = r
                .window
                .iter()
                .find(|(s, _)| *s == seq.sequence)
                .map(|(_, l)| l.clone());
            return Ok(Admit::Duplicate(landing));
        }
        let expected = r.last.saturating_add(1);
        if gaps == Gaps::Refused && seq.sequence > expected {
            return Err(Error::ProducerRefused {
                producer: seq.producer.clone(),
                reason: format!(
                    "sequence {} leaves a gap: the next expected is {expected}",
                    seq.sequence
                ),
                expected: Some(expected),
            });
        }
        Ok(Admit::New)
    }

    /// Records a new sequence just submitted (see [`Producers::admit`]).
    pub(crate) fn submitted(&mut self, stamp: &ProducerStamp, ticket: SharedTicket) {
        self.note(
            &stamp.producer,
            stamp.epoch,
            stamp.sequence,
            stamp.at_ms,
            Landing::InFlight(ticket),
        );
    }

    /// Applies a stamp replayed from the WAL entry at `position`. Order
    /// does not matter (the epoch and last sequence only grow), so a stamp
    /// the loaded checkpoint already holds changes nothing.
    pub(crate) fn replayed(&mut self, stamp: &ProducerStamp, position: u64) {
        self.note(
            &stamp.producer,
            stamp.epoch,
            stamp.sequence,
            stamp.at_ms,
            Landing::At(position),
        );
    }

    fn note(&mut self, producer: &str, epoch: u64, sequence: u64, at_ms: u64, landing: Landing) {
        self.seen = true;
        let r = self
            .map
            .entry(producer.to_string())
            .or_insert_with(|| Record {
                epoch,
                last: sequence,
                at_ms,
                window: VecDeque::new(),
            });
        r.epoch = r.epoch.max(epoch);
        r.last = r.last.max(sequence);
        r.at_ms = r.at_ms.max(at_ms);
        r.remember(sequence, landing);
    }

    /// Forgets producers idle for `expiry` or longer as of `now_ms`.
    pub(crate) fn expire(&mut self, now_ms: u64, expiry: Duration) {
        let expiry = u64::try_from(expiry.as_millis()).unwrap_or(u64::MAX);
        self.map
            .retain(|_, r| r.at_ms.saturating_add(expiry) > now_ms);
    }

    /// The epoch and last sequence recorded for `producer`.
    pub(crate) fn last(&self, producer: &str) -> Option<(u64, u64)> {
        self.map.get(producer).map(|r| (r.epoch, r.last))
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

/// Milliseconds since the Unix epoch by the system clock (0 before it).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A ticket several waiters can await.
pub(crate) fn share(ticket: AppendTicket) -> SharedTicket {
    ticket.shared()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(producer: &str, epoch: u64, sequence: u64, at_ms: u64) -> ProducerStamp {
        ProducerStamp {
            producer: producer.into(),
            epoch,
            sequence,
            at_ms,
        }
    }

    fn admit(p: &Producers, producer: &str, epoch: u64, sequence: u64, gaps: Gaps) -> String {
        match p.admit(&ProducerSeq::new(producer, epoch, sequence), gaps, 2) {
            Ok(Admit::New) => "new".into(),
            Ok(Admit::Duplicate(l)) => match l.and_then(|l| l.position_now()) {
                Some(p) => format!("dup@{p}"),
                None => "dup".into(),
            },
            Err(Error::ProducerRefused { expected, .. }) => format!("refused({expected:?})"),
            Err(e) => panic!("unexpected {e}"),
        }
    }

    // Each rule of `admit`, and that replayed stamps rebuild them whatever
    // their order: breaks if a duplicate is written again, a fenced epoch
    // or a gap is admitted, or a retry loses its original position.
    #[test]
    fn the_sequence_rules() {
        let mut p = Producers::default();
        assert_eq!(admit(&p, "a", 1, 7, Gaps::Refused), "new", "first contact");
        for (s, pos) in [(5, 50), (7, 70), (6, 60)] {
            p.replayed(&stamp("a", 2, s, 100), pos);
        }
        assert_eq!(p.last("a"), Some((2, 7)));
        assert_eq!(admit(&p, "a", 2, 6, Gaps::Refused), "dup@60");
        assert_eq!(admit(&p, "a", 2, 7, Gaps::Refused), "dup@70");
        assert_eq!(
            admit(&p, "a", 3, 7, Gaps::Refused),
            "dup@70",
            "a new epoch retries"
        );
        assert_eq!(admit(&p, "a", 2, 8, Gaps::Refused), "new");
        assert_eq!(admit(&p, "a", 2, 9, Gaps::Refused), "refused(Some(8))");
        assert_eq!(admit(&p, "a", 2, 9, Gaps::Allowed), "new");
        assert_eq!(
            admit(&p, "a", 1, 8, Gaps::Allowed),
            "refused(None)",
            "fenced epoch"
        );
        assert_eq!(admit(&p, "a", 1, 3, Gaps::Allowed), "refused(None)");
        assert_eq!(admit(&p, "b", 0, 1, Gaps::Refused), "new");
        p.replayed(&stamp("b", 0, 1, 100), 5);
        assert_eq!(
            admit(&p, "c", 0, 1, Gaps::Refused),
            "refused(None)",
            "past producer_limit (2 here)"
        );
        assert_eq!(
            admit(&p, "b", 0, 2, Gaps::Refused),
            "new",
            "known ones go on"
        );
        for s in 8..8 + WINDOW as u64 {
            p.replayed(&stamp("a", 2, s, 100), s * 10);
        }
        assert_eq!(
            admit(&p, "a", 2, 7, Gaps::Refused),
            "dup",
            "older than the window"
        );
        assert_eq!(
            admit(&p, "a", 2, 8, Gaps::Refused),
            "dup@80",
            "the last WINDOW keep their positions"
        );
    }

    #[test]
    fn idle_producers_expire() {
        let mut p = Producers::default();
        p.replayed(&stamp("old", 1, 1, 1_000), 1);
        p.replayed(&stamp("new", 1, 1, 9_000), 2);
        p.expire(10_000, Duration::from_millis(5_000));
        assert_eq!(p.last("old"), None);
        assert_eq!(p.last("new"), Some((1, 1)));
        assert!(p.is_seen());
        p.expire(20_000, Duration::from_millis(5_000));
        assert_eq!(p.len(), 0);
        assert!(p.is_seen(), "an emptied table still writes checkpoints");
    }
}
