//! `memwal serve`: the ingestion daemon.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use memwal_compactor::{Compactor, CompactorTask};
use memwal_server::{http, FlightServiceServer, IngestService, TableHost};
use memwal_store::open_store;
use memwal_table::TableSharding;

use crate::config::{ServeArgs, ServeConfig};

fn demo_schema() -> Arc<arrow_schema::Schema> {
    crate::table::parse_schema(&["id:int64:key".into(), "payload:utf8".into()])
        .expect("static demo schema")
}

async fn tables(args: &ServeConfig) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = args
        .tables
        .iter()
        .map(|(n, u)| (n.clone(), u.clone()))
        .collect();
    if out.is_empty() {
        let dir = args
            .data_dir
            .as_ref()
            .ok_or("give a data directory (memwal serve ./data) or --table NAME=URI")?;
        let uri = std::path::Path::new(dir).join("demo");
        let uri = uri
            .to_str()
            .ok_or("the data directory is not UTF-8")?
            .to_string();
        let loc = open_store(&uri).map_err(|e| e.to_string())?;
        let exists = memwal_table::BaseTable::load(
            &memwal_sstable::LanceStore::new(loc.store.clone()),
            &loc.root,
        )
        .await
        .is_ok();
        if !exists {
            memwal_table::create_table(
                &loc,
                demo_schema(),
                &TableSharding::Bucket {
                    column: "id".into(),
                    buckets: 4,
                },
            )
            .await
            .map_err(|e| e.to_string())?;
            eprintln!("memwal: created the demo table at {uri}");
        }
        out.push(("demo".to_string(), uri));
    }
    Ok(out)
}

/// The largest Flight message (one record batch) accepted. gRPC's default
/// of 4 MiB would refuse ordinary puts from clients that send a batch as
/// one message (pyarrow); larger puts than a shard's `memtable_max_bytes`
/// (64 MiB by default) are refused by the writer with INVALID_ARGUMENT.
const MAX_FLIGHT_MESSAGE_BYTES: usize = 256 << 20;

/// Runs the daemon until SIGTERM/SIGINT, then drains and closes every
/// shard; a second signal exits at once (the WAL keeps every acknowledged
/// row).
pub async fn serve(args: ServeArgs) -> Result<String, String> {
    let print_config = args.print_config;
    let args = crate::config::resolve(&args)?;
    if print_config {
        return crate::config::print(&args);
    }
    let writer_config = args.writer.to_config()?;
    // Before anything else: a signal that arrives while tables open is held
    // and stops the daemon gracefully once they are open (instead of the
    // default action killing it without a flush).
    let mut signals = Signals::install()?;
    let (mut server, scheme) = flight_server(&args)?;
    // Series not updated for twice the shard idle time go: a shard that
    // got no rows for the idle time is closed, so they are a closed
    // shard's (live writers' gauges are set again every second).
    let idle = (args.shard_idle_secs > 0).then(|| Duration::from_secs(args.shard_idle_secs * 2));
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .idle_timeout(metrics_util::MetricKindMask::ALL, idle)
        .install_recorder()
        .map_err(|e| format!("installing the metrics recorder: {e}"))?;
    let ready = Arc::new(AtomicBool::new(false));
    let token: Option<Arc<str>> = args.token.clone().map(Into::into);
    let names = tables(&args).await?;

    for name in args.shards.keys() {
        if !names.iter().any(|(n, _)| n == name) {
            return Err(format!(
                "shards are configured for `{name}`, which is not served"
            ));
        }
    }
    let opened: http::Tables = Arc::default();
    let http_state = http::HttpState {
        tables: opened.clone(),
        ready: ready.clone(),
        metrics: Some(metrics),
        token: token.clone(),
    };
    let http_listener = tokio::net::TcpListener::bind(args.http)
        .await
        .map_err(|e| format!("binding {}: {e}", args.http))?;
    let http_addr = http_listener.local_addr().map_err(|e| e.to_string())?;
    eprintln!("memwal: opening tables (claim and replay); http://{http_addr}/readyz answers 503 until done");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut http_stop = stop_rx.clone();
    let http_task = tokio::spawn(async move {
        axum::serve(http_listener, http::router(http_state))
            .with_graceful_shutdown(async move {
                let _ = http_stop.wait_for(|s| *s).await;
            })
            .await
    });

    // How this daemon reaches the other members (read before joining:
    // a bad CA file fails the start, not the first forward).
    let peer_access = memwal_server::PeerAccess {
        token: args.token.clone(),
        tls_ca_pem: match &args.cluster_tls_ca {
            Some(path) => {
                let pem = cluster_ca(path)?;
                // The process's rustls provider (see `flight_server`).
                let _ = rustls::crypto::ring::default_provider().install_default();
                Some(pem)
            }
            None => None,
        },
    };
    // In a cluster: join before any table opens (the placement decides
    // which shards this daemon claims).
    let cluster = match &args.cluster {
        Some(list) => {
            let failover = Duration::from_millis(args.cluster_failover_ms);
            let config = memwal_cluster::ClusterConfig {
                endpoints: crate::config::etcd_endpoints(list)?,
                advertise: args.advertise.clone().unwrap_or_default(),
                prefix: args.cluster_prefix.clone(),
                lease_ttl: Duration::from_secs_f64((failover.as_secs_f64() * 0.6).ceil().max(2.0)),
            };
            let c = memwal_cluster::Cluster::join(config)
                .await
                .map_err(|e| format!("joining the cluster: {e}"))?;
            eprintln!(
                "memwal: joined the cluster as member {} ({})",
                c.id(),
                c.advertise()
            );
            Some(c)
        }
        None => None,
    };
    // A member whose tables do not open leaves at once (its lease would
    // keep shards placed on it, refused, until it expired).
    let opening = async {
        let mut hosts = HashMap::new();
        for (name, uri) in &names {
            let loc = open_store(uri).map_err(|e| format!("table `{name}`: {e}"))?;
            let buckets = match args.shards.get(name) {
                Some(list) => Some(crate::config::parse_buckets(list)?),
                None => None,
            };
            let host = match &cluster {
                Some(c) => {
                    TableHost::open_cluster(
                        name,
                        loc,
                        writer_config.clone(),
                        c.clone(),
                        peer_access.clone(),
                    )
                    .await
                }
                None => {
                    TableHost::open_buckets(name, loc, writer_config.clone(), buckets.as_deref())
                        .await
                }
            }
            .map_err(|e| e.to_string())?;
            host.set_min_flush_interval(Duration::from_millis(args.min_flush_interval_ms));
            host.set_shard_limits(memwal_server::ShardLimits {
                max_open: args.max_open_shards,
                idle_close: (args.shard_idle_secs > 0)
                    .then(|| Duration::from_secs(args.shard_idle_secs)),
            });
            hosts.insert(name.clone(), Arc::new(host));
        }
        Ok::<_, String>(hosts)
    };
    let hosts = match opening.await {
        Ok(hosts) => hosts,
        Err(e) => {
            if let Some(c) = &cluster {
                if let Err(left) = c.leave().await {
                    eprintln!("memwal: leaving the cluster: {left} (the lease expires on its own)");
                }
            }
            return Err(e);
        }
    };
    let hosts = Arc::new(hosts);
    // A shard whose writer stopped on a storage failure is reopened (a new
    // claim and a replay) with backoff; /readyz reports it until then.
    let reopeners: Vec<_> = hosts
        .values()
        .map(|h| h.spawn_reopener(Duration::from_secs(1), stop_rx.clone()))
        .collect();
    // A column added to or dropped from a base table reaches its live
    // shards within `schema_poll_ms` (or at once on the `evolve` action).
    let schema_watches: Vec<_> = if args.schema_poll_ms > 0 {
        hosts
            .values()
            .map(|h| {
                h.spawn_schema_watch(Duration::from_millis(args.schema_poll_ms), stop_rx.clone())
            })
            .collect()
    } else {
        Vec::new()
    };

    // In a cluster: each table's placement claims the shards placed here
    // (with their replays) and hands over those placed elsewhere.
    let placements: Vec<_> = hosts
        .values()
        .filter_map(|h| h.spawn_placement(stop_rx.clone()))
        .collect();

    let _ = opened.set(hosts.clone());

    let mut compactors = Vec::new();
    if args.compactor {
        for (name, uri) in &names {
            let loc = open_store(uri).map_err(|e| e.to_string())?;
            let gc = args.gc.then(|| crate::table::gc_config(&args));
            let config = crate::table::compactor_config(&args);
            let compactor = Compactor::new(loc, config);
            if let Some(host) = hosts.get(name) {
                host.attach_compactor(compactor.clone());
            }
            // In a cluster, one member compacts each table (and collects
            // its garbage); the others skip their cycles.
            let gate = cluster.as_ref().map(|c| {
                let (c, table) = (c.clone(), name.clone());
                Arc::new(move || c.runs_compactor(&table)) as memwal_compactor::CompactorGate
            });
            compactors.push(CompactorTask::spawn_gated(
                compactor,
                Duration::from_secs(args.compact_every_secs.max(1)),
                gc,
                gate,
            ));
        }
    }

    // Turns true when the drain expires: open ingest streams are cut.
    let (cut_tx, cut_rx) = tokio::sync::watch::channel(false);
    let limits = memwal_server::IngestLimits {
        max_streams: args.max_streams,
        max_decoded_bytes_in_flight: args.max_decoded_mib_in_flight.saturating_mul(1 << 20),
        first_message_timeout: Duration::from_secs(args.first_message_secs),
        ..Default::default()
    };
    let service = IngestService::new(hosts.clone(), args.token.clone())
        .with_cut(cut_rx)
        .with_limits(limits)
        .with_query_limits(memwal_server::QueryLimits {
            memory_bytes: args.query_memory_mib.saturating_mul(1 << 20),
            timeout: Duration::from_millis(args.query_timeout_ms),
            total_memory_bytes: args.query_total_memory_mib.saturating_mul(1 << 20),
            max_concurrent: args.query_max_concurrent,
            max_sql_bytes: args.query_max_sql_bytes,
            max_expr_depth: args.query_max_expr_depth,
            max_k: args.query_max_k,
        });
    let incoming = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("binding {}: {e}", args.listen))?;
    let flight_addr = incoming.local_addr().map_err(|e| e.to_string())?;
    ready.store(true, Ordering::SeqCst);
    // One write of the whole line: `eprintln!` writes its pieces one by
    // one to unbuffered stderr, so a process aborted meanwhile (an armed
    // crash point on a background task) would leave half a line that reads
    // as "serving" without its addresses.
    let serving = format!(
        "memwal: serving {} on {scheme}://{flight_addr} http://{http_addr}\n",
        names
            .iter()
            .map(|(n, u)| format!("{n} ({u})"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), serving.as_bytes());
    let mut flight_stop = stop_rx.clone();
    let flight = server
        .add_service(
            FlightServiceServer::new(service)
                .max_decoding_message_size(MAX_FLIGHT_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_FLIGHT_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(
            memwal_server::limited_incoming(incoming, args.max_connections),
            async move {
                let _ = flight_stop.wait_for(|s| *s).await;
            },
        );
    let flight_task = tokio::spawn(flight);

    signals.next().await;
    eprintln!("memwal: stopping (a second signal exits at once)");
    tokio::spawn(async move {
        signals.next().await;
        eprintln!("memwal: second signal, exiting now; the WAL keeps every acknowledged row");
        std::process::exit(130);
    });
    ready.store(false, Ordering::SeqCst);
    let _ = stop_tx.send(true);
    // In-flight calls get `drain_secs` to finish; a client that keeps a
    // stream open longer has it cut (batches not acknowledged by then were
    // never acknowledged). Then every shard closes in parallel, each within
    // the writer's `close_timeout` (60 s by default).
    let drain = Duration::from_secs(args.drain_secs);
    let mut flight_task = flight_task;
    if tokio::time::timeout(drain, &mut flight_task).await.is_err() {
        // Streams end with UNAVAILABLE; a batch not acknowledged by now is
        // never written (and no shard opens once the tables close).
        let _ = cut_tx.send(true);
        eprintln!("memwal: calls still open after {drain:?}; cutting them");
        flight_task.abort();
    }
    let _ = cut_tx.send(true);
    for c in compactors {
        c.stop().await;
    }
    // A reopen still running is dropped (at worst a claim nobody uses:
    // fencing makes that harmless); the shards then close.
    for r in reopeners
        .into_iter()
        .chain(schema_watches)
        .chain(placements)
    {
        r.abort();
    }
    let closes = futures::future::join_all(hosts.iter().map(|(name, host)| async move {
        host.close()
            .await
            .map_err(|e| format!("closing table `{name}`: {e}"))
    }))
    .await;
    let mut failed: Vec<String> = closes.into_iter().filter_map(Result::err).collect();
    // The shards are closed (flushed and published): leaving revokes the
    // lease, so the survivors see this daemon's shards free at once and
    // claim them (SIGTERM hands the shards over).
    if let Some(c) = &cluster {
        if let Err(e) = c.leave().await {
            failed.push(format!(
                "leaving the cluster: {e} (the lease expires on its own)"
            ));
        }
    }
    let _ = http_task.await;
    if failed.is_empty() {
        Ok("memwal: stopped\n".into())
    } else {
        Err(failed.join("\n"))
    }
}

/// The Flight server builder, with TLS when a certificate is configured,
/// and the URI scheme clients use.
/// The PEM file at `path` (`cluster_tls_ca`), once every certificate in
/// it parses as a trust anchor: a file that is unreadable, holds no
/// certificate or a broken one fails the start, naming the file, instead
/// of every forward to a TLS member later.
fn cluster_ca(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use rustls::pki_types::pem::PemObject;
    let failed = |e: String| format!("cluster_tls_ca {}: {e}", path.display());
    let pem = std::fs::read(path).map_err(|e| failed(e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| failed(format!("not PEM: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| failed(format!("not a CA certificate: {e}")))?;
    }
    match roots.is_empty() {
        true => Err(failed("no PEM certificate in it".into())),
        false => Ok(pem),
    }
}

fn flight_server(
    args: &crate::config::ServeConfig,
) -> Result<(tonic::transport::Server, &'static str), String> {
    // hyper's own default of 200 streams per connection, which tonic
    // overrides with "no limit" unless told; memwal's global limit on
    // ingest calls is `max_streams`.
    let server = tonic::transport::Server::builder()
        .max_concurrent_streams(Some(args.max_streams.min(u32::MAX as usize) as u32));
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
        return Ok((server, "grpc"));
    };
    // Several rustls crypto providers are linked (lance's and object
    // store's dependencies bring aws-lc-rs): pick ring for the process. An
    // error only says one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let read = |p: &std::path::PathBuf| {
        std::fs::read(p).map_err(|e| format!("TLS: reading {}: {e}", p.display()))
    };
    let identity = tonic::transport::Identity::from_pem(read(cert)?, read(key)?);
    let server = server
        .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
        .map_err(|e| format!("TLS: {e}"))?;
    Ok((server, "grpc+tls"))
}

/// SIGTERM and SIGINT, handled by the daemon from the moment it starts.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Self, String> {
        use tokio::signal::unix::{signal, SignalKind};
        let handler = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|e| format!("installing the {name} handler: {e}"))
        };
        Ok(Self {
            term: handler(SignalKind::terminate(), "SIGTERM")?,
            int: handler(SignalKind::interrupt(), "SIGINT")?,
        })
    }

    /// The next SIGTERM or SIGINT (including one delivered before the call).
    async fn next(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    // Breaks if a `cluster_tls_ca` file whose certificate does not parse
    // (a PEM header over garbage), or that holds no certificate, is
    // accepted at start (every forward to a TLS member then failed), or
    // if a real CA certificate is refused.
    #[test]
    fn a_broken_cluster_ca_fails_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let broken = file(
            "broken.pem",
            "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
        );
        let e = super::cluster_ca(&broken).unwrap_err();
        assert!(
            e.contains("cluster_tls_ca") && e.contains("broken.pem"),
            "{e}"
        );
        let empty = file("empty.pem", "just text\n");
        let e = super::cluster_ca(&empty).unwrap_err();
        assert!(e.contains("no PEM certificate"), "{e}");
        let e = super::cluster_ca(&dir.path().join("missing.pem")).unwrap_err();
        assert!(e.contains("missing.pem"), "{e}");
        let ca = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let good = file("ca.pem", &ca.cert.pem());
        assert_eq!(
            super::cluster_ca(&good).unwrap(),
            std::fs::read(&good).unwrap()
        );
    }
}
