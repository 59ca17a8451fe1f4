//! [`WebSocketUpstream`]: a WebSocket JSON feed, one connection per subscription.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, SinkExt, StreamExt};
use leasehold_control::clock::SystemClock;
use leasehold_telemetry::{SkipReason, TelemetryEvent, TelemetrySink};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message, Utf8Bytes};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::budget::ConnectBudget;
use super::extract::Extractor;
use super::redact::{redact_url, url_secrets};
use super::template::{render_subscribe, render_url};
use super::{
    SeqRange, Subscription, Upstream, UpstreamError, UpstreamEvent, WebSocketUpstreamConfig,
};

/// A close that the peer never acknowledges must not hold the caller.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Bytes read from the socket at most per read (tungstenite's default is 128 KiB).
const READ_BUFFER_BYTES: usize = 16 * 1024;
/// Server error messages are echoed into our errors; keep them bounded.
const MAX_SERVER_MESSAGE: usize = 200;

/// A WebSocket JSON feed.
pub struct WebSocketUpstream {
    config: WebSocketUpstreamConfig,
    telemetry: Arc<dyn TelemetrySink>,
    /// Shared by every stream of the worker (one adapter per worker).
    budget: std::sync::Mutex<ConnectBudget>,
}

/// The window `UPSTREAM_CONNECTS_PER_MINUTE` counts over.
const CONNECT_WINDOW: Duration = Duration::from_secs(60);

impl WebSocketUpstream {
    /// An adapter for `config`; problems surface as [`UpstreamError::Config`] on subscribe.
    pub fn new(config: WebSocketUpstreamConfig, telemetry: Arc<dyn TelemetrySink>) -> Self {
        let budget = ConnectBudget::new(config.connects_per_minute, CONNECT_WINDOW);
        WebSocketUpstream {
            config,
            telemetry,
            budget: std::sync::Mutex::new(budget),
        }
    }

    /// This adapter, its connects counted by `budget` (tests: a short window).
    pub fn with_connect_budget(mut self, budget: ConnectBudget) -> Self {
        self.budget = std::sync::Mutex::new(budget);
        self
    }

    /// Waits until the worker's connect budget lets this connect go;
    /// a wait is reported (`leasehold_upstream_connects_throttled_total`).
    async fn wait_for_the_budget(&self, stream_id: &str) {
        let asked = Instant::now();
        let at = self
            .budget
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .reserve(asked);
        if at > asked {
            self.telemetry
                .emit(TelemetryEvent::UpstreamConnectThrottled {
                    stream_id: stream_id.to_owned(),
                    wait: at - asked,
                });
            tokio::time::sleep_until(at).await;
        }
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
        self.wait_for_the_budget(stream_id).await;
        let url = render_url(&self.config.url_template, stream_id);
        // Frames somewhat over the limit are read and skipped; only absurd ones
        // (which would cost unbounded memory) break the connection.
        let hard_limit = self.config.max_frame_bytes.saturating_mul(4).max(64 * 1024);
        // tungstenite zeroes its whole read chunk before every read, a pending
        // one included (128 KiB by default: the top frame of the profile).
        // Feed frames are small; 16 KiB still takes ~100 of them per read.
        let ws_config = WebSocketConfig::default()
            .max_message_size(Some(hard_limit))
            .max_frame_size(Some(hard_limit))
            .read_buffer_size(READ_BUFFER_BYTES);
        let subscribe = (!self.config.subscribe_template.is_empty())
            .then(|| render_subscribe(&self.config.subscribe_template, stream_id, from_seq));
        let resubscribe = match (&subscribe, self.config.unsubscribe_template.as_str()) {
            (Some(subscribe), unsubscribe) if !unsubscribe.is_empty() => Some((
                render_subscribe(unsubscribe, stream_id, from_seq),
                subscribe.clone(),
            )),
            _ => None,
        };
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
        let match_pointers = self.config.data_match_pointers();
        let mut pointers = vec![
            self.config.seq_pointer.as_str(),
            self.config.id_pointer.as_str(),
            self.config.ts_pointer.as_deref().unwrap_or("none"),
            self.config.range.as_ref().map_or("none", SeqRange::pointer),
        ];
        pointers.extend(&match_pointers);
        let snapshot_match = self.config.snapshot_match.as_ref().map(|snapshot| {
            pointers.push(snapshot.pointer.as_str());
            (pointers.len() - 1, snapshot.clone())
        });
        let data_match = self
            .config
            .data_match
            .iter()
            .map(|alternative| {
                let slot = match_pointers
                    .iter()
                    .position(|p| *p == alternative.pointer)
                    .unwrap_or_default();
                (FIRST_MATCH_SLOT + slot, alternative.clone())
            })
            .collect();
        let now = Instant::now();
        Ok(Box::new(WebSocketSubscription {
            ws,
            url,
            stream_id: stream_id.to_owned(),
            from_seq,
            max_frame_bytes: self.config.max_frame_bytes,
            range: self.config.range.clone(),
            extractor: Extractor::new(&pointers),
            data_match,
            snapshot_match,
            resubscribe,
            app_ping: self.config.ping_text.clone().map(|text| AppPing {
                text,
                interval: self.config.ping_interval,
                next: now + self.config.ping_interval,
            }),
            telemetry: self.telemetry.clone(),
            failed: None,
            disconnected: false,
            idle_timeout: self.config.idle_timeout,
            last_heard: now,
            next_ping: now + self.config.idle_timeout / 3,
        }))
    }
}

/// Where the data-match pointers start in the extractor's output (after the
/// sequence, id, time and range start).
const FIRST_MATCH_SLOT: usize = 4;

/// A sequence as a frame writes it: a number, or a number in a string (JSON
/// numbers past 2^53 are often sent as strings).
fn sequence_number(value: Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// An application-level ping: text the upstream wants on a schedule.
struct AppPing {
    text: String,
    interval: Duration,
    next: Instant,
}

struct WebSocketSubscription {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    url: String,
    stream_id: String,
    from_seq: u64,
    max_frame_bytes: usize,
    /// Where a frame says which sequences it covers, if it does.
    range: Option<SeqRange>,
    /// The sequence, id and time pointers, in that order (a missing time
    /// pointer is one that never resolves), then the data-match pointers.
    extractor: Extractor,
    /// `UPSTREAM_DATA_MATCH`: (extractor slot, alternative); empty: all data.
    data_match: Vec<(usize, super::config::DataMatch)>,
    /// `UPSTREAM_SNAPSHOT_MATCH`: (extractor slot, condition).
    snapshot_match: Option<(usize, super::config::DataMatch)>,
    /// The unsubscribe and subscribe messages that ask for a new snapshot.
    resubscribe: Option<(String, String)>,
    app_ping: Option<AppPing>,
    telemetry: Arc<dyn TelemetrySink>,
    failed: Option<UpstreamError>,
    disconnected: bool,
    idle_timeout: Duration,
    /// When the upstream last sent anything (data, ping, pong, close).
    last_heard: Instant,
    next_ping: Instant,
}

/// What woke a subscription that waits for a frame.
enum Wake {
    Message(Option<Result<Message, WsError>>),
    Ping,
    AppPing,
    Idle,
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
        if matches!(error, UpstreamError::Closed(_) | UpstreamError::Idle(_)) {
            self.disconnected();
        }
        self.failed = Some(error.clone());
        error
    }

    /// One message read: an event or the subscription's end (`None`: a
    /// frame that is skipped or answered by tungstenite, read on).
    fn take(
        &mut self,
        message: Option<Result<Message, WsError>>,
    ) -> Option<Result<UpstreamEvent, UpstreamError>> {
        let received_at = Instant::now();
        self.last_heard = received_at;
        let frame = match message {
            Some(Ok(Message::Text(text))) => self.classify(text, received_at),
            Some(Ok(Message::Binary(_))) => Frame::Skip(SkipReason::NotJson),
            // tungstenite answers pings itself while we keep reading.
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => return None,
            Some(Ok(Message::Close(frame))) => Frame::Fail(UpstreamError::Closed(match frame {
                Some(frame) => format!("server sent close {}: {}", frame.code, frame.reason),
                None => "server sent close".to_owned(),
            })),
            Some(Err(WsError::Capacity(error))) => Frame::Fail(UpstreamError::Closed(format!(
                "frame beyond the hard size limit, connection unusable: {error}"
            ))),
            Some(Err(error)) => Frame::Fail(UpstreamError::Closed(describe(&error, &self.url))),
            None => Frame::Fail(UpstreamError::Closed("connection ended".to_owned())),
        };
        match frame {
            Frame::Event(event) => Some(Ok(event)),
            Frame::Skip(reason) => {
                self.skip(reason);
                None
            }
            Frame::Fail(error) => Some(Err(self.fail(error))),
        }
    }

    fn classify(&mut self, frame: Utf8Bytes, received_at: Instant) -> Frame {
        let text = frame.as_str();
        if text.len() > self.max_frame_bytes {
            return Frame::Skip(SkipReason::TooLarge);
        }
        // Only the pointed-at fields are read; the payload stays the frame's text.
        let Ok(mut fields) = self.extractor.extract(text) else {
            // An application ping's reply is often plain text (`pong`).
            return Frame::Skip(if self.app_ping.is_some() {
                SkipReason::Control
            } else {
                SkipReason::NotJson
            });
        };
        if !self.data_match.is_empty()
            && !self
                .data_match
                .iter()
                .any(|(slot, alternative)| alternative.matches(fields[*slot].as_ref()))
        {
            // Acknowledgements, heartbeats, status and ping replies; an
            // error frame still ends the subscription.
            let value = serde_json::from_str::<Value>(text).unwrap_or_default();
            return match server_error(&value, self.from_seq) {
                Some(error) => Frame::Fail(error),
                None => Frame::Skip(SkipReason::Control),
            };
        }
        let snapshot = self
            .snapshot_match
            .as_ref()
            .is_some_and(|(slot, condition)| condition.matches(fields[*slot].as_ref()));
        fields.truncate(FIRST_MATCH_SLOT);
        let [seq, event_id, ts, range] = <[Option<Value>; 4]>::try_from(fields).unwrap_or_default();
        let seq = seq.and_then(sequence_number);
        let Some(seq) = seq else {
            // Rare: an error frame (or a bad one) is worth a full parse.
            let value = serde_json::from_str::<Value>(text).unwrap_or_default();
            return match server_error(&value, self.from_seq) {
                Some(error) => Frame::Fail(error),
                None => Frame::Skip(SkipReason::MissingField),
            };
        };
        let event_id = match event_id {
            Some(Value::String(s)) if !s.is_empty() => s,
            Some(Value::Number(n)) => n.to_string(),
            _ => return Frame::Skip(SkipReason::MissingField),
        };
        // A frame that should say where its range starts and does not
        // cannot be placed: skipped like one without its sequence.
        let first_seq = match &self.range {
            // A snapshot is the whole book at its sequence: it covers no range.
            _ if snapshot => None,
            None => None,
            Some(kind) => match range.and_then(sequence_number) {
                Some(value) => Some(kind.first(value)),
                None => return Frame::Skip(SkipReason::MissingField),
            },
        };
        // Replays and holes are the runner's to judge (`crate::sequence`).
        let arrival_lag = ts
            .as_ref()
            .and_then(Value::as_f64)
            .map(|event_ms| SystemClock.seconds_since(event_ms));
        Frame::Event(UpstreamEvent {
            seq,
            first_seq,
            event_id,
            payload: leasehold_sink::Payload::from_shared(frame.into()),
            snapshot,
            received_at,
            arrival_lag,
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
            // A half-open TCP connection or a frozen upstream never fails a
            // read: pings make a live but quiet upstream answer, and silence
            // past the idle timeout ends the subscription (reason `idle`).
            // A frame already buffered is taken without arming the two timers
            // (under load that is nearly every frame, and each armed timer
            // costs a runtime handle and a clock read).
            let wake = match self.ws.next().now_or_never() {
                Some(message) => Wake::Message(message),
                None => {
                    let idle_at = self.last_heard + self.idle_timeout;
                    // Without an application ping this timer never fires first.
                    let app_ping_at = self.app_ping.as_ref().map_or(idle_at, |ping| ping.next);
                    tokio::select! {
                        biased;
                        message = self.ws.next() => Wake::Message(message),
                        _ = tokio::time::sleep_until(idle_at) => Wake::Idle,
                        _ = tokio::time::sleep_until(self.next_ping) => Wake::Ping,
                        _ = tokio::time::sleep_until(app_ping_at), if self.app_ping.is_some() => Wake::AppPing,
                    }
                }
            };
            // Under a steady stream of frames the timers above are never
            // armed: an application ping due is sent here.
            if let Some(ping) = &mut self.app_ping
                && (matches!(wake, Wake::AppPing) || ping.next <= Instant::now())
            {
                ping.next = Instant::now() + ping.interval;
                let text = Message::text(ping.text.clone());
                // A failed send shows up as a failed read next.
                let _ = self.ws.send(text).await;
                if matches!(wake, Wake::AppPing) {
                    continue;
                }
            }
            let message = match wake {
                Wake::Message(message) => message,
                Wake::Ping => {
                    self.next_ping = Instant::now() + self.idle_timeout / 3;
                    // A failed send shows up as a failed read next.
                    let _ = self.ws.send(Message::Ping(Vec::new().into())).await;
                    continue;
                }
                Wake::Idle => {
                    return Err(self.fail(UpstreamError::Idle(self.idle_timeout)));
                }
                Wake::AppPing => continue,
            };
            if let Some(result) = self.take(message) {
                return result;
            }
        }
    }

    fn next_ready(&mut self) -> Option<Result<UpstreamEvent, UpstreamError>> {
        if let Some(error) = &self.failed {
            return Some(Err(error.clone()));
        }
        // A ping that is due needs a send: `next` does that.
        if self
            .app_ping
            .as_ref()
            .is_some_and(|ping| ping.next <= Instant::now())
        {
            return None;
        }
        loop {
            let message = self.ws.next().now_or_never()?;
            if let Some(result) = self.take(message) {
                return Some(result);
            }
        }
    }

    async fn resubscribe(&mut self) -> Result<(), UpstreamError> {
        let Some((unsubscribe, subscribe)) = self.resubscribe.clone() else {
            return Err(UpstreamError::Closed(
                "no UPSTREAM_UNSUBSCRIBE: a new snapshot is asked for by reconnecting".into(),
            ));
        };
        for message in [unsubscribe, subscribe] {
            if let Err(error) = self.ws.send(Message::text(message)).await {
                let error = UpstreamError::Closed(describe(&error, &self.url));
                return Err(self.fail(error));
            }
        }
        Ok(())
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
        text = text.replace(&secret, "***");
    }
    text
}
