//! `leasehold feed` and `leasehold stream-worker`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use leasehold_control::clock::SystemClock;
use leasehold_control::store::dynamodb::DynamoLeaseStore;
use leasehold_feed::{FeedConfig, FeedServer};
use leasehold_platform::aws::{RetryPolicy, require_region, sdk_config};
use leasehold_platform::settings::{ConfigError, Env, process_env};

use leasehold_stream::{StreamWorker, settings};
use leasehold_telemetry::transport::BufferedShipper;
use tokio_util::sync::CancellationToken;

use crate::{Failure, shutdown_on_signal};

/// `leasehold feed`: the upstream simulator.
#[derive(Debug, Args)]
pub struct FeedArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: SocketAddr,
    /// Events per second per stream.
    #[arg(long, default_value_t = 10.0)]
    rate: f64,
    /// Events kept per stream; older subscriptions get `retention_exceeded`.
    #[arg(long, default_value_t = 100_000)]
    retention: u64,
    /// Events already available per stream at start (throughput benchmarks).
    #[arg(long, default_value_t = 0)]
    backlog: u64,
}

/// Runs the feed simulator until SIGTERM or Ctrl-C.
pub async fn feed(args: FeedArgs) -> Result<(), Failure> {
    if !(args.rate > 0.0 && args.rate.is_finite()) {
        return Err(Failure::Config(ConfigError {
            problems: vec!["--rate: must be a positive number of events per second".into()],
        }));
    }
    let shutdown = shutdown_on_signal();
    let config = FeedConfig {
        rate: args.rate,
        retention: args.retention,
        backlog: args.backlog,
    };
    let server = FeedServer::start(args.listen, config, shutdown)
        .await
        .with_context(|| format!("cannot serve the feed on {}", args.listen))?;
    println!("feed listening on {}", server.url());
    server.finished().await;
    Ok(())
}

/// `leasehold stream-worker`: flags mirror the environment variables.
#[derive(Debug, Args)]
pub struct StreamWorkerArgs {
    /// Upstream WebSocket URL [env: UPSTREAM_URL]
    #[arg(long)]
    upstream_url: Option<String>,
    /// `redis://…` or `memory:` [env: SINK_URL]
    #[arg(long)]
    sink_url: Option<String>,
    /// DynamoDB table [env: LEASE_TABLE]
    #[arg(long)]
    lease_table: Option<String>,
    /// Lease duration in seconds [env: LEASE_SECONDS]
    #[arg(long)]
    lease_seconds: Option<String>,
    /// This worker's identity [env: OWNER_ID]
    #[arg(long)]
    owner_id: Option<String>,
    /// Streams to register at start, comma-separated [env: STREAM_IDS]
    #[arg(long)]
    stream_ids: Option<String>,
    /// Most streams held [env: MAX_STREAMS]
    #[arg(long)]
    max_streams: Option<String>,
}

impl StreamWorkerArgs {
    fn flag(&self, name: &str) -> Option<String> {
        match name {
            "UPSTREAM_URL" => self.upstream_url.clone(),
            "SINK_URL" => self.sink_url.clone(),
            "LEASE_TABLE" => self.lease_table.clone(),
            "LEASE_SECONDS" => self.lease_seconds.clone(),
            "OWNER_ID" => self.owner_id.clone(),
            "STREAM_IDS" => self.stream_ids.clone(),
            "MAX_STREAMS" => self.max_streams.clone(),
            _ => None,
        }
    }
}

/// Binds `HANDOFF_LISTEN`; the announced address replaces an unspecified IP
/// with the ECS task's own (what peers in other tasks reach), else loopback.
fn handoff_socket(
    listen: std::net::SocketAddr,
    task: Option<&leasehold_platform::ecs::TaskMetadata>,
) -> anyhow::Result<leasehold_stream::handoff::HandoffSocket> {
    let socket = std::net::UdpSocket::bind(listen)
        .with_context(|| format!("cannot bind HANDOFF_LISTEN {listen}"))?;
    let mut advertised = socket.local_addr()?;
    if advertised.ip().is_unspecified() {
        let ip = task
            .and_then(|metadata| metadata.private_ipv4())
            .map_or(std::net::IpAddr::from([127, 0, 0, 1]), std::net::IpAddr::V4);
        advertised.set_ip(ip);
    }
    Ok(leasehold_stream::handoff::HandoffSocket::new(
        socket, advertised,
    )?)
}

/// Runs a stream worker until SIGTERM, then drains and exits 0.
pub async fn stream_worker(args: StreamWorkerArgs) -> Result<(), Failure> {
    // OWNER_ID defaults to the ECS task id (what the console, the dashboard and
    // StopTask name), else the host name.
    // The task metadata also gives the address of this task's sidecar.
    let task = leasehold_platform::ecs::task_metadata().await;
    let explicit_owner = args
        .flag("OWNER_ID")
        .or_else(|| process_env("OWNER_ID"))
        .filter(|owner| !owner.is_empty());
    let ecs_task_id = match explicit_owner {
        Some(_) => None,
        None => task
            .as_ref()
            .and_then(|metadata| metadata.task_id().map(str::to_owned)),
    };
    let lookup = |name: &str| {
        let value = args.flag(name).or_else(|| process_env(name));
        match value {
            // An empty OWNER_ID is unset: the ECS task id stands in.
            Some(owner) if name == "OWNER_ID" && owner.is_empty() => ecs_task_id.clone(),
            None if name == "OWNER_ID" => ecs_task_id.clone(),
            other => other,
        }
    };
    let sdk = sdk_config(RetryPolicy::CallerRetries).await;
    let mut settings = require_region(&sdk, settings::parse(&lookup))?;
    let explicit = settings.worker.sidecar_url.take();
    let mut env = Env::new(&lookup);
    let derived =
        leasehold_telemetry::settings::sidecar_url_from(&mut env, explicit, task.as_ref());
    settings.worker.sidecar_url = env.finish(derived)?;
    let store = DynamoLeaseStore::from_sdk_config(&sdk, settings.lease.table.table.clone());
    store.check_table().await?;
    let sink = leasehold_sink::open(settings.sink_url.expose(), settings.sink)
        .await
        .context("cannot open the sink")?;
    // Telemetry outlives the drain so the final releases reach the sidecar.
    let telemetry_stop = CancellationToken::new();
    let telemetry = Arc::new(BufferedShipper::start(
        settings.shipper.clone(),
        telemetry_stop.clone(),
    ));
    let worker = StreamWorker::from_settings(
        &settings,
        Arc::new(store),
        sink,
        telemetry.clone(),
        Arc::new(SystemClock),
    );
    let worker = match settings.handoff_listen {
        Some(listen) => worker.with_handoff(handoff_socket(listen, task.as_ref())?),
        None => worker,
    };
    let shutdown = shutdown_on_signal();
    tracing::info!(
        owner_id = settings.lease.keeper.owner_id,
        "stream worker started"
    );
    let report = worker.run(shutdown).await?;
    tracing::info!(
        released = report.released.len(),
        failed = report.failed.len(),
        "stream worker drained"
    );
    for (stream, error) in &report.failed {
        tracing::warn!(stream_id = stream, error, "not released cleanly");
    }
    telemetry.flush(Duration::from_millis(500)).await;
    telemetry_stop.cancel();
    Ok(())
}
