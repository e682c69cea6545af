//! `memwal query`: one SQL query to a running daemon over Flight SQL
//! (`CommandStatementQuery`, then `DoGet` of each endpoint), printed as a
//! table or, with `--json`, as one JSON object per row.

use arrow_array::RecordBatch;
use arrow_flight::sql::client::FlightSqlServiceClient;
use futures::TryStreamExt;

/// What `memwal query` was asked to do.
#[derive(Debug, Clone, clap::Args)]
pub struct QueryArgs {
    /// The SQL query (tables named as the daemon serves them).
    pub sql: String,
    /// The daemon's Flight address.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub to: String,
    /// Bearer token, if the daemon requires one.
    #[arg(long, env = "MEMWAL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print one JSON object per row instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `memwal query`.
pub async fn query(args: QueryArgs) -> Result<String, String> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", args.to))
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("connecting to {}: {e}", args.to))?;
    let mut client = FlightSqlServiceClient::new(channel);
    if let Some(t) = &args.token {
        client.set_token(t.clone());
    }
    let info = client
        .execute(args.sql.clone(), None)
        .await
        .map_err(|e| format!("query: {e}"))?;
    let mut batches: Vec<RecordBatch> = Vec::new();
    for endpoint in info.endpoint {
        let ticket = endpoint
            .ticket
            .ok_or("the daemon answered an endpoint without a ticket")?;
        let stream = client
            .do_get(ticket)
            .await
            .map_err(|e| format!("query: {e}"))?;
        batches.extend(
            stream
                .try_collect::<Vec<_>>()
                .await
                .map_err(|e| format!("query: {e}"))?,
        );
    }
    if args.json {
        let mut out = Vec::new();
        let mut writer = arrow_json::LineDelimitedWriter::new(&mut out);
        for b in &batches {
            writer.write(b).map_err(|e| e.to_string())?;
        }
        writer.finish().map_err(|e| e.to_string())?;
        return String::from_utf8(out).map_err(|e| e.to_string());
    }
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let table = arrow_cast::pretty::pretty_format_batches(&batches).map_err(|e| e.to_string())?;
    Ok(format!("{table}\n({rows} rows)\n"))
}
