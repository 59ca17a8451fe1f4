//! The stream worker against exchange-shaped upstreams, as a user points it at
//! one: a real `leasehold stream-worker` (with its sidecar), moto and Redis,
//! and a fake exchange (`leasehold_feed::exchange`) served by this test with
//! the shape's worked settings (docs/upstreams.md). Each fake starts every
//! connection live, replays nothing, and is cut by the test three times.
//!
//! Checked for every shape: the first event reaches the sink within 2 s of the
//! acquire; reconnects equal the server's cuts (no loop); and what the sink
//! holds, by mode — `live`: every hole covered by exactly one marker with the
//! right bounds, no event inside one; `backfill`: no missing and no duplicate
//! sequence, no marker; `increasing`: no marker, no `gap` reconnect, no
//! control frame stored. Kraken and Bybit cut clients that send no
//! application ping for 2 s: the worker's pings keep the connection.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::{Cluster, serial};
use leasehold_feed::exchange::{ExchangeConfig, ExchangeServer, ExchangeShape, HistoryOverride};
use leasehold_sink::memory::StoredEvent;
use leasehold_telemetry::GapReason;
use tokio_util::sync::CancellationToken;

/// Trades per second per symbol: busy enough that a reconnect always misses some.
const RATE: f64 = 100.0;
const CUTS: u64 = 3;

/// A symbol never used before, in the shape's spelling (Binance lower case,
/// the others upper case; Coinbase `BASE-QUOTE`, Kraken `BASE/QUOTE`).
fn unique_symbol(shape: ExchangeShape) -> String {
    let n = leasehold_testkit::unique_name("x")
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64))
        % 1_000_000_000;
    match shape {
        ExchangeShape::BinanceTrade
        | ExchangeShape::BinanceAggTrade
        | ExchangeShape::BinanceDepth
        | ExchangeShape::BinanceFuturesDepth => format!("x{n}usdt"),
        ExchangeShape::CoinbaseMatches | ExchangeShape::CoinbaseLevel2 => format!("X{n}-USD"),
        ExchangeShape::KrakenTrade | ExchangeShape::KrakenBook => format!("X{n}/USD"),
        ExchangeShape::BybitPublicTrade | ExchangeShape::BybitOrderbook => format!("X{n}USDT"),
        ExchangeShape::OkxBooks => format!("X{n}-USDT"),
    }
}

/// One shape's run: the sink's entries and what the worker's sidecar counted.
struct Run {
    entries: Vec<StoredEvent>,
    reconnects: BTreeMap<String, u64>,
    /// `leasehold_stream_snapshots_total` by reason.
    snapshots: BTreeMap<String, u64>,
    /// `leasehold_stream_checksum_failures_total`.
    checksum_failures: u64,
    control_frames: u64,
    first_event_after_acquire: Duration,
    cuts: u64,
    server: ExchangeServer,
    symbol: String,
    logs: String,
}

/// The value of every sample of `name` in a Prometheus text body, by its
/// `reason` label (or "" without one).
fn samples(body: &str, name: &str) -> BTreeMap<String, u64> {
    body.lines()
        .filter(|line| line.starts_with(name) && !line.starts_with('#'))
        .filter_map(|line| {
            let (labels, value) = line.rsplit_once(' ')?;
            let reason = labels
                .split("reason=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or("")
                .to_owned();
            Some((reason, value.parse::<f64>().ok()? as u64))
        })
        .collect()
}

async fn metrics(cluster: &Cluster, owner: &str) -> String {
    let (_, _, body) = leasehold_testkit::http_get(&cluster.sidecars[owner].http, "/metrics")
        .await
        .expect("sidecar answers");
    body
}

/// Serves `config`, runs one worker on one stream with the shape's worked
/// settings (plus `overrides`), cuts the connection three times, stops the
/// worker and returns what happened.
async fn run(config: ExchangeConfig, overrides: &[(&str, &str)]) -> Option<Run> {
    run_with(config, overrides, |_| {}).await
}

/// [`run`], calling `before_cuts` once the first entry is in the sink.
async fn run_with(
    config: ExchangeConfig,
    overrides: &[(&str, &str)],
    before_cuts: impl Fn(&ExchangeServer),
) -> Option<Run> {
    let shutdown = CancellationToken::new();
    let server = ExchangeServer::start(([127, 0, 0, 1], 0).into(), config, shutdown.clone())
        .await
        .expect("fake exchange starts");
    // A symbol of its own per run: the Redis sink outlives the run, and a
    // new fake starts its ids over.
    let stream = unique_symbol(config.shape);
    let mut cluster = Cluster::start_on(server.ws_url(), vec![stream.clone()]).await?;
    let mut settings: Vec<(&str, String)> = server.worked_settings();
    settings.extend(overrides.iter().map(|(k, v)| (*k, (*v).to_owned())));
    let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    cluster.start_worker_with_sidecar("w1", &settings);

    // From the acquire (the record names w1) to the first entry in the sink.
    let started = Instant::now();
    let mut acquired = None;
    let first_event_after_acquire = loop {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{}: nothing reached the sink\n{}",
            config.shape,
            cluster.logs()
        );
        if acquired.is_none() && cluster.owners().await.contains_key(&stream) {
            acquired = Some(Instant::now());
        }
        if let Some(at) = acquired
            && !cluster.sink_entries(&stream).await.is_empty()
        {
            break at.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    before_cuts(&server);
    for _ in 0..CUTS {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            server.cut_all(),
            1,
            "{}: one connection to cut",
            config.shape
        );
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let body = metrics(&cluster, "w1").await;
    let reconnects = samples(&body, "leasehold_websocket_reconnects_total");
    let snapshots = samples(&body, "leasehold_stream_snapshots_total");
    let checksum_failures = samples(&body, "leasehold_stream_checksum_failures_total")
        .values()
        .sum();
    let control_frames = samples(&body, "leasehold_upstream_frames_skipped_total")
        .get("control")
        .copied()
        .unwrap_or(0);
    let gaps_counted: u64 = samples(&body, "leasehold_stream_gaps_total").values().sum();
    cluster.stop_workers();
    let entries = cluster.sink_entries(&stream).await;
    let markers = entries.iter().filter(|e| e.gap.is_some()).count() as u64;
    assert_eq!(
        gaps_counted, markers,
        "{}: leasehold_stream_gaps_total counts each marker once",
        config.shape
    );
    let logs = cluster.logs();
    let cuts = server.cuts();
    shutdown.cancel();
    Some(Run {
        entries,
        reconnects,
        snapshots,
        checksum_failures,
        control_frames,
        first_event_after_acquire,
        cuts,
        server,
        symbol: stream,
        logs,
    })
}

impl Run {
    fn common_checks(&self, shape: ExchangeShape) {
        assert!(
            self.first_event_after_acquire <= Duration::from_secs(2),
            "{shape}: first event {:?} after the acquire",
            self.first_event_after_acquire
        );
        assert_eq!(self.cuts, CUTS, "{shape}: the server cut only when told to");
        let reconnects: u64 = self.reconnects.values().sum();
        assert_eq!(
            reconnects, CUTS,
            "{shape}: one reconnect per cut, no loop: {:?}\n{}",
            self.reconnects, self.logs
        );
        assert_eq!(
            self.reconnects.get("gap").copied().unwrap_or(0),
            0,
            "{shape}: a live upstream never reconnects for a gap"
        );
        let positions: Vec<u64> = self.entries.iter().map(|e| e.seq).collect();
        assert!(
            positions.windows(2).all(|w| w[0] < w[1]),
            "{shape}: positions strictly increase"
        );
        assert!(
            self.entries.len() > 100,
            "{shape}: only {} entries",
            self.entries.len()
        );
    }

    fn markers(&self) -> Vec<&StoredEvent> {
        self.entries.iter().filter(|e| e.gap.is_some()).collect()
    }

    /// Contiguous ids: every id from the first entry on is an event or in
    /// exactly one marker.
    fn assert_covered(&self, shape: ExchangeShape) {
        let mut next = *self.entries[0].covers().start();
        for entry in &self.entries {
            assert_eq!(
                *entry.covers().start(),
                next,
                "{shape}: a hole without a marker, or an event inside one, before {entry:?}"
            );
            next = entry.seq + 1;
        }
    }

    /// Events stored are the server's frames (or history items) as sent.
    fn assert_payloads(&self, shape: ExchangeShape, symbol: &str) {
        for entry in self.entries.iter().filter(|e| e.gap.is_none()) {
            let live = self.server.frame(symbol, entry.seq);
            // Coinbase's first frame of a subscription is the same trade as `last_match`.
            let last_match = live.replacen("\"type\":\"match\"", "\"type\":\"last_match\"", 1);
            let history = self.server.history_item(symbol, entry.seq);
            assert!(
                entry.payload == live
                    || entry.payload == last_match
                    || Some(&entry.payload) == history.as_ref(),
                "{shape}: entry {} is neither the frame nor the history item: {}",
                entry.seq,
                entry.payload
            );
        }
    }
}

/// One side of a book as the fake spells it: (price, quantity).
type Side = Vec<(String, String)>;

impl Run {
    /// The fake's number of the update stored as `payload`, the first after
    /// `after`, for books whose frames carry no id of the book (Coinbase
    /// `level2`, Kraken `book`): the frame it is, but for the connection's
    /// `sequence_num` and a checksum the test corrupted.
    fn fake_frame_id(&self, payload: &str, after: u64) -> u64 {
        let normal = |text: &str| {
            let mut value: serde_json::Value = serde_json::from_str(text).unwrap();
            if let Some(message) = value.as_object_mut() {
                message.remove("sequence_num");
            }
            if let Some(data) = value
                .pointer_mut("/data/0")
                .and_then(serde_json::Value::as_object_mut)
            {
                data.remove("checksum");
            }
            value
        };
        let stored = normal(payload);
        let from = after.max(self.server.config().first_id - 1) + 1;
        (from..=self.server.head(&self.symbol))
            .find(|&id| normal(&self.server.frame(&self.symbol, id)) == stored)
            .unwrap_or_else(|| panic!("no frame after {after} is {payload}"))
    }

    /// The exchange's book after `id`, as a subscriber `depth` deep sees it.
    fn exchange_book(&self, id: u64, depth: Option<usize>) -> (Side, Side) {
        let (mut bids, mut asks) = self.server.book_at(&self.symbol, id);
        if let Some(depth) = depth {
            bids.truncate(depth);
            asks.truncate(depth);
        }
        (bids, asks)
    }

    /// An order book: a snapshot entry first and after every cut (each
    /// later one naming the diffs it replaces), diffs that continue the
    /// snapshot or diff before them by the exchange's rule (Coinbase and
    /// Kraken, whose frames name no book id: the worker's numbers, one
    /// after the other), and a book rebuilt from the entries that equals the
    /// exchange's own book at every snapshot and every diff (Kraken's at the
    /// subscribed depth, with every checksum but the corrupted ones right).
    fn assert_books(&self, shape: ExchangeShape, checksum_resyncs: u64) {
        use leasehold_stream::book::{Book, BookFormat, ChecksumRule, MessageKind, Precision};
        let format = match shape {
            ExchangeShape::BybitOrderbook => BookFormat::Bybit,
            ExchangeShape::OkxBooks => BookFormat::Okx,
            ExchangeShape::CoinbaseLevel2 => BookFormat::Coinbase,
            ExchangeShape::KrakenBook => BookFormat::KrakenV2,
            _ => BookFormat::Binance,
        };
        let settings: BTreeMap<&str, String> = self.server.worked_settings().into_iter().collect();
        let depth: Option<usize> = settings
            .get("UPSTREAM_BOOK_DEPTH")
            .map(|depth| depth.parse().unwrap());
        let precision = settings.get("UPSTREAM_BOOK_PRECISION").map(|value| {
            let (price, qty) = value.split_once(',').unwrap();
            Precision {
                price_decimals: price.parse().unwrap(),
                qty_decimals: qty.parse().unwrap(),
            }
        });
        let snapshots: Vec<&StoredEvent> = self.entries.iter().filter(|e| e.snapshot).collect();
        // A reconnect whose first diff continues the book needs none (a
        // quick one on a slow feed): at most one per cut, and a checksum's.
        let resyncs = snapshots.len() as u64 - 1;
        assert!(
            resyncs >= checksum_resyncs && resyncs <= CUTS + checksum_resyncs,
            "{shape}: {} books for {CUTS} cuts\n{}",
            snapshots.len(),
            self.logs
        );
        assert!(self.entries[0].snapshot && self.entries[0].gap.is_none());
        assert!(
            self.entries.iter().all(|e| e.snapshot || e.gap.is_none()),
            "{shape}: no bare gap marker: a book resyncs instead"
        );
        let mut book = depth.map_or_else(Book::new, Book::with_depth);
        let mut last = 0;
        let mut after_snapshot = false;
        let mut compared = 0;
        // Coinbase and Kraken: the fake's number of the last frame matched,
        // and a snapshot's book until the update after it names its frame.
        let mut fake_id = 0;
        let mut unmatched_snapshot: Option<(Side, Side)> = None;
        let mut checksum_mismatches = 0;
        for (i, entry) in self.entries.iter().enumerate() {
            let message = format
                .read_message(entry.payload.as_bytes())
                .expect("a book message of the shape's format")
                .expect("a book message");
            if entry.snapshot {
                assert_eq!(message.kind, MessageKind::Snapshot);
                if i > 0 {
                    let gap = entry.gap.expect("a later book names what it replaces");
                    assert_eq!(gap.from, last + 1, "{shape}: {entry:?}");
                    assert!(
                        matches!(gap.reason, GapReason::NoReplay | GapReason::Checksum),
                        "{shape}: {entry:?}"
                    );
                }
                after_snapshot = true;
            } else {
                let frame: serde_json::Value = serde_json::from_str(&entry.payload).unwrap();
                let (first, prev) = (frame["U"].as_u64().unwrap_or(0), frame["pu"].as_u64());
                let continues = match (shape, after_snapshot) {
                    // Bybit: `u` is contiguous, from the book's on. Coinbase
                    // and Kraken: the worker's numbers, one after the other
                    // from the book's.
                    (
                        ExchangeShape::BybitOrderbook
                        | ExchangeShape::CoinbaseLevel2
                        | ExchangeShape::KrakenBook,
                        _,
                    ) => entry.seq == last + 1,
                    // OKX: each update names the one before (the book's too).
                    (ExchangeShape::OkxBooks, _) => {
                        frame["data"][0]["prevSeqId"].as_u64() == Some(last)
                    }
                    // Binance's rules: the first diff after a snapshot covers
                    // lastUpdateId + 1 (futures: it starts at or before it).
                    (ExchangeShape::BinanceFuturesDepth, true) => prev.unwrap() <= last,
                    (ExchangeShape::BinanceFuturesDepth, false) => prev == Some(last),
                    (_, true) => first <= last + 1,
                    (_, false) => first == last + 1,
                };
                assert!(continues, "{shape}: {entry:?} does not continue {last}");
                after_snapshot = false;
            }
            book.apply(&message);
            last = entry.seq;
            if shape == ExchangeShape::KrakenBook
                && message.checksum != ChecksumRule::Kraken.compute(&book, precision)
            {
                checksum_mismatches += 1;
            }
            let ours = |levels: Vec<leasehold_stream::book::Level>| -> Side {
                levels
                    .into_iter()
                    .map(|l| (l.price.as_str().to_owned(), l.qty.as_str().to_owned()))
                    .collect()
            };
            let (our_bids, our_asks) = book.top(usize::MAX);
            let rebuilt = (ours(our_bids), ours(our_asks));
            let at = if shape.frames_carry_ids() {
                Some(entry.seq)
            } else if entry.snapshot {
                unmatched_snapshot = Some(rebuilt.clone());
                None
            } else {
                let id = self.fake_frame_id(&entry.payload, fake_id);
                // The book a snapshot holds is the one the update after it
                // continues (for Kraken, frames between changed nothing in
                // the subscribed depth and were not sent).
                if let Some(snapshot) = unmatched_snapshot.take() {
                    assert_eq!(
                        snapshot,
                        self.exchange_book(id - 1, depth),
                        "{shape}: the book before {}",
                        entry.seq
                    );
                    compared += 1;
                }
                fake_id = id;
                Some(id)
            };
            if let Some(id) = at {
                assert_eq!(
                    rebuilt,
                    self.exchange_book(id, depth),
                    "{shape}: the book rebuilt at {} is the exchange's",
                    entry.seq
                );
                compared += 1;
            }
        }
        assert!(compared > 100, "{shape}: {compared} books compared");
        if shape == ExchangeShape::KrakenBook {
            // The corrupted update is stored as received.
            assert_eq!(checksum_mismatches, checksum_resyncs, "{shape}");
        }
        // The first book and each reconnect's; a checksum's own.
        assert_eq!(
            self.snapshots.get("subscribe").copied(),
            Some(1 + resyncs - checksum_resyncs),
            "{shape}: {:?}",
            self.snapshots
        );
        assert_eq!(self.snapshots.get("gap").copied(), Some(0), "{shape}");
        assert_eq!(
            self.snapshots.get("checksum").copied(),
            Some(checksum_resyncs),
            "{shape}"
        );
        assert_eq!(self.checksum_failures, checksum_resyncs, "{shape}");
        let checksum_books = snapshots
            .iter()
            .filter(|e| e.gap.is_some_and(|g| g.reason == GapReason::Checksum))
            .count() as u64;
        assert_eq!(checksum_books, checksum_resyncs, "{shape}");
    }
}

fn config(shape: ExchangeShape) -> ExchangeConfig {
    ExchangeConfig {
        shape,
        rate: RATE,
        first_id: 5_000,
        history_retention: 100_000,
        ..ExchangeConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binance_trades_backfill_every_cut_from_the_rest_history() {
    let _serial = serial().await;
    for shape in [ExchangeShape::BinanceTrade, ExchangeShape::BinanceAggTrade] {
        let mut config = config(shape);
        // The history rate-limits once: the worker waits its Retry-After.
        config.history_status_override = Some(HistoryOverride::too_many_requests(1));
        let Some(run) = run(config, &[]).await else {
            return;
        };
        run.common_checks(shape);
        assert!(run.markers().is_empty(), "{shape}: {:?}", run.markers());
        run.assert_covered(shape);
        run.assert_payloads(shape, &run.symbol);
        // Every hole is covered with no marker (above), so the history filled
        // them; how many requests that took varies: on a slow host a cut can
        // come while the previous hole's fetch waits out its Retry-After, and
        // one request then covers both. The refused one and a retry at least.
        assert!(
            run.server.history_requests() >= 2,
            "{shape}: the history was asked again after its 429"
        );
        assert!(
            run.entries
                .iter()
                .any(|e| e.payload.contains("\"isBuyerMaker\"")
                    || (shape == ExchangeShape::BinanceAggTrade && !e.payload.contains("\"e\""))),
            "{shape}: some entries are history items"
        );
    }
}

/// Binance spot and USD-M depth with REST snapshots, cut three times: the
/// book any reader rebuilds from the sink is the exchange's at every entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binance_books_rebuilt_from_the_sink_are_the_exchanges_at_every_entry() {
    let _serial = serial().await;
    for shape in [
        ExchangeShape::BinanceDepth,
        ExchangeShape::BinanceFuturesDepth,
    ] {
        let Some(run) = run(config(shape), &[]).await else {
            return;
        };
        run.common_checks(shape);
        run.assert_books(shape, 0);
    }
}

/// Books sent in the stream: Bybit v5 (`u` contiguous), OKX (`prevSeqId`
/// chains, CRC32 checksums), Coinbase `level2` (`sequence_num` counts each
/// connection's messages) and Kraken v2 `book` (no sequence, CRC32
/// checksums of a book 10 levels deep), cut three times. OKX and Kraken also
/// send one update with a wrong checksum: the worker finds it on that
/// update, asks for a new book on the connection, and the book's entry says
/// `checksum`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn books_sent_in_the_stream_resync_after_cuts_and_a_checksum_failure() {
    let _serial = serial().await;
    for shape in [
        ExchangeShape::BybitOrderbook,
        ExchangeShape::OkxBooks,
        ExchangeShape::CoinbaseLevel2,
        ExchangeShape::KrakenBook,
    ] {
        let corrupt = shape.has_checksum();
        let Some(run) = run_with(config(shape), &[], |server| {
            if corrupt {
                assert!(server.corrupt_next_checksum());
            }
        })
        .await
        else {
            return;
        };
        run.common_checks(shape);
        run.assert_books(shape, u64::from(corrupt));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_upstreams_record_each_missed_range_as_one_marker() {
    let _serial = serial().await;
    // Binance without its history, and Coinbase by contiguous trade_id.
    for (shape, overrides) in [
        (
            ExchangeShape::BinanceTrade,
            &[("UPSTREAM_RESUME", "live")][..],
        ),
        (ExchangeShape::CoinbaseMatches, &[][..]),
    ] {
        let mut config = config(shape);
        config.history_retention = 0;
        let Some(run) = run(config, overrides).await else {
            return;
        };
        run.common_checks(shape);
        run.assert_covered(shape);
        let markers = run.markers();
        assert!(
            !markers.is_empty() && markers.len() as u64 <= CUTS,
            "{shape}: one marker per cut at most: {markers:?}"
        );
        assert!(
            markers
                .iter()
                .all(|m| m.gap.unwrap().reason == GapReason::NoReplay && m.payload.is_empty()),
            "{shape}: {markers:?}"
        );
        assert_eq!(
            run.entries.first().and_then(|e| e.gap),
            None,
            "{shape}: a stream never written starts at the live position, no marker first"
        );
        run.assert_payloads(shape, &run.symbol);
        if shape == ExchangeShape::CoinbaseMatches {
            assert!(
                run.control_frames > 0,
                "subscriptions and heartbeats are control frames"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn increasing_sequences_store_data_only_and_pings_keep_the_connection() {
    let _serial = serial().await;
    for (shape, overrides) in [
        // Coinbase by its shared `sequence`, which has holes.
        (
            ExchangeShape::CoinbaseMatches,
            &[
                ("UPSTREAM_SEQ_POINTER", "/sequence"),
                ("UPSTREAM_SEQ_STEP", "increasing"),
            ][..],
        ),
        (ExchangeShape::KrakenTrade, &[][..]),
        (ExchangeShape::BybitPublicTrade, &[][..]),
    ] {
        let mut config = config(shape);
        config.history_retention = 0;
        if shape.has_app_ping() {
            // Cut any client silent for 2 s: the worked settings ping every 1 s.
            config.silent_cut_after = Some(Duration::from_secs(2));
        }
        let Some(run) = run(config, overrides).await else {
            return;
        };
        run.common_checks(shape);
        assert!(run.markers().is_empty(), "{shape}: {:?}", run.markers());
        assert!(
            run.control_frames > 0,
            "{shape}: acknowledgements, heartbeats, pongs"
        );
        let data: &[&str] = match shape {
            ExchangeShape::CoinbaseMatches => &["\"type\":\"match\"", "\"type\":\"last_match\""],
            ExchangeShape::KrakenTrade => &["\"channel\":\"trade\""],
            _ => &["\"topic\":\"publicTrade."],
        };
        for entry in &run.entries {
            assert!(
                data.iter().any(|marker| entry.payload.contains(marker)),
                "{shape}: a control frame reached the sink: {}",
                entry.payload
            );
        }
    }
}

/// A fake Binance trade feed without history, one worker with its sidecar
/// reading it in `live` mode, and the stream's first 20 entries written.
struct LiveBinance {
    server: ExchangeServer,
    cluster: Cluster,
    stream: String,
    shutdown: CancellationToken,
}

async fn live_binance() -> Option<LiveBinance> {
    let shape = ExchangeShape::BinanceTrade;
    let mut exchange = config(shape);
    exchange.history_retention = 0;
    let shutdown = CancellationToken::new();
    let server = ExchangeServer::start(([127, 0, 0, 1], 0).into(), exchange, shutdown.clone())
        .await
        .expect("fake exchange starts");
    let stream = unique_symbol(shape);
    let mut cluster = Cluster::start_on(server.ws_url(), vec![stream.clone()]).await?;
    let mut settings: Vec<(&str, String)> = server.worked_settings();
    settings.push(("UPSTREAM_RESUME", "live".into()));
    let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    cluster.start_worker_with_sidecar("w1", &settings);
    let started = Instant::now();
    while cluster.sink_entries(&stream).await.len() < 20 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "nothing written\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Some(LiveBinance {
        server,
        cluster,
        stream,
        shutdown,
    })
}

/// One frame that passes the data match with a far-future id (1e15) at the
/// sequence pointer: the stream is not moved there. The frame is dropped and
/// counted (`reason="jump"`), and the real trades after it keep being written
/// (without the jump bound, a marker up to 1e15 - 1 and then nothing, every
/// real trade a duplicate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bogus_frame_far_ahead_leaves_the_stream_writing_real_ids() {
    let _serial = serial().await;
    let Some(LiveBinance {
        server,
        mut cluster,
        stream,
        shutdown,
    }) = live_binance().await
    else {
        return;
    };
    let before = cluster.sink_entries(&stream).await.last().unwrap().seq;
    let bogus = server
        .frame(&stream, before)
        .replace(&format!("\"t\":{before},"), "\"t\":1000000000000000,");
    assert!(bogus.contains("\"t\":1000000000000000,"), "{bogus}");
    assert_eq!(server.inject(&bogus), 1, "one connection to send it on");
    // A second of trades after it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let body = metrics(&cluster, "w1").await;
    let skipped = samples(&body, "leasehold_upstream_frames_skipped_total");
    cluster.stop_workers();
    let entries = cluster.sink_entries(&stream).await;
    shutdown.cancel();
    let last = entries.last().unwrap().seq;
    assert!(
        last > before + 50 && last < 1_000_000,
        "real ids written after the bogus frame: {before} then {last}"
    );
    assert!(
        entries.iter().all(|e| e.gap.is_none()),
        "no marker: {:?}",
        entries
            .iter()
            .filter(|e| e.gap.is_some())
            .collect::<Vec<_>>()
    );
    assert_eq!(skipped.get("jump").copied(), Some(1), "{skipped:?}");
}

/// An exchange restart: the fake cuts every connection and its trade ids
/// start over at 1. The stream writes a reset entry (a new epoch: its token
/// above the old one's) and the new trades after it, the reset is counted
/// (the alert's expression, `increase(leasehold_stream_resets_total[10m]) >
/// 0`, is then true), and the ids in the sink keep increasing (without
/// resets, every new trade is a "duplicate" and nothing is written again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exchange_restart_is_recorded_as_a_reset_and_the_new_ids_are_written() {
    let _serial = serial().await;
    let Some(LiveBinance {
        server,
        mut cluster,
        stream,
        shutdown,
    }) = live_binance().await
    else {
        return;
    };
    assert_eq!(server.restart(), 1, "one connection cut by the restart");
    let restarted = Instant::now();
    let (entries, at) = loop {
        let entries = cluster.sink_entries(&stream).await;
        if let Some(at) = entries.iter().position(|e| e.reset.is_some())
            && entries.len() > at + 20
        {
            break (entries, at);
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(30),
            "no reset entry and new trades within 30 s of the restart: {:?}\n{}",
            entries.iter().rev().take(5).collect::<Vec<_>>(),
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let body = metrics(&cluster, "w1").await;
    let resets = body
        .lines()
        .find_map(|line| line.strip_prefix("leasehold_stream_resets_total "))
        .and_then(|value| value.trim().parse::<f64>().ok());
    cluster.stop_workers();
    shutdown.cancel();
    assert_eq!(resets, Some(1.0), "counted once");
    let old_last = entries[at - 1].seq;
    let reset = &entries[at];
    let mark = reset.reset.unwrap();
    assert_eq!(
        mark.from, old_last,
        "reset_from is the last sequence before"
    );
    assert!(
        mark.to >= 1 && mark.to < 1_000 && mark.to < old_last,
        "reset_to is the restarted id: {mark:?}"
    );
    assert_eq!(
        reset.seq,
        mark.to - 1,
        "the entry sits just before reset_to"
    );
    assert!(
        reset.fence_token > entries[at - 1].fence_token,
        "a new epoch: {} after {}",
        reset.fence_token,
        entries[at - 1].fence_token
    );
    let after = &entries[at + 1..];
    assert_eq!(after[0].seq, mark.to);
    assert!(
        after
            .windows(2)
            .all(|w| w[1].seq > w[0].seq && w[1].fence_token == reset.fence_token),
        "the new epoch is written in order under its token"
    );
    assert!(after.iter().all(|e| e.reset.is_none()), "one reset");
}

/// The exchange cuts every connection at 3 s of age (Binance: 24 h); with
/// `UPSTREAM_MAX_CONNECTION_AGE_MS=1800` the worker replaces each one before
/// that, overlapping the two, so a `live` stream (no history to fill a hole)
/// records every trade once, with no marker and no reconnect. Without the
/// setting the same run leaves one marker per cut (checked too, so the
/// exchange's cuts are known to bite).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_replaced_before_the_exchanges_age_leave_no_gap_on_a_live_stream() {
    let _serial = serial().await;
    for max_age in ["1800", "0"] {
        let shape = ExchangeShape::BinanceTrade;
        let mut config = config(shape);
        config.history_retention = 0;
        config.cut_every = Some(Duration::from_secs(3));
        let shutdown = CancellationToken::new();
        let server = ExchangeServer::start(([127, 0, 0, 1], 0).into(), config, shutdown.clone())
            .await
            .expect("fake exchange starts");
        let stream = unique_symbol(shape);
        let Some(mut cluster) = Cluster::start_on(server.ws_url(), vec![stream.clone()]).await
        else {
            return;
        };
        let mut settings: Vec<(&str, String)> = server.worked_settings();
        settings.push(("UPSTREAM_RESUME", "live".into()));
        settings.push(("UPSTREAM_MAX_CONNECTION_AGE_MS", max_age.into()));
        let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
        cluster.start_worker_with_sidecar("w1", &settings);
        let started = Instant::now();
        while cluster.sink_entries(&stream).await.is_empty() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "nothing reached the sink\n{}",
                cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Three of the exchange's ages.
        tokio::time::sleep(Duration::from_millis(9_500)).await;
        let body = metrics(&cluster, "w1").await;
        let reconnects: u64 = samples(&body, "leasehold_websocket_reconnects_total")
            .values()
            .sum();
        cluster.stop_workers();
        let entries = cluster.sink_entries(&stream).await;
        let logs = cluster.logs();
        let markers = entries.iter().filter(|e| e.gap.is_some()).count();
        let ids: Vec<u64> = entries.iter().map(|e| e.seq).collect();
        let accepted = server.connections_accepted();
        shutdown.cancel();
        assert!(
            entries.len() > 100,
            "{max_age}: {} entries\n{logs}",
            entries.len()
        );
        if max_age == "0" {
            assert!(
                markers >= 2,
                "the exchange's cuts leave markers: {markers}\n{logs}"
            );
            continue;
        }
        assert_eq!(
            markers,
            0,
            "no marker: {:?}\n{logs}",
            entries
                .iter()
                .filter(|e| e.gap.is_some())
                .collect::<Vec<_>>()
        );
        assert!(
            ids.windows(2).all(|w| w[1] == w[0] + 1),
            "every trade once, in order\n{logs}"
        );
        assert_eq!(
            reconnects, 0,
            "a planned replacement is no reconnect\n{logs}"
        );
        assert!(
            accepted >= 5,
            "replaced about every 1.8 s: {accepted} connections"
        );
    }
}

/// A rolling deploy of three workers on a `live` upstream (Binance trades,
/// no history, 200 a second per stream), each replacement started first:
/// every hand-off overlaps, the balancer's hand-backs to the replacement and
/// the old worker's drain alike (`HANDOFF_LISTEN`): the successor subscribes
/// each stream before it is released, and the old owner writes up to the
/// successor's first frame. Every trade is in the sink once, in order, with
/// no marker. With `HANDOFF_PREPARE_TIMEOUT_MS=0` (release, then the
/// successor subscribes) the same deploy leaves markers, which shows the
/// upstream's pace makes the window bite. Both discovery modes: in scan
/// discovery the release names the successor (`handed_to`), so a peer's
/// scan in the moment between release and the successor's acquire does not
/// take the stream cold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_deploy_on_a_live_upstream_overlaps_every_hand_off_and_loses_nothing() {
    let _serial = serial().await;
    for (prepare, discovery, lease_mode) in [
        ("5000", "scan", "per-stream"),
        ("5000", "assigned", "session"),
        ("0", "scan", "per-stream"),
    ] {
        let shape = ExchangeShape::BinanceTrade;
        let mut config = config(shape);
        config.history_retention = 0;
        config.rate = 200.0;
        let shutdown = CancellationToken::new();
        let server = ExchangeServer::start(([127, 0, 0, 1], 0).into(), config, shutdown.clone())
            .await
            .expect("fake exchange starts");
        let streams: Vec<String> = (0..6).map(|_| unique_symbol(shape)).collect();
        let Some(mut cluster) = Cluster::start_on(server.ws_url(), streams.clone()).await else {
            return;
        };
        let mut settings: Vec<(&str, String)> = server.worked_settings();
        settings.extend([
            ("UPSTREAM_RESUME", "live".into()),
            ("HANDOFF_LISTEN", "127.0.0.1:0".into()),
            ("HANDOFF_PREPARE_TIMEOUT_MS", prepare.into()),
            ("DISCOVERY_INTERVAL_MS", "1000".into()),
            ("DISCOVERY_MODE", discovery.into()),
            ("LEASE_MODE", lease_mode.into()),
        ]);
        let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let olds = ["w1", "w2", "w3"];
        for old in olds {
            cluster.start_worker_with(old, &settings);
        }
        let share = |o: &BTreeMap<String, String>, w: &str| o.values().filter(|x| *x == w).count();
        cluster
            .wait_owners(Duration::from_secs(40), |o| {
                o.len() == 6 && olds.iter().all(|w| share(o, w) == 2)
            })
            .await;
        for (round, old) in olds.iter().enumerate() {
            let new = format!("n{}", round + 1);
            cluster.start_worker_with(&new, &settings);
            // The balancer hands the replacement its share.
            cluster
                .wait_owners(Duration::from_secs(40), |o| {
                    o.len() == 6 && share(o, &new) >= 1
                })
                .await;
            cluster.workers[*old].signal("TERM");
            cluster
                .wait_owners(Duration::from_secs(40), |o| {
                    o.len() == 6 && share(o, old) == 0
                })
                .await;
            let mut worker = cluster.workers.remove(*old).unwrap();
            assert!(worker.wait_exit(Duration::from_secs(20)).success(), "{old}");
        }
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        cluster.stop_workers();
        let logs = cluster.logs();
        let (mut markers, mut missed, mut resets, mut handoffs, mut broken) =
            (0, 0, 0, 0, Vec::new());
        for stream in &streams {
            let entries = cluster.sink_entries(stream).await;
            // It flowed through the deploy (a second of trades at least),
            // whatever a release-first hand-off lost on the way.
            let span = entries
                .last()
                .map_or(0, |e| e.seq)
                .saturating_sub(entries.first().map_or(0, |e| e.seq));
            assert!(
                span > 200,
                "{stream}: {span} sequences written or marked\n{logs}"
            );
            for marker in entries.iter().filter(|e| e.gap.is_some()) {
                eprintln!("{stream}: marker {marker:?}");
            }
            markers += entries.iter().filter(|e| e.gap.is_some()).count();
            missed += entries
                .iter()
                .filter_map(|e| Some(e.seq - e.gap?.from + 1))
                .sum::<u64>();
            resets += entries.iter().filter(|e| e.reset.is_some()).count();
            // Every acquire raised the token: the hand-offs the stream saw.
            let tokens = entries.iter().map(|e| e.fence_token);
            handoffs += tokens.clone().max().unwrap_or(0) - tokens.min().unwrap_or(0);
            // (seq, token) on both sides of each break: who wrote what.
            broken.extend(
                entries
                    .windows(2)
                    .filter(|w| w[1].seq != w[0].seq + 1)
                    .map(|w| {
                        (
                            stream.clone(),
                            (w[0].seq, w[0].fence_token),
                            (w[1].seq, w[1].fence_token),
                        )
                    }),
            );
        }
        shutdown.cancel();
        assert!(
            handoffs >= 6,
            "every stream moved at least once: {handoffs}\n{logs}"
        );
        eprintln!(
            "HANDOFF_PREPARE_TIMEOUT_MS={prepare} DISCOVERY_MODE={discovery}: {handoffs} hand-offs, \
             {markers} markers, {missed} trades missed ({:.1} per hand-off)",
            missed as f64 / handoffs.max(1) as f64
        );
        if prepare == "0" {
            assert!(
                markers >= 1,
                "releasing first loses trades: no marker\n{logs}"
            );
        } else {
            assert_eq!(
                markers, 0,
                "an overlapped hand-off leaves no marker ({discovery})\n{logs}"
            );
            assert!(
                broken.is_empty() && resets == 0,
                "every trade once, in order, no reset: {broken:?}, {resets} resets\n{logs}"
            );
        }
    }
}
