//! Replay of WAL shapes the writer itself does not produce.

use memwal_wal::codec::encode_entry;
use object_store::ObjectStoreExt;

use crate::support::*;

// Breaks if generation-less (upstream WAL-only) entries are dropped, given
// a generation of their own (renumbering), or applied out of WAL order
// relative to the recorded generation they follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generation_less_entries_join_the_generation_being_rebuilt() {
    let t = TestTable::new().await;
    let w = t.open(config()).await.unwrap();
    let schema = table_schema(&w);
    let storage = |ids: &[i64], v: &str| schema.to_storage(&rows(ids, v)).unwrap();
    w.put(&rows(&[1, 2], "a")).await.unwrap();
    let last = w.put(&rows(&[3], "a")).await.unwrap();
    let epoch = w.epoch();
    w.abort();
    // An upstream-style entry (no `generation`) right after ours.
    let bytes = encode_entry(epoch, None, &[storage(&[2, 4], "up")]).unwrap();
    t.mem
        .put(&t.layout().wal_path(last + 1), bytes.into())
        .await
        .unwrap();

    let w2 = t.reopen_inner(config()).await;
    let m = t.manifest().await;
    let gens: Vec<u64> = m.sstables.iter().map(|s| s.generation).collect();
    assert_eq!(gens, vec![1], "one recorded generation, not renumbered");
    assert_eq!(m.sstables[0].physical_rows, Some(5));
    assert_eq!(m.replay_after_wal_entry_position, last + 1);
    let mut model = Model::new();
    model_put(&mut model, &[1, 2, 3], "a");
    model_put(&mut model, &[2, 4], "up");
    assert_eq!(t.read_published(&schema).await, model);
    assert_eq!(w2.stats().generation, 2);
    w2.close().await.unwrap();
}
