//! `leasehold sidecar`.

use std::sync::Arc;

use clap::Args;
use leasehold_control::store::dynamodb::DynamoLeaseStore;
use leasehold_platform::aws::{RetryPolicy, require_region, sdk_config};
use leasehold_platform::settings::{Redacted, process_env};
use leasehold_sidecar::cloudwatch::Mode;
use leasehold_sidecar::observer::ObserverConfig;
use leasehold_sidecar::otlp::OtlpConfig;
use leasehold_sidecar::{Sidecar, SidecarConfig, settings};

use crate::{Failure, shutdown_on_signal};

/// `leasehold sidecar`: flags mirror the environment variables.
#[derive(Debug, Args)]
pub(crate) struct SidecarArgs {
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
pub(crate) async fn sidecar(args: SidecarArgs) -> Result<(), Failure> {
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
    crate::iam::declare("sidecar", &lookup);
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
            let redis_url = settings.redis_url.clone().map(Redacted::into_inner);
            let pacing = settings.observer_pacing;
            let observer = ObserverConfig::new(Arc::new(store), lease.keeper, pacing, redis_url);
            Some(observer.map_err(|err| anyhow::anyhow!("REDIS_URL: {err}"))?)
        }
        _ => None,
    };
    let metadata = leasehold_platform::ecs::task_metadata()
        .await
        .unwrap_or_default();
    let shutdown = shutdown_on_signal();
    let sidecar = Sidecar::start(
        SidecarConfig {
            listen: settings.listen,
            telemetry: settings.telemetry,
            worker_silence: settings.worker_silence,
            stream_series_idle: settings.stream_series_idle,
            observer,
            otlp: OtlpConfig::for_task(&metadata),
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
