//! Supervision: a user whose worker died while work is pending gets a new one.
//!
//! The original broker-pool specification has the orchestrator restart a
//! failed worker within 60 s. Here a user is *unserved* when it has work (a
//! non-empty `trading:user:{id}:requests` or `…:processing`, or the optional
//! `pool:wanted:{id}` mark) and no live worker: no `worker:active:{id}`, or a
//! mark naming a task the launcher no longer runs (`kill -9`, OOM). Such a
//! user is re-served through the claim path (an idle pool worker is claimed,
//! else a worker is cold-started), at most once per lock period: the lock
//! `pool:reserve:{id}` (`SET NX EX`) is what keeps a user to one pending
//! re-serve, and what the dashboard lists as "being re-served".

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use leasehold_control::clock::unix_ms;
use leasehold_pool::bus::PoolBus;
use leasehold_pool::keys;
use leasehold_pool::protocol::MarkValue;
use leasehold_telemetry::{ReservePath, TelemetryEvent, TelemetrySink};

use crate::launcher::TaskLauncher;
use crate::manager::{self, ClaimPath, PoolError};

/// Supervision settings.
#[derive(Debug, Clone, Copy)]
pub struct SuperviseConfig {
    /// How long a user's re-serve lock holds: no second re-serve for the user
    /// starts within it, and a failed one is retried after it.
    pub lock: Duration,
    /// Only report.
    pub dry_run: bool,
}

/// What one supervision pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Supervised {
    /// Users with work and no live worker.
    pub unserved: Vec<String>,
    /// Users given a worker in this pass, with the path taken.
    pub reserved: Vec<(String, ClaimPath)>,
    /// Failures (no secrets).
    pub errors: Vec<String>,
}

/// Users with work waiting: queued or in-flight requests, or a "wants a
/// worker" mark.
async fn users_with_work(bus: &dyn PoolBus) -> Result<BTreeSet<String>, PoolError> {
    let mut users = BTreeSet::new();
    for pattern in [
        keys::USER_REQUESTS_PATTERN,
        keys::USER_PROCESSING_PATTERN,
        keys::USER_WANTED_PATTERN,
    ] {
        for key in bus.scan_keys(pattern).await? {
            // Empty lists do not exist in Redis; a key is work.
            if let Some(user) = keys::user_in(pattern, &key) {
                users.insert(user);
            }
        }
    }
    Ok(users)
}

/// One pass: find unserved users and re-serve each (unless dry run).
pub async fn supervise(
    bus: &dyn PoolBus,
    launcher: &dyn TaskLauncher,
    config: &SuperviseConfig,
    telemetry: &dyn TelemetrySink,
) -> Result<Supervised, PoolError> {
    let mut outcome = Supervised::default();
    let users = users_with_work(bus).await?;
    if users.is_empty() {
        return Ok(outcome);
    }
    let running: BTreeSet<String> = launcher
        .list()
        .await?
        .into_iter()
        .map(|task| task.task_id)
        .collect();
    for user in users {
        let mark = bus.get(&keys::worker_active(&user)).await?;
        // A mark whose task is gone is a dead worker (its TTL has not run out
        // yet); one that is not leasehold's JSON is left to the sweep.
        let dead_holder = match mark.as_deref().map(MarkValue::parse) {
            None => None,
            Some(Some(mark)) if !running.contains(&mark.task_id) => Some(mark.worker_id),
            Some(_) => {
                // Served: a "wants a worker" mark has done its job.
                bus.delete_keys(&[keys::user_wanted(&user)]).await?;
                continue;
            }
        };
        outcome.unserved.push(user.clone());
        if config.dry_run {
            continue;
        }
        let now = unix_ms(SystemTime::now()).to_string();
        if !bus
            .set_if_absent(&keys::reserve_lock(&user), &now, config.lock)
            .await?
        {
            // A re-serve for this user is pending already.
            continue;
        }
        if let Some(worker_id) = dead_holder {
            // Guarded: only that worker's mark goes, never a new holder's.
            bus.release_user_mark(&user, &worker_id).await?;
        }
        match manager::claim_user(bus, launcher, &user).await {
            Ok(path) => {
                let label = match &path {
                    ClaimPath::PoolClaim { .. } => Some(ReservePath::PoolClaim),
                    ClaimPath::ColdStart { .. } => Some(ReservePath::ColdStart),
                    ClaimPath::AlreadyActive => None,
                };
                if let Some(path) = label {
                    telemetry.emit(TelemetryEvent::UserReserved {
                        user_id: user.clone(),
                        path,
                    });
                }
                outcome.reserved.push((user, path));
            }
            // The lock stays: the next attempt comes after it expires.
            Err(err) => outcome.errors.push(format!("re-serve {user}: {err}")),
        }
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launcher::{LaunchError, RunningTask};
    use async_trait::async_trait;
    use leasehold_pool::bus::Inspect;
    use leasehold_pool::bus::memory::MemoryPoolBus;
    use leasehold_telemetry::RecordingSink;
    use std::sync::Mutex;

    /// Runs what the test says; records cold starts.
    #[derive(Default)]
    struct Launcher {
        running: Mutex<Vec<String>>,
        started: Mutex<Vec<Option<String>>>,
    }

    #[async_trait]
    impl TaskLauncher for Launcher {
        async fn start(&self, user_id: Option<&str>) -> Result<String, LaunchError> {
            self.started
                .lock()
                .unwrap()
                .push(user_id.map(str::to_owned));
            Ok("cold-1".into())
        }
        async fn stop(&self, _: &str, _: &str) -> Result<(), LaunchError> {
            Ok(())
        }
        async fn list(&self) -> Result<Vec<RunningTask>, LaunchError> {
            Ok(self
                .running
                .lock()
                .unwrap()
                .iter()
                .map(|task_id| RunningTask {
                    task_id: task_id.clone(),
                    started_at: 0,
                    user_id: None,
                })
                .collect())
        }
    }

    fn mark(user: &str, task: &str) -> String {
        MarkValue {
            worker_id: task.into(),
            task_id: task.into(),
            user_id: user.into(),
            heartbeat_at: 1,
            started_at: 1,
            sidecar_url: None,
        }
        .to_json()
    }

    const CONFIG: SuperviseConfig = SuperviseConfig {
        lock: Duration::from_secs(60),
        dry_run: false,
    };

    #[tokio::test(start_paused = true)]
    async fn a_user_whose_worker_died_with_requests_is_reserved_once_per_lock() {
        let bus = MemoryPoolBus::new();
        let launcher = Launcher::default();
        let telemetry = RecordingSink::new();
        bus.put_credentials("u1", "blob").await.unwrap();
        bus.push_request("u1", "r1").await.unwrap();
        // u1's worker was killed: its mark outlives it, naming a task that is gone.
        bus.set_pool_mark("idle", &mark("-1", "idle"), Duration::from_secs(30))
            .await
            .unwrap();
        launcher.running.lock().unwrap().push("idle".into());
        let write = leasehold_pool::bus::MarkWrite {
            user_id: "u1",
            worker_id: "dead",
            value: &mark("u1", "dead"),
            ttl: Duration::from_secs(30),
            metadata: &leasehold_pool::bus::WorkerMetadata {
                task_arn: "dead".into(),
                instance_id: "h".into(),
                launched_at: 1,
                sidecar_url: None,
            },
        };
        assert!(bus.claim_user(&write).await.unwrap());
        let first = supervise(&bus, &launcher, &CONFIG, &telemetry)
            .await
            .unwrap();
        assert_eq!(first.unserved, ["u1"]);
        assert!(
            matches!(first.reserved[..], [(_, ClaimPath::PoolClaim { .. })]),
            "{first:?}"
        );
        assert!(
            !bus.user_is_active("u1").await.unwrap(),
            "the dead mark is gone"
        );
        assert_eq!(bus.list_len(keys::POOL_CLAIMS).await.unwrap(), 1);
        assert!(matches!(
            telemetry.snapshot()[..],
            [TelemetryEvent::UserReserved {
                path: ReservePath::PoolClaim,
                ..
            }]
        ));
        // Nobody took it yet: no second claim while the lock holds…
        tokio::time::advance(Duration::from_secs(30)).await;
        let second = supervise(&bus, &launcher, &CONFIG, &telemetry)
            .await
            .unwrap();
        assert_eq!(second.unserved, ["u1"]);
        assert!(second.reserved.is_empty());
        assert_eq!(bus.list_len(keys::POOL_CLAIMS).await.unwrap(), 1);
        // …and one more once it expired. No idle worker now: a cold start.
        bus.delete_pool_mark("idle").await.unwrap();
        tokio::time::advance(Duration::from_secs(31)).await;
        let third = supervise(&bus, &launcher, &CONFIG, &telemetry)
            .await
            .unwrap();
        assert!(
            matches!(third.reserved[..], [(_, ClaimPath::ColdStart { .. })]),
            "{third:?}"
        );
        assert_eq!(*launcher.started.lock().unwrap(), [Some("u1".to_owned())]);
    }

    #[tokio::test(start_paused = true)]
    async fn served_and_idle_users_are_left_alone_and_a_want_is_met() {
        let bus = MemoryPoolBus::new();
        let launcher = Launcher::default();
        let telemetry = RecordingSink::new();
        launcher.running.lock().unwrap().push("t1".into());
        let metadata = leasehold_pool::bus::WorkerMetadata {
            task_arn: "t1".into(),
            instance_id: "h".into(),
            launched_at: 1,
            sidecar_url: None,
        };
        let value = mark("u1", "t1");
        let write = leasehold_pool::bus::MarkWrite {
            user_id: "u1",
            worker_id: "t1",
            value: &value,
            ttl: Duration::from_secs(30),
            metadata: &metadata,
        };
        assert!(bus.claim_user(&write).await.unwrap());
        bus.push_request("u1", "r1").await.unwrap();
        bus.set_if_absent(&keys::user_wanted("u1"), "1", Duration::from_secs(300))
            .await
            .unwrap();
        let pass = supervise(&bus, &launcher, &CONFIG, &telemetry)
            .await
            .unwrap();
        assert_eq!(pass, Supervised::default());
        assert_eq!(bus.get(&keys::user_wanted("u1")).await.unwrap(), None);
        // A user who only wants a worker (no requests yet) gets one.
        bus.put_credentials("u2", "blob").await.unwrap();
        bus.set_if_absent(&keys::user_wanted("u2"), "1", Duration::from_secs(300))
            .await
            .unwrap();
        let pass = supervise(&bus, &launcher, &CONFIG, &telemetry)
            .await
            .unwrap();
        assert_eq!(pass.unserved, ["u2"]);
        assert!(matches!(
            pass.reserved[..],
            [(_, ClaimPath::ColdStart { .. })]
        ));
        assert!(telemetry.snapshot().len() == 1);
    }
}
