//! `leasehold dev`: the whole cluster in one process (`leasehold_devcluster`).

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use leasehold_control::settings::{LeaseMode, parse_lease_mode};
use leasehold_devcluster::{DevCluster, DevFeed, DevOptions};
use leasehold_stream::worker::DiscoveryMode;

use crate::{Failure, shutdown_on_signal};

/// `leasehold dev`: sizes and backends.
#[derive(Debug, Args)]
pub(crate) struct DevArgs {
    /// Streams served by the feed simulator.
    #[arg(long, default_value_t = 12)]
    streams: usize,
    /// Stream workers (each with its own sidecar).
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Warm pool size the pool manager keeps.
    #[arg(long, default_value_t = 3)]
    pool: usize,
    /// Users of the synthetic order flow.
    #[arg(long, default_value_t = 4)]
    users: usize,
    /// Events per second per stream.
    #[arg(long, default_value_t = 5.0)]
    rate: f64,
    /// Lease duration in seconds (short, so takeovers are quick to watch).
    // At least 1, as LEASE_SECONDS: a zero lease expires as it is taken.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u64).range(1..))]
    lease_seconds: u64,
    /// Dashboard address (loopback).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Crash, pause and roll workers periodically.
    #[arg(long)]
    chaos: bool,
    /// Seconds between chaos actions.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    chaos_every: u64,
    /// Use this DynamoDB-compatible endpoint (table `leasehold-dev`) instead of the in-memory store.
    #[arg(long)]
    dynamodb_endpoint: Option<String>,
    /// Use this Redis for the sink and the pool bus instead of the in-memory
    /// ones (`redis://…`; `redis+cluster://h:p,h:p` puts the sink on a Redis
    /// Cluster and keeps the pool bus in memory).
    #[arg(long)]
    redis_url: Option<String>,
    /// What the stream workers read: `simulator` (replays on request),
    /// `exchange` (a Binance-shaped fake: live start, a short REST history,
    /// connections cut every 20 s; the dashboard shows backfills and gaps) or
    /// `book` (Binance-shaped order books: REST snapshots plus diffs, a
    /// resync after every cut).
    #[arg(long, default_value = "simulator")]
    feed: DevFeed,
    /// `per-stream` (a renewed lease per stream) or `session` (one per worker).
    #[arg(long, env = "LEASE_MODE", default_value = "per-stream", value_parser = parse_lease_mode)]
    lease_mode: LeaseMode,
    /// `scan` (every worker scans) or `assigned` (one elected assigner advises).
    #[arg(long, env = "DISCOVERY_MODE", default_value = "scan")]
    discovery_mode: DiscoveryMode,
}

/// Runs the embedded cluster until Ctrl-C, then drains it and checks the sink.
pub(crate) async fn dev(args: DevArgs) -> Result<(), Failure> {
    let started = std::time::Instant::now();
    let options = DevOptions {
        streams: args.streams,
        workers: args.workers,
        pool: args.pool,
        users: args.users,
        rate: args.rate,
        lease: Duration::from_secs(args.lease_seconds),
        listen: args.listen,
        chaos_every: args.chaos.then(|| Duration::from_secs(args.chaos_every)),
        dynamodb_endpoint: args.dynamodb_endpoint.clone(),
        redis_url: args.redis_url.clone(),
        feed: args.feed,
        lease_mode: args.lease_mode,
        discovery_mode: args.discovery_mode,
    };
    let shutdown = shutdown_on_signal();
    let cluster = DevCluster::start(options).await.map_err(|err| match err {
        leasehold_devcluster::DevError::Config(err) => Failure::Config(err),
        other => Failure::Runtime(other.into()),
    })?;
    let ready_ms = started.elapsed().as_millis();
    println!("leasehold dev: ready in {ready_ms} ms");
    print!("{}", cluster.banner());
    // A second Ctrl-C while draining means "now".
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            shutdown.cancelled().await;
            println!("leasehold dev: draining…");
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("leasehold dev: second interrupt, exiting without draining");
                std::process::exit(130);
            }
        }
    });
    match cluster.run_until(shutdown).await {
        Some(audit) => println!("{audit}"),
        None => println!(
            "sink check: skipped (Redis sink; read leasehold:sink:* with redis-cli XRANGE)"
        ),
    }
    Ok(())
}
