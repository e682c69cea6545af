//! Hands lance our object store, so every object of an SSTable is written
//! (and read) through it.
//!
//! Lance resolves dataset URIs through the `ObjectStoreRegistry` of its
//! `Session`. We register a provider for a private scheme that always
//! answers with our store; SSTable URIs use that scheme. Lance's local
//! fast path (direct, non-fsynced file writes) only applies to `file://`
//! URIs, so under our scheme every write is a `put`/multipart upload on our
//! store: for `memwal_store::open_store`'s local store that means fsync of
//! the file and its new directories before the write returns.

use std::collections::HashMap;
use std::sync::Arc;

use lance::session::Session;
use lance_io::object_store::{
    ObjectStore as LanceObjectStore, ObjectStoreParams, ObjectStoreProvider, ObjectStoreRegistry,
    DEFAULT_DOWNLOAD_RETRY_COUNT, DEFAULT_LOCAL_IO_PARALLELISM,
};
use object_store::path::Path;
use object_store::ObjectStore;
use url::Url;

/// URI scheme under which lance sees our store.
pub(crate) const SCHEME: &str = "memwal-store";
const AUTHORITY: &str = "store";

const INDEX_CACHE_BYTES: usize = 64 << 20;
const METADATA_CACHE_BYTES: usize = 64 << 20;

#[derive(Debug)]
struct Provider {
    store: Arc<dyn ObjectStore>,
}

#[async_trait::async_trait]
impl ObjectStoreProvider for Provider {
    async fn new_store(
        &self,
        base_path: Url,
        params: &ObjectStoreParams,
    ) -> lance_core::Result<LanceObjectStore> {
        Ok(lance_view(self.store.clone(), base_path, params))
    }

    fn extract_path(&self, url: &Url) -> lance_core::Result<Path> {
        Path::from_url_path(url.path())
            .map_err(|e| lance_core::Error::invalid_input(format!("bad path in {url}: {e}")))
    }

    fn calculate_object_store_prefix(
        &self,
        _url: &Url,
        _storage_options: Option<&HashMap<String, String>>,
    ) -> lance_core::Result<String> {
        Ok(format!("{SCHEME}${AUTHORITY}"))
    }
}

fn lance_view(
    store: Arc<dyn ObjectStore>,
    location: Url,
    params: &ObjectStoreParams,
) -> LanceObjectStore {
    LanceObjectStore::new(
        store,
        location,
        params.block_size,
        params.object_store_wrapper.clone(),
        false,
        // Local directories list in arbitrary order; never assume sorted.
        false,
        DEFAULT_LOCAL_IO_PARALLELISM,
        DEFAULT_DOWNLOAD_RETRY_COUNT,
        None,
    )
}

/// Our object store as lance sees it: a session whose registry resolves
/// [`LanceStore::uri`]s to the store, and a lance `ObjectStore` view of it.
#[derive(Clone)]
pub struct LanceStore {
    store: Arc<dyn ObjectStore>,
    session: Arc<Session>,
    lance: Arc<LanceObjectStore>,
}

impl std::fmt::Debug for LanceStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LanceStore")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl LanceStore {
    /// Wraps `store` (any `object_store` implementation: local with fsync,
    /// memory, S3, a test wrapper).
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        let registry = ObjectStoreRegistry::default();
        registry.insert(
            SCHEME,
            Arc::new(Provider {
                store: store.clone(),
            }),
        );
        let session = Arc::new(Session::new(
            INDEX_CACHE_BYTES,
            METADATA_CACHE_BYTES,
            Arc::new(registry),
        ));
        let root = Url::parse(&format!("{SCHEME}://{AUTHORITY}/")).expect("static URL parses");
        let lance = Arc::new(lance_view(
            store.clone(),
            root,
            &ObjectStoreParams::default(),
        ));
        Self {
            store,
            session,
            lance,
        }
    }

    /// The wrapped store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The lance session whose registry resolves our URIs; pass it to every
    /// lance call that opens or writes a dataset under [`Self::uri`].
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// Lance's `ObjectStore` over our store (paths are store paths).
    pub fn lance_store(&self) -> &Arc<LanceObjectStore> {
        &self.lance
    }

    /// The commit handler every lance commit through this store must use:
    /// put-if-not-exists of the version's manifest, so concurrent committers
    /// conflict instead of overwriting each other (lance picks an unsafe,
    /// overwriting handler for a scheme it does not know, such as ours).
    pub fn commit_handler(&self) -> Arc<dyn lance_table::io::commit::CommitHandler> {
        Arc::new(lance_table::io::commit::ConditionalPutCommitHandler)
    }

    /// The URI under which lance finds the object-store directory `path`.
    pub fn uri(&self, path: &Path) -> String {
        let mut url = Url::parse(&format!("{SCHEME}://{AUTHORITY}/")).expect("static URL parses");
        {
            let mut segments = url.path_segments_mut().expect("URL has a path");
            segments.clear();
            for part in path.parts() {
                segments.push(part.as_ref());
            }
        }
        url.to_string()
    }
}
