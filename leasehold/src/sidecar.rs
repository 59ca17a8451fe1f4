//! `leasehold sidecar`.

use std::sync::Arc;

use clap::Args;
use leasehold_control::clock::SystemClock;
use leasehold_control::keeper::LeaseKeeper;
use leasehold_control::store::dynamodb::DynamoLeaseStore;
use leasehold_platform::aws::{RetryPolicy, require_region, sdk_config};
use leasehold_platform::settings::process_env;
use leasehold_pool::bus::BusConnector;
use leasehold_pool::read::PoolReader;
use leasehold_sidecar::cloudwatch::Mode;
use leasehold_sidecar::observer::ObserverConfig;
use leasehold_sidecar::{Sidecar, SidecarConfig, settings};
use leasehold_telemetry::LogSink;

use crate::{Failure, shutdown_on_signal};

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

/// Runs the sidecar until SIGTERM or Ctrl-C.
pub async fn sidecar(args: SidecarArgs) -> Result<(), Failure> {
    let lookup = |name: &str| {
        let flag = match name {
            "SIDECAR_LISTEN" => args.listen.clone(),
            "TELEMETRY_ADDR" => args.telemetry_addr.clone(),
            "SIDECAR_OBSERVER" if args.no_observer => Some("false".into()),
            _ => None,
        };
        flag.or_else(|| process_env(name))
    };
    let parsed = settings::parse(&lookup);
    let needs_aws = parsed.as_ref().map_or(true, |settings| {
        settings.observer.is_some() || settings.cloudwatch.mode == Mode::Api
    });
    // The observer's lease writes are retried by its keeper; PutMetricData by the SDK.
    let (settings, keeper_sdk, cloudwatch_sdk) = if needs_aws {
        let keeper_sdk = sdk_config(RetryPolicy::CallerRetries).await;
        let settings = require_region(&keeper_sdk, parsed)?;
        let cloudwatch_sdk = sdk_config(RetryPolicy::Standard).await;
        (settings, Some(keeper_sdk), Some(cloudwatch_sdk))
    } else {
        (parsed?, None, None)
    };
    let cloudwatch_client = match (&cloudwatch_sdk, settings.cloudwatch.mode) {
        (Some(sdk), Mode::Api) => Some(aws_sdk_cloudwatch::Client::new(sdk)),
        _ => None,
    };
    let observer = match (settings.observer.clone(), keeper_sdk) {
        (Some(lease), Some(sdk)) => {
            let store = DynamoLeaseStore::from_sdk_config(&sdk, lease.table.table.clone());
            let clock = Arc::new(SystemClock);
            let keeper = LeaseKeeper::new(
                Arc::new(store),
                clock.clone(),
                Arc::new(LogSink),
                lease.keeper,
            );
            // The pool gauges need the pool's Redis. It is connected lazily (and
            // again after a failure): a Redis that is down at task start must not
            // stop the sidecar, which ECS would then not restart. Without it the
            // observer publishes the stream gauges only.
            let pool = match settings.redis_url.clone() {
                Some(url) => Some(Arc::new(
                    BusConnector::redis(url.into_inner())
                        .map_err(|err| anyhow::anyhow!("REDIS_URL: {err}"))?,
                ) as Arc<dyn PoolReader>),
                None => None,
            };
            Some(ObserverConfig {
                keeper,
                clock,
                pacing: settings.observer_pacing,
                pool,
            })
        }
        _ => None,
    };
    let metadata = leasehold_platform::ecs::task_metadata()
        .await
        .unwrap_or_default();
    let instance = metadata
        .task_id()
        .map(str::to_owned)
        .unwrap_or_else(leasehold_control::settings::default_owner_id);
    let mut otlp_resource = vec![("service.instance.id".to_owned(), instance)];
    otlp_resource.extend(metadata.resource_attributes());
    let shutdown = shutdown_on_signal();
    let sidecar = Sidecar::start(
        SidecarConfig {
            listen: settings.listen,
            telemetry: settings.telemetry,
            worker_silence: settings.worker_silence,
            stream_series_idle: settings.stream_series_idle,
            observer,
            otlp: leasehold_sidecar::otlp::enabled_by_env().then(|| {
                leasehold_sidecar::otlp::OtlpConfig {
                    resource: otlp_resource,
                    ..Default::default()
                }
            }),
            cloudwatch: Some((settings.cloudwatch, cloudwatch_client)),
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
