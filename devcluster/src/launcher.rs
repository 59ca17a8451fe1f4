//! Broker workers as tasks of this process: the `dev` cluster's [`TaskLauncher`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_broker::connections::ConnectPolicy;
use leasehold_broker::credentials::Keyring;
use leasehold_broker::launcher::{LaunchError, RunningTask, TaskLauncher};
use leasehold_broker::paper::{Broker, PaperBroker, PaperConfig};
use leasehold_broker::sealer::SealerClient;
use leasehold_broker::worker::{BrokerWorker, BrokerWorkerConfig, WorkerMetadata};
use leasehold_control::clock::{Clock, SystemClock};
use leasehold_pool::bus::PoolBus;
use leasehold_telemetry::transport::BufferedShipper;
use tokio_util::sync::CancellationToken;

use crate::pool::MARK_TTL;

pub(crate) struct Task {
    pub(crate) info: RunningTask,
    pub(crate) stop: CancellationToken,
    pub(crate) handle: tokio::task::AbortHandle,
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
    pub(crate) bus: Arc<dyn PoolBus>,
    /// The in-process credential sealer's base URL: workers hold no key, as
    /// in production.
    pub(crate) sealer_url: String,
    pub(crate) telemetry: Arc<BufferedShipper>,
    pub(crate) tasks: Arc<Mutex<HashMap<String, Task>>>,
    pub(crate) next: Mutex<u64>,
}

impl InProcessLauncher {
    pub(crate) fn tasks(&self) -> std::sync::MutexGuard<'_, HashMap<String, Task>> {
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
        let brokers: HashMap<String, Arc<dyn Broker>> = HashMap::from([(
            "paper".to_owned(),
            Arc::new(PaperBroker::new(
                PaperConfig {
                    latency: Duration::from_millis(5),
                    failure_rate: 0.02,
                    hang_rate: 0.0,
                    late_booking: Duration::ZERO,
                },
                self.bus.clone(),
            )) as Arc<dyn Broker>,
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
                queue_max: leasehold_broker::worker::DEFAULT_QUEUE_MAX,
                bounds: leasehold_broker::worker::RequestBounds::DEFAULT,
                metadata: WorkerMetadata {
                    task_arn: task_id.clone(),
                    instance_id: "dev".into(),
                    launched_at: started_at,
                    sidecar_url: None,
                },
            },
            self.bus.clone(),
            // Nothing to decrypt with: credentials come sealed.
            Arc::new(Keyring::default()),
            brokers,
            self.telemetry.clone(),
        )
        .with_sealer(SealerClient::new(&self.sealer_url, Duration::from_secs(5)));
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
