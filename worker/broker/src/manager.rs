//! The pool manager's reconcile pass and the claim path (the original broker-pool specification: "active →
//! nothing; idle pool worker → claim; none → cold start"), and the reload
//! path: a fresh reload grant, then `reload_credentials` ([`reload_credentials`]).
//!
//! Both read the idle pool from `pool:idle` (one script over the idle
//! workers, never a SCAN of a keyspace that holds a day of request keys).
//!
//! Scale-down never stops a worker between taking a claim and its claim step:
//! the manager first retires the worker on the bus, one step that succeeds only
//! while the worker is idle (no claim in its processing list), and stops only
//! a worker it retired; a retired worker takes no claim, and a claim its
//! blocked move took after the retirement goes back first in line
//! (`PoolBus::retire_idle`, `PoolBus::take_claim`).

use std::time::Duration;

use leasehold_control::clock::{Clock, SystemClock};
use leasehold_pool::keys;
use leasehold_pool::state::PoolState;
use leasehold_telemetry::{TelemetryEvent, TelemetrySink};

use crate::launcher::{LaunchError, TaskLauncher};
use crate::sealer::{grant_credentials, new_grant};
use leasehold_pool::bus::{BusError, Inspect, MarkBus, PoolBus};
use leasehold_pool::protocol::{ClaimMessage, ClaimOutcome, GrantReason, MarkValue, ParseError};

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

/// Idle pool workers (from `pool:idle`): their ids and, where readable, their marks.
pub async fn idle_pool_workers(
    bus: &dyn MarkBus,
) -> Result<Vec<(String, Option<MarkValue>)>, BusError> {
    Ok(bus
        .idle_workers()
        .await?
        .into_iter()
        .map(|entry| {
            let value = MarkValue::parse(&entry.mark);
            (entry.worker_id, value)
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
        // After the launch: the grant names the task, the one worker that
        // may use it (the worker asks again until the grant is there).
        let task_id = launcher.start(Some(user_id)).await?;
        let grant = new_grant(GrantReason::ColdStart).for_task(&task_id);
        grant_credentials(bus, user_id, &grant).await?;
        return Ok(ClaimPath::ColdStart { task_id });
    }
    let now = SystemClock.now_ms();
    let claim = ClaimMessage {
        user_id: user_id.to_owned(),
        encrypted_credentials: blob,
        // Unique per push (two claims in one millisecond must not share an
        // outcome key).
        claim_id: format!("claim-{user_id}-{now}-{:08x}", rand::random::<u32>()),
        enqueued_at: u64::try_from(now).unwrap_or(0),
    };
    // Before the push: the worker that takes the claim asks the sealer at once.
    let grant = new_grant(GrantReason::Claim).for_claim(&claim.claim_id);
    grant_credentials(bus, user_id, &grant).await?;
    bus.push_claim(&claim.to_json()).await?;
    Ok(ClaimPath::PoolClaim {
        claim_id: claim.claim_id,
    })
}

/// Tells `user_id`'s worker to reload its credentials the way
/// docs/messages.md asks a sender to: a fresh reload grant
/// (`pool:grant:{user_id}`, which the sealer binds to the holder it
/// recorded), then `reload_credentials`. The grant the worker's claim or cold
/// start used is spent, and the sealer seals once per grant: a reload sent
/// without a new grant is refused (`409`) and dead-lettered.
///
/// `false`, with nothing written, when the user has no worker (or has an id
/// no worker may serve, `keys::valid_user_id`): a reload grant would replace
/// the grant a pending claim or cold start is about to use, and the user's
/// next worker seals the stored blob anyway. `credentials rotate` and
/// `leasehold dev`'s order flow send every reload through here.
pub async fn reload_credentials(bus: &dyn PoolBus, user_id: &str) -> Result<bool, BusError> {
    // Before any key is built from it: `-1:w7` would name pool worker w7's mark.
    if !keys::valid_user_id(user_id) || !bus.user_is_active(user_id).await? {
        return Ok(false);
    }
    // Before the push: the worker asks the sealer as soon as it takes it.
    grant_credentials(bus, user_id, &new_grant(GrantReason::Reload)).await?;
    bus.push_control(user_id, RELOAD_CREDENTIALS).await?;
    Ok(true)
}

/// The `reload_credentials` control message (docs/messages.md); send it
/// with [`reload_credentials`], which grants first.
pub const RELOAD_CREDENTIALS: &str = r#"{"type": "reload_credentials"}"#;

impl Reconciled {
    /// The line `pool-manager` prints after a pass toward `target`.
    pub fn summary(&self, target: usize) -> String {
        format!(
            "pool: idle {} target {target} started {} stopped {}",
            self.idle,
            self.started.len(),
            self.stopped.len()
        )
    }
}

/// Polls `pool:claim:{claim_id}` every `poll` until it exists or `timeout`
/// has passed (`None`). A missing outcome means pending, never failed: the
/// claim may still be waiting for an idle pool worker.
pub async fn wait_for_outcome(
    bus: &dyn Inspect,
    claim_id: &str,
    timeout: Duration,
    poll: Duration,
) -> Result<Option<Result<ClaimOutcome, ParseError>>, BusError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(outcome) = bus.claim_outcome(claim_id).await? {
            return Ok(Some(outcome));
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(poll).await;
    }
}

/// What `leasehold claim` learned by the end of its wait.
#[derive(Debug, Clone)]
pub enum ClaimWait {
    /// The user had a worker already: nothing was waited for.
    AlreadyActive,
    /// A pool worker settled the claim: its outcome as stored.
    Outcome {
        /// The claim's id.
        claim_id: String,
        /// Claimed or failed, by whom.
        outcome: ClaimOutcome,
    },
    /// After a cold start, the user's mark appeared.
    Active,
    /// Nothing was known within the timeout: pending, never failed.
    Pending,
}

/// Why the wait for a claim could not tell.
#[derive(Debug, thiserror::Error)]
pub enum ClaimWaitError {
    /// The outcome key could not be read.
    #[error("cannot read the claim outcome")]
    Outcome(#[source] BusError),
    /// The outcome key holds something else.
    #[error("{key} is not a claim outcome: {error}")]
    Malformed {
        /// `pool:claim:{claim_id}`.
        key: String,
        /// What is wrong with it (fields, never values).
        error: ParseError,
    },
    /// The user's mark could not be read.
    #[error("cannot read the user's mark")]
    Mark(#[source] BusError),
}

/// Waits up to `timeout` for what `path` leads to, polling every `poll`: a
/// pool claim's outcome key, or after a cold start the user's mark (a cold
/// start has no claim message, so no outcome key).
pub async fn wait_for_claim(
    bus: &dyn PoolBus,
    path: &ClaimPath,
    user_id: &str,
    timeout: Duration,
    poll: Duration,
) -> Result<ClaimWait, ClaimWaitError> {
    match path {
        ClaimPath::AlreadyActive => Ok(ClaimWait::AlreadyActive),
        ClaimPath::PoolClaim { claim_id } => {
            let outcome = wait_for_outcome(bus, claim_id, timeout, poll)
                .await
                .map_err(ClaimWaitError::Outcome)?;
            match outcome {
                None => Ok(ClaimWait::Pending),
                Some(parsed) => Ok(ClaimWait::Outcome {
                    claim_id: claim_id.clone(),
                    outcome: parsed.map_err(|error| ClaimWaitError::Malformed {
                        key: keys::claim_outcome(claim_id),
                        error,
                    })?,
                }),
            }
        }
        ClaimPath::ColdStart { .. } => {
            let deadline = tokio::time::Instant::now() + timeout;
            while !bus
                .user_is_active(user_id)
                .await
                .map_err(ClaimWaitError::Mark)?
            {
                if tokio::time::Instant::now() >= deadline {
                    return Ok(ClaimWait::Pending);
                }
                tokio::time::sleep(poll).await;
            }
            Ok(ClaimWait::Active)
        }
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
    /// Pool workers chosen to stop that refused retirement (they took a
    /// claim after the idle read): left running.
    pub busy: Vec<String>,
}

/// One pool-manager pass: start or stop pool workers to reach `target`.
pub async fn reconcile(
    bus: &dyn MarkBus,
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
    // Only a worker retired on the bus is stopped: one that took a claim
    // since the read is busy, refuses the retirement, and the next is tried.
    let mut extras: Vec<(String, MarkValue)> = idle
        .into_iter()
        .filter_map(|(worker, mark)| Some((worker, mark?)))
        .collect();
    extras.sort_by_key(|(_, mark)| std::cmp::Reverse(mark.started_at));
    let mut surplus = outcome.idle.saturating_sub(target);
    for (worker_id, mark) in extras {
        if surplus == 0 {
            break;
        }
        if !bus.retire_idle(&worker_id).await? {
            outcome.busy.push(worker_id);
            continue;
        }
        surplus -= 1;
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::launcher::testing::ScriptedLauncher;
    use leasehold_pool::bus::memory::{MemoryPoolBus, SnapshotRead};
    use leasehold_pool::bus::{Inspect, Take};
    use leasehold_pool::bus::{MarkBus, PoolBus};
    use leasehold_telemetry::RecordingSink;
    use tokio_util::sync::CancellationToken;

    async fn pool_worker(bus: &MemoryPoolBus, worker: &str, started_at: u64) {
        let mark = MarkValue {
            worker_id: worker.into(),
            task_id: format!("task-{worker}"),
            user_id: keys::POOL_USER_ID.into(),
            heartbeat_at: 1,
            started_at,
            sidecar_url: None,
            ttl_ms: None,
            heartbeat_interval_ms: None,
            seal_key: None,
        };
        assert!(
            bus.set_pool_mark(worker, &mark.to_json(), Duration::from_secs(30))
                .await
                .unwrap()
        );
    }

    /// Guard: retire before stop. The worker chosen to stop takes a claim
    /// between the manager's idle read and its stop: it refuses retirement,
    /// keeps its claim and runs on; the next idle worker is stopped instead.
    #[tokio::test]
    async fn scale_down_never_stops_a_worker_that_took_a_claim() {
        let bus = Arc::new(MemoryPoolBus::new());
        pool_worker(&bus, "w-old", 1).await;
        pool_worker(&bus, "w-new", 2).await;
        let hooked = bus.clone();
        bus.after_read(SnapshotRead::IdleWorkers, 1, move || {
            Box::pin(async move {
                hooked.push_claim("claim-for-w-new").await.unwrap();
                let taken = hooked
                    .take_claim("w-new", Duration::from_secs(1), &CancellationToken::new())
                    .await
                    .unwrap();
                assert!(matches!(taken, Take::Claim(_)));
            })
        });
        let launcher = ScriptedLauncher::default();
        let outcome = reconcile(bus.as_ref(), &launcher, 1, &RecordingSink::new())
            .await
            .unwrap();
        assert_eq!(outcome.idle, 2);
        assert_eq!(outcome.busy, ["w-new"]);
        assert_eq!(outcome.stopped, ["task-w-old"]);
        assert_eq!(launcher.stopped(), ["task-w-old"]);
        assert_eq!(
            bus.list_items(&keys::claims_processing("w-new"))
                .await
                .unwrap(),
            ["claim-for-w-new"],
            "the busy worker keeps its claim"
        );
        // The stopped one was retired first: it would take no claim.
        assert_eq!(
            bus.take_claim(
                "w-old",
                Duration::from_millis(10),
                &CancellationToken::new()
            )
            .await
            .unwrap(),
            Take::Retired
        );
        assert!(idle_pool_workers(bus.as_ref()).await.unwrap().is_empty());
    }

    /// `leasehold claim`'s wait: pending until the outcome key appears, then
    /// the outcome; a key holding something else is an error naming the key.
    #[tokio::test(start_paused = true)]
    async fn a_claim_wait_reports_pending_then_the_outcome() {
        let bus = MemoryPoolBus::new();
        let path = ClaimPath::PoolClaim {
            claim_id: "c1".into(),
        };
        let (timeout, poll) = (Duration::from_secs(1), Duration::from_millis(50));
        let wait = wait_for_claim(&bus, &path, "u1", timeout, poll);
        assert!(matches!(wait.await.unwrap(), ClaimWait::Pending));
        let stored = ClaimOutcome::claimed("w1").to_json();
        let key = keys::claim_outcome("c1");
        assert!(bus.set_if_absent(&key, &stored, timeout).await.unwrap());
        match wait_for_claim(&bus, &path, "u1", timeout, poll)
            .await
            .unwrap()
        {
            ClaimWait::Outcome { claim_id, outcome } => {
                assert_eq!(
                    (claim_id.as_str(), outcome.worker_id.as_str()),
                    ("c1", "w1")
                );
            }
            other => panic!("{other:?}"),
        }
        let path = ClaimPath::PoolClaim {
            claim_id: "c2".into(),
        };
        let key = keys::claim_outcome("c2");
        assert!(bus.set_if_absent(&key, "{}", timeout).await.unwrap());
        let err = wait_for_claim(&bus, &path, "u1", timeout, poll)
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("{key} is not a claim outcome")),
            "{err}"
        );
        let cold = ClaimPath::ColdStart {
            task_id: "t1".into(),
        };
        let wait = wait_for_claim(&bus, &cold, "u1", timeout, poll);
        assert!(matches!(wait.await.unwrap(), ClaimWait::Pending));
    }
}
