//! The pool bus: every interaction of the broker pool with its shared state
//! (liveness marks, claim / request / control queues, responses, credentials,
//! the maintenance report), behind one trait.
//!
//! Two implementations pass one conformance suite: [`redis::RedisPoolBus`]
//! (production; the Redis layout in docs/redis.md is a contract for APIs in
//! other languages, so it is spelled exactly as before) and
//! [`memory::MemoryPoolBus`] (one process, no Redis: `leasehold dev` and fast
//! tests). Key names come only from `crate::keys`.
//!
//! Roles: workers and the admin tools (claim path, pool manager, sweep,
//! `credentials put`) hold a [`PoolBus`]; readers (dashboard, observer) hold a
//! [`crate::read::PoolReader`], which cannot write or name a key.
//!
//! Queue directions are part of the contract and are fixed here, not by
//! callers: producers push claims, requests and control messages at the head
//! (Redis `LPUSH`); claims are popped at the tail (`BRPOP`, oldest first),
//! requests and control messages at the head (`BLPOP`, newest first, as the
//! original protocol does), control before requests.

pub mod memory;
pub mod redis;

#[cfg(feature = "testing")]
pub mod conformance;

use std::collections::HashMap;
use std::time::Duration;

use crate::keys;
use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

/// Responses stay readable this long (docs/redis.md).
pub const RESPONSE_TTL: Duration = Duration::from_secs(60);

/// A taken request id is remembered this long (redeliveries come much sooner).
pub const REQUEST_TAKEN_TTL: Duration = Duration::from_secs(86_400);

/// Why a bus operation failed. Messages never hold the bus URL (which may
/// carry a password) nor a message body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BusError {
    /// The bus could not be reached or timed out; the outcome is unknown.
    #[error("pool bus unavailable: {0}")]
    Unavailable(String),
    /// The bus refused the operation (script error, wrong type at a key).
    #[error("pool bus rejected the operation: {0}")]
    Rejected(String),
    /// The bus URL or options are invalid.
    #[error("invalid pool bus configuration: {0}")]
    Config(String),
}

/// Where a claimed worker runs, stored in `worker:metadata:{user_id}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerMetadata {
    /// ECS task ARN, or the local task id.
    pub task_arn: String,
    /// Host (EC2 instance id or host name).
    pub instance_id: String,
    /// Process start, unix ms.
    pub launched_at: u64,
}

/// A worker writing a user's liveness mark (claim and heartbeat).
#[derive(Debug, Clone, Copy)]
pub struct MarkWrite<'a> {
    /// The user (`worker:active:{user_id}`).
    pub user_id: &'a str,
    /// The writing worker: owner of the mark, and of the pool mark a claim drops.
    pub worker_id: &'a str,
    /// The mark's stored value (a `MarkValue` as JSON whose `worker_id` is `worker_id`).
    pub value: &'a str,
    /// TTL of the mark and the metadata, in whole seconds (at least 1).
    pub ttl: Duration,
    /// Written to `worker:metadata:{user_id}` with the same TTL.
    pub metadata: &'a WorkerMetadata,
}

/// A message popped for a claimed worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserMessage {
    /// From `worker:control:{user_id}:messages`.
    Control(String),
    /// From `trading:user:{user_id}:requests`.
    Request(String),
}

impl UserMessage {
    /// The lists a user's worker pops, in priority order: control first.
    pub(crate) fn lists(user_id: &str) -> [String; 2] {
        [keys::worker_control(user_id), keys::user_requests(user_id)]
    }

    /// Names what came from which of [`UserMessage::lists`].
    pub(crate) fn from_list(user_id: &str, list: &str, body: String) -> UserMessage {
        if list == keys::worker_control(user_id) {
            UserMessage::Control(body)
        } else {
            UserMessage::Request(body)
        }
    }
}

/// One liveness mark as read by the pool manager and the sweep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMark {
    /// The key (`worker:active:…`).
    pub key: String,
    /// The stored value as text.
    pub value: String,
    /// Remaining TTL in ms; `None` when the key has no expiry.
    pub ttl_ms: Option<u64>,
}

/// The broker pool's shared state. Every method is one atomic step on the
/// bus unless it says otherwise.
#[async_trait]
pub trait PoolBus: Inspect {
    // --- liveness marks ---

    /// The exclusive claim: sets the user's mark only if no one holds it, and
    /// in the same step drops the claimer's pool mark and rewrites the
    /// metadata. `true` when this worker now holds the user.
    async fn claim_user(&self, mark: &MarkWrite<'_>) -> Result<bool, BusError>;

    /// Refreshes the user's mark and metadata while the mark is absent or this
    /// worker's (an expired mark is taken back). `false`: another worker holds
    /// the user; nothing was written.
    async fn refresh_user_mark(&self, mark: &MarkWrite<'_>) -> Result<bool, BusError>;

    /// Deletes the user's mark and metadata unless another worker holds the
    /// user (then `false` and nothing is deleted).
    async fn release_user_mark(&self, user_id: &str, worker_id: &str) -> Result<bool, BusError>;

    /// Whether the user has a worker (its mark exists).
    async fn user_is_active(&self, user_id: &str) -> Result<bool, BusError>;

    /// Writes an idle pool worker's mark `worker:active:-1:{worker_id}` with a
    /// TTL in whole seconds (at least 1).
    async fn set_pool_mark(
        &self,
        worker_id: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<(), BusError>;

    /// Deletes an idle pool worker's mark.
    async fn delete_pool_mark(&self, worker_id: &str) -> Result<(), BusError>;

    // --- queues ---

    /// Queues a claim for an idle pool worker (`LPUSH pool:claims`).
    async fn push_claim(&self, body: &str) -> Result<(), BusError>;

    /// Puts a claim back first in line (`RPUSH pool:claims`), for a claim a
    /// stopping worker popped but will not serve.
    async fn return_claim(&self, body: &str) -> Result<(), BusError>;

    /// Waits up to `timeout` for the oldest claim (`BRPOP pool:claims`).
    /// `interrupt` ends the wait early with `None`; a claim the bus had
    /// already handed out when interrupted is still returned, never lost.
    async fn pop_claim(
        &self,
        timeout: Duration,
        interrupt: &CancellationToken,
    ) -> Result<Option<String>, BusError>;

    /// Queues a request for a user's worker (`LPUSH`, as the API does).
    async fn push_request(&self, user_id: &str, body: &str) -> Result<(), BusError>;

    /// Queues a control message for a user's worker (`LPUSH`, as the API does).
    async fn push_control(&self, user_id: &str, body: &str) -> Result<(), BusError>;

    /// Waits up to `timeout` for the user's next control message or request
    /// (`BLPOP control requests`: control first, each list newest first).
    /// `interrupt` behaves as in [`PoolBus::pop_claim`].
    async fn pop_user_message(
        &self,
        user_id: &str,
        timeout: Duration,
        interrupt: &CancellationToken,
    ) -> Result<Option<UserMessage>, BusError>;

    /// Appends an invalid message to `{list_key}:dead` with the reason and the
    /// time (`RPUSH`, so the dead list reads oldest first).
    async fn dead_letter(
        &self,
        list_key: &str,
        reason: &str,
        body: &str,
        at_unix_ms: u64,
    ) -> Result<(), BusError>;

    // --- requests and responses ---

    /// Takes a request id for `worker_id` (`SET NX`, [`REQUEST_TAKEN_TTL`]).
    /// `false`: it was taken before and must not run again.
    async fn take_request(&self, request_id: &str, worker_id: &str) -> Result<bool, BusError>;

    /// Stores the answer to a request for [`RESPONSE_TTL`].
    async fn put_response(&self, request_id: &str, body: &str) -> Result<(), BusError>;

    // --- credentials and reports ---

    /// A user's encrypted credentials blob.
    async fn credentials(&self, user_id: &str) -> Result<Option<String>, BusError>;

    /// Stores a user's encrypted credentials blob (no TTL).
    async fn put_credentials(&self, user_id: &str, blob: &str) -> Result<(), BusError>;

    /// The last maintenance sweep report (JSON).
    async fn maintenance_report(&self) -> Result<Option<String>, BusError>;

    /// Replaces the maintenance sweep report.
    async fn put_maintenance_report(&self, report: &str) -> Result<(), BusError>;

    /// Deletes keys (the sweep's stale and orphan marks); returns how many existed.
    async fn delete_keys(&self, keys: &[String]) -> Result<u64, BusError>;
}

/// Reads of any key in the pool's keyspace: what the pool's own read model
/// ([`crate::read`]) and the conformance suite are built on. Components that
/// only read hold a [`crate::read::PoolReader`] instead, which names no keys and
/// cannot reach `credentials:*`.
#[async_trait]
pub trait Inspect: Send + Sync {
    /// Every mark whose key matches `pattern` (SCAN semantics), with its value
    /// and TTL. Not atomic across keys; keys that vanish meanwhile are left out.
    async fn marks(&self, pattern: &str) -> Result<Vec<StoredMark>, BusError>;

    // --- generic reads (dashboard, observer, tests) ---

    /// Keys matching a glob pattern (`*`, `?`, `[…]`, `\` escapes), by SCAN
    /// (never KEYS), sorted and without duplicates.
    async fn scan_keys(&self, pattern: &str) -> Result<Vec<String>, BusError>;

    /// A string key's value.
    async fn get(&self, key: &str) -> Result<Option<String>, BusError>;

    /// A key's remaining TTL in ms: `None` when the key does not exist,
    /// `Some(-1)` when it has no expiry.
    async fn ttl_ms(&self, key: &str) -> Result<Option<i64>, BusError>;

    /// Length of a list (0 when absent).
    async fn list_len(&self, key: &str) -> Result<u64, BusError>;

    /// A list's entries from head to tail (empty when absent).
    async fn list_items(&self, key: &str) -> Result<Vec<String>, BusError>;

    /// A hash's fields (empty when absent), e.g. `worker:metadata:{user_id}`.
    async fn hash_get_all(&self, key: &str) -> Result<HashMap<String, String>, BusError>;
}

/// A TTL as the whole seconds Redis `EX` takes (at least 1, as the worker always
/// wrote it); both buses round the same way.
pub(crate) fn whole_seconds(ttl: Duration) -> u64 {
    ttl.as_secs().max(1)
}

/// A pool bus that may not be connected yet: readers that must keep running
/// while Redis is down (the sidecar's observer, the dashboard) connect on first
/// use and again after a failed connect, instead of failing at start.
pub struct BusConnector {
    bus: tokio::sync::Mutex<Option<std::sync::Arc<dyn PoolBus>>>,
    redis_url: Option<String>,
}

impl std::fmt::Debug for BusConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a password.
        f.debug_struct("BusConnector").finish_non_exhaustive()
    }
}

impl BusConnector {
    /// A connector over a bus that already exists (memory bus, tests).
    pub fn ready(bus: std::sync::Arc<dyn PoolBus>) -> Self {
        BusConnector {
            bus: tokio::sync::Mutex::new(Some(bus)),
            redis_url: None,
        }
    }

    /// A connector to Redis at `url`; nothing is connected yet. The URL's form
    /// is checked now, so a typo is a configuration error at start.
    pub fn redis(url: String) -> Result<Self, BusError> {
        ::redis::Client::open(url.as_str())
            .map_err(|err| BusError::Config(format!("invalid Redis URL ({:?})", err.kind())))?;
        Ok(BusConnector {
            bus: tokio::sync::Mutex::new(None),
            redis_url: Some(url),
        })
    }

    /// The bus, connecting first if needed.
    pub async fn get(&self) -> Result<std::sync::Arc<dyn PoolBus>, BusError> {
        let mut slot = self.bus.lock().await;
        if let Some(bus) = slot.as_ref() {
            return Ok(bus.clone());
        }
        let url = self
            .redis_url
            .as_deref()
            .ok_or_else(|| BusError::Config("no pool bus".into()))?;
        let bus: std::sync::Arc<dyn PoolBus> =
            std::sync::Arc::new(redis::RedisPoolBus::connect(url).await?);
        *slot = Some(bus.clone());
        Ok(bus)
    }
}

/// A connector inspects through the bus it connects, so a reader that holds one
/// as a [`crate::read::PoolReader`] survives a Redis that is down at start.
#[async_trait]
impl Inspect for BusConnector {
    async fn marks(&self, pattern: &str) -> Result<Vec<StoredMark>, BusError> {
        self.get().await?.marks(pattern).await
    }
    async fn scan_keys(&self, pattern: &str) -> Result<Vec<String>, BusError> {
        self.get().await?.scan_keys(pattern).await
    }
    async fn get(&self, key: &str) -> Result<Option<String>, BusError> {
        BusConnector::get(self).await?.get(key).await
    }
    async fn ttl_ms(&self, key: &str) -> Result<Option<i64>, BusError> {
        self.get().await?.ttl_ms(key).await
    }
    async fn list_len(&self, key: &str) -> Result<u64, BusError> {
        self.get().await?.list_len(key).await
    }
    async fn list_items(&self, key: &str) -> Result<Vec<String>, BusError> {
        self.get().await?.list_items(key).await
    }
    async fn hash_get_all(&self, key: &str) -> Result<HashMap<String, String>, BusError> {
        self.get().await?.hash_get_all(key).await
    }
}

#[cfg(test)]
mod connector_tests {
    use super::*;

    #[tokio::test]
    async fn a_redis_that_is_down_is_an_error_per_use_not_at_creation() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let connector = BusConnector::redis(format!("redis://127.0.0.1:{port}")).unwrap();
        let err = connector.get().await.err().expect("nothing listens there");
        assert!(matches!(err, BusError::Unavailable(_)), "{err:?}");
        assert!(BusConnector::redis("http://nope".into()).is_err());
        let ready = BusConnector::ready(std::sync::Arc::new(memory::MemoryPoolBus::new()));
        assert!(ready.get().await.is_ok());
    }
}
