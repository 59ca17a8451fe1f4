//! [`WebSocketUpstream`]: a WebSocket JSON feed, one connection per subscription.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, SinkExt, StreamExt};
use leasehold_telemetry::{SkipReason, TelemetryEvent, TelemetrySink};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message, Utf8Bytes};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::task::AbortOnDropHandle;

use super::budget::ConnectBudget;
use super::frame::{FrameReader, Read};
use super::handover::Handover;
use super::redact::{redact_url, url_secrets};
use super::template::{render_subscribe, render_url};
use super::{Subscription, Upstream, UpstreamError, UpstreamEvent, WebSocketUpstreamConfig};

/// A close that the peer never acknowledges must not hold the caller.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Bytes read from the socket at most per read (tungstenite's default is 128 KiB).
const READ_BUFFER_BYTES: usize = 16 * 1024;
/// Server error messages are echoed into our errors; keep them bounded.
const MAX_SERVER_MESSAGE: usize = 200;
/// How long a successor may overlap the connection it replaces before it
/// is switched to whether or not it met it (then the stream's resume mode
/// judges any hole, as after a cut).
const OVERLAP_MAX: Duration = Duration::from_secs(10);
/// The wait before a planned replacement that failed to connect is tried
/// again (the current connection keeps running meanwhile).
const REPLACE_RETRY: Duration = Duration::from_secs(1);

/// A WebSocket JSON feed.
pub struct WebSocketUpstream {
    config: WebSocketUpstreamConfig,
    telemetry: Arc<dyn TelemetrySink>,
    /// Shared by every stream of the worker (one adapter per worker), and
    /// by their planned reconnects.
    budget: Arc<std::sync::Mutex<ConnectBudget>>,
    /// One connection per stream.
    registry: Arc<super::registry::ConnectionRegistry>,
}

impl WebSocketUpstream {
    /// An adapter for `config`; problems surface as [`UpstreamError::Config`] on subscribe.
    pub fn new(config: WebSocketUpstreamConfig, telemetry: Arc<dyn TelemetrySink>) -> Self {
        let budget = ConnectBudget::new(config.connects_per_minute, super::CONNECT_WINDOW);
        WebSocketUpstream {
            config,
            telemetry,
            budget: Arc::new(std::sync::Mutex::new(budget)),
            registry: Arc::default(),
        }
    }

    /// This adapter, its connects counted by `budget` (tests: a short window).
    pub fn with_connect_budget(mut self, budget: ConnectBudget) -> Self {
        self.budget = Arc::new(std::sync::Mutex::new(budget));
        self
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
        let asked = Instant::now();
        super::wait_for_the_budget(&self.budget, &*self.telemetry, stream_id).await;
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
        let ws = connect(&url, ws_config, subscribe, self.config.connect_timeout).await?;
        self.telemetry.emit(TelemetryEvent::UpstreamConnected {
            stream_id: stream_id.to_owned(),
            from_seq,
        });
        let now = Instant::now();
        let connection = self.registry.opened(1, &*self.telemetry);
        let planned = (!self.config.max_connection_age.is_zero()).then(|| PlannedReconnect {
            max_age: self.config.max_connection_age,
            url: url.clone(),
            ws_config,
            subscribe_template: self.config.subscribe_template.clone(),
            connect_timeout: self.config.connect_timeout,
            budget: self.budget.clone(),
            telemetry: self.telemetry.clone(),
        });
        Ok(Box::new(WebSocketSubscription {
            replace_at: planned
                .as_ref()
                .map(|planned| now + planned.age_for(stream_id, 0)),
            planned,
            replacements: 0,
            successor: None,
            queued: VecDeque::new(),
            delivered: None,
            floor: None,
            asked: Some(asked),
            registry: self.registry.clone(),
            connection,
            ws,
            url,
            stream_id: stream_id.to_owned(),
            from_seq,
            reader: FrameReader::new(&self.config, None),
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

/// An application-level ping: text the upstream wants on a schedule.
struct AppPing {
    text: String,
    interval: Duration,
    next: Instant,
}

/// How a connection is replaced before its age (`UPSTREAM_MAX_CONNECTION_AGE_MS`).
struct PlannedReconnect {
    max_age: Duration,
    url: String,
    ws_config: WebSocketConfig,
    subscribe_template: String,
    connect_timeout: Duration,
    budget: Arc<std::sync::Mutex<ConnectBudget>>,
    telemetry: Arc<dyn TelemetrySink>,
}

impl PlannedReconnect {
    /// The age at which connection `n` of `stream_id` is replaced.
    fn age_for(&self, stream_id: &str, n: u64) -> Duration {
        spread_age(self.max_age, stream_id, n)
    }
}

/// The age at which connection `n` of `stream_id` is replaced: up to a tenth
/// earlier than `max_age`, spread by stream, so that streams connected
/// together (a worker's start) do not all reconnect at once.
pub(crate) fn spread_age(max_age: Duration, stream_id: &str, n: u64) -> Duration {
    let spread = max_age / 10;
    let hash = stream_id
        .bytes()
        .fold(n.wrapping_mul(0x9E37_79B9_7F4A_7C15), |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
        });
    let fraction = (hash % 1_000) as u32;
    max_age - spread * fraction / 1_000
}

/// The connection that replaces the current one before its age.
enum Successor {
    /// Connecting and subscribing.
    Connecting(AbortOnDropHandle<Result<Box<Socket>, UpstreamError>>),
    /// Subscribed, its frames held until it meets the current connection.
    Open {
        ws: Box<Socket>,
        handover: Handover,
        since: Instant,
    },
}

/// A client WebSocket connection.
pub(crate) type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

struct WebSocketSubscription {
    /// Replacing connections before their age, when set.
    planned: Option<PlannedReconnect>,
    /// When the current connection is to be replaced.
    replace_at: Option<Instant>,
    /// Planned replacements so far.
    replacements: u64,
    successor: Option<Successor>,
    /// Frames to hand on before reading on (a successor's, at the switch).
    queued: VecDeque<UpstreamEvent>,
    /// The last sequence handed on.
    delivered: Option<u64>,
    /// After a switch to a successor that was behind: what the replaced
    /// connection handed on, which the successor's frames repeat up to here.
    floor: Option<u64>,
    /// When the subscription was asked for, until its first frame.
    asked: Option<Instant>,
    registry: Arc<super::registry::ConnectionRegistry>,
    /// This subscription's connection in the registry.
    connection: super::registry::ConnectionId,
    ws: Socket,
    url: String,
    stream_id: String,
    from_seq: u64,
    reader: FrameReader,
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
    /// A frame (or the end) of the successor.
    Successor(Option<Result<Message, WsError>>),
    /// The successor connected, or failed to.
    SuccessorOpen(Result<Box<Socket>, UpstreamError>),
    /// Time to start replacing the connection.
    Replace,
    /// The successor has overlapped for as long as it may.
    OverlapOver,
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
    /// An event leaves the subscription: the successor's handover learns
    /// what was delivered.
    fn hand_on(&mut self, event: UpstreamEvent) -> UpstreamEvent {
        self.delivered = self.delivered.max(Some(event.seq));
        match &mut self.successor {
            Some(Successor::Open { handover, .. }) => handover.from_old(event),
            _ => event,
        }
    }

    /// Whether `event` repeats what the replaced connection handed on (the
    /// successor started behind it): dropped, not counted, as the overlap
    /// is meant to repeat.
    fn repeated(&mut self, event: &UpstreamEvent) -> bool {
        match self.floor {
            Some(floor) if event.seq <= floor => true,
            Some(_) => {
                self.floor = None;
                false
            }
            None => false,
        }
    }

    /// The connection is old enough: a successor connects and subscribes
    /// (within the worker's connect budget) while this one runs on.
    fn start_replacing(&mut self) {
        let Some(planned) = &self.planned else {
            return;
        };
        let (url, ws_config, timeout_after) = (
            planned.url.clone(),
            planned.ws_config,
            planned.connect_timeout,
        );
        let subscribe = (!planned.subscribe_template.is_empty()).then(|| {
            let from = self.delivered.map_or(self.from_seq, |seq| seq + 1);
            render_subscribe(&planned.subscribe_template, &self.stream_id, from)
        });
        let (budget, telemetry) = (planned.budget.clone(), planned.telemetry.clone());
        let stream_id = self.stream_id.clone();
        self.successor = Some(Successor::Connecting(AbortOnDropHandle::new(tokio::spawn(
            async move {
                super::wait_for_the_budget(&budget, &*telemetry, &stream_id).await;
                connect(&url, ws_config, subscribe, timeout_after)
                    .await
                    .map(Box::new)
            },
        ))));
    }

    fn successor_opened(&mut self, result: Result<Box<Socket>, UpstreamError>) {
        match result {
            Ok(ws) => {
                self.registry
                    .successor_opened(self.connection, &*self.telemetry);
                self.successor = Some(Successor::Open {
                    ws,
                    handover: Handover::new(self.delivered),
                    since: Instant::now(),
                });
            }
            Err(error) => {
                tracing::warn!(
                    stream_id = self.stream_id,
                    error = %error,
                    "the connection's replacement failed to connect; trying again, the connection runs on"
                );
                self.successor = None;
                self.replace_at = Some(Instant::now() + REPLACE_RETRY);
            }
        }
    }

    /// A frame of the successor: held for the switch, or the successor's end.
    fn successor_frame(&mut self, message: Option<Result<Message, WsError>>) {
        let received_at = Instant::now();
        let event = match message {
            Some(Ok(Message::Text(text))) => match self.reader.read(text, received_at) {
                Read::Event { event, .. } => Some(event),
                _ => None,
            },
            Some(Ok(Message::Close(_)) | Err(_)) | None => {
                self.drop_successor();
                return;
            }
            Some(Ok(_)) => None,
        };
        let Some(Successor::Open { handover, .. }) = &mut self.successor else {
            return;
        };
        if let Some(event) = event {
            handover.from_new(event);
        }
        if handover.met() || handover.full() {
            self.switch_if_open();
        }
    }

    fn drop_successor(&mut self) {
        if let Some(Successor::Open { .. }) = self.successor.take() {
            self.registry
                .successor_dropped(self.connection, &*self.telemetry);
        }
        self.replace_at = Some(Instant::now() + REPLACE_RETRY);
    }

    /// Switches to an open successor, if there is one: the current
    /// connection is closed, the successor's frames not handed on yet are
    /// queued. Returns whether it switched.
    fn switch_if_open(&mut self) -> bool {
        let Some(Successor::Open { ws, handover, .. }) = self.successor.take() else {
            return false;
        };
        self.queued.extend(handover.switch());
        self.floor = self.delivered;
        let mut old = std::mem::replace(&mut self.ws, *ws);
        tokio::spawn(async move {
            let _ = timeout(CLOSE_TIMEOUT, old.close(None)).await;
        });
        self.registry.replaced(self.connection, &*self.telemetry);
        self.replacements += 1;
        let now = Instant::now();
        self.last_heard = now;
        self.next_ping = now + self.idle_timeout / 3;
        self.replace_at = self
            .planned
            .as_ref()
            .map(|planned| now + planned.age_for(&self.stream_id, self.replacements));
        tracing::info!(
            stream_id = self.stream_id,
            "replaced the connection before its age"
        );
        true
    }

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
            self.registry.closed(self.connection, &*self.telemetry);
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
            Some(Err(error)) => {
                Frame::Fail(UpstreamError::Closed(describe_error(&error, &self.url)))
            }
            None => Frame::Fail(UpstreamError::Closed("connection ended".to_owned())),
        };
        match frame {
            Frame::Event(event) => {
                if let Some(asked) = self.asked.take() {
                    self.registry.subscribed(
                        self.connection,
                        &self.stream_id,
                        received_at.saturating_duration_since(asked),
                        &*self.telemetry,
                    );
                }
                Some(Ok(event))
            }
            Frame::Skip(reason) => {
                self.skip(reason);
                None
            }
            Frame::Fail(error) => Some(Err(self.fail(error))),
        }
    }

    fn classify(&mut self, frame: Utf8Bytes, received_at: Instant) -> Frame {
        let text = frame.clone();
        match self.reader.read(frame, received_at) {
            Read::Event { event, .. } => Frame::Event(event),
            Read::Skip(reason) => Frame::Skip(reason),
            // Acknowledgements, heartbeats, status and ping replies; an error
            // frame still ends the subscription (rare: worth a full parse).
            read @ (Read::Control | Read::NoSequence) => {
                let value = serde_json::from_str::<Value>(text.as_str()).unwrap_or_default();
                match server_error(&value, self.from_seq) {
                    Some(error) => Frame::Fail(error),
                    None if matches!(read, Read::Control) => Frame::Skip(SkipReason::Control),
                    None => Frame::Skip(SkipReason::MissingField),
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl Subscription for WebSocketSubscription {
    async fn next(&mut self) -> Result<UpstreamEvent, UpstreamError> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        loop {
            if let Some(event) = self.queued.pop_front() {
                return Ok(self.hand_on(event));
            }
            // A half-open TCP connection or a frozen upstream never fails a
            // read: pings make a live but quiet upstream answer, and silence
            // past the idle timeout ends the subscription (reason `idle`).
            // A frame already buffered is taken without arming the two timers
            // (under load that is nearly every frame, and each armed timer
            // costs a runtime handle and a clock read), unless a successor
            // overlaps: then both connections are read in turn.
            let buffered = match self.successor {
                Some(Successor::Open { .. }) => None,
                _ => self.ws.next().now_or_never(),
            };
            let wake = match buffered {
                Some(message) => Wake::Message(message),
                None => {
                    let idle_at = self.last_heard + self.idle_timeout;
                    // Without an application ping this timer never fires first.
                    let app_ping_at = self.app_ping.as_ref().map_or(idle_at, |ping| ping.next);
                    let replace_at = match self.successor {
                        None => self.replace_at,
                        Some(_) => None,
                    };
                    let (ws, successor) = (&mut self.ws, &mut self.successor);
                    let successor_wake = async {
                        match successor {
                            Some(Successor::Connecting(task)) => {
                                Wake::SuccessorOpen(task.await.unwrap_or_else(|_| {
                                    Err(UpstreamError::Connect("the connect task ended".into()))
                                }))
                            }
                            Some(Successor::Open { ws, since, .. }) => {
                                tokio::select! {
                                    message = ws.next() => Wake::Successor(message),
                                    _ = tokio::time::sleep_until(*since + OVERLAP_MAX) => Wake::OverlapOver,
                                }
                            }
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        biased;
                        message = ws.next() => Wake::Message(message),
                        wake = successor_wake => wake,
                        _ = tokio::time::sleep_until(idle_at) => Wake::Idle,
                        _ = tokio::time::sleep_until(self.next_ping) => Wake::Ping,
                        _ = tokio::time::sleep_until(app_ping_at), if self.app_ping.is_some() => Wake::AppPing,
                        _ = tokio::time::sleep_until(replace_at.unwrap_or(idle_at)), if replace_at.is_some() => Wake::Replace,
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
                    if self.switch_if_open() {
                        continue;
                    }
                    return Err(self.fail(UpstreamError::Idle(self.idle_timeout)));
                }
                Wake::AppPing => continue,
                Wake::Replace => {
                    self.start_replacing();
                    continue;
                }
                Wake::SuccessorOpen(result) => {
                    self.successor_opened(result);
                    continue;
                }
                Wake::Successor(message) => {
                    self.successor_frame(message);
                    continue;
                }
                Wake::OverlapOver => {
                    tracing::warn!(
                        stream_id = self.stream_id,
                        "the new connection did not meet the one it replaces in time; switching to it"
                    );
                    self.switch_if_open();
                    continue;
                }
            };
            // The connection being replaced ended first: the successor
            // takes over, with what it holds (a hole is the resume mode's).
            let ends = matches!(message, None | Some(Err(_) | Ok(Message::Close(_))));
            if ends && self.switch_if_open() {
                continue;
            }
            match self.take(message) {
                Some(Ok(event)) if self.repeated(&event) => {}
                Some(Ok(event)) => {
                    let event = self.hand_on(event);
                    if let Some(Successor::Open { handover, .. }) = &self.successor
                        && handover.met()
                    {
                        self.switch_if_open();
                    }
                    return Ok(event);
                }
                Some(result) => return result,
                None => {}
            }
        }
    }

    fn next_ready(&mut self) -> Option<Result<UpstreamEvent, UpstreamError>> {
        if let Some(error) = &self.failed {
            return Some(Err(error.clone()));
        }
        if let Some(event) = self.queued.pop_front() {
            return Some(Ok(self.hand_on(event)));
        }
        // While a successor overlaps, both are read by `next`.
        if self.successor.is_some() {
            return None;
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
            match self.take(message) {
                Some(Ok(event)) if self.repeated(&event) => {}
                Some(result) => return Some(result.map(|event| self.hand_on(event))),
                None => {}
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
                let error = UpstreamError::Closed(describe_error(&error, &self.url));
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

/// Opens `url` and sends the subscribe, within `connect_timeout`.
pub(crate) async fn connect(
    url: &str,
    ws_config: WebSocketConfig,
    subscribe: Option<String>,
    connect_timeout: Duration,
) -> Result<Socket, UpstreamError> {
    let connect = async {
        let (mut ws, _response) =
            tokio_tungstenite::connect_async_with_config(url, Some(ws_config), true).await?;
        if let Some(message) = subscribe {
            ws.send(Message::text(message)).await?;
        }
        Ok::<_, WsError>(ws)
    };
    match timeout(connect_timeout, connect).await {
        Ok(Ok(ws)) => Ok(ws),
        Ok(Err(error)) => Err(UpstreamError::Connect(describe_error(&error, url))),
        Err(_) => Err(UpstreamError::Connect(format!(
            "{} timed out after {:?}",
            redact_url(url),
            connect_timeout
        ))),
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
pub(crate) fn describe_error(error: &WsError, url: &str) -> String {
    let mut text = format!("{}: {error}", redact_url(url));
    for secret in url_secrets(url) {
        text = text.replace(&secret, "***");
    }
    text
}
