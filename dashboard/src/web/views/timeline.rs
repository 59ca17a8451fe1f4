//! The ownership timeline: per-stream (or per-worker) lanes of owner bars,
//! gaps, fenced writes and data gaps over a time window, drawn as SVG, and
//! `/api/timeline`.

use askama::Template;
use axum::Router;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde::{Deserialize, Serialize};

use crate::model::Snapshot;
use crate::model::changes::ChangeLog;
use crate::model::gaps::GapLog;
use crate::model::timeline::{self, LANES_PER_PAGE};
use crate::web::Shared;
use crate::web::lanes::{self, DrawnLane, LANE_HEIGHT};
use crate::web::page::{Header, html, refresh_ms};
use crate::web::views::streams::search_text;

/// The view's routes.
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/timeline", get(view))
        .route("/api/timeline", get(api))
}

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
    /// The owners on this page and their colour classes (the legend).
    pub owners: Vec<(String, String)>,
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

/// How far back the ownership history goes, in words.
pub(crate) fn history_text(log: &ChangeLog, now_ms: i64) -> String {
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
        let lanes = lanes::draw(&body.lanes, body.from_ms, body.taken_at_ms);
        let owners = lanes::owner_legend(&body.lanes);
        let span = body.taken_at_ms - body.from_ms;
        let ticks = (0..=4)
            .map(|i| {
                let x = lanes::WIDTH * f64::from(i) / 4.0;
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
            owners,
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

async fn view(State(state): State<Shared>, Query(query): Query<TimelineQuery>) -> Response {
    let snapshot = state.collector.latest();
    let collector = &state.collector;
    let page = collector.with_changes(|log| {
        collector
            .with_gaps(|gaps| TimelinePage::new(&snapshot, log, gaps, query, refresh_ms(&state)))
    });
    html(page)
}

async fn api(State(state): State<Shared>, Query(query): Query<TimelineQuery>) -> Response {
    let snapshot = state.collector.latest();
    let collector = &state.collector;
    let body = collector.with_changes(|log| {
        collector.with_gaps(|gaps| timeline_body(&snapshot, log, gaps, &query))
    });
    Json(body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

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
