//! Order-book figures (BENCHMARKS.md, "Order books"): what keeping a book and
//! checking its checksum costs per update, and how long a stream's book is
//! out of sync after its connection is cut.
//!
//! **Book keeping, one thread.** The real recordings of
//! `testdata/recordings/` are replayed from memory, no I/O: Kraken v1
//! (`KRAKEN.ws.50.0`, 4,269 updates of 10 pairs, depth 1000, each with its
//! CRC32) and the Binance USD-M futures diffs (`BINANCE_FUTURES.ws.1.0`,
//! those after each symbol's REST snapshot). Each update frame goes through,
//! in separate cases: `serde_json::from_slice::<Value>` (a full parse of the
//! frame, the baseline); for Binance also the worker's own field extraction
//! (`Extractor` over the pointers its worked settings read); the book
//! format's reader alone (`BookFormat::read_message`, no book); a
//! `BookKeeper` with `ChecksumRule::None` (read and applied to the book); and
//! for Kraken a `BookKeeper` with `ChecksumRule::Kraken` (read, applied, the
//! CRC32 of the top 10 levels recomputed and compared). Every replay starts
//! on books at the recording's snapshots (copied before the clock starts); a
//! pass of a case repeats the replay until it lasts about 50 ms. The figure
//! is this thread's CPU time per update, the median of `--passes` rounds; a
//! round runs one pass of every case (order rotated), so that cases compared
//! with each other ran at about the same time on a shared machine, and the
//! differences and ratios printed are medians of each round's own.
//!
//! **Cut to re-synchronised book.** A whole `StreamWorker`, wired from its
//! settings as the `leasehold stream-worker` binary wires it
//! (`StreamWorker::from_settings` with the fake exchange's worked settings:
//! `UPSTREAM_RESUME=snapshot`, `UPSTREAM_SNAPSHOT_URL`), in this process, on
//! the in-memory lease store and the memory sink (no Redis, no DynamoDB),
//! holds one Binance spot depth stream of the fake exchange
//! (`ExchangeShape::BinanceDepth`, `--rate` updates/s). The bench cuts the
//! connection `--cuts` times (`ExchangeServer::cut_all`, odd connections
//! with a close frame, even ones without) and times, from the cut: the
//! worker's disconnect, its new subscription, the snapshot entry confirmed
//! by the sink, and the first diff after it confirmed. After each cut the
//! book rebuilt from the sink (that snapshot and that diff) must equal the
//! exchange's book at the diff's `u`.
//!
//! `cargo bench -p leasehold --bench book [-- --passes 21 --cuts 30 --rate 100 --only keep|resync]`
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use leasehold_control::clock::SystemClock;
use leasehold_control::store::LeaseStore;
use leasehold_control::store::memory::MemoryLeaseStore;
use leasehold_feed::exchange::{ExchangeConfig, ExchangeServer, ExchangeShape};
use leasehold_sink::memory::MemorySink;
use leasehold_sink::{
    FencedSink, OpenOutcome, ResetMark, SinkBatch, SinkError, SinkOptions, WriteOutcome,
};
use leasehold_stream::StreamWorker;
use leasehold_stream::book::{
    Book, BookFormat, BookKeeper, ChecksumRule, Decimal, KeeperOptions, MessageKind, Verdict,
};
use leasehold_stream::upstream::extract::Extractor;
use leasehold_telemetry::{TelemetryEvent, TelemetrySink};
use leasehold_testkit::measure::{arg, median, percentile};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------- recordings

fn recording(name: &str) -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/recordings/");
    std::fs::read_to_string(format!("{dir}{name}")).unwrap()
}

/// The received frames of a `.ws.` recording, in order (the first line is
/// the URL; lines starting with it are frames the client sent).
fn received_frames(text: &str) -> Vec<&str> {
    let mut lines = text.lines();
    let url = lines.next().unwrap().split(' ').next().unwrap();
    lines
        .filter(|line| !line.is_empty() && !line.starts_with(url))
        .map(|line| line.split_once(": ").unwrap().1)
        .collect()
}

/// One recording ready to replay: a keeper per instrument at its snapshot,
/// and the updates after it in the order received (instrument index, frame).
struct Replay<'a> {
    name: &'static str,
    format: BookFormat,
    options: KeeperOptions,
    snapshots: Vec<&'a str>,
    updates: Vec<(usize, &'a str)>,
}

impl Replay<'_> {
    /// One keeper per instrument, its snapshot applied.
    fn keepers(&self, rule: ChecksumRule) -> Vec<BookKeeper> {
        self.snapshots
            .iter()
            .map(|snapshot| {
                let mut keeper = BookKeeper::new(self.format, rule, self.options).unwrap();
                assert_eq!(keeper.on_frame(snapshot.as_bytes()), Ok(Verdict::Snapshot));
                keeper
            })
            .collect()
    }

    fn mean_bytes(&self) -> usize {
        let total: usize = self.updates.iter().map(|(_, f)| f.len()).sum();
        total / self.updates.len()
    }

    /// Price levels an update sets, on average.
    fn mean_levels(&self) -> f64 {
        let total: usize = (self.updates.iter())
            .map(|(_, f)| {
                let message = self.format.read_message(f.as_bytes()).unwrap().unwrap();
                message.changes.len()
            })
            .sum();
        total as f64 / self.updates.len() as f64
    }
}

fn kraken(text: &str) -> Replay<'_> {
    let mut pairs: HashMap<String, usize> = HashMap::new();
    let (mut snapshots, mut updates) = (Vec::new(), Vec::new());
    for frame in received_frames(text) {
        let value: Value = serde_json::from_str(frame).unwrap();
        // Array frames end with their pair; object frames are events.
        let Some(pair) = value.as_array().and_then(|a| a.last()?.as_str()) else {
            continue;
        };
        let kind = BookFormat::KrakenV1
            .read_message(frame.as_bytes())
            .unwrap()
            .unwrap()
            .kind;
        match kind {
            MessageKind::Snapshot => {
                assert!(!pairs.contains_key(pair), "one snapshot a pair");
                pairs.insert(pair.to_owned(), snapshots.len());
                snapshots.push(frame);
            }
            MessageKind::Diff => updates.push((pairs[pair], frame)),
        }
    }
    Replay {
        name: "Kraken v1 (KRAKEN.ws.50.0)",
        format: BookFormat::KrakenV1,
        options: KeeperOptions {
            depth: Some(1000),
            precision: None,
        },
        snapshots,
        updates,
    }
}

/// The futures diffs after each symbol's REST snapshot (`u` above its
/// `lastUpdateId`), in the order received.
fn binance_futures<'a>(http: &'a str, ws: &'a str) -> Replay<'a> {
    let format = BookFormat::Binance;
    let last = |body: &str| {
        format
            .sequence_range(body.as_bytes())
            .unwrap()
            .unwrap()
            .last
    };
    let mut symbols: HashMap<String, (usize, u64)> = HashMap::new();
    let mut snapshots = Vec::new();
    for line in http.lines().filter(|l| !l.is_empty()) {
        let (url, rest) = line.split_once(" -> ").unwrap();
        let symbol = url.split(['=', '&']).nth(1).unwrap().to_owned();
        let body = rest.split_once(": ").unwrap().1;
        symbols.insert(symbol, (snapshots.len(), last(body)));
        snapshots.push(body);
    }
    let mut updates = Vec::new();
    for frame in received_frames(ws) {
        let value: Value = serde_json::from_str(frame).unwrap();
        let data = &value["data"];
        if data["e"] != "depthUpdate" {
            continue;
        }
        let (index, snapshot_id) = symbols[data["s"].as_str().unwrap()];
        if last(frame) > snapshot_id {
            updates.push((index, frame));
        }
    }
    Replay {
        name: "Binance USD-M futures (BINANCE_FUTURES.ws.1.0)",
        format,
        options: KeeperOptions::default(),
        snapshots,
        updates,
    }
}

// ------------------------------------------------------------ part a: keeping

/// This thread's time on a CPU so far, in ns. The kernel's per-thread
/// `sum_exec_runtime` (`/proc/thread-self/schedstat`, first field) is brought
/// up to date at scheduling events: the yield makes the read one, so the
/// figure does not lag by up to a tick.
fn thread_cpu_ns() -> u64 {
    std::thread::yield_now();
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    stat.split_whitespace().next().unwrap().parse().unwrap()
}

/// One pass: nanoseconds per update on this thread's CPU and on the wall.
#[derive(Debug, Clone, Copy)]
struct Pass {
    cpu: f64,
    wall: f64,
}

/// One measured case: a name and a pass of it (setup untimed, then as many
/// replays as fill about 50 ms, timed).
struct Case<'a> {
    name: &'static str,
    pass: Box<dyn FnMut() -> Pass + 'a>,
}

/// A case running `run` over `updates` updates on the state `setup` makes
/// for one replay; calibrated here by one replay (also the warm-up).
fn case<'a, S: 'a>(
    name: &'static str,
    updates: usize,
    mut setup: impl FnMut() -> S + 'a,
    mut run: impl FnMut(&mut S) + 'a,
) -> Case<'a> {
    let mut state = setup();
    let started = Instant::now();
    run(&mut state);
    let once = started.elapsed().max(Duration::from_micros(1));
    let replays = (Duration::from_millis(50).as_secs_f64() / once.as_secs_f64()).ceil() as usize;
    let per = move |ns: f64| ns / (replays * updates) as f64;
    Case {
        name,
        pass: Box::new(move || {
            let mut states: Vec<S> = (0..replays).map(|_| setup()).collect();
            let (cpu, started) = (thread_cpu_ns(), Instant::now());
            for state in &mut states {
                run(state);
            }
            let (cpu, wall) = (thread_cpu_ns() - cpu, started.elapsed());
            drop(black_box(states));
            Pass {
                cpu: per(cpu as f64),
                wall: per(wall.as_secs_f64() * 1e9),
            }
        }),
    }
}

/// Runs `passes` rounds of every case, one pass of each per round (the
/// order rotated each round), so that cases compared with each other ran
/// at about the same time on a shared machine. `[case][round]`.
fn interleaved(cases: &mut [Case<'_>], passes: usize) -> Vec<Vec<Pass>> {
    let mut results = vec![Vec::with_capacity(passes); cases.len()];
    for round in 0..passes {
        for i in 0..cases.len() {
            let at = (round + i) % cases.len();
            results[at].push((cases[at].pass)());
        }
    }
    results
}

/// The median of `f` over rounds (a figure paired within each round).
fn paired(a: &[Pass], b: &[Pass], f: impl Fn(f64, f64) -> f64) -> f64 {
    median(a.iter().zip(b).map(|(a, b)| f(a.cpu, b.cpu)).collect())
}

/// Prints one case and returns its figure: the median pass's CPU time per
/// update (what one core spends), with updates/s per core, the passes'
/// range and the median wall time (higher when other processes took the
/// core meanwhile).
fn report(case: &str, passes: &[Pass]) -> f64 {
    let mut cpu: Vec<f64> = passes.iter().map(|p| p.cpu).collect();
    cpu.sort_by(f64::total_cmp);
    let mid = median(cpu.clone());
    let wall = median(passes.iter().map(|p| p.wall).collect());
    println!(
        "  {case:<56} {mid:>6.0} ns/update {:>9.0} updates/s per core (passes {:.0}-{:.0} ns; wall {wall:.0} ns)",
        1e9 / mid,
        cpu[0],
        cpu[cpu.len() - 1],
    );
    mid
}

/// Replays `replay.updates` on `keepers` (one per instrument), checking
/// every verdict.
fn keep(keepers: &mut [BookKeeper], replay: &Replay<'_>) {
    for &(index, frame) in &replay.updates {
        let verdict = keepers[index].on_frame(frame.as_bytes());
        assert_eq!(verdict, Ok(Verdict::Applied));
    }
}

const PARSE: &str = "serde_json::from_slice::<Value> (baseline: full parse)";
const EXTRACT: &str = "worker's field extraction (Extractor, 5 pointers)";
const READ: &str = "BookFormat::read_message (levels read, no book)";
const KEPT: &str = "BookKeeper, ChecksumRule::None (read + book kept)";
const CHECKED: &str = "BookKeeper, ChecksumRule::Kraken (read + book + CRC32)";

fn keeping(passes: usize) {
    let kraken_text = recording("KRAKEN.ws.50.0");
    let futures_http = recording("BINANCE_FUTURES.http.0.0");
    let futures_ws = recording("BINANCE_FUTURES.ws.1.0");
    let replays = [
        kraken(&kraken_text),
        binance_futures(&futures_http, &futures_ws),
    ];
    println!(
        "book keeping, one thread: updates replayed from memory; this thread's CPU time per update, median of {passes} rounds (each case ≥ 50 ms a round, cases interleaved)"
    );
    for replay in &replays {
        let n = replay.updates.len();
        println!(
            "{}: {} updates over {} instruments, on average {} bytes and {:.1} price levels an update",
            replay.name,
            n,
            replay.snapshots.len(),
            replay.mean_bytes(),
            replay.mean_levels()
        );
        let frames = || replay.updates.iter().map(|(_, f)| *f);
        let mut cases = vec![
            case(
                PARSE,
                n,
                || (),
                move |()| {
                    for frame in frames() {
                        black_box(serde_json::from_slice::<Value>(frame.as_bytes()).unwrap());
                    }
                },
            ),
            case(
                READ,
                n,
                || (),
                move |()| {
                    for frame in frames() {
                        black_box(replay.format.read_message(frame.as_bytes()).unwrap());
                    }
                },
            ),
        ];
        let base = replay.keepers(ChecksumRule::None);
        cases.push(case(KEPT, n, move || base.clone(), |k| keep(k, replay)));
        if replay.format == BookFormat::KrakenV1 {
            let base = replay.keepers(ChecksumRule::Kraken);
            cases.push(case(CHECKED, n, move || base.clone(), |k| keep(k, replay)));
        } else {
            // The pointers the worker reads on every frame with the fake's
            // worked settings, inside the combined-stream envelope.
            let extractor =
                Extractor::new(&["/data/u", "/data/u", "/data/T", "/data/pu", "/data/e"]);
            cases.push(case(
                EXTRACT,
                n,
                || (),
                move |()| {
                    for frame in frames() {
                        black_box(extractor.extract(frame).unwrap());
                    }
                },
            ));
        }
        let results = interleaved(&mut cases, passes);
        let of = |name: &str| &results[cases.iter().position(|c| c.name == name).unwrap()];
        for (case, passes) in cases.iter().zip(&results) {
            report(case.name, passes);
        }
        let (parse, read, kept) = (of(PARSE), of(READ), of(KEPT));
        println!(
            "  = the book kept: +{:.0} ns/update over the read; the keeper {:.2}x the full parse (medians of the rounds' own differences and ratios)",
            paired(kept, read, |k, r| k - r),
            paired(kept, parse, |k, p| k / p),
        );
        if replay.format == BookFormat::KrakenV1 {
            let checked = of(CHECKED);
            println!(
                "  = the checksum: +{:.0} ns/update over the kept book, {:.2}x the full parse; the keeper with it {:.2}x the full parse",
                paired(checked, kept, |c, k| c - k),
                median(
                    (0..passes)
                        .map(|i| (checked[i].cpu - kept[i].cpu) / parse[i].cpu)
                        .collect()
                ),
                paired(checked, parse, |c, p| c / p),
            );
        }
    }
    // The snapshots themselves (Kraken's of depth 1000, the futures REST
    // snapshots of up to 1000 levels a side), for scale.
    for replay in &replays {
        let mut snapshot = [case(
            "snapshot",
            replay.snapshots.len(),
            || (),
            |()| {
                black_box(replay.keepers(ChecksumRule::None));
            },
        )];
        let results = interleaved(&mut snapshot, passes.min(5));
        println!(
            "{}: a snapshot read and kept in {:.0} µs of CPU (median)",
            replay.name,
            median(results[0].iter().map(|p| p.cpu).collect()) / 1000.0
        );
    }
}

// ------------------------------------------------------------ part b: resync

/// The memory sink, recording when each written event was confirmed.
struct TimedSink {
    inner: MemorySink,
    confirmed: Mutex<Vec<Confirmed>>,
}

#[derive(Debug, Clone, Copy)]
struct Confirmed {
    at: Instant,
    seq: u64,
    snapshot: bool,
    /// A snapshot's missed diffs: its `gap.from`.
    missed_from: Option<u64>,
}

#[async_trait]
impl FencedSink for TimedSink {
    async fn open(&self, stream_id: &str, fence_token: u64) -> Result<OpenOutcome, SinkError> {
        self.inner.open(stream_id, fence_token).await
    }

    async fn open_epoch(
        &self,
        stream_id: &str,
        fence_token: u64,
        reset: ResetMark,
    ) -> Result<OpenOutcome, SinkError> {
        self.inner.open_epoch(stream_id, fence_token, reset).await
    }

    async fn write(&self, batch: SinkBatch<'_>) -> Result<WriteOutcome, SinkError> {
        let outcome = self.inner.write(batch).await?;
        let at = Instant::now();
        if outcome.accepted > 0 {
            let mut confirmed = self.confirmed.lock().unwrap();
            confirmed.extend(batch.events.iter().map(|event| Confirmed {
                at,
                seq: event.seq,
                snapshot: event.snapshot,
                missed_from: event.gap.map(|gap| gap.from),
            }));
        }
        Ok(outcome)
    }
}

/// When the worker reported its connection ended and a subscription made.
#[derive(Default)]
struct Connections {
    events: Mutex<Vec<(Instant, bool)>>,
}

impl TelemetrySink for Connections {
    fn emit(&self, event: TelemetryEvent) {
        let connected = match event {
            TelemetryEvent::UpstreamConnected { .. } => true,
            TelemetryEvent::UpstreamDisconnected { .. } => false,
            _ => return,
        };
        self.events
            .lock()
            .unwrap()
            .push((Instant::now(), connected));
    }
}

impl Connections {
    fn first_after(&self, after: Instant, connected: bool) -> Option<Instant> {
        let events = self.events.lock().unwrap();
        events
            .iter()
            .find(|(at, c)| *at >= after && *c == connected)
            .map(|(at, _)| *at)
    }
}

/// The first snapshot confirmed at or after `after`, and the first diff
/// confirmed after it.
fn synced_after(sink: &TimedSink, after: Instant) -> Option<(Confirmed, Confirmed)> {
    let confirmed = sink.confirmed.lock().unwrap();
    let at = confirmed.iter().position(|c| c.at >= after && c.snapshot)?;
    let diff = confirmed[at + 1..].iter().find(|c| !c.snapshot)?;
    Some((confirmed[at], *diff))
}

/// How the book came back after a cut: from a snapshot (then the first diff
/// after it), or by the new connection's first diff chaining on the last
/// one (no update was due while the connection was down).
enum Resynced {
    Snapshot(Confirmed, Confirmed),
    Chained(Confirmed),
}

/// The first entry from the connection made at `connected`: a snapshot
/// (waits for the diff after it too) or a diff.
fn resynced_after(sink: &TimedSink, connected: Instant) -> Option<Resynced> {
    let first = *sink
        .confirmed
        .lock()
        .unwrap()
        .iter()
        .find(|c| c.at >= connected)?;
    if first.snapshot {
        let (snapshot, diff) = synced_after(sink, connected)?;
        Some(Resynced::Snapshot(snapshot, diff))
    } else {
        Some(Resynced::Chained(first))
    }
}

const STREAM: &str = "btcusdt";

/// The book rebuilt from the sink (the latest snapshot before `diff`, the
/// diffs from it to `diff`) equals the exchange's at the diff's `u`.
fn check_book(server: &ExchangeServer, sink: &TimedSink, diff: u64) {
    let events = sink.inner.events(STREAM);
    let end = events.iter().position(|e| e.seq == diff).unwrap();
    let at = events[..end].iter().rposition(|e| e.snapshot).unwrap();
    let diffs = events[at + 1..=end].iter().map(|e| e.payload.as_bytes());
    let book = Book::rebuild(
        BookFormat::Binance,
        None,
        events[at].payload.as_bytes(),
        diffs,
    )
    .unwrap();
    let rebuilt = (side(book.bids()), side(book.asks()));
    assert_eq!(
        rebuilt,
        server.book_at(STREAM, diff),
        "the re-synchronised book is the exchange's at u={diff}"
    );
}

fn side<'a>(levels: impl Iterator<Item = (&'a Decimal, &'a Decimal)>) -> Vec<(String, String)> {
    levels
        .map(|(price, qty)| (price.to_string(), qty.to_string()))
        .collect()
}

async fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(Instant::now() < deadline, "{what}: not within 30 s");
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn resync(cuts: usize, rate: f64) {
    let shutdown = CancellationToken::new();
    let server = ExchangeServer::start(
        ([127, 0, 0, 1], 0).into(),
        ExchangeConfig {
            shape: ExchangeShape::BinanceDepth,
            rate,
            ..ExchangeConfig::default()
        },
        shutdown.clone(),
    )
    .await
    .unwrap();
    let worked = server.worked_settings();
    let mut pairs: Vec<(&str, &str)> = worked.iter().map(|(k, v)| (*k, v.as_str())).collect();
    pairs.extend([
        ("SINK_URL", "memory:"),
        ("OWNER_ID", "bench-book"),
        ("STREAM_IDS", STREAM),
        ("DISCOVERY_INTERVAL_MS", "200"),
    ]);
    let lookup = leasehold_platform::settings::fixed_lookup(&pairs);
    let settings = leasehold_stream::settings::parse(&lookup).unwrap();
    let sink = Arc::new(TimedSink {
        inner: MemorySink::new(SinkOptions {
            max_len: 0,
            ..settings.sink
        }),
        confirmed: Mutex::default(),
    });
    let connections = Arc::new(Connections::default());
    let worker = StreamWorker::from_settings(
        &settings,
        Arc::new(MemoryLeaseStore::new()) as Arc<dyn LeaseStore>,
        sink.clone() as Arc<dyn FencedSink>,
        connections.clone() as Arc<dyn TelemetrySink>,
        Arc::new(SystemClock),
    );
    let stop = CancellationToken::new();
    let started = Instant::now();
    let task = tokio::spawn(worker.run(stop.clone()));
    println!(
        "cut to re-synchronised book: one in-process StreamWorker (from_settings; memory lease store and sink) on the fake exchange's Binance spot depth stream, {rate} updates/s, UPSTREAM_RESUME=snapshot with REST snapshots; {cuts} cuts"
    );
    let (first, _) = wait_for("the first synchronised book", || {
        synced_after(&sink, started)
    })
    .await;
    println!(
        "  start: first snapshot entry {:.1} ms after the worker started",
        ms(first.at - started)
    );

    let mut to_reconnect = Vec::new();
    let mut to_snapshot = Vec::new();
    let mut to_diff_after_snapshot = Vec::new();
    let mut to_synced = Vec::new();
    for cut in 1..=cuts {
        // Cuts land at different points of the frame cadence.
        tokio::time::sleep(Duration::from_millis(400 + 37 * cut as u64 % 200)).await;
        let connection = server.connections_accepted();
        let at = Instant::now();
        assert_eq!(server.cut_all(), 1, "one connection to cut");
        let back = wait_for("a new subscription", || connections.first_after(at, true)).await;
        let gone = connections.first_after(at, false).unwrap();
        let resynced = wait_for("the book back after the cut", || {
            resynced_after(&sink, back)
        })
        .await;
        let how = if connection % 2 == 1 {
            "close frame"
        } else {
            "dropped    "
        };
        let head = format!(
            "  cut {cut:>2} ({how}): disconnect seen {:>5.1} ms, subscribed again {:>6.1} ms,",
            ms(gone - at),
            ms(back - at),
        );
        to_reconnect.push(back - at);
        let synced = match resynced {
            Resynced::Snapshot(snapshot, diff) => {
                let missed = snapshot
                    .missed_from
                    .map_or(0, |from| snapshot.seq + 1 - from);
                println!(
                    "{head} snapshot entry {:>6.1} ms, first diff after it {:>6.1} ms (snapshot at u={}, replacing {missed} missed updates)",
                    ms(snapshot.at - at),
                    ms(diff.at - at),
                    snapshot.seq,
                );
                to_snapshot.push(snapshot.at - at);
                to_diff_after_snapshot.push(diff.at - at);
                diff
            }
            Resynced::Chained(diff) => {
                println!(
                    "{head} no update missed: the first diff chained on, {:>6.1} ms (no snapshot)",
                    ms(diff.at - at),
                );
                diff
            }
        };
        check_book(&server, &sink, synced.seq);
        to_synced.push(synced.at - at);
    }
    stop.cancel();
    task.await.unwrap().unwrap();
    shutdown.cancel();
    server.finished().await;
    let figures = |values: &mut Vec<Duration>| {
        format!(
            "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            ms(percentile(values, 50.0)),
            ms(percentile(values, 99.0)),
            ms(*values.iter().max().unwrap())
        )
    };
    println!(
        "  cut -> subscribed again ({} cuts):             {}",
        to_reconnect.len(),
        figures(&mut to_reconnect)
    );
    if !to_snapshot.is_empty() {
        println!(
            "  cut -> snapshot entry in the sink ({} cuts):    {}",
            to_snapshot.len(),
            figures(&mut to_snapshot)
        );
        println!(
            "  cut -> first diff after the snapshot ({} cuts): {}",
            to_diff_after_snapshot.len(),
            figures(&mut to_diff_after_snapshot)
        );
    }
    println!(
        "  cut -> first diff on a synchronised book, every cut ({}, {} without a snapshot): {}",
        to_synced.len(),
        to_synced.len() - to_snapshot.len(),
        figures(&mut to_synced)
    );
    println!("  every book rebuilt from the sink at that diff equals the exchange's at its u");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let passes = arg("--passes", 21) as usize;
    let cuts = arg("--cuts", 30) as usize;
    let rate = arg("--rate", 100) as f64;
    let only = std::env::args()
        .skip_while(|a| a != "--only")
        .nth(1)
        .unwrap_or_default();
    if only.is_empty() || only == "keep" {
        // On this thread: nothing else runs in the process meanwhile.
        tokio::task::block_in_place(|| keeping(passes));
    }
    if only.is_empty() || only == "resync" {
        resync(cuts, rate).await;
    }
}
