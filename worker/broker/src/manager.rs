//! The pool manager's reconcile pass and the claim path (the original broker-pool specification: "active →
//! nothing; idle pool worker → claim; none → cold start").
//!
//! Both count idle pool workers with a scan of `worker:active:-1:*` on the pool
//! bus (SCAN, never KEYS: it would block Redis on a large keyspace).

use std::time::{Duration, SystemTime};

use leasehold_control::clock::unix_ms;
use leasehold_pool::keys;
use leasehold_telemetry::{TelemetryEvent, TelemetrySink};

use crate::launcher::{LaunchError, TaskLauncher};
use leasehold_pool::bus::{BusError, PoolBus};
use leasehold_pool::protocol::{ClaimMessage, ClaimOutcome, MarkValue, ParseError};

/// Pool manager and claim failures.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The pool bus failed (no URL in the message).
    #[error(transparent)]
    Bus(#[from] BusError),
    /// The launcher failed.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// The user has no credentials blob yet.
    #[error("{0} is not set (run `leasehold credentials put`)")]
    NoCredentials(String),
    /// The user id cannot be part of a key (`keys::valid_user_id`).
    #[error("invalid user id: must be 1-128 of A-Z a-z 0-9 _ . @ - and not start with -")]
    InvalidUserId,
}

/// Idle pool workers: their mark keys and, where readable, their marks.
pub async fn idle_pool_workers(
    bus: &dyn PoolBus,
) -> Result<Vec<(String, Option<MarkValue>)>, BusError> {
    let marks = bus.marks(keys::POOL_WORKER_ACTIVE_PATTERN).await?;
    Ok(marks
        .into_iter()
        .map(|mark| {
            let value = MarkValue::parse(&mark.value);
            (mark.key, value)
        })
        .collect())
}

/// Which path a claim took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimPath {
    /// The user already has a worker: nothing to do.
    AlreadyActive,
    /// A claim was pushed for an idle pool worker.
    PoolClaim {
        /// The claim's id.
        claim_id: String,
    },
    /// No idle pool worker: a worker was started for the user.
    ColdStart {
        /// The started task.
        task_id: String,
    },
}

impl std::fmt::Display for ClaimPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClaimPath::AlreadyActive => write!(f, "active"),
            ClaimPath::PoolClaim { claim_id } => write!(f, "pool-claim {claim_id}"),
            ClaimPath::ColdStart { task_id } => write!(f, "cold-start {task_id}"),
        }
    }
}

/// Makes sure `user_id` gets a worker. The credentials blob is forwarded as
/// stored: the claimer never needs the key.
pub async fn claim_user(
    bus: &dyn PoolBus,
    launcher: &dyn TaskLauncher,
    user_id: &str,
) -> Result<ClaimPath, PoolError> {
    // Before any key is built from it: `-1:w7` would name pool worker w7's mark.
    if !keys::valid_user_id(user_id) {
        return Err(PoolError::InvalidUserId);
    }
    if bus.user_is_active(user_id).await? {
        return Ok(ClaimPath::AlreadyActive);
    }
    let Some(blob) = bus.credentials(user_id).await? else {
        return Err(PoolError::NoCredentials(keys::credentials(user_id)));
    };
    if idle_pool_workers(bus).await?.is_empty() {
        let task_id = launcher.start(Some(user_id)).await?;
        return Ok(ClaimPath::ColdStart { task_id });
    }
    let now = unix_ms(SystemTime::now());
    let claim = ClaimMessage {
        user_id: user_id.to_owned(),
        encrypted_credentials: blob,
        // Unique per push (two claims in one millisecond must not share an
        // outcome key).
        claim_id: format!("claim-{user_id}-{now}-{:08x}", rand::random::<u32>()),
        enqueued_at: u64::try_from(now).unwrap_or(0),
    };
    bus.push_claim(&claim.to_json()).await?;
    Ok(ClaimPath::PoolClaim {
        claim_id: claim.claim_id,
    })
}

/// Polls `pool:claim:{claim_id}` every `poll` until it exists or `timeout`
/// has passed (`None`). A missing outcome means pending, never failed: the
/// claim may still be waiting for an idle pool worker.
pub async fn wait_for_outcome(
    bus: &dyn PoolBus,
    claim_id: &str,
    timeout: Duration,
    poll: Duration,
) -> Result<Option<Result<ClaimOutcome, ParseError>>, BusError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(text) = bus.get(&keys::claim_outcome(claim_id)).await? {
            return Ok(Some(ClaimOutcome::parse(&text)));
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(poll).await;
    }
}

/// What one reconcile pass did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reconciled {
    /// Idle pool workers counted.
    pub idle: usize,
    /// Started task ids.
    pub started: Vec<String>,
    /// Stopped task ids.
    pub stopped: Vec<String>,
}

/// One pool-manager pass: start or stop pool workers to reach `target`.
pub async fn reconcile(
    bus: &dyn PoolBus,
    launcher: &dyn TaskLauncher,
    target: usize,
    telemetry: &dyn TelemetrySink,
) -> Result<Reconciled, PoolError> {
    let idle = idle_pool_workers(bus).await?;
    let mut outcome = Reconciled {
        idle: idle.len(),
        ..Reconciled::default()
    };
    for _ in idle.len()..target {
        outcome.started.push(launcher.start(None).await?);
    }
    // Stop the newest extras first: the oldest have proven they start fine.
    let mut extras: Vec<MarkValue> = idle.into_iter().filter_map(|(_, mark)| mark).collect();
    extras.sort_by_key(|mark| std::cmp::Reverse(mark.started_at));
    for mark in extras.into_iter().take(outcome.idle.saturating_sub(target)) {
        launcher
            .stop(&mark.task_id, "pool above target size")
            .await?;
        outcome.stopped.push(mark.task_id);
    }
    telemetry.emit(TelemetryEvent::PoolReconciled {
        idle: outcome.idle as u64,
        target: target as u64,
        started: outcome.started.len() as u64,
        stopped: outcome.stopped.len() as u64,
    });
    Ok(outcome)
}
