//! Every environment variable leasehold reads, with its default, in one place.
//!
//! Parsing follows linkerd2-proxy's `env.rs`: read everything, collect every
//! problem, then fail once with all of them (the binary exits with status 2).
//! Command-line flags mirror these variables and take precedence; the binary
//! passes them in through the `lookup` function.

use std::time::Duration;

use crate::keeper::KeeperConfig;

/// One documented environment variable.
#[derive(Debug, Clone, Copy)]
pub struct EnvVar {
    /// Variable name, also the flag name in kebab case.
    pub name: &'static str,
    /// Default, as documented (`""` when there is none or it is derived).
    pub default: &'static str,
    /// What it configures.
    pub doc: &'static str,
}

/// DynamoDB table holding the leases.
pub const LEASE_TABLE: EnvVar = EnvVar {
    name: "LEASE_TABLE",
    default: "websocket-leases",
    doc: "DynamoDB table holding the leases (string partition key `stream_id`).",
};
/// Lease duration.
pub const LEASE_SECONDS: EnvVar = EnvVar {
    name: "LEASE_SECONDS",
    default: "30",
    doc: "Lease duration in seconds; a crashed holder's streams are taken over after about this long.",
};
/// Renew period.
pub const LEASE_RENEW_INTERVAL_MS: EnvVar = EnvVar {
    name: "LEASE_RENEW_INTERVAL_MS",
    default: "LEASE_SECONDS/3",
    doc: "How often each held lease is renewed, in ms.",
};
/// Holder-side safety margin.
pub const LEASE_SAFETY_MARGIN_MS: EnvVar = EnvVar {
    name: "LEASE_SAFETY_MARGIN_MS",
    default: "LEASE_SECONDS/10",
    doc: "The holder stops side effects this long before its lease could expire \
          (deadline = renew sent + lease - margin), in ms.",
};
/// Taker-side clock-skew margin.
pub const LEASE_SKEW_MARGIN_MS: EnvVar = EnvVar {
    name: "LEASE_SKEW_MARGIN_MS",
    default: "1000",
    doc: "A taker waits this long past `lease_expires_at` before taking over, \
          to absorb clock skew between hosts, in ms.",
};
/// Identity of this process in the lease table.
pub const OWNER_ID: EnvVar = EnvVar {
    name: "OWNER_ID",
    default: "ECS task id, else hostname",
    doc: "This worker's identity in `owner_id` (default: the ECS task id from the task metadata endpoint, else the host name).",
};
/// Region for the AWS SDK (read by the SDK itself).
pub const AWS_REGION: EnvVar = EnvVar {
    name: "AWS_REGION",
    default: "",
    doc: "AWS region (read by the AWS SDK; profiles and the ECS task environment also work).",
};
/// Endpoint override for every AWS service (read by the AWS SDK itself).
pub const AWS_ENDPOINT_URL: EnvVar = EnvVar {
    name: "AWS_ENDPOINT_URL",
    default: "",
    doc: "Endpoint for all AWS APIs, e.g. a local DynamoDB-compatible server (read by the AWS SDK).",
};
/// Endpoint override for DynamoDB only (read by the AWS SDK itself).
pub const AWS_ENDPOINT_URL_DYNAMODB: EnvVar = EnvVar {
    name: "AWS_ENDPOINT_URL_DYNAMODB",
    default: "",
    doc: "Endpoint for DynamoDB only (read by the AWS SDK).",
};

/// Upstream WebSocket URL template.
pub const UPSTREAM_URL: EnvVar = EnvVar {
    name: "UPSTREAM_URL",
    default: "",
    doc: "Upstream WebSocket URL (required by `stream-worker`); `{stream_id}` is substituted if present.",
};
/// Subscribe message template.
pub const UPSTREAM_SUBSCRIBE: EnvVar = EnvVar {
    name: "UPSTREAM_SUBSCRIBE",
    default: r#"{"subscribe": "{stream_id}", "from_seq": {from_seq}}"#,
    doc: "Text sent after connecting; `{stream_id}` and `{from_seq}` are substituted (empty: send nothing).",
};
/// Where the sequence number is in a frame.
pub const UPSTREAM_SEQ_POINTER: EnvVar = EnvVar {
    name: "UPSTREAM_SEQ_POINTER",
    default: "/seq",
    doc: "JSON pointer to the event's sequence number.",
};
/// Where the event id is in a frame.
pub const UPSTREAM_ID_POINTER: EnvVar = EnvVar {
    name: "UPSTREAM_ID_POINTER",
    default: "/event_id",
    doc: "JSON pointer to the event's id (string or number), the sink's de-duplication key.",
};
/// Frame size limit.
pub const UPSTREAM_MAX_FRAME_BYTES: EnvVar = EnvVar {
    name: "UPSTREAM_MAX_FRAME_BYTES",
    default: "1048576",
    doc: "Frames larger than this are counted and skipped.",
};
/// Where events go.
pub const SINK_URL: EnvVar = EnvVar {
    name: "SINK_URL",
    default: "",
    doc: "`redis://…` (Redis Streams sink) or `memory:` (in-process); required by `stream-worker`.",
};
/// De-duplication window.
pub const SINK_DEDUP_WINDOW: EnvVar = EnvVar {
    name: "SINK_DEDUP_WINDOW",
    default: "10000",
    doc: "Event ids remembered per stream; must cover the replay after a takeover \
          (events/s per stream × (renew interval + lease)).",
};
/// Stored events cap.
pub const SINK_MAX_LEN: EnvVar = EnvVar {
    name: "SINK_MAX_LEN",
    default: "0",
    doc: "Approximate cap on events kept per sink stream (`XADD MAXLEN ~`); 0 keeps everything.",
};
/// Streams to register at start.
pub const STREAM_IDS: EnvVar = EnvVar {
    name: "STREAM_IDS",
    default: "",
    doc: "Comma-separated stream ids the worker registers at start (idempotent); others come from `leases add`.",
};
/// Per-worker cap.
pub const MAX_STREAMS: EnvVar = EnvVar {
    name: "MAX_STREAMS",
    default: "100",
    doc: "Most streams one worker holds, whatever its fair share.",
};
/// Full discovery scan period.
pub const DISCOVERY_INTERVAL_MS: EnvVar = EnvVar {
    name: "DISCOVERY_INTERVAL_MS",
    default: "5000",
    doc: "How often a worker scans the lease table for streams to take or hand back (±20 % jitter).",
};
/// Doorbell poll period.
pub const HANDOFF_POLL_MS: EnvVar = EnvVar {
    name: "HANDOFF_POLL_MS",
    default: "250",
    doc: "How often a worker reads the hand-off doorbell that draining workers ring (one GetItem).",
};
/// Drain budget on SIGTERM.
pub const DRAIN_TIMEOUT_MS: EnvVar = EnvVar {
    name: "DRAIN_TIMEOUT_MS",
    default: "20000",
    doc: "On SIGTERM, time to finish in-flight batches before leases are released anyway \
          (keep it below the task's `stopTimeout`).",
};
/// Batch size cap.
pub const BATCH_MAX_EVENTS: EnvVar = EnvVar {
    name: "BATCH_MAX_EVENTS",
    default: "500",
    doc: "Most events per sink write.",
};
/// Batch latency cap.
pub const BATCH_MAX_DELAY_MS: EnvVar = EnvVar {
    name: "BATCH_MAX_DELAY_MS",
    default: "20",
    doc: "Longest an event waits for its batch to fill before it is written.",
};

/// Sidecar HTTP listener.
pub const SIDECAR_LISTEN: EnvVar = EnvVar {
    name: "SIDECAR_LISTEN",
    default: "0.0.0.0:9464",
    doc: "The sidecar's HTTP address: `/metrics`, `/healthz`, `/status`.",
};
/// Worker → sidecar transport address.
pub const TELEMETRY_ADDR: EnvVar = EnvVar {
    name: "TELEMETRY_ADDR",
    default: "127.0.0.1:9465",
    doc: "Where workers ship telemetry events and the sidecar listens for them (loopback).",
};
/// Telemetry buffer size in the worker.
pub const TELEMETRY_BUFFER: EnvVar = EnvVar {
    name: "TELEMETRY_BUFFER",
    default: "65536",
    doc: "Events a worker keeps while its sidecar is slow or away; the oldest are dropped and counted beyond it.",
};
/// When the sidecar calls a worker down.
pub const WORKER_SILENCE_MS: EnvVar = EnvVar {
    name: "WORKER_SILENCE_MS",
    default: "5000",
    doc: "The sidecar reports `leasehold_worker_up 0` when no event (heartbeats included) arrived for this long.",
};
/// Idle timeout of per-stream series.
pub const STREAM_SERIES_IDLE_SECONDS: EnvVar = EnvVar {
    name: "STREAM_SERIES_IDLE_SECONDS",
    default: "120",
    doc: "Per-stream gauges (`stream_id` label) disappear this long after their last update.",
};

/// Whether the sidecar competes for the observer lease.
pub const SIDECAR_OBSERVER: EnvVar = EnvVar {
    name: "SIDECAR_OBSERVER",
    default: "true",
    doc: "`true`: this sidecar competes for the observer lease and, while it holds it, publishes the cluster gauges.",
};

/// CloudWatch export mode.
pub const CLOUDWATCH_MODE: EnvVar = EnvVar {
    name: "CLOUDWATCH_MODE",
    default: "off",
    doc: "`off`, `emf` (Embedded Metric Format lines on stdout for the awslogs driver) or `api` (PutMetricData).",
};
/// CloudWatch namespace.
pub const CLOUDWATCH_NAMESPACE: EnvVar = EnvVar {
    name: "CLOUDWATCH_NAMESPACE",
    default: "Leasehold",
    doc: "CloudWatch namespace for every metric.",
};
/// CloudWatch export period.
pub const CLOUDWATCH_INTERVAL_SECONDS: EnvVar = EnvVar {
    name: "CLOUDWATCH_INTERVAL_SECONDS",
    default: "60",
    doc: "How often the sidecar publishes to CloudWatch.",
};

/// Log filter for every subcommand.
pub const LEASEHOLD_LOG: EnvVar = EnvVar {
    name: "LEASEHOLD_LOG",
    default: "warn",
    doc: "Log filter (`tracing` EnvFilter syntax, e.g. `info,leasehold_control=debug`).",
};

/// Dashboard listener.
pub const DASHBOARD_LISTEN: EnvVar = EnvVar {
    name: "DASHBOARD_LISTEN",
    default: "127.0.0.1:8080",
    doc: "The dashboard's HTTP address. Loopback by default; any other address needs `DASHBOARD_TOKEN` (or `DASHBOARD_ALLOW_ANONYMOUS=true`).",
};
/// Dashboard bearer token.
pub const DASHBOARD_TOKEN: EnvVar = EnvVar {
    name: "DASHBOARD_TOKEN",
    default: "",
    doc: "When set, every page and API call needs `Authorization: Bearer …` or the token form's cookie (never printed).",
};
/// Serving the dashboard beyond loopback without a token.
pub const DASHBOARD_ALLOW_ANONYMOUS: EnvVar = EnvVar {
    name: "DASHBOARD_ALLOW_ANONYMOUS",
    default: "false",
    doc: "`true` lets the dashboard listen on a non-loopback address without a token (e.g. behind an authenticating proxy).",
};
/// Where the dashboard finds sidecars.
pub const DASHBOARD_SIDECARS: EnvVar = EnvVar {
    name: "DASHBOARD_SIDECARS",
    default: "",
    doc: "Comma-separated sidecar base URLs (`http://HOST:PORT`); every address a host name resolves to is polled (Cloud Map / DNS service discovery).",
};
/// Dashboard refresh period.
pub const DASHBOARD_REFRESH_MS: EnvVar = EnvVar {
    name: "DASHBOARD_REFRESH_MS",
    default: "2000",
    doc: "How often the dashboard re-reads its sources and the page refreshes itself.",
};
/// Verdict: when a stream counts as stopped.
pub const DASHBOARD_STOPPED_AFTER_SECONDS: EnvVar = EnvVar {
    name: "DASHBOARD_STOPPED_AFTER_SECONDS",
    default: "300",
    doc: "A stream whose checkpoint has not moved for this long, while behind or with unknown lag, is judged `stopped`.",
};

// --- broker pool ---
/// Redis holding the pool protocol (design §3.2).
pub const REDIS_URL: EnvVar = EnvVar {
    name: "REDIS_URL",
    default: "redis://127.0.0.1:6379",
    doc: "Redis/Valkey with the broker pool's keys (may hold a password: never printed).",
};
/// The user a broker worker serves.
pub const USER_ID: EnvVar = EnvVar {
    name: "USER_ID",
    default: "-1",
    doc: "User a broker worker serves; `-1` starts it in the warm pool waiting for a claim.",
};
/// AES-256-GCM key for the credentials blobs.
pub const CREDENTIALS_KEY: EnvVar = EnvVar {
    name: "CREDENTIALS_KEY",
    default: "",
    doc: "Standard base64 of 32 random bytes: the AES-256-GCM key of the credentials blobs (never printed).",
};
/// Identity of a broker worker in its pool mark.
pub const WORKER_ID: EnvVar = EnvVar {
    name: "WORKER_ID",
    default: "task id",
    doc: "Broker worker identity in `worker:active:-1:{worker_id}` (default: the ECS task id, else `local-{pid}`).",
};
/// Warm pool size.
pub const POOL_TARGET_SIZE: EnvVar = EnvVar {
    name: "POOL_TARGET_SIZE",
    default: "2",
    doc: "Idle pool workers `pool-manager` keeps running.",
};
/// Which launcher starts and stops workers.
pub const TASK_LAUNCHER: EnvVar = EnvVar {
    name: "TASK_LAUNCHER",
    default: "local",
    doc: "`local` (child processes of this binary) or `ecs` (RunTask/StopTask).",
};
/// Tag on every worker a launcher starts.
pub const POOL_GROUP: EnvVar = EnvVar {
    name: "POOL_GROUP",
    default: "leasehold-broker-pool",
    doc: "Marks the workers a launcher owns (ECS `startedBy`; local: an environment variable of the process).",
};
/// ECS cluster.
pub const ECS_CLUSTER: EnvVar = EnvVar {
    name: "ECS_CLUSTER",
    default: "default",
    doc: "ECS cluster the `ecs` launcher runs broker workers in.",
};
/// ECS task definition.
pub const ECS_TASK_DEFINITION: EnvVar = EnvVar {
    name: "ECS_TASK_DEFINITION",
    default: "",
    doc: "Task definition (family, family:revision or ARN) of the broker worker; required by the `ecs` launcher.",
};
/// Container that gets `USER_ID` on a cold start.
pub const ECS_CONTAINER_NAME: EnvVar = EnvVar {
    name: "ECS_CONTAINER_NAME",
    default: "broker-worker",
    doc: "Container in the task definition that runs `leasehold broker-worker` (receives `USER_ID` on a cold start).",
};
/// Subnets for awsvpc networking.
pub const ECS_SUBNETS: EnvVar = EnvVar {
    name: "ECS_SUBNETS",
    default: "",
    doc: "Comma-separated subnet ids for `awsvpc` tasks (empty: no network configuration is sent).",
};
/// Security groups for awsvpc networking.
pub const ECS_SECURITY_GROUPS: EnvVar = EnvVar {
    name: "ECS_SECURITY_GROUPS",
    default: "",
    doc: "Comma-separated security group ids for `awsvpc` tasks.",
};
/// ECS launch type.
pub const ECS_LAUNCH_TYPE: EnvVar = EnvVar {
    name: "ECS_LAUNCH_TYPE",
    default: "FARGATE",
    doc: "`FARGATE`, `EC2` or `EXTERNAL`.",
};
/// ECS task metadata endpoint (set by the ECS agent).
pub const ECS_CONTAINER_METADATA_URI_V4: EnvVar = EnvVar {
    name: "ECS_CONTAINER_METADATA_URI_V4",
    default: "",
    doc: "Task metadata endpoint v4, set by ECS; gives `task_arn` for `worker:metadata:{user_id}`.",
};
/// Heartbeat period.
pub const WORKER_HEARTBEAT_MS: EnvVar = EnvVar {
    name: "WORKER_HEARTBEAT_MS",
    default: "5000",
    doc: "How often a broker worker refreshes its `worker:active:…` mark.",
};
/// Mark lifetime.
pub const WORKER_MARK_TTL_SECONDS: EnvVar = EnvVar {
    name: "WORKER_MARK_TTL_SECONDS",
    default: "30",
    doc: "TTL of `worker:active:…` and `worker:metadata:…`; a dead worker's mark disappears after this.",
};
/// BLPOP timeout.
pub const WORKER_BLOCK_SECONDS: EnvVar = EnvVar {
    name: "WORKER_BLOCK_SECONDS",
    default: "30",
    doc: "BLPOP timeout on `pool:claims` and on a user's request list.",
};
/// Idle exit.
pub const WORKER_IDLE_TIMEOUT_SECONDS: EnvVar = EnvVar {
    name: "WORKER_IDLE_TIMEOUT_SECONDS",
    default: "1800",
    doc: "A claimed worker without requests or control messages for this long closes its connections and exits 0.",
};
/// Broker connection health check.
pub const BROKER_HEALTH_CHECK_SECONDS: EnvVar = EnvVar {
    name: "BROKER_HEALTH_CHECK_SECONDS",
    default: "60",
    doc: "While idle, every open broker connection is pinged this often.",
};
/// Broker connect attempts.
pub const BROKER_CONNECT_ATTEMPTS: EnvVar = EnvVar {
    name: "BROKER_CONNECT_ATTEMPTS",
    default: "3",
    doc: "Connect attempts (with backoff) before a worker reports failure and exits non-zero.",
};
/// Paper broker latency.
pub const PAPER_LATENCY_MS: EnvVar = EnvVar {
    name: "PAPER_LATENCY_MS",
    default: "0",
    doc: "Simulated latency of every paper broker call.",
};
/// Paper broker failure injection.
pub const PAPER_FAILURE_RATE: EnvVar = EnvVar {
    name: "PAPER_FAILURE_RATE",
    default: "0",
    doc: "Fraction (0-1) of paper broker orders that fail, to exercise error paths.",
};
/// Where local workers write their output.
pub const LOCAL_WORKER_LOG_DIR: EnvVar = EnvVar {
    name: "LOCAL_WORKER_LOG_DIR",
    default: "",
    doc: "`local` launcher: each worker's output goes to `{dir}/{task_id}.log` (empty: inherits this process's stderr).",
};
/// Orphan-task grace.
pub const SWEEP_GRACE_SECONDS: EnvVar = EnvVar {
    name: "SWEEP_GRACE_SECONDS",
    default: "60",
    doc: "`maintenance` leaves tasks younger than this alone (they may not have written their first mark).",
};
/// Sweep parallelism.
pub const SWEEP_CONCURRENCY: EnvVar = EnvVar {
    name: "SWEEP_CONCURRENCY",
    default: "8",
    doc: "Batches of 100 findings `maintenance` resolves at once.",
};

/// Every variable, in documentation order.
pub const ALL: &[EnvVar] = &[
    LEASE_TABLE,
    LEASE_SECONDS,
    LEASE_RENEW_INTERVAL_MS,
    LEASE_SAFETY_MARGIN_MS,
    LEASE_SKEW_MARGIN_MS,
    OWNER_ID,
    AWS_REGION,
    AWS_ENDPOINT_URL,
    AWS_ENDPOINT_URL_DYNAMODB,
    UPSTREAM_URL,
    UPSTREAM_SUBSCRIBE,
    UPSTREAM_SEQ_POINTER,
    UPSTREAM_ID_POINTER,
    UPSTREAM_MAX_FRAME_BYTES,
    SINK_URL,
    SINK_DEDUP_WINDOW,
    SINK_MAX_LEN,
    STREAM_IDS,
    MAX_STREAMS,
    DISCOVERY_INTERVAL_MS,
    HANDOFF_POLL_MS,
    DRAIN_TIMEOUT_MS,
    BATCH_MAX_EVENTS,
    BATCH_MAX_DELAY_MS,
    SIDECAR_LISTEN,
    TELEMETRY_ADDR,
    TELEMETRY_BUFFER,
    WORKER_SILENCE_MS,
    STREAM_SERIES_IDLE_SECONDS,
    SIDECAR_OBSERVER,
    CLOUDWATCH_MODE,
    CLOUDWATCH_NAMESPACE,
    CLOUDWATCH_INTERVAL_SECONDS,
    LEASEHOLD_LOG,
    DASHBOARD_LISTEN,
    DASHBOARD_TOKEN,
    DASHBOARD_ALLOW_ANONYMOUS,
    DASHBOARD_SIDECARS,
    DASHBOARD_REFRESH_MS,
    DASHBOARD_STOPPED_AFTER_SECONDS,
    // --- broker pool ---
    REDIS_URL,
    USER_ID,
    CREDENTIALS_KEY,
    WORKER_ID,
    POOL_TARGET_SIZE,
    TASK_LAUNCHER,
    POOL_GROUP,
    ECS_CLUSTER,
    ECS_TASK_DEFINITION,
    ECS_CONTAINER_NAME,
    ECS_SUBNETS,
    ECS_SECURITY_GROUPS,
    ECS_LAUNCH_TYPE,
    ECS_CONTAINER_METADATA_URI_V4,
    WORKER_HEARTBEAT_MS,
    WORKER_MARK_TTL_SECONDS,
    WORKER_BLOCK_SECONDS,
    WORKER_IDLE_TIMEOUT_SECONDS,
    BROKER_HEALTH_CHECK_SECONDS,
    BROKER_CONNECT_ATTEMPTS,
    PAPER_LATENCY_MS,
    PAPER_FAILURE_RATE,
    SWEEP_GRACE_SECONDS,
    SWEEP_CONCURRENCY,
    LOCAL_WORKER_LOG_DIR,
];

/// All configuration problems found, reported together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration:\n  - {}", .problems.join("\n  - "))]
pub struct ConfigError {
    /// One line per bad value, naming the variable.
    pub problems: Vec<String>,
}

/// Collects problems while parsing.
#[derive(Default)]
pub struct Problems(Vec<String>);

impl Problems {
    /// Records a problem with a variable.
    pub fn add(&mut self, var: &EnvVar, problem: impl std::fmt::Display) {
        self.0.push(format!("{}: {problem}", var.name));
    }

    /// Records a problem already phrased with its variable name.
    pub fn add_raw(&mut self, problem: impl Into<String>) {
        self.0.push(problem.into());
    }

    /// Fails if anything was recorded.
    pub fn finish<T>(self, value: T) -> Result<T, ConfigError> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(ConfigError { problems: self.0 })
        }
    }

    /// Parses an optional value with `parse`, recording a problem on failure.
    pub fn parse<T, E: std::fmt::Display>(
        &mut self,
        var: &EnvVar,
        raw: Option<String>,
        parse: impl FnOnce(&str) -> Result<T, E>,
    ) -> Option<T> {
        let raw = raw?;
        match parse(raw.trim()) {
            Ok(value) => Some(value),
            Err(err) => {
                self.add(var, format_args!("{err} (got {raw:?})"));
                None
            }
        }
    }
}

/// Where the lease table is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSettings {
    /// Table name.
    pub table: String,
}

/// Everything a lease holder needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Table name.
    pub table: TableSettings,
    /// Keeper timings and identity.
    pub keeper: KeeperConfig,
}

/// Parses a whole number greater than zero.
pub fn positive_number(raw: &str) -> Result<u64, String> {
    match raw.parse::<u64>() {
        Ok(0) => Err("must be greater than 0".into()),
        Ok(value) => Ok(value),
        Err(_) => Err("must be a whole number".into()),
    }
}

/// Parses the table name alone (operator commands need nothing more).
pub fn table_settings(
    lookup: &dyn Fn(&str) -> Option<String>,
    problems: &mut Problems,
) -> TableSettings {
    let table = lookup(LEASE_TABLE.name).unwrap_or_else(|| LEASE_TABLE.default.to_owned());
    let valid_chars = table
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !(3..=255).contains(&table.len()) || !valid_chars {
        problems.add(
            &LEASE_TABLE,
            format_args!("{table:?} is not a DynamoDB table name (3-255 of a-z A-Z 0-9 _ - .)"),
        );
    }
    TableSettings { table }
}

/// Parses the lease settings, reporting every problem at once.
pub fn lease_settings(
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<LeaseSettings, ConfigError> {
    let mut problems = Problems::default();
    let table = table_settings(lookup, &mut problems);
    let lease_secs = problems
        .parse(&LEASE_SECONDS, lookup(LEASE_SECONDS.name), positive_number)
        .unwrap_or(30);
    let lease_ms = lease_secs.saturating_mul(1000);
    let renew_ms = problems
        .parse(
            &LEASE_RENEW_INTERVAL_MS,
            lookup(LEASE_RENEW_INTERVAL_MS.name),
            positive_number,
        )
        .unwrap_or(lease_ms / 3);
    let safety_ms = problems
        .parse(
            &LEASE_SAFETY_MARGIN_MS,
            lookup(LEASE_SAFETY_MARGIN_MS.name),
            |raw| raw.parse::<u64>().map_err(|_| "must be a whole number"),
        )
        .unwrap_or(lease_ms / 10);
    let skew_ms = problems
        .parse(
            &LEASE_SKEW_MARGIN_MS,
            lookup(LEASE_SKEW_MARGIN_MS.name),
            |raw| raw.parse::<u64>().map_err(|_| "must be a whole number"),
        )
        .unwrap_or(1000);
    if safety_ms >= lease_ms {
        problems.add(
            &LEASE_SAFETY_MARGIN_MS,
            format_args!("{safety_ms} ms must be shorter than the lease ({lease_ms} ms)"),
        );
    } else if renew_ms >= lease_ms - safety_ms {
        problems.add(
            &LEASE_RENEW_INTERVAL_MS,
            format_args!(
                "{renew_ms} ms leaves no time to renew before the holder's deadline \
                 (lease {lease_ms} ms - safety margin {safety_ms} ms)"
            ),
        );
    }
    let owner_id = lookup(OWNER_ID.name).unwrap_or_else(default_owner_id);
    if owner_id.trim().is_empty() || owner_id.len() > 256 {
        problems.add(&OWNER_ID, "must be 1 to 256 characters");
    }
    problems.finish(LeaseSettings {
        table,
        keeper: KeeperConfig {
            owner_id,
            lease: Duration::from_millis(lease_ms),
            renew_interval: Duration::from_millis(renew_ms),
            safety_margin: Duration::from_millis(safety_ms),
            skew_margin: Duration::from_millis(skew_ms),
            ..KeeperConfig::default()
        },
    })
}

/// The host name, which on ECS/Fargate is unique per task.
pub fn default_owner_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("leasehold-{}", std::process::id()))
}

/// A lookup over fixed values: tests, and embedders that configure components
/// in code (`dev`).
pub fn fixed_lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: std::collections::HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

/// Reads variables from the process environment; empty values count as unset.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        fixed_lookup(pairs)
    }

    #[test]
    fn defaults_follow_the_seed() {
        let settings = lease_settings(&lookup(&[("OWNER_ID", "w1")])).unwrap();
        assert_eq!(settings.table.table, "websocket-leases");
        assert_eq!(settings.keeper.lease, Duration::from_secs(30));
        assert_eq!(settings.keeper.renew_interval, Duration::from_secs(10));
        assert_eq!(settings.keeper.safety_margin, Duration::from_secs(3));
        assert_eq!(settings.keeper.skew_margin, Duration::from_secs(1));
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let err = lease_settings(&lookup(&[
            ("LEASE_TABLE", "x"),
            ("LEASE_SECONDS", "ten"),
            ("LEASE_SKEW_MARGIN_MS", "-1"),
            ("OWNER_ID", " "),
        ]))
        .unwrap_err();
        let text = err.to_string();
        assert_eq!(err.problems.len(), 4, "{text}");
        for name in [
            "LEASE_TABLE",
            "LEASE_SECONDS",
            "LEASE_SKEW_MARGIN_MS",
            "OWNER_ID",
        ] {
            assert!(text.contains(name), "{name} missing from {text}");
        }
    }

    #[test]
    fn renew_interval_must_fit_before_the_deadline() {
        let err = lease_settings(&lookup(&[
            ("LEASE_SECONDS", "3"),
            ("LEASE_RENEW_INTERVAL_MS", "2800"),
            ("OWNER_ID", "w"),
        ]))
        .unwrap_err();
        assert!(
            err.problems[0].starts_with("LEASE_RENEW_INTERVAL_MS"),
            "{err}"
        );
    }
}
