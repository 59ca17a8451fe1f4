//! CPU and memory per stream with many streams on one worker, on a connection
//! each and on shared connections (`UPSTREAM_STREAMS_PER_CONNECTION`).
//!
//! ```text
//! cargo bench -p leasehold --bench connections -- \
//!   [--streams 1000] [--seconds 10] [--rate 5] [--rounds 3] [--only trade-1|depth-1|depth-500]
//! ```
//!
//! One whole `StreamWorker`, wired from its settings as the `leasehold
//! stream-worker` binary wires it (`StreamWorker::from_settings`; the
//! in-memory lease store, the memory sink with `SINK_URL=memory:`), registers
//! and holds `--streams` streams (`STREAM_IDS`, `MAX_STREAMS`) of the fake
//! exchange (`leasehold_feed::exchange`), each `--rate` events a second. Three
//! cases:
//!
//! - `trade-1`: the Binance raw trade shape, `<symbol>@trade`, one connection
//!   per stream (the shape's worked settings);
//! - `depth-1`: the Binance spot diff-depth shape, `<symbol>@depth@100ms`, one
//!   connection per stream (worked settings: a REST snapshot per stream);
//! - `depth-500`: the same streams on the combined `/stream` endpoint, 500 a
//!   connection (`worked_settings_shared(500)`).
//!
//! The fake serves Binance's combined endpoint for its depth shapes only, so
//! the shared case is a depth stream, and `depth-1` is its like-for-like
//! comparison (same frames, same REST snapshots); `trade-1` is the trade
//! stream. The depth shape folds 21 book updates into 8 frames: it runs at
//! `--rate` × 21/8 updates a second, so every case offers `--rate` events
//! (frames) a second a stream.
//!
//! **Where things run.** Each case of each round runs in a fresh process (this
//! binary, `--case`), so the allocator's state after one case does not move the
//! next one's memory figure. That process runs the worker on a tokio runtime of
//! its own (threads named `lh-worker`, as many as cores, as `#[tokio::main]`
//! gives the binary) and starts the fake exchange in a child process of its own
//! (this binary again, `--serve-exchange`), so neither the fake's CPU nor its
//! per-connection memory lands in the worker's figures; the case process asks
//! the child for `open_connections()` over a pipe.
//!
//! **Measured.** The worker starts; once every stream has written at least two
//! events (a trade stream two trades; a depth stream its snapshot and a diff)
//! and 2 s more have passed, a steady window of `--seconds` starts. Over it:
//! the CPU time of the worker runtime's threads and of the whole process (the
//! kernel's per-thread `sum_exec_runtime`, `/proc/self/task/*/schedstat`; the
//! whole process adds the main thread, which polls the sink's counters every
//! 250 ms), the fake's CPU the same way from `/proc/<child>/task/*/schedstat`,
//! and the events the sink accepted. At its end: `VmRSS` of the worker process
//! (`/proc/self/status`) minus `VmRSS` just before the worker started,
//! divided by the streams, and the fake's open and accepted connections. The
//! sink keeps one event per stream (`SINK_MAX_LEN=1`): what is stored is not
//! what holding costs (a Redis sink stores nothing in the worker), and one
//! frame per stream stays in the figure (well under 1 KiB). The
//! telemetry goes nowhere (`LogSink` without a subscriber; the binary ships it
//! to a sidecar). Each figure is the median over `--rounds` rounds, the cases'
//! order rotated each round.
//!
//! **Checked** (a failing check panics): every stream wrote events within the
//! window; the fake closed no connection for a limit and cut none, and no
//! connection ended or was opened during the window; on one
//! connection per stream `--streams` connections are open, and the shared
//! case opened exactly ceil(`--streams` / 500) connections and no other (the
//! fake serves at most 4,096 connections: `--streams` above that fails the
//! one-a-connection cases).
//! `RLIMIT_NOFILE`: each process holds one end of every connection, so the
//! bench raises its soft limit to `--streams` + 256 when lower (`prlimit`, up
//! to the hard limit; the processes it starts inherit it) and says so.
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leasehold_control::clock::SystemClock;
use leasehold_control::store::LeaseStore;
use leasehold_control::store::memory::MemoryLeaseStore;
use leasehold_feed::exchange::{ExchangeConfig, ExchangeServer, ExchangeShape};
use leasehold_sink::FencedSink;
use leasehold_sink::memory::MemorySink;
use leasehold_stream::StreamWorker;
use leasehold_telemetry::{LogSink, TelemetryEvent, TelemetrySink};
use leasehold_testkit::measure::{
    arg, median, process_cpu_seconds, rss_kib, task_cpu_seconds, thread_cpu_seconds,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// The worker runtime's thread names (the kernel keeps 15 bytes).
const WORKER_THREADS: &str = "lh-worker";
/// Streams a connection carries in the shared case.
const SHARED: usize = 500;
/// Book updates per frame of the fake's depth shapes: 21 in 8 frames.
const UPDATES_PER_FRAME: f64 = 21.0 / 8.0;
/// After every stream flows, before the window opens.
const SETTLE: Duration = Duration::from_secs(2);
/// Every stream flowing within this long, or the case fails.
const FLOW_DEADLINE: Duration = Duration::from_secs(180);
/// File descriptors a process needs besides one per connection.
const FD_MARGIN: u64 = 256;

/// One configuration measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Trade1,
    Depth1,
    DepthShared,
}

const CASES: [Case; 3] = [Case::Trade1, Case::Depth1, Case::DepthShared];

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Trade1 => "trade-1",
            Case::Depth1 => "depth-1",
            Case::DepthShared => "depth-500",
        }
    }

    fn from_name(name: &str) -> Case {
        CASES
            .into_iter()
            .find(|case| case.name() == name)
            .unwrap_or_else(|| panic!("unknown case {name:?} (trade-1, depth-1, depth-500)"))
    }

    fn shape(self) -> ExchangeShape {
        match self {
            Case::Trade1 => ExchangeShape::BinanceTrade,
            Case::Depth1 | Case::DepthShared => ExchangeShape::BinanceDepth,
        }
    }

    fn upstream(self) -> &'static str {
        match self {
            Case::Trade1 => "Binance trade, `/ws/<s>@trade`",
            Case::Depth1 => "Binance depth, `/ws/<s>@depth@100ms`",
            Case::DepthShared => "Binance depth, combined `/stream`",
        }
    }

    fn per_connection(self) -> usize {
        match self {
            Case::Trade1 | Case::Depth1 => 1,
            Case::DepthShared => SHARED,
        }
    }

    /// The fake's rate (ids per second per symbol) for `events` frames a
    /// second per stream.
    fn exchange_rate(self, events: f64) -> f64 {
        match self.shape() {
            ExchangeShape::BinanceDepth => events * UPDATES_PER_FRAME,
            _ => events,
        }
    }
}

// ------------------------------------------------------------ measurement

/// This process's `RLIMIT_NOFILE` (soft, hard) from `/proc/self/limits`
/// (`u64::MAX` for unlimited).
fn nofile_limits() -> (u64, u64) {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let mut fields = line["Max open files".len()..]
        .split_whitespace()
        .map(|v| v.parse::<u64>().unwrap_or(u64::MAX));
    (fields.next().unwrap(), fields.next().unwrap())
}

/// Makes the soft `RLIMIT_NOFILE` at least `needed`, with `prlimit` (the
/// workspace forbids `unsafe`, and this crate has no rlimit binding); the
/// processes started afterwards inherit it. Returns what was done, to print.
fn ensure_fd_limit(needed: u64) -> String {
    let (soft, hard) = nofile_limits();
    if soft >= needed {
        return format!(
            "RLIMIT_NOFILE soft {soft}, hard {hard}: enough for {needed} per process, not raised"
        );
    }
    assert!(
        hard >= needed,
        "RLIMIT_NOFILE hard limit {hard} is below the {needed} descriptors a process needs; raise it (ulimit -Hn) or run fewer --streams"
    );
    let status = Command::new("prlimit")
        .arg("--pid")
        .arg(std::process::id().to_string())
        .arg(format!("--nofile={needed}:"))
        .status()
        .expect("prlimit (util-linux) raises the soft RLIMIT_NOFILE");
    assert!(status.success(), "prlimit failed: {status}");
    let (raised, _) = nofile_limits();
    assert!(raised >= needed, "soft RLIMIT_NOFILE still {raised}");
    format!("RLIMIT_NOFILE soft {soft} raised to {raised} (hard {hard}) for {needed} per process")
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_owned()
}

// ------------------------------------------------------------ the fake exchange, in its own process

/// `--serve-exchange`: runs the fake exchange until stdin closes. Prints the
/// worker's settings for it as one JSON line, then answers each `stats` line
/// on stdin with its connection counts.
fn serve_exchange(case: Case, rate: f64) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .thread_name("lh-exchange")
        .enable_all()
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let server = runtime
        .block_on(ExchangeServer::start(
            ([127, 0, 0, 1], 0).into(),
            ExchangeConfig {
                shape: case.shape(),
                rate,
                ..ExchangeConfig::default()
            },
            shutdown.clone(),
        ))
        .unwrap();
    let settings = if case.per_connection() > 1 {
        server.worked_settings_shared(case.per_connection())
    } else {
        server.worked_settings()
    };
    assert!(!settings.is_empty(), "{}: no worked settings", case.name());
    let settings: Vec<(String, String)> = settings
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", json!(settings)).unwrap();
    out.flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        if line.unwrap().trim() == "stats" {
            let stats = json!({
                "open": server.open_connections(),
                "accepted": server.connections_accepted(),
                "limit_closes": server.limit_closes(),
                "cuts": server.cuts(),
                "messages": server.messages_received(),
                "rest_requests": server.history_requests(),
            });
            writeln!(out, "{stats}").unwrap();
            out.flush().unwrap();
        }
    }
    shutdown.cancel();
    runtime.block_on(async {
        let _ = tokio::time::timeout(Duration::from_secs(5), server.finished()).await;
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
}

/// The fake exchange's process, seen from the case process.
struct Exchange {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    settings: Vec<(String, String)>,
}

impl Exchange {
    fn start(case: Case, rate: f64) -> Exchange {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--serve-exchange", case.name(), "--rate"])
            .arg(rate.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let settings: Vec<(String, String)> = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("the fake's settings: {e}: {line:?}"));
        Exchange {
            child,
            stdin,
            stdout,
            settings,
        }
    }

    fn stats(&mut self) -> Value {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "stats").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    }

    fn cpu_seconds(&self) -> f64 {
        task_cpu_seconds(&self.child.id().to_string(), "")
    }

    fn rss_kib(&self) -> u64 {
        rss_kib(&self.child.id().to_string())
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        // Closing stdin ends it.
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ------------------------------------------------------------ one case, in its own process

/// Counts the worker's upstream disconnects (none is expected in the window).
#[derive(Default)]
struct Disconnects(AtomicU64);

impl TelemetrySink for Disconnects {
    fn emit(&self, event: TelemetryEvent) {
        if matches!(event, TelemetryEvent::UpstreamDisconnected { .. }) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        LogSink.emit(event);
    }
}

fn appended(sink: &MemorySink, streams: &[String]) -> Vec<u64> {
    streams.iter().map(|s| sink.appended(s)).collect()
}

/// `--case`: one worker holding `streams` streams of the case's fake; prints
/// `RESULT {json}` on stdout.
fn run_case(case: Case, streams: usize, seconds: u64, rate: f64) {
    let mut exchange = Exchange::start(case, case.exchange_rate(rate));
    let names: Vec<String> = (0..streams).map(|i| format!("s{i}usdt")).collect();
    let ids = names.join(",");
    let max = streams.to_string();
    let mut pairs: Vec<(&str, &str)> = exchange
        .settings
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    pairs.extend([
        ("SINK_URL", "memory:"),
        ("SINK_MAX_LEN", "1"),
        ("OWNER_ID", "bench-connections"),
        ("STREAM_IDS", ids.as_str()),
        ("MAX_STREAMS", max.as_str()),
    ]);
    let lookup = leasehold_platform::settings::fixed_lookup(&pairs);
    let settings = leasehold_stream::settings::parse(&lookup).unwrap();
    assert_eq!(
        settings.upstream.streams_per_connection,
        case.per_connection()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .thread_name(WORKER_THREADS)
        .enable_all()
        .build()
        .unwrap();
    let sink = Arc::new(MemorySink::new(settings.sink));
    let disconnects = Arc::new(Disconnects::default());
    let rss_before = rss_kib("self");
    let result = runtime.block_on(async {
        let worker = StreamWorker::from_settings(
            &settings,
            Arc::new(MemoryLeaseStore::new()) as Arc<dyn LeaseStore>,
            sink.clone() as Arc<dyn FencedSink>,
            disconnects.clone() as Arc<dyn TelemetrySink>,
            Arc::new(SystemClock),
        );
        let stop = CancellationToken::new();
        let started = Instant::now();
        let task = tokio::spawn(worker.run(stop.clone()));

        // Every stream flowing: two events written.
        let mut reported = Instant::now();
        loop {
            let flowing = appended(&sink, &names).iter().filter(|n| **n >= 2).count();
            if flowing == names.len() {
                break;
            }
            if reported.elapsed() >= Duration::from_secs(5) {
                eprintln!(
                    "  {}: {flowing} of {streams} streams flowing after {:.0} s ({:?})",
                    case.name(),
                    started.elapsed().as_secs_f64(),
                    exchange.stats()
                );
                reported = Instant::now();
            }
            assert!(
                started.elapsed() < FLOW_DEADLINE,
                "{}: only {flowing} of {streams} streams wrote two events within {FLOW_DEADLINE:?}; fake: {}",
                case.name(),
                exchange.stats()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let flowing_after = started.elapsed().as_secs_f64();
        tokio::time::sleep(SETTLE).await;

        // The steady window.
        let disconnects_before = disconnects.0.load(Ordering::Relaxed);
        let accepted_before = exchange.stats()["accepted"].as_u64().unwrap();
        let counts_before = appended(&sink, &names);
        let (worker_cpu, process_cpu, exchange_cpu) = (
            thread_cpu_seconds(WORKER_THREADS),
            process_cpu_seconds(),
            exchange.cpu_seconds(),
        );
        let opened = Instant::now();
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let (worker_cpu, process_cpu, exchange_cpu) = (
            thread_cpu_seconds(WORKER_THREADS) - worker_cpu,
            process_cpu_seconds() - process_cpu,
            exchange.cpu_seconds() - exchange_cpu,
        );
        let wall = opened.elapsed().as_secs_f64();
        let counts_after = appended(&sink, &names);
        let rss_after = rss_kib("self");
        let stats = exchange.stats();
        let disconnects = disconnects.0.load(Ordering::Relaxed) - disconnects_before;

        let per_stream: Vec<u64> = counts_after
            .iter()
            .zip(&counts_before)
            .map(|(a, b)| a - b)
            .collect();
        let events: u64 = per_stream.iter().sum();
        let idle: Vec<&String> = (names.iter().zip(&per_stream))
            .filter(|(_, n)| **n == 0)
            .map(|(s, _)| s)
            .collect();
        assert!(
            idle.is_empty(),
            "{}: {} streams wrote nothing in the window, e.g. {:?}",
            case.name(),
            idle.len(),
            &idle[..idle.len().min(5)]
        );
        let open = stats["open"].as_u64().unwrap();
        let accepted = stats["accepted"].as_u64().unwrap();
        assert_eq!(stats["limit_closes"], 0, "{}: {stats}", case.name());
        assert_eq!(stats["cuts"], 0, "{}: {stats}", case.name());
        assert_eq!(
            (accepted - accepted_before, disconnects),
            (0, 0),
            "{}: connections opened and ended during the window",
            case.name()
        );
        let expected = streams.div_ceil(case.per_connection()) as u64;
        assert_eq!(
            open,
            expected,
            "{}: open connections (streams {streams}, {} a connection): {stats}",
            case.name(),
            case.per_connection()
        );
        if case.per_connection() > 1 {
            assert_eq!(
                accepted,
                expected,
                "{}: connections ever accepted: {stats}",
                case.name()
            );
        }

        stop.cancel();
        match tokio::time::timeout(Duration::from_secs(60), task).await {
            Ok(joined) => {
                joined.unwrap().unwrap();
            }
            Err(_) => eprintln!("  {}: the worker did not drain within 60 s", case.name()),
        }
        json!({
            "case": case.name(),
            "streams": streams,
            "flowing_after_s": flowing_after,
            "wall_s": wall,
            "events": events,
            "min_events_per_stream": per_stream.iter().min(),
            "worker_cpu_s": worker_cpu,
            "process_cpu_s": process_cpu,
            "exchange_cpu_s": exchange_cpu,
            "rss_before_kib": rss_before,
            "rss_after_kib": rss_after,
            "exchange_rss_kib": exchange.rss_kib(),
            "open": open,
            "accepted": accepted,
            "messages": stats["messages"],
            "rest_requests": stats["rest_requests"],
        })
    });
    drop(exchange);
    runtime.shutdown_timeout(Duration::from_secs(2));
    println!("RESULT {result}");
}

// ------------------------------------------------------------ the table

fn spawn_case(case: Case, streams: usize, seconds: u64, rate: f64) -> Value {
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--case", case.name()])
        .args(["--streams", &streams.to_string()])
        .args(["--seconds", &seconds.to_string()])
        .args(["--rate", &rate.to_string()])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "case {} failed ({}); stdout: {stdout}",
        case.name(),
        output.status
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("case {}: no result in {stdout:?}", case.name()));
    serde_json::from_str(line).unwrap()
}

/// The lowest and highest of `values`.
fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    })
}

fn f(value: &Value, name: &str) -> f64 {
    value[name]
        .as_f64()
        .unwrap_or_else(|| panic!("{name} in {value}"))
}

fn main() {
    let streams = arg("--streams", 1_000) as usize;
    let seconds = arg("--seconds", 10).max(1);
    let rounds = arg("--rounds", 3).max(1) as usize;
    let option = |name: &str| std::env::args().skip_while(|a| a != name).nth(1);
    let rate: f64 = option("--rate")
        .map(|r| r.parse().expect("--rate: events per second per stream"))
        .unwrap_or(5.0);
    assert!(rate > 0.0, "--rate must be positive");
    if let Some(case) = option("--serve-exchange") {
        return serve_exchange(Case::from_name(&case), rate);
    }
    if let Some(case) = option("--case") {
        return run_case(Case::from_name(&case), streams, seconds, rate);
    }
    let cases: Vec<Case> = match option("--only") {
        Some(name) => vec![Case::from_name(&name)],
        None => CASES.to_vec(),
    };
    assert!(streams > 0, "--streams must be positive");
    let fds = ensure_fd_limit(streams as u64 + FD_MARGIN);
    let load_before = loadavg();
    let started = Instant::now();
    eprintln!(
        "connections: {streams} streams, {rate} events/s each, {seconds} s windows, {rounds} rounds; {fds}; loadavg {load_before}"
    );
    // [case][round]
    let mut results: Vec<Vec<Value>> = vec![Vec::new(); cases.len()];
    for round in 0..rounds {
        for i in 0..cases.len() {
            let at = (round + i) % cases.len();
            let result = spawn_case(cases[at], streams, seconds, rate);
            eprintln!("  round {round}: {result}");
            results[at].push(result);
        }
    }
    let load_after = loadavg();
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    println!(
        "connections: one stream worker (StreamWorker::from_settings, in-memory lease store, memory sink keeping 1 event a stream) holding {streams} streams of the fake exchange, {rate} events/s each ({:.0} events/s offered), {cores} cores; the fake in a child process; medians of {rounds} rounds, {seconds} s windows, each case in a fresh process",
        rate * streams as f64
    );
    println!(
        "| case | upstream | streams per connection | connections open (accepted) | events/s written | worker CPU, % of a core | CPU µs per stream per wall second | whole process, µs per stream per s | RSS per stream (KiB) | fake exchange CPU, % of a core | all {streams} flowing after (s) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (case, rounds) in cases.iter().zip(&results) {
        let of = |figure: &dyn Fn(&Value) -> f64| median(rounds.iter().map(figure).collect());
        let per_stream_us =
            |cpu: &str| of(&|r: &Value| f(r, cpu) / f(r, "wall_s") / streams as f64 * 1e6);
        println!(
            "| {} | {} | {} | {:.0} ({:.0}) | {:.0} | {:.1} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} |",
            case.name(),
            case.upstream(),
            case.per_connection(),
            of(&|r| f(r, "open")),
            of(&|r| f(r, "accepted")),
            of(&|r| f(r, "events") / f(r, "wall_s")),
            of(&|r| f(r, "worker_cpu_s") / f(r, "wall_s") * 100.0),
            per_stream_us("worker_cpu_s"),
            per_stream_us("process_cpu_s"),
            of(&|r| (f(r, "rss_after_kib") - f(r, "rss_before_kib")) / streams as f64),
            of(&|r| f(r, "exchange_cpu_s") / f(r, "wall_s") * 100.0),
            of(&|r| f(r, "flowing_after_s")),
        );
    }
    let ranges: Vec<String> = cases
        .iter()
        .zip(&results)
        .map(|(case, rounds)| {
            let (lo, hi) = range(
                rounds
                    .iter()
                    .map(|r| f(r, "worker_cpu_s") / f(r, "wall_s") / streams as f64 * 1e6),
            );
            let (klo, khi) = range(
                rounds
                    .iter()
                    .map(|r| (f(r, "rss_after_kib") - f(r, "rss_before_kib")) / streams as f64),
            );
            format!(
                "{}: CPU µs per stream per s {lo:.2}-{hi:.2}, KiB per stream {klo:.2}-{khi:.2}",
                case.name()
            )
        })
        .collect();
    println!("rounds' range: {}", ranges.join("; "));
    let counts: Vec<String> = cases
        .iter()
        .map(|case| match case.per_connection() {
            1 => format!("{}: {streams} open", case.name()),
            n => format!(
                "{}: {} open, no other accepted",
                case.name(),
                streams.div_ceil(n)
            ),
        })
        .collect();
    println!(
        "checked: every stream wrote in every window; the fake closed and cut no connection, none opened or ended in a window; connections {}",
        counts.join(", ")
    );
    println!("{fds}");
    println!(
        "loadavg before {load_before}; after {load_after}; {:.0} s in all",
        started.elapsed().as_secs_f64()
    );
}
