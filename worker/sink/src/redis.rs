//! Redis Streams sink, layout v2 (docs/redis.md): entry ids `<token>-<seq>`.
//! One small script opens a stream at acquire (raises its last id to the
//! owner's token, reads the last sequence); a batch is one `MULTI`/`EXEC` of
//! explicit-id `XADD`s, no Lua, whose refusals Redis itself decides.

use crate::keys;
use async_trait::async_trait;
use leasehold_control::protocol::{self, EntryId};
use leasehold_platform::redis_functions::StoredFunction;
use leasehold_telemetry::GapReason;
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster_async::ClusterConnection;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{
    FencedSink, OpenOutcome, OpenedStreams, ResetMark, SinkBatch, SinkError, SinkOptions,
    WriteOutcome,
};

/// How long connecting to Redis may take (the client's default is 1 s: tight
/// for a TLS endpoint across zones).
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// KEYS: stream. ARGV: token, the v1 id floor ([`V1_ID_FLOOR`]), and for a
/// new epoch ([`FencedSink::open_epoch`]) the reset entry's position,
/// `reset_from` and `reset_to`. The only Lua (a Redis function): run once per
/// acquire, reconnect and reset, never per batch. Returns {verdict, token,
/// seq} of the stream's last id after the call; verdict 0 = opened, 1 =
/// fenced (a newer token's id), 2 = layout v1 (the id is a unix-ms time: ids
/// written by Redis, not `<token>-<seq>`; nothing is changed). A stream that
/// does not exist is created at `<token>-0` (an entry added and deleted: the
/// id stays), so no zombie can create it under its lower token. A new epoch
/// appends its reset entry instead of raising the last id: the entry sits
/// below the last sequence, above every id of the older tokens
/// ([`protocol::epoch_open`], which the memory sink runs as it is). The sequence
/// stays the text Redis wrote: Lua numbers are doubles, exact only to 2^53,
/// and print 1e14 as `1e+14`, which `XSETID` refuses. Tokens are small
/// integers and the v1 floor 1e12, both exact as doubles.
const OPEN: &str = r#"
local stream, token = KEYS[1], tonumber(ARGV[1])
local function reset()
  redis.call('XADD', stream, ARGV[1] .. '-' .. ARGV[3], 'reset_from', ARGV[4],
    'reset_to', ARGV[5], 'fence_token', ARGV[1], 'reason', 'reset')
  return {0, token, ARGV[3]}
end
if redis.call('EXISTS', stream) == 0 then
  if ARGV[3] then return reset() end
  redis.call('XADD', stream, ARGV[1] .. '-0', 'opened', ARGV[1])
  redis.call('XDEL', stream, ARGV[1] .. '-0')
  return {0, token, 0}
end
local info = redis.call('XINFO', 'STREAM', stream)
local last = '0-0'
for i = 1, #info, 2 do
  if info[i] == 'last-generated-id' then last = info[i + 1] end
end
local t, s = string.match(last, '^(%d+)-(%d+)$')
t = tonumber(t)
if t >= tonumber(ARGV[2]) then return {2, t, s} end
if t > token then return {1, t, s} end
if t < token then
  if ARGV[3] then return reset() end
  redis.call('XSETID', stream, ARGV[1] .. '-' .. s)
end
return {0, token, s}
"#;

/// The functions the sink calls (the open script alone), for `leasehold redis
/// load-functions`: the stream-worker role may call but not load them.
pub fn stored_functions() -> Vec<StoredFunction> {
    vec![StoredFunction::new(OPEN)]
}

/// A first id part at or above this is a unix-ms time (2001-09-09 onwards),
/// not a fence token: the stream was written in layout v1.
const V1_ID_FLOOR: u64 = 1_000_000_000_000;

/// Redis's refusal of an explicit id that is not above the stream's last:
/// in layout v2 a duplicate or a fenced entry, never a failure.
fn is_id_refusal(error: &redis::ServerError) -> bool {
    error
        .details()
        .is_some_and(|details| details.contains("equal or smaller than the target stream top item"))
}

/// Connections a sink that waits for replicas spreads its streams over:
/// `WAIT` blocks the connection it is sent on (Redis answers one client's
/// commands in order), so on one shared connection a replica falling behind
/// would hold every stream's writes for up to `SINK_WAIT_TIMEOUT_MS`; spread,
/// it holds the streams of one connection in eight.
pub const WAIT_CONNECTIONS: usize = 8;

/// The Redis Streams sink. Cheap to clone; reconnects by itself.
#[derive(Clone)]
pub struct RedisSink {
    /// The lanes each stream's open and writes go on: one, or
    /// [`WAIT_CONNECTIONS`] with `SINK_WAIT_REPLICAS`.
    lanes: std::sync::Arc<[Lane]>,
    open: StoredFunction,
    options: SinkOptions,
    /// Shared by clones: one set of lanes, one set of opened streams.
    opened: std::sync::Arc<OpenedStreams>,
}

/// Where a stream's open and writes go, and which connection that is. Every
/// connection a lane makes gets the next generation, and a write goes out
/// only on the generation its stream was opened on ([`OpenedStreams`]):
/// whatever ended the old connection, the stream is opened again (and its
/// tail compared) before anything is written on the new one.
enum Lane {
    /// One node: a plain multiplexed connection, which never reconnects by
    /// itself (a `ConnectionManager` does, silently over RESP3); the lane
    /// makes the next one after a loss.
    Node(Box<NodeLane>),
    /// A cluster: its client routes and reconnects each node by itself, so
    /// each loss the sink sees starts a new generation. A node reconnect
    /// that no call of this sink saw fail is not seen (docs/redis.md).
    Cluster {
        connection: ClusterConnection,
        generation: AtomicU64,
    },
}

/// One node's lane: its current connection and generation, made again by the
/// lane after a loss.
struct NodeLane {
    client: redis::Client,
    config: redis::AsyncConnectionConfig,
    current: std::sync::Mutex<Option<(MultiplexedConnection, u64)>>,
    /// One connect at a time: callers that found no connection wait for the
    /// same one.
    connecting: tokio::sync::Mutex<()>,
    /// Connections made (the last one's generation).
    made: AtomicU64,
    /// Connects that failed.
    failures: AtomicU64,
}

impl NodeLane {
    fn new(client: redis::Client, config: redis::AsyncConnectionConfig) -> Self {
        NodeLane {
            client,
            config,
            current: std::sync::Mutex::default(),
            connecting: tokio::sync::Mutex::default(),
            made: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    fn held(&self) -> Option<(MultiplexedConnection, u64)> {
        self.current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// The connection and its generation, connecting if there is none.
    /// Callers that waited while another's connect failed share its failure
    /// instead of each trying again in turn: against an unreachable Redis,
    /// a hundred streams would otherwise wait a hundred connect timeouts.
    async fn take(&self) -> Result<(MultiplexedConnection, u64), redis::RedisError> {
        if let Some(held) = self.held() {
            return Ok(held);
        }
        let failures = self.failures.load(Ordering::SeqCst);
        let _connecting = self.connecting.lock().await;
        if let Some(held) = self.held() {
            return Ok(held);
        }
        if self.failures.load(Ordering::SeqCst) != failures {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "connecting to the sink failed just now",
            )));
        }
        let connection = match self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
        {
            Ok(connection) => connection,
            Err(err) => {
                self.failures.fetch_add(1, Ordering::SeqCst);
                return Err(err);
            }
        };
        let generation = self.made.fetch_add(1, Ordering::SeqCst) + 1;
        *self
            .current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) =
            Some((connection.clone(), generation));
        Ok((connection, generation))
    }

    fn lost(&self, lost: u64) {
        let mut current = self
            .current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if matches!(&*current, Some((_, generation)) if *generation == lost) {
            *current = None;
        }
    }
}

impl Lane {
    /// A lane to what a Redis sink URL names, connected now (so a wrong
    /// address fails at start).
    async fn connect(url: &str, reply_timeout: std::time::Duration) -> Result<Self, SinkError> {
        match crate::url::SinkUrl::parse(url).map_err(SinkError::Config)? {
            crate::url::SinkUrl::Redis(node) => Lane::node(&node, reply_timeout).await,
            _ => match RedisConnection::connect(url, reply_timeout, 0).await? {
                RedisConnection::Cluster(connection) => Ok(Lane::Cluster {
                    connection,
                    generation: AtomicU64::new(0),
                }),
                _ => Err(SinkError::Config("not a Redis Cluster URL".into())),
            },
        }
    }

    async fn node(url: &str, reply_timeout: std::time::Duration) -> Result<Self, SinkError> {
        let client = redis::Client::open(url)
            .map_err(|err| SinkError::Config(format!("invalid Redis URL ({:?})", err.kind())))?;
        let lane = Lane::Node(Box::new(NodeLane::new(
            client,
            redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(reply_timeout))
                .set_connection_timeout(Some(CONNECT_TIMEOUT)),
        )));
        lane.take().await.map_err(classify)?;
        Ok(lane)
    }

    /// The lane's connection and its generation, connecting if it has none.
    async fn take(&self) -> Result<(RedisConnection, u64), redis::RedisError> {
        match self {
            Lane::Node(node) => {
                let (connection, generation) = node.take().await?;
                Ok((RedisConnection::Node(connection), generation))
            }
            Lane::Cluster {
                connection,
                generation,
            } => Ok((
                RedisConnection::Cluster(connection.clone()),
                generation.load(Ordering::SeqCst),
            )),
        }
    }

    /// Generation `generation` was lost: the next call starts the next one
    /// (a loss already replaced changes nothing).
    fn lost(&self, lost: u64) {
        match self {
            Lane::Node(node) => node.lost(lost),
            Lane::Cluster { generation, .. } => {
                let _ =
                    generation.compare_exchange(lost, lost + 1, Ordering::SeqCst, Ordering::SeqCst);
            }
        }
    }
}

/// A single Redis primary or a Redis Cluster: every sink command names one
/// key, so both run the same code. Cheap to clone (one connection shared).
#[derive(Clone)]
pub enum RedisConnection {
    /// `redis://…`, `rediss://…`, `redis+unix://…`: reconnects by itself.
    Single(ConnectionManager),
    /// `redis+cluster://…`: routes each command to its key's primary.
    Cluster(ClusterConnection),
    /// One connection of a sink's lane: never reconnects by itself.
    Node(MultiplexedConnection),
}

impl RedisConnection {
    /// Connects to what a Redis sink URL names; `retries` is how often a
    /// cluster connection follows a redirect or retries a broken node by
    /// itself (the sink passes 0: see [`RedisSink::connect`]).
    pub async fn connect(
        url: &str,
        reply_timeout: std::time::Duration,
        retries: u32,
    ) -> Result<Self, SinkError> {
        // The URL may hold a password: report only the kind of problem.
        let invalid = |err: redis::RedisError| {
            SinkError::Config(format!("invalid Redis URL ({:?})", err.kind()))
        };
        match crate::url::SinkUrl::parse(url).map_err(SinkError::Config)? {
            crate::url::SinkUrl::Memory => {
                Err(SinkError::Config("memory: is not a Redis URL".into()))
            }
            crate::url::SinkUrl::Redis(url) => {
                let client = redis::Client::open(url).map_err(invalid)?;
                Ok(RedisConnection::Single(
                    ConnectionManager::new_with_config(
                        client,
                        ConnectionManagerConfig::new()
                            .set_response_timeout(Some(reply_timeout))
                            .set_connection_timeout(Some(CONNECT_TIMEOUT)),
                    )
                    .await
                    .map_err(classify)?,
                ))
            }
            crate::url::SinkUrl::RedisCluster(nodes) => {
                let client = redis::cluster::ClusterClient::builder(nodes)
                    .retries(retries)
                    .connection_timeout(CONNECT_TIMEOUT)
                    .response_timeout(reply_timeout)
                    .build()
                    .map_err(invalid)?;
                Ok(RedisConnection::Cluster(
                    client.get_async_connection().await.map_err(classify)?,
                ))
            }
        }
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            RedisConnection::Single(connection) => connection.req_packed_command(cmd),
            RedisConnection::Cluster(connection) => connection.req_packed_command(cmd),
            RedisConnection::Node(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            RedisConnection::Single(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
            RedisConnection::Cluster(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
            RedisConnection::Node(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Single(connection) => connection.get_db(),
            RedisConnection::Cluster(connection) => connection.get_db(),
            RedisConnection::Node(connection) => connection.get_db(),
        }
    }
}

impl std::fmt::Debug for RedisSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSink")
            .field("options", &self.options)
            .finish()
    }
}

/// Redis errors, without the URL (which may hold a password).
fn classify(err: redis::RedisError) -> SinkError {
    if err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
    {
        SinkError::Unavailable(err.to_string())
    } else {
        SinkError::Rejected(err.to_string())
    }
}

impl RedisSink {
    /// Which of the sink's lanes a stream's open and writes use (0 unless it
    /// waits for replicas): the same one each time, so `WAIT` counts the
    /// stream's own writes.
    #[doc(hidden)]
    pub fn connection_of(&self, stream_id: &str) -> usize {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::hash::DefaultHasher::new();
        stream_id.hash(&mut hasher);
        (hasher.finish() % self.lanes.len() as u64) as usize
    }

    fn lane(&self, stream_id: &str) -> &Lane {
        &self.lanes[self.connection_of(stream_id)]
    }

    /// Reads back a stream's stored events (tests, verification tools), in
    /// pages so a long stream never makes one slow reply.
    pub async fn stored(
        &self,
        stream_id: &str,
    ) -> Result<Vec<super::memory::StoredEvent>, SinkError> {
        // Small pages: a verifier reading a busy stream must not wait on one huge reply.
        const PAGE: usize = 500;
        let mut events = Vec::new();
        let mut start = "-".to_owned();
        loop {
            let reply: redis::streams::StreamRangeReply = self
                .read(
                    redis::cmd("XRANGE")
                        .arg(keys::sink_stream(stream_id))
                        .arg(&start)
                        .arg("+")
                        .arg("COUNT")
                        .arg(PAGE),
                )
                .await?;
            let full = reply.ids.len() == PAGE;
            if let Some(last) = reply.ids.last() {
                // Exclusive start after the last id read (Redis 6.2+).
                start = format!("({}", last.id);
            }
            for entry in reply.ids {
                events.push(stored_event(&entry)?);
            }
            if !full {
                return Ok(events);
            }
        }
    }

    /// Connects to the Redis a sink URL names: `redis://…` (and `rediss://`,
    /// `redis+unix://`), or `redis+cluster://…` (`rediss+cluster://`)
    /// through a cluster connection. Every call goes on a lane ([`Lane`]).
    ///
    /// A cluster connection gets no retries of its own: a redirect or a
    /// broken node connection must reach the sink, which then opens every
    /// stream again (a failover shows as exactly these), and the runner's
    /// own retry sends the batch again.
    pub async fn connect(url: &str, options: SinkOptions) -> Result<Self, SinkError> {
        let count = if options.wait_replicas > 0 {
            WAIT_CONNECTIONS
        } else {
            1
        };
        let mut lanes = Vec::with_capacity(count);
        for _ in 0..count {
            lanes.push(Lane::connect(url, options.reply_timeout).await?);
        }
        Ok(RedisSink {
            lanes: lanes.into(),
            open: StoredFunction::new(OPEN),
            options,
            opened: std::sync::Arc::default(),
        })
    }

    /// The `seq` of a stream's newest entry (`None`: nothing stored), read
    /// with one `XREVRANGE … + - COUNT 1` and nothing else: the read the
    /// dashboard's stream page makes, which its Redis user may do read-only.
    pub async fn last_seq(&self, stream_id: &str) -> Result<Option<u64>, SinkError> {
        let reply: redis::streams::StreamRangeReply = self
            .read(
                redis::cmd("XREVRANGE")
                    .arg(keys::sink_stream(stream_id))
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(1),
            )
            .await?;
        match reply.ids.first() {
            Some(entry) => Ok(Some(stored_event(entry)?.seq)),
            None => Ok(None),
        }
    }
}

fn gap_reason(reason: &str, id: &str) -> Result<GapReason, SinkError> {
    GapReason::parse(reason)
        .ok_or_else(|| SinkError::Rejected(format!("entry {id} names an unknown gap reason")))
}

/// One stream entry as a [`super::memory::StoredEvent`]: an event (`seq`,
/// `event_id`, `fence_token`, `payload`), a gap marker (`gap_from`, `gap_to`,
/// `fence_token`, `reason`), a reset entry, or a snapshot (`snapshot`, `seq`,
/// `fence_token`, and the missed range's fields when diffs were missed).
fn stored_event(entry: &redis::streams::StreamId) -> Result<super::memory::StoredEvent, SinkError> {
    let field = |name: &str| -> Result<String, SinkError> {
        entry
            .get::<String>(name)
            .ok_or_else(|| SinkError::Rejected(format!("entry {} has no field {name}", entry.id)))
    };
    let number = |name: &str| -> Result<u64, SinkError> {
        field(name)?.parse().map_err(|_| {
            SinkError::Rejected(format!("entry {} field {name} is not a number", entry.id))
        })
    };
    if entry.map.contains_key("reset_to") {
        return Ok(super::memory::StoredEvent {
            seq: parse_id(&entry.id).map_or(0, |id| id.seq),
            event_id: String::new(),
            fence_token: number("fence_token")?,
            payload: String::new(),
            gap: None,
            reset: Some(super::ResetMark {
                from: number("reset_from")?,
                to: number("reset_to")?,
            }),
            snapshot: false,
        });
    }
    if entry.map.contains_key("snapshot") {
        let gap = match entry.map.contains_key("gap_from") {
            true => Some(super::GapMark {
                from: number("gap_from")?,
                reason: gap_reason(&field("reason")?, &entry.id)?,
            }),
            false => None,
        };
        return Ok(super::memory::StoredEvent {
            seq: number("seq")?,
            event_id: String::new(),
            fence_token: number("fence_token")?,
            payload: field("snapshot")?,
            gap,
            reset: None,
            snapshot: true,
        });
    }
    if entry.map.contains_key("gap_to") {
        let reason = gap_reason(&field("reason")?, &entry.id)?;
        return Ok(super::memory::StoredEvent {
            seq: number("gap_to")?,
            event_id: String::new(),
            fence_token: number("fence_token")?,
            payload: String::new(),
            gap: Some(super::GapMark {
                from: number("gap_from")?,
                reason,
            }),
            reset: None,
            snapshot: false,
        });
    }
    Ok(super::memory::StoredEvent {
        seq: number("seq")?,
        event_id: field("event_id")?,
        fence_token: number("fence_token")?,
        payload: field("payload")?,
        gap: None,
        reset: None,
        snapshot: false,
    })
}

impl RedisSink {
    /// A failed stream call may mean a lost connection, and a lost
    /// connection may mean a failover to a replica without the newest
    /// entries: the lane's generation ends, so every stream on it is opened
    /// again before its next write. `READONLY` (a demoted primary) and
    /// `MOVED` count as lost connections too (a new connection reaches the
    /// new primary behind the same name).
    fn failed(&self, lane: &Lane, generation: u64, err: redis::RedisError) -> SinkError {
        use redis::ServerErrorKind::{Ask, ClusterDown, ExecAbort, Moved, ReadOnly, TryAgain};
        let lost = err.is_io_error()
            || err.is_timeout()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || matches!(err.kind(), redis::ErrorKind::Server(ReadOnly | Moved | Ask));
        if lost {
            lane.lost(generation);
            return SinkError::Unavailable(err.to_string());
        }
        // A slot in migration, a cluster without quorum, a transaction
        // refused whole (OOM, a busy script): nothing was appended, and the
        // same batch may land a moment later.
        if matches!(
            err.kind(),
            redis::ErrorKind::Server(TryAgain | ClusterDown | ExecAbort)
        ) {
            return SinkError::Unavailable(err.to_string());
        }
        classify(err)
    }

    /// One read on the first lane, sent once more on a new connection when
    /// the first was lost: a read lands nothing, and its loss ends the
    /// lane's generation like any other.
    async fn read<T: redis::FromRedisValue>(&self, command: &redis::Cmd) -> Result<T, SinkError> {
        let lane = &self.lanes[0];
        let mut again = true;
        loop {
            let (mut connection, generation) = lane.take().await.map_err(classify)?;
            match command.query_async(&mut connection).await {
                Ok(reply) => return Ok(reply),
                Err(err) => match self.failed(lane, generation, err) {
                    SinkError::Unavailable(_) if std::mem::take(&mut again) => {}
                    error => return Err(error),
                },
            }
        }
    }

    /// The stream's last generated id (layout v2: the fence and the
    /// high-water mark), `None` when the stream does not exist. Read after a
    /// batch was refused whole, and by tests and verification tools.
    pub async fn last_id(&self, stream_id: &str) -> Result<Option<EntryId>, SinkError> {
        let info: redis::Value = self
            .read(
                redis::cmd("XINFO")
                    .arg("STREAM")
                    .arg(keys::sink_stream(stream_id)),
            )
            .await?;
        let last = match info {
            redis::Value::Map(pairs) => pairs
                .into_iter()
                .find(|(key, _)| is_text(key, "last-generated-id"))
                .map(|(_, value)| value),
            redis::Value::Array(items) => items
                .chunks(2)
                .find(|pair| is_text(&pair[0], "last-generated-id"))
                .and_then(|pair| pair.get(1).cloned()),
            _ => None,
        };
        let text: Option<String> = last
            .map(redis::from_redis_value)
            .transpose()
            .map_err(|err| SinkError::Rejected(err.to_string()))?;
        Ok(text.as_deref().and_then(parse_id))
    }
}

fn is_text(value: &redis::Value, text: &str) -> bool {
    match value {
        redis::Value::BulkString(bytes) => bytes == text.as_bytes(),
        redis::Value::SimpleString(value) => value == text,
        _ => false,
    }
}

/// `<token>-<seq>` as an [`EntryId`].
fn parse_id(id: &str) -> Option<EntryId> {
    let (token, seq) = id.split_once('-')?;
    Some(EntryId {
        token: token.parse().ok()?,
        seq: seq.parse().ok()?,
    })
}

/// One entry's `XADD` (`id` is scratch for its id), its buffers sized once:
/// grown argument by argument they were reallocated several times per
/// event, a fifth of the consumer's CPU in the throughput bench's profile.
fn xadd(
    key: &str,
    token: &str,
    max_len: u64,
    event: &super::SinkEvent,
    id: &mut String,
) -> redis::Cmd {
    use std::fmt::Write as _;
    id.clear();
    let _ = write!(id, "{token}-{}", event.seq);
    let (mut seq, mut from, mut limit) = (
        itoa::Buffer::new(),
        itoa::Buffer::new(),
        itoa::Buffer::new(),
    );
    let seq = seq.format(event.seq).as_bytes();
    let mut fields: [&[u8]; 12] = [b""; 12];
    let used = match (&event.gap, event.snapshot) {
        (None, false) => {
            fields[..8].copy_from_slice(&[
                b"seq",
                seq,
                b"event_id",
                event.event_id.as_bytes(),
                b"fence_token",
                token.as_bytes(),
                b"payload",
                event.payload.as_bytes(),
            ]);
            8
        }
        (Some(gap), false) => {
            fields[..8].copy_from_slice(&[
                b"gap_from",
                from.format(gap.from).as_bytes(),
                b"gap_to",
                seq,
                b"fence_token",
                token.as_bytes(),
                b"reason",
                gap.reason.as_str().as_bytes(),
            ]);
            8
        }
        (gap, true) => {
            fields[..6].copy_from_slice(&[
                b"snapshot",
                event.payload.as_bytes(),
                b"seq",
                seq,
                b"fence_token",
                token.as_bytes(),
            ]);
            match gap {
                Some(gap) => {
                    fields[6..].copy_from_slice(&[
                        b"gap_from",
                        from.format(gap.from).as_bytes(),
                        b"gap_to",
                        seq,
                        b"reason",
                        gap.reason.as_str().as_bytes(),
                    ]);
                    12
                }
                None => 6,
            }
        }
    };
    let fields = &fields[..used];
    let trim: [&[u8]; 3] = [b"MAXLEN", b"~", limit.format(max_len).as_bytes()];
    let trim = if max_len > 0 { &trim[..] } else { &[] };
    let head: [&[u8]; 2] = [b"XADD", key.as_bytes()];
    let id: [&[u8]; 1] = [id.as_bytes()];
    let args = || head.iter().chain(trim).chain(&id).chain(fields);
    let mut command = redis::Cmd::with_capacity(args().count(), args().map(|arg| arg.len()).sum());
    for arg in args() {
        command.arg(*arg);
    }
    command
}

impl RedisSink {
    /// The open script, plain or for a new epoch (`reset`).
    async fn run_open(
        &self,
        stream_id: &str,
        fence_token: u64,
        reset: Option<ResetMark>,
    ) -> Result<OpenOutcome, SinkError> {
        let lane = self.lane(stream_id);
        let (mut connection, generation) = lane.take().await.map_err(classify)?;
        let mut call = self.open.key(keys::sink_stream(stream_id));
        call.arg(fence_token).arg(V1_ID_FLOOR);
        if let Some(reset) = reset {
            call.arg(reset.position()).arg(reset.from).arg(reset.to);
        }
        let (verdict, token, seq): (u8, u64, u64) = call
            .invoke_async(&mut connection)
            .await
            .map_err(|err| self.failed(lane, generation, err))?;
        let last = Some(EntryId { token, seq });
        match verdict {
            0 => {
                self.opened.opened(stream_id, fence_token, generation);
                Ok(OpenOutcome {
                    highest_token: token,
                    // A new epoch's position may be 0 (a sequence restarted
                    // at 1): still its last sequence, not an empty stream.
                    last_seq: if reset.is_some() {
                        Some(seq)
                    } else {
                        protocol::last_seq_of(last)
                    },
                    fenced: false,
                })
            }
            1 => Ok(OpenOutcome {
                highest_token: token,
                last_seq: protocol::last_seq_of(last),
                fenced: true,
            }),
            _ => Err(SinkError::Rejected(format!(
                "{key} was written in sink layout v1 (time-based entry ids, last id {token}-{seq}): \
                 stop every worker of the old version, then RENAME {key} to keep its events \
                 (or DEL it) and DEL {fence}; the next owner resumes from the checkpoint",
                key = keys::sink_stream(stream_id),
                fence = keys::sink_fence(stream_id),
            ))),
        }
    }
}

#[async_trait]
impl FencedSink for RedisSink {
    async fn open(&self, stream_id: &str, fence_token: u64) -> Result<OpenOutcome, SinkError> {
        self.run_open(stream_id, fence_token, None).await
    }

    async fn open_epoch(
        &self,
        stream_id: &str,
        fence_token: u64,
        reset: ResetMark,
    ) -> Result<OpenOutcome, SinkError> {
        self.run_open(stream_id, fence_token, Some(reset)).await
    }

    async fn write(&self, batch: SinkBatch<'_>) -> Result<WriteOutcome, SinkError> {
        batch.check_order()?;
        // The connection and its generation taken together, then checked:
        // the batch goes out on exactly the connection the stream was opened
        // on, or not at all.
        let lane = self.lane(batch.stream_id);
        let (mut connection, generation) = lane.take().await.map_err(classify)?;
        self.opened
            .check(batch.stream_id, batch.fence_token, generation)?;
        if batch.events.is_empty() {
            return Ok(WriteOutcome {
                highest_token: batch.fence_token,
                ..WriteOutcome::default()
            });
        }
        let key = keys::sink_stream(batch.stream_id);
        let token = batch.fence_token.to_string();
        // MULTI, the XADDs, EXEC (and WAIT) written out rather than as an
        // atomic pipeline, so WAIT rides in the same round trip to the same
        // node (a cluster routes the pipeline by its first key).
        let mut pipe = redis::Pipeline::with_capacity(batch.events.len() + 3);
        pipe.ignore_errors().cmd("MULTI");
        let mut id = String::new();
        for event in batch.events {
            pipe.add_command(xadd(&key, &token, self.options.max_len, event, &mut id));
        }
        pipe.cmd("EXEC");
        let waits = self.options.wait_replicas > 0;
        if waits {
            pipe.cmd("WAIT")
                .arg(self.options.wait_replicas)
                .arg(self.options.wait_timeout.as_millis() as u64);
        }
        let mut replies: Vec<redis::Value> = pipe
            .query_async(&mut connection)
            .await
            .map_err(|err| self.failed(lane, generation, err))?;
        let acknowledged = if waits { replies.pop() } else { None };
        let exec = replies.pop();
        // A command refused while queued (a wrong number of arguments, OOM)
        // makes EXEC refuse the whole transaction: nothing was appended.
        let replies = match exec {
            Some(redis::Value::Array(replies)) => replies,
            Some(redis::Value::ServerError(error)) => {
                return Err(self.failed(lane, generation, redis::RedisError::from(error)));
            }
            other => {
                return Err(SinkError::Rejected(format!(
                    "unexpected reply to EXEC: {other:?}"
                )));
            }
        };
        let mut outcome = WriteOutcome {
            highest_token: batch.fence_token,
            ..WriteOutcome::default()
        };
        for reply in &replies {
            match reply {
                redis::Value::ServerError(error) if is_id_refusal(error) => outcome.duplicate += 1,
                redis::Value::ServerError(error) => {
                    // Another refusal (a wrong key type): nothing else of the
                    // batch can have been appended, as every XADD meets it.
                    return Err(SinkError::Rejected(error.to_string()));
                }
                _ => outcome.accepted += 1,
            }
        }
        if let Some(acknowledged) = acknowledged {
            let replicas: i64 = redis::from_redis_value(acknowledged)
                .map_err(|err| SinkError::Rejected(err.to_string()))?;
            if replicas < i64::from(self.options.wait_replicas) {
                // Appended on the primary, not yet where a failover keeps
                // it: not confirmed. Sent again, it is de-duplicated and
                // waited for again.
                return Err(SinkError::Unavailable(format!(
                    "{replicas} of {} replicas acknowledged the batch within {} ms",
                    self.options.wait_replicas,
                    self.options.wait_timeout.as_millis()
                )));
            }
        }
        if outcome.accepted == 0 {
            // Refused whole: a newer owner's id, or all of it a replay.
            if let Some(last) = self.last_id(batch.stream_id).await? {
                outcome.highest_token = last.token;
                if protocol::refused_as_fenced(last, batch.fence_token) {
                    outcome.fenced = std::mem::take(&mut outcome.duplicate);
                }
            }
        }
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SinkEvent;

    /// The `XADD` as the redis crate's builder makes it, argument by argument.
    fn built_by_arguments(key: &str, token: &str, max_len: u64, event: &SinkEvent) -> redis::Cmd {
        let mut command = redis::cmd("XADD");
        command.arg(key);
        if max_len > 0 {
            command.arg("MAXLEN").arg("~").arg(max_len);
        }
        command.arg(format!("{token}-{}", event.seq));
        if event.snapshot {
            command
                .arg("snapshot")
                .arg(event.payload.as_bytes())
                .arg("seq")
                .arg(event.seq)
                .arg("fence_token")
                .arg(token);
            if let Some(gap) = event.gap {
                command
                    .arg("gap_from")
                    .arg(gap.from)
                    .arg("gap_to")
                    .arg(event.seq)
                    .arg("reason")
                    .arg(gap.reason.as_str());
            }
            return command;
        }
        match event.gap {
            None => command
                .arg("seq")
                .arg(event.seq)
                .arg("event_id")
                .arg(&event.event_id)
                .arg("fence_token")
                .arg(token)
                .arg("payload")
                .arg(event.payload.as_bytes()),
            Some(gap) => command
                .arg("gap_from")
                .arg(gap.from)
                .arg("gap_to")
                .arg(event.seq)
                .arg("fence_token")
                .arg(token)
                .arg("reason")
                .arg(gap.reason.as_str()),
        };
        command
    }

    /// Against a Redis that takes connections and never answers (a network
    /// partition), callers queued behind a connect that timed out share its
    /// failure: one connect for all of them, not one connect timeout each.
    #[tokio::test]
    async fn callers_waiting_on_a_failed_connect_share_its_failure() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = std::sync::Arc::new(AtomicU64::new(0));
        std::thread::spawn({
            let accepted = accepted.clone();
            move || {
                let mut silent = Vec::new();
                for socket in listener.incoming() {
                    accepted.fetch_add(1, Ordering::SeqCst);
                    silent.push(socket);
                }
            }
        });
        let wait = std::time::Duration::from_millis(300);
        let lane = NodeLane::new(
            redis::Client::open(format!("redis://{addr}")).expect("URL"),
            redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(wait))
                .set_response_timeout(Some(wait)),
        );
        let (a, b, c, d) = tokio::join!(lane.take(), lane.take(), lane.take(), lane.take());
        assert!(a.is_err() && b.is_err() && c.is_err() && d.is_err());
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one connect for the four callers"
        );
        // The next caller, after the failure, tries again.
        assert!(lane.take().await.is_err());
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn an_entrys_presized_xadd_is_the_same_command() {
        let events = [
            SinkEvent::data(42, "trade-42", r#"{"seq":42,"price":"1.5"}"#),
            SinkEvent::data(u64::MAX, "", ""),
            SinkEvent::gap(7, 1_000, GapReason::Retention),
            SinkEvent::snapshot(40, r#"{"lastUpdateId":40}"#, None),
            SinkEvent::snapshot(
                40,
                r#"{"lastUpdateId":40}"#,
                Some(crate::GapMark {
                    from: 13,
                    reason: GapReason::NoReplay,
                }),
            ),
        ];
        let mut id = String::from("left over from the previous entry");
        for max_len in [0, 9, 100_000] {
            for event in &events {
                let presized = xadd("leasehold:sink:s-1", "17", max_len, event, &mut id);
                assert_eq!(
                    presized.get_packed_command(),
                    built_by_arguments("leasehold:sink:s-1", "17", max_len, event)
                        .get_packed_command(),
                    "{event:?} with MAXLEN {max_len}"
                );
            }
        }
    }
}
