//! The credential sealer (`leasehold credential-sealer`): the one component
//! that may decrypt credentials blobs (KMS `Decrypt`, or the local key in
//! development) and read `credentials:*`. A broker worker asks it for its
//! user's credentials over HTTP and gets them sealed to the key in its mark
//! ([`crate::sealing`]); the broker task itself holds no decrypt capability.
//!
//! The sealer answers only when, at that moment:
//! 1. a trusted component granted the user's credentials
//!    (`pool:grant:{user_id}`, written by the claim path, supervision's cold
//!    start or `credentials rotate`, none of which a broker worker may write);
//! 2. the asking worker is the user's worker: `worker:active:{user_id}` names
//!    it with the same `seal_key`, or (before the claim step) no one holds the
//!    user, the worker's pool mark carries that `seal_key` and its
//!    `pool:claims:processing:{worker_id}` holds a claim for the user.
//!
//! What this does not stop is written in `deploy/README.md`: every broker
//! worker shares one Redis user, so a compromised one can race for a user
//! while a grant is live (as it can take any claim from the queue).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use leasehold_control::clock::{Clock, SystemClock};
use leasehold_pool::bus::{BusError, PoolBus};
use leasehold_pool::claim_users::{ClaimUsers, RedisLogin};
use leasehold_pool::keys;
use leasehold_pool::protocol::{self, GrantReason, MarkValue};
use leasehold_pool::state::PoolState;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::{Deserialize, Serialize};

use crate::credentials::{CipherError, Credentials, CredentialsCipher};
use crate::sealing::{self, SealedCredentials, SealingKey};

/// The sealer's default listen address (`SEALER_LISTEN`).
pub const DEFAULT_LISTEN: &str = "0.0.0.0:9480";

/// The path a worker posts [`SealRequest`]s to.
pub const SEAL_PATH: &str = "/v1/seal";

/// `leasehold_credential_seals_total{result}`: every seal request by outcome.
/// Refusals other than `unavailable` mean a misconfigured claimer (`no_grant`)
/// or a worker asking for a user that is not its own (`not_the_holder`).
pub const SEALS_TOTAL: &str = "leasehold_credential_seals_total";

/// Every metric the sealer exports on `GET /metrics` (docs/metrics.md).
pub const METRICS: &[&str] = &[SEALS_TOTAL];

/// The `result` values of [`SEALS_TOTAL`]: `sealed`, then each refusal's.
pub const SEAL_RESULTS: &[&str] = &[
    "sealed",
    "bad_request",
    "no_grant",
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

/// How often the sealer deletes claim users whose user has no worker, by
/// default (`SEALER_SWEEP_INTERVAL_MS`).
pub const CLAIM_USER_SWEEP: Duration = Duration::from_secs(30);

/// Why the sealer did not seal (each maps to one HTTP status; the message
/// names ids and reasons, never a secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealRefusal {
    /// The request is not usable (bad user id or key).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// No live `pool:grant:{user_id}`.
    #[error(
        "no credentials grant for user {0} (pool:grant:{0}): only a claim, a cold start or a reload by a trusted component grants them"
    )]
    NoGrant(String),
    /// The asking worker neither holds nor is claiming the user with that key.
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
            SealRefusal::BadRequest(_) => "bad_request",
            SealRefusal::NoGrant(_) => "no_grant",
            SealRefusal::NotTheHolder { .. } => "not_the_holder",
            SealRefusal::NoCredentials(_) => "no_credentials",
            SealRefusal::DoesNotDecrypt { .. } => "does_not_decrypt",
            SealRefusal::Unavailable(_) => "unavailable",
        }
    }

    /// The HTTP status the refusal is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            SealRefusal::BadRequest(_) => StatusCode::BAD_REQUEST,
            SealRefusal::NoGrant(_) | SealRefusal::NotTheHolder { .. } => StatusCode::FORBIDDEN,
            SealRefusal::NoCredentials(_) => StatusCode::NOT_FOUND,
            SealRefusal::DoesNotDecrypt { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            SealRefusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl From<BusError> for SealRefusal {
    fn from(err: BusError) -> Self {
        SealRefusal::Unavailable(err.to_string())
    }
}

/// Grants `user_id`'s credentials to its worker for
/// [`protocol::GRANT_TTL`]: what a trusted component does before it pushes a
/// claim, launches a cold start or sends `reload_credentials`.
pub async fn grant_credentials(
    bus: &dyn PoolBus,
    user_id: &str,
    reason: protocol::GrantReason,
) -> Result<(), BusError> {
    let grant = protocol::CredentialsGrant {
        reason,
        granted_at: u64::try_from(SystemClock.now_ms()).unwrap_or(0),
    };
    bus.grant_credentials(user_id, &grant.to_json(), protocol::GRANT_TTL)
        .await
}

/// Whether `worker_id` with `seal_key` is the user's worker, from what Redis
/// holds: the user's mark, the worker's pool mark and its claim list. Pure,
/// so every rule has a test without Redis.
pub fn is_the_users_worker(
    request: &SealRequest,
    user_mark: Option<&MarkValue>,
    pool_mark: Option<&MarkValue>,
    taken_claims: &[String],
) -> bool {
    let same_key = |mark: &MarkValue| mark.seal_key.as_deref() == Some(request.seal_key.as_str());
    match user_mark {
        // The user is served: only by its holder, with the key it published.
        Some(mark) => mark.worker_id == request.worker_id && same_key(mark),
        // Not served yet: a pool worker between taking the user's claim and
        // the claim step (which needs the credentials first).
        None => {
            pool_mark.is_some_and(|mark| mark.worker_id == request.worker_id && same_key(mark))
                && taken_claims.iter().any(|raw| {
                    protocol::parse_claim(raw).is_ok_and(|claim| claim.user_id == request.user_id)
                })
        }
    }
}

/// The sealer's decisions over the pool bus and a cipher that can decrypt.
pub struct CredentialSealer {
    bus: Arc<dyn PoolBus>,
    cipher: Arc<dyn CredentialsCipher>,
    claim_users: Option<ClaimUsers>,
}

impl CredentialSealer {
    /// A sealer reading `bus` and decrypting with `cipher`.
    pub fn new(bus: Arc<dyn PoolBus>, cipher: Arc<dyn CredentialsCipher>) -> Self {
        CredentialSealer {
            bus,
            cipher,
            claim_users: None,
        }
    }

    /// The sealer `leasehold credential-sealer` runs from its settings: with
    /// `SEALER_CLAIM_REDIS_USERS`, it also makes and sweeps per-claim Redis
    /// users, connected as the sealer's own user.
    pub async fn from_settings(
        bus: Arc<dyn PoolBus>,
        settings: crate::settings::SealerSettings,
    ) -> Result<Self, BusError> {
        let sealer = CredentialSealer::new(bus, Arc::new(settings.cipher));
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

    /// Deletes the claim users whose user has no worker and no grant.
    pub async fn sweep_claim_users(&self) -> Result<u64, BusError> {
        match &self.claim_users {
            Some(claim_users) => claim_users.sweep(self.bus.as_ref()).await,
            None => Ok(0),
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
        let Some(grant) = self.bus.credentials_grant(user_id).await? else {
            return Err(SealRefusal::NoGrant(user_id.to_owned()));
        };
        let user_mark = self.bus.user_mark(user_id).await?;
        let (pool_mark, taken) = if user_mark.is_none() {
            let pool_mark = self.bus.pool_mark(&request.worker_id).await?;
            let taken = self.bus.claims_taken_by(&request.worker_id).await?;
            (pool_mark, taken)
        } else {
            (None, Vec::new())
        };
        if !is_the_users_worker(request, user_mark.as_ref(), pool_mark.as_ref(), &taken) {
            return Err(SealRefusal::NotTheHolder {
                user_id: user_id.to_owned(),
                worker_id: request.worker_id.clone(),
            });
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
        let plaintext = credentials.to_json();
        let seal = |purpose: sealing::Purpose, plaintext: &[u8]| {
            let context = sealing::SealContext {
                purpose,
                user_id,
                worker_id: &request.worker_id,
            };
            sealing::seal_to(&request.seal_key, &context, plaintext)
                .map_err(|err| SealRefusal::BadRequest(err.to_string()))
        };
        let sealed = seal(sealing::Purpose::Credentials, &plaintext)?;
        // A reload keeps the login the worker has: a new password would cut
        // its next reconnect.
        let new_holder = grant.is_none_or(|grant| grant.reason != GrantReason::Reload);
        let redis = match &self.claim_users {
            Some(claim_users) if new_holder => {
                let login = claim_users.create(user_id).await?;
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

/// `POST /v1/seal`, `GET /healthz` and, with a recorder, `GET /metrics`
/// (counts only: no id, no secret).
pub fn router(sealer: Arc<CredentialSealer>, metrics: Option<PrometheusHandle>) -> Router {
    let router = Router::new()
        .route(SEAL_PATH, post(seal_handler))
        .route("/healthz", get(|| async { "ok\n" }));
    let router = match metrics {
        Some(handle) => router.route("/metrics", get(move || async move { handle.render() })),
        None => router,
    };
    router
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
        .with_state(sealer)
}

async fn seal_handler(
    State(sealer): State<Arc<CredentialSealer>>,
    Json(request): Json<SealRequest>,
) -> Result<Json<SealedAnswer>, SealRefusal> {
    let sealed = sealer.seal(&request).await;
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
/// finish), sweeping claim users every `sweep` meanwhile.
pub async fn serve(
    listener: tokio::net::TcpListener,
    sealer: Arc<CredentialSealer>,
    sweep: Duration,
    metrics: Option<PrometheusHandle>,
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
                    Ok(0) => {}
                    Ok(deleted) => {
                        tracing::info!(deleted, "claim users of users without a worker deleted")
                    }
                    Err(err) => tracing::warn!(error = %err, "cannot sweep claim users"),
                }
            }
        },
    ));
    let served = axum::serve(listener, router(sealer, metrics))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await;
    sweep.abort();
    served
}

/// A worker's side: asks the sealer at `CREDENTIALS_SEALER_URL` and opens the
/// answer with the worker's own key.
pub struct SealerClient {
    base: String,
    key: SealingKey,
    timeout: Duration,
    client: Client<HttpConnector, Full<hyper::body::Bytes>>,
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
    /// A client of the sealer at `base` (`http://host:port`) with a fresh key.
    pub fn new(base: &str, timeout: Duration) -> Self {
        SealerClient {
            base: base.trim_end_matches('/').to_owned(),
            key: SealingKey::generate(),
            timeout,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// The public key this worker's marks carry.
    pub fn seal_key(&self) -> String {
        self.key.public_base64()
    }

    /// `user_id`'s credentials, sealed to this worker by the sealer. Errors
    /// are [`CipherError::SealerUnavailable`] (try again) or
    /// [`CipherError::SealerRefused`] (the sealer's reason).
    pub async fn fetch(&self, user_id: &str, worker_id: &str) -> Result<Unsealed, CipherError> {
        let body = serde_json::to_vec(&SealRequest {
            user_id: user_id.to_owned(),
            worker_id: worker_id.to_owned(),
            seal_key: self.seal_key(),
        })
        .map_err(|err| CipherError::SealerUnavailable(err.to_string()))?;
        let request = hyper::Request::post(format!("{}{SEAL_PATH}", self.base))
            .header(hyper::header::CONTENT_TYPE, "application/json")
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

    fn mark(worker_id: &str, user_id: &str, seal_key: Option<&str>) -> MarkValue {
        MarkValue {
            worker_id: worker_id.into(),
            task_id: format!("task-{worker_id}"),
            user_id: user_id.into(),
            heartbeat_at: 1,
            started_at: 1,
            sidecar_url: None,
            ttl_ms: None,
            heartbeat_interval_ms: None,
            seal_key: seal_key.map(str::to_owned),
        }
    }

    fn claim(user_id: &str) -> String {
        format!(
            r#"{{"user_id": "{user_id}", "encrypted_credentials": "x", "claim_id": "c-{user_id}", "enqueued_at": 1}}"#
        )
    }

    #[test]
    fn only_the_users_worker_with_its_published_key_is_answered() {
        let request = SealRequest {
            user_id: "alice".into(),
            worker_id: "w1".into(),
            seal_key: "K1".into(),
        };
        // Claimed: the holder with its key, and no one else.
        assert!(is_the_users_worker(
            &request,
            Some(&mark("w1", "alice", Some("K1"))),
            None,
            &[]
        ));
        assert!(!is_the_users_worker(
            &request,
            Some(&mark("w2", "alice", Some("K1"))),
            None,
            &[]
        ));
        assert!(!is_the_users_worker(
            &request,
            Some(&mark("w1", "alice", Some("K2"))),
            None,
            &[]
        ));
        assert!(!is_the_users_worker(
            &request,
            Some(&mark("w1", "alice", None)),
            None,
            &[]
        ));
        // A claimed user is never handed to a pool worker holding a stale claim.
        assert!(!is_the_users_worker(
            &request,
            Some(&mark("w2", "alice", Some("K2"))),
            Some(&mark("w1", "-1", Some("K1"))),
            &[claim("alice")]
        ));
        // Before the claim step: the pool worker that took alice's claim.
        let pool = mark("w1", "-1", Some("K1"));
        assert!(is_the_users_worker(
            &request,
            None,
            Some(&pool),
            &[claim("alice")]
        ));
        assert!(!is_the_users_worker(
            &request,
            None,
            Some(&pool),
            &[claim("bob")]
        ));
        assert!(!is_the_users_worker(&request, None, Some(&pool), &[]));
        assert!(!is_the_users_worker(
            &request,
            None,
            None,
            &[claim("alice")]
        ));
        assert!(!is_the_users_worker(
            &request,
            None,
            Some(&mark("w1", "-1", Some("K2"))),
            &[claim("alice")]
        ));
    }
}
