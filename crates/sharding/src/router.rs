//! Evaluating a `ShardingSpec` over rows.

use std::collections::BTreeMap;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Schema, TimeUnit};
use memwal_proto::{ShardingField, ShardingSpec};

use crate::hash::{
    bucket_of, canonical_f32_bits, canonical_f64_bits, hash_bytes, hash_i32, hash_i64,
};
use crate::ShardingError;

/// Shard field values: raw little-endian Arrow scalar bytes by shard field id.
pub type FieldValues = BTreeMap<String, Vec<u8>>;

/// Field metadata key holding a column's Lance field id.
pub const FIELD_ID_KEY: &str = "lance:field_id";

#[derive(Debug, Clone)]
enum Transform {
    Unsharded,
    Bucket { column: usize, num_buckets: i32 },
    Identity { column: usize },
}

#[derive(Debug, Clone)]
struct CompiledField {
    field_id: String,
    transform: Transform,
}

/// A sharding spec bound to a table schema: computes the shard field values
/// of rows and checks that rows belong to a given shard.
///
/// Columns are found by Lance field id (`lance:field_id` field metadata);
/// a schema without field ids numbers its columns 0.. in order.
#[derive(Debug, Clone)]
pub struct ShardRouter {
    spec_id: u32,
    fields: Vec<CompiledField>,
    column_names: Vec<String>,
}

impl ShardRouter {
    /// Binds `spec` to `schema`. Fails with a typed error for an unknown
    /// transform, a bad `num_buckets` (must be in 1..=1024), a missing
    /// source column, or a source type the transform cannot use.
    pub fn new(spec: &ShardingSpec, schema: &Schema) -> Result<Self, ShardingError> {
        let fields = spec
            .fields
            .iter()
            .map(|f| compile_field(f, schema))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            spec_id: spec.spec_id,
            fields,
            column_names: schema.fields().iter().map(|f| f.name().clone()).collect(),
        })
    }

    /// The spec's id.
    pub fn spec_id(&self) -> u32 {
        self.spec_id
    }

    /// Names of the table columns the spec reads (in spec field order, each
    /// once).
    pub fn source_columns(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for f in &self.fields {
            let column = match f.transform {
                Transform::Unsharded => continue,
                Transform::Bucket { column, .. } | Transform::Identity { column } => column,
            };
            let name = self.column_names[column].as_str();
            if !out.contains(&name) {
                out.push(name);
            }
        }
        out
    }

    /// The shard field values every row has when the spec reads no column
    /// (only `unsharded` fields): there is one shard. `None` otherwise.
    pub fn constant_values(&self) -> Option<BTreeMap<String, Vec<u8>>> {
        self.fields
            .iter()
            .map(|f| match f.transform {
                Transform::Unsharded => Some((f.field_id.clone(), 0i32.to_le_bytes().to_vec())),
                _ => None,
            })
            .collect()
    }

    /// The spec's shard field ids, in spec order.
    pub fn field_ids(&self) -> impl Iterator<Item = &str> {
        self.fields.iter().map(|f| f.field_id.as_str())
    }

    /// The shard field values (raw little-endian Arrow scalar bytes by shard
    /// field id) of row `row` of `batch`, whose columns follow the schema.
    pub fn row_values(
        &self,
        batch: &RecordBatch,
        row: usize,
    ) -> Result<BTreeMap<String, Vec<u8>>, ShardingError> {
        self.fields
            .iter()
            .map(|f| Ok((f.field_id.clone(), self.value(f, batch, row)?)))
            .collect()
    }

    /// Splits `batch` by shard: one batch per distinct set of shard field
    /// values, rows in their original order within each, groups in order of
    /// first appearance. A row whose values cannot be computed fails the
    /// whole split (nothing is routed).
    pub fn split(
        &self,
        batch: &RecordBatch,
    ) -> Result<Vec<(FieldValues, RecordBatch)>, ShardingError> {
        let mut groups: Vec<(FieldValues, Vec<u32>)> = Vec::new();
        let mut index: std::collections::HashMap<FieldValues, usize> =
            std::collections::HashMap::new();
        for row in 0..batch.num_rows() {
            let values = self.row_values(batch, row)?;
            let at = *index.entry(values.clone()).or_insert_with(|| {
                groups.push((values, Vec::new()));
                groups.len() - 1
            });
            groups[at].1.push(row as u32);
        }
        if groups.len() == 1 {
            let (values, _) = groups.pop().expect("one group");
            return Ok(vec![(values, batch.clone())]);
        }
        groups
            .into_iter()
            .map(|(values, rows)| {
                let take = arrow_array::UInt32Array::from(rows);
                let columns = batch
                    .columns()
                    .iter()
                    .map(|c| arrow_select::take::take(c.as_ref(), &take, None))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| ShardingError::InvalidSpec {
                        reason: format!("splitting a batch by shard: {e}"),
                    })?;
                let part = RecordBatch::try_new(batch.schema(), columns).map_err(|e| {
                    ShardingError::InvalidSpec {
                        reason: format!("splitting a batch by shard: {e}"),
                    }
                })?;
                Ok((values, part))
            })
            .collect()
    }

    /// Checks that every row of `batch` has the shard field values
    /// `expected`; the first row that does not is
    /// [`ShardingError::WrongShard`].
    pub fn check_batch(
        &self,
        batch: &RecordBatch,
        expected: &BTreeMap<String, Vec<u8>>,
    ) -> Result<(), ShardingError> {
        for f in &self.fields {
            let want = expected
                .get(&f.field_id)
                .ok_or_else(|| ShardingError::InvalidSpec {
                    reason: format!(
                        "the shard records no value for shard field `{}`",
                        f.field_id
                    ),
                })?;
            for row in 0..batch.num_rows() {
                let got = self.value(f, batch, row)?;
                if &got != want {
                    return Err(ShardingError::WrongShard {
                        row,
                        field_id: f.field_id.clone(),
                        expected: want.clone(),
                        found: got,
                    });
                }
            }
        }
        Ok(())
    }

    fn value(
        &self,
        f: &CompiledField,
        batch: &RecordBatch,
        row: usize,
    ) -> Result<Vec<u8>, ShardingError> {
        // Columns are taken by position, so check the name there too: a
        // batch with reordered columns must not hash the wrong one.
        let column = |idx: usize| {
            let name = &self.column_names[idx];
            match batch.schema().fields().get(idx) {
                Some(f) if f.name() == name => Ok(batch.column(idx)),
                _ => Err(ShardingError::MissingColumn {
                    column: name.clone(),
                }),
            }
        };
        match &f.transform {
            Transform::Unsharded => Ok(0i32.to_le_bytes().to_vec()),
            Transform::Bucket {
                column: c,
                num_buckets,
            } => {
                let array = column(*c)?;
                let hash = row_hash(array.as_ref(), row)
                    .ok_or_else(|| unsupported(&self.column_names[*c], array.data_type()))?;
                Ok(bucket_of(hash, *num_buckets).to_le_bytes().to_vec())
            }
            Transform::Identity { column: c } => {
                let array = column(*c)?;
                if array.is_null(row) {
                    return Err(ShardingError::NullIdentity {
                        column: self.column_names[*c].clone(),
                        row,
                    });
                }
                identity_bytes(array.as_ref(), row)
                    .ok_or_else(|| unsupported(&self.column_names[*c], array.data_type()))
            }
        }
    }
}

fn unsupported(column: &str, data_type: &DataType) -> ShardingError {
    ShardingError::UnsupportedType {
        column: column.to_string(),
        data_type: data_type.to_string(),
    }
}

fn compile_field(f: &ShardingField, schema: &Schema) -> Result<CompiledField, ShardingError> {
    let invalid = |reason: String| ShardingError::InvalidSpec {
        reason: format!("shard field `{}`: {reason}", f.field_id),
    };
    if f.expression.is_some() {
        return Err(invalid("expression shard fields are not supported".into()));
    }
    let source = || -> Result<usize, ShardingError> {
        match f.source_ids.as_slice() {
            [id] => column_of(schema, *id).ok_or_else(|| {
                invalid(format!("source field id {id} is not a column of the table"))
            }),
            ids => Err(invalid(format!(
                "needs exactly one source column, has {}",
                ids.len()
            ))),
        }
    };
    let transform = match f.transform.as_deref() {
        Some("unsharded") => Transform::Unsharded,
        Some("bucket") => {
            let raw = f
                .parameters
                .get("num_buckets")
                .ok_or_else(|| invalid("missing num_buckets".into()))?;
            let num_buckets: i32 = raw
                .parse()
                .map_err(|_| invalid(format!("num_buckets `{raw}` is not an integer")))?;
            if !(1..=1024).contains(&num_buckets) {
                return Err(invalid(format!(
                    "num_buckets {num_buckets} is outside 1..=1024"
                )));
            }
            let column = source()?;
            if !hashable(schema.field(column).data_type()) {
                return Err(unsupported(
                    schema.field(column).name(),
                    schema.field(column).data_type(),
                ));
            }
            Transform::Bucket {
                column,
                num_buckets,
            }
        }
        Some("identity") => {
            let column = source()?;
            let dt = schema.field(column).data_type();
            if !(dt.is_integer()
                || matches!(dt, DataType::Boolean | DataType::Utf8 | DataType::LargeUtf8))
            {
                return Err(unsupported(schema.field(column).name(), dt));
            }
            Transform::Identity { column }
        }
        other => return Err(invalid(format!("unsupported transform {other:?}"))),
    };
    Ok(CompiledField {
        field_id: f.field_id.clone(),
        transform,
    })
}

fn column_of(schema: &Schema, field_id: i32) -> Option<usize> {
    let has_ids = schema
        .fields()
        .iter()
        .any(|f| f.metadata().contains_key(FIELD_ID_KEY));
    if !has_ids {
        return usize::try_from(field_id)
            .ok()
            .filter(|i| *i < schema.fields().len());
    }
    schema.fields().iter().position(|f| {
        f.metadata()
            .get(FIELD_ID_KEY)
            .and_then(|v| v.parse::<i32>().ok())
            == Some(field_id)
    })
}

fn hashable(dt: &DataType) -> bool {
    dt.is_integer()
        || matches!(
            dt,
            DataType::Boolean
                | DataType::Float32
                | DataType::Float64
                | DataType::Date32
                | DataType::Time32(_)
                | DataType::Time64(_)
                | DataType::Timestamp(_, _)
                | DataType::Utf8
                | DataType::LargeUtf8
        )
}

/// The bucket hash of one value; a null hashes to 0, which is bucket 0.
fn row_hash(a: &dyn Array, row: usize) -> Option<i32> {
    if a.is_null(row) {
        return Some(0);
    }
    Some(match a.data_type() {
        DataType::Boolean => hash_i32(a.as_boolean().value(row) as i32),
        DataType::Int8 => hash_i32(a.as_primitive::<Int8Type>().value(row) as i32),
        DataType::Int16 => hash_i32(a.as_primitive::<Int16Type>().value(row) as i32),
        DataType::Int32 => hash_i32(a.as_primitive::<Int32Type>().value(row)),
        DataType::UInt8 => hash_i32(a.as_primitive::<UInt8Type>().value(row) as i32),
        DataType::UInt16 => hash_i32(a.as_primitive::<UInt16Type>().value(row) as i32),
        DataType::UInt32 => hash_i32(a.as_primitive::<UInt32Type>().value(row) as i32),
        DataType::Date32 => hash_i32(a.as_primitive::<Date32Type>().value(row)),
        DataType::Time32(TimeUnit::Second) => {
            hash_i32(a.as_primitive::<Time32SecondType>().value(row))
        }
        DataType::Time32(_) => hash_i32(a.as_primitive::<Time32MillisecondType>().value(row)),
        DataType::Int64 => hash_i64(a.as_primitive::<Int64Type>().value(row)),
        DataType::UInt64 => hash_i64(a.as_primitive::<UInt64Type>().value(row) as i64),
        DataType::Time64(TimeUnit::Microsecond) => {
            hash_i64(a.as_primitive::<Time64MicrosecondType>().value(row))
        }
        DataType::Time64(_) => hash_i64(a.as_primitive::<Time64NanosecondType>().value(row)),
        DataType::Timestamp(TimeUnit::Second, _) => {
            hash_i64(a.as_primitive::<TimestampSecondType>().value(row))
        }
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            hash_i64(a.as_primitive::<TimestampMillisecondType>().value(row))
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            hash_i64(a.as_primitive::<TimestampMicrosecondType>().value(row))
        }
        DataType::Timestamp(TimeUnit::Nanosecond, _) => {
            hash_i64(a.as_primitive::<TimestampNanosecondType>().value(row))
        }
        DataType::Float32 => hash_i32(canonical_f32_bits(
            a.as_primitive::<Float32Type>().value(row),
        )),
        DataType::Float64 => hash_i64(canonical_f64_bits(
            a.as_primitive::<Float64Type>().value(row),
        )),
        DataType::Utf8 => hash_bytes(a.as_string::<i32>().value(row).as_bytes()),
        DataType::LargeUtf8 => hash_bytes(a.as_string::<i64>().value(row).as_bytes()),
        _ => return None,
    })
}

/// Raw little-endian Arrow scalar bytes of a non-null value.
fn identity_bytes(a: &dyn Array, row: usize) -> Option<Vec<u8>> {
    Some(match a.data_type() {
        DataType::Boolean => vec![a.as_boolean().value(row) as u8],
        DataType::Int8 => a
            .as_primitive::<Int8Type>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        DataType::Int16 => a
            .as_primitive::<Int16Type>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        DataType::Int32 => a
            .as_primitive::<Int32Type>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        DataType::Int64 => a
            .as_primitive::<Int64Type>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        DataType::UInt8 => a
            .as_primitive::<UInt8Type>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        DataType::UInt16 => a
            .as_primitive::<UInt16Type>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        DataType::UInt32 => a
            .as_primitive::<UInt32Type>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        DataType::UInt64 => a
            .as_primitive::<UInt64Type>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        DataType::Utf8 => a.as_string::<i32>().value(row).as_bytes().to_vec(),
        DataType::LargeUtf8 => a.as_string::<i64>().value(row).as_bytes().to_vec(),
        _ => return None,
    })
}
