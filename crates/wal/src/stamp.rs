//! Producer stamps: who wrote an append, recorded in its WAL entry
//! (docs/design/idempotent-producers.md).
//!
//! An entry's stamps are the value of [`PRODUCERS_KEY`] in the metadata
//! of the entry schema's *last field* (`_tombstone` in a storage batch): a
//! JSON array of `{"producer", "epoch", "sequence", "at_ms"}`, one per
//! stamped append the entry groups (in submit order). Entries without
//! stamped appends carry no such key.
//!
//! Not in the schema-level metadata: upstream 14.0.2's replay keeps
//! unknown schema-level keys on the batches it decodes and its memtable
//! then refuses them (the batch schema must equal the memtable's, metadata
//! included), whereas batches whose fields differ from its storage schema
//! (here: one field's metadata) are rebuilt under that schema, which drops
//! the key. `tests/takeover/producers.rs` holds upstream to that.

use std::sync::Arc;

use arrow_schema::{FieldRef, Fields};
use serde::{Deserialize, Serialize};

/// Field metadata key of an entry's producer stamps (a JSON array), on the
/// entry schema's last field.
pub const PRODUCERS_KEY: &str = "memwal:producers";

/// Longest producer id accepted, in bytes.
pub const MAX_PRODUCER_ID_BYTES: usize = 256;

/// One stamped append: the rows a producer sent as `sequence` while it
/// held `epoch`, written at `at_ms` (milliseconds since the Unix epoch, by
/// the writer's clock).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerStamp {
    /// The producer's id (1..=[`MAX_PRODUCER_ID_BYTES`] bytes of printable
    /// ASCII, [`check_producer_id`]).
    pub producer: String,
    /// The producer's epoch: a restarted producer raises it to fence its
    /// older incarnation.
    pub epoch: u64,
    /// The sequence number the producer gave the batch.
    pub sequence: u64,
    /// When the writer took the append.
    pub at_ms: u64,
}

/// Why `id` cannot name a producer, if it cannot: empty, longer than
/// [`MAX_PRODUCER_ID_BYTES`], or holding anything but printable ASCII
/// (no spaces or control characters).
pub fn check_producer_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("the producer id is empty".into());
    }
    if id.len() > MAX_PRODUCER_ID_BYTES {
        return Err(format!(
            "the producer id is {} bytes long, more than {MAX_PRODUCER_ID_BYTES}",
            id.len()
        ));
    }
    if let Some(c) = id.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(format!(
            "the producer id {id:?} holds {c:?}: only printable ASCII without spaces is allowed"
        ));
    }
    Ok(())
}

/// `fields` with `value` under [`PRODUCERS_KEY`] in the last one's
/// metadata (`fields` must not be empty).
pub(crate) fn on_last_field(fields: &Fields, value: String) -> Fields {
    let mut out: Vec<FieldRef> = fields.iter().cloned().collect();
    if let Some(last) = out.last_mut() {
        let mut metadata = last.metadata().clone();
        metadata.insert(PRODUCERS_KEY.to_string(), value);
        *last = Arc::new(last.as_ref().clone().with_metadata(metadata));
    }
    out.into()
}

/// `fields` without any [`PRODUCERS_KEY`] metadata, and the stamps the
/// last field carried; an error names a malformed value.
pub(crate) fn take_from_fields(fields: &Fields) -> Result<(Fields, Vec<ProducerStamp>), String> {
    if !fields
        .iter()
        .any(|f| f.metadata().contains_key(PRODUCERS_KEY))
    {
        return Ok((fields.clone(), Vec::new()));
    }
    let mut stamps = Vec::new();
    let mut out = Vec::with_capacity(fields.len());
    for (i, f) in fields.iter().enumerate() {
        let Some(value) = f.metadata().get(PRODUCERS_KEY) else {
            out.push(f.clone());
            continue;
        };
        if i + 1 != fields.len() {
            return Err(format!(
                "`{PRODUCERS_KEY}` is on field `{}`, not the last one",
                f.name()
            ));
        }
        stamps = decode(value)?;
        let mut metadata = f.metadata().clone();
        metadata.remove(PRODUCERS_KEY);
        out.push(Arc::new(f.as_ref().clone().with_metadata(metadata)));
    }
    Ok((out.into(), stamps))
}

/// The metadata value for `stamps`; `None` when there are none.
pub(crate) fn encode(stamps: &[ProducerStamp]) -> Option<String> {
    if stamps.is_empty() {
        return None;
    }
    // Serializing plain strings and integers cannot fail.
    serde_json::to_string(stamps).ok()
}

/// The stamps of an entry's metadata value; an error names what is wrong.
pub(crate) fn decode(value: &str) -> Result<Vec<ProducerStamp>, String> {
    let stamps: Vec<ProducerStamp> = serde_json::from_str(value)
        .map_err(|e| format!("`{PRODUCERS_KEY}` is not a list of producer stamps: {e}"))?;
    for s in &stamps {
        check_producer_id(&s.producer).map_err(|e| format!("`{PRODUCERS_KEY}`: {e}"))?;
    }
    Ok(stamps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(producer: &str, sequence: u64) -> ProducerStamp {
        ProducerStamp {
            producer: producer.into(),
            epoch: 2,
            sequence,
            at_ms: 1_700_000_000_000,
        }
    }

    #[test]
    fn stamps_round_trip_and_bad_values_are_refused() {
        let stamps = vec![stamp("a", 1), stamp("flink-job-7/sub-3", u64::MAX)];
        let text = encode(&stamps).unwrap();
        assert_eq!(decode(&text).unwrap(), stamps);
        assert_eq!(encode(&[]), None);
        for bad in [
            "",
            "{}",
            "[{\"producer\":\"a\"}]",
            "[{\"producer\":\"\",\"epoch\":1,\"sequence\":1,\"at_ms\":0}]",
            "[{\"producer\":\"a b\",\"epoch\":1,\"sequence\":1,\"at_ms\":0}]",
            "[{\"producer\":\"a\",\"epoch\":-1,\"sequence\":1,\"at_ms\":0}]",
        ] {
            assert!(decode(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn producer_ids_are_checked() {
        assert!(check_producer_id("job-1.task:3/x").is_ok());
        assert!(check_producer_id(&"x".repeat(MAX_PRODUCER_ID_BYTES)).is_ok());
        for bad in [
            String::new(),
            "x".repeat(MAX_PRODUCER_ID_BYTES + 1),
            "a b".into(),
            "tab\there".into(),
            "é".into(),
        ] {
            assert!(check_producer_id(&bad).is_err(), "{bad:?}");
        }
    }
}
