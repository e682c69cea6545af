//! Following the base table's schema while serving: a column added to or
//! dropped from the base table reaches every live shard without a restart
//! (docs/design/schema-changes.md).

use std::sync::Arc;

use futures::future::BoxFuture;
use memwal_sstable::LanceStore;
use memwal_table::BaseTable;

use crate::columns::Shape;
use crate::slots::Cell;
use crate::{ServerError, TableHost};

/// The columns a host serves, and the lock schema changes take: what
/// [`TableHost::evolve`] replaces, whole, one change at a time.
pub(crate) struct Following {
    spec: memwal_proto::ShardingSpec,
    /// One version of the base table's schema, replaced whole.
    shape: parking_lot::RwLock<Arc<Shape>>,
    /// One schema change at a time.
    evolving: tokio::sync::Mutex<()>,
}

impl Following {
    /// Serving `shape`, built from `spec` and the base table's schema.
    pub(crate) fn new(spec: memwal_proto::ShardingSpec, shape: Shape) -> Self {
        Self {
            spec,
            shape: parking_lot::RwLock::new(Arc::new(shape)),
            evolving: Default::default(),
        }
    }

    /// The columns served now (a put checks its whole batch against one).
    pub(crate) fn current(&self) -> Arc<Shape> {
        self.shape.read().clone()
    }
}

impl crate::shards::GoLive for TableHost {
    fn go_live<'a>(&'a self, cell: &'a Cell, w: Arc<memwal::ShardWriter>) -> BoxFuture<'a, ()> {
        Box::pin(TableHost::go_live(self, cell, w))
    }
}

impl TableHost {
    /// Reads the base table's latest version and follows its schema:
    /// every live shard writer moves onto it first (each freezing its
    /// active generation, so no generation mixes schemas:
    /// [`memwal::ShardWriter::evolve_to`]), then this host checks and
    /// routes puts by it (`GetSchema` answers it). Returns whether the
    /// host's schema changed.
    ///
    /// Writers go first because a writer on the new schema takes puts of
    /// both versions (a missing nullable column is null), while the host's
    /// check still admits only the old one: no shard ever refuses both
    /// schemas. Idempotent and cheap when nothing changed (a writer opened
    /// from an older base version is caught up as well). One runs at a
    /// time. Refused ([`ServerError::InvalidInput`], nothing changed) when
    /// the primary key changed; a writer that fails to follow is left to
    /// its slot (a terminal writer is reopened, on the new schema).
    pub async fn evolve(&self) -> Result<bool, ServerError> {
        let _one = self.following().evolving.lock().await;
        self.evolve_locked(None).await
    }

    /// Puts `w`, just opened, into `cell` as live, on the schema this host
    /// serves: a schema change followed while `w` opened missed it (it was
    /// not live yet), and a writer behind the host's check would refuse
    /// puts of both schemas. Under [`Self::evolve`]'s lock from the check
    /// until `w` is live, so no change can land in between unseen, and no
    /// put reaches `w` before it follows; a difference runs a whole
    /// `evolve` that moves `w` too (forward only: everything moves to the
    /// base's latest). A failure is logged; the next poll retries.
    pub(crate) async fn go_live(&self, cell: &Cell, w: Arc<memwal::ShardWriter>) {
        let _one = self.following().evolving.lock().await;
        let serving = self.shape().validator.storage_schema().fields().clone();
        if w.schema().storage_schema().fields() != &serving {
            if let Err(e) = self.evolve_locked(Some(&w)).await {
                tracing::warn!(table = %self.name(), shard = %w.shard(), error = %e, "a shard opened during a schema change could not follow it");
            }
        }
        cell.set(crate::slots::Slot::Live(w));
    }

    /// [`Self::evolve`], its lock held; `opening` (a writer not live yet)
    /// follows too.
    async fn evolve_locked(
        &self,
        opening: Option<&Arc<memwal::ShardWriter>>,
    ) -> Result<bool, ServerError> {
        let lance = LanceStore::new(self.loc().store.clone());
        let base = BaseTable::load(&lance, &self.loc().root)
            .await
            .map_err(|e| ServerError::Setup {
                table: self.name().to_string(),
                reason: format!("reading the base table's schema: {e}"),
            })?;
        let current = self.shape();
        let changed = current.schema.fields() != base.schema.fields();
        let next = if changed {
            let next =
                Shape::build(&self.following().spec, base.schema.clone()).map_err(|reason| {
                    ServerError::InvalidInput {
                        table: self.name().to_string(),
                        reason: format!("the base table's new schema: {reason}"),
                    }
                })?;
            if next.key_schema.fields() != current.key_schema.fields() {
                return Err(ServerError::InvalidInput {
                    table: self.name().to_string(),
                    reason: format!(
                        "the base table's primary key changed ({:?} -> {:?}); a served table \
                         cannot follow that: restart the daemon",
                        names(&current.key_schema),
                        names(&next.key_schema)
                    ),
                });
            }
            Some(next)
        } else {
            None
        };
        let mut writers = self.shards().live();
        writers.extend(opening.cloned());
        for w in writers {
            match w.evolve_to(base.schema.clone()) {
                Ok(_) => {}
                // Closed, fenced or failed meanwhile: its slot deals with it.
                Err(e) if w.terminal_error().is_some() => {
                    tracing::debug!(table = %self.name(), shard = %w.shard(), error = %e, "a stopped writer did not follow the schema");
                }
                Err(e) => {
                    tracing::warn!(table = %self.name(), shard = %w.shard(), error = %e, "a shard writer could not follow the table's schema");
                }
            }
        }
        let Some(next) = next else {
            return Ok(false);
        };
        tracing::info!(
            table = %self.name(),
            from = ?names(&current.schema),
            to = ?names(&next.schema),
            "following the base table's new schema"
        );
        *self.following().shape.write() = Arc::new(next);
        metrics::counter!("memwal_server_schema_changes_total", "table" => self.name().to_string())
            .increment(1);
        Ok(true)
    }

    /// Starts the task that calls [`Self::evolve`] every `every` until
    /// `stop` turns true (failures are retried at the next tick, logged as
    /// a warning when they first occur or change; the host keeps serving
    /// its current schema meanwhile).
    pub fn spawn_schema_watch(
        self: &Arc<Self>,
        every: std::time::Duration,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let span = tracing::info_span!("schema_watch", table = %self.name());
        let last = Arc::new(parking_lot::Mutex::new(None::<String>));
        crate::periodic::spawn_every(span, every, stop, self.clone(), move |host| {
            let last = last.clone();
            async move {
                let failure = host.evolve().await.err().map(|e| e.to_string());
                let mut last = last.lock();
                match &failure {
                    Some(e) if last.as_ref() != Some(e) => {
                        tracing::warn!(error = %e, "following the base table's schema")
                    }
                    Some(e) => tracing::debug!(error = %e, "following the base table's schema"),
                    None if last.is_some() => {
                        tracing::info!("following the base table's schema again")
                    }
                    None => {}
                }
                *last = failure;
            }
        })
    }
}

fn names(s: &arrow_schema::Schema) -> Vec<&str> {
    s.fields().iter().map(|f| f.name().as_str()).collect()
}
