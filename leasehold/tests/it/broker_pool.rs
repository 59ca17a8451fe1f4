//! The broker pool with real processes and the real `redis-server`: the
//! `credentials put` → `pool-manager` → `claim` → request → `kill -9` →
//! `maintenance` → refill cycle, duplicate workers, and a planted canary secret
//! that must never appear in any process output. Each test has its own Redis
//! database and pool group.

use std::time::{Duration, Instant};

use crate::support::{Proc, run_leasehold, serial, spawn_leasehold};
use leasehold_broker::credentials::AesGcmCipher;
use leasehold_broker::launcher::{LocalLauncher, TaskLauncher};
use leasehold_pool::keys;
use leasehold_pool::protocol::MarkValue;
use leasehold_testkit::{redis_url, unique_name};
use redis::AsyncCommands;
use serde_json::Value;

const CANARY: &str = "CANARY-91c3-never-print-me";

struct Pool {
    envs: Vec<(String, String)>,
    redis: redis::aio::MultiplexedConnection,
    launcher: LocalLauncher,
    output: Vec<String>,
    log_dir: std::path::PathBuf,
}

impl Pool {
    async fn new(db: u8) -> Option<Pool> {
        let base = redis_url()?;
        let url = format!("{}/{db}", base.trim_end_matches('/'));
        let mut redis = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = redis::cmd("FLUSHDB").query_async(&mut redis).await.unwrap();
        let group = unique_name("g").chars().rev().take(30).collect::<String>();
        let log_dir = std::env::temp_dir().join(unique_name("broker-logs"));
        std::fs::create_dir_all(&log_dir).unwrap();
        let envs = [
            ("REDIS_URL", url.as_str()),
            ("CREDENTIALS_KEY", &AesGcmCipher::generate_key()),
            ("POOL_GROUP", &group),
            ("POOL_TARGET_SIZE", "1"),
            ("WORKER_HEARTBEAT_MS", "300"),
            ("WORKER_MARK_TTL_SECONDS", "5"),
            ("SWEEP_GRACE_SECONDS", "30"),
            ("LEASEHOLD_LOG", "debug"),
            ("LOCAL_WORKER_LOG_DIR", log_dir.to_str().unwrap()),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        Some(Pool {
            envs,
            redis,
            launcher: LocalLauncher {
                program: env!("CARGO_BIN_EXE_leasehold").into(),
                group,
                log_dir: Some(log_dir.clone()),
            },
            output: Vec::new(),
            log_dir,
        })
    }

    fn run(&mut self, args: &[&str], stdin: Option<&str>) -> String {
        let (status, output) = run_leasehold(args, &self.envs, stdin);
        assert!(
            status.success(),
            "leasehold {args:?} failed: {status}\n{output}"
        );
        self.output.push(output.clone());
        output
    }

    async fn wait_mark(&mut self, key: &str) -> MarkValue {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let value: Option<String> = self.redis.get(key).await.unwrap();
            if let Some(mark) = value.and_then(|v| MarkValue::parse(&v)) {
                return mark;
            }
            assert!(Instant::now() < deadline, "{key} never appeared");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn idle_marks(&mut self) -> Vec<String> {
        leasehold_pool::bus::redis::scan_keys(&mut self.redis, keys::POOL_WORKER_ACTIVE_PATTERN)
            .await
            .unwrap()
    }

    async fn wait_idle(&mut self, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.idle_marks().await.len() != count {
            assert!(
                Instant::now() < deadline,
                "pool never reached {count} idle workers"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn round_trip(&mut self, user: &str) -> Value {
        let request_id = unique_name("r");
        self.push_order(user, &request_id).await;
        let response = self
            .wait_response(user, &request_id, Duration::from_secs(10), None)
            .await;
        serde_json::from_str(&response).unwrap()
    }

    /// A user with paper credentials for account A1, and the variables of a
    /// broker worker cold-started for that user.
    fn user_with_credentials(&mut self) -> (String, Vec<(String, String)>) {
        let user = unique_name("u");
        self.run(
            &["credentials", "put", &user],
            Some(r#"{"api_key": "k", "account_id": "A1"}"#),
        );
        let mut envs = self.envs.clone();
        envs.push(("USER_ID".into(), user.clone()));
        (user, envs)
    }

    /// Pushes one paper order on account A1 for `user`; returns the body pushed.
    async fn push_order(&mut self, user: &str, request_id: &str) -> String {
        let body = serde_json::json!({
            "request_id": request_id, "action": "place_order",
            "account": {"broker_name": "paper", "broker_type": "stock", "simulation": true, "account_id": "A1"},
            "order": {"symbol": "2330", "side": "buy", "quantity": 1, "price": 600.5}
        })
        .to_string();
        let _: () = self
            .redis
            .lpush(keys::user_requests(user), &body)
            .await
            .unwrap();
        body
    }

    /// The response to `request_id` (raw JSON) once it exists; fails after
    /// `timeout`, showing `worker`'s output when given.
    async fn wait_response(
        &mut self,
        user: &str,
        request_id: &str,
        timeout: Duration,
        worker: Option<&Proc>,
    ) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let value: Option<String> = self
                .redis
                .get(keys::response(user, request_id))
                .await
                .unwrap();
            if let Some(value) = value {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "no response to {request_id} within {timeout:?}\n{}",
                worker.map(Proc::output).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The list `key` as it is now.
    async fn list(&mut self, key: &str) -> Vec<String> {
        self.redis.lrange(key, 0, -1).await.unwrap()
    }

    /// Every worker's log.
    fn worker_logs(&self) -> String {
        std::fs::read_dir(&self.log_dir)
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }

    async fn stop_all(&self) {
        self.kill_workers();
    }

    fn kill_workers(&self) {
        use futures_util::FutureExt;
        // The local launcher's list does no real waiting: it completes at once.
        let tasks = self.launcher.list().now_or_never().and_then(Result::ok);
        for task in tasks.unwrap_or_default() {
            if let Some(pid) = task.task_id.strip_prefix("local-") {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", pid])
                    .status();
            }
        }
    }
}

impl Drop for Pool {
    /// Also on a failed assertion: no worker outlives its test. The worker logs
    /// are kept only when the test failed (they explain it).
    fn drop(&mut self) {
        self.kill_workers();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.log_dir);
        }
    }
}

/// The JSON report line `maintenance` prints on stdout (logs go to stderr).
fn sweep_report(output: &str) -> Value {
    let line = output
        .lines()
        .find(|l| l.starts_with(r#"{"at""#))
        .unwrap_or_else(|| panic!("no report in:\n{output}"));
    serde_json::from_str(line).unwrap()
}

/// The outcome line `claim` prints on stdout.
fn claim_outcome(output: &str) -> Value {
    let line = output
        .lines()
        .find(|l| l.starts_with('{') && l.contains(r#""status":"#))
        .unwrap_or_else(|| panic!("no outcome in:\n{output}"));
    serde_json::from_str(line).unwrap()
}

fn pid_of(mark: &MarkValue) -> &str {
    mark.task_id.strip_prefix("local-").expect("local task id")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_serve_crash_sweep_refill_without_leaking_the_secret() {
    let _serial = serial().await;
    let Some(pool) = Pool::new(8).await else {
        return;
    };
    claim_serve_crash_sweep_refill(pool, 1).await;
}

/// The same cycle in KMS mode: version 2 blobs, workers without a local key,
/// KMS (moto's) decrypting each claim's blob in the pool worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_kms_mode_claim_serve_crash_sweep_refill_without_leaking_the_secret() {
    let _serial = serial().await;
    let Some(endpoint) = leasehold_testkit::dynamodb_endpoint() else {
        return;
    };
    let Some(mut pool) = Pool::new(12).await else {
        return;
    };
    let client = aws_sdk_kms::Client::new(&leasehold_testkit::local_sdk_config(&endpoint));
    let key = client.create_key().send().await.expect("CreateKey");
    let arn = key.key_metadata().unwrap().arn().unwrap().to_owned();
    pool.envs.retain(|(k, _)| k != "CREDENTIALS_KEY");
    for (k, v) in [
        ("CREDENTIALS_KMS_KEY_ID", arn.as_str()),
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "local"),
        ("AWS_SECRET_ACCESS_KEY", "local"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ] {
        pool.envs.push((k.into(), v.into()));
    }
    claim_serve_crash_sweep_refill(pool, 2).await;
}

async fn claim_serve_crash_sweep_refill(mut pool: Pool, version: u64) {
    let user = unique_name("u");
    let credentials = format!(r#"{{"api_key": "{CANARY}", "account_id": "A1"}}"#);
    let manager = spawn_leasehold(
        "pool-manager",
        &["pool-manager", "--every", "1h"],
        &pool.envs,
    );
    async {
        let stored = pool.run(&["credentials", "put", &user], Some(&credentials));
        assert!(
            stored.contains(&format!(
                "stored {} (version {version})",
                keys::credentials(&user)
            )),
            "{stored}"
        );
        pool.wait_idle(1).await;

        // `claim` waits for the outcome the claim step writes and prints it.
        let out = pool.run(&["claim", &user], None);
        assert!(out.contains(": pool-claim"), "{out}");
        let outcome = claim_outcome(&out);
        assert_eq!(outcome["status"], "claimed", "{out}");
        let claimed = pool.wait_mark(&keys::worker_active(&user)).await;
        assert_eq!(outcome["worker_id"], claimed.worker_id.as_str(), "{out}");
        assert!(pool.run(&["claim", &user], None).contains(": active"));
        let response = pool.round_trip(&user).await;
        assert_eq!(response["status"], "ok", "{response}");

        // The pool is empty now; one pass refills it.
        assert!(pool.run(&["pool-manager"], None).contains("started 1"));
        pool.wait_idle(1).await;

        // A claim the pool worker cannot serve (another user's blob replayed
        // under this user's key: bound to that user by the AES associated
        // data, and in KMS mode by the encryption context too) prints
        // `failed` with the reason and exits 1; the worker stays in the pool.
        let stranger = unique_name("u");
        let owner = unique_name("u");
        pool.run(&["credentials", "put", &owner], Some(r#"{"api_key": "k"}"#));
        let blob: String = pool.redis.get(keys::credentials(&owner)).await.unwrap();
        let _: () = pool
            .redis
            .set(keys::credentials(&stranger), blob)
            .await
            .unwrap();
        let (status, out) = run_leasehold(&["claim", &stranger], &pool.envs, None);
        assert_eq!(status.code(), Some(1), "{out}");
        let outcome = claim_outcome(&out);
        assert_eq!(outcome["status"], "failed", "{out}");
        assert!(
            outcome["error"].as_str().unwrap().contains("decrypt"),
            "{out}"
        );
        pool.output.push(out);
        pool.wait_idle(1).await;

        // kill -9 the claimed worker: its marks stay until the sweep (or the TTL).
        std::process::Command::new("kill")
            .args(["-KILL", pid_of(&claimed)])
            .status()
            .unwrap();
        let report: Value = sweep_report(&pool.run(&["maintenance"], None));
        assert_eq!(report["found"]["orphan_mark"], 1, "{report}");
        assert_eq!(report["resolved"]["orphan_mark"], 1, "{report}");
        let exists: bool = pool.redis.exists(keys::worker_active(&user)).await.unwrap();
        assert!(!exists, "the orphan mark was not deleted");
        let stored: String = pool.redis.get(keys::MAINTENANCE_LAST_REPORT).await.unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&stored).unwrap()["found"],
            report["found"]
        );

        // The user gets a worker again from the refilled pool.
        assert!(pool.run(&["claim", &user], None).contains(": pool-claim"));
        let again = pool.wait_mark(&keys::worker_active(&user)).await;
        assert_ne!(again.task_id, claimed.task_id);
        assert_eq!(pool.round_trip(&user).await["status"], "ok");

        // A dry run reports without acting.
        let dry: Value = sweep_report(&pool.run(&["maintenance", "--dry-run"], None));
        assert_eq!(dry["dry_run"], true);
    }
    .await;
    pool.stop_all().await;
    let mut everything = pool.output.join("\n");
    everything.push_str(&manager.output());
    everything.push_str(&pool.worker_logs());
    assert!(
        everything.contains("broker worker"),
        "worker output was not captured:\n{everything}"
    );
    assert!(
        !everything.contains(CANARY),
        "the canary secret leaked:\n{everything}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_start_then_duplicate_worker_the_mark_holder_stays() {
    let _serial = serial().await;
    let Some(mut pool) = Pool::new(9).await else {
        return;
    };
    pool.envs.retain(|(k, _)| k != "POOL_TARGET_SIZE");
    pool.envs.push(("POOL_TARGET_SIZE".into(), "0".into()));
    let user = unique_name("u");
    pool.run(
        &["credentials", "put", &user],
        Some(r#"{"api_key": "k", "account_id": "A1"}"#),
    );
    // No pool worker: the claim cold-starts one for the user.
    let out = pool.run(&["claim", &user], None);
    assert!(out.contains(": cold-start local-"), "{out}");
    let older = pool.wait_mark(&keys::worker_active(&user)).await;
    // Force a second worker onto the same user.
    let mut envs = pool.envs.clone();
    envs.push(("USER_ID".into(), user.clone()));
    envs.push((
        leasehold_broker::launcher::LOCAL_GROUP_VAR.into(),
        pool.launcher.group.clone(),
    ));
    let newer_proc = spawn_leasehold("newer", &["broker-worker"], &envs);
    let newer = format!("local-{}", newer_proc.pid());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report: Value = sweep_report(&pool.run(&["maintenance"], None));
    assert_eq!(report["found"]["duplicate_worker"], 1, "{report}");
    // The older holds the user's mark and serves it: the newer is stopped.
    assert_eq!(
        report["findings"][0]["stop_task"],
        newer.as_str(),
        "{report}"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let running: Vec<String> = pool
            .launcher
            .list()
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.task_id)
            .collect();
        if running == vec![older.task_id.clone()] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the duplicate never stopped: {running:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mark = pool.wait_mark(&keys::worker_active(&user)).await;
    assert_eq!(mark.task_id, older.task_id, "the mark holder kept the user");
    assert_eq!(pool.round_trip(&user).await["status"], "ok");
    pool.stop_all().await;
    drop(newer_proc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_hung_order_exits_promptly_and_the_successor_settles_it() {
    let _serial = serial().await;
    let Some(mut pool) = Pool::new(14).await else {
        return;
    };
    let (user, envs) = pool.user_with_credentials();
    // Every paper order executes and then never answers; the order timeout
    // is far away, so only the stop itself can end the wait.
    let mut hung_envs = envs.clone();
    hung_envs.push(("PAPER_HANG_RATE".into(), "1".into()));
    hung_envs.push(("BROKER_ORDER_TIMEOUT_MS".into(), "120000".into()));
    let mut hung = spawn_leasehold("hung", &["broker-worker"], &hung_envs);
    pool.wait_mark(&keys::worker_active(&user)).await;
    let body = pool.push_order(&user, "r1").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let placed: bool = pool
            .redis
            .hexists(keys::paper_orders("A1"), "r1")
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
    let signalled = Instant::now();
    hung.signal("TERM");
    let status = hung.wait_exit(Duration::from_secs(5));
    assert!(status.success(), "{status}\n{}", hung.output());
    assert!(signalled.elapsed() < Duration::from_secs(5));
    let processing = pool.list(&keys::user_processing(&user)).await;
    assert_eq!(processing, [body], "the request waits for a successor");
    let state: Option<String> = pool
        .redis
        .hget(keys::request_record(&user, "r1"), "state")
        .await
        .unwrap();
    assert_eq!(state.as_deref(), Some("executing"));

    let mut successor = spawn_leasehold("successor", &["broker-worker"], &envs);
    let response: Value = serde_json::from_str(
        &pool
            .wait_response(&user, "r1", Duration::from_secs(15), Some(&successor))
            .await,
    )
    .unwrap();
    assert_eq!(response["status"], "ok", "{response}");
    assert_eq!(
        response["result"]["broker_order_id"], 1,
        "settled by lookup"
    );
    let ledger: i64 = pool.redis.hlen(keys::paper_orders("A1")).await.unwrap();
    assert_eq!(ledger, 1, "executed once");
    successor.signal("TERM");
    assert!(successor.wait_exit(Duration::from_secs(5)).success());
}

/// Supervision with real processes: `kill -9` of a user's worker while a
/// request is pending; `maintenance --every` (supervision every
/// `SUPERVISE_INTERVAL_SECONDS`, the default 10 s here) claims the warm pool
/// worker for the user, which answers the pending request. Prints the time
/// from the kill to that answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_users_worker_is_replaced_from_the_warm_pool_by_supervision() {
    let _serial = serial().await;
    // Database 9 again: `serial` keeps these tests apart.
    let Some(mut pool) = Pool::new(9).await else {
        return;
    };
    pool.envs.retain(|(k, _)| k != "POOL_TARGET_SIZE");
    pool.envs.push(("POOL_TARGET_SIZE".into(), "2".into()));
    let user = unique_name("u");
    pool.run(
        &["credentials", "put", &user],
        Some(r#"{"api_key": "k", "account_id": "A1"}"#),
    );
    let manager = spawn_leasehold(
        "pool-manager",
        &["pool-manager", "--every", "1h"],
        &pool.envs,
    );
    pool.wait_idle(2).await;
    let out = pool.run(&["claim", &user], None);
    assert_eq!(claim_outcome(&out)["status"], "claimed", "{out}");
    let claimed = pool.wait_mark(&keys::worker_active(&user)).await;
    assert_eq!(pool.round_trip(&user).await["status"], "ok");
    pool.wait_idle(1).await;
    let maintenance = spawn_leasehold(
        "maintenance",
        &["maintenance", "--every", "60s"],
        &pool.envs,
    );
    // The first sweep is done: from now on only supervision passes run.
    maintenance.wait_line(r#"{"at""#, Duration::from_secs(15));

    std::process::Command::new("kill")
        .args(["-KILL", pid_of(&claimed)])
        .status()
        .unwrap();
    let killed = Instant::now();
    let request_id = unique_name("r");
    let body = serde_json::json!({
        "request_id": request_id, "action": "place_order",
        "account": {"broker_name": "paper", "broker_type": "stock", "simulation": true, "account_id": "A1"},
        "order": {"symbol": "2330", "side": "buy", "quantity": 1, "price": 600.5}
    });
    let _: () = pool
        .redis
        .lpush(keys::user_requests(&user), body.to_string())
        .await
        .unwrap();
    let deadline = killed + Duration::from_secs(25);
    let response: Value = loop {
        let value: Option<String> = pool
            .redis
            .get(keys::response(&user, &request_id))
            .await
            .unwrap();
        if let Some(value) = value {
            break serde_json::from_str(&value).unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "no replacement served the user within 25 s\n{}",
            maintenance.output()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let replaced_in = killed.elapsed();
    println!("kill -9 → replacement serving the user: {replaced_in:?}");
    assert_eq!(response["status"], "ok", "{response}");
    // Within one supervision interval (10 s) plus the claim itself.
    assert!(
        replaced_in < Duration::from_secs(12),
        "took {replaced_in:?}"
    );
    let again = pool.wait_mark(&keys::worker_active(&user)).await;
    assert_ne!(again.task_id, claimed.task_id);
    maintenance.wait_line(
        &format!("supervise {user}: pool-claim"),
        Duration::from_secs(1),
    );
    pool.stop_all().await;
    drop(maintenance);
    drop(manager);
}

/// `kill -9` in the middle of an order (paper latency 2 s, killed 1 s into the
/// call): the request stays in the user's processing list, a successor settles
/// it, and the request gets exactly one final response while the ledger holds
/// the order once, whichever side of the broker's write the kill fell on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_request_gives_one_final_response_and_one_execution() {
    let _serial = serial().await;
    let Some(mut pool) = Pool::new(13).await else {
        return;
    };
    let (user, envs) = pool.user_with_credentials();
    let mut slow_envs = envs.clone();
    slow_envs.push(("PAPER_LATENCY_MS".into(), "2000".into()));
    let mut victim = spawn_leasehold("victim", &["broker-worker"], &slow_envs);
    pool.wait_mark(&keys::worker_active(&user)).await;
    let request_id = unique_name("r");
    let body = pool.push_order(&user, &request_id).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state: Option<String> = pool
            .redis
            .hget(keys::request_record(&user, &request_id), "state")
            .await
            .unwrap();
        if state.as_deref() == Some("executing") {
            break;
        }
        assert!(Instant::now() < deadline, "the request never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    victim.signal("KILL");
    victim.wait_exit(Duration::from_secs(5));
    let answered: Option<String> = pool
        .redis
        .get(keys::response(&user, &request_id))
        .await
        .unwrap();
    assert_eq!(answered, None, "killed before it could answer");
    let processing = pool.list(&keys::user_processing(&user)).await;
    assert_eq!(
        processing,
        std::slice::from_ref(&body),
        "the request waits for a successor"
    );

    // The dead worker's mark expires (5 s here), then the successor takes over.
    let mut successor = spawn_leasehold("successor", &["broker-worker"], &envs);
    let response = pool
        .wait_response(
            &user,
            &request_id,
            Duration::from_secs(30),
            Some(&successor),
        )
        .await;
    let parsed: Value = serde_json::from_str(&response).unwrap();
    assert_eq!(parsed["status"], "ok", "{parsed}");
    let ledger: i64 = pool.redis.hlen(keys::paper_orders("A1")).await.unwrap();
    assert_eq!(ledger, 1, "executed once");
    // One final response: it does not change, and the same id pushed again is
    // answered from the record without a second execution.
    let _: () = pool
        .redis
        .lpush(keys::user_requests(&user), &body)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let processing: i64 = pool.redis.llen(keys::user_processing(&user)).await.unwrap();
        let queued: i64 = pool.redis.llen(keys::user_requests(&user)).await.unwrap();
        if processing == 0 && queued == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the repeat was never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again: Option<String> = pool
        .redis
        .get(keys::response(&user, &request_id))
        .await
        .unwrap();
    assert_eq!(again.as_deref(), Some(response.as_str()));
    let ledger: i64 = pool.redis.hlen(keys::paper_orders("A1")).await.unwrap();
    assert_eq!(ledger, 1, "not executed again");
    let state: Option<String> = pool
        .redis
        .hget(keys::request_record(&user, &request_id), "state")
        .await
        .unwrap();
    assert_eq!(state.as_deref(), Some("done"));
    successor.signal("TERM");
    assert!(successor.wait_exit(Duration::from_secs(5)).success());
}

/// On ECS (the metadata variable set) a broker worker whose task ARN cannot be
/// read exits with a clear error instead of running as `local-{pid}`, which
/// the maintenance sweep would take for an orphan's mark and an unmarked task.
#[test]
fn on_ecs_a_failed_task_arn_lookup_ends_the_worker() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let envs: Vec<(String, String)> = [
        ("REDIS_URL", "redis://127.0.0.1:1/".to_owned()),
        ("CREDENTIALS_KEY", AesGcmCipher::generate_key()),
        ("CREDENTIALS_ALLOW_LOCAL_KEY", "true".to_owned()),
        (
            "ECS_CONTAINER_METADATA_URI_V4",
            format!("http://127.0.0.1:{port}/v4/task-1"),
        ),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value))
    .collect();
    let (status, output) = run_leasehold(&["broker-worker"], &envs, None);
    assert!(!status.success(), "{output}");
    assert!(
        output.contains("task ARN could not be read"),
        "names the cause: {output}"
    );
    assert!(!output.contains("started"), "never ran: {output}");
}

/// Waits until `request_id`'s record says `state` (the worker reached it).
async fn wait_record_state(pool: &mut Pool, user: &str, request_id: &str, state: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now: Option<String> = pool
            .redis
            .hget(keys::request_record(user, request_id), "state")
            .await
            .unwrap();
        if now.as_deref() == Some(state) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{request_id} never reached {state}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A worker frozen mid-order (SIGSTOP) whose user is served elsewhere in the
/// meantime: when it wakes (SIGCONT) its late "not executed" cannot replace
/// the successor's answer, and the ledger holds the order once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_worker_displaced_mid_order_cannot_overwrite_its_successors_answer() {
    let _serial = serial().await;
    let Some(mut pool) = Pool::new(14).await else {
        return;
    };
    let (user, envs) = pool.user_with_credentials();
    // The victim's broker is slow and fails every order it sends: if its
    // answer landed, it would say `broker`, not executed.
    let mut victim_envs = envs.clone();
    victim_envs.push(("PAPER_LATENCY_MS".into(), "1500".into()));
    victim_envs.push(("PAPER_FAILURE_RATE".into(), "1".into()));
    let mut victim = spawn_leasehold("victim", &["broker-worker"], &victim_envs);
    let victim_mark = pool.wait_mark(&keys::worker_active(&user)).await;
    let request_id = unique_name("r");
    pool.push_order(&user, &request_id).await;
    wait_record_state(&mut pool, &user, &request_id, "executing").await;
    victim.signal("STOP");

    // Its mark expires (5 s); a successor is started for the user and settles
    // the order by lookup: absent, so it places it once and answers `ok`.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let marked: bool = pool.redis.exists(keys::worker_active(&user)).await.unwrap();
        if !marked {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the paused worker's mark never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut successor = spawn_leasehold("successor", &["broker-worker"], &envs);
    let response = pool
        .wait_response(
            &user,
            &request_id,
            Duration::from_secs(30),
            Some(&successor),
        )
        .await;
    let parsed: Value = serde_json::from_str(&response).unwrap();
    assert_eq!(parsed["status"], "ok", "{parsed}");
    assert_eq!(parsed["user_id"], user.as_str());
    let holder = pool.wait_mark(&keys::worker_active(&user)).await;
    assert_ne!(holder.worker_id, victim_mark.worker_id);

    victim.signal("CONT");
    // The victim finds another holder and stops; whatever it tried meanwhile
    // left the successor's answer alone.
    let exit = victim.wait_exit(Duration::from_secs(20));
    assert!(exit.success(), "{exit}\n{}", victim.output());
    let after: Option<String> = pool
        .redis
        .get(keys::response(&user, &request_id))
        .await
        .unwrap();
    assert_eq!(
        after.as_deref(),
        Some(response.as_str()),
        "{}",
        victim.output()
    );
    let stored: Option<String> = pool
        .redis
        .hget(keys::request_record(&user, &request_id), "response")
        .await
        .unwrap();
    assert_eq!(stored.as_deref(), Some(response.as_str()));
    let ledger: i64 = pool.redis.hlen(keys::paper_orders("A1")).await.unwrap();
    assert_eq!(ledger, 1, "executed once");
    successor.signal("TERM");
    assert!(successor.wait_exit(Duration::from_secs(5)).success());
}

/// The codes an API following docs/messages.md reads as "not executed": it
/// may send the order again, under a new request id.
const NOT_EXECUTED: &[&str] = &["timeout", "broker", "expired", "overloaded", "poison"];

/// A broker that books orders late (its gateway holds them: the paper broker
/// with `PAPER_LATE_BOOKING_MS` 1.5 s) behind an order timeout of 0.5 s: the
/// call times out and the lookup finds nothing yet. The answer must be
/// `in_doubt`, so the API (this test, following docs/messages.md) does not
/// resend the order; the late booking lands, and the ledger holds it once.
/// Answered "not executed", the API would resend it under a new id and the
/// broker would book it twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_booking_broker_is_answered_in_doubt_and_books_the_order_once() {
    let _serial = serial().await;
    let Some(mut pool) = Pool::new(10).await else {
        return;
    };
    let user = unique_name("u");
    pool.run(
        &["credentials", "put", &user],
        Some(r#"{"api_key": "k", "account_id": "A1"}"#),
    );
    let mut envs = pool.envs.clone();
    envs.push(("PAPER_LATE_BOOKING_MS".into(), "1500".into()));
    envs.push(("BROKER_ORDER_TIMEOUT_MS".into(), "500".into()));
    envs.push((
        leasehold_broker::launcher::LOCAL_GROUP_VAR.into(),
        pool.launcher.group.clone(),
    ));
    let mut worker = spawn_leasehold("late", &["broker-worker"], &envs);
    pool.wait_idle(1).await;
    let out = pool.run(&["claim", &user], None);
    assert_eq!(claim_outcome(&out)["status"], "claimed", "{out}");
    pool.wait_mark(&keys::worker_active(&user)).await;

    // The API: one order, sent again (once) under a new request id only when
    // the answer says it was not executed.
    let mut sent = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..2 {
        let request_id = unique_name("r");
        pool.push_order(&user, &request_id).await;
        sent.push(request_id.clone());
        let answer: Value = serde_json::from_str(
            &pool
                .wait_response(&user, &request_id, Duration::from_secs(10), Some(&worker))
                .await,
        )
        .unwrap();
        let not_executed = answer["error_code"]
            .as_str()
            .is_some_and(|code| NOT_EXECUTED.contains(&code));
        answers.push(answer);
        if !not_executed {
            break;
        }
    }
    // The broker books every order it was sent, 1.5 s after its call.
    let deadline = Instant::now() + Duration::from_secs(10);
    let ledger = loop {
        let ledger: std::collections::HashMap<String, String> =
            pool.redis.hgetall(keys::paper_orders("A1")).await.unwrap();
        if sent.iter().all(|id| ledger.contains_key(id)) {
            break ledger;
        }
        assert!(
            Instant::now() < deadline,
            "the late booking never landed: {ledger:#?}\n{}",
            worker.output()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        answers[0]["error_code"], "in_doubt",
        "answers {answers:#?}\nledger {ledger:#?}"
    );
    assert_eq!(
        ledger.keys().collect::<Vec<_>>(),
        [&sent[0]],
        "the order is booked once, under its request id; answers {answers:#?}"
    );
    worker.signal("TERM");
    assert!(worker.wait_exit(Duration::from_secs(5)).success());
}

/// u2 pushes a request under u1's request id. Records and answers are keyed
/// by user (`trading:request:{user_id}:{request_id}`), so u2's request gets a
/// record and an answer of its own, and u1's record and answer stay as they
/// were: a reused id reaches nothing of another user's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_users_request_id_gets_its_own_record_and_the_first_answer_stays() {
    let _serial = serial().await;
    let Some(mut pool) = Pool::new(15).await else {
        return;
    };
    let (u1, u1_envs) = pool.user_with_credentials();
    let (u2, u2_envs) = pool.user_with_credentials();
    let mut w1 = spawn_leasehold("w1", &["broker-worker"], &u1_envs);
    let mut w2 = spawn_leasehold("w2", &["broker-worker"], &u2_envs);
    pool.wait_mark(&keys::worker_active(&u1)).await;
    pool.wait_mark(&keys::worker_active(&u2)).await;
    let request_id = unique_name("r");
    pool.push_order(&u1, &request_id).await;
    let first = pool
        .wait_response(&u1, &request_id, Duration::from_secs(10), Some(&w1))
        .await;
    let record_before: std::collections::HashMap<String, String> = pool
        .redis
        .hgetall(keys::request_record(&u1, &request_id))
        .await
        .unwrap();
    pool.push_order(&u2, &request_id).await;
    let second: Value = serde_json::from_str(
        &pool
            .wait_response(&u2, &request_id, Duration::from_secs(10), Some(&w2))
            .await,
    )
    .unwrap();
    assert_eq!(second["user_id"], u2.as_str(), "{second}");
    let record_u2: std::collections::HashMap<String, String> = pool
        .redis
        .hgetall(keys::request_record(&u2, &request_id))
        .await
        .unwrap();
    assert_eq!(record_u2["user_id"], u2);
    let response: Option<String> = pool
        .redis
        .get(keys::response(&u1, &request_id))
        .await
        .unwrap();
    assert_eq!(response.as_deref(), Some(first.as_str()));
    let record_after: std::collections::HashMap<String, String> = pool
        .redis
        .hgetall(keys::request_record(&u1, &request_id))
        .await
        .unwrap();
    assert_eq!(record_after, record_before);
    assert!(
        pool.list(&keys::dead_letter(&keys::user_requests(&u2)))
            .await
            .is_empty(),
        "nothing dead-lettered"
    );
    for worker in [&mut w1, &mut w2] {
        worker.signal("TERM");
        assert!(worker.wait_exit(Duration::from_secs(5)).success());
    }
}

/// A 2 MiB request is answered `too_large` without being parsed or executed
/// (`REQUEST_MAX_BYTES` 64 KiB by default), and the next one is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_mebibyte_request_is_answered_too_large_and_the_next_is_served() {
    let _serial = serial().await;
    let Some(mut pool) = Pool::new(1).await else {
        return;
    };
    let (user, envs) = pool.user_with_credentials();
    let mut worker = spawn_leasehold("worker", &["broker-worker"], &envs);
    pool.wait_mark(&keys::worker_active(&user)).await;
    let request_id = unique_name("big");
    // The id first: the worker reads it from the first 4 KiB only.
    let huge = format!(
        r#"{{"request_id": "{request_id}", "action": "place_order",
            "account": {{"broker_name": "paper", "broker_type": "stock", "simulation": true, "account_id": "A1"}},
            "order": {{"symbol": "2330", "side": "buy", "quantity": 1, "price": 600.5}},
            "note": "{}"}}"#,
        "x".repeat(2 * 1024 * 1024)
    );
    let _: () = pool
        .redis
        .lpush(keys::user_requests(&user), &huge)
        .await
        .unwrap();
    let response = pool
        .wait_response(&user, &request_id, Duration::from_secs(10), Some(&worker))
        .await;
    let parsed: Value = serde_json::from_str(&response).unwrap();
    assert_eq!(parsed["error_code"], "too_large", "{parsed}");
    let dead = pool
        .list(&keys::dead_letter(&keys::user_requests(&user)))
        .await;
    assert_eq!(dead.len(), 1);
    let letter: Value = serde_json::from_str(&dead[0]).unwrap();
    assert_eq!(letter["length"], huge.len() as u64);
    assert!(dead[0].len() < 8 * 1024, "kept truncated");
    let ledger: i64 = pool.redis.hlen(keys::paper_orders("A1")).await.unwrap();
    assert_eq!(ledger, 0, "not executed");
    assert_eq!(pool.round_trip(&user).await["status"], "ok");
    worker.signal("TERM");
    assert!(worker.wait_exit(Duration::from_secs(5)).success());
}
