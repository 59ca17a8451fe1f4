//! Supervision: a user whose worker died while work is pending gets a new one.
//!
//! The original broker-pool specification has the orchestrator restart a
//! failed worker within 60 s. Here a user is *unserved* when it has work (a
//! non-empty `trading:user:{id}:requests` or `…:processing`, or the optional
//! `pool:wanted:{id}` mark) and no live worker: no `worker:active:{id}`, or a
//! mark whose holder is dead (`kill -9`, OOM). Such a user is re-served
//! through the claim path (an idle pool worker is claimed, else a worker is
//! cold-started), at most once per lock period: the lock `pool:reserve:{id}`
//! (`SET NX EX`) is what keeps a user to one pending re-serve, and what the
//! dashboard lists as "being re-served".
//!
//! Releasing a holder's mark displaces it, so supervision takes it under the
//! same guard rails as the maintenance sweep:
//!
//! - **Redis says the holder is dead, never a listing alone**: a holder is
//!   dead only when its mark was not refreshed (remaining TTL below
//!   TTL − 2 × heartbeat, by the TTL and heartbeat the mark carries), *and*
//!   its task is missing from the launcher's listing. A listing that misses a
//!   task (a wrong `POOL_GROUP`, an eventually consistent API) displaces
//!   nobody whose mark is fresh;
//! - **a second look**: marks and tasks are read twice, a heartbeat and a half
//!   apart; the holder is dead only if both looks agree on an unchanged mark
//!   and a task missing from both listings;
//! - **compare-and-delete**: the mark is released only while it still holds
//!   the value both looks saw (a refresh or a new claim since then wins);
//! - **the safety valve** (`SWEEP_MAX_FRACTION`): when more than that share of
//!   the marks would be released, the pass releases none and says why.
//!
//! A user without any mark displaces nobody: it is re-served at once.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use leasehold_control::clock::{Clock, SystemClock};
use leasehold_pool::bus::{Inspect, PoolBus};
use leasehold_pool::keys;
use leasehold_pool::read::Finding;
use leasehold_pool::state::PoolState;
use leasehold_telemetry::{OrphanKind, ReservePath, TelemetryEvent, TelemetrySink};

use crate::launcher::{RunningTask, TaskLauncher};
use crate::maintenance::{self, Mark, MarkTiming, SweepConfig};
use crate::manager::{self, ClaimPath, PoolError};

/// Supervision settings.
#[derive(Debug, Clone, Copy)]
pub struct SuperviseConfig {
    /// How long a user's re-serve lock holds: no second re-serve for the user
    /// starts within it, and a failed one is retried after it.
    pub lock: Duration,
    /// Only report.
    pub dry_run: bool,
    /// The mark TTL and heartbeat assumed for marks that do not carry theirs
    /// (`WORKER_MARK_TTL_SECONDS`, `WORKER_HEARTBEAT_MS`).
    pub fallback: MarkTiming,
    /// The safety valve: above this share of the marks looking dead, release
    /// none (`SWEEP_MAX_FRACTION`).
    pub max_fraction: f64,
}

impl SuperviseConfig {
    /// Supervision with the sweep's settings: its mark TTL and valve, this
    /// `lock` and `heartbeat` (`WORKER_HEARTBEAT_MS`).
    pub fn for_sweep(sweep: &SweepConfig, lock: Duration, heartbeat: Duration) -> Self {
        SuperviseConfig {
            lock,
            dry_run: sweep.dry_run,
            fallback: MarkTiming {
                ttl: sweep.mark_ttl,
                heartbeat,
            },
            max_fraction: sweep.max_fraction,
        }
    }
}

/// What one supervision pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Supervised {
    /// Users with work and no live worker.
    pub unserved: Vec<String>,
    /// Users given a worker in this pass, with the path taken.
    pub reserved: Vec<(String, ClaimPath)>,
    /// Users whose mark looked unrefreshed at the first look but whose holder
    /// the second look did not confirm dead (refreshed, re-claimed, or its
    /// task listed): left alone.
    pub unconfirmed: Vec<String>,
    /// Why the safety valve kept this pass from releasing any mark, if it did.
    pub held: Option<String>,
    /// Failures (no secrets).
    pub errors: Vec<String>,
}

/// Users with work waiting: queued or in-flight requests, or a "wants a
/// worker" mark.
async fn users_with_work(bus: &dyn Inspect) -> Result<BTreeSet<String>, PoolError> {
    Ok(bus.users_with_work().await?)
}

/// How one look sees a user's mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// No mark: nobody serves the user.
    Absent,
    /// A mark Redis says was refreshed lately (or one supervision does not
    /// judge: unreadable or without a TTL, left to the sweep): served.
    Live,
    /// A readable mark whose remaining TTL says it was not refreshed: its
    /// holder may be dead, which only a second look can confirm.
    NotRefreshed,
}

/// How `mark` looks (pure): by its remaining TTL against the TTL and
/// heartbeat it carries (`fallback` where it carries none).
pub fn holder(mark: Option<&Mark>, fallback: MarkTiming) -> Holder {
    let Some(mark) = mark else {
        return Holder::Absent;
    };
    match (&mark.value, mark.ttl_ms) {
        (Some(value), Some(remaining)) if !MarkTiming::of(value, fallback).refreshed(remaining) => {
            Holder::NotRefreshed
        }
        _ => Holder::Live,
    }
}

/// One look: the launcher's tasks, then the marks.
pub struct Look {
    /// Every task the launcher listed.
    pub tasks: Vec<RunningTask>,
    /// Every liveness mark (pool and user), with its remaining TTL.
    pub marks: Vec<Mark>,
}

impl Look {
    fn user_mark(&self, user: &str) -> Option<&Mark> {
        let key = keys::worker_active(user);
        self.marks.iter().find(|mark| mark.key == key)
    }

    fn runs(&self, task_id: &str) -> bool {
        self.tasks.iter().any(|task| task.task_id == task_id)
    }
}

/// The suspects' marks both looks confirm dead (pure): in both, the same
/// unrefreshed value, naming a task neither listing has. With the value to
/// compare before releasing it.
pub fn dead_holders(
    suspects: &[String],
    first: &Look,
    second: &Look,
    fallback: MarkTiming,
) -> BTreeMap<String, String> {
    suspects
        .iter()
        .filter_map(|user| {
            let before = first.user_mark(user)?;
            let after = second.user_mark(user)?;
            let unchanged = before.raw == after.raw;
            let not_refreshed = [before, after]
                .iter()
                .all(|mark| holder(Some(mark), fallback) == Holder::NotRefreshed);
            let task = &after.value.as_ref()?.task_id;
            let gone = !first.runs(task) && !second.runs(task);
            (unchanged && not_refreshed && gone).then(|| (user.clone(), after.raw.clone()))
        })
        .collect()
}

/// How long the second look waits: a heartbeat and a half of the slowest
/// suspect's writer.
fn second_look(suspects: &[String], first: &Look, fallback: MarkTiming) -> Duration {
    suspects
        .iter()
        .filter_map(|user| first.user_mark(user)?.value.as_ref())
        .map(|value| MarkTiming::of(value, fallback).second_look())
        .max()
        .unwrap_or_else(|| fallback.second_look())
}

/// The second look (only taken when some mark looks unrefreshed): tasks,
/// then the wait, then tasks and marks again. `marks` are the first look's.
async fn look_twice(
    bus: &dyn PoolBus,
    launcher: &dyn TaskLauncher,
    marks: Vec<Mark>,
    suspects: &[String],
    fallback: MarkTiming,
) -> Result<(Look, Look), PoolError> {
    // A failed listing (ECS DescribeTasks failures included) fails the pass:
    // an empty or partial list would make every suspect's task look gone.
    let first = Look {
        tasks: launcher.list().await?,
        marks,
    };
    tokio::time::sleep(second_look(suspects, &first, fallback)).await;
    let tasks = launcher.list().await?;
    let second = Look {
        tasks,
        marks: maintenance::read_marks(bus).await?,
    };
    Ok((first, second))
}

/// One pass of `maintenance --every`'s supervision between sweeps: the
/// re-queue of dead pool workers' claims (not in a dry run), then
/// [`supervise`]. Failures are logged, never fatal: the next pass tries
/// again. Returns the lines the command prints: each user re-served and by
/// which path, then why the pass held back, if it did.
pub async fn supervision_pass(
    bus: &dyn PoolBus,
    launcher: &dyn TaskLauncher,
    config: &SuperviseConfig,
    dry_run: bool,
    telemetry: &dyn TelemetrySink,
) -> Vec<String> {
    if !dry_run && let Err(err) = crate::worker::requeue_dead_claims(bus).await {
        tracing::warn!(error = %err, "re-queue of dead pool workers' claims failed");
    }
    match supervise(bus, launcher, config, telemetry).await {
        Ok(pass) => {
            for error in &pass.errors {
                tracing::warn!(error, "supervision");
            }
            let reserved = pass.reserved.iter();
            let lines = reserved.map(|(user, path)| format!("supervise {user}: {path}"));
            let held = pass
                .held
                .iter()
                .map(|reason| format!("supervise held: {reason}"));
            lines.chain(held).collect()
        }
        Err(err) => {
            tracing::warn!(error = %err, "supervision pass failed");
            Vec::new()
        }
    }
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
    let marks = maintenance::read_marks(bus).await?;
    let first = Look {
        tasks: Vec::new(),
        marks,
    };
    let mut absent = Vec::new();
    let mut suspects = Vec::new();
    for user in users {
        match holder(first.user_mark(&user), config.fallback) {
            Holder::Absent => absent.push(user),
            Holder::NotRefreshed => suspects.push(user),
            // Served: a "wants a worker" mark has done its job.
            Holder::Live => {
                bus.delete_keys(&[keys::user_wanted(&user)]).await?;
            }
        }
    }
    let mut dead = BTreeMap::new();
    if !suspects.is_empty() {
        let (first, second) =
            look_twice(bus, launcher, first.marks, &suspects, config.fallback).await?;
        dead = dead_holders(&suspects, &first, &second, config.fallback);
        let findings: Vec<Finding> = dead
            .keys()
            .map(|user| Finding {
                kind: OrphanKind::OrphanMark,
                user_id: Some(user.clone()),
                delete_key: Some(keys::worker_active(user)),
                stop_task: None,
            })
            .collect();
        outcome.held = maintenance::valve(
            &findings,
            second.marks.len(),
            second.tasks.len(),
            config.max_fraction,
        );
        let confirmed: HashSet<&String> = dead.keys().collect();
        outcome.unconfirmed = suspects
            .iter()
            .filter(|user| !confirmed.contains(user))
            .cloned()
            .collect();
        if let Some(reason) = &outcome.held {
            tracing::error!(reason, "supervision held by its safety valve");
            dead.clear();
        }
    }
    let mut unserved: Vec<(String, Option<String>)> =
        absent.into_iter().map(|user| (user, None)).collect();
    unserved.extend(dead.into_iter().map(|(user, raw)| (user, Some(raw))));
    unserved.sort();
    for (user, dead_mark) in unserved {
        if config.dry_run {
            outcome.unserved.push(user);
            continue;
        }
        let now = SystemClock.now_ms().to_string();
        if !bus
            .set_if_absent(&keys::reserve_lock(&user), &now, config.lock)
            .await?
        {
            // A re-serve for this user is pending already.
            outcome.unserved.push(user);
            continue;
        }
        if let Some(seen) = dead_mark {
            // Only the value both looks saw goes: a refresh or a new holder's
            // claim since then keeps the mark, and the user is served.
            let released = bus
                .delete_mark_if(
                    &keys::worker_active(&user),
                    &seen,
                    &[keys::worker_metadata(&user)],
                )
                .await?;
            if !released {
                bus.delete_keys(&[keys::reserve_lock(&user)]).await?;
                outcome.unconfirmed.push(user);
                continue;
            }
        }
        outcome.unserved.push(user.clone());
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
mod tests;
