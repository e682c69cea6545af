//! The memwal daemon's services: Arrow Flight ingestion routed by each
//! table's sharding spec to its shards' writers ([`IngestService`],
//! [`TableHost`]), and HTTP health, readiness, status and Prometheus
//! metrics ([`http::router`]).

#![warn(missing_docs)]
#![recursion_limit = "256"]

mod auth;
mod columns;
mod conns;
mod cooperative;
mod decode;
mod error;
mod evolve;
mod flight;
mod flight_ipc;
mod forward;
pub mod http;
mod ingest;
mod limits;
mod long_arithmetic;
mod periodic;
mod placement;
mod producer_gate;
mod producer_meta;
mod provider;
mod query;
mod reader;
mod reads;
mod shards;
mod slots;
mod sql;
mod statement;
mod status;
mod table;
mod table_functions;

pub use arrow_flight::flight_service_server::FlightServiceServer;
pub use conns::{limited_incoming, LimitedConnection};
pub use decode::IngestLimits;
pub use error::{FailedPart, ServerError, EXPECTED_SEQUENCE_KEY};
pub use flight::IngestService;
pub use forward::{PeerAccess, FORWARDED_HEADER};
pub use ingest::{FlushTurn, PartAck, MIN_FLUSH_INTERVAL};
pub use limits::ShardLimits;
pub use memwal::ProducerSeq;
pub use query::{QueryLimits, QUERY_MEMORY_BYTES, QUERY_TIMEOUT};
pub use reader::lookup::KeyTuples;
pub use reader::search::{DISTANCE_COLUMN, SCORE_COLUMN};
pub use status::ShardStatus;
pub use table::{ShardKey, TableHost};
