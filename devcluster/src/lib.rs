//! The whole leasehold cluster in one process, for `leasehold dev`.
//!
//! The same code as production, wired in one process: the feed simulator, N
//! stream workers (each with its own sidecar on its own port), M broker pool
//! workers with the paper broker, a synthetic order flow, the pool manager and
//! maintenance loops, and the dashboard. The lease store, the sink and the pool
//! bus are the in-memory backends that pass the same conformance suites as
//! DynamoDB and Redis; a DynamoDB endpoint and a Redis URL swap in the real
//! ones. Chaos crashes, pauses and rolls workers so takeovers, fencing and pool
//! refills show on the dashboard. Stopping drains everything, then checks every
//! sink stream for gaps and duplicates.
//!
//! Module map:
//! - `gate`: fault gates around a worker's store and sink (crash, pause).
//! - `chaos`: the chaos loop that uses them.
//! - `launcher`: broker workers as tasks of this process.
//! - `pool`: the pool manager and maintenance loops and the order flow.
//! - [`audit`]: the sink check printed at the end.
//! - `banner`: what `leasehold dev` prints once the cluster is up
//!   ([`DevCluster::banner`]).
//! - [`fleet`]: stream workers alone on silent upstreams, for balancing tests
//!   and the lease-moves and fleet-scale benchmarks.
//! - [`meter`]: DynamoDB-like latency and the capacity units of each store
//!   call, for the fleet-scale simulation's cost.

pub mod audit;
mod banner;
mod chaos;
pub mod fleet;
mod gate;
mod launcher;
pub mod meter;
mod pool;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use leasehold_control::clock::{Clock, SystemClock};
use leasehold_control::keeper::LeaseKeeper;
use leasehold_control::mode::{self, ModeError};
use leasehold_control::pacing::ScanPacing;
use leasehold_control::settings::{LeaseMode, lease_settings};
use leasehold_control::store::LeaseStore;
use leasehold_control::store::dynamodb::DynamoLeaseStore;
use leasehold_control::store::memory::MemoryLeaseStore;
use leasehold_dashboard::sources::sidecars::SidecarTarget;
use leasehold_dashboard::{CollectorSettings, Dashboard, DashboardConfig, Sources};
use leasehold_feed::exchange::{ExchangeConfig, ExchangeServer, ExchangeShape};
use leasehold_feed::{FeedConfig, FeedServer};
use leasehold_platform::aws::{RetryPolicy, local_sdk_config};
use leasehold_platform::settings::{ConfigError, Env, fixed_lookup};
use leasehold_pool::bus::memory::MemoryPoolBus;
use leasehold_pool::bus::redis::RedisPoolBus;
use leasehold_pool::bus::{BusConnector, PoolBus};
use leasehold_sidecar::observer::ObserverConfig;
use leasehold_sidecar::{Sidecar, SidecarConfig};
use leasehold_sink::memory::MemorySink;
use leasehold_sink::redis::RedisSink;
use leasehold_sink::{FencedSink, SinkOptions};
use leasehold_stream::settings;
use leasehold_stream::worker::DiscoveryMode;
use leasehold_stream::worker::StreamWorker;
use leasehold_telemetry::LogSink;
use leasehold_telemetry::transport::BufferedShipper;
use tokio_util::sync::CancellationToken;

use audit::Audit;
use gate::{Gate, GatedSink, GatedStore};

/// Why the dev cluster could not start. Messages never hold a URL.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    /// An option or a derived setting is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A part of the cluster could not be started.
    #[error("cannot start {what}: {reason}")]
    Start {
        /// Which part.
        what: &'static str,
        /// Why (the part's own error, without secrets).
        reason: String,
    },
}

fn start_error<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> DevError {
    move |err| DevError::Start {
        what,
        reason: err.to_string(),
    }
}

/// Sizes and backends of the dev cluster.
#[derive(Debug, Clone)]
pub struct DevOptions {
    /// Streams served by the feed simulator.
    pub streams: usize,
    /// Stream workers (each with its own sidecar).
    pub workers: usize,
    /// Warm pool size the pool manager keeps.
    pub pool: usize,
    /// Users of the synthetic order flow.
    pub users: usize,
    /// Events per second per stream.
    pub rate: f64,
    /// Lease duration (short, so takeovers are quick to watch; at least 3 s).
    pub lease: Duration,
    /// Dashboard address (loopback only: dev has no token).
    pub listen: SocketAddr,
    /// Crash, pause or roll a worker this often.
    pub chaos_every: Option<Duration>,
    /// A DynamoDB-compatible endpoint (table `leasehold-dev`) instead of the in-memory store.
    pub dynamodb_endpoint: Option<String>,
    /// A Redis for the sink and the pool bus instead of the in-memory ones.
    pub redis_url: Option<String>,
    /// What the stream workers read.
    pub feed: DevFeed,
    /// How the stream workers hold leases (`LEASE_MODE`).
    pub lease_mode: LeaseMode,
    /// How the stream workers find streams (`DISCOVERY_MODE`).
    pub discovery_mode: DiscoveryMode,
}

/// The upstream `dev` runs (`--feed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DevFeed {
    /// Our feed simulator: replays from any sequence (`UPSTREAM_RESUME=replay`).
    #[default]
    Simulator,
    /// A Binance-shaped fake exchange: live start, no replay, a REST history
    /// that keeps only the newest trades, connections cut every 20 s; the
    /// workers backfill short holes and record longer ones (a crash's
    /// takeover) as gap markers.
    Exchange,
    /// A Binance-shaped depth stream per symbol (`UPSTREAM_RESUME=snapshot`):
    /// order books from REST snapshots plus diffs, connections cut every
    /// 20 s; each cut is a resync whose snapshot entry names what it replaced.
    Book,
}

impl std::str::FromStr for DevFeed {
    type Err = String;

    /// `--feed`: `simulator`, `exchange` or `book`.
    fn from_str(raw: &str) -> Result<Self, String> {
        match raw {
            "simulator" => Ok(DevFeed::Simulator),
            "exchange" => Ok(DevFeed::Exchange),
            "book" => Ok(DevFeed::Book),
            _ => Err("must be simulator, exchange or book".into()),
        }
    }
}

/// Trades the dev exchange's history keeps per symbol: a reconnect's hole is
/// backfilled, a crash takeover's (a lease and more) mostly outlives it.
const DEV_EXCHANGE_HISTORY: u64 = 25;
/// How often the dev exchange cuts each connection.
const DEV_EXCHANGE_CUT_EVERY: Duration = Duration::from_secs(20);

/// The running upstream.
enum Upstream {
    Simulator(FeedServer),
    Exchange(ExchangeServer),
}

impl Upstream {
    async fn start(
        options: &DevOptions,
        shutdown: CancellationToken,
    ) -> Result<(Upstream, Vec<(String, String)>), DevError> {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        Ok(match options.feed {
            DevFeed::Simulator => {
                let feed = FeedServer::start(
                    addr,
                    FeedConfig {
                        rate: options.rate,
                        retention: 1_000_000,
                        backlog: 0,
                    },
                    shutdown,
                )
                .await
                .map_err(start_error("the feed simulator"))?;
                let settings = vec![
                    (settings::UPSTREAM_URL.name.to_owned(), feed.url()),
                    (
                        settings::UPSTREAM_TS_POINTER.name.to_owned(),
                        "/ts_ms".into(),
                    ),
                ];
                (Upstream::Simulator(feed), settings)
            }
            DevFeed::Exchange | DevFeed::Book => {
                let shape = match options.feed {
                    DevFeed::Book => ExchangeShape::BinanceDepth,
                    _ => ExchangeShape::BinanceTrade,
                };
                let exchange = ExchangeServer::start(
                    addr,
                    ExchangeConfig {
                        shape,
                        rate: options.rate,
                        history_retention: DEV_EXCHANGE_HISTORY,
                        cut_every: Some(DEV_EXCHANGE_CUT_EVERY),
                        ..ExchangeConfig::default()
                    },
                    shutdown,
                )
                .await
                .map_err(start_error("the fake exchange"))?;
                let settings = exchange
                    .worked_settings()
                    .into_iter()
                    .map(|(name, value)| (name.to_owned(), value))
                    .collect();
                (Upstream::Exchange(exchange), settings)
            }
        })
    }

    /// What `dev` prints as the feed's address.
    fn url(&self) -> String {
        match self {
            Upstream::Simulator(feed) => feed.url(),
            Upstream::Exchange(exchange) => exchange.ws_url(),
        }
    }

    async fn finished(self) {
        match self {
            Upstream::Simulator(feed) => feed.finished().await,
            Upstream::Exchange(exchange) => exchange.finished().await,
        }
    }
}

/// Where the running cluster can be reached.
#[derive(Debug, Clone)]
pub struct DevAddresses {
    /// The dashboard.
    pub dashboard: SocketAddr,
    /// The upstream's WebSocket URL (the simulator's, or the fake exchange's
    /// template with `{stream_id}`).
    pub feed: String,
    /// Each stream worker's sidecar (`/metrics`, `/status`).
    pub sidecars: Vec<SocketAddr>,
    /// The broker pool's shared sidecar.
    pub pool_sidecar: SocketAddr,
}

/// A running dev cluster.
pub struct DevCluster {
    /// Where its parts listen.
    pub addresses: DevAddresses,
    options: DevOptions,
    slots: Arc<tokio::sync::Mutex<Vec<Slot>>>,
    shared: Arc<StreamShared>,
    pool: Arc<pool::PoolRuntime>,
    memory_sink: Arc<MemorySink>,
    stream_ids: Vec<String>,
    dashboard: Dashboard,
    feed: Upstream,
    background: CancellationToken,
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
    pub(crate) fn start(&self, slot: &mut Slot) -> Result<(), DevError> {
        slot.generation += 1;
        let owner_id = format!("worker-{}-g{}", slot.index + 1, slot.generation);
        let mut pairs: Vec<(&str, &str)> = self
            .lookup_pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let telemetry_addr = slot.sidecar.telemetry_addr.to_string();
        pairs.push((leasehold_control::settings::OWNER_ID.name, &owner_id));
        pairs.push((
            leasehold_telemetry::settings::TELEMETRY_ADDR.name,
            &telemetry_addr,
        ));
        // The presence record names this slot's sidecar (loopback: `dev` only).
        let sidecar_url = format!("http://{}", slot.sidecar.http_addr);
        pairs.push((
            leasehold_telemetry::settings::SIDECAR_URL.name,
            &sidecar_url,
        ));
        let settings = settings::parse(&fixed_lookup(&pairs))?;
        let gate = Gate::default();
        let shutdown = CancellationToken::new();
        let telemetry_stop = CancellationToken::new();
        let telemetry = Arc::new(BufferedShipper::start(
            settings.shipper.clone(),
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
                telemetry.flush(Duration::from_millis(500)).await;
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

impl DevCluster {
    /// Starts every part; `background` stops them all.
    pub async fn start(options: DevOptions) -> Result<DevCluster, DevError> {
        if !options.listen.ip().is_loopback() {
            return Err(DevError::Config(ConfigError::one(format!(
                "--listen: {} is not a loopback address (dev has no token; use `leasehold dashboard` to serve beyond this host)",
                options.listen
            ))));
        }
        let background = CancellationToken::new();

        // Backends.
        let store: Arc<dyn LeaseStore> = match &options.dynamodb_endpoint {
            None => Arc::new(MemoryLeaseStore::new()),
            Some(endpoint) => {
                let config = local_sdk_config(RetryPolicy::CallerRetries, endpoint);
                let store = DynamoLeaseStore::from_sdk_config(&config, "leasehold-dev".to_owned());
                let created = store
                    .create_table()
                    .await
                    .map_err(start_error("the dev lease table"))?;
                tracing::info!(?created, "dev lease table");
                Arc::new(store)
            }
        };
        // A persistent dev table keeps the mode its first run declared.
        match mode::declare(store.as_ref(), options.lease_mode, SystemClock.now_ms()).await {
            Err(err @ ModeError::Mismatch { .. }) => {
                return Err(DevError::Config(ConfigError::one(format!(
                    "--lease-mode: {err}"
                ))));
            }
            other => other.map_err(start_error("the lease mode"))?,
        }
        // Bounded, so a dev left running for days does not grow without end; the
        // audit checks that what is kept is contiguous.
        let sink_options = SinkOptions {
            max_len: 20_000,
            ..SinkOptions::default()
        };
        let memory_sink = Arc::new(MemorySink::new(sink_options));
        type Shared = (
            Arc<dyn FencedSink>,
            Arc<dyn PoolBus>,
            Arc<dyn leasehold_dashboard::sources::sink::SinkReader>,
        );
        let (sink, bus, dashboard_sink): Shared = match &options.redis_url {
            None => (
                memory_sink.clone(),
                Arc::new(MemoryPoolBus::new()),
                Arc::new(leasehold_sink::reader::MemorySinkReader(
                    memory_sink.clone(),
                )),
            ),
            Some(url) => {
                let redis_sink = RedisSink::connect(url, sink_options)
                    .await
                    .map_err(start_error("the Redis sink"))?;
                // The broker pool needs one primary (docs/redis.md): on a
                // Redis Cluster only the sink runs there.
                let bus: Arc<dyn PoolBus> = match leasehold_sink::url::SinkUrl::parse(url) {
                    Ok(leasehold_sink::url::SinkUrl::RedisCluster(_)) => {
                        tracing::info!(
                            "Redis Cluster: the sink runs on it, the broker pool in memory (it needs one primary)"
                        );
                        Arc::new(MemoryPoolBus::new())
                    }
                    _ => Arc::new(
                        RedisPoolBus::connect(url)
                            .await
                            .map_err(start_error("the Redis pool bus"))?,
                    ),
                };
                (
                    Arc::new(redis_sink.clone()),
                    bus,
                    Arc::new(leasehold_sink::reader::RedisSinkReader::connected(
                        redis_sink,
                    )),
                )
            }
        };

        // The upstream.
        let (feed, upstream_settings) = Upstream::start(&options, background.clone()).await?;
        let now = SystemClock.now_ms();
        let stream_ids: Vec<String> = (1..=options.streams)
            .map(|i| match options.feed {
                DevFeed::Simulator => format!("stream-{i:03}"),
                // Exchange symbols: lower case in the stream URL, upper in REST.
                DevFeed::Exchange | DevFeed::Book => format!("sym{i:03}usdt"),
            })
            .collect();
        for stream in &stream_ids {
            store
                .register(stream, now)
                .await
                .map_err(start_error("stream registration"))?;
        }

        // Stream workers, one sidecar per slot; the first sidecar also observes the cluster.
        let lease = options.lease.max(Duration::from_secs(3));
        let shared = Arc::new(StreamShared {
            store: store.clone(),
            sink: sink.clone(),
            lookup_pairs: upstream_settings
                .into_iter()
                .chain([
                    ("SINK_URL".into(), "memory:".into()),
                    ("LEASE_SECONDS".into(), lease.as_secs().to_string()),
                    ("LEASE_MODE".into(), options.lease_mode.as_str().into()),
                    (
                        "DISCOVERY_MODE".into(),
                        options.discovery_mode.as_str().into(),
                    ),
                    ("DISCOVERY_INTERVAL_MS".into(), "1000".into()),
                    ("DRAIN_TIMEOUT_MS".into(), "5000".into()),
                ])
                .collect(),
        });
        let mut slots = Vec::with_capacity(options.workers.max(1));
        for index in 0..options.workers.max(1) {
            let mut config = SidecarConfig::loopback();
            if index == 0 {
                let lookup = fixed_lookup(&[("OWNER_ID", "dev-observer"), ("LEASE_SECONDS", "6")]);
                let mut env = Env::new(&lookup);
                let observer_lease = lease_settings(&mut env);
                env.finish(())?;
                config.observer = Some(ObserverConfig {
                    keeper: LeaseKeeper::new(
                        store.clone(),
                        Arc::new(SystemClock),
                        Arc::new(LogSink),
                        observer_lease.keeper,
                    ),
                    clock: Arc::new(SystemClock),
                    pacing: ScanPacing::new(Duration::from_secs(2), 500),
                    pool: Some(Arc::new(BusConnector::ready(bus.clone()))),
                });
            }
            let sidecar = Sidecar::start(config, background.clone())
                .await
                .map_err(start_error("a sidecar"))?;
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
            .map_err(start_error("the pool sidecar"))?;
        let pool = pool::PoolRuntime::start(
            bus.clone(),
            pool_sidecar.telemetry_addr.to_string(),
            options.pool,
            options.users,
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
                listen: options.listen,
                token: None,
                access: leasehold_dashboard::Access::new(options.listen, false, false, Vec::new()),
                sources: Sources {
                    leases: store.clone(),
                    pool: Some(Arc::new(BusConnector::ready(bus.clone()))),
                    sidecars: targets,
                    discovery: leasehold_dashboard::sources::sidecars::DiscoveryPolicy::dev(),
                },
                settings: CollectorSettings {
                    refresh: Duration::from_secs(1),
                    // Trends a newcomer can watch move: 5 s points (2 h of
                    // cluster history, 5 min per stream).
                    trend_resolution: Duration::from_secs(5),
                    ..CollectorSettings::default()
                },
                clock: Arc::new(SystemClock),
                // The page's "sink last seq" reads the very sink the workers write.
                sink: Some(dashboard_sink),
                grafana: None,
            },
            background.clone(),
        )
        .await
        .map_err(start_error("the dashboard"))?;

        Ok(DevCluster {
            addresses: DevAddresses {
                dashboard: dashboard.addr,
                feed: feed.url(),
                sidecars: slots.iter().map(|slot| slot.sidecar.http_addr).collect(),
                pool_sidecar: pool_sidecar.http_addr,
            },
            slots: Arc::new(tokio::sync::Mutex::new(slots)),
            shared,
            pool,
            memory_sink,
            stream_ids,
            dashboard,
            feed,
            background,
            options,
        })
    }

    /// Runs (with chaos when asked) until `shutdown`, then drains every worker
    /// at once and audits the in-memory sink (`None` with a Redis sink).
    pub async fn run_until(self, shutdown: CancellationToken) -> Option<Audit> {
        let chaos = self.options.chaos_every.map(|every| {
            tokio::spawn(chaos::run(
                self.slots.clone(),
                self.shared.clone(),
                self.pool.clone(),
                every.max(Duration::from_secs(1)),
                self.options.lease.max(Duration::from_secs(3)),
                self.background.clone(),
            ))
        });
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = self.pool.maintenance() => {}
        }
        if let Some(chaos) = chaos {
            chaos.abort();
        }
        self.pool.stop().await;
        // Every worker drains at once: one after another, the last would inherit
        // and drain everything the others released.
        let mut slots = self.slots.lock().await;
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
        let audit = self.options.redis_url.is_none().then(|| {
            audit::audit(
                &self.memory_sink,
                &self.stream_ids,
                self.options.feed == DevFeed::Book,
            )
        });
        self.background.cancel();
        self.dashboard.finished().await;
        self.feed.finished().await;
        audit
    }
}

fn sidecar_target(addr: SocketAddr) -> SidecarTarget {
    SidecarTarget {
        host: addr.ip().to_string(),
        port: addr.port(),
    }
}
