//! The crate's error type and its mapping to Flight status codes.

use tonic::{Code, Status};

/// Why a request or the server failed. Every variant names the table (and
/// the shard where one is involved).
#[derive(Debug, thiserror::Error)]
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
    /// Some parts of a batch are durable, another failed: retrying the whole
    /// batch is safe for a keyed table (last write wins) but appends those
    /// parts again to an append-only one.
    #[error("{source}; parts already durable: {durable}")]
    Partial {
        /// The failure.
        source: Box<ServerError>,
        /// The durable parts (shard: rows at WAL position).
        durable: String,
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

impl From<ServerError> for Status {
    fn from(e: ServerError) -> Self {
        let code = code_of(&e);
        Status::new(code, e.to_string())
    }
}

fn code_of(e: &ServerError) -> Code {
    match e {
        ServerError::Partial { source, .. } => code_of(source),
        ServerError::UnknownTable(_) => Code::NotFound,
        ServerError::InvalidInput { .. } => Code::InvalidArgument,
        ServerError::ServedElsewhere { .. } => Code::FailedPrecondition,
        ServerError::Setup { .. } => Code::Internal,
        ServerError::Writer { source, .. } => match source {
            memwal::Error::Fenced { .. } | memwal::Error::Sealed { .. } => Code::FailedPrecondition,
            memwal::Error::InvalidInput { .. } => Code::InvalidArgument,
            memwal::Error::Backpressure { .. } => Code::ResourceExhausted,
            memwal::Error::OutcomeUnknown { .. } => Code::Unavailable,
            memwal::Error::Closed { .. } => Code::Unavailable,
            memwal::Error::Storage { .. } => Code::Unavailable,
            // Stored state that does not decode: retrying cannot help.
            memwal::Error::Corrupt { .. } => Code::DataLoss,
        },
    }
}
