//! A column added to the base table while a shard is written, and the
//! shard taken over across the change, both ways: upstream's writer
//! follows the change (`evolve_to`) and is abandoned, memwal replays its
//! mixed-schema WAL; memwal follows it (`ShardWriter::evolve`) and is
//! abandoned, upstream replays. Upstream's `LsmScanner` over the mixed
//! generations must show every acknowledged row, `extra` null where the
//! producer sent none.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use lance::dataset::mem_wal::{LsmScanner, ShardSnapshot};
use lance::dataset::{Dataset, NewColumnTransform};

use crate::support::*;

/// key -> (payload, extra).
type Seen = BTreeMap<i64, (String, Option<String>)>;

async fn add_extra(t: &Table) {
    let mut ds = Dataset::open(&t.uri).await.unwrap();
    let extra = Arc::new(Schema::new(vec![Field::new("extra", DataType::Utf8, true)]));
    ds.add_columns(NewColumnTransform::AllNulls(extra), None, None)
        .await
        .unwrap();
}

/// `rows(ids, tag)` with `extra` = `x-<tag>-<id>` appended.
fn rows_extra(ids: &[i64], tag: &str) -> RecordBatch {
    let b = rows(ids, tag);
    let mut fields: Vec<Field> = b
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("extra", DataType::Utf8, true));
    let mut columns = b.columns().to_vec();
    columns.push(Arc::new(StringArray::from_iter_values(
        ids.iter().map(|i| format!("x-{tag}-{i}")),
    )) as ArrayRef);
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

fn expect(seen: &mut Seen, ids: &[i64], tag: &str, extra: bool) {
    for &id in ids {
        let row = Row::of(id, tag);
        seen.insert(id, (row.payload, extra.then(|| format!("x-{tag}-{id}"))));
    }
}

/// Upstream's `LsmScanner` over the base and the shard's published SSTables.
async fn scan(t: &Table, shard: &Shard) -> Seen {
    let ds = Arc::new(Dataset::open(&t.uri).await.unwrap());
    let m = t.manifest(shard).await;
    let mut snap = ShardSnapshot::new(shard.uuid)
        .with_spec_id(m.shard_spec_id)
        .with_current_generation(m.current_generation);
    for (generation, path) in m.sstables {
        snap = snap.with_sstable(generation, path);
    }
    let batch = LsmScanner::new(ds, vec![snap], vec!["id".to_string()])
        .try_into_batch()
        .await
        .expect("upstream LsmScanner over mixed-schema generations");
    let ids = batch
        .column_by_name("id")
        .unwrap()
        .as_primitive::<Int64Type>();
    let payload = batch.column_by_name("payload").unwrap().as_string::<i32>();
    let extra = batch
        .column_by_name("extra")
        .expect("the scan has the new column")
        .as_string::<i32>();
    let mut out = Seen::new();
    for i in 0..batch.num_rows() {
        let e = extra.is_valid(i).then(|| extra.value(i).to_string());
        let prev = out.insert(ids.value(i), (payload.value(i).to_string(), e));
        assert!(prev.is_none(), "key {} seen twice", ids.value(i));
    }
    out
}

// Breaks if memwal cannot replay a WAL upstream wrote across a schema
// change (entries of two schemas), or if the generations it publishes
// cannot be read with upstream's earlier ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_follows_a_new_column_then_memwal_takes_over() {
    let (t, _) = Table::create(Sharding::Unsharded, false).await;
    let shard = t.shards().remove(0);
    let mut want = Seen::new();
    let up = t.open_upstream(&shard).await.unwrap();
    let old = shard.keys(&[0, 1, 2]);
    up.put(vec![rows(&old, "u1")]).await.unwrap();
    expect(&mut want, &old, "u1", false);
    add_extra(&t).await;
    up.evolve_to(&Dataset::open(&t.uri).await.unwrap())
        .await
        .expect("upstream follows the new column");
    let new = shard.keys(&[2, 3]);
    up.put(vec![rows_extra(&new, "u2")]).await.unwrap();
    expect(&mut want, &new, "u2", true);

    // Abandoned: memwal claims the shard and replays both kinds of entry.
    let w = t.open_memwal(&shard, shard.memwal_config()).await.unwrap();
    assert!(
        w.schema().table_schema().field_with_name("extra").is_ok(),
        "memwal opens on the base's current schema"
    );
    let mine = shard.keys(&[4]);
    w.put(&rows_extra(&mine, "m1")).await.unwrap();
    expect(&mut want, &mine, "m1", true);
    // A producer still on the old columns.
    let legacy = shard.keys(&[0, 5]);
    w.put(&rows(&legacy, "m2")).await.unwrap();
    expect(&mut want, &legacy, "m2", false);
    w.close().await.unwrap();
    assert_eq!(scan(&t, &shard).await, want);
}

// Breaks if upstream cannot replay a WAL memwal wrote across a schema
// change, or if memwal's SSTables of the two schemas are not read together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memwal_follows_a_new_column_then_upstream_takes_over() {
    let (t, _) = Table::create(Sharding::Unsharded, false).await;
    let shard = t.shards().remove(0);
    let mut want = Seen::new();
    let w = t.open_memwal(&shard, shard.memwal_config()).await.unwrap();
    let first = shard.keys(&[0, 1]);
    w.put(&rows(&first, "m1")).await.unwrap();
    expect(&mut want, &first, "m1", false);
    // One generation published in the old schema.
    w.flush().await.unwrap();
    let old = shard.keys(&[1, 2]);
    w.put(&rows(&old, "m2")).await.unwrap();
    expect(&mut want, &old, "m2", false);
    add_extra(&t).await;
    assert!(w.evolve().await.unwrap().is_some());
    let new = shard.keys(&[2, 3]);
    w.put(&rows_extra(&new, "m3")).await.unwrap();
    expect(&mut want, &new, "m3", true);
    // Abandoned with the last two generations (one per schema) only in
    // the WAL, or the first of them published meanwhile.
    w.abort();
    drop(w);

    let up = t.open_upstream(&shard).await.unwrap();
    let theirs = shard.keys(&[4]);
    up.put(vec![rows_extra(&theirs, "u1")]).await.unwrap();
    expect(&mut want, &theirs, "u1", true);
    up.close().await.unwrap();
    assert_eq!(scan(&t, &shard).await, want);
}
