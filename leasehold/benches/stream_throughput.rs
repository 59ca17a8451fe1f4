//! End-to-end stream throughput against the raw WebSocket throughput of the same
//! feed, and the control-plane writes a steady stream costs.
//!
//! ```text
//! LEASEHOLD_BENCH_REDIS_URL=redis://127.0.0.1:6379 \
//!   cargo bench -p leasehold --bench stream_throughput -- [--events 200000]
//! ```
//! (`scripts/bench.sh` starts Redis and runs every benchmark.)
//!
//! 1. A `leasehold feed` process serves a backlog of N events per stream.
//! 2. Raw: a null client reads N frames over loopback (no parsing).
//! 3. End to end: one stream runner (upstream adapter → batching → Redis
//!    Streams sink via the Lua script, checkpoint staged for the renew) until the
//!    sink holds N events. CPU is this process's (the runner; the feed and Redis
//!    are other processes).
//! 4. Control plane: a stream worker with 8 streams on a counting in-memory
//!    store for 20 s (3 s lease, renew every 1 s): writes per stream per renew.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::{SinkExt, StreamExt};
use leasehold_control::clock::SystemClock;
use leasehold_control::keeper::{KeeperConfig, LeaseKeeper};
use leasehold_control::lease::Lease;
use leasehold_control::store::memory::MemoryLeaseStore;
use leasehold_control::store::{
    AcquireRequest, CheckpointRequest, Consistency, LeaseError, LeasePage, LeaseReader, LeaseStore,
    LiftRequest, ReleaseRequest, RenewRequest,
};
use leasehold_stream::sink::memory::MemorySink;
use leasehold_stream::sink::redis::RedisSink;
use leasehold_stream::sink::{FencedSink, SinkOptions};
use leasehold_stream::upstream::{WebSocketUpstream, WebSocketUpstreamConfig};
use leasehold_stream::{RunnerConfig, RunnerContext, StreamWorker, StreamWorkerConfig, run_stream};
use leasehold_telemetry::transport::{BufferedShipper, ShipperConfig};
use leasehold_telemetry::{LogSink, TelemetrySink};
use leasehold_testkit::measure::{arg, process_cpu_seconds};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

struct Feed {
    child: std::process::Child,
    url: String,
}

impl Drop for Feed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_feed(backlog: u64) -> Feed {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args([
            "feed",
            "--listen",
            "127.0.0.1:0",
            "--rate",
            "1",
            "--retention",
            &(backlog + 10).to_string(),
        ])
        .args(["--backlog", &backlog.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start leasehold feed");
    let stdout = child.stdout.take().expect("stdout");
    let line = std::io::BufReader::new(stdout)
        .lines()
        .next()
        .expect("feed prints its URL")
        .expect("read");
    let url = line.rsplit(' ').next().expect("url").to_owned();
    Feed { child, url }
}

async fn raw_throughput(url: &str, stream: &str, events: u64) -> f64 {
    let (mut socket, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("connect");
    let subscribe = format!(r#"{{"subscribe": "{stream}", "from_seq": 1}}"#);
    socket
        .send(Message::Text(subscribe.into()))
        .await
        .expect("subscribe");
    let started = Instant::now();
    let mut received = 0;
    while received < events {
        match socket.next().await {
            Some(Ok(Message::Text(_))) => received += 1,
            Some(Ok(_)) => {}
            other => panic!("feed ended early: {other:?}"),
        }
    }
    received as f64 / started.elapsed().as_secs_f64()
}

fn keeper(store: Arc<dyn LeaseStore>, owner: &str, lease: Duration) -> LeaseKeeper {
    LeaseKeeper::new(
        store,
        Arc::new(SystemClock),
        Arc::new(LogSink),
        KeeperConfig {
            owner_id: owner.into(),
            lease,
            renew_interval: lease / 3,
            safety_margin: lease / 10,
            skew_margin: Duration::from_millis(500),
            ..KeeperConfig::default()
        },
    )
}

/// Runs one stream runner from the feed into `sink` until `stored()` reaches
/// `events`; returns (events per wall second, events per CPU-second of this process).
async fn pipeline(
    url: &str,
    stream: &str,
    events: u64,
    sink: Arc<dyn FencedSink>,
    telemetry: Arc<dyn TelemetrySink>,
    stored: impl AsyncFn() -> u64,
) -> (f64, f64) {
    let context = Arc::new(RunnerContext {
        keeper: keeper(
            Arc::new(MemoryLeaseStore::new()),
            "bench",
            Duration::from_secs(30),
        ),
        upstream: Arc::new(WebSocketUpstream::new(
            WebSocketUpstreamConfig::for_feed(url),
            Arc::new(LogSink),
        )),
        sink,
        telemetry,
        config: RunnerConfig::default(),
    });
    let lease = context.keeper.acquire(stream).await.expect("acquire");
    let drain = CancellationToken::new();
    let cpu_start = process_cpu_seconds();
    let started = Instant::now();
    let task = tokio::spawn(run_stream(context.clone(), lease, drain.clone()));
    while stored().await < events {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = process_cpu_seconds() - cpu_start;
    drain.cancel();
    let _ = task.await;
    (events as f64 / wall, events as f64 / cpu)
}

async fn into_redis(url: &str, redis: &str, stream: &str, events: u64) -> (f64, f64) {
    let sink = Arc::new(
        RedisSink::connect(redis, SinkOptions::default())
            .await
            .expect("redis"),
    );
    let client = redis::Client::open(redis).expect("redis url");
    let connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let key = leasehold_stream::sink::keys::sink_stream(stream);
    let stored = async || {
        let mut connection = connection.clone();
        redis::cmd("XLEN")
            .arg(&key)
            .query_async::<u64>(&mut connection)
            .await
            .expect("xlen")
    };
    pipeline(url, stream, events, sink, Arc::new(LogSink), stored).await
}

/// The same pipeline with its telemetry shipped to a running sidecar.
async fn into_memory_with_sidecar(url: &str, stream: &str, events: u64) -> f64 {
    let shutdown = CancellationToken::new();
    let sidecar = leasehold_sidecar::Sidecar::start(
        leasehold_sidecar::SidecarConfig::loopback(),
        shutdown.clone(),
    )
    .await
    .expect("sidecar");
    let shipper = Arc::new(BufferedShipper::start(
        ShipperConfig::new(sidecar.telemetry_addr.to_string(), "stream-worker", "bench"),
        shutdown.clone(),
    ));
    let sink = Arc::new(MemorySink::new(SinkOptions::default()));
    let stored = async || sink.appended(stream);
    let rate = pipeline(url, stream, events, sink.clone(), shipper, stored)
        .await
        .0;
    shutdown.cancel();
    rate
}

async fn into_memory(url: &str, stream: &str, events: u64) -> f64 {
    let sink = Arc::new(MemorySink::new(SinkOptions::default()));
    let stored = async || sink.appended(stream);
    pipeline(url, stream, events, sink.clone(), Arc::new(LogSink), stored)
        .await
        .0
}

/// Counts store calls by kind.
#[derive(Default)]
struct CountingStore {
    inner: MemoryLeaseStore,
    writes: AtomicU64,
    renews: AtomicU64,
    reads: AtomicU64,
}

#[async_trait]
impl LeaseStore for CountingStore {
    async fn acquire(&self, r: &AcquireRequest) -> Result<Lease, LeaseError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.inner.acquire(r).await
    }
    async fn renew(&self, r: &RenewRequest) -> Result<Lease, LeaseError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        if !r
            .stream_id
            .starts_with(leasehold_control::schema::RESERVED_PREFIX)
        {
            self.renews.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.renew(r).await
    }
    async fn checkpoint(&self, r: &CheckpointRequest) -> Result<Lease, LeaseError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.inner.checkpoint(r).await
    }
    async fn release(&self, r: &ReleaseRequest) -> Result<Lease, LeaseError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.inner.release(r).await
    }
    async fn force_release(&self, stream_id: &str, now_ms: i64) -> Result<Lease, LeaseError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.inner.force_release(stream_id, now_ms).await
    }
    async fn register(&self, stream_id: &str, now_ms: i64) -> Result<bool, LeaseError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.inner.register(stream_id, now_ms).await
    }
    async fn bump(&self, record_id: &str, now_ms: i64) -> Result<u64, LeaseError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.inner.bump(record_id, now_ms).await
    }
    async fn lift_token(&self, request: &LiftRequest) -> Result<Lease, LeaseError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.inner.lift_token(request).await
    }
}

#[async_trait]
impl LeaseReader for CountingStore {
    async fn get_with(
        &self,
        stream_id: &str,
        consistency: Consistency,
    ) -> Result<Lease, LeaseError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.get_with(stream_id, consistency).await
    }
    async fn list_with(
        &self,
        start_after: Option<&str>,
        limit: usize,
        consistency: Consistency,
    ) -> Result<LeasePage, LeaseError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.list_with(start_after, limit, consistency).await
    }
}

async fn control_plane_cost(url: &str) {
    const STREAMS: usize = 8;
    let store = Arc::new(CountingStore::default());
    let lease = Duration::from_secs(3);
    let context = Arc::new(RunnerContext {
        keeper: keeper(store.clone(), "cost", lease),
        upstream: Arc::new(WebSocketUpstream::new(
            WebSocketUpstreamConfig::for_feed(url),
            Arc::new(LogSink),
        )),
        sink: Arc::new(MemorySink::new(SinkOptions::default())) as Arc<dyn FencedSink>,
        telemetry: Arc::new(LogSink),
        config: RunnerConfig::default(),
    });
    let config = StreamWorkerConfig {
        register: (0..STREAMS).map(|i| format!("cost-{i}")).collect(),
        discovery_interval: Duration::from_secs(5),
        ..StreamWorkerConfig::default()
    };
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(
        StreamWorker::new(context, Arc::new(SystemClock), config).run(shutdown.clone()),
    );
    // Let acquisition settle, then measure a steady window.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (writes0, renews0, reads0) = (
        store.writes.load(Ordering::Relaxed),
        store.renews.load(Ordering::Relaxed),
        store.reads.load(Ordering::Relaxed),
    );
    let window = Duration::from_secs(20);
    tokio::time::sleep(window).await;
    let writes = store.writes.load(Ordering::Relaxed) - writes0;
    let renews = store.renews.load(Ordering::Relaxed) - renews0;
    let reads = store.reads.load(Ordering::Relaxed) - reads0;
    shutdown.cancel();
    let _ = worker.await;
    let renew_periods = window.as_secs_f64() / (lease / 3).as_secs_f64();
    let per_stream_period = writes as f64 / STREAMS as f64 / renew_periods;
    println!(
        "control plane, {STREAMS} streams, 3 s lease renewed every 1 s, {:.0} s steady window:",
        window.as_secs_f64()
    );
    println!(
        "  writes                    {writes} (stream renews {renews}; the rest: presence renews)"
    );
    println!(
        "  writes per stream per renew interval  {per_stream_period:.2}  (renewals alone: 1.00)"
    );
    println!(
        "  => at a 30 s lease renewed every 10 s: {:.0} writes per stream-hour (renewals alone: 360; target ≤ 720)",
        per_stream_period * 360.0
    );
    println!(
        "  reads (doorbell GetItem + scans)  {reads} ({:.1}/s per worker)",
        reads as f64 / window.as_secs_f64()
    );
}

fn main() {
    let events = arg("--events", 200_000);
    let Ok(redis) = std::env::var("LEASEHOLD_BENCH_REDIS_URL") else {
        eprintln!("LEASEHOLD_BENCH_REDIS_URL is not set; run scripts/bench.sh");
        std::process::exit(2);
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let feed = start_feed(events);
        let run = leasehold_control::clock::unix_ms(std::time::SystemTime::now());
        let raw = raw_throughput(&feed.url, &format!("raw-{run}"), events).await;
        let (e2e, per_core) = into_redis(&feed.url, &redis, &format!("e2e-{run}"), events).await;
        let memory = into_memory(&feed.url, &format!("mem-{run}"), events).await;
        let with_sidecar = into_memory_with_sidecar(&feed.url, &format!("side-{run}"), events).await;
        println!(
            "stream throughput, {events} events replayed from the feed's backlog over loopback:"
        );
        println!("  raw WebSocket to a null client   {raw:>10.0} events/s");
        println!(
            "  end to end into the Redis sink   {e2e:>10.0} events/s  (ratio {:.2}; target ≥ 0.5)",
            e2e / raw
        );
        println!("  end to end per core of the worker {per_core:>9.0} events/s per CPU-second");
        println!(
            "  worker pipeline into memory sink {memory:>10.0} events/s  (ratio {:.2})",
            memory / raw
        );
        println!(
            "  same pipeline, telemetry to a sidecar {with_sidecar:>6.0} events/s  (ratio to without: {:.2}; target ≥ 0.97)",
            with_sidecar / memory
        );
        control_plane_cost(&feed.url).await;
    });
}
