//! `vector_search(table, column, vector, k)`: a SQL table function over a
//! served table as a query reads it (published data plus this daemon's
//! memtables), so a fresh, unflushed row is found at once:
//!
//! ```sql
//! SELECT id, _distance FROM vector_search('docs', 'vec', '0.1,0.2,0.3', 10)
//! ```
//!
//! The vector is a string of comma-separated numbers (any Flight SQL client
//! can send it); `column` must be a `FixedSizeList<Float32>` of that many
//! dimensions. The search is exact (every row's squared L2 distance,
//! `_distance`, smallest first): a brute-force scan of the rows the query
//! read, no index.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Float32Type;
use arrow_array::{Array, Float32Array, RecordBatch, UInt32Array};
use arrow_schema::{DataType, Field, Schema};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{plan_err, DataFusionError, Result, ScalarValue};
use datafusion::datasource::MemTable;
use datafusion::logical_expr::Expr;

/// The tables a query read, by name (see `query::context`).
#[derive(Debug)]
pub(crate) struct VectorSearch {
    pub(crate) tables: std::collections::HashMap<String, RecordBatch>,
}

fn text(e: &Expr, what: &str) -> Result<String> {
    match e {
        Expr::Literal(ScalarValue::Utf8(Some(s)), _) => Ok(s.clone()),
        other => plan_err!("vector_search: {what} must be a string literal, not {other}"),
    }
}

impl TableFunctionImpl for VectorSearch {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let [table, column, vector, k] = args.exprs() else {
            return plan_err!(
                "vector_search takes (table, column, vector, k), e.g. \
                 vector_search('t', 'vec', '0.1,0.2', 10)"
            );
        };
        let table = text(table, "the table")?;
        let column = text(column, "the column")?;
        let query: Vec<f32> = text(vector, "the vector")?
            .split(',')
            .map(|x| x.trim().parse::<f32>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| DataFusionError::Plan(format!("vector_search: the vector: {e}")))?;
        let k = match k {
            Expr::Literal(ScalarValue::Int64(Some(k)), _) if *k > 0 => *k as usize,
            other => return plan_err!("vector_search: k must be a positive integer, not {other}"),
        };
        let Some(batch) = self.tables.get(&table) else {
            return plan_err!("vector_search: no table `{table}`");
        };
        let Some(values) = batch.column_by_name(&column) else {
            return plan_err!("vector_search: table `{table}` has no column `{column}`");
        };
        let DataType::FixedSizeList(item, dim) = values.data_type() else {
            return plan_err!("vector_search: `{column}` is not a vector column");
        };
        if item.data_type() != &DataType::Float32 || *dim as usize != query.len() {
            return plan_err!(
                "vector_search: `{column}` holds {dim} x {}, the query vector has {} values",
                item.data_type(),
                query.len()
            );
        }
        let list = values.as_fixed_size_list();
        let flat = list.values().as_primitive::<Float32Type>();
        let dim = *dim as usize;
        let mut scored: Vec<(f32, u32)> = (0..list.len())
            .filter(|&r| list.is_valid(r))
            .map(|r| {
                let at = list.value_offset(r) as usize;
                let row = &flat.values()[at..at + dim];
                let d: f32 = row.iter().zip(&query).map(|(a, b)| (a - b) * (a - b)).sum();
                (d, r as u32)
            })
            .collect();
        scored.sort_by(|a, b| a.0.total_cmp(&b.0));
        scored.truncate(k);
        let indices = UInt32Array::from_iter_values(scored.iter().map(|s| s.1));
        let picked = arrow_select::take::take_record_batch(batch, &indices)?;
        let mut fields: Vec<Arc<Field>> = picked.schema().fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new("_distance", DataType::Float32, false)));
        let mut columns = picked.columns().to_vec();
        columns.push(Arc::new(Float32Array::from_iter_values(
            scored.iter().map(|s| s.0),
        )));
        let schema = Arc::new(Schema::new(fields));
        let out = RecordBatch::try_new(schema.clone(), columns)?;
        Ok(Arc::new(MemTable::try_new(schema, vec![vec![out]])?))
    }
}
