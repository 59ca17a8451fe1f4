//! The broker pool's variables (from `leasehold_control::config`), parsed with
//! every problem reported at once. `CREDENTIALS_KEY` and `REDIS_URL` values are
//! never echoed: problems name the variable only.

use std::time::{Duration, SystemTime};

use leasehold_control::backoff::Backoff;
use leasehold_control::clock::unix_ms;
use leasehold_control::config::{
    BROKER_CONNECT_ATTEMPTS, BROKER_HEALTH_CHECK_SECONDS, CREDENTIALS_KEY, ConfigError,
    ECS_CLUSTER, ECS_CONTAINER_METADATA_URI_V4, ECS_CONTAINER_NAME, ECS_LAUNCH_TYPE,
    ECS_SECURITY_GROUPS, ECS_SUBNETS, ECS_TASK_DEFINITION, EnvVar, PAPER_FAILURE_RATE,
    PAPER_LATENCY_MS, POOL_GROUP, POOL_TARGET_SIZE, Problems, REDIS_URL, SWEEP_CONCURRENCY,
    SWEEP_GRACE_SECONDS, TASK_LAUNCHER, USER_ID, WORKER_BLOCK_SECONDS, WORKER_HEARTBEAT_MS,
    WORKER_ID, WORKER_IDLE_TIMEOUT_SECONDS, WORKER_MARK_TTL_SECONDS,
};

use super::connections::ConnectPolicy;
use super::credentials::AesGcmCipher;
use super::launcher::EcsSettings;
use super::maintenance::SweepConfig;
use super::paper::PaperConfig;
use super::worker::{BrokerWorkerConfig, WorkerMetadata};

type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

fn number(problems: &mut Problems, lookup: Lookup, var: &EnvVar, zero_ok: bool) -> u64 {
    let default = var.default.parse().unwrap_or(0);
    problems
        .parse(var, lookup(var.name), |raw| match raw.parse::<u64>() {
            Ok(0) if !zero_ok => Err("must be greater than 0"),
            Ok(value) => Ok(value),
            Err(_) => Err("must be a whole number"),
        })
        .unwrap_or(default)
}

/// `REDIS_URL`, checked for form only.
pub fn redis_url(problems: &mut Problems, lookup: Lookup) -> String {
    let url = lookup(REDIS_URL.name).unwrap_or_else(|| REDIS_URL.default.to_owned());
    if redis::Client::open(url.as_str()).is_err() {
        problems.add(&REDIS_URL, "is not a redis:// or rediss:// URL");
    }
    url
}

/// The cipher from `CREDENTIALS_KEY` (required).
pub fn cipher(problems: &mut Problems, lookup: Lookup) -> Option<AesGcmCipher> {
    match lookup(CREDENTIALS_KEY.name) {
        None => {
            problems.add(
                &CREDENTIALS_KEY,
                "is required (standard base64 of 32 random bytes)",
            );
            None
        }
        Some(key) => match AesGcmCipher::from_base64_key(&key) {
            Ok(cipher) => Some(cipher),
            Err(_) => {
                // Never `add` via `parse`: that would echo the key.
                problems.add(&CREDENTIALS_KEY, "must be standard base64 of 32 bytes");
                None
            }
        },
    }
}

/// Everything `leasehold broker-worker` needs.
#[derive(Debug)]
pub struct BrokerWorkerSettings {
    /// Redis (may hold a password: never print).
    pub redis_url: String,
    /// Worker timings and identity.
    pub worker: BrokerWorkerConfig,
    /// The key.
    pub cipher: AesGcmCipher,
    /// Paper broker behaviour.
    pub paper: PaperConfig,
    /// ECS task metadata endpoint, when on ECS.
    pub ecs_metadata_uri: Option<String>,
}

/// Parses the broker worker's settings.
pub fn worker_settings(lookup: Lookup) -> Result<BrokerWorkerSettings, ConfigError> {
    let mut problems = Problems::default();
    let redis_url = redis_url(&mut problems, lookup);
    let cipher = cipher(&mut problems, lookup);
    let user_id = lookup(USER_ID.name).filter(|u| u != leasehold_control::keys::POOL_USER_ID);
    if let Some(user) = &user_id
        && (user.len() > 200 || user.chars().any(|c| c.is_whitespace() || c.is_control()))
    {
        problems.add(&USER_ID, "must be 1-200 characters without spaces");
    }
    let heartbeat = number(&mut problems, lookup, &WORKER_HEARTBEAT_MS, false);
    let ttl = number(&mut problems, lookup, &WORKER_MARK_TTL_SECONDS, false);
    if heartbeat >= ttl.saturating_mul(1000) {
        problems.add(
            &WORKER_HEARTBEAT_MS,
            "must be shorter than WORKER_MARK_TTL_SECONDS",
        );
    }
    let block = number(&mut problems, lookup, &WORKER_BLOCK_SECONDS, false);
    let idle = number(&mut problems, lookup, &WORKER_IDLE_TIMEOUT_SECONDS, false);
    let health = number(&mut problems, lookup, &BROKER_HEALTH_CHECK_SECONDS, false);
    let attempts = number(&mut problems, lookup, &BROKER_CONNECT_ATTEMPTS, false);
    let latency = number(&mut problems, lookup, &PAPER_LATENCY_MS, true);
    let failure_rate = problems
        .parse(
            &PAPER_FAILURE_RATE,
            lookup(PAPER_FAILURE_RATE.name),
            |raw| {
                raw.parse::<f64>()
                    .ok()
                    .filter(|r| (0.0..=1.0).contains(r))
                    .ok_or("must be a number from 0 to 1")
            },
        )
        .unwrap_or(0.0);
    let task_id = format!("local-{}", std::process::id());
    let worker_id = lookup(WORKER_ID.name).unwrap_or_else(|| task_id.clone());
    let host = leasehold_control::config::default_owner_id();
    let ecs_metadata_uri = lookup(ECS_CONTAINER_METADATA_URI_V4.name);
    let worker = BrokerWorkerConfig {
        worker_id,
        task_id: task_id.clone(),
        user_id,
        heartbeat: Duration::from_millis(heartbeat),
        mark_ttl: Duration::from_secs(ttl),
        block: Duration::from_secs(block),
        idle_timeout: Duration::from_secs(idle),
        health_check: Duration::from_secs(health),
        connect: ConnectPolicy {
            attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
            backoff: Backoff {
                base: Duration::from_millis(200),
                cap: Duration::from_secs(2),
            },
        },
        metadata: WorkerMetadata {
            task_arn: task_id,
            instance_id: host,
            launched_at: u64::try_from(unix_ms(SystemTime::now())).unwrap_or(0),
        },
    };
    let paper = PaperConfig {
        latency: Duration::from_millis(latency),
        failure_rate,
    };
    match cipher {
        Some(cipher) => problems.finish(BrokerWorkerSettings {
            redis_url,
            worker,
            cipher,
            paper,
            ecs_metadata_uri,
        }),
        None => Err(problems.finish(()).err().unwrap_or(ConfigError {
            problems: vec![format!("{}: is required", CREDENTIALS_KEY.name)],
        })),
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
        log_dir: Option<std::path::PathBuf>,
    },
    /// ECS tasks.
    Ecs(EcsSettings),
}

fn list(lookup: Lookup, var: &EnvVar) -> Vec<String> {
    lookup(var.name)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Parses `TASK_LAUNCHER` and what the chosen launcher needs.
pub fn launcher_settings(problems: &mut Problems, lookup: Lookup) -> LauncherSettings {
    let group = lookup(POOL_GROUP.name).unwrap_or_else(|| POOL_GROUP.default.to_owned());
    if group.is_empty() || group.len() > 36 {
        problems.add(&POOL_GROUP, "must be 1-36 characters (ECS startedBy)");
    }
    match lookup(TASK_LAUNCHER.name).as_deref().unwrap_or("local") {
        "local" => LauncherSettings::Local {
            group,
            log_dir: lookup(leasehold_control::config::LOCAL_WORKER_LOG_DIR.name).map(Into::into),
        },
        "ecs" => {
            let task_definition = lookup(ECS_TASK_DEFINITION.name).unwrap_or_default();
            if task_definition.is_empty() {
                problems.add(&ECS_TASK_DEFINITION, "is required with TASK_LAUNCHER=ecs");
            }
            let launch_type =
                lookup(ECS_LAUNCH_TYPE.name).unwrap_or_else(|| ECS_LAUNCH_TYPE.default.to_owned());
            if !matches!(launch_type.as_str(), "FARGATE" | "EC2" | "EXTERNAL") {
                problems.add(&ECS_LAUNCH_TYPE, "must be FARGATE, EC2 or EXTERNAL");
            }
            LauncherSettings::Ecs(EcsSettings {
                cluster: lookup(ECS_CLUSTER.name).unwrap_or_else(|| ECS_CLUSTER.default.to_owned()),
                task_definition,
                container: lookup(ECS_CONTAINER_NAME.name)
                    .unwrap_or_else(|| ECS_CONTAINER_NAME.default.to_owned()),
                subnets: list(lookup, &ECS_SUBNETS),
                security_groups: list(lookup, &ECS_SECURITY_GROUPS),
                launch_type,
                group,
            })
        }
        _ => {
            problems.add(&TASK_LAUNCHER, "must be `local` or `ecs`");
            LauncherSettings::Local {
                group,
                log_dir: None,
            }
        }
    }
}

/// `POOL_TARGET_SIZE`.
pub fn pool_target(problems: &mut Problems, lookup: Lookup) -> usize {
    usize::try_from(number(problems, lookup, &POOL_TARGET_SIZE, true)).unwrap_or(usize::MAX)
}

/// The sweep's settings.
pub fn sweep_config(problems: &mut Problems, lookup: Lookup, dry_run: bool) -> SweepConfig {
    SweepConfig {
        mark_ttl: Duration::from_secs(number(problems, lookup, &WORKER_MARK_TTL_SECONDS, false)),
        grace: Duration::from_secs(number(problems, lookup, &SWEEP_GRACE_SECONDS, true)),
        concurrency: usize::try_from(number(problems, lookup, &SWEEP_CONCURRENCY, false))
            .unwrap_or(1),
        dry_run,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_redis_urls_are_accepted() {
        // ElastiCache Serverless only speaks TLS: `rediss://` must work.
        for url in ["rediss://cache.example:6379", "redis://127.0.0.1:6379/7"] {
            let mut problems = Problems::default();
            redis_url(&mut problems, &|_| Some(url.to_owned()));
            assert!(problems.finish(()).is_ok(), "{url} refused");
        }
        let mut problems = Problems::default();
        redis_url(&mut problems, &|_| Some("http://nope".to_owned()));
        assert!(problems.finish(()).is_err());
    }

    #[test]
    fn bad_values_are_all_reported_and_the_key_is_never_echoed() {
        let lookup = |name: &str| match name {
            "CREDENTIALS_KEY" => Some("CANARY-not-a-key".to_owned()),
            "WORKER_HEARTBEAT_MS" => Some("soon".to_owned()),
            "PAPER_FAILURE_RATE" => Some("2".to_owned()),
            _ => None,
        };
        let err = worker_settings(&lookup).unwrap_err();
        let text = err.to_string();
        assert_eq!(err.problems.len(), 3, "{text}");
        assert!(!text.contains("CANARY"), "{text}");
    }

    #[test]
    fn defaults_follow_the_seed() {
        let key = AesGcmCipher::generate_key();
        let lookup = move |name: &str| (name == "CREDENTIALS_KEY").then(|| key.clone());
        let settings = worker_settings(&lookup).unwrap();
        assert_eq!(settings.worker.user_id, None);
        assert_eq!(settings.worker.heartbeat, Duration::from_secs(5));
        assert_eq!(settings.worker.mark_ttl, Duration::from_secs(30));
        assert_eq!(settings.worker.block, Duration::from_secs(30));
        assert_eq!(settings.worker.idle_timeout, Duration::from_secs(1800));
        assert_eq!(settings.worker.health_check, Duration::from_secs(60));
        assert_eq!(settings.worker.connect.attempts, 3);
    }
}
