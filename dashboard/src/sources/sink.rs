//! The sink's position for one stream, for the per-stream page: checkpoint
//! (what the lease record says the sink confirmed) versus the sink's last
//! stored sequence.
//!
//! Optional (`DASHBOARD_SINK_URL`). The read itself is the sink crate's
//! ([`SinkReader`], `leasehold_sink::reader`), which names the keys; the
//! dashboard depends on it, not on the stream worker (no WebSocket code in
//! it). Only the per-stream page reads it, one stream at a time, within
//! [`SINK_READ_TIMEOUT`]; what goes wrong is shown as a fixed category, never
//! an error text (which could carry a URL or a password).

use std::sync::Arc;

use serde::Serialize;

pub use leasehold_sink::reader::{SINK_READ_TIMEOUT, SinkReadError, SinkReader};

/// What the page shows next to the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SinkPosition {
    /// No `DASHBOARD_SINK_URL`.
    NotConfigured,
    /// The sink could not be read (why, as a category).
    Unreadable {
        /// `unreachable`, `refused the read` or `no answer in time`.
        reason: &'static str,
    },
    /// The sink holds nothing for the stream.
    Empty,
    /// The sink's newest entry.
    At {
        /// Its `seq`.
        last_seq: u64,
    },
}

impl SinkPosition {
    /// The sink's last seq, when read.
    pub fn last_seq(&self) -> Option<u64> {
        match self {
            SinkPosition::At { last_seq } => Some(*last_seq),
            _ => None,
        }
    }

    /// Sink last seq minus checkpoint: events stored but not yet checkpointed
    /// (negative: the checkpoint is ahead of what the sink holds, e.g. a
    /// trimmed or replaced sink). `None` unless both are known.
    pub fn ahead_of(&self, checkpoint: Option<u64>) -> Option<i128> {
        Some(i128::from(self.last_seq()?) - i128::from(checkpoint?))
    }

    /// In words, for the page.
    pub fn describe(&self) -> String {
        match self {
            SinkPosition::NotConfigured => "not read (DASHBOARD_SINK_URL is not set)".to_owned(),
            SinkPosition::Unreadable { reason } => format!("unknown: the sink {reason}"),
            SinkPosition::Empty => "nothing stored".to_owned(),
            SinkPosition::At { last_seq } => last_seq.to_string(),
        }
    }
}

/// Reads one stream's position, bounded by [`SINK_READ_TIMEOUT`].
pub async fn position(reader: Option<&Arc<dyn SinkReader>>, stream_id: &str) -> SinkPosition {
    let Some(reader) = reader else {
        return SinkPosition::NotConfigured;
    };
    match tokio::time::timeout(SINK_READ_TIMEOUT, reader.last_seq(stream_id)).await {
        Ok(Ok(Some(last_seq))) => SinkPosition::At { last_seq },
        Ok(Ok(None)) => SinkPosition::Empty,
        Ok(Err(SinkReadError::Unavailable)) => SinkPosition::Unreadable {
            reason: "is unreachable",
        },
        Ok(Err(SinkReadError::Refused)) => SinkPosition::Unreadable {
            reason: "refused the read",
        },
        Err(_) => SinkPosition::Unreadable {
            reason: "gave no answer in time",
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use async_trait::async_trait;

    use super::*;

    struct Fixed(Result<Option<u64>, SinkReadError>, Duration);

    #[async_trait]
    impl SinkReader for Fixed {
        async fn last_seq(&self, _: &str) -> Result<Option<u64>, SinkReadError> {
            tokio::time::sleep(self.1).await;
            self.0
        }
    }

    fn reader(answer: Result<Option<u64>, SinkReadError>, delay: Duration) -> Arc<dyn SinkReader> {
        Arc::new(Fixed(answer, delay))
    }

    #[tokio::test(start_paused = true)]
    async fn positions_say_what_was_read_or_why_not() {
        assert_eq!(position(None, "s").await, SinkPosition::NotConfigured);
        let at = position(Some(&reader(Ok(Some(42)), Duration::ZERO)), "s").await;
        assert_eq!(at, SinkPosition::At { last_seq: 42 });
        assert_eq!(at.ahead_of(Some(40)), Some(2));
        assert_eq!(at.ahead_of(None), None);
        assert_eq!(
            position(Some(&reader(Ok(None), Duration::ZERO)), "s").await,
            SinkPosition::Empty
        );
        let down = position(
            Some(&reader(Err(SinkReadError::Unavailable), Duration::ZERO)),
            "s",
        )
        .await;
        assert_eq!(down.describe(), "unknown: the sink is unreachable");
        assert_eq!(down.ahead_of(Some(1)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_sink_costs_the_page_at_most_the_timeout() {
        let started = tokio::time::Instant::now();
        let slow = position(Some(&reader(Ok(Some(1)), Duration::from_secs(60))), "s").await;
        assert_eq!(
            slow,
            SinkPosition::Unreadable {
                reason: "gave no answer in time"
            }
        );
        assert_eq!(started.elapsed(), SINK_READ_TIMEOUT);
    }
}
