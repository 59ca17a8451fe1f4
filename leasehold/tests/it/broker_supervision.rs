//! Supervision and the sweep with real processes and the real `redis-server`:
//! neither displaces a healthy worker because of what a launcher lists, or
//! because the worker was configured with another mark TTL than the sweeper.
//! Each test has its own pool group; the tests run one at a time (`serial`) on
//! Redis database 15.

use std::time::{Duration, Instant};

use crate::support::{Proc, run_leasehold, serial, spawn_leasehold};
use leasehold_broker::credentials::AesGcmCipher;
use leasehold_broker::launcher::{LOCAL_GROUP_VAR, LocalLauncher, TaskLauncher};
use leasehold_pool::keys;
use leasehold_pool::protocol::MarkValue;
use leasehold_testkit::{redis_url, unique_name};
use redis::AsyncCommands;
use serde_json::Value;

/// The database of these tests (and of one in `broker_pool`: `serial` keeps
/// them apart).
const DB: u8 = 15;

/// A user with credentials, the variables its tools and workers share, and
/// a Redis connection.
struct Setup {
    user: String,
    group: String,
    envs: Vec<(String, String)>,
    redis: redis::aio::MultiplexedConnection,
    /// Groups whose workers are killed when the test ends.
    groups: Vec<String>,
}

impl Setup {
    async fn new(worker_mark_ttl_seconds: &str) -> Option<Setup> {
        let base = redis_url()?;
        let url = format!("{}/{DB}", base.trim_end_matches('/'));
        let mut redis = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = redis::cmd("FLUSHDB").query_async(&mut redis).await.unwrap();
        let group = unique_name("g").chars().rev().take(30).collect::<String>();
        let envs: Vec<(String, String)> = [
            ("REDIS_URL", url.as_str()),
            ("CREDENTIALS_KEY", &AesGcmCipher::generate_key()),
            ("POOL_GROUP", &group),
            ("POOL_TARGET_SIZE", "0"),
            // A heartbeat of 1 s on a mark of `worker_mark_ttl_seconds`: a
            // worker on a loaded machine keeps its mark fresh (above
            // TTL − 2 s) with a second to spare.
            ("WORKER_HEARTBEAT_MS", "1000"),
            ("WORKER_MARK_TTL_SECONDS", worker_mark_ttl_seconds),
            ("SWEEP_GRACE_SECONDS", "30"),
            ("LEASEHOLD_LOG", "debug"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let user = unique_name("u");
        let (status, output) = run_leasehold(
            &["credentials", "put", &user],
            &envs,
            Some(r#"{"api_key": "k", "account_id": "A1"}"#),
        );
        assert!(status.success(), "{output}");
        Some(Setup {
            user,
            groups: vec![group.clone()],
            group,
            envs,
            redis,
        })
    }

    /// A worker cold-started for the user in the setup's group, with `extra`
    /// variables.
    fn spawn_worker(&self, extra: &[(&str, &str)]) -> Proc {
        let mut envs = self.envs.clone();
        envs.push(("USER_ID".into(), self.user.clone()));
        envs.push((LOCAL_GROUP_VAR.into(), self.group.clone()));
        envs.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        spawn_leasehold("worker", &["broker-worker"], &envs)
    }

    /// The user's mark, once there is one.
    async fn wait_mark(&mut self) -> MarkValue {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(mark) = self.mark().await {
                return mark;
            }
            assert!(Instant::now() < deadline, "the user's mark never appeared");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn mark(&mut self) -> Option<MarkValue> {
        let value: Option<String> = self
            .redis
            .get(keys::worker_active(&self.user))
            .await
            .unwrap();
        value.as_deref().and_then(MarkValue::parse)
    }

    /// Pushes one paper order for the user and waits until the worker has
    /// begun it (the user is busy: the request is in its processing list).
    async fn begin_order(&mut self, request_id: &str) {
        let body = serde_json::json!({
            "request_id": request_id, "action": "place_order",
            "account": {"broker_name": "paper", "broker_type": "stock", "simulation": true, "account_id": "A1"},
            "order": {"symbol": "2330", "side": "buy", "quantity": 1, "price": 600.5}
        });
        let _: () = self
            .redis
            .lpush(keys::user_requests(&self.user), body.to_string())
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let placed: bool = self
                .redis
                .hexists(keys::paper_orders("A1"), request_id)
                .await
                .unwrap();
            if placed {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the order never reached the ledger"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn kill_workers(&self) {
        use futures_util::FutureExt;
        for group in &self.groups {
            let launcher = LocalLauncher {
                program: env!("CARGO_BIN_EXE_leasehold").into(),
                group: group.clone(),
                log_dir: None,
            };
            // The local launcher's list does no real waiting.
            let tasks = launcher.list().now_or_never().and_then(Result::ok);
            for task in tasks.unwrap_or_default() {
                if let Some(pid) = task.task_id.strip_prefix("local-") {
                    let _ = std::process::Command::new("kill")
                        .args(["-KILL", pid])
                        .status();
                }
            }
        }
    }
}

impl Drop for Setup {
    /// Also on a failed assertion: no worker outlives its test.
    fn drop(&mut self) {
        self.kill_workers();
    }
}

/// Whether the process runs (neither gone nor a zombie).
fn alive(proc: &Proc) -> bool {
    std::fs::read_to_string(format!("/proc/{}/stat", proc.pid()))
        .ok()
        .and_then(|stat| {
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_owned();
            Some(state != "Z" && state != "X")
        })
        .unwrap_or(false)
}

/// The JSON sweep reports `maintenance` printed so far.
fn sweep_reports(output: &str) -> Vec<Value> {
    output
        .lines()
        .filter(|l| l.starts_with(r#"{"at""#))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn resolved_nothing(report: &Value) -> bool {
    report["resolved"]
        .as_object()
        .is_some_and(|kinds| kinds.values().all(|n| n == 0))
}

/// A launcher listing that misses a busy user's task (`maintenance` runs
/// with another `POOL_GROUP` than the worker's, so neither the sweep nor
/// supervision ever lists it): no mark is released, nothing is re-claimed,
/// the worker keeps serving. Then, as the control, the same `maintenance`
/// re-serves the user once its worker really dies (`kill -9`): the mark,
/// no longer refreshed, says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_that_misses_a_busy_users_task_releases_nothing() {
    let _serial = serial().await;
    // A 20 s mark: the worker's order call is cut at its holder deadline
    // (mark TTL less a heartbeat, 19 s), which outlasts the sweeps below.
    let Some(mut setup) = Setup::new("20").await else {
        return;
    };
    // The order executes and never answers: the user stays busy, its
    // request in the processing list, through the sweeps.
    let mut worker = setup.spawn_worker(&[
        ("PAPER_HANG_RATE", "1"),
        ("BROKER_ORDER_TIMEOUT_MS", "120000"),
    ]);
    let held = setup.wait_mark().await;
    setup.begin_order("r1").await;

    let wrong_group = unique_name("wrong")
        .chars()
        .rev()
        .take(30)
        .collect::<String>();
    setup.groups.push(wrong_group.clone());
    let mut envs = setup.envs.clone();
    envs.retain(|(k, _)| k != "POOL_GROUP");
    envs.extend([
        ("POOL_GROUP".to_owned(), wrong_group),
        ("SUPERVISE_INTERVAL_SECONDS".to_owned(), "1".to_owned()),
        ("RESERVE_LOCK_SECONDS".to_owned(), "30".to_owned()),
    ]);
    let maintenance = spawn_leasehold("maintenance", &["maintenance", "--every", "3s"], &envs);

    // Three sweeps and a dozen supervision passes.
    let watch = Instant::now() + Duration::from_secs(10);
    while Instant::now() < watch {
        let mark = setup.mark().await;
        assert_eq!(
            mark.as_ref().map(|m| m.worker_id.as_str()),
            Some(held.worker_id.as_str()),
            "the busy user's mark was released or replaced\n{}",
            maintenance.output()
        );
        let claims: i64 = setup.redis.llen(keys::POOL_CLAIMS).await.unwrap();
        assert_eq!(claims, 0, "a claim was pushed\n{}", maintenance.output());
        let lock: bool = setup
            .redis
            .exists(keys::reserve_lock(&setup.user))
            .await
            .unwrap();
        assert!(!lock, "a re-serve was started\n{}", maintenance.output());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        alive(&worker),
        "the worker was stopped\n{}",
        worker.output()
    );
    let output = maintenance.output();
    assert!(
        !output.contains(&format!("supervise {}:", setup.user)),
        "{output}"
    );
    let reports = sweep_reports(&output);
    assert!(reports.len() >= 3, "{output}");
    for report in &reports {
        assert!(resolved_nothing(report), "{report}");
        // The listing did miss the task: each sweep saw the mark as an
        // orphan's once, and its second look, a heartbeat later, did not.
        assert!(report["unconfirmed"].as_u64() >= Some(1), "{report}");
    }
    let processing: i64 = setup
        .redis
        .llen(keys::user_processing(&setup.user))
        .await
        .unwrap();
    assert_eq!(processing, 1, "the hung request is still the worker's");

    // The control: the worker dies; its mark, no longer refreshed, makes
    // the same maintenance re-serve the user (a cold start in its group),
    // and the successor settles the order by lookup.
    worker.signal("KILL");
    worker.wait_exit(Duration::from_secs(5));
    let deadline = Instant::now() + Duration::from_secs(30);
    let successor = loop {
        if let Some(mark) = setup.mark().await.filter(|m| m.task_id != held.task_id) {
            break mark;
        }
        assert!(
            Instant::now() < deadline,
            "the user was never re-served\n{}",
            maintenance.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_ne!(successor.worker_id, held.worker_id);
    let deadline = Instant::now() + Duration::from_secs(15);
    let response: Value = loop {
        let value: Option<String> = setup
            .redis
            .get(keys::response(&setup.user, "r1"))
            .await
            .unwrap();
        if let Some(value) = value {
            break serde_json::from_str(&value).unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "the successor never answered\n{}",
            maintenance.output()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(response["status"], "ok", "{response}");
    let ledger: i64 = setup.redis.hlen(keys::paper_orders("A1")).await.unwrap();
    assert_eq!(ledger, 1, "executed once");
    drop(maintenance);
}

/// A worker configured with a 60 s mark TTL under a `maintenance` configured
/// with 5 s: its fresh mark's TTL is far longer than the sweeper's, but the
/// mark says its own, so the sweep finds nothing and stops nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_a_longer_mark_ttl_than_the_sweepers_is_left_alone() {
    let _serial = serial().await;
    let Some(mut setup) = Setup::new("60").await else {
        return;
    };
    let worker = setup.spawn_worker(&[]);
    let held = setup.wait_mark().await;
    let mut envs = setup.envs.clone();
    envs.retain(|(k, _)| k != "WORKER_MARK_TTL_SECONDS");
    envs.push(("WORKER_MARK_TTL_SECONDS".into(), "5".into()));
    let (status, output) = run_leasehold(&["maintenance"], &envs, None);
    assert!(status.success(), "{output}");
    let reports = sweep_reports(&output);
    let [report] = &reports[..] else {
        panic!("one report expected:\n{output}");
    };
    assert!(
        report["findings"].as_array().is_some_and(Vec::is_empty),
        "{report}"
    );
    assert!(resolved_nothing(report), "{report}");
    assert_eq!(report["unconfirmed"], 0, "not even suspected: {report}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        alive(&worker),
        "the worker was stopped\n{}",
        worker.output()
    );
    let mark = setup.mark().await.expect("the mark is still there");
    assert_eq!(mark.worker_id, held.worker_id);
    assert_eq!(mark.ttl_ms, Some(60_000), "the mark carries its TTL");
}
