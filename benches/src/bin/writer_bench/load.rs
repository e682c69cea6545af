//! Producers doing back-to-back durable puts.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::rows::{Rows, ROW_BYTES};
use crate::writers::Writer;

const PUT_TIMEOUT: Duration = Duration::from_secs(120);

/// What one timed window measured.
pub struct Load {
    /// Rows acknowledged.
    pub rows: u64,
    /// Seconds from the first put to the last acknowledgement.
    pub secs: f64,
    /// Latency of every acknowledged put (call to return), sorted.
    pub lat: Vec<Duration>,
    pub err: Option<String>,
}

impl Load {
    pub fn rows_s(&self) -> f64 {
        self.rows as f64 / self.secs
    }

    pub fn mb_s(&self) -> f64 {
        (self.rows * ROW_BYTES as u64) as f64 / self.secs / 1e6
    }

    /// MB/s over the time spent inside put calls (the producer's own work
    /// of building the next batch excluded).
    pub fn in_put_mb_s(&self) -> f64 {
        let busy: f64 = self.lat.iter().map(Duration::as_secs_f64).sum();
        (self.rows * ROW_BYTES as u64) as f64 / busy / 1e6
    }
}

/// `producers` tasks putting `rows_per_put` fresh rows (ids from
/// `first_id` up) back to back until `secs` have passed or `max_bytes` of
/// rows were acknowledged.
pub async fn drive(
    w: &Writer,
    rows: &Rows,
    first_id: i64,
    producers: usize,
    rows_per_put: usize,
    secs: f64,
    max_bytes: u64,
) -> Load {
    let next_id = Arc::new(AtomicI64::new(first_id));
    let done = Arc::new(AtomicU64::new(0));
    let last_id = first_id + (max_bytes / ROW_BYTES as u64) as i64;
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = (0..producers)
        .map(|_| {
            let (w, rows, next_id, done) = (w.clone(), rows.clone(), next_id.clone(), done.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut err = None;
                while Instant::now() < deadline {
                    // Reserve the rows first so the budget is never overshot.
                    let first = next_id.fetch_add(rows_per_put as i64, Ordering::Relaxed);
                    if first + rows_per_put as i64 > last_id {
                        break;
                    }
                    let batch = rows.batch(first, rows_per_put);
                    let t = Instant::now();
                    match tokio::time::timeout(PUT_TIMEOUT, w.put(batch)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            err = Some(e);
                            break;
                        }
                        Err(_) => {
                            err = Some(format!("put timed out after {PUT_TIMEOUT:?}"));
                            break;
                        }
                    }
                    lat.push(t.elapsed());
                    done.fetch_add(rows_per_put as u64, Ordering::Relaxed);
                }
                (lat, err)
            })
        })
        .collect();
    let mut lat = Vec::new();
    let mut err = None;
    for t in tasks {
        match t.await {
            Ok((l, e)) => {
                lat.extend(l);
                err = err.or(e);
            }
            Err(e) => err = err.or(Some(format!("producer panicked: {e}"))),
        }
    }
    let secs = started.elapsed().as_secs_f64();
    lat.sort_unstable();
    Load {
        rows: done.load(Ordering::Relaxed),
        secs,
        lat,
        err,
    }
}
