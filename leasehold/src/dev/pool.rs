//! The broker pool in `dev`: broker workers as tasks of this process (an
//! in-process [`TaskLauncher`]), the pool manager and maintenance loops, and a
//! synthetic order flow of claims, orders and control messages.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_control::clock::{Clock, SystemClock};
use leasehold_control::transport::{BufferedShipper, ShipperConfig};
use leasehold_worker::broker::bus::PoolBus;
use leasehold_worker::broker::connections::ConnectPolicy;
use leasehold_worker::broker::credentials::{AesGcmCipher, CredentialsCipher};
use leasehold_worker::broker::launcher::{LaunchError, RunningTask, TaskLauncher};
use leasehold_worker::broker::maintenance::{self, SweepConfig};
use leasehold_worker::broker::paper::{Broker, PaperBroker, PaperConfig};
use leasehold_worker::broker::pool;
use leasehold_worker::broker::worker::{BrokerWorker, BrokerWorkerConfig, WorkerMetadata};
use tokio_util::sync::CancellationToken;

use crate::Failure;

/// Liveness mark TTL in dev (the seed's 30 s would make the sweep slow to watch).
const MARK_TTL: Duration = Duration::from_secs(10);

struct Task {
    info: RunningTask,
    stop: CancellationToken,
    handle: tokio::task::AbortHandle,
}

/// Removes a task's entry when its future ends or is aborted.
struct Deregister {
    tasks: Arc<Mutex<HashMap<String, Task>>>,
    task_id: String,
}

impl Drop for Deregister {
    fn drop(&mut self) {
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.task_id);
    }
}

/// Broker workers as tasks of this process.
pub(crate) struct InProcessLauncher {
    bus: Arc<dyn PoolBus>,
    key: String,
    telemetry: Arc<BufferedShipper>,
    tasks: Arc<Mutex<HashMap<String, Task>>>,
    next: Mutex<u64>,
}

impl InProcessLauncher {
    fn tasks(&self) -> std::sync::MutexGuard<'_, HashMap<String, Task>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl TaskLauncher for InProcessLauncher {
    async fn start(&self, user_id: Option<&str>) -> Result<String, LaunchError> {
        let number = {
            let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
            *next += 1;
            *next
        };
        let worker_id = format!("pool-{number}");
        let task_id = format!("dev-task-{number}");
        let cipher = AesGcmCipher::from_base64_key(&self.key)
            .map_err(|err| LaunchError::Start(err.to_string()))?;
        let brokers: HashMap<String, Arc<dyn Broker>> = HashMap::from([(
            "paper".to_owned(),
            Arc::new(PaperBroker::new(PaperConfig {
                latency: Duration::from_millis(5),
                failure_rate: 0.02,
            })) as Arc<dyn Broker>,
        )]);
        let started_at = SystemClock.now_ms() as u64;
        let worker = BrokerWorker::new(
            BrokerWorkerConfig {
                worker_id: worker_id.clone(),
                task_id: task_id.clone(),
                user_id: user_id.map(str::to_owned),
                heartbeat: Duration::from_secs(2),
                mark_ttl: MARK_TTL,
                block: Duration::from_secs(5),
                idle_timeout: Duration::from_secs(120),
                health_check: Duration::from_secs(30),
                connect: ConnectPolicy::default(),
                metadata: WorkerMetadata {
                    task_arn: task_id.clone(),
                    instance_id: "dev".into(),
                    launched_at: started_at,
                },
            },
            self.bus.clone(),
            Arc::new(cipher),
            brokers,
            self.telemetry.clone(),
        );
        let stop = CancellationToken::new();
        // Registered before the task runs, and removed by a guard when it ends
        // however it ends: a worker that fails at once must not leave a ghost.
        let mut tasks = self.tasks();
        let handle = tokio::spawn({
            let stop = stop.clone();
            let task_id = task_id.clone();
            let guard = Deregister {
                tasks: self.tasks.clone(),
                task_id: task_id.clone(),
            };
            async move {
                let _guard = guard;
                match worker.run(stop).await {
                    Ok(exit) => tracing::info!(task_id, ?exit, "broker worker stopped"),
                    Err(err) => tracing::warn!(task_id, error = %err, "broker worker failed"),
                }
            }
        })
        .abort_handle();
        tasks.insert(
            task_id.clone(),
            Task {
                info: RunningTask {
                    task_id: task_id.clone(),
                    started_at,
                    user_id: user_id.map(str::to_owned),
                },
                stop,
                handle,
            },
        );
        drop(tasks);
        Ok(task_id)
    }

    async fn stop(&self, task_id: &str, _reason: &str) -> Result<(), LaunchError> {
        if let Some(task) = self.tasks().get(task_id) {
            task.stop.cancel();
        }
        Ok(())
    }

    async fn list(&self) -> Result<Vec<RunningTask>, LaunchError> {
        Ok(self.tasks().values().map(|t| t.info.clone()).collect())
    }
}

/// The running pool and its loops.
pub(crate) struct PoolRuntime {
    bus: Arc<dyn PoolBus>,
    launcher: Arc<InProcessLauncher>,
    telemetry: Arc<BufferedShipper>,
    stop: CancellationToken,
    loops: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl PoolRuntime {
    /// Starts the pool manager, maintenance and the order flow for `users` users.
    pub(crate) async fn start(
        bus: Arc<dyn PoolBus>,
        telemetry_addr: String,
        target: usize,
        users: usize,
        background: CancellationToken,
    ) -> Result<Arc<PoolRuntime>, Failure> {
        let telemetry = Arc::new(BufferedShipper::start(
            ShipperConfig::new(telemetry_addr, "broker-worker", "dev-pool"),
            background.clone(),
        ));
        let key = AesGcmCipher::generate_key();
        let cipher =
            AesGcmCipher::from_base64_key(&key).map_err(|err| Failure::Runtime(err.into()))?;
        let user_ids: Vec<String> = (1..=users.max(1)).map(|i| format!("user-{i:02}")).collect();
        for user in &user_ids {
            // Paper credentials (no real secret); encrypted exactly as in production.
            let blob = cipher
                .encrypt(
                    user,
                    format!(r#"{{"api_key": "paper-{user}", "account_id": "A-{user}"}}"#)
                        .as_bytes(),
                )
                .map_err(|err| Failure::Runtime(err.into()))?;
            bus.put_credentials(user, &blob)
                .await
                .map_err(|err| Failure::Runtime(err.into()))?;
        }
        let launcher = Arc::new(InProcessLauncher {
            bus: bus.clone(),
            key,
            telemetry: telemetry.clone(),
            tasks: Arc::default(),
            next: Mutex::new(0),
        });
        let stop = CancellationToken::new();
        let mut loops = Vec::new();
        loops.push(tokio::spawn(every(Duration::from_secs(2), stop.clone(), {
            let (bus, launcher, telemetry) = (bus.clone(), launcher.clone(), telemetry.clone());
            move || {
                let (bus, launcher, telemetry) = (bus.clone(), launcher.clone(), telemetry.clone());
                async move {
                    if let Err(err) =
                        pool::reconcile(bus.as_ref(), launcher.as_ref(), target, telemetry.as_ref())
                            .await
                    {
                        tracing::warn!(error = %err, "pool manager pass failed");
                    }
                }
            }
        })));
        loops.push(tokio::spawn(order_flow(
            bus.clone(),
            launcher.clone(),
            user_ids,
            stop.clone(),
        )));
        Ok(Arc::new(PoolRuntime {
            bus,
            launcher,
            telemetry,
            stop,
            loops: Mutex::new(loops),
        }))
    }

    /// The maintenance sweep every 5 s until stopped. Awaited by `dev` itself
    /// rather than spawned: the sweep's batch futures are not `Send`-general.
    pub(crate) async fn maintenance(&self) {
        let config = SweepConfig {
            mark_ttl: MARK_TTL,
            grace: Duration::from_secs(5),
            concurrency: 4,
            dry_run: false,
        };
        every(Duration::from_secs(5), self.stop.clone(), || async {
            let swept = maintenance::sweep(
                self.bus.as_ref(),
                self.launcher.as_ref(),
                &config,
                self.telemetry.as_ref(),
            )
            .await;
            if let Err(err) = swept {
                tracing::warn!(error = %err, "maintenance sweep failed");
            }
        })
        .await
    }

    /// Chaos: abort a random broker worker's task without any clean-up, as a
    /// crash would. Its mark stays until maintenance finds it an orphan.
    pub(crate) async fn crash_random_worker(&self) {
        let victim = {
            let mut tasks = self.launcher.tasks();
            let ids: Vec<String> = tasks.keys().cloned().collect();
            (!ids.is_empty())
                .then(|| ids[rand::random_range(0..ids.len())].clone())
                .and_then(|id| tasks.remove(&id))
        };
        if let Some(task) = victim {
            println!(
                "chaos: crash broker worker {} (its mark is left behind for the sweep)",
                task.info.task_id
            );
            task.handle.abort();
        }
    }

    /// Stops the loops and every broker worker.
    pub(crate) async fn stop(&self) {
        self.stop.cancel();
        let loops: Vec<_> =
            std::mem::take(&mut *self.loops.lock().unwrap_or_else(|p| p.into_inner()));
        for handle in loops {
            let _ = handle.await;
        }
        let tasks: Vec<CancellationToken> = self
            .launcher
            .tasks()
            .values()
            .map(|t| t.stop.clone())
            .collect();
        for stop in tasks {
            stop.cancel();
        }
        for _ in 0..100 {
            if self.launcher.tasks().is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn every<F, Fut>(period: Duration, stop: CancellationToken, pass: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut tick = tokio::time::interval(period);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => pass().await,
        }
    }
}

/// Claims, orders and control messages for random users, a few per second.
async fn order_flow(
    bus: Arc<dyn PoolBus>,
    launcher: Arc<InProcessLauncher>,
    users: Vec<String>,
    stop: CancellationToken,
) {
    let mut sent: u64 = 0;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(400)) => {}
        }
        let user = &users[rand::random_range(0..users.len())];
        if let Err(err) = pool::claim_user(bus.as_ref(), launcher.as_ref(), user).await {
            tracing::warn!(user, error = %err, "claim failed");
            continue;
        }
        sent += 1;
        let roll = rand::random_range(0..100u8);
        let pushed = if roll < 3 {
            // Now and then a user's session ends: the pool manager refills the pool.
            bus.push_control(user, r#"{"type": "shutdown"}"#).await
        } else if roll < 10 {
            bus.push_control(user, r#"{"type": "reload_credentials"}"#)
                .await
        } else {
            let request = serde_json::json!({
                "request_id": format!("dev-{}-{sent}", SystemClock.now_ms()),
                "action": "place_order",
                "account": {"broker_name": "paper", "broker_type": "stock", "simulation": true, "account_id": format!("A-{user}")},
                "order": {"symbol": "2330", "side": if sent.is_multiple_of(2) { "buy" } else { "sell" }, "quantity": 1, "price": 600.5}
            });
            bus.push_request(user, &request.to_string()).await
        };
        if let Err(err) = pushed {
            tracing::warn!(user, error = %err, "order flow push failed");
        }
    }
}
