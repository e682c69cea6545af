//! Idempotent producers across implementations
//! (docs/design/idempotent-producers.md, "Upstream"): memwal's stamped WAL
//! entries (`memwal:producers` schema metadata) and producer checkpoints
//! must not disturb upstream, and memwal must keep deduplicating after
//! upstream held the shard.

use memwal::{Acked, ProducerSeq};

use crate::support::*;

fn seq(sequence: u64) -> ProducerSeq {
    ProducerSeq::new("flink-job/7", 3, sequence)
}

// Breaks if upstream cannot replay or read memwal's stamped WAL entries
// (the extra schema metadata reaching its memtable or SSTable schema), or
// if memwal, claiming the shard back after upstream published generations
// without checkpoints, loses the sequences of its own last checkpoint
// (retries of them would be written again: key 0 would go back to
// "retry-1", or be deleted by the retried delete).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_replays_stamped_entries_and_memwal_dedups_after_it() {
    let (t, mut model) = Table::create(Sharding::Unsharded, false).await;
    let s = &t.shards()[0];
    let w = t.open_memwal(s, s.memwal_config()).await.unwrap();
    let mut positions = Vec::new();
    for (n, idx) in [vec![0, 1], vec![0, 2], vec![3]].into_iter().enumerate() {
        let ids = s.keys(&idx);
        let tag = format!("p{n}");
        let a = w
            .put_idempotent(&rows(&ids, &tag), &seq(n as u64 + 1))
            .await;
        positions.push(a.unwrap().position);
        model.put(&ids, &tag);
    }
    let deleted = s.keys(&[1]);
    let a = w.delete_idempotent(&keys(&deleted), &seq(4)).await.unwrap();
    model.delete(&deleted);
    w.flush().await.unwrap(); // generation 1 and its checkpoint
    let ids = s.keys(&[4]);
    w.put_idempotent(&rows(&ids, "p4"), &seq(5)).await.unwrap();
    model.put(&ids, "p4");
    drop(w); // abandoned: sequence 5 only in the WAL

    let up = t.open_upstream(s).await.unwrap();
    up.put(vec![rows(&s.keys(&[5]), "up")]).await.unwrap();
    model.put(&s.keys(&[5]), "up");
    up.close().await.unwrap();
    assert_view(
        &t.upstream_view(std::slice::from_ref(s)).await,
        &model,
        "upstream replayed memwal's stamped entries",
    );

    let w = t.open_memwal(s, s.memwal_config()).await.unwrap();
    for (n, idx) in [vec![0, 1], vec![0, 2], vec![3]].into_iter().enumerate() {
        let retried = w
            .put_idempotent(
                &rows(&s.keys(&idx), &format!("retry-{n}")),
                &seq(n as u64 + 1),
            )
            .await
            .unwrap();
        assert_eq!(
            retried,
            Acked {
                position: positions[n],
                duplicate: true
            },
            "sequence {} (in memwal's checkpoint)",
            n + 1
        );
    }
    let retried = w.delete_idempotent(&keys(&s.keys(&[0])), &seq(4)).await;
    assert_eq!(
        retried.unwrap(),
        Acked {
            position: a.position,
            duplicate: true
        },
        "the delete's sequence"
    );
    w.close().await.unwrap();
    assert_view(
        &t.upstream_view(std::slice::from_ref(s)).await,
        &model,
        "retries after the round trip wrote nothing",
    );
}
