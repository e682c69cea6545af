//! Where an idempotent producer's id, epoch and sequence come from on the
//! wire (docs/design/idempotent-producers.md, "Clients"):
//!
//! - a Flight `DoPut` batch: its `app_metadata`, a JSON object with
//!   `producer_id` (string), `producer_epoch` (integer, default 0) and
//!   `sequence` (integer), beside the optional `request_id`;
//! - a Flight SQL bulk ingest: the command's options `memwal.producer_id`,
//!   `memwal.producer_epoch`, `memwal.sequence`, or the same as request
//!   headers `memwal-producer-id`, `memwal-producer-epoch`,
//!   `memwal-sequence` (what ADBC's `adbc.flight.sql.rpc.call_header.*`
//!   statement options send); the statement's n-th batch (from 0) is
//!   sequence `memwal.sequence + n`.
//!
//! Metadata without a producer id is a plain put. A producer id with a
//! missing or malformed sequence or epoch is `INVALID_ARGUMENT`: nothing
//! is written.

use std::collections::HashMap;

use memwal::ProducerSeq;
use serde_json::Value;
use tonic::Status;

/// The producer of one `DoPut` batch, from its `app_metadata` parsed as
/// JSON (`None`: it is not JSON).
pub(crate) fn of_batch(
    table: &str,
    app_metadata: Option<&Value>,
) -> Result<Option<ProducerSeq>, Status> {
    let Some(Value::Object(m)) = app_metadata else {
        return Ok(None);
    };
    let Some(id) = m.get("producer_id") else {
        return Ok(None);
    };
    let bad = |what: &str| {
        Status::invalid_argument(format!(
            "put into `{table}`: app_metadata `{what}` must be {}",
            if what == "producer_id" {
                "a string"
            } else {
                "a non-negative integer"
            }
        ))
    };
    let producer = id.as_str().ok_or_else(|| bad("producer_id"))?;
    let epoch = match m.get("producer_epoch") {
        None => 0,
        Some(v) => v.as_u64().ok_or_else(|| bad("producer_epoch"))?,
    };
    let sequence = m
        .get("sequence")
        .and_then(Value::as_u64)
        .ok_or_else(|| bad("sequence"))?;
    checked(table, ProducerSeq::new(producer, epoch, sequence)).map(Some)
}

/// A bulk ingest's producer: batch `n` of the statement is `first + n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StatementProducer {
    producer: String,
    epoch: u64,
    first: u64,
}

impl StatementProducer {
    /// The producer sequence of the statement's batch `n` (from 0).
    pub(crate) fn batch(&self, n: u64) -> ProducerSeq {
        ProducerSeq::new(
            self.producer.clone(),
            self.epoch,
            self.first.saturating_add(n),
        )
    }
}

/// The producer of a bulk ingest, from its command options or, failing
/// those, its request headers.
pub(crate) fn of_statement(
    table: &str,
    options: &HashMap<String, String>,
    headers: &tonic::metadata::MetadataMap,
) -> Result<Option<StatementProducer>, Status> {
    let from_options = options.contains_key("memwal.producer_id");
    let get = |option: &str, header: &str| -> Option<String> {
        if from_options {
            options.get(option).cloned()
        } else {
            headers
                .get(header)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        }
    };
    let Some(producer) = get("memwal.producer_id", "memwal-producer-id") else {
        return Ok(None);
    };
    let number = |option: &str, header: &str, default: Option<u64>| {
        match get(option, header) {
            None => default,
            Some(v) => v.trim().parse::<u64>().ok(),
        }
        .ok_or_else(|| {
            Status::invalid_argument(format!(
                "ingest into `{table}`: `{option}` (or header `{header}`) must be a \
                 non-negative integer"
            ))
        })
    };
    let epoch = number("memwal.producer_epoch", "memwal-producer-epoch", Some(0))?;
    let first = number("memwal.sequence", "memwal-sequence", None)?;
    let seq = checked(table, ProducerSeq::new(producer, epoch, first))?;
    Ok(Some(StatementProducer {
        producer: seq.producer,
        epoch,
        first,
    }))
}

fn checked(table: &str, seq: ProducerSeq) -> Result<ProducerSeq, Status> {
    memwal_wal::check_producer_id(&seq.producer)
        .map_err(|e| Status::invalid_argument(format!("put into `{table}`: {e}")))?;
    Ok(seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Breaks if a producer's metadata is ignored (its batch would be
    // written as a plain put, duplicating on retry) or a malformed one is
    // taken as a plain put.
    #[test]
    fn producer_metadata_is_read_or_refused() {
        let seq = |m: &str| of_batch("t", serde_json::from_str::<Value>(m).ok().as_ref());
        assert_eq!(
            seq(r#"{"producer_id":"p","producer_epoch":2,"sequence":9,"request_id":"r"}"#).unwrap(),
            Some(ProducerSeq::new("p", 2, 9))
        );
        assert_eq!(
            seq(r#"{"producer_id":"p","sequence":0}"#).unwrap(),
            Some(ProducerSeq::new("p", 0, 0))
        );
        for plain in ["", "not json", r#"{"request_id":"r"}"#, "[1]"] {
            assert_eq!(seq(plain).unwrap(), None, "{plain}");
        }
        for bad in [
            r#"{"producer_id":"p"}"#,
            r#"{"producer_id":"p","sequence":-1}"#,
            r#"{"producer_id":"p","sequence":"1"}"#,
            r#"{"producer_id":7,"sequence":1}"#,
            r#"{"producer_id":"","sequence":1}"#,
            r#"{"producer_id":"p","producer_epoch":1.5,"sequence":1}"#,
        ] {
            let e = seq(bad).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}");
        }
    }

    #[test]
    fn statement_producers_come_from_options_or_headers() {
        let none = tonic::metadata::MetadataMap::new();
        let options: HashMap<String, String> = [
            ("memwal.producer_id", "job"),
            ("memwal.producer_epoch", "3"),
            ("memwal.sequence", "100"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into();
        let p = of_statement("t", &options, &none).unwrap().unwrap();
        assert_eq!(p.batch(2), ProducerSeq::new("job", 3, 102));
        let mut headers = tonic::metadata::MetadataMap::new();
        headers.insert("memwal-producer-id", "h".parse().unwrap());
        headers.insert("memwal-sequence", "5".parse().unwrap());
        let p = of_statement("t", &HashMap::new(), &headers)
            .unwrap()
            .unwrap();
        assert_eq!(p.batch(0), ProducerSeq::new("h", 0, 5));
        assert_eq!(of_statement("t", &HashMap::new(), &none).unwrap(), None);
        let mut bad = options.clone();
        bad.remove("memwal.sequence");
        assert_eq!(
            of_statement("t", &bad, &none).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
