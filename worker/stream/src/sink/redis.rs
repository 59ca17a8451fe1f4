//! Redis Streams sink: one Lua script per batch checks the fence, drops
//! duplicates and appends, atomically (docs/redis.md fixes the layout).

use crate::sink::keys;
use async_trait::async_trait;
use redis::aio::ConnectionManager;

use super::{FencedSink, SinkBatch, SinkError, SinkOptions, WriteOutcome};

/// KEYS: fence, dedup, stream. ARGV: token, dedup window, max len, then
/// (seq, event_id, payload) per event. Returns {accepted, duplicate, fenced, highest}.
/// Tokens and sequences stay below 2^53, so Lua's doubles hold them exactly.
const WRITE_BATCH: &str = r#"
local token = tonumber(ARGV[1])
local highest = tonumber(redis.call('GET', KEYS[1]) or '0')
local events = (#ARGV - 3) / 3
if token < highest then
  return {0, 0, events, highest}
end
if token > highest then
  redis.call('SET', KEYS[1], ARGV[1])
end
local window = tonumber(ARGV[2])
local max_len = tonumber(ARGV[3])
local accepted, duplicate = 0, 0
for i = 4, #ARGV, 3 do
  local seq, id, payload = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  -- ZADD NX both checks and records the id: one command per event, not two.
  if redis.call('ZADD', KEYS[2], 'NX', seq, id) == 0 then
    duplicate = duplicate + 1
  else
    if max_len > 0 then
      redis.call('XADD', KEYS[3], 'MAXLEN', '~', max_len, '*',
        'seq', seq, 'event_id', id, 'fence_token', ARGV[1], 'payload', payload)
    else
      redis.call('XADD', KEYS[3], '*',
        'seq', seq, 'event_id', id, 'fence_token', ARGV[1], 'payload', payload)
    end
    accepted = accepted + 1
  end
end
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -(window + 1))
return {accepted, duplicate, 0, token}
"#;

/// The Redis Streams sink. Cheap to clone; reconnects by itself.
#[derive(Clone)]
pub struct RedisSink {
    connection: ConnectionManager,
    script: redis::Script,
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
    /// Reads back a stream's stored events (tests, verification tools).
    pub async fn stored(
        &self,
        stream_id: &str,
    ) -> Result<Vec<super::memory::StoredEvent>, SinkError> {
        let mut connection = self.connection.clone();
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(keys::sink_stream(stream_id))
            .arg("-")
            .arg("+")
            .query_async(&mut connection)
            .await
            .map_err(classify)?;
        reply
            .ids
            .into_iter()
            .map(|entry| {
                let field = |name: &str| -> Result<String, SinkError> {
                    entry.get::<String>(name).ok_or_else(|| {
                        SinkError::Rejected(format!("entry {} has no field {name}", entry.id))
                    })
                };
                let number = |name: &str| -> Result<u64, SinkError> {
                    field(name)?.parse().map_err(|_| {
                        SinkError::Rejected(format!(
                            "entry {} field {name} is not a number",
                            entry.id
                        ))
                    })
                };
                Ok(super::memory::StoredEvent {
                    seq: number("seq")?,
                    event_id: field("event_id")?,
                    fence_token: number("fence_token")?,
                    payload: field("payload")?,
                })
            })
            .collect()
    }

    /// Connects (the connection manager reconnects after failures).
    pub async fn connect(url: &str, options: SinkOptions) -> Result<Self, SinkError> {
        if options.dedup_window == 0 {
            return Err(SinkError::Config(
                "the de-duplication window must hold at least one id".into(),
            ));
        }
        // The URL may hold a password: report only the kind of problem.
        let client = redis::Client::open(url)
            .map_err(|err| SinkError::Config(format!("invalid Redis URL ({:?})", err.kind())))?;
        let connection = ConnectionManager::new(client).await.map_err(classify)?;
        Ok(RedisSink {
            connection,
            script: redis::Script::new(WRITE_BATCH),
            options,
        })
    }
}

#[async_trait]
impl FencedSink for RedisSink {
    async fn write(&self, batch: SinkBatch<'_>) -> Result<WriteOutcome, SinkError> {
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(keys::sink_fence(batch.stream_id))
            .key(keys::sink_dedup(batch.stream_id))
            .key(keys::sink_stream(batch.stream_id))
            .arg(batch.fence_token)
            .arg(self.options.dedup_window)
            .arg(self.options.max_len);
        for event in batch.events {
            invocation
                .arg(event.seq)
                .arg(&event.event_id)
                .arg(&event.payload);
        }
        let mut connection = self.connection.clone();
        let (accepted, duplicate, fenced, highest_token): (u64, u64, u64, u64) = invocation
            .invoke_async(&mut connection)
            .await
            .map_err(classify)?;
        Ok(WriteOutcome {
            accepted,
            duplicate,
            fenced,
            highest_token,
        })
    }
}
