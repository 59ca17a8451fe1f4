//! The warm pool and the sweeper's findings, read from the pool's key space
//! (design §3.2) through a small read-only interface.
//!
//! Only the keys of `leasehold_control::keys` are read, through the pool bus's
//! generic reads (SCAN, never KEYS: the pool's Redis is shared with the API;
//! GET, HGETALL, LLEN). Credentials
//! keys are never read, so no secret can reach a page.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use futures_util::{StreamExt, TryStreamExt};
use leasehold_control::keys;
use leasehold_worker::broker::bus::{BusConnector, BusError, PoolBus};
use leasehold_worker::broker::maintenance::SweepReport;
use leasehold_worker::broker::protocol::MarkValue;
use serde::Serialize;

/// Why the pool's key space could not be read (no URL, no password).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct PoolReadError(pub String);

/// Read-only access to the pool's keys.
#[async_trait]
pub trait PoolReader: Send + Sync {
    /// Keys matching a glob pattern (SCAN semantics: complete, no duplicates).
    async fn scan(&self, pattern: &str) -> Result<Vec<String>, PoolReadError>;
    /// A string value.
    async fn get(&self, key: &str) -> Result<Option<String>, PoolReadError>;
    /// A hash's fields (empty when absent).
    async fn hash(&self, key: &str) -> Result<BTreeMap<String, String>, PoolReadError>;
    /// A list's length (0 when absent).
    async fn list_len(&self, key: &str) -> Result<u64, PoolReadError>;
}

/// [`PoolReader`] over the pool bus (Redis in production, memory in `dev`),
/// through a [`BusConnector`]: a Redis that is down when the dashboard starts
/// shows as down instead of stopping the dashboard.
pub struct BusReader {
    connector: BusConnector,
}

impl BusReader {
    /// Reads through `connector`.
    pub fn new(connector: BusConnector) -> Self {
        BusReader { connector }
    }

    async fn bus(&self) -> Result<Arc<dyn PoolBus>, PoolReadError> {
        self.connector.get().await.map_err(bus_error)
    }
}

fn bus_error(err: BusError) -> PoolReadError {
    // BusError never carries the URL or a message body.
    PoolReadError(err.to_string())
}

#[async_trait]
impl PoolReader for BusReader {
    async fn scan(&self, pattern: &str) -> Result<Vec<String>, PoolReadError> {
        self.bus()
            .await?
            .scan_keys(pattern)
            .await
            .map_err(bus_error)
    }

    async fn get(&self, key: &str) -> Result<Option<String>, PoolReadError> {
        self.bus().await?.get(key).await.map_err(bus_error)
    }

    async fn hash(&self, key: &str) -> Result<BTreeMap<String, String>, PoolReadError> {
        let fields = self
            .bus()
            .await?
            .hash_get_all(key)
            .await
            .map_err(bus_error)?;
        Ok(fields.into_iter().collect())
    }

    async fn list_len(&self, key: &str) -> Result<u64, PoolReadError> {
        self.bus().await?.list_len(key).await.map_err(bus_error)
    }
}

/// An idle pool worker.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IdleWorker {
    /// Worker identity.
    pub worker_id: String,
    /// Task as the launcher lists it (`local-{pid}` or the ECS task ARN).
    pub task_id: Option<String>,
    /// Last heartbeat, unix ms (none when the mark is not leasehold's JSON).
    pub heartbeat_at_ms: Option<i64>,
}

/// A user with a claimed worker.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClaimedUser {
    /// The user.
    pub user_id: String,
    /// Worker serving it.
    pub worker_id: Option<String>,
    /// Task as the launcher lists it.
    pub task_id: Option<String>,
    /// Last heartbeat, unix ms.
    pub heartbeat_at_ms: Option<i64>,
    /// `task_arn` from `worker:metadata:{user}`.
    pub task_arn: Option<String>,
    /// `instance_id` from the metadata hash.
    pub instance_id: Option<String>,
    /// `launched_at` (unix ms) from the metadata hash.
    pub launched_at_ms: Option<i64>,
    /// Requests waiting in `trading:user:{id}:requests`.
    pub requests_queued: u64,
    /// Control messages waiting.
    pub control_queued: u64,
    /// Dead letters of the request and control queues.
    pub dead_letters: u64,
}

/// The pool at one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct PoolView {
    /// Idle pool workers, by worker id.
    pub idle: Vec<IdleWorker>,
    /// Claimed users, by user id.
    pub claimed: Vec<ClaimedUser>,
    /// Claims waiting in `pool:claims`.
    pub claims_pending: u64,
    /// Invalid claims in `pool:claims:dead`.
    pub claims_dead: u64,
}

/// The sweeper's latest report.
#[derive(Debug, Clone, Serialize)]
pub struct AnomalyView {
    /// The report as maintenance wrote it; none before the first sweep.
    pub report: Option<SweepReport>,
    /// The stored text was not a report (shown, never fatal).
    pub unreadable: Option<String>,
}

/// How many per-user reads run at once.
const READ_CONCURRENCY: usize = 16;

/// Reads the pool.
pub async fn read_pool(reader: &dyn PoolReader) -> Result<PoolView, PoolReadError> {
    let mut idle = Vec::new();
    for key in reader.scan(keys::POOL_WORKER_ACTIVE_PATTERN).await? {
        let Some(value) = reader.get(&key).await? else {
            continue;
        };
        let mark = MarkValue::parse(&value);
        let prefix = keys::pool_worker_active("");
        idle.push(IdleWorker {
            worker_id: key.strip_prefix(&prefix).unwrap_or(&key).to_owned(),
            task_id: mark.as_ref().map(|m| m.task_id.clone()),
            heartbeat_at_ms: mark.map(|m| m.heartbeat_at as i64),
        });
    }
    let pool_prefix = keys::pool_worker_active("");
    let users: Vec<String> = reader
        .scan(keys::WORKER_ACTIVE_PATTERN)
        .await?
        .into_iter()
        .filter(|key| !key.starts_with(&pool_prefix))
        .filter_map(|key| {
            key.strip_prefix(keys::WORKER_ACTIVE_PREFIX)
                .map(str::to_owned)
        })
        .collect();
    let mut claimed: Vec<ClaimedUser> = futures_util::stream::iter(users)
        .map(|user| claimed_user(reader, user))
        .buffer_unordered(READ_CONCURRENCY)
        .try_collect()
        .await?;
    claimed.sort_by(|a, b| a.user_id.cmp(&b.user_id));
    Ok(PoolView {
        idle,
        claimed,
        claims_pending: reader.list_len(keys::POOL_CLAIMS).await?,
        claims_dead: reader
            .list_len(&keys::dead_letter(keys::POOL_CLAIMS))
            .await?,
    })
}

async fn claimed_user(
    reader: &dyn PoolReader,
    user_id: String,
) -> Result<ClaimedUser, PoolReadError> {
    let mark = reader
        .get(&keys::worker_active(&user_id))
        .await?
        .and_then(|value| MarkValue::parse(&value));
    let metadata = reader.hash(&keys::worker_metadata(&user_id)).await?;
    let requests = keys::user_requests(&user_id);
    let control = keys::worker_control(&user_id);
    let dead_letters = reader.list_len(&keys::dead_letter(&requests)).await?
        + reader.list_len(&keys::dead_letter(&control)).await?;
    Ok(ClaimedUser {
        worker_id: mark.as_ref().map(|m| m.worker_id.clone()),
        task_id: mark.as_ref().map(|m| m.task_id.clone()),
        heartbeat_at_ms: mark.map(|m| m.heartbeat_at as i64),
        task_arn: metadata.get("task_arn").filter(|v| !v.is_empty()).cloned(),
        instance_id: metadata
            .get("instance_id")
            .filter(|v| !v.is_empty())
            .cloned(),
        launched_at_ms: metadata.get("launched_at").and_then(|v| v.parse().ok()),
        requests_queued: reader.list_len(&requests).await?,
        control_queued: reader.list_len(&control).await?,
        dead_letters,
        user_id,
    })
}

/// Reads the latest maintenance report.
pub async fn read_anomalies(reader: &dyn PoolReader) -> Result<AnomalyView, PoolReadError> {
    let Some(text) = reader.get(keys::MAINTENANCE_LAST_REPORT).await? else {
        return Ok(AnomalyView {
            report: None,
            unreadable: None,
        });
    };
    Ok(match serde_json::from_str::<SweepReport>(&text) {
        Ok(report) => AnomalyView {
            report: Some(report),
            unreadable: None,
        },
        Err(err) => AnomalyView {
            report: None,
            unreadable: Some(format!(
                "{} is not a sweep report: {err}",
                keys::MAINTENANCE_LAST_REPORT
            )),
        },
    })
}
