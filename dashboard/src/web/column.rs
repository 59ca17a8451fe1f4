//! Tables as data: every view is a list of columns (title, JSON field, kind)
//! and rows of cells. The server renders the cells once; the refresh script
//! (`static/dashboard.js`) rebuilds the same cells from the JSON API using the
//! column kinds written into the table header, so both paths format alike.

use serde::Serialize;

/// How a column's value is shown (the script knows the same kinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Plain text; `—` when null.
    Text,
    /// A number; `—` when null.
    Number,
    /// Seconds with one decimal.
    Seconds,
    /// A badge whose CSS class follows the value.
    Badge,
    /// A unix-ms instant shown as time left ("in 12 s"), ticking; `—` when 0/null.
    Countdown,
    /// A unix-ms instant shown as age ("12 s ago"), ticking.
    Ago,
    /// Milliseconds of age as the source measured them.
    AgeMs,
    /// A base URL linking to `{url}/status`.
    StatusLink,
    /// `[[stream, token], …]` pairs shown as `stream:token`.
    Tokens,
    /// A stream id linking to its page (`/streams/{id}`, percent-encoded).
    StreamLink,
    /// A data gap (`{at_ms, from_seq, to_seq, missing, reason}`) shown as its
    /// age, ticking, with its range and reason as the cell's title.
    Gap,
}

impl Kind {
    /// The name written into `data-kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Text => "text",
            Kind::Number => "number",
            Kind::Seconds => "seconds",
            Kind::Badge => "badge",
            Kind::Countdown => "countdown",
            Kind::Ago => "ago",
            Kind::AgeMs => "age_ms",
            Kind::StatusLink => "status_link",
            Kind::Tokens => "tokens",
            Kind::StreamLink => "stream_link",
            Kind::Gap => "gap",
        }
    }
}

/// One column.
#[derive(Debug, Clone, Copy)]
pub struct Column {
    /// Header text.
    pub title: &'static str,
    /// Field in the JSON row (dots for nesting).
    pub field: &'static str,
    /// How it is shown.
    pub kind: Kind,
}

/// Shorthand for a column.
pub const fn col(title: &'static str, field: &'static str, kind: Kind) -> Column {
    Column { title, field, kind }
}

/// One rendered cell.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Cell {
    /// Text shown (escaped by the template).
    pub text: String,
    /// Extra CSS class (badges).
    pub class: String,
    /// Instant for ticking cells, unix ms.
    pub at: Option<i64>,
    /// Link target.
    pub href: Option<String>,
    /// Tooltip (the cell's `title`).
    pub title: Option<String>,
}

/// A table ready for the template.
#[derive(Debug, Clone)]
pub struct Table {
    /// `id` of the table element.
    pub id: &'static str,
    /// JSON API the script refreshes from (with the page's query string).
    pub api: &'static str,
    /// Path (dots for nesting) of the rows array in that JSON.
    pub rows_key: &'static str,
    /// Columns.
    pub columns: &'static [Column],
    /// Cells, row by row.
    pub rows: Vec<Vec<Cell>>,
    /// Shown when there are no rows.
    pub empty: &'static str,
}

impl Table {
    /// Renders `rows` (already serialized to JSON values) through `columns`.
    pub fn build(
        id: &'static str,
        api: &'static str,
        rows_key: &'static str,
        columns: &'static [Column],
        rows: impl IntoIterator<Item = serde_json::Value>,
        now_ms: i64,
        empty: &'static str,
    ) -> Table {
        let rows = rows
            .into_iter()
            .map(|row| {
                columns
                    .iter()
                    .map(|column| cell(column, field(&row, column.field), now_ms))
                    .collect()
            })
            .collect();
        Table {
            id,
            api,
            rows_key,
            columns,
            rows,
            empty,
        }
    }
}

fn field<'a>(row: &'a serde_json::Value, path: &str) -> &'a serde_json::Value {
    path.split('.').fold(row, |value, key| &value[key])
}

/// Human duration: `850 ms`, `12.3 s`, `4 m 10 s`, `2 h 5 m`, `3 d 4 h`.
pub fn duration_ms(ms: i64) -> String {
    let ms = ms.max(0);
    if ms < 1_000 {
        return format!("{ms} ms");
    }
    let secs = ms / 1_000;
    if secs < 60 {
        return format!("{:.1} s", ms as f64 / 1_000.0);
    }
    if secs < 3_600 {
        return format!("{} m {} s", secs / 60, secs % 60);
    }
    if secs < 86_400 {
        return format!("{} h {} m", secs / 3_600, (secs % 3_600) / 60);
    }
    format!("{} d {} h", secs / 86_400, (secs % 86_400) / 3_600)
}

const NONE: &str = "—";

fn cell(column: &Column, value: &serde_json::Value, now_ms: i64) -> Cell {
    use serde_json::Value;
    let text = |text: String| Cell {
        text,
        ..Cell::default()
    };
    match (column.kind, value) {
        (_, Value::Null) => text(NONE.into()),
        (Kind::Text, Value::String(s)) => text(s.clone()),
        (Kind::Badge, Value::String(s)) => Cell {
            text: s.clone(),
            class: format!("badge badge-{s}"),
            ..Cell::default()
        },
        (Kind::Badge, Value::Bool(b)) => Cell {
            text: if *b { "yes" } else { "no" }.into(),
            class: format!("badge badge-{}", if *b { "up" } else { "down" }),
            ..Cell::default()
        },
        (Kind::Seconds, Value::Number(n)) => text(format!("{:.1} s", n.as_f64().unwrap_or(0.0))),
        (Kind::Countdown, Value::Number(n)) => match n.as_i64() {
            Some(0) | None => text(NONE.into()),
            Some(at) => Cell {
                text: countdown(at - now_ms),
                at: Some(at),
                ..Cell::default()
            },
        },
        (Kind::Ago, Value::Number(n)) => match n.as_i64() {
            Some(at) if at > 0 => Cell {
                text: format!("{} ago", duration_ms(now_ms - at)),
                at: Some(at),
                ..Cell::default()
            },
            _ => text(NONE.into()),
        },
        (Kind::AgeMs, Value::Number(n)) => text(duration_ms(n.as_i64().unwrap_or(0))),
        (Kind::StatusLink, Value::String(url)) => Cell {
            text: format!("{url}/status"),
            href: Some(format!("{url}/status")),
            ..Cell::default()
        },
        (Kind::StreamLink, Value::String(id)) => Cell {
            text: id.clone(),
            href: Some(crate::web::pages::stream_href(id)),
            ..Cell::default()
        },
        (Kind::Gap, Value::Object(_)) => {
            match <crate::model::gaps::LastGap as serde::Deserialize>::deserialize(value) {
                Ok(gap) if gap.at_ms > 0 => Cell {
                    text: format!("{} ago", duration_ms(now_ms - gap.at_ms)),
                    at: Some(gap.at_ms),
                    title: Some(gap.range_text()),
                    ..Cell::default()
                },
                _ => text(NONE.into()),
            }
        }
        (Kind::Tokens, Value::Array(pairs)) => text(
            pairs
                .iter()
                .map(|pair| format!("{}:{}", pair[0].as_str().unwrap_or("?"), pair[1]))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        (_, Value::String(s)) => text(s.clone()),
        (_, other) => text(other.to_string()),
    }
}

/// `in 12.3 s` or `expired 2.0 s ago`.
pub fn countdown(left_ms: i64) -> String {
    if left_ms >= 0 {
        format!("in {}", duration_ms(left_ms))
    } else {
        format!("{} ago", duration_ms(-left_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_an_operator_writes_them() {
        assert_eq!(duration_ms(850), "850 ms");
        assert_eq!(duration_ms(12_340), "12.3 s");
        assert_eq!(duration_ms(250_000), "4 m 10 s");
        assert_eq!(duration_ms(7_500_000), "2 h 5 m");
        assert_eq!(countdown(-2_000), "2.0 s ago");
    }

    #[test]
    fn cells_follow_their_kind() {
        const COLUMNS: &[Column] = &[
            col("Stream", "stream_id", Kind::Text),
            col("State", "state", Kind::Badge),
            col("Expires", "exp", Kind::Countdown),
            col("Nested", "a.b", Kind::Number),
            col("Tokens", "tokens", Kind::Tokens),
            col("Last gap", "gaps.last", Kind::Gap),
        ];
        let table = Table::build(
            "t",
            "/api/x",
            "rows",
            COLUMNS,
            [
                serde_json::json!({"stream_id": "<b>", "state": "owned", "exp": 11_000,
                "a": {"b": 7}, "tokens": [["s1", 3], ["s2", 4]],
                "gaps": {"last": {"at_ms": 400, "from_seq": 7, "to_seq": 9, "missing": 3,
                    "reason": "sink_lost"}}}),
                serde_json::json!({"gaps": {"last": null}}),
            ],
            1_000,
            "none",
        );
        let row = &table.rows[0];
        assert_eq!(
            row[0].text, "<b>",
            "escaping is the template's job, not the cell's"
        );
        assert_eq!(row[1].class, "badge badge-owned");
        assert_eq!(row[2].text, "in 10.0 s");
        assert_eq!(row[2].at, Some(11_000));
        assert_eq!(row[3].text, "7");
        assert_eq!(row[4].text, "s1:3, s2:4");
        assert_eq!(
            (row[5].text.as_str(), row[5].at, row[5].title.as_deref()),
            (
                "600 ms ago",
                Some(400),
                Some("seq 7–9 missing (3 events): sink_lost")
            )
        );
        let none = &table.rows[1][5];
        assert_eq!(
            (none.text.as_str(), none.at, &none.title),
            ("—", None, &None)
        );
    }
}
