//! The broker pool's variables, read with every problem reported at once.
//! `CREDENTIALS_KEY` and `REDIS_URL` values (and the key file's content) are
//! never echoed: problems name the variable only.

use std::path::PathBuf;
use std::time::Duration;

use leasehold_control::clock::{Clock, SystemClock};
use leasehold_platform::backoff::Backoff;
use leasehold_platform::settings::{
    ConfigError, Documented, Env, Fallback, Lookup, Parser, Setting, parse,
};
use leasehold_pool::keys;
use leasehold_pool::settings::REDIS_URL;

use crate::connections::{CallTimeouts, ConnectPolicy, RECONNECT};
use crate::credentials::{AesGcmCipher, Keyring, KmsEnvelope};
use crate::launcher::{EcsLauncher, EcsSettings, LocalLauncher, TaskLauncher};
use crate::maintenance::SweepConfig;
use crate::paper::PaperConfig;
use crate::sealer::caller::{AllowedRole, CallerAuth, CallerPolicy};
use crate::worker::{BrokerWorkerConfig, DEFAULT_QUEUE_MAX, RequestBounds, WorkerMetadata};
use leasehold_platform::aws::{RetryPolicy, sdk_config};

/// One of the ECS launch types.
const LAUNCH_TYPE: Parser<String> = Parser {
    parse: |raw| match raw {
        "FARGATE" | "EC2" | "EXTERNAL" => Ok(raw.to_owned()),
        _ => Err("must be FARGATE, EC2 or EXTERNAL".into()),
    },
    show: Clone::clone,
};

/// A directory path.
const PATH: Parser<PathBuf> = Parser {
    parse: |raw| Ok(PathBuf::from(raw)),
    show: |v| v.display().to_string(),
};

/// The `USER_ID` variable.
pub const USER_ID: Setting<String> = Setting::new(
    "USER_ID",
    parse::TEXT,
    Fallback::Derived("-1"),
    "user a broker worker serves; `-1` starts it in the warm pool waiting for a claim",
);
/// The `CREDENTIALS_KMS_KEY_ID` variable.
pub const CREDENTIALS_KMS_KEY_ID: Setting<String> = Setting::new(
    "CREDENTIALS_KMS_KEY_ID",
    parse::TEXT,
    Fallback::Unset,
    "KMS key (key id, ARN or `alias/…`) that `credentials put` and `credentials rotate` wrap \
     each blob's fresh data key under (blob version 2, \
     [messages.md](messages.md#credentials-blob-version-2--key-credentialsuser_id)); not a \
     secret. Workers decrypt with the key each blob names, so this only has to be right for \
     writers; it also selects KMS mode, in which a worker needs no local key",
);
/// The `CREDENTIALS_KEY` variable.
pub const CREDENTIALS_KEY: Setting<String> = Setting::secret(
    "CREDENTIALS_KEY",
    parse::TEXT,
    Fallback::Unset,
    "local key of version 1 blobs (`dev`, tests): standard base64 of 32 random bytes (never \
     printed). Refused in production unless `CREDENTIALS_ALLOW_LOCAL_KEY=true`",
);
/// The `CREDENTIALS_KEY_FILE` variable.
pub const CREDENTIALS_KEY_FILE: Setting<PathBuf> = Setting::new(
    "CREDENTIALS_KEY_FILE",
    PATH,
    Fallback::Unset,
    "a file holding the local key (same form; surrounding whitespace ignored), so the key \
     need not sit in the environment; same rules as `CREDENTIALS_KEY`; set one or the other",
);
/// The `CREDENTIALS_ALLOW_LOCAL_KEY` variable.
pub const CREDENTIALS_ALLOW_LOCAL_KEY: Setting<bool> = Setting::new(
    "CREDENTIALS_ALLOW_LOCAL_KEY",
    parse::BOOL,
    Fallback::Value(|| false),
    "allows a local key in production, e.g. to read version 1 blobs while `credentials \
     rotate` moves them to KMS",
);
/// The `CREDENTIALS_SEALER_URL` variable.
pub const CREDENTIALS_SEALER_URL: Setting<String> = Setting::new(
    "CREDENTIALS_SEALER_URL",
    parse::TEXT,
    Fallback::Unset,
    "base URL of the credential sealer (`https://host:9480`; `http://` is refused on ECS), \
     for `broker-worker`. Set: the worker decrypts nothing and reads no `credentials:*` key; \
     it publishes an X25519 key in its marks (`seal_key`) and gets its user's credentials \
     sealed to it. Required on ECS unless a local key is allowed (a broker worker on ECS has \
     no KMS access)",
);
/// The `CREDENTIALS_SEALER_CA` variable.
pub const CREDENTIALS_SEALER_CA: Setting<String> = Setting::new(
    "CREDENTIALS_SEALER_CA",
    parse::TEXT,
    Fallback::Unset,
    "the CA certificate(s), PEM text, a broker worker trusts for an `https://` \
     `CREDENTIALS_SEALER_URL`, and only those (no public roots); required with `https://`",
);
/// The `SEALER_TLS_CERT` variable.
pub const SEALER_TLS_CERT: Setting<String> = Setting::new(
    "SEALER_TLS_CERT",
    parse::TEXT,
    Fallback::Unset,
    "the credential sealer's certificate chain, PEM text (on ECS a secret from Secrets \
     Manager); with `SEALER_TLS_KEY` the sealer serves HTTPS only. Both or neither; both are \
     required on ECS",
);
/// The `SEALER_TLS_KEY` variable.
pub const SEALER_TLS_KEY: Setting<String> = Setting::secret(
    "SEALER_TLS_KEY",
    parse::TEXT,
    Fallback::Unset,
    "the private key of `SEALER_TLS_CERT`, PEM text (PKCS#8, SEC1 or PKCS#1); never printed, \
     and a key that does not match the certificate is a configuration error at start",
);
/// The `SEALER_METRICS_LISTEN` variable.
pub const SEALER_METRICS_LISTEN: Setting<std::net::SocketAddr> = Setting::new(
    "SEALER_METRICS_LISTEN",
    parse::SOCKET_ADDR,
    Fallback::Unset,
    "where the credential sealer also serves `GET /healthz` and `GET /metrics` over plain \
     HTTP (counts only, never a seal): the ECS health check and Prometheus, which do not \
     speak the sealer's TLS. Unset: none (both stay on `SEALER_LISTEN` as well)",
);
/// The `SEALER_LISTEN` variable.
pub const SEALER_LISTEN: Setting<std::net::SocketAddr> = Setting::new(
    "SEALER_LISTEN",
    parse::SOCKET_ADDR,
    Fallback::Value(|| {
        crate::sealer::DEFAULT_LISTEN
            .parse()
            .expect("a socket address")
    }),
    "where `leasehold credential-sealer` listens for broker workers (`POST /v1/seal`; HTTPS \
     only when `SEALER_TLS_CERT` and `SEALER_TLS_KEY` are set, which ECS requires)",
);
/// The `SEALER_CLAIM_REDIS_USERS` variable.
pub const SEALER_CLAIM_REDIS_USERS: Setting<bool> = Setting::new(
    "SEALER_CLAIM_REDIS_USERS",
    parse::BOOL,
    Fallback::Value(|| false),
    "`true` (self-managed Redis/Valkey, which allow `ACL SETUSER`): for each claim and cold \
     start the credential sealer makes the Redis user `leasehold-claim-{user_id}`, confined \
     to that user's keys, and hands its login to the worker sealed with the credentials; the \
     worker serves its user through it, so the pool-wide `broker-worker` user reaches no \
     user's queues. Users whose user has no worker and no grant are deleted every \
     `SEALER_SWEEP_INTERVAL_MS`. The sealer's Redis user then needs `+acl\\|setuser \
     +acl\\|deluser +acl\\|users`. Leave `false` on ElastiCache, which manages users through \
     its API",
);
/// The `SEALER_SWEEP_INTERVAL_MS` variable.
pub const SEALER_SWEEP_INTERVAL_MS: Setting<Duration> = Setting::new(
    "SEALER_SWEEP_INTERVAL_MS",
    parse::POSITIVE_MILLIS,
    Fallback::Value(|| crate::sealer::CLAIM_USER_SWEEP),
    "how often the credential sealer deletes per-claim Redis users whose user has no worker \
     and no grant, and makes again (from the password hash in `pool:holder:{user_id}`) those \
     a failover or an `ACL LOAD` dropped while their holder still holds the user; well inside \
     a mark's TTL, so the worker's reconnect finds its login back",
);
/// The `SEALER_CALLER_AUTH` variable.
pub const SEALER_CALLER_AUTH: Setting<CallerAuth> = Setting::new(
    "SEALER_CALLER_AUTH",
    Parser {
        parse: CallerAuth::parse,
        show: |auth| match auth {
            CallerAuth::None => "none".into(),
            CallerAuth::AwsIam => "aws-iam".into(),
        },
    },
    Fallback::Value(|| CallerAuth::None),
    "read by the sealer and by broker workers alike. `aws-iam`: a worker signs an \
     `sts:GetCallerIdentity` request with its task role and sends it, unsent, with every seal \
     request; the sealer has STS say who signed and answers only a session of a \
     `SEALER_CALLER_ROLES` role named after the worker and task the request names. `none` is \
     refused on ECS ([deploy/README.md](../deploy/README.md#credential-isolation))",
);
/// The `SEALER_STS_ENDPOINT` variable.
pub const SEALER_STS_ENDPOINT: Setting<String> = Setting::new(
    "SEALER_STS_ENDPOINT",
    parse::TEXT,
    Fallback::Derived("https://sts.{AWS_REGION}.amazonaws.com/"),
    "the STS endpoint proofs are signed for and verified at; the sealer sends a proof to no \
     other URL. Same value on both sides",
);
/// The `SEALER_AUDIENCE` variable.
pub const SEALER_AUDIENCE: Setting<String> = Setting::new(
    "SEALER_AUDIENCE",
    parse::TEXT,
    Fallback::Value(|| crate::sealer::caller::DEFAULT_AUDIENCE.to_owned()),
    "the name a proof is signed for (signed header `x-leasehold-sealer-audience`), so a proof \
     for this sealer is refused by any other service and the other way round. Same value on \
     both sides",
);
/// The `SEALER_CALLER_ROLES` variable.
pub const SEALER_CALLER_ROLES: Setting<Vec<String>> = Setting::new(
    "SEALER_CALLER_ROLES",
    parse::LIST,
    Fallback::Unset,
    "the role ARNs (comma-separated, account included) whose sessions the sealer answers: the \
     broker workers' task role. Required with `aws-iam`",
);
/// The `WORKER_ID` variable.
pub const WORKER_ID: Setting<String> = Setting::new(
    "WORKER_ID",
    parse::TEXT,
    Fallback::Derived("task id"),
    "broker worker identity in `worker:active:-1:{worker_id}` (the ECS task id, else \
     `local-{pid}`)",
);
/// The `POOL_TARGET_SIZE` variable.
pub const POOL_TARGET_SIZE: Setting<usize> = Setting::new(
    "POOL_TARGET_SIZE",
    parse::COUNT_SIZE,
    Fallback::Value(|| 2),
    "idle pool workers `pool-manager` keeps running",
);
/// The `TASK_LAUNCHER` variable.
pub const TASK_LAUNCHER: Setting<String> = Setting::new(
    "TASK_LAUNCHER",
    parse::TEXT,
    Fallback::Value(|| "local".to_owned()),
    "`local` (child processes of this binary) or `ecs` (RunTask / StopTask)",
);
/// The `POOL_GROUP` variable.
pub const POOL_GROUP: Setting<String> = Setting::new(
    "POOL_GROUP",
    parse::TEXT,
    Fallback::Value(|| "leasehold-broker-pool".to_owned()),
    "marks the workers a launcher owns (ECS `startedBy`; local: an environment variable of \
     the process)",
);
/// The `ECS_CLUSTER` variable.
pub const ECS_CLUSTER: Setting<String> = Setting::new(
    "ECS_CLUSTER",
    parse::TEXT,
    Fallback::Value(|| "default".to_owned()),
    "ECS cluster the `ecs` launcher runs broker workers in",
);
/// The `ECS_TASK_DEFINITION` variable.
pub const ECS_TASK_DEFINITION: Setting<String> = Setting::new(
    "ECS_TASK_DEFINITION",
    parse::TEXT,
    Fallback::Unset,
    "task definition (family, family:revision or ARN) of the broker worker; required by the \
     `ecs` launcher",
);
/// The `ECS_CONTAINER_NAME` variable.
pub const ECS_CONTAINER_NAME: Setting<String> = Setting::new(
    "ECS_CONTAINER_NAME",
    parse::TEXT,
    Fallback::Value(|| "broker-worker".to_owned()),
    "container in the task definition that runs `leasehold broker-worker` (receives `USER_ID` \
     on a cold start)",
);
/// The `ECS_SUBNETS` variable.
pub const ECS_SUBNETS: Setting<Vec<String>> = Setting::new(
    "ECS_SUBNETS",
    parse::LIST,
    Fallback::Unset,
    "comma-separated subnet ids for `awsvpc` tasks (empty: no network configuration is sent)",
);
/// The `ECS_SECURITY_GROUPS` variable.
pub const ECS_SECURITY_GROUPS: Setting<Vec<String>> = Setting::new(
    "ECS_SECURITY_GROUPS",
    parse::LIST,
    Fallback::Unset,
    "comma-separated security group ids for `awsvpc` tasks",
);
/// The `ECS_LAUNCH_TYPE` variable.
pub const ECS_LAUNCH_TYPE: Setting<String> = Setting::new(
    "ECS_LAUNCH_TYPE",
    LAUNCH_TYPE,
    Fallback::Value(|| "FARGATE".to_owned()),
    "`FARGATE`, `EC2` or `EXTERNAL`",
);
/// The `WORKER_HEARTBEAT_MS` variable.
pub const WORKER_HEARTBEAT_MS: Setting<Duration> = Setting::new(
    "WORKER_HEARTBEAT_MS",
    parse::POSITIVE_MILLIS,
    Fallback::Value(|| Duration::from_millis(5_000)),
    "how often a broker worker refreshes its `worker:active:…` mark; also read by \
     `maintenance`: the heartbeat assumed for marks that do not carry their own \
     (`heartbeat_interval_ms`), and so how long its second look waits (1.5 ×)",
);
/// The `WORKER_MARK_TTL_SECONDS` variable.
pub const WORKER_MARK_TTL_SECONDS: Setting<Duration> = Setting::new(
    "WORKER_MARK_TTL_SECONDS",
    parse::POSITIVE_SECONDS,
    Fallback::Value(|| crate::worker::DEFAULT_MARK_TTL),
    "TTL of `worker:active:…` and `worker:metadata:…`; a dead worker's mark disappears after \
     this. Marks carry the TTL their writer gave them (`ttl_ms`); in `maintenance` this value \
     is only the fallback for marks that do not",
);
/// The `WORKER_BLOCK_SECONDS` variable.
pub const WORKER_BLOCK_SECONDS: Setting<Duration> = Setting::new(
    "WORKER_BLOCK_SECONDS",
    parse::POSITIVE_SECONDS,
    Fallback::Value(|| Duration::from_secs(30)),
    "blocking-wait timeout on `pool:claims` (`BRPOP`) and on a user's lists (`BLMOVE` control \
     into its control processing list, `BLMOVE` requests into the processing list)",
);
/// The `WORKER_IDLE_TIMEOUT_SECONDS` variable.
pub const WORKER_IDLE_TIMEOUT_SECONDS: Setting<Duration> = Setting::new(
    "WORKER_IDLE_TIMEOUT_SECONDS",
    parse::POSITIVE_SECONDS,
    Fallback::Value(|| Duration::from_secs(1_800)),
    "a claimed worker without requests or control messages for this long closes its \
     connections and exits 0",
);
/// The `BROKER_HEALTH_CHECK_SECONDS` variable.
pub const BROKER_HEALTH_CHECK_SECONDS: Setting<Duration> = Setting::new(
    "BROKER_HEALTH_CHECK_SECONDS",
    parse::POSITIVE_SECONDS,
    Fallback::Value(|| Duration::from_secs(60)),
    "while idle, every open broker connection is pinged this often",
);
/// The `BROKER_CONNECT_ATTEMPTS` variable.
pub const BROKER_CONNECT_ATTEMPTS: Setting<u32> = Setting::new(
    "BROKER_CONNECT_ATTEMPTS",
    parse::ATTEMPTS,
    Fallback::Value(|| 3),
    "connect attempts (with backoff) per request before the account counts as down: that \
     request is answered `broker`, and so is every request for the account until a jittered \
     backoff has passed (up to 1 s after the first failed round, doubling to 60 s); then its \
     next request tries again. The worker stays up and serves the user's other accounts",
);
/// The `BROKER_CONNECT_TIMEOUT_MS` variable.
pub const BROKER_CONNECT_TIMEOUT_MS: Setting<Duration> = Setting::new(
    "BROKER_CONNECT_TIMEOUT_MS",
    parse::POSITIVE_MILLIS,
    Fallback::Value(|| CallTimeouts::default().connect),
    "longest one connect attempt (TLS and login) may take; a timed-out attempt counts as \
     failed. 15 s: a slow login handshake fits, a dead endpoint costs at most 45 s per \
     backoff round",
);
/// The `BROKER_ORDER_TIMEOUT_MS` variable.
pub const BROKER_ORDER_TIMEOUT_MS: Setting<Duration> = Setting::new(
    "BROKER_ORDER_TIMEOUT_MS",
    parse::POSITIVE_MILLIS,
    Fallback::Value(|| CallTimeouts::default().order),
    "longest `place_order` may take. Then the order is looked up by client order id: found → \
     answered from the broker's record; absent (the broker may still book it) or the lookup \
     failing → `in_doubt`. The call is also cut to the time the worker surely still holds the \
     user. 10 s: far above a normal sub-second round trip and a busy market open, well inside \
     the 30 s a stopping task gets",
);
/// The `BROKER_LOOKUP_TIMEOUT_MS` variable.
pub const BROKER_LOOKUP_TIMEOUT_MS: Setting<Duration> = Setting::new(
    "BROKER_LOOKUP_TIMEOUT_MS",
    parse::POSITIVE_MILLIS,
    Fallback::Value(|| CallTimeouts::default().lookup),
    "longest a lookup by client order id may take; a timed-out lookup leaves the order \
     `in_doubt` (a lookup is a plain read, hence shorter)",
);
/// The `BROKER_PING_TIMEOUT_MS` variable.
pub const BROKER_PING_TIMEOUT_MS: Setting<Duration> = Setting::new(
    "BROKER_PING_TIMEOUT_MS",
    parse::POSITIVE_MILLIS,
    Fallback::Value(|| CallTimeouts::default().ping),
    "longest a health-check ping may take (a timed-out ping closes the connection, reopened \
     on next use); also bounds closing a connection",
);
/// The `USER_QUEUE_MAX` variable.
pub const USER_QUEUE_MAX: Setting<u64> = Setting::new(
    "USER_QUEUE_MAX",
    parse::POSITIVE,
    Fallback::Value(|| DEFAULT_QUEUE_MAX),
    "most requests a user's queue (`trading:user:{user_id}:requests`) may hold. The API only \
     pushes, so the worker enforces it: each time it takes a request it answers the newest \
     requests beyond the cap `overloaded` (not executed), each in the step that removes it \
     from the queue; nothing is dropped unanswered",
);
/// The `REQUEST_MAX_BYTES` variable.
pub const REQUEST_MAX_BYTES: Setting<usize> = Setting::new(
    "REQUEST_MAX_BYTES",
    parse::SIZE,
    Fallback::Value(|| RequestBounds::DEFAULT.max_bytes),
    "longest request, control message or claim a broker worker takes, in bytes: a longer one \
     is never read whole or parsed; a request whose `request_id` can be read from its first \
     bytes is answered `too_large` (not executed), and every such message is dead-lettered as \
     its first 4 KiB with its `length`",
);
/// The `REQUEST_MAX_DELIVERIES` variable.
pub const REQUEST_MAX_DELIVERIES: Setting<u32> = Setting::new(
    "REQUEST_MAX_DELIVERIES",
    parse::ATTEMPTS,
    Fallback::Value(|| RequestBounds::DEFAULT.max_deliveries),
    "most workers that may take one request without a final answer (each stopped by it): the \
     next asks the broker by client order id and answers from its record, or `poison` (not \
     executed); the request leaves the queue",
);
/// The `PAPER_LATENCY_MS` variable.
pub const PAPER_LATENCY_MS: Setting<Duration> = Setting::new(
    "PAPER_LATENCY_MS",
    parse::MILLIS,
    Fallback::Value(|| Duration::ZERO),
    "simulated latency of every paper broker call",
);
/// The `PAPER_FAILURE_RATE` variable.
pub const PAPER_FAILURE_RATE: Setting<f64> = Setting::new(
    "PAPER_FAILURE_RATE",
    parse::FRACTION,
    Fallback::Value(|| 0.0),
    "fraction (0–1) of paper broker orders that fail with a lost connection before they reach \
     the ledger (not executed), to exercise error paths",
);
/// The `PAPER_HANG_RATE` variable.
pub const PAPER_HANG_RATE: Setting<f64> = Setting::new(
    "PAPER_HANG_RATE",
    parse::FRACTION,
    Fallback::Value(|| 0.0),
    "fraction (0–1) of paper broker orders that are executed and then never answered (the \
     call hangs), to exercise timeouts and in-doubt orders",
);
/// The `PAPER_LATE_BOOKING_MS` variable.
pub const PAPER_LATE_BOOKING_MS: Setting<Duration> = Setting::new(
    "PAPER_LATE_BOOKING_MS",
    parse::MILLIS,
    Fallback::Value(|| Duration::ZERO),
    "paper broker: book every order this many ms after the call, which never returns (a \
     broker whose gateway holds orders): with `BROKER_ORDER_TIMEOUT_MS` below it, every order \
     times out, the lookup finds nothing yet, and the answer must be `in_doubt`. `0`: off",
);
/// The `LOCAL_WORKER_LOG_DIR` variable.
pub const LOCAL_WORKER_LOG_DIR: Setting<PathBuf> = Setting::new(
    "LOCAL_WORKER_LOG_DIR",
    PATH,
    Fallback::Unset,
    "`local` launcher: each worker's output goes to `{dir}/{task_id}.log` (empty: inherits \
     this process's stderr)",
);
/// The `SWEEP_GRACE_SECONDS` variable.
pub const SWEEP_GRACE_SECONDS: Setting<Duration> = Setting::new(
    "SWEEP_GRACE_SECONDS",
    parse::SECONDS,
    Fallback::Value(|| Duration::from_secs(60)),
    "`maintenance` leaves tasks younger than this alone (they may not have written their \
     first mark)",
);
/// The `SWEEP_MAX_FRACTION` variable.
pub const SWEEP_MAX_FRACTION: Setting<f64> = Setting::new(
    "SWEEP_MAX_FRACTION",
    parse::FRACTION,
    Fallback::Value(|| crate::maintenance::DEFAULT_MAX_FRACTION),
    "`maintenance`'s safety valve: when more than this share (0-1) of the marks or of the \
     tasks looks orphaned (e.g. a wrong `POOL_GROUP`), it reports (log, \
     `leasehold_sweep_held`, the report's `held`) and acts on nothing; a single finding is \
     always acted on. `leasehold dev` runs its sweep without the valve (its launcher is the \
     process itself, and chaos crashes a large share of a small pool on purpose). It also \
     holds supervision's releases of dead holders' marks",
);
/// The `SWEEP_CONCURRENCY` variable.
pub const SWEEP_CONCURRENCY: Setting<usize> = Setting::new(
    "SWEEP_CONCURRENCY",
    parse::SIZE,
    Fallback::Value(|| 8),
    "batches of 100 findings `maintenance` resolves at once",
);
/// The `SUPERVISE_INTERVAL_SECONDS` variable.
pub const SUPERVISE_INTERVAL_SECONDS: Setting<Duration> = Setting::new(
    "SUPERVISE_INTERVAL_SECONDS",
    parse::POSITIVE_SECONDS,
    Fallback::Value(|| Duration::from_secs(10)),
    "`maintenance --every …`: between full sweeps, a supervision pass runs this often (users \
     whose worker died with work pending get a new one; a dead pool worker's taken claims are \
     re-queued). A one-shot `maintenance` supervises once, after its sweep. A pass that finds \
     an unrefreshed mark waits 1.5 heartbeats for its second look",
);
/// The `RESERVE_LOCK_SECONDS` variable.
pub const RESERVE_LOCK_SECONDS: Setting<Duration> = Setting::new(
    "RESERVE_LOCK_SECONDS",
    parse::POSITIVE_SECONDS,
    Fallback::Value(|| Duration::from_secs(60)),
    "supervision starts at most one re-serve per user within this period \
     (`pool:reserve:{user_id}`); a failed one is retried after it",
);

/// Every variable of this part, in documentation order.
pub const ALL: &[&dyn Documented] = &[
    &USER_ID,
    &CREDENTIALS_KMS_KEY_ID,
    &CREDENTIALS_KEY,
    &CREDENTIALS_KEY_FILE,
    &CREDENTIALS_ALLOW_LOCAL_KEY,
    &CREDENTIALS_SEALER_URL,
    &CREDENTIALS_SEALER_CA,
    &SEALER_TLS_CERT,
    &SEALER_TLS_KEY,
    &SEALER_LISTEN,
    &SEALER_METRICS_LISTEN,
    &SEALER_CLAIM_REDIS_USERS,
    &SEALER_SWEEP_INTERVAL_MS,
    &SEALER_CALLER_AUTH,
    &SEALER_STS_ENDPOINT,
    &SEALER_AUDIENCE,
    &SEALER_CALLER_ROLES,
    &WORKER_ID,
    &POOL_TARGET_SIZE,
    &TASK_LAUNCHER,
    &POOL_GROUP,
    &ECS_CLUSTER,
    &ECS_TASK_DEFINITION,
    &ECS_CONTAINER_NAME,
    &ECS_SUBNETS,
    &ECS_SECURITY_GROUPS,
    &ECS_LAUNCH_TYPE,
    &WORKER_HEARTBEAT_MS,
    &WORKER_MARK_TTL_SECONDS,
    &WORKER_BLOCK_SECONDS,
    &WORKER_IDLE_TIMEOUT_SECONDS,
    &BROKER_HEALTH_CHECK_SECONDS,
    &BROKER_CONNECT_ATTEMPTS,
    &BROKER_CONNECT_TIMEOUT_MS,
    &BROKER_ORDER_TIMEOUT_MS,
    &BROKER_LOOKUP_TIMEOUT_MS,
    &BROKER_PING_TIMEOUT_MS,
    &USER_QUEUE_MAX,
    &REQUEST_MAX_BYTES,
    &REQUEST_MAX_DELIVERIES,
    &PAPER_LATENCY_MS,
    &PAPER_FAILURE_RATE,
    &PAPER_HANG_RATE,
    &PAPER_LATE_BOOKING_MS,
    &LOCAL_WORKER_LOG_DIR,
    &SWEEP_GRACE_SECONDS,
    &SWEEP_CONCURRENCY,
    &SWEEP_MAX_FRACTION,
    &SUPERVISE_INTERVAL_SECONDS,
    &RESERVE_LOCK_SECONDS,
];

/// Production, for the local-key rule: running on ECS (the agent sets
/// `ECS_CONTAINER_METADATA_URI_V4` in every task).
pub fn production(env: &Env) -> bool {
    env.raw(leasehold_platform::ecs::ECS_CONTAINER_METADATA_URI_V4.name)
        .is_some()
}

/// The local key from `CREDENTIALS_KEY` or `CREDENTIALS_KEY_FILE`, if one is
/// set; problems name the variable (and the file's path), never the key.
fn local_key(env: &mut Env) -> Option<AesGcmCipher> {
    let from_env = env.optional(&CREDENTIALS_KEY).map(zeroize::Zeroizing::new);
    let path = env.optional(&CREDENTIALS_KEY_FILE);
    let (name, key) = match (from_env, path) {
        (None, None) => return None,
        (Some(_), Some(_)) => {
            env.problem(
                CREDENTIALS_KEY_FILE.name,
                "set either CREDENTIALS_KEY or CREDENTIALS_KEY_FILE, not both",
            );
            return None;
        }
        (Some(key), None) => (CREDENTIALS_KEY.name, key),
        (None, Some(path)) => match std::fs::read_to_string(&path) {
            Ok(text) => (CREDENTIALS_KEY_FILE.name, zeroize::Zeroizing::new(text)),
            Err(err) => {
                env.problem(
                    CREDENTIALS_KEY_FILE.name,
                    format!("cannot read {}: {}", path.display(), err.kind()),
                );
                return None;
            }
        },
    };
    if production(env) && !env.get(&CREDENTIALS_ALLOW_LOCAL_KEY) {
        env.problem(
            name,
            "a local credentials key is refused in production (on ECS): use CREDENTIALS_KMS_KEY_ID, or set CREDENTIALS_ALLOW_LOCAL_KEY=true",
        );
        return None;
    }
    match AesGcmCipher::from_base64_key(&key) {
        Ok(cipher) => Some(cipher),
        Err(_) => {
            env.problem(name, "must be standard base64 of 32 bytes");
            None
        }
    }
}

/// The keys for credentials blobs: version 2 through KMS (the client is built
/// from the AWS SDK's chain on first use; `CREDENTIALS_KMS_KEY_ID` is the key
/// new blobs are wrapped under), version 1 with the local key when one is set
/// and allowed. Either `CREDENTIALS_KMS_KEY_ID` or a local key is required.
pub fn keyring(env: &mut Env) -> Keyring {
    let key_id = env.optional(&CREDENTIALS_KMS_KEY_ID);
    let had_problems = env.has_problems();
    let local = local_key(env);
    let local_key_problem = !had_problems && env.has_problems();
    if key_id.is_none() && local.is_none() && !local_key_problem {
        env.problem(
            CREDENTIALS_KMS_KEY_ID.name,
            "is required (or, outside production, CREDENTIALS_KEY / CREDENTIALS_KEY_FILE)",
        );
    }
    Keyring {
        local,
        kms: Some(KmsEnvelope::from_environment(key_id)),
    }
}

/// `SEALER_CALLER_AUTH` (`none` is refused on ECS): whether callers prove
/// who they are.
fn caller_auth(env: &mut Env) -> bool {
    let auth = env.get(&SEALER_CALLER_AUTH);
    if auth == CallerAuth::None && production(env) {
        env.problem(
            SEALER_CALLER_AUTH.name,
            "must be aws-iam on ECS: the sealer answers only broker workers that prove their task role",
        );
    }
    auth == CallerAuth::AwsIam
}

/// `SEALER_STS_ENDPOINT`, checked: `None` means the region's endpoint.
fn sts_endpoint(env: &mut Env) -> Option<String> {
    let endpoint = env.optional(&SEALER_STS_ENDPOINT)?;
    if !endpoint.starts_with("https://") && !endpoint.starts_with("http://") {
        env.problem(SEALER_STS_ENDPOINT.name, "must be an https:// URL");
    } else if endpoint.starts_with("http://") && production(env) {
        env.problem(SEALER_STS_ENDPOINT.name, "must be https:// on ECS");
    }
    Some(endpoint)
}

/// What a broker worker's caller proofs are signed for.
#[derive(Debug, Clone)]
pub struct ProofSettings {
    /// `SEALER_STS_ENDPOINT` (`None`: the region's).
    pub sts_endpoint: Option<String>,
    /// `SEALER_AUDIENCE`.
    pub audience: String,
}

/// Everything `leasehold broker-worker` needs.
#[derive(Debug)]
pub struct BrokerWorkerSettings {
    /// Redis (may hold a password: never print).
    pub redis_url: leasehold_platform::settings::Redacted<String>,
    /// Worker timings and identity.
    pub worker: BrokerWorkerConfig,
    /// The credentials keys (empty when a sealer is set).
    pub cipher: Keyring,
    /// `CREDENTIALS_SEALER_URL`: where sealed credentials come from.
    pub sealer_url: Option<String>,
    /// `CREDENTIALS_SEALER_CA`: the CA trusted for an `https://` sealer URL.
    pub sealer_ca: Option<String>,
    /// `SEALER_CALLER_AUTH=aws-iam`: sign caller proofs for the sealer.
    pub caller_proof: Option<ProofSettings>,
    /// Paper broker behaviour.
    pub paper: PaperConfig,
}

impl BrokerWorkerSettings {
    /// Takes this worker's identity from its ECS task: the sidecar URL its
    /// marks publish (how the dashboard finds the task's sidecar; derived
    /// from the task's address unless set, never fatal), and the task ARN as
    /// its task id and, unless `WORKER_ID` is set, its worker id.
    pub fn adopt_task(
        &mut self,
        lookup: Lookup,
        task: Option<leasehold_platform::ecs::TaskMetadata>,
    ) -> Result<(), ConfigError> {
        let explicit = self.worker.metadata.sidecar_url.take();
        let mut env = Env::new(lookup);
        let derived =
            leasehold_telemetry::settings::sidecar_url_from(&mut env, explicit, task.as_ref());
        self.worker.metadata.sidecar_url = env.finish(derived)?;
        if let Some(arn) = task.and_then(|metadata| metadata.task_arn) {
            let worker_id_set = lookup(WORKER_ID.name).is_some();
            self.worker.adopt_task_arn(arn, worker_id_set);
        }
        Ok(())
    }
}

/// Reads the broker worker's settings.
pub fn worker_settings(lookup: Lookup) -> Result<BrokerWorkerSettings, ConfigError> {
    let mut env = Env::new(lookup);
    let redis_url = env.get(&REDIS_URL);
    let sealer_url = env.optional(&CREDENTIALS_SEALER_URL);
    let cipher = match &sealer_url {
        // Nothing to decrypt with, by design: not even a KMS client.
        Some(url) => {
            if !url.starts_with("http://") && !url.starts_with("https://") {
                env.problem(
                    CREDENTIALS_SEALER_URL.name,
                    "must be an http:// or https:// URL",
                );
            }
            if url.starts_with("http://") && production(&env) {
                env.problem(
                    CREDENTIALS_SEALER_URL.name,
                    "must be https:// on ECS (the sealer serves HTTPS only there)",
                );
            }
            Keyring::default()
        }
        None => {
            let keyring = keyring(&mut env);
            if production(&env) && keyring.local.is_none() {
                env.problem(
                    CREDENTIALS_SEALER_URL.name,
                    "is required on ECS: a broker worker gets its user's credentials from the credential sealer and has no KMS access of its own",
                );
            }
            keyring
        }
    };
    let user_id = env.optional(&USER_ID).filter(|u| u != keys::POOL_USER_ID);
    if let Some(user) = &user_id
        && let Err(err) = keys::check_user_id(user)
    {
        env.problem(USER_ID.name, err);
    }
    let heartbeat = env.get(&WORKER_HEARTBEAT_MS);
    let mark_ttl = env.get(&WORKER_MARK_TTL_SECONDS);
    if heartbeat >= mark_ttl {
        env.problem(
            WORKER_HEARTBEAT_MS.name,
            "must be shorter than WORKER_MARK_TTL_SECONDS",
        );
    }
    let task_id = format!("local-{}", std::process::id());
    let worker = BrokerWorkerConfig {
        worker_id: env.optional(&WORKER_ID).unwrap_or_else(|| task_id.clone()),
        task_id: task_id.clone(),
        user_id,
        heartbeat,
        mark_ttl,
        block: env.get(&WORKER_BLOCK_SECONDS),
        idle_timeout: env.get(&WORKER_IDLE_TIMEOUT_SECONDS),
        health_check: env.get(&BROKER_HEALTH_CHECK_SECONDS),
        connect: ConnectPolicy {
            attempts: env.get(&BROKER_CONNECT_ATTEMPTS),
            backoff: Backoff {
                base: Duration::from_millis(200),
                cap: Duration::from_secs(2),
            },
            reconnect: RECONNECT,
            timeouts: CallTimeouts {
                connect: env.get(&BROKER_CONNECT_TIMEOUT_MS),
                order: env.get(&BROKER_ORDER_TIMEOUT_MS),
                lookup: env.get(&BROKER_LOOKUP_TIMEOUT_MS),
                ping: env.get(&BROKER_PING_TIMEOUT_MS),
            },
        },
        queue_max: env.get(&USER_QUEUE_MAX),
        bounds: RequestBounds {
            max_bytes: env.get(&REQUEST_MAX_BYTES),
            max_deliveries: env.get(&REQUEST_MAX_DELIVERIES),
        },
        metadata: WorkerMetadata {
            task_arn: task_id,
            instance_id: leasehold_control::settings::default_owner_id(),
            launched_at: SystemClock.now_ms_u64(),
            sidecar_url: env.optional(&leasehold_telemetry::settings::SIDECAR_URL),
        },
    };
    let sealer_ca = env.optional(&CREDENTIALS_SEALER_CA);
    if sealer_url
        .as_deref()
        .is_some_and(|url| url.starts_with("https://"))
    {
        match &sealer_ca {
            None => env.problem(
                CREDENTIALS_SEALER_CA.name,
                "is required with an https:// CREDENTIALS_SEALER_URL (the CA of the sealer's certificate)",
            ),
            Some(pem) => {
                if let Err(err) = crate::sealer::tls::client_config(Some(pem.as_bytes())) {
                    env.problem(CREDENTIALS_SEALER_CA.name, err);
                }
            }
        }
    }
    let caller_proof = match sealer_url.is_some() && caller_auth(&mut env) {
        true => Some(ProofSettings {
            sts_endpoint: sts_endpoint(&mut env),
            audience: env.get(&SEALER_AUDIENCE),
        }),
        false => None,
    };
    let paper = PaperConfig {
        latency: env.get(&PAPER_LATENCY_MS),
        failure_rate: env.get(&PAPER_FAILURE_RATE),
        hang_rate: env.get(&PAPER_HANG_RATE),
        late_booking: env.get(&PAPER_LATE_BOOKING_MS),
    };
    env.finish(BrokerWorkerSettings {
        redis_url: redis_url.into(),
        worker,
        cipher,
        sealer_url,
        sealer_ca,
        caller_proof,
        paper,
    })
}

/// Everything `leasehold credential-sealer` needs.
#[derive(Debug)]
pub struct SealerSettings {
    /// Redis as the sealer's user (reads grants, marks, claim lists and
    /// `credentials:*`; never print).
    pub redis_url: leasehold_platform::settings::Redacted<String>,
    /// What decrypts blobs: KMS (production) or the local key (`dev`).
    pub cipher: Keyring,
    /// `SEALER_LISTEN`.
    pub listen: std::net::SocketAddr,
    /// `SEALER_METRICS_LISTEN`: plain-HTTP `/healthz` and `/metrics`.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// `SEALER_CLAIM_REDIS_USERS`.
    pub claim_redis_users: bool,
    /// `SEALER_SWEEP_INTERVAL_MS`.
    pub sweep_interval: Duration,
    /// `SEALER_TLS_CERT` + `SEALER_TLS_KEY`: serve HTTPS only (`None`: plain
    /// HTTP, refused on ECS).
    pub tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// `SEALER_CALLER_AUTH=aws-iam`: whose proofs the sealer admits.
    pub callers: Option<CallerPolicy>,
}

/// Reads the credential sealer's settings.
pub fn sealer_settings(lookup: Lookup) -> Result<SealerSettings, ConfigError> {
    let mut env = Env::new(lookup);
    let redis_url = env.get(&REDIS_URL);
    let cipher = keyring(&mut env);
    let listen = env.get(&SEALER_LISTEN);
    let metrics_listen = env.optional(&SEALER_METRICS_LISTEN);
    let claim_redis_users = env.get(&SEALER_CLAIM_REDIS_USERS);
    let sweep_interval = env.get(&SEALER_SWEEP_INTERVAL_MS);
    let cert = env.optional(&SEALER_TLS_CERT);
    let key = env.optional(&SEALER_TLS_KEY).map(zeroize::Zeroizing::new);
    let tls = match (cert, key) {
        (Some(cert), Some(key)) => {
            match crate::sealer::tls::server_config(cert.as_bytes(), key.as_bytes()) {
                Ok(config) => Some(std::sync::Arc::new(config)),
                Err(err) => {
                    env.problem(SEALER_TLS_CERT.name, format!("with SEALER_TLS_KEY {err}"));
                    None
                }
            }
        }
        (Some(_), None) => {
            env.problem(SEALER_TLS_KEY.name, "is required with SEALER_TLS_CERT");
            None
        }
        (None, Some(_)) => {
            env.problem(SEALER_TLS_CERT.name, "is required with SEALER_TLS_KEY");
            None
        }
        (None, None) => {
            if production(&env) {
                env.problem(
                    SEALER_TLS_CERT.name,
                    "and SEALER_TLS_KEY are required on ECS: the sealer serves HTTPS only there",
                );
            }
            None
        }
    };
    let callers = caller_auth(&mut env).then(|| caller_policy(&mut env));
    env.finish(SealerSettings {
        redis_url: redis_url.into(),
        cipher,
        listen,
        metrics_listen,
        claim_redis_users,
        sweep_interval,
        tls,
        callers,
    })
}

/// The sealer's [`CallerPolicy`] from `SEALER_STS_ENDPOINT` (or
/// `AWS_REGION`), `SEALER_AUDIENCE` and `SEALER_CALLER_ROLES`.
fn caller_policy(env: &mut Env) -> CallerPolicy {
    let region = env.raw(leasehold_platform::logging::AWS_REGION.name);
    let sts_endpoint = match (sts_endpoint(env), region) {
        (Some(endpoint), _) => endpoint,
        (None, Some(region)) => crate::sealer::caller::regional_sts_endpoint(&region),
        (None, None) => {
            env.problem(
                SEALER_STS_ENDPOINT.name,
                "is required with SEALER_CALLER_AUTH=aws-iam when AWS_REGION is not set",
            );
            String::new()
        }
    };
    let mut roles = Vec::new();
    for arn in env
        .required(&SEALER_CALLER_ROLES, "with SEALER_CALLER_AUTH=aws-iam")
        .unwrap_or_default()
    {
        match AllowedRole::parse(&arn) {
            Ok(role) => roles.push(role),
            Err(problem) => env.problem(SEALER_CALLER_ROLES.name, problem),
        }
    }
    CallerPolicy {
        sts_endpoint,
        audience: env.get(&SEALER_AUDIENCE),
        roles,
    }
}

/// Which launcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LauncherSettings {
    /// Local processes, tagged with the group.
    Local {
        /// Group tag.
        group: String,
        /// `LOCAL_WORKER_LOG_DIR`.
        log_dir: Option<PathBuf>,
    },
    /// ECS tasks.
    Ecs(EcsSettings),
}

impl LauncherSettings {
    /// The launcher these settings name. Local workers run this executable;
    /// the error is only that it cannot be found.
    pub async fn launcher(self) -> std::io::Result<Box<dyn TaskLauncher>> {
        Ok(match self {
            LauncherSettings::Local { group, log_dir } => Box::new(LocalLauncher {
                program: std::env::current_exe()?,
                group,
                log_dir,
            }),
            LauncherSettings::Ecs(ecs) => {
                // RunTask and StopTask have no lease deadline: the SDK's standard
                // retries ride out throttling instead of failing a user's cold start.
                let sdk = sdk_config(RetryPolicy::Standard).await;
                Box::new(EcsLauncher::new(aws_sdk_ecs::Client::new(&sdk), ecs))
            }
        })
    }
}

/// Reads `TASK_LAUNCHER` and what the chosen launcher needs.
pub fn launcher_settings(env: &mut Env) -> LauncherSettings {
    let group = env.get(&POOL_GROUP);
    if group.is_empty() || group.len() > 36 {
        env.problem(POOL_GROUP.name, "must be 1-36 characters (ECS startedBy)");
    }
    match env.get(&TASK_LAUNCHER).as_str() {
        "local" => LauncherSettings::Local {
            group,
            log_dir: env.optional(&LOCAL_WORKER_LOG_DIR),
        },
        "ecs" => {
            let task_definition = env
                .required(&ECS_TASK_DEFINITION, "with TASK_LAUNCHER=ecs")
                .unwrap_or_default();
            LauncherSettings::Ecs(EcsSettings {
                cluster: env.get(&ECS_CLUSTER),
                task_definition,
                container: env.get(&ECS_CONTAINER_NAME),
                subnets: env.optional(&ECS_SUBNETS).unwrap_or_default(),
                security_groups: env.optional(&ECS_SECURITY_GROUPS).unwrap_or_default(),
                launch_type: env.get(&ECS_LAUNCH_TYPE),
                group,
            })
        }
        _ => {
            env.problem(TASK_LAUNCHER.name, "must be `local` or `ecs`");
            LauncherSettings::Local {
                group,
                log_dir: None,
            }
        }
    }
}

/// `POOL_TARGET_SIZE`.
pub fn pool_target(env: &mut Env) -> usize {
    env.get(&POOL_TARGET_SIZE)
}

/// How often `maintenance --every …` supervises between full sweeps.
pub fn supervise_interval(env: &mut Env) -> Duration {
    env.get(&SUPERVISE_INTERVAL_SECONDS)
}

/// The sweep's settings.
pub fn sweep_config(env: &mut Env, dry_run: bool) -> SweepConfig {
    SweepConfig {
        mark_ttl: env.get(&WORKER_MARK_TTL_SECONDS),
        grace: env.get(&SWEEP_GRACE_SECONDS),
        concurrency: env.get(&SWEEP_CONCURRENCY),
        dry_run,
        supervise: Some(env.get(&RESERVE_LOCK_SECONDS)),
        max_fraction: env.get(&SWEEP_MAX_FRACTION),
    }
}

#[cfg(test)]
mod tests;
