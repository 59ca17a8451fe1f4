//! `leasehold feed` and `leasehold stream-worker`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use leasehold_control::clock::{Clock, SystemClock};
use leasehold_control::mode::{self, ModeError};
use leasehold_control::store::dynamodb::DynamoLeaseStore;
use leasehold_feed::{FeedConfig, FeedServer};
use leasehold_platform::aws::{RetryPolicy, require_region, sdk_config};
use leasehold_platform::settings::{ConfigError, process_env};

use leasehold_stream::handoff::HandoffSocket;
use leasehold_stream::{StreamWorker, settings};
use leasehold_telemetry::transport::BufferedShipper;
use tokio_util::sync::CancellationToken;

use crate::{Failure, shutdown_on_signal};

/// `leasehold feed`: the upstream simulator.
#[derive(Debug, Args)]
pub(crate) struct FeedArgs {
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
pub(crate) async fn feed(args: FeedArgs) -> Result<(), Failure> {
    if !(args.rate > 0.0 && args.rate.is_finite()) {
        let problem = "--rate: must be a positive number of events per second";
        return Err(ConfigError::one(problem).into());
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
pub(crate) struct StreamWorkerArgs {
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

/// Runs a stream worker until SIGTERM, then drains and exits 0.
pub(crate) async fn stream_worker(args: StreamWorkerArgs) -> Result<(), Failure> {
    crate::iam::declare("stream-worker", &process_env);
    // OWNER_ID defaults to the ECS task id (what the console, the dashboard and
    // StopTask name), else the host name.
    // The task metadata also gives the address of this task's sidecar.
    let task = leasehold_platform::ecs::task_metadata().await;
    let flags = |name: &str| args.flag(name).or_else(|| process_env(name));
    let lookup = settings::owner_from_task(&flags, task.as_ref());
    let sdk = sdk_config(RetryPolicy::CallerRetries).await;
    let mut settings = require_region(&sdk, settings::parse(&lookup))?;
    settings.derive_sidecar_url(&lookup, task.as_ref())?;
    if settings.sink.max_len == 0 {
        tracing::warn!(
            "SINK_MAX_LEN=0: the sink keeps every event until Redis runs out of memory and refuses writes (size it as events per second times the seconds a reader may fall behind)"
        );
    }
    let store = DynamoLeaseStore::from_sdk_config(&sdk, settings.lease.table.table.clone());
    store.check_table().await?;
    let declared = mode::declare(&store, settings.lease.keeper.mode, SystemClock.now_ms());
    match declared.await {
        Err(err @ ModeError::Mismatch { .. }) => {
            Err(ConfigError::one(format!("LEASE_MODE: {err}")))?
        }
        other => other.context("cannot declare the lease mode")?,
    }
    match leasehold_sink::require_noeviction(settings.sink_url.expose()).await {
        Err(leasehold_sink::SinkError::Config(problem)) => Err(ConfigError::one(problem))?,
        other => other.context("cannot check the sink's eviction policy")?,
    }
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
        Some(listen) => {
            let socket = HandoffSocket::bind(listen, task.as_ref()).map_err(anyhow::Error::from)?;
            worker.with_handoff(socket)
        }
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
