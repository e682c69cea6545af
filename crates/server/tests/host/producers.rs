//! Idempotent producers through `TableHost::write_as`
//! (docs/design/idempotent-producers.md): a batch split over shards is
//! acknowledged once every part is durable, and a retry of a batch whose
//! outcome was unknown or partial writes only the parts that are missing.

use std::sync::atomic::{AtomicUsize, Ordering};

use memwal::ProducerSeq;
use memwal_testkit::{permission_denied, Action, InjectError, OpKind};

use super::*;

fn seq(sequence: u64) -> ProducerSeq {
    ProducerSeq::new("loader", 1, sequence)
}

// Breaks if a retried batch writes a part again (keys keep the first
// write's value "b"/"c", never "retry"), if a part that never landed is
// not written by the retry, if a batch after a failed one is taken before
// the failed one is retried (the daemon's gap rule), or if a duplicate is
// not reported as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_batch_writes_only_its_missing_parts() {
    let dir = tempfile::tempdir().unwrap();
    let loc = bucket_table(&dir).await;
    let (faults, faulty) = through_faults(&loc);
    let config = ShardWriterConfig {
        retry: memwal_store::RetryPolicy {
            max_attempts: 2,
            initial_backoff: std::time::Duration::from_millis(1),
            max_backoff: std::time::Duration::from_millis(2),
        },
        ..ShardWriterConfig::default()
    };
    let host = TableHost::open("t", faulty, config).await.unwrap();
    let ids: Vec<i64> = (0..16).collect();
    let bucket = |id: &i64| memwal_sharding::bucket_of(memwal_sharding::hash_i64(*id), 4);
    let victim = host.write(&tagged(&[0], "a"), false).await.unwrap()[0]
        .shard
        .clone();
    let victims: Vec<i64> = ids
        .iter()
        .copied()
        .filter(|i| bucket(i) == bucket(&0))
        .collect();
    let others: Vec<i64> = ids
        .iter()
        .copied()
        .filter(|i| bucket(i) != bucket(&0))
        .collect();
    let first = host
        .write_as(&tagged(&ids, "a"), false, Some(&seq(1)))
        .await
        .unwrap();
    assert_eq!(first.len(), 4, "{first:?}");
    assert!(first
        .iter()
        .all(|p| !p.duplicate && p.wal_position.is_some()));
    let model = |tags: &[(&[i64], &str)]| {
        let mut m = BTreeMap::new();
        for (ids, tag) in tags {
            put(&mut m, ids, tag);
        }
        m
    };

    // 1. The victim's WAL write lands but reports an error (then every
    //    retry of it fails): its part's outcome is unknown.
    let calls = std::sync::Arc::new(AtomicUsize::new(0));
    {
        let (victim, calls) = (victim.clone(), calls.clone());
        faults.set_hook(move |op| {
            if op.kind != OpKind::Put || !op.path.contains(&format!("{victim}/wal/")) {
                return Action::Pass;
            }
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 => Action::LandThenFail,
                _ => Action::Fail,
            }
        });
    }
    let e = host
        .write_as(&tagged(&ids, "b"), false, Some(&seq(2)))
        .await
        .unwrap_err();
    assert!(matches!(e, ServerError::Partial { .. }), "{e}");
    let e = host
        .write_as(&tagged(&[1], "next"), false, Some(&seq(3)))
        .await
        .unwrap_err();
    let status = tonic::Status::from(e);
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert_eq!(
        status
            .metadata()
            .get(memwal_server::EXPECTED_SEQUENCE_KEY)
            .unwrap(),
        "2"
    );
    faults.clear_hook();
    reopen_down(&host).await;
    let retried = host
        .write_as(&tagged(&ids, "retry"), false, Some(&seq(2)))
        .await
        .unwrap();
    assert!(
        retried.iter().all(|p| p.duplicate),
        "every part landed (one unknown to the writer that wrote it): {retried:?}"
    );
    assert_eq!(
        as_map(&host.read_rows().await.unwrap()),
        model(&[(&ids, "b")])
    );

    // 2. The victim's WAL write is refused outright: its part is missing.
    faults.set_hook({
        let victim = victim.clone();
        move |op| {
            if op.kind == OpKind::Put && op.path.contains(&format!("{victim}/wal/")) {
                Action::FailWith(InjectError::new(|| permission_denied("wal")))
            } else {
                Action::Pass
            }
        }
    });
    let e = host
        .write_as(&tagged(&ids, "c"), false, Some(&seq(3)))
        .await
        .unwrap_err();
    assert!(matches!(e, ServerError::Partial { .. }), "{e}");
    faults.clear_hook();
    reopen_down(&host).await;
    let retried = host
        .write_as(&tagged(&ids, "retry"), false, Some(&seq(3)))
        .await
        .unwrap();
    let missing: Vec<_> = retried.iter().filter(|p| !p.duplicate).collect();
    assert_eq!(missing.len(), 1, "{retried:?}");
    assert_eq!(missing[0].shard, victim);
    assert_eq!(
        as_map(&host.read_rows().await.unwrap()),
        model(&[(&others, "c"), (&victims, "retry")])
    );
    host.close().await.unwrap();
}
