//! The read-only position of a stream in the sink, as the dashboard's stream
//! page shows it next to the checkpoint: one `XREVRANGE … + - COUNT 1` (a
//! Redis user that may only read), or the in-process sink `leasehold dev`
//! shares. Failures are categories, never error texts (which could carry a
//! URL or a password).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::OnceCell;

use crate::memory::MemorySink;
use crate::redis::RedisSink;
use crate::{SinkError, SinkOptions};

/// Longest a page waits for the sink.
pub const SINK_READ_TIMEOUT: Duration = Duration::from_millis(500);

/// Why a sink read failed (categories only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SinkReadError {
    /// Not reachable (connection refused, dropped, timed out).
    #[error("unreachable")]
    Unavailable,
    /// Reachable, but the read was refused (permissions, wrong key type).
    #[error("refused the read")]
    Refused,
}

/// Reads the last position the sink stored for a stream.
#[async_trait]
pub trait SinkReader: Send + Sync {
    /// `None`: nothing stored for the stream.
    async fn last_seq(&self, stream_id: &str) -> Result<Option<u64>, SinkReadError>;
}

fn category(err: SinkError) -> SinkReadError {
    match err {
        SinkError::Unavailable(_) => SinkReadError::Unavailable,
        SinkError::Rejected(_) | SinkError::Config(_) | SinkError::NotOpen { .. } => {
            SinkReadError::Refused
        }
    }
}

/// `leasehold dev`'s in-process sink.
pub struct MemorySinkReader(pub Arc<MemorySink>);

#[async_trait]
impl SinkReader for MemorySinkReader {
    async fn last_seq(&self, stream_id: &str) -> Result<Option<u64>, SinkReadError> {
        Ok(self.0.last_seq(stream_id))
    }
}

/// A Redis sink, connected on first use (and retried on the next read while
/// the connection cannot be made): a Redis that is down when the dashboard
/// starts shows on the page as unreachable instead of stopping it.
pub struct RedisSinkReader {
    url: String,
    sink: OnceCell<RedisSink>,
}

impl RedisSinkReader {
    /// Reads through an already connected sink (`leasehold dev` with Redis).
    pub fn connected(sink: RedisSink) -> Self {
        RedisSinkReader {
            url: String::new(),
            sink: OnceCell::new_with(Some(sink)),
        }
    }

    /// Connects to `url` when first read (the URL may hold a password: it is
    /// never printed, and errors carry only their kind).
    pub fn lazy(url: String) -> Self {
        RedisSinkReader {
            url,
            sink: OnceCell::new(),
        }
    }
}

impl std::fmt::Debug for RedisSinkReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSinkReader")
            .field("connected", &self.sink.initialized())
            .finish()
    }
}

#[async_trait]
impl SinkReader for RedisSinkReader {
    async fn last_seq(&self, stream_id: &str) -> Result<Option<u64>, SinkReadError> {
        let sink = self
            .sink
            .get_or_try_init(|| async {
                match tokio::time::timeout(
                    SINK_READ_TIMEOUT,
                    RedisSink::connect(&self.url, SinkOptions::default()),
                )
                .await
                {
                    Ok(connected) => connected.map_err(category),
                    Err(_) => Err(SinkReadError::Unavailable),
                }
            })
            .await?;
        sink.last_seq(stream_id).await.map_err(category)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FencedSink, SinkBatch, SinkEvent};

    #[tokio::test]
    async fn the_memory_reader_gives_the_newest_stored_seq() {
        let sink = Arc::new(MemorySink::new(SinkOptions::default()));
        let reader = MemorySinkReader(sink.clone());
        assert_eq!(reader.last_seq("s").await, Ok(None));
        sink.open("s", 1).await.unwrap();
        let events: Vec<SinkEvent> = (1..=3)
            .map(|seq| SinkEvent::data(seq, format!("e{seq}"), "{}"))
            .collect();
        sink.write(SinkBatch {
            stream_id: "s",
            fence_token: 1,
            events: &events,
        })
        .await
        .unwrap();
        assert_eq!(reader.last_seq("s").await, Ok(Some(3)));
    }

    #[tokio::test]
    async fn an_unreachable_redis_is_a_category_not_an_error_text() {
        // Nothing listens on port 1.
        let reader = RedisSinkReader::lazy("redis://:hunter2@127.0.0.1:1/".into());
        assert_eq!(reader.last_seq("s").await, Err(SinkReadError::Unavailable));
        assert!(!format!("{reader:?}").contains("hunter2"));
    }
}
