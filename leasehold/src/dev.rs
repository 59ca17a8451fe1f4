//! `leasehold dev`: the whole cluster in one process on embedded backends.
//!
//! The same code as production, wired in one process: the feed simulator, N
//! stream workers (each with its own sidecar on its own port), M broker pool
//! workers with the paper broker, a synthetic order flow, the pool manager and
//! maintenance loops, and the dashboard. The lease store, the sink and the pool
//! bus are the in-memory backends that pass the same conformance suites as
//! DynamoDB and Redis; `--dynamodb-endpoint` and `--redis-url` swap in the real
//! ones. `--chaos` crashes, pauses and rolls workers so takeovers, fencing and
//! pool refills show on the dashboard. Ctrl-C drains everything, then checks
//! every sink stream for gaps and duplicates.

mod chaos;
mod pool;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use leasehold_control::clock::{Clock, SystemClock};
use leasehold_control::config::fixed_lookup;
use leasehold_control::keeper::LeaseKeeper;
use leasehold_control::store::LeaseStore;
use leasehold_control::store::dynamodb::{DynamoLeaseStore, TableCreation};
use leasehold_control::store::memory::MemoryLeaseStore;
use leasehold_control::telemetry::LogSink;
use leasehold_control::transport::BufferedShipper;
use leasehold_dashboard::pool::BusReader;
use leasehold_dashboard::sidecars::SidecarTarget;
use leasehold_dashboard::{CollectorSettings, Dashboard, DashboardConfig, Sources};
use leasehold_sidecar::observer::ObserverConfig;
use leasehold_sidecar::{Sidecar, SidecarConfig};
use leasehold_worker::broker::bus::memory::MemoryPoolBus;
use leasehold_worker::broker::bus::redis::RedisPoolBus;
use leasehold_worker::broker::bus::{BusConnector, PoolBus};
use leasehold_worker::feed::{FeedConfig, FeedServer};
use leasehold_worker::sink::memory::MemorySink;
use leasehold_worker::sink::redis::RedisSink;
use leasehold_worker::sink::{FencedSink, SinkOptions};
use leasehold_worker::stream::settings;
use leasehold_worker::stream::worker::StreamWorker;
use tokio_util::sync::CancellationToken;

use crate::Failure;
use crate::stream::shutdown_on_signal;
use chaos::{Gate, GatedSink, GatedStore};

/// `leasehold dev`: sizes and backends.
#[derive(Debug, Args)]
pub struct DevArgs {
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
    #[arg(long, default_value_t = 6)]
    lease_seconds: u64,
    /// Dashboard address (loopback).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Crash, pause and roll workers periodically.
    #[arg(long)]
    chaos: bool,
    /// Seconds between chaos actions.
    #[arg(long, default_value_t = 8)]
    chaos_every: u64,
    /// Use this DynamoDB-compatible endpoint (table `leasehold-dev`) instead of the in-memory store.
    #[arg(long)]
    dynamodb_endpoint: Option<String>,
    /// Use this Redis for the sink and the pool bus instead of the in-memory ones.
    #[arg(long)]
    redis_url: Option<String>,
}

/// One stream-worker slot: a fixed sidecar, and the worker that currently runs in it.
pub(crate) struct Slot {
    pub(crate) index: usize,
    pub(crate) sidecar: Sidecar,
    pub(crate) generation: usize,
    pub(crate) running: Option<RunningWorker>,
}

/// A stream worker running in a slot.
pub(crate) struct RunningWorker {
    pub(crate) owner_id: String,
    pub(crate) gate: Gate,
    pub(crate) shutdown: CancellationToken,
    pub(crate) task: tokio::task::JoinHandle<()>,
}

/// What every stream worker shares.
pub(crate) struct StreamShared {
    pub(crate) store: Arc<dyn LeaseStore>,
    pub(crate) sink: Arc<dyn FencedSink>,
    pub(crate) lookup_pairs: Vec<(String, String)>,
}

impl StreamShared {
    /// Starts a worker in `slot` under a fresh owner id.
    pub(crate) fn start(&self, slot: &mut Slot) -> anyhow::Result<()> {
        slot.generation += 1;
        let owner_id = format!("worker-{}-g{}", slot.index + 1, slot.generation);
        let mut pairs: Vec<(&str, &str)> = self
            .lookup_pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let telemetry_addr = slot.sidecar.telemetry_addr.to_string();
        pairs.push(("OWNER_ID", &owner_id));
        pairs.push(("TELEMETRY_ADDR", &telemetry_addr));
        let settings = settings::parse(&fixed_lookup(&pairs))
            .map_err(|err| anyhow::anyhow!("dev settings: {err}"))?;
        let gate = Gate::default();
        let shutdown = CancellationToken::new();
        let telemetry_stop = CancellationToken::new();
        let telemetry = Arc::new(BufferedShipper::start(
            settings.shipper(),
            telemetry_stop.clone(),
        ));
        let worker = StreamWorker::from_settings(
            &settings,
            Arc::new(GatedStore::new(self.store.clone(), gate.clone())),
            Arc::new(GatedSink::new(self.sink.clone(), gate.clone())),
            telemetry.clone(),
            Arc::new(SystemClock),
        );
        let task = tokio::spawn({
            let shutdown = shutdown.clone();
            let owner_id = owner_id.clone();
            async move {
                match worker.run(shutdown).await {
                    Ok(report) => tracing::info!(
                        owner_id,
                        released = report.released.len(),
                        "stream worker stopped"
                    ),
                    Err(err) => tracing::warn!(owner_id, error = %err, "stream worker ended"),
                }
                crate::stream::flush_telemetry(&telemetry).await;
                telemetry_stop.cancel();
            }
        });
        slot.running = Some(RunningWorker {
            owner_id,
            gate,
            shutdown,
            task,
        });
        Ok(())
    }
}

/// Runs the embedded cluster until Ctrl-C.
pub async fn dev(args: DevArgs) -> Result<(), Failure> {
    let started = Instant::now();
    if !args.listen.ip().is_loopback() {
        return Err(Failure::Config(leasehold_control::config::ConfigError {
            problems: vec![format!(
                "--listen: {} is not a loopback address (dev has no token; use `leasehold dashboard` to serve beyond this host)",
                args.listen
            )],
        }));
    }
    let shutdown = shutdown_on_signal();
    let background = CancellationToken::new();

    // Backends.
    let store: Arc<dyn LeaseStore> = match &args.dynamodb_endpoint {
        None => Arc::new(MemoryLeaseStore::new()),
        Some(endpoint) => {
            let config = local_sdk_config(endpoint).await;
            let store = DynamoLeaseStore::from_sdk_config(&config, "leasehold-dev".to_owned());
            let created: TableCreation = store
                .create_table()
                .await
                .context("cannot create the dev lease table")?;
            tracing::info!(?created, "dev lease table");
            Arc::new(store)
        }
    };
    // Bounded, so a dev left running for days does not grow without end; the
    // audit checks that what is kept is contiguous.
    let sink_options = SinkOptions {
        dedup_window: 100_000,
        max_len: 20_000,
    };
    let memory_sink = Arc::new(MemorySink::new(sink_options));
    let (sink, bus): (Arc<dyn FencedSink>, Arc<dyn PoolBus>) = match &args.redis_url {
        None => (memory_sink.clone(), Arc::new(MemoryPoolBus::new())),
        Some(url) => (
            Arc::new(
                RedisSink::connect(url, sink_options)
                    .await
                    .context("cannot open the Redis sink")?,
            ),
            Arc::new(
                RedisPoolBus::connect(url)
                    .await
                    .context("cannot open the Redis pool bus")?,
            ),
        ),
    };

    // The upstream.
    let feed = FeedServer::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        FeedConfig {
            rate: args.rate,
            retention: 1_000_000,
            backlog: 0,
        },
        background.clone(),
    )
    .await
    .context("cannot start the feed simulator")?;
    let now = SystemClock.now_ms();
    let stream_ids: Vec<String> = (1..=args.streams)
        .map(|i| format!("stream-{i:03}"))
        .collect();
    for stream in &stream_ids {
        store.register(stream, now).await?;
    }

    // Stream workers, one sidecar per slot; the first sidecar also observes the cluster.
    let lease_seconds = args.lease_seconds.max(3).to_string();
    let shared = Arc::new(StreamShared {
        store: store.clone(),
        sink: sink.clone(),
        lookup_pairs: vec![
            ("UPSTREAM_URL".into(), feed.url()),
            ("SINK_URL".into(), "memory:".into()),
            ("LEASE_SECONDS".into(), lease_seconds),
            ("DISCOVERY_INTERVAL_MS".into(), "1000".into()),
            ("DRAIN_TIMEOUT_MS".into(), "5000".into()),
        ],
    });
    let mut slots = Vec::with_capacity(args.workers.max(1));
    for index in 0..args.workers.max(1) {
        let mut config = SidecarConfig::loopback();
        if index == 0 {
            config.observer = Some(ObserverConfig {
                keeper: LeaseKeeper::new(
                    store.clone(),
                    Arc::new(SystemClock),
                    Arc::new(LogSink),
                    leasehold_control::config::lease_settings(&fixed_lookup(&[
                        ("OWNER_ID", "dev-observer"),
                        ("LEASE_SECONDS", "6"),
                    ]))?
                    .keeper,
                ),
                clock: Arc::new(SystemClock),
                interval: Duration::from_secs(2),
                pool: Some(Arc::new(BusConnector::ready(bus.clone()))),
            });
        }
        let sidecar = Sidecar::start(config, background.clone())
            .await
            .context("cannot start a sidecar")?;
        let mut slot = Slot {
            index,
            sidecar,
            generation: 0,
            running: None,
        };
        shared.start(&mut slot)?;
        slots.push(slot);
    }

    // The broker pool: its own sidecar, the pool manager, maintenance and the order flow.
    let pool_sidecar = Sidecar::start(SidecarConfig::loopback(), background.clone())
        .await
        .context("cannot start the pool sidecar")?;
    let pool_runtime = pool::PoolRuntime::start(
        bus.clone(),
        pool_sidecar.telemetry_addr.to_string(),
        args.pool,
        args.users,
        background.clone(),
    )
    .await?;

    // The dashboard.
    let mut targets: Vec<SidecarTarget> = slots
        .iter()
        .map(|slot| sidecar_target(slot.sidecar.http_addr))
        .collect();
    targets.push(sidecar_target(pool_sidecar.http_addr));
    let dashboard = Dashboard::start(
        DashboardConfig {
            listen: args.listen,
            token: None,
            sources: Sources {
                leases: store.clone(),
                pool: Some(Arc::new(BusReader::new(BusConnector::ready(bus.clone())))),
                sidecars: targets,
            },
            settings: CollectorSettings {
                refresh: Duration::from_secs(1),
                ..CollectorSettings::default()
            },
            clock: Arc::new(SystemClock),
        },
        background.clone(),
    )
    .await
    .map_err(|err| Failure::Runtime(err.into()))?;

    println!(
        "leasehold dev: ready in {} ms",
        started.elapsed().as_millis()
    );
    println!("  dashboard     http://{}/", dashboard.addr);
    println!(
        "  feed          {} ({} streams at {}/s)",
        feed.url(),
        args.streams,
        args.rate
    );
    for slot in &slots {
        println!(
            "  sidecar {}     http://{}/metrics  http://{}/status",
            slot.index + 1,
            slot.sidecar.http_addr,
            slot.sidecar.http_addr
        );
    }
    println!(
        "  pool sidecar  http://{}/metrics  (all broker workers)",
        pool_sidecar.http_addr
    );
    println!(
        "  backends      lease store: {}, sink and pool bus: {}",
        if args.dynamodb_endpoint.is_some() {
            "DynamoDB"
        } else {
            "in-memory"
        },
        if args.redis_url.is_some() {
            "Redis"
        } else {
            "in-memory"
        }
    );
    if args.chaos {
        println!(
            "  chaos         every {} s: crash, pause or roll a worker",
            args.chaos_every
        );
    }
    println!("Ctrl-C drains everything and checks the sink.");

    let slots = Arc::new(tokio::sync::Mutex::new(slots));
    let chaos = args.chaos.then(|| {
        tokio::spawn(chaos::run(
            slots.clone(),
            shared.clone(),
            pool_runtime.clone(),
            Duration::from_secs(args.chaos_every.max(1)),
            Duration::from_secs(args.lease_seconds.max(3)),
            background.clone(),
        ))
    });

    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = pool_runtime.maintenance() => {}
    }
    println!("leasehold dev: draining…");
    if let Some(chaos) = chaos {
        chaos.abort();
    }
    pool_runtime.stop().await;
    // A second Ctrl-C while draining means "now".
    tokio::spawn(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("leasehold dev: second interrupt, exiting without draining");
            std::process::exit(130);
        }
    });
    // Every worker drains at once: one after another, the last would inherit
    // and drain everything the others released.
    let mut slots = slots.lock().await;
    let draining: Vec<_> = slots
        .iter_mut()
        .filter_map(|slot| slot.running.take())
        .map(|running| {
            running.gate.open();
            running.shutdown.cancel();
            running.task
        })
        .collect();
    let _ = tokio::time::timeout(
        Duration::from_secs(10),
        futures_util::future::join_all(draining),
    )
    .await;
    let report = match &args.redis_url {
        None => Some(chaos::audit(&memory_sink, &stream_ids)),
        Some(_) => None,
    };
    match report {
        Some(audit) => println!(
            "sink check: {} streams, {} events, {} gaps, {} duplicates, {} token regressions",
            audit.streams, audit.events, audit.gaps, audit.duplicates, audit.token_regressions
        ),
        None => println!(
            "sink check: skipped (Redis sink; read leasehold:sink:* with redis-cli XRANGE)"
        ),
    }
    background.cancel();
    dashboard.finished().await;
    feed.finished().await;
    Ok(())
}

fn sidecar_target(addr: SocketAddr) -> SidecarTarget {
    SidecarTarget {
        host: addr.ip().to_string(),
        port: addr.port(),
    }
}

/// The lease store's usual SDK configuration (its timeouts and retry policy),
/// pointed at `endpoint`; a local server accepts any credentials and region,
/// so placeholders fill in what the environment does not give.
async fn local_sdk_config(endpoint: &str) -> aws_config::SdkConfig {
    use aws_sdk_dynamodb::config::{Credentials, Region, SharedCredentialsProvider};
    let base = leasehold_control::store::dynamodb::load_sdk_config().await;
    let mut builder = base.to_builder().endpoint_url(endpoint);
    // The default chain is always present, credentials or not: ask the environment.
    if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
        builder = builder.credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "dev",
            "dev",
            None,
            None,
            "leasehold-dev",
        )));
    }
    if base.region().is_none() {
        builder = builder.region(Region::new("us-east-1"));
    }
    builder.build()
}
