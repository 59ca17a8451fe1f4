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
use std::time::{Duration, SystemTime};

use leasehold_control::clock::unix_ms;
use leasehold_platform::backoff::Backoff;
use leasehold_pool::keys;
use leasehold_telemetry::{ClaimResult, PoolWorkerStateKind, TelemetryEvent, TelemetrySink};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::connections::{ConnectPolicy, ConnectionCache};
use crate::credentials::{CipherError, Credentials, CredentialsCipher};
use crate::paper::Broker;
use crate::sealer::{SealerClient, Unsealed};
use leasehold_platform::settings::Redacted;
pub use leasehold_pool::bus::WorkerMetadata;
use leasehold_pool::bus::redis::RedisPoolBus;
use leasehold_pool::bus::{BusError, ClaimSettle, MarkWrite, PoolBus, Settled, Take};
use leasehold_pool::claim_users::{RedisLogin, login_url};
use leasehold_pool::protocol::{self, ClaimMessage, ClaimOutcome, MarkValue};

/// Why a claim for a user who has a worker fails (outcome and telemetry).
const ALREADY_SERVED: &str = "user already has an active worker";

/// Re-queues the claims every pool worker whose pool mark is gone had taken
/// and not settled (it died between the take and the claim step); returns
/// how many. A `SCAN` of the keyspace, so only the maintenance sweep and
/// supervision run it; pool workers rely on the idle read (`pool:idle`),
/// which re-queues the claims of every dead worker that was in the idle pool.
pub async fn requeue_dead_claims(bus: &dyn PoolBus) -> Result<u64, BusError> {
    let mut requeued = 0;
    for key in bus.scan_keys(keys::CLAIMS_PROCESSING_PATTERN).await? {
        if let Some(worker_id) = keys::claims_processing_owner(&key) {
            // The script checks the pool mark itself, in the same step.
            requeued += bus.requeue_claims(worker_id).await?;
        }
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

    /// Whether the mark is surely still this worker's at `now`.
    fn may_act(&self, now: Instant) -> bool {
        let confirmed = *self.confirmed.lock().unwrap_or_else(|e| e.into_inner());
        now.saturating_duration_since(confirmed) < self.grace
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
    u64::try_from(unix_ms(SystemTime::now())).unwrap_or(0)
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

    /// A worker on its own Redis bus (the URL is never part of an error).
    pub async fn connect(
        config: BrokerWorkerConfig,
        redis_url: &str,
        cipher: Arc<dyn CredentialsCipher>,
        brokers: HashMap<String, Arc<dyn Broker>>,
        telemetry: Arc<dyn TelemetrySink>,
    ) -> Result<Self, WorkerError> {
        let bus = Arc::new(RedisPoolBus::connect(redis_url).await?);
        Ok(BrokerWorker::new(config, bus, cipher, brokers, telemetry))
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

    /// Moves the bus onto the per-claim Redis user the sealer made: from here
    /// on this worker reaches only its user's keys. A login that does not
    /// work gives the user back and ends the worker (the pool-wide user may
    /// not reach the user's queues at all).
    async fn log_in_as_claim_user(
        &mut self,
        user_id: &str,
        login: &RedisLogin,
    ) -> Result<(), WorkerError> {
        let Some(base) = &self.claim_redis_url else {
            tracing::debug!(
                user_id,
                "a claim login from the sealer, but the bus is not Redis"
            );
            return Ok(());
        };
        let bus = match login_url(base.expose(), login) {
            Ok(url) => RedisPoolBus::connect(&url).await,
            Err(err) => Err(err),
        };
        match bus {
            Ok(bus) => {
                tracing::info!(
                    user_id,
                    redis_user = login.user,
                    "serving as the per-claim Redis user"
                );
                self.bus = Arc::new(bus);
                Ok(())
            }
            Err(err) => {
                self.give_user_back(user_id).await;
                Err(WorkerError::Bus(err))
            }
        }
    }

    /// Releases a user this worker claimed but cannot serve (no credentials,
    /// no login), so the next claim need not wait for the mark to expire.
    async fn give_user_back(&self, user_id: &str) {
        if let Err(err) = self
            .bus
            .release_user_mark(user_id, &self.config.worker_id)
            .await
        {
            tracing::warn!(user_id, error = %err, "cannot give the user back; the mark expires");
        }
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

    /// The claim step for a parsed claim; `true` when this worker now holds
    /// the user. A Redis error leaves the outcome unknown (the script may have
    /// run), so it is never taken for a failure: the step is repeated (it
    /// only acts while the claim is in this worker's list), and when the
    /// claim has left the list the user's mark says whether it is this
    /// worker's. Stopping meanwhile leaves the claim in the list, where the
    /// re-queue of a dead worker's claims finds it.
    async fn settle_claim(
        &mut self,
        claim: &ClaimMessage,
        raw: &[u8],
        shutdown: &CancellationToken,
    ) -> bool {
        let worker_id = self.config.worker_id.clone();
        let value = self.mark(&claim.user_id).to_json();
        let claimed = ClaimOutcome::claimed(&worker_id).to_json();
        let refused = ClaimOutcome::failed(&worker_id, ALREADY_SERVED).to_json();
        let settle = ClaimSettle {
            raw,
            claim_id: &claim.claim_id,
            claimed: &claimed,
            refused: &refused,
        };
        let retry = Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(5),
        };
        let mut attempt = 0;
        loop {
            let settled = self
                .bus
                .settle_claim(&self.mark_write(&claim.user_id, &value), &settle)
                .await;
            let problem = match settled {
                Ok(Settled::Claimed) => return true,
                Ok(Settled::Refused) => {
                    self.claim_event(Some(&claim.user_id), ClaimResult::Error, ALREADY_SERVED);
                    return false;
                }
                Ok(Settled::NotHeld) => {
                    match self.bus.get(&keys::worker_active(&claim.user_id)).await {
                        Ok(mark) => {
                            let mine = mark
                                .and_then(|mark| MarkValue::parse(&mark))
                                .is_some_and(|mark| mark.worker_id == worker_id);
                            if !mine {
                                tracing::info!(
                                    user_id = claim.user_id,
                                    claim_id = claim.claim_id,
                                    "claim left this worker's list without this worker taking the user; back to the pool"
                                );
                            }
                            return mine;
                        }
                        Err(err) => err,
                    }
                }
                Err(err) => err,
            };
            tracing::warn!(user_id = claim.user_id, claim_id = claim.claim_id, error = %problem, "claim outcome unknown; asking the pool bus again");
            attempt += 1;
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(retry.delay(attempt)) => {}
            }
        }
    }

    /// Parses and decrypts a claim; a bad one is dead-lettered with a
    /// `failed` outcome (when its claim id is readable) and `None` returned.
    async fn check_claim(
        &mut self,
        raw: &[u8],
    ) -> Option<(ClaimMessage, Credentials, Option<RedisLogin>)> {
        if raw.len() > self.config.bounds.max_bytes {
            // Never parsed: the claim id, if plain, is read from the head.
            let head = &raw[..raw.len().min(protocol::DEAD_LETTER_HEAD_BYTES)];
            let claim_id = protocol::sniff_id(head, "claim_id");
            tracing::warn!(
                length = raw.len(),
                max = self.config.bounds.max_bytes,
                "a claim over REQUEST_MAX_BYTES is dead-lettered unparsed"
            );
            self.reject_claim(
                raw,
                claim_id.as_deref(),
                None,
                ClaimResult::Invalid,
                protocol::dead_reason::TOO_LARGE,
            )
            .await;
            return None;
        }
        let body = String::from_utf8_lossy(raw);
        let claim = match protocol::parse_claim(&body) {
            Ok(claim) => claim,
            Err(err) => {
                let claim_id = protocol::claim_id_of(&body);
                self.reject_claim(
                    raw,
                    claim_id.as_deref(),
                    None,
                    ClaimResult::Invalid,
                    &format!("invalid claim: {err}"),
                )
                .await;
                return None;
            }
        };
        let credentials = match &self.sealer {
            // The sealer reads the stored blob; the one in the claim is not
            // needed (and this worker could not open it).
            Some(sealer) => sealer
                .fetch(&claim.user_id, &self.config.worker_id)
                .await
                .map(|unsealed| (unsealed.credentials, unsealed.redis_login)),
            None => self
                .cipher
                .decrypt(&claim.user_id, &claim.encrypted_credentials)
                .await
                .map(|credentials| (credentials, None)),
        };
        match credentials {
            Ok((credentials, login)) => Some((claim, credentials, login)),
            Err(err) if err.is_transient() => {
                // KMS throttled or unreachable: the claim is fine, so it goes
                // back first in line rather than failing for good; this
                // worker waits before it takes one again.
                tracing::warn!(user_id = claim.user_id, error = %err, "credentials cannot be decrypted now; the claim is put back");
                if let Err(err) = self.bus.return_claim(&self.config.worker_id, raw).await {
                    tracing::warn!(error = %err, "cannot put the claim back; it is taken again from this worker's list");
                }
                tokio::time::sleep(TRANSIENT_CREDENTIALS_PAUSE).await;
                None
            }
            Err(err) => {
                self.reject_claim(
                    raw,
                    Some(&claim.claim_id),
                    Some(&claim.user_id),
                    ClaimResult::Invalid,
                    &err.to_string(),
                )
                .await;
                None
            }
        }
    }

    fn claim_event(&self, user_id: Option<&str>, result: ClaimResult, reason: &str) {
        self.telemetry.emit(TelemetryEvent::PoolClaim {
            worker_id: self.config.worker_id.clone(),
            user_id: user_id.map(str::to_owned),
            result,
            duration: Duration::ZERO,
            reason: Some(reason.to_owned()),
        });
    }

    async fn reject_claim(
        &mut self,
        raw: &[u8],
        claim_id: Option<&str>,
        user_id: Option<&str>,
        result: ClaimResult,
        reason: &str,
    ) {
        self.claim_event(user_id, result, reason);
        self.telemetry.emit(TelemetryEvent::MessageDeadLettered {
            queue: keys::POOL_CLAIMS.to_owned(),
            reason: reason.to_owned(),
        });
        let outcome = ClaimOutcome::failed(&self.config.worker_id, reason).to_json();
        let failed = self
            .bus
            .fail_claim(
                &self.config.worker_id,
                raw,
                claim_id.map(|id| (id, outcome.as_str())),
                reason,
                now_ms(),
            )
            .await;
        if let Err(err) = failed {
            // Still in this worker's list: handed out again by the next take.
            tracing::error!(queue = keys::dead_letter(keys::POOL_CLAIMS), error = %err, "cannot dead-letter a claim; retrying with the next take");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn dead_letter(&mut self, list: &str, reason: &str, body: &str) {
        self.telemetry.emit(TelemetryEvent::MessageDeadLettered {
            queue: list.to_owned(),
            reason: reason.to_owned(),
        });
        let pushed = self.bus.dead_letter(list, reason, body, now_ms()).await;
        if let Err(err) = pushed {
            let dead = keys::dead_letter(list);
            tracing::error!(queue = dead, error = %err, "cannot dead-letter a message; it is dropped");
        }
    }

    /// The exclusive claim script (cold start): true when this worker now holds the user.
    async fn claim(&mut self, user_id: &str) -> Result<bool, BusError> {
        let value = self.mark(user_id).to_json();
        self.bus.claim_user(&self.mark_write(user_id, &value)).await
    }

    async fn load_credentials(&mut self, user_id: &str) -> Result<Credentials, WorkerError> {
        Ok(self.obtain_credentials(user_id).await?.credentials)
    }

    /// The user's credentials (and, from a sealer, maybe a per-claim Redis
    /// login): sealed to this worker, or decrypted from the stored blob.
    async fn obtain_credentials(&mut self, user_id: &str) -> Result<Unsealed, WorkerError> {
        let problem = |problem: String| WorkerError::Credentials {
            user_id: user_id.to_owned(),
            problem,
        };
        if let Some(sealer) = &self.sealer {
            return sealer
                .fetch(user_id, &self.config.worker_id)
                .await
                .map_err(|err| problem(err.to_string()));
        }
        let blob = self.bus.credentials(user_id).await?;
        let blob =
            blob.ok_or_else(|| problem(format!("{} is not set", keys::credentials(user_id))))?;
        let credentials = self
            .cipher
            .decrypt(user_id, &blob)
            .await
            .map_err(|err: CipherError| problem(err.to_string()))?;
        Ok(Unsealed {
            credentials,
            redis_login: None,
        })
    }

    /// Cold start (`USER_ID` set): read the credentials, then claim; while another
    /// worker holds the user, retry for one mark TTL (it may be dying). With a
    /// sealer the order is the other way round, since the sealer answers only
    /// the worker whose mark names it: claim, then fetch, and give the user
    /// back if the credentials do not come.
    async fn cold_start(
        &mut self,
        user_id: &str,
        shutdown: &CancellationToken,
    ) -> Result<Result<Claimed, WorkerExit>, WorkerError> {
        let decrypted = match self.sealer {
            Some(_) => None,
            None => Some(self.obtain_credentials(user_id).await?),
        };
        let give_up = Instant::now() + self.config.mark_ttl + self.config.heartbeat;
        loop {
            if self.claim(user_id).await? {
                let unsealed = match decrypted {
                    Some(unsealed) => unsealed,
                    None => match self.obtain_credentials(user_id).await {
                        Ok(unsealed) => unsealed,
                        Err(err) => {
                            self.give_user_back(user_id).await;
                            return Err(err);
                        }
                    },
                };
                self.state(PoolWorkerStateKind::Claimed, Some(user_id));
                return Ok(Ok(Claimed {
                    user_id: user_id.to_owned(),
                    credentials: unsealed.credentials,
                    redis_login: unsealed.redis_login,
                }));
            }
            if Instant::now() >= give_up {
                tracing::warn!(user_id, "user already has an active worker; exiting");
                return Ok(Err(WorkerExit::AlreadyServed));
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(Err(WorkerExit::Signal)),
                _ = tokio::time::sleep(self.config.heartbeat) => {}
            }
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

mod schedule;
mod serve;

pub use schedule::{Due, Schedule};

#[cfg(test)]
mod tests;
