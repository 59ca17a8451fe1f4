//! The feed simulator (design §3.4): a WebSocket server that serves any stream id,
//! with sequences advancing at a fixed rate from the feed's start.
//!
//! Events are a pure function of `(stream_id, seq)` and the feed's start time, so
//! nothing is stored: replay and live delivery both just compute frames. Each
//! connection runs in its own task, so a slow client only slows itself.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{Instant, sleep_until, timeout};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;

/// Frames sent between flushes: large enough to amortise syscalls during replay,
/// small enough that shutdown and client messages are noticed promptly.
const BATCH: u64 = 512;
/// A stray TCP connection must not hold a task forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(30);
/// Closing is best effort; a peer that never answers must not delay shutdown.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Clients only ever send a small subscribe message.
const MAX_CLIENT_MESSAGE: usize = 64 * 1024;
const MAX_STREAM_ID: usize = 1024;

/// How the simulator generates events.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FeedConfig {
    /// Events per second per stream.
    pub rate: f64,
    /// Events kept per stream; older `from_seq` requests are refused.
    pub retention: u64,
    /// Events already available at start (replayed as fast as the socket goes).
    pub backlog: u64,
}

impl Default for FeedConfig {
    fn default() -> Self {
        FeedConfig {
            rate: 10.0,
            retention: 100_000,
            backlog: 0,
        }
    }
}

/// Why the simulator could not start.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    /// The configuration cannot produce a feed.
    #[error("invalid feed configuration: {0}")]
    Config(String),
    /// The listen address could not be bound.
    #[error("could not listen on {addr}: {source}")]
    Bind {
        /// Address asked for.
        addr: SocketAddr,
        /// What the OS said.
        source: std::io::Error,
    },
}

/// When each sequence becomes available and what time it carries.
#[derive(Debug)]
struct Timeline {
    start: Instant,
    start_unix_ms: u64,
    rate: f64,
    backlog: u64,
    retention: u64,
}

impl Timeline {
    fn head_at(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.start).as_secs_f64();
        // `as` saturates, which is the right answer for absurd rates.
        self.backlog
            .saturating_add((elapsed * self.rate).floor() as u64)
    }

    fn head(&self) -> u64 {
        self.head_at(Instant::now())
    }

    fn earliest(&self, head: u64) -> u64 {
        head.saturating_sub(self.retention - 1).max(1)
    }

    fn ts_ms(&self, seq: u64) -> u64 {
        if seq <= self.backlog {
            return self.start_unix_ms;
        }
        let offset = ((seq - self.backlog) as f64 * 1000.0 / self.rate).round() as u64;
        self.start_unix_ms.saturating_add(offset)
    }

    /// `None` when the due time is too far away to represent.
    fn due(&self, seq: u64) -> Option<Instant> {
        let secs = seq.saturating_sub(self.backlog) as f64 / self.rate;
        let offset = Duration::try_from_secs_f64(secs).ok()?;
        self.start.checked_add(offset)
    }
}

/// A running simulator.
#[derive(Debug)]
pub struct FeedServer {
    local_addr: SocketAddr,
    timeline: Arc<Timeline>,
    task: JoinHandle<()>,
}

impl FeedServer {
    /// Binds `addr` (use port 0 in tests) and starts serving in a spawned task.
    pub async fn start(
        addr: SocketAddr,
        config: FeedConfig,
        shutdown: CancellationToken,
    ) -> Result<FeedServer, FeedError> {
        if !(config.rate.is_finite() && config.rate > 0.0) {
            return Err(FeedError::Config(format!(
                "rate must be a positive number of events per second, got {}",
                config.rate
            )));
        }
        if config.retention == 0 {
            return Err(FeedError::Config(
                "retention must keep at least one event".into(),
            ));
        }
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| FeedError::Bind { addr, source })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| FeedError::Bind { addr, source })?;
        let start_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let timeline = Arc::new(Timeline {
            start: Instant::now(),
            start_unix_ms,
            rate: config.rate,
            backlog: config.backlog,
            retention: config.retention,
        });
        let task = tokio::spawn(accept_loop(listener, timeline.clone(), shutdown));
        tracing::info!(%local_addr, rate = config.rate, retention = config.retention, backlog = config.backlog, "feed simulator listening");
        Ok(FeedServer {
            local_addr,
            timeline,
            task,
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The URL clients connect to, e.g. `ws://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        let mut addr = self.local_addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        format!("ws://{addr}/")
    }

    /// Current head sequence (same for every stream).
    pub fn head(&self) -> u64 {
        self.timeline.head()
    }

    /// The `ts_ms` every frame for `seq` carries, on any stream.
    pub fn ts_ms(&self, seq: u64) -> u64 {
        self.timeline.ts_ms(seq)
    }

    /// Waits until the server task ended (after shutdown is cancelled), including
    /// every connection it served.
    pub async fn finished(self) {
        if let Err(error) = self.task.await {
            tracing::error!(%error, "feed simulator task failed");
        }
    }
}

async fn accept_loop(listener: TcpListener, timeline: Arc<Timeline>, shutdown: CancellationToken) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            // Reap finished connections so the set does not grow with churn.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    connections.spawn(serve_connection(tcp, peer, timeline.clone(), shutdown.clone()));
                }
                Err(error) => {
                    // Usually fd exhaustion: back off instead of spinning.
                    tracing::warn!(%error, "feed accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    tracing::info!("feed simulator stopped");
}

type Sink = SplitSink<WebSocketStream<TcpStream>, Message>;
type Source = SplitStream<WebSocketStream<TcpStream>>;

#[derive(Deserialize)]
struct SubscribeRequest {
    subscribe: String,
    #[serde(default)]
    from_seq: Option<u64>,
}

enum Refusal {
    /// The client left or the socket failed: nobody to answer.
    Gone,
    /// Answer with an error frame and close.
    Error(String, &'static str, Option<u64>),
}

async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    timeline: Arc<Timeline>,
    shutdown: CancellationToken,
) {
    let _ = tcp.set_nodelay(true);
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_CLIENT_MESSAGE))
        .max_frame_size(Some(MAX_CLIENT_MESSAGE));
    let handshake = timeout(
        HANDSHAKE_TIMEOUT,
        tokio_tungstenite::accept_async_with_config(tcp, Some(config)),
    );
    let ws = tokio::select! {
        _ = shutdown.cancelled() => return,
        result = handshake => match result {
            Ok(Ok(ws)) => ws,
            Ok(Err(error)) => {
                tracing::debug!(%peer, %error, "feed handshake failed");
                return;
            }
            Err(_) => return,
        },
    };
    let (mut sink, mut source) = ws.split();

    let request = tokio::select! {
        _ = shutdown.cancelled() => {
            close(&mut sink, &mut source, CloseCode::Away, "shutting down").await;
            return;
        }
        request = timeout(SUBSCRIBE_TIMEOUT, read_subscribe(&mut source)) => match request {
            Ok(request) => request,
            Err(_) => Err(Refusal::Error("no subscribe message received in time".into(), "bad_request", None)),
        },
    };
    let request = request.and_then(|(stream_id, from_seq)| {
        let earliest = timeline.earliest(timeline.head());
        if from_seq < earliest {
            Err(Refusal::Error(
                format!(
                    "from_seq {from_seq} is older than the retention window (earliest {earliest})"
                ),
                "retention_exceeded",
                Some(earliest),
            ))
        } else {
            Ok((stream_id, from_seq))
        }
    });
    let (stream_id, from_seq) = match request {
        Ok(request) => request,
        Err(Refusal::Gone) => return,
        Err(Refusal::Error(message, code, earliest)) => {
            tracing::debug!(%peer, code, message, "feed request refused");
            let mut frame = serde_json::json!({ "error": message, "code": code });
            if let Some(earliest) = earliest {
                frame["earliest_seq"] = earliest.into();
            }
            let sent = timeout(CLOSE_TIMEOUT, sink.send(Message::text(frame.to_string()))).await;
            if matches!(sent, Ok(Ok(()))) {
                close(&mut sink, &mut source, CloseCode::Policy, code).await;
            }
            return;
        }
    };
    tracing::debug!(%peer, stream_id, from_seq, "feed subscription");
    let frames = FrameMaker::new(&stream_id);
    stream_events(
        &mut sink,
        &mut source,
        &frames,
        &timeline,
        from_seq,
        &shutdown,
    )
    .await;
}

/// Reads until the subscribe message; control frames before it are fine.
async fn read_subscribe(source: &mut Source) -> Result<(String, u64), Refusal> {
    let bad = |message: String| Refusal::Error(message, "bad_request", None);
    loop {
        match source.next().await {
            Some(Ok(Message::Text(text))) => {
                let usage = "expected {\"subscribe\": \"<stream_id>\", \"from_seq\": <n>}";
                // serde would also accept a JSON array for a struct; the contract is an object.
                let request = match serde_json::from_str::<serde_json::Value>(&text) {
                    Ok(value) if value.is_object() => {
                        serde_json::from_value::<SubscribeRequest>(value)
                            .map_err(|e| bad(format!("{usage}: {e}")))?
                    }
                    _ => return Err(bad(usage.to_owned())),
                };
                if request.subscribe.is_empty() || request.subscribe.len() > MAX_STREAM_ID {
                    return Err(bad(format!("stream id must be 1 to {MAX_STREAM_ID} bytes")));
                }
                return Ok((request.subscribe, request.from_seq.unwrap_or(0).max(1)));
            }
            Some(Ok(Message::Binary(_))) => {
                return Err(bad("the subscribe message must be a text frame".into()));
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return Err(Refusal::Gone),
        }
    }
}

/// Replays from `next` to the head, then follows the head as it advances.
async fn stream_events(
    sink: &mut Sink,
    source: &mut Source,
    frames: &FrameMaker,
    timeline: &Timeline,
    mut next: u64,
    shutdown: &CancellationToken,
) {
    loop {
        let now = Instant::now();
        let head = timeline.head_at(now);
        if next <= head {
            let end = head.min(next.saturating_add(BATCH - 1));
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                message = source.next() => if !client_still_there(sink, message).await { return },
                sent = send_range(sink, frames, timeline, &mut next, end) => if sent.is_err() { return },
            }
        } else {
            // Float rounding can put the due time a hair before the head moves;
            // never spin on it.
            let wake = match timeline.due(next) {
                Some(due) if due > now => due,
                Some(_) => now + Duration::from_millis(1),
                None => now + Duration::from_secs(3600),
            };
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                message = source.next() => if !client_still_there(sink, message).await { return },
                _ = sleep_until(wake) => {}
            }
        }
    }
    close(sink, source, CloseCode::Away, "shutting down").await;
}

/// Feeds `next..=end` into the sink and flushes once. Cancel-safe: `next` only
/// advances past frames the sink accepted.
async fn send_range(
    sink: &mut Sink,
    frames: &FrameMaker,
    timeline: &Timeline,
    next: &mut u64,
    end: u64,
) -> Result<(), WsError> {
    while *next <= end {
        let frame = frames.frame(*next, timeline.ts_ms(*next));
        sink.feed(Message::text(frame)).await?;
        *next += 1;
    }
    sink.flush().await
}

/// Handles a message from a subscribed client; false when the connection is over.
async fn client_still_there(sink: &mut Sink, message: Option<Result<Message, WsError>>) -> bool {
    match message {
        Some(Ok(Message::Close(_))) => {
            // tungstenite queued the close reply; push it out.
            let _ = timeout(CLOSE_TIMEOUT, sink.flush()).await;
            false
        }
        Some(Ok(_)) => true,
        Some(Err(_)) | None => false,
    }
}

/// Sends a close frame and waits (bounded) for the peer's reply, so the peer
/// reads everything sent before the socket goes away.
async fn close(sink: &mut Sink, source: &mut Source, code: CloseCode, reason: &str) {
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

/// Builds the frames of one stream; the escaped stream id and its hash are
/// computed once per connection because replay builds frames in a tight loop.
struct FrameMaker {
    /// The stream id as a JSON string literal, quotes included.
    quoted_id: String,
    hash: u64,
}

impl FrameMaker {
    fn new(stream_id: &str) -> Self {
        // Serialising a str cannot fail; the fallback keeps the frame valid JSON.
        let quoted_id = serde_json::to_string(stream_id).unwrap_or_else(|_| "\"\"".into());
        FrameMaker {
            quoted_id,
            hash: fnv1a(stream_id.as_bytes()),
        }
    }

    fn frame(&self, seq: u64, ts_ms: u64) -> String {
        let mixed = splitmix64(self.hash ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let cents = 10_000 + mixed % 1_000_000;
        let qty = 1 + (mixed >> 40) % 1_000;
        // The event id is the stream id literal with ":<seq>" inside its quotes.
        let id_prefix = &self.quoted_id[..self.quoted_id.len() - 1];
        format!(
            r#"{{"stream_id":{},"seq":{seq},"event_id":{id_prefix}:{seq}","ts_ms":{ts_ms},"payload":{{"price":{}.{:02},"qty":{qty}}}}}"#,
            self.quoted_id,
            cents / 100,
            cents % 100,
        )
    }
}

/// The frame the simulator sends for `(stream_id, seq)` stamped `ts_ms`.
pub fn event_frame(stream_id: &str, seq: u64, ts_ms: u64) -> String {
    FrameMaker::new(stream_id).frame(seq, ts_ms)
}

/// A stable hash (unlike `DefaultHasher`, guaranteed across Rust versions), so
/// payloads are reproducible between runs and builds.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use tokio_tungstenite::MaybeTlsStream;

    /// Generous: only a broken server takes this long.
    const WAIT: Duration = Duration::from_secs(10);

    type Client = WebSocketStream<MaybeTlsStream<TcpStream>>;

    async fn start(config: FeedConfig) -> (FeedServer, CancellationToken) {
        let shutdown = CancellationToken::new();
        let server = FeedServer::start(([127, 0, 0, 1], 0).into(), config, shutdown.clone())
            .await
            .expect("feed starts");
        (server, shutdown)
    }

    async fn connect(server: &FeedServer, request: &str) -> Client {
        let (mut ws, _) = timeout(WAIT, tokio_tungstenite::connect_async(server.url()))
            .await
            .expect("connect in time")
            .expect("connect");
        ws.send(Message::text(request))
            .await
            .expect("send subscribe");
        ws
    }

    /// The next text frame as JSON, or `None` when the server closed.
    async fn next_json(ws: &mut Client) -> Option<Value> {
        loop {
            match timeout(WAIT, ws.next()).await.expect("frame in time") {
                Some(Ok(Message::Text(text))) => {
                    return Some(serde_json::from_str(&text).expect("valid JSON"));
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return None,
                Some(Ok(_)) => {}
            }
        }
    }

    #[tokio::test]
    async fn subscribe_from_one_delivers_consecutive_events() {
        let (server, shutdown) = start(FeedConfig {
            rate: 50.0,
            ..FeedConfig::default()
        })
        .await;
        let mut ws = connect(&server, r#"{"subscribe": "btc-usd", "from_seq": 1}"#).await;
        let mut previous_ts = None;
        for seq in 1..=5u64 {
            let event = next_json(&mut ws).await.expect("event");
            assert_eq!(event["stream_id"], "btc-usd");
            assert_eq!(event["seq"], seq);
            assert_eq!(event["event_id"], format!("btc-usd:{seq}"));
            let ts = event["ts_ms"].as_u64().expect("ts_ms");
            assert_eq!(ts, server.ts_ms(seq));
            if let Some(previous) = previous_ts {
                assert_eq!(ts - previous, 20, "50 events/s are 20 ms apart");
            }
            previous_ts = Some(ts);
            assert!(event["payload"]["price"].as_f64().expect("price") >= 100.0);
            assert!(event["payload"]["qty"].as_u64().expect("qty") >= 1);
            // Events are a pure function of (stream, seq, ts).
            let expected: Value =
                serde_json::from_str(&event_frame("btc-usd", seq, ts)).expect("JSON");
            assert_eq!(event, expected);
        }
        // A client that stops reading would hold the server's bounded close wait.
        drop(ws);
        shutdown.cancel();
        timeout(WAIT, server.finished()).await.expect("stops");
    }

    #[tokio::test]
    async fn backlog_is_replayed_at_once_then_events_follow_the_rate() {
        let before = Instant::now();
        let rate = 25.0;
        let (server, shutdown) = start(FeedConfig {
            rate,
            retention: 1000,
            backlog: 20,
        })
        .await;
        let mut ws = connect(&server, r#"{"subscribe": "s", "from_seq": 0}"#).await;
        let connected = Instant::now();
        for seq in 1..=20u64 {
            let event = next_json(&mut ws).await.expect("backlog event");
            assert_eq!(event["seq"], seq);
            assert_eq!(
                event["ts_ms"],
                server.ts_ms(1),
                "backlog carries the start time"
            );
        }
        // Paced at 25/s the backlog would take 760 ms; a batch takes a few.
        assert!(connected.elapsed() < Duration::from_millis(600));
        for k in 1..=10u64 {
            let event = next_json(&mut ws).await.expect("live event");
            assert_eq!(event["seq"], 20 + k);
            // The server never sends an event before it is due.
            let due = before + Duration::from_secs_f64(k as f64 / rate);
            assert!(Instant::now() >= due, "seq {} arrived early", 20 + k);
        }
        drop(ws);
        shutdown.cancel();
        timeout(WAIT, server.finished()).await.expect("stops");
    }

    #[tokio::test]
    async fn streams_are_independent() {
        let (server, shutdown) = start(FeedConfig {
            rate: 0.01,
            retention: 1000,
            backlog: 100,
        })
        .await;
        let mut a = connect(&server, r#"{"subscribe": "a", "from_seq": 10}"#).await;
        let mut b = connect(&server, r#"{"subscribe": "b\"q", "from_seq": 50}"#).await;
        let mut differ = false;
        for i in 0..5u64 {
            let ea = next_json(&mut a).await.expect("a");
            let eb = next_json(&mut b).await.expect("b");
            assert_eq!(
                (ea["stream_id"].as_str(), ea["seq"].as_u64()),
                (Some("a"), Some(10 + i))
            );
            assert_eq!(eb["stream_id"], "b\"q");
            assert_eq!(eb["seq"], 50 + i);
            assert_eq!(eb["event_id"], format!("b\"q:{}", 50 + i));
            let payload = |id: &str| {
                let frame: Value = serde_json::from_str(&event_frame(id, 10 + i, 0)).expect("JSON");
                frame["payload"].clone()
            };
            differ |= payload("a") != payload("b");
        }
        assert!(differ, "payloads depend on the stream id");
        drop(a);
        // b is unaffected by a leaving.
        assert_eq!(next_json(&mut b).await.expect("b")["seq"], 55);
        drop(b);
        shutdown.cancel();
        timeout(WAIT, server.finished()).await.expect("stops");
    }

    #[tokio::test]
    async fn request_older_than_retention_is_refused_with_the_earliest_seq() {
        let (server, shutdown) = start(FeedConfig {
            rate: 0.01,
            retention: 10,
            backlog: 100,
        })
        .await;
        assert_eq!(server.head(), 100);
        let mut ws = connect(&server, r#"{"subscribe": "s", "from_seq": 90}"#).await;
        let error = next_json(&mut ws).await.expect("error frame");
        assert_eq!(error["code"], "retention_exceeded");
        assert_eq!(error["earliest_seq"], 91);
        assert!(next_json(&mut ws).await.is_none(), "closed after the error");
        // Missing from_seq means 1, which is also too old here.
        let mut ws = connect(&server, r#"{"subscribe": "s"}"#).await;
        assert_eq!(
            next_json(&mut ws).await.expect("error")["code"],
            "retention_exceeded"
        );
        let mut ws = connect(&server, r#"{"subscribe": "s", "from_seq": 91}"#).await;
        assert_eq!(next_json(&mut ws).await.expect("event")["seq"], 91);
        drop(ws);
        shutdown.cancel();
        timeout(WAIT, server.finished()).await.expect("stops");
    }

    #[tokio::test]
    async fn malformed_subscribe_is_a_bad_request_and_others_are_still_served() {
        let (server, shutdown) = start(FeedConfig {
            rate: 0.01,
            retention: 1000,
            backlog: 5,
        })
        .await;
        let mut healthy = connect(&server, r#"{"subscribe": "ok", "from_seq": 1}"#).await;
        assert_eq!(next_json(&mut healthy).await.expect("event")["seq"], 1);
        for bad in [
            "not json",
            r#"{"subscribe": 5}"#,
            r#"{"subscribe": "s", "from_seq": -3}"#,
            r#"{"subscribe": ""}"#,
            r#"["subscribe"]"#,
        ] {
            let mut ws = connect(&server, bad).await;
            let error = next_json(&mut ws).await.expect("error frame");
            assert_eq!(error["code"], "bad_request", "for {bad}");
            assert!(error["error"].is_string());
            assert!(next_json(&mut ws).await.is_none(), "closed after {bad}");
        }
        let (mut ws, _) = tokio_tungstenite::connect_async(server.url())
            .await
            .expect("connect");
        ws.send(Message::binary(vec![1, 2, 3])).await.expect("send");
        assert_eq!(
            next_json(&mut ws).await.expect("error")["code"],
            "bad_request"
        );
        // Both the old connection and new ones still work.
        assert_eq!(next_json(&mut healthy).await.expect("event")["seq"], 2);
        let mut again = connect(&server, r#"{"subscribe": "ok", "from_seq": 4}"#).await;
        assert_eq!(next_json(&mut again).await.expect("event")["seq"], 4);
        drop((healthy, again, ws));
        shutdown.cancel();
        timeout(WAIT, server.finished()).await.expect("stops");
    }

    #[tokio::test]
    async fn shutdown_closes_connections_and_the_listener() {
        let (server, shutdown) = start(FeedConfig::default()).await;
        let url = server.url();
        let mut ws = connect(&server, r#"{"subscribe": "s", "from_seq": 1}"#).await;
        let (mut idle, _) = timeout(WAIT, tokio_tungstenite::connect_async(server.url()))
            .await
            .expect("in time")
            .expect("connect");
        shutdown.cancel();
        timeout(WAIT, server.finished()).await.expect("stops");
        // Whatever was in flight, the stream ends.
        while next_json(&mut ws).await.is_some() {}
        assert!(next_json(&mut idle).await.is_none());
        assert!(tokio_tungstenite::connect_async(url).await.is_err());
    }

    #[tokio::test]
    async fn invalid_config_is_refused() {
        for config in [
            FeedConfig {
                rate: 0.0,
                ..FeedConfig::default()
            },
            FeedConfig {
                rate: f64::NAN,
                ..FeedConfig::default()
            },
            FeedConfig {
                retention: 0,
                ..FeedConfig::default()
            },
        ] {
            let result =
                FeedServer::start(([127, 0, 0, 1], 0).into(), config, CancellationToken::new())
                    .await;
            assert!(matches!(result, Err(FeedError::Config(_))), "{config:?}");
        }
    }

    #[test]
    fn frames_are_valid_json_for_awkward_stream_ids() {
        for id in ["plain", "quo\"te", "back\\slash", "new\nline", "ünï"] {
            let frame: Value = serde_json::from_str(&event_frame(id, 7, 1)).expect("JSON");
            assert_eq!(frame["stream_id"], id);
            assert_eq!(frame["event_id"], format!("{id}:7"));
        }
        assert_eq!(event_frame("x", 3, 9), event_frame("x", 3, 9));
        assert_ne!(
            event_frame("x", 3, 9),
            event_frame("x", 4, 9).replace("4", "3")
        );
    }
}
