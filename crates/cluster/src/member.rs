//! One daemon's membership: its lease and member key (kept alive by a
//! named background task), the view of the cluster (kept current by a
//! watch task), and recording itself as a shard's owner.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp,
    TxnOpResponse, WatchOptions,
};
use tokio::sync::watch;

use crate::view::{Member, Owner, View};
use crate::ClusterError;

/// How a daemon joins a cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// etcd client endpoints (`http://HOST:PORT`).
    pub endpoints: Vec<String>,
    /// Where this daemon's Flight service answers, as peers reach it.
    pub advertise: String,
    /// The key prefix shared by the daemons of one cluster (`/memwal`).
    pub prefix: String,
    /// The member lease's time to live: a daemon not heard from for this
    /// long leaves the cluster and its shards are claimed by survivors.
    /// etcd rounds it up to whole seconds (at least 2 s here).
    pub lease_ttl: Duration,
}

/// Whether [`Cluster::acquire`] recorded this daemon as the owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// This daemon is the recorded owner (now, or already).
    Mine,
    /// Another member is: it must release the shard first.
    Held(String),
}

/// This daemon's membership of a cluster. Dropping it does not leave the
/// cluster (its lease then expires): call [`Cluster::leave`].
pub struct Cluster {
    client: Client,
    config: ClusterConfig,
    id: String,
    /// The lease this daemon's keys live under (changes when a lost lease
    /// is replaced).
    lease: Arc<AtomicI64>,
    view: watch::Receiver<Arc<View>>,
    stopping: Arc<AtomicBool>,
    tasks: parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("id", &self.id)
            .field("advertise", &self.config.advertise)
            .finish_non_exhaustive()
    }
}

fn member_key(prefix: &str, id: &str) -> String {
    format!("{prefix}/members/{id}")
}

fn owner_key(prefix: &str, table: &str, shard: &str) -> String {
    format!("{prefix}/owners/{table}/{shard}")
}

impl Cluster {
    /// Joins the cluster: connects to etcd, takes a lease, records this
    /// daemon as a member under it, reads the cluster's state, and starts
    /// the tasks that keep the lease alive and the view current. Fails
    /// (nothing left behind but a lease that expires) when etcd cannot be
    /// reached within a few seconds.
    pub async fn join(config: ClusterConfig) -> Result<Arc<Self>, ClusterError> {
        if config.endpoints.is_empty() {
            return Err(ClusterError::Config("no etcd endpoint".into()));
        }
        let prefix = config.prefix.trim_end_matches('/').to_string();
        if prefix.is_empty() || !prefix.starts_with('/') {
            return Err(ClusterError::Config(format!(
                "the key prefix `{}` must start with `/` and name something",
                config.prefix
            )));
        }
        let config = ClusterConfig { prefix, ..config };
        let err = |what: &str| etcd_failed(&config.endpoints, what);
        let mut client = connect(&config.endpoints, true).await?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let lease = register(&mut client, &config, &id)
            .await
            .map_err(err("registering the member"))?;
        let initial = read_view(&mut client, &config.prefix)
            .await
            .map_err(err("reading the cluster"))?;
        let (tx, view) = watch::channel(Arc::new(initial));
        let cluster = Arc::new(Self {
            client: client.clone(),
            config: config.clone(),
            id: id.clone(),
            lease: Arc::new(AtomicI64::new(lease)),
            view,
            stopping: Arc::new(AtomicBool::new(false)),
            tasks: Default::default(),
        });
        let keepalive = tokio::spawn(monitored(
            "cluster-lease",
            keep_lease(
                client.clone(),
                config.clone(),
                id.clone(),
                cluster.lease.clone(),
                cluster.stopping.clone(),
            ),
        ));
        let watcher = tokio::spawn(monitored(
            "cluster-watch",
            follow(client, config.prefix.clone(), tx, cluster.stopping.clone()),
        ));
        cluster.tasks.lock().extend([keepalive, watcher]);
        tracing::info!(member = %id, advertise = %config.advertise, "joined the cluster");
        Ok(cluster)
    }

    /// This daemon's member id (unique per process start).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Where this daemon's Flight service answers.
    pub fn advertise(&self) -> &str {
        &self.config.advertise
    }

    /// The cluster as last seen.
    pub fn view(&self) -> Arc<View> {
        self.view.borrow().clone()
    }

    /// Whether this daemon runs `table`'s compactor now
    /// ([`View::compactor`] of the last view); false while the view holds
    /// no member (this daemon's lease being replaced).
    pub fn runs_compactor(&self, table: &str) -> bool {
        self.view()
            .compactor(table)
            .is_some_and(|m| m.id == self.id)
    }

    /// A receiver that changes with every new view.
    pub fn subscribe(&self) -> watch::Receiver<Arc<View>> {
        self.view.clone()
    }

    /// Records this daemon as the owner of `shard` of `table` (with the
    /// shard's field values, hex), unless another member is recorded: only
    /// then may it claim the shard. Idempotent.
    pub async fn acquire(
        &self,
        table: &str,
        shard: &str,
        values: BTreeMap<String, String>,
    ) -> Result<Acquired, ClusterError> {
        let key = owner_key(&self.config.prefix, table, shard);
        let lease = self.lease.load(Ordering::SeqCst);
        let record = serde_json::to_vec(&Owner {
            member: self.id.clone(),
            values,
        })
        .expect("an owner record serialises");
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                record,
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key.clone(), None)]);
        let response = self
            .client
            .clone()
            .txn(txn)
            .await
            .map_err(|source| self.etcd_error("recording a shard owner", source))?;
        if response.succeeded() {
            metrics::counter!("memwal_cluster_shards_acquired_total").increment(1);
            return Ok(Acquired::Mine);
        }
        let holder = response.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| {
                let owner = serde_json::from_slice::<Owner>(kv.value()).ok();
                (kv.lease(), owner.map(|o| o.member))
            }),
            _ => None,
        });
        match holder {
            Some((l, _)) if l == lease => Ok(Acquired::Mine),
            Some((_, Some(member))) if member == self.id => Ok(Acquired::Mine),
            Some((_, member)) => Ok(Acquired::Held(member.unwrap_or_else(|| "?".into()))),
            // Deleted between the compare and the get: try again later.
            None => Ok(Acquired::Held("?".into())),
        }
    }

    /// Deletes this daemon's owner record of `shard` of `table` (after it
    /// closed the shard), if it is still this daemon's.
    pub async fn release(&self, table: &str, shard: &str) -> Result<(), ClusterError> {
        let key = owner_key(&self.config.prefix, table, shard);
        let lease = self.lease.load(Ordering::SeqCst);
        let txn = Txn::new()
            .when([Compare::lease(key.clone(), CompareOp::Equal, lease)])
            .and_then([TxnOp::delete(key, None)]);
        self.client
            .clone()
            .txn(txn)
            .await
            .map_err(|source| self.etcd_error("releasing a shard", source))?;
        metrics::counter!("memwal_cluster_shards_released_total").increment(1);
        Ok(())
    }

    /// Leaves the cluster: stops the background tasks and revokes the
    /// lease, which deletes this daemon's member key and every owner
    /// record still under it (call it after the shards closed).
    pub async fn leave(&self) -> Result<(), ClusterError> {
        self.stopping.store(true, Ordering::SeqCst);
        for task in self.tasks.lock().drain(..) {
            task.abort();
        }
        let lease = self.lease.load(Ordering::SeqCst);
        self.client
            .clone()
            .lease_revoke(lease)
            .await
            .map_err(|source| self.etcd_error("revoking the lease", source))?;
        tracing::info!(member = %self.id, "left the cluster");
        Ok(())
    }

    fn etcd_error(&self, what: &str, source: etcd_client::Error) -> ClusterError {
        metrics::counter!("memwal_cluster_etcd_errors_total").increment(1);
        etcd_failed(&self.config.endpoints, what)(source)
    }
}

/// The error of `what` failing at etcd `endpoints`.
fn etcd_failed(
    endpoints: &[String],
    what: &str,
) -> impl FnOnce(etcd_client::Error) -> ClusterError {
    let endpoints = endpoints.join(",");
    let what = what.to_string();
    move |source| ClusterError::Etcd {
        endpoints,
        what,
        source,
    }
}

/// A client of etcd at `endpoints` (5 s to connect and per request); with
/// `keep_alive`, HTTP/2 pings every 2 s notice a dead connection.
async fn connect(endpoints: &[String], keep_alive: bool) -> Result<Client, ClusterError> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(5));
    if keep_alive {
        options = options.with_keep_alive(Duration::from_secs(2), Duration::from_secs(2));
    }
    Client::connect(endpoints, Some(options))
        .await
        .map_err(etcd_failed(endpoints, "connecting"))
}

/// The cluster under `prefix` as etcd holds it now, read once without
/// joining (`memwal status --cluster`).
pub async fn read_cluster(endpoints: &[String], prefix: &str) -> Result<View, ClusterError> {
    let mut client = connect(endpoints, false).await?;
    read_view(&mut client, prefix.trim_end_matches('/'))
        .await
        .map_err(etcd_failed(endpoints, "reading the cluster"))
}

/// A lease and the member key under it; returns the lease id.
async fn register(
    client: &mut Client,
    config: &ClusterConfig,
    id: &str,
) -> Result<i64, etcd_client::Error> {
    let ttl = config.lease_ttl.as_secs_f64().ceil().max(2.0) as i64;
    let lease = client.lease_grant(ttl, None).await?.id();
    let record = serde_json::to_vec(&Member {
        id: id.to_string(),
        advertise: config.advertise.clone(),
    })
    .expect("a member record serialises");
    client
        .put(
            member_key(&config.prefix, id),
            record,
            Some(PutOptions::new().with_lease(lease)),
        )
        .await?;
    Ok(lease)
}

/// Whether etcd answers, within `within`, that `lease` does not exist
/// (expired or revoked); false when it exists or etcd does not answer.
async fn lease_gone(client: &mut Client, lease: i64, within: Duration) -> bool {
    match tokio::time::timeout(within, client.lease_time_to_live(lease, None)).await {
        Ok(Ok(r)) => r.ttl() <= 0,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "reading the lease's TTL failed; retrying");
            false
        }
        Err(_) => false,
    }
}

/// Every member and owner under `prefix`, at the read's revision.
async fn read_view(client: &mut Client, prefix: &str) -> Result<View, etcd_client::Error> {
    let response = client
        .get(format!("{prefix}/"), Some(GetOptions::new().with_prefix()))
        .await?;
    let mut view = View::default();
    view.revision = response.header().map_or(0, |h| h.revision());
    for kv in response.kvs() {
        view.apply(prefix, kv.key(), Some(kv.value()));
    }
    Ok(view)
}

/// Runs `task`, logging how it ended: a cluster task that stops while the
/// daemon runs leaves the daemon's view or membership frozen, which must
/// be visible.
async fn monitored(name: &'static str, task: impl std::future::Future<Output = ()>) {
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(task).catch_unwind().await {
        Ok(()) => tracing::debug!(task = name, "cluster task ended"),
        Err(_) => {
            metrics::counter!("memwal_cluster_task_panics_total", "task" => name).increment(1);
            tracing::error!(
                task = name,
                "cluster task panicked; membership is no longer kept"
            );
        }
    }
}

/// Keeps the lease alive (a refresh every third of its TTL). A lease etcd
/// no longer knows (expired while this daemon was paused or cut off) is
/// replaced by a new one with the member key under it: the daemon joins
/// again, and the owner records of the old lease are gone (survivors may
/// have claimed those shards; fencing refuses this daemon's writers).
/// etcd errors are retried; nothing is given up while etcd is down.
async fn keep_lease(
    mut client: Client,
    config: ClusterConfig,
    id: String,
    lease: Arc<AtomicI64>,
    stopping: Arc<AtomicBool>,
) {
    let ttl = config.lease_ttl.as_secs_f64().ceil().max(2.0);
    let every = Duration::from_secs_f64(ttl / 3.0);
    while !stopping.load(Ordering::SeqCst) {
        let current = lease.load(Ordering::SeqCst);
        // Every await below is bounded: a stream broken by an etcd
        // restart may neither answer nor fail (its request channel full,
        // its connection half-open); it is replaced instead.
        let opened = tokio::time::timeout(every * 2, client.lease_keep_alive(current)).await;
        let lost = match opened {
            Ok(Ok((mut keeper, mut responses))) => loop {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                let refresh = async {
                    keeper.keep_alive().await?;
                    responses.message().await
                };
                match tokio::time::timeout(every * 2, refresh).await {
                    Ok(Ok(Some(r))) if r.ttl() > 0 => {}
                    Ok(Ok(Some(_))) => break true,
                    Ok(Ok(None)) | Err(_) => break false,
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "lease refresh failed; retrying");
                        break false;
                    }
                }
                tokio::time::sleep(every).await;
            },
            Ok(Err(e)) => {
                // etcd-client reports a lease etcd no longer knows (it
                // expired or was revoked while no stream was open) as a
                // failure to open the stream: ask etcd whether it is gone.
                tracing::warn!(error = %e, "lease refresh stream failed; retrying");
                lease_gone(&mut client, current, every * 2).await
            }
            Err(_) => {
                tracing::warn!("lease refresh stream did not open; retrying");
                false
            }
        };
        if lost {
            metrics::counter!("memwal_cluster_leases_lost_total").increment(1);
            tracing::error!(member = %id, "the lease expired (paused or cut off from etcd); joining again");
            match tokio::time::timeout(every * 3, register(&mut client, &config, &id)).await {
                Ok(Ok(new)) => {
                    lease.store(new, Ordering::SeqCst);
                    tracing::info!(member = %id, "joined the cluster again");
                    continue;
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "joining again failed; retrying"),
                Err(_) => tracing::warn!("joining again timed out; retrying"),
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// Keeps `tx`'s view current: a read of the prefix, then its watch from
/// the next revision; on any break (etcd restarted, history compacted)
/// the view is read again and watched from there.
async fn follow(
    mut client: Client,
    prefix: String,
    tx: watch::Sender<Arc<View>>,
    stopping: Arc<AtomicBool>,
) {
    let mut first = true;
    while !stopping.load(Ordering::SeqCst) {
        if !first {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        first = false;
        let mut view = match read_view(&mut client, &prefix).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "reading the cluster failed; retrying");
                continue;
            }
        };
        let from = view.revision + 1;
        tx.send_replace(Arc::new(view.clone()));
        metrics::gauge!("memwal_cluster_members").set(view.members().count() as f64);
        let options = WatchOptions::new().with_prefix().with_start_revision(from);
        let mut stream = match client.watch(format!("{prefix}/"), Some(options)).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "watching the cluster failed; retrying");
                continue;
            }
        };
        loop {
            let response = match stream.message().await {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "the cluster watch broke; reading again");
                    break;
                }
            };
            if response.canceled() {
                tracing::warn!(
                    reason = response.cancel_reason(),
                    "the cluster watch was cancelled; reading again"
                );
                break;
            }
            if response.events().is_empty() {
                continue;
            }
            for event in response.events() {
                let Some(kv) = event.kv() else { continue };
                match event.event_type() {
                    EventType::Put => view.apply(&prefix, kv.key(), Some(kv.value())),
                    EventType::Delete => view.apply(&prefix, kv.key(), None),
                }
                view.revision = view.revision.max(kv.mod_revision());
            }
            metrics::counter!("memwal_cluster_view_updates_total").increment(1);
            metrics::gauge!("memwal_cluster_members").set(view.members().count() as f64);
            tx.send_replace(Arc::new(view.clone()));
        }
    }
}
