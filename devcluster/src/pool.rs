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
use leasehold_pool::bus::{BusError, PoolBus};
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
        let user_ids: Vec<String> = (1..=users.max(1)).map(|i| format!("user-{i:02}")).collect();
        let launcher =
            sealed_launcher(bus.clone(), telemetry.clone(), &user_ids, background).await?;
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

/// Paper credentials for `users`, the credential sealer on a loopback port
/// (the one holder of the key, as in production) and the launcher of broker
/// workers that get their credentials only from it.
async fn sealed_launcher(
    bus: Arc<dyn PoolBus>,
    telemetry: Arc<BufferedShipper>,
    users: &[String],
    background: CancellationToken,
) -> Result<Arc<InProcessLauncher>, DevError> {
    let key = AesGcmCipher::generate_key();
    let cipher = AesGcmCipher::from_base64_key(&key)
        .map_err(crate::start_error("the credentials cipher"))?;
    for user in users {
        // Paper credentials (no real secret); encrypted exactly as in production.
        let blob = cipher
            .encrypt(
                user,
                format!(r#"{{"api_key": "paper-{user}", "account_id": "A-{user}"}}"#).as_bytes(),
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
        background,
    ));
    Ok(Arc::new(InProcessLauncher {
        bus,
        sealer_url,
        telemetry,
        tasks: Arc::default(),
        next: Mutex::new(0),
    }))
}

/// What the order flow sends a user, once it made sure the user has a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Push {
    /// The user's session ends: the pool manager refills the pool.
    Shutdown,
    /// New credentials to pick up.
    Reload,
    /// A paper order.
    Order,
}

impl Push {
    /// Now and then a shutdown (3 %) or a reload (7 %); otherwise an order.
    fn from_roll(roll: u8) -> Push {
        match roll {
            0..3 => Push::Shutdown,
            3..10 => Push::Reload,
            _ => Push::Order,
        }
    }
}

/// Sends `what` to `user`'s worker; `sent` numbers the order's request id.
async fn push(bus: &dyn PoolBus, user: &str, what: Push, sent: u64) -> Result<(), BusError> {
    match what {
        Push::Shutdown => bus.push_control(user, r#"{"type": "shutdown"}"#).await,
        // A fresh reload grant first, as `credentials rotate` sends it: the
        // grant of the worker's claim is spent (one seal per grant). Nothing
        // when the user's claim is still pending: its grant must stay.
        Push::Reload => manager::reload_credentials(bus, user).await.map(drop),
        Push::Order => {
            let request = serde_json::json!({
                "request_id": format!("dev-{}-{sent}", SystemClock.now_ms()),
                "action": "place_order",
                "account": {"broker_name": "paper", "broker_type": "stock", "simulation": true, "account_id": format!("A-{user}")},
                "order": {"symbol": "2330", "side": if sent.is_multiple_of(2) { "buy" } else { "sell" }, "quantity": 1, "price": 600.5}
            });
            bus.push_request(user, &request.to_string()).await
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
        let what = Push::from_roll(rand::random_range(0..100u8));
        let pushed = push(bus.as_ref(), user, what, sent).await;
        if let Err(err) = pushed {
            tracing::warn!(user, error = %err, "order flow push failed");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test: a panic is its report

    use leasehold_broker::launcher::TaskLauncher;
    use leasehold_broker::manager::ClaimPath;
    use leasehold_pool::bus::memory::MemoryPoolBus;
    use leasehold_pool::keys;

    use super::*;

    /// Polls `done` every 20 ms for up to 20 s.
    async fn wait_until<F, Fut>(what: &str, mut done: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !done().await {
            assert!(tokio::time::Instant::now() < deadline, "{what}: never");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The order flow's reloads reach a worker that gets its credentials only
    /// from the sealer, as in `leasehold dev`: the claim's grant is spent by
    /// the claim, so each reload needs a grant of its own, and every one is
    /// sealed; none is refused (409) and dead-lettered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_reload_of_the_order_flow_is_sealed_to_the_users_worker() {
        let bus: Arc<dyn PoolBus> = Arc::new(MemoryPoolBus::new());
        let background = CancellationToken::new();
        // Nothing listens: the workers' telemetry is dropped.
        let telemetry = Arc::new(BufferedShipper::start(
            ShipperConfig::new("127.0.0.1:9", "broker-worker", "dev-pool"),
            background.clone(),
        ));
        let user = "user-01".to_owned();
        let launcher = sealed_launcher(
            bus.clone(),
            telemetry,
            std::slice::from_ref(&user),
            background.clone(),
        )
        .await
        .unwrap();
        launcher.start(None).await.unwrap();
        wait_until("an idle pool worker", || async {
            !manager::idle_pool_workers(bus.as_ref())
                .await
                .unwrap()
                .is_empty()
        })
        .await;
        let path = manager::claim_user(bus.as_ref(), launcher.as_ref(), &user)
            .await
            .unwrap();
        assert!(matches!(path, ClaimPath::PoolClaim { .. }), "{path}");
        let mark = keys::worker_active(&user);
        wait_until("the user's mark", || async {
            bus.get(&mark).await.unwrap().is_some()
        })
        .await;
        let worker_id =
            leasehold_pool::protocol::MarkValue::parse(&bus.get(&mark).await.unwrap().unwrap())
                .unwrap()
                .worker_id;
        let (control, processing) = (
            keys::worker_control(&user),
            keys::worker_control_processing(&user),
        );
        let dead = keys::dead_letter(&control);
        for round in 1..=2 {
            push(bus.as_ref(), &user, Push::Reload, round)
                .await
                .unwrap();
            wait_until("the reload handled", || async {
                bus.list_len(&control).await.unwrap() == 0
                    && bus.list_len(&processing).await.unwrap() == 0
            })
            .await;
            let refused = bus.list_items(&dead).await.unwrap();
            assert!(refused.is_empty(), "reload {round}: {refused:?}");
            // The grant the sealer spent on this reload: its own, a reload's.
            let grant: serde_json::Value = serde_json::from_str(
                &bus.get(&keys::credentials_grant(&user))
                    .await
                    .unwrap()
                    .unwrap(),
            )
            .unwrap();
            assert_eq!(grant["reason"], "reload", "{grant}");
            assert_eq!(grant["used_by"], worker_id.as_str(), "{grant}");
        }
        // The same worker still serves the user.
        let still =
            leasehold_pool::protocol::MarkValue::parse(&bus.get(&mark).await.unwrap().unwrap())
                .unwrap();
        assert_eq!(still.worker_id, worker_id);

        for task in launcher.tasks().values() {
            task.stop.cancel();
        }
        wait_until("the worker stopped", || async {
            launcher.tasks().is_empty()
        })
        .await;
        background.cancel();
    }
}
