//! The broker pool in one process on the in-memory bus, no Redis: what
//! `leasehold dev` runs. A pool worker is claimed through the pool manager's
//! claim path, serves a request, stops at once on shutdown, and the sweep
//! clears what a vanished worker left behind.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_broker::credentials::AesGcmCipher;
use leasehold_broker::launcher::{LaunchError, RunningTask, TaskLauncher};
use leasehold_broker::maintenance::{self, SweepConfig};
use leasehold_broker::manager::{self, ClaimPath};
use leasehold_broker::paper::{Broker, PaperBroker, PaperConfig};
use leasehold_broker::worker::{BrokerWorker, BrokerWorkerConfig, WorkerExit};
use leasehold_pool::bus::memory::MemoryPoolBus;
use leasehold_pool::bus::{CredentialBus, Inspect, MarkBus, PoolBus};
use leasehold_pool::keys;
use leasehold_telemetry::{LogSink, OrphanKind, RecordingSink, RequestResult, TelemetryEvent};
use tokio_util::sync::CancellationToken;

/// A launcher whose tasks are whatever the test says runs.
#[derive(Default)]
struct FakeLauncher {
    running: Mutex<Vec<RunningTask>>,
    stopped: Mutex<Vec<String>>,
}

#[async_trait]
impl TaskLauncher for FakeLauncher {
    async fn start(&self, _user_id: Option<&str>) -> Result<String, LaunchError> {
        Err(LaunchError::Start("this test starts workers itself".into()))
    }
    async fn stop(&self, task_id: &str, _reason: &str) -> Result<(), LaunchError> {
        self.stopped.lock().unwrap().push(task_id.to_owned());
        Ok(())
    }
    async fn list(&self) -> Result<Vec<RunningTask>, LaunchError> {
        Ok(self.running.lock().unwrap().clone())
    }
}

fn config(worker_id: &str) -> BrokerWorkerConfig {
    BrokerWorkerConfig::for_tests(worker_id, None, Duration::from_millis(100))
}

/// Waits up to 60 s (of tokio's clock: tests on a paused clock wait through
/// broker timeouts at once).
async fn wait_for(bus: &dyn PoolBus, key: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::time::Instant::now() < deadline {
        if let Some(value) = bus.get(key).await.unwrap() {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{key} never appeared");
}

/// Pool worker `w1` with the paper broker on `bus`, idle in the pool (its mark
/// is there); the cipher its claims must be sealed with, its stop and its task.
async fn pool_worker_w1(
    bus: &Arc<dyn PoolBus>,
) -> (
    AesGcmCipher,
    CancellationToken,
    tokio::task::JoinHandle<Result<WorkerExit, leasehold_broker::worker::WorkerError>>,
) {
    let key = AesGcmCipher::generate_key();
    let brokers: HashMap<String, Arc<dyn Broker>> = HashMap::from([(
        "paper".to_owned(),
        Arc::new(PaperBroker::new(PaperConfig::default(), bus.clone())) as Arc<dyn Broker>,
    )]);
    let worker = BrokerWorker::new(
        config("w1"),
        bus.clone(),
        Arc::new(AesGcmCipher::from_base64_key(&key).unwrap()),
        brokers,
        Arc::new(RecordingSink::new()),
    );
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait_for(bus.as_ref(), &keys::pool_worker_active("w1")).await;
    (
        AesGcmCipher::from_base64_key(&key).unwrap(),
        shutdown,
        running,
    )
}

#[tokio::test]
async fn the_pool_runs_in_one_process_on_the_memory_bus() {
    let bus: Arc<dyn PoolBus> = Arc::new(MemoryPoolBus::new());
    let (cipher, shutdown, running) = pool_worker_w1(&bus).await;

    let blob = cipher
        .encrypt("u1", br#"{"api_key": "k", "account_id": "A1"}"#)
        .unwrap();
    bus.put_credentials("u1", &blob).await.unwrap();
    let launcher = FakeLauncher::default();
    let path = manager::claim_user(bus.as_ref(), &launcher, "u1")
        .await
        .unwrap();
    assert!(matches!(path, ClaimPath::PoolClaim { .. }), "{path}");
    let mark = wait_for(bus.as_ref(), &keys::worker_active("u1")).await;
    assert!(mark.contains(r#""worker_id":"w1""#), "{mark}");
    assert_eq!(
        manager::claim_user(bus.as_ref(), &launcher, "u1")
            .await
            .unwrap(),
        ClaimPath::AlreadyActive
    );

    let request = serde_json::json!({
        "request_id": "r1", "action": "place_order",
        "account": {"broker_name": "paper", "broker_type": "stock", "simulation": true, "account_id": "A1"},
        "order": {"symbol": "2330", "side": "buy", "quantity": 1, "price": 600.5}
    });
    bus.push_request("u1", &request.to_string()).await.unwrap();
    let response: serde_json::Value =
        serde_json::from_str(&wait_for(bus.as_ref(), &keys::response("u1", "r1")).await).unwrap();
    assert_eq!(response["status"], "ok", "{response}");

    // Shutdown interrupts the 30 s blocking pop at once and deletes the marks.
    shutdown.cancel();
    let exit = tokio::time::timeout(Duration::from_secs(2), running)
        .await
        .expect("the blocked pop was interrupted")
        .unwrap()
        .unwrap();
    assert_eq!(exit, WorkerExit::Signal);
    assert!(!bus.user_is_active("u1").await.unwrap());
    assert!(
        bus.hash_get_all(&keys::worker_metadata("u1"))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn the_sweep_deletes_orphan_marks_on_the_memory_bus() {
    let bus = MemoryPoolBus::new();
    let mark = serde_json::json!({
        "worker_id": "gone", "task_id": "task-gone", "user_id": "-1",
        "heartbeat_at": leasehold_control::clock::unix_ms(std::time::SystemTime::now()),
        "started_at": 1
    });
    bus.set_pool_mark("gone", &mark.to_string(), Duration::from_secs(30))
        .await
        .unwrap();
    let launcher = FakeLauncher::default();
    let sweep = SweepConfig {
        mark_ttl: Duration::from_secs(30),
        grace: Duration::from_secs(60),
        concurrency: 2,
        dry_run: false,
        supervise: None,
        max_fraction: maintenance::DEFAULT_MAX_FRACTION,
    };
    let report = maintenance::sweep(&bus, &launcher, &sweep, &LogSink)
        .await
        .unwrap();
    assert_eq!(report.found[&OrphanKind::OrphanMark], 1);
    assert_eq!(report.resolved[&OrphanKind::OrphanMark], 1);
    assert_eq!(
        bus.get(&keys::pool_worker_active("gone")).await.unwrap(),
        None
    );
    let stored: serde_json::Value =
        serde_json::from_str(&bus.maintenance_report().await.unwrap().unwrap()).unwrap();
    assert_eq!(stored["found"]["orphan_mark"], 1);
    assert!(launcher.stopped.lock().unwrap().is_empty());
}

/// One claimed worker for `u1` on a memory bus the test can break.
struct Served {
    bus: Arc<MemoryPoolBus>,
    broker: PaperBroker,
    telemetry: RecordingSink,
    shutdown: CancellationToken,
    running: tokio::task::JoinHandle<Result<WorkerExit, leasehold_broker::worker::WorkerError>>,
}

async fn serve_u1() -> Served {
    serve("u1", |_| {}, &[]).await
}

/// A claimed worker for `user` (config adjusted by `tune`), started after
/// `queued` requests were pushed.
async fn serve(user: &str, tune: impl FnOnce(&mut BrokerWorkerConfig), queued: &[&str]) -> Served {
    let bus = Arc::new(MemoryPoolBus::new());
    serve_on(bus, user, "w1", PaperConfig::default(), tune, queued).await
}

/// [`serve`] on a given bus, as worker `worker_id`, with a paper broker of
/// its own configured by `paper` (the ledger is the bus's, shared).
async fn serve_on(
    bus: Arc<MemoryPoolBus>,
    user: &str,
    worker_id: &str,
    paper: PaperConfig,
    tune: impl FnOnce(&mut BrokerWorkerConfig),
    queued: &[&str],
) -> Served {
    let key = AesGcmCipher::generate_key();
    let cipher = AesGcmCipher::from_base64_key(&key).unwrap();
    let blob = cipher
        .encrypt(user, br#"{"api_key": "k", "account_id": "A1"}"#)
        .unwrap();
    bus.put_credentials(user, &blob).await.unwrap();
    for id in queued {
        bus.push_request(user, &request_body(id, "A1"))
            .await
            .unwrap();
    }
    let broker = PaperBroker::new(paper, bus.clone());
    let brokers: HashMap<String, Arc<dyn Broker>> = HashMap::from([(
        "paper".to_owned(),
        Arc::new(broker.clone()) as Arc<dyn Broker>,
    )]);
    let telemetry = RecordingSink::new();
    let mut config =
        BrokerWorkerConfig::for_tests(worker_id, Some(user), Duration::from_millis(100));
    tune(&mut config);
    let worker = BrokerWorker::new(
        config,
        bus.clone(),
        Arc::new(cipher),
        brokers,
        Arc::new(telemetry.clone()),
    );
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait_for(bus.as_ref(), &keys::worker_active(user)).await;
    Served {
        bus,
        broker,
        telemetry,
        shutdown,
        running,
    }
}

fn request_body(request_id: &str, account_id: &str) -> String {
    serde_json::json!({
        "request_id": request_id, "action": "place_order",
        "account": {"broker_name": "paper", "broker_type": "stock", "simulation": true, "account_id": account_id},
        "order": {"symbol": "2330", "side": "buy", "quantity": 1, "price": 600.5}
    })
    .to_string()
}

impl Served {
    async fn ask(&self, request_id: &str) -> serde_json::Value {
        self.ask_as("u1", request_id, "A1").await
    }

    async fn ask_as(&self, user: &str, request_id: &str, account_id: &str) -> serde_json::Value {
        self.bus
            .push_request(user, &request_body(request_id, account_id))
            .await
            .unwrap();
        self.response(user, request_id).await
    }

    async fn response(&self, user: &str, request_id: &str) -> serde_json::Value {
        serde_json::from_str(&wait_for(self.bus.as_ref(), &keys::response(user, request_id)).await)
            .unwrap()
    }

    async fn ledger_len(&self) -> usize {
        self.bus
            .hash_get_all(&keys::paper_orders("A1"))
            .await
            .unwrap()
            .len()
    }

    fn results(&self, request_id: &str) -> Vec<RequestResult> {
        self.telemetry
            .snapshot()
            .into_iter()
            .filter_map(|e| match e {
                TelemetryEvent::BrokerRequest {
                    request_id: Some(id),
                    result,
                    ..
                } if id == request_id => Some(result),
                _ => None,
            })
            .collect()
    }

    async fn stop(self) {
        assert!(!self.running.is_finished(), "the worker died");
        self.shutdown.cancel();
        let exit = tokio::time::timeout(Duration::from_secs(5), self.running)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(exit.unwrap(), WorkerExit::Signal);
    }
}

#[tokio::test]
async fn redis_failing_while_recording_neither_kills_the_worker_nor_drops_the_request() {
    let served = serve_u1().await;
    // Before the broker call: the request waits in processing, then runs once.
    served.bus.fail_begins(3);
    assert_eq!(served.ask("r1").await["status"], "ok");
    // After the broker call: the response is stored on a retry, the order is
    // not sent again.
    served.bus.fail_answers(3);
    let response = served.ask("r2").await;
    assert_eq!(response["status"], "ok", "{response}");
    assert_eq!(response["result"]["broker_order_id"], 2);
    assert_eq!(served.ledger_len().await, 2);
    assert_eq!(served.results("r1"), [RequestResult::Ok]);
    assert_eq!(served.results("r2"), [RequestResult::Ok]);
    assert_eq!(
        served
            .bus
            .list_len(&keys::user_processing("u1"))
            .await
            .unwrap(),
        0
    );
    served.stop().await;
}

#[tokio::test]
async fn an_order_whose_reply_is_lost_is_looked_up_never_resent() {
    let served = serve_u1().await;
    let faults = served.broker.faults();
    // Executed, reply lost: the lookup finds it.
    faults
        .lost_replies
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let found = served.ask("r1").await;
    assert_eq!(found["status"], "ok", "{found}");
    assert_eq!(found["result"]["broker_order_id"], 1);
    // Lost before the broker: the lookup finds nothing, but a broker may
    // still book an order that reached it, so the answer is in doubt (an API
    // told "not executed" would resend it).
    faults
        .failing_orders
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let failed = served.ask("r2").await;
    assert_eq!(failed["error_code"], "in_doubt", "{failed}");
    // Executed, reply lost, and the broker cannot be asked: in doubt, final.
    faults
        .lost_replies
        .store(1, std::sync::atomic::Ordering::SeqCst);
    faults
        .failing_lookups
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let doubtful = served.ask("r3").await;
    assert_eq!(doubtful["error_code"], "in_doubt", "{doubtful}");
    assert_eq!(
        served.ledger_len().await,
        2,
        "r1 and r3 executed, each once"
    );
    assert_eq!(served.results("r1"), [RequestResult::Ok]);
    assert_eq!(served.results("r2"), [RequestResult::InDoubt]);
    assert_eq!(served.results("r3"), [RequestResult::InDoubt]);
    // The in-doubt answer is final: a repeat gets it again, nothing is resent.
    served
        .bus
        .delete_keys(&[keys::response("u1", "r3")])
        .await
        .unwrap();
    assert_eq!(served.ask("r3").await, doubtful);
    assert_eq!(served.ledger_len().await, 2);
    served.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_hung_order_is_settled_by_lookup_after_the_order_timeout() {
    let served = serve_u1().await;
    let faults = served.broker.faults();
    // Executed, then silent: the lookup after the timeout finds it.
    faults.hanging_orders.store(1, Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    let found = served.ask("r1").await;
    assert_eq!(found["status"], "ok", "{found}");
    assert_eq!(found["result"]["broker_order_id"], 1);
    let waited = started.elapsed();
    // The 10 s order timeout is cut to the time the worker surely still holds
    // the user: this harness's 2 s mark TTL less its 100 ms heartbeat.
    assert!(
        (Duration::from_millis(1_900)..Duration::from_millis(2_500)).contains(&waited),
        "answered once the call was cut at the holder deadline (1.9 s), not before and not after the 10 s order timeout: {waited:?}"
    );
    // Silent before the broker took it: the lookup finds nothing yet, and
    // the answer is in doubt, never "not executed" (it may be booked late).
    faults.stalled_orders.store(1, Ordering::SeqCst);
    let timed_out = served.ask("r2").await;
    assert_eq!(timed_out["error_code"], "in_doubt", "{timed_out}");
    // Silent, and the lookup too: in doubt.
    faults.hanging_orders.store(1, Ordering::SeqCst);
    faults.hanging_lookups.store(1, Ordering::SeqCst);
    let doubtful = served.ask("r3").await;
    assert_eq!(doubtful["error_code"], "in_doubt", "{doubtful}");
    assert_eq!(served.ledger_len().await, 2, "r1 and r3 executed, r2 not");
    assert_eq!(served.results("r1"), [RequestResult::Ok]);
    assert_eq!(served.results("r2"), [RequestResult::InDoubt]);
    assert_eq!(served.results("r3"), [RequestResult::InDoubt]);
    // The worker goes on.
    assert_eq!(served.ask("r4").await["status"], "ok");
    served.stop().await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_does_not_wait_for_a_hung_order_and_the_successor_settles_it() {
    let served = serve_u1().await;
    served
        .broker
        .faults()
        .hanging_orders
        .store(1, Ordering::SeqCst);
    let body = request_body("r1", "A1");
    served.bus.push_request("u1", &body).await.unwrap();
    while served.ledger_len().await == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    served.shutdown.cancel();
    let exit = tokio::time::timeout(Duration::from_secs(2), served.running)
        .await
        .expect("the worker did not wait for the hung broker call")
        .unwrap()
        .unwrap();
    assert_eq!(exit, WorkerExit::Signal);
    let bus = served.bus;
    assert_eq!(
        bus.list_items(&keys::user_processing("u1")).await.unwrap(),
        [body],
        "the request waits in processing for a successor"
    );
    assert_eq!(bus.get(&keys::response("u1", "r1")).await.unwrap(), None);
    assert_eq!(
        bus.hash_get_all(&keys::request_record("u1", "r1"))
            .await
            .unwrap()["state"],
        "executing"
    );

    // The successor settles it from the broker's record, never sends it again.
    let key = AesGcmCipher::generate_key();
    let cipher = AesGcmCipher::from_base64_key(&key).unwrap();
    let blob = cipher
        .encrypt("u1", br#"{"api_key": "k", "account_id": "A1"}"#)
        .unwrap();
    bus.put_credentials("u1", &blob).await.unwrap();
    let brokers: HashMap<String, Arc<dyn Broker>> = HashMap::from([(
        "paper".to_owned(),
        Arc::new(PaperBroker::new(PaperConfig::default(), bus.clone())) as Arc<dyn Broker>,
    )]);
    let successor = BrokerWorker::new(
        BrokerWorkerConfig::for_tests("w2", Some("u1"), Duration::from_millis(100)),
        bus.clone(),
        Arc::new(cipher),
        brokers,
        Arc::new(RecordingSink::new()),
    );
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(successor.run(shutdown.clone()));
    let response: serde_json::Value =
        serde_json::from_str(&wait_for(bus.as_ref(), &keys::response("u1", "r1")).await).unwrap();
    assert_eq!(response["status"], "ok", "{response}");
    assert_eq!(response["result"]["broker_order_id"], 1);
    assert_eq!(
        bus.hash_get_all(&keys::paper_orders("A1"))
            .await
            .unwrap()
            .len(),
        1,
        "executed once"
    );
    assert_eq!(bus.list_len(&keys::user_processing("u1")).await.unwrap(), 0);
    shutdown.cancel();
    running.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn one_failing_account_fails_its_requests_not_the_worker() {
    let served = serve_u1().await;
    // The user's credentials are for A1: every connect for A2 fails.
    let refused = served.ask_as("u1", "a2-1", "A2").await;
    assert_eq!(refused["error_code"], "broker", "{refused}");
    assert!(!served.running.is_finished(), "the worker stays up");
    // A1 is served meanwhile, and A2 is answered at once while it backs off.
    assert_eq!(served.ask("a1-1").await["status"], "ok");
    let started = tokio::time::Instant::now();
    let again = served.ask_as("u1", "a2-2", "A2").await;
    assert_eq!(again["error_code"], "broker", "{again}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "answered at once while the account backs off"
    );
    // A broker that hangs on connect: each attempt ends at the connect timeout.
    served
        .broker
        .faults()
        .hanging_connects
        .store(3, Ordering::SeqCst);
    served
        .bus
        .push_control("u1", r#"{"type": "reload_credentials"}"#)
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let hung = served.ask("a1-2").await;
    assert_eq!(hung["error_code"], "broker", "{hung}");
    assert!(started.elapsed() >= Duration::from_secs(45), "3 × 15 s");
    assert_eq!(served.results("a2-1"), [RequestResult::Error]);
    assert_eq!(served.results("a1-2"), [RequestResult::Error]);
    // A1 recovers once its backoff (at most 1 s after one failed round) passed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(served.ask("a1-3").await["status"], "ok");
    served.stop().await;
}

#[tokio::test(start_paused = true)]
async fn requests_over_the_queue_cap_are_answered_overloaded_none_lost() {
    let ids: Vec<String> = (1..=10).map(|i| format!("q{i}")).collect();
    let queued: Vec<&str> = ids.iter().map(String::as_str).collect();
    let served = serve("u1", |config| config.queue_max = 3, &queued).await;
    let mut ok = Vec::new();
    let mut overloaded = Vec::new();
    for id in &ids {
        let response = served.response("u1", id).await;
        match response["error_code"].as_str() {
            None => ok.push(id.clone()),
            Some("overloaded") => overloaded.push(id.clone()),
            Some(other) => panic!("{id}: {other}"),
        }
    }
    // q1 was taken first; of the nine behind it the oldest three stay.
    assert_eq!(ok, ["q1", "q2", "q3", "q4"]);
    assert_eq!(overloaded, ["q5", "q6", "q7", "q8", "q9", "q10"]);
    assert_eq!(served.ledger_len().await, 4);
    for id in &overloaded {
        assert_eq!(served.results(id), [RequestResult::Overloaded]);
    }
    assert_eq!(
        served
            .bus
            .list_len(&keys::user_requests("u1"))
            .await
            .unwrap(),
        0
    );
    served.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_user_id_that_could_name_pool_keys_is_served_nothing() {
    // Claimed somehow (the claim path must refuse it; see keys::check_user_id).
    let served = serve("-1:w7", |_| {}, &[]).await;
    let response = served.ask_as("-1:w7", "r1", "A1").await;
    assert_eq!(response["error_code"], "invalid", "{response}");
    assert_eq!(served.ledger_len().await, 0);
    let dead = served
        .bus
        .list_items(&keys::dead_letter(&keys::user_requests("-1:w7")))
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert!(dead[0].contains("user id must not start with"), "{dead:?}");
    served
        .bus
        .push_control("-1:w7", r#"{"type": "reload_credentials"}"#)
        .await
        .unwrap();
    let control_dead = keys::dead_letter(&keys::worker_control("-1:w7"));
    while served.bus.list_len(&control_dead).await.unwrap() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    served.stop().await;
}

/// The claim step ran but its reply was lost: the worker does not take that
/// for a failure (the user would be marked with no one serving) but asks the
/// bus again and finds the user's mark is its own.
#[tokio::test]
async fn an_unknown_claim_outcome_is_resolved_from_the_mark() {
    let memory = Arc::new(MemoryPoolBus::new());
    let bus: Arc<dyn PoolBus> = memory.clone();
    let (cipher, shutdown, running) = pool_worker_w1(&bus).await;
    memory.lose_settle_replies(1);
    let blob = cipher
        .encrypt("u1", br#"{"api_key": "k", "account_id": "A1"}"#)
        .unwrap();
    let claim = leasehold_pool::protocol::ClaimMessage {
        user_id: "u1".into(),
        encrypted_credentials: blob,
        claim_id: "c-lost".into(),
        enqueued_at: 1,
    };
    bus.push_claim(&claim.to_json()).await.unwrap();
    let outcome = wait_for(bus.as_ref(), &keys::claim_outcome("c-lost")).await;
    assert_eq!(outcome, r#"{"status":"claimed","worker_id":"w1"}"#);
    let request = serde_json::json!({
        "request_id": "r-lost", "action": "place_order",
        "account": {"broker_name": "paper", "broker_type": "stock", "simulation": true, "account_id": "A1"},
        "order": {"symbol": "2330", "side": "buy", "quantity": 1, "price": 600.5}
    });
    bus.push_request("u1", &request.to_string()).await.unwrap();
    let response: serde_json::Value =
        serde_json::from_str(&wait_for(bus.as_ref(), &keys::response("u1", "r-lost")).await)
            .unwrap();
    assert_eq!(
        response["status"], "ok",
        "the worker went on to serve the user"
    );
    shutdown.cancel();
    running.await.unwrap().unwrap();
}

/// A request id reused by another user: records and answers are keyed by
/// user, so u2's request gets a record and an answer of its own and u1's stay
/// as they were; responses name their user.
#[tokio::test(start_paused = true)]
async fn a_request_id_of_another_user_reaches_nothing_of_the_first_users() {
    let u1 = serve_u1().await;
    let first = u1.ask("r1").await;
    assert_eq!(first["status"], "ok", "{first}");
    assert_eq!(first["user_id"], "u1", "a response names its user");
    let record_before = u1
        .bus
        .hash_get_all(&keys::request_record("u1", "r1"))
        .await
        .unwrap();
    let u2 = serve_on(
        u1.bus.clone(),
        "u2",
        "w2",
        PaperConfig::default(),
        |_| {},
        &[],
    )
    .await;
    let second = u2.ask_as("u2", "r1", "A2").await;
    assert_eq!(second["user_id"], "u2", "{second}");
    assert_eq!(
        u2.bus
            .hash_get_all(&keys::request_record("u2", "r1"))
            .await
            .unwrap()["user_id"],
        "u2"
    );
    assert_eq!(
        u2.bus
            .hash_get_all(&keys::request_record("u1", "r1"))
            .await
            .unwrap(),
        record_before
    );
    assert_eq!(
        u2.response("u1", "r1").await,
        first,
        "u1's response is untouched"
    );
    let dead = keys::dead_letter(&keys::user_requests("u2"));
    assert_eq!(
        u2.bus.list_len(&dead).await.unwrap(),
        0,
        "nothing dead-lettered"
    );
    u2.stop().await;
    u1.stop().await;
}

/// A request over `REQUEST_MAX_BYTES` is answered `too_large` from its head,
/// never parsed or executed, dead-lettered truncated with its length; the
/// next request is served.
#[tokio::test(start_paused = true)]
async fn a_request_over_the_size_bound_is_answered_too_large_unparsed() {
    let served = serve("u1", |config| config.bounds.max_bytes = 1_024, &[]).await;
    // The id first, as the worker reads it from the first 4 KiB only (a
    // JSON map serialised by serde_json would put it last).
    let huge = format!(
        r#"{{"request_id": "big", "action": "place_order",
            "account": {{"broker_name": "paper", "broker_type": "stock", "simulation": true, "account_id": "A1"}},
            "order": {{"symbol": "2330{}", "side": "buy", "quantity": 1}}}}"#,
        "x".repeat(2 * 1024 * 1024)
    );
    assert!(huge.len() > 2 * 1024 * 1024);
    served.bus.push_request("u1", &huge).await.unwrap();
    let response = served.response("u1", "big").await;
    assert_eq!(response["error_code"], "too_large", "{response}");
    assert_eq!(response["user_id"], "u1");
    let dead = served
        .bus
        .list_items(&keys::dead_letter(&keys::user_requests("u1")))
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert!(
        dead[0].len() < 8 * 1024,
        "kept truncated: {} bytes",
        dead[0].len()
    );
    let letter: serde_json::Value = serde_json::from_str(&dead[0]).unwrap();
    assert_eq!(letter["reason"], "too_large");
    assert_eq!(letter["length"], huge.len() as u64);
    assert_eq!(served.results("big"), [RequestResult::Invalid]);
    assert_eq!(served.ask("r2").await["status"], "ok");
    assert_eq!(served.ledger_len().await, 1, "only r2 executed");
    served.stop().await;
}

/// A request three workers took without a final answer (each stopped by it)
/// is settled by the fourth without placing it: looked up, absent, `poison`.
#[tokio::test(start_paused = true)]
async fn a_request_taken_too_often_is_settled_as_poison_never_placed() {
    let bus = Arc::new(MemoryPoolBus::new());
    bus.push_request("u1", &request_body("p1", "A1"))
        .await
        .unwrap();
    for (round, crashed) in ["c1", "c2", "c3"].iter().enumerate() {
        let mark = leasehold_pool::protocol::MarkValue {
            worker_id: (*crashed).into(),
            task_id: format!("task-{crashed}"),
            user_id: "u1".into(),
            heartbeat_at: 1,
            started_at: 1,
            sidecar_url: None,
            ttl_ms: None,
            heartbeat_interval_ms: None,
            seal_key: None,
        }
        .to_json();
        let metadata = leasehold_pool::bus::WorkerMetadata {
            task_arn: format!("task-{crashed}"),
            instance_id: "h".into(),
            launched_at: 1,
            sidecar_url: None,
        };
        let write = leasehold_pool::bus::MarkWrite {
            user_id: "u1",
            worker_id: crashed,
            value: &mark,
            ttl: Duration::from_secs(30),
            metadata: &metadata,
        };
        assert!(bus.claim_user(&write).await.unwrap());
        let begun = bus.begin_request("p1", "u1", crashed, 1).await.unwrap();
        assert!(
            !matches!(begun, leasehold_pool::bus::Begun::NotHolder),
            "round {round}: {begun:?}"
        );
        // It dies with the request in processing, executing.
        bus.release_user_mark("u1", crashed).await.unwrap();
    }
    let served = serve_on(bus, "u1", "w1", PaperConfig::default(), |_| {}, &["p1"]).await;
    let response = served.response("u1", "p1").await;
    assert_eq!(response["error_code"], "poison", "{response}");
    assert_eq!(served.ledger_len().await, 0, "never placed");
    assert_eq!(
        served
            .bus
            .hash_get_all(&keys::request_record("u1", "p1"))
            .await
            .unwrap()["deliveries"],
        "4"
    );
    assert_eq!(served.ask("r2").await["status"], "ok", "the queue moves on");
    served.stop().await;
}

/// A record lost in a failover: the repeated client order id is looked up
/// and answered from the broker's record, not `duplicate`, and not placed twice.
#[tokio::test(start_paused = true)]
async fn a_repeated_client_order_id_is_looked_up_after_a_lost_record() {
    let served = serve_u1().await;
    let first = served.ask("r1").await;
    assert_eq!(first["status"], "ok", "{first}");
    served
        .bus
        .delete_keys(&[keys::request_record("u1", "r1"), keys::response("u1", "r1")])
        .await
        .unwrap();
    let again = served.ask("r1").await;
    assert_eq!(again["status"], "ok", "{again}");
    assert_eq!(
        again["result"]["broker_order_id"],
        first["result"]["broker_order_id"]
    );
    assert_eq!(served.ledger_len().await, 1, "executed once");
    served.stop().await;
}

/// `expires_at` is checked again once the broker connection is ready: an
/// order whose connect outlasted it is answered `expired`, never sent.
/// (Real time: expiry is wall-clock, which a paused tokio clock does not move.)
#[tokio::test]
async fn an_order_that_expires_while_connecting_is_not_sent() {
    let paper = PaperConfig {
        latency: Duration::from_millis(600),
        ..PaperConfig::default()
    };
    let served = serve_on(
        Arc::new(MemoryPoolBus::new()),
        "u1",
        "w1",
        paper,
        |_| {},
        &[],
    )
    .await;
    let now = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let mut body: serde_json::Value = serde_json::from_str(&request_body("e1", "A1")).unwrap();
    body["expires_at"] = serde_json::json!(now + 300);
    served
        .bus
        .push_request("u1", &body.to_string())
        .await
        .unwrap();
    let response = served.response("u1", "e1").await;
    assert_eq!(response["error_code"], "expired", "{response}");
    assert_eq!(served.ledger_len().await, 0, "never sent");
    served.stop().await;
}

/// Heartbeats that reach the bus but whose replies are lost: the mark stays
/// fresh, but the worker cannot show it still holds the user, so past its
/// holder deadline (mark TTL − heartbeat) it places nothing; once a
/// heartbeat is confirmed again the order runs, once.
#[tokio::test(start_paused = true)]
async fn a_worker_that_cannot_confirm_its_mark_places_no_order() {
    let served = serve_u1().await;
    served.bus.lose_refresh_replies(u32::MAX);
    // 2 s mark TTL, 100 ms heartbeat: the deadline passes after 1.9 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    served
        .bus
        .push_request("u1", &request_body("h1", "A1"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        served.ledger_len().await,
        0,
        "placed past the holder deadline"
    );
    assert_eq!(
        served.bus.get(&keys::response("u1", "h1")).await.unwrap(),
        None,
        "nothing answered"
    );
    served.bus.lose_refresh_replies(0);
    let response = served.response("u1", "h1").await;
    assert_eq!(response["status"], "ok", "{response}");
    assert_eq!(served.ledger_len().await, 1);
    served.stop().await;
}

/// A cipher whose first `throttled` decrypts fail as KMS throttling does.
struct ThrottledOnce {
    inner: AesGcmCipher,
    throttled: std::sync::atomic::AtomicU32,
}

#[async_trait]
impl leasehold_broker::credentials::CredentialsCipher for ThrottledOnce {
    async fn encrypt(
        &self,
        user_id: &str,
        plaintext: &[u8],
    ) -> Result<String, leasehold_broker::credentials::CipherError> {
        self.inner.encrypt(user_id, plaintext)
    }
    async fn decrypt(
        &self,
        user_id: &str,
        blob: &str,
    ) -> Result<
        leasehold_broker::credentials::Credentials,
        leasehold_broker::credentials::CipherError,
    > {
        if self
            .throttled
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(leasehold_broker::credentials::CipherError::KmsThrottled {
                operation: "Decrypt",
            });
        }
        self.inner.decrypt(user_id, blob)
    }
}

/// KMS throttling a claim's decrypt is not the claim's fault: the claim goes
/// back first in line and is served once KMS answers, never failed for good.
#[tokio::test]
async fn a_claim_whose_decrypt_is_throttled_is_put_back_and_served() {
    let bus: Arc<dyn PoolBus> = Arc::new(MemoryPoolBus::new());
    let key = AesGcmCipher::generate_key();
    let cipher = ThrottledOnce {
        inner: AesGcmCipher::from_base64_key(&key).unwrap(),
        throttled: std::sync::atomic::AtomicU32::new(2),
    };
    let worker = BrokerWorker::new(
        config("w1"),
        bus.clone(),
        Arc::new(cipher),
        HashMap::new(),
        Arc::new(RecordingSink::new()),
    );
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait_for(bus.as_ref(), &keys::pool_worker_active("w1")).await;
    let blob = AesGcmCipher::from_base64_key(&key)
        .unwrap()
        .encrypt("u1", br#"{"api_key": "k"}"#)
        .unwrap();
    let claim = leasehold_pool::protocol::ClaimMessage {
        user_id: "u1".into(),
        encrypted_credentials: blob,
        claim_id: "c-throttled".into(),
        enqueued_at: 1,
    };
    bus.push_claim(&claim.to_json()).await.unwrap();
    let outcome = wait_for(bus.as_ref(), &keys::claim_outcome("c-throttled")).await;
    assert_eq!(outcome, r#"{"status":"claimed","worker_id":"w1"}"#);
    assert_eq!(
        bus.list_len(&keys::dead_letter(keys::POOL_CLAIMS))
            .await
            .unwrap(),
        0,
        "not dead-lettered"
    );
    shutdown.cancel();
    running.await.unwrap().unwrap();
}
