//! The pool as its readers see it: the one read model of the pool's key layout.
//!
//! The dashboard and the sidecar's observer hold a [`PoolReader`]: it names no
//! keys, so through it nothing can write, and nothing outside the pool layout
//! (no `credentials:*` key) can be read. Every pool bus (and anything else that
//! can [`Inspect`] the keyspace) is a `PoolReader`, reading with SCAN (never
//! KEYS: the pool's Redis is shared with the API), GET, HGETALL and LLEN.

use std::collections::BTreeMap;

use async_trait::async_trait;
use futures_util::{StreamExt, TryStreamExt};
use leasehold_telemetry::OrphanKind;
use serde::{Deserialize, Serialize};

use crate::bus::{BusError, Inspect};
use crate::keys;
use crate::protocol::{MarkValue, metadata as field};

/// Read-only, layout-aware access to the pool.
#[async_trait]
pub trait PoolReader: Send + Sync {
    /// Counts only (cheap: key scans and one list length), for the observer's gauges.
    async fn counts(&self) -> Result<PoolCounts, BusError>;
    /// Every idle worker and claimed user with its queues, for the dashboard.
    async fn pool(&self) -> Result<PoolView, BusError>;
    /// The maintenance sweep's latest report.
    async fn anomalies(&self) -> Result<AnomalyView, BusError>;
}

#[async_trait]
impl<T: Inspect + ?Sized> PoolReader for T {
    async fn counts(&self) -> Result<PoolCounts, BusError> {
        let idle = self
            .scan_keys(keys::POOL_WORKER_ACTIVE_PATTERN)
            .await?
            .len() as u64;
        let all = self.scan_keys(keys::WORKER_ACTIVE_PATTERN).await?.len() as u64;
        Ok(PoolCounts {
            idle,
            claimed: all.saturating_sub(idle),
            claims_pending: self.list_len(keys::POOL_CLAIMS).await?,
        })
    }

    async fn pool(&self) -> Result<PoolView, BusError> {
        read_pool(self).await
    }

    async fn anomalies(&self) -> Result<AnomalyView, BusError> {
        read_anomalies(self).await
    }
}

/// Pool sizes at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolCounts {
    /// Idle pool workers (`worker:active:-1:*`).
    pub idle: u64,
    /// Users with a worker (every other `worker:active:*`).
    pub claimed: u64,
    /// Claims waiting in `pool:claims`.
    pub claims_pending: u64,
}

/// What to do about one anomaly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// Which anomaly.
    pub kind: OrphanKind,
    /// User concerned (`-1` for pool workers), if known.
    pub user_id: Option<String>,
    /// Mark key to delete.
    pub delete_key: Option<String>,
    /// Task to stop.
    pub stop_task: Option<String>,
}

/// The JSON written to `maintenance:last_report` (read back by the dashboard).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepReport {
    /// Sweep time, unix ms.
    pub at: u64,
    /// Only reported.
    pub dry_run: bool,
    /// Marks read.
    pub marks: usize,
    /// Tasks listed.
    pub tasks: usize,
    /// Anomalies found, by kind (every kind present, zero included).
    pub found: BTreeMap<OrphanKind, u64>,
    /// Anomalies resolved, by kind.
    pub resolved: BTreeMap<OrphanKind, u64>,
    /// Every finding.
    pub findings: Vec<Finding>,
    /// Resolution failures (no secrets: pool bus and launcher errors only).
    pub errors: Vec<String>,
    /// Claims put back in `pool:claims` from the processing lists of dead
    /// pool workers (absent in reports of older versions).
    #[serde(default)]
    pub claims_requeued: u64,
    /// Users given a new worker by supervision in this pass.
    #[serde(default)]
    pub reserved: Vec<String>,
    /// Set when the safety valve (`SWEEP_MAX_FRACTION`) held the sweep: why.
    /// Nothing was deleted or stopped; the findings are what looked orphaned.
    #[serde(default)]
    pub held: Option<String>,
    /// Findings of the first snapshot that the second did not confirm, or
    /// whose mark changed before its compare-and-delete: left alone.
    #[serde(default)]
    pub unconfirmed: u64,
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
    /// `sidecar_url` from the mark (untrusted: the dashboard validates it).
    pub sidecar_url: Option<String>,
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
    /// `sidecar_url` from the metadata hash (untrusted: the dashboard validates it).
    pub sidecar_url: Option<String>,
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
    /// Users whose worker died with work pending and whose re-serve by
    /// supervision is pending (`pool:reserve:{user_id}`), by user id.
    pub reserving: Vec<String>,
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
async fn read_pool<R: Inspect + ?Sized>(reader: &R) -> Result<PoolView, BusError> {
    let mut idle = Vec::new();
    for key in reader.scan_keys(keys::POOL_WORKER_ACTIVE_PATTERN).await? {
        let Some(value) = reader.get(&key).await? else {
            continue;
        };
        let mark = MarkValue::parse(&value);
        let prefix = keys::pool_worker_active("");
        idle.push(IdleWorker {
            worker_id: key.strip_prefix(&prefix).unwrap_or(&key).to_owned(),
            task_id: mark.as_ref().map(|m| m.task_id.clone()),
            heartbeat_at_ms: mark.as_ref().map(|m| m.heartbeat_at as i64),
            sidecar_url: mark.and_then(|m| m.sidecar_url),
        });
    }
    let pool_prefix = keys::pool_worker_active("");
    let users: Vec<String> = reader
        .scan_keys(keys::WORKER_ACTIVE_PATTERN)
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
        reserving: reader
            .scan_keys(keys::RESERVE_LOCK_PATTERN)
            .await?
            .iter()
            .filter_map(|key| keys::user_in(keys::RESERVE_LOCK_PATTERN, key))
            .collect(),
    })
}

async fn claimed_user<R: Inspect + ?Sized>(
    reader: &R,
    user_id: String,
) -> Result<ClaimedUser, BusError> {
    let mark = reader
        .get(&keys::worker_active(&user_id))
        .await?
        .and_then(|value| MarkValue::parse(&value));
    let metadata = reader
        .hash_get_all(&keys::worker_metadata(&user_id))
        .await?;
    let requests = keys::user_requests(&user_id);
    let control = keys::worker_control(&user_id);
    let dead_letters = reader.list_len(&keys::dead_letter(&requests)).await?
        + reader.list_len(&keys::dead_letter(&control)).await?;
    Ok(ClaimedUser {
        worker_id: mark.as_ref().map(|m| m.worker_id.clone()),
        task_id: mark.as_ref().map(|m| m.task_id.clone()),
        heartbeat_at_ms: mark.map(|m| m.heartbeat_at as i64),
        task_arn: metadata
            .get(field::TASK_ARN)
            .filter(|v| !v.is_empty())
            .cloned(),
        instance_id: metadata
            .get(field::INSTANCE_ID)
            .filter(|v| !v.is_empty())
            .cloned(),
        launched_at_ms: metadata
            .get(field::LAUNCHED_AT)
            .and_then(|v| v.parse().ok()),
        sidecar_url: metadata
            .get(field::SIDECAR_URL)
            .filter(|v| !v.is_empty())
            .cloned(),
        requests_queued: reader.list_len(&requests).await?,
        control_queued: reader.list_len(&control).await?,
        dead_letters,
        user_id,
    })
}

/// Reads the latest maintenance report.
async fn read_anomalies<R: Inspect + ?Sized>(reader: &R) -> Result<AnomalyView, BusError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::PoolBus;
    use crate::bus::memory::MemoryPoolBus;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn the_pool_view_lists_users_being_reserved_until_their_lock_expires() {
        let bus = MemoryPoolBus::new();
        assert!(bus.pool().await.unwrap().reserving.is_empty());
        for user in ["u2", "u1"] {
            bus.set_if_absent(&keys::reserve_lock(user), "1", Duration::from_secs(60))
                .await
                .unwrap();
        }
        assert_eq!(bus.pool().await.unwrap().reserving, ["u1", "u2"]);
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(bus.pool().await.unwrap().reserving.is_empty());
    }
}
