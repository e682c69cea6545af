//! The Flight SQL subset memwal speaks: bulk ingest
//! (`CommandStatementIngest`, what ADBC's `adbc_ingest` sends), queries
//! (`CommandStatementQuery`, and prepared statements: create, execute
//! through `GetFlightInfo` / `DoGet`, close; what ADBC's `cursor.execute`
//! sends; see [`crate::query`]), `CommandGetTables` (the served tables,
//! catalog `memwal`, schema `public`) and `CommandGetSqlInfo` (which
//! advertises ingest and SQL). Every other Flight SQL command is refused with `UNIMPLEMENTED`
//! naming it.
//!
//! An ingest appends to a served table: upserts, last write wins by primary
//! key (append-only tables: plain appends). Its one result, the row count,
//! is sent only after every batch of the stream is durable; a failure ends
//! the call with a status saying how many rows before it are durable.

use std::sync::{Arc, OnceLock};

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::{
    ActionCreatePreparedStatementRequest, ActionCreatePreparedStatementResult, Any, Command,
    CommandStatementIngest, DoPutUpdateResult, ProstMessageExt, SqlInfo, SqlSupportedTransaction,
    TableExistsOption, TicketStatementQuery,
};
use arrow_flight::{FlightData, FlightDescriptor, FlightEndpoint, FlightInfo, PutResult, Ticket};
use bytes::Bytes;
use futures::{SinkExt, StreamExt, TryStreamExt};
use prost::Message;
use tonic::Status;

use crate::decode::IngestInput;
use crate::TableHost;

/// What memwal answers to `CommandGetSqlInfo`.
fn sql_info() -> &'static SqlInfoData {
    static INFO: OnceLock<SqlInfoData> = OnceLock::new();
    INFO.get_or_init(|| {
        let mut b = SqlInfoDataBuilder::new();
        b.append(SqlInfo::FlightSqlServerName, "memwal");
        b.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
        b.append(SqlInfo::FlightSqlServerArrowVersion, "58");
        b.append(SqlInfo::FlightSqlServerReadOnly, false);
        b.append(SqlInfo::FlightSqlServerSql, true);
        b.append(SqlInfo::FlightSqlServerSubstrait, false);
        b.append(
            SqlInfo::FlightSqlServerTransaction,
            SqlSupportedTransaction::None as i32,
        );
        b.append(SqlInfo::FlightSqlServerCancel, false);
        b.append(SqlInfo::FlightSqlServerBulkIngestion, true);
        b.append(SqlInfo::FlightSqlServerIngestTransactionsSupported, false);
        b.build().expect("the SQL info values are well-formed")
    })
}

/// Decodes a Flight SQL command carried in a descriptor's `cmd` or a ticket.
pub(crate) fn command(bytes: &[u8]) -> Result<Command, Status> {
    let any = Any::decode(bytes).map_err(|e| {
        Status::invalid_argument(format!("not a Flight SQL command (protobuf Any): {e}"))
    })?;
    Command::try_from(any).map_err(|e| Status::invalid_argument(e.to_string()))
}

fn unsupported(cmd: &Command) -> Status {
    Status::unimplemented(format!(
        "memwal speaks Flight SQL for bulk ingest (CommandStatementIngest), queries \
         (CommandStatementQuery, prepared statements), CommandGetTables and \
         CommandGetSqlInfo, not `{}`",
        cmd.type_url()
    ))
}

/// The SQL text a query command or ticket carries (a prepared statement's
/// handle is its query).
fn query_text(cmd: &Command) -> Option<Result<String, Status>> {
    let bytes: &[u8] = match cmd {
        Command::CommandStatementQuery(q) => return Some(Ok(q.query.clone())),
        Command::CommandPreparedStatementQuery(p) => &p.prepared_statement_handle,
        Command::TicketStatementQuery(t) => &t.statement_handle,
        _ => return None,
    };
    Some(
        String::from_utf8(bytes.to_vec())
            .map_err(|_| Status::invalid_argument("a statement handle memwal did not issue")),
    )
}

/// `GetFlightInfo` for a command descriptor: `CommandGetSqlInfo`, or a
/// query (its result schema; the ticket runs it).
pub(crate) async fn flight_info(
    queries: &crate::query::Queries,
    descriptor: &FlightDescriptor,
) -> Result<FlightInfo, Status> {
    let cmd = command(&descriptor.cmd)?;
    let (schema, ticket) = match &cmd {
        Command::CommandGetSqlInfo(get) => (
            get.clone().into_builder(sql_info()).schema(),
            Ticket::new(get.as_any().encode_to_vec()),
        ),
        Command::CommandGetTables(get) => (
            get.clone().into_builder().schema(),
            Ticket::new(get.as_any().encode_to_vec()),
        ),
        other => match query_text(other) {
            Some(sql) => {
                let sql = sql?;
                let schema = queries.plan(&sql).await?;
                let ticket = TicketStatementQuery {
                    statement_handle: Bytes::from(sql.into_bytes()),
                };
                (schema, Ticket::new(ticket.as_any().encode_to_vec()))
            }
            None => return Err(unsupported(other)),
        },
    };
    FlightInfo::new()
        .try_with_schema(&schema)
        .map_err(|e| Status::internal(e.to_string()))
        .map(|i| {
            i.with_descriptor(descriptor.clone())
                .with_endpoint(FlightEndpoint::new().with_ticket(ticket))
        })
}

/// `GetSchema` for a command descriptor.
pub(crate) async fn schema(
    queries: &crate::query::Queries,
    descriptor: &FlightDescriptor,
) -> Result<arrow_schema::SchemaRef, Status> {
    match command(&descriptor.cmd)? {
        Command::CommandGetSqlInfo(get) => Ok(get.into_builder(sql_info()).schema()),
        Command::CommandGetTables(get) => Ok(get.into_builder().schema()),
        other => match query_text(&other) {
            Some(sql) => queries.plan(&sql?).await,
            None => Err(unsupported(&other)),
        },
    }
}

/// `DoGet` of a ticket [`flight_info`] handed out.
pub(crate) async fn do_get(
    queries: &crate::query::Queries,
    ticket: &Ticket,
) -> Result<futures::stream::BoxStream<'static, Result<FlightData, Status>>, Status> {
    let cmd = command(&ticket.ticket)?;
    let (schema, batches) = match &cmd {
        Command::CommandGetSqlInfo(get) => {
            let batch = get
                .clone()
                .into_builder(sql_info())
                .build()
                .map_err(|e| Status::internal(e.to_string()))?;
            (batch.schema(), one(batch))
        }
        Command::CommandGetTables(get) => {
            let mut b = get.clone().into_builder();
            let tables = queries.hosts();
            let mut names: Vec<&String> = tables.keys().collect();
            names.sort();
            for name in names {
                b.append(
                    crate::query::CATALOG,
                    crate::query::SCHEMA,
                    name,
                    "TABLE",
                    &tables[name].schema(),
                )
                .map_err(|e| Status::internal(e.to_string()))?;
            }
            let batch = b.build().map_err(|e| Status::internal(e.to_string()))?;
            (batch.schema(), one(batch))
        }
        other => match query_text(other) {
            // Streamed as the query produces it.
            Some(sql) => queries.stream(&sql?).await?,
            None => return Err(unsupported(other)),
        },
    };
    let stream = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .build(batches.map_err(|s| arrow_flight::error::FlightError::Tonic(Box::new(s))))
        .map_err(Status::from);
    Ok(stream.boxed())
}

/// One batch as a result stream.
fn one(batch: arrow_array::RecordBatch) -> crate::query::RowStream {
    futures::stream::iter([Ok(batch)]).boxed()
}

/// The Flight SQL actions memwal answers (prepared statements), by type;
/// `None` for any other action type.
pub(crate) async fn action(
    queries: &crate::query::Queries,
    kind: &str,
    body: &[u8],
) -> Option<Result<Vec<arrow_flight::Result>, Status>> {
    let unpack = |body: &[u8]| {
        Any::decode(body)
            .map_err(|e| Status::invalid_argument(format!("{kind}: not a protobuf Any: {e}")))
    };
    match kind {
        "CreatePreparedStatement" => Some(
            async {
                let req: ActionCreatePreparedStatementRequest = unpack(body)?
                    .unpack()
                    .map_err(|e| Status::invalid_argument(e.to_string()))?
                    .ok_or_else(|| {
                        Status::invalid_argument("CreatePreparedStatement: another message")
                    })?;
                let schema = queries.plan(&req.query).await?;
                let schema_bytes =
                    arrow_flight::IpcMessage::try_from(arrow_flight::SchemaAsIpc::new(
                        &schema,
                        &arrow_ipc::writer::IpcWriteOptions::default(),
                    ))
                    .map_err(|e| Status::internal(e.to_string()))?;
                let result = ActionCreatePreparedStatementResult {
                    prepared_statement_handle: Bytes::from(req.query.into_bytes()),
                    dataset_schema: schema_bytes.0,
                    parameter_schema: Bytes::new(),
                };
                Ok(vec![arrow_flight::Result {
                    body: result.as_any().encode_to_vec().into(),
                }])
            }
            .await,
        ),
        // The handle is the query itself: nothing is held to release.
        "ClosePreparedStatement" => Some(Ok(vec![])),
        _ => None,
    }
}

/// The table an ingest command targets, or why it cannot be served. memwal
/// ingests only into existing tables (created with `memwal init`) and never
/// replaces one.
pub(crate) fn ingest_target(cmd: &CommandStatementIngest) -> Result<(), Status> {
    let table = &cmd.table;
    if cmd.temporary {
        return Err(Status::invalid_argument(format!(
            "ingest into `{table}`: memwal has no temporary tables"
        )));
    }
    if cmd.transaction_id.is_some() {
        return Err(Status::invalid_argument(format!(
            "ingest into `{table}`: memwal has no transactions (each batch is durable on its own)"
        )));
    }
    for (what, v) in [("catalog", &cmd.catalog), ("schema", &cmd.schema)] {
        if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
            return Err(Status::invalid_argument(format!(
                "ingest into `{table}`: memwal tables have no {what} (got `{v}`)"
            )));
        }
    }
    let if_exists = cmd
        .table_definition_options
        .as_ref()
        .map(|o| o.if_exists())
        .unwrap_or(TableExistsOption::Unspecified);
    match if_exists {
        TableExistsOption::Append | TableExistsOption::Unspecified => Ok(()),
        TableExistsOption::Fail => Err(Status::already_exists(format!(
            "table `{table}` exists; memwal ingests into existing tables: use mode \"append\""
        ))),
        TableExistsOption::Replace => Err(Status::invalid_argument(format!(
            "ingest into `{table}`: memwal never replaces a table; use mode \"append\""
        ))),
    }
}

/// Writes every batch of a bulk ingest, then sends the one result (the row
/// count) once all of them are durable.
///
/// With a `producer` (idempotent ingest), the statement's n-th batch is
/// written as its sequence `first + n`.
pub(crate) async fn ingest(
    table: Arc<TableHost>,
    producer: Option<crate::producer_meta::StatementProducer>,
    mut input: IngestInput,
    mut tx: futures::channel::mpsc::Sender<Result<PutResult, Status>>,
) {
    let mut rows: i64 = 0;
    let mut batches: u64 = 0;
    while let Some(item) = input.next().await {
        let seq = producer.as_ref().map(|p| p.batch(batches));
        let failure = match item {
            Ok(put) => match table.write_as(&put.batch, false, seq.as_ref()).await {
                Ok(_) => {
                    rows += put.batch.num_rows() as i64;
                    batches += 1;
                    continue;
                }
                Err(e) => Status::from(e),
            },
            Err(status) => status,
        };
        let _ = tx.send(Err(after_durable(failure, rows, batches))).await;
        return;
    }
    let result = DoPutUpdateResult { record_count: rows };
    let _ = tx
        .send(Ok(PutResult {
            app_metadata: Bytes::from(result.encode_to_vec()),
        }))
        .await;
}

/// Metadata key of an ingest's partial outcome: the rows durable before
/// the failure (decimal).
pub const DURABLE_ROWS_KEY: &str = "memwal-durable-rows";

/// The status an ingest ends with when `failure` stops it after `rows`
/// rows in `batches` batches were durable: the failure's own code only
/// when nothing was written (a definite code means nothing of the ingest
/// was); `ABORTED` (partial) otherwise, the durable row count in the
/// metadata `memwal-durable-rows` and the message.
fn after_durable(failure: Status, rows: i64, batches: u64) -> Status {
    let message = format!(
        "ingest: {}; {rows} rows in the {batches} batches before it are durable",
        failure.message()
    );
    if rows == 0 {
        return Status::with_metadata(failure.code(), message, failure.metadata().clone());
    }
    let code = match failure.code() {
        // Unknown outcomes stay unknown; everything else is partial.
        c @ (tonic::Code::Unavailable | tonic::Code::Internal) => c,
        _ => tonic::Code::Aborted,
    };
    let mut metadata = failure.metadata().clone();
    if let Ok(v) = tonic::metadata::MetadataValue::try_from(rows.to_string()) {
        metadata.insert(DURABLE_ROWS_KEY, v);
    }
    Status::with_metadata(code, message, metadata)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_flight::sql::CommandGetSqlInfo;
    use arrow_flight::sql::TableDefinitionOptions;
    use arrow_flight::sql::TableNotExistOption;
    use tonic::Code;

    fn cmd(if_exists: TableExistsOption) -> CommandStatementIngest {
        CommandStatementIngest {
            table_definition_options: Some(TableDefinitionOptions {
                if_not_exist: TableNotExistOption::Fail as i32,
                if_exists: if_exists as i32,
            }),
            table: "t".into(),
            ..Default::default()
        }
    }

    #[test]
    fn append_is_served_and_replace_fail_temporary_transactions_are_refused() {
        assert!(ingest_target(&cmd(TableExistsOption::Append)).is_ok());
        assert!(ingest_target(&cmd(TableExistsOption::Unspecified)).is_ok());
        let code = |c: &CommandStatementIngest| ingest_target(c).unwrap_err().code();
        assert_eq!(code(&cmd(TableExistsOption::Fail)), Code::AlreadyExists);
        assert_eq!(
            code(&cmd(TableExistsOption::Replace)),
            Code::InvalidArgument
        );
        let mut temp = cmd(TableExistsOption::Append);
        temp.temporary = true;
        assert_eq!(code(&temp), Code::InvalidArgument);
        let mut txn = cmd(TableExistsOption::Append);
        txn.transaction_id = Some(Bytes::from_static(b"x"));
        assert_eq!(code(&txn), Code::InvalidArgument);
        let mut cat = cmd(TableExistsOption::Append);
        cat.catalog = Some("c".into());
        assert_eq!(code(&cat), Code::InvalidArgument);
    }

    #[tokio::test]
    async fn sql_info_advertises_bulk_ingest_and_sql_and_queries_plan() {
        let get = CommandGetSqlInfo {
            info: vec![
                SqlInfo::FlightSqlServerBulkIngestion as u32,
                SqlInfo::FlightSqlServerSql as u32,
            ],
        };
        let batch = get.into_builder(sql_info()).build().unwrap();
        assert_eq!(batch.num_rows(), 2);
        let ticket = Ticket::new(CommandGetSqlInfo { info: vec![] }.as_any().encode_to_vec());
        assert!(matches!(
            command(&ticket.ticket).unwrap(),
            Command::CommandGetSqlInfo(_)
        ));
        let queries =
            crate::query::Queries::new(Default::default(), crate::query::QueryLimits::default());
        let query = |q: &str| {
            FlightDescriptor::new_cmd(
                arrow_flight::sql::CommandStatementQuery {
                    query: q.into(),
                    transaction_id: None,
                }
                .as_any()
                .encode_to_vec(),
            )
        };
        let s = schema(&queries, &query("select 1 as one")).await.unwrap();
        assert_eq!(s.field(0).name(), "one");
        let err = schema(&queries, &query("select * from nowhere"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(err.message().contains("nowhere"), "{err}");
        let err = schema(&queries, &query("create table x (a int)"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        let catalogs = FlightDescriptor::new_cmd(
            arrow_flight::sql::CommandGetCatalogs {}
                .as_any()
                .encode_to_vec(),
        );
        let err = schema(&queries, &catalogs).await.unwrap_err();
        assert_eq!(err.code(), Code::Unimplemented);
    }
}
