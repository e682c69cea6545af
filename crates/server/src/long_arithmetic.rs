//! Filters whose predicate holds a long chain of arithmetic are planned
//! without the analyses whose cost grows as a power of that length.
//!
//! DataFusion builds a `FilterExec` (again each time an optimizer rule
//! rebuilds the plan, about a dozen times per query) by running interval
//! analysis over its predicate when the predicate is made only of
//! arithmetic, comparisons, `AND`, columns, literals and casts. That
//! analysis deduplicates subexpressions by comparing each one, deeply,
//! with every one seen before: a chain of n `+` costs about n³. Measured
//! (debug build, one FilterExec): 61 ms at 200 operators, 335 ms at 400;
//! planning a whole query 0.7 s and 3.7 s, and 45 s at 998, within the
//! statement depth cap (`crate::statement`). Lance's planning of the same
//! filter inside each level's scan grows too.
//!
//! So a predicate whose arithmetic chain is longer than
//! [`MAX_ANALYZED_ARITHMETIC`]:
//! - is kept out of the levels' Lance scans ([`too_long`], checked by
//!   `reader::scan::pushable`): the query applies it;
//! - is planned as `p IS TRUE` ([`WithoutIntervalAnalysis`], a logical
//!   optimizer rule run after DataFusion's own): a filter keeps a row only
//!   where its predicate is true, so the same rows pass, and `IS TRUE` is
//!   outside what interval analysis takes. Measured: 400 operators planned
//!   in 0.35 s instead of 3.7 s.
//!
//! Shorter chains (real predicates: `price * qty > 100`) keep both, and
//! with them DataFusion's selectivity estimates.
//!
//! Test: `a_long_arithmetic_filter_plans_without_interval_analysis`
//! (`query_tests.rs`).

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::Result;
use datafusion::logical_expr::{Expr, Filter, LogicalPlan, Operator};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

/// The longest chain of arithmetic operators a filter is analysed and
/// pushed into Lance with: about 0.5 ms per FilterExec there (debug
/// build; 13.7 ms measured at 100 operators, cubic).
pub(crate) const MAX_ANALYZED_ARITHMETIC: usize = 32;

/// Whether `predicate` holds a chain of more than
/// [`MAX_ANALYZED_ARITHMETIC`] arithmetic operators (`+ - * /` nested in
/// one another). Walks the expression without recursing.
pub(crate) fn too_long(predicate: &Expr) -> bool {
    let mut pending = vec![(predicate, 0usize)];
    while let Some((expr, above)) = pending.pop() {
        let run = match expr {
            Expr::BinaryExpr(b)
                if matches!(
                    b.op,
                    Operator::Plus | Operator::Minus | Operator::Multiply | Operator::Divide
                ) =>
            {
                above + 1
            }
            _ => 0,
        };
        if run > MAX_ANALYZED_ARITHMETIC {
            return true;
        }
        // Never fails: the closure only collects.
        let _ = expr.apply_children(|child| {
            pending.push((child, run));
            Ok(TreeNodeRecursion::Continue)
        });
    }
    false
}

/// The logical optimizer rule that plans a filter whose predicate is
/// [`too_long`] as `predicate IS TRUE` (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct WithoutIntervalAnalysis;

impl OptimizerRule for WithoutIntervalAnalysis {
    fn name(&self) -> &str {
        "memwal_without_interval_analysis"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        match plan {
            LogicalPlan::Filter(f)
                if !matches!(f.predicate, Expr::IsTrue(_)) && too_long(&f.predicate) =>
            {
                let predicate = Expr::IsTrue(Box::new(f.predicate));
                Ok(Transformed::yes(LogicalPlan::Filter(Filter::try_new(
                    predicate, f.input,
                )?)))
            }
            other => Ok(Transformed::no(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::{col, lit};

    fn chain(n: usize) -> Expr {
        (0..n).fold(col("id"), |e, _| e + lit(1i64))
    }

    // Breaks if a chain's length is miscounted: a chain at the limit, and
    // the same operators spread over separate chains, are not too long;
    // one more operator in one chain is, wherever it sits.
    #[test]
    fn only_a_chain_past_the_limit_is_too_long() {
        let at = MAX_ANALYZED_ARITHMETIC;
        assert!(!too_long(&chain(at).gt_eq(lit(5i64))));
        assert!(too_long(&chain(at + 1).gt_eq(lit(5i64))));
        let spread = chain(at).gt(lit(1i64)).and(chain(at).lt(lit(9i64)));
        assert!(!too_long(&spread));
        let nested = col("v").eq(lit("x")).or(chain(at + 1).eq(lit(0i64)));
        assert!(too_long(&nested));
        // A chain of comparisons and `AND`s is not arithmetic.
        let conjunction = (0..500).fold(col("id").gt(lit(0i64)), |e, i| {
            e.and(col("id").gt(lit(i as i64)))
        });
        assert!(!too_long(&conjunction));
    }
}
