//! `memwal load`: synthetic rows over Arrow Flight to a running daemon, a
//! live progress line, then throughput and acknowledgement latencies. The
//! daemon's benchmark. With `--embedded URI` the same workload goes
//! in-process through the daemon's own write path (`TableHost::write`), no
//! Flight: the two runs' ratio is what Flight costs.

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
    /// Send for this many seconds instead of `--rows` rows (keys keep
    /// rising).
    #[arg(long)]
    pub secs: Option<u64>,
    /// On a refused or failed batch, count its status code, reconnect and
    /// go on with the next batch (default: stop at the first error). The
    /// summary then lists the codes.
    #[arg(long)]
    pub keep_going: bool,
    /// Append one line per acknowledged batch to this file: its first key
    /// and row count (the keys are `first..first+rows`).
    #[arg(long)]
    pub acked: Option<std::path::PathBuf>,
    /// Write in-process to the table at this URI instead of to a daemon
    /// (no Flight, no network): the daemon's write path with the default
    /// writer settings, `--table` naming it (`--to`, the token and TLS are
    /// not used). Nothing else may write the table meanwhile (it would be
    /// fenced).
    #[arg(long)]
    pub embedded: Option<String>,
    /// Send as idempotent producers (docs/design/idempotent-producers.md):
    /// producer `p` is `ID-p`, and its k-th batch (from 1) is its sequence
    /// k, in the batch's `app_metadata`. A failed batch is then retried
    /// (with `--keep-going`) instead of skipped, so each is written once.
    #[arg(long)]
    pub producer_id: Option<String>,
    /// The producers' epoch (with `--producer-id`).
    #[arg(long, default_value_t = 0, requires = "producer_id")]
    pub producer_epoch: u64,
}

/// What the producers share.
struct Shared {
    args: LoadArgs,
    schema: SchemaRef,
    /// Batches in all (unbounded under `--secs`).
    batches: u64,
    deadline: Option<Instant>,
    acked: Option<std::sync::Mutex<std::fs::File>>,
    errors: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Shared {
    fn more(&self, b: u64) -> bool {
        b < self.batches && self.deadline.is_none_or(|d| Instant::now() < d)
    }

    /// Producer `p`'s sequence for batch `b` (`--producer-id`).
    fn sequence(&self, p: usize, b: u64) -> Option<memwal::ProducerSeq> {
        let id = self.args.producer_id.as_ref()?;
        Some(memwal::ProducerSeq::new(
            format!("{id}-{p}"),
            self.args.producer_epoch,
            b / self.args.producers as u64 + 1,
        ))
    }

    /// The batch after a failed `b`: `b` again for an idempotent producer
    /// (its retry is written at most once), else the next one.
    fn after_failure(&self, b: u64) -> u64 {
        if self.args.producer_id.is_some() {
            b
        } else {
            b + self.args.producers as u64
        }
    }

    /// The `app_metadata` of batch `b` of producer `p`.
    fn metadata(&self, p: usize, b: u64) -> bytes::Bytes {
        match self.sequence(p, b) {
            None => bytes::Bytes::new(),
            Some(seq) => serde_json::json!({
                "producer_id": seq.producer,
                "producer_epoch": seq.epoch,
                "sequence": seq.sequence,
            })
            .to_string()
            .into(),
        }
    }

    /// Batch `b`: its first key, rows and data.
    fn make(&self, b: u64) -> Result<(i64, usize, RecordBatch), String> {
        let size = self.args.batch as u64;
        let first = (b * size) as i64;
        let n = match self.deadline {
            Some(_) => size,
            None => size.min(self.args.rows - b * size),
        } as usize;
        batch(&self.schema, first, n, self.args.payload).map(|batch| (first, n, batch))
    }

    /// Counts a failed batch under `--keep-going` (its code), or stops.
    fn failed(&self, p: usize, e: arrow_flight::error::FlightError) -> Result<(), String> {
        let code = match &e {
            arrow_flight::error::FlightError::Tonic(s) => format!("{:?}", s.code()),
            _ => "Other".to_string(),
        };
        self.failed_code(p, code, e.to_string())
    }

    /// [`Self::failed`] for a failure already reduced to its status code.
    fn failed_code(&self, p: usize, code: String, e: String) -> Result<(), String> {
        if !self.args.keep_going {
            return Err(format!("producer {p}: {e}"));
        }
        *self
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(code)
            .or_default() += 1;
        Ok(())
    }

    fn ack(&self, done: &Done, first: i64, n: usize, latency: Duration) -> Result<(), String> {
        let _ = done.unbounded_send((n, latency));
        if let Some(f) = &self.acked {
            use std::io::Write;
            writeln!(f.lock().unwrap_or_else(|e| e.into_inner()), "{first} {n}")
                .map_err(|e| format!("--acked: {e}"))?;
        }
        Ok(())
    }
}

/// Where producers report each acknowledged batch (rows, latency); the
/// summary ends once every producer dropped its sender.
type Done = futures::channel::mpsc::UnboundedSender<(usize, Duration)>;

/// One producer: batches `p`, `p + producers`, ... over one DoPut stream
/// (a new one after a failure under `--keep-going`).
async fn produce(p: usize, s: Arc<Shared>, done: Done) -> Result<(), String> {
    let step = s.args.producers as u64;
    let mut b = p as u64;
    'stream: while s.more(b) {
        let mut c = match connect(&s.args).await {
            Ok(c) => c,
            Err(e) if s.args.keep_going => {
                *s.errors
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry("Connect".into())
                    .or_default() += 1;
                tracing::debug!(producer = p, error = %e, "reconnecting");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let (mut tx, rx) = futures::channel::mpsc::channel::<RecordBatch>(1);
        // Each batch's app_metadata, in send order: the encoder turns each
        // batch into one data message (no dictionaries here).
        let metadata = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
        let stream = FlightDataEncoderBuilder::new()
            .with_flight_descriptor(Some(FlightDescriptor::new_path(vec![s.args.table.clone()])))
            .build(rx.map(Ok))
            .map({
                let metadata = metadata.clone();
                move |m| {
                    m.map(|mut fd| {
                        if !fd.data_body.is_empty() {
                            let mut q = metadata.lock().unwrap_or_else(|e| e.into_inner());
                            fd.app_metadata = q.pop_front().unwrap_or_default();
                        }
                        fd
                    })
                }
            });
        let queue = |b: u64| {
            let mut q = metadata.lock().unwrap_or_else(|e| e.into_inner());
            q.push_back(s.metadata(p, b));
        };
        // The daemon answers a DoPut once its first message arrives, so
        // the first batch is queued before the call.
        let (mut first, mut n, data) = s.make(b)?;
        let mut sent = Instant::now();
        queue(b);
        tx.send(data).await.map_err(|e| e.to_string())?;
        let mut acks = match c.do_put(stream).await {
            Ok(acks) => acks,
            Err(e) => {
                s.failed(p, e)?;
                b = s.after_failure(b);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue 'stream;
            }
        };
        loop {
            match acks.next().await {
                Some(Ok(_)) => s.ack(&done, first, n, sent.elapsed())?,
                Some(Err(e)) => {
                    s.failed(p, e)?;
                    b = s.after_failure(b);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue 'stream;
                }
                None => {
                    let e = arrow_flight::error::FlightError::Tonic(Box::new(
                        tonic::Status::unavailable("the daemon ended the stream"),
                    ));
                    s.failed(p, e)?;
                    b = s.after_failure(b);
                    continue 'stream;
                }
            }
            b += step;
            if !s.more(b) {
                break;
            }
            let next;
            (first, n, next) = s.make(b)?;
            sent = Instant::now();
            queue(b);
            if tx.send(next).await.is_err() {
                continue 'stream;
            }
        }
        drop(tx);
        while let Some(r) = acks.next().await {
            if let Err(e) = r {
                s.failed(p, e)?;
            }
        }
        return Ok(());
    }
    Ok(())
}

/// One producer writing in-process (`--embedded`): batches `p`,
/// `p + producers`, ... through `TableHost::write`, the call the daemon
/// makes for each DoPut batch.
async fn produce_embedded(
    p: usize,
    s: Arc<Shared>,
    host: Arc<memwal_server::TableHost>,
    done: Done,
) -> Result<(), String> {
    let step = s.args.producers as u64;
    let mut b = p as u64;
    while s.more(b) {
        let (first, n, data) = s.make(b)?;
        let sent = Instant::now();
        let seq = s.sequence(p, b);
        match host.write_as(&data, false, seq.as_ref()).await {
            Ok(_) => s.ack(&done, first, n, sent.elapsed())?,
            Err(e) => {
                let text = e.to_string();
                let code = format!("{:?}", tonic::Status::from(e).code());
                s.failed_code(p, code, text)?;
                b = s.after_failure(b);
                continue;
            }
        }
        b += step;
    }
    Ok(())
}

/// The table at `uri` served in-process as `name` (`--embedded`).
async fn open_embedded(name: &str, uri: &str) -> Result<memwal_server::TableHost, String> {
    let loc = memwal_store::open_store(uri).map_err(|e| format!("--embedded {uri}: {e}"))?;
    memwal_server::TableHost::open(name, loc, memwal::ShardWriterConfig::default())
        .await
        .map_err(|e| format!("--embedded {uri}: {e}"))
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
    let embedded = match &args.embedded {
        Some(uri) => Some(Arc::new(open_embedded(&args.table, uri).await?)),
        None => None,
    };
    let schema = match &embedded {
        Some(host) => host.schema(),
        None => {
            let mut probe = connect(&args).await?;
            schema(&mut probe, &args.table).await?
        }
    };
    let (batches, deadline) = match args.secs {
        Some(secs) => (
            u64::MAX / 2 / args.batch as u64,
            Some(Instant::now() + Duration::from_secs(secs)),
        ),
        None => (args.rows.div_ceil(args.batch as u64), None),
    };
    let acked = match &args.acked {
        Some(path) => Some(std::sync::Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("--acked {}: {e}", path.display()))?,
        )),
        None => None,
    };
    let (done_tx, mut done_rx) = futures::channel::mpsc::unbounded::<(usize, Duration)>();
    let shared = Arc::new(Shared {
        args: args.clone(),
        schema,
        batches,
        deadline,
        acked,
        errors: Default::default(),
    });
    let started = Instant::now();
    let tasks: Vec<_> = (0..args.producers)
        .map(|p| match &embedded {
            Some(host) => tokio::spawn(produce_embedded(
                p,
                shared.clone(),
                host.clone(),
                done_tx.clone(),
            )),
            None => tokio::spawn(produce(p, shared.clone(), done_tx.clone())),
        })
        .collect();
    drop(done_tx);
    let bar = match args.secs {
        Some(_) => indicatif::ProgressBar::hidden(),
        None => indicatif::ProgressBar::new(args.rows),
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} rows  {per_sec}  eta {eta}")
            .map_err(|e| e.to_string())?,
    );
    let mut latencies = Vec::with_capacity(batches.min(1 << 20) as usize);
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
    // In-process: flush and close what was written (outside the timing, as
    // a daemon keeps running after a load).
    if let Some(host) = embedded {
        host.close()
            .await
            .map_err(|e| format!("closing the embedded table: {e}"))?;
    }
    latencies.sort();
    let pct = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q).round() as usize)
            .map(|d| d.as_secs_f64() * 1e3)
            .unwrap_or(0.0)
    };
    let bytes = rows as f64 * (args.payload as f64 + 8.0);
    let errors = shared
        .errors
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let errors = if errors.is_empty() {
        String::new()
    } else {
        format!("failed batches by code: {errors:?}\n")
    };
    let mode = if args.embedded.is_some() {
        "embedded (no Flight): "
    } else {
        ""
    };
    Ok(format!(
        "{mode}{rows} rows in {secs:.2} s: {:.0} rows/s, {:.1} MB/s; ack latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} batches of {}, {} producers)\n{errors}",
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
