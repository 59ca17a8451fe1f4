//! `leasehold sidecar`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use leasehold_control::clock::SystemClock;
use leasehold_control::config::{
    self, CLOUDWATCH_INTERVAL_SECONDS, CLOUDWATCH_MODE, CLOUDWATCH_NAMESPACE, ConfigError, EnvVar,
    Problems, SIDECAR_LISTEN, SIDECAR_OBSERVER, STREAM_SERIES_IDLE_SECONDS, TELEMETRY_ADDR,
    WORKER_SILENCE_MS,
};
use leasehold_control::keeper::LeaseKeeper;
use leasehold_control::store::dynamodb::{DynamoLeaseStore, load_sdk_config};
use leasehold_control::telemetry::LogSink;
use leasehold_sidecar::cloudwatch::{CloudWatchConfig, Mode};
use leasehold_sidecar::observer::ObserverConfig;
use leasehold_sidecar::{Sidecar, SidecarConfig};
use leasehold_worker::broker::bus::BusConnector;

use crate::Failure;
use crate::stream::shutdown_on_signal;

/// `leasehold sidecar`: flags mirror the environment variables.
#[derive(Debug, Args)]
pub struct SidecarArgs {
    /// HTTP address for /metrics, /healthz, /status [env: SIDECAR_LISTEN]
    #[arg(long)]
    listen: Option<String>,
    /// Telemetry address workers ship to [env: TELEMETRY_ADDR]
    #[arg(long)]
    telemetry_addr: Option<String>,
    /// Do not compete for the observer lease [env: SIDECAR_OBSERVER=false]
    #[arg(long)]
    no_observer: bool,
}

fn address(
    problems: &mut Problems,
    lookup: &dyn Fn(&str) -> Option<String>,
    var: &EnvVar,
) -> SocketAddr {
    let raw = lookup(var.name).unwrap_or_else(|| var.default.to_owned());
    problems
        .parse(var, Some(raw), |raw| {
            raw.parse::<SocketAddr>()
                .map_err(|_| "must be HOST:PORT with an IP address")
        })
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)))
}

fn millis(
    problems: &mut Problems,
    lookup: &dyn Fn(&str) -> Option<String>,
    var: &EnvVar,
    default: u64,
) -> Duration {
    Duration::from_millis(
        problems
            .parse(var, lookup(var.name), config::positive_number)
            .unwrap_or(default),
    )
}

/// Runs the sidecar until SIGTERM or Ctrl-C.
pub async fn sidecar(args: SidecarArgs) -> Result<(), Failure> {
    let lookup = |name: &str| {
        let flag = match name {
            "SIDECAR_LISTEN" => args.listen.clone(),
            "TELEMETRY_ADDR" => args.telemetry_addr.clone(),
            "SIDECAR_OBSERVER" if args.no_observer => Some("false".into()),
            _ => None,
        };
        flag.or_else(|| config::process_env(name))
    };
    let mut problems = Problems::default();
    let listen = address(&mut problems, &lookup, &SIDECAR_LISTEN);
    let telemetry = address(&mut problems, &lookup, &TELEMETRY_ADDR);
    let worker_silence = millis(&mut problems, &lookup, &WORKER_SILENCE_MS, 5_000);
    let idle = millis(&mut problems, &lookup, &STREAM_SERIES_IDLE_SECONDS, 120) * 1000;
    let observe = problems
        .parse(
            &SIDECAR_OBSERVER,
            lookup(SIDECAR_OBSERVER.name),
            |raw| match raw {
                "true" | "1" => Ok(true),
                "false" | "0" => Ok(false),
                _ => Err("must be true or false"),
            },
        )
        .unwrap_or(true);
    let lease = if observe {
        match config::lease_settings(&lookup) {
            Ok(lease) => Some(lease),
            Err(err) => {
                err.problems.into_iter().for_each(|p| problems.add_raw(p));
                None
            }
        }
    } else {
        None
    };
    let mode = problems
        .parse(
            &CLOUDWATCH_MODE,
            lookup(CLOUDWATCH_MODE.name),
            |raw| match raw {
                "off" => Ok(Mode::Off),
                "emf" => Ok(Mode::Emf),
                "api" => Ok(Mode::Api),
                _ => Err("must be off, emf or api"),
            },
        )
        .unwrap_or(Mode::Off);
    let cloudwatch = CloudWatchConfig {
        mode,
        namespace: lookup(CLOUDWATCH_NAMESPACE.name)
            .unwrap_or_else(|| CLOUDWATCH_NAMESPACE.default.to_owned()),
        interval: millis(&mut problems, &lookup, &CLOUDWATCH_INTERVAL_SECONDS, 60) * 1000,
    };
    let needs_aws = observe || mode == Mode::Api;
    let sdk = if needs_aws {
        Some(load_sdk_config().await)
    } else {
        None
    };
    if sdk.as_ref().is_some_and(|sdk| sdk.region().is_none()) {
        problems.add(
            &config::AWS_REGION,
            "not set, and no region in the AWS profile (needed by the observer)",
        );
    }
    problems
        .finish(())
        .map_err(|err: ConfigError| Failure::Config(err))?;
    let cloudwatch_client = match (&sdk, mode) {
        (Some(sdk), Mode::Api) => {
            // PutMetricData is worth retrying (unlike lease writes, which the keeper retries itself).
            let config = aws_sdk_cloudwatch::config::Builder::from(sdk)
                .retry_config(
                    aws_sdk_cloudwatch::config::retry::RetryConfig::standard().with_max_attempts(3),
                )
                .build();
            Some(aws_sdk_cloudwatch::Client::from_conf(config))
        }
        _ => None,
    };
    let observer = match (lease, sdk) {
        (Some(lease), Some(sdk)) => {
            let store = DynamoLeaseStore::from_sdk_config(&sdk, lease.table.table.clone());
            let clock = Arc::new(SystemClock);
            let keeper = LeaseKeeper::new(
                Arc::new(store),
                clock.clone(),
                Arc::new(LogSink),
                lease.keeper,
            );
            // The pool and orphan gauges need the pool bus; without it the
            // observer publishes the stream gauges only.
            // The pool gauges need the pool's Redis. It is connected lazily (and
            // again after a failure): a Redis that is down at task start must not
            // stop the sidecar, which ECS would then not restart.
            let pool = match lookup(config::REDIS_URL.name) {
                Some(url) => {
                    Some(Arc::new(BusConnector::redis(url).map_err(|err| {
                        anyhow::anyhow!("REDIS_URL is not a Redis URL ({err})")
                    })?))
                }
                None => None,
            };
            Some(ObserverConfig {
                keeper,
                clock,
                interval: Duration::from_secs(15),
                pool,
            })
        }
        _ => None,
    };
    let metadata = leasehold_control::ecs::task_metadata()
        .await
        .unwrap_or_default();
    let instance = metadata
        .task_id()
        .map(str::to_owned)
        .unwrap_or_else(config::default_owner_id);
    let mut otlp_resource = vec![("service.instance.id".to_owned(), instance)];
    otlp_resource.extend(metadata.resource_attributes());
    let shutdown = shutdown_on_signal();
    let sidecar = Sidecar::start(
        SidecarConfig {
            listen,
            telemetry,
            worker_silence,
            stream_series_idle: idle,
            observer,
            otlp: leasehold_sidecar::otlp::enabled_by_env().then(|| {
                leasehold_sidecar::otlp::OtlpConfig {
                    resource: otlp_resource.clone(),
                    ..Default::default()
                }
            }),
            cloudwatch: Some((cloudwatch, cloudwatch_client)),
        },
        shutdown,
    )
    .await
    .map_err(|err| Failure::Runtime(err.into()))?;
    println!(
        "sidecar: metrics on http://{}/metrics, telemetry on {}",
        sidecar.http_addr, sidecar.telemetry_addr
    );
    sidecar.finished().await;
    Ok(())
}
