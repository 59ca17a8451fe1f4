use super::*;
use crate::launcher::testing::ScriptedLauncher;
use crate::launcher::{LaunchError, RunningTask};
use async_trait::async_trait;
use leasehold_pool::bus::memory::{MemoryPoolBus, SnapshotRead};
use leasehold_pool::bus::{CredentialBus, MarkBus, PoolBus};
use leasehold_pool::bus::{Inspect, MarkWrite, WorkerMetadata};
use leasehold_pool::protocol::MarkValue;
use leasehold_telemetry::RecordingSink;
use std::sync::{Arc, Mutex};

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

/// A mark as written before marks carried their timing.
fn mark(user: &str, task: &str) -> String {
    timed_mark(user, task, 1, None)
}

/// A mark of `task` for `user`, written at `heartbeat_at`, carrying
/// `timing` (TTL, heartbeat) when given.
fn timed_mark(user: &str, task: &str, heartbeat_at: u64, timing: Option<MarkTiming>) -> String {
    MarkValue {
        worker_id: task.into(),
        task_id: task.into(),
        user_id: user.into(),
        heartbeat_at,
        started_at: 1,
        sidecar_url: None,
        ttl_ms: timing.map(|t| t.ttl.as_millis() as u64),
        heartbeat_interval_ms: timing.map(|t| t.heartbeat.as_millis() as u64),
        seal_key: None,
    }
    .to_json()
}

fn metadata(task: &str) -> WorkerMetadata {
    WorkerMetadata {
        task_arn: task.into(),
        instance_id: "h".into(),
        launched_at: 1,
        sidecar_url: None,
    }
}

/// `task` claims `user` with a mark of `value` and TTL `ttl`.
async fn claim(bus: &MemoryPoolBus, user: &str, task: &str, value: &str, ttl: Duration) {
    let write = MarkWrite {
        user_id: user,
        worker_id: task,
        value,
        ttl,
        metadata: &metadata(task),
    };
    assert!(bus.claim_user(&write).await.unwrap());
}

/// `task` refreshes its mark on `user`, as its heartbeat does.
async fn refresh(bus: &MemoryPoolBus, user: &str, task: &str, value: &str, ttl: Duration) {
    let write = MarkWrite {
        user_id: user,
        worker_id: task,
        value,
        ttl,
        metadata: &metadata(task),
    };
    assert!(bus.refresh_user_mark(&write).await.unwrap());
}

/// A user with credentials, a queued request and a mark of `task`
/// (old-style, 30 s TTL).
async fn busy_user(bus: &MemoryPoolBus, user: &str, task: &str) {
    bus.put_credentials(user, "blob").await.unwrap();
    bus.push_request(user, "r1").await.unwrap();
    claim(bus, user, task, &mark(user, task), MARK_TTL).await;
}

const MARK_TTL: Duration = Duration::from_secs(30);
const HEARTBEAT: Duration = Duration::from_secs(5);

/// How long after its last refresh a 30 s mark with a 5 s heartbeat
/// looks unrefreshed (remaining TTL below 30 − 2 × 5 = 20 s).
const UNREFRESHED_AFTER: Duration = Duration::from_secs(11);

const CONFIG: SuperviseConfig = SuperviseConfig {
    lock: Duration::from_secs(60),
    dry_run: false,
    fallback: MarkTiming {
        ttl: MARK_TTL,
        heartbeat: HEARTBEAT,
    },
    max_fraction: crate::maintenance::DEFAULT_MAX_FRACTION,
};

async fn pass(bus: &MemoryPoolBus, launcher: &dyn TaskLauncher) -> Supervised {
    supervise(bus, launcher, &CONFIG, &RecordingSink::new())
        .await
        .unwrap()
}

/// Asserts `user` is still held by `task` and nothing was set in motion
/// to re-serve it.
async fn still_served(bus: &MemoryPoolBus, user: &str, task: &str, outcome: &Supervised) {
    let mark = bus.get(&keys::worker_active(user)).await.unwrap();
    assert!(
        mark.as_deref()
            .and_then(MarkValue::parse)
            .map(|m| m.task_id)
            == Some(task.into()),
        "the mark was released: {mark:?} {outcome:?}"
    );
    assert!(outcome.unserved.is_empty(), "{outcome:?}");
    assert!(outcome.reserved.is_empty(), "{outcome:?}");
    assert_eq!(bus.list_len(keys::POOL_CLAIMS).await.unwrap(), 0);
    assert_eq!(bus.get(&keys::reserve_lock(user)).await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn a_user_whose_worker_died_with_requests_is_reserved_once_per_lock() {
    let bus = MemoryPoolBus::new();
    let launcher = Launcher::default();
    let telemetry = RecordingSink::new();
    // u1's worker was killed: its mark outlives it, naming a task that is
    // gone, and nothing refreshes it any more.
    busy_user(&bus, "u1", "dead").await;
    tokio::time::advance(UNREFRESHED_AFTER).await;
    bus.set_pool_mark("idle", &mark("-1", "idle"), MARK_TTL)
        .await
        .unwrap();
    launcher.running.lock().unwrap().push("idle".into());
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
    claim(&bus, "u1", "t1", &mark("u1", "t1"), MARK_TTL).await;
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

/// Guard: a holder is dead only when Redis says its mark was not
/// refreshed. The launcher lists none of the pool's tasks (a wrong
/// `POOL_GROUP`): a busy user whose mark is fresh keeps its worker, pass
/// after pass.
#[tokio::test(start_paused = true)]
async fn a_fresh_mark_whose_task_no_listing_has_keeps_its_worker() {
    let bus = MemoryPoolBus::new();
    let launcher = ScriptedLauncher::with(vec![]);
    busy_user(&bus, "u1", "t1").await;
    for _ in 0..3 {
        let outcome = pass(&bus, &launcher).await;
        still_served(&bus, "u1", "t1", &outcome).await;
        // The worker's heartbeat: the mark stays fresh.
        tokio::time::advance(HEARTBEAT).await;
        refresh(&bus, "u1", "t1", &mark("u1", "t1"), MARK_TTL).await;
    }
}

/// Guard: the mark's own TTL. A worker configured with a 10 s mark TTL
/// (1 s heartbeat) under a supervisor configured with 30 s: its fresh
/// mark's 10 s would be below 30 − 2 × 5 s, as if unrefreshed for 20 s.
#[tokio::test(start_paused = true)]
async fn a_mark_with_a_shorter_ttl_than_the_supervisors_is_judged_by_its_own() {
    let bus = MemoryPoolBus::new();
    let launcher = ScriptedLauncher::with(vec![]);
    bus.put_credentials("u1", "blob").await.unwrap();
    bus.push_request("u1", "r1").await.unwrap();
    let own = MarkTiming {
        ttl: Duration::from_secs(10),
        heartbeat: Duration::from_secs(1),
    };
    let value = timed_mark("u1", "t1", 1, Some(own));
    claim(&bus, "u1", "t1", &value, own.ttl).await;
    let outcome = pass(&bus, &launcher).await;
    still_served(&bus, "u1", "t1", &outcome).await;
    assert!(outcome.unconfirmed.is_empty(), "not even a suspect");
}

/// Guard: the confirmed task set. The first listing misses the holder's
/// task (an eventually consistent listing), the second has it: a worker
/// whose mark is late but whose task runs is not displaced.
#[tokio::test(start_paused = true)]
async fn a_task_only_the_first_listing_misses_is_not_dead() {
    let bus = MemoryPoolBus::new();
    let launcher = ScriptedLauncher::with(vec![]);
    busy_user(&bus, "u1", "t1").await;
    tokio::time::advance(UNREFRESHED_AFTER).await;
    let running = launcher.running.clone();
    launcher.after_list(1, move || {
        Box::pin(async move {
            running.lock().unwrap().push(RunningTask {
                task_id: "t1".into(),
                started_at: 0,
                user_id: None,
            });
        })
    });
    let outcome = pass(&bus, &launcher).await;
    still_served(&bus, "u1", "t1", &outcome).await;
    assert_eq!(outcome.unconfirmed, ["u1"]);
}

/// Guard: the second look waits a heartbeat and a half. The holder's
/// heartbeat was late (its mark looks unrefreshed) and lands one
/// heartbeat later; the listing misses its task throughout.
#[tokio::test(start_paused = true)]
async fn a_late_heartbeat_within_the_second_look_keeps_the_worker() {
    let bus = Arc::new(MemoryPoolBus::new());
    let launcher = ScriptedLauncher::with(vec![]);
    busy_user(&bus, "u1", "t1").await;
    tokio::time::advance(UNREFRESHED_AFTER).await;
    let late = bus.clone();
    let heartbeat = tokio::spawn(async move {
        tokio::time::sleep(HEARTBEAT).await;
        refresh(
            &late,
            "u1",
            "t1",
            &timed_mark("u1", "t1", 2, None),
            MARK_TTL,
        )
        .await;
    });
    let outcome = pass(&bus, &launcher).await;
    heartbeat.await.unwrap();
    still_served(&bus, "u1", "t1", &outcome).await;
    assert_eq!(outcome.unconfirmed, ["u1"]);
}

/// Guard: the second look waits for the mark's own heartbeat. The holder
/// beats every 10 s and its beat is late; it lands 5 s after the first
/// look (a supervisor going by its own 1 s would look again after 1.5 s,
/// before it).
#[tokio::test(start_paused = true)]
async fn the_second_look_waits_for_the_marks_own_heartbeat() {
    let bus = Arc::new(MemoryPoolBus::new());
    let launcher = ScriptedLauncher::with(vec![]);
    bus.put_credentials("u1", "blob").await.unwrap();
    bus.push_request("u1", "r1").await.unwrap();
    let own = MarkTiming {
        ttl: Duration::from_secs(30),
        heartbeat: Duration::from_secs(10),
    };
    claim(
        &bus,
        "u1",
        "t1",
        &timed_mark("u1", "t1", 1, Some(own)),
        own.ttl,
    )
    .await;
    // Remaining TTL 9 s: below 30 − 2 × 10 s, a beat is overdue.
    tokio::time::advance(Duration::from_secs(21)).await;
    let late = bus.clone();
    let heartbeat = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let value = timed_mark("u1", "t1", 2, Some(own));
        refresh(&late, "u1", "t1", &value, own.ttl).await;
    });
    let config = SuperviseConfig {
        fallback: MarkTiming {
            ttl: MARK_TTL,
            heartbeat: Duration::from_secs(1),
        },
        ..CONFIG
    };
    let outcome = supervise(bus.as_ref(), &launcher, &config, &RecordingSink::new())
        .await
        .unwrap();
    heartbeat.await.unwrap();
    still_served(&bus, "u1", "t1", &outcome).await;
}

/// Guard: an unchanged mark in both looks. A worker writing marks that
/// do not carry their timing, with a 10 s TTL, under a supervisor that
/// assumes 30 s: its fresh mark looks unrefreshed at every look, but it
/// changes between the looks, so its writer is alive.
#[tokio::test(start_paused = true)]
async fn an_old_style_mark_rewritten_between_the_looks_is_alive() {
    let bus = Arc::new(MemoryPoolBus::new());
    let launcher = ScriptedLauncher::with(vec![]);
    bus.put_credentials("u1", "blob").await.unwrap();
    bus.push_request("u1", "r1").await.unwrap();
    let ttl = Duration::from_secs(10);
    claim(&bus, "u1", "t1", &timed_mark("u1", "t1", 0, None), ttl).await;
    let beating = bus.clone();
    let heartbeat = tokio::spawn(async move {
        for beat in 1..=10 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let value = timed_mark("u1", "t1", beat, None);
            refresh(&beating, "u1", "t1", &value, ttl).await;
        }
    });
    let outcome = pass(&bus, &launcher).await;
    heartbeat.abort();
    still_served(&bus, "u1", "t1", &outcome).await;
    assert_eq!(outcome.unconfirmed, ["u1"]);
}

/// Guard: compare-and-delete. The holder refreshes right after the
/// second look read the marks: the release finds another value and
/// leaves it.
#[tokio::test(start_paused = true)]
async fn a_refresh_after_the_second_look_keeps_the_mark() {
    let bus = Arc::new(MemoryPoolBus::new());
    let launcher = ScriptedLauncher::with(vec![]);
    busy_user(&bus, "u1", "t1").await;
    tokio::time::advance(UNREFRESHED_AFTER).await;
    let hooked = bus.clone();
    bus.after_read(SnapshotRead::Marks, 2, move || {
        Box::pin(async move {
            let value = timed_mark("u1", "t1", 2, None);
            refresh(&hooked, "u1", "t1", &value, MARK_TTL).await;
        })
    });
    let outcome = pass(&bus, &launcher).await;
    still_served(&bus, "u1", "t1", &outcome).await;
    assert_eq!(outcome.unconfirmed, ["u1"]);
}

/// Guard: the safety valve. Three of four marks look dead at once (their
/// workers lost Redis together, and the listing misses their tasks):
/// supervision releases none and says why.
#[tokio::test(start_paused = true)]
async fn many_dead_looking_holders_at_once_hold_the_pass() {
    let bus = MemoryPoolBus::new();
    let launcher = ScriptedLauncher::with(vec![]);
    for n in 1..=3 {
        busy_user(&bus, &format!("u{n}"), &format!("t{n}")).await;
    }
    tokio::time::advance(UNREFRESHED_AFTER).await;
    busy_user(&bus, "u4", "t4").await;
    let outcome = pass(&bus, &launcher).await;
    let reason = outcome.held.clone().expect("held");
    assert!(reason.contains("3 of 4 marks"), "{reason}");
    for n in 1..=3 {
        assert!(bus.user_is_active(&format!("u{n}")).await.unwrap());
    }
    assert!(outcome.reserved.is_empty(), "{outcome:?}");
    assert_eq!(bus.list_len(keys::POOL_CLAIMS).await.unwrap(), 0);
}

/// Guard: a listing that fails is no listing. The launcher cannot list
/// (ECS `DescribeTasks` failures): the pass fails and releases nothing,
/// rather than take the holder's task for gone.
#[tokio::test(start_paused = true)]
async fn a_failed_listing_fails_the_pass_and_releases_nothing() {
    let bus = MemoryPoolBus::new();
    let launcher = ScriptedLauncher::with(vec![]);
    busy_user(&bus, "u1", "t1").await;
    tokio::time::advance(UNREFRESHED_AFTER).await;
    // The first look's listing fails in one pass, the second look's in
    // the next (lists 2 and 3).
    for failing in [1, 3] {
        launcher.fail_list(failing);
        let failed = supervise(&bus, &launcher, &CONFIG, &RecordingSink::new()).await;
        assert!(
            matches!(failed, Err(PoolError::Launch(LaunchError::List(_)))),
            "list {failing}: {failed:?}"
        );
        assert!(bus.user_is_active("u1").await.unwrap());
        assert_eq!(bus.list_len(keys::POOL_CLAIMS).await.unwrap(), 0);
    }
}

#[test]
fn a_mark_is_unrefreshed_below_its_ttl_less_two_heartbeats() {
    let timing = MarkTiming {
        ttl: Duration::from_secs(30),
        heartbeat: Duration::from_secs(5),
    };
    assert!(timing.refreshed(20_000));
    assert!(!timing.refreshed(19_999));
    // A writer beating no faster than its mark lives is never judged by it.
    let odd = MarkTiming {
        ttl: Duration::from_secs(2),
        heartbeat: Duration::from_secs(5),
    };
    assert!(odd.refreshed(0));
    // A mark claiming absurd timing neither overflows nor stalls a look.
    let absurd = MarkTiming {
        ttl: Duration::from_millis(u64::MAX),
        heartbeat: Duration::from_millis(u64::MAX),
    };
    assert!(absurd.refreshed(0));
    assert_eq!(absurd.second_look(), maintenance::MAX_SECOND_LOOK);
}
