//! HTTP endpoints: `/healthz`, `/readyz`, `/status` (JSON), `/metrics`
//! (Prometheus text).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;

use crate::TableHost;

/// The served tables, set once every one is open (its shards claimed and
/// replayed); HTTP answers before that (`/readyz`: not ready).
pub type Tables = Arc<OnceLock<Arc<HashMap<String, Arc<TableHost>>>>>;

/// What the endpoints read.
#[derive(Clone)]
pub struct HttpState {
    /// The served tables (empty while opening).
    pub tables: Tables,
    /// Set while the daemon serves: every table open, not stopping.
    pub ready: Arc<AtomicBool>,
    /// The Prometheus recorder's handle.
    pub metrics: Option<PrometheusHandle>,
    /// Bearer token required on every endpoint but `/healthz`, if any.
    pub token: Option<Arc<str>>,
}

fn authorized(state: &HttpState, headers: &HeaderMap) -> bool {
    match &state.token {
        None => true,
        Some(t) => crate::auth::bearer_matches(
            headers.get("authorization").and_then(|v| v.to_str().ok()),
            t,
        ),
    }
}

/// The HTTP router.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn readyz(State(s): State<HttpState>, headers: HeaderMap) -> Response {
    if !authorized(&s, &headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    if !s.ready.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response();
    }
    let down: Vec<String> = s
        .tables
        .get()
        .iter()
        .flat_map(|t| t.values())
        .flat_map(|t| t.down_shards())
        .collect();
    if down.is_empty() {
        "ready\n".into_response()
    } else {
        let body = format!(
            "not ready: shards down (reopening with backoff):\n{}\n",
            down.join("\n")
        );
        (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    }
}

async fn status(State(s): State<HttpState>, headers: HeaderMap) -> Response {
    if !authorized(&s, &headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let mut tables = serde_json::Map::new();
    let opening = s.tables.get().is_none();
    for (name, t) in s.tables.get().iter().flat_map(|t| t.iter()) {
        tables.insert(
            name.clone(),
            json!({
                "shards": t.status().await,
                "index_catchup": t.index_catchup(),
                "maintenance": t.maintenance(),
                "cluster": t.cluster_status(),
            }),
        );
    }
    Json(json!({
        "ready": s.ready.load(Ordering::SeqCst),
        "opening": opening,
        "tables": tables,
    }))
    .into_response()
}

async fn metrics(State(s): State<HttpState>, headers: HeaderMap) -> Response {
    if !authorized(&s, &headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    match &s.metrics {
        Some(h) => h.render().into_response(),
        None => (StatusCode::NOT_FOUND, "metrics are not recorded\n").into_response(),
    }
}
