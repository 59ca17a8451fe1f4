use super::*;
use crate::launcher::testing::ScriptedLauncher;
use leasehold_pool::bus::memory::{MemoryPoolBus, SnapshotRead};
use leasehold_pool::bus::{Inspect, MarkWrite, WorkerMetadata};
use leasehold_pool::bus::{MarkBus, PoolBus};
use leasehold_telemetry::RecordingSink;
use std::sync::Arc;

const NOW: u64 = 1_000_000;

fn config() -> SweepConfig {
    SweepConfig {
        mark_ttl: Duration::from_secs(30),
        grace: Duration::from_secs(60),
        concurrency: 4,
        dry_run: false,
        supervise: None,
        max_fraction: DEFAULT_MAX_FRACTION,
    }
}

fn mark(user: &str, task: &str, heartbeat_ago_ms: u64, ttl: Option<u64>) -> Mark {
    let key = if user == "-1" {
        keys::pool_worker_active(task)
    } else {
        keys::worker_active(user)
    };
    let value = MarkValue {
        worker_id: task.into(),
        task_id: task.into(),
        user_id: user.into(),
        heartbeat_at: NOW - heartbeat_ago_ms,
        started_at: 0,
        sidecar_url: None,
        ttl_ms: None,
        heartbeat_interval_ms: None,
        seal_key: None,
    };
    Mark {
        user_id: user_of(&key),
        key,
        raw: value.to_json(),
        value: Some(value),
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
fn staleness_is_judged_by_the_ttl_redis_keeps_not_by_heartbeat_clocks() {
    let marks = [
        mark("u1", "t1", 1000, None),
        mark("u2", "t2", 0, Some(3_600_000)),
        Mark {
            value: None,
            ..mark("u3", "t3", 0, Some(5000))
        },
        // Its writer's clock is 10 minutes behind: its TTL is fine, so it is.
        mark("u4", "t4", 600_000, Some(25_000)),
    ];
    let tasks = [task("t1", 600_000, None), task("t4", 600_000, None)];
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

/// Guard: each mark judged by its own TTL. A worker configured with a
/// 60 s mark TTL under a sweeper configured with 30 s: its fresh mark's
/// 58 s would be longer than any TTL the sweeper expects (stale: deleted
/// and its task stopped).
#[test]
fn a_mark_carrying_a_longer_ttl_than_the_sweepers_is_not_stale() {
    let mut long = mark("u1", "t1", 0, Some(58_000));
    if let Some(value) = long.value.as_mut() {
        value.ttl_ms = Some(60_000);
        value.heartbeat_interval_ms = Some(5_000);
        long.raw = value.to_json();
    }
    let tasks = [task("t1", 600_000, None)];
    assert_eq!(classify(&[long.clone()], &tasks, NOW, &config()), vec![]);
    // Longer than even its own TTL: stale.
    let beyond = Mark {
        ttl_ms: Some(70_000),
        ..long
    };
    assert_eq!(
        kinds(&classify(&[beyond], &tasks, NOW, &config())),
        vec![(
            OrphanKind::StaleMark,
            Some("worker:active:u1".into()),
            Some("t1".into())
        )]
    );
}

#[test]
fn two_tasks_for_one_user_keep_the_mark_holder() {
    let tasks = [
        task("t-old", 600_000, Some("u1")),
        task("t-new", 10_000, Some("u1")),
    ];
    // t-new holds the mark: the older one goes.
    let marks = [mark("u1", "t-new", 0, Some(30_000))];
    let findings = classify(&marks, &tasks, NOW, &config());
    assert_eq!(
        kinds(&findings),
        vec![(OrphanKind::DuplicateWorker, None, Some("t-old".into()))]
    );
    // t-old holds the mark: it serves the user, the newer one goes.
    let marks = [mark("u1", "t-old", 0, Some(30_000))];
    let findings = classify(&marks, &tasks, NOW, &config());
    assert_eq!(
        kinds(&findings),
        vec![(OrphanKind::DuplicateWorker, None, Some("t-new".into()))]
    );
    // Nobody holds it: the newest stays.
    let findings = classify(&[], &tasks, NOW, &config());
    assert_eq!(
        kinds(&findings),
        vec![(OrphanKind::DuplicateWorker, None, Some("t-old".into()))]
    );
}

#[test]
fn the_valve_allows_one_finding_and_holds_a_large_share() {
    let orphan = |n: usize| Finding {
        kind: OrphanKind::OrphanMark,
        user_id: None,
        delete_key: Some(format!("worker:active:u{n}")),
        stop_task: None,
    };
    assert_eq!(
        valve(&[orphan(1)], 2, 2, 0.2),
        None,
        "one is always allowed"
    );
    assert_eq!(valve(&[orphan(1), orphan(2)], 10, 10, 0.2), None);
    assert!(valve(&[orphan(1), orphan(2), orphan(3)], 10, 10, 0.2).is_some());
    let stop = |n: usize| Finding {
        kind: OrphanKind::OrphanTask,
        user_id: None,
        delete_key: None,
        stop_task: Some(format!("t{n}")),
    };
    let reason = valve(&[stop(1), stop(2), stop(3)], 0, 5, 0.2).expect("held");
    assert!(reason.contains("3 of 5 tasks"), "{reason}");
}

// --- race tests: the bus and the launcher change between the sweep's reads ---

fn metadata(task: &str) -> WorkerMetadata {
    WorkerMetadata {
        task_arn: task.into(),
        instance_id: "host".into(),
        launched_at: 1,
        sidecar_url: None,
    }
}

/// `task` claims `user` on the bus, as a worker's claim step does.
async fn claim(bus: &MemoryPoolBus, user: &str, task: &str) {
    let value = MarkValue {
        worker_id: task.into(),
        task_id: task.into(),
        user_id: user.into(),
        heartbeat_at: 1,
        started_at: 1,
        sidecar_url: None,
        ttl_ms: None,
        heartbeat_interval_ms: None,
        seal_key: None,
    }
    .to_json();
    let claimed = bus
        .claim_user(&MarkWrite {
            user_id: user,
            worker_id: task,
            value: &value,
            ttl: Duration::from_secs(30),
            metadata: &metadata(task),
        })
        .await
        .unwrap();
    assert!(claimed);
}

async fn pool_mark(bus: &MemoryPoolBus, task: &str) {
    let value = MarkValue {
        worker_id: task.into(),
        task_id: task.into(),
        user_id: keys::POOL_USER_ID.into(),
        heartbeat_at: 1,
        started_at: 1,
        sidecar_url: None,
        ttl_ms: None,
        heartbeat_interval_ms: None,
        seal_key: None,
    }
    .to_json();
    bus.set_pool_mark(task, &value, Duration::from_secs(30))
        .await
        .unwrap();
}

/// A task the bus's clock says started `ago_ms` ago.
async fn running(bus: &MemoryPoolBus, id: &str, ago_ms: u64) -> RunningTask {
    let now = bus.server_time_ms().await.unwrap();
    RunningTask {
        task_id: id.into(),
        started_at: now - ago_ms,
        user_id: None,
    }
}

async fn sweep_once(bus: &MemoryPoolBus, launcher: &ScriptedLauncher) -> SweepReport {
    sweep(bus, launcher, &config(), &RecordingSink::new())
        .await
        .unwrap()
}

/// Guard: compare-and-delete. The mark the snapshots saw as an orphan's
/// is replaced by a claim before the delete: the new mark stays.
#[tokio::test(start_paused = true)]
async fn a_claim_after_the_snapshot_keeps_its_mark() {
    let bus = Arc::new(MemoryPoolBus::new());
    claim(&bus, "u1", "t-dead").await;
    let launcher = ScriptedLauncher::with(vec![]);
    let (hooked, running) = (bus.clone(), launcher.running.clone());
    bus.after_read(SnapshotRead::Marks, 2, move || {
        Box::pin(async move {
            // t-dead's mark lapses and t-new claims u1.
            hooked
                .delete_keys(&[keys::worker_active("u1")])
                .await
                .unwrap();
            claim(&hooked, "u1", "t-new").await;
            running.lock().unwrap().push(RunningTask {
                task_id: "t-new".into(),
                started_at: 0,
                user_id: None,
            });
        })
    });
    let report = sweep_once(&bus, &launcher).await;
    let mark = bus.get(&keys::worker_active("u1")).await.unwrap();
    assert!(
        mark.as_deref().is_some_and(|m| m.contains("t-new")),
        "t-new's claim survived the sweep: {mark:?}"
    );
    assert!(bus.user_is_active("u1").await.unwrap());
    assert_eq!(report.resolved[&OrphanKind::OrphanMark], 0);
    assert_eq!(report.unconfirmed, 1);
    assert!(launcher.stopped().is_empty());
}

/// Guard: the second look. A task that starts (and claims) between the
/// task list and the marks read keeps its mark and is not stopped.
#[tokio::test(start_paused = true)]
async fn a_task_started_between_listing_and_reading_marks_is_left_alone() {
    let bus = Arc::new(MemoryPoolBus::new());
    let launcher = ScriptedLauncher::with(vec![]);
    let (hooked, running) = (bus.clone(), launcher.running.clone());
    let started = running_now(&bus, "t-started").await;
    launcher.after_list(1, move || {
        Box::pin(async move {
            running.lock().unwrap().push(started);
            claim(&hooked, "u2", "t-started").await;
        })
    });
    let report = sweep_once(&bus, &launcher).await;
    assert!(bus.user_is_active("u2").await.unwrap(), "mark kept");
    assert!(
        !bus.hash_get_all(&keys::worker_metadata("u2"))
            .await
            .unwrap()
            .is_empty(),
        "metadata kept"
    );
    assert!(launcher.stopped().is_empty());
    assert_eq!(report.unconfirmed, 1, "seen once as an orphan mark");
}

async fn running_now(bus: &MemoryPoolBus, id: &str) -> RunningTask {
    running(bus, id, 0).await
}

/// Guard: the second look, for tasks. An old task whose mark appears
/// right after the first marks read (its first heartbeat was late) is
/// not stopped.
#[tokio::test(start_paused = true)]
async fn a_task_marked_after_the_first_look_is_not_stopped() {
    let bus = Arc::new(MemoryPoolBus::new());
    let launcher = ScriptedLauncher::with(vec![running(&bus, "t-slow", 600_000).await]);
    let hooked = bus.clone();
    bus.after_read(SnapshotRead::Marks, 1, move || {
        Box::pin(async move { pool_mark(&hooked, "t-slow").await })
    });
    let report = sweep_once(&bus, &launcher).await;
    assert!(launcher.stopped().is_empty(), "{:?}", launcher.stopped());
    assert_eq!(report.unconfirmed, 1);
}

/// Guard: ages by the pool bus's clock. The sweeper's host clock is 60 s
/// ahead of Redis's: a task Redis's clock says started 5 s ago has not
/// written its first mark yet, and a mark whose writer's clock lags a
/// minute is healthy by its TTL. Nothing is stopped or deleted.
#[tokio::test(start_paused = true)]
async fn a_sweeper_clock_60_s_ahead_stops_nothing_healthy() {
    let bus = Arc::new(MemoryPoolBus::new());
    bus.skew_clock(-60_000);
    let launcher = ScriptedLauncher::with(vec![
        running(&bus, "t-young", 5_000).await,
        running(&bus, "t-old", 600_000).await,
    ]);
    claim(&bus, "u1", "t-old").await;
    let report = sweep_once(&bus, &launcher).await;
    assert!(launcher.stopped().is_empty(), "{:?}", launcher.stopped());
    assert!(report.findings.is_empty(), "{:?}", report.findings);
    assert!(bus.user_is_active("u1").await.unwrap());
}

/// Guard: the safety valve. A launcher of the wrong `POOL_GROUP` lists
/// none of the pool's tasks: every mark looks orphaned, and the sweep
/// reports and acts on nothing.
#[tokio::test(start_paused = true)]
async fn a_wrong_pool_group_holds_the_sweep() {
    let bus = MemoryPoolBus::new();
    for n in 0..4 {
        pool_mark(&bus, &format!("t-pool-{n}")).await;
    }
    claim(&bus, "u1", "t-served").await;
    let wrong_group = crate::launcher::LocalLauncher {
        program: "/bin/true".into(),
        group: format!("wrong-group-{}", rand::random::<u64>()),
        log_dir: None,
    };
    let telemetry = RecordingSink::new();
    let report = sweep(&bus, &wrong_group, &config(), &telemetry)
        .await
        .unwrap();
    let reason = report.held.clone().expect("held");
    assert!(reason.contains("5 of 5 marks"), "{reason}");
    assert_eq!(report.found[&OrphanKind::OrphanMark], 5);
    assert!(report.resolved.values().all(|n| *n == 0));
    assert_eq!(
        bus.marks(keys::WORKER_ACTIVE_PATTERN).await.unwrap().len(),
        5,
        "every mark is still there"
    );
    assert!(
        telemetry
            .snapshot()
            .iter()
            .any(|event| matches!(event, TelemetryEvent::OrphanSweep { held: true, .. }))
    );
    let stored: SweepReport =
        serde_json::from_str(&bus.maintenance_report().await.unwrap().unwrap()).unwrap();
    assert_eq!(stored.held, Some(reason));
}

/// A live worker beating every `every` on `user`'s mark (as its
/// heartbeat task does), with marks of `timing` (`None`: marks that do
/// not carry it) and TTL `ttl`.
fn beating(
    bus: &Arc<MemoryPoolBus>,
    user: &str,
    task: &str,
    every: Duration,
    ttl: Duration,
    timing: Option<MarkTiming>,
) -> tokio::task::JoinHandle<()> {
    let (bus, user, task) = (bus.clone(), user.to_owned(), task.to_owned());
    tokio::spawn(async move {
        for beat in 1.. {
            let value = MarkValue {
                worker_id: task.clone(),
                task_id: task.clone(),
                user_id: user.clone(),
                heartbeat_at: beat,
                started_at: 1,
                sidecar_url: None,
                ttl_ms: timing.map(|t| millis(t.ttl)),
                heartbeat_interval_ms: timing.map(|t| millis(t.heartbeat)),
                seal_key: None,
            }
            .to_json();
            let write = MarkWrite {
                user_id: &user,
                worker_id: &task,
                value: &value,
                ttl,
                metadata: &metadata(&task),
            };
            if beat == 1 {
                assert!(bus.claim_user(&write).await.unwrap());
            } else {
                assert!(bus.refresh_user_mark(&write).await.unwrap());
            }
            tokio::time::sleep(every).await;
        }
    })
}

/// Guard: the two snapshots a heartbeat and a half apart. A live worker
/// configured with a 60 s mark TTL writes marks that do not carry it
/// (an older worker): to a sweeper configured with 30 s its mark looks
/// stale at every look; only the heartbeat between the two looks shows
/// it alive. Back to back, both looks would confirm it and stop it.
#[tokio::test(start_paused = true)]
async fn a_live_worker_whose_mark_looks_stale_is_not_stopped() {
    let bus = Arc::new(MemoryPoolBus::new());
    let heartbeat = Duration::from_secs(1);
    let worker = beating(&bus, "u1", "t1", heartbeat, Duration::from_secs(60), None);
    tokio::task::yield_now().await;
    let launcher = ScriptedLauncher::with(vec![running(&bus, "t1", 600_000).await]);
    let report = sweep_with_heartbeat(
        bus.as_ref(),
        &launcher,
        &config(),
        heartbeat,
        &RecordingSink::new(),
    )
    .await
    .unwrap();
    worker.abort();
    assert!(launcher.stopped().is_empty(), "{:?}", launcher.stopped());
    assert!(bus.user_is_active("u1").await.unwrap());
    assert_eq!(report.resolved[&OrphanKind::StaleMark], 0);
    assert_eq!(report.unconfirmed, 1, "seen once as stale");
}

/// Guard: the second snapshot waits for the mark's own heartbeat. The
/// listing misses a live worker's task; the worker beats every 10 s, a
/// sweeper going by its own 1 s would look again before the next beat.
#[tokio::test(start_paused = true)]
async fn the_second_snapshot_waits_for_the_marks_own_heartbeat() {
    let bus = Arc::new(MemoryPoolBus::new());
    let own = MarkTiming {
        ttl: Duration::from_secs(30),
        heartbeat: Duration::from_secs(10),
    };
    let worker = beating(&bus, "u1", "t1", own.heartbeat, own.ttl, Some(own));
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_secs(5)).await;
    let launcher = ScriptedLauncher::with(vec![]);
    let report = sweep_with_heartbeat(
        bus.as_ref(),
        &launcher,
        &config(),
        Duration::from_secs(1),
        &RecordingSink::new(),
    )
    .await
    .unwrap();
    worker.abort();
    assert!(bus.user_is_active("u1").await.unwrap(), "{report:?}");
    assert_eq!(report.resolved[&OrphanKind::OrphanMark], 0);
    assert_eq!(report.unconfirmed, 1);
}

/// A sweep that finds nothing takes no second look, so waits for nothing.
#[tokio::test(start_paused = true)]
async fn a_clean_sweep_does_not_wait() {
    let bus = MemoryPoolBus::new();
    let launcher = ScriptedLauncher::with(vec![]);
    let started = tokio::time::Instant::now();
    let report = sweep_once(&bus, &launcher).await;
    assert!(report.findings.is_empty());
    assert_eq!(started.elapsed(), Duration::ZERO);
}

/// The valve does not stop the ordinary case: one dead worker of five.
#[tokio::test(start_paused = true)]
async fn one_dead_worker_of_five_is_still_swept() {
    let bus = MemoryPoolBus::new();
    let mut tasks = Vec::new();
    for n in 0..5 {
        let id = format!("t-pool-{n}");
        pool_mark(&bus, &id).await;
        if n > 0 {
            tasks.push(running(&bus, &id, 600_000).await);
        }
    }
    let launcher = ScriptedLauncher::with(tasks);
    let report = sweep_once(&bus, &launcher).await;
    assert_eq!(report.held, None);
    assert_eq!(report.resolved[&OrphanKind::OrphanMark], 1);
    assert_eq!(
        bus.get(&keys::pool_worker_active("t-pool-0"))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        bus.marks(keys::WORKER_ACTIVE_PATTERN).await.unwrap().len(),
        4
    );
}

/// Duplicates on the bus: the mark holder stays, the other is stopped.
#[tokio::test(start_paused = true)]
async fn a_duplicate_is_stopped_and_the_mark_holder_kept() {
    let bus = MemoryPoolBus::new();
    claim(&bus, "u1", "t-holder").await;
    let mut holder = running(&bus, "t-holder", 600_000).await;
    holder.user_id = Some("u1".into());
    let mut late = running(&bus, "t-late", 120_000).await;
    late.user_id = Some("u1".into());
    let mut others = Vec::new();
    for n in 0..4 {
        let id = format!("t-pool-{n}");
        pool_mark(&bus, &id).await;
        others.push(running(&bus, &id, 600_000).await);
    }
    others.extend([holder, late]);
    let launcher = ScriptedLauncher::with(others);
    let report = sweep_once(&bus, &launcher).await;
    assert_eq!(report.held, None);
    assert_eq!(launcher.stopped(), ["t-late"]);
    assert!(bus.user_is_active("u1").await.unwrap());
}
