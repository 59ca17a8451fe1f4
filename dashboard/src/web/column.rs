//! Tables as data: every view is a list of typed columns over its rows and
//! the cells they make. A column names its row's field twice, on purpose:
//! through an accessor (so renaming a field is a compile error here) and as
//! the field's JSON path, which the refresh script (`static/dashboard.js`)
//! uses to rebuild the same cells from the JSON API with the column kinds
//! written into the table header; the tests check both name the same value.

use std::borrow::Cow;

use serde::Serialize;

use crate::model::gaps::LastGap;

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

/// A row's value as a column reads it, typed as the row holds it (what the
/// row's JSON would carry, without going through JSON).
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    /// Absent (`null` in the JSON): shown as `—` whatever the kind.
    None,
    /// Text: ids, labels, URLs.
    Text(Cow<'a, str>),
    /// A whole number (counts, tokens, unix ms).
    Int(i64),
    /// A whole number that may exceed `i64`.
    Uint(u64),
    /// A measured amount (seconds).
    Float(f64),
    /// Yes or no.
    Bool(bool),
    /// A stream's newest data gap.
    Gap(&'a LastGap),
    /// `stream:token` pairs.
    Tokens(&'a [(String, u64)]),
}

impl<'a> Value<'a> {
    /// Borrowed text.
    pub fn text(text: &'a str) -> Value<'a> {
        Value::Text(Cow::Borrowed(text))
    }

    /// Borrowed text, or `None`.
    pub fn opt_text(text: Option<&'a str>) -> Value<'a> {
        text.map_or(Value::None, Value::text)
    }

    /// A number, or `None`.
    pub fn opt<T: Into<Value<'a>>>(value: Option<T>) -> Value<'a> {
        value.map_or(Value::None, Into::into)
    }
}

impl From<i64> for Value<'_> {
    fn from(n: i64) -> Self {
        Value::Int(n)
    }
}

impl From<u64> for Value<'_> {
    fn from(n: u64) -> Self {
        Value::Uint(n)
    }
}

impl From<usize> for Value<'_> {
    fn from(n: usize) -> Self {
        Value::Uint(n as u64)
    }
}

impl From<bool> for Value<'_> {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<f64> for Value<'_> {
    /// JSON has no NaN or infinity (they serialize as `null`), so neither
    /// shows here.
    fn from(x: f64) -> Self {
        if x.is_finite() {
            Value::Float(x)
        } else {
            Value::None
        }
    }
}

impl From<&'static str> for Value<'_> {
    fn from(label: &'static str) -> Self {
        Value::Text(Cow::Borrowed(label))
    }
}

/// One column over rows of type `Row`.
pub struct Column<Row> {
    /// Header text.
    pub title: &'static str,
    /// The field's path in the row's JSON (dots for nesting), for the script.
    pub field: &'static str,
    /// How it is shown.
    pub kind: Kind,
    /// Reads the field from a row.
    pub value: for<'r> fn(&'r Row) -> Value<'r>,
}

/// Shorthand for a column.
pub const fn col<Row>(
    title: &'static str,
    field: &'static str,
    kind: Kind,
    value: for<'r> fn(&'r Row) -> Value<'r>,
) -> Column<Row> {
    Column {
        title,
        field,
        kind,
        value,
    }
}

/// A column's header as the template writes it (`data-field`, `data-kind`).
#[derive(Debug, Clone, Copy)]
pub struct Heading {
    /// Header text.
    pub title: &'static str,
    /// The field's JSON path.
    pub field: &'static str,
    /// How it is shown.
    pub kind: Kind,
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
    /// Column headings.
    pub columns: Vec<Heading>,
    /// Cells, row by row.
    pub rows: Vec<Vec<Cell>>,
    /// Shown when there are no rows.
    pub empty: &'static str,
}

/// Where a table's rows come from and what it says without any.
#[derive(Debug, Clone, Copy)]
pub struct Source {
    /// `id` of the table element.
    pub id: &'static str,
    /// JSON API the script refreshes from.
    pub api: &'static str,
    /// Path of the rows array in that JSON.
    pub rows_key: &'static str,
    /// Shown when there are no rows.
    pub empty: &'static str,
}

impl Table {
    /// Renders `rows` through `columns`, with ages and countdowns at `now_ms`.
    pub fn build<'r, Row: 'r>(
        source: Source,
        columns: &[Column<Row>],
        rows: impl IntoIterator<Item = &'r Row>,
        now_ms: i64,
    ) -> Table {
        let rows = rows
            .into_iter()
            .map(|row| {
                columns
                    .iter()
                    .map(|column| cell(column.kind, (column.value)(row), now_ms))
                    .collect()
            })
            .collect();
        Table {
            id: source.id,
            api: source.api,
            rows_key: source.rows_key,
            columns: columns
                .iter()
                .map(|c| Heading {
                    title: c.title,
                    field: c.field,
                    kind: c.kind,
                })
                .collect(),
            rows,
            empty: source.empty,
        }
    }
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

/// One cell: what `static/dashboard.js` makes of the same value in JSON.
fn cell(kind: Kind, value: Value<'_>, now_ms: i64) -> Cell {
    let text = |text: String| Cell {
        text,
        ..Cell::default()
    };
    match (kind, value) {
        (_, Value::None) => text(NONE.into()),
        (Kind::Badge, Value::Text(s)) => Cell {
            class: format!("badge badge-{s}"),
            text: s.into_owned(),
            ..Cell::default()
        },
        (Kind::Badge, Value::Bool(b)) => Cell {
            text: if b { "yes" } else { "no" }.into(),
            class: format!("badge badge-{}", if b { "up" } else { "down" }),
            ..Cell::default()
        },
        (Kind::Seconds, Value::Float(x)) => text(format!("{x:.1} s")),
        (Kind::Seconds, Value::Int(n)) => text(format!("{:.1} s", n as f64)),
        (Kind::Seconds, Value::Uint(n)) => text(format!("{:.1} s", n as f64)),
        (Kind::Countdown, Value::Int(at)) => match at {
            0 => text(NONE.into()),
            at => Cell {
                text: countdown(at - now_ms),
                at: Some(at),
                ..Cell::default()
            },
        },
        (Kind::Ago, Value::Int(at)) if at > 0 => Cell {
            text: format!("{} ago", duration_ms(now_ms - at)),
            at: Some(at),
            ..Cell::default()
        },
        (Kind::Ago, Value::Int(_)) => text(NONE.into()),
        (Kind::AgeMs, Value::Int(ms)) => text(duration_ms(ms)),
        (Kind::AgeMs, Value::Uint(ms)) => text(duration_ms(i64::try_from(ms).unwrap_or(0))),
        (Kind::StatusLink, Value::Text(url)) => Cell {
            text: format!("{url}/status"),
            href: Some(format!("{url}/status")),
            ..Cell::default()
        },
        (Kind::StreamLink, Value::Text(id)) => Cell {
            href: Some(crate::web::page::stream_href(&id)),
            text: id.into_owned(),
            ..Cell::default()
        },
        (Kind::Gap, Value::Gap(gap)) if gap.at_ms > 0 => Cell {
            text: format!("{} ago", duration_ms(now_ms - gap.at_ms)),
            at: Some(gap.at_ms),
            title: Some(gap.range_text()),
            ..Cell::default()
        },
        (Kind::Gap, Value::Gap(_)) => text(NONE.into()),
        (Kind::Tokens, Value::Tokens(pairs)) => text(
            pairs
                .iter()
                .map(|(stream, token)| format!("{stream}:{token}"))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        (_, Value::Text(s)) => text(s.into_owned()),
        (_, Value::Int(n)) => text(n.to_string()),
        (_, Value::Uint(n)) => text(n.to_string()),
        (_, Value::Float(x)) => text(float_text(x)),
        (_, Value::Bool(b)) => text(b.to_string()),
        (_, Value::Gap(gap)) => text(serde_json::to_string(gap).unwrap_or_default()),
        (_, Value::Tokens(pairs)) => text(serde_json::to_string(pairs).unwrap_or_default()),
    }
}

/// A float as JSON writes it (`1.0`, `0.25`), as the cells always showed it.
fn float_text(x: f64) -> String {
    serde_json::Number::from_f64(x).map_or_else(|| NONE.to_owned(), |n| n.to_string())
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
mod tests;
