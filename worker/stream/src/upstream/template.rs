//! URL and subscribe-message templates: `{stream_id}` and `{from_seq}` are
//! substituted once, escaped for where they land (a URL path segment or query
//! value, a JSON string, plain text).

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// Everything but RFC 3986 unreserved characters is encoded, so a stream id is
/// always exactly one path segment or query value.
const NOT_UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A template that will be sent as JSON (stream ids are JSON-escaped in it).
pub fn looks_like_json(template: &str) -> bool {
    matches!(template.trim_start().chars().next(), Some('{' | '['))
}

/// The URL for `stream_id` (percent-encoded into the template).
pub fn render_url(template: &str, stream_id: &str) -> String {
    let encoded = utf8_percent_encode(stream_id, NOT_UNRESERVED).to_string();
    substitute(template, &[("{stream_id}", &encoded)])
}

/// A history page's URL: `{stream_id}` and `{stream_id_upper}` (upper-cased,
/// as REST APIs often spell symbols) percent-encoded, `{from_seq}` and
/// `{to_seq}` as numbers.
pub fn render_history_url(template: &str, stream_id: &str, from_seq: u64, to_seq: u64) -> String {
    let encoded = utf8_percent_encode(stream_id, NOT_UNRESERVED).to_string();
    let upper = utf8_percent_encode(&stream_id.to_uppercase(), NOT_UNRESERVED).to_string();
    substitute(
        template,
        &[
            ("{stream_id_upper}", &upper),
            ("{stream_id}", &encoded),
            ("{from_seq}", &from_seq.to_string()),
            ("{to_seq}", &to_seq.to_string()),
        ],
    )
}

/// The subscribe message for `stream_id` from `from_seq`.
pub fn render_subscribe(template: &str, stream_id: &str, from_seq: u64) -> String {
    let stream_id = if looks_like_json(template) {
        json_escape(stream_id)
    } else {
        stream_id.to_owned()
    };
    substitute(
        template,
        &[
            ("{stream_id}", &stream_id),
            ("{from_seq}", &from_seq.to_string()),
        ],
    )
}

/// A stream's name on a shared connection (`UPSTREAM_ROUTE_TEMPLATE`):
/// `{stream_id}` and `{stream_id_upper}` as they are (Binance
/// `{stream_id}@depth@100ms`, Bybit `orderbook.50.{stream_id_upper}`).
pub fn render_route(template: &str, stream_id: &str) -> String {
    substitute(
        template,
        &[
            ("{stream_id_upper}", &stream_id.to_uppercase()),
            ("{stream_id}", stream_id),
        ],
    )
}

/// A subscribe or unsubscribe message on a shared connection for `routes`
/// (rendered route names, in order) as request `request_id`:
/// `{stream_ids_json}` is their JSON array, `{stream_id}` the first (a
/// template that names one stream per message), `{request_id}` the number
/// acknowledgements and errors name.
pub fn render_batch(template: &str, routes: &[String], request_id: u64) -> String {
    let first = routes.first().map(String::as_str).unwrap_or_default();
    let first = if looks_like_json(template) {
        json_escape(first)
    } else {
        first.to_owned()
    };
    let list = serde_json::to_string(routes).unwrap_or_else(|_| "[]".to_owned());
    substitute(
        template,
        &[
            ("{stream_ids_json}", &list),
            ("{request_id}", &request_id.to_string()),
            ("{stream_id}", &first),
            ("{from_seq}", "0"),
        ],
    )
}

/// Replaces placeholders in one pass, so a value containing a placeholder's text
/// is not substituted again.
fn substitute(template: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    'scan: while let Some(brace) = rest.find('{') {
        out.push_str(&rest[..brace]);
        rest = &rest[brace..];
        for (key, value) in values {
            if let Some(after) = rest.strip_prefix(key) {
                out.push_str(value);
                rest = after;
                continue 'scan;
            }
        }
        out.push('{');
        rest = &rest[1..];
    }
    out.push_str(rest);
    out
}

/// Escapes for inside a JSON string literal (the template supplies the quotes).
fn json_escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_urls_take_the_range_and_an_upper_case_symbol() {
        assert_eq!(
            render_history_url(
                "https://h/api?symbol={stream_id_upper}&fromId={from_seq}&to={to_seq}&s={stream_id}",
                "btc usdt",
                11,
                19
            ),
            "https://h/api?symbol=BTC%20USDT&fromId=11&to=19&s=btc%20usdt"
        );
    }

    #[test]
    fn templates_substitute_once_and_escape() {
        assert_eq!(
            render_subscribe(
                r#"{"s": "{stream_id}", "n": {from_seq}}"#,
                "a\"\\{from_seq}",
                3
            ),
            r#"{"s": "a\"\\{from_seq}", "n": 3}"#
        );
        assert_eq!(
            render_subscribe("SUB {stream_id} {from_seq}", "a\"b", 3),
            "SUB a\"b 3"
        );
        assert_eq!(
            render_url("ws://h/{stream_id}/{x}", "a b/ü"),
            "ws://h/a%20b%2F%C3%BC/{x}"
        );
    }
}
