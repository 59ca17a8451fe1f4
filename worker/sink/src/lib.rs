//! Fenced sinks: where a stream's events go, guarded by the fence token.
//!
//! Layout v2 (docs/redis.md): every entry's id is `<fence token>-<seq>`, so
//! the stream's last generated id is at once the fence and the high-water mark,
//! and the store itself refuses an entry whose id is not above it: a zombie's
//! lower token and any replayed sequence, at any replay length.
//!
//! A new owner first *opens* the stream: one atomic call raises the last id to
//! `<its token>-<last seq>` (so a zombie's delayed write is refused from that
//! moment, even on a stream with no traffic; the stream is created if it does
//! not exist, so no zombie can create it under its lower token) and returns the
//! last sequence, where the owner resumes. A write is a batch of explicit-id
//! appends admitted whole or not at all; its refusals are a head of duplicates
//! (a takeover's replay) or the whole batch (fenced). A sink writes a stream only
//! under a token it opened on this connection: after a lost connection (which is
//! how a failover shows) every stream is opened again before its next write, so
//! a tail the new primary lacks is found instead of written over
//! ([`SinkError::NotOpen`]). Both sinks pass one conformance suite (`leasehold_testkit::sink`).
//!
//! Module map:
//! - this module: [`FencedSink`], [`SinkEvent`] (an event or a gap marker),
//!   the outcomes and errors, [`Payload`], [`open`] (a `SINK_URL` to a sink),
//!   [`OpenedStreams`] (which streams may be written under which token).
//! - [`keys`]: the sink's Redis key names.
//! - [`memory`], [`redis`]: the two sinks.
//! - [`url`]: the one `SINK_URL` parser.
//! - [`reader`]: the read-only position the dashboard shows (`SinkReader`).

pub mod keys;
pub mod memory;
pub mod reader;
pub mod redis;
pub mod url;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use leasehold_telemetry::GapReason;

/// An event's payload: the text as received (a frame, a history item),
/// sharing the buffer it was read into (cloning it is a reference count, not
/// a copy). Compares equal to `&str` and `String`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Payload(Bytes);

impl Payload {
    /// A payload over `bytes`, which its reader already knows to be text
    /// (a WebSocket text frame, a JSON item): no copy, no second check.
    pub fn from_shared(bytes: Bytes) -> Self {
        Payload(bytes)
    }

    /// The bytes, as sent to the sink.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Nothing in it (a gap marker's).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The text, checked (`None` for bytes that are not UTF-8, which a text
    /// frame never has).
    pub fn text(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    /// As text (an invalid byte, which a text frame never has, becomes U+FFFD).
    pub fn to_text(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }
}

impl From<&str> for Payload {
    fn from(text: &str) -> Self {
        Payload(Bytes::copy_from_slice(text.as_bytes()))
    }
}

impl From<String> for Payload {
    fn from(text: String) -> Self {
        Payload(Bytes::from(text))
    }
}

impl PartialEq<str> for Payload {
    fn eq(&self, other: &str) -> bool {
        self.0 == other.as_bytes()
    }
}

impl PartialEq<&str> for Payload {
    fn eq(&self, other: &&str) -> bool {
        self.0 == other.as_bytes()
    }
}

impl PartialEq<String> for Payload {
    fn eq(&self, other: &String) -> bool {
        self.0 == other.as_bytes()
    }
}

/// One entry to append: an event, a gap marker recording sequences that
/// will never arrive (at the position of the last of them, so a reader meets
/// the marker exactly where the data is missing), or an order book's snapshot
/// (at the sequence it is the book at; with the diffs missed before it, if
/// any, as a marker's range).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkEvent {
    /// Upstream sequence number (a marker: its last missing sequence, `gap_to`).
    pub seq: u64,
    /// Upstream event id (empty for a marker: an event's id never is).
    pub event_id: String,
    /// The event as received (empty for a marker).
    pub payload: Payload,
    /// `Some` for a gap marker, and for a snapshot that replaces missed diffs.
    pub gap: Option<GapMark>,
    /// A snapshot entry: `payload` is the book's body as received, stored
    /// under the field `snapshot` (docs/redis.md: how a reader rebuilds a
    /// book from any position).
    pub snapshot: bool,
}

/// What a gap marker records besides its position (`gap_to` = its `seq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GapMark {
    /// First missing sequence.
    pub from: u64,
    /// Why they are missing.
    pub reason: GapReason,
}

/// A reset entry: the upstream's sequence started over. Stored at position
/// `to - 1` under the new epoch's (raised) fence token, so entry ids still
/// increase and the next event, `to`, follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResetMark {
    /// The last sequence before (`reset_from`).
    pub from: u64,
    /// The first sequence after (`reset_to`), at least 1.
    pub to: u64,
}

impl ResetMark {
    /// Where the entry sits: just before the new epoch's first sequence.
    pub fn position(&self) -> u64 {
        self.to.saturating_sub(1)
    }
}

impl SinkEvent {
    /// An event.
    pub fn data(seq: u64, event_id: impl Into<String>, payload: impl Into<Payload>) -> Self {
        SinkEvent {
            seq,
            event_id: event_id.into(),
            payload: payload.into(),
            gap: None,
            snapshot: false,
        }
    }

    /// A gap marker for `from..=to`.
    pub fn gap(from: u64, to: u64, reason: GapReason) -> Self {
        SinkEvent {
            seq: to,
            event_id: String::new(),
            payload: Payload::default(),
            gap: Some(GapMark { from, reason }),
            snapshot: false,
        }
    }

    /// An order book's snapshot: the book at `seq`, its body as received;
    /// `missed` when diffs before it were lost (`gap_from`..=`seq`, with the
    /// reason), so a reader knows its book was wrong until here.
    pub fn snapshot(seq: u64, body: impl Into<Payload>, missed: Option<GapMark>) -> Self {
        SinkEvent {
            seq,
            event_id: String::new(),
            payload: body.into(),
            gap: missed,
            snapshot: true,
        }
    }
}

/// A batch of one stream's events, under one fence token.
#[derive(Debug, Clone, Copy)]
pub struct SinkBatch<'a> {
    /// Stream written.
    pub stream_id: &'a str,
    /// The writer's fence token.
    pub fence_token: u64,
    /// Events in sequence order.
    pub events: &'a [SinkEvent],
}

impl SinkBatch<'_> {
    /// Refuses a batch whose sequences do not strictly increase, or that
    /// holds sequence 0 (the id `<token>-0` marks an opened, empty stream).
    /// Ids only go up: an unordered batch would lose the events after its
    /// first step back, and the sinks classify refusals as a batch's head.
    pub fn check_order(&self) -> Result<(), SinkError> {
        if self.events.first().is_some_and(|event| event.seq == 0) {
            return Err(SinkError::Rejected(format!(
                "batch for {} holds sequence 0 (sequences start at 1)",
                self.stream_id
            )));
        }
        match self
            .events
            .windows(2)
            .find(|pair| pair[1].seq <= pair[0].seq)
        {
            None => Ok(()),
            Some(pair) => Err(SinkError::Rejected(format!(
                "batch for {} is not in sequence order ({} after {})",
                self.stream_id, pair[1].seq, pair[0].seq
            ))),
        }
    }
}

/// What a new owner learns when it opens a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenOutcome {
    /// The token of the stream's last id after the call (the fence).
    pub highest_token: u64,
    /// The sequence of the stream's last id (the last appended entry's, even
    /// if trimmed since), if any entry was ever appended.
    pub last_seq: Option<u64>,
    /// A newer token already exists: the caller is not the owner (or its lease
    /// record was re-created behind the sink's back).
    pub fenced: bool,
}

/// What the sink did with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteOutcome {
    /// Events appended.
    pub accepted: u64,
    /// Events dropped because their sequence is at or below the last appended one.
    pub duplicate: u64,
    /// Events rejected because a newer fence token exists (all of the batch, or none).
    pub fenced: u64,
    /// The token of the stream's last id after the write (the fence).
    pub highest_token: u64,
}

impl WriteOutcome {
    /// The writer's token is stale: it lost ownership and must stop.
    pub fn is_fenced(&self) -> bool {
        self.fenced > 0
    }
}

/// Why a write did not happen. Part of the batch may have been appended:
/// retrying the same batch is safe, since appended sequences are dropped.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SinkError {
    /// The stream was not opened under this token on this sink, or the
    /// connection was lost since it was (a failover may have lost its tail):
    /// open it again, compare its last sequence with what was confirmed, then
    /// write. Nothing was sent.
    #[error(
        "stream {stream_id} must be opened (again) under token {fence_token} before it is written"
    )]
    NotOpen {
        /// Stream written.
        stream_id: String,
        /// The writer's token.
        fence_token: u64,
    },
    /// The sink could not be reached or timed out.
    #[error("sink unavailable: {0}")]
    Unavailable(String),
    /// The sink refused the request (script error, wrong type at a key).
    #[error("sink rejected the write: {0}")]
    Rejected(String),
    /// The sink URL or options are invalid.
    #[error("invalid sink configuration: {0}")]
    Config(String),
}

/// A downstream that enforces fencing and de-duplication.
#[async_trait]
pub trait FencedSink: Send + Sync + 'static {
    /// Raises the stream's fence to `fence_token` (unless a higher one exists)
    /// and returns the last appended sequence, in one atomic step. A stream
    /// may be opened again under the same token (after a reconnect).
    async fn open(&self, stream_id: &str, fence_token: u64) -> Result<OpenOutcome, SinkError>;

    /// Opens a new epoch of the stream under `fence_token` (raised for it by
    /// the lease) by appending the reset entry `<fence_token>-<reset.to - 1>`,
    /// in one atomic step: below the stream's last sequence, which an open
    /// would keep. Fenced as an open is (a newer token exists: nothing
    /// changed); done already when the last id carries `fence_token` (a
    /// retry after a lost reply). Returns the outcome with `last_seq` the
    /// entry's position.
    async fn open_epoch(
        &self,
        stream_id: &str,
        fence_token: u64,
        reset: ResetMark,
    ) -> Result<OpenOutcome, SinkError>;

    /// Writes one batch: fenced as a whole, de-duplicated by sequence, in
    /// order. Only under a token this sink opened the stream with on the
    /// connection the batch goes out on ([`SinkError::NotOpen`] otherwise). One batch per
    /// stream at a time: a batch sent past one that failed would land above
    /// the hole, and ids only go up.
    async fn write(&self, batch: SinkBatch<'_>) -> Result<WriteOutcome, SinkError>;
}

/// Sizing shared by both sinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkOptions {
    /// Approximate cap on stored events per stream (`XADD MAXLEN ~`); 0 keeps
    /// everything. The newest event always stays, so de-duplication holds.
    pub max_len: u64,
    /// How long a reply may take before the write counts as failed and is
    /// retried (`SINK_TIMEOUT_MS`; the Redis sink only).
    pub reply_timeout: std::time::Duration,
    /// Replicas that must have a batch before it is confirmed
    /// (`SINK_WAIT_REPLICAS`, `WAIT n`; 0: confirmed by the primary alone).
    pub wait_replicas: u32,
    /// How long a batch waits for them (`SINK_WAIT_TIMEOUT_MS`); fewer in
    /// time and the write counts as failed and is sent again.
    pub wait_timeout: std::time::Duration,
}

/// Default [`SinkOptions::reply_timeout`]. Generous on purpose: every stream's
/// batches queue on one Redis, so a busy second delays every reply, and a
/// write given up too early is sent again (harmless, de-duplicated) exactly
/// when Redis has least time for it. The Redis client's own default is 500 ms.
pub const DEFAULT_REPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Default [`SinkOptions::wait_timeout`]: a replica on the same network
/// acknowledges within milliseconds; a second means it is not keeping up.
pub const DEFAULT_WAIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Default [`SinkOptions::max_len`]: bounded, because a sink that keeps every
/// event grows until Redis refuses writes (it must run with `noeviction`).
/// 100,000 events is about 2.8 hours of a 10 events/s stream and, at
/// 300-byte frames, about 40 MB of Redis memory per stream; size it as events
/// per second times the hours readers may fall behind (docs/redis.md).
pub const DEFAULT_MAX_LEN: u64 = 100_000;

impl Default for SinkOptions {
    fn default() -> Self {
        SinkOptions {
            max_len: DEFAULT_MAX_LEN,
            reply_timeout: DEFAULT_REPLY_TIMEOUT,
            wait_replicas: 0,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
        }
    }
}

/// The streams a sink may write, each with the token it was opened under and
/// the connection it was opened on.
///
/// Why the sink keeps this: with the fence in the entry id, a write under a
/// token above the stream's last id is appended whatever its sequence, so a
/// write before the open would store a replay twice; and on a new connection
/// (after a failover) the stream may have lost its tail, which only an open
/// finds. So a write is refused ([`SinkError::NotOpen`]) unless the stream
/// was opened under its token on the very connection the write goes out on.
/// Connections are numbered (a generation per new connection), so this holds
/// however the old one ended: an error the sink saw, or none at all (a client
/// that reconnected by itself, another stream's call that found the loss).
#[derive(Debug, Default)]
pub struct OpenedStreams(std::sync::Mutex<std::collections::HashMap<String, Opened>>);

/// One stream's open: its token and the connection generation it ran on.
#[derive(Debug, Clone, Copy)]
struct Opened {
    fence_token: u64,
    connection: u64,
}

impl OpenedStreams {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Opened>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records an open that was not fenced, made on connection generation
    /// `connection` (an open's late reply from an older connection changes
    /// nothing).
    pub fn opened(&self, stream_id: &str, fence_token: u64, connection: u64) {
        let mut streams = self.lock();
        let now = Opened {
            fence_token,
            connection,
        };
        let entry = streams.entry(stream_id.to_owned()).or_insert(now);
        if connection > entry.connection {
            *entry = now;
        } else if connection == entry.connection {
            entry.fence_token = entry.fence_token.max(fence_token);
        }
    }

    /// `Err(NotOpen)` unless the stream was opened on connection generation
    /// `connection` under `fence_token` or a higher one (a lower token is
    /// sent: the store fences it, and the verdict is counted as any
    /// zombie's).
    pub fn check(
        &self,
        stream_id: &str,
        fence_token: u64,
        connection: u64,
    ) -> Result<(), SinkError> {
        match self.lock().get(stream_id) {
            Some(opened)
                if opened.connection == connection && opened.fence_token >= fence_token =>
            {
                Ok(())
            }
            _ => Err(SinkError::NotOpen {
                stream_id: stream_id.to_owned(),
                fence_token,
            }),
        }
    }
}

/// Refuses a sink Redis that may evict keys (`maxmemory-policy` other than
/// `noeviction`): an evicted stream is data lost for every reader. A
/// single-node URL is checked with `INFO memory`; `memory:` needs nothing;
/// a Redis Cluster is not checked here (each node has its own policy: set
/// `noeviction` in its parameter group, as deploy/README says).
pub async fn require_noeviction(url: &str) -> Result<(), SinkError> {
    let url::SinkUrl::Redis(node) = url::SinkUrl::parse(url).map_err(SinkError::Config)? else {
        return Ok(());
    };
    let client = ::redis::Client::open(node.as_str())
        .map_err(|err| SinkError::Config(format!("invalid SINK_URL ({:?})", err.kind())))?;
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|err| {
            // The setting, where it points and the client's reason (an I/O
            // error's text names no credential).
            let reason = match err.kind() {
                ::redis::ErrorKind::Io => err.to_string(),
                kind => format!("{kind:?}"),
            };
            SinkError::Unavailable(format!(
                "SINK_URL: cannot connect to Redis at {}: {reason}",
                url::redis_address(&node)
            ))
        })?;
    leasehold_platform::redis_memory::require_noeviction(&mut connection, "SINK_URL")
        .await
        .map_err(|err| SinkError::Config(err.to_string()))
}

/// Opens the sink a `SINK_URL` names ([`url::SinkUrl`]).
pub async fn open(url: &str, options: SinkOptions) -> Result<Arc<dyn FencedSink>, SinkError> {
    match url::SinkUrl::parse(url).map_err(SinkError::Config)? {
        url::SinkUrl::Memory => Ok(Arc::new(memory::MemorySink::new(options))),
        url::SinkUrl::Redis(_) | url::SinkUrl::RedisCluster(_) => {
            Ok(Arc::new(redis::RedisSink::connect(url, options).await?))
        }
    }
}
