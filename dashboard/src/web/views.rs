//! The pictures: the per-stream page, the ownership timeline and the trends,
//! drawn as SVG by askama templates (no JavaScript charting library), each
//! chart with a text equivalent (an accessible name and a table or summary).

use askama::Template;
use serde::{Deserialize, Serialize};

use crate::collector::Snapshot;
use crate::model::changes::{Change, ChangeLog, FencedWrite};
use crate::model::gaps::{DataGap, GapLog};
use crate::model::streams::{StreamRow, StreamState, Verdict};
use crate::model::timeline::{self, DrawnLane, LANE_HEIGHT, LANES_PER_PAGE};
use crate::model::trends::{Chart, ClusterPoint, StreamPoint, Trends};
use crate::web::pages::{Header, MAX_STREAM_ID_LEN, search_text, stream_href};

/// Time windows the timeline offers: (query value, milliseconds).
pub const WINDOWS: &[(&str, i64)] = &[
    ("5m", 5 * 60_000),
    ("15m", 15 * 60_000),
    ("1h", 3_600_000),
    ("6h", 6 * 3_600_000),
    ("24h", 24 * 3_600_000),
];

/// Query of `/timeline`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct TimelineQuery {
    /// `stream` (default) or `worker`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// One of [`WINDOWS`] (default `15m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    /// Only lanes whose stream id contains this text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q: Option<String>,
    /// 1-based page of lanes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page: Option<usize>,
}

impl TimelineQuery {
    /// The window asked for: (label, ms); 15 minutes unless told.
    pub fn window(&self) -> (&'static str, i64) {
        let asked = self.window.as_deref().unwrap_or("15m");
        WINDOWS
            .iter()
            .copied()
            .find(|(label, _)| *label == asked)
            .unwrap_or(WINDOWS[1])
    }

    /// No window asked for: the window fits the history kept.
    pub fn fitted(&self) -> bool {
        self.window.as_deref().is_none_or(str::is_empty)
    }

    /// Lanes per worker rather than per stream.
    pub fn per_worker(&self) -> bool {
        self.by.as_deref() == Some("worker")
    }
}

/// `/api/timeline` body: the lanes of one page.
#[derive(Debug, Serialize)]
pub struct TimelineBody {
    /// Snapshot time, unix ms (the window's right edge).
    pub taken_at_ms: i64,
    /// Window start, unix ms.
    pub from_ms: i64,
    /// Oldest change kept (how far back the history goes), unix ms.
    pub history_from_ms: Option<i64>,
    /// Lanes matching, over all pages.
    pub total: usize,
    /// This page, 1-based.
    pub page: usize,
    /// Pages in all.
    pub pages: usize,
    /// The lanes.
    pub lanes: Vec<timeline::Lane>,
}

/// The window drawn: as asked, or (by default) the history kept plus a
/// margin, between one and fifteen minutes, so a young dashboard does not
/// squeeze its few changes into the right edge.
fn window_ms(log: &ChangeLog, query: &TimelineQuery, to: i64) -> i64 {
    if !query.fitted() {
        return query.window().1;
    }
    match log.oldest_ms() {
        Some(oldest) => ((to - oldest) * 11 / 10 + 1_000).clamp(60_000, WINDOWS[1].1),
        None => WINDOWS[1].1,
    }
}

/// Builds one page of lanes.
pub fn timeline_body(
    snapshot: &Snapshot,
    log: &ChangeLog,
    gaps: &GapLog,
    query: &TimelineQuery,
) -> TimelineBody {
    let to = snapshot.taken_at_ms;
    let from = to - window_ms(log, query, to);
    let changes = log.since_ref(from);
    let fenced = log.fenced_since(from);
    let search = search_text(query.q.as_deref());
    let window = timeline::Window {
        from_ms: from,
        to_ms: to,
        per_worker: query.per_worker(),
    };
    let page_of = |page: usize| {
        timeline::lane_page(
            &snapshot.streams,
            &changes,
            timeline::Marked {
                fenced: &fenced,
                gaps,
            },
            &window,
            search.as_deref(),
            (page - 1) * LANES_PER_PAGE,
            LANES_PER_PAGE,
        )
    };
    let asked = query.page.unwrap_or(1).max(1);
    let (total, mut lanes) = page_of(asked);
    let pages = total.div_ceil(LANES_PER_PAGE).max(1);
    let page = asked.min(pages);
    if page != asked {
        // Past the last page: show the last one.
        lanes = page_of(page).1;
    }
    TimelineBody {
        taken_at_ms: to,
        from_ms: from,
        history_from_ms: log.oldest_ms(),
        total,
        page,
        pages,
        lanes,
    }
}

/// The timeline view.
#[derive(Template)]
#[template(path = "timeline.html")]
pub struct TimelinePage {
    /// Shared header.
    pub header: Header,
    /// Query as given.
    pub query: TimelineQuery,
    /// Lanes drawn.
    pub lanes: Vec<DrawnLane>,
    /// SVG height.
    pub height: u32,
    /// Axis ticks: (x, label, text-anchor).
    pub ticks: Vec<(String, String, &'static str)>,
    /// Lanes matching, pages, page.
    pub total: usize,
    /// Pages in all.
    pub pages: usize,
    /// This page.
    pub page: usize,
    /// How far back the history goes, in words.
    pub history: String,
    /// Previous/next page links.
    pub prev_link: Option<String>,
    /// Next page link.
    pub next_link: Option<String>,
    /// Window choices: (value, label, selected).
    pub windows: Vec<(&'static str, bool)>,
    /// Lane height.
    pub lane_height: u32,
}

/// Edge ticks hug the inside of the chart so their labels are not cut off.
fn tick_anchor(i: u32, last: u32) -> &'static str {
    match i {
        0 => "start",
        i if i == last => "end",
        _ => "middle",
    }
}

fn history_text(log: &ChangeLog, now_ms: i64) -> String {
    let (count, age_ms) = log.bounds();
    let kept = format!(
        "the dashboard keeps the newest {count} ownership changes of the last {}",
        crate::web::column::duration_ms(age_ms)
    );
    match log.oldest_ms() {
        Some(oldest) if log.truncated() => format!(
            "History goes back {} (older changes were dropped: {kept}).",
            crate::web::column::duration_ms(now_ms - oldest)
        ),
        Some(oldest) => format!(
            "History goes back {}, to the first change seen since the dashboard started ({kept}).",
            crate::web::column::duration_ms(now_ms - oldest)
        ),
        None => format!("No ownership change observed yet ({kept})."),
    }
}

impl TimelinePage {
    /// Builds the view.
    pub fn new(
        snapshot: &Snapshot,
        log: &ChangeLog,
        gaps: &GapLog,
        query: TimelineQuery,
        refresh_ms: u64,
    ) -> TimelinePage {
        let body = timeline_body(snapshot, log, gaps, &query);
        let lanes = timeline::draw(&body.lanes, body.from_ms, body.taken_at_ms);
        let span = body.taken_at_ms - body.from_ms;
        let ticks = (0..=4)
            .map(|i| {
                let x = timeline::WIDTH * f64::from(i) / 4.0;
                let ago = span - span * i64::from(i) / 4;
                let label = if ago == 0 {
                    "now".to_owned()
                } else {
                    format!("−{}", crate::web::column::duration_ms(ago))
                };
                (format!("{x:.1}"), label, tick_anchor(i, 4))
            })
            .collect();
        let link = |to: usize| {
            let mut q = query.clone();
            q.page = Some(to);
            format!(
                "/timeline?{}",
                serde_urlencoded::to_string(&q).unwrap_or_default()
            )
        };
        let window = if query.fitted() { "" } else { query.window().0 };
        TimelinePage {
            header: Header::new("/timeline", snapshot, refresh_ms),
            height: (lanes.len().max(1) as u32) * LANE_HEIGHT,
            lanes,
            ticks,
            total: body.total,
            pages: body.pages,
            page: body.page,
            history: history_text(log, snapshot.taken_at_ms),
            prev_link: (body.page > 1).then(|| link(body.page - 1)),
            next_link: (body.page < body.pages).then(|| link(body.page + 1)),
            windows: WINDOWS.iter().map(|(w, _)| (*w, *w == window)).collect(),
            lane_height: LANE_HEIGHT,
            query,
        }
    }

    /// The search text as typed.
    pub fn search(&self) -> &str {
        self.query.q.as_deref().unwrap_or("")
    }
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
        include_str!("../../../alerts/runbooks/LeaseholdStreamUnowned.md"),
    ),
    (
        "LeaseholdLeaseLost",
        include_str!("../../../alerts/runbooks/LeaseholdLeaseLost.md"),
    ),
    (
        "LeaseholdCheckpointStalled",
        include_str!("../../../alerts/runbooks/LeaseholdCheckpointStalled.md"),
    ),
    (
        "LeaseholdCheckpointLagHigh",
        include_str!("../../../alerts/runbooks/LeaseholdCheckpointLagHigh.md"),
    ),
    (
        "LeaseholdUpstreamSilent",
        include_str!("../../../alerts/runbooks/LeaseholdUpstreamSilent.md"),
    ),
    (
        "LeaseholdLeaseRenewalsFailing",
        include_str!("../../../alerts/runbooks/LeaseholdLeaseRenewalsFailing.md"),
    ),
    (
        "LeaseholdStaleTokenWritesRejected",
        include_str!("../../../alerts/runbooks/LeaseholdStaleTokenWritesRejected.md"),
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
        Verdict::Ok | Verdict::Unknown => {}
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
    Some(StreamDetail {
        taken_at_ms: snapshot.taken_at_ms,
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
        let lane = timeline::draw(&lanes, from, to);
        let ticks = [(0.0, to - from, "start"), (timeline::WIDTH, 0, "end")]
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

    /// The link of this page (for the live refresh).
    pub fn href(&self) -> String {
        stream_href(&self.detail.stream.stream_id)
    }
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
        let series =
            |pick: fn(&ClusterPoint) -> f64| -> Vec<f64> { cluster.iter().map(pick).collect() };
        let (w, h) = (400, 80);
        let charts = vec![
            Chart::line(
                "Lag, all streams (events)",
                " events",
                &series(|p| p.lag_events as f64),
                w,
                h,
            ),
            Chart::line(
                "Largest lag (seconds)",
                " s",
                &series(|p| p.lag_seconds),
                w,
                h,
            ),
            Chart::line(
                "Largest last-event age (seconds)",
                " s",
                &series(|p| p.last_event_age_seconds),
                w,
                h,
            ),
            Chart::line(
                "Longest takeover gap (seconds)",
                " s",
                &series(|p| p.takeover_gap_seconds),
                w,
                h,
            ),
            Chart::line("Takeovers", "", &series(|p| p.takeovers as f64), w, h),
            Chart::line(
                "Idle pool workers",
                "",
                &series(|p| p.pool_idle as f64),
                w,
                h,
            ),
            Chart::line(
                "Claimed users",
                "",
                &series(|p| p.pool_claimed as f64),
                w,
                h,
            ),
            Chart::line(
                "Claims waiting",
                "",
                &series(|p| p.claims_pending as f64),
                w,
                h,
            ),
            Chart::line(
                "Claim latency, median (seconds)",
                " s",
                &series(|p| p.claim_p50_seconds),
                w,
                h,
            ),
            Chart::line(
                "Claim latency, 99th percentile (seconds)",
                " s",
                &series(|p| p.claim_p99_seconds),
                w,
                h,
            ),
            Chart::line("Claims taken", "", &series(|p| p.claims_taken as f64), w, h),
        ];
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

    #[test]
    fn the_default_window_fits_the_history_between_one_and_fifteen_minutes() {
        let log = ChangeLog::new(10);
        let query = TimelineQuery::default();
        assert_eq!(window_ms(&log, &query, 0), 15 * 60_000);
        let asked = TimelineQuery {
            window: Some("1h".into()),
            ..TimelineQuery::default()
        };
        assert_eq!(window_ms(&log, &asked, 0), 3_600_000);
        let bogus = TimelineQuery {
            window: Some("<script>".into()),
            ..TimelineQuery::default()
        };
        assert_eq!(bogus.window(), ("15m", 15 * 60_000));
    }
}
