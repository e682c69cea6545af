//! Memory the reads keep between queries (other writers' WAL tails,
//! `tails.rs`; the indexes over unflushed rows, `memtables.rs`), charged
//! while kept to the memory all of the daemon's queries share
//! (`query_total_memory_mib`), so what queries hold and what reads keep
//! for them have one bound. Embedded use without an account charges
//! nothing.

use std::sync::Arc;

use datafusion::error::DataFusionError;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};

/// The pool reads charge what they keep to (`None`: nothing charged).
#[derive(Default)]
pub(crate) struct Account(parking_lot::RwLock<Option<Arc<dyn MemoryPool>>>);

impl Account {
    /// Charges what reads keep to `pool` from now on (what is kept already
    /// moves to it at its next change).
    pub(crate) fn set(&self, pool: Arc<dyn MemoryPool>) {
        *self.0.write() = Some(pool);
    }

    /// The pool charged now.
    pub(crate) fn pool(&self) -> Option<Arc<dyn MemoryPool>> {
        self.0.read().clone()
    }
}

/// The bytes one kept thing holds, charged to the pool they were taken
/// from; given back when dropped.
#[derive(Default)]
pub(crate) struct Held(Option<(Arc<dyn MemoryPool>, MemoryReservation)>);

impl Held {
    /// Sets the bytes held to `bytes`, charged to `pool` (`None`: nothing
    /// charged). A growth `pool` has no room for is refused
    /// (`ResourcesExhausted`, naming `what` and the setting), and the
    /// charge stays what it was: the caller drops what it could not keep.
    pub(crate) fn set(
        &mut self,
        pool: Option<&Arc<dyn MemoryPool>>,
        what: &str,
        bytes: usize,
    ) -> Result<(), DataFusionError> {
        let Some(pool) = pool else {
            self.0 = None;
            return Ok(());
        };
        if !self.0.as_ref().is_some_and(|(p, _)| Arc::ptr_eq(p, pool)) {
            self.0 = Some((pool.clone(), MemoryConsumer::new(what).register(pool)));
        }
        let Some((_, reservation)) = self.0.as_mut() else {
            return Ok(());
        };
        reservation.try_resize(bytes).map_err(|e| {
            metrics::counter!("memwal_server_reads_refused_total", "reason" => "kept_memory")
                .increment(1);
            DataFusionError::ResourcesExhausted(format!(
                "{what} would keep {bytes} bytes, more than the memory all queries share has \
                 free (query_total_memory_mib): {e}"
            ))
        })
    }

    /// The bytes charged now.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |(_, r)| r.size())
    }
}

#[cfg(test)]
mod tests {
    use datafusion::execution::memory_pool::GreedyMemoryPool;

    use super::*;

    // Breaks if a kept thing is charged past its pool, if a refused growth
    // changes the charge, or if dropping or shrinking does not give the
    // bytes back.
    #[test]
    fn what_is_kept_is_charged_within_the_pool_and_given_back() {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1000));
        let mut a = Held::default();
        a.set(Some(&pool), "a", 600).unwrap();
        let mut b = Held::default();
        let e = b.set(Some(&pool), "b", 500).unwrap_err();
        assert!(e.to_string().contains("query_total_memory_mib"), "{e}");
        assert_eq!((pool.reserved(), b.bytes()), (600, 0));
        a.set(Some(&pool), "a", 100).unwrap();
        b.set(Some(&pool), "b", 500).unwrap();
        assert_eq!(pool.reserved(), 600);
        drop(b);
        assert_eq!(pool.reserved(), 100);
        // Moved to another pool: the first one gets its bytes back.
        let other: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1000));
        a.set(Some(&other), "a", 300).unwrap();
        assert_eq!((pool.reserved(), other.reserved()), (0, 300));
        a.set(None, "a", 300).unwrap();
        assert_eq!(other.reserved(), 0);
    }
}
