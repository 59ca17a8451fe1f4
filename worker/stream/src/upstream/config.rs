//! How to reach a WebSocket JSON feed, checked before the first connect.

use std::time::Duration;

use serde_json::Value;

use super::redact::redact_url;
use super::template::{looks_like_json, render_subscribe, render_url};

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
}

impl WebSocketUpstreamConfig {
    /// The simulator's protocol at `url`.
    pub fn for_feed(url: &str) -> Self {
        WebSocketUpstreamConfig {
            url_template: url.to_owned(),
            subscribe_template: FEED_SUBSCRIBE_TEMPLATE.to_owned(),
            seq_pointer: "/seq".to_owned(),
            id_pointer: "/event_id".to_owned(),
            ts_pointer: None,
            max_frame_bytes: 1 << 20,
            connect_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(15),
        }
    }

    /// Every problem with this configuration, not just the first.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        let url = render_url(&self.url_template, "stream");
        let redacted = redact_url(&self.url_template);
        match url::Url::parse(&url) {
            Ok(parsed) if !matches!(parsed.scheme(), "ws" | "wss") => problems.push(format!(
                "upstream URL {redacted} must start with ws:// or wss://"
            )),
            Ok(parsed) if parsed.host().is_none() => {
                problems.push(format!("upstream URL {redacted} names no host"));
            }
            Ok(_) => {}
            Err(_) => problems.push(format!("upstream URL {redacted} is not a valid URL")),
        }
        if looks_like_json(&self.subscribe_template) {
            let sample = render_subscribe(&self.subscribe_template, "a\"b\\c", 1);
            if serde_json::from_str::<Value>(&sample).is_err() {
                problems.push(
                    "subscribe template looks like JSON but is not valid JSON after substitution"
                        .to_owned(),
                );
            }
        }
        let ts_pointer = self.ts_pointer.clone().unwrap_or_else(|| "/".to_owned());
        for (name, pointer) in [
            ("sequence", &self.seq_pointer),
            ("event id", &self.id_pointer),
            ("event time", &ts_pointer),
        ] {
            if !pointer.starts_with('/') {
                problems.push(format!(
                    "{name} pointer {pointer:?} must be a JSON pointer starting with /"
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
            id_pointer: String::new(),
            ts_pointer: None,
            max_frame_bytes: 0,
            connect_timeout: Duration::ZERO,
            idle_timeout: Duration::ZERO,
        };
        let problems = config.validate().expect_err("invalid");
        assert_eq!(problems.len(), 7, "{problems:?}");
        assert!(!problems.join(" ").contains("secret"));
        assert_eq!(
            WebSocketUpstreamConfig::for_feed("ws://127.0.0.1:9/").validate(),
            Ok(())
        );
        let templated = WebSocketUpstreamConfig::for_feed("wss://feed.example/{stream_id}?key=k");
        assert_eq!(templated.validate(), Ok(()));
    }
}
