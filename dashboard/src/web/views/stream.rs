//! The per-stream page: the record, its problems with their runbooks, what
//! each sidecar says, the owner history, data gaps, its timeline lane and
//! lag sparklines; `/api/streams/{id}`, and the runbooks it links to.

use askama::Template;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde::Serialize;

use crate::model::Snapshot;
use crate::model::changes::{Change, ChangeLog, FencedWrite};
use crate::model::connections::ConnectionRow;
use crate::model::gaps::{DataGap, GapLog};
use crate::model::streams::{MAX_STREAM_ID_LEN, StreamRow, StreamState, Verdict};
use crate::model::timeline;
use crate::model::trends::{StreamPoint, Trends};
use crate::web::chart::Chart;
use crate::web::lanes::{self, DrawnLane, LANE_HEIGHT};
use crate::web::page::{Header, html, refresh_ms, stream_href};
use crate::web::views::timeline::history_text;
use crate::web::{DashboardState, Shared};

/// The view's routes.
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/streams/{id}", get(view))
        .route("/api/streams/{id}", get(api))
        .route("/runbooks/{name}", get(runbook))
}

/// A problem on the per-stream page, with the runbook that treats it.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    /// What is wrong, in words.
    pub text: String,
    /// Runbook name (served at `/runbooks/{name}`).
    pub runbook: &'static str,
}

/// The runbooks the dashboard serves (from `alerts/runbooks/`, compiled in so
/// the links work offline).
pub const RUNBOOKS: &[(&str, &str)] = &[
    (
        "LeaseholdStreamUnowned",
        include_str!("../../../../alerts/runbooks/LeaseholdStreamUnowned.md"),
    ),
    (
        "LeaseholdStreamDataGaps",
        include_str!("../../../../alerts/runbooks/LeaseholdStreamDataGaps.md"),
    ),
    (
        "LeaseholdLeaseLost",
        include_str!("../../../../alerts/runbooks/LeaseholdLeaseLost.md"),
    ),
    (
        "LeaseholdCheckpointStalled",
        include_str!("../../../../alerts/runbooks/LeaseholdCheckpointStalled.md"),
    ),
    (
        "LeaseholdCheckpointLagHigh",
        include_str!("../../../../alerts/runbooks/LeaseholdCheckpointLagHigh.md"),
    ),
    (
        "LeaseholdUpstreamSilent",
        include_str!("../../../../alerts/runbooks/LeaseholdUpstreamSilent.md"),
    ),
    (
        "LeaseholdLeaseRenewalsFailing",
        include_str!("../../../../alerts/runbooks/LeaseholdLeaseRenewalsFailing.md"),
    ),
    (
        "LeaseholdStaleTokenWritesRejected",
        include_str!("../../../../alerts/runbooks/LeaseholdStaleTokenWritesRejected.md"),
    ),
];

/// What is wrong with a stream, each with its runbook.
pub fn problems(row: &StreamRow, fenced: &[FencedWrite]) -> Vec<Problem> {
    let mut out = Vec::new();
    let mut add = |text: String, runbook| out.push(Problem { text, runbook });
    match row.state {
        StreamState::Unowned => add(
            "Nobody holds this stream: no worker is reading it.".into(),
            "LeaseholdStreamUnowned",
        ),
        StreamState::Expired => add(
            "The owner's lease ran out: it crashed, froze or lost the table.".into(),
            "LeaseholdLeaseLost",
        ),
        StreamState::Expiring => add(
            "A renew is overdue: the lease runs out soon unless renewed.".into(),
            "LeaseholdLeaseRenewalsFailing",
        ),
        StreamState::Malformed => add(
            format!(
                "The record cannot be read ({}).",
                row.problem.as_deref().unwrap_or("unknown")
            ),
            "LeaseholdStreamUnowned",
        ),
        StreamState::Owned => {}
    }
    match row.verdict {
        Verdict::Stalled => add(
            "Behind, and the checkpoint has not moved over the verdict window.".into(),
            "LeaseholdCheckpointStalled",
        ),
        Verdict::Lagging => add(
            "The checkpoint moves but the lag grew over the whole window.".into(),
            "LeaseholdCheckpointLagHigh",
        ),
        Verdict::Stopped => add(
            "No checkpoint for longer than the stop window.".into(),
            "LeaseholdUpstreamSilent",
        ),
        Verdict::LostData => add(
            "Events were lost in the last 10 minutes: the sink holds gap markers where they are missing.".into(),
            "LeaseholdStreamDataGaps",
        ),
        // Listed with the state above (unowned or expired).
        Verdict::Unowned | Verdict::Ok | Verdict::Unknown => {}
    }
    let refused: u64 = fenced.iter().map(|f| f.writes).sum();
    if refused > 0 {
        add(
            format!(
                "{refused} write(s) by a previous owner were refused by the sink's fence (a zombie after a pause)."
            ),
            "LeaseholdStaleTokenWritesRejected",
        );
    }
    out
}

/// What one sidecar says about the stream.
#[derive(Debug, Clone, Serialize)]
pub struct SidecarView {
    /// Sidecar base URL.
    pub url: String,
    /// The worker behind it.
    pub owner_id: Option<String>,
    /// Fence token it holds the stream with, if it holds it.
    pub held_token: Option<u64>,
    /// Its lease expiry as the worker sees it, unix ms.
    pub held_expires_at_ms: Option<i64>,
    /// Events received but not yet persisted.
    pub lag_events: Option<u64>,
    /// Age of the oldest unpersisted event, seconds.
    pub lag_seconds: Option<f64>,
    /// Seconds since the last event arrived.
    pub last_event_age_seconds: Option<f64>,
}

/// `/api/streams/{id}` body.
#[derive(Debug, Serialize)]
pub struct StreamDetail {
    /// Snapshot time, unix ms.
    pub taken_at_ms: i64,
    /// The record.
    pub stream: StreamRow,
    /// Owner history, oldest first (as far back as the history goes).
    pub owners: Vec<Change>,
    /// Fenced writes attributed to this stream.
    pub fenced: Vec<FencedWrite>,
    /// What the sidecars report for it.
    pub sidecars: Vec<SidecarView>,
    /// Problems with their runbooks.
    pub problems: Vec<Problem>,
    /// Lag samples, oldest first.
    pub trend: Vec<StreamPoint>,
    /// Data gaps the sidecars reported for it, newest first (the newest
    /// [`crate::model::gaps::GAPS_PER_STREAM`] since the dashboard started).
    pub gaps: Vec<DataGap>,
    /// The sink's last stored sequence (read by the handler, when configured).
    pub sink: crate::sources::sink::SinkPosition,
    /// Backfills of this stream the sidecars still list, newest first:
    /// (worker, record). Many pages or `gap` results say the stream is close
    /// to falling off its history.
    pub backfills: Vec<(Option<String>, leasehold_telemetry::status::BackfillSample)>,
    /// The owner's upstream connection carrying it, when its sidecar lists it.
    pub connection: Option<ConnectionRow>,
}

/// Looks one stream up; `None` for an unknown (or absurdly long) id.
pub fn stream_detail(
    snapshot: &Snapshot,
    log: &ChangeLog,
    trends: &Trends,
    gaps: &GapLog,
    id: &str,
) -> Option<StreamDetail> {
    if id.len() > MAX_STREAM_ID_LEN {
        return None;
    }
    let index = snapshot
        .streams
        .binary_search_by(|row| row.stream_id.as_str().cmp(id))
        .ok()?;
    let row = snapshot.streams[index].clone();
    let fenced: Vec<FencedWrite> = log
        .fenced_since(i64::MIN)
        .into_iter()
        .filter(|f| f.streams.iter().any(|s| s == id))
        .collect();
    let sidecars = snapshot
        .sidecars
        .iter()
        .filter_map(|report| {
            let status = report.status.as_ref()?;
            let held = status.leases.iter().find(|l| l.stream_id == id);
            let lag = status.lag.get(id);
            if held.is_none() && lag.is_none() {
                return None;
            }
            Some(SidecarView {
                url: report.url.clone(),
                owner_id: status.owner_id.clone(),
                held_token: held.map(|l| l.fence_token),
                held_expires_at_ms: held.map(|l| l.expires_at_ms),
                lag_events: lag.map(|l| l.lag_events),
                lag_seconds: lag.map(|l| l.lag_seconds),
                last_event_age_seconds: lag.and_then(|l| l.last_event_age_seconds),
            })
        })
        .collect();
    let mut backfills: Vec<_> = snapshot
        .sidecars
        .iter()
        .filter_map(|report| report.status.as_ref())
        .flat_map(|status| {
            status
                .backfills
                .iter()
                .filter(|b| b.stream_id == id)
                .map(|b| (status.owner_id.clone(), b.clone()))
        })
        .collect();
    backfills.sort_by_key(|(_, b)| b.age_ms);
    let connection = row
        .owner_id
        .as_deref()
        .zip(row.upstream_connection)
        .and_then(|(owner, id)| snapshot.connections.find(owner, id))
        .cloned();
    Some(StreamDetail {
        connection,
        taken_at_ms: snapshot.taken_at_ms,
        backfills,
        problems: problems(&row, &fenced),
        owners: log.for_stream(id),
        fenced,
        sidecars,
        trend: trends.stream(id),
        gaps: gaps.for_stream(id),
        stream: row,
        sink: crate::sources::sink::SinkPosition::NotConfigured,
    })
}

/// The per-stream page.
#[derive(Template)]
#[template(path = "stream.html")]
pub struct StreamDetailPage {
    /// Shared header.
    pub header: Header,
    /// The data.
    pub detail: StreamDetail,
    /// Owner history, newest first, with times in words.
    pub owners: Vec<(String, Change)>,
    /// Data gaps, newest first, with times in words.
    pub gaps: Vec<(String, DataGap)>,
    /// What the dashboard keeps of data gaps, in words.
    pub gaps_kept: String,
    /// The stream's timeline lane over its history.
    pub lane: Vec<DrawnLane>,
    /// Timeline axis: (x, label, text-anchor).
    pub ticks: Vec<(String, String, &'static str)>,
    /// The owners on the lane and their colour classes (the legend).
    pub legend: Vec<(String, String)>,
    /// Lag sparklines.
    pub charts: Vec<Chart>,
    /// How far back the history goes.
    pub history: String,
    /// Lane height.
    pub lane_height: u32,
}

impl StreamDetailPage {
    /// Builds the page.
    pub fn new(
        snapshot: &Snapshot,
        log: &ChangeLog,
        gaps: &GapLog,
        detail: StreamDetail,
        refresh_ms: u64,
    ) -> StreamDetailPage {
        let to = snapshot.taken_at_ms;
        let from = detail
            .owners
            .first()
            .map(|c| c.at_ms - (to - c.at_ms) / 10 - 1_000)
            .unwrap_or(to - 15 * 60_000)
            .min(to - 60_000);
        let owners_ref: Vec<Change> = detail.owners.clone();
        let lanes = timeline::lanes(
            std::slice::from_ref(&detail.stream),
            &owners_ref,
            &detail.fenced,
            gaps,
            from,
            to,
            false,
        );
        let lane = lanes::draw(&lanes, from, to);
        let owner_legend = lanes::owner_legend(&lanes);
        let ticks = [(0.0, to - from, "start"), (lanes::WIDTH, 0, "end")]
            .iter()
            .map(|(x, ago, anchor)| {
                (
                    format!("{x:.1}"),
                    if *ago == 0 {
                        "now".to_owned()
                    } else {
                        format!("−{}", crate::web::column::duration_ms(*ago))
                    },
                    *anchor,
                )
            })
            .collect();
        let events: Vec<f64> = detail
            .trend
            .iter()
            .map(|p| f64::from(p.lag_events))
            .collect();
        let seconds: Vec<f64> = detail
            .trend
            .iter()
            .map(|p| f64::from(p.lag_seconds))
            .collect();
        let owners = detail
            .owners
            .iter()
            .rev()
            .map(|c| {
                (
                    format!("{} ago", crate::web::column::duration_ms(to - c.at_ms)),
                    c.clone(),
                )
            })
            .collect();
        let (per_stream, kept) = gaps.bounds();
        let gaps_kept = format!(
            "Ranges of sequences that will never reach the sink, as the workers' sidecars reported them since the dashboard started, newest first (it keeps the newest {per_stream} per stream and {kept} in all)."
        );
        let gaps = detail
            .gaps
            .iter()
            .map(|g| {
                (
                    format!("{} ago", crate::web::column::duration_ms(to - g.at_ms)),
                    g.clone(),
                )
            })
            .collect();
        StreamDetailPage {
            header: Header::new("/streams", snapshot, refresh_ms),
            owners,
            gaps,
            gaps_kept,
            lane,
            ticks,
            legend: owner_legend,
            charts: vec![
                Chart::line("Lag (events)", " events", &events, 240, 40),
                Chart::line("Lag (seconds)", " s", &seconds, 240, 40),
            ],
            history: history_text(log, to),
            lane_height: LANE_HEIGHT,
            detail,
        }
    }

    /// Link back to the streams view, searching for this stream.
    pub fn search_link(&self) -> String {
        format!(
            "/streams?{}",
            serde_urlencoded::to_string([("q", self.detail.stream.stream_id.as_str())])
                .unwrap_or_default()
        )
    }

    /// Milliseconds ago, in words.
    pub fn ended_ago(age_ms: &u64) -> String {
        format!(
            "{} ago",
            crate::web::column::duration_ms(i64::try_from(*age_ms).unwrap_or(i64::MAX))
        )
    }

    /// Text or `—`.
    pub fn or_none<T: std::fmt::Display>(value: &Option<T>) -> String {
        value
            .as_ref()
            .map(|v| v.to_string())
            .unwrap_or_else(|| "—".to_owned())
    }

    /// Seconds with one decimal, or `—`.
    pub fn secs(value: &Option<f64>) -> String {
        value
            .map(|v| format!("{v:.1} s"))
            .unwrap_or_else(|| "—".to_owned())
    }

    /// Which of the owner's connections carries the stream, in words.
    pub fn connection_text(&self) -> String {
        let stream = &self.detail.stream;
        match (&self.detail.connection, stream.upstream_connection) {
            (Some(c), _) => format!(
                "#{} of {}: {} stream{} on it, opened {} ago{}",
                c.connection,
                c.owner_id,
                c.streams,
                if c.streams == 1 { "" } else { "s" },
                crate::web::column::duration_ms(self.detail.taken_at_ms - c.opened_at_ms),
                match c.replacements {
                    0 => String::new(),
                    n => format!(", replaced {n}× before its age"),
                }
            ),
            // Carried by a connection its sidecar does not list (past the
            // oldest it lists).
            (None, Some(id)) => format!("#{id} (not listed by its sidecar)"),
            (None, None) => "—".to_owned(),
        }
    }

    /// The link of this page (for the live refresh).
    pub fn href(&self) -> String {
        stream_href(&self.detail.stream.stream_id)
    }
}

async fn view(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    let Some(detail) = stream_with_sink(&state, &id).await else {
        return not_found();
    };
    let snapshot = state.collector.latest();
    let collector = &state.collector;
    html(collector.with_changes(|log| {
        collector.with_gaps(|gaps| {
            StreamDetailPage::new(&snapshot, log, gaps, detail, refresh_ms(&state))
        })
    }))
}

async fn api(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    match stream_with_sink(&state, &id).await {
        Some(detail) => Json(detail).into_response(),
        None => not_found(),
    }
}

/// One stream's detail, with the sink's position read (bounded) when a sink
/// is configured; `None` for an unknown id, which is never sent to the sink.
async fn stream_with_sink(state: &DashboardState, id: &str) -> Option<StreamDetail> {
    let snapshot = state.collector.latest();
    // Locks in the collector's order: changes, trends, gaps.
    let collector = &state.collector;
    let mut detail = collector.with_changes(|log| {
        collector.with_trends(|trends| {
            collector.with_gaps(|gaps| stream_detail(&snapshot, log, trends, gaps, id))
        })
    })?;
    detail.sink = crate::sources::sink::position(state.sink.as_ref(), id).await;
    Some(detail)
}

/// A 404 that never echoes the (untrusted) id asked for.
fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "no such stream\n").into_response()
}

async fn runbook(Path(name): Path<String>) -> Response {
    match RUNBOOKS.iter().find(|(known, _)| *known == name) {
        Some((_, text)) => {
            ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], *text).into_response()
        }
        None => (StatusCode::NOT_FOUND, "no such runbook\n").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str) -> StreamRow {
        StreamRow::unowned(id)
    }

    #[test]
    fn ids_beyond_the_bound_are_not_looked_up_and_unknown_ids_are_none() {
        let long = "s".repeat(MAX_STREAM_ID_LEN + 1);
        let mut snapshot = Snapshot::empty(0);
        snapshot.streams = vec![row("a"), row(&long)];
        let log = ChangeLog::new(10);
        let trends = Trends::new(1_000);
        let gaps = GapLog::default();
        assert!(stream_detail(&snapshot, &log, &trends, &gaps, "a").is_some());
        assert!(stream_detail(&snapshot, &log, &trends, &gaps, "b").is_none());
        assert!(
            stream_detail(&snapshot, &log, &trends, &gaps, &long).is_none(),
            "an id longer than the bound is refused before any lookup"
        );
        let detail = stream_detail(&snapshot, &log, &trends, &gaps, "a").unwrap();
        assert_eq!(detail.problems[0].runbook, "LeaseholdStreamUnowned");
    }

    /// Backfills the sidecars list show on the stream page, newest first,
    /// with their result, pages, events and time.
    #[test]
    fn the_stream_page_lists_the_backfills_sidecars_report() {
        let mut snapshot = Snapshot::empty(100_000);
        snapshot.streams = vec![row("a")];
        let status: crate::sources::sidecars::KeptStatus = serde_json::from_value(serde_json::json!({
            "owner_id": "w1", "worker_up": true, "leases": [], "lag": {}, "observer": false,
            "backfills": [
                {"age_ms": 90000, "stream_id": "a", "result": "filled", "pages": 2, "events": 180, "seconds": 0.4},
                {"age_ms": 5000, "stream_id": "a", "result": "gap", "pages": 9, "events": 25, "seconds": 12.5},
                {"age_ms": 1000, "stream_id": "other", "result": "filled", "pages": 1, "events": 1, "seconds": 0.1}
            ]
        }))
        .unwrap();
        snapshot.sidecars = vec![crate::sources::sidecars::SidecarReport {
            url: "http://10.0.0.1:9464".into(),
            status: Some(status),
            error: None,
        }];
        let (log, trends, gaps) = (ChangeLog::new(10), Trends::new(1_000), GapLog::default());
        let detail = stream_detail(&snapshot, &log, &trends, &gaps, "a").unwrap();
        let results: Vec<_> = detail
            .backfills
            .iter()
            .map(|(_, b)| b.result.as_str())
            .collect();
        assert_eq!(results, ["gap", "filled"], "this stream's, newest first");
        let page = StreamDetailPage::new(&snapshot, &log, &gaps, detail, 2_000)
            .render()
            .unwrap();
        let table = page.split("id=\"stream-backfills\"").nth(1).unwrap();
        for needle in [
            "badge-backfill-gap",
            "<td>9</td>",
            "<td>25</td>",
            "12.5 s",
            "5.0 s ago",
            "w1",
        ] {
            assert!(table.contains(needle), "{needle:?} in {table}");
        }
    }

    #[test]
    fn the_stream_page_lists_data_gaps_newest_first_or_says_none() {
        use leasehold_telemetry::labels::GapReason;
        let mut snapshot = Snapshot::empty(100_000);
        snapshot.streams = vec![row("a"), row("quiet")];
        let log = ChangeLog::new(10);
        let trends = Trends::new(1_000);
        let mut gaps = GapLog::default();
        for (at_ms, from_seq, to_seq, reason) in [
            (40_000, 10, 19, GapReason::Retention),
            (90_000, 500, 500, GapReason::SinkLost),
        ] {
            gaps.record(
                "a",
                DataGap {
                    at_ms,
                    from_seq,
                    to_seq,
                    missing: to_seq - from_seq + 1,
                    reason,
                    worker: Some("<i>w1</i>".into()),
                },
            );
        }
        let detail = stream_detail(&snapshot, &log, &trends, &gaps, "a").unwrap();
        let json = serde_json::to_value(&detail).unwrap();
        assert_eq!(json["gaps"][0]["from_seq"], 500, "newest first");
        assert_eq!(json["gaps"][0]["reason"], "sink_lost");
        assert_eq!(json["gaps"][1]["missing"], 10);
        assert_eq!(json["gaps"][1]["worker"], "<i>w1</i>");
        let page = StreamDetailPage::new(&snapshot, &log, &gaps, detail, 2_000)
            .render()
            .unwrap();
        let table = page.split("id=\"stream-gaps\"").nth(1).unwrap();
        let newest = table.find("500–500").unwrap();
        let older = table.find("10–19").unwrap();
        assert!(newest < older, "{table}");
        for needle in [
            "<td>10.0 s ago</td>",
            "<td>1 m 0 s ago</td>",
            "<td>10</td>",
            "badge badge-gap-retention",
            "badge badge-gap-sink_lost",
            "&#60;i&#62;w1&#60;/i&#62;",
        ] {
            assert!(table.contains(needle), "{needle:?} in {table}");
        }
        assert!(!page.contains("<i>w1"), "the worker id is text");
        assert!(page.contains("class=\"data-gap\""), "marked on the lane");
        let quiet = stream_detail(&snapshot, &log, &trends, &gaps, "quiet").unwrap();
        assert!(quiet.gaps.is_empty());
        let page = StreamDetailPage::new(&snapshot, &log, &gaps, quiet, 2_000)
            .render()
            .unwrap();
        assert!(page.contains("None recorded"), "{page}");
        assert!(!page.contains("class=\"data-gap\""));
    }
}
