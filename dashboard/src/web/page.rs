//! What every page shares: the header (navigation, counts, sources that are
//! down), the plain-tables page, and rendering a template to a response.
//!
//! Every value reaches the HTML through askama's escaping (stream ids and
//! owners come from a table anyone with write access can fill); no template
//! uses `|safe`.

use askama::Template;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};

use crate::model::Snapshot;
use crate::model::streams::StreamState;
use crate::web::DashboardState;
use crate::web::column::Table;

/// Renders a template, or a 500 that says only that a template failed.
pub(crate) fn html(page: impl Template) -> Response {
    match page.render() {
        Ok(body) => Html(body).into_response(),
        Err(err) => {
            tracing::error!(error = %err, "dashboard template failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "template error\n").into_response()
        }
    }
}

/// The refresh period pages tell their script: the collector's pace.
pub(crate) fn refresh_ms(state: &DashboardState) -> u64 {
    state.collector.interval().as_millis() as u64
}

/// A stream id as one URL path segment (`/streams/{segment}`).
pub fn stream_href(id: &str) -> String {
    format!(
        "/streams/{}",
        percent_encoding::utf8_percent_encode(id, percent_encoding::NON_ALPHANUMERIC)
    )
}

/// The navigation and status line every page shares.
#[derive(Debug, Clone)]
pub struct Header {
    /// Which view is shown.
    pub active: &'static str,
    /// Snapshot time, unix ms (the script's clock offset comes from it).
    pub now_ms: i64,
    /// Refresh period for the script.
    pub refresh_ms: u64,
    /// Streams by state.
    pub counts: Vec<(&'static str, usize)>,
    /// Sources that are down, with the age of their last good read.
    pub down: Vec<(String, String)>,
    /// What the cluster runs as: "lease mode session · discovery scan · …".
    pub roles: String,
}

impl Header {
    /// The header for `active` at `snapshot`.
    pub fn new(active: &'static str, snapshot: &Snapshot, refresh_ms: u64) -> Header {
        let counts = snapshot.state_counts();
        Header {
            active,
            now_ms: snapshot.taken_at_ms,
            refresh_ms,
            roles: snapshot
                .roles
                .iter()
                .map(|(what, value)| format!("{what} {value}"))
                .collect::<Vec<_>>()
                .join(" · "),
            counts: StreamState::ALL
                .iter()
                .map(|s| (s.as_str(), counts.get(s.as_str()).copied().unwrap_or(0)))
                .collect(),
            down: snapshot
                .sources
                .iter()
                .filter(|s| !s.ok)
                .map(|s| {
                    let since = match s.last_ok_ms {
                        Some(at) => format!(
                            "showing data from {} ago",
                            crate::web::column::duration_ms(snapshot.taken_at_ms - at)
                        ),
                        None => "no data yet".to_owned(),
                    };
                    (
                        s.name.to_owned(),
                        format!("{} — {since}", s.error.as_deref().unwrap_or("unavailable")),
                    )
                })
                .collect(),
        }
    }

    /// The refresh period as text.
    pub fn refresh_text(&self) -> String {
        crate::web::column::duration_ms(self.refresh_ms as i64)
    }

    /// The navigation entries: (path, title).
    pub fn nav(&self) -> &'static [(&'static str, &'static str)] {
        crate::web::views::nav()
    }
}

/// A view with one or more plain tables.
#[derive(Template)]
#[template(path = "tables.html")]
pub struct TablesPage {
    /// Shared header.
    pub header: Header,
    /// Page heading.
    pub heading: &'static str,
    /// Summary lines under the heading.
    pub summary: Vec<String>,
    /// Tables with their captions.
    pub tables: Vec<(&'static str, Table)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_links_encode_every_special_character() {
        assert_eq!(stream_href("a/b?c#<d>"), "/streams/a%2Fb%3Fc%23%3Cd%3E");
    }
}
