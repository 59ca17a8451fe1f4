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
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::budget::ConnectBudget;
use super::frame::{FrameReader, Read};
use super::handover::Handover;
use super::redact::redact_url;
use super::registry::{ConnectionId, ConnectionRegistry};
use super::template::{render_batch, render_route};
use super::websocket::{Socket, connect};
use super::{Subscription, Upstream, UpstreamError, UpstreamEvent, WebSocketUpstreamConfig};

/// Events queued per stream before it counts as fallen behind: a few
/// seconds of a busy book.
const STREAM_QUEUE: usize = 4_096;
/// How long a subscribe or unsubscribe message waits for more streams to
/// join it (leases are taken in bursts).
const BATCH_WINDOW: Duration = Duration::from_millis(20);

/// How long a successor may overlap the connection it replaces before
/// every stream on it moves as it is (their resume modes judge any hole).
const OVERLAP_MAX: Duration = Duration::from_secs(10);
/// The wait before a replacement that failed is tried again.
const REPLACE_RETRY: Duration = Duration::from_secs(1);

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
    registry: Arc<ConnectionRegistry>,
    /// Its id in the registry.
    id: ConnectionId,
    telemetry: Arc<dyn TelemetrySink>,
    /// Streams placed on it (counted at subscribe, released at close).
    held: AtomicUsize,
    ended: CancellationToken,
}

/// Streams on shared connections (see the module docs).
pub struct SharedUpstream {
    config: WebSocketUpstreamConfig,
    telemetry: Arc<dyn TelemetrySink>,
    budget: Arc<std::sync::Mutex<ConnectBudget>>,
    connections: tokio::sync::Mutex<Vec<Arc<Connection>>>,
    requests: Arc<AtomicU64>,
    registry: Arc<ConnectionRegistry>,
}

impl SharedUpstream {
    /// Shared connections for `config` (`streams_per_connection` streams each).
    pub fn new(config: WebSocketUpstreamConfig, telemetry: Arc<dyn TelemetrySink>) -> Self {
        let budget = ConnectBudget::new(config.connects_per_minute, super::CONNECT_WINDOW);
        SharedUpstream {
            config,
            telemetry,
            budget: Arc::new(std::sync::Mutex::new(budget)),
            connections: tokio::sync::Mutex::new(Vec::new()),
            requests: Arc::new(AtomicU64::new(1)),
            registry: Arc::default(),
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
        let ws = connect(&url, ws_config, None, self.config.connect_timeout).await?;
        let (commands, inbox) = mpsc::unbounded_channel();
        let id = self.registry.opened(0, &*self.telemetry);
        let connection = Arc::new(Connection {
            commands,
            registry: self.registry.clone(),
            id,
            telemetry: self.telemetry.clone(),
            held: AtomicUsize::new(0),
            ended: CancellationToken::new(),
        });
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
            ws_config,
            budget: self.budget.clone(),
            replace_at: (!self.config.max_connection_age.is_zero())
                .then(|| Instant::now() + replacement_age(&self.config, stream_id, 0)),
            replacements: 0,
            successor: None,
            registry: self.registry.clone(),
            id,
        };
        let (registry, telemetry) = (self.registry.clone(), self.telemetry.clone());
        let ended = connection.ended.clone();
        tokio::spawn(async move {
            task.run(ws, inbox, ended).await;
            registry.closed(id, &*telemetry);
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
        connection
            .registry
            .stream_moved(connection.id, true, &*self.telemetry);
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
            connection
                .registry
                .stream_moved(connection.id, false, &*connection.telemetry);
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
    /// The last sequence handed to the stream.
    delivered: Option<u64>,
    /// While a successor overlaps the connection: this stream's handover,
    /// until it moved.
    handover: Option<Handover>,
    /// The successor carries it now (the connection's frames for it are
    /// repeats).
    moved: bool,
    /// After a move to a successor that was behind: the successor's frames
    /// up to here repeat what was handed on.
    floor: Option<u64>,
}

impl Route {
    fn new(
        stream_id: String,
        events: mpsc::Sender<Result<UpstreamEvent, UpstreamError>>,
        asked: Option<Instant>,
    ) -> Self {
        Route {
            stream_id,
            events,
            asked,
            delivered: None,
            handover: None,
            moved: false,
            floor: None,
        }
    }
}

/// Which of the (at most two) connections of a task a frame came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// The connection the streams are on.
    Current,
    /// The one replacing it before its age.
    Successor,
}

/// The connection that replaces a shared one before its age.
enum SharedSuccessor {
    Connecting(AbortOnDropHandle<Result<Box<Socket>, UpstreamError>>),
    Open {
        ws: Box<Socket>,
        /// Its own subscribes, paced like the connection's.
        outbox: Outbox,
        since: Instant,
    },
}

/// What woke a connection's task.
enum TaskWake {
    Command(Option<Command>),
    Frame(Option<Result<Message, WsError>>),
    Send,
    AppPing,
    Ping,
    Idle,
    Replace,
    SuccessorOpen(Result<Box<Socket>, UpstreamError>),
    SuccessorFrame(Option<Result<Message, WsError>>),
    SuccessorSend,
    OverlapOver,
}

/// The age at which a shared connection is replaced (up to a tenth early,
/// spread by its first stream and replacement, as for one-stream connections).
fn replacement_age(config: &WebSocketUpstreamConfig, stream_id: &str, n: u64) -> Duration {
    super::websocket::spread_age(config.max_connection_age, stream_id, n)
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
    ws_config: WebSocketConfig,
    budget: Arc<std::sync::Mutex<ConnectBudget>>,
    /// When the connection is to be replaced (`UPSTREAM_MAX_CONNECTION_AGE_MS`).
    replace_at: Option<Instant>,
    replacements: u64,
    successor: Option<SharedSuccessor>,
    registry: Arc<ConnectionRegistry>,
    /// This connection's id in the registry.
    id: ConnectionId,
}

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
            let replace_at = self.replace_at.filter(|_| self.successor.is_none());
            let successor = &mut self.successor;
            let successor_wake = async {
                match successor {
                    Some(SharedSuccessor::Connecting(task)) => {
                        TaskWake::SuccessorOpen(task.await.unwrap_or_else(|_| {
                            Err(UpstreamError::Connect("the connect task ended".into()))
                        }))
                    }
                    Some(SharedSuccessor::Open { ws, outbox, since }) => {
                        let due = outbox
                            .due(Instant::now())
                            .map(|due| due.max(*since + BATCH_WINDOW));
                        tokio::select! {
                            message = ws.next() => TaskWake::SuccessorFrame(message),
                            _ = sleep_until(due.unwrap_or(*since)), if due.is_some() => TaskWake::SuccessorSend,
                            _ = sleep_until(*since + OVERLAP_MAX) => TaskWake::OverlapOver,
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            let wake = tokio::select! {
                biased;
                command = inbox.recv() => TaskWake::Command(command),
                message = ws.next() => TaskWake::Frame(message),
                wake = successor_wake => wake,
                _ = sleep_until(send_at.unwrap_or(now)), if send_at.is_some() => TaskWake::Send,
                _ = sleep_until(next_app_ping.unwrap_or(now)), if next_app_ping.is_some() => TaskWake::AppPing,
                _ = sleep_until(next_ping) => TaskWake::Ping,
                _ = sleep_until(idle_at) => TaskWake::Idle,
                _ = sleep_until(replace_at.unwrap_or(now)), if replace_at.is_some() => TaskWake::Replace,
            };
            match wake {
                TaskWake::Command(None) => {
                    break UpstreamError::Closed("the worker stopped".into());
                }
                TaskWake::Command(Some(command)) => {
                    if self.outbox.is_empty() {
                        hold_until = Instant::now() + BATCH_WINDOW;
                    }
                    self.command(command);
                }
                TaskWake::Frame(message) => {
                    last_heard = Instant::now();
                    let failure = match message {
                        Some(Ok(Message::Text(text))) => {
                            self.frame(text, last_heard, Side::Current);
                            continue;
                        }
                        Some(Ok(Message::Binary(_))) => {
                            self.skipped(SkipReason::NotJson);
                            continue;
                        }
                        Some(Ok(Message::Close(_))) | None => {
                            UpstreamError::Closed("the server closed the shared connection".into())
                        }
                        Some(Ok(_)) => continue,
                        Some(Err(error)) => UpstreamError::Closed(
                            super::websocket::describe_error(&error, &self.url),
                        ),
                    };
                    // Ended before its successor took over: it takes over now.
                    if self.promote(&mut ws) {
                        last_heard = Instant::now();
                        continue;
                    }
                    break failure;
                }
                TaskWake::Send => {
                    if let Some((op, routes)) = self.outbox.poll(Instant::now())
                        && let Err(error) = self.send(&mut ws, op, routes).await
                    {
                        break error;
                    }
                }
                TaskWake::AppPing => {
                    next_app_ping = Some(Instant::now() + self.config.ping_interval);
                    if let Some(text) = &self.config.ping_text {
                        let _ = ws.send(Message::text(text.clone())).await;
                    }
                }
                TaskWake::Ping => {
                    next_ping = Instant::now() + self.config.idle_timeout / 3;
                    let _ = ws.send(Message::Ping(Vec::new().into())).await;
                }
                TaskWake::Idle => {
                    if self.promote(&mut ws) {
                        last_heard = Instant::now();
                        continue;
                    }
                    break UpstreamError::Idle(self.config.idle_timeout);
                }
                TaskWake::Replace => self.start_replacing(),
                TaskWake::SuccessorOpen(result) => {
                    self.successor_opened(result);
                    if self.routes.is_empty() && self.promote(&mut ws) {
                        last_heard = Instant::now();
                    }
                }
                TaskWake::SuccessorFrame(message) => {
                    match message {
                        Some(Ok(Message::Text(text))) => {
                            self.frame(text, Instant::now(), Side::Successor)
                        }
                        Some(Ok(Message::Close(_)) | Err(_)) | None => {
                            self.successor_lost();
                            continue;
                        }
                        Some(Ok(_)) => {}
                    }
                    if self.routes.values().all(|route| route.moved) && self.promote(&mut ws) {
                        last_heard = Instant::now();
                    }
                }
                TaskWake::SuccessorSend => {
                    let Some(SharedSuccessor::Open {
                        mut ws,
                        mut outbox,
                        since,
                    }) = self.successor.take()
                    else {
                        continue;
                    };
                    let sent = match outbox.poll(Instant::now()) {
                        Some((op, routes)) => self.send(&mut ws, op, routes).await,
                        None => Ok(()),
                    };
                    self.successor = Some(SharedSuccessor::Open { ws, outbox, since });
                    if sent.is_err() {
                        self.successor_lost();
                    }
                }
                TaskWake::OverlapOver => {
                    tracing::warn!(
                        url = redact_url(&self.url),
                        "streams did not all meet on the new connection in time; switching them as they are"
                    );
                    if self.promote(&mut ws) {
                        last_heard = Instant::now();
                    }
                }
            }
        };
        ended.cancel();
        drop(self.successor.take());
        // Every stream on it sees the end as its own: each machine reconnects.
        for (_, route) in self.routes.drain() {
            let _ = route.events.try_send(Err(failure.clone()));
            self.telemetry.emit(TelemetryEvent::UpstreamDisconnected {
                stream_id: route.stream_id,
            });
        }
        let _ = timeout(Duration::from_secs(1), ws.close(None)).await;
    }

    /// The connection is old enough: a successor connects (within the
    /// worker's connect budget) while this one runs on.
    fn start_replacing(&mut self) {
        let (url, ws_config, connect_timeout) = (
            self.url.clone(),
            self.ws_config,
            self.config.connect_timeout,
        );
        let (budget, telemetry) = (self.budget.clone(), self.telemetry.clone());
        let first = self
            .routes
            .values()
            .next()
            .map(|r| r.stream_id.clone())
            .unwrap_or_default();
        self.successor = Some(SharedSuccessor::Connecting(AbortOnDropHandle::new(
            tokio::spawn(async move {
                super::wait_for_the_budget(&budget, &*telemetry, &first).await;
                connect(&url, ws_config, None, connect_timeout)
                    .await
                    .map(Box::new)
            }),
        )));
    }

    /// The successor is open: every stream is subscribed on it too, each
    /// with its own handover.
    fn successor_opened(&mut self, result: Result<Box<Socket>, UpstreamError>) {
        let ws = match result {
            Ok(ws) => ws,
            Err(error) => {
                tracing::warn!(
                    error = %error,
                    "a shared connection's replacement failed to connect; trying again, the connection runs on"
                );
                self.successor = None;
                self.replace_at = Some(Instant::now() + REPLACE_RETRY);
                return;
            }
        };
        self.registry.successor_opened(self.id, &*self.telemetry);
        let mut outbox = Outbox::new(
            self.config.subscribe_batch,
            self.config.subscribes_per_second,
        );
        for (name, route) in &mut self.routes {
            route.handover = Some(Handover::new(route.delivered));
            route.moved = false;
            outbox.subscribe(name.clone());
        }
        self.successor = Some(SharedSuccessor::Open {
            ws,
            outbox,
            since: Instant::now(),
        });
    }

    /// The successor failed before every stream moved: the streams it
    /// carried end (their machines reconnect); the others stay.
    fn successor_lost(&mut self) {
        if let Some(SharedSuccessor::Open { .. }) = self.successor.take() {
            self.registry.successor_dropped(self.id, &*self.telemetry);
        }
        let moved: Vec<String> = self
            .routes
            .iter()
            .filter(|(_, route)| route.moved)
            .map(|(name, _)| name.clone())
            .collect();
        for name in moved {
            if let Some(route) = self.routes.remove(&name) {
                let _ = route.events.try_send(Err(UpstreamError::Closed(
                    "the connection replacing the shared one ended".into(),
                )));
            }
        }
        for route in self.routes.values_mut() {
            route.handover = None;
        }
        self.replace_at = Some(Instant::now() + REPLACE_RETRY);
    }

    /// Makes an open successor the connection: streams that have not met
    /// it yet move as they are, the old connection closes. Returns whether
    /// there was one.
    fn promote(&mut self, ws: &mut Socket) -> bool {
        let Some(SharedSuccessor::Open {
            ws: successor,
            outbox,
            ..
        }) = self.successor.take()
        else {
            return false;
        };
        let unmoved: Vec<String> = self
            .routes
            .iter()
            .filter(|(_, route)| !route.moved)
            .map(|(name, _)| name.clone())
            .collect();
        for name in unmoved {
            self.move_route(&name);
        }
        for route in self.routes.values_mut() {
            route.moved = false;
        }
        let mut old = std::mem::replace(ws, *successor);
        tokio::spawn(async move {
            let _ = timeout(Duration::from_secs(1), old.close(None)).await;
        });
        // What the old connection still owed it owes no more.
        self.outbox = outbox;
        self.registry.replaced(self.id, &*self.telemetry);
        self.replacements += 1;
        let first = self
            .routes
            .values()
            .next()
            .map(|r| r.stream_id.clone())
            .unwrap_or_default();
        self.replace_at =
            Some(Instant::now() + replacement_age(&self.config, &first, self.replacements));
        tracing::info!(
            url = redact_url(&self.url),
            "replaced a shared connection before its age"
        );
        true
    }

    /// One stream moves to the successor: what it held past the handed-on
    /// sequence is handed on.
    fn move_route(&mut self, name: &str) {
        let Some(route) = self.routes.get_mut(name) else {
            return;
        };
        let held = route
            .handover
            .take()
            .map(Handover::switch)
            .unwrap_or_default();
        route.moved = true;
        route.floor = route.delivered;
        for event in held {
            self.deliver(name, event);
        }
    }

    fn command(&mut self, command: Command) {
        let overlapping = matches!(self.successor, Some(SharedSuccessor::Open { .. }));
        match command {
            Command::Add {
                route,
                stream_id,
                events,
                asked,
            } => {
                let mut held = Route::new(stream_id, events, Some(asked));
                match &mut self.successor {
                    // A stream that comes while a successor overlaps goes on
                    // the successor only: nothing of it to hand over.
                    Some(SharedSuccessor::Open { outbox, .. }) => {
                        held.moved = true;
                        outbox.subscribe(route.clone());
                    }
                    _ => self.outbox.subscribe(route.clone()),
                }
                self.routes.insert(route, held);
            }
            Command::Remove { route } => {
                if let Some(held) = self.routes.remove(&route) {
                    if !(overlapping && held.moved) {
                        self.unsubscribe(route.clone());
                    }
                    if overlapping {
                        self.unsubscribe_on_successor(route);
                    }
                }
            }
            Command::Resubscribe { route } => {
                let Some(held) = self.routes.get(&route) else {
                    return;
                };
                if overlapping && held.moved {
                    self.unsubscribe_on_successor(route.clone());
                    if let Some(SharedSuccessor::Open { outbox, .. }) = &mut self.successor {
                        outbox.subscribe(route);
                    }
                } else {
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

    fn unsubscribe_on_successor(&mut self, route: String) {
        if let Some(SharedSuccessor::Open { outbox, .. }) = &mut self.successor
            && !self.config.unsubscribe_template.is_empty()
        {
            outbox.unsubscribe(route);
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

    fn frame(&mut self, text: tokio_tungstenite::tungstenite::Utf8Bytes, at: Instant, side: Side) {
        let (event, route) = match self.reader.read(text.clone(), at) {
            Read::Event { event, route } => (event, route),
            Read::Skip(reason) => return self.skipped(reason),
            Read::Control | Read::NoSequence => return self.control(text.as_str()),
        };
        let Some((name, held)) = route.and_then(|route| self.routes.get_key_value(&route)) else {
            // For a stream no longer held (unsubscribed, moved by a takeover).
            return self.skipped(SkipReason::Control);
        };
        let (name, moved) = (name.clone(), held.moved);
        let overlapping = matches!(self.successor, Some(SharedSuccessor::Open { .. }));
        match side {
            // Carried by the successor now: the connection repeats it.
            Side::Current if overlapping && moved => {}
            Side::Current => {
                let handover = self.routes.get_mut(&name).and_then(|r| r.handover.as_mut());
                let event = match handover {
                    Some(handover) => handover.from_old(event),
                    None => event,
                };
                self.deliver(&name, event);
                if self.met(&name) {
                    self.move_route(&name);
                }
            }
            Side::Successor if moved => self.deliver(&name, event),
            Side::Successor => {
                if let Some(handover) = self.routes.get_mut(&name).and_then(|r| r.handover.as_mut())
                {
                    handover.from_new(event);
                }
                if self.met(&name) {
                    self.move_route(&name);
                }
            }
        }
    }

    /// Whether a stream's successor continues what was handed on (or holds
    /// as much as it may).
    fn met(&self, name: &str) -> bool {
        self.routes
            .get(name)
            .and_then(|route| route.handover.as_ref())
            .is_some_and(|handover| handover.met() || handover.full())
    }

    /// Hands an event to its stream (once: a successor's repeat of what was
    /// handed on is dropped).
    fn deliver(&mut self, name: &str, event: UpstreamEvent) {
        let Some(held) = self.routes.get_mut(name) else {
            return;
        };
        match held.floor {
            Some(floor) if event.seq <= floor => return,
            Some(_) => held.floor = None,
            None => {}
        }
        if let Some(asked) = held.asked.take() {
            self.registry.subscribed(
                self.id,
                &held.stream_id,
                event.received_at.saturating_duration_since(asked),
                &*self.telemetry,
            );
        }
        let seq = event.seq;
        match held.events.try_send(Ok(event)) {
            Ok(()) => held.delivered = held.delivered.max(Some(seq)),
            Err(mpsc::error::TrySendError::Full(_)) => {
                // Its machine is not reading: drop it from the connection
                // (its subscription ends; its resume mode covers the hole)
                // rather than stall every other stream on it.
                tracing::warn!(
                    route = name,
                    "a stream fell behind its shared connection; dropping it from the connection"
                );
                self.routes.remove(name);
                self.unsubscribe(name.to_owned());
                self.unsubscribe_on_successor(name.to_owned());
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.routes.remove(name);
                self.unsubscribe(name.to_owned());
                self.unsubscribe_on_successor(name.to_owned());
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
