//! The streams view: filtering, search, sorting and paging over every stream
//! record, and `/api/streams` with the same query.

use askama::Template;
use axum::Router;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde::{Deserialize, Serialize};

use crate::model::gaps::GapTally;
use crate::model::streams::{StreamRow, StreamState};
use crate::model::{Snapshot, SourceHealth};
use crate::web::Shared;
use crate::web::column::{Column, Kind, Source, Table, Value, col};
use crate::web::page::{Header, html, refresh_ms};
use leasehold_telemetry::labels::GapReason;

/// Streams per page unless asked otherwise.
pub const DEFAULT_PER_PAGE: usize = 100;
/// Largest page (a whole 10,000-stream cluster on one page).
pub const MAX_PER_PAGE: usize = 10_000;
/// Query of the streams view and `/api/streams`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct StreamQuery {
    /// Only this owner (exact match).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Only this state (`owned`, `expiring`, `expired`, `unowned`, `malformed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Data gaps: `some` (streams with any), `none` (without), or a reason
    /// (`no_replay`, `retention`, `backfill_exhausted`, `sink_lost`: streams
    /// with a gap of that reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gaps: Option<String>,
    /// `stream` (default), `lag`, `token`, `expires`, `gaps` (most data gaps
    /// first) or `last_gap` (newest data gap first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sort: Option<String>,
    /// 1-based page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page: Option<usize>,
    /// Rows per page (at most 10,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_page: Option<usize>,
    /// Search: stream ids containing this text (case-insensitive); ids
    /// starting with it come first. At most [`MAX_SEARCH_LEN`] bytes are used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q: Option<String>,
}

/// Longest search text used (longer text is cut at a character boundary).
pub const MAX_SEARCH_LEN: usize = 200;
/// The search text as used: trimmed, bounded, lower-cased; none when empty.
pub fn search_text(q: Option<&str>) -> Option<String> {
    let q = q?.trim();
    if q.is_empty() {
        return None;
    }
    let mut end = q.len().min(MAX_SEARCH_LEN);
    while !q.is_char_boundary(end) {
        end -= 1;
    }
    Some(q[..end].to_lowercase())
}

/// Whether `id` matches the search: 2 = prefix, 1 = substring, 0 = no.
fn search_rank(id: &str, q: &str) -> u8 {
    // Ids are mostly ASCII: avoid allocating for the common case.
    if id.is_ascii() && q.is_ascii() {
        let bytes = id.as_bytes();
        if bytes.len() >= q.len() && bytes[..q.len()].eq_ignore_ascii_case(q.as_bytes()) {
            return 2;
        }
        let found = bytes
            .windows(q.len().max(1))
            .any(|w| w.eq_ignore_ascii_case(q.as_bytes()));
        return u8::from(found && !q.is_empty());
    }
    let id = id.to_lowercase();
    if id.starts_with(q) {
        2
    } else {
        u8::from(id.contains(q))
    }
}

/// Whether a stream's gaps pass the `gaps` filter (an unknown value passes
/// everything, like an unknown state).
fn gaps_match(tally: Option<&GapTally>, filter: &str) -> bool {
    match filter {
        "some" => tally.is_some(),
        "none" => tally.is_none(),
        reason => {
            GapReason::parse(reason).is_none_or(|r| tally.is_some_and(|t| t.with_reason(r) > 0))
        }
    }
}

/// The `gaps` filter's choices: (value, label).
pub fn gap_filters() -> Vec<(&'static str, String)> {
    let mut choices = vec![
        ("some", "with data gaps".to_owned()),
        ("none", "without data gaps".to_owned()),
    ];
    choices.extend(
        GapReason::RECORDED
            .iter()
            .map(|r| (r.as_str(), format!("with a {} gap", r.as_str()))),
    );
    choices
}

/// One page of streams.
#[derive(Debug, Serialize)]
pub struct StreamPage<'a> {
    /// Snapshot time, unix ms.
    pub taken_at_ms: i64,
    /// Streams matching the filter.
    pub total: usize,
    /// This page, 1-based.
    pub page: usize,
    /// Pages in all (at least 1).
    pub pages: usize,
    /// Rows per page.
    pub per_page: usize,
    /// The rows.
    pub streams: Vec<&'a StreamRow>,
    /// Streams by state over the whole table (the header's counts).
    pub counts: std::collections::BTreeMap<&'static str, usize>,
    /// Source health.
    pub sources: &'a [SourceHealth],
}

/// Applies the query to a snapshot.
pub fn stream_page<'a>(snapshot: &'a Snapshot, query: &StreamQuery) -> StreamPage<'a> {
    let state = query.state.as_deref().and_then(StreamState::parse);
    let owner = query.owner.as_deref().filter(|o| !o.is_empty());
    let search = search_text(query.q.as_deref());
    let gaps = query.gaps.as_deref().filter(|g| !g.is_empty());
    let mut rows: Vec<&StreamRow> = snapshot
        .streams
        .iter()
        .filter(|row| state.is_none_or(|s| row.state == s))
        .filter(|row| owner.is_none_or(|o| row.owner_id.as_deref() == Some(o)))
        .filter(|row| gaps.is_none_or(|g| gaps_match(row.gaps.as_ref(), g)))
        .filter(|row| {
            search
                .as_deref()
                .is_none_or(|q| search_rank(&row.stream_id, q) > 0)
        })
        .collect();
    if let Some(q) = search.as_deref()
        && query.sort.as_deref().unwrap_or("stream") == "stream"
    {
        // Prefix matches first, each group still in id order (stable sort).
        rows.sort_by_key(|row| std::cmp::Reverse(search_rank(&row.stream_id, q)));
    }
    match query.sort.as_deref() {
        Some("lag") => rows.sort_by(|a, b| {
            b.lag_events.cmp(&a.lag_events).then_with(|| {
                b.lag_seconds
                    .unwrap_or(0.0)
                    .total_cmp(&a.lag_seconds.unwrap_or(0.0))
            })
        }),
        Some("token") => rows.sort_by_key(|row| std::cmp::Reverse(row.fence_token)),
        // Streams without a gap (`None`) last.
        Some("gaps") => {
            rows.sort_by_key(|row| std::cmp::Reverse(row.gaps.map(|g| (g.count, g.last.at_ms))))
        }
        Some("last_gap") => {
            rows.sort_by_key(|row| std::cmp::Reverse(row.gaps.map(|g| g.last.at_ms)))
        }
        Some("expires") => rows.sort_by_key(|row| match row.lease_expires_at_ms {
            0 => i64::MAX,
            at => at,
        }),
        _ => {} // the snapshot is sorted by stream id
    }
    let per_page = query
        .per_page
        .unwrap_or(DEFAULT_PER_PAGE)
        .clamp(1, MAX_PER_PAGE);
    let total = rows.len();
    let pages = total.div_ceil(per_page).max(1);
    let page = query.page.unwrap_or(1).clamp(1, pages);
    let streams = rows
        .into_iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .collect();
    StreamPage {
        taken_at_ms: snapshot.taken_at_ms,
        total,
        page,
        pages,
        per_page,
        streams,
        counts: snapshot.state_counts(),
        sources: &snapshot.sources,
    }
}

/// The view's routes.
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/streams", get(view))
        .route("/api/streams", get(api))
}

/// Columns of the streams table.
pub const STREAM_COLUMNS: &[Column<StreamRow>] = &[
    col("Stream", "stream_id", Kind::StreamLink, |r| {
        Value::text(&r.stream_id)
    }),
    col("State", "state", Kind::Badge, |r| r.state.as_str().into()),
    col("Owner", "owner_id", Kind::Text, |r| {
        Value::opt_text(r.owner_id.as_deref())
    }),
    col("Fence token", "fence_token", Kind::Number, |r| {
        r.fence_token.into()
    }),
    col(
        "Lease expires",
        "lease_expires_at_ms",
        Kind::Countdown,
        |r| r.lease_expires_at_ms.into(),
    ),
    col("Checkpoint", "checkpoint", Kind::Number, |r| {
        Value::opt(r.checkpoint)
    }),
    col("Lag (events)", "lag_events", Kind::Number, |r| {
        Value::opt(r.lag_events)
    }),
    col("Lag", "lag_seconds", Kind::Seconds, |r| {
        Value::opt(r.lag_seconds)
    }),
    col("Last event", "last_event_age_seconds", Kind::Seconds, |r| {
        Value::opt(r.last_event_age_seconds)
    }),
    col("Last checkpoint", "checkpoint_at_ms", Kind::Ago, |r| {
        Value::opt(r.checkpoint_at_ms)
    }),
    col(
        "Last ownership change",
        "last_change_at_ms",
        Kind::Ago,
        |r| Value::opt(r.last_change_at_ms),
    ),
    col("Data gaps", "gaps.count", Kind::Number, |r| {
        Value::opt(r.gaps.map(|g| g.count))
    }),
    col("Last data gap", "gaps.last", Kind::Gap, |r| {
        r.gaps.as_ref().map_or(Value::None, |g| Value::Gap(&g.last))
    }),
    col("Verdict", "verdict", Kind::Badge, |r| {
        r.verdict.as_str().into()
    }),
    col("Problem", "problem", Kind::Text, |r| {
        Value::opt_text(r.problem.as_deref())
    }),
];

/// The streams view.
#[derive(Template)]
#[template(path = "streams.html")]
pub struct StreamsPage {
    /// Shared header.
    pub header: Header,
    /// The table.
    pub table: Table,
    /// Query as given (for the form and page links).
    pub query: StreamQuery,
    /// Owners for the filter.
    pub owners: Vec<String>,
    /// States for the filter.
    pub states: Vec<&'static str>,
    /// Data-gap choices for the filter: (value, label).
    pub gap_filters: Vec<(&'static str, String)>,
    /// Page numbers.
    pub page: usize,
    /// Pages in all.
    pub pages: usize,
    /// Rows matching.
    pub total: usize,
    /// Link to the previous page, if any.
    pub prev_link: Option<String>,
    /// Link to the next page, if any.
    pub next_link: Option<String>,
}

impl StreamsPage {
    /// Builds the view of one page.
    pub fn new(snapshot: &Snapshot, query: StreamQuery, refresh_ms: u64) -> StreamsPage {
        let page = stream_page(snapshot, &query);
        let mut owners: Vec<String> = snapshot
            .streams
            .iter()
            .filter_map(|r| r.owner_id.clone())
            .collect();
        owners.sort();
        owners.dedup();
        let link = |to: usize| {
            let mut q = query.clone();
            q.page = Some(to);
            format!("/streams?{}", encode(&q))
        };
        StreamsPage {
            header: Header::new("/streams", snapshot, refresh_ms),
            table: Table::build(
                Source {
                    id: "streams",
                    api: "/api/streams",
                    rows_key: "streams",
                    empty: "No streams match.",
                },
                STREAM_COLUMNS,
                page.streams.iter().copied(),
                snapshot.taken_at_ms,
            ),
            owners,
            states: StreamState::ALL.iter().map(|s| s.as_str()).collect(),
            gap_filters: gap_filters(),
            prev_link: (page.page > 1).then(|| link(page.page - 1)),
            next_link: (page.page < page.pages).then(|| link(page.page + 1)),
            page: page.page,
            pages: page.pages,
            total: page.total,
            query,
        }
    }

    /// Whether `value` is the selected owner.
    pub fn owner_selected(&self, value: &str) -> bool {
        self.query.owner.as_deref() == Some(value)
    }

    /// Whether `value` is the selected state.
    pub fn state_selected(&self, value: &str) -> bool {
        self.query.state.as_deref() == Some(value)
    }

    /// Whether `value` is the selected data-gap filter.
    pub fn gaps_selected(&self, value: &str) -> bool {
        self.query.gaps.as_deref() == Some(value)
    }

    /// The search text as typed (for the form).
    pub fn search(&self) -> &str {
        self.query.q.as_deref().unwrap_or("")
    }

    /// Whether `value` is the selected sort.
    pub fn sort_selected(&self, value: &str) -> bool {
        self.query.sort.as_deref().unwrap_or("stream") == value
    }

    /// Rows per page in effect.
    pub fn per_page(&self) -> usize {
        self.query
            .per_page
            .unwrap_or(DEFAULT_PER_PAGE)
            .clamp(1, MAX_PER_PAGE)
    }
}

/// URL-encodes a query (values are untrusted text).
pub fn encode(query: &StreamQuery) -> String {
    serde_urlencoded::to_string(query).unwrap_or_default()
}

async fn view(State(state): State<Shared>, Query(query): Query<StreamQuery>) -> Response {
    let snapshot = state.collector.latest();
    html(StreamsPage::new(&snapshot, query, refresh_ms(&state)))
}

async fn api(State(state): State<Shared>, Query(query): Query<StreamQuery>) -> Response {
    let snapshot = state.collector.latest();
    Json(stream_page(&snapshot, &query)).into_response()
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[test]
    fn search_text_is_bounded_at_a_character_boundary_and_lowercased() {
        assert_eq!(search_text(Some("  ")), None);
        assert_eq!(search_text(Some(" BTC-usd ")).as_deref(), Some("btc-usd"));
        // 150 two-byte characters: cut at 200 bytes = 100 characters.
        let long = search_text(Some(&"é".repeat(150))).unwrap();
        assert_eq!(long.len(), MAX_SEARCH_LEN);
        assert_eq!(long.chars().count(), 100);
        // A long search still finds the id its first 200 bytes name.
        let id = "a".repeat(MAX_SEARCH_LEN);
        let q = search_text(Some(&format!("{id}zzz"))).unwrap();
        assert_eq!(search_rank(&id, &q), 2);
        assert_eq!(search_rank("xAAy", "aa"), 1);
        assert_eq!(search_rank("b", "aa"), 0);
    }

    fn with_gaps(id: &str, count: u64, last_at_ms: i64, reason: GapReason) -> StreamRow {
        let mut row = StreamRow::unowned(id);
        let mut reasons = [0; GapReason::RECORDED.len()];
        reasons[GapReason::RECORDED
            .iter()
            .position(|r| *r == reason)
            .unwrap()] = count;
        row.gaps = Some(GapTally {
            count,
            missing: count * 10,
            last: crate::model::gaps::LastGap {
                at_ms: last_at_ms,
                from_seq: 100,
                to_seq: 109,
                missing: 10,
                reason,
            },
            reasons,
        });
        row
    }

    fn ids(page: &StreamPage<'_>) -> Vec<String> {
        page.streams.iter().map(|r| r.stream_id.clone()).collect()
    }

    #[test]
    fn the_streams_view_counts_data_gaps_and_filters_and_sorts_by_them() {
        let mut snapshot = Snapshot::empty(100_000);
        snapshot.streams = vec![
            with_gaps("a", 1, 90_000, GapReason::SinkLost),
            StreamRow::unowned("b"),
            with_gaps("c", 3, 40_000, GapReason::Retention),
        ];
        let query = |gaps: Option<&str>, sort: Option<&str>| StreamQuery {
            gaps: gaps.map(Into::into),
            sort: sort.map(Into::into),
            ..StreamQuery::default()
        };
        let page = |q: StreamQuery| ids(&stream_page(&snapshot, &q));
        assert_eq!(page(query(Some("some"), None)), ["a", "c"]);
        assert_eq!(page(query(Some("none"), None)), ["b"]);
        assert_eq!(page(query(Some("sink_lost"), None)), ["a"]);
        assert_eq!(page(query(Some("retention"), None)), ["c"]);
        assert_eq!(page(query(Some("bogus"), None)), ["a", "b", "c"]);
        assert_eq!(page(query(None, Some("gaps"))), ["c", "a", "b"]);
        assert_eq!(page(query(None, Some("last_gap"))), ["a", "c", "b"]);
        // In the JSON row: count, missing events, the newest, per reason.
        let json = serde_json::to_value(stream_page(&snapshot, &query(None, None))).unwrap();
        let a = &json["streams"][0]["gaps"];
        assert_eq!(
            (a["count"].as_u64(), a["missing"].as_u64()),
            (Some(1), Some(10))
        );
        assert_eq!(a["last"]["at_ms"], 90_000);
        assert_eq!(a["last"]["reason"], "sink_lost");
        assert_eq!(a["reasons"], serde_json::json!({"sink_lost": 1}));
        assert_eq!(json["streams"][1]["gaps"], Value::Null, "none recorded");
        // The rendered table: a column each, the last gap ticking with a title.
        let html = StreamsPage::new(&snapshot, query(None, None), 2_000)
            .render()
            .unwrap();
        for needle in [
            "data-field=\"gaps.count\" data-kind=\"number\">Data gaps</th>",
            "data-field=\"gaps.last\" data-kind=\"gap\">Last data gap</th>",
            "<td data-at=\"90000\" title=\"seq 100–109 missing (10 events): sink_lost\">10.0 s ago</td>",
            "<td>3</td><td data-at=\"40000\"",
            "<option value=\"sink_lost\">with a sink_lost gap</option>",
            "<option value=\"last_gap\">",
        ] {
            assert!(html.contains(needle), "{needle:?} in {html}");
        }
        let b_row = html.split("/streams/b\"").nth(1).unwrap();
        let b_row = &b_row[..b_row.find("</tr>").unwrap()];
        assert!(
            b_row.contains("<td>—</td><td>—</td><td><span class=\"badge badge-ok\">"),
            "{b_row}"
        );
        let selected = StreamsPage::new(&snapshot, query(Some("none"), None), 2_000)
            .render()
            .unwrap();
        assert!(selected.contains("<option value=\"none\" selected>"));
    }

    #[test]
    fn queries_are_percent_encoded() {
        let query = StreamQuery {
            owner: Some("a&b=<c>".into()),
            page: Some(2),
            ..StreamQuery::default()
        };
        assert_eq!(encode(&query), "owner=a%26b%3D%3Cc%3E&page=2");
    }
}
