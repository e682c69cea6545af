//! Replay: the WAL between the replay cursor and this writer's sentinel,
//! rebuilt generation by generation (never renumbered) and queued to the
//! flusher in generation order.

use std::sync::Arc;

use futures::StreamExt;
use memwal_fencing::ShardManifest;
use memwal_memtable::MemTable;
use memwal_wal::{replay, ReplayRange, WalLocation, DEFAULT_REPLAY_PREFETCH};

use crate::config::ReplayPublish;
use crate::producers::Producers;
use crate::state::Inner;
use crate::write_path;
use crate::{Error, Result};

/// A generation being rebuilt from the WAL.
struct Rebuild {
    generation: u64,
    memtable: MemTable,
    first_position: u64,
    last_position: u64,
}

/// Replays the WAL between the replay cursor and our sentinel. Each
/// recorded generation is rebuilt whole as one memtable (never
/// renumbered) and, once complete (the next generation starts, or the WAL
/// ends), frozen and queued to the flusher, which publishes it in
/// generation order in the background; replay waits while the queued
/// generations hold more than `max_unflushed_bytes` (with
/// [`ReplayPublish::BeforeOpenReturns`]: until each is published). Entries without a
/// `generation` (upstream WAL-only entries) belong to the generation being
/// rebuilt (the manifest's `current_generation` if none is). A generation
/// whose memtable exceeds `max_unflushed_bytes` fails with
/// [`Error::Backpressure`] naming it. Returns the first generation after
/// every replayed one.
pub(crate) async fn replay_wal(inner: &Arc<Inner>, manifest: &ShardManifest) -> Result<u64> {
    let storage = &inner.storage;
    let config = &inner.config;
    let range = ReplayRange::new(manifest, inner.epoch, inner.sentinel);
    let mut entries = replay(
        WalLocation::of(&storage.manifests),
        range,
        DEFAULT_REPLAY_PREFETCH,
    );
    if memwal_store::broken("broken::replay_reversed") {
        let mut all: Vec<_> = entries.collect().await;
        all.reverse();
        entries = Box::pin(futures::stream::iter(all));
    }
    // Entries are matched to the schema the writer opened with by field id
    // (an entry written before a column was added or dropped replays:
    // missing columns null, dropped ones ignored).
    let (schema, mut producers) = {
        let st = inner.state.lock();
        (st.active.schema().clone(), st.producers.clone())
    };
    let mut next_generation = manifest.current_generation.max(1);
    let mut current: Option<Rebuild> = None;
    while let Some(entry) = entries.next().await {
        let entry = entry.map_err(|e| Error::from_wal(e, "replaying the WAL"))?;
        let generation = entry.generation.unwrap_or_else(|| {
            current
                .as_ref()
                .map_or(manifest.current_generation, |c| c.generation)
        });
        if current.as_ref().is_some_and(|c| c.generation != generation) {
            let done = current.take().expect("checked");
            next_generation =
                next_generation.max(queue_replayed(inner, done, producers.clone()).await?);
        }
        // Applied after the previous generation was queued: its table (its
        // checkpoint) holds the stamps of its own entries and older ones.
        for stamp in &entry.producers {
            producers.replayed(stamp, entry.position);
        }
        let rebuild = current.get_or_insert_with(|| Rebuild {
            generation,
            memtable: MemTable::new(schema.clone()),
            first_position: entry.position,
            last_position: entry.position,
        });
        for batch in entry.batches.iter().filter(|b| b.num_rows() > 0) {
            let storage = schema.to_storage_for_replay(batch).map_err(|e| {
                Error::corrupt_from(
                    &format!("WAL entry {} does not fit the table schema", entry.position),
                    e,
                )
            })?;
            rebuild
                .memtable
                .insert(&storage)
                .map_err(|e| Error::corrupt_from(&format!("WAL entry {}", entry.position), e))?;
        }
        rebuild.last_position = entry.position;
        // The live path keeps every generation's payload within
        // `memtable_max_bytes` (<= `max_unflushed_bytes`), so what this
        // writer's config acknowledged always replays under it.
        let bytes = rebuild.memtable.memory_usage().payload_bytes;
        if bytes > config.max_unflushed_bytes {
            return Err(Error::Backpressure {
                reason: format!(
                    "replay: recorded generation {} (WAL positions {}..={}) holds {bytes} bytes \
                     of rows, more than max_unflushed_bytes {}; a generation is rebuilt whole, \
                     so raise max_unflushed_bytes to open this shard",
                    rebuild.generation,
                    rebuild.first_position,
                    rebuild.last_position,
                    config.max_unflushed_bytes
                ),
            });
        }
    }
    if let Some(done) = current {
        next_generation =
            next_generation.max(queue_replayed(inner, done, producers.clone()).await?);
    }
    // The table every put from now on is admitted by.
    inner.state.lock().producers = producers;
    Ok(next_generation)
}

/// Freezes a rebuilt generation and queues it to the flusher (its SSTable
/// write starts at once), then waits until the generations still queued
/// hold at most `max_unflushed_bytes` (or, with
/// [`ReplayPublish::BeforeOpenReturns`], until it is published). Returns
/// the generation after it.
///
/// `producers` is the table as of the end of the generation (the loaded
/// checkpoint plus every stamp replayed up to its last entry): its
/// checkpoint.
async fn queue_replayed(
    inner: &Arc<Inner>,
    done: Rebuild,
    mut producers: Producers,
) -> Result<u64> {
    let generation = done.generation;
    let next = generation.checked_add(1).ok_or_else(|| {
        Error::corrupt(format!(
            "replayed generation {generation} cannot be followed"
        ))
    })?;
    {
        let mut st = inner.state.lock();
        st.check_usable()?;
        let memtable = done.memtable.freeze();
        let producers = crate::write_path::expired(inner, &mut producers).then_some(producers);
        let job = crate::flusher::replayed_job(
            inner.clone(),
            generation,
            memtable.clone(),
            done.last_position,
            producers,
        );
        write_path::enqueue(inner, &mut st, generation, memtable, job, false)?;
        tracing::debug!(
            generation,
            last_position = done.last_position,
            "replayed generation queued"
        );
    }
    let before_ready = inner.config.replay_publish == ReplayPublish::BeforeOpenReturns;
    inner
        .wait_until(None, |st| {
            if let Err(e) = st.check_usable() {
                return Some(Err(e));
            }
            let done = if before_ready {
                st.published_generation >= generation
            } else {
                st.unflushed_bytes() <= inner.config.max_unflushed_bytes
            };
            done.then_some(Ok(next))
        })
        .await
        .map(|n| n.unwrap_or(next))
}
