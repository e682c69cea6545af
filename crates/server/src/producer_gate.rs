//! The daemon's side of idempotent producers
//! (docs/design/idempotent-producers.md): per table and producer id, one
//! batch at a time, in sequence order.
//!
//! A batch is split by shard, and each shard sees only the sequences whose
//! batches had rows for it, so shards deduplicate (a sequence at or below
//! the producer's last one there is not written again) but cannot see a
//! gap. The gate sees the producer's whole sequence through this daemon:
//!
//! - one batch of a producer is written at a time (a second one waits for
//!   the first's outcome), so at every shard the producer's sequences
//!   land in order and a batch is complete, or reported failed, before the
//!   next is admitted;
//! - a batch past the next expected sequence is refused
//!   (`FAILED_PRECONDITION`, naming the expected one), as is an epoch below
//!   the producer's highest seen here;
//! - the next expected sequence moves past a batch only once every part of
//!   it is durable (written now or found written before), so after a
//!   failure or a partial outcome the producer must retry that batch
//!   before any later one is taken.
//!
//! The gate lives in memory: a restarted daemon takes a producer's first
//! batch at any sequence (the shards' records still deduplicate it), which
//! is safe for a producer that retries in order from its oldest
//! unacknowledged batch, as an at-least-once engine does.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::time::{Duration, Instant};

/// One producer's place in its sequence, as this daemon saw it.
#[derive(Debug)]
pub(crate) struct Place {
    /// The highest epoch seen.
    pub epoch: u64,
    /// The sequence expected next (`None`: no batch of it completed here).
    pub next: Option<u64>,
}

impl Place {
    /// Why `epoch`/`sequence` cannot be taken now, if it cannot, and the
    /// expected sequence for a gap.
    pub(crate) fn refusal(&self, epoch: u64, sequence: u64) -> Option<(String, Option<u64>)> {
        if epoch < self.epoch {
            return Some((
                format!(
                    "epoch {epoch} is fenced: the producer already wrote with epoch {} here",
                    self.epoch
                ),
                None,
            ));
        }
        match self.next {
            Some(next) if sequence > next => Some((
                format!("sequence {sequence} leaves a gap: the next expected is {next}"),
                Some(next),
            )),
            _ => None,
        }
    }

    /// Records a batch every part of which is durable.
    pub(crate) fn completed(&mut self, epoch: u64, sequence: u64) {
        self.epoch = self.epoch.max(epoch);
        let after = sequence.saturating_add(1);
        self.next = Some(self.next.map_or(after, |n| n.max(after)));
    }
}

struct Entry {
    place: Arc<tokio::sync::Mutex<Place>>,
    used: Instant,
}

/// Gates of one table's producers.
#[derive(Default)]
pub(crate) struct ProducerGates {
    gates: Mutex<HashMap<String, Entry>>,
}

/// Gates idle this long are forgotten once the table holds many.
const IDLE: Duration = Duration::from_secs(3600);
/// ... more than this many.
const MANY: usize = 4096;

impl ProducerGates {
    /// The gate of `producer` (created on first use); lock it for the
    /// duration of one batch.
    pub(crate) fn of(&self, producer: &str) -> Arc<tokio::sync::Mutex<Place>> {
        let mut gates = self.gates.lock();
        let now = Instant::now();
        if gates.len() >= MANY && !gates.contains_key(producer) {
            gates.retain(|_, e| {
                Arc::strong_count(&e.place) > 1 || now.duration_since(e.used) < IDLE
            });
        }
        let entry = gates.entry(producer.to_string()).or_insert_with(|| Entry {
            place: Arc::new(tokio::sync::Mutex::new(Place {
                epoch: 0,
                next: None,
            })),
            used: now,
        });
        entry.used = now;
        entry.place.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Breaks if a gap or a fenced epoch is taken, if a retry of an earlier
    // batch is refused, or if a failed batch moves the expected sequence.
    #[test]
    fn the_gate_rules() {
        let mut p = Place {
            epoch: 0,
            next: None,
        };
        assert_eq!(p.refusal(1, 40), None, "first contact: any sequence");
        p.completed(1, 40);
        assert_eq!(p.refusal(1, 41), None);
        assert_eq!(p.refusal(1, 40), None, "a retry");
        assert_eq!(p.refusal(1, 3), None, "an old retry");
        assert_eq!(p.refusal(1, 42).unwrap().1, Some(41), "a gap");
        assert_eq!(p.refusal(2, 41), None, "a newer epoch");
        p.completed(2, 41);
        assert!(p.refusal(1, 42).unwrap().0.contains("fenced"));
        p.completed(2, 10);
        assert_eq!(p.next, Some(42), "a retry never moves next back");
    }

    #[tokio::test]
    async fn one_batch_of_a_producer_at_a_time() {
        let gates = ProducerGates::default();
        let a = gates.of("a");
        let held = a.lock().await;
        assert!(gates.of("a").try_lock().is_err(), "the same producer waits");
        assert!(gates.of("b").try_lock().is_ok(), "another does not");
        drop(held);
        assert!(gates.of("a").try_lock().is_ok());
    }
}
