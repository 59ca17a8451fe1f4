//! The maintenance sweep (the original broker-pool specification's "orphan detection"): the liveness marks on
//! the pool bus compared with the launcher's running tasks.
//!
//! | kind | found when | resolved by |
//! |---|---|---|
//! | orphan mark | a mark names a task that is not running | deleting the mark (and metadata), if unchanged |
//! | orphan task | a task older than the grace period has no mark | stopping the task |
//! | stale mark | a mark without a TTL, with a TTL longer than its writer gives it, or unreadable | deleting it, if unchanged, and stopping its task |
//! | duplicate worker | two tasks for one user | stopping every task but the mark holder |
//!
//! It also puts back in `pool:claims` the claims a dead pool worker had taken
//! into its processing list and not settled.
//!
//! A sweep never harms a healthy worker:
//!
//! - **two snapshots**: tasks, then marks, then tasks and marks again; only a
//!   finding present in both, on an unchanged mark, is acted on (a task that
//!   starts between listing tasks and reading marks is listed the second time);
//!   the second is taken at least one heartbeat and a half after the first
//!   (the heartbeat the marks carry, else `WORKER_HEARTBEAT_MS`), so a live
//!   worker has rewritten its mark in between and no finding on it is confirmed;
//! - **each mark judged by its own TTL**: a mark says the TTL its writer gives
//!   it, so a sweeper configured with another `WORKER_MARK_TTL_SECONDS` never
//!   takes a fresh mark for a stale one (marks that do not say are judged by
//!   this process's setting);
//! - **compare-and-delete**: a mark is deleted in one step only while it still
//!   holds the value the snapshots saw (a claim or heartbeat since then wins);
//! - **the pool bus's clock**: ages (the grace period) are measured against
//!   Redis `TIME`, staleness by Redis's own TTLs, never by this host's clock;
//! - **a safety valve**: when more than `SWEEP_MAX_FRACTION` of the marks or
//!   of the tasks look orphaned (a wrong `POOL_GROUP`, a launcher that lists
//!   nothing), the sweep reports and acts on nothing;
//! - **duplicates** keep the task that holds the user's mark.
//!
//! [`classify`] is a pure function of (marks, tasks, now); [`sweep`] gathers the
//! inputs, resolves findings in batches of 100 with bounded concurrency, and
//! writes the report to `maintenance:last_report`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use futures_util::StreamExt;
use leasehold_pool::keys;
use leasehold_telemetry::{OrphanKind, TelemetryEvent, TelemetrySink};

use crate::launcher::{RunningTask, TaskLauncher};
use crate::manager::PoolError;
use crate::supervise::SuperviseConfig;
use leasehold_pool::bus::{BusError, Inspect, MarkBus, PoolBus};
use leasehold_pool::protocol::MarkValue;
pub use leasehold_pool::read::{Finding, SweepReport};

/// `SWEEP_MAX_FRACTION`'s default.
pub const DEFAULT_MAX_FRACTION: f64 = 0.2;

/// A mark's TTL may exceed the configured mark TTL by this much (whole-second
/// rounding, a worker configured a little differently) before it is stale.
const TTL_SLACK: Duration = Duration::from_secs(5);

/// The longest a second look waits, whatever heartbeat a mark claims.
pub const MAX_SECOND_LOOK: Duration = Duration::from_secs(300);

/// How a mark is kept alive: the TTL its writer gives it and how often the
/// writer refreshes it. Read from the mark itself; marks written before they
/// carried it get this process's own settings (`WORKER_MARK_TTL_SECONDS`,
/// `WORKER_HEARTBEAT_MS`), the `fallback`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MarkTiming {
    /// The TTL the writer sets on every refresh.
    pub ttl: Duration,
    /// How often the writer refreshes the mark.
    pub heartbeat: Duration,
}

impl MarkTiming {
    /// The timing `value` says it was written with, `fallback` where it does
    /// not say. A heartbeat is never longer than the TTL (a writer refreshing
    /// less often than its mark lives is no writer to wait for).
    pub fn of(value: &MarkValue, fallback: MarkTiming) -> MarkTiming {
        let ttl = value
            .ttl_ms
            .map(Duration::from_millis)
            .unwrap_or(fallback.ttl);
        let heartbeat = value
            .heartbeat_interval_ms
            .map(Duration::from_millis)
            .unwrap_or(fallback.heartbeat);
        MarkTiming {
            ttl,
            heartbeat: heartbeat.min(ttl),
        }
    }

    /// Whether Redis says the mark was refreshed lately: a remaining TTL of at
    /// least TTL − 2 × heartbeat. A live writer's mark never drops below
    /// TTL − heartbeat; one more heartbeat of slack absorbs a late refresh.
    /// How the mark looks in a task listing has no part in it.
    pub fn refreshed(&self, remaining_ms: u64) -> bool {
        let slack = millis(self.heartbeat).saturating_mul(2);
        remaining_ms >= millis(self.ttl).saturating_sub(slack)
    }

    /// How long a second look waits after the first: a heartbeat and a half,
    /// so a live writer's refresh (its write may be slow to land) falls
    /// between the two reads and changes the mark. At most
    /// [`MAX_SECOND_LOOK`]: a mark claiming an absurd heartbeat must not
    /// stall the sweep.
    pub fn second_look(&self) -> Duration {
        (self.heartbeat + self.heartbeat / 2).min(MAX_SECOND_LOOK)
    }
}

/// A duration as whole milliseconds, saturating.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The heartbeat assumed for marks that do not carry one when the caller
/// names none ([`sweep`]): `WORKER_HEARTBEAT_MS`'s default, or a third of
/// the mark TTL when that is shorter (a worker's heartbeat is always shorter
/// than its TTL).
pub fn default_heartbeat(mark_ttl: Duration) -> Duration {
    let default = crate::settings::WORKER_HEARTBEAT_MS
        .default_value()
        .unwrap_or(Duration::from_secs(5));
    default.min(mark_ttl / 3)
}

/// One `worker:active:…` key as the sweep reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// The key.
    pub key: String,
    /// `-1` for pool marks.
    pub user_id: String,
    /// The stored value, compared before a delete.
    pub raw: String,
    /// Parsed value (`None`: unreadable, e.g. a bare timestamp).
    pub value: Option<MarkValue>,
    /// Remaining TTL in ms (Redis `PTTL`); `None` when the key has no expiry.
    pub ttl_ms: Option<u64>,
}

/// Sweep settings.
#[derive(Debug, Clone, Copy)]
pub struct SweepConfig {
    /// Mark TTL assumed for marks that do not carry theirs: a mark with a
    /// longer remaining TTL than its own is stale.
    pub mark_ttl: Duration,
    /// Tasks younger than this (by the pool bus's clock) are not orphans yet.
    pub grace: Duration,
    /// Batches of 100 resolved at once.
    pub concurrency: usize,
    /// Only report.
    pub dry_run: bool,
    /// Also supervise (see [`crate::supervise`]) after resolving, with this
    /// re-serve lock; `None`: do not.
    pub supervise: Option<Duration>,
    /// The safety valve: above this share of marks or of tasks looking
    /// orphaned, act on nothing (`SWEEP_MAX_FRACTION`).
    pub max_fraction: f64,
}

fn user_of(key: &str) -> String {
    let rest = key.strip_prefix(keys::WORKER_ACTIVE_PREFIX).unwrap_or(key);
    match rest.strip_prefix("-1:") {
        Some(_) => keys::POOL_USER_ID.to_owned(),
        None => rest.to_owned(),
    }
}

/// Classifies marks and tasks into findings (pure). `now_ms` is the pool
/// bus's clock; marks are judged by their TTL alone (the heartbeat time in a
/// mark is the writer's clock, not comparable with any other), against the
/// TTL the mark says its writer gives it (`config.mark_ttl` when it does not
/// say).
pub fn classify(
    marks: &[Mark],
    tasks: &[RunningTask],
    now_ms: u64,
    config: &SweepConfig,
) -> Vec<Finding> {
    let running: HashMap<&str, &RunningTask> =
        tasks.iter().map(|t| (t.task_id.as_str(), t)).collect();
    let mut findings = Vec::new();
    let mut marked: HashSet<&str> = HashSet::new();
    // Tasks serving each user: launched for it, or named by its mark.
    let mut per_user: BTreeMap<&str, HashSet<&str>> = BTreeMap::new();
    // The task named by each user's (live) mark: the one a duplicate keeps.
    let mut holder: HashMap<&str, &str> = HashMap::new();
    for task in tasks {
        if let Some(user) = &task.user_id {
            per_user.entry(user).or_default().insert(&task.task_id);
        }
    }
    for mark in marks {
        let task_id = mark.value.as_ref().map(|v| v.task_id.as_str());
        if let Some(task_id) = task_id {
            marked.insert(task_id);
        }
        let user_id = Some(mark.user_id.clone());
        // Its own TTL, not this sweeper's: a worker configured with a longer
        // WORKER_MARK_TTL_SECONDS than the sweeper's writes fresh marks that
        // would otherwise look as if they never expire.
        let own_ttl_ms = mark
            .value
            .as_ref()
            .and_then(|value| value.ttl_ms)
            .unwrap_or_else(|| millis(config.mark_ttl));
        let longest_ttl_ms = own_ttl_ms.saturating_add(millis(TTL_SLACK));
        let stale = match mark.ttl_ms {
            None => true,
            Some(ttl) => ttl > longest_ttl_ms || mark.value.is_none(),
        };
        if stale {
            findings.push(Finding {
                kind: OrphanKind::StaleMark,
                user_id,
                delete_key: Some(mark.key.clone()),
                stop_task: task_id
                    .filter(|t| running.contains_key(t))
                    .map(str::to_owned),
            });
            continue;
        }
        match task_id {
            Some(task_id) if running.contains_key(task_id) => {
                if mark.user_id != keys::POOL_USER_ID {
                    per_user.entry(&mark.user_id).or_default().insert(task_id);
                    holder.insert(&mark.user_id, task_id);
                }
            }
            _ => findings.push(Finding {
                kind: OrphanKind::OrphanMark,
                user_id,
                delete_key: Some(mark.key.clone()),
                stop_task: None,
            }),
        }
    }
    let grace_ms = config.grace.as_millis() as u64;
    for task in tasks {
        let young = now_ms.saturating_sub(task.started_at) < grace_ms;
        let serving = task
            .user_id
            .as_deref()
            .is_some_and(|user| per_user.get(user).is_some_and(|set| set.len() > 1));
        if !marked.contains(task.task_id.as_str()) && !young && !serving {
            findings.push(Finding {
                kind: OrphanKind::OrphanTask,
                user_id: task.user_id.clone(),
                delete_key: None,
                stop_task: Some(task.task_id.clone()),
            });
        }
    }
    for (user, set) in per_user {
        if set.len() < 2 {
            continue;
        }
        let mut serving: Vec<&RunningTask> =
            set.iter().filter_map(|t| running.get(t).copied()).collect();
        serving.sort_by_key(|t| (t.started_at, t.task_id.clone()));
        // Keep the task that holds the user's mark: it serves the user and
        // the others cannot take it from it. Without a holder, the newest.
        let keep = holder
            .get(user)
            .copied()
            .or_else(|| serving.last().map(|t| t.task_id.as_str()));
        for other in serving.iter().filter(|t| Some(t.task_id.as_str()) != keep) {
            findings.push(Finding {
                kind: OrphanKind::DuplicateWorker,
                user_id: Some(user.to_owned()),
                delete_key: None,
                stop_task: Some(other.task_id.clone()),
            });
        }
    }
    findings
}

/// Why the safety valve held a sweep, if it did: more than `max_fraction`
/// of the marks, or of the tasks, would be deleted or stopped. A single
/// finding is always allowed (one dead worker in a pool of two is half the
/// pool).
pub fn valve(
    findings: &[Finding],
    marks: usize,
    tasks: usize,
    max_fraction: f64,
) -> Option<String> {
    let deleted: BTreeSet<&str> = findings
        .iter()
        .filter_map(|f| f.delete_key.as_deref())
        .collect();
    let stopped: BTreeSet<&str> = findings
        .iter()
        .filter_map(|f| f.stop_task.as_deref())
        .collect();
    let over = |affected: usize, total: usize| {
        affected > 1 && affected as f64 > max_fraction * total as f64
    };
    if over(deleted.len(), marks) {
        return Some(format!(
            "{} of {marks} marks look orphaned (more than SWEEP_MAX_FRACTION={max_fraction}): acting on nothing; check POOL_GROUP and the launcher",
            deleted.len()
        ));
    }
    if over(stopped.len(), tasks) {
        return Some(format!(
            "{} of {tasks} tasks look orphaned (more than SWEEP_MAX_FRACTION={max_fraction}): acting on nothing; check POOL_GROUP and the launcher",
            stopped.len()
        ));
    }
    None
}

/// Every liveness mark (pool and user) with its value and remaining TTL.
pub(crate) async fn read_marks(bus: &dyn Inspect) -> Result<Vec<Mark>, BusError> {
    let marks = bus.marks(keys::WORKER_ACTIVE_PATTERN).await?;
    Ok(marks
        .into_iter()
        .map(|mark| Mark {
            user_id: user_of(&mark.key),
            value: MarkValue::parse(&mark.value),
            raw: mark.value,
            ttl_ms: mark.ttl_ms,
            key: mark.key,
        })
        .collect())
}

/// One snapshot: tasks first, then marks, then the bus's clock.
struct Snapshot {
    tasks: Vec<RunningTask>,
    marks: Vec<Mark>,
    now: u64,
    findings: Vec<Finding>,
}

async fn snapshot(
    bus: &dyn Inspect,
    launcher: &dyn TaskLauncher,
    config: &SweepConfig,
) -> Result<Snapshot, PoolError> {
    let tasks = launcher.list().await?;
    let marks = read_marks(bus).await?;
    let now = bus.server_time_ms().await?;
    let findings = classify(&marks, &tasks, now, config);
    Ok(Snapshot {
        tasks,
        marks,
        now,
        findings,
    })
}

/// The findings of `first` that `second` confirms: the same finding, on a
/// mark holding the same value in both. With the mark's value to compare
/// before deleting.
fn confirmed(first: &Snapshot, second: &Snapshot) -> Vec<(Finding, Option<String>)> {
    let values = |snapshot: &Snapshot| -> HashMap<String, String> {
        snapshot
            .marks
            .iter()
            .map(|m| (m.key.clone(), m.raw.clone()))
            .collect()
    };
    let (before, after) = (values(first), values(second));
    first
        .findings
        .iter()
        .filter(|finding| second.findings.contains(finding))
        .filter_map(|finding| match &finding.delete_key {
            None => Some((finding.clone(), None)),
            Some(key) => {
                let seen = before.get(key)?;
                (after.get(key) == Some(seen)).then(|| (finding.clone(), Some(seen.clone())))
            }
        })
        .collect()
}

/// What resolving one finding did.
enum Resolved {
    Done,
    /// The mark changed since the snapshot: left alone, nothing stopped.
    Changed,
}

async fn resolve(
    finding: &Finding,
    seen: Option<&str>,
    bus: &dyn MarkBus,
    launcher: &dyn TaskLauncher,
) -> Result<Resolved, String> {
    if let (Some(key), Some(seen)) = (&finding.delete_key, seen) {
        let mut also = Vec::new();
        if let Some(user) = finding
            .user_id
            .as_deref()
            .filter(|u| *u != keys::POOL_USER_ID)
        {
            also.push(keys::worker_metadata(user));
        }
        let deleted = bus
            .delete_mark_if(key, seen, &also)
            .await
            .map_err(|err| format!("DEL {key}: {err}"))?;
        if !deleted {
            // A claim or heartbeat since the snapshot: the finding is stale,
            // and so is any stop that came with it.
            return Ok(Resolved::Changed);
        }
    }
    if let Some(task) = &finding.stop_task {
        launcher
            .stop(task, finding.kind.as_str())
            .await
            .map_err(|err| err.to_string())?;
    }
    Ok(Resolved::Done)
}

/// How long the second snapshot waits after the first: a heartbeat and a
/// half of the slowest writer among the marks the first snapshot's findings
/// name (`fallback` for marks that do not say, and for findings on tasks).
fn second_look(first: &Snapshot, fallback: MarkTiming) -> Duration {
    let timing: HashMap<&str, MarkTiming> = first
        .marks
        .iter()
        .filter_map(|mark| {
            let value = mark.value.as_ref()?;
            Some((mark.key.as_str(), MarkTiming::of(value, fallback)))
        })
        .collect();
    first
        .findings
        .iter()
        .map(|finding| {
            finding
                .delete_key
                .as_deref()
                .and_then(|key| timing.get(key))
                .copied()
                .unwrap_or(fallback)
                .second_look()
        })
        .max()
        .unwrap_or_default()
}

/// [`sweep_with_heartbeat`] assuming [`default_heartbeat`] for marks that do
/// not carry their own.
pub async fn sweep(
    bus: &dyn PoolBus,
    launcher: &dyn TaskLauncher,
    config: &SweepConfig,
    telemetry: &dyn TelemetrySink,
) -> Result<SweepReport, PoolError> {
    let heartbeat = default_heartbeat(config.mark_ttl);
    sweep_with_heartbeat(bus, launcher, config, heartbeat, telemetry).await
}

/// One sweep: two snapshots at least a heartbeat and a half apart, classify,
/// the safety valve, resolve what both snapshots confirm (unless dry run),
/// report. `heartbeat` is this process's `WORKER_HEARTBEAT_MS`, assumed for
/// marks that do not carry their own.
pub async fn sweep_with_heartbeat(
    bus: &dyn PoolBus,
    launcher: &dyn TaskLauncher,
    config: &SweepConfig,
    heartbeat: Duration,
    telemetry: &dyn TelemetrySink,
) -> Result<SweepReport, PoolError> {
    let fallback = MarkTiming {
        ttl: config.mark_ttl,
        heartbeat,
    };
    let first = snapshot(bus, launcher, config).await?;
    let held = valve(
        &first.findings,
        first.marks.len(),
        first.tasks.len(),
        config.max_fraction,
    );
    if let Some(reason) = &held {
        tracing::error!(reason, "maintenance sweep held by its safety valve");
    }
    // Act only on what a second look confirms: a task that started, a claim
    // or a heartbeat since the first look drops the finding. Taken after
    // every live writer has refreshed its mark at least once: back to back,
    // both looks would see a live worker's mark unchanged.
    let (findings, unconfirmed) = if held.is_some() || config.dry_run {
        let all = first.findings.iter().cloned().map(|f| (f, None)).collect();
        (all, 0)
    } else if first.findings.is_empty() {
        (Vec::new(), 0)
    } else {
        tokio::time::sleep(second_look(&first, fallback)).await;
        let second = snapshot(bus, launcher, config).await?;
        let confirmed = confirmed(&first, &second);
        let dropped = first.findings.len() - confirmed.len();
        (confirmed, dropped as u64)
    };
    let mut found: BTreeMap<OrphanKind, u64> = OrphanKind::ALL.iter().map(|k| (*k, 0)).collect();
    let mut resolved = found.clone();
    for (finding, _) in &findings {
        *found.entry(finding.kind).or_default() += 1;
    }
    let mut errors = Vec::new();
    let mut changed = 0;
    let act = !config.dry_run && held.is_none();
    if act {
        let results: Vec<Vec<(OrphanKind, Result<Resolved, String>)>> =
            futures_util::stream::iter(findings.chunks(100).map(|batch| async move {
                let mut out = Vec::with_capacity(batch.len());
                for (finding, seen) in batch {
                    let done = resolve(finding, seen.as_deref(), bus, launcher).await;
                    out.push((finding.kind, done));
                }
                out
            }))
            .buffer_unordered(config.concurrency.max(1))
            .collect()
            .await;
        for (kind, result) in results.into_iter().flatten() {
            match result {
                Ok(Resolved::Done) => *resolved.entry(kind).or_default() += 1,
                Ok(Resolved::Changed) => changed += 1,
                Err(err) => errors.push(err),
            }
        }
    }
    // After the orphan marks are gone: a dead pool worker's half-taken claims
    // go back in line (the re-queue itself checks that its pool mark is gone).
    let mut claims_requeued = 0;
    if act {
        match crate::worker::requeue_dead_claims(bus).await {
            Ok(count) => claims_requeued = count,
            Err(err) => errors.push(format!("re-queue of dead workers' claims: {err}")),
        }
    }
    // Last: an orphaned mark deleted above no longer hides a dead worker.
    let mut reserved = Vec::new();
    if let (Some(lock), None) = (config.supervise, &held) {
        let supervise = SuperviseConfig::for_sweep(config, lock, heartbeat);
        match crate::supervise::supervise(bus, launcher, &supervise, telemetry).await {
            Ok(pass) => {
                reserved = pass.reserved.into_iter().map(|(user, _)| user).collect();
                errors.extend(pass.errors);
            }
            Err(err) => errors.push(format!("supervision: {err}")),
        }
    }
    let counts = |map: &BTreeMap<OrphanKind, u64>| map.iter().map(|(k, n)| (*k, *n)).collect();
    telemetry.emit(TelemetryEvent::OrphanSweep {
        found: counts(&found),
        resolved: counts(&resolved),
        dry_run: config.dry_run,
        held: held.is_some(),
    });
    let report = SweepReport {
        at: first.now,
        dry_run: config.dry_run,
        marks: first.marks.len(),
        tasks: first.tasks.len(),
        found,
        resolved,
        findings: findings.into_iter().map(|(finding, _)| finding).collect(),
        errors,
        claims_requeued,
        reserved,
        held,
        unconfirmed: unconfirmed + changed,
    };
    bus.put_maintenance_report(&serde_json::to_string(&report).unwrap_or_default())
        .await?;
    Ok(report)
}

#[cfg(test)]
mod tests;
