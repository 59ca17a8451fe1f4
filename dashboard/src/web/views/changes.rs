//! The ownership-changes view (newest first) and `/api/changes`.

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde::Serialize;

use crate::model::Snapshot;
use crate::model::changes::Change;
use crate::web::Shared;
use crate::web::column::{Column, Kind, Source, Table, Value, col};
use crate::web::page::{Header, TablesPage, html, refresh_ms};

/// Ownership changes shown.
pub const CHANGES_SHOWN: usize = 200;

/// The view's routes.
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/changes", get(view))
        .route("/api/changes", get(api))
}

/// `/api/changes` body.
#[derive(Debug, Serialize)]
pub struct ChangesBody<'a> {
    /// Snapshot time, unix ms.
    pub taken_at_ms: i64,
    /// Newest first.
    pub changes: &'a [Change],
}

/// Columns of the ownership-change timeline.
pub const CHANGE_COLUMNS: &[Column<Change>] = &[
    col("When", "at_ms", Kind::Ago, |r| r.at_ms.into()),
    col("Stream", "stream_id", Kind::StreamLink, |r| {
        Value::text(&r.stream_id)
    }),
    col("Change", "kind", Kind::Badge, |r| r.kind.as_str().into()),
    col("Old owner", "old_owner", Kind::Text, |r| {
        Value::opt_text(r.old_owner.as_deref())
    }),
    col("New owner", "new_owner", Kind::Text, |r| {
        Value::opt_text(r.new_owner.as_deref())
    }),
    col("Fence token", "fence_token", Kind::Number, |r| {
        r.fence_token.into()
    }),
    col("Gap", "gap_seconds", Kind::Seconds, |r| {
        Value::opt(r.gap_seconds)
    }),
    col("Missed steps", "missed", Kind::Number, |r| r.missed.into()),
];

/// The ownership changes, newest first.
pub fn page(snapshot: &Snapshot, changes: &[Change], refresh_ms: u64) -> TablesPage {
    TablesPage {
        header: Header::new("/changes", snapshot, refresh_ms),
        heading: "Ownership changes",
        summary: vec![
            "Takeovers, hand-offs and releases the dashboard observed since it started, newest first."
                .into(),
        ],
        tables: vec![(
            "Takeovers, hand-offs and releases",
            Table::build(Source { id: "changes", api: "/api/changes", rows_key: "changes", empty: "No ownership change observed yet." }, CHANGE_COLUMNS, changes, snapshot.taken_at_ms),
        )],
    }
}
async fn view(State(state): State<Shared>) -> Response {
    let changes = state.collector.changes(CHANGES_SHOWN);
    html(page(
        &state.collector.latest(),
        &changes,
        refresh_ms(&state),
    ))
}

async fn api(State(state): State<Shared>) -> Response {
    let snapshot = state.collector.latest();
    let changes = state.collector.changes(CHANGES_SHOWN);
    Json(ChangesBody {
        taken_at_ms: snapshot.taken_at_ms,
        changes: &changes,
    })
    .into_response()
}
