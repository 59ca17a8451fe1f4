//! The broker pool in one process on the in-memory bus, no Redis: what
//! `leasehold dev` runs. A pool worker is claimed through the pool manager's
//! claim path, serves a request, stops at once on shutdown, and the sweep
//! clears what a vanished worker left behind.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_broker::credentials::{AesGcmCipher, CredentialsCipher};
use leasehold_broker::launcher::{LaunchError, RunningTask, TaskLauncher};
use leasehold_broker::maintenance::{self, SweepConfig};
use leasehold_broker::manager::{self, ClaimPath};
use leasehold_broker::paper::{Broker, PaperBroker, PaperConfig};
use leasehold_broker::worker::{BrokerWorker, BrokerWorkerConfig, WorkerExit};
use leasehold_pool::bus::memory::MemoryPoolBus;
use leasehold_pool::bus::{Inspect, PoolBus};
use leasehold_pool::keys;
use leasehold_telemetry::{LogSink, OrphanKind, RecordingSink};
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
        Arc::new(PaperBroker::new(PaperConfig::default())) as Arc<dyn Broker>,
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
