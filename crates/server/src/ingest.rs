//! Ingest: a put (rows, or key-only deletes) checked as a whole, split by
//! the table's sharding spec, every part prepared by its shard's writer
//! before any is written, then written at once and acknowledged once every
//! part is durable; and the admission of `flush` actions.

use arrow_array::RecordBatch;
use serde::Serialize;

use crate::error::FailedPart;
use crate::placement::Located;
use crate::producer_gate::ProducerGates;
use crate::table::ShardKey;
use crate::{ServerError, TableHost};
use memwal::{Gaps, ProducerSeq};

/// Where a put came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// A client: parts owned by other cluster members are forwarded.
    Client,
    /// Another cluster member: parts not owned here are refused.
    Peer,
}

/// What one part of a put reached.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct PartAck {
    /// The shard.
    pub shard: String,
    /// Rows of the part.
    pub rows: usize,
    /// The WAL position holding them (`None` only for a duplicate older
    /// than the producer's last `memwal::PRODUCER_WINDOW` sequences).
    pub wal_position: Option<u64>,
    /// True when the part's producer sequence was written before: nothing
    /// was written now (idempotent producers).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub duplicate: bool,
}

/// `flush` actions start at most this often per table, by default
/// ([`TableHost::set_min_flush_interval`]).
pub const MIN_FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// A `flush` action's turn ([`TableHost::begin_flush`]): the next one may
/// start once this drops (and the interval has passed).
pub struct FlushTurn<'a>(&'a Ingest);

impl Drop for FlushTurn<'_> {
    fn drop(&mut self) {
        self.0.flushes.lock().1 = false;
    }
}

/// Ingest's own state: flush admission.
pub(crate) struct Ingest {
    /// When the last `flush` action started, and whether one runs.
    flushes: parking_lot::Mutex<(Option<tokio::time::Instant>, bool)>,
    /// `flush` actions start at most once per this long.
    flush_interval: parking_lot::Mutex<std::time::Duration>,
    /// Idempotent producers' order (`producer_gate.rs`).
    gates: ProducerGates,
}

impl Default for Ingest {
    fn default() -> Self {
        Self {
            flushes: Default::default(),
            flush_interval: parking_lot::Mutex::new(MIN_FLUSH_INTERVAL),
            gates: ProducerGates::default(),
        }
    }
}

impl TableHost {
    /// Writes `batch` (rows, or key-only deletes): validated as a whole
    /// (schema, null keys, nulls in non-nullable columns: nothing of an
    /// invalid batch is written), split by shard, every part handed to its
    /// shard's writer at once; returns once every part is durable. Any part
    /// failing fails the call; parts that succeeded stay durable and the error ([`ServerError::Partial`]) lists them.
    pub async fn write(
        &self,
        batch: &RecordBatch,
        delete: bool,
    ) -> Result<Vec<PartAck>, ServerError> {
        self.write_as(batch, delete, None).await
    }

    /// [`Self::write`] for an idempotent producer (`seq`; `None`: as
    /// `write`): one batch of the producer at a time, in sequence order
    /// (`producer_gate.rs`), and each part written only where its shard
    /// has not written that sequence before ([`PartAck::duplicate`]). A
    /// partly durable batch retried whole writes only the missing parts.
    /// Refusals (a fenced producer epoch, a gap) are
    /// [`ServerError::Producer`]: nothing written.
    pub async fn write_as(
        &self,
        batch: &RecordBatch,
        delete: bool,
        seq: Option<&ProducerSeq>,
    ) -> Result<Vec<PartAck>, ServerError> {
        let started = tokio::time::Instant::now();
        // The process tests arm this with `panic` to prove a failing put
        // never ends its call with OK.
        memwal_store::crash_point("server::before_write");
        let result = match seq {
            None => self.write_parts(batch, delete, None, Origin::Client).await,
            Some(seq) => self.write_in_order(batch, delete, seq).await,
        };
        metrics::histogram!("memwal_server_put_seconds", "table" => self.name().to_string())
            .record(started.elapsed().as_secs_f64());
        if result.is_ok() {
            metrics::counter!("memwal_server_rows_total", "table" => self.name().to_string())
                .increment(batch.num_rows() as u64);
        }
        result
    }

    /// [`Self::write_as`] for a put another cluster member forwarded (it
    /// ordered the producer's batches already, so no producer gate here; each
    /// shard still writes a sequence once). Parts this daemon is not placed
    /// to write are refused with `UNAVAILABLE`, never forwarded again.
    pub async fn write_forwarded(
        &self,
        batch: &RecordBatch,
        delete: bool,
        seq: Option<&ProducerSeq>,
    ) -> Result<Vec<PartAck>, ServerError> {
        metrics::counter!("memwal_server_forwarded_puts_received_total", "table" => self.name().to_string())
            .increment(1);
        self.write_parts(batch, delete, seq, Origin::Peer).await
    }

    async fn write_in_order(
        &self,
        batch: &RecordBatch,
        delete: bool,
        seq: &ProducerSeq,
    ) -> Result<Vec<PartAck>, ServerError> {
        memwal_wal::check_producer_id(&seq.producer).map_err(|reason| {
            ServerError::InvalidInput {
                table: self.name().to_string(),
                reason,
            }
        })?;
        let gate = self.ingest().gates.of(&seq.producer);
        let mut place = gate.lock().await;
        if let Some((reason, expected)) = place.refusal(seq.epoch, seq.sequence) {
            return Err(ServerError::Producer {
                table: self.name().to_string(),
                producer: seq.producer.clone(),
                reason,
                expected,
            });
        }
        let written = self
            .write_parts(batch, delete, Some(seq), Origin::Client)
            .await?;
        place.completed(seq.epoch, seq.sequence);
        Ok(written)
    }

    async fn write_parts(
        &self,
        batch: &RecordBatch,
        delete: bool,
        seq: Option<&ProducerSeq>,
        origin: Origin,
    ) -> Result<Vec<PartAck>, ServerError> {
        self.shards().check_open()?;
        // One version of the table's columns for the whole put (a schema
        // change landing meanwhile is met by the writers: see
        // `ShardWriter::evolve_to`).
        let shape = self.shape();
        let conformed = if delete {
            None
        } else {
            self.conform(&shape, batch)?
        };
        let batch = conformed.as_ref().unwrap_or(batch);
        self.check_schema(&shape, batch, delete)?;
        if batch.num_rows() == 0 {
            return Ok(Vec::new());
        }
        // Null keys, nulls in non-nullable columns: refused for the whole
        // batch before any part reaches a shard. (Unsharded: one part, and
        // its writer refuses it whole.)
        if shape.router.is_some() {
            let checked = if delete {
                shape.validator.tombstone_batch(batch)
            } else {
                shape.validator.to_storage(batch)
            };
            checked.map_err(|e| ServerError::InvalidInput {
                table: self.name().to_string(),
                reason: e.to_string(),
            })?;
        }
        let parts: Vec<(ShardKey, RecordBatch)> = match &shape.router {
            None => vec![(ShardKey::new(), batch.clone())],
            Some((rows, keys)) => {
                let router = if delete { keys } else { rows };
                router.split(batch).map_err(|e| ServerError::InvalidInput {
                    table: self.name().to_string(),
                    reason: e.to_string(),
                })?
            }
        };
        // 0. In a cluster, the parts of shards other members own go to
        //    them (a shard moving now refuses the whole put: nothing
        //    written, UNAVAILABLE).
        let (parts, remote) = self.route(parts, origin)?;
        // 1. Everything that can refuse a part, for every part, before any
        //    is written: the shard's slot (owned, not lost, failed or down;
        //    opened if new) and the shard writer's own checks (its schema,
        //    keys, routing, size). A refusal here means nothing was written.
        let prepares = parts.into_iter().map(|(key, part)| async move {
            let w = self.shards().writer(&key, self).await?;
            let prepared = if delete {
                w.prepare_delete(&part)
            } else {
                w.prepare_put(&part)
            };
            let prepared = prepared.map_err(|source| ServerError::Writer {
                table: self.name().to_string(),
                shard: w.shard().to_string(),
                source,
            })?;
            Ok::<_, ServerError>((key, w, prepared))
        });
        let mut prepared = Vec::new();
        for r in futures::future::join_all(prepares).await {
            prepared.push(r?);
        }
        // 2. Every part at once. Only the writers' state can fail them now
        //    (fenced, closed, backpressure, storage).
        let writes = prepared.into_iter().map(|(key, w, part)| async move {
            let rows = part.num_rows();
            let written = match seq {
                None => w.put_prepared(part).await.map(|position| memwal::Acked {
                    position: Some(position),
                    duplicate: false,
                }),
                Some(seq) => w.put_prepared_as(part, seq, Gaps::Allowed).await,
            };
            match written {
                Ok(acked) => Ok(PartAck {
                    shard: w.shard().to_string(),
                    rows,
                    wal_position: acked.position,
                    duplicate: acked.duplicate,
                }),
                Err(source) => {
                    if source.is_fenced() {
                        self.shards().lose(&key, w.shard(), source.to_string());
                        // In a cluster a fenced writer means the shard
                        // moved: nothing was written, and a retry finds the
                        // new owner (UNAVAILABLE, not FAILED_PRECONDITION).
                        if self.shards().placement().is_some() {
                            return Err((
                                rows,
                                ServerError::Moving {
                                    table: self.name().to_string(),
                                    shard: w.shard().to_string(),
                                    reason: format!("claimed by another member ({source})"),
                                },
                            ));
                        }
                    }
                    Err((
                        rows,
                        ServerError::Writer {
                            table: self.name().to_string(),
                            shard: w.shard().to_string(),
                            source,
                        },
                    ))
                }
            }
        });
        let forwards = remote.into_iter().map(|(member, part, shards)| async move {
            let rows = part.num_rows();
            let placement = self
                .shards()
                .placement()
                .expect("remote parts only in a cluster");
            placement
                .peers()
                .forward(
                    &member.advertise,
                    placement.cluster().id(),
                    self.name(),
                    &shards,
                    &part,
                    delete,
                    seq,
                )
                .await
                .map_err(|e| (rows, e))
        });
        let (written, forwarded) = futures::future::join(
            futures::future::join_all(writes),
            futures::future::join_all(forwards),
        )
        .await;
        let mut done = Vec::new();
        let mut failed = Vec::new();
        for r in forwarded {
            match r {
                Ok(parts) => done.extend(parts),
                Err(e) => failed.push(e),
            }
        }
        for r in written {
            match r {
                Ok(part) => done.push(part),
                Err(e) => failed.push(e),
            }
        }
        if failed.is_empty() {
            return Ok(done);
        }
        if done.is_empty() {
            // Nothing durable: the first failure says what happened (an
            // unknown outcome where any part's is unknown).
            let unknown = failed.iter().position(|(_, e)| e.may_be_durable());
            return Err(failed.swap_remove(unknown.unwrap_or(0)).1);
        }
        Err(ServerError::Partial {
            table: self.name().to_string(),
            durable: done,
            failed: failed
                .into_iter()
                .map(|(rows, e)| FailedPart {
                    shard: e.shard().unwrap_or_default().to_string(),
                    rows,
                    code: format!("{:?}", crate::error::code_of(&e)),
                    outcome_unknown: e.may_be_durable(),
                    error: e.to_string(),
                })
                .collect(),
        })
    }

    /// Splits `parts` into those written here and those forwarded, by
    /// owner (each owner's parts as one batch, with their shards named).
    #[allow(clippy::type_complexity)]
    fn route(
        &self,
        parts: Vec<(ShardKey, RecordBatch)>,
        origin: Origin,
    ) -> Result<
        (
            Vec<(ShardKey, RecordBatch)>,
            Vec<(memwal_cluster::Member, RecordBatch, String)>,
        ),
        ServerError,
    > {
        let Some(placement) = self.shards().placement() else {
            return Ok((parts, Vec::new()));
        };
        let spec_id = self.shards().spec_id();
        let mut here = Vec::new();
        let mut by_owner: std::collections::BTreeMap<
            String,
            (memwal_cluster::Member, Vec<RecordBatch>, Vec<String>),
        > = Default::default();
        for (key, part) in parts {
            let shard = memwal::ShardId::for_values(spec_id, &key);
            let moving = |reason: String| ServerError::Moving {
                table: self.name().to_string(),
                shard: shard.to_string(),
                reason,
            };
            match placement.locate(self.name(), shard) {
                Located::Here => here.push((key, part)),
                Located::Moving(reason) => return Err(moving(reason)),
                Located::At(m) if origin == Origin::Peer => {
                    return Err(moving(format!(
                        "forwarded here, but owned by {} now",
                        m.advertise
                    )))
                }
                Located::At(m) => {
                    let entry = by_owner
                        .entry(m.id.clone())
                        .or_insert_with(|| (m, Vec::new(), Vec::new()));
                    entry.1.push(part);
                    entry.2.push(shard.to_string());
                }
            }
        }
        let mut remote = Vec::new();
        for (_, (member, batches, shards)) in by_owner {
            let schema = batches[0].schema();
            let batch = arrow_select::concat::concat_batches(&schema, &batches).map_err(|e| {
                ServerError::InvalidInput {
                    table: self.name().to_string(),
                    reason: format!("joining the parts for {}: {e}", member.advertise),
                }
            })?;
            remote.push((member, batch, shards.join(",")));
        }
        Ok((here, remote))
    }

    /// Sets how often `flush` actions may start (default
    /// [`MIN_FLUSH_INTERVAL`]; zero: only one at a time).
    pub fn set_min_flush_interval(&self, interval: std::time::Duration) {
        *self.ingest().flush_interval.lock() = interval;
    }

    /// Admits one `flush` action: refused (`RESOURCE_EXHAUSTED`) while
    /// another runs or within the minimum interval
    /// ([`Self::set_min_flush_interval`]) of the last one's start. The turn
    /// ends when the returned guard drops.
    pub fn begin_flush(&self) -> Result<FlushTurn<'_>, ServerError> {
        let ingest = self.ingest();
        let interval = *ingest.flush_interval.lock();
        let mut f = ingest.flushes.lock();
        if f.1 {
            return Err(ServerError::TooFrequent {
                table: self.name().to_string(),
                what: "a flush action runs; try again when it ends".into(),
            });
        }
        if let Some(left) =
            f.0.and_then(|at| interval.checked_sub(at.elapsed()))
                .filter(|l| !l.is_zero())
        {
            return Err(ServerError::TooFrequent {
                table: self.name().to_string(),
                what: format!(
                    "flush actions start at most once per {interval:?}; try again in {left:?}"
                ),
            });
        }
        *f = (Some(tokio::time::Instant::now()), true);
        Ok(FlushTurn(ingest))
    }

    /// Flushes every served shard (frozen and published).
    pub async fn flush(&self) -> Result<(), ServerError> {
        for w in self.shards().live() {
            w.flush().await.map_err(|source| ServerError::Writer {
                table: self.name().to_string(),
                shard: w.shard().to_string(),
                source,
            })?;
        }
        Ok(())
    }
}
