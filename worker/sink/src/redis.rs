//! Redis Streams sink: one Lua script opens a stream (raises the fence, reads
//! the last sequence), one per batch checks the fence, drops replayed sequences
//! and appends (docs/redis.md fixes the layout).

use crate::keys;
use async_trait::async_trait;
use leasehold_telemetry::GapReason;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::{FencedSink, OpenOutcome, SinkBatch, SinkError, SinkOptions, WriteOutcome};

/// How long connecting to Redis may take (the client's default is 1 s: tight
/// for a TLS endpoint across zones).
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The position of a stream's last entry (an event's `seq`, a gap marker's
/// `gap_to`), or -1. Shared by both scripts.
const LAST_SEQ: &str = r#"
local function last_seq(stream)
  local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
  if not last then return -1 end
  local fields = last[2]
  for i = 1, #fields, 2 do
    if fields[i] == 'seq' or fields[i] == 'gap_to' then return tonumber(fields[i + 1]) end
  end
  return -1
end
"#;

/// KEYS: fence, stream. ARGV: token. Raises the fence unless a higher token
/// exists. Returns {fenced (0/1), highest, last seq or -1}.
const OPEN: &str = r#"
local token = tonumber(ARGV[1])
local highest = tonumber(redis.call('GET', KEYS[1]) or '0')
if token < highest then
  return {1, highest, last_seq(KEYS[2])}
end
if token > highest then
  redis.call('SET', KEYS[1], ARGV[1])
end
return {0, token, last_seq(KEYS[2])}
"#;

/// KEYS: fence, stream. ARGV: token, max len, after ('' or the sequence the
/// stream must have reached: a pipelined batch's predecessor), then (seq,
/// event_id, payload) per event; a gap marker is (gap_to, '', '<gap_from>
/// <reason>') – an event's id is never empty. Returns {accepted, duplicate,
/// fenced, highest, out_of_order}. The last sequence is
/// read from the stream before anything is written, and nothing but the append
/// records an event: a script that fails part-way leaves only what it appended.
/// Tokens and sequences stay below 2^53, so Lua's doubles hold them exactly.
const WRITE_BATCH: &str = r#"
local token = tonumber(ARGV[1])
local highest = tonumber(redis.call('GET', KEYS[1]) or '0')
local events = (#ARGV - 3) / 3
if token < highest then
  return {0, 0, events, highest, 0}
end
local last = last_seq(KEYS[2])
if ARGV[3] ~= '' and last < tonumber(ARGV[3]) then
  return {0, 0, 0, highest, events}
end
if token > highest then
  redis.call('SET', KEYS[1], ARGV[1])
end
-- Events come in sequence order: only a takeover's replay at the head can be
-- a duplicate, so the loop that appends compares nothing (per-event Lua work
-- is most of the script's cost).
local first = 4
while first <= #ARGV and tonumber(ARGV[first]) <= last do
  first = first + 3
end
local duplicate = (first - 4) / 3
local stream, fence = KEYS[2], ARGV[1]
local max_len = tonumber(ARGV[2])
-- Markers are rare: one function for both trims.
local function add_marker(i)
  local from, reason = string.match(ARGV[i + 2], '^(%d+) (.+)$')
  if max_len > 0 then
    redis.call('XADD', stream, 'MAXLEN', '~', max_len, '*',
      'gap_from', from, 'gap_to', ARGV[i], 'fence_token', fence, 'reason', reason)
  else
    redis.call('XADD', stream, '*',
      'gap_from', from, 'gap_to', ARGV[i], 'fence_token', fence, 'reason', reason)
  end
end
if max_len > 0 then
  for i = first, #ARGV, 3 do
    if ARGV[i + 1] == '' then add_marker(i) else
    redis.call('XADD', stream, 'MAXLEN', '~', max_len, '*',
      'seq', ARGV[i], 'event_id', ARGV[i + 1], 'fence_token', fence, 'payload', ARGV[i + 2])
    end
  end
else
  for i = first, #ARGV, 3 do
    if ARGV[i + 1] == '' then add_marker(i) else
    redis.call('XADD', stream, '*',
      'seq', ARGV[i], 'event_id', ARGV[i + 1], 'fence_token', fence, 'payload', ARGV[i + 2])
    end
  end
end
return {events - duplicate, duplicate, 0, token, 0}
"#;

/// The Redis Streams sink. Cheap to clone; reconnects by itself.
#[derive(Clone)]
pub struct RedisSink {
    connection: ConnectionManager,
    open: redis::Script,
    write: redis::Script,
    options: SinkOptions,
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
    /// Reads back a stream's stored events (tests, verification tools), in
    /// pages so a long stream never makes one slow reply.
    pub async fn stored(
        &self,
        stream_id: &str,
    ) -> Result<Vec<super::memory::StoredEvent>, SinkError> {
        // Small pages: a verifier reading a busy stream must not wait on one huge reply.
        const PAGE: usize = 500;
        let mut connection = self.connection.clone();
        let mut events = Vec::new();
        let mut start = "-".to_owned();
        loop {
            let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
                .arg(keys::sink_stream(stream_id))
                .arg(&start)
                .arg("+")
                .arg("COUNT")
                .arg(PAGE)
                .query_async(&mut connection)
                .await
                .map_err(classify)?;
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

    /// Connects (the connection manager reconnects after failures).
    pub async fn connect(url: &str, options: SinkOptions) -> Result<Self, SinkError> {
        // The URL may hold a password: report only the kind of problem.
        let client = redis::Client::open(url)
            .map_err(|err| SinkError::Config(format!("invalid Redis URL ({:?})", err.kind())))?;
        let connection = ConnectionManager::new_with_config(
            client,
            ConnectionManagerConfig::new()
                .set_response_timeout(Some(options.reply_timeout))
                .set_connection_timeout(Some(CONNECT_TIMEOUT)),
        )
        .await
        .map_err(classify)?;
        Ok(RedisSink {
            connection,
            open: redis::Script::new(&format!("{LAST_SEQ}{OPEN}")),
            write: redis::Script::new(&format!("{LAST_SEQ}{WRITE_BATCH}")),
            options,
        })
    }

    /// The `seq` of a stream's newest entry (`None`: nothing stored), read
    /// with one `XREVRANGE … + - COUNT 1` and nothing else: the read the
    /// dashboard's stream page makes, which its Redis user may do read-only.
    pub async fn last_seq(&self, stream_id: &str) -> Result<Option<u64>, SinkError> {
        let mut connection = self.connection.clone();
        let reply: redis::streams::StreamRangeReply = redis::cmd("XREVRANGE")
            .arg(keys::sink_stream(stream_id))
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut connection)
            .await
            .map_err(classify)?;
        match reply.ids.first() {
            Some(entry) => Ok(Some(stored_event(entry)?.seq)),
            None => Ok(None),
        }
    }
}

/// One stream entry as a [`super::memory::StoredEvent`]: an event (`seq`,
/// `event_id`, `fence_token`, `payload`) or a gap marker (`gap_from`,
/// `gap_to`, `fence_token`, `reason`).
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
    if entry.map.contains_key("gap_to") {
        let reason = field("reason")?;
        let reason = GapReason::parse(&reason).ok_or_else(|| {
            SinkError::Rejected(format!("entry {} names an unknown gap reason", entry.id))
        })?;
        return Ok(super::memory::StoredEvent {
            seq: number("gap_to")?,
            event_id: String::new(),
            fence_token: number("fence_token")?,
            payload: String::new(),
            gap: Some(super::GapMark {
                from: number("gap_from")?,
                reason,
            }),
        });
    }
    Ok(super::memory::StoredEvent {
        seq: number("seq")?,
        event_id: field("event_id")?,
        fence_token: number("fence_token")?,
        payload: field("payload")?,
        gap: None,
    })
}

#[async_trait]
impl FencedSink for RedisSink {
    async fn open(&self, stream_id: &str, fence_token: u64) -> Result<OpenOutcome, SinkError> {
        let mut connection = self.connection.clone();
        let (fenced, highest_token, last_seq): (u8, u64, i64) = self
            .open
            .key(keys::sink_fence(stream_id))
            .key(keys::sink_stream(stream_id))
            .arg(fence_token)
            .invoke_async(&mut connection)
            .await
            .map_err(classify)?;
        Ok(OpenOutcome {
            highest_token,
            last_seq: u64::try_from(last_seq).ok(),
            fenced: fenced == 1,
        })
    }

    async fn write(&self, batch: SinkBatch<'_>) -> Result<WriteOutcome, SinkError> {
        // The script compares only the batch's head with the stream's end.
        batch.check_order()?;
        // EVALSHA built directly, sized once: a `ScriptInvocation` serialises
        // every argument into its own buffer first (three allocations and a
        // payload copy per event), and a growing command reallocates.
        let bytes: usize = batch
            .events
            .iter()
            .map(|event| event.event_id.len() + event.payload.len() + 48)
            .sum();
        let mut command = redis::Cmd::with_capacity(7 + 3 * batch.events.len(), 256 + bytes);
        command
            .arg("EVALSHA")
            .arg(self.write.get_hash())
            .arg(2)
            .arg(keys::sink_fence(batch.stream_id))
            .arg(keys::sink_stream(batch.stream_id))
            .arg(batch.fence_token)
            .arg(self.options.max_len);
        match batch.after {
            Some(after) => command.arg(after),
            None => command.arg(""),
        };
        for event in batch.events {
            command.arg(event.seq);
            match event.gap {
                None => command.arg(&event.event_id).arg(event.payload.as_bytes()),
                Some(gap) => command
                    .arg("")
                    .arg(format!("{} {}", gap.from, gap.reason.as_str())),
            };
        }
        let mut connection = self.connection.clone();
        let reply = match command.query_async(&mut connection).await {
            Err(err)
                if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                // A restarted or flushed Redis forgot the script: load it, send again.
                self.write
                    .load_async(&mut connection)
                    .await
                    .map_err(classify)?;
                command.query_async(&mut connection).await
            }
            reply => reply,
        };
        let (accepted, duplicate, fenced, highest_token, out_of_order): (u64, u64, u64, u64, u64) =
            reply.map_err(classify)?;
        Ok(WriteOutcome {
            accepted,
            duplicate,
            fenced,
            highest_token,
            out_of_order,
        })
    }
}
