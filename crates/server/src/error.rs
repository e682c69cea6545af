//! The crate's error type and its mapping to Flight status codes.

use tonic::{Code, Status};

/// Why a request or the server failed. Every variant names the table (and
/// the shard where one is involved).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// No table of that name is served.
    #[error("no table `{0}` is served here")]
    UnknownTable(String),
    /// The request is malformed (descriptor, schema, keys, size).
    #[error("table `{table}`: {reason}")]
    InvalidInput {
        /// The table.
        table: String,
        /// What was wrong.
        reason: String,
    },
    /// A shard's writer refused or failed the write.
    #[error("table `{table}`, shard {shard}: {source}")]
    Writer {
        /// The table.
        table: String,
        /// The shard.
        shard: String,
        /// What the writer reported.
        #[source]
        source: memwal::Error,
    },
    /// The shard is moving between the daemons of a cluster (handed over,
    /// its owner gone and not yet replaced, or this daemon cut off from
    /// etcd): nothing was written; a retry lands on the new owner.
    #[error("table `{table}`, shard {shard}: moving ({reason}); retry")]
    Moving {
        /// The table.
        table: String,
        /// The shard.
        shard: String,
        /// Why it cannot be written here now.
        reason: String,
    },
    /// A part forwarded to the shard's owner in the cluster failed there
    /// (or could not reach it); `code` is the owner's status code.
    #[error("table `{table}`, shard {shard}: forwarded to {owner}: {message}")]
    Forwarded {
        /// The table.
        table: String,
        /// The shard(s) of the part.
        shard: String,
        /// The owner's advertised address.
        owner: String,
        /// The status code the owner (or the transport) answered.
        code: Code,
        /// Its message.
        message: String,
    },
    /// The shard was taken over by another writer; this daemon no longer
    /// serves it.
    #[error("table `{table}`, shard {shard}: served elsewhere now ({reason})")]
    ServedElsewhere {
        /// The table.
        table: String,
        /// The shard.
        shard: String,
        /// What was observed (the epochs).
        reason: String,
    },
    /// The shard is down: its writer stopped on a storage failure (or could
    /// not open), and it is reopened with backoff. Nothing was written.
    #[error("table `{table}`, shard {shard}: down for {down_secs} s ({cause}); next reopen in {retry_in_ms} ms")]
    Down {
        /// The table.
        table: String,
        /// The shard.
        shard: String,
        /// Why it went down.
        cause: String,
        /// Seconds it has been down.
        down_secs: u64,
        /// When the next reopen is tried.
        retry_in_ms: u64,
    },
    /// Some parts of a batch are durable, others failed: the outcome is
    /// partial (`ABORTED`, the parts in the status metadata
    /// `memwal-durable-parts` and `memwal-failed-parts`, JSON). Retrying the
    /// whole batch is safe for a keyed table (last write wins) but appends
    /// the durable parts again to an append-only one.
    #[error("table `{table}`: partly written: {} parts durable ({}); {} failed: {}", .durable.len(), durable_text(.durable), .failed.len(), failed_text(.failed))]
    Partial {
        /// The table.
        table: String,
        /// The durable parts.
        durable: Vec<crate::PartAck>,
        /// The parts that failed.
        failed: Vec<FailedPart>,
    },
    /// An idempotent producer's batch was refused before anything was
    /// written: its epoch is older than one it already wrote with
    /// (fenced), or its sequence leaves a gap (`expected` names the next
    /// sequence taken; also in the status metadata
    /// `memwal-expected-sequence`). `FAILED_PRECONDITION`.
    #[error("table `{table}`: producer {producer} refused: {reason}")]
    Producer {
        /// The table.
        table: String,
        /// The producer's id.
        producer: String,
        /// Why.
        reason: String,
        /// For a gap: the sequence expected next.
        expected: Option<u64>,
    },
    /// The daemon is stopping: the table's shards are closing and take no
    /// more rows. Nothing was written.
    #[error("table `{table}`: the daemon is stopping; no more rows are taken")]
    Stopping {
        /// The table.
        table: String,
    },
    /// A request came too soon after the last of its kind (a `flush`
    /// action). Nothing was done.
    #[error("table `{table}`: {what}; try again later")]
    TooFrequent {
        /// The table.
        table: String,
        /// What was refused.
        what: String,
    },
    /// Rows for a shard that is not open would open one more than the
    /// table's cap (`max_open_shards`). Nothing was written.
    #[error(
        "table `{table}`: {open} shards are open, the cap (max_open_shards) is {cap}; \
         rows for a new shard are refused until an idle one closes"
    )]
    ShardLimit {
        /// The table.
        table: String,
        /// Shards open (or opening, or down) now.
        open: usize,
        /// The cap.
        cap: usize,
    },
    /// Reading the table's published state failed (the view: shard
    /// manifests and the base table; or the levels a read merges).
    /// `UNAVAILABLE` when the failure is a transient storage failure
    /// ([`memwal_table::TableError::is_transient`]: timeouts, connection
    /// failures, throttling, 5xx), which a retry of the read may pass;
    /// `INTERNAL` otherwise. Nothing was read.
    #[error("table `{table}`: {what}: {source}")]
    Read {
        /// The table.
        table: String,
        /// What the read was doing.
        what: &'static str,
        /// What failed.
        #[source]
        source: memwal_table::TableError,
    },
    /// Reading the unpublished rows of a shard this daemon holds no writer
    /// for from its WAL failed (`reader/tails.rs`): `DATA_LOSS` for an
    /// entry that does not decode or fit the table, `UNAVAILABLE` for a
    /// storage failure (after retries), `INTERNAL` otherwise. Nothing was
    /// read.
    #[error(
        "table `{table}`: reading the unpublished rows of shard {shard} from its WAL: {source}"
    )]
    WalTail {
        /// The table.
        table: String,
        /// The shard.
        shard: String,
        /// What failed.
        #[source]
        source: Box<memwal_wal::WalError>,
    },
    /// A read for a query needed more memory than the query's budget
    /// left (`RESOURCE_EXHAUSTED`): charged before it was taken.
    #[error("table `{table}`: {what}: {source}")]
    OverBudget {
        /// The table.
        table: String,
        /// What the read was doing.
        what: &'static str,
        /// The memory pool's refusal.
        #[source]
        source: datafusion::error::DataFusionError,
    },
    /// Setting up a table failed.
    #[error("table `{table}`: {reason}")]
    Setup {
        /// The table.
        table: String,
        /// What failed.
        reason: String,
    },
}

/// A part of a batch that failed while others became durable.
#[derive(Debug, Clone, serde::Serialize, PartialEq, Eq)]
pub struct FailedPart {
    /// The shard.
    pub shard: String,
    /// Rows of the part.
    pub rows: usize,
    /// The status code the part alone would have had.
    pub code: String,
    /// Whether its rows may nevertheless be durable.
    pub outcome_unknown: bool,
    /// What failed.
    pub error: String,
}

fn durable_text(parts: &[crate::PartAck]) -> String {
    parts
        .iter()
        .map(|p| match p.wal_position {
            Some(at) => format!("{}: {} rows at {at}", p.shard, p.rows),
            None => format!("{}: {} rows (written before)", p.shard, p.rows),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn failed_text(parts: &[FailedPart]) -> String {
    parts
        .iter()
        .map(|p| format!("{}: {} rows, {}: {}", p.shard, p.rows, p.code, p.error))
        .collect::<Vec<_>>()
        .join("; ")
}

impl ServerError {
    /// Whether the rows of a failed write may nevertheless be durable (an
    /// unknown outcome, or a partial one).
    pub fn may_be_durable(&self) -> bool {
        match self {
            ServerError::Writer { source, .. } => source.may_be_durable(),
            ServerError::Partial { .. } => true,
            ServerError::Forwarded { code, .. } => forwarded_may_be_durable(*code),
            _ => false,
        }
    }

    /// The shard the error concerns, when one does.
    pub fn shard(&self) -> Option<&str> {
        match self {
            ServerError::Writer { shard, .. }
            | ServerError::ServedElsewhere { shard, .. }
            | ServerError::Moving { shard, .. }
            | ServerError::Forwarded { shard, .. }
            | ServerError::Down { shard, .. }
            | ServerError::WalTail { shard, .. } => Some(shard),
            _ => None,
        }
    }
}

/// Metadata key of a refused producer batch's status: the sequence the
/// daemon (or a shard) expects next (decimal).
pub const EXPECTED_SEQUENCE_KEY: &str = "memwal-expected-sequence";

/// Metadata keys of a partial outcome's status.
pub const DURABLE_PARTS_KEY: &str = "memwal-durable-parts";
/// See [`DURABLE_PARTS_KEY`].
pub const FAILED_PARTS_KEY: &str = "memwal-failed-parts";

impl From<ServerError> for Status {
    fn from(e: ServerError) -> Self {
        let code = code_of(&e);
        let mut metadata = tonic::metadata::MetadataMap::new();
        if let ServerError::Partial {
            durable, failed, ..
        } = &e
        {
            let ascii = |v: serde_json::Value| {
                let text: String = v
                    .to_string()
                    .chars()
                    .map(|c| {
                        if c.is_ascii() && !c.is_ascii_control() {
                            c
                        } else {
                            '?'
                        }
                    })
                    .collect();
                tonic::metadata::MetadataValue::try_from(text).ok()
            };
            if let Some(v) = ascii(serde_json::json!(durable)) {
                metadata.insert(DURABLE_PARTS_KEY, v);
            }
            if let Some(v) = ascii(serde_json::json!(failed)) {
                metadata.insert(FAILED_PARTS_KEY, v);
            }
        }
        let expected = match &e {
            ServerError::Producer { expected, .. } => *expected,
            ServerError::Writer {
                source: memwal::Error::ProducerRefused { expected, .. },
                ..
            } => *expected,
            _ => None,
        };
        if let Some(v) = expected.and_then(|n| n.to_string().parse().ok()) {
            metadata.insert(EXPECTED_SEQUENCE_KEY, v);
        }
        Status::with_metadata(code, e.to_string(), metadata)
    }
}

/// The status code of an error: `INVALID_ARGUMENT`, `NOT_FOUND`,
/// `FAILED_PRECONDITION` and `RESOURCE_EXHAUSTED` mean nothing of the batch
/// was written; `UNAVAILABLE` that nothing was, or (for an unknown outcome)
/// that it may have been; `ABORTED` that some parts are durable. A read
/// that failed on a transient storage failure is `UNAVAILABLE` (try
/// again), on any other `INTERNAL`.
/// Whether a forwarded part that ended with `code` may have been written
/// by its owner: the owner's definite codes say nothing was; an unknown
/// outcome there (or a transport failure after the part was sent) may
/// have left it durable.
fn forwarded_may_be_durable(code: Code) -> bool {
    matches!(
        code,
        Code::Unknown | Code::Internal | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted
    )
}

pub(crate) fn code_of(e: &ServerError) -> Code {
    match e {
        ServerError::Partial { .. } => Code::Aborted,
        ServerError::Down { .. } | ServerError::Stopping { .. } | ServerError::Moving { .. } => {
            Code::Unavailable
        }
        ServerError::Forwarded { code, .. } => *code,
        ServerError::TooFrequent { .. }
        | ServerError::ShardLimit { .. }
        | ServerError::OverBudget { .. } => Code::ResourceExhausted,
        ServerError::UnknownTable(_) => Code::NotFound,
        ServerError::InvalidInput { .. } => Code::InvalidArgument,
        ServerError::ServedElsewhere { .. } | ServerError::Producer { .. } => {
            Code::FailedPrecondition
        }
        ServerError::Setup { .. } => Code::Internal,
        ServerError::Read { source, .. } if source.is_transient() => Code::Unavailable,
        ServerError::Read { .. } => Code::Internal,
        ServerError::WalTail { source, .. } => match source.as_ref() {
            memwal_wal::WalError::Corrupt { .. } => Code::DataLoss,
            memwal_wal::WalError::Storage(_) | memwal_wal::WalError::Fencing(_) => {
                Code::Unavailable
            }
            _ => Code::Internal,
        },
        ServerError::Writer { source, .. } => match source {
            memwal::Error::Fenced { .. }
            | memwal::Error::Sealed { .. }
            | memwal::Error::ProducerRefused { .. } => Code::FailedPrecondition,
            memwal::Error::InvalidInput { .. } => Code::InvalidArgument,
            memwal::Error::Backpressure { .. } => Code::ResourceExhausted,
            memwal::Error::OutcomeUnknown { .. } => Code::Unavailable,
            memwal::Error::Closed { .. } => Code::Unavailable,
            memwal::Error::Storage { .. } => Code::Unavailable,
            // Stored state that does not decode: retrying cannot help.
            memwal::Error::Corrupt { .. } => Code::DataLoss,
            // A kind added later (the enum is non-exhaustive): never a
            // definite code until it is mapped here.
            _ => Code::Unavailable,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_failure(source: object_store::Error) -> ServerError {
        ServerError::Read {
            table: "t".into(),
            what: "reading the published view",
            source: memwal_table::TableError::Store {
                path: "t/_mem_wal".into(),
                source: Box::new(source),
            },
        }
    }

    // Breaks if a read that failed on a transient storage failure is not
    // UNAVAILABLE (a client would not retry it), or if a definite failure
    // is (a client would retry what cannot pass).
    #[test]
    fn a_read_failure_is_unavailable_only_when_storage_may_recover() {
        let reset = read_failure(object_store::Error::Generic {
            store: "S3",
            source: "connection reset by peer".into(),
        });
        assert_eq!(Status::from(reset).code(), Code::Unavailable);
        let denied = read_failure(object_store::Error::PermissionDenied {
            path: "t/_mem_wal".into(),
            source: "403 Forbidden".into(),
        });
        assert_eq!(Status::from(denied).code(), Code::Internal);
        let corrupt = ServerError::Read {
            table: "t".into(),
            what: "reading the published view",
            source: memwal_table::TableError::Corrupt {
                uri: "t".into(),
                reason: "a compacted_sstables entry has no valid shard id".into(),
            },
        };
        assert_eq!(Status::from(corrupt).code(), Code::Internal);
    }
}
