//! memwal's bucket routing against upstream's evaluation of the sharding
//! spec upstream installed (`bucket_sharding("id", 4)`).

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int32Type;
use arrow_array::RecordBatch;
use arrow_schema::{Field, Schema};
use lance::dataset::mem_wal::{evaluate_sharding_spec, DatasetMemWalExt};
use lance::dataset::Dataset;
use memwal_sharding::ShardRouter;

use crate::support::*;

// Breaks if memwal's hash or bucket formula (or its router reading the
// spec upstream wrote) puts an int64 key in another bucket than upstream
// does: rows would be refused, or land in a shard upstream's readers and
// writers do not expect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memwal_bucket_routing_agrees_with_upstream() {
    let (t, _) = Table::create(Sharding::Bucket, false).await;
    let ds = Dataset::open(&t.uri).await.unwrap();
    let details = ds
        .mem_wal_index_details()
        .await
        .unwrap()
        .expect("the MemWAL index");
    assert_eq!(details.sharding_specs.len(), 1, "{details:?}");
    let spec = &details.sharding_specs[0];
    assert_eq!(spec.fields.len(), 1, "{spec:?}");
    assert_eq!(spec.fields[0].field_id, BUCKET_FIELD, "{spec:?}");
    assert_eq!(
        spec.fields[0].transform.as_deref(),
        Some("bucket"),
        "{spec:?}"
    );

    let mut ids: Vec<i64> = (-300..300).collect();
    ids.extend([
        i64::MIN,
        i64::MIN + 1,
        i64::MAX,
        i64::MAX - 1,
        1 << 32,
        -(1 << 32),
        (1 << 32) + 1,
        0x1234_5678_9abc_def0,
        -0x0fed_cba9_8765_4321,
    ]);
    let batch = rows(&ids, "route");
    let theirs = evaluate_sharding_spec(&batch, spec, ds.schema()).expect("upstream evaluates");
    let theirs = theirs
        .column_by_name(BUCKET_FIELD)
        .expect("a bucket column")
        .as_primitive::<Int32Type>();

    // memwal's router over the same spec, converted field by field, on the
    // batch with the base table's field ids.
    let ours_spec = memwal_proto::ShardingSpec {
        spec_id: spec.spec_id,
        fields: spec
            .fields
            .iter()
            .map(|f| memwal_proto::ShardingField {
                field_id: f.field_id.clone(),
                source_ids: f.source_ids.clone(),
                transform: f.transform.clone(),
                expression: f.expression.clone(),
                result_type: f.result_type.clone(),
                parameters: f
                    .parameters
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            })
            .collect(),
    };
    let with_ids = Arc::new(Schema::new(
        table_schema()
            .fields()
            .iter()
            .map(|f| {
                let id = ds.schema().field(f.name()).expect("a base column").id;
                let mut md = f.metadata().clone();
                md.insert(memwal_sharding::FIELD_ID_KEY.to_string(), id.to_string());
                Field::clone(f).with_metadata(md)
            })
            .collect::<Vec<_>>(),
    ));
    let router = ShardRouter::new(&ours_spec, &with_ids).expect("memwal binds the spec");
    let batch = RecordBatch::try_new(with_ids, batch.columns().to_vec()).unwrap();

    let mut seen = [0usize; NUM_BUCKETS as usize];
    for (row, id) in ids.iter().enumerate() {
        let up = theirs.value(row);
        assert_eq!(
            memwal_bucket(*id),
            up,
            "key {id}: memwal's hash vs upstream"
        );
        let values = router.row_values(&batch, row).expect("memwal routes");
        assert_eq!(
            values.get(BUCKET_FIELD).map(Vec::as_slice),
            Some(&up.to_le_bytes()[..]),
            "key {id}: memwal's router vs upstream"
        );
        seen[up as usize] += 1;
    }
    assert!(seen.iter().all(|n| *n > 0), "every bucket occurs: {seen:?}");
}
