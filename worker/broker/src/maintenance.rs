//! The maintenance sweep (the original broker-pool specification's "orphan detection"): the liveness marks on
//! the pool bus compared with the launcher's running tasks.
//!
//! | kind | found when | resolved by |
//! |---|---|---|
//! | orphan mark | a mark names a task that is not running | deleting the mark (and metadata) |
//! | orphan task | a task older than the grace period has no mark | stopping the task |
//! | stale mark | a mark without TTL, or whose heartbeat is older than the TTL | deleting it and stopping its task |
//! | duplicate worker | two tasks for one user | stopping the older |
//!
//! It also puts back in `pool:claims` the claims a dead pool worker had taken
//! into its processing list and not settled.
//!
//! [`classify`] is a pure function of (marks, tasks, now); [`sweep`] gathers the
//! inputs, resolves findings in batches of 100 with bounded concurrency, and
//! writes the report to `maintenance:last_report`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use leasehold_control::clock::unix_ms;
use leasehold_pool::keys;
use leasehold_telemetry::{OrphanKind, TelemetryEvent, TelemetrySink};

use crate::launcher::{RunningTask, TaskLauncher};
use crate::manager::PoolError;
use crate::supervise::SuperviseConfig;
use leasehold_pool::bus::{BusError, PoolBus};
use leasehold_pool::protocol::MarkValue;
pub use leasehold_pool::read::{Finding, SweepReport};

/// One `worker:active:…` key as the sweep reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// The key.
    pub key: String,
    /// `-1` for pool marks.
    pub user_id: String,
    /// Parsed value (`None`: unreadable, e.g. a bare timestamp).
    pub value: Option<MarkValue>,
    /// Remaining TTL in ms; `None` when the key has no expiry.
    pub ttl_ms: Option<u64>,
}

/// Sweep settings.
#[derive(Debug, Clone, Copy)]
pub struct SweepConfig {
    /// Mark TTL (a heartbeat older than this is stale).
    pub mark_ttl: Duration,
    /// Tasks younger than this are not orphans yet.
    pub grace: Duration,
    /// Batches of 100 resolved at once.
    pub concurrency: usize,
    /// Only report.
    pub dry_run: bool,
    /// Also supervise (see [`crate::supervise`]) after resolving, with this
    /// re-serve lock; `None`: do not.
    pub supervise: Option<Duration>,
}

fn user_of(key: &str) -> String {
    let rest = key.strip_prefix(keys::WORKER_ACTIVE_PREFIX).unwrap_or(key);
    match rest.strip_prefix("-1:") {
        Some(_) => keys::POOL_USER_ID.to_owned(),
        None => rest.to_owned(),
    }
}

/// Classifies marks and tasks into findings (pure).
pub fn classify(
    marks: &[Mark],
    tasks: &[RunningTask],
    now_ms: u64,
    config: &SweepConfig,
) -> Vec<Finding> {
    let running: HashMap<&str, &RunningTask> =
        tasks.iter().map(|t| (t.task_id.as_str(), t)).collect();
    let ttl_ms = config.mark_ttl.as_millis() as u64;
    let mut findings = Vec::new();
    let mut marked: HashSet<&str> = HashSet::new();
    // Tasks serving each user: launched for it, or named by its mark.
    let mut per_user: BTreeMap<&str, HashSet<&str>> = BTreeMap::new();
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
        let heartbeat_old = mark
            .value
            .as_ref()
            .is_none_or(|v| now_ms.saturating_sub(v.heartbeat_at) > ttl_ms);
        if mark.ttl_ms.is_none() || heartbeat_old {
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
        // Keep the newest; stop every older one.
        for older in &serving[..serving.len().saturating_sub(1)] {
            findings.push(Finding {
                kind: OrphanKind::DuplicateWorker,
                user_id: Some(user.to_owned()),
                delete_key: None,
                stop_task: Some(older.task_id.clone()),
            });
        }
    }
    findings
}

async fn read_marks(bus: &dyn PoolBus) -> Result<Vec<Mark>, BusError> {
    let marks = bus.marks(keys::WORKER_ACTIVE_PATTERN).await?;
    Ok(marks
        .into_iter()
        .map(|mark| Mark {
            user_id: user_of(&mark.key),
            value: MarkValue::parse(&mark.value),
            ttl_ms: mark.ttl_ms,
            key: mark.key,
        })
        .collect())
}

async fn resolve(
    finding: &Finding,
    bus: &dyn PoolBus,
    launcher: &dyn TaskLauncher,
) -> Result<(), String> {
    if let Some(key) = &finding.delete_key {
        let mut delete = vec![key.clone()];
        if let Some(user) = finding
            .user_id
            .as_deref()
            .filter(|u| *u != keys::POOL_USER_ID)
        {
            delete.push(keys::worker_metadata(user));
        }
        bus.delete_keys(&delete)
            .await
            .map_err(|err| format!("DEL {key}: {err}"))?;
    }
    if let Some(task) = &finding.stop_task {
        launcher
            .stop(task, finding.kind.as_str())
            .await
            .map_err(|err| err.to_string())?;
    }
    Ok(())
}

/// One sweep: read, classify, resolve (unless dry run), report.
pub async fn sweep(
    bus: &dyn PoolBus,
    launcher: &dyn TaskLauncher,
    config: &SweepConfig,
    telemetry: &dyn TelemetrySink,
) -> Result<SweepReport, PoolError> {
    // Tasks first: a task that starts between the two reads then has a mark but
    // is not listed, which at worst looks like an orphan mark for one sweep only
    // if it also died; listing marks first could stop a healthy new task.
    let tasks = launcher.list().await?;
    let marks = read_marks(bus).await?;
    let now = u64::try_from(unix_ms(SystemTime::now())).unwrap_or(0);
    let findings = classify(&marks, &tasks, now, config);
    let mut found: BTreeMap<OrphanKind, u64> = OrphanKind::ALL.iter().map(|k| (*k, 0)).collect();
    let mut resolved = found.clone();
    for finding in &findings {
        *found.entry(finding.kind).or_default() += 1;
    }
    let mut errors = Vec::new();
    if !config.dry_run {
        let results: Vec<Vec<(OrphanKind, Result<(), String>)>> =
            futures_util::stream::iter(findings.chunks(100).map(|batch| async move {
                let mut out = Vec::with_capacity(batch.len());
                for finding in batch {
                    out.push((finding.kind, resolve(finding, bus, launcher).await));
                }
                out
            }))
            .buffer_unordered(config.concurrency.max(1))
            .collect()
            .await;
        for (kind, result) in results.into_iter().flatten() {
            match result {
                Ok(()) => *resolved.entry(kind).or_default() += 1,
                Err(err) => errors.push(err),
            }
        }
    }
    // After the orphan marks are gone: a dead pool worker's half-taken claims
    // go back in line (the re-queue itself checks that its pool mark is gone).
    let mut claims_requeued = 0;
    if !config.dry_run {
        match crate::worker::requeue_dead_claims(bus).await {
            Ok(count) => claims_requeued = count,
            Err(err) => errors.push(format!("re-queue of dead workers' claims: {err}")),
        }
    }
    // Last: an orphaned mark deleted above no longer hides a dead worker.
    let mut reserved = Vec::new();
    if let Some(lock) = config.supervise {
        let supervise = SuperviseConfig {
            lock,
            dry_run: config.dry_run,
        };
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
    });
    let report = SweepReport {
        at: now,
        dry_run: config.dry_run,
        marks: marks.len(),
        tasks: tasks.len(),
        found,
        resolved,
        findings,
        errors,
        claims_requeued,
        reserved,
    };
    bus.put_maintenance_report(&serde_json::to_string(&report).unwrap_or_default())
        .await?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_000_000;

    fn config() -> SweepConfig {
        SweepConfig {
            mark_ttl: Duration::from_secs(30),
            grace: Duration::from_secs(60),
            concurrency: 4,
            dry_run: false,
            supervise: None,
        }
    }

    fn mark(user: &str, task: &str, heartbeat_ago_ms: u64, ttl: Option<u64>) -> Mark {
        let key = if user == "-1" {
            keys::pool_worker_active(task)
        } else {
            keys::worker_active(user)
        };
        Mark {
            user_id: user_of(&key),
            key,
            value: Some(MarkValue {
                worker_id: task.into(),
                task_id: task.into(),
                user_id: user.into(),
                heartbeat_at: NOW - heartbeat_ago_ms,
                started_at: 0,
                sidecar_url: None,
            }),
            ttl_ms: ttl,
        }
    }

    fn task(id: &str, started_ago_ms: u64, user: Option<&str>) -> RunningTask {
        RunningTask {
            task_id: id.into(),
            started_at: NOW - started_ago_ms,
            user_id: user.map(str::to_owned),
        }
    }

    fn kinds(findings: &[Finding]) -> Vec<(OrphanKind, Option<String>, Option<String>)> {
        findings
            .iter()
            .map(|f| (f.kind, f.delete_key.clone(), f.stop_task.clone()))
            .collect()
    }

    #[test]
    fn healthy_marks_and_tasks_are_left_alone() {
        let marks = [
            mark("u1", "t1", 1000, Some(29_000)),
            mark("-1", "t2", 0, Some(30_000)),
        ];
        let tasks = [task("t1", 600_000, None), task("t2", 600_000, None)];
        assert_eq!(classify(&marks, &tasks, NOW, &config()), vec![]);
    }

    #[test]
    fn a_mark_without_its_task_is_an_orphan_mark() {
        let findings = classify(
            &[mark("u1", "gone", 1000, Some(29_000))],
            &[],
            NOW,
            &config(),
        );
        assert_eq!(
            kinds(&findings),
            vec![(
                OrphanKind::OrphanMark,
                Some("worker:active:u1".into()),
                None
            )]
        );
        assert_eq!(findings[0].user_id.as_deref(), Some("u1"));
    }

    #[test]
    fn a_task_without_a_mark_is_an_orphan_only_after_the_grace() {
        let tasks = [task("old", 120_000, None), task("new", 5_000, None)];
        let findings = classify(&[], &tasks, NOW, &config());
        assert_eq!(
            kinds(&findings),
            vec![(OrphanKind::OrphanTask, None, Some("old".into()))]
        );
    }

    #[test]
    fn marks_without_ttl_or_with_an_old_heartbeat_are_stale() {
        let marks = [
            mark("u1", "t1", 1000, None),
            mark("u2", "t2", 45_000, Some(10_000)),
            Mark {
                value: None,
                ..mark("u3", "t3", 0, Some(5000))
            },
        ];
        let tasks = [task("t1", 600_000, None)];
        let findings = classify(&marks, &tasks, NOW, &config());
        assert_eq!(
            kinds(&findings),
            vec![
                (
                    OrphanKind::StaleMark,
                    Some("worker:active:u1".into()),
                    Some("t1".into())
                ),
                (OrphanKind::StaleMark, Some("worker:active:u2".into()), None),
                (OrphanKind::StaleMark, Some("worker:active:u3".into()), None),
            ]
        );
    }

    #[test]
    fn two_tasks_for_one_user_stop_the_older() {
        // t-old was cold-started for u1 and still runs; t-new holds the mark.
        let marks = [mark("u1", "t-new", 0, Some(30_000))];
        let tasks = [
            task("t-old", 600_000, Some("u1")),
            task("t-new", 10_000, Some("u1")),
        ];
        let findings = classify(&marks, &tasks, NOW, &config());
        assert_eq!(
            kinds(&findings),
            vec![(OrphanKind::DuplicateWorker, None, Some("t-old".into()))]
        );
        // Same when the older one holds the mark: the original specification stops the older task.
        let marks = [mark("u1", "t-old", 0, Some(30_000))];
        let findings = classify(&marks, &tasks, NOW, &config());
        assert_eq!(
            kinds(&findings),
            vec![(OrphanKind::DuplicateWorker, None, Some("t-old".into()))]
        );
    }
}
