//! Which shard a row belongs to (docs/memwal-format.md "Sharding").
//!
//! A [`ShardRouter`] binds a `ShardingSpec` (`unsharded`, `bucket`,
//! `identity` transforms) to a table schema and computes each row's shard
//! field values as raw little-endian Arrow scalar bytes, the form
//! `ShardManifest.shard_field_entries` records. The bucket hash is the
//! spec's 32-bit Murmur3-style hash, bit for bit.

mod hash;
mod router;

use thiserror::Error;

pub use hash::{bucket_of, hash_bytes, hash_i32, hash_i64};
pub use router::{FieldValues, ShardRouter, FIELD_ID_KEY};

/// Why a spec could not be bound or a row could not be routed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ShardingError {
    /// The spec is malformed or does not fit the table.
    #[error("invalid sharding spec: {reason}")]
    InvalidSpec {
        /// What is wrong.
        reason: String,
    },
    /// A source column's type cannot be used by its transform.
    #[error("column `{column}` of type {data_type} cannot be used for sharding")]
    UnsupportedType {
        /// The column.
        column: String,
        /// Its Arrow type.
        data_type: String,
    },
    /// A batch lacks a column the spec reads.
    #[error("batch lacks sharding source column `{column}`")]
    MissingColumn {
        /// The column.
        column: String,
    },
    /// An identity-sharded column is null: the row has no shard.
    #[error("row {row}: identity sharding column `{column}` is null")]
    NullIdentity {
        /// The column.
        column: String,
        /// The row.
        row: usize,
    },
    /// A row maps to another shard than the one being written.
    #[error("row {row} belongs to another shard: shard field `{field_id}` is {found:?}, this shard has {expected:?}")]
    WrongShard {
        /// The first offending row.
        row: usize,
        /// The shard field that differs.
        field_id: String,
        /// This shard's value.
        expected: Vec<u8>,
        /// The row's value.
        found: Vec<u8>,
    },
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};
    use std::sync::Arc;

    use arrow_array::{
        ArrayRef, BooleanArray, Float32Array, Float64Array, Int32Array, RecordBatch, StringArray,
    };
    use arrow_schema::{DataType, Field, Schema};
    use memwal_proto::{ShardingField, ShardingSpec};

    use super::*;

    fn bucket_spec(source_id: i32, n: &str) -> ShardingSpec {
        ShardingSpec {
            spec_id: 1,
            fields: vec![ShardingField {
                field_id: "b".into(),
                source_ids: vec![source_id],
                transform: Some("bucket".into()),
                result_type: "int32".into(),
                parameters: [("num_buckets".to_string(), n.to_string())].into(),
                ..Default::default()
            }],
        }
    }

    fn one_column(name: &str, array: ArrayRef) -> RecordBatch {
        let schema = Schema::new(vec![Field::new(name, array.data_type().clone(), true)]);
        RecordBatch::try_new(Arc::new(schema), vec![array]).unwrap()
    }

    fn buckets(array: ArrayRef) -> Vec<i32> {
        let batch = one_column("c", array);
        let router = ShardRouter::new(&bucket_spec(0, "8"), &batch.schema()).unwrap();
        (0..batch.num_rows())
            .map(|r| {
                let v = router.row_values(&batch, r).unwrap().remove("b").unwrap();
                i32::from_le_bytes(v.try_into().unwrap())
            })
            .collect()
    }

    // Breaks if any step of the hash (mixing constants, rotations, logical
    // shifts, the sign extension of leftover bytes, canonical float bits)
    // differs from docs/memwal-format.md: these are the spec's own vectors.
    #[test]
    fn bucket_ids_match_the_spec_vectors() {
        assert_eq!(
            buckets(Arc::new(Int32Array::from(vec![
                Some(1),
                Some(2),
                Some(3),
                None
            ]))),
            [2, 7, 1, 0]
        );
        assert_eq!(buckets(Arc::new(StringArray::from(vec!["a", "b"]))), [1, 5]);
        assert_eq!(buckets(Arc::new(BooleanArray::from(vec![true]))), [2]);
        assert_eq!(buckets(Arc::new(Float32Array::from(vec![1.25f32]))), [0]);
        assert_eq!(buckets(Arc::new(Float64Array::from(vec![1.25f64]))), [0]);
        // Both zeros and all NaNs land together.
        let f = buckets(Arc::new(Float64Array::from(vec![
            0.0,
            -0.0,
            f64::NAN,
            -f64::NAN,
        ])));
        assert_eq!((f[0], f[2]), (f[1], f[3]));
    }

    // Breaks if a row of another shard is accepted, or the error loses the row.
    #[test]
    fn rows_of_another_shard_are_rejected_with_the_row() {
        let batch = one_column("c", Arc::new(Int32Array::from(vec![1, 9, 2])));
        let router = ShardRouter::new(&bucket_spec(0, "8"), &batch.schema()).unwrap();
        let shard2 = BTreeMap::from([("b".to_string(), 2i32.to_le_bytes().to_vec())]);
        // 1 -> 2, 9 -> ?, 2 -> 7
        match router.check_batch(&batch, &shard2) {
            Err(ShardingError::WrongShard { row, .. }) => assert!(row == 1 || row == 2),
            other => panic!("{other:?}"),
        }
        let ones = one_column("c", Arc::new(Int32Array::from(vec![1, 1])));
        router.check_batch(&ones, &shard2).unwrap();
    }

    // Breaks if a split loses, duplicates or misroutes a row, or reorders
    // rows within a shard (last write wins depends on their order).
    #[test]
    fn split_groups_rows_by_shard_in_order() {
        let batch = one_column("c", Arc::new(Int32Array::from(vec![1, 2, 3, 1, 2])));
        let router = ShardRouter::new(&bucket_spec(0, "8"), &batch.schema()).unwrap();
        let parts = router.split(&batch).unwrap();
        // Buckets: 1 -> 2, 2 -> 7, 3 -> 1 (the spec vectors above).
        let got: Vec<(i32, Vec<i32>)> = parts
            .iter()
            .map(|(v, b)| {
                let bucket = i32::from_le_bytes(v["b"].clone().try_into().unwrap());
                let rows = b.column(0).as_any().downcast_ref::<Int32Array>().unwrap();
                (bucket, rows.values().to_vec())
            })
            .collect();
        assert_eq!(got, vec![(2, vec![1, 1]), (7, vec![2, 2]), (1, vec![3])]);
        for (values, part) in &parts {
            router.check_batch(part, values).unwrap();
        }
        let single = one_column("c", Arc::new(Int32Array::from(vec![1, 1])));
        assert_eq!(router.split(&single).unwrap().len(), 1);
    }

    // Breaks if identity values are not the raw little-endian scalar bytes,
    // or a null identity is silently routed somewhere.
    #[test]
    fn identity_values_are_raw_scalar_bytes() {
        let spec = ShardingSpec {
            spec_id: 2,
            fields: vec![ShardingField {
                field_id: "region".into(),
                source_ids: vec![7],
                transform: Some("identity".into()),
                result_type: "utf8".into(),
                ..Default::default()
            }],
        };
        let field = Field::new("region", DataType::Utf8, true)
            .with_metadata(HashMap::from([(FIELD_ID_KEY.to_string(), "7".to_string())]));
        let schema = Arc::new(Schema::new(vec![field]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(StringArray::from(vec![Some("eu"), None]))],
        )
        .unwrap();
        let router = ShardRouter::new(&spec, &schema).unwrap();
        assert_eq!(
            router.row_values(&batch, 0).unwrap()["region"],
            b"eu".to_vec()
        );
        assert!(matches!(
            router.row_values(&batch, 1),
            Err(ShardingError::NullIdentity { row: 1, .. })
        ));
    }

    // Breaks if bad specs are accepted (they would route rows arbitrarily).
    #[test]
    fn malformed_specs_are_rejected() {
        let schema = Schema::new(vec![Field::new("c", DataType::Int32, false)]);
        for n in ["0", "1025", "x"] {
            assert!(
                matches!(
                    ShardRouter::new(&bucket_spec(0, n), &schema),
                    Err(ShardingError::InvalidSpec { .. })
                ),
                "{n}"
            );
        }
        assert!(ShardRouter::new(&bucket_spec(5, "8"), &schema).is_err());
        let float_identity = ShardingSpec {
            spec_id: 1,
            fields: vec![ShardingField {
                field_id: "f".into(),
                source_ids: vec![0],
                transform: Some("identity".into()),
                ..Default::default()
            }],
        };
        let fschema = Schema::new(vec![Field::new("c", DataType::Float32, false)]);
        assert!(matches!(
            ShardRouter::new(&float_identity, &fschema),
            Err(ShardingError::UnsupportedType { .. })
        ));
        let unsharded = ShardingSpec {
            spec_id: 1,
            fields: vec![ShardingField {
                field_id: "u".into(),
                transform: Some("unsharded".into()),
                ..Default::default()
            }],
        };
        let router = ShardRouter::new(&unsharded, &schema).unwrap();
        let batch =
            RecordBatch::try_new(Arc::new(schema), vec![Arc::new(Int32Array::from(vec![5]))])
                .unwrap();
        assert_eq!(
            router.row_values(&batch, 0).unwrap()["u"],
            0i32.to_le_bytes().to_vec()
        );
    }

    // Breaks if columns are read by position alone: a batch whose columns
    // are reordered would hash the wrong column and route rows silently.
    #[test]
    fn reordered_columns_are_refused() {
        let schema = Schema::new(vec![
            Field::new("c", DataType::Int32, false),
            Field::new("d", DataType::Int32, false),
        ]);
        let router = ShardRouter::new(&bucket_spec(0, "8"), &schema).unwrap();
        let swapped = Schema::new(vec![
            Field::new("d", DataType::Int32, false),
            Field::new("c", DataType::Int32, false),
        ]);
        let batch = RecordBatch::try_new(
            Arc::new(swapped),
            vec![
                Arc::new(Int32Array::from(vec![1])),
                Arc::new(Int32Array::from(vec![2])),
            ],
        )
        .unwrap();
        assert!(matches!(
            router.row_values(&batch, 0),
            Err(ShardingError::MissingColumn { .. })
        ));
    }
}
