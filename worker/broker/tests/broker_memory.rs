//! The broker pool in one process on the in-memory bus, no Redis: what
//! `leasehold dev` runs. A pool worker is claimed through the pool manager's
//! claim path, serves a request, stops at once on shutdown, and the sweep
//! clears what a vanished worker left behind.

use std::collections::HashMap;
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
use leasehold_pool::bus::{Inspect, PoolBus};
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

async fn wait_for(bus: &dyn PoolBus, key: &str) -> String {
    for _ in 0..500 {
        if let Some(value) = bus.get(key).await.unwrap() {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{key} never appeared");
}

#[tokio::test]
async fn the_pool_runs_in_one_process_on_the_memory_bus() {
    let bus: Arc<dyn PoolBus> = Arc::new(MemoryPoolBus::new());
    let key = AesGcmCipher::generate_key();
    let cipher = AesGcmCipher::from_base64_key(&key).unwrap();
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
        serde_json::from_str(&wait_for(bus.as_ref(), &keys::response("r1")).await).unwrap();
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
    let bus = Arc::new(MemoryPoolBus::new());
    let key = AesGcmCipher::generate_key();
    let cipher = AesGcmCipher::from_base64_key(&key).unwrap();
    let blob = cipher
        .encrypt("u1", br#"{"api_key": "k", "account_id": "A1"}"#)
        .unwrap();
    bus.put_credentials("u1", &blob).await.unwrap();
    let broker = PaperBroker::new(PaperConfig::default(), bus.clone());
    let brokers: HashMap<String, Arc<dyn Broker>> = HashMap::from([(
        "paper".to_owned(),
        Arc::new(broker.clone()) as Arc<dyn Broker>,
    )]);
    let telemetry = RecordingSink::new();
    let worker = BrokerWorker::new(
        BrokerWorkerConfig::for_tests("w1", Some("u1"), Duration::from_millis(100)),
        bus.clone(),
        Arc::new(cipher),
        brokers,
        Arc::new(telemetry.clone()),
    );
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait_for(bus.as_ref(), &keys::worker_active("u1")).await;
    Served {
        bus,
        broker,
        telemetry,
        shutdown,
        running,
    }
}

impl Served {
    async fn ask(&self, request_id: &str) -> serde_json::Value {
        let request = serde_json::json!({
            "request_id": request_id, "action": "place_order",
            "account": {"broker_name": "paper", "broker_type": "stock", "simulation": true, "account_id": "A1"},
            "order": {"symbol": "2330", "side": "buy", "quantity": 1, "price": 600.5}
        });
        self.bus
            .push_request("u1", &request.to_string())
            .await
            .unwrap();
        serde_json::from_str(&wait_for(self.bus.as_ref(), &keys::response(request_id)).await)
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
    // Lost before the broker: the lookup finds nothing; not executed.
    faults
        .failing_orders
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let failed = served.ask("r2").await;
    assert_eq!(failed["error_code"], "broker", "{failed}");
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
    assert_eq!(served.results("r2"), [RequestResult::Error]);
    assert_eq!(served.results("r3"), [RequestResult::InDoubt]);
    // The in-doubt answer is final: a repeat gets it again, nothing is resent.
    served
        .bus
        .delete_keys(&[keys::response("r3")])
        .await
        .unwrap();
    assert_eq!(served.ask("r3").await, doubtful);
    assert_eq!(served.ledger_len().await, 2);
    served.stop().await;
}
