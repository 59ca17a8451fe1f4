//! The anomalies view (the latest maintenance sweep) and `/api/anomalies`.

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde::Serialize;

use crate::model::Snapshot;
use crate::model::SourceHealth;
use crate::web::Shared;
use crate::web::column::{Column, Kind, Source, Table, Value, col};
use crate::web::page::{Header, TablesPage, html, refresh_ms};
use leasehold_pool::read::{AnomalyView, Finding};

/// The view's routes.
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/anomalies", get(view))
        .route("/api/anomalies", get(api))
}

/// `/api/anomalies` body.
#[derive(Debug, Serialize)]
pub struct AnomaliesBody<'a> {
    /// Snapshot time, unix ms.
    pub taken_at_ms: i64,
    /// The latest report.
    pub anomalies: Option<&'a AnomalyView>,
    /// Source health.
    pub sources: &'a [SourceHealth],
}

/// Columns of the findings table.
pub const FINDING_COLUMNS: &[Column<Finding>] = &[
    col("Kind", "kind", Kind::Badge, |r| r.kind.as_str().into()),
    col("User", "user_id", Kind::Text, |r| {
        Value::opt_text(r.user_id.as_deref())
    }),
    col("Mark deleted", "delete_key", Kind::Text, |r| {
        Value::opt_text(r.delete_key.as_deref())
    }),
    col("Task stopped", "stop_task", Kind::Text, |r| {
        Value::opt_text(r.stop_task.as_deref())
    }),
];

/// The anomalies view.
pub fn page(snapshot: &Snapshot, refresh_ms: u64) -> TablesPage {
    let report = snapshot.anomalies.as_ref().and_then(|a| a.report.as_ref());
    let mut summary = Vec::new();
    match (&snapshot.anomalies, report) {
        (None, _) => summary.push("No pool source (start the dashboard with REDIS_URL).".into()),
        (Some(view), None) => summary.push(
            view.unreadable
                .clone()
                .unwrap_or_else(|| "No maintenance sweep has reported yet.".into()),
        ),
        (Some(_), Some(report)) => {
            summary.push(format!(
                "Last sweep {} ago{}: {} marks, {} tasks.",
                crate::web::column::duration_ms(snapshot.taken_at_ms - report.at as i64),
                if report.dry_run { " (dry run)" } else { "" },
                report.marks,
                report.tasks
            ));
            let counts = |map: &std::collections::BTreeMap<_, u64>| {
                map.iter()
                    .map(|(k, n): (&leasehold_telemetry::OrphanKind, &u64)| {
                        format!("{} {n}", k.as_str())
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            summary.push(format!("Found: {}.", counts(&report.found)));
            summary.push(format!("Resolved: {}.", counts(&report.resolved)));
            for error in &report.errors {
                summary.push(format!("Error: {error}"));
            }
        }
    }
    TablesPage {
        header: Header::new("/anomalies", snapshot, refresh_ms),
        heading: "Anomalies (latest maintenance sweep)",
        summary,
        tables: vec![(
            "Findings",
            Table::build(
                Source {
                    id: "findings",
                    api: "/api/anomalies",
                    rows_key: "anomalies.report.findings",
                    empty: "Nothing found.",
                },
                FINDING_COLUMNS,
                report.map(|r| r.findings.as_slice()).unwrap_or_default(),
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
    Json(AnomaliesBody {
        taken_at_ms: snapshot.taken_at_ms,
        anomalies: snapshot.anomalies.as_ref(),
        sources: &snapshot.sources,
    })
    .into_response()
}
