//! The cluster layer against a real etcd (see `memwal_testkit::etcd`).

use std::collections::BTreeMap;
use std::time::Duration;

use memwal_cluster::{Acquired, Cluster, ClusterConfig};
use memwal_testkit::EtcdServer;

fn config(etcd: &EtcdServer, advertise: &str) -> ClusterConfig {
    ClusterConfig {
        endpoints: vec![etcd.endpoint()],
        advertise: advertise.into(),
        prefix: "/memwal-test".into(),
        lease_ttl: Duration::from_secs(2),
    }
}

/// Waits (up to 20 s of real time) until `cluster`'s view satisfies `ok`.
async fn until(cluster: &Cluster, what: &str, ok: impl Fn(&memwal_cluster::View) -> bool) {
    let mut rx = cluster.subscribe();
    tokio::time::timeout(Duration::from_secs(20), rx.wait_for(|v| ok(v)))
        .await
        .unwrap_or_else(|_| panic!("{what}: not seen within 20 s; view {:?}", cluster.view()))
        .expect("the view's sender lives as long as the cluster");
}

fn values() -> BTreeMap<String, String> {
    [("1".to_string(), "00000000".to_string())].into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(memwal_etcd_tests),
    ignore = "needs etcd (apt-get install etcd-server)"
)]
async fn members_see_each_other_and_agree_on_owners() {
    let etcd = EtcdServer::start();
    let a = Cluster::join(config(&etcd, "grpc://a:1"))
        .await
        .expect("a joins");
    let b = Cluster::join(config(&etcd, "grpc://b:1"))
        .await
        .expect("b joins");
    for c in [&a, &b] {
        until(c, "both members", |v| v.members().count() == 2).await;
    }
    let (va, vb) = (a.view(), b.view());
    for s in 0..50 {
        let shard = format!("s{s}");
        assert_eq!(
            va.desired("t", &shard).map(|m| m.id.clone()),
            vb.desired("t", &shard).map(|m| m.id.clone())
        );
    }
    // One owner record per shard: the second member is refused while the
    // first holds it, and gets it once released.
    assert_eq!(
        a.acquire("t", "s0", values()).await.expect("acquire"),
        Acquired::Mine
    );
    assert_eq!(
        a.acquire("t", "s0", values()).await.expect("again"),
        Acquired::Mine
    );
    assert_eq!(
        b.acquire("t", "s0", values()).await.expect("acquire"),
        Acquired::Held(a.id().to_string())
    );
    until(&b, "a's record", |v| {
        v.owner("t", "s0")
            .is_some_and(|o| o.member == a.id() && o.values == values())
    })
    .await;
    b.release("t", "s0")
        .await
        .expect("a release by a non-owner is a no-op");
    assert!(a.view().owner("t", "s0").is_some() || b.view().owner("t", "s0").is_some());
    a.release("t", "s0").await.expect("release");
    until(&b, "the record gone", |v| v.owner("t", "s0").is_none()).await;
    assert_eq!(
        b.acquire("t", "s0", values()).await.expect("acquire"),
        Acquired::Mine
    );
    b.leave().await.expect("leave");
    until(&a, "b gone with its records", |v| {
        v.members().count() == 1 && v.owner("t", "s0").is_none()
    })
    .await;
    a.leave().await.expect("leave");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(memwal_etcd_tests),
    ignore = "needs etcd (apt-get install etcd-server)"
)]
async fn a_member_whose_lease_expires_leaves_and_joins_again() {
    let mut etcd = EtcdServer::start();
    let a = Cluster::join(config(&etcd, "grpc://a:1"))
        .await
        .expect("a joins");
    let b = Cluster::join(config(&etcd, "grpc://b:1"))
        .await
        .expect("b joins");
    assert_eq!(
        b.acquire("t", "s", values()).await.expect("acquire"),
        Acquired::Mine
    );
    until(&a, "b's record", |v| v.owner("t", "s").is_some()).await;
    // etcd restarts: leases survive it (their TTLs restart), so both stay
    // members and b keeps its record.
    etcd.stop();
    etcd.start_again();
    until(&a, "both members after the restart", |v| {
        v.members().count() == 2
    })
    .await;
    assert_eq!(
        b.acquire("t", "s", values()).await.expect("acquire"),
        Acquired::Mine
    );
    // b's lease revoked behind its back (as an expiry would): its member
    // key and owner record go, a sees the shard free, and b joins again.
    let mut admin = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .expect("an admin client");
    let leases = admin.leases().await.expect("leases");
    let record = admin
        .get("/memwal-test/owners/t/s", None)
        .await
        .expect("the record");
    let b_lease = record.kvs()[0].lease();
    assert!(leases.leases().iter().any(|l| l.id() == b_lease));
    admin.lease_revoke(b_lease).await.expect("revoke");
    until(&a, "b's record gone", |v| v.owner("t", "s").is_none()).await;
    assert_eq!(
        a.acquire("t", "s", values()).await.expect("acquire"),
        Acquired::Mine
    );
    until(&a, "b back as a member", |v| v.member(b.id()).is_some()).await;
    assert_eq!(
        b.acquire("t", "s", values()).await.expect("acquire"),
        Acquired::Held(a.id().to_string())
    );
}
