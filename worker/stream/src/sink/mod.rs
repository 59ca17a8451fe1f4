//! Fenced sinks: where a stream's events go, guarded by the fence token.
//!
//! Every write carries `stream_id`, `fence_token` and each event's `event_id`.
//! A sink rejects a whole batch whose token is lower than the highest it has
//! accepted for that stream (a zombie owner), drops event ids it already wrote
//! within a bounded window (a takeover replays from the last checkpoint), and
//! appends the rest, atomically per batch. Both sinks pass one conformance suite.

pub mod keys;
pub mod memory;
pub mod redis;

#[cfg(feature = "testing")]
pub mod conformance;

use std::sync::Arc;

use async_trait::async_trait;

/// One event to append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkEvent {
    /// Upstream sequence number.
    pub seq: u64,
    /// Upstream event id, the de-duplication key.
    pub event_id: String,
    /// The event as received.
    pub payload: String,
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

/// What the sink did with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteOutcome {
    /// Events appended.
    pub accepted: u64,
    /// Events dropped because their id was already written.
    pub duplicate: u64,
    /// Events rejected because a newer fence token exists (all of the batch, or none).
    pub fenced: u64,
    /// Highest token the sink has accepted for this stream after the write.
    pub highest_token: u64,
}

impl WriteOutcome {
    /// The writer's token is stale: it lost ownership and must stop.
    pub fn is_fenced(&self) -> bool {
        self.fenced > 0
    }
}

/// Why a write did not happen. The outcome is unknown: retrying the same batch
/// is safe, since duplicates are dropped.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SinkError {
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
    /// Writes one batch atomically.
    async fn write(&self, batch: SinkBatch<'_>) -> Result<WriteOutcome, SinkError>;
}

/// Sizing shared by both sinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkOptions {
    /// Event ids remembered per stream for de-duplication. Must cover the replay
    /// after a takeover: at least (events per second per stream) × (checkpoint
    /// interval + lease duration).
    pub dedup_window: u64,
    /// Approximate cap on stored events per stream (`XADD MAXLEN ~`); 0 keeps everything.
    pub max_len: u64,
}

impl Default for SinkOptions {
    fn default() -> Self {
        SinkOptions {
            dedup_window: 10_000,
            max_len: 0,
        }
    }
}

/// Opens the sink a `SINK_URL` names: `redis://…`/`rediss://…` or `memory:`.
pub async fn open(url: &str, options: SinkOptions) -> Result<Arc<dyn FencedSink>, SinkError> {
    if url == "memory:" {
        return Ok(Arc::new(memory::MemorySink::new(options)));
    }
    if url.starts_with("redis://")
        || url.starts_with("rediss://")
        || url.starts_with("redis+unix://")
    {
        return Ok(Arc::new(redis::RedisSink::connect(url, options).await?));
    }
    Err(SinkError::Config(
        "SINK_URL must be redis://…, rediss://… or memory:".into(),
    ))
}
