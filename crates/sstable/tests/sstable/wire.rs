//! Wire compatibility of memwal-proto with lance's own generated types
//! (`lance_table::format::pb`), both directions, every field of every
//! MemWAL message.
//!
//! The converters below destructure each message exhaustively (no `..`) and
//! build the other side's struct without `..Default::default()`: a field
//! added on either side and not handled here is a compile error. Every field
//! is set to a distinct non-default value, so a wrong field number, wire
//! type or a dropped field shows up as a mismatch after decoding.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use lance_table::format::pb as lpb;
use memwal_proto as ours;
use prost::Message;

fn uuid_to_lance(u: &ours::Uuid) -> lpb::Uuid {
    let ours::Uuid { uuid } = u;
    lpb::Uuid { uuid: uuid.clone() }
}
fn uuid_from_lance(u: &lpb::Uuid) -> ours::Uuid {
    let lpb::Uuid { uuid } = u;
    ours::Uuid { uuid: uuid.clone() }
}

fn sstable_from_lance(s: &lpb::SsTable) -> ours::SsTable {
    let lpb::SsTable {
        generation,
        path,
        in_memory_bytes,
        physical_rows,
        primary_key_bytes,
    } = s;
    ours::SsTable {
        generation: *generation,
        path: path.clone(),
        in_memory_bytes: *in_memory_bytes,
        physical_rows: *physical_rows,
        primary_key_bytes: *primary_key_bytes,
    }
}
fn sstable_to_lance(s: &ours::SsTable) -> lpb::SsTable {
    let ours::SsTable {
        generation,
        path,
        in_memory_bytes,
        physical_rows,
        primary_key_bytes,
    } = s;
    lpb::SsTable {
        generation: *generation,
        path: path.clone(),
        in_memory_bytes: *in_memory_bytes,
        physical_rows: *physical_rows,
        primary_key_bytes: *primary_key_bytes,
    }
}

fn field_entry_from_lance(e: &lpb::ShardFieldEntry) -> ours::ShardFieldEntry {
    let lpb::ShardFieldEntry { field_id, value } = e;
    ours::ShardFieldEntry {
        field_id: field_id.clone(),
        value: value.clone(),
    }
}
fn field_entry_to_lance(e: &ours::ShardFieldEntry) -> lpb::ShardFieldEntry {
    let ours::ShardFieldEntry { field_id, value } = e;
    lpb::ShardFieldEntry {
        field_id: field_id.clone(),
        value: value.clone(),
    }
}

fn manifest_from_lance(m: &lpb::ShardManifest) -> ours::ShardManifest {
    let lpb::ShardManifest {
        shard_id,
        version,
        shard_spec_id,
        shard_field_entries,
        writer_epoch,
        replay_after_wal_entry_position,
        wal_entry_position_last_seen,
        current_generation,
        sstables,
        status,
    } = m;
    ours::ShardManifest {
        shard_id: shard_id.as_ref().map(uuid_from_lance),
        version: *version,
        shard_spec_id: *shard_spec_id,
        shard_field_entries: shard_field_entries
            .iter()
            .map(field_entry_from_lance)
            .collect(),
        writer_epoch: *writer_epoch,
        replay_after_wal_entry_position: *replay_after_wal_entry_position,
        wal_entry_position_last_seen: *wal_entry_position_last_seen,
        current_generation: *current_generation,
        sstables: sstables.iter().map(sstable_from_lance).collect(),
        status: *status,
    }
}
fn manifest_to_lance(m: &ours::ShardManifest) -> lpb::ShardManifest {
    let ours::ShardManifest {
        shard_id,
        version,
        shard_spec_id,
        shard_field_entries,
        writer_epoch,
        replay_after_wal_entry_position,
        wal_entry_position_last_seen,
        current_generation,
        sstables,
        status,
    } = m;
    lpb::ShardManifest {
        shard_id: shard_id.as_ref().map(uuid_to_lance),
        version: *version,
        shard_spec_id: *shard_spec_id,
        shard_field_entries: shard_field_entries
            .iter()
            .map(field_entry_to_lance)
            .collect(),
        writer_epoch: *writer_epoch,
        replay_after_wal_entry_position: *replay_after_wal_entry_position,
        wal_entry_position_last_seen: *wal_entry_position_last_seen,
        current_generation: *current_generation,
        sstables: sstables.iter().map(sstable_to_lance).collect(),
        status: *status,
    }
}

fn compacted_from_lance(c: &lpb::CompactedSsTable) -> ours::CompactedSsTable {
    let lpb::CompactedSsTable {
        shard_id,
        generation,
    } = c;
    ours::CompactedSsTable {
        shard_id: shard_id.as_ref().map(uuid_from_lance),
        generation: *generation,
    }
}
fn compacted_to_lance(c: &ours::CompactedSsTable) -> lpb::CompactedSsTable {
    let ours::CompactedSsTable {
        shard_id,
        generation,
    } = c;
    lpb::CompactedSsTable {
        shard_id: shard_id.as_ref().map(uuid_to_lance),
        generation: *generation,
    }
}

fn catchup_from_lance(c: &lpb::IndexCatchupProgress) -> ours::IndexCatchupProgress {
    let lpb::IndexCatchupProgress {
        index_name,
        caught_up_generations,
    } = c;
    ours::IndexCatchupProgress {
        index_name: index_name.clone(),
        caught_up_generations: caught_up_generations
            .iter()
            .map(compacted_from_lance)
            .collect(),
    }
}
fn catchup_to_lance(c: &ours::IndexCatchupProgress) -> lpb::IndexCatchupProgress {
    let ours::IndexCatchupProgress {
        index_name,
        caught_up_generations,
    } = c;
    lpb::IndexCatchupProgress {
        index_name: index_name.clone(),
        caught_up_generations: caught_up_generations
            .iter()
            .map(compacted_to_lance)
            .collect(),
    }
}

fn to_btree(m: &HashMap<String, String>) -> BTreeMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}
fn to_hash(m: &BTreeMap<String, String>) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn field_from_lance(f: &lpb::ShardingField) -> ours::ShardingField {
    let lpb::ShardingField {
        field_id,
        source_ids,
        transform,
        expression,
        result_type,
        parameters,
    } = f;
    ours::ShardingField {
        field_id: field_id.clone(),
        source_ids: source_ids.clone(),
        transform: transform.clone(),
        expression: expression.clone(),
        result_type: result_type.clone(),
        parameters: to_btree(parameters),
    }
}
fn field_to_lance(f: &ours::ShardingField) -> lpb::ShardingField {
    let ours::ShardingField {
        field_id,
        source_ids,
        transform,
        expression,
        result_type,
        parameters,
    } = f;
    lpb::ShardingField {
        field_id: field_id.clone(),
        source_ids: source_ids.clone(),
        transform: transform.clone(),
        expression: expression.clone(),
        result_type: result_type.clone(),
        parameters: to_hash(parameters),
    }
}

fn spec_from_lance(s: &lpb::ShardingSpec) -> ours::ShardingSpec {
    let lpb::ShardingSpec { spec_id, fields } = s;
    ours::ShardingSpec {
        spec_id: *spec_id,
        fields: fields.iter().map(field_from_lance).collect(),
    }
}
fn spec_to_lance(s: &ours::ShardingSpec) -> lpb::ShardingSpec {
    let ours::ShardingSpec { spec_id, fields } = s;
    lpb::ShardingSpec {
        spec_id: *spec_id,
        fields: fields.iter().map(field_to_lance).collect(),
    }
}

fn details_from_lance(d: &lpb::MemWalIndexDetails) -> ours::MemWalIndexDetails {
    let lpb::MemWalIndexDetails {
        snapshot_ts_millis,
        num_shards,
        inline_snapshots,
        sharding_specs,
        maintained_indexes,
        maintain_all_indexes,
        compacted_sstables,
        index_catchup,
        writer_config_defaults,
    } = d;
    ours::MemWalIndexDetails {
        snapshot_ts_millis: *snapshot_ts_millis,
        num_shards: *num_shards,
        inline_snapshots: inline_snapshots.clone(),
        sharding_specs: sharding_specs.iter().map(spec_from_lance).collect(),
        maintained_indexes: maintained_indexes.clone(),
        maintain_all_indexes: *maintain_all_indexes,
        compacted_sstables: compacted_sstables
            .iter()
            .map(compacted_from_lance)
            .collect(),
        index_catchup: index_catchup.iter().map(catchup_from_lance).collect(),
        writer_config_defaults: to_btree(writer_config_defaults),
    }
}
fn details_to_lance(d: &ours::MemWalIndexDetails) -> lpb::MemWalIndexDetails {
    let ours::MemWalIndexDetails {
        snapshot_ts_millis,
        num_shards,
        inline_snapshots,
        sharding_specs,
        maintained_indexes,
        maintain_all_indexes,
        compacted_sstables,
        index_catchup,
        writer_config_defaults,
    } = d;
    lpb::MemWalIndexDetails {
        snapshot_ts_millis: *snapshot_ts_millis,
        num_shards: *num_shards,
        inline_snapshots: inline_snapshots.clone(),
        sharding_specs: sharding_specs.iter().map(spec_to_lance).collect(),
        maintained_indexes: maintained_indexes.clone(),
        maintain_all_indexes: *maintain_all_indexes,
        compacted_sstables: compacted_sstables.iter().map(compacted_to_lance).collect(),
        index_catchup: index_catchup.iter().map(catchup_to_lance).collect(),
        writer_config_defaults: to_hash(writer_config_defaults),
    }
}

fn uuid(n: u8) -> ours::Uuid {
    ours::Uuid::from_bytes([n; 16])
}

/// Every field set, each to a value no other field shares.
fn full_manifest() -> ours::ShardManifest {
    ours::ShardManifest {
        shard_id: Some(uuid(0xab)),
        version: 3,
        shard_spec_id: 5,
        shard_field_entries: vec![
            ours::ShardFieldEntry {
                field_id: "bucket".into(),
                value: vec![7, 0, 0, 0],
            },
            ours::ShardFieldEntry {
                field_id: "region".into(),
                value: b"eu".to_vec(),
            },
        ],
        writer_epoch: 11,
        replay_after_wal_entry_position: 13,
        wal_entry_position_last_seen: 17,
        current_generation: 19,
        sstables: vec![
            ours::SsTable {
                generation: 23,
                path: "0badcafe_gen_23".into(),
                in_memory_bytes: Some(29),
                physical_rows: Some(31),
                primary_key_bytes: Some(37),
            },
            // Optional fields absent must stay absent, not become zero.
            ours::SsTable {
                generation: 41,
                path: "deadbeef_gen_41".into(),
                in_memory_bytes: None,
                physical_rows: None,
                primary_key_bytes: None,
            },
            // And present-but-zero must stay present.
            ours::SsTable {
                generation: 43,
                path: "00000000_gen_43".into(),
                in_memory_bytes: Some(0),
                physical_rows: Some(0),
                primary_key_bytes: Some(0),
            },
        ],
        status: ours::ShardStatus::Sealed as i32,
    }
}

fn full_details() -> ours::MemWalIndexDetails {
    let compacted = |n: u8, g: u64| ours::CompactedSsTable {
        shard_id: Some(uuid(n)),
        generation: g,
    };
    ours::MemWalIndexDetails {
        snapshot_ts_millis: -47,
        num_shards: 53,
        inline_snapshots: Some(vec![1, 2, 3, 0, 255]),
        sharding_specs: vec![ours::ShardingSpec {
            spec_id: 59,
            fields: vec![
                ours::ShardingField {
                    field_id: "b".into(),
                    source_ids: vec![61, -1, 67],
                    transform: Some("bucket".into()),
                    expression: Some("id % 8".into()),
                    result_type: "int32".into(),
                    parameters: [("num_buckets".to_string(), "8".to_string())]
                        .into_iter()
                        .collect(),
                },
                ours::ShardingField {
                    field_id: "u".into(),
                    source_ids: vec![],
                    transform: None,
                    expression: None,
                    result_type: "int32".into(),
                    parameters: BTreeMap::new(),
                },
            ],
        }],
        maintained_indexes: vec!["idx_a".into(), "idx_b".into()],
        maintain_all_indexes: Some(true),
        compacted_sstables: vec![compacted(1, 71), compacted(2, 73)],
        index_catchup: vec![ours::IndexCatchupProgress {
            index_name: "idx_a".into(),
            caught_up_generations: vec![compacted(3, 79)],
        }],
        writer_config_defaults: [
            ("max_memtable_rows".to_string(), "1000".to_string()),
            ("flush_interval_ms".to_string(), "250".to_string()),
        ]
        .into_iter()
        .collect(),
    }
}

/// Encode with `E`, decode with `D`.
fn across<E: Message, D: Message + Default>(m: &E) -> D {
    D::decode(Bytes::from(m.encode_to_vec())).expect("decodes")
}

// Breaks if any ShardManifest/SsTable/ShardFieldEntry/UUID field number or
// wire type differs from lance's, or an optional SsTable field loses
// presence (None vs Some(0)), or SEALED has another enum value.
#[test]
fn shard_manifest_round_trips_through_lance_types() {
    let m = full_manifest();
    let in_lance: lpb::ShardManifest = across(&m);
    assert_eq!(in_lance.status, lpb::ShardStatus::Sealed as i32);
    assert_eq!(manifest_from_lance(&in_lance), m, "ours -> lance");
    let back: ours::ShardManifest = across(&manifest_to_lance(&m));
    assert_eq!(back, m, "lance -> ours");
}

// Breaks if any MemWalIndexDetails/ShardingSpec/ShardingField/
// CompactedSsTable/IndexCatchupProgress field number differs, including the
// map fields 11 and ShardingField.parameters and lance 14's field 12.
#[test]
fn mem_wal_index_details_round_trip_through_lance_types() {
    let d = full_details();
    let in_lance: lpb::MemWalIndexDetails = across(&d);
    assert_eq!(in_lance.maintain_all_indexes, Some(true));
    assert_eq!(in_lance.writer_config_defaults.len(), 2);
    assert_eq!(details_from_lance(&in_lance), d, "ours -> lance");
    let back: ours::MemWalIndexDetails = across(&details_to_lance(&d));
    assert_eq!(back, d, "lance -> ours");

    // maintain_all_indexes absent stays absent (not false) both ways.
    let d = ours::MemWalIndexDetails {
        maintain_all_indexes: None,
        ..full_details()
    };
    let in_lance: lpb::MemWalIndexDetails = across(&d);
    assert_eq!(in_lance.maintain_all_indexes, None);
    let back: ours::MemWalIndexDetails = across(&details_to_lance(&d));
    assert_eq!(back.maintain_all_indexes, None);
}

// Breaks if a standalone message of the set encodes differently from lance
// when used on its own (not only nested).
#[test]
fn every_message_round_trips_on_its_own() {
    let m = full_manifest();
    let d = full_details();
    for s in &m.sstables {
        let l: lpb::SsTable = across(s);
        assert_eq!(&sstable_from_lance(&l), s);
        assert_eq!(&across::<_, ours::SsTable>(&sstable_to_lance(s)), s);
    }
    for e in &m.shard_field_entries {
        let l: lpb::ShardFieldEntry = across(e);
        assert_eq!(&field_entry_from_lance(&l), e);
    }
    let u = uuid(9);
    assert_eq!(uuid_from_lance(&across(&u)), u);
    let spec = &d.sharding_specs[0];
    assert_eq!(&spec_from_lance(&across(spec)), spec);
    for f in &spec.fields {
        assert_eq!(&field_from_lance(&across(f)), f);
        assert_eq!(&across::<_, ours::ShardingField>(&field_to_lance(f)), f);
    }
    let c = &d.compacted_sstables[0];
    assert_eq!(&compacted_from_lance(&across(c)), c);
    let p = &d.index_catchup[0];
    assert_eq!(&catchup_from_lance(&across(p)), p);
    assert_eq!(
        &across::<_, ours::IndexCatchupProgress>(&catchup_to_lance(p)),
        p
    );
}

// Breaks if lance's decoder rejected the claim token memwal appends to
// claimed manifests (unknown field 536870911, length-delimited): upstream
// readers could then not read any manifest our claims write. The bytes are
// the real ones a claim stores.
#[tokio::test]
async fn lance_decodes_claimed_manifests_with_the_claim_token() {
    use memwal_fencing::{ManifestStore, ShardId, ShardIdentity};
    use memwal_store::RetryPolicy;
    use object_store::{ObjectStore, ObjectStoreExt};

    let store: std::sync::Arc<dyn ObjectStore> =
        std::sync::Arc::new(object_store::memory::InMemory::new());
    let root = object_store::path::Path::from("tbl");
    let shard = ShardId::random();
    let manifests = ManifestStore::new(store.clone(), &root, shard, RetryPolicy::immediate(3));
    let identity = ShardIdentity {
        spec_id: 2,
        field_values: [("bucket".to_string(), vec![3, 0, 0, 0])]
            .into_iter()
            .collect(),
    };
    let claim = manifests.claim(Some(&identity)).await.expect("claims");
    let version = claim.manifest.version;
    let path = manifests.layout().manifest_path(version);
    let bytes = store.get(&path).await.unwrap().bytes().await.unwrap();

    let ours_decoded = ours::ShardManifest::decode(bytes.clone()).unwrap();
    // Prove the token is really there: the bytes are longer than the message.
    assert!(
        bytes.len() > ours_decoded.encoded_len(),
        "no claim token in the stored bytes"
    );
    let lance_decoded = lpb::ShardManifest::decode(bytes).expect("lance accepts the token");
    assert_eq!(manifest_from_lance(&lance_decoded), ours_decoded);
    assert_eq!(lance_decoded.writer_epoch, 1);
    assert_eq!(lance_decoded.shard_spec_id, 2);
}
