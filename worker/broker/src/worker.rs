//! One broker worker process: pool worker → claimed worker → exit (the original broker-pool specification's
//! lifecycle).
//!
//! - **Pool**: heartbeats `worker:active:-1:{worker_id}`, moves the oldest
//!   claim of `pool:claims` into its own `pool:claims:processing:{worker_id}`
//!   (`BLMOVE`; producers LPUSH, so claims are served oldest first).
//! - **Claim**: decrypts the credentials for the claimed user, then one Lua script
//!   removes the claim from the processing list, sets `worker:active:{user_id}`
//!   only if no one holds it (exclusive), drops the pool mark, writes the
//!   metadata hash and the outcome `pool:claim:{claim_id}`, atomically. A claim
//!   a dead pool worker had taken is re-queued by its successors.
//! - **Claimed**: heartbeats with a script that refreshes the mark only while it
//!   is still this worker's (another holder means this worker lost the user and
//!   exits); serves control messages first, then requests oldest first through
//!   the user's processing list, each with exactly one final response
//!   (`serve.rs`: begin, execute or settle by lookup, answer).
//! - **Exit**: SIGTERM, `shutdown`, idle timeout or a lost mark: connections
//!   closed (bounded), own marks deleted. A request in flight is not waited
//!   for when its broker call hangs: it stays in the processing list,
//!   `executing`, and the successor settles it by lookup.
//!
//! Every step goes through the [`PoolBus`]: Redis in production, in memory in
//! one process. A blocking pop interrupted by shutdown is ended through the
//! bus's interrupt rather than by dropping the future, so a message the bus
//! already handed out is never lost; a request is in the processing list until
//! answered, so not even a crash loses it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold_control::clock::{Clock, SystemClock};
use leasehold_platform::backoff::Backoff;
use leasehold_pool::keys;
use leasehold_pool::state::PoolState;
use leasehold_telemetry::{ClaimResult, PoolWorkerStateKind, TelemetryEvent, TelemetrySink};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::connections::{ConnectPolicy, ConnectionCache};
use crate::credentials::{Credentials, CredentialsCipher};
use crate::paper::Broker;
use crate::sealer::SealerClient;
use leasehold_platform::settings::Redacted;
pub use leasehold_pool::bus::WorkerMetadata;
use leasehold_pool::bus::{BusError, MarkWrite, PoolBus, Take};
use leasehold_pool::claim_users::RedisLogin;
use leasehold_pool::protocol::MarkValue;

/// Why a claim for a user who has a worker fails (outcome and telemetry).
const ALREADY_SERVED: &str = "user already has an active worker";

/// Re-queues the claims every pool worker whose pool mark is gone had taken
/// and not settled (it died between the take and the claim step); returns
/// how many. A `SCAN` of the keyspace, so only the maintenance sweep and
/// supervision run it; pool workers rely on the idle read (`pool:idle`),
/// which re-queues the claims of every dead worker that was in the idle pool.
pub async fn requeue_dead_claims(bus: &dyn PoolBus) -> Result<u64, BusError> {
    let mut requeued = 0;
    for worker_id in bus.workers_with_taken_claims().await? {
        // The script checks the pool mark itself, in the same step.
        requeued += bus.requeue_claims(&worker_id).await?;
    }
    Ok(requeued)
}

/// How long a pool worker waits after putting back a claim whose credentials
/// KMS could not decrypt for now (throttled, unreachable): long enough not to
/// spin on KMS, short against a claim's patience.
const TRANSIENT_CREDENTIALS_PAUSE: Duration = Duration::from_secs(1);

/// `USER_QUEUE_MAX`'s default: a backlog a worker clears in about a minute at a
/// paper broker's pace, and far more than an API should ever queue for one user.
pub const DEFAULT_QUEUE_MAX: u64 = 1_000;

/// What a worker takes from a user's lists (`REQUEST_MAX_BYTES`,
/// `REQUEST_MAX_DELIVERIES`): a message that would stop every worker that
/// takes it must end after a few, answered, instead of wedging the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestBounds {
    /// Longest message taken whole, in bytes.
    pub max_bytes: usize,
    /// Most workers that take one request without a final answer.
    pub max_deliveries: u32,
}

impl RequestBounds {
    /// 64 KiB (an order is a few hundred bytes) and three workers.
    pub const DEFAULT: RequestBounds = RequestBounds {
        max_bytes: 65_536,
        max_deliveries: 3,
    };
}

impl Default for RequestBounds {
    fn default() -> Self {
        RequestBounds::DEFAULT
    }
}

/// A broker worker's settings.
#[derive(Debug, Clone)]
pub struct BrokerWorkerConfig {
    /// Identity in the pool mark.
    pub worker_id: String,
    /// What launchers list this process as (`local-{pid}` or the task ARN).
    pub task_id: String,
    /// `None`: start in the pool. `Some`: cold start for this user.
    pub user_id: Option<String>,
    /// Heartbeat period (originally 5 s).
    pub heartbeat: Duration,
    /// Mark TTL (originally 30 s), whole seconds.
    pub mark_ttl: Duration,
    /// Blocking-wait timeout (originally 30 s).
    pub block: Duration,
    /// Exit after this long without requests or control messages (originally 30 min).
    pub idle_timeout: Duration,
    /// Health-check period for idle connections (originally 60 s).
    pub health_check: Duration,
    /// Connect attempts and backoff, and every broker call's timeout.
    pub connect: ConnectPolicy,
    /// Most requests a user's queue may hold; the newest beyond it are
    /// answered `overloaded` (`USER_QUEUE_MAX`).
    pub queue_max: u64,
    /// Size and delivery bounds of what the worker takes.
    pub bounds: RequestBounds,
    /// For the metadata hash.
    pub metadata: WorkerMetadata,
}

/// A user's mark TTL unless `WORKER_MARK_TTL_SECONDS` says otherwise (the
/// sealer's too, for an asker that names none).
pub const DEFAULT_MARK_TTL: Duration = Duration::from_secs(30);

/// How long a worker waits for the credential sealer (which may wait for KMS).
const SEALER_TIMEOUT: Duration = Duration::from_secs(10);

impl BrokerWorker {
    /// The worker `leasehold broker-worker` runs from its settings: the paper
    /// broker with its ledger on `bus` (as a real broker's order book lives at
    /// the broker, it outlives this worker), and with `CREDENTIALS_SEALER_URL`
    /// credentials sealed by the sealer and the per-claim Redis login.
    pub fn from_settings(
        settings: crate::settings::BrokerWorkerSettings,
        bus: Arc<dyn PoolBus>,
        telemetry: Arc<dyn TelemetrySink>,
    ) -> Self {
        let paper = Arc::new(crate::paper::PaperBroker::new(settings.paper, bus.clone()));
        let brokers = HashMap::from([("paper".to_owned(), paper as Arc<dyn Broker>)]);
        let cipher = Arc::new(settings.cipher);
        let worker = BrokerWorker::new(settings.worker, bus, cipher, brokers, telemetry);
        let Some(url) = &settings.sealer_url else {
            return worker;
        };
        let client = SealerClient::new(url, SEALER_TIMEOUT);
        let client = match &settings.sealer_ca {
            // The settings parsed it already; a failure here leaves a client
            // that trusts nothing, so an https:// sealer answers nothing.
            Some(pem) => client.trusting(pem.as_bytes()).unwrap_or_else(|err| {
                tracing::error!(error = %err, "CREDENTIALS_SEALER_CA cannot be used");
                SealerClient::new(url, SEALER_TIMEOUT)
            }),
            None => client,
        };
        let client = match settings.caller_proof {
            Some(proof) => client.proving(crate::sealer::caller::CallerProver::from_environment(
                proof.sts_endpoint,
                proof.audience,
            )),
            None => client,
        };
        worker
            .with_sealer(client)
            .with_claim_redis_url(settings.redis_url)
    }
}

impl BrokerWorkerConfig {
    /// Takes the ECS task ARN as this worker's identity in its marks (what the
    /// launcher lists), and its last segment as the worker id unless
    /// `WORKER_ID` was set.
    pub fn adopt_task_arn(&mut self, arn: String, worker_id_set: bool) {
        if !worker_id_set {
            self.worker_id = arn.rsplit('/').next().unwrap_or_default().to_owned();
        }
        self.task_id = arn.clone();
        self.metadata.task_arn = arn;
    }
}

#[cfg(feature = "testing")]
impl BrokerWorkerConfig {
    /// Test settings: a 2 s mark TTL, the given heartbeat, the original 30 s
    /// blocking pop, and metadata naming `task-{worker_id}` on `test-host`.
    pub fn for_tests(worker_id: &str, user_id: Option<&str>, heartbeat: Duration) -> Self {
        BrokerWorkerConfig {
            worker_id: worker_id.to_owned(),
            task_id: format!("task-{worker_id}"),
            user_id: user_id.map(str::to_owned),
            heartbeat,
            mark_ttl: Duration::from_secs(2),
            block: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(600),
            health_check: Duration::from_secs(60),
            connect: ConnectPolicy::default(),
            queue_max: DEFAULT_QUEUE_MAX,
            bounds: RequestBounds::DEFAULT,
            metadata: WorkerMetadata {
                task_arn: format!("task-{worker_id}"),
                instance_id: "test-host".into(),
                launched_at: 1,
                sidecar_url: None,
            },
        }
    }
}

/// Why a worker stopped (all clean exits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerExit {
    /// SIGTERM / Ctrl-C.
    Signal,
    /// A `shutdown` control message.
    ControlShutdown,
    /// No activity for the idle timeout.
    IdleTimeout,
    /// Another worker holds this user's mark: this one is the duplicate.
    Lost,
    /// Cold start for a user who already had a worker for longer than a mark TTL.
    AlreadyServed,
    /// The pool manager retired this idle pool worker (pool above target).
    Retired,
}

impl WorkerExit {
    /// Why the worker stopped, as its last line says it.
    pub fn reason(&self) -> &'static str {
        match self {
            WorkerExit::Signal => "signal",
            WorkerExit::ControlShutdown => "shutdown message",
            WorkerExit::IdleTimeout => "idle timeout",
            WorkerExit::Lost => "another worker holds the user",
            WorkerExit::AlreadyServed => "user already served",
            WorkerExit::Retired => "retired by the pool manager",
        }
    }
}

/// Failures that end a worker with a non-zero exit (the orchestrator replaces it).
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The pool bus is unusable (message without its URL).
    #[error(transparent)]
    Bus(#[from] BusError),
    /// A cold start could not load the user's credentials.
    #[error("credentials for user {user_id}: {problem}")]
    Credentials {
        /// User.
        user_id: String,
        /// What failed (never the secret).
        problem: String,
    },
}

/// A broker worker on a pool bus.
pub struct BrokerWorker {
    config: BrokerWorkerConfig,
    bus: Arc<dyn PoolBus>,
    cipher: Arc<dyn CredentialsCipher>,
    /// Set: credentials come sealed from the credential sealer, and `cipher`
    /// is never used (this worker decrypts no blob).
    sealer: Option<Arc<SealerClient>>,
    /// The pool bus's Redis URL, for logging in as the per-claim user the
    /// sealer may hand out (`None`: the bus is not Redis, or no sealer).
    claim_redis_url: Option<Redacted<String>>,
    /// What this worker's grant was bound to (the claim id it took, or its
    /// task on a cold start): the sealer's answers open only for it.
    sealed_binding: String,
    brokers: HashMap<String, Arc<dyn Broker>>,
    telemetry: Arc<dyn TelemetrySink>,
}

/// Aborts a background task when the worker's future is dropped, so a worker
/// that is dropped mid-run (or whose runtime stops) heartbeats no more.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl AbortOnDrop {
    async fn stop(mut self) {
        self.0.abort();
        let _ = (&mut self.0).await;
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A claimed user and the state that goes with it.
struct Claimed {
    user_id: String,
    credentials: Credentials,
    /// The per-claim Redis user the sealer made for this claim, if any.
    redis_login: Option<RedisLogin>,
}

/// The holder deadline: how long this worker may still act on its mark.
/// Refreshed by each heartbeat Redis confirmed, from the moment it was sent
/// (the mark's TTL ran from some time after that). Once heartbeats have
/// failed for `mark TTL − heartbeat interval` the mark may have expired and
/// the user may be served elsewhere: the worker places no more orders until a
/// heartbeat is confirmed again.
#[derive(Debug)]
struct Holder {
    confirmed: std::sync::Mutex<Instant>,
    grace: Duration,
}

impl Holder {
    /// A holder whose mark was written at `claimed_at`.
    fn new(claimed_at: Instant, mark_ttl: Duration, heartbeat: Duration) -> Self {
        Holder {
            confirmed: std::sync::Mutex::new(claimed_at),
            // A heartbeat longer than the TTL is refused by the settings; the
            // floor keeps a zero grace from stopping every order.
            grace: mark_ttl
                .saturating_sub(heartbeat)
                .max(Duration::from_millis(1)),
        }
    }

    /// A heartbeat sent at `sent_at` was confirmed.
    fn confirmed(&self, sent_at: Instant) {
        let mut confirmed = self.confirmed.lock().unwrap_or_else(|e| e.into_inner());
        *confirmed = (*confirmed).max(sent_at);
    }

    /// How long from `now` the mark is surely still this worker's; `None`
    /// once the holder deadline has passed.
    fn time_left(&self, now: Instant) -> Option<Duration> {
        let confirmed = *self.confirmed.lock().unwrap_or_else(|e| e.into_inner());
        let deadline = confirmed + self.grace;
        (now < deadline).then(|| deadline - now)
    }
}

enum Handled {
    Continue,
    Exit(WorkerExit),
}

/// Retries of a failed pop or bus step: quick at first (a blip), bounded (an
/// outage), jittered (many workers lose Redis at once, and a fixed delay
/// would bring them back in lockstep).
const RETRY: Backoff = Backoff {
    base: Duration::from_millis(100),
    cap: Duration::from_secs(5),
};

/// A duration as whole milliseconds, saturating.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn now_ms() -> u64 {
    SystemClock.now_ms_u64()
}

impl BrokerWorker {
    /// A worker on `bus` (shared with other workers in one process, or its own).
    pub fn new(
        config: BrokerWorkerConfig,
        bus: Arc<dyn PoolBus>,
        cipher: Arc<dyn CredentialsCipher>,
        brokers: HashMap<String, Arc<dyn Broker>>,
        telemetry: Arc<dyn TelemetrySink>,
    ) -> Self {
        BrokerWorker {
            config,
            bus,
            cipher,
            sealer: None,
            claim_redis_url: None,
            sealed_binding: String::new(),
            brokers,
            telemetry,
        }
    }

    /// Gets credentials from the credential sealer instead of decrypting
    /// blobs (`CREDENTIALS_SEALER_URL`): the worker publishes the client's
    /// key in its marks, and reads no `credentials:*` key.
    pub fn with_sealer(mut self, sealer: SealerClient) -> Self {
        self.sealer = Some(Arc::new(sealer));
        self
    }

    /// The Redis URL of this worker's pool bus: when the sealer hands out a
    /// per-claim Redis user, the claimed phase runs on a bus logged in as it.
    pub fn with_claim_redis_url(mut self, url: Redacted<String>) -> Self {
        self.claim_redis_url = Some(url);
        self
    }

    /// What this worker writes into a user's mark and metadata.
    fn mark_write<'a>(&'a self, user_id: &'a str, value: &'a str) -> MarkWrite<'a> {
        MarkWrite {
            user_id,
            worker_id: &self.config.worker_id,
            value,
            ttl: self.config.mark_ttl,
            metadata: &self.config.metadata,
        }
    }

    fn mark(&self, user_id: &str) -> MarkValue {
        MarkValue {
            worker_id: self.config.worker_id.clone(),
            task_id: self.config.task_id.clone(),
            user_id: user_id.to_owned(),
            heartbeat_at: now_ms(),
            started_at: self.config.metadata.launched_at,
            sidecar_url: self.config.metadata.sidecar_url.clone(),
            ttl_ms: Some(millis(self.config.mark_ttl)),
            heartbeat_interval_ms: Some(millis(self.config.heartbeat)),
            seal_key: self.sealer.as_ref().map(|sealer| sealer.seal_key()),
        }
    }

    fn state(&self, state: PoolWorkerStateKind, user_id: Option<&str>) {
        self.telemetry.emit(TelemetryEvent::PoolWorkerState {
            worker_id: self.config.worker_id.clone(),
            state,
            user_id: user_id.map(str::to_owned),
        });
    }

    /// Runs until a clean exit or a fatal error; marks are deleted either way.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<WorkerExit, WorkerError> {
        let claimed = match self.config.user_id.clone() {
            None => match self.pool(&shutdown).await? {
                Ok(claimed) => claimed,
                Err(exit) => return Ok(exit),
            },
            Some(user_id) => match self.cold_start(&user_id, &shutdown).await? {
                Ok(claimed) => claimed,
                Err(exit) => return Ok(exit),
            },
        };
        let mut claimed = claimed;
        let user_id = claimed.user_id.clone();
        if let Some(login) = claimed.redis_login.take() {
            self.log_in_as_claim_user(&user_id, &login).await?;
        }
        let lost = CancellationToken::new();
        let holder = Arc::new(Holder::new(
            Instant::now(),
            self.config.mark_ttl,
            self.config.heartbeat,
        ));
        let heartbeat =
            AbortOnDrop(self.spawn_user_heartbeat(&user_id, lost.clone(), holder.clone()));
        let stop = CancellationToken::new();
        let forward = {
            let (stop, shutdown, lost) = (stop.clone(), shutdown.clone(), lost.clone());
            AbortOnDrop(tokio::spawn(async move {
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = lost.cancelled() => {}
                }
                stop.cancel();
            }))
        };
        let mut cache = ConnectionCache::new(
            &user_id,
            self.brokers.clone(),
            self.config.connect,
            self.telemetry.clone(),
        );
        let outcome = self
            .serve(claimed, &holder, &mut cache, &stop, &shutdown, &lost)
            .await;
        forward.stop().await;
        heartbeat.stop().await;
        cache.close_all("shutdown").await;
        let released = self
            .bus
            .release_user_mark(&user_id, &self.config.worker_id)
            .await;
        if let Err(err) = released {
            tracing::warn!(user_id, error = %err, "cannot delete own marks; they expire with their TTL");
        }
        self.state(PoolWorkerStateKind::Stopped, Some(&user_id));
        outcome
    }

    /// Pool phase: until a valid claim (Ok(Ok)) or shutdown (Ok(Err(exit))).
    async fn pool(
        &mut self,
        shutdown: &CancellationToken,
    ) -> Result<Result<Claimed, WorkerExit>, WorkerError> {
        self.state(PoolWorkerStateKind::Idle, None);
        let mut heartbeat = AbortOnDrop(self.spawn_pool_heartbeat());
        let mut failures = 0;
        // A pool worker that starts is a successor: claims a dead one left
        // half-taken go back in line before this one waits.
        self.requeue_dead_claims().await;
        loop {
            if shutdown.is_cancelled() {
                heartbeat.stop().await;
                if let Err(err) = self.bus.delete_pool_mark(&self.config.worker_id).await {
                    tracing::warn!(error = %err, "cannot delete the pool mark; it expires with its TTL");
                }
                self.state(PoolWorkerStateKind::Stopped, None);
                return Ok(Err(WorkerExit::Signal));
            }
            // Claims are served in arrival order (the original design's SQS
            // queue was FIFO-like), moved into this worker's own processing
            // list so a crash from here on cannot lose one.
            let taken = self
                .bus
                .take_claim(&self.config.worker_id, self.config.block, shutdown)
                .await;
            let taken = match taken {
                Ok(Take::Claim(taken)) => taken,
                Ok(Take::Empty) => {
                    failures = 0;
                    self.requeue_dead_claims().await;
                    continue;
                }
                Ok(Take::Retired) => {
                    // The pool manager chose this idle worker to stop; any
                    // claim it moved meanwhile is back in line already.
                    heartbeat.stop().await;
                    if let Err(err) = self.bus.delete_pool_mark(&self.config.worker_id).await {
                        tracing::warn!(error = %err, "cannot delete the pool mark; it expires with its TTL");
                    }
                    self.state(PoolWorkerStateKind::Stopped, None);
                    return Ok(Err(WorkerExit::Retired));
                }
                Err(err) => {
                    tracing::warn!(error = %err, "take on pool:claims failed; retrying");
                    let delay = RETRY.delay(failures);
                    failures = failures.saturating_add(1);
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = shutdown.cancelled() => {}
                    }
                    continue;
                }
            };
            failures = 0;
            if shutdown.is_cancelled() {
                // Taken while stopping: give it back, first in line for the next pool worker.
                if let Err(err) = self
                    .bus
                    .return_claim(&self.config.worker_id, &taken.raw)
                    .await
                {
                    tracing::warn!(error = %err, "cannot give a claim back; it is re-queued once this worker's pool mark is gone");
                }
                continue;
            }
            let Some((claim, credentials, redis_login)) = self.check_claim(&taken.raw).await else {
                continue;
            };
            heartbeat.stop().await;
            if self.settle_claim(&claim, &taken.raw, shutdown).await {
                self.telemetry.emit(TelemetryEvent::PoolClaim {
                    worker_id: self.config.worker_id.clone(),
                    user_id: Some(claim.user_id.clone()),
                    result: ClaimResult::Claimed,
                    duration: Duration::from_millis(now_ms().saturating_sub(claim.enqueued_at)),
                    reason: None,
                });
                self.state(PoolWorkerStateKind::Claimed, Some(&claim.user_id));
                return Ok(Ok(Claimed {
                    user_id: claim.user_id,
                    credentials,
                    redis_login,
                }));
            }
            heartbeat = AbortOnDrop(self.spawn_pool_heartbeat());
        }
    }

    /// Re-queues the claims of pool workers whose pool mark is gone (they
    /// died between taking a claim and settling it), through the idle read of
    /// `pool:idle`, which does so for every dead entry it finds: no SCAN of a
    /// keyspace that holds a day of request records. Best effort: the
    /// maintenance sweep also re-queues by SCAN.
    async fn requeue_dead_claims(&self) {
        if let Err(err) = self.bus.idle_workers().await {
            tracing::warn!(error = %err, "cannot look for claims of dead pool workers");
        }
    }

    fn spawn_pool_heartbeat(&self) -> tokio::task::JoinHandle<()> {
        let bus = self.bus.clone();
        let every = self.config.heartbeat;
        let ttl = self.config.mark_ttl;
        let template = self.mark(keys::POOL_USER_ID);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            loop {
                ticks.tick().await;
                let mark = MarkValue {
                    heartbeat_at: now_ms(),
                    ..template.clone()
                };
                let set = bus
                    .set_pool_mark(&template.worker_id, &mark.to_json(), ttl)
                    .await;
                match set {
                    Ok(true) => {}
                    // The mark still beats (the worker is alive until it
                    // exits); the next take tells the worker to exit.
                    Ok(false) => tracing::debug!("retired by the pool manager"),
                    Err(err) => tracing::warn!(error = %err, "pool heartbeat failed"),
                }
            }
        })
    }

    fn spawn_user_heartbeat(
        &self,
        user_id: &str,
        lost: CancellationToken,
        holder: Arc<Holder>,
    ) -> tokio::task::JoinHandle<()> {
        let bus = self.bus.clone();
        let user_id = user_id.to_owned();
        let every = self.config.heartbeat;
        let ttl = self.config.mark_ttl;
        let template = self.mark(&user_id);
        let metadata = self.config.metadata.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.tick().await; // the claim just wrote the mark
            loop {
                ticks.tick().await;
                let sent_at = Instant::now();
                let mark = MarkValue {
                    heartbeat_at: now_ms(),
                    ..template.clone()
                };
                let value = mark.to_json();
                let refreshed = bus
                    .refresh_user_mark(&MarkWrite {
                        user_id: &user_id,
                        worker_id: &template.worker_id,
                        value: &value,
                        ttl,
                        metadata: &metadata,
                    })
                    .await;
                match refreshed {
                    Ok(true) => holder.confirmed(sent_at),
                    Ok(false) => {
                        tracing::warn!(user_id, "another worker holds this user's mark; stopping");
                        lost.cancel();
                        return;
                    }
                    Err(err) => tracing::warn!(user_id, error = %err, "heartbeat failed"),
                }
            }
        })
    }
}

mod claim;
mod schedule;
mod serve;

pub use schedule::{Due, Schedule};

#[cfg(test)]
mod tests;
