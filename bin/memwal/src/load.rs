//! `memwal load`: synthetic rows over Arrow Flight to a running daemon, a
//! live progress line, then throughput and acknowledgement latencies. The
//! daemon's benchmark.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::{FlightClient, FlightDescriptor};
use arrow_schema::SchemaRef;
use futures::{SinkExt, StreamExt};

/// What `memwal load` was asked to do.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// The daemon's Flight address.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub to: String,
    /// The table to write to.
    #[arg(long, default_value = "demo")]
    pub table: String,
    /// Rows in all.
    #[arg(long, default_value_t = 100_000)]
    pub rows: u64,
    /// Rows per batch (one acknowledgement each).
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// Concurrent producers (one DoPut stream each).
    #[arg(long, default_value_t = 4)]
    pub producers: usize,
    /// Bytes of the synthetic text column per row.
    #[arg(long, default_value_t = 1000)]
    pub payload: usize,
    /// Bearer token, if the daemon requires one.
    #[arg(long, env = "MEMWAL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Connect over TLS, trusting this PEM CA certificate (a daemon started
    /// with --tls-cert).
    #[arg(long)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// The name the daemon's certificate is issued to [default: the host of --to].
    #[arg(long, requires = "tls_ca")]
    pub tls_domain: Option<String>,
}

async fn connect(args: &LoadArgs) -> Result<FlightClient, String> {
    let scheme = if args.tls_ca.is_some() {
        "https"
    } else {
        "http"
    };
    let mut endpoint = tonic::transport::Channel::from_shared(format!("{scheme}://{}", args.to))
        .map_err(|e| e.to_string())?;
    if let Some(ca) = &args.tls_ca {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let pem = std::fs::read(ca).map_err(|e| format!("--tls-ca {}: {e}", ca.display()))?;
        let host = args
            .to
            .rsplit_once(':')
            .map_or(args.to.as_str(), |(h, _)| h);
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(pem))
            .domain_name(args.tls_domain.clone().unwrap_or_else(|| host.to_string()));
        endpoint = endpoint.tls_config(tls).map_err(|e| format!("TLS: {e}"))?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("connecting to {}: {e}", args.to))?;
    let mut c = FlightClient::new(channel);
    if let Some(t) = &args.token {
        c.add_header("authorization", &format!("Bearer {t}"))
            .map_err(|e| e.to_string())?;
    }
    Ok(c)
}

/// The table's put schema, from the daemon.
async fn schema(c: &mut FlightClient, table: &str) -> Result<SchemaRef, String> {
    let r = c
        .get_schema(FlightDescriptor::new_path(vec![table.to_string()]))
        .await
        .map_err(|e| format!("GetSchema of `{table}`: {e}"))?;
    Ok(Arc::new(r))
}

/// A batch for `schema` with keys `first..first+n`: Int64 columns get the
/// key, Utf8 columns a distinct text of `payload` bytes, other columns
/// nulls (refused by the daemon if not nullable).
fn batch(schema: &SchemaRef, first: i64, n: usize, payload: usize) -> Result<RecordBatch, String> {
    let cols = schema
        .fields()
        .iter()
        .map(|f| -> Result<ArrayRef, String> {
            Ok(match f.data_type() {
                arrow_schema::DataType::Int64 => {
                    Arc::new(Int64Array::from_iter_values(first..first + n as i64))
                }
                arrow_schema::DataType::Utf8 => Arc::new(StringArray::from_iter_values(
                    (first..first + n as i64).map(|k| {
                        let head = format!("row {k} ");
                        format!("{head}{}", "x".repeat(payload.saturating_sub(head.len())))
                    }),
                )),
                other if f.is_nullable() => arrow_array::new_null_array(other, n),
                other => {
                    return Err(format!(
                        "column `{}` ({other}) cannot be generated; memwal load fills int64 \
                         and utf8 columns",
                        f.name()
                    ))
                }
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema.clone(), cols).map_err(|e| e.to_string())
}

/// `memwal load`.
pub async fn load(args: LoadArgs) -> Result<String, String> {
    if args.batch == 0 || args.producers == 0 {
        return Err("--batch and --producers must be at least 1".into());
    }
    let mut probe = connect(&args).await?;
    let schema = schema(&mut probe, &args.table).await?;
    let batches = args.rows.div_ceil(args.batch as u64);
    let (done_tx, mut done_rx) = futures::channel::mpsc::unbounded::<(usize, Duration)>();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..args.producers {
        let args = args.clone();
        let schema = schema.clone();
        let done = done_tx.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = connect(&args).await?;
            let (mut tx, rx) = futures::channel::mpsc::channel::<RecordBatch>(1);
            let stream = FlightDataEncoderBuilder::new()
                .with_flight_descriptor(Some(FlightDescriptor::new_path(vec![args.table.clone()])))
                .build(rx.map(Ok));
            let mut b = p as u64;
            if b >= batches {
                return Ok(());
            }
            // The daemon answers a DoPut once its first message arrives, so
            // the first batch is queued before the call.
            let make = |b: u64| {
                let first = (b * args.batch as u64) as i64;
                let n = (args.batch as u64).min(args.rows - b * args.batch as u64) as usize;
                batch(&schema, first, n, args.payload).map(|batch| (n, batch))
            };
            let (mut n, first) = make(b)?;
            let mut sent = Instant::now();
            tx.send(first).await.map_err(|e| e.to_string())?;
            let mut acks = c.do_put(stream).await.map_err(|e| e.to_string())?;
            loop {
                match acks.next().await {
                    Some(Ok(_)) => {
                        let _ = done.unbounded_send((n, sent.elapsed()));
                    }
                    Some(Err(e)) => return Err(format!("producer {p}: {e}")),
                    None => return Err(format!("producer {p}: the daemon ended the stream")),
                }
                b += args.producers as u64;
                if b >= batches {
                    break;
                }
                let (next_n, next) = make(b)?;
                n = next_n;
                sent = Instant::now();
                tx.send(next).await.map_err(|e| e.to_string())?;
            }
            drop(tx);
            while let Some(r) = acks.next().await {
                r.map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        }));
    }
    drop(done_tx);
    let bar = indicatif::ProgressBar::new(args.rows);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} rows  {per_sec}  eta {eta}")
            .map_err(|e| e.to_string())?,
    );
    let mut latencies = Vec::with_capacity(batches as usize);
    let mut rows = 0u64;
    while let Some((n, latency)) = done_rx.next().await {
        rows += n as u64;
        latencies.push(latency);
        bar.set_position(rows);
    }
    bar.finish_and_clear();
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    let secs = started.elapsed().as_secs_f64();
    latencies.sort();
    let pct = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q).round() as usize)
            .map(|d| d.as_secs_f64() * 1e3)
            .unwrap_or(0.0)
    };
    let bytes = rows as f64 * (args.payload as f64 + 8.0);
    Ok(format!(
        "{rows} rows in {secs:.2} s: {:.0} rows/s, {:.1} MB/s; ack latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} batches of {}, {} producers)\n",
        rows as f64 / secs,
        bytes / secs / 1e6,
        pct(0.5),
        pct(0.99),
        pct(1.0),
        latencies.len(),
        args.batch,
        args.producers
    ))
}
