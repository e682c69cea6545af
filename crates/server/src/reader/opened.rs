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
    /// The datasets of the SSTables `view` lists above its base (each
    /// shard's, in the view's order): the ones kept, and the others opened
    /// (16 at a time, with the base's session) and kept. Datasets of
    /// SSTables the view does not list are dropped.
    pub(crate) async fn open_view(
        &self,
        loc: &memwal_store::StoreLocation,
        view: &memwal_table::TableView,
    ) -> lance::Result<Vec<Arc<Dataset>>> {
        let lance_store = memwal_sstable::LanceStore::new(loc.store.clone());
        let uris: Vec<String> = view
            .shards
            .iter()
            .flat_map(|shard| {
                let layout = memwal_fencing::ShardLayout::new(&loc.root, shard.shard);
                let lance_store = &lance_store;
                shard
                    .sstables
                    .iter()
                    .map(move |t| lance_store.uri(&layout.sstable_dir(&t.path)))
            })
            .collect();
        self.open(&uris, &view.base.session()).await
    }

    /// The datasets of `uris`, in that order (see [`Self::open_view`]).
    async fn open(
        &self,
        uris: &[String],
        session: &Arc<lance::session::Session>,
    ) -> lance::Result<Vec<Arc<Dataset>>> {
        // The kept ones are taken (cloned) here: a concurrent read of a
        // newer view may drop them from the map meanwhile.
        let mut found: HashMap<String, Arc<Dataset>> = HashMap::with_capacity(uris.len());
        let missing: Vec<String> = {
            let listed: std::collections::HashSet<&String> = uris.iter().collect();
            let mut kept = self.datasets.lock();
            kept.retain(|uri, _| listed.contains(uri));
            uris.iter()
                .filter(|u| match kept.get(*u) {
                    Some(ds) => {
                        found.insert((*u).clone(), ds.clone());
                        false
                    }
                    None => true,
                })
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
        {
            let mut kept = self.datasets.lock();
            for (uri, ds) in &opened {
                kept.insert(uri.clone(), ds.clone());
            }
        }
        found.extend(opened);
        Ok(uris
            .iter()
            .map(|u| {
                found
                    .get(u)
                    .expect("every listed SSTable was kept or opened")
                    .clone()
            })
            .collect())
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
