//! What a read taken while writes run may show, and [`check_read`], which
//! reports every way a read contradicts the history of writes.
//!
//! A read spans a window: it begins after some writes were acknowledged
//! ([`ReadWindow::open`], taken from the writes recorded so far) and ends
//! before later ones were issued ([`ReadWindow::close`]). Judged once every
//! write's outcome is known, for each key it shows
//!
//! 1. the value of its newest write acknowledged before the read began,
//!    or of a later write (issued before the read ended, not refused); a
//!    key whose newest acknowledged write before the read was a put is
//!    present unless a later, not refused delete may have removed it:
//!    [`ReadViolation::Lost`] (an acknowledged write missing, an older
//!    value back, a deleted key back);
//! 2. no value of a write that was refused (definitely not written, such
//!    as a write whose WAL entry lost to a new owner): a read that showed
//!    a write before it was durable: [`ReadViolation::Refused`];
//! 3. no value no client sent, none issued only after the read ended, and
//!    no key twice: [`ReadViolation::Impossible`].
//!
//! A read that is refused shows nothing and breaks nothing.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use crate::invariants::{Op, Outcome, View};

/// The writes a read is judged against: what was acknowledged before it
/// began, and how many writes were issued before it ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadWindow {
    /// Per key, the issue number (`seq`) of its newest write acknowledged
    /// before the read began.
    acked_before: BTreeMap<i64, u64>,
    /// Writes issued before the read ended have a `seq` below this.
    issued_before: u64,
}

impl ReadWindow {
    /// A window opened just before a read starts, over `recorded`: the
    /// writes whose outcome was recorded by then.
    pub fn open(recorded: &[Op]) -> Self {
        let mut acked_before: BTreeMap<i64, u64> = BTreeMap::new();
        for op in recorded.iter().filter(|o| o.outcome == Outcome::Acked) {
            let newest = acked_before.entry(op.key).or_insert(op.seq);
            *newest = (*newest).max(op.seq);
        }
        Self {
            acked_before,
            issued_before: u64::MAX,
        }
    }

    /// Closes the window once the read answered: `issued` writes had been
    /// issued by then (the next write's `seq`).
    pub fn close(mut self, issued: u64) -> Self {
        self.issued_before = issued;
        self
    }
}

/// One contradiction between a read and the history of writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadViolation {
    /// Rule 1: the newest write of `key` acknowledged before the read
    /// (`seq`) is not what it showed (`shown`: an older value, or nothing).
    Lost {
        key: i64,
        seq: u64,
        shown: Option<String>,
    },
    /// Rule 2: `key` showed the value of write `seq`, which was refused.
    Refused { key: i64, seq: u64 },
    /// Rule 3: `key` showed something no read could (`why`).
    Impossible { key: i64, why: String },
}

impl ReadViolation {
    /// The rule broken (see the module docs).
    pub fn rule(&self) -> u8 {
        match self {
            ReadViolation::Lost { .. } => 1,
            ReadViolation::Refused { .. } => 2,
            ReadViolation::Impossible { .. } => 3,
        }
    }
}

impl fmt::Display for ReadViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadViolation::Lost { key, seq, shown } => write!(
                f,
                "key {key}: write #{seq}, acknowledged before the read began, not shown \
                 (showed {shown:?})"
            ),
            ReadViolation::Refused { key, seq } => {
                write!(f, "key {key}: showed refused write #{seq}")
            }
            ReadViolation::Impossible { key, why } => write!(f, "key {key}: {why}"),
        }
    }
}

/// Every contradiction between `read` (taken in `window`) and `ops` (every
/// write of the run, with its final outcome), for keys in `keys`.
pub fn check_read(
    read: &View,
    window: &ReadWindow,
    ops: &[Op],
    keys: Range<i64>,
) -> Vec<ReadViolation> {
    let mut out: Vec<ReadViolation> = read
        .duplicates
        .iter()
        .map(|&key| ReadViolation::Impossible {
            key,
            why: "shown twice".into(),
        })
        .collect();
    let by_seq: BTreeMap<u64, &Op> = ops.iter().map(|o| (o.seq, o)).collect();
    for (&key, value) in &read.rows {
        let sent = ops
            .iter()
            .find(|o| o.key == key && o.value.as_deref() == Some(value.as_str()));
        let Some(op) = sent.filter(|_| keys.contains(&key)) else {
            out.push(ReadViolation::Impossible {
                key,
                why: format!("showed {value:?}, which no client sent"),
            });
            continue;
        };
        if op.seq >= window.issued_before {
            out.push(ReadViolation::Impossible {
                key,
                why: format!("showed write #{}, issued after the read ended", op.seq),
            });
        } else if op.outcome == Outcome::Refused {
            out.push(ReadViolation::Refused { key, seq: op.seq });
        } else if let Some(&acked) = window.acked_before.get(&key) {
            if op.seq < acked {
                out.push(ReadViolation::Lost {
                    key,
                    seq: acked,
                    shown: Some(value.clone()),
                });
            }
        }
    }
    for (&key, &acked) in &window.acked_before {
        if read.rows.contains_key(&key) || !keys.contains(&key) {
            continue;
        }
        let was_put = by_seq.get(&acked).is_some_and(|o| o.value.is_some());
        let deleted_since = ops.iter().any(|o| {
            o.key == key
                && o.value.is_none()
                && o.seq > acked
                && o.seq < window.issued_before
                && o.outcome != Outcome::Refused
        });
        if was_put && !deleted_since {
            out.push(ReadViolation::Lost {
                key,
                seq: acked,
                shown: None,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(seq: u64, key: i64, value: Option<&str>, outcome: Outcome) -> Op {
        Op {
            seq,
            key,
            value: value.map(str::to_string),
            outcome,
            writer: 1,
        }
    }

    fn view(rows: &[(i64, &str)]) -> View {
        let mut v = View::default();
        for (k, s) in rows {
            v.push(*k, s.to_string());
        }
        v
    }

    #[test]
    fn each_rule_is_reported_and_allowed_reads_pass() {
        use Outcome::*;
        let ops = vec![
            op(0, 1, Some("a"), Acked),
            op(1, 2, Some("b"), Acked),
            op(2, 1, Some("c"), Unknown),
            op(3, 2, None, Acked),
            op(4, 3, Some("d"), Refused),
            op(5, 1, Some("e"), Acked),
        ];
        // Opened after #0, #1 and #3 were acknowledged; #2, #4, #5 in
        // flight; closed before #5 was issued.
        let window = ReadWindow::open(&ops[..4]).close(5);
        let check = |rows: &[(i64, &str)]| check_read(&view(rows), &window, &ops, 0..10);
        // The acked state, or an in-flight write's value: allowed.
        assert_eq!(check(&[(1, "a")]), []);
        assert_eq!(check(&[(1, "c")]), []);
        // 1: an acked put missing, a deleted key back.
        assert!(matches!(
            check(&[])[..],
            [ReadViolation::Lost { key: 1, seq: 0, .. }]
        ));
        assert!(matches!(
            check(&[(1, "a"), (2, "b")])[..],
            [ReadViolation::Lost { key: 2, seq: 3, .. }]
        ));
        // 2: a refused write shown.
        assert!(matches!(
            check(&[(1, "a"), (3, "d")])[..],
            [ReadViolation::Refused { key: 3, seq: 4 }]
        ));
        // 3: issued after the read, never sent, twice.
        assert_eq!(check(&[(1, "e")])[0].rule(), 3);
        assert_eq!(check(&[(1, "a"), (7, "z")])[0].rule(), 3);
        let mut twice = view(&[(1, "a")]);
        twice.push(1, "a".into());
        assert_eq!(check_read(&twice, &window, &ops, 0..10)[0].rule(), 3);
        // A later acked value (#5) is newer than the read's window: once
        // the window includes it, the older value is a lost ack.
        let later = ReadWindow::open(&ops).close(6);
        assert!(matches!(
            check_read(&view(&[(1, "a")]), &later, &ops, 0..10)[..],
            [ReadViolation::Lost { key: 1, seq: 5, .. }]
        ));
    }
}
