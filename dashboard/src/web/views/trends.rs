//! The trends view: cluster charts and per-stream sparklines over the
//! downsampled history, each with a text equivalent, and `/api/trends`.

use askama::Template;
use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde::Serialize;

use crate::model::Snapshot;
use crate::model::streams::StreamRow;
use crate::model::trends::{ClusterPoint, Trends};
use crate::web::Shared;
use crate::web::chart::Chart;
use crate::web::page::{Header, html, refresh_ms, stream_href};

/// The view's routes.
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/trends", get(view))
        .route("/api/trends", get(api))
}

/// `/api/trends` body.
#[derive(Debug, Serialize)]
pub struct TrendsBody {
    /// Snapshot time, unix ms.
    pub taken_at_ms: i64,
    /// Bucket width, ms.
    pub resolution_ms: i64,
    /// (cluster span, per-stream span), ms.
    pub spans_ms: (i64, i64),
    /// The cluster series, oldest first.
    pub cluster: Vec<ClusterPoint>,
}

/// Streams with sparklines on the trends page (the laggiest).
pub const SPARKLINES_SHOWN: usize = 50;

/// A cluster chart: its title, its unit and the reading it plots.
type ClusterChart = (&'static str, &'static str, fn(&ClusterPoint) -> f64);

/// The cluster charts, in page order.
const CLUSTER_CHARTS: &[ClusterChart] = &[
    ("Lag, all streams (events)", " events", |p| {
        p.lag_events as f64
    }),
    ("Largest lag (seconds)", " s", |p| p.lag_seconds),
    ("Largest last-event age (seconds)", " s", |p| {
        p.last_event_age_seconds
    }),
    ("Longest takeover gap (seconds)", " s", |p| {
        p.takeover_gap_seconds
    }),
    ("Takeovers", "", |p| p.takeovers as f64),
    ("Idle pool workers", "", |p| p.pool_idle as f64),
    ("Claimed users", "", |p| p.pool_claimed as f64),
    ("Claims waiting", "", |p| p.claims_pending as f64),
    ("Claim latency, median (seconds)", " s", |p| {
        p.claim_p50_seconds
    }),
    ("Claim latency, 99th percentile (seconds)", " s", |p| {
        p.claim_p99_seconds
    }),
    ("Claims taken", "", |p| p.claims_taken as f64),
];

/// The trends view.
#[derive(Template)]
#[template(path = "trends.html")]
pub struct TrendsPage {
    /// Shared header.
    pub header: Header,
    /// Cluster charts.
    pub charts: Vec<Chart>,
    /// Per-stream sparklines: (stream, href, events chart, seconds chart).
    pub sparklines: Vec<(String, String, Chart, Chart)>,
    /// Resolution and spans, in words.
    pub resolution: String,
    /// Grafana, when the operator has one.
    pub grafana: Option<String>,
}

impl TrendsPage {
    /// Builds the view.
    pub fn new(
        snapshot: &Snapshot,
        trends: &Trends,
        grafana: Option<String>,
        refresh_ms: u64,
    ) -> TrendsPage {
        let cluster = trends.cluster();
        let charts = CLUSTER_CHARTS
            .iter()
            .map(|&(title, unit, reading)| {
                let series: Vec<f64> = cluster.iter().map(reading).collect();
                Chart::line(title, unit, &series, 400, 80)
            })
            .collect();
        let mut laggiest: Vec<&StreamRow> = snapshot
            .streams
            .iter()
            .filter(|r| r.lag_events.is_some())
            .collect();
        laggiest.sort_by(|a, b| {
            b.lag_events
                .cmp(&a.lag_events)
                .then_with(|| a.stream_id.cmp(&b.stream_id))
        });
        let sparklines = laggiest
            .into_iter()
            .take(SPARKLINES_SHOWN)
            .map(|row| {
                let points = trends.stream(&row.stream_id);
                let events: Vec<f64> = points.iter().map(|p| f64::from(p.lag_events)).collect();
                let seconds: Vec<f64> = points.iter().map(|p| f64::from(p.lag_seconds)).collect();
                (
                    row.stream_id.clone(),
                    stream_href(&row.stream_id),
                    Chart::line(
                        format!("{} lag (events)", row.stream_id),
                        " events",
                        &events,
                        120,
                        24,
                    ),
                    Chart::line(
                        format!("{} lag (seconds)", row.stream_id),
                        " s",
                        &seconds,
                        120,
                        24,
                    ),
                )
            })
            .collect();
        let (cluster_span, stream_span) = trends.spans_ms();
        TrendsPage {
            header: Header::new("/trends", snapshot, refresh_ms),
            charts,
            sparklines,
            resolution: format!(
                "One point per {} (several refreshes merge: maxima for lag, ages and gaps, the latest reading for counts); the cluster charts keep {}, each stream {}; kept in memory since the dashboard started.",
                crate::web::column::duration_ms(trends.resolution_ms()),
                crate::web::column::duration_ms(cluster_span),
                crate::web::column::duration_ms(stream_span)
            ),
            grafana,
        }
    }
}

async fn view(State(state): State<Shared>) -> Response {
    let snapshot = state.collector.latest();
    let page = state.collector.with_trends(|trends| {
        TrendsPage::new(&snapshot, trends, state.grafana.clone(), refresh_ms(&state))
    });
    html(page)
}

async fn api(State(state): State<Shared>) -> Response {
    let snapshot = state.collector.latest();
    let body = state.collector.with_trends(|trends| TrendsBody {
        taken_at_ms: snapshot.taken_at_ms,
        resolution_ms: trends.resolution_ms(),
        spans_ms: trends.spans_ms(),
        cluster: trends.cluster(),
    });
    Json(body).into_response()
}
