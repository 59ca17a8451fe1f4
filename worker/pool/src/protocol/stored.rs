//! What the pool keeps in Redis besides messages: the request record's field
//! names, the paper broker's ledger entries and the liveness mark. Kept apart
//! from the message families because these are read back by scripts and
//! tools, not exchanged with the API.

use super::Side;
use serde::Serialize;

/// The request record `trading:request:{user_id}:{request_id}` (a hash): its field names
/// and `state` values, spelled once for both buses and their scripts.
pub mod record {
    /// `executing` or `done`.
    pub const STATE: &str = "state";
    /// The final response JSON (once `done`).
    pub const RESPONSE: &str = "response";
    /// The user whose worker began the request.
    pub const USER_ID: &str = "user_id";
    /// The worker that began it.
    pub const WORKER_ID: &str = "worker_id";
    /// When it began (unix ms).
    pub const STARTED_AT: &str = "started_at";
    /// How many workers have taken it without a final answer (one per worker:
    /// a worker retrying its own bus step does not count).
    pub const DELIVERIES: &str = "deliveries";
    /// `state` before the broker call: the outcome is not known yet.
    pub const EXECUTING: &str = "executing";
    /// `state` once the final response is stored.
    pub const DONE: &str = "done";
}

/// The claimed worker's metadata hash `worker:metadata:{user_id}`: its field
/// names, spelled once for both buses, their scripts and the pool's readers.
pub mod metadata {
    /// ECS task ARN, or the local task id.
    pub const TASK_ARN: &str = "task_arn";
    /// Host (EC2 instance id or host name).
    pub const INSTANCE_ID: &str = "instance_id";
    /// Process start, unix ms.
    pub const LAUNCHED_AT: &str = "launched_at";
    /// The worker's sidecar (`http://IP:PORT`); absent when it has none.
    pub const SIDECAR_URL: &str = "sidecar_url";
}

/// An order in the paper broker's ledger (`paper:orders:{account_id}`, field =
/// its client order id), as a real broker reports an order.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct PaperOrder {
    /// Assigned by the ledger, increasing per account in the order orders arrive.
    pub broker_order_id: u64,
    /// The request id the order was placed under.
    pub client_order_id: String,
    /// Always `filled` (the paper broker fills at once).
    pub status: String,
    /// The account.
    pub account_id: String,
    /// Instrument.
    pub symbol: String,
    /// Buy or sell.
    pub side: Side,
    /// Units.
    pub quantity: f64,
    /// Limit price; `null` for a market order.
    pub price: Option<f64>,
    /// The limit price, or 100.0 for a market order.
    pub fill_price: f64,
    /// When the ledger accepted it (unix ms).
    pub created_at: u64,
}

impl PaperOrder {
    /// Reads a stored order.
    pub fn parse(text: &str) -> Option<PaperOrder> {
        serde_json::from_str(text).ok()
    }
}

/// The value of a liveness mark `worker:active:…` (JSON). The API only checks
/// that the key exists; the pool manager and the sweeper read the fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct MarkValue {
    /// Worker identity (`WORKER_ID`).
    pub worker_id: String,
    /// What the launcher lists: `local-{pid}` or the ECS task ARN.
    pub task_id: String,
    /// User served, `-1` in the pool.
    pub user_id: String,
    /// Last heartbeat (unix ms).
    pub heartbeat_at: u64,
    /// Process start (unix ms).
    pub started_at: u64,
    /// The worker's sidecar (`http://IP:PORT`): how the dashboard finds the
    /// sidecars of idle pool workers. Absent when the worker has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sidecar_url: Option<String>,
    /// The TTL its writer gives the mark (ms): a sweeper or supervisor judges
    /// the mark by its own TTL, not by its own setting, so a tool configured
    /// with another `WORKER_MARK_TTL_SECONDS` never takes a fresh mark for a
    /// dead one. Absent in marks written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// How often its writer refreshes the mark (ms); absent as `ttl_ms` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_interval_ms: Option<u64>,
    /// The worker's X25519 public key (standard base64, 32 bytes): the
    /// credential sealer seals this user's credentials to it. Absent for a
    /// worker that decrypts blobs itself (local key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seal_key: Option<String>,
}

impl MarkValue {
    /// The JSON stored in Redis.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads a stored mark; `None` for anything else (e.g. the original design's bare timestamp).
    pub fn parse(text: &str) -> Option<MarkValue> {
        serde_json::from_str(text).ok()
    }
}
