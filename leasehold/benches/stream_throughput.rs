//! The fair stream-throughput set, in one run against one feed process: what
//! leasehold's guarantees cost next to a plain consumer, and the control-plane
//! writes a steady stream costs.
//!
//! ```text
//! LEASEHOLD_BENCH_REDIS_URL=redis://127.0.0.1:6379 \
//!   cargo bench -p leasehold --bench stream_throughput -- \
//!   [--events 300000] [--streams 100] [--events-per-stream 5000] [--held 1000] \
//!   [--rounds 3] [--cases abcdef]
//! ```
//! (`scripts/bench.sh` starts Redis and runs every benchmark.)
//!
//! A `leasehold feed` process serves a backlog per stream. Five consumers read
//! it, each on 1 stream and on `--streams` streams at once: (a) a null client
//! that counts frames; (b) the same plus leasehold's field extraction (seq, id,
//! time), no sink; (c) the peer, a plain tokio consumer that serde-derives seq
//! and id and pipelines `XADD`s (no fence, no de-duplication, no checkpoint);
//! (d) leasehold's stream runners into the memory sink; (e) the same into the
//! Redis sink. For each: events/s, events per CPU-second of this process (the
//! consumer; the feed and Redis are other processes), and the p99 latency from
//! the feed's `ts_ms` to the sink's confirmation (to the read for (a)/(b)) with
//! a fresh live feed offering 50 % of that row's measured maximum. Then what
//! `SINK_WAIT_REPLICAS=1` costs: (e) against (f), the same with each batch
//! confirmed by a replica, which the bench starts for that section. Then the RSS
//! per held stream with `--held` quiet streams, the sidecar's telemetry cost,
//! and the control plane: a stream worker with 8 streams on a counting
//! in-memory store for 20 s (3 s lease, renew every 1 s).
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::{SinkExt, StreamExt};
use leasehold_control::clock::SystemClock;
use leasehold_control::keeper::{KeeperConfig, LeaseKeeper};
use leasehold_control::settings::LeaseMode;
use leasehold_control::store::LeaseStore;
use leasehold_control::store::memory::MemoryLeaseStore;
use leasehold_sink::memory::MemorySink;
use leasehold_sink::redis::RedisSink;
use leasehold_sink::{FencedSink, OpenOutcome, SinkBatch, SinkError, SinkOptions, WriteOutcome};
use leasehold_stream::upstream::extract::Extractor;
use leasehold_stream::upstream::{WebSocketUpstream, WebSocketUpstreamConfig};
use leasehold_stream::{RunnerConfig, RunnerContext, run_stream};
use leasehold_telemetry::transport::{BufferedShipper, ShipperConfig};
use leasehold_telemetry::{LogSink, TelemetrySink};
use leasehold_testkit::measure::{arg, median, process_cpu_seconds, rss_kib};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

#[path = "stream_throughput/control_plane.rs"]
mod control_plane;
#[path = "stream_throughput/peer.rs"]
mod peer;
#[path = "stream_throughput/redis_stats.rs"]
mod redis_stats;
#[path = "../tests/it/support/mod.rs"]
mod support;

use control_plane::control_plane_costs;
use peer::peer;
use redis_stats::{clean_redis, redis_cpu_seconds, transactions};

/// A feed process: `backlog` events per stream ready at start, then `rate`
/// events/s per stream. Retention is unbounded in practice: a consumer that
/// falls behind a fast live feed is measured, not disconnected.
fn start_feed(backlog: u64, rate: f64) -> Feed {
    let (child, url) = support::spawn_feed(&[
        "--rate",
        &rate.to_string(),
        "--retention",
        "1000000000",
        "--backlog",
        &backlog.to_string(),
    ]);
    Feed { _child: child, url }
}

/// A running feed; the process ends when this is dropped.
struct Feed {
    _child: support::Proc,
    url: String,
}

fn keeper(store: Arc<dyn LeaseStore>, owner: &str, lease: Duration) -> LeaseKeeper {
    keeper_in(store, owner, lease, LeaseMode::PerStream)
}

fn keeper_in(
    store: Arc<dyn LeaseStore>,
    owner: &str,
    lease: Duration,
    mode: LeaseMode,
) -> LeaseKeeper {
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
            mode,
            ..KeeperConfig::default()
        },
    )
}

/// One consumer of the fair benchmark set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    /// (a) a null client: counts frames.
    Raw,
    /// (b) the field extraction leasehold does on every frame, no sink.
    Parse,
    /// (c) the peer: a plain consumer that pipelines `XADD`s, unfenced.
    Peer,
    /// (d) leasehold into the memory sink.
    Memory,
    /// (e) leasehold into the Redis sink.
    Redis,
    /// (f) the same with `SINK_WAIT_REPLICAS=1`: each batch confirmed once a
    /// replica has it. Its own section, with a replica attached for it alone
    /// (a replica costs the primary CPU for every write, which would move the
    /// other rows).
    RedisWait,
}

const CASES: [Case; 5] = [
    Case::Raw,
    Case::Parse,
    Case::Peer,
    Case::Memory,
    Case::Redis,
];

impl Case {
    fn label(self) -> &'static str {
        match self {
            Case::Raw => "(a) raw read, null client",
            Case::Parse => "(b) parse only (seq, id, time)",
            Case::Peer => "(c) peer: tokio + pipelined XADD",
            Case::Memory => "(d) leasehold, memory sink",
            Case::Redis => "(e) leasehold, Redis sink",
            Case::RedisWait => "(f) leasehold, Redis sink, SINK_WAIT_REPLICAS=1",
        }
    }

    /// The row's letter, for `--cases`.
    fn letter(self) -> char {
        match self {
            Case::Raw => 'a',
            Case::Parse => 'b',
            Case::Peer => 'c',
            Case::Memory => 'd',
            Case::Redis => 'e',
            Case::RedisWait => 'f',
        }
    }
}

/// Events a case has finished (read, parsed, or confirmed by the sink), and
/// the latency samples while recording.
#[derive(Default)]
struct Probe {
    done: AtomicU64,
    recording: AtomicBool,
    latencies_ms: Mutex<Vec<f64>>,
}

impl Probe {
    fn recording(&self) -> bool {
        self.recording.load(Ordering::Relaxed)
    }

    /// Feed timestamp → now, for each frame.
    fn record<'a>(&self, frames: impl Iterator<Item = &'a str>) {
        if !self.recording() {
            return;
        }
        let now = now_ms();
        let mut latencies = self.latencies_ms.lock().unwrap_or_else(|p| p.into_inner());
        latencies.extend(frames.filter_map(ts_of).map(|ts| now - ts));
    }
}

fn now_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// The feed's `ts_ms` without parsing the frame (latency runs only).
fn ts_of(frame: &str) -> Option<f64> {
    let at = frame.find("\"ts_ms\":")? + 8;
    let digits = frame[at..].bytes().take_while(u8::is_ascii_digit).count();
    frame[at..at + digits].parse().ok()
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn subscribe_raw(url: &str, stream: &str) -> Socket {
    let (mut socket, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("connect");
    let subscribe = format!(r#"{{"subscribe": "{stream}", "from_seq": 1}}"#);
    socket
        .send(Message::Text(subscribe.into()))
        .await
        .expect("subscribe");
    socket
}

/// (a) and (b): read `limit` frames (or until aborted), extracting with
/// leasehold's extractor when given one.
async fn null_client(
    url: String,
    stream: String,
    limit: Option<u64>,
    extractor: Option<Extractor>,
    probe: Arc<Probe>,
) {
    let mut socket = subscribe_raw(&url, &stream).await;
    let mut read = 0u64;
    let mut unreported = 0u64;
    while limit.is_none_or(|limit| read < limit) {
        match socket.next().await {
            Some(Ok(Message::Text(text))) => {
                if let Some(extractor) = &extractor {
                    std::hint::black_box(extractor.extract(text.as_str()).ok());
                }
                probe.record(std::iter::once(text.as_str()));
                read += 1;
                unreported += 1;
                if unreported == 256 {
                    probe.done.fetch_add(unreported, Ordering::Relaxed);
                    unreported = 0;
                }
            }
            Some(Ok(_)) => {}
            other => panic!("feed ended early: {other:?}"),
        }
    }
    probe.done.fetch_add(unreported, Ordering::Relaxed);
}

/// The sink as leasehold sees it, counting confirmed events and stamping
/// latencies at the confirmation.
struct ProbeSink {
    inner: Arc<dyn FencedSink>,
    probe: Arc<Probe>,
}

#[async_trait]
impl FencedSink for ProbeSink {
    async fn open(&self, stream_id: &str, fence_token: u64) -> Result<OpenOutcome, SinkError> {
        self.inner.open(stream_id, fence_token).await
    }

    async fn open_epoch(
        &self,
        stream_id: &str,
        fence_token: u64,
        reset: leasehold_sink::ResetMark,
    ) -> Result<OpenOutcome, SinkError> {
        self.inner.open_epoch(stream_id, fence_token, reset).await
    }

    async fn write(&self, batch: SinkBatch<'_>) -> Result<WriteOutcome, SinkError> {
        let outcome = self.inner.write(batch).await?;
        if outcome.accepted > 0 && !outcome.is_fenced() {
            self.probe
                .record(batch.events.iter().filter_map(|e| e.payload.text()));
            self.probe
                .done
                .fetch_add(outcome.accepted, Ordering::Relaxed);
        }
        Ok(outcome)
    }
}

/// Where the benchmark's consumers connect.
struct Target<'a> {
    feed: &'a str,
    redis: &'a str,
}

/// Ends a case: every task ends on the token (leasehold's runners drain).
async fn stop_case(stop: CancellationToken, tasks: Vec<tokio::task::JoinHandle<()>>) {
    stop.cancel();
    for task in tasks {
        let _ = task.await;
    }
}

/// Runs a plain client until it is done or `stop` (checked once per wake-up,
/// not per frame).
fn spawn_until(
    stop: &CancellationToken,
    client: impl Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    let stop = stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = client => {}
        }
    })
}

/// Starts `case` on `streams`; returns the probe and a stopper that ends it.
async fn start_case(
    case: Case,
    target: &Target<'_>,
    streams: &[String],
    limit: Option<u64>,
    telemetry: Arc<dyn TelemetrySink>,
) -> (
    Arc<Probe>,
    CancellationToken,
    Vec<tokio::task::JoinHandle<()>>,
) {
    let probe = Arc::new(Probe::default());
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    match case {
        Case::Raw | Case::Parse => {
            let extractor =
                (case == Case::Parse).then(|| Extractor::new(&["/seq", "/event_id", "/ts_ms"]));
            for stream in streams {
                tasks.push(spawn_until(
                    &stop,
                    null_client(
                        target.feed.to_owned(),
                        stream.clone(),
                        limit,
                        extractor.clone(),
                        probe.clone(),
                    ),
                ));
            }
        }
        Case::Peer => {
            let client = redis::Client::open(target.redis).expect("redis url");
            // No reply deadline: 100 streams x 4 pipelines of 500 XADDs queue
            // longer than the client's default, and the peer must not fail.
            let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
            let connection = client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .expect("redis");
            for stream in streams {
                tasks.push(spawn_until(
                    &stop,
                    peer(
                        target.feed.to_owned(),
                        stream.clone(),
                        limit,
                        connection.clone(),
                        probe.clone(),
                    ),
                ));
            }
        }
        Case::Memory | Case::Redis | Case::RedisWait => {
            let inner: Arc<dyn FencedSink> = if case == Case::Memory {
                Arc::new(MemorySink::new(SinkOptions {
                    max_len: 0,
                    ..SinkOptions::default()
                }))
            } else {
                // Uncapped, as the figures in BENCHMARKS.md were measured
                // before SINK_MAX_LEN had a bounded default.
                let options = SinkOptions {
                    max_len: 0,
                    wait_replicas: u32::from(case == Case::RedisWait),
                    ..SinkOptions::default()
                };
                Arc::new(
                    RedisSink::connect(target.redis, options)
                        .await
                        .expect("redis"),
                )
            };
            let mut upstream = WebSocketUpstreamConfig::for_feed(target.feed);
            upstream.ts_pointer = Some("/ts_ms".to_owned());
            let context = Arc::new(RunnerContext {
                keeper: keeper(
                    Arc::new(MemoryLeaseStore::new()),
                    "bench",
                    Duration::from_secs(30),
                ),
                upstream: Arc::new(WebSocketUpstream::new(upstream, Arc::new(LogSink))),
                sink: Arc::new(ProbeSink {
                    inner,
                    probe: probe.clone(),
                }),
                history: None,
                telemetry,
                config: RunnerConfig::default(),
            });
            for stream in streams {
                let lease = context.keeper.acquire(stream).await.expect("acquire");
                let context = context.clone();
                let stop = stop.clone();
                tasks.push(tokio::spawn(async move {
                    run_stream(context, lease, stop).await;
                }));
            }
        }
    }
    (probe, stop, tasks)
}

fn names(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}-{i}")).collect()
}

/// Consumes `per_stream` backlog events on each stream: events/s, events per
/// CPU-second of this process (the consumer only), and Redis's side.
async fn throughput(
    case: Case,
    target: &Target<'_>,
    streams: &[String],
    per_stream: u64,
    telemetry: Arc<dyn TelemetrySink>,
) -> Throughput {
    let total = per_stream * streams.len() as u64;
    let redis_start = redis_cpu_seconds(target.redis).await;
    let transactions_start = transactions(target.redis).await;
    let cpu_start = process_cpu_seconds();
    let started = Instant::now();
    let (probe, stop, tasks) = start_case(case, target, streams, Some(per_stream), telemetry).await;
    while probe.done.load(Ordering::Relaxed) < total {
        // Counted events never reaching the total means events were resent
        // (a resend lands as duplicates and counts nothing): say so, not hang.
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "{}: {} of {total} events confirmed after 10 minutes",
            case.label(),
            probe.done.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = process_cpu_seconds() - cpu_start;
    let redis_cpu = redis_cpu_seconds(target.redis).await - redis_start;
    let calls = transactions(target.redis).await - transactions_start;
    stop_case(stop, tasks).await;
    clean_redis(target.redis, streams).await;
    Throughput {
        rate: total as f64 / wall,
        per_cpu: total as f64 / cpu,
        redis_us: redis_cpu * 1e6 / total as f64,
        per_call: total as f64 / calls as f64,
    }
}

/// One consumer's pass over the backlog.
#[derive(Clone, Copy)]
struct Throughput {
    /// Events per second.
    rate: f64,
    /// Events per CPU-second of this process.
    per_cpu: f64,
    /// Redis CPU µs per event (meaningful for the rows that write to Redis).
    redis_us: f64,
    /// Events per transaction (the Redis sink's batch size; infinite without them).
    per_call: f64,
}

/// p99 feed-timestamp-to-sink latency (ms) with the feed sending `rate` events/s
/// in total, spread over `streams`.
async fn latency(case: Case, redis: &str, prefix: &str, streams: usize, rate: f64) -> (f64, usize) {
    let feed = start_feed(0, rate / streams as f64);
    let target = Target {
        feed: &feed.url,
        redis,
    };
    let streams = names(prefix, streams);
    let (probe, stop, tasks) = start_case(case, &target, &streams, None, Arc::new(LogSink)).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    probe.recording.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(3)).await;
    probe.recording.store(false, Ordering::Relaxed);
    stop_case(stop, tasks).await;
    clean_redis(redis, &streams).await;
    let mut samples = std::mem::take(&mut *probe.latencies_ms.lock().expect("lock"));
    samples.sort_by(f64::total_cmp);
    let p99 = leasehold_platform::percentile::nearest_rank(&samples, 99.0).unwrap_or(f64::NAN);
    (p99, samples.len())
}

/// RSS per held stream: leasehold holding `count` quiet streams (memory sink).
/// A feed of its own with no backlog and one event per second per stream: on
/// the shared feed each stream read its backlog into the memory sink, so the
/// figure measured how far the reads got, not what holding a stream costs.
async fn rss_per_stream(redis: &str, count: usize) -> f64 {
    let feed = start_feed(0, 1.0);
    let target = Target {
        feed: &feed.url,
        redis,
    };
    let streams = names("rss", count);
    let before = rss_kib("self");
    let (_probe, stop, tasks) =
        start_case(Case::Memory, &target, &streams, None, Arc::new(LogSink)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = rss_kib("self");
    stop_case(stop, tasks).await;
    (after.saturating_sub(before)) as f64 * 1024.0 / count as f64
}

/// The same pipeline with its telemetry shipped to a running sidecar, against
/// without: (with, without) events/s.
async fn sidecar_ratio(target: &Target<'_>, run: i64, events: u64) -> (f64, f64) {
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
    let with = throughput(
        Case::Memory,
        target,
        &names(&format!("side-{run}"), 1),
        events,
        shipper,
    )
    .await
    .rate;
    let without = throughput(
        Case::Memory,
        target,
        &names(&format!("noside-{run}"), 1),
        events,
        Arc::new(LogSink),
    )
    .await
    .rate;
    shutdown.cancel();
    (with, without)
}

struct Row {
    /// Medians over the rounds.
    median: Throughput,
    /// The median round's p99 latency at half the median maximum rate.
    p99_ms: f64,
    /// Latency samples over all rounds.
    samples: usize,
}

/// What `SINK_WAIT_REPLICAS=1` costs: (e) and (f) in turn, each round, with a
/// replica of the bench Redis attached for this section only; throughput,
/// Redis CPU per event and the p99 at 50 % of (f)'s own maximum for both.
async fn wait_cost(target: &Target<'_>, run: i64, rounds: usize, sizes: &[(usize, u64)]) {
    let _replica = leasehold_testkit::redis_replica::Replica::start(target.redis);
    println!(
        "SINK_WAIT_REPLICAS=1 against 0, one loopback replica attached to both; medians of {rounds} rounds"
    );
    println!(
        "| consumer | streams | events/s | Redis CPU µs per event | events per transaction | p99 latency at 50 % of (f) (ms) |"
    );
    println!("|---|---|---|---|---|---|");
    for &(streams, per_stream) in sizes {
        let cases = [Case::Redis, Case::RedisWait];
        let mut rates: Vec<Vec<Throughput>> = vec![Vec::new(); cases.len()];
        for round in 0..rounds {
            for (case, rates) in cases.iter().zip(&mut rates) {
                let prefix = format!("wait-{case:?}-{streams}-{run}-{round}");
                let pass = throughput(
                    *case,
                    target,
                    &names(&prefix, streams),
                    per_stream,
                    Arc::new(LogSink),
                )
                .await;
                eprintln!(
                    "{} on {streams}, round {round}: {:.0}/s",
                    case.label(),
                    pass.rate
                );
                rates.push(pass);
            }
        }
        let waited = medians(&rates[1]);
        for (case, rates) in cases.iter().zip(&rates) {
            let row = medians(rates);
            let prefix = format!("wait-lat-{case:?}-{streams}-{run}");
            let (p99_ms, _) =
                latency(*case, target.redis, &prefix, streams, waited.rate * 0.5).await;
            println!(
                "| {} | {streams} | {:.0} | {:.2} | {:.0} | {p99_ms:.2} |",
                case.label(),
                row.rate,
                row.redis_us,
                row.per_call
            );
        }
        let ratios: Vec<f64> = rates[1]
            .iter()
            .zip(&rates[0])
            .map(|(waited, plain)| waited.rate / plain.rate)
            .collect();
        println!("(f)/(e) on {streams} stream(s): {:.2}", median(ratios));
    }
}

/// The median of each figure over `rounds`, separately.
fn medians(rounds: &[Throughput]) -> Throughput {
    let of = |figure: fn(&Throughput) -> f64| median(rounds.iter().map(figure).collect());
    Throughput {
        rate: of(|t| t.rate),
        per_cpu: of(|t| t.per_cpu),
        redis_us: of(|t| t.redis_us),
        per_call: of(|t| t.per_call),
    }
}

fn main() {
    let events = arg("--events", 300_000);
    let many = arg("--streams", 100) as usize;
    let per_stream_many = arg("--events-per-stream", 5_000);
    let held = arg("--held", 1_000) as usize;
    let rounds = arg("--rounds", 3).max(1) as usize;
    // `--cases ace` runs only those rows (and skips the RSS, sidecar and
    // control-plane parts): for profiling one consumer, not for the table.
    // `--cases p` runs only the control-plane part.
    let only: Option<String> = std::env::args().skip_while(|a| a != "--cases").nth(1);
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
        let feed = start_feed(events.max(per_stream_many), 1.0);
        let target = Target {
            feed: &feed.url,
            redis: &redis,
        };
        // First, in a process that has not yet held hundreds of thousands of
        // events: after the memory-sink rows the allocator's own size moves
        // more than 1,000 held streams do.
        let rss = if only.is_none() {
            rss_per_stream(&redis, held).await
        } else {
            f64::NAN
        };
        if only.as_deref() == Some("p") {
            control_plane_costs(&feed.url).await;
            return;
        }
        let run = leasehold_control::clock::unix_ms(std::time::SystemTime::now());
        let mut table: Vec<(Case, usize, Row)> = Vec::new();
        // Per stream count, each case's passes, one per round. The rounds run
        // the cases in turn (a b c d e, a b c d e, ...) so a ratio pairs two
        // passes minutes apart at most, and a slow minute of a shared machine
        // shows as one outlying round, not as one outlying row.
        let mut passes: Vec<(usize, Case, Vec<Throughput>)> = Vec::new();
        for (streams, per_stream) in [(1usize, events), (many, per_stream_many)] {
            let cases: Vec<Case> = CASES
                .into_iter()
                .filter(|case| only.as_ref().is_none_or(|only| only.contains(case.letter())))
                .collect();
            let mut rates: Vec<Vec<Throughput>> = vec![Vec::new(); cases.len()];
            for round in 0..rounds {
                for (case, rates) in cases.iter().zip(&mut rates) {
                    let prefix = format!("{case:?}-{streams}-{run}-{round}");
                    let pass = throughput(
                        *case,
                        &target,
                        &names(&prefix, streams),
                        per_stream,
                        Arc::new(LogSink),
                    )
                    .await;
                    eprintln!("{} on {streams}, round {round}: {:.0}/s", case.label(), pass.rate);
                    rates.push(pass);
                }
            }
            for (case, rates) in cases.into_iter().zip(rates) {
                let median = medians(&rates);
                // One live feed per round as well: a p99 is one stall away
                // from doubling on a shared machine.
                let mut p99s = Vec::new();
                let mut samples = 0;
                for round in 0..rounds {
                    let prefix = format!("lat-{case:?}-{streams}-{run}-{round}");
                    let (p99_ms, count) =
                        latency(case, &redis, &prefix, streams, median.rate * 0.5).await;
                    eprintln!("{} on {streams}, round {round}: p99 {p99_ms:.2} ms", case.label());
                    p99s.push(p99_ms);
                    samples += count;
                }
                let p99_ms = self::median(p99s);
                table.push((
                    case,
                    streams,
                    Row {
                        median,
                        p99_ms,
                        samples,
                    },
                ));
                passes.push((streams, case, rates));
            }
        }
        println!(
            "stream throughput: one run, one feed process, loopback; 1 stream x {events} events, \
             {many} streams x {per_stream_many} events; medians of {rounds} rounds; latency at 50 % \
             of each row's own median maximum, median p99 of {rounds} live feeds"
        );
        println!(
            "| consumer | streams | events/s | events per CPU-second | Redis CPU µs per event | events per transaction | p99 latency at 50 % (ms) | samples |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        for (case, streams, row) in &table {
            let redis = matches!(case, Case::Peer | Case::Redis | Case::RedisWait);
            let redis_us = if redis {
                format!("{:.2}", row.median.redis_us)
            } else {
                "-".to_owned()
            };
            let per_call = if matches!(case, Case::Redis | Case::RedisWait) {
                format!("{:.0}", row.median.per_call)
            } else {
                "-".to_owned()
            };
            println!(
                "| {} | {streams} | {:.0} | {:.0} | {redis_us} | {per_call} | {:.2} | {} |",
                case.label(),
                row.median.rate,
                row.median.per_cpu,
                row.p99_ms,
                row.samples
            );
        }
        // A ratio per round (two passes close in time), then its median and range.
        let ratio = |streams: usize, over: Case, under: Case| {
            let rates = |case: Case| {
                passes
                    .iter()
                    .find(|(s, c, _)| *s == streams && *c == case)
                    .map(|(_, _, rates)| rates.iter().map(|t| t.rate).collect::<Vec<_>>())
                    .unwrap_or_default()
            };
            let ratios: Vec<f64> = rates(over)
                .iter()
                .zip(rates(under))
                .map(|(over, under)| over / under)
                .collect();
            let low = ratios.iter().copied().fold(f64::NAN, f64::min);
            let high = ratios.iter().copied().fold(f64::NAN, f64::max);
            format!("{:.2} ({low:.2}-{high:.2})", median(ratios))
        };
        for streams in [1, many] {
            println!(
                "ratios on {streams} stream(s), median (range) of {rounds} rounds: (e)/(c) {} (target >= 0.8); (b)/(a) {} (>= 0.5); (d)/(a) {} (>= 0.35)",
                ratio(streams, Case::Redis, Case::Peer),
                ratio(streams, Case::Parse, Case::Raw),
                ratio(streams, Case::Memory, Case::Raw),
            );
        }
        if only.as_ref().is_none_or(|only| only.contains('f')) {
            let sizes = [(1usize, events), (many, per_stream_many)];
            wait_cost(&target, run, rounds, &sizes).await;
        }
        if only.is_some() {
            return;
        }
        let (with_sidecar, without) = sidecar_ratio(&target, run, events).await;
        println!("RSS per held stream at {held} streams (memory sink): {:.1} KiB", rss / 1024.0);
        println!(
            "memory-sink pipeline with telemetry shipped to a sidecar: {with_sidecar:.0} events/s, without: {without:.0} (ratio {:.2}; target >= 0.97)",
            with_sidecar / without
        );
        control_plane_costs(&feed.url).await;
    });
}
