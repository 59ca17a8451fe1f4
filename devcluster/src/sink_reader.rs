//! The dashboard's read of the sink ([`leasehold_dashboard::sink::SinkReader`])
//! over the stream worker's own sinks, which name the keys: `leasehold dev`
//! shares its in-process or Redis sink, and `leasehold dashboard` connects to
//! `DASHBOARD_SINK_URL` lazily (a Redis that is down at start shows on the
//! page as unreachable instead of stopping the dashboard).

use std::sync::Arc;

use async_trait::async_trait;
use leasehold_dashboard::sink::{SINK_READ_TIMEOUT, SinkReadError, SinkReader};
use leasehold_stream::sink::memory::MemorySink;
use leasehold_stream::sink::redis::RedisSink;
use leasehold_stream::sink::{SinkError, SinkOptions};
use tokio::sync::OnceCell;

fn category(err: SinkError) -> SinkReadError {
    match err {
        SinkError::Unavailable(_) => SinkReadError::Unavailable,
        SinkError::Rejected(_) | SinkError::Config(_) => SinkReadError::Refused,
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
/// the connection cannot be made).
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
    use leasehold_stream::sink::{FencedSink, SinkBatch, SinkEvent};

    use super::*;

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
            after: None,
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
