use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStore;
use parking_lot::Mutex;
use url::Url;

use crate::direct::LocalDurableStore;
use crate::{StoreError, StoreResult};

/// A store and the root path of a table inside it.
#[derive(Debug, Clone)]
pub struct StoreLocation {
    /// The object store holding the table.
    pub store: Arc<dyn ObjectStore>,
    /// The table's root inside `store` (empty for a store rooted at the table).
    pub root: Path,
    /// The URI this location was opened from.
    pub uri: String,
}

impl StoreLocation {
    /// `root` joined with a relative `/`-separated path.
    pub fn child(&self, relative: &str) -> Path {
        let mut path = self.root.clone();
        for part in relative.split('/').filter(|p| !p.is_empty()) {
            path = path.clone().join(part);
        }
        path
    }
}

/// Opens the store a table URI names.
///
/// - a plain path or `file://` URL: the local file system rooted at that
///   directory (created if missing), **with fsync**: a write that returned is
///   on disk, including its directory entry. Whole-object writes of at least
///   [`crate::DIRECT_MIN_BYTES`] (WAL entries) and multipart uploads
///   (lance's SSTable data files) bypass the page cache (`O_DIRECT`) where
///   the file system allows it (`docs/design/local-store.md`);
/// - `memory://NAME`: an in-memory store shared by every caller in this
///   process that opens the same URI;
/// - `s3://BUCKET/PREFIX`: credentials, region and endpoint from the standard
///   `AWS_*` environment variables (`AWS_ENDPOINT_URL` points at an
///   S3-compatible server); plain HTTP is allowed only for a loopback
///   endpoint unless `AWS_ALLOW_HTTP=true`.
pub fn open_store(uri: &str) -> StoreResult<StoreLocation> {
    let invalid = |reason: String| StoreError::InvalidUri {
        uri: uri.to_string(),
        reason,
    };
    if uri.trim().is_empty() {
        return Err(invalid("empty URI".into()));
    }
    let has_scheme = uri.contains("://");
    if !has_scheme {
        return open_local(uri, std::path::Path::new(uri));
    }
    let url = Url::parse(uri).map_err(|e| invalid(e.to_string()))?;
    match url.scheme() {
        "file" => {
            let dir = url
                .to_file_path()
                .map_err(|_| invalid("not a local file path".into()))?;
            open_local(uri, &dir)
        }
        "memory" => Ok(StoreLocation {
            store: shared_memory_store(uri),
            root: Path::default(),
            uri: uri.to_string(),
        }),
        "s3" | "s3a" => open_s3(uri, &url),
        other => Err(invalid(format!(
            "unsupported scheme `{other}` (expected a local path, file://, memory:// or s3://)"
        ))),
    }
}

fn open_local(uri: &str, dir: &std::path::Path) -> StoreResult<StoreLocation> {
    std::fs::create_dir_all(dir).map_err(|e| StoreError::InvalidUri {
        uri: uri.to_string(),
        reason: format!("cannot create directory {}: {e}", dir.display()),
    })?;
    let fs = LocalFileSystem::new_with_prefix(dir)
        .map_err(|e| StoreError::InvalidUri {
            uri: uri.to_string(),
            reason: e.to_string(),
        })?
        .with_fsync(true);
    Ok(StoreLocation {
        store: Arc::new(LocalDurableStore::new(fs)),
        root: Path::default(),
        uri: uri.to_string(),
    })
}

fn shared_memory_store(uri: &str) -> Arc<dyn ObjectStore> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<InMemory>>>> = OnceLock::new();
    let key = uri.trim_end_matches('/').to_string();
    let mut stores = STORES.get_or_init(Default::default).lock();
    stores
        .entry(key)
        .or_insert_with(|| Arc::new(InMemory::new()))
        .clone()
}

fn open_s3(uri: &str, url: &Url) -> StoreResult<StoreLocation> {
    let invalid = |reason: String| StoreError::InvalidUri {
        uri: uri.to_string(),
        reason,
    };
    let bucket = url
        .host_str()
        .filter(|b| !b.is_empty())
        .ok_or_else(|| invalid("missing bucket name".into()))?;
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
    if let Some(endpoint) = std::env::var("AWS_ENDPOINT_URL")
        .ok()
        .or_else(|| std::env::var("AWS_ENDPOINT").ok())
    {
        if is_loopback_http(&endpoint) {
            builder = builder.with_allow_http(true);
        }
        builder = builder.with_endpoint(endpoint);
    }
    let store = builder.build().map_err(|e| invalid(e.to_string()))?;
    let root = Path::parse(url.path().trim_matches('/')).map_err(|e| invalid(e.to_string()))?;
    Ok(StoreLocation {
        store: Arc::new(store),
        root,
        uri: uri.to_string(),
    })
}

fn is_loopback_http(endpoint: &str) -> bool {
    let Ok(url) = Url::parse(endpoint) else {
        return false;
    };
    if url.scheme() != "http" {
        return false;
    }
    match url.host() {
        Some(url::Host::Domain(d)) => d == "localhost",
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;

    #[tokio::test]
    async fn memory_uri_is_shared_within_the_process() {
        let a = open_store("memory://shared-test").unwrap();
        let b = open_store("memory://shared-test/").unwrap();
        let other = open_store("memory://other-test").unwrap();
        a.store.put(&Path::from("x"), "1".into()).await.unwrap();
        assert!(b.store.head(&Path::from("x")).await.is_ok());
        assert!(other.store.head(&Path::from("x")).await.is_err());
    }

    #[tokio::test]
    async fn local_path_and_file_url_reach_the_same_directory() {
        let dir = tempfile::tempdir().unwrap();
        let table = dir.path().join("t");
        let a = open_store(table.to_str().unwrap()).unwrap();
        let url = Url::from_directory_path(&table).unwrap().to_string();
        let b = open_store(&url).unwrap();
        a.store.put(&a.child("m/v1"), "x".into()).await.unwrap();
        assert!(table.join("m/v1").exists());
        assert!(b.store.head(&b.child("m/v1")).await.is_ok());
    }

    #[test]
    fn bad_uris_are_rejected_with_reasons() {
        for uri in ["", "gopher://x", "s3:///nobucket"] {
            let err = open_store(uri).unwrap_err();
            assert!(matches!(err, StoreError::InvalidUri { .. }), "{uri}: {err}");
        }
    }

    #[test]
    fn s3_prefix_becomes_the_root() {
        let loc = open_store("s3://bucket/some/prefix/").unwrap();
        assert_eq!(loc.root.as_ref(), "some/prefix");
        assert_eq!(loc.child("a/b").as_ref(), "some/prefix/a/b");
    }

    #[test]
    fn only_loopback_http_is_allowed_implicitly() {
        assert!(is_loopback_http("http://127.0.0.1:5000"));
        assert!(is_loopback_http("http://localhost:9000"));
        assert!(is_loopback_http("http://[::1]:9000"));
        assert!(!is_loopback_http("http://10.0.0.1:9000"));
        assert!(!is_loopback_http("https://127.0.0.1:9000"));
    }
}
