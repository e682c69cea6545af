//! Producer checkpoints (docs/design/idempotent-producers.md): the
//! producers table as of the end of a generation, written before that
//! generation is published, so the state survives the WAL entries the
//! publish lets GC delete.
//!
//! `{shard}/producers/{generation:020}.json` holds every producer's
//! epoch, last sequence, last write time and the positions of its last
//! sequences, after the appends of every generation up to `generation`.
//! It is written only once all of them are durable (a live generation's
//! WAL switch has resolved; a replayed one's entries were read), so it
//! describes durable appends only, and any writer computes the same
//! table for the same generation from storage. Hence put-if-not-exists,
//! and an object already there (a predecessor's, or an earlier attempt of
//! ours) is as good as ours: it is kept.
//!
//! A claimer loads the checkpoint of the last published generation
//! (`current_generation - 1`); when that one is missing (the generation
//! was published by a writer that does not write checkpoints, e.g.
//! upstream's) it falls back to the newest one below, logged as a warning:
//! the sequences of the missing generations are then not known.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use futures::TryStreamExt;
use memwal_fencing::{parse_producers_file, ShardLayout};
use memwal_store::{create_object, read_object, CreateOutcome};
use serde::{Deserialize, Serialize};

use crate::producers::{Landing, Producers, Record};
use crate::storage::Storage;
use crate::{Error, Result};

/// The format version written (and the only one read).
const FORMAT: u32 = 1;

#[derive(Serialize, Deserialize)]
struct File {
    format: u32,
    generation: u64,
    producers: Vec<Entry>,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    producer: String,
    epoch: u64,
    last: u64,
    at_ms: u64,
    /// `[sequence, position]`, ascending.
    window: Vec<(u64, u64)>,
}

/// The checkpoint bytes of `table` as of the end of `generation`. Waits
/// for appends still in flight (none are, once the generation's WAL
/// switch resolved); one that failed is [`Error::Corrupt`]: the
/// generation would not be published.
pub(crate) async fn encode(table: &Producers, generation: u64) -> Result<Bytes> {
    let mut producers = Vec::with_capacity(table.len());
    for (id, r) in table.records() {
        let mut window = Vec::with_capacity(r.window.len());
        for (sequence, landing) in &r.window {
            let position = match landing {
                Landing::At(p) => *p,
                Landing::InFlight(t) => {
                    t.clone()
                        .await
                        .map_err(|e| {
                            Error::corrupt_from(
                                &format!(
                                "producer {id} sequence {sequence} in generation {generation}'s \
                                 checkpoint is not durable"
                            ),
                                e,
                            )
                        })?
                        .position
                }
            };
            window.push((*sequence, position));
        }
        producers.push(Entry {
            producer: id.clone(),
            epoch: r.epoch,
            last: r.last,
            at_ms: r.at_ms,
            window,
        });
    }
    producers.sort_by(|a, b| a.producer.cmp(&b.producer));
    let file = File {
        format: FORMAT,
        generation,
        producers,
    };
    serde_json::to_vec(&file)
        .map(Bytes::from)
        .map_err(|e| Error::corrupt_from("encoding a producer checkpoint", e))
}

/// The table a checkpoint's bytes hold; [`Error::Corrupt`] names what is
/// wrong with them.
fn decode(bytes: &[u8], generation: u64, path: &str) -> Result<Producers> {
    let corrupt = |why: String| Error::corrupt(format!("producer checkpoint {path}: {why}"));
    let file: File = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
    if file.format != FORMAT {
        return Err(corrupt(format!(
            "format {} (this writer reads {FORMAT})",
            file.format
        )));
    }
    if file.generation != generation {
        return Err(corrupt(format!("names generation {}", file.generation)));
    }
    let mut map = HashMap::with_capacity(file.producers.len());
    for e in file.producers {
        memwal_wal::check_producer_id(&e.producer).map_err(corrupt)?;
        let window: VecDeque<_> = e.window.iter().map(|&(s, p)| (s, Landing::At(p))).collect();
        let ascending = e.window.windows(2).all(|w| w[0].0 < w[1].0);
        if !ascending || e.window.last().is_some_and(|&(s, _)| s > e.last) {
            return Err(corrupt(format!(
                "producer {}'s window does not end at its last sequence",
                e.producer
            )));
        }
        let record = Record {
            epoch: e.epoch,
            last: e.last,
            at_ms: e.at_ms,
            window,
        };
        if map.insert(e.producer.clone(), record).is_some() {
            return Err(corrupt(format!("producer {} is listed twice", e.producer)));
        }
    }
    Ok(Producers::from_records(map))
}

/// Writes generation `generation`'s checkpoint (put-if-not-exists; one
/// already there is kept, see the module docs).
pub(crate) async fn write(storage: &Storage, generation: u64, bytes: Bytes) -> Result<()> {
    let m = &storage.manifests;
    let path = m.layout().producers_path(generation);
    let outcome = create_object(m.store().as_ref(), &path, bytes, m.retry())
        .await
        .map_err(|e| {
            Error::from_store(
                e,
                &format!("writing generation {generation}'s producer checkpoint"),
            )
        })?;
    if let CreateOutcome::Conflict(_) = outcome {
        tracing::debug!(%path, "a producer checkpoint for this generation exists; kept");
    }
    storage.meters.producer_checkpoints.increment(1);
    Ok(())
}

/// The producers table as of the end of generation `published` (the
/// claimed manifest's `current_generation - 1`; 0: nothing published):
/// its checkpoint, or the newest one below it (see the module docs), or
/// an empty table when there is none.
pub(crate) async fn load(storage: &Storage, published: u64) -> Result<Producers> {
    if published == 0 {
        return Ok(Producers::default());
    }
    let m = &storage.manifests;
    let layout: &ShardLayout = m.layout();
    let store = m.store().as_ref();
    let path = layout.producers_path(published);
    let reading = |e| Error::from_store(e, "reading a producer checkpoint");
    if let Some(bytes) = read_object(store, &path, m.retry())
        .await
        .map_err(reading)?
    {
        return decode(&bytes, published, path.as_ref());
    }
    let listed: Vec<_> = store
        .list(Some(&layout.producers_dir()))
        .try_collect()
        .await
        .map_err(|e| Error::storage("listing the producer checkpoints", e))?;
    let newest = listed
        .iter()
        .filter_map(|o| parse_producers_file(o.location.filename()?))
        .filter(|&g| g < published)
        .max();
    let Some(found) = newest else {
        return Ok(Producers::default());
    };
    tracing::warn!(
        shard = %layout.shard(),
        published,
        found,
        "no producer checkpoint for the last published generation (published by a writer \
         that keeps none?): retries of sequences written in generations {}..={published} \
         are not recognised",
        found + 1
    );
    let path = layout.producers_path(found);
    match read_object(store, &path, m.retry())
        .await
        .map_err(reading)?
    {
        Some(bytes) => decode(&bytes, found, path.as_ref()),
        None => Ok(Producers::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memwal_wal::ProducerStamp;

    // Breaks if a checkpoint loses a producer's epoch, last sequence, time
    // or window, or if damaged bytes load as a (wrong) table.
    #[tokio::test]
    async fn checkpoints_round_trip_and_damage_is_corrupt() {
        let mut t = Producers::default();
        for (p, s, pos) in [("a", 3, 30), ("a", 4, 40), ("b", 9, 90)] {
            t.replayed(
                &ProducerStamp {
                    producer: p.into(),
                    epoch: 2,
                    sequence: s,
                    at_ms: 77,
                },
                pos,
            );
        }
        let bytes = encode(&t, 5).await.unwrap();
        let back = decode(&bytes, 5, "x").unwrap();
        assert_eq!(back.last("a"), Some((2, 4)));
        assert_eq!(back.last("b"), Some((2, 9)));
        let a = &back.records()["a"];
        assert_eq!(a.at_ms, 77);
        let window: Vec<_> = a
            .window
            .iter()
            .map(|(s, l)| (*s, l.position_now()))
            .collect();
        assert_eq!(window, vec![(3, Some(30)), (4, Some(40))]);
        assert!(decode(&bytes, 6, "x").is_err(), "another generation's");
        assert!(decode(&bytes[..bytes.len() - 1], 5, "x").is_err());
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        for bad in [
            text.replace("\"format\":1", "\"format\":2"),
            text.replace("\"last\":4", "\"last\":3"),
            text.replace("\"b\"", "\"a\""),
            text.replace("\"b\"", "\"b c\""),
        ] {
            assert!(
                matches!(decode(bad.as_bytes(), 5, "x"), Err(Error::Corrupt { .. })),
                "{bad}"
            );
        }
    }
}
