//! The broker pool in `dev`: broker workers as tasks of this process (see
//! [`crate::launcher`]), the pool manager and maintenance loops, and a synthetic
//! order flow of claims, orders and control messages.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_broker::credentials::AesGcmCipher;
use leasehold_broker::maintenance::{self, SweepConfig};
use leasehold_broker::manager;
use leasehold_broker::sealer::CredentialSealer;
use leasehold_control::clock::{Clock, SystemClock};
use leasehold_pool::bus::PoolBus;
use leasehold_telemetry::transport::{BufferedShipper, ShipperConfig};
use tokio_util::sync::CancellationToken;

use crate::DevError;
use crate::launcher::InProcessLauncher;

/// Liveness mark TTL in dev (production's 30 s would make the sweep slow to watch).
pub(crate) const MARK_TTL: Duration = Duration::from_secs(10);

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
    ) -> Result<Arc<PoolRuntime>, DevError> {
        let telemetry = Arc::new(BufferedShipper::start(
            ShipperConfig::new(telemetry_addr, "broker-worker", "dev-pool"),
            background.clone(),
        ));
        let key = AesGcmCipher::generate_key();
        let cipher = AesGcmCipher::from_base64_key(&key)
            .map_err(crate::start_error("the credentials cipher"))?;
        let user_ids: Vec<String> = (1..=users.max(1)).map(|i| format!("user-{i:02}")).collect();
        for user in &user_ids {
            // Paper credentials (no real secret); encrypted exactly as in production.
            let blob = cipher
                .encrypt(
                    user,
                    format!(r#"{{"api_key": "paper-{user}", "account_id": "A-{user}"}}"#)
                        .as_bytes(),
                )
                .map_err(crate::start_error("paper credentials"))?;
            bus.put_credentials(user, &blob)
                .await
                .map_err(crate::start_error("the pool bus"))?;
        }
        // The credential sealer, as production runs it: the one holder of the key.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(crate::start_error("the credential sealer's port"))?;
        let sealer_url = format!(
            "http://{}",
            listener
                .local_addr()
                .map_err(crate::start_error("the credential sealer's port"))?
        );
        let sealer = Arc::new(CredentialSealer::new(bus.clone(), Arc::new(cipher)));
        tokio::spawn(leasehold_broker::sealer::serve(
            listener,
            sealer,
            leasehold_broker::sealer::CLAIM_USER_SWEEP,
            None,
            // One process on loopback: `leasehold dev` needs no certificate.
            None,
            background.clone(),
        ));
        let launcher = Arc::new(InProcessLauncher {
            bus: bus.clone(),
            sealer_url,
            telemetry: telemetry.clone(),
            tasks: Arc::default(),
            next: Mutex::new(0),
        });
        let stop = CancellationToken::new();
        let mut loops = Vec::new();
        loops.push(tokio::spawn(leasehold_platform::periodic::every(
            Duration::from_secs(2),
            stop.clone(),
            {
                let (bus, launcher, telemetry) = (bus.clone(), launcher.clone(), telemetry.clone());
                move || {
                    let (bus, launcher, telemetry) =
                        (bus.clone(), launcher.clone(), telemetry.clone());
                    async move {
                        if let Err(err) = manager::reconcile(
                            bus.as_ref(),
                            launcher.as_ref(),
                            target,
                            telemetry.as_ref(),
                        )
                        .await
                        {
                            tracing::warn!(error = %err, "pool manager pass failed");
                        }
                    }
                }
            },
        )));
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
            // `dev` starts its users' workers itself.
            supervise: None,
            // The valve guards against a wrong POOL_GROUP or launcher, which
            // dev cannot have (its launcher is this process); with a pool of a
            // few workers and chaos crashing them every few seconds, 0.2 would
            // hold nearly every sweep and leave the crashed workers' marks.
            max_fraction: 1.0,
        };
        leasehold_platform::periodic::every(Duration::from_secs(5), self.stop.clone(), || async {
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
        if let Err(err) = manager::claim_user(bus.as_ref(), launcher.as_ref(), user).await {
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
