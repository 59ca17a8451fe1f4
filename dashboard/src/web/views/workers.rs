//! The workers view: each stream owner with what its sidecar says, and
//! `/api/workers`.

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde::Serialize;

use crate::model::Snapshot;
use crate::model::SourceHealth;
use crate::model::WorkerRow;
use crate::sources::sidecars::SidecarReport;
use crate::web::Shared;
use crate::web::column::{Column, Kind, Source, Table, Value, col};
use crate::web::page::{Header, TablesPage, html, refresh_ms};
use leasehold_control::lease::LeaseState;

/// The view's routes.
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/workers", get(view))
        .route("/api/workers", get(api))
}

/// `/api/workers` body.
#[derive(Debug, Serialize)]
pub struct WorkersBody<'a> {
    /// Snapshot time, unix ms.
    pub taken_at_ms: i64,
    /// Owners and sidecar-only workers.
    pub workers: &'a [WorkerRow],
    /// Every sidecar polled, with errors.
    pub sidecars: &'a [SidecarReport],
    /// Source health.
    pub sources: &'a [SourceHealth],
}

/// Columns of the workers table.
pub const WORKER_COLUMNS: &[Column<WorkerRow>] = &[
    col("Owner", "owner_id", Kind::Text, |r| {
        Value::text(&r.owner_id)
    }),
    col("Streams held", "streams_held", Kind::Number, |r| {
        r.streams_held.into()
    }),
    col("Of them expired", "streams_expired", Kind::Number, |r| {
        r.streams_expired.into()
    }),
    col("Fence tokens", "tokens", Kind::Tokens, |r| {
        Value::Tokens(&r.tokens)
    }),
    col("Presence", "presence", Kind::Badge, |r| {
        Value::opt(r.presence.map(LeaseState::as_str))
    }),
    col("Worker up", "worker_up", Kind::Badge, |r| {
        Value::opt(r.worker_up)
    }),
    col("Last event", "last_event_age_ms", Kind::AgeMs, |r| {
        Value::opt(r.last_event_age_ms)
    }),
    col("Leases lost", "leases_lost", Kind::Number, |r| {
        Value::opt(r.leases_lost)
    }),
    col("Fenced writes", "sink_events_fenced", Kind::Number, |r| {
        Value::opt(r.sink_events_fenced)
    }),
    col("Component", "component", Kind::Text, |r| {
        Value::opt_text(r.component.as_deref())
    }),
    col("Sidecar", "sidecar_url", Kind::StatusLink, |r| {
        Value::opt_text(r.sidecar_url.as_deref())
    }),
];

/// The workers view.
pub fn page(snapshot: &Snapshot, refresh_ms: u64) -> TablesPage {
    let answered = snapshot
        .sidecars
        .iter()
        .filter(|s| s.status.is_some())
        .count();
    TablesPage {
        header: Header::new("/workers", snapshot, refresh_ms),
        heading: "Workers",
        summary: vec![format!(
            "{} owners; {answered} of {} sidecars answered.",
            snapshot.workers.len(),
            snapshot.sidecars.len()
        )],
        tables: vec![(
            "Leases held per owner, with what its sidecar says",
            Table::build(
                Source {
                    id: "workers",
                    api: "/api/workers",
                    rows_key: "workers",
                    empty: "No worker holds a lease and no sidecar answered.",
                },
                WORKER_COLUMNS,
                &snapshot.workers,
                snapshot.taken_at_ms,
            ),
        )],
    }
}

async fn view(State(state): State<Shared>) -> Response {
    html(page(&state.collector.latest(), refresh_ms(&state)))
}

async fn api(State(state): State<Shared>) -> Response {
    let snapshot = state.collector.latest();
    Json(WorkersBody {
        taken_at_ms: snapshot.taken_at_ms,
        workers: &snapshot.workers,
        sidecars: &snapshot.sidecars,
        sources: &snapshot.sources,
    })
    .into_response()
}
