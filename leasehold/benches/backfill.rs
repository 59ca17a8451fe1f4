//! Backfill figures (BENCHMARKS.md, "Backfill"): how fast a stream worker
//! reads a missed range from an exchange's REST history while it holds the live
//! events, and how long closing a 10 s gap at 1,000 events/s takes.
//!
//! A Binance-shaped fake exchange (`leasehold_feed::exchange`, trades at
//! `--rate`, history of every trade) serves the live stream and the history on
//! loopback; one runner (the production `run_stream`, in-memory lease store and
//! sink) acquires a stream whose sink ends `--gap-seconds` of trades behind the
//! live head, so its first live event opens exactly that hole. Timed: from the
//! acquire to the hole closed (every trade up to the first live one stored, in
//! order), and from the first history page asked to the last one answered.
//!
//! `cargo bench -p leasehold --bench backfill [-- --rate 1000 --gap-seconds 10 --rounds 3]`
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_control::clock::SystemClock;
use leasehold_control::keeper::{KeeperConfig, LeaseKeeper};
use leasehold_control::store::LeaseStore;
use leasehold_control::store::memory::MemoryLeaseStore;
use leasehold_feed::exchange::{ExchangeConfig, ExchangeServer, ExchangeShape};
use leasehold_sink::memory::MemorySink;
use leasehold_sink::{FencedSink, SinkBatch, SinkEvent, SinkOptions};
use leasehold_stream::runner::{RunnerConfig, RunnerContext, run_stream};
use leasehold_stream::sequence::ResumeMode;
use leasehold_stream::upstream::history::{HistoryConfig, HttpHistory};
use leasehold_stream::upstream::{DataMatch, WebSocketUpstream, WebSocketUpstreamConfig};
use leasehold_telemetry::LogSink;
use leasehold_testkit::measure::median;
use tokio_util::sync::CancellationToken;

struct Args {
    rate: f64,
    gap_seconds: f64,
    rounds: usize,
}

fn args() -> Args {
    let mut args = Args {
        rate: 1_000.0,
        gap_seconds: 10.0,
        rounds: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().and_then(|v| v.parse::<f64>().ok());
        match arg.as_str() {
            "--rate" => args.rate = value().unwrap_or(args.rate),
            "--gap-seconds" => args.gap_seconds = value().unwrap_or(args.gap_seconds),
            "--rounds" => args.rounds = value().map_or(args.rounds, |v| v as usize),
            _ => {}
        }
    }
    args
}

/// One round's figures.
struct Round {
    missed: u64,
    close: Duration,
    history: Duration,
    pages: u64,
    held_peak: u64,
}

async fn round(server: &ExchangeServer, index: usize, rate: f64, gap_seconds: f64) -> Round {
    let stream = format!("bench{index}usdt");
    let settings: std::collections::HashMap<&str, String> =
        server.worked_settings().into_iter().collect();
    let upstream = WebSocketUpstreamConfig {
        url_template: settings["UPSTREAM_URL"].clone(),
        subscribe_template: String::new(),
        seq_pointer: "/t".into(),
        id_pointer: "/t".into(),
        ts_pointer: Some("/T".into()),
        data_match: DataMatch::parse_list("/e=trade").unwrap(),
        ..WebSocketUpstreamConfig::for_feed("ws://unused/")
    };
    let history_config = HistoryConfig {
        url_template: server.history_url().expect("a history"),
        seq_pointer: "/id".into(),
        id_pointer: "/id".into(),
        ts_pointer: Some("/time".into()),
        ..HistoryConfig::default()
    };
    let history = Arc::new(HttpHistory::new(history_config.clone()).unwrap());
    let store = Arc::new(MemoryLeaseStore::new());
    let sink = Arc::new(MemorySink::new(SinkOptions::default()));
    let keeper = LeaseKeeper::new(
        store.clone() as Arc<dyn LeaseStore>,
        Arc::new(SystemClock),
        Arc::new(LogSink),
        KeeperConfig {
            owner_id: "bench".into(),
            ..KeeperConfig::default()
        },
    );
    let context = Arc::new(RunnerContext {
        keeper,
        upstream: Arc::new(WebSocketUpstream::new(upstream, Arc::new(LogSink))),
        sink: sink.clone() as Arc<dyn FencedSink>,
        history: Some((history, history_config)),
        telemetry: Arc::new(LogSink),
        config: RunnerConfig {
            resume: ResumeMode::Backfill,
            ..RunnerConfig::default()
        },
    });
    // The sink ends `gap_seconds` of trades behind the head: the first live
    // event opens that hole.
    let missed = (rate * gap_seconds) as u64;
    let anchor = server.head(&stream) - missed;
    sink.open(&stream, 1).await.unwrap();
    sink.write(SinkBatch {
        stream_id: &stream,
        fence_token: 1,
        events: &[SinkEvent::data(anchor, anchor.to_string(), "{}")],
    })
    .await
    .unwrap();
    let requests_before = server.history_requests();
    let lease = context.keeper.acquire(&stream).await.unwrap();
    let started = Instant::now();
    let drain = CancellationToken::new();
    let task = tokio::spawn(run_stream(context.clone(), lease, drain.clone()));
    // Closed when the entries run contiguously from the anchor past the head
    // the hole ended at (every entry after it was appended in order).
    let mut history_started = None;
    let mut held_peak = 0;
    let closed_at = loop {
        let appended = sink.appended(&stream);
        if history_started.is_none() && server.history_requests() > requests_before {
            history_started = Some(Instant::now());
        }
        let last = sink.last_seq(&stream).unwrap_or(anchor);
        let live_head = server.head(&stream);
        held_peak = held_peak.max(live_head.saturating_sub(last));
        if appended > missed + 1 && last > anchor + missed {
            break Instant::now();
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the hole did not close in 2 minutes"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let history_done = closed_at;
    drain.cancel();
    let _ = task.await;
    let events = sink.events(&stream);
    assert!(
        events.windows(2).all(|w| w[1].seq == w[0].seq + 1),
        "backfilled in order without a hole"
    );
    assert!(events.iter().all(|e| e.gap.is_none()), "no marker");
    Round {
        missed,
        close: closed_at - started,
        history: history_done - history_started.unwrap_or(started),
        pages: server.history_requests() - requests_before,
        held_peak,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = args();
    let shutdown = CancellationToken::new();
    let server = ExchangeServer::start(
        ([127, 0, 0, 1], 0).into(),
        ExchangeConfig {
            shape: ExchangeShape::BinanceTrade,
            rate: args.rate,
            history_retention: 10_000_000,
            ..ExchangeConfig::default()
        },
        shutdown.clone(),
    )
    .await
    .unwrap();
    // Enough history behind the head for the first round's gap.
    tokio::time::sleep(Duration::from_secs_f64(args.gap_seconds + 0.5)).await;
    println!(
        "backfill: Binance-shaped fake at {} trades/s, a {} s gap ({} trades), pages of 1,000, {} rounds",
        args.rate,
        args.gap_seconds,
        (args.rate * args.gap_seconds) as u64,
        args.rounds
    );
    let mut closes = Vec::new();
    let mut rates = Vec::new();
    for index in 0..args.rounds {
        let round = round(&server, index, args.rate, args.gap_seconds).await;
        let rate = round.missed as f64 / round.history.as_secs_f64();
        println!(
            "  round {}: gap of {} closed {:.0} ms after the acquire; history {:.0} ms, {} pages, {:.0} events/s read from history while live events were held (peak {} behind the head)",
            index + 1,
            round.missed,
            round.close.as_secs_f64() * 1000.0,
            round.history.as_secs_f64() * 1000.0,
            round.pages,
            rate,
            round.held_peak,
        );
        closes.push(round.close.as_secs_f64() * 1000.0);
        rates.push(rate);
    }
    println!(
        "median: time to close the gap {:.0} ms; catch-up rate {:.0} events/s",
        median(closes),
        median(rates)
    );
    shutdown.cancel();
    server.finished().await;
}
