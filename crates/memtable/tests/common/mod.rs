//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use memwal_memtable::{TableSchema, PRIMARY_KEY_KEY, PRIMARY_KEY_POSITION_KEY};

/// A primary-key field (flag only).
pub fn pk(name: &str, dt: DataType) -> Field {
    Field::new(name, dt, false).with_metadata(HashMap::from([(
        PRIMARY_KEY_KEY.to_string(),
        "true".to_string(),
    )]))
}

/// A primary-key field with an explicit composite position.
pub fn pk_at(name: &str, dt: DataType, position: u32) -> Field {
    Field::new(name, dt, false).with_metadata(HashMap::from([
        (PRIMARY_KEY_KEY.to_string(), "true".to_string()),
        (PRIMARY_KEY_POSITION_KEY.to_string(), position.to_string()),
    ]))
}

/// `id: Int64` key, `name: Utf8` nullable, `v: Int64` non-nullable.
pub fn int_table() -> SchemaRef {
    Arc::new(Schema::new(vec![
        pk("id", DataType::Int64),
        Field::new("name", DataType::Utf8, true),
        Field::new("v", DataType::Int64, false),
    ]))
}

/// Composite key `(a: Int32 @1, b: Utf8 @2)` and `v: Int64`.
pub fn composite_table() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("v", DataType::Int64, true),
        pk_at("b", DataType::Utf8, 2),
        pk_at("a", DataType::Int32, 1),
    ]))
}

/// Same columns as [`int_table`] without a primary key.
pub fn append_table() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("v", DataType::Int64, false),
    ]))
}

pub fn table(schema: SchemaRef) -> Arc<TableSchema> {
    Arc::new(TableSchema::new(schema).expect("valid table schema"))
}

/// A user batch for [`int_table`] / [`append_table`].
pub fn int_rows(schema: &SchemaRef, ids: &[i64], vs: &[i64]) -> RecordBatch {
    let names: Vec<String> = ids.iter().map(|i| format!("n{i}")).collect();
    RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
            Arc::new(StringArray::from(names)),
            Arc::new(Int64Array::from(vs.to_vec())),
        ],
    )
    .unwrap()
}

/// A user batch for [`composite_table`].
pub fn composite_rows(schema: &SchemaRef, keys: &[(i32, &str)], vs: &[i64]) -> RecordBatch {
    RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from(vs.to_vec())) as ArrayRef,
            Arc::new(StringArray::from(
                keys.iter().map(|k| k.1).collect::<Vec<_>>(),
            )),
            Arc::new(Int32Array::from(
                keys.iter().map(|k| k.0).collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap()
}

/// Int64 column `name` of a one-row batch.
pub fn int_of(batch: &RecordBatch, name: &str) -> i64 {
    assert_eq!(batch.num_rows(), 1);
    batch
        .column_by_name(name)
        .unwrap()
        .as_primitive::<Int64Type>()
        .value(0)
}
