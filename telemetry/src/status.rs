//! The sidecar's `/status` document: what a sidecar knows about its worker.
//!
//! The sidecar serves it and the dashboard reads it; both use these types, so
//! neither depends on the other.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A lease the worker holds, as last reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldLease {
    /// Stream (or reserved record) held.
    pub stream_id: String,
    /// Fence token.
    pub fence_token: u64,
    /// Record expiry, unix ms, from the last acquire or renew.
    pub expires_at_ms: i64,
}

/// Lag of one stream, as last reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamLag {
    /// Received minus persisted.
    pub lag_events: u64,
    /// Age of the oldest unpersisted event.
    pub lag_seconds: f64,
    /// Seconds since the last event arrived (absent from older sidecars).
    #[serde(default)]
    pub last_event_age_seconds: Option<f64>,
    /// The worker's upstream connection carrying it
    /// ([`UpstreamConnection::id`]), from its latest subscription.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<u64>,
}

/// Upstream connections a worker lists in its reports (the oldest first);
/// more are counted, not listed: a worker on one connection per stream has
/// as many as it holds streams, and the view needs the long-lived ones.
pub const LISTED_CONNECTIONS: usize = 64;

/// One upstream connection of a worker, for the dashboard's connections view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpstreamConnection {
    /// The worker's number for it, from 1; a planned replacement keeps it.
    pub id: u64,
    /// When its current socket opened, unix ms (a replacement restarts it).
    pub opened_at_ms: i64,
    /// Held streams on it.
    pub streams: u64,
    /// Times it was replaced before its age (`UPSTREAM_MAX_CONNECTION_AGE_MS`).
    pub replacements: u64,
    /// Its latest subscription: from the stream asking to its first frame,
    /// seconds (connect budget and subscribe pacing included).
    pub subscribe_seconds: Option<f64>,
}

/// A broker worker's place in the pool, as last reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolState {
    /// The worker's id.
    pub worker_id: String,
    /// `idle`, `claimed` or `stopped`.
    pub state: String,
    /// The user it serves once claimed.
    pub user_id: Option<String>,
}

/// Pool claims a sidecar keeps for `/status` (the newest; older ones leave).
pub const RECENT_CLAIMS: usize = 32;

/// One pool claim a worker behind this sidecar took (`PoolClaim` with result
/// `claimed`): raw samples rather than percentiles, because percentiles of
/// different sidecars cannot be merged and the dashboard wants the cluster's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClaimSample {
    /// 1-based count of claims this sidecar has seen (since it started), so a
    /// reader polling again can tell new samples from ones it already has.
    pub seq: u64,
    /// Milliseconds between the claim and this `/status` answer.
    pub age_ms: u64,
    /// The claim's latency: from its `enqueued_at` to the worker being active.
    pub seconds: f64,
}

/// Data gaps a sidecar keeps for `/status` (the newest; older ones leave).
pub const RECENT_GAPS: usize = 32;

/// One data gap a worker behind this sidecar recorded (`StreamGap`): what the
/// dashboard lists on the stream page, counts per stream and marks on the
/// timeline. Raw records, numbered, so a poller can tell new ones apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GapSample {
    /// 1-based count of gaps this sidecar has seen (since it started).
    pub seq: u64,
    /// Milliseconds between the gap and this `/status` answer.
    pub age_ms: u64,
    /// Stream with the gap.
    pub stream_id: String,
    /// First missing sequence.
    pub from_seq: u64,
    /// Last missing sequence.
    pub to_seq: u64,
    /// `no_replay`, `retention`, `backfill_exhausted` or `sink_lost`.
    pub reason: crate::GapReason,
}

/// Backfills a sidecar keeps for `/status` (the newest; older ones leave).
pub const RECENT_BACKFILLS: usize = 32;

/// One backfill a worker behind this sidecar finished (`StreamBackfill`):
/// what the stream page lists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackfillSample {
    /// Milliseconds between its end and this `/status` answer.
    pub age_ms: u64,
    /// Stream backfilled.
    pub stream_id: String,
    /// `filled`, `gap` or `stopped`.
    pub result: crate::BackfillResult,
    /// History pages fetched.
    pub pages: u32,
    /// Events the history supplied.
    pub events: u64,
    /// First request to end, seconds.
    pub seconds: f64,
}

/// What the sidecar knows about its worker (the worker part of `/status`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    /// `stream-worker`, `broker-worker`, or null before the first heartbeat.
    pub component: Option<String>,
    /// The worker's identity.
    pub owner_id: Option<String>,
    /// A worker is connected to the telemetry socket.
    pub worker_connected: bool,
    /// Milliseconds since the last event (heartbeats included); null if none yet.
    pub last_event_age_ms: Option<u64>,
    /// Connected and not silent beyond the threshold (what `leasehold_worker_up` says).
    pub worker_up: bool,
    /// Events received since start.
    pub events_received: u64,
    /// Events the worker reported dropping.
    pub events_dropped: u64,
    /// Events the sink refused because a newer fence token exists (zombie writes).
    #[serde(default)]
    pub sink_events_fenced: u64,
    /// Leases this worker lost (renew refused, deadline passed, fenced).
    #[serde(default)]
    pub leases_lost: u64,
    /// Leases held: streams and reserved records (presence).
    pub leases: Vec<HeldLease>,
    /// Per-stream lag.
    pub lag: BTreeMap<String, StreamLag>,
    /// Open upstream connections.
    pub websocket_connections: usize,
    /// Upstream connections the worker has open, counted whole (a
    /// replacement overlapping its connection counts); 0 while it is down.
    #[serde(default)]
    pub upstream_connections_open: u64,
    /// The worker's upstream connections, the oldest [`LISTED_CONNECTIONS`];
    /// empty for broker workers and older sidecars.
    #[serde(default)]
    pub upstream_connections: Vec<UpstreamConnection>,
    /// Connects that waited for the worker's connect budget since the
    /// sidecar started (`leasehold_upstream_connects_throttled_total`).
    #[serde(default)]
    pub upstream_connects_throttled: u64,
    /// Pool/user state of a broker worker (null for stream workers).
    pub pool: Option<PoolState>,
    /// The newest pool claims (at most [`RECENT_CLAIMS`], oldest first);
    /// empty for stream workers and older sidecars.
    #[serde(default)]
    pub claims: Vec<ClaimSample>,
    /// The newest data gaps (at most [`RECENT_GAPS`], oldest first); empty for
    /// broker workers and older sidecars.
    #[serde(default)]
    pub gaps: Vec<GapSample>,
    /// The newest finished backfills (at most [`RECENT_BACKFILLS`], oldest
    /// first); empty for broker workers and older sidecars.
    #[serde(default)]
    pub backfills: Vec<BackfillSample>,
}

/// The `/status` body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SidecarStatus {
    /// What the sidecar knows about its worker.
    #[serde(flatten)]
    pub worker: Status,
    /// This sidecar currently publishes the cluster gauges.
    pub observer: bool,
}
