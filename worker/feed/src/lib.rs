//! The feed simulator (docs/messages.md): a WebSocket server that serves any stream id,
//! with sequences advancing at a fixed rate from the feed's start.
//!
//! Events are a pure function of `(stream_id, seq)` and the feed's start time, so
//! nothing is stored: replay and live delivery both just compute frames. Each
//! connection runs in its own task, so a slow client only slows itself.
//!
//! Module map:
//! - this module: the replaying feed ([`FeedServer`], [`FeedConfig`]).
//! - [`exchange`]: fake servers in the shapes of real exchanges' public trade
//!   APIs (Binance, Coinbase, Kraken, Bybit), Binance's order-book diff
//!   streams (spot and USD-M futures) and the order books Bybit, OKX,
//!   Coinbase and Kraken send in the stream: live start only, their own
//!   subscribe messages, pings, REST history and order-book snapshots.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use leasehold_platform::clock::{Clock, SystemClock};

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

pub mod exchange;

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
/// Bytes read from a client per read. Clients send one subscribe and control
/// frames, and the send loop polls the client on every tick: tungstenite
/// zeroes its whole read chunk (128 KiB by default) on each poll, which was a
/// quarter of a live feed's CPU at 100 streams.
const CLIENT_READ_BUFFER: usize = 4 * 1024;
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
        let start_unix_ms = SystemClock.now_ms_u64();
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
        .max_frame_size(Some(MAX_CLIENT_MESSAGE))
        .read_buffer_size(CLIENT_READ_BUFFER);
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
mod tests;
