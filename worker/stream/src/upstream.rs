//! Upstream adapter (design §3.4): "connect to stream X from sequence N and give me
//! events", and a generic WebSocket JSON implementation configured by templates and
//! JSON pointers so it can point at a real feed or at the simulator.
//!
//! The adapter never reconnects: the caller owns the reconnect policy (backoff with
//! jitter) and learns why from [`UpstreamError::reason`]. Bad frames are skipped and
//! reported, never fatal, because one malformed message must not stall a stream.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use leasehold_telemetry::{SkipReason, TelemetryEvent, TelemetrySink};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message, http::Uri};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// The simulator's subscribe message; the default template.
pub const FEED_SUBSCRIBE_TEMPLATE: &str = r#"{"subscribe": "{stream_id}", "from_seq": {from_seq}}"#;
/// A close that the peer never acknowledges must not hold the caller.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Server error messages are echoed into our errors; keep them bounded.
const MAX_SERVER_MESSAGE: usize = 200;

/// One event as received.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamEvent {
    /// Sequence number read at the sequence pointer.
    pub seq: u64,
    /// Event id read at the id pointer (numbers are stringified).
    pub event_id: String,
    /// The frame's text as received.
    pub payload: String,
    /// When the frame was read off the socket.
    pub received_at: Instant,
}

/// A source of ordered events per stream.
#[async_trait::async_trait]
pub trait Upstream: Send + Sync + 'static {
    /// Connects and subscribes to `stream_id` starting at `from_seq` (0: from
    /// wherever the upstream starts; the first event then sets the sequence).
    async fn subscribe(
        &self,
        stream_id: &str,
        from_seq: u64,
    ) -> Result<Box<dyn Subscription>, UpstreamError>;
}

/// One live subscription.
#[async_trait::async_trait]
pub trait Subscription: Send {
    /// The next event, in sequence order. Frames over the size limit, non-JSON or
    /// binary frames, frames missing the seq/id fields, and already-delivered
    /// sequence numbers (seq < expected) are skipped and reported
    /// ([`TelemetryEvent::UpstreamFrameSkipped`]) — never an error, never a panic.
    /// A sequence jump (seq > expected) returns [`UpstreamError::Gap`]. After any
    /// error the subscription is finished and keeps returning that error.
    async fn next(&mut self) -> Result<UpstreamEvent, UpstreamError>;
    /// Closes the connection now (sends a close frame, best effort, bounded time).
    async fn close(&mut self);
}

/// Why a subscription could not start or stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    /// Could not connect, handshake or subscribe in time.
    #[error("could not connect to the upstream: {0}")]
    Connect(String),
    /// The server closed the connection or the socket failed.
    #[error("upstream connection closed: {0}")]
    Closed(String),
    /// The upstream skipped sequence numbers.
    #[error("sequence gap: expected {expected}, got {got}")]
    Gap {
        /// The sequence that should have come next.
        expected: u64,
        /// The sequence that came.
        got: u64,
    },
    /// The upstream no longer has the requested sequence.
    #[error("upstream no longer has sequence {requested} (earliest available: {})",
        earliest.map_or_else(|| "unknown".to_owned(), |e| e.to_string()))]
    RetentionExceeded {
        /// The sequence asked for.
        requested: u64,
        /// The oldest sequence the upstream still has, if it said.
        earliest: Option<u64>,
    },
    /// The server refused the subscription with an error frame.
    #[error("upstream rejected the subscription: {0}")]
    Rejected(String),
    /// The adapter's configuration is unusable.
    #[error("invalid upstream configuration: {0}")]
    Config(String),
}

impl UpstreamError {
    /// The reconnect metric's `reason` label.
    pub fn reason(&self) -> &'static str {
        match self {
            UpstreamError::Connect(_) => "connect",
            UpstreamError::Closed(_) => "closed",
            UpstreamError::Gap { .. } => "gap",
            UpstreamError::RetentionExceeded { .. } => "retention_exceeded",
            UpstreamError::Rejected(_) => "rejected",
            UpstreamError::Config(_) => "config",
        }
    }
}

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
    /// Frames larger than this are skipped.
    pub max_frame_bytes: usize,
    /// Bound on connect, handshake and sending the subscribe message.
    pub connect_timeout: Duration,
}

impl WebSocketUpstreamConfig {
    /// The simulator's protocol at `url`.
    pub fn for_feed(url: &str) -> Self {
        WebSocketUpstreamConfig {
            url_template: url.to_owned(),
            subscribe_template: FEED_SUBSCRIBE_TEMPLATE.to_owned(),
            seq_pointer: "/seq".to_owned(),
            id_pointer: "/event_id".to_owned(),
            max_frame_bytes: 1 << 20,
            connect_timeout: Duration::from_secs(5),
        }
    }

    /// Every problem with this configuration, not just the first.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        let url = render_url(&self.url_template, "stream");
        let redacted = redact_url(&self.url_template);
        if !(url.starts_with("ws://") || url.starts_with("wss://")) {
            problems.push(format!(
                "upstream URL {redacted} must start with ws:// or wss://"
            ));
        } else if url.parse::<Uri>().map_or(true, |uri| uri.host().is_none()) {
            problems.push(format!("upstream URL {redacted} is not a valid URL"));
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
        for (name, pointer) in [
            ("sequence", &self.seq_pointer),
            ("event id", &self.id_pointer),
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
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

/// A WebSocket JSON feed.
pub struct WebSocketUpstream {
    config: WebSocketUpstreamConfig,
    telemetry: Arc<dyn TelemetrySink>,
}

impl WebSocketUpstream {
    /// An adapter for `config`; problems surface as [`UpstreamError::Config`] on subscribe.
    pub fn new(config: WebSocketUpstreamConfig, telemetry: Arc<dyn TelemetrySink>) -> Self {
        WebSocketUpstream { config, telemetry }
    }
}

#[async_trait::async_trait]
impl Upstream for WebSocketUpstream {
    async fn subscribe(
        &self,
        stream_id: &str,
        from_seq: u64,
    ) -> Result<Box<dyn Subscription>, UpstreamError> {
        self.config
            .validate()
            .map_err(|problems| UpstreamError::Config(problems.join("; ")))?;
        let url = render_url(&self.config.url_template, stream_id);
        // Frames somewhat over the limit are read and skipped; only absurd ones
        // (which would cost unbounded memory) break the connection.
        let hard_limit = self.config.max_frame_bytes.saturating_mul(4).max(64 * 1024);
        let ws_config = WebSocketConfig::default()
            .max_message_size(Some(hard_limit))
            .max_frame_size(Some(hard_limit));
        let subscribe = (!self.config.subscribe_template.is_empty())
            .then(|| render_subscribe(&self.config.subscribe_template, stream_id, from_seq));
        let connect = async {
            let (mut ws, _response) =
                tokio_tungstenite::connect_async_with_config(url.as_str(), Some(ws_config), true)
                    .await?;
            if let Some(message) = subscribe {
                ws.send(Message::text(message)).await?;
            }
            Ok::<_, WsError>(ws)
        };
        let ws = match timeout(self.config.connect_timeout, connect).await {
            Ok(Ok(ws)) => ws,
            Ok(Err(error)) => return Err(UpstreamError::Connect(describe(&error, &url))),
            Err(_) => {
                return Err(UpstreamError::Connect(format!(
                    "{} timed out after {:?}",
                    redact_url(&url),
                    self.config.connect_timeout
                )));
            }
        };
        self.telemetry.emit(TelemetryEvent::UpstreamConnected {
            stream_id: stream_id.to_owned(),
            from_seq,
        });
        Ok(Box::new(WebSocketSubscription {
            ws,
            url,
            stream_id: stream_id.to_owned(),
            from_seq,
            expected: (from_seq > 0).then_some(from_seq),
            max_frame_bytes: self.config.max_frame_bytes,
            seq_pointer: self.config.seq_pointer.clone(),
            id_pointer: self.config.id_pointer.clone(),
            telemetry: self.telemetry.clone(),
            failed: None,
            disconnected: false,
        }))
    }
}

struct WebSocketSubscription {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    url: String,
    stream_id: String,
    from_seq: u64,
    /// `None` until the first event when subscribed from 0.
    expected: Option<u64>,
    max_frame_bytes: usize,
    seq_pointer: String,
    id_pointer: String,
    telemetry: Arc<dyn TelemetrySink>,
    failed: Option<UpstreamError>,
    disconnected: bool,
}

/// What one frame turned out to be.
enum Frame {
    Event(UpstreamEvent),
    Skip(SkipReason),
    Fail(UpstreamError),
}

impl WebSocketSubscription {
    fn skip(&self, reason: SkipReason) {
        self.telemetry.emit(TelemetryEvent::UpstreamFrameSkipped {
            stream_id: self.stream_id.clone(),
            reason,
        });
    }

    /// Reports the end of the connection once, whichever of close, drop or a
    /// closed socket comes first.
    fn disconnected(&mut self) {
        if !std::mem::replace(&mut self.disconnected, true) {
            self.telemetry.emit(TelemetryEvent::UpstreamDisconnected {
                stream_id: self.stream_id.clone(),
            });
        }
    }

    fn fail(&mut self, error: UpstreamError) -> UpstreamError {
        if matches!(error, UpstreamError::Closed(_)) {
            self.disconnected();
        }
        self.failed = Some(error.clone());
        error
    }

    fn classify(&mut self, text: &str, received_at: Instant) -> Frame {
        if text.len() > self.max_frame_bytes {
            return Frame::Skip(SkipReason::TooLarge);
        }
        let Ok(value) = serde_json::from_str::<Value>(text) else {
            return Frame::Skip(SkipReason::NotJson);
        };
        let seq = value.pointer(&self.seq_pointer).and_then(|v| match v {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.parse().ok(),
            _ => None,
        });
        let Some(seq) = seq else {
            return match server_error(&value, self.expected.unwrap_or(self.from_seq)) {
                Some(error) => Frame::Fail(error),
                None => Frame::Skip(SkipReason::MissingField),
            };
        };
        let event_id = match value.pointer(&self.id_pointer) {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => return Frame::Skip(SkipReason::MissingField),
        };
        let expected = *self.expected.get_or_insert(seq);
        if seq < expected {
            return Frame::Skip(SkipReason::Duplicate);
        }
        if seq > expected {
            return Frame::Fail(UpstreamError::Gap { expected, got: seq });
        }
        self.expected = Some(seq + 1);
        Frame::Event(UpstreamEvent {
            seq,
            event_id,
            payload: text.to_owned(),
            received_at,
        })
    }
}

#[async_trait::async_trait]
impl Subscription for WebSocketSubscription {
    async fn next(&mut self) -> Result<UpstreamEvent, UpstreamError> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        loop {
            let message = self.ws.next().await;
            let received_at = Instant::now();
            let frame = match message {
                Some(Ok(Message::Text(text))) => self.classify(text.as_str(), received_at),
                Some(Ok(Message::Binary(_))) => Frame::Skip(SkipReason::NotJson),
                // tungstenite answers pings itself while we keep reading.
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => continue,
                Some(Ok(Message::Close(frame))) => {
                    Frame::Fail(UpstreamError::Closed(match frame {
                        Some(frame) => {
                            format!("server sent close {}: {}", frame.code, frame.reason)
                        }
                        None => "server sent close".to_owned(),
                    }))
                }
                Some(Err(WsError::Capacity(error))) => Frame::Fail(UpstreamError::Closed(format!(
                    "frame beyond the hard size limit, connection unusable: {error}"
                ))),
                Some(Err(error)) => Frame::Fail(UpstreamError::Closed(describe(&error, &self.url))),
                None => Frame::Fail(UpstreamError::Closed("connection ended".to_owned())),
            };
            match frame {
                Frame::Event(event) => return Ok(event),
                Frame::Skip(reason) => self.skip(reason),
                Frame::Fail(error) => return Err(self.fail(error)),
            }
        }
    }

    async fn close(&mut self) {
        if self.disconnected {
            return;
        }
        let _ = timeout(CLOSE_TIMEOUT, async {
            if self.ws.close(None).await.is_ok() {
                // Wait for the close reply so the server sees a clean close.
                while let Some(Ok(_)) = self.ws.next().await {}
            }
        })
        .await;
        self.failed = Some(UpstreamError::Closed("closed by this client".to_owned()));
        self.disconnected();
    }
}

impl Drop for WebSocketSubscription {
    fn drop(&mut self) {
        self.disconnected();
    }
}

/// An `{"error": ..., "code": ...}` frame from the server, if this is one.
fn server_error(value: &Value, requested: u64) -> Option<UpstreamError> {
    let error = value.get("error")?;
    let code = value
        .get("code")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    if code == "retention_exceeded" {
        return Some(UpstreamError::RetentionExceeded {
            requested,
            earliest: value.get("earliest_seq").and_then(Value::as_u64),
        });
    }
    let message = match error {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let message: String = message.chars().take(MAX_SERVER_MESSAGE).collect();
    Some(UpstreamError::Rejected(format!("{code}: {message}")))
}

/// A tungstenite error as text, with the URL's secrets removed in case the error
/// echoes any part of it.
fn describe(error: &WsError, url: &str) -> String {
    let mut text = format!("{}: {error}", redact_url(url));
    for secret in url_secrets(url) {
        text = text.replace(secret, "***");
    }
    text
}

fn looks_like_json(template: &str) -> bool {
    matches!(template.trim_start().chars().next(), Some('{' | '['))
}

fn render_url(template: &str, stream_id: &str) -> String {
    substitute(template, &[("{stream_id}", &percent_encode(stream_id))])
}

fn render_subscribe(template: &str, stream_id: &str, from_seq: u64) -> String {
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

/// Percent-encodes everything but RFC 3986 unreserved characters, so a stream id
/// is always exactly one path segment or query value.
fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The userinfo and the query of a URL: the parts that may carry credentials.
fn url_secrets(url: &str) -> Vec<&str> {
    let (authority, path) = split_url(url);
    let mut secrets = Vec::new();
    if let Some(at) = authority.rfind('@') {
        secrets.push(&authority[..at]);
    }
    if let Some(q) = path.find('?') {
        let query = path[q + 1..].split('#').next().unwrap_or("");
        secrets.push(query);
    }
    secrets.retain(|s| !s.is_empty());
    secrets
}

/// `scheme://host/path` with userinfo and query replaced by `***`.
pub fn redact_url(url: &str) -> String {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let (authority, path) = split_url(url);
    let host = authority
        .rfind('@')
        .map_or(authority, |at| &authority[at + 1..]);
    let userinfo = if authority.contains('@') { "***@" } else { "" };
    let path = path.split('#').next().unwrap_or("");
    let path = match path.find('?') {
        Some(q) => format!("{}?***", &path[..q]),
        None => path.to_owned(),
    };
    format!("{}{userinfo}{host}{path}", &url[..scheme_end])
}

/// Splits after the scheme into (authority, path-query-fragment).
fn split_url(url: &str) -> (&str, &str) {
    let rest = url.find("://").map_or(url, |i| &url[i + 3..]);
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    rest.split_at(end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_feed::{FeedConfig, FeedServer, event_frame};
    use leasehold_telemetry::RecordingSink;
    use std::net::SocketAddr;
    use tokio::net::TcpListener;
    use tokio::task::JoinHandle;
    use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
    use tokio_util::sync::CancellationToken;

    /// Generous: only a broken implementation takes this long.
    const WAIT: Duration = Duration::from_secs(10);

    fn upstream(config: WebSocketUpstreamConfig) -> (WebSocketUpstream, RecordingSink) {
        let sink = RecordingSink::new();
        (WebSocketUpstream::new(config, Arc::new(sink.clone())), sink)
    }

    async fn feed(config: FeedConfig) -> (FeedServer, CancellationToken) {
        let shutdown = CancellationToken::new();
        let server = FeedServer::start(([127, 0, 0, 1], 0).into(), config, shutdown.clone())
            .await
            .expect("feed starts");
        (server, shutdown)
    }

    async fn subscribe(
        upstream: &WebSocketUpstream,
        stream_id: &str,
        from_seq: u64,
    ) -> Result<Box<dyn Subscription>, UpstreamError> {
        timeout(WAIT, upstream.subscribe(stream_id, from_seq))
            .await
            .expect("subscribe in time")
    }

    async fn next(sub: &mut Box<dyn Subscription>) -> Result<UpstreamEvent, UpstreamError> {
        timeout(WAIT, sub.next()).await.expect("next in time")
    }

    /// What a scripted server saw from the client.
    #[derive(Debug)]
    struct Seen {
        uri: String,
        subscribe: Option<String>,
    }

    /// A one-connection server that optionally waits for a subscribe message, sends
    /// `frames`, then stays open until the client leaves.
    // tungstenite's handshake callback fixes the (large) error type.
    #[allow(clippy::result_large_err)]
    async fn scripted(
        wait_for_subscribe: bool,
        frames: Vec<Message>,
    ) -> (SocketAddr, JoinHandle<Seen>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.expect("accept");
            let mut uri = String::new();
            let mut ws =
                tokio_tungstenite::accept_hdr_async(tcp, |req: &Request, resp: Response| {
                    uri = req.uri().to_string();
                    Ok(resp)
                })
                .await
                .expect("handshake");
            let mut subscribe = None;
            if wait_for_subscribe {
                while let Some(Ok(message)) = ws.next().await {
                    if let Message::Text(text) = message {
                        subscribe = Some(text.to_string());
                        break;
                    }
                }
            }
            for frame in frames {
                if ws.send(frame).await.is_err() {
                    break;
                }
            }
            while let Some(Ok(_)) = ws.next().await {}
            Seen { uri, subscribe }
        });
        (addr, task)
    }

    fn skipped(stream_id: &str, reason: SkipReason) -> TelemetryEvent {
        TelemetryEvent::UpstreamFrameSkipped {
            stream_id: stream_id.to_owned(),
            reason,
        }
    }

    #[tokio::test]
    async fn reads_the_feed_in_order_and_reports_connect_and_disconnect_once() {
        let (server, shutdown) = feed(FeedConfig {
            rate: 0.01,
            retention: 1000,
            backlog: 50,
        })
        .await;
        let (upstream, telemetry) = upstream(WebSocketUpstreamConfig::for_feed(&server.url()));
        let mut sub = subscribe(&upstream, "eth-usd", 1)
            .await
            .expect("subscribed");
        for seq in 1..=50 {
            let event = next(&mut sub).await.expect("event");
            assert_eq!(event.seq, seq);
            assert_eq!(event.event_id, format!("eth-usd:{seq}"));
            assert_eq!(
                event.payload,
                event_frame("eth-usd", seq, server.ts_ms(seq))
            );
        }
        timeout(WAIT, sub.close()).await.expect("close in time");
        timeout(WAIT, sub.close())
            .await
            .expect("second close in time");
        assert_eq!(next(&mut sub).await.map_err(|e| e.reason()), Err("closed"));
        drop(sub);
        let stream_id = "eth-usd".to_owned();
        assert_eq!(
            telemetry.take(),
            vec![
                TelemetryEvent::UpstreamConnected {
                    stream_id: stream_id.clone(),
                    from_seq: 1
                },
                TelemetryEvent::UpstreamDisconnected { stream_id },
            ]
        );
        shutdown.cancel();
        timeout(WAIT, server.finished()).await.expect("feed stops");
    }

    #[tokio::test]
    async fn replays_a_large_backlog_in_order() {
        let (server, shutdown) = feed(FeedConfig {
            rate: 0.01,
            retention: 100_000,
            backlog: 20_000,
        })
        .await;
        let (upstream, _) = upstream(WebSocketUpstreamConfig::for_feed(&server.url()));
        let mut sub = subscribe(&upstream, "bulk", 1).await.expect("subscribed");
        for seq in 1..=20_000 {
            assert_eq!(next(&mut sub).await.expect("event").seq, seq);
        }
        drop(sub);
        shutdown.cancel();
        timeout(WAIT, server.finished()).await.expect("feed stops");
    }

    #[tokio::test]
    async fn retention_exceeded_carries_the_earliest_sequence() {
        let (server, shutdown) = feed(FeedConfig {
            rate: 0.01,
            retention: 10,
            backlog: 100,
        })
        .await;
        let (upstream, _) = upstream(WebSocketUpstreamConfig::for_feed(&server.url()));
        let mut sub = subscribe(&upstream, "s", 5).await.expect("subscribed");
        let expected = UpstreamError::RetentionExceeded {
            requested: 5,
            earliest: Some(91),
        };
        assert_eq!(next(&mut sub).await, Err(expected.clone()));
        assert_eq!(expected.reason(), "retention_exceeded");
        // The subscription stays finished.
        assert_eq!(next(&mut sub).await, Err(expected));
        drop(sub);
        shutdown.cancel();
        timeout(WAIT, server.finished()).await.expect("feed stops");
    }

    #[tokio::test]
    async fn bad_frames_are_skipped_and_reported_and_a_jump_is_a_gap() {
        let event = |seq: u64| Message::text(format!(r#"{{"seq":{seq},"event_id":"s:{seq}"}}"#));
        let oversized = format!(
            r#"{{"seq":2,"event_id":"s:2","pad":"{}"}}"#,
            "x".repeat(2000)
        );
        let (addr, server) = scripted(
            true,
            vec![
                event(1),
                Message::text("not json"),
                Message::binary(br#"{"seq":2,"event_id":"s:2"}"#.to_vec()),
                Message::text(oversized),
                Message::text(r#"{"event_id":"s:2"}"#),
                Message::text(r#"{"seq":2,"event_id":{"nested":true}}"#),
                Message::Ping(vec![1].into()),
                event(2),
                event(1),
                event(2),
                event(5),
            ],
        )
        .await;
        let mut config = WebSocketUpstreamConfig::for_feed(&format!("ws://{addr}/"));
        config.max_frame_bytes = 1024;
        let (upstream, telemetry) = upstream(config);
        let mut sub = subscribe(&upstream, "s", 1).await.expect("subscribed");
        assert_eq!(next(&mut sub).await.expect("event").seq, 1);
        let second = next(&mut sub).await.expect("event");
        assert_eq!((second.seq, second.event_id.as_str()), (2, "s:2"));
        assert_eq!(
            next(&mut sub).await,
            Err(UpstreamError::Gap {
                expected: 3,
                got: 5
            })
        );
        drop(sub);
        let seen = timeout(WAIT, server)
            .await
            .expect("server ends")
            .expect("server ok");
        assert_eq!(
            seen.subscribe.as_deref(),
            Some(r#"{"subscribe": "s", "from_seq": 1}"#)
        );
        assert_eq!(
            telemetry.take(),
            vec![
                TelemetryEvent::UpstreamConnected {
                    stream_id: "s".into(),
                    from_seq: 1
                },
                skipped("s", SkipReason::NotJson),
                skipped("s", SkipReason::NotJson),
                skipped("s", SkipReason::TooLarge),
                skipped("s", SkipReason::MissingField),
                skipped("s", SkipReason::MissingField),
                skipped("s", SkipReason::Duplicate),
                skipped("s", SkipReason::Duplicate),
                TelemetryEvent::UpstreamDisconnected {
                    stream_id: "s".into()
                },
            ]
        );
    }

    #[tokio::test]
    async fn a_frame_beyond_the_hard_limit_closes_instead_of_buffering() {
        let (addr, _server) = scripted(false, vec![Message::text("x".repeat(200_000))]).await;
        let mut config = WebSocketUpstreamConfig::for_feed(&format!("ws://{addr}/"));
        config.max_frame_bytes = 1024;
        let (upstream, _) = upstream(config);
        let mut sub = subscribe(&upstream, "s", 1).await.expect("subscribed");
        assert_eq!(next(&mut sub).await.map_err(|e| e.reason()), Err("closed"));
    }

    #[tokio::test]
    async fn custom_url_subscribe_template_and_pointers() {
        let frame = |seq: u64, id: u64| {
            Message::text(format!(
                r#"{{"data":{{"sequence":{seq},"id":{id}}},"px":1.5}}"#
            ))
        };
        let (addr, server) = scripted(true, vec![frame(7, 700), frame(8, 800)]).await;
        let config = WebSocketUpstreamConfig {
            url_template: format!("ws://{addr}/streams/{{stream_id}}?depth=1"),
            subscribe_template: r#"{"op":"sub","args":["{stream_id}"],"since":{from_seq}}"#.into(),
            seq_pointer: "/data/sequence".into(),
            id_pointer: "/data/id".into(),
            ..WebSocketUpstreamConfig::for_feed("unused")
        };
        let (upstream, _) = upstream(config);
        let stream_id = r#"a"b/c {from_seq}"#;
        let mut sub = subscribe(&upstream, stream_id, 7)
            .await
            .expect("subscribed");
        let first = next(&mut sub).await.expect("event");
        assert_eq!((first.seq, first.event_id.as_str()), (7, "700"));
        assert_eq!(
            first.payload,
            r#"{"data":{"sequence":7,"id":700},"px":1.5}"#
        );
        assert_eq!(next(&mut sub).await.expect("event").event_id, "800");
        sub.close().await;
        let seen = timeout(WAIT, server)
            .await
            .expect("server ends")
            .expect("server ok");
        assert_eq!(seen.uri, "/streams/a%22b%2Fc%20%7Bfrom_seq%7D?depth=1");
        let sent: Value =
            serde_json::from_str(&seen.subscribe.expect("subscribe sent")).expect("JSON");
        assert_eq!(
            sent["args"][0], stream_id,
            "stream id escaped, not re-substituted"
        );
        assert_eq!(sent["since"], 7);
    }

    #[tokio::test]
    async fn empty_template_sends_nothing_and_from_zero_starts_anywhere() {
        let frames = vec![
            Message::text(r#"{"seq":42,"event_id":"x"}"#),
            Message::text(r#"{"seq":43,"event_id":"y"}"#),
        ];
        let (addr, server) = scripted(false, frames).await;
        let mut config = WebSocketUpstreamConfig::for_feed(&format!("ws://{addr}/"));
        config.subscribe_template = String::new();
        let (upstream, _) = upstream(config);
        let mut sub = subscribe(&upstream, "s", 0).await.expect("subscribed");
        assert_eq!(next(&mut sub).await.expect("event").seq, 42);
        assert_eq!(next(&mut sub).await.expect("event").seq, 43);
        sub.close().await;
        let seen = timeout(WAIT, server)
            .await
            .expect("server ends")
            .expect("server ok");
        assert_eq!(seen.subscribe, None);
    }

    #[tokio::test]
    async fn other_server_errors_and_close_frames_end_the_subscription() {
        let (addr, _server) = scripted(
            false,
            vec![Message::text(
                r#"{"error":"no such stream","code":"not_found"}"#,
            )],
        )
        .await;
        let (upstream_a, _) = upstream(WebSocketUpstreamConfig::for_feed(&format!("ws://{addr}/")));
        let mut sub = subscribe(&upstream_a, "s", 1).await.expect("subscribed");
        assert_eq!(
            next(&mut sub).await,
            Err(UpstreamError::Rejected("not_found: no such stream".into()))
        );

        let (addr, _server) = scripted(false, vec![Message::Close(None)]).await;
        let (upstream_b, telemetry) =
            upstream(WebSocketUpstreamConfig::for_feed(&format!("ws://{addr}/")));
        let mut sub = subscribe(&upstream_b, "s", 1).await.expect("subscribed");
        assert_eq!(next(&mut sub).await.map_err(|e| e.reason()), Err("closed"));
        drop(sub);
        let disconnects = telemetry
            .take()
            .into_iter()
            .filter(|e| matches!(e, TelemetryEvent::UpstreamDisconnected { .. }))
            .count();
        assert_eq!(disconnects, 1);
    }

    #[tokio::test]
    async fn connect_errors_never_show_credentials() {
        // A port that was just free: connection refused.
        let port = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        for url in [
            format!("ws://user:pass@127.0.0.1:{port}/x?token=abc"),
            "wss://user:pass@127.0.0.1:1/x?token=abc".to_owned(),
        ] {
            let (upstream, telemetry) = upstream(WebSocketUpstreamConfig::for_feed(&url));
            let error = match upstream.subscribe("s", 1).await {
                Err(error) => error,
                Ok(_) => panic!("connecting to {url} should fail"),
            };
            assert_eq!(error.reason(), "connect", "{error}");
            let text = format!("{error} {error:?}");
            for secret in ["user", "pass", "token", "abc"] {
                assert!(!text.contains(secret), "{secret} leaked in {text}");
            }
            assert!(text.contains("127.0.0.1"), "{text}");
            assert!(
                telemetry.take().is_empty(),
                "no connect event for a failed connect"
            );
        }
    }

    #[tokio::test]
    async fn feed_shutdown_ends_the_subscription_as_closed() {
        let (server, shutdown) = feed(FeedConfig {
            rate: 100.0,
            ..FeedConfig::default()
        })
        .await;
        let (upstream, telemetry) = upstream(WebSocketUpstreamConfig::for_feed(&server.url()));
        let mut sub = subscribe(&upstream, "s", 1).await.expect("subscribed");
        assert_eq!(next(&mut sub).await.expect("event").seq, 1);
        shutdown.cancel();
        let error = loop {
            match next(&mut sub).await {
                Ok(_) => continue,
                Err(error) => break error,
            }
        };
        assert_eq!(error.reason(), "closed", "{error}");
        timeout(WAIT, server.finished()).await.expect("feed stops");
        drop(sub);
        let events = telemetry.take();
        assert_eq!(
            events.last(),
            Some(&TelemetryEvent::UpstreamDisconnected {
                stream_id: "s".into()
            })
        );
        assert_eq!(events.len(), 2, "{events:?}");
    }

    #[test]
    fn validate_lists_every_problem() {
        let config = WebSocketUpstreamConfig {
            url_template: "http://user:secret@host/x".into(),
            subscribe_template: r#"{"subscribe": {stream_id}}"#.into(),
            seq_pointer: "seq".into(),
            id_pointer: String::new(),
            max_frame_bytes: 0,
            connect_timeout: Duration::ZERO,
        };
        let problems = config.validate().expect_err("invalid");
        assert_eq!(problems.len(), 6, "{problems:?}");
        assert!(!problems.join(" ").contains("secret"));
        assert_eq!(
            WebSocketUpstreamConfig::for_feed("ws://127.0.0.1:9/").validate(),
            Ok(())
        );
        let templated = WebSocketUpstreamConfig::for_feed("wss://feed.example/{stream_id}?key=k");
        assert_eq!(templated.validate(), Ok(()));
    }

    #[tokio::test]
    async fn subscribe_refuses_an_invalid_config() {
        let (upstream, _) = upstream(WebSocketUpstreamConfig::for_feed("http://host/"));
        let error = upstream.subscribe("s", 1).await.err().expect("refused");
        assert_eq!(error.reason(), "config");
    }

    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            redact_url("wss://user:pass@host:443/x?token=abc#frag"),
            "wss://***@host:443/x?***"
        );
        assert_eq!(redact_url("ws://host/path"), "ws://host/path");
        assert_eq!(redact_url("ws://u@host?k=v"), "ws://***@host?***");
        assert_eq!(
            url_secrets("wss://user:pass@host/x?token=abc"),
            vec!["user:pass", "token=abc"]
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
