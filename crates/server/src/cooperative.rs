//! Queries yield to the runtime: every operator's output takes part in
//! tokio's cooperative scheduling, so a query's time limit
//! ([`crate::QueryLimits`]) ends it on time and other work on the same
//! threads (ingest acks) is not starved by it.
//!
//! DataFusion makes its data sources cooperative, which is not enough: an
//! operator that emits many batches per input batch (a cross join emits
//! its whole build side per probe batch) never polls a source while it
//! runs, so a query could run for seconds without yielding. Wrapping each
//! operator in a `CooperativeExec` spends the task's budget on every
//! batch any operator emits.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::ExecutionPlan;

/// The physical optimizer rule (run last) that wraps every operator.
#[derive(Debug, Default)]
pub(crate) struct YieldEverywhere;

impl PhysicalOptimizerRule for YieldEverywhere {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            if node.is::<CooperativeExec>() {
                return Ok(Transformed::no(node));
            }
            Ok(Transformed::yes(
                Arc::new(CooperativeExec::new(node)) as Arc<dyn ExecutionPlan>
            ))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "memwal_yield_everywhere"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
