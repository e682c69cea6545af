//! A served table as DataFusion sees it: read when the query runs, as a
//! key lookup ([`TableHost::lookup_rows`]) when a filter names primary-key
//! values (`id = 4`, `id IN (1, 2)`), else whole
//! ([`TableHost::read_rows`]). Filters are pushed down `Inexact`:
//! DataFusion still applies them, so a lookup only has to return a
//! superset of the matching rows.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::datasource::{MemTable, TableType};
use datafusion::logical_expr::{BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;

use crate::TableHost;

/// One served table in one query's session.
#[derive(Debug)]
pub(crate) struct HostTable {
    host: Arc<TableHost>,
    /// The table's schema when the query was planned.
    schema: SchemaRef,
    /// This query's budget for table reads (shared by its tables).
    read_bytes: Arc<ReadBudget>,
}

impl HostTable {
    pub(crate) fn new(host: Arc<TableHost>, read_bytes: Arc<ReadBudget>) -> Self {
        Self {
            schema: host.schema(),
            host,
            read_bytes,
        }
    }

    /// The key values `filter` restricts the table to, when it is an
    /// equality, a (non-negated) `IN` list or an `OR` of those, of literals
    /// on the table's one-column primary key.
    fn keys_of(&self, filter: &Expr) -> Option<Vec<ScalarValue>> {
        let key_schema = self.host.key_schema();
        let [key] = key_schema.fields().as_ref() else {
            return None;
        };
        let is_key = |e: &Expr| matches!(e, Expr::Column(c) if c.name == *key.name());
        let literal = |e: &Expr| match e {
            Expr::Literal(v, _) => Some(v.clone()),
            _ => None,
        };
        match filter {
            Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::Eq,
                right,
            }) => {
                if is_key(left) {
                    literal(right).map(|v| vec![v])
                } else if is_key(right) {
                    literal(left).map(|v| vec![v])
                } else {
                    None
                }
            }
            Expr::InList(list) if !list.negated && is_key(&list.expr) => {
                list.list.iter().map(literal).collect()
            }
            // DataFusion rewrites a short `IN` list as `OR`ed equalities.
            Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::Or,
                right,
            }) => {
                let mut keys = self.keys_of(left)?;
                keys.extend(self.keys_of(right)?);
                Some(keys)
            }
            _ => None,
        }
    }
}

/// The bytes one query's table reads may hold, and hold so far.
#[derive(Debug)]
pub(crate) struct ReadBudget {
    used: AtomicUsize,
    limit: usize,
}

impl ReadBudget {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            used: AtomicUsize::new(0),
            limit,
        }
    }

    /// Counts `batch` against the budget; `Err` says it is exceeded.
    pub(crate) fn charge(&self, batch: &RecordBatch) -> Result<(), String> {
        let size = batch.get_array_memory_size();
        let held = self.used.fetch_add(size, Ordering::Relaxed) + size;
        if held > self.limit {
            return Err(format!(
                "the tables this query reads hold {held} bytes, more than its budget of {} bytes",
                self.limit
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl TableProvider for HostTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| match self.keys_of(f) {
                Some(_) => TableProviderFilterPushDown::Inexact,
                None => TableProviderFilterPushDown::Unsupported,
            })
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let read = match filters.iter().find_map(|f| self.keys_of(f)) {
            Some(keys) => self.host.lookup_rows(&keys).await,
            None => self.host.read_rows().await,
        };
        let batch = read.map_err(|e| DataFusionError::External(Box::new(e)))?;
        self.read_bytes
            .charge(&batch)
            .map_err(DataFusionError::ResourcesExhausted)?;
        MemTable::try_new(self.schema.clone(), vec![vec![batch]])?
            .scan(state, projection, &[], limit)
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;

    async fn table(dir: &tempfile::TempDir) -> Arc<TableHost> {
        let path = dir.path().join("t").to_str().unwrap().to_string();
        let loc = memwal_store::open_store(&path).unwrap();
        let key = Field::new("id", DataType::Int64, false).with_metadata(
            [(
                memwal_memtable::PRIMARY_KEY_KEY.to_string(),
                "true".to_string(),
            )]
            .into(),
        );
        let schema = Arc::new(Schema::new(vec![
            key,
            Field::new("v", DataType::Utf8, true),
        ]));
        let sharding = memwal_compactor::TableSharding::Bucket {
            column: "id".into(),
            buckets: 4,
        };
        memwal_compactor::create_table(&loc, schema, &sharding)
            .await
            .unwrap();
        Arc::new(
            TableHost::open("t", loc, memwal::ShardWriterConfig::default())
                .await
                .unwrap(),
        )
    }

    fn pairs(batches: &[RecordBatch]) -> Vec<(i64, String)> {
        let mut out = Vec::new();
        for b in batches {
            let ids = b.column(0).as_primitive::<Int64Type>();
            let vs = b.column(1).as_string::<i32>();
            for i in 0..b.num_rows() {
                out.push((ids.value(i), vs.value(i).to_string()));
            }
        }
        out
    }

    // Breaks if a query filtering on primary-key values reads the whole
    // table instead of looking the keys up, if the lookup's rows differ
    // from the whole read's, or if another filter is taken for a lookup.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_filter_is_a_lookup_and_other_filters_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let host = table(&dir).await;
        let ids: Vec<i64> = (0..20).collect();
        let batch = RecordBatch::try_new(
            host.schema(),
            vec![
                Arc::new(Int64Array::from(ids.clone())) as ArrayRef,
                Arc::new(StringArray::from_iter_values(
                    ids.iter().map(|i| format!("v{i}")),
                )),
            ],
        )
        .unwrap();
        host.write(&batch, false).await.unwrap();
        let hosts = HashMap::from([("t".to_string(), host.clone())]);
        let run = |sql: &'static str| {
            let hosts = hosts.clone();
            async move {
                let limits = crate::query::QueryLimits::default();
                crate::query::run(&hosts, &limits, sql).await.unwrap().1
            }
        };
        let got = run("SELECT id, v FROM t WHERE id IN (3, 7, 99) ORDER BY id").await;
        assert_eq!(pairs(&got), [(3, "v3".into()), (7, "v7".into())]);
        assert_eq!(host.read_counts(), (0, 1), "a lookup, no whole read");
        let got = run("SELECT id, v FROM t WHERE 4 = id").await;
        assert_eq!(pairs(&got), [(4, "v4".into())]);
        assert_eq!(host.read_counts(), (0, 2));
        let got = run("SELECT id, v FROM t WHERE v = 'v5'").await;
        assert_eq!(pairs(&got), [(5, "v5".into())]);
        assert_eq!(host.read_counts(), (1, 2), "not a key filter: read whole");
        let got = run("SELECT id, v FROM t WHERE id > 17 ORDER BY id").await;
        assert_eq!(pairs(&got), [(18, "v18".into()), (19, "v19".into())]);
        assert_eq!(host.read_counts(), (2, 2));
        host.close().await.unwrap();
    }
}
