//! The server every shape runs on: one port, hyper serving each TCP connection
//! (REST history and WebSocket upgrades), axum routing, and after an upgrade a
//! session task per WebSocket that drives the shape's [`Protocol`].
//!
//! A session computes its frames when they are due (no per-connection queue
//! grows with time), reads the client only while fewer than [`MAX_PENDING`]
//! answers wait to be sent, and ends on shutdown, on a cut (`cut_all`,
//! `cut_every`, a silent client) or when the client leaves.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::future::poll_fn;
use futures_util::{FutureExt, Sink, SinkExt, StreamExt};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::model::Timeline;
use super::{ExchangeConfig, HistoryOverride};

/// Frames a session computes between flushes: amortises syscalls when a client
/// is behind, small enough that shutdown and client messages are noticed.
pub(super) const BATCH: usize = 512;
/// Answers waiting to be sent above which the client is not read: a client that
/// sends pings but never reads cannot grow the queue.
const MAX_PENDING: usize = 1024;
/// Open WebSocket sessions; more are answered 503.
const MAX_SESSIONS: usize = 4096;
/// A stray TCP connection must not hold a task forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Closing is best effort; a peer that never answers must not delay shutdown.
pub(super) const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Clients send subscribe messages and pings, nothing large.
const MAX_CLIENT_MESSAGE: usize = 64 * 1024;
/// See the feed simulator: tungstenite zeroes its whole read chunk per poll.
const CLIENT_READ_BUFFER: usize = 4 * 1024;
/// Request line and headers (hyper's minimum is 8 KiB).
const MAX_HTTP_HEAD: usize = 16 * 1024;

/// What every request handler and session of one server shares.
pub(super) struct Shared {
    pub(super) config: ExchangeConfig,
    /// The current timeline, replaced by a restart. Sessions take the one
    /// current when they start and keep it (a restart cuts them anyway);
    /// requests and accessors take it once each.
    timeline: RwLock<Arc<Timeline>>,
    restarts: AtomicU64,
    pub(super) shutdown: CancellationToken,
    sessions: TaskTracker,
    /// Open sessions by number, each with the token that cuts it.
    open: Mutex<HashMap<u64, CancellationToken>>,
    accepted: AtomicU64,
    cuts: AtomicU64,
    /// Client messages read (text, binary, ping and pong frames).
    messages: AtomicU64,
    /// Connections a shape closed for breaking a limit (Binance's combined
    /// stream: messages per second, streams per connection).
    limit_closes: AtomicU64,
    history_requests: AtomicU64,
    history_override: Mutex<Option<HistoryOverride>>,
    panics: AtomicU64,
    /// Frames a test sends to every open session, as they are.
    injected: tokio::sync::broadcast::Sender<String>,
    /// The next checksummed update frame sent carries a wrong checksum.
    corrupt_checksum: AtomicBool,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; if something did, the data
    // (a map of tokens, an override) is still consistent.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub(super) fn new(config: ExchangeConfig, shutdown: CancellationToken) -> Shared {
        Shared {
            timeline: RwLock::new(Arc::new(Timeline::new(config.rate, config.first_id))),
            restarts: AtomicU64::new(0),
            history_override: Mutex::new(config.history_status_override),
            config,
            shutdown,
            sessions: TaskTracker::new(),
            open: Mutex::new(HashMap::new()),
            accepted: AtomicU64::new(0),
            cuts: AtomicU64::new(0),
            messages: AtomicU64::new(0),
            limit_closes: AtomicU64::new(0),
            history_requests: AtomicU64::new(0),
            panics: AtomicU64::new(0),
            injected: tokio::sync::broadcast::channel(16).0,
            corrupt_checksum: AtomicBool::new(false),
        }
    }

    /// The current timeline (see [`Shared::restart`]).
    pub(super) fn timeline(&self) -> Arc<Timeline> {
        // Nothing panics while holding the lock; the Arc in it is whole.
        self.timeline
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// An exchange service restart: a new timeline from now whose ids start
    /// at 1, then every open session is cut; returns how many. Swapping first
    /// means a session that took the old timeline was already registered, so
    /// the cut reaches it; one registered after the cut takes the new one.
    pub(super) fn restart(&self) -> usize {
        let fresh = Arc::new(Timeline::new(self.config.rate, 1));
        *self
            .timeline
            .write()
            .unwrap_or_else(PoisonError::into_inner) = fresh;
        self.restarts.fetch_add(1, Ordering::Relaxed);
        self.cut_all()
    }

    pub(super) fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Makes the next checksummed update frame any session sends carry a
    /// wrong checksum.
    pub(super) fn corrupt_next_checksum(&self) {
        self.corrupt_checksum.store(true, Ordering::Release);
    }

    /// Whether this frame is the one to corrupt: true once per
    /// [`Shared::corrupt_next_checksum`].
    pub(super) fn take_corrupt_checksum(&self) -> bool {
        self.corrupt_checksum.load(Ordering::Relaxed)
            && self.corrupt_checksum.swap(false, Ordering::AcqRel)
    }

    /// Sends `frame` to every open session; returns how many.
    pub(super) fn inject(&self, frame: &str) -> usize {
        self.injected.send(frame.to_owned()).unwrap_or(0)
    }

    pub(super) fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    pub(super) fn cuts(&self) -> u64 {
        self.cuts.load(Ordering::Relaxed)
    }

    pub(super) fn messages(&self) -> u64 {
        self.messages.load(Ordering::Relaxed)
    }

    pub(super) fn limit_closes(&self) -> u64 {
        self.limit_closes.load(Ordering::Relaxed)
    }

    /// Counts a connection closed for breaking a limit.
    pub(super) fn count_limit_close(&self) {
        self.limit_closes.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn history_requests(&self) -> u64 {
        self.history_requests.load(Ordering::Relaxed)
    }

    /// Sessions and connections that panicked (tests assert none did).
    #[cfg(test)]
    pub(super) fn panics(&self) -> u64 {
        self.panics.load(Ordering::Relaxed)
    }

    pub(super) fn open_sessions(&self) -> usize {
        locked(&self.open).len()
    }

    /// Signals every open session that has not been cut yet; returns how many.
    pub(super) fn cut_all(&self) -> usize {
        let open = locked(&self.open);
        let mut signalled = 0;
        for token in open.values().filter(|token| !token.is_cancelled()) {
            token.cancel();
            signalled += 1;
        }
        signalled
    }

    pub(super) fn set_history_override(&self, value: Option<HistoryOverride>) {
        *locked(&self.history_override) = value.filter(|o| o.times > 0);
    }

    /// Counts a history request and takes one use of the override, if any.
    pub(super) fn history_request(&self) -> Option<HistoryOverride> {
        self.history_requests.fetch_add(1, Ordering::Relaxed);
        let mut current = locked(&self.history_override);
        let taken = current.as_mut()?;
        taken.times -= 1;
        let answer = *taken;
        if taken.times == 0 {
            *current = None;
        }
        Some(answer)
    }
}

/// One open WebSocket session; leaves the registry when dropped.
pub(super) struct Session {
    /// 1-based, in the order sessions were accepted.
    pub(super) number: u64,
    cut: CancellationToken,
    pub(super) shared: Arc<Shared>,
}

impl Session {
    fn open(shared: Arc<Shared>) -> Session {
        let number = shared.accepted.fetch_add(1, Ordering::Relaxed) + 1;
        let cut = CancellationToken::new();
        locked(&shared.open).insert(number, cut.clone());
        Session {
            number,
            cut,
            shared,
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        locked(&self.shared.open).remove(&self.number);
    }
}

/// Odd-numbered sessions are cut with a close frame (1001), even-numbered ones
/// by dropping the socket without one: real exchanges do both.
pub(super) fn cut_with_close_frame(number: u64) -> bool {
    number % 2 == 1
}

/// Frames waiting to be sent, oldest first.
pub(super) type Outbox = VecDeque<String>;

/// What a client message was, as far as the session loop cares.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Heard {
    /// An application-level ping: resets the silent-client timer.
    pub(super) app_ping: bool,
}

/// A shape's decision to end the connection with a close frame.
#[derive(Debug, Clone, Copy)]
pub(super) struct Refusal {
    pub(super) code: CloseCode,
    pub(super) reason: &'static str,
}

/// One shape's side of a WebSocket connection. Frames go into the outbox; the
/// session loop sends them.
pub(super) trait Protocol: Send + 'static {
    /// Frames sent as soon as the connection is open.
    fn opening(&mut self, _out: &mut Outbox) {}
    /// A text message from the client.
    fn on_text(&mut self, text: &str, out: &mut Outbox) -> Heard;
    /// A binary message from the client (no shape expects one).
    fn on_binary(&mut self, out: &mut Outbox) -> Heard;
    /// A ping or pong frame from the client (tungstenite answers pings);
    /// shapes that count every incoming message see it here.
    fn on_control_frame(&mut self) {}
    /// Adds up to [`BATCH`] frames due at `now`, or ends the connection.
    fn emit_due(&mut self, now: Instant, out: &mut Outbox) -> Option<Refusal>;
    /// When something next becomes due (`None`: only a client message can
    /// change anything).
    fn next_wake(&self, now: Instant) -> Option<Instant>;
}

/// Serves HTTP on `listener` until shutdown, then waits for every connection
/// and session to end.
pub(super) async fn accept_loop(listener: TcpListener, router: Router, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = shared.shutdown.cancelled() => break,
            // Reap finished connections so the set does not grow with churn.
            Some(joined) = connections.join_next(), if !connections.is_empty() => {
                if joined.is_err_and(|error| error.is_panic()) {
                    shared.panics.fetch_add(1, Ordering::Relaxed);
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((tcp, _peer)) => {
                    connections.spawn(serve_http(tcp, router.clone(), shared.shutdown.clone()));
                }
                Err(error) => {
                    // Usually fd exhaustion: back off instead of spinning.
                    tracing::warn!(%error, "exchange accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    shared.sessions.close();
    shared.sessions.wait().await;
    tracing::info!("exchange server stopped");
}

async fn serve_http(tcp: TcpStream, router: Router, shutdown: CancellationToken) {
    let _ = tcp.set_nodelay(true);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT)
        .max_buf_size(MAX_HTTP_HEAD);
    let connection = builder
        .serve_connection(TokioIo::new(tcp), TowerToHyperService::new(router))
        .with_upgrades();
    tokio::pin!(connection);
    tokio::select! {
        // An upgraded connection ends here; its session runs on in its own task.
        _ = connection.as_mut() => {}
        _ = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            let _ = timeout(CLOSE_TIMEOUT, connection).await;
        }
    }
}

/// A plain-text answer (404, 400 on a bad upgrade, 503).
pub(super) fn plain(status: StatusCode, message: &'static str) -> Response {
    (status, message).into_response()
}

/// Checks a WebSocket upgrade request and returns its `Sec-WebSocket-Accept`.
fn accept_key(request: &Request) -> Result<String, &'static str> {
    if request.method() != Method::GET {
        return Err("a WebSocket upgrade is a GET request");
    }
    let headers = request.headers();
    let has_token = |name: header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|value| {
            value.to_str().is_ok_and(|text| {
                text.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case(token))
            })
        })
    };
    if !has_token(header::CONNECTION, "upgrade") || !has_token(header::UPGRADE, "websocket") {
        return Err("expected a WebSocket upgrade");
    }
    if headers.get(header::SEC_WEBSOCKET_VERSION) != Some(&HeaderValue::from_static("13")) {
        return Err("unsupported WebSocket version (13 expected)");
    }
    match headers.get(header::SEC_WEBSOCKET_KEY) {
        Some(key) if !key.is_empty() && key.len() <= 64 => Ok(derive_accept_key(key.as_bytes())),
        _ => Err("missing Sec-WebSocket-Key"),
    }
}

/// Answers a WebSocket upgrade and starts its session, whose protocol `make`
/// builds once the socket is taken over (so a live start is computed then).
pub(super) fn upgrade<P, F>(shared: &Arc<Shared>, mut request: Request, make: F) -> Response
where
    P: Protocol,
    F: FnOnce(&Session) -> P + Send + 'static,
{
    let accept = match accept_key(&request) {
        Ok(accept) => accept,
        Err(message) => return plain(StatusCode::BAD_REQUEST, message),
    };
    let Some(on_upgrade) = request.extensions_mut().remove::<OnUpgrade>() else {
        return plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            "connection cannot upgrade",
        );
    };
    if shared.shutdown.is_cancelled() || shared.open_sessions() >= MAX_SESSIONS {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "not accepting connections");
    }
    let tracker = shared.sessions.clone();
    let shared = shared.clone();
    tracker.spawn(async move {
        let upgraded = tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            upgraded = timeout(HANDSHAKE_TIMEOUT, on_upgrade) => match upgraded {
                Ok(Ok(upgraded)) => upgraded,
                _ => return,
            },
        };
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_CLIENT_MESSAGE))
            .max_frame_size(Some(MAX_CLIENT_MESSAGE))
            .read_buffer_size(CLIENT_READ_BUFFER);
        let ws =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config))
                .await;
        let session = Session::open(shared);
        let run = AssertUnwindSafe(async {
            let protocol = make(&session);
            drive(ws, protocol, &session).await;
        });
        if run.catch_unwind().await.is_err() {
            session.shared.panics.fetch_add(1, Ordering::Relaxed);
            tracing::error!(session = session.number, "exchange session panicked");
        }
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(accept) = HeaderValue::from_str(&accept) {
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    response
}

enum End {
    Shutdown,
    Cut(&'static str),
    Refused(Refusal),
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Runs one session until it ends (see the module doc).
async fn drive<S, P>(ws: WebSocketStream<S>, mut protocol: P, session: &Session)
where
    S: AsyncRead + AsyncWrite + Unpin,
    P: Protocol,
{
    let shared = &session.shared;
    let (mut sink, mut source) = ws.split();
    let mut out = Outbox::new();
    let mut injected = shared.injected.subscribe();
    let opened = Instant::now();
    protocol.opening(&mut out);
    let lifetime = shared.config.cut_every.and_then(|d| opened.checked_add(d));
    let silent_after = shared.config.silent_cut_after;
    let mut last_ping = opened;
    let end = loop {
        let now = Instant::now();
        if out.is_empty()
            && let Some(refusal) = protocol.emit_due(now, &mut out)
        {
            break End::Refused(refusal);
        }
        let wake = if out.is_empty() {
            protocol.next_wake(now)
        } else {
            None
        };
        let silent = silent_after.and_then(|d| last_ping.checked_add(d));
        tokio::select! {
            biased;
            _ = shared.shutdown.cancelled() => break End::Shutdown,
            _ = session.cut.cancelled() => break End::Cut("cut by the server"),
            _ = sleep_until_opt(lifetime) => break End::Cut("connection lifetime reached"),
            _ = sleep_until_opt(silent) => break End::Cut("no ping received"),
            message = source.next(), if out.len() < MAX_PENDING => {
                if matches!(message, Some(Ok(Message::Text(_) | Message::Binary(_) | Message::Ping(_) | Message::Pong(_)))) {
                    shared.messages.fetch_add(1, Ordering::Relaxed);
                }
                let heard = match message {
                    Some(Ok(Message::Text(text))) => protocol.on_text(&text, &mut out),
                    Some(Ok(Message::Binary(_))) => protocol.on_binary(&mut out),
                    Some(Ok(Message::Close(_))) => {
                        // tungstenite queued the close reply; push it out.
                        let _ = timeout(CLOSE_TIMEOUT, sink.flush()).await;
                        return;
                    }
                    // Pings are answered by tungstenite.
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => {
                        protocol.on_control_frame();
                        Heard::default()
                    }
                    Some(Ok(_)) => Heard::default(),
                    Some(Err(_)) | None => return,
                };
                if heard.app_ping {
                    last_ping = Instant::now();
                }
            }
            frame = injected.recv() => if let Ok(frame) = frame { out.push_back(frame) },
            sent = send_out(&mut sink, &mut out), if !out.is_empty() => if sent.is_err() { return },
            _ = sleep_until_opt(wake), if out.is_empty() => {}
        }
    };
    match end {
        End::Shutdown => close(&mut sink, &mut source, CloseCode::Away, "shutting down").await,
        End::Cut(reason) => {
            shared.cuts.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                session = session.number,
                reason,
                "exchange cut a connection"
            );
            if cut_with_close_frame(session.number) {
                close(&mut sink, &mut source, CloseCode::Away, reason).await;
            }
            // Otherwise dropping both halves drops the socket: no close frame.
        }
        End::Refused(refusal) => {
            let _ = timeout(CLOSE_TIMEOUT, send_out(&mut sink, &mut out)).await;
            close(&mut sink, &mut source, refusal.code, refusal.reason).await;
        }
    }
}

/// Sends the outbox and flushes. Cancel-safe: a frame leaves the outbox only
/// when the sink took it.
async fn send_out<K>(sink: &mut K, out: &mut Outbox) -> Result<(), WsError>
where
    K: Sink<Message, Error = WsError> + Unpin,
{
    while !out.is_empty() {
        poll_fn(|cx| sink.poll_ready_unpin(cx)).await?;
        if let Some(frame) = out.pop_front() {
            sink.start_send_unpin(Message::text(frame))?;
        }
    }
    poll_fn(|cx| sink.poll_flush_unpin(cx)).await
}

/// Sends a close frame and waits (bounded) for the peer's reply, so the peer
/// reads everything sent before the socket goes away.
async fn close<K, R>(sink: &mut K, source: &mut R, code: CloseCode, reason: &str)
where
    K: Sink<Message, Error = WsError> + Unpin,
    R: futures_util::Stream<Item = Result<Message, WsError>> + Unpin,
{
    let frame = CloseFrame {
        code,
        reason: reason.to_owned().into(),
    };
    let _ = timeout(CLOSE_TIMEOUT, async {
        if sink.send(Message::Close(Some(frame))).await.is_ok() {
            while let Some(Ok(_)) = source.next().await {}
        }
    })
    .await;
}
