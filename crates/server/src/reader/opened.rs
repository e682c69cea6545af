//! Published SSTables opened for scans, kept between reads.
//!
//! A published SSTable directory never changes, so the `Dataset` a scan
//! opened (its manifest read and parsed) serves every later scan while the
//! table's view lists it. Without this, every query paid one manifest read
//! per fresh SSTable, and a table with a backlog of small SSTables paid
//! hundreds per query. What is kept is bounded by the view: each call drops
//! the SSTables the current view no longer lists (compacted ones), and the
//! writers' stalls bound how many a view lists.

use std::collections::HashMap;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use lance::Dataset;

/// SSTables opened at once when a read opens several (each open reads its
/// manifest: on an object store, a round trip).
const OPEN_CONCURRENCY: usize = 16;

/// The SSTable datasets opened so far, by URI.
#[derive(Default)]
pub(crate) struct Opened {
    datasets: parking_lot::Mutex<HashMap<String, Arc<Dataset>>>,
    /// SSTables opened so far (each open reads a manifest).
    opens: std::sync::atomic::AtomicU64,
}

impl Opened {
    /// The datasets of `uris` (every SSTable the current view lists, in
    /// the order wanted): the ones kept, and the others opened (16 at a
    /// time, with `session`) and kept. Datasets of SSTables not in `uris`
    /// are dropped.
    pub(crate) async fn open(
        &self,
        uris: &[String],
        session: &Arc<lance::session::Session>,
    ) -> lance::Result<Vec<Arc<Dataset>>> {
        let missing: Vec<String> = {
            let listed: std::collections::HashSet<&String> = uris.iter().collect();
            let mut kept = self.datasets.lock();
            kept.retain(|uri, _| listed.contains(uri));
            uris.iter()
                .filter(|u| !kept.contains_key(*u))
                .cloned()
                .collect()
        };
        let opens = missing.into_iter().map(|uri| {
            let session = session.clone();
            async move {
                let ds = lance::dataset::builder::DatasetBuilder::from_uri(&uri)
                    .with_session(session)
                    .load()
                    .await?;
                Ok::<_, lance::Error>((uri, Arc::new(ds)))
            }
        });
        let opened: Vec<(String, Arc<Dataset>)> = futures::stream::iter(opens)
            .buffered(OPEN_CONCURRENCY)
            .try_collect()
            .await?;
        self.opens
            .fetch_add(opened.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let mut kept = self.datasets.lock();
        for (uri, ds) in opened {
            kept.insert(uri, ds);
        }
        Ok(uris.iter().filter_map(|u| kept.get(u).cloned()).collect())
    }

    /// How many are kept, and how many were opened so far (tests).
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (usize, u64) {
        (
            self.datasets.lock().len(),
            self.opens.load(std::sync::atomic::Ordering::Relaxed),
        )
    }
}
