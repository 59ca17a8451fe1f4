//! The sidecar's HTTP face: `/metrics` (Prometheus), `/healthz`, `/status`.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Json};
use axum::routing::get;

use crate::SidecarState;
use leasehold_telemetry::status::SidecarStatus;

/// Prometheus text exposition format, version 0.0.4.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The router, apart from any listener so tests can drive it directly.
pub fn app(state: Arc<SidecarState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/status", get(status))
        .with_state(state)
}

async fn metrics(State(state): State<Arc<SidecarState>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
        state.render(),
    )
}

/// The sidecar itself is healthy when it answers; worker health is `/status`
/// and `leasehold_worker_up`, so a dead worker does not restart its sidecar.
async fn healthz() -> &'static str {
    "ok\n"
}

async fn status(State(state): State<Arc<SidecarState>>) -> Json<SidecarStatus> {
    Json(SidecarStatus {
        worker: state.view().status(),
        observer: state.is_observer(),
    })
}
