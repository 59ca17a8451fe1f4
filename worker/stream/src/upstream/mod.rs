//! Upstream adapter: "connect to stream X from sequence N and give me events",
//! and a generic WebSocket JSON implementation configured by templates and JSON
//! pointers so it can point at a real feed or at the simulator.
//!
//! The adapter never reconnects: the caller owns the reconnect policy (backoff with
//! jitter) and learns why from [`UpstreamError::reason`]. Bad frames are skipped and
//! reported, never fatal, because one malformed message must not stall a stream.
//!
//! - [`config`]: [`WebSocketUpstreamConfig`] and its validation.
//! - [`budget`]: connects per minute per worker (`UPSTREAM_CONNECTS_PER_MINUTE`).
//! - [`websocket`]: [`WebSocketUpstream`], frames to events.
//! - [`extract`]: the sequence, id and time read from a frame without a JSON tree.
//! - [`history`]: the upstream's REST history, for `UPSTREAM_RESUME=backfill`.
//! - [`template`]: URL and subscribe-message templates.
//! - [`redact`]: URLs as they may appear in logs and errors (no credentials).

pub mod budget;
pub mod config;
pub mod extract;
mod frame;
pub mod handover;
pub mod history;
pub mod redact;
mod registry;
pub mod shared;
pub mod template;
pub mod websocket;

#[cfg(test)]
mod tests;

use tokio::time::Instant;

pub use config::{DataMatch, FEED_SUBSCRIBE_TEMPLATE, SeqRange, WebSocketUpstreamConfig};
pub use redact::redact_url;
pub use shared::SharedUpstream;
pub use websocket::WebSocketUpstream;

/// The window `UPSTREAM_CONNECTS_PER_MINUTE` counts over.
pub(crate) const CONNECT_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// Waits until the worker's connect budget lets a connect go; a wait is
/// reported (`leasehold_upstream_connects_throttled_total`).
pub(crate) async fn wait_for_the_budget(
    budget: &std::sync::Mutex<budget::ConnectBudget>,
    telemetry: &dyn leasehold_telemetry::TelemetrySink,
    stream_id: &str,
) {
    let asked = Instant::now();
    let at = budget
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .reserve(asked);
    if at > asked {
        telemetry.emit(
            leasehold_telemetry::TelemetryEvent::UpstreamConnectThrottled {
                stream_id: stream_id.to_owned(),
                wait: at - asked,
            },
        );
        tokio::time::sleep_until(at).await;
    }
}

/// One event as received.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamEvent {
    /// Sequence number read at the sequence pointer.
    pub seq: u64,
    /// The first sequence the frame covers, when it covers a range
    /// (`UPSTREAM_SEQ_FIRST_POINTER`, or `UPSTREAM_SEQ_PREV_POINTER` + 1).
    pub first_seq: Option<u64>,
    /// Event id read at the id pointer (numbers are stringified).
    pub event_id: String,
    /// The frame's text as received (not copied out of the frame).
    pub payload: leasehold_sink::Payload,
    /// An order book's snapshot sent in the stream (`UPSTREAM_SNAPSHOT_MATCH`),
    /// not a diff.
    pub snapshot: bool,
    /// When the frame was read off the socket.
    pub received_at: Instant,
    /// Seconds from the event's own time (`UPSTREAM_TS_POINTER`, unix ms) to its
    /// arrival; `None` without a time pointer or a readable time.
    pub arrival_lag: Option<f64>,
}

/// A source of ordered events per stream.
#[async_trait::async_trait]
pub trait Upstream: Send + Sync + 'static {
    /// Connects and subscribes to `stream_id` starting at `from_seq` (0: from
    /// wherever the upstream starts; the first event then sets the sequence).
    async fn subscribe(
        &self,
        stream_id: &str,
        from_seq: u64,
    ) -> Result<Box<dyn Subscription>, UpstreamError>;
}

/// One live subscription.
#[async_trait::async_trait]
pub trait Subscription: Send {
    /// The next event, as the upstream sent it. Frames over the size limit,
    /// non-JSON or binary frames, frames missing the seq/id fields and control
    /// frames (`UPSTREAM_DATA_MATCH`) are skipped and reported
    /// (`TelemetryEvent::UpstreamFrameSkipped`) — never an error, never a panic.
    /// Replayed sequences and holes are delivered as they come: what they mean
    /// is the runner's decision (`crate::sequence`). After any
    /// error the subscription is finished and keeps returning that error.
    async fn next(&mut self) -> Result<UpstreamEvent, UpstreamError>;
    /// What [`Subscription::next`] would return at once, if anything is
    /// already here (`None`: it would wait). The runner takes a busy stream's
    /// buffered events through this. Override it where `next` allocates per
    /// call (`async_trait` boxes every call's future: one allocation per
    /// event).
    fn next_ready(&mut self) -> Option<Result<UpstreamEvent, UpstreamError>> {
        use futures_util::FutureExt as _;
        self.next().now_or_never()
    }
    /// Asks the upstream for a new order-book snapshot on this connection
    /// (`UPSTREAM_UNSUBSCRIBE` then `UPSTREAM_SUBSCRIBE`). `Err` when it
    /// cannot: the caller reconnects instead, which brings one too.
    async fn resubscribe(&mut self) -> Result<(), UpstreamError> {
        Err(UpstreamError::Closed(
            "a new snapshot is asked for by reconnecting".into(),
        ))
    }
    /// Closes the connection now (sends a close frame, best effort, bounded time).
    async fn close(&mut self);
}

/// Why a subscription could not start or stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    /// Could not connect, handshake or subscribe in time.
    #[error("could not connect to the upstream: {0}")]
    Connect(String),
    /// The server closed the connection or the socket failed.
    #[error("upstream connection closed: {0}")]
    Closed(String),
    /// The upstream skipped sequence numbers (`replay` mode: reconnect from
    /// `expected`).
    #[error("sequence gap: expected {expected}, got {got}")]
    Gap {
        /// The sequence that should have come next.
        expected: u64,
        /// The sequence that came.
        got: u64,
    },
    /// The upstream no longer has the requested sequence.
    #[error("upstream no longer has sequence {requested} (earliest available: {})",
        earliest.map_or_else(|| "unknown".to_owned(), |e| e.to_string()))]
    RetentionExceeded {
        /// The sequence asked for.
        requested: u64,
        /// The oldest sequence the upstream still has, if it said.
        earliest: Option<u64>,
    },
    /// The server refused the subscription with an error frame.
    #[error("upstream rejected the subscription: {0}")]
    Rejected(String),
    /// The adapter's configuration is unusable.
    #[error("invalid upstream configuration: {0}")]
    Config(String),
    /// Nothing (no event, no pong to our pings) arrived for the idle timeout:
    /// a half-open connection or a frozen upstream.
    #[error("upstream silent for {0:?}")]
    Idle(std::time::Duration),
}

impl UpstreamError {
    /// The reconnect metric's `reason` label.
    pub fn reason(&self) -> &'static str {
        match self {
            UpstreamError::Connect(_) => "connect",
            UpstreamError::Closed(_) => "closed",
            UpstreamError::Gap { .. } => "gap",
            UpstreamError::RetentionExceeded { .. } => "retention_exceeded",
            UpstreamError::Rejected(_) => "rejected",
            UpstreamError::Config(_) => "config",
            UpstreamError::Idle(_) => "idle",
        }
    }
}

#[cfg(test)]
mod reason_tests {
    use super::*;

    /// The sidecar registers the reconnect counter at 0 for exactly these.
    #[test]
    fn every_reconnect_reason_is_a_known_label_value() {
        let errors = [
            UpstreamError::Connect(String::new()),
            UpstreamError::Closed(String::new()),
            UpstreamError::Gap {
                expected: 1,
                got: 2,
            },
            UpstreamError::RetentionExceeded {
                requested: 1,
                earliest: None,
            },
            UpstreamError::Rejected(String::new()),
            UpstreamError::Config(String::new()),
            UpstreamError::Idle(std::time::Duration::ZERO),
        ];
        let reasons: Vec<&str> = errors.iter().map(UpstreamError::reason).collect();
        assert_eq!(reasons, leasehold_telemetry::RECONNECT_REASONS);
    }
}
