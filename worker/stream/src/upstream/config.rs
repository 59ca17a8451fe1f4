//! How to reach a WebSocket JSON feed, checked before the first connect.

use std::time::Duration;

use serde_json::Value;

use super::redact::redact_url;
use super::template::{looks_like_json, render_batch, render_url};

/// The simulator's subscribe message; the default template.
pub const FEED_SUBSCRIBE_TEMPLATE: &str = r#"{"subscribe": "{stream_id}", "from_seq": {from_seq}}"#;

/// How to talk to a WebSocket JSON feed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebSocketUpstreamConfig {
    /// `ws://` or `wss://` URL; `{stream_id}` is substituted (percent-encoded) if present.
    pub url_template: String,
    /// Text sent after connecting, with `{stream_id}` and `{from_seq}` substituted;
    /// empty sends nothing.
    pub subscribe_template: String,
    /// JSON pointer to the sequence number.
    pub seq_pointer: String,
    /// Where a frame says which sequences it covers, if it covers a range
    /// (`UPSTREAM_SEQ_FIRST_POINTER`, `UPSTREAM_SEQ_PREV_POINTER`).
    pub range: Option<SeqRange>,
    /// JSON pointer to the event id (string or number).
    pub id_pointer: String,
    /// JSON pointer to the event's time in unix ms, if the upstream has one.
    pub ts_pointer: Option<String>,
    /// Frames larger than this are skipped.
    pub max_frame_bytes: usize,
    /// Bound on connect, handshake and sending the subscribe message.
    pub connect_timeout: Duration,
    /// Reconnect when nothing (data or a pong to the pings sent every third of
    /// it) arrives for this long (`UPSTREAM_IDLE_TIMEOUT_MS`).
    pub idle_timeout: Duration,
    /// `UPSTREAM_DATA_MATCH`: a frame is data when one of these holds; a frame
    /// that matches none is a control frame (empty: every frame is data).
    pub data_match: Vec<DataMatch>,
    /// `UPSTREAM_PING_TEXT`: an application-level ping sent as a text frame
    /// every `ping_interval`, for upstreams that drop clients who do not.
    pub ping_text: Option<String>,
    /// `UPSTREAM_PING_INTERVAL_MS`.
    pub ping_interval: Duration,
    /// `UPSTREAM_CONNECTS_PER_MINUTE`: connects this worker opens per rolling
    /// minute at most, over all its streams (0: no limit).
    pub connects_per_minute: usize,
    /// `UPSTREAM_SNAPSHOT_MATCH`: a data frame for which this holds is an
    /// order book's snapshot sent in the stream (Bybit `/type=snapshot`).
    pub snapshot_match: Option<DataMatch>,
    /// `UPSTREAM_UNSUBSCRIBE`: text that ends the subscription on the
    /// connection (same placeholders as the subscribe); with it a new
    /// in-band snapshot is asked for by unsubscribing and subscribing again,
    /// without it by reconnecting. Empty: none.
    pub unsubscribe_template: String,
    /// `UPSTREAM_STREAMS_PER_CONNECTION`: held streams one connection carries
    /// (1: a connection per stream).
    pub streams_per_connection: usize,
    /// `UPSTREAM_ROUTE_POINTER`: the field that names a frame's stream on a
    /// shared connection.
    pub route_pointer: Option<String>,
    /// `UPSTREAM_ROUTE_TEMPLATE`: a stream's name in that field and in
    /// `{stream_ids_json}`.
    pub route_template: String,
    /// `UPSTREAM_SUBSCRIBE_BATCH`: streams named in one (un)subscribe message.
    pub subscribe_batch: usize,
    /// `UPSTREAM_SUBSCRIBES_PER_SECOND`: (un)subscribe messages per second on
    /// one connection at most (0: no limit).
    pub subscribes_per_second: u32,
    /// `UPSTREAM_MAX_CONNECTION_AGE_MS`: a connection is replaced, with an
    /// overlap, before this age (zero: never).
    pub max_connection_age: Duration,
}

/// How a frame states the range of sequences it covers (an order book's
/// diff folds several update ids together).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeqRange {
    /// JSON pointer to the first sequence it covers (Binance spot `/U`).
    First(String),
    /// JSON pointer to the previous frame's last sequence (Binance USD-M
    /// futures `/pu`): the frame covers from the one after.
    Prev(String),
}

impl SeqRange {
    /// The pointer, whichever kind.
    pub fn pointer(&self) -> &str {
        match self {
            SeqRange::First(pointer) | SeqRange::Prev(pointer) => pointer,
        }
    }

    /// The first sequence covered, from the value read at the pointer.
    pub fn first(&self, value: u64) -> u64 {
        match self {
            SeqRange::First(_) => value,
            SeqRange::Prev(_) => value.saturating_add(1),
        }
    }
}

/// `UPSTREAM_SEQ_POINTER` / `UPSTREAM_ID_POINTER` value for an upstream
/// whose frames have no sequence (the worker numbers them) / no id (the
/// sequence is the id).
pub const NO_POINTER: &str = "none";

/// One alternative of `UPSTREAM_DATA_MATCH`: the value at `pointer` is `value`
/// (a string as it is, a number, boolean or null as JSON writes it), or,
/// written without `=value`, the pointer leads to something.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataMatch {
    /// JSON pointer (RFC 6901).
    pub pointer: String,
    /// The text the value must have; `None`: any value.
    pub value: Option<String>,
}

impl DataMatch {
    /// Parses `/pointer=value[,/pointer…]` (split at each alternative's first
    /// `=`; a bare pointer: present; empty text: no condition). A bare
    /// pointer is for frames told apart only by which keys they have (Kraken
    /// v1's book snapshot has `as`, its updates `a`).
    pub fn parse_list(text: &str) -> Result<Vec<DataMatch>, String> {
        text.split(',')
            .map(str::trim)
            .filter(|part| !part.is_empty())
            .map(|part| {
                let (pointer, value) = match part.split_once('=') {
                    Some((pointer, value)) => (pointer, Some(value.to_owned())),
                    None => (part, None),
                };
                if !pointer.starts_with('/') {
                    return Err(format!(
                        "{pointer:?} must be a JSON pointer starting with /"
                    ));
                }
                Ok(DataMatch {
                    pointer: pointer.to_owned(),
                    value,
                })
            })
            .collect()
    }

    /// Whether `found` (the value at the pointer, if any) is this value.
    pub fn matches(&self, found: Option<&Value>) -> bool {
        let Some(expected) = &self.value else {
            return found.is_some();
        };
        match found {
            Some(Value::String(s)) => s == expected,
            Some(Value::Number(n)) => n.to_string() == *expected,
            Some(Value::Bool(b)) => (if *b { "true" } else { "false" }) == expected,
            Some(Value::Null) => expected == "null",
            _ => false,
        }
    }
}

impl std::fmt::Display for DataMatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.value {
            Some(value) => write!(f, "{}={value}", self.pointer),
            None => f.write_str(&self.pointer),
        }
    }
}

/// Distinct data-match pointers one adapter reads at most (documented as 5;
/// the extractor reads up to sixteen pointers per frame, four of them the
/// sequence, id, time and range start, one the snapshot match).
pub const MAX_DATA_MATCH_POINTERS: usize = 5;
const _: () = assert!(MAX_DATA_MATCH_POINTERS + 5 <= super::extract::MAX_POINTERS);

impl WebSocketUpstreamConfig {
    /// The simulator's protocol at `url`.
    pub fn for_feed(url: &str) -> Self {
        WebSocketUpstreamConfig {
            url_template: url.to_owned(),
            subscribe_template: FEED_SUBSCRIBE_TEMPLATE.to_owned(),
            seq_pointer: "/seq".to_owned(),
            range: None,
            id_pointer: "/event_id".to_owned(),
            ts_pointer: None,
            max_frame_bytes: 1 << 20,
            connect_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(15),
            data_match: Vec::new(),
            ping_text: None,
            ping_interval: Duration::from_secs(10),
            connects_per_minute: 0,
            snapshot_match: None,
            unsubscribe_template: String::new(),
            streams_per_connection: 1,
            route_pointer: None,
            route_template: "{stream_id}".to_owned(),
            subscribe_batch: 1,
            subscribes_per_second: 0,
            max_connection_age: Duration::ZERO,
        }
    }

    /// The distinct pointers `data_match` reads, in first-mention order.
    pub fn data_match_pointers(&self) -> Vec<&str> {
        let mut pointers: Vec<&str> = Vec::new();
        for alternative in &self.data_match {
            if !pointers.contains(&alternative.pointer.as_str()) {
                pointers.push(&alternative.pointer);
            }
        }
        pointers
    }

    /// Every problem with this configuration, not just the first, each
    /// starting with the setting it is about (`UPSTREAM_URL: …`).
    pub fn validate(&self) -> Result<(), Vec<String>> {
        use crate::settings::{
            UPSTREAM_ID_POINTER, UPSTREAM_ROUTE_POINTER, UPSTREAM_SEQ_FIRST_POINTER,
            UPSTREAM_SEQ_POINTER, UPSTREAM_SEQ_PREV_POINTER, UPSTREAM_SNAPSHOT_MATCH,
            UPSTREAM_SUBSCRIBE, UPSTREAM_TS_POINTER, UPSTREAM_UNSUBSCRIBE, UPSTREAM_URL,
        };
        let mut problems = Vec::new();
        let url = render_url(&self.url_template, "stream");
        let redacted = redact_url(&self.url_template);
        let setting = UPSTREAM_URL.name;
        match url::Url::parse(&url) {
            Ok(parsed) if !matches!(parsed.scheme(), "ws" | "wss") => problems.push(format!(
                "{setting}: {redacted} must start with ws:// or wss://"
            )),
            Ok(parsed) if parsed.host().is_none() => {
                problems.push(format!("{setting}: {redacted} names no host"));
            }
            Ok(_) => {}
            // The parser's reason names no part of the URL (no secret).
            Err(reason) => problems.push(format!(
                "{setting}: {redacted} is not a valid URL ({reason}); expected ws://host[:port]/path or wss://…"
            )),
        }
        for (setting, template) in [
            (UPSTREAM_SUBSCRIBE.name, &self.subscribe_template),
            (UPSTREAM_UNSUBSCRIBE.name, &self.unsubscribe_template),
        ] {
            if looks_like_json(template) {
                let sample = render_batch(template, &["a\"b\\c".to_owned()], 1);
                if serde_json::from_str::<Value>(&sample).is_err() {
                    problems.push(format!(
                        "{setting}: looks like JSON but is not valid JSON after substitution"
                    ));
                }
            }
        }
        if let Some(snapshot) = &self.snapshot_match
            && !snapshot.pointer.starts_with('/')
        {
            problems.push(format!(
                "{}: {:?} must be a JSON pointer starting with /",
                UPSTREAM_SNAPSHOT_MATCH.name, snapshot.pointer
            ));
        }
        let ts_pointer = self.ts_pointer.clone().unwrap_or_else(|| "/".to_owned());
        let range_pointer = match &self.range {
            Some(SeqRange::First(pointer)) => (UPSTREAM_SEQ_FIRST_POINTER.name, pointer.clone()),
            Some(SeqRange::Prev(pointer)) => (UPSTREAM_SEQ_PREV_POINTER.name, pointer.clone()),
            None => (UPSTREAM_SEQ_FIRST_POINTER.name, "/".to_owned()),
        };
        for (setting, pointer) in [
            (range_pointer.0, &range_pointer.1),
            (UPSTREAM_SEQ_POINTER.name, &self.seq_pointer),
            (UPSTREAM_ID_POINTER.name, &self.id_pointer),
            (UPSTREAM_TS_POINTER.name, &ts_pointer),
        ] {
            let none_allowed =
                setting == UPSTREAM_SEQ_POINTER.name || setting == UPSTREAM_ID_POINTER.name;
            let no_pointer = none_allowed && pointer == NO_POINTER;
            if !(pointer.starts_with('/') || no_pointer) {
                problems.push(format!(
                    "{setting}: {pointer:?} must be a JSON pointer starting with /"
                ));
            }
        }
        if self.max_frame_bytes == 0 {
            problems.push("maximum frame size must be positive".to_owned());
        }
        if self.connect_timeout.is_zero() {
            problems.push("connect timeout must be positive".to_owned());
        }
        if self.idle_timeout.is_zero() {
            problems.push("idle timeout must be positive".to_owned());
        }
        if self.data_match_pointers().len() > MAX_DATA_MATCH_POINTERS {
            problems.push(format!(
                "data match names more than {MAX_DATA_MATCH_POINTERS} distinct pointers"
            ));
        }
        if self.streams_per_connection > 1 && self.route_pointer.is_none() {
            problems.push(format!(
                "{}: is required when UPSTREAM_STREAMS_PER_CONNECTION is above 1 (which \
                 field of a frame names its stream)",
                UPSTREAM_ROUTE_POINTER.name
            ));
        }
        if self.ping_text.as_deref() == Some("") {
            problems.push("application ping text must not be empty".to_owned());
        }
        if self.ping_text.is_some() && self.ping_interval.is_zero() {
            problems.push("application ping interval must be positive".to_owned());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_lists_every_problem() {
        let config = WebSocketUpstreamConfig {
            url_template: "http://user:secret@host/x".into(),
            subscribe_template: r#"{"subscribe": {stream_id}}"#.into(),
            seq_pointer: "seq".into(),
            range: Some(SeqRange::Prev("pu".into())),
            id_pointer: String::new(),
            ts_pointer: None,
            max_frame_bytes: 0,
            connect_timeout: Duration::ZERO,
            idle_timeout: Duration::ZERO,
            data_match: DataMatch::parse_list("/a=1,/b=1,/c=1,/d=1,/e=1,/f=1").unwrap(),
            ping_text: Some(String::new()),
            ping_interval: Duration::ZERO,
            connects_per_minute: 0,
            snapshot_match: Some(DataMatch {
                pointer: "type".into(),
                value: Some("snapshot".into()),
            }),
            unsubscribe_template: r#"{"unsubscribe": {stream_id}}"#.into(),
            streams_per_connection: 2,
            route_pointer: None,
            route_template: "{stream_id}".into(),
            subscribe_batch: 1,
            subscribes_per_second: 0,
            max_connection_age: Duration::ZERO,
        };
        let problems = config.validate().expect_err("invalid");
        assert_eq!(problems.len(), 14, "{problems:?}");
        assert!(!problems.join(" ").contains("secret"));
        assert_eq!(
            WebSocketUpstreamConfig::for_feed("ws://127.0.0.1:9/").validate(),
            Ok(())
        );
        let templated = WebSocketUpstreamConfig::for_feed("wss://feed.example/{stream_id}?key=k");
        assert_eq!(templated.validate(), Ok(()));
    }

    #[test]
    fn data_match_alternatives_parse_and_compare_as_text() {
        let alternatives =
            DataMatch::parse_list(" /type=match, /type=last_match ,/n=5,/ok=true").unwrap();
        assert_eq!(alternatives.len(), 4);
        assert_eq!(alternatives[0].pointer, "/type");
        assert_eq!(alternatives[1].value.as_deref(), Some("last_match"));
        let value = |json: &str| serde_json::from_str::<Value>(json).unwrap();
        assert!(alternatives[0].matches(Some(&value(r#""match""#))));
        assert!(!alternatives[0].matches(Some(&value(r#""heartbeat""#))));
        assert!(alternatives[2].matches(Some(&value("5"))));
        assert!(alternatives[3].matches(Some(&value("true"))));
        assert!(!alternatives[2].matches(None));
        assert_eq!(DataMatch::parse_list("").unwrap(), Vec::new());
        assert!(DataMatch::parse_list("type=match").is_err());
        // `=` inside the value is the value's.
        assert_eq!(
            DataMatch::parse_list("/a=b=c").unwrap()[0].value.as_deref(),
            Some("b=c")
        );
    }

    #[test]
    fn a_bare_pointer_matches_whatever_is_there() {
        let present = &DataMatch::parse_list("/1/as").unwrap()[0];
        assert_eq!(present.value, None);
        assert_eq!(present.to_string(), "/1/as");
        let frame: Value = serde_json::from_str(r#"[336, {"as": [], "bs": []}]"#).unwrap();
        assert!(present.matches(frame.pointer("/1/as")));
        assert!(!present.matches(frame.pointer("/1/a")));
        assert!(DataMatch::parse_list("as").is_err());
    }
}
