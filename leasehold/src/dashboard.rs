//! `leasehold dashboard`.

use std::sync::Arc;

use clap::Args;
use leasehold_control::clock::SystemClock;
use leasehold_control::store::dynamodb::DynamoLeaseStore;
use leasehold_dashboard::{Dashboard, DashboardConfig, Sources, settings};
use leasehold_platform::aws::{RetryPolicy, require_region, sdk_config};
use leasehold_platform::settings::{ConfigError, process_env};
use leasehold_pool::bus::BusConnector;
use leasehold_pool::read::PoolReader;
use leasehold_sink::reader::RedisSinkReader;

use crate::{Failure, shutdown_on_signal};

/// `leasehold dashboard`: flags mirror the environment variables.
#[derive(Debug, Args)]
pub(crate) struct DashboardArgs {
    /// HTTP address; anything but loopback also needs DASHBOARD_TOKEN [env: DASHBOARD_LISTEN]
    #[arg(long)]
    listen: Option<String>,
    /// Override sidecar discovery: comma-separated base URLs, e.g. http://10.0.3.7:9464 [env: DASHBOARD_SIDECARS]
    #[arg(long)]
    sidecars: Option<String>,
}

/// Runs the dashboard until SIGTERM or Ctrl-C.
pub(crate) async fn dashboard(args: DashboardArgs) -> Result<(), Failure> {
    crate::iam::declare("dashboard", &process_env);
    let lookup = |name: &str| {
        let flag = match name {
            "DASHBOARD_LISTEN" => args.listen.clone(),
            "DASHBOARD_SIDECARS" => args.sidecars.clone(),
            _ => None,
        };
        flag.or_else(|| process_env(name))
    };
    let sdk = sdk_config(RetryPolicy::Standard).await;
    let settings = require_region(&sdk, settings::parse(&lookup))?;
    // Without REDIS_URL the dashboard shows streams only; with it, the
    // connection is made (and remade) by the reader, so a Redis that is down at
    // start shows as down instead of stopping the dashboard.
    let pool = match settings.redis_url {
        Some(url) => {
            let bus = BusConnector::redis(url.into_inner());
            let bus = bus.map_err(|err| ConfigError::one(format!("REDIS_URL: {err}")))?;
            Some(Arc::new(bus) as Arc<dyn PoolReader>)
        }
        None => None,
    };
    // Likewise the sink: connected on the first stream page that reads it.
    let sink = settings.sink_url.map(|url| {
        Arc::new(RedisSinkReader::lazy(url.into_inner()))
            as Arc<dyn leasehold_dashboard::sources::sink::SinkReader>
    });
    let store = DynamoLeaseStore::from_sdk_config(&sdk, settings.table.table);
    let dashboard = Dashboard::start(
        DashboardConfig {
            listen: settings.listen,
            token: settings.token,
            access: settings.access,
            sources: Sources {
                leases: Arc::new(store),
                pool,
                sidecars: settings.sidecars,
                discovery: settings.discovery,
            },
            settings: settings.collector,
            clock: Arc::new(SystemClock),
            sink,
            grafana: settings.grafana_url,
        },
        shutdown_on_signal(),
    )
    .await
    .map_err(|err| Failure::Runtime(err.into()))?;
    println!("dashboard: http://{}/", dashboard.addr);
    dashboard.finished().await;
    Ok(())
}
