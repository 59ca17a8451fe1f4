//! Many held streams on one connection (`UPSTREAM_STREAMS_PER_CONNECTION`
//! above 1): exchanges take hundreds of streams per connection and limit new
//! connections per address, so a worker fills a connection before it opens
//! another.
//!
//! [`SharedUpstream`] is an [`Upstream`]: each stream still gets its own
//! [`Subscription`] and its own machine (fence, sequence, gaps, snapshots).
//! Behind it, one task per connection reads every frame once
//! ([`FrameReader`], with `UPSTREAM_ROUTE_POINTER`), hands it to the stream
//! whose rendered `UPSTREAM_ROUTE_TEMPLATE` equals the field (one map
//! lookup), and sends the subscribe and unsubscribe messages the
//! [`Outbox`] lets out: several streams per message where the exchange takes
//! a list (`UPSTREAM_SUBSCRIBE_BATCH`, `{stream_ids_json}`), never more than
//! `UPSTREAM_SUBSCRIBES_PER_SECOND`.
//!
//! A stream whose reader falls behind (its queue full: its machine is not
//! reading) is dropped from the connection and its subscription ends; its
//! machine reconnects and its resume mode covers the hole, while the other
//! streams on the connection go on. A cut ends every stream on it, each
//! handled by its own machine. Frames for no held stream are counted
//! (`reason="control"`) and dropped.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use leasehold_telemetry::{SkipReason, TelemetryEvent, TelemetrySink};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_util::sync::CancellationToken;

use super::budget::ConnectBudget;
use super::frame::{FrameReader, Read};
use super::redact::redact_url;
use super::template::{render_batch, render_route};
use super::{Subscription, Upstream, UpstreamError, UpstreamEvent, WebSocketUpstreamConfig};

/// Events queued per stream before it counts as fallen behind: a few
/// seconds of a busy book.
const STREAM_QUEUE: usize = 4_096;
/// How long a subscribe or unsubscribe message waits for more streams to
/// join it (leases are taken in bursts).
const BATCH_WINDOW: Duration = Duration::from_millis(20);

/// What a queued message does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `UPSTREAM_SUBSCRIBE`.
    Subscribe,
    /// `UPSTREAM_UNSUBSCRIBE`.
    Unsubscribe,
}

/// The subscribe and unsubscribe messages one connection still owes, in the
/// order they were asked for, and when it may send the next: the pure part
/// of the connection (no I/O, time passed in).
#[derive(Debug)]
pub struct Outbox {
    batch: usize,
    per_second: u32,
    queue: VecDeque<(Op, String)>,
    /// When each message of the last second went out.
    sent: VecDeque<Instant>,
}

impl Outbox {
    /// An outbox that names up to `batch` streams per message and sends at
    /// most `per_second` messages in any second (0: no limit).
    pub fn new(batch: usize, per_second: u32) -> Self {
        Outbox {
            batch: batch.max(1),
            per_second,
            queue: VecDeque::new(),
            sent: VecDeque::new(),
        }
    }

    /// `route` is to be subscribed.
    pub fn subscribe(&mut self, route: String) {
        self.queue.push_back((Op::Subscribe, route));
    }

    /// `route` is to be unsubscribed: a subscribe still queued is withdrawn
    /// instead (the exchange never heard of it).
    pub fn unsubscribe(&mut self, route: String) {
        if let Some(at) = self
            .queue
            .iter()
            .rposition(|(op, queued)| *op == Op::Subscribe && *queued == route)
        {
            self.queue.remove(at);
        } else {
            self.queue.push_back((Op::Unsubscribe, route));
        }
    }

    /// Messages still owed.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// When the next message may go (`None`: nothing is owed).
    pub fn due(&self, now: Instant) -> Option<Instant> {
        if self.queue.is_empty() {
            return None;
        }
        let limit = self.per_second as usize;
        if limit == 0 || self.sent.len() < limit {
            return Some(now);
        }
        let oldest = self.sent[self.sent.len() - limit];
        Some((oldest + Duration::from_secs(1)).max(now))
    }

    /// The next message, if one may go at `now`: its kind and the streams it
    /// names (consecutive requests of one kind, up to the batch).
    pub fn poll(&mut self, now: Instant) -> Option<(Op, Vec<String>)> {
        while self
            .sent
            .front()
            .is_some_and(|at| now.saturating_duration_since(*at) >= Duration::from_secs(1))
        {
            self.sent.pop_front();
        }
        if self.due(now)? > now {
            return None;
        }
        let (op, _) = *self.queue.front()?;
        let mut routes = Vec::new();
        while routes.len() < self.batch
            && let Some((next, _)) = self.queue.front()
            && *next == op
        {
            let (_, route) = self.queue.pop_front()?;
            routes.push(route);
        }
        self.sent.push_back(now);
        Some((op, routes))
    }
}

/// What a stream asks of its connection's task.
enum Command {
    Add {
        route: String,
        stream_id: String,
        events: mpsc::Sender<Result<UpstreamEvent, UpstreamError>>,
        /// When the stream asked (its subscribe time runs to its first frame).
        asked: Instant,
    },
    Remove {
        route: String,
    },
    /// Unsubscribe and subscribe again (a new in-band snapshot).
    Resubscribe {
        route: String,
    },
}

/// One shared connection, as the pool sees it.
struct Connection {
    commands: mpsc::UnboundedSender<Command>,
    gauge: Arc<super::ConnectionGauge>,
    telemetry: Arc<dyn TelemetrySink>,
    /// Streams placed on it (counted at subscribe, released at close).
    held: AtomicUsize,
    ended: CancellationToken,
}

/// Streams on shared connections (see the module docs).
pub struct SharedUpstream {
    config: WebSocketUpstreamConfig,
    telemetry: Arc<dyn TelemetrySink>,
    budget: std::sync::Mutex<ConnectBudget>,
    connections: tokio::sync::Mutex<Vec<Arc<Connection>>>,
    requests: Arc<AtomicU64>,
    gauge: Arc<super::ConnectionGauge>,
}

impl SharedUpstream {
    /// Shared connections for `config` (`streams_per_connection` streams each).
    pub fn new(config: WebSocketUpstreamConfig, telemetry: Arc<dyn TelemetrySink>) -> Self {
        let budget = ConnectBudget::new(config.connects_per_minute, super::CONNECT_WINDOW);
        SharedUpstream {
            config,
            telemetry,
            budget: std::sync::Mutex::new(budget),
            connections: tokio::sync::Mutex::new(Vec::new()),
            requests: Arc::new(AtomicU64::new(1)),
            gauge: Arc::default(),
        }
    }

    /// Open connections now (ended ones are forgotten at the next subscribe).
    pub async fn connections(&self) -> usize {
        let connections = self.connections.lock().await;
        connections
            .iter()
            .filter(|c| !c.ended.is_cancelled())
            .count()
    }

    async fn open(&self, stream_id: &str) -> Result<Arc<Connection>, UpstreamError> {
        super::wait_for_the_budget(&self.budget, &*self.telemetry, stream_id).await;
        // One URL for every stream on it: `{stream_id}`, if the template has
        // it, names the first (Binance's combined `/stream` has none).
        let url = super::template::render_url(&self.config.url_template, stream_id);
        let hard_limit = self.config.max_frame_bytes.saturating_mul(4).max(64 * 1024);
        let ws_config = WebSocketConfig::default()
            .max_message_size(Some(hard_limit))
            .max_frame_size(Some(hard_limit));
        let connect =
            tokio_tungstenite::connect_async_with_config(url.as_str(), Some(ws_config), true);
        let ws = match timeout(self.config.connect_timeout, connect).await {
            Ok(Ok((ws, _))) => ws,
            Ok(Err(error)) => {
                return Err(UpstreamError::Connect(format!(
                    "{}: {}",
                    redact_url(&url),
                    super::websocket::describe_error(&error, &url)
                )));
            }
            Err(_) => {
                return Err(UpstreamError::Connect(format!(
                    "{} timed out after {:?}",
                    redact_url(&url),
                    self.config.connect_timeout
                )));
            }
        };
        let (commands, inbox) = mpsc::unbounded_channel();
        let connection = Arc::new(Connection {
            commands,
            gauge: self.gauge.clone(),
            telemetry: self.telemetry.clone(),
            held: AtomicUsize::new(0),
            ended: CancellationToken::new(),
        });
        self.gauge.change(1, 0, &*self.telemetry);
        let task = ConnectionTask {
            reader: FrameReader::new(&self.config, self.config.route_pointer.as_deref()),
            outbox: Outbox::new(
                self.config.subscribe_batch,
                self.config.subscribes_per_second,
            ),
            config: self.config.clone(),
            telemetry: self.telemetry.clone(),
            routes: HashMap::new(),
            requests: self.requests.clone(),
            unanswered: BTreeMap::new(),
            url,
        };
        let (gauge, telemetry) = (self.gauge.clone(), self.telemetry.clone());
        let ended = connection.ended.clone();
        tokio::spawn(async move {
            task.run(ws, inbox, ended).await;
            gauge.change(-1, 0, &*telemetry);
        });
        Ok(connection)
    }
}

#[async_trait::async_trait]
impl Upstream for SharedUpstream {
    async fn subscribe(
        &self,
        stream_id: &str,
        _from_seq: u64,
    ) -> Result<Box<dyn Subscription>, UpstreamError> {
        self.config
            .validate()
            .map_err(|problems| UpstreamError::Config(problems.join("; ")))?;
        let asked = Instant::now();
        let room = self.config.streams_per_connection.max(1);
        let route = render_route(&self.config.route_template, stream_id);
        let mut connections = self.connections.lock().await;
        connections.retain(|c| !c.ended.is_cancelled());
        let connection = match connections
            .iter()
            .find(|c| c.held.load(Ordering::SeqCst) < room)
        {
            Some(connection) => connection.clone(),
            None => {
                let connection = self.open(stream_id).await?;
                connections.push(connection.clone());
                connection
            }
        };
        connection.held.fetch_add(1, Ordering::SeqCst);
        connection.gauge.change(0, 1, &*self.telemetry);
        drop(connections);
        let (events, inbox) = mpsc::channel(STREAM_QUEUE);
        let added = connection.commands.send(Command::Add {
            route: route.clone(),
            stream_id: stream_id.to_owned(),
            events,
            asked,
        });
        let mut subscription = SharedSubscription {
            inbox,
            connection,
            route,
            released: false,
        };
        if added.is_err() {
            subscription.release();
            return Err(UpstreamError::Connect(
                "the shared connection ended while subscribing".into(),
            ));
        }
        self.telemetry.emit(TelemetryEvent::UpstreamConnected {
            stream_id: stream_id.to_owned(),
            from_seq: 0,
        });
        Ok(Box::new(subscription))
    }
}

/// One stream's share of a connection.
struct SharedSubscription {
    inbox: mpsc::Receiver<Result<UpstreamEvent, UpstreamError>>,
    connection: Arc<Connection>,
    route: String,
    released: bool,
}

impl SharedSubscription {
    fn release(&mut self) {
        if !std::mem::replace(&mut self.released, true) {
            self.connection.held.fetch_sub(1, Ordering::SeqCst);
            let connection = &self.connection;
            connection.gauge.change(0, -1, &*connection.telemetry);
            let _ = self.connection.commands.send(Command::Remove {
                route: self.route.clone(),
            });
        }
    }
}

fn ended() -> UpstreamError {
    UpstreamError::Closed("the shared connection dropped this stream".into())
}

#[async_trait::async_trait]
impl Subscription for SharedSubscription {
    async fn next(&mut self) -> Result<UpstreamEvent, UpstreamError> {
        self.inbox.recv().await.unwrap_or_else(|| Err(ended()))
    }

    fn next_ready(&mut self) -> Option<Result<UpstreamEvent, UpstreamError>> {
        match self.inbox.try_recv() {
            Ok(result) => Some(result),
            Err(mpsc::error::TryRecvError::Empty) => None,
            Err(mpsc::error::TryRecvError::Disconnected) => Some(Err(ended())),
        }
    }

    async fn resubscribe(&mut self) -> Result<(), UpstreamError> {
        self.connection
            .commands
            .send(Command::Resubscribe {
                route: self.route.clone(),
            })
            .map_err(|_| ended())
    }

    async fn close(&mut self) {
        self.release();
    }
}

impl Drop for SharedSubscription {
    fn drop(&mut self) {
        self.release();
    }
}

/// A stream held on the connection.
struct Route {
    stream_id: String,
    events: mpsc::Sender<Result<UpstreamEvent, UpstreamError>>,
    /// When it asked, until its first frame.
    asked: Option<Instant>,
}

/// Subscribe requests a connection remembers until answered: an exchange
/// that answers none (a template without `{request_id}` is not remembered
/// at all) must not grow the map for ever; the oldest are forgotten.
const UNANSWERED_MAX: usize = 1_024;

/// The task that owns one shared connection.
struct ConnectionTask {
    reader: FrameReader,
    outbox: Outbox,
    config: WebSocketUpstreamConfig,
    telemetry: Arc<dyn TelemetrySink>,
    routes: HashMap<String, Route>,
    requests: Arc<AtomicU64>,
    /// Subscribes sent with a `{request_id}` and not yet answered, by id:
    /// an answer that refuses one ends exactly the streams it named.
    unanswered: BTreeMap<u64, Vec<String>>,
    url: String,
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

impl ConnectionTask {
    async fn run(
        mut self,
        mut ws: Socket,
        mut inbox: mpsc::UnboundedReceiver<Command>,
        ended: CancellationToken,
    ) {
        let mut last_heard = Instant::now();
        let mut next_ping = last_heard + self.config.idle_timeout / 3;
        let mut next_app_ping = self
            .config
            .ping_text
            .as_ref()
            .map(|_| last_heard + self.config.ping_interval);
        // Requests must not go before the batch window has gathered them.
        let mut hold_until = Instant::now();
        let failure = loop {
            let now = Instant::now();
            let send_at = self.outbox.due(now).map(|due| due.max(hold_until));
            let idle_at = last_heard + self.config.idle_timeout;
            tokio::select! {
                biased;
                command = inbox.recv() => {
                    let Some(command) = command else {
                        break UpstreamError::Closed("the worker stopped".into());
                    };
                    if self.outbox.is_empty() {
                        hold_until = Instant::now() + BATCH_WINDOW;
                    }
                    self.command(command);
                }
                message = ws.next() => {
                    last_heard = Instant::now();
                    match message {
                        Some(Ok(Message::Text(text))) => self.frame(text, last_heard),
                        Some(Ok(Message::Binary(_))) => self.skipped(SkipReason::NotJson),
                        Some(Ok(Message::Close(_))) | None => {
                            break UpstreamError::Closed("the server closed the shared connection".into());
                        }
                        Some(Ok(_)) => {}
                        Some(Err(error)) => {
                            break UpstreamError::Closed(super::websocket::describe_error(&error, &self.url));
                        }
                    }
                }
                _ = sleep_until(send_at.unwrap_or(now)), if send_at.is_some() => {
                    if let Some((op, routes)) = self.outbox.poll(Instant::now())
                        && let Err(error) = self.send(&mut ws, op, routes).await
                    {
                        break error;
                    }
                }
                _ = sleep_until(next_app_ping.unwrap_or(now)), if next_app_ping.is_some() => {
                    next_app_ping = Some(Instant::now() + self.config.ping_interval);
                    if let Some(text) = &self.config.ping_text {
                        let _ = ws.send(Message::text(text.clone())).await;
                    }
                }
                _ = sleep_until(next_ping) => {
                    next_ping = Instant::now() + self.config.idle_timeout / 3;
                    let _ = ws.send(Message::Ping(Vec::new().into())).await;
                }
                _ = sleep_until(idle_at) => {
                    break UpstreamError::Idle(self.config.idle_timeout);
                }
            }
        };
        ended.cancel();
        // Every stream on it sees the end as its own: each machine reconnects.
        for (_, route) in self.routes.drain() {
            let _ = route.events.try_send(Err(failure.clone()));
            self.telemetry.emit(TelemetryEvent::UpstreamDisconnected {
                stream_id: route.stream_id,
            });
        }
        let _ = timeout(Duration::from_secs(1), ws.close(None)).await;
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Add {
                route,
                stream_id,
                events,
                asked,
            } => {
                let held = Route {
                    stream_id,
                    events,
                    asked: Some(asked),
                };
                self.routes.insert(route.clone(), held);
                self.outbox.subscribe(route);
            }
            Command::Remove { route } => {
                if self.routes.remove(&route).is_some() {
                    self.unsubscribe(route);
                }
            }
            Command::Resubscribe { route } => {
                if self.routes.contains_key(&route) {
                    self.unsubscribe(route.clone());
                    self.outbox.subscribe(route);
                }
            }
        }
    }

    fn unsubscribe(&mut self, route: String) {
        if !self.config.unsubscribe_template.is_empty() {
            self.outbox.unsubscribe(route);
        }
    }

    async fn send(
        &mut self,
        ws: &mut Socket,
        op: Op,
        routes: Vec<String>,
    ) -> Result<(), UpstreamError> {
        let template = match op {
            Op::Subscribe => &self.config.subscribe_template,
            Op::Unsubscribe => &self.config.unsubscribe_template,
        };
        if template.is_empty() {
            return Ok(());
        }
        // One id per message, so that an answer names exactly its streams.
        let batches: Vec<Vec<String>> = if template.contains("{stream_ids_json}") {
            vec![routes]
        } else {
            routes.into_iter().map(|route| vec![route]).collect()
        };
        let mut messages = Vec::with_capacity(batches.len());
        for batch in batches {
            let request_id = self.requests.fetch_add(1, Ordering::Relaxed);
            messages.push(render_batch(template, &batch, request_id));
            if op == Op::Subscribe && template.contains("{request_id}") {
                self.unanswered.insert(request_id, batch);
                if self.unanswered.len() > UNANSWERED_MAX {
                    self.unanswered.pop_first();
                }
            }
        }
        for message in messages {
            ws.send(Message::text(message)).await.map_err(|error| {
                UpstreamError::Closed(super::websocket::describe_error(&error, &self.url))
            })?;
        }
        Ok(())
    }

    fn frame(&mut self, text: tokio_tungstenite::tungstenite::Utf8Bytes, at: Instant) {
        let (event, route) = match self.reader.read(text.clone(), at) {
            Read::Event { event, route } => (event, route),
            Read::Skip(reason) => return self.skipped(reason),
            Read::Control | Read::NoSequence => return self.control(text.as_str()),
        };
        let Some(held) = route.as_ref().and_then(|route| self.routes.get_mut(route)) else {
            // For a stream no longer held (unsubscribed, moved by a takeover).
            return self.skipped(SkipReason::Control);
        };
        if let Some(asked) = held.asked.take() {
            self.telemetry.emit(TelemetryEvent::UpstreamSubscribed {
                stream_id: held.stream_id.clone(),
                duration: at.saturating_duration_since(asked),
            });
        }
        match held.events.try_send(Ok(event)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                // Its machine is not reading: drop it from the connection
                // (its subscription ends; its resume mode covers the hole)
                // rather than stall every other stream on it.
                if let Some(route) = route {
                    tracing::warn!(
                        route,
                        "a stream fell behind its shared connection; dropping it from the connection"
                    );
                    self.routes.remove(&route);
                    self.unsubscribe(route);
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                if let Some(route) = route {
                    self.routes.remove(&route);
                    self.unsubscribe(route);
                }
            }
        }
    }

    /// An acknowledgement, heartbeat or error. An answer to a subscribe
    /// sent with `{request_id}` (Binance and OKX `id`, Kraken v2 and Bybit
    /// `req_id`) is matched to it: a refusal ends exactly the streams it
    /// named. Any other error that names a stream in its text ends that
    /// stream only; the rest are logged.
    fn control(&mut self, text: &str) {
        self.skipped(SkipReason::Control);
        let Ok(value) = serde_json::from_str::<Value>(text) else {
            return;
        };
        let refused = value.get("error").is_some_and(|error| !error.is_null())
            || value.get("success").and_then(Value::as_bool) == Some(false);
        let answered = ["id", "req_id"]
            .iter()
            .find_map(|key| request_id(value.get(*key)?))
            .and_then(|id| self.unanswered.remove(&id));
        if !refused {
            return;
        }
        let message: String = text.chars().take(200).collect();
        let named: Vec<String> = match answered {
            Some(routes) => routes,
            None => self
                .routes
                .keys()
                .filter(|route| text.contains(route.as_str()))
                .cloned()
                .collect(),
        };
        if named.is_empty() {
            tracing::warn!(
                error = message,
                "the upstream refused a request on a shared connection"
            );
        }
        for route in named {
            if let Some(held) = self.routes.remove(&route) {
                let _ = held
                    .events
                    .try_send(Err(UpstreamError::Rejected(message.clone())));
            }
        }
    }

    fn skipped(&self, reason: SkipReason) {
        self.telemetry.emit(TelemetryEvent::UpstreamFrameSkipped {
            stream_id: String::new(),
            reason,
        });
    }
}

/// A request id as an answer spells it: a number, or a number in a string.
fn request_id(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
