//! A fleet of in-process stream workers on one in-memory lease table, with
//! silent upstreams and a crash gate per worker: the production worker's
//! discovery, fair share, hand-back and expiry probes, with nothing else
//! running. Balancing tests (`tests/it/balance.rs`) and the lease-moves benchmark
//! (`benches/balance.rs`) drive it, usually on tokio's paused clock, where a
//! minute of discovery takes milliseconds and every lease move is counted
//! exactly (each acquire raises a stream's fence token by one).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_control::clock::Clock;
use leasehold_control::keeper::{KeeperConfig, LeaseKeeper};
use leasehold_control::lease::LeaseState;
use leasehold_control::read::LeaseTable;
use leasehold_control::settings::LeaseMode;
use leasehold_control::store::intercept::Intercepted;
use leasehold_control::store::memory::MemoryLeaseStore;
use leasehold_control::store::{Consistency, LeaseError, LeaseStore};
use leasehold_sink::memory::MemorySink;
use leasehold_sink::{FencedSink, SinkOptions};
use leasehold_stream::handoff::{HandoffSocket, InProcessNet};
use leasehold_stream::upstream::{Subscription, Upstream, UpstreamError, UpstreamEvent};
use leasehold_stream::worker::DiscoveryMode;
use leasehold_stream::{RunnerConfig, RunnerContext, StreamWorker, StreamWorkerConfig};
use leasehold_telemetry::LogSink;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::gate::{Gate, GatedSink, GatedStore};
use crate::meter::{Meter, Units};

/// The fleet's timings; the defaults are the production ones.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// Streams registered in the table.
    pub streams: usize,
    /// Lease duration (renewed every third of it).
    pub lease: Duration,
    /// `DISCOVERY_INTERVAL_MS`.
    pub discovery_interval: Duration,
    /// `HANDOFF_POLL_MS`.
    pub handoff_poll: Duration,
    /// `LEASE_MODE`.
    pub mode: LeaseMode,
    /// DynamoDB-like latency on every store call (p50 5 ms, p99 20 ms).
    pub store_latency: bool,
    /// `DISCOVERY_MODE`.
    pub discovery: DiscoveryMode,
    /// Every worker [`Fleet::start`] starts takes pushed hand-offs
    /// (`HANDOFF_LISTEN`), on the fleet's in-process network: on the paused
    /// clock a real datagram can arrive seconds late in simulated time when
    /// the host is busy.
    pub pushes: bool,
}

impl Default for FleetOptions {
    fn default() -> Self {
        let worker = StreamWorkerConfig::default();
        FleetOptions {
            streams: 100,
            lease: KeeperConfig::default().lease,
            discovery_interval: worker.discovery_interval,
            handoff_poll: worker.handoff_poll,
            mode: LeaseMode::PerStream,
            store_latency: false,
            discovery: DiscoveryMode::Scan,
            pushes: false,
        }
    }
}

struct Member {
    gate: Gate,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

/// What the table says right now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holdings {
    /// Valid stream leases per owner.
    pub held_by: BTreeMap<String, usize>,
    /// Streams nobody validly holds.
    pub unowned: usize,
    /// Sum of every stream's fence token: the number of acquisitions so far.
    pub acquisitions: u64,
}

impl Holdings {
    /// Every stream held and every count within one of `streams / workers`
    /// among exactly `workers` owners.
    pub fn balanced(&self, streams: usize, workers: usize) -> bool {
        let least = streams / workers;
        self.unowned == 0
            && self.held_by.len() == workers
            && self
                .held_by
                .values()
                .all(|held| *held >= least && *held <= streams.div_ceil(workers))
    }
}

/// In-process stream workers sharing one table and one sink.
pub struct Fleet {
    /// The table, metered: every worker's calls pass the meter.
    store: Arc<Intercepted<MemoryLeaseStore, Meter>>,
    sink: Arc<MemorySink>,
    clock: Arc<dyn Clock>,
    options: FleetOptions,
    members: BTreeMap<String, Member>,
    /// Where the workers' pushed hand-offs travel when `options.pushes`.
    net: InProcessNet,
}

impl Fleet {
    /// A table with `options.streams` streams (`s000`, `s001`, …) and no worker.
    pub async fn new(options: FleetOptions, clock: Arc<dyn Clock>) -> Result<Fleet, LeaseError> {
        let table = Arc::new(MemoryLeaseStore::new());
        for index in 0..options.streams {
            table
                .register(&format!("s{index:03}"), clock.now_ms())
                .await?;
        }
        let meter = Meter::new(table.clone(), options.store_latency);
        let store = Arc::new(Intercepted::new(table, meter));
        Ok(Fleet {
            store,
            sink: Arc::new(MemorySink::new(SinkOptions::default())),
            clock,
            options,
            members: BTreeMap::new(),
            net: InProcessNet::default(),
        })
    }

    /// Starts a worker named `owner` that holds at most `max_streams`.
    pub fn start(&mut self, owner: &str, max_streams: usize) {
        let socket = self.options.pushes.then(|| self.net.socket());
        self.start_with(owner, max_streams, socket);
    }

    /// [`Fleet::start`] for a worker that takes pushed hand-offs on a UDP
    /// socket of its own (loopback); returns the socket's address.
    pub fn start_taking_pushes(
        &mut self,
        owner: &str,
        max_streams: usize,
    ) -> std::io::Result<std::net::SocketAddr> {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0")?;
        let addr = socket.local_addr()?;
        self.start_with(owner, max_streams, Some(HandoffSocket::new(socket, addr)?));
        Ok(addr)
    }

    fn start_with(&mut self, owner: &str, max_streams: usize, handoff: Option<HandoffSocket>) {
        let gate = Gate::default();
        let store: Arc<dyn LeaseStore> =
            Arc::new(GatedStore::new(self.store.clone(), gate.clone()));
        let sink: Arc<dyn FencedSink> = Arc::new(GatedSink::new(self.sink.clone(), gate.clone()));
        let keeper = LeaseKeeper::new(
            store,
            self.clock.clone(),
            Arc::new(LogSink),
            KeeperConfig {
                owner_id: owner.to_owned(),
                lease: self.options.lease,
                renew_interval: self.options.lease / 3,
                safety_margin: self.options.lease / 10,
                mode: self.options.mode,
                ..KeeperConfig::default()
            },
        );
        let context = Arc::new(RunnerContext {
            keeper,
            upstream: Arc::new(SilentUpstream),
            sink,
            history: None,
            telemetry: Arc::new(LogSink),
            config: RunnerConfig::default(),
        });
        let worker = StreamWorker::new(
            context,
            self.clock.clone(),
            StreamWorkerConfig {
                max_streams,
                discovery_interval: self.options.discovery_interval,
                handoff_poll: self.options.handoff_poll,
                discovery_mode: self.options.discovery,
                // Silent upstreams: a successor never holds a frame to
                // overlap from, so a drain would only wait for nothing.
                handoff_prepare_timeout: std::time::Duration::ZERO,
                ..StreamWorkerConfig::default()
            },
        );
        let worker = match handoff {
            Some(socket) => worker.with_handoff(socket),
            None => worker,
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                let _ = worker.run(shutdown).await;
            }
        });
        self.members.insert(
            owner.to_owned(),
            Member {
                gate,
                shutdown,
                task,
            },
        );
    }

    /// Crashes `owner`: every call it makes fails from now on, so nothing is
    /// released and its leases must expire.
    pub fn crash(&mut self, owner: &str) {
        if let Some(member) = self.members.remove(owner) {
            member.gate.fail();
            member.shutdown.cancel();
        }
    }

    /// Stops `owner` gracefully (drain, release, doorbell) and waits for it.
    pub async fn stop(&mut self, owner: &str) {
        if let Some(member) = self.members.remove(owner) {
            member.shutdown.cancel();
            let _ = member.task.await;
        }
    }

    /// Stops every worker gracefully.
    pub async fn stop_all(&mut self) {
        let owners: Vec<String> = self.members.keys().cloned().collect();
        for owner in owners {
            self.stop(&owner).await;
        }
    }

    /// Reads the table (around the meter), as every reader does: a
    /// session-mode stream is held while its session is.
    pub async fn holdings(&self) -> Result<Holdings, LeaseError> {
        self.view().holdings().await
    }

    /// Each stream's valid owner right now (`None`: nobody validly holds it).
    pub async fn owners(&self) -> Result<BTreeMap<String, Option<String>>, LeaseError> {
        self.view().owners().await
    }

    /// A reader of the table that borrows nothing of the fleet, so it can
    /// sample while the fleet's workers are started and stopped.
    pub fn view(&self) -> FleetView {
        FleetView {
            table: self.store.inner().clone(),
            clock: self.clock.clone(),
        }
    }

    /// Freezes the assignee index as it is (or lets it follow the table
    /// again): a lagging DynamoDB index.
    pub fn freeze_index(&self, frozen: bool) {
        self.store.inner().freeze_index(frozen);
    }

    /// What the workers' store calls have cost so far.
    pub fn units(&self) -> Units {
        self.store.interceptor().units()
    }
}

/// Reads a fleet's table (see [`Fleet::view`]).
#[derive(Clone)]
pub struct FleetView {
    table: Arc<MemoryLeaseStore>,
    clock: Arc<dyn Clock>,
}

impl FleetView {
    /// See [`Fleet::holdings`].
    pub async fn holdings(&self) -> Result<Holdings, LeaseError> {
        let now = self.clock.now_ms();
        let mut holdings = Holdings::default();
        for lease in self.streams().await? {
            holdings.acquisitions += lease.fence_token;
            match lease.owner_id {
                Some(owner) if lease.state(now) == LeaseState::Owned => {
                    *holdings.held_by.entry(owner).or_default() += 1;
                }
                _ => holdings.unowned += 1,
            }
        }
        Ok(holdings)
    }

    /// See [`Fleet::owners`].
    pub async fn owners(&self) -> Result<BTreeMap<String, Option<String>>, LeaseError> {
        let now = self.clock.now_ms();
        Ok(self
            .streams()
            .await?
            .into_iter()
            .map(|lease| {
                let held = lease.state(now) == LeaseState::Owned;
                (lease.stream_id, lease.owner_id.filter(|_| held))
            })
            .collect())
    }

    /// One record as stored (a reserved one too: the assigner lease).
    pub async fn record(&self, id: &str) -> Result<leasehold_control::lease::Lease, LeaseError> {
        use leasehold_control::store::LeaseReader;
        self.table.get(id).await
    }

    async fn streams(&self) -> Result<Vec<leasehold_control::lease::Lease>, LeaseError> {
        let table = LeaseTable::read(self.table.as_ref(), 1000, Consistency::Strong).await?;
        Ok(table.streams)
    }
}

/// An upstream that accepts every subscription and never sends: balancing is
/// about leases, and a quiet stream is the hardest case for fencing.
struct SilentUpstream;

struct SilentSubscription;

#[async_trait]
impl Upstream for SilentUpstream {
    async fn subscribe(
        &self,
        _stream_id: &str,
        _from_seq: u64,
    ) -> Result<Box<dyn Subscription>, UpstreamError> {
        Ok(Box::new(SilentSubscription))
    }
}

#[async_trait]
impl Subscription for SilentSubscription {
    async fn next(&mut self) -> Result<UpstreamEvent, UpstreamError> {
        std::future::pending().await
    }

    async fn close(&mut self) {}
}
