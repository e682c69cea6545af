//! The Arrow Flight service: `DoPut` ingestion (rows, or key-only deletes
//! with the descriptor path `[NAME, "delete"]`), `GetFlightInfo` /
//! `GetSchema` for a table's schema, `DoAction` `flush`, `evolve` and `status`.
//! Command descriptors and tickets are Flight SQL ([`crate::sql`]: bulk
//! ingest and `GetSqlInfo`).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use arrow_flight::flight_descriptor::DescriptorType;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::Command;
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaAsIpc, SchemaResult, Ticket,
};
use arrow_schema::SchemaRef;
use bytes::Bytes;
use futures::{FutureExt, Stream, StreamExt};
use serde_json::json;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::decode::{panic_message, Budget, IngestInput, IngestLimits};
use crate::{sql, ServerError, TableHost};

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The Flight service over the served tables.
#[derive(Clone)]
pub struct IngestService {
    tables: Arc<HashMap<String, Arc<TableHost>>>,
    token: Option<Arc<str>>,
    budget: Budget,
    queries: crate::query::Queries,
    cut: tokio::sync::watch::Receiver<bool>,
}

impl IngestService {
    /// Serves `tables`; with `token`, every call must carry
    /// `authorization: Bearer TOKEN`.
    pub fn new(tables: Arc<HashMap<String, Arc<TableHost>>>, token: Option<String>) -> Self {
        Self {
            queries: crate::query::Queries::new(
                tables.clone(),
                crate::query::QueryLimits::default(),
            ),
            tables,
            token: token.map(Into::into),
            budget: Budget::new(IngestLimits::default()),
            cut: tokio::sync::watch::channel(false).1,
        }
    }

    /// Open ingest streams end (`UNAVAILABLE`) once `cut` turns true: what
    /// the daemon does when its drain expires.
    pub fn with_cut(mut self, cut: tokio::sync::watch::Receiver<bool>) -> Self {
        self.cut = cut;
        self
    }

    /// Bounds on what one client message may make the daemon decode
    /// (default: [`IngestLimits::default`]).
    pub fn with_limits(mut self, limits: IngestLimits) -> Self {
        self.budget = Budget::new(limits);
        self
    }

    /// What one SQL query may use (default: [`crate::QueryLimits::default`]).
    pub fn with_query_limits(mut self, limits: crate::query::QueryLimits) -> Self {
        self.queries = crate::query::Queries::new(self.tables.clone(), limits);
        self
    }

    fn authorize<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let Some(token) = &self.token else {
            return Ok(());
        };
        let given = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        match given {
            None => Err(Status::unauthenticated(
                "this server requires `authorization: Bearer <token>`",
            )),
            Some(g) if crate::auth::bearer_matches(Some(g), token) => Ok(()),
            Some(_) => Err(Status::unauthenticated("wrong bearer token")),
        }
    }

    fn table(&self, name: &str) -> Result<Arc<TableHost>, Status> {
        self.tables
            .get(name)
            .cloned()
            .ok_or_else(|| ServerError::UnknownTable(name.to_string()).into())
    }

    /// The table and whether the descriptor asks for deletes.
    fn target(&self, d: &FlightDescriptor) -> Result<(Arc<TableHost>, bool), Status> {
        match d.path.as_slice() {
            [name] => Ok((self.table(name)?, false)),
            [name, op] if op == "delete" => Ok((self.table(name)?, true)),
            _ => Err(Status::invalid_argument(format!(
                "descriptor path must be [TABLE] or [TABLE, \"delete\"], got {:?}",
                d.path
            ))),
        }
    }
}

fn schema_result(schema: &SchemaRef) -> Result<SchemaResult, Status> {
    let options = arrow_ipc_options();
    SchemaAsIpc::new(schema, &options)
        .try_into()
        .map_err(|e: arrow_schema::ArrowError| Status::internal(e.to_string()))
}

fn arrow_ipc_options() -> arrow_ipc::writer::IpcWriteOptions {
    arrow_ipc::writer::IpcWriteOptions::default()
}

/// The schema a client sends: metadata-free table fields.
fn wire_schema(schema: &SchemaRef) -> SchemaRef {
    Arc::new(arrow_schema::Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| arrow_schema::Field::new(f.name(), f.data_type().clone(), f.is_nullable()))
            .collect::<Vec<_>>(),
    ))
}

#[tonic::async_trait]
impl FlightService for IngestService {
    type HandshakeStream = Boxed<HandshakeResponse>;
    type ListFlightsStream = Boxed<FlightInfo>;
    type DoGetStream = Boxed<FlightData>;
    type DoPutStream = Boxed<PutResult>;
    type DoExchangeStream = Boxed<FlightData>;
    type DoActionStream = Boxed<arrow_flight::Result>;
    type ListActionsStream = Boxed<ActionType>;

    async fn handshake(
        &self,
        _: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        Err(Status::unimplemented(
            "handshake: send a bearer token instead",
        ))
    }

    async fn list_flights(
        &self,
        request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        self.authorize(&request)?;
        let mut infos = Vec::new();
        for (name, t) in self.tables.iter() {
            infos.push(flight_info(name, &t.schema())?);
        }
        Ok(Response::new(Box::pin(futures::stream::iter(
            infos.into_iter().map(Ok),
        ))))
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.authorize(&request)?;
        if is_command(request.get_ref()) {
            return Ok(Response::new(
                sql::flight_info(&self.queries, request.get_ref()).await?,
            ));
        }
        let (t, _) = self.target(request.get_ref())?;
        let mut info = flight_info(t.name(), &t.schema())?;
        // In a cluster: one endpoint per shard, at its owner, so a client
        // that routes by shard skips the forwarding hop (app_metadata: the
        // shard id and its field values, hex).
        for (shard, values, owner) in t.shard_owners() {
            let metadata = json!({ "shard": shard, "values": values }).to_string();
            info = info.with_endpoint(
                arrow_flight::FlightEndpoint::new()
                    .with_location(owner)
                    .with_app_metadata(metadata.into_bytes()),
            );
        }
        Ok(Response::new(info))
    }

    async fn poll_flight_info(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        Err(Status::unimplemented("poll_flight_info"))
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        self.authorize(&request)?;
        if is_command(request.get_ref()) {
            return Ok(Response::new(schema_result(
                &sql::schema(&self.queries, request.get_ref()).await?,
            )?));
        }
        let (t, delete) = self.target(request.get_ref())?;
        let schema = if delete { t.key_schema() } else { t.schema() };
        Ok(Response::new(schema_result(&wire_schema(&schema))?))
    }

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        self.authorize(&request)?;
        sql::do_get(&self.queries, request.get_ref())
            .await
            .map(Response::new)
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        self.authorize(&request)?;
        // Held until the ingest task ends.
        let stream = self.budget.admit_stream()?;
        let headers = request.metadata().clone();
        let mut input = request.into_inner();
        let wait = self.budget.limits.first_message_timeout;
        let first = tokio::time::timeout(wait, input.message())
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "no first message within {wait:?} (first_message_timeout)"
                ))
            })??
            .ok_or_else(|| Status::invalid_argument("empty DoPut stream"))?;
        let descriptor = first
            .flight_descriptor
            .clone()
            .ok_or_else(|| Status::invalid_argument("the first message carries no descriptor"))?;
        let messages = futures::stream::once(async move { Ok(first) }).chain(input);
        let (tx, rx) = futures::channel::mpsc::channel::<Result<PutResult, Status>>(16);
        let (table, task) = if is_command(&descriptor) {
            let cmd = match sql::command(&descriptor.cmd)? {
                Command::CommandStatementIngest(cmd) => cmd,
                other => {
                    return Err(Status::unimplemented(format!(
                        "DoPut of Flight SQL `{}`: memwal takes only bulk ingest \
                         (CommandStatementIngest) or a path descriptor [TABLE]",
                        other.type_url()
                    )))
                }
            };
            sql::ingest_target(&cmd)?;
            let table = self.table(&cmd.table)?;
            let producer =
                crate::producer_meta::of_statement(table.name(), &cmd.options, &headers)?;
            let input = IngestInput::new(
                table.name(),
                messages,
                self.budget.clone(),
                self.cut.clone(),
            );
            (
                table.clone(),
                sql::ingest(table, producer, input, tx).boxed(),
            )
        } else {
            let (table, delete) = self.target(&descriptor)?;
            // A part another cluster member forwarded: written here or
            // refused, never forwarded again.
            let forwarded = headers.get(crate::forward::FORWARDED_HEADER).is_some();
            let input = IngestInput::new(
                table.name(),
                messages,
                self.budget.clone(),
                self.cut.clone(),
            );
            (
                table.clone(),
                ingest(table, delete, forwarded, input, tx).boxed(),
            )
        };
        let task = async move {
            task.await;
            if let Some(pause) = memwal_store::pause("server::ingest_end") {
                tokio::time::sleep(pause).await;
            }
            drop(stream);
        }
        .boxed();
        Ok(Response::new(spawn_monitored(table.name(), task, rx)))
    }

    async fn do_exchange(
        &self,
        _: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(Status::unimplemented("do_exchange"))
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        self.authorize(&request)?;
        let action = request.into_inner();
        if let Some(results) = sql::action(&self.queries, &action.r#type, &action.body).await {
            let results = results?;
            return Ok(Response::new(Box::pin(futures::stream::iter(
                results.into_iter().map(Ok),
            ))));
        }
        let name = String::from_utf8(action.body.to_vec())
            .map_err(|_| Status::invalid_argument("the action body is the table name (UTF-8)"))?;
        let t = self.table(&name)?;
        let body = match action.r#type.as_str() {
            "flush" => {
                // One flush per table at a time, at most one per second:
                // a client cannot keep the flusher (and the store) busy.
                let _turn = t.begin_flush().map_err(Status::from)?;
                t.flush().await.map_err(Status::from)?;
                json!({ "table": name, "flushed": true })
            }
            "evolve" => {
                // Follow a schema change now rather than at the next poll.
                let changed = t.evolve().await.map_err(Status::from)?;
                json!({
                    "table": name,
                    "changed": changed,
                    "columns": t.schema().fields().iter().map(|f| f.name().clone()).collect::<Vec<_>>(),
                })
            }
            "status" => json!({
                "table": name,
                "shards": t.status().await,
                "index_catchup": t.index_catchup(),
                "maintenance": t.maintenance(),
            }),
            other => {
                return Err(Status::invalid_argument(format!(
                    "unknown action `{other}` (flush, evolve, status)"
                )))
            }
        };
        let result = arrow_flight::Result {
            body: Bytes::from(body.to_string()),
        };
        Ok(Response::new(Box::pin(futures::stream::once(async {
            Ok(result)
        }))))
    }

    async fn list_actions(
        &self,
        request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        self.authorize(&request)?;
        let actions = [
            (
                "flush",
                "freeze, flush and publish every shard of the table named in the body",
            ),
            (
                "evolve",
                "follow the base table's current schema now (every live shard of the table named in the body)",
            ),
            (
                "status",
                "per-shard state of the table named in the body, as JSON",
            ),
        ]
        .map(|(t, d)| {
            Ok(ActionType {
                r#type: t.into(),
                description: d.into(),
            })
        });
        Ok(Response::new(Box::pin(futures::stream::iter(actions))))
    }
}

/// Whether a descriptor carries a (Flight SQL) command rather than a path.
fn is_command(d: &FlightDescriptor) -> bool {
    d.r#type == DescriptorType::Cmd as i32
}

fn flight_info(name: &str, schema: &SchemaRef) -> Result<FlightInfo, Status> {
    FlightInfo::new()
        .try_with_schema(&wire_schema(schema))
        .map_err(|e| Status::internal(e.to_string()))
        .map(|i| i.with_descriptor(FlightDescriptor::new_path(vec![name.to_string()])))
}

/// Runs one put's ingest as its own task and answers with what it sends;
/// the task is watched to its end, so a task that panics ends the call with
/// `INTERNAL` (the batch in flight may or may not be durable; batches
/// acknowledged before it are), never with a plain end of stream, which a
/// client reads as success.
fn spawn_monitored(
    table: &str,
    task: futures::future::BoxFuture<'static, ()>,
    responses: futures::channel::mpsc::Receiver<Result<PutResult, Status>>,
) -> Boxed<PutResult> {
    let table = table.to_string();
    let span = tracing::info_span!("ingest", table = %table);
    let handle = tokio::spawn(task.instrument(span));
    let failure = move |ended: Result<(), tokio::task::JoinError>| {
        let e = ended.err()?;
        let why = if e.is_panic() {
            panic_message(&*e.into_panic())
        } else {
            "the task was cancelled".to_string()
        };
        metrics::counter!("memwal_server_ingest_failures_total", "table" => table.clone())
            .increment(1);
        tracing::error!(table = %table, error = %why, "an ingest task failed");
        Some(Status::internal(format!(
            "table `{table}`: the put failed inside the daemon ({why}); the outcome of the \
             batch in flight is unknown (batches acknowledged before it are durable)"
        )))
    };
    // The call's last word (its error, or the end of the stream) reaches
    // the client only once the task has ended, so the resources the task
    // held (its `max_streams` place, decoded bytes) are free by then: a
    // client that sends its next call on seeing the answer is not refused
    // for its own finished call.
    let replies = futures::stream::unfold(Some((responses, handle, failure)), |state| async move {
        let (mut responses, handle, failure) = state?;
        match responses.next().await {
            Some(Ok(reply)) => Some((Ok(reply), Some((responses, handle, failure)))),
            Some(Err(status)) => {
                // A task that fails after its answer is still counted and
                // logged; the client keeps the answer it was sent.
                let _logged = failure(handle.await);
                Some((Err(status), None))
            }
            None => failure(handle.await).map(|status| (Err(status), None)),
        }
    });
    Box::pin(replies)
}

/// Writes each decoded batch and sends its acknowledgement once durable;
/// the first failure ends the stream with its status.
async fn ingest(
    table: Arc<TableHost>,
    delete: bool,
    forwarded: bool,
    mut input: IngestInput,
    mut tx: futures::channel::mpsc::Sender<Result<PutResult, Status>>,
) {
    use futures::SinkExt;
    let mut batches = 0u64;
    while let Some(item) = input.next().await {
        let put = match item {
            Ok(put) => put,
            Err(status) => {
                let _ = tx.send(Err(status)).await;
                return;
            }
        };
        let batch = put.batch;
        batches += 1;
        // Parsed once: the producer, and the request id the ack echoes.
        let metadata = serde_json::from_slice::<serde_json::Value>(&put.app_metadata).ok();
        let seq = match crate::producer_meta::of_batch(table.name(), metadata.as_ref()) {
            Ok(seq) => seq,
            Err(status) => {
                let _ = tx.send(Err(status)).await;
                return;
            }
        };
        let written = if forwarded {
            table.write_forwarded(&batch, delete, seq.as_ref()).await
        } else {
            table.write_as(&batch, delete, seq.as_ref()).await
        };
        let reply = match written {
            Ok(parts) => {
                let request_id = metadata.as_ref().and_then(|v| v.get("request_id").cloned());
                let body = json!({
                    "table": table.name(),
                    "batch": batches,
                    "rows": batch.num_rows(),
                    "delete": delete,
                    "parts": parts,
                    "request_id": request_id,
                });
                Ok(PutResult {
                    app_metadata: Bytes::from(body.to_string()),
                })
            }
            Err(e) => Err(Status::from(e)),
        };
        let failed = reply.is_err();
        if tx.send(reply).await.is_err() || failed {
            return;
        }
    }
}
