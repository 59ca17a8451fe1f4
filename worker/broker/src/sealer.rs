//! The credential sealer (`leasehold credential-sealer`): the one component
//! that may decrypt credentials blobs (KMS `Decrypt`, or the local key in
//! development) and read `credentials:*`. A broker worker asks it for its
//! user's credentials over HTTP and gets them sealed to the key in its mark
//! ([`crate::sealing`]); the broker task itself holds no decrypt capability.
//!
//! The sealer alone decides who holds a user
//! ([`leasehold_pool::bus::assign`]): in one atomic step it consumes the
//! user's grant (`pool:grant:{user_id}`, written by the claim path,
//! supervision's cold start or `credentials rotate`, none of which a broker
//! worker may write), checks the grant is bound to the asker (its claim in
//! the asker's own claim list, or its launched task) and that no other worker
//! holds the user, and sets the user's mark for the asker. A second seal on
//! one grant is refused and counted (`grant_used`). Broker workers may read
//! user marks but not write them, so nothing a worker can write makes the
//! sealer answer it for another user.
//!
//! What this does not stop is written in `deploy/README.md` ("Credential
//! isolation"): a compromised pool worker can take any claim from the queue,
//! as a healthy one does.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use leasehold_control::clock::{Clock, SystemClock};
use leasehold_pool::bus::assign::{Asker, AssignRequest, Assignment};
use leasehold_pool::bus::{BusError, CredentialBus, PoolBus};
use leasehold_pool::claim_users::{self, ClaimUsers, RedisLogin};
use leasehold_pool::keys;
use leasehold_pool::protocol::{self, CredentialsGrant, GrantReason, MarkValue};
use leasehold_pool::state::PoolState;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::{Deserialize, Serialize};

pub mod caller;
pub mod tls;

use crate::credentials::{CipherError, Credentials, CredentialsCipher};
use crate::sealing::{self, SealedCredentials, SealingKey};

/// The sealer's default listen address (`SEALER_LISTEN`).
pub const DEFAULT_LISTEN: &str = "0.0.0.0:9480";

/// The path a worker posts [`SealRequest`]s to.
pub const SEAL_PATH: &str = "/v1/seal";

/// `leasehold_credential_seals_total{result}`: every seal request by outcome.
/// Refusals other than `unavailable` mean a misconfigured claimer (`no_grant`),
/// a worker asking for a user that is not its own (`not_the_holder`) or a
/// second seal on one grant (`grant_used`).
pub const SEALS_TOTAL: &str = "leasehold_credential_seals_total";

/// Every metric the sealer exports on `GET /metrics` (docs/metrics.md).
pub const METRICS: &[&str] = &[SEALS_TOTAL];

/// The `result` values of [`SEALS_TOTAL`]: `sealed`, then each refusal's.
pub const SEAL_RESULTS: &[&str] = &[
    "sealed",
    "unauthenticated",
    "bad_request",
    "no_grant",
    "grant_used",
    "not_the_holder",
    "no_credentials",
    "does_not_decrypt",
    "unavailable",
];

/// Installs this process's Prometheus recorder and puts every series of
/// [`SEAL_RESULTS`] at 0, so `increase()` sees the first refusal (as the
/// sidecar does with its counters); the handle renders `GET /metrics`.
pub fn install_metrics() -> Result<PrometheusHandle, metrics_exporter_prometheus::BuildError> {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    for result in SEAL_RESULTS {
        metrics::counter!(SEALS_TOTAL, "result" => *result).absolute(0);
    }
    Ok(handle)
}

/// Largest request body the sealer reads: three ids and a key.
const MAX_REQUEST_BYTES: usize = 4_096;

/// Largest answer a worker reads: a sealed credentials object (blobs are
/// capped at 64 KiB of plaintext, base64 adds a third).
const MAX_ANSWER_BYTES: usize = 128 * 1024;

/// What a broker worker asks the sealer for (JSON body of `POST /v1/seal`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealRequest {
    /// The user whose credentials the worker needs.
    pub user_id: String,
    /// The asking worker (`WORKER_ID`).
    pub worker_id: String,
    /// The worker's public key, as its marks carry it.
    pub seal_key: String,
    /// The worker's task (ECS task ARN, or `local-{pid}`): a cold-start
    /// grant is bound to it.
    #[serde(default)]
    pub task_id: String,
    /// The TTL of the user's mark the sealer sets for the worker (ms; 0 = the
    /// default), until the worker's first heartbeat rewrites it.
    #[serde(default)]
    pub mark_ttl_ms: u64,
}

/// The sealer's answer: the user's credentials and, when the sealer makes
/// per-claim Redis users, the worker's login for its claimed phase, each
/// sealed to the worker's key (JSON body of a `200`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedAnswer {
    /// The credentials JSON object, sealed.
    pub credentials: SealedCredentials,
    /// `{"user", "password"}` of `leasehold-claim-{user_id}`, sealed; only on
    /// a claim or a cold start, never on a reload (the worker keeps the one it has).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<SealedCredentials>,
}

/// What a worker opened from a [`SealedAnswer`].
#[derive(Debug)]
pub struct Unsealed {
    /// Its user's credentials.
    pub credentials: Credentials,
    /// Its per-claim Redis login, if the sealer made one.
    pub redis_login: Option<RedisLogin>,
}

/// How often the sealer sweeps claim users by default
/// (`SEALER_SWEEP_INTERVAL_MS`): well inside a mark's TTL, so a claimed
/// worker whose login a failover dropped gets it back before its heartbeats
/// run out.
pub const CLAIM_USER_SWEEP: Duration = Duration::from_secs(5);

/// Why the sealer did not seal (each maps to one HTTP status; the message
/// names ids and reasons, never a secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealRefusal {
    /// The caller did not prove it is a broker worker of the task it names
    /// (`SEALER_CALLER_AUTH=aws-iam`): nothing was read or decrypted.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The request is not usable (bad user id or key).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// No live `pool:grant:{user_id}`.
    #[error(
        "no credentials grant for user {0} (pool:grant:{0}): only a claim, a cold start or a reload by a trusted component grants them"
    )]
    NoGrant(String),
    /// The grant was used by an earlier seal: one seal per grant.
    #[error(
        "the credentials grant of user {0} was used already: one seal per grant (a claim, cold start or reload grants again)"
    )]
    GrantUsed(String),
    /// The grant is not bound to the asking worker, or another worker holds
    /// the user.
    #[error("worker {worker_id} is not the worker of user {user_id} with this seal_key")]
    NotTheHolder {
        /// The user asked for.
        user_id: String,
        /// The asking worker.
        worker_id: String,
    },
    /// `credentials:{user_id}` does not exist.
    #[error("credentials:{0} is not set")]
    NoCredentials(String),
    /// The stored blob does not decrypt for the user (permanent until someone
    /// writes a new one).
    #[error("credentials of user {user_id} do not decrypt: {problem}")]
    DoesNotDecrypt {
        /// The user.
        user_id: String,
        /// The cipher's reason.
        problem: String,
    },
    /// Redis or KMS cannot answer now; the worker tries again.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

impl SealRefusal {
    /// Its `result` label on [`SEALS_TOTAL`] (one of [`SEAL_RESULTS`]).
    pub fn label(&self) -> &'static str {
        match self {
            SealRefusal::Unauthenticated(_) => "unauthenticated",
            SealRefusal::BadRequest(_) => "bad_request",
            SealRefusal::NoGrant(_) => "no_grant",
            SealRefusal::GrantUsed(_) => "grant_used",
            SealRefusal::NotTheHolder { .. } => "not_the_holder",
            SealRefusal::NoCredentials(_) => "no_credentials",
            SealRefusal::DoesNotDecrypt { .. } => "does_not_decrypt",
            SealRefusal::Unavailable(_) => "unavailable",
        }
    }

    /// The HTTP status the refusal is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            SealRefusal::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            SealRefusal::BadRequest(_) => StatusCode::BAD_REQUEST,
            SealRefusal::NoGrant(_) | SealRefusal::NotTheHolder { .. } => StatusCode::FORBIDDEN,
            SealRefusal::GrantUsed(_) => StatusCode::CONFLICT,
            SealRefusal::NoCredentials(_) => StatusCode::NOT_FOUND,
            SealRefusal::DoesNotDecrypt { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            SealRefusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl From<caller::CallerError> for SealRefusal {
    fn from(err: caller::CallerError) -> Self {
        match err.is_transient() {
            true => SealRefusal::Unavailable(err.to_string()),
            false => SealRefusal::Unauthenticated(err.to_string()),
        }
    }
}

impl From<BusError> for SealRefusal {
    fn from(err: BusError) -> Self {
        SealRefusal::Unavailable(err.to_string())
    }
}

/// A grant for `reason` written now; bind it with
/// [`CredentialsGrant::for_claim`] or [`CredentialsGrant::for_task`].
pub fn new_grant(reason: GrantReason) -> CredentialsGrant {
    CredentialsGrant::new(reason, u64::try_from(SystemClock.now_ms()).unwrap_or(0))
}

/// Grants `user_id`'s credentials to its next worker for
/// [`protocol::GRANT_TTL`]: what a trusted component does before it pushes a
/// claim (bound to the claim), after it launches a cold start (bound to the
/// task) or before it sends `reload_credentials` (bound to the holder).
pub async fn grant_credentials(
    bus: &dyn CredentialBus,
    user_id: &str,
    grant: &CredentialsGrant,
) -> Result<(), BusError> {
    bus.grant_credentials(user_id, &grant.to_json(), protocol::GRANT_TTL)
        .await
}

/// The mark TTL a request may ask for: long enough for a slow first
/// heartbeat, short enough that a worker that dies at once frees the user.
fn mark_ttl(requested_ms: u64) -> Duration {
    match requested_ms {
        0 => crate::worker::DEFAULT_MARK_TTL,
        ms => Duration::from_millis(ms).clamp(Duration::from_secs(1), Duration::from_secs(600)),
    }
}

/// The sealer's decisions over the pool bus and a cipher that can decrypt.
pub struct CredentialSealer {
    bus: Arc<dyn PoolBus>,
    cipher: Arc<dyn CredentialsCipher>,
    claim_users: Option<ClaimUsers>,
    callers: Option<Arc<caller::CallerVerifier>>,
}

impl CredentialSealer {
    /// A sealer reading `bus` and decrypting with `cipher`.
    pub fn new(bus: Arc<dyn PoolBus>, cipher: Arc<dyn CredentialsCipher>) -> Self {
        CredentialSealer {
            bus,
            cipher,
            claim_users: None,
            callers: None,
        }
    }

    /// The sealer `leasehold credential-sealer` runs from its settings: with
    /// `SEALER_CLAIM_REDIS_USERS`, it also makes and sweeps per-claim Redis
    /// users, connected as the sealer's own user.
    pub async fn from_settings(
        bus: Arc<dyn PoolBus>,
        settings: crate::settings::SealerSettings,
    ) -> Result<Self, BusError> {
        let mut sealer = CredentialSealer::new(bus, Arc::new(settings.cipher));
        if let Some(policy) = settings.callers {
            sealer = sealer.with_callers(caller::CallerVerifier::new(policy));
        }
        if !settings.claim_redis_users {
            return Ok(sealer);
        }
        let users = ClaimUsers::connect(settings.redis_url.expose()).await?;
        Ok(sealer.with_claim_users(users))
    }

    /// Also makes a per-claim Redis user for each claim and cold start
    /// (`SEALER_CLAIM_REDIS_USERS`), and sweeps them.
    pub fn with_claim_users(mut self, claim_users: ClaimUsers) -> Self {
        self.claim_users = Some(claim_users);
        self
    }

    /// Answers only callers that prove, with a signed `GetCallerIdentity`,
    /// that they are a broker role's session for the worker and task they
    /// name (`SEALER_CALLER_AUTH=aws-iam`).
    pub fn with_callers(mut self, verifier: caller::CallerVerifier) -> Self {
        self.callers = Some(Arc::new(verifier));
        self
    }

    /// Checks the caller's proof (the [`caller::PROOF_HEADER`] value) when
    /// callers must authenticate: before anything is read or decrypted, so
    /// an unauthenticated peer causes no Redis read, no KMS call, no change.
    pub async fn authenticate(
        &self,
        proof: Option<&str>,
        request: &SealRequest,
    ) -> Result<(), SealRefusal> {
        match &self.callers {
            None => Ok(()),
            Some(verifier) => {
                verifier
                    .verify(proof, &request.worker_id, &request.task_id)
                    .await?;
                Ok(())
            }
        }
    }

    /// Deletes the claim users whose user has no worker and no grant, and
    /// makes again those a failover or an `ACL LOAD` dropped while their
    /// holder still holds the user. Returns (deleted, restored).
    pub async fn sweep_claim_users(&self) -> Result<(u64, u64), BusError> {
        match &self.claim_users {
            Some(claim_users) => {
                let restored = claim_users.restore().await?;
                let deleted = claim_users.sweep(self.bus.as_ref()).await?;
                Ok((deleted, restored))
            }
            None => Ok((0, 0)),
        }
    }

    /// The user's credentials sealed to the asking worker, or why not.
    pub async fn seal(&self, request: &SealRequest) -> Result<SealedAnswer, SealRefusal> {
        keys::check_user_id(&request.user_id)
            .map_err(|err| SealRefusal::BadRequest(err.to_string()))?;
        if request.worker_id.is_empty() || request.worker_id.contains(['*', '?', '[']) {
            return Err(SealRefusal::BadRequest("worker_id".into()));
        }
        sealing::parse_public_key(&request.seal_key)
            .map_err(|err| SealRefusal::BadRequest(err.to_string()))?;
        let user_id = request.user_id.as_str();
        // A read-only look first: no KMS call for a request that cannot be
        // answered. The assign step below decides; this only saves work.
        match self.bus.credentials_grant(user_id).await? {
            None => return Err(SealRefusal::NoGrant(user_id.to_owned())),
            Some(Some(grant)) if grant.used_by.is_some() => {
                return Err(SealRefusal::GrantUsed(user_id.to_owned()));
            }
            Some(_) => {}
        }
        let blob = self
            .bus
            .credentials(user_id)
            .await?
            .ok_or_else(|| SealRefusal::NoCredentials(user_id.to_owned()))?;
        let credentials =
            self.cipher
                .decrypt(user_id, &blob)
                .await
                .map_err(|err| match err.is_transient() {
                    true => SealRefusal::Unavailable(err.to_string()),
                    false => SealRefusal::DoesNotDecrypt {
                        user_id: user_id.to_owned(),
                        problem: err.to_string(),
                    },
                })?;
        let ttl = mark_ttl(request.mark_ttl_ms);
        let now = u64::try_from(SystemClock.now_ms()).unwrap_or(0);
        let mark = MarkValue {
            worker_id: request.worker_id.clone(),
            task_id: request.task_id.clone(),
            user_id: user_id.to_owned(),
            heartbeat_at: now,
            started_at: now,
            sidecar_url: None,
            ttl_ms: Some(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)),
            heartbeat_interval_ms: None,
            seal_key: Some(request.seal_key.clone()),
        }
        .to_json();
        // Made before the step, so the holder record keeps its hash (the
        // login survives a failover); handed out only if the step assigns.
        let password = self
            .claim_users
            .as_ref()
            .map(|_| zeroize::Zeroizing::new(claim_users::new_password()));
        let login_hash = password
            .as_deref()
            .map(|password| claim_users::password_hash(password))
            .unwrap_or_default();
        let assign = AssignRequest {
            asker: Asker {
                user_id,
                worker_id: &request.worker_id,
                seal_key: &request.seal_key,
                task_id: &request.task_id,
            },
            mark: &mark,
            mark_ttl: ttl,
            login_hash: &login_hash,
        };
        let not_the_holder = || SealRefusal::NotTheHolder {
            user_id: user_id.to_owned(),
            worker_id: request.worker_id.clone(),
        };
        let (bound_to, new_holder) = match self.bus.assign_user(&assign).await? {
            Assignment::Assigned { bound_to } => (bound_to, true),
            // A reload keeps the login the worker has: a new password would
            // cut its next reconnect.
            Assignment::Renewed { bound_to } => (bound_to, false),
            Assignment::NoGrant => return Err(SealRefusal::NoGrant(user_id.to_owned())),
            Assignment::GrantUsed => return Err(SealRefusal::GrantUsed(user_id.to_owned())),
            Assignment::NotBound | Assignment::Held => return Err(not_the_holder()),
        };
        let plaintext = credentials.to_json();
        let seal = |purpose: sealing::Purpose, plaintext: &[u8]| {
            let context = sealing::SealContext {
                purpose,
                user_id,
                worker_id: &request.worker_id,
                claim: &bound_to,
            };
            sealing::seal_to(&request.seal_key, &context, plaintext)
                .map_err(|err| SealRefusal::BadRequest(err.to_string()))
        };
        let sealed = seal(sealing::Purpose::Credentials, &plaintext)?;
        let redis = match (&self.claim_users, &password) {
            (Some(claim_users), Some(password)) if new_holder => {
                let login = claim_users.create(user_id, password).await?;
                let json = zeroize::Zeroizing::new(
                    serde_json::json!({"user": login.user, "password": login.password}).to_string(),
                );
                Some(seal(sealing::Purpose::RedisLogin, json.as_bytes())?)
            }
            _ => None,
        };
        Ok(SealedAnswer {
            credentials: sealed,
            redis,
        })
    }
}

/// The refusal as the worker reads it.
#[derive(Debug, Serialize, Deserialize)]
struct RefusalBody {
    error: String,
}

impl IntoResponse for SealRefusal {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = RefusalBody {
            error: self.to_string(),
        };
        (status, Json(body)).into_response()
    }
}

/// `POST /v1/seal` with [`observability_router`]'s routes.
pub fn router(sealer: Arc<CredentialSealer>, metrics: Option<PrometheusHandle>) -> Router {
    Router::new()
        .route(SEAL_PATH, post(seal_handler))
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
        .with_state(sealer)
        .merge(observability_router(metrics))
}

/// `GET /healthz` and, with a recorder, `GET /metrics` (counts only: no id,
/// no secret), and nothing else: what `SEALER_METRICS_LISTEN` serves over
/// plain HTTP beside an HTTPS `SEALER_LISTEN`.
pub fn observability_router(metrics: Option<PrometheusHandle>) -> Router {
    let router = Router::new().route("/healthz", get(|| async { "ok\n" }));
    match metrics {
        Some(handle) => router.route("/metrics", get(move || async move { handle.render() })),
        None => router,
    }
}

async fn seal_handler(
    State(sealer): State<Arc<CredentialSealer>>,
    headers: axum::http::HeaderMap,
    Json(request): Json<SealRequest>,
) -> Result<Json<SealedAnswer>, SealRefusal> {
    let proof = headers
        .get(caller::PROOF_HEADER)
        .and_then(|value| value.to_str().ok());
    let sealed = match sealer.authenticate(proof, &request).await {
        Ok(()) => sealer.seal(&request).await,
        Err(refusal) => Err(refusal),
    };
    let result = sealed
        .as_ref()
        .map_or_else(SealRefusal::label, |_| "sealed");
    metrics::counter!(SEALS_TOTAL, "result" => result).increment(1);
    match sealed {
        Ok(sealed) => {
            tracing::info!(
                user_id = request.user_id,
                worker_id = request.worker_id,
                "credentials sealed to the user's worker"
            );
            Ok(Json(sealed))
        }
        Err(refusal) => {
            tracing::warn!(
                user_id = request.user_id,
                worker_id = request.worker_id,
                reason = %refusal,
                "credentials not sealed"
            );
            Err(refusal)
        }
    }
}

/// Serves the sealer on `listener` until `shutdown` (in-flight requests
/// finish), sweeping claim users every `sweep` meanwhile; HTTPS only when
/// `tls` is given (`SEALER_TLS_CERT`, `SEALER_TLS_KEY`), plain HTTP
/// otherwise (`leasehold dev`, tests; refused on ECS by the settings).
pub async fn serve(
    listener: tokio::net::TcpListener,
    sealer: Arc<CredentialSealer>,
    sweep: Duration,
    metrics: Option<PrometheusHandle>,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    let sweeper = sealer.clone();
    let sweep = tokio::spawn(leasehold_platform::periodic::every(
        sweep,
        shutdown.clone(),
        move || {
            let sealer = sweeper.clone();
            async move {
                match sealer.sweep_claim_users().await {
                    Ok((0, 0)) => {}
                    Ok((deleted, restored)) => tracing::info!(
                        deleted,
                        restored,
                        "claim users swept: deleted those of users without a worker, made again those a failover or ACL LOAD dropped"
                    ),
                    Err(err) => tracing::warn!(error = %err, "cannot sweep claim users"),
                }
            }
        },
    ));
    let app = router(sealer, metrics);
    let served = match tls {
        None => {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
        }
        Some(config) => {
            let handle = axum_server::Handle::new();
            let stopping = handle.clone();
            let stop = tokio::spawn(async move {
                shutdown.cancelled().await;
                stopping.graceful_shutdown(Some(Duration::from_secs(10)));
            });
            let config = axum_server::tls_rustls::RustlsConfig::from_config(config);
            let served = axum_server::from_tcp_rustls(listener.into_std()?, config)?
                .handle(handle)
                .serve(app.into_make_service())
                .await;
            stop.abort();
            served
        }
    };
    sweep.abort();
    served
}

/// A client for `http://` and `https://` sealer URLs, trusting `ca_pem`.
fn https_client(
    ca_pem: Option<&[u8]>,
) -> Result<Client<HttpsConnector<HttpConnector>, Full<hyper::body::Bytes>>, tls::TlsError> {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls::client_config(ca_pem)?)
        .https_or_http()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}

/// What a worker asks the sealer for ([`SealerClient::fetch`]).
#[derive(Debug, Clone, Copy)]
pub struct SealAsk<'a> {
    /// The user.
    pub user_id: &'a str,
    /// This worker.
    pub worker_id: &'a str,
    /// This worker's task (a cold-start grant is bound to it).
    pub task_id: &'a str,
    /// What the grant is bound to, as this worker knows it: the claim id it
    /// took, its own task on a cold start, the same again on a reload. The
    /// answer opens only for it.
    pub binding: &'a str,
    /// The TTL of the mark the sealer sets for this worker.
    pub mark_ttl: Duration,
}

/// Serves [`observability_router`] over plain HTTP on `listener` until
/// `shutdown` (`SEALER_METRICS_LISTEN`).
pub async fn serve_observability(
    listener: tokio::net::TcpListener,
    metrics: PrometheusHandle,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, observability_router(Some(metrics)))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// A worker's side: asks the sealer at `CREDENTIALS_SEALER_URL` and opens the
/// answer with the worker's own key.
pub struct SealerClient {
    base: String,
    key: SealingKey,
    timeout: Duration,
    client: Client<HttpsConnector<HttpConnector>, Full<hyper::body::Bytes>>,
    prover: Option<Arc<caller::CallerProver>>,
}

impl std::fmt::Debug for SealerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealerClient")
            .field("base", &self.base)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl SealerClient {
    /// A client of the sealer at `base` (`http://host:port`) with a fresh
    /// key; for `https://`, see [`SealerClient::trusting`].
    pub fn new(base: &str, timeout: Duration) -> Self {
        SealerClient {
            base: base.trim_end_matches('/').to_owned(),
            key: SealingKey::generate(),
            timeout,
            // Trusting no CA parses nothing: only the provider's protocol
            // versions are checked, and aws-lc-rs has them all.
            client: https_client(None).expect("a client trusting no CA always builds"),
            prover: None,
        }
    }

    /// This client, proving its AWS identity on every request
    /// (`SEALER_CALLER_AUTH=aws-iam`).
    pub fn proving(mut self, prover: caller::CallerProver) -> Self {
        self.prover = Some(Arc::new(prover));
        self
    }

    /// This client, trusting only the CA certificates in `ca_pem` for an
    /// `https://` sealer (`CREDENTIALS_SEALER_CA`).
    pub fn trusting(mut self, ca_pem: &[u8]) -> Result<Self, tls::TlsError> {
        self.client = https_client(Some(ca_pem))?;
        Ok(self)
    }

    /// The public key this worker's marks carry.
    pub fn seal_key(&self) -> String {
        self.key.public_base64()
    }

    /// `user_id`'s credentials, sealed to this worker by the sealer. Errors
    /// are [`CipherError::SealerUnavailable`] (try again) or
    /// [`CipherError::SealerRefused`] (the sealer's reason).
    pub async fn fetch(&self, ask: &SealAsk<'_>) -> Result<Unsealed, CipherError> {
        let (user_id, worker_id) = (ask.user_id, ask.worker_id);
        let body = serde_json::to_vec(&SealRequest {
            user_id: user_id.to_owned(),
            worker_id: worker_id.to_owned(),
            seal_key: self.seal_key(),
            task_id: ask.task_id.to_owned(),
            mark_ttl_ms: u64::try_from(ask.mark_ttl.as_millis()).unwrap_or(u64::MAX),
        })
        .map_err(|err| CipherError::SealerUnavailable(err.to_string()))?;
        let mut request = hyper::Request::post(format!("{}{SEAL_PATH}", self.base))
            .header(hyper::header::CONTENT_TYPE, "application/json");
        if let Some(prover) = &self.prover {
            let proof = prover
                .proof()
                .await
                .map_err(|err| CipherError::SealerUnavailable(err.to_string()))?;
            request = request.header(caller::PROOF_HEADER, proof);
        }
        let request = request
            .body(Full::new(hyper::body::Bytes::from(body)))
            .map_err(|_| {
                CipherError::SealerUnavailable("CREDENTIALS_SEALER_URL is not a valid URL".into())
            })?;
        let unavailable = |problem: String| CipherError::SealerUnavailable(problem);
        let response = tokio::time::timeout(self.timeout, self.client.request(request))
            .await
            .map_err(|_| unavailable(format!("no answer within {:?}", self.timeout)))?
            .map_err(|err| unavailable(format!("request failed: {err}")))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|err| unavailable(format!("reading the answer failed: {err}")))?
            .to_bytes();
        if !status.is_success() {
            let reason = serde_json::from_slice::<RefusalBody>(&body)
                .map(|refusal| refusal.error)
                .unwrap_or_else(|_| "no reason given".into());
            return Err(match status {
                StatusCode::SERVICE_UNAVAILABLE => unavailable(reason),
                _ => CipherError::SealerRefused {
                    status: status.as_u16(),
                    reason,
                },
            });
        }
        let answer: SealedAnswer = serde_json::from_slice(&body)
            .map_err(|_| unavailable("the answer is not sealed credentials".into()))?;
        let open = |purpose: sealing::Purpose, sealed: &SealedCredentials| {
            let context = sealing::SealContext {
                purpose,
                user_id,
                worker_id,
                claim: ask.binding,
            };
            self.key.open(&context, sealed).map_err(|err| match err {
                sealing::SealError::Cipher(err) => err,
                other => CipherError::SealerRefused {
                    status: 200,
                    reason: other.to_string(),
                },
            })
        };
        let credentials = open(sealing::Purpose::Credentials, &answer.credentials)?;
        let redis_login = match &answer.redis {
            None => None,
            Some(sealed) => {
                let login = open(sealing::Purpose::RedisLogin, sealed)?;
                let field = |name: &str| login.get(name).map(|v| v.expose().to_owned());
                match (field("user"), field("password")) {
                    (Some(user), Some(password)) => Some(RedisLogin { user, password }),
                    _ => {
                        return Err(CipherError::SealerRefused {
                            status: 200,
                            reason: "the sealed Redis login lacks `user` or `password`".into(),
                        });
                    }
                }
            }
        };
        Ok(Unsealed {
            credentials,
            redis_login,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_ttl_is_bounded_and_defaults() {
        assert_eq!(mark_ttl(0), crate::worker::DEFAULT_MARK_TTL);
        assert_eq!(mark_ttl(5), Duration::from_secs(1));
        assert_eq!(mark_ttl(20_000), Duration::from_secs(20));
        assert_eq!(mark_ttl(u64::MAX), Duration::from_secs(600));
    }

    #[test]
    fn every_refusal_has_a_counted_result() {
        for refusal in [
            SealRefusal::Unauthenticated("x".into()),
            SealRefusal::BadRequest("x".into()),
            SealRefusal::NoGrant("u".into()),
            SealRefusal::GrantUsed("u".into()),
            SealRefusal::NotTheHolder {
                user_id: "u".into(),
                worker_id: "w".into(),
            },
            SealRefusal::NoCredentials("u".into()),
            SealRefusal::Unavailable("x".into()),
        ] {
            assert!(SEAL_RESULTS.contains(&refusal.label()), "{refusal:?}");
        }
        assert_eq!(
            SealRefusal::GrantUsed("u".into()).status(),
            StatusCode::CONFLICT
        );
    }
}
