use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use parking_lot::Mutex;

use crate::{injected_error, Gate};

/// The kind of request a [`FaultStore`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// `put_opts` (any mode).
    Put,
    /// `get_opts` / `get_ranges`.
    Get,
    /// A `get_opts` with `head = true`.
    Head,
    /// `list`, `list_with_offset`, `list_with_delimiter`.
    List,
    /// `delete_stream` (one op per path).
    Delete,
    /// `copy_opts`.
    Copy,
    /// `put_multipart_opts` (decided once, at the start of the upload).
    Multipart,
}

/// One request as the fault hook sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// What kind of request.
    pub kind: OpKind,
    /// The object (or list prefix) it addresses.
    pub path: String,
    /// For puts: whether it was put-if-not-exists.
    pub create: bool,
    /// 0-based sequence number over all requests this store saw.
    pub seq: u64,
}

/// Builds the error an [`Action::FailWith`] or [`Action::LandThenFailWith`]
/// reports (a fresh one per request: `object_store::Error` is not `Clone`).
#[derive(Clone)]
pub struct InjectError(Arc<dyn Fn() -> object_store::Error + Send + Sync>);

impl InjectError {
    /// Injects what `make` returns.
    pub fn new(make: impl Fn() -> object_store::Error + Send + Sync + 'static) -> Self {
        Self(Arc::new(make))
    }

    fn make(&self) -> object_store::Error {
        (self.0)()
    }
}

impl fmt::Debug for InjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "InjectError({})", self.make())
    }
}

/// What the hook decides for a request.
#[derive(Debug, Clone)]
pub enum Action {
    /// Run it normally.
    Pass,
    /// Fail with an injected transient error; nothing reaches the inner store.
    Fail,
    /// Run it on the inner store, then report an injected error anyway (a
    /// PUT that landed but whose response was lost).
    LandThenFail,
    /// Fail with the given error; nothing reaches the inner store (e.g. a
    /// refusal such as [`crate::permission_denied`]).
    FailWith(InjectError),
    /// Run it on the inner store, then report the given error if it
    /// succeeded (e.g. [`crate::local_sync_error`]: the object was linked
    /// into place, then its fsync failed). An inner failure is reported as is.
    LandThenFailWith(InjectError),
    /// Hold at the gate until the test opens it, then decide by the inner action.
    Hold(Gate, Box<Action>),
    /// Wait this long, then run it normally.
    Delay(Duration),
}

type Hook = Arc<dyn Fn(&Op) -> Action + Send + Sync>;

/// An object store wrapper for tests: a hook chooses an [`Action`] per
/// request, [`FaultStore::cut_power`] makes every later request fail without
/// landing, and every request is logged.
pub struct FaultStore {
    inner: Arc<dyn ObjectStore>,
    state: Arc<State>,
}

#[derive(Default)]
struct State {
    hook: Mutex<Option<Hook>>,
    power_cut: AtomicBool,
    seq: AtomicU64,
    log: Mutex<Vec<Op>>,
}

impl State {
    fn is_power_cut(&self) -> bool {
        self.power_cut.load(Ordering::SeqCst)
    }

    fn record(&self, kind: OpKind, path: &Path, create: bool) -> (Op, Action) {
        let op = Op {
            kind,
            path: path.to_string(),
            create,
            seq: self.seq.fetch_add(1, Ordering::SeqCst),
        };
        self.log.lock().push(op.clone());
        let hook = self.hook.lock().clone();
        let action = hook.map(|h| h(&op)).unwrap_or(Action::Pass);
        (op, action)
    }
}

impl fmt::Debug for FaultStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultStore")
            .field("inner", &self.inner)
            .field("power_cut", &self.state.is_power_cut())
            .finish()
    }
}

impl fmt::Display for FaultStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultStore({})", self.inner)
    }
}

impl FaultStore {
    /// Wraps `inner`; with no hook installed every request passes.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            state: Arc::new(State::default()),
        })
    }

    /// The wrapped store (bypasses every fault).
    pub fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    /// Installs the hook that decides each later request.
    pub fn set_hook(&self, hook: impl Fn(&Op) -> Action + Send + Sync + 'static) {
        *self.state.hook.lock() = Some(Arc::new(hook));
    }

    /// Removes the hook: every later request passes.
    pub fn clear_hook(&self) {
        *self.state.hook.lock() = None;
    }

    /// From now on every request fails and nothing more lands (requests held
    /// at a gate or delayed fail too when they resume).
    pub fn cut_power(&self) {
        self.state.power_cut.store(true, Ordering::SeqCst);
    }

    /// Whether [`FaultStore::cut_power`] was called.
    pub fn is_power_cut(&self) -> bool {
        self.state.is_power_cut()
    }

    /// Every request seen so far, in arrival order.
    pub fn ops(&self) -> Vec<Op> {
        self.state.log.lock().clone()
    }

    /// Requests of `kind` whose path starts with `prefix`.
    pub fn count(&self, kind: OpKind, prefix: &str) -> usize {
        self.state
            .log
            .lock()
            .iter()
            .filter(|op| op.kind == kind && op.path.starts_with(prefix))
            .count()
    }

    /// Applies gates and delays, then says whether the request runs and
    /// which failure to report after it ran (`None`: its own outcome).
    async fn resolve(&self, mut action: Action) -> Result<Option<InjectError>> {
        loop {
            if self.is_power_cut() {
                return Err(injected_error("power cut"));
            }
            match action {
                Action::Pass => return Ok(None),
                Action::Fail => return Err(injected_error("request failed before landing")),
                Action::LandThenFail => {
                    return Ok(Some(InjectError::new(|| {
                        injected_error("response lost after the request landed")
                    })))
                }
                Action::FailWith(err) => return Err(err.make()),
                Action::LandThenFailWith(err) => return Ok(Some(err)),
                Action::Hold(gate, then) => {
                    gate.pass().await;
                    action = *then;
                }
                Action::Delay(d) => {
                    tokio::time::sleep(d).await;
                    action = Action::Pass;
                }
            }
        }
    }

    async fn run<T>(
        &self,
        kind: OpKind,
        path: &Path,
        create: bool,
        fut: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let (_op, action) = self.state.record(kind, path, create);
        let fail_after = self.resolve(action).await?;
        let out = fut.await;
        if let Some(err) = fail_after {
            out?;
            return Err(err.make());
        }
        out
    }
}

#[async_trait]
impl ObjectStore for FaultStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let create = matches!(opts.mode, PutMode::Create);
        self.run(
            OpKind::Put,
            location,
            create,
            self.inner.put_opts(location, payload, opts),
        )
        .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.run(
            OpKind::Multipart,
            location,
            false,
            self.inner.put_multipart_opts(location, opts),
        )
        .await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let kind = if options.head {
            OpKind::Head
        } else {
            OpKind::Get
        };
        self.run(
            kind,
            location,
            false,
            self.inner.get_opts(location, options),
        )
        .await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.run(
            OpKind::Get,
            location,
            false,
            self.inner.get_ranges(location, ranges),
        )
        .await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        // Each path is decided as it streams by: blocked deletes become
        // errors, the others go on to the inner store.
        let state = self.state.clone();
        let inner = self.inner.clone();
        let allowed = locations
            .map(move |loc| {
                let path = loc?;
                let (_op, action) = state.record(OpKind::Delete, &path, false);
                match action {
                    _ if state.is_power_cut() => Err(injected_error("delete failed")),
                    Action::Pass => Ok(path),
                    Action::FailWith(err) => Err(err.make()),
                    _ => Err(injected_error("delete failed")),
                }
            })
            .boxed();
        inner.delete_stream(allowed)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        let path = prefix.cloned().unwrap_or_default();
        let (_op, action) = self.state.record(OpKind::List, &path, false);
        let err = match action {
            _ if self.is_power_cut() => injected_error("list failed"),
            Action::Pass => return self.inner.list(prefix),
            Action::FailWith(err) => err.make(),
            _ => injected_error("list failed"),
        };
        stream::once(async move { Err(err) }).boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let path = prefix.cloned().unwrap_or_default();
        self.run(
            OpKind::List,
            &path,
            false,
            self.inner.list_with_delimiter(prefix),
        )
        .await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.run(
            OpKind::Copy,
            to,
            false,
            self.inner.copy_opts(from, to, options),
        )
        .await
    }
}
