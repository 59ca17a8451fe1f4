//! Real exchange sessions (`testdata/recordings/`, see its README) served
//! back to real workers by a local server that behaves like the exchange
//! did, on a timeline of its own:
//!
//! - Each instrument (a Binance symbol, a Kraken pair) replays on its own
//!   clock, started by its first connection (Binance) or subscription
//!   (Kraken), at the recording's first book of it. Its recorded frames
//!   are due at their recorded times (Binance: the exchange's `E`, see
//!   [`BinanceDiff::at`]; Kraken: when received), compressed so that the
//!   whole ~30 s session takes `replay` (a few seconds): the instruments
//!   keep their recorded pace relative to each other, and every one ends
//!   at about the same time.
//! - A connection gets the frames due while it is open. The clock does not
//!   wait for anybody: frames due while a client was away (after
//!   [`RecordingServer::cut_all`]) are missed, as on a real exchange.
//! - Order books come as the recording gives them: the recorded snapshot,
//!   and after the replay has moved on, that snapshot with every recorded
//!   update due so far applied (Binance's REST depth, Kraken's snapshot after
//!   a re-subscribe), in the recording's own spelling of every level.
//!
//! The WebSocket side is tokio-tungstenite; the Binance REST depth is an
//! axum route. One port serves both: the request line of each connection
//! says which (the workspace builds axum without its `ws` feature).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::{SinkExt, StreamExt};
use leasehold_stream::book::{Book, BookFormat, Decimal, Level};
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{
    ErrorResponse, Request, Response as Handshake,
};
use tokio_tungstenite::tungstenite::http;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;

/// Levels a side of the Kraken book the recording subscribed to
/// (`"depth":1000`): Kraken sends no removal for a level pushed past it.
pub const KRAKEN_DEPTH: usize = 1000;

fn recording_text(name: &str) -> String {
    let path = leasehold_testkit::repo_root()
        .join("testdata/recordings")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The received frames of a `.ws.` recording with their unix times, in
/// order: the first line is the URL, lines starting with it are frames the
/// client sent.
fn received_frames(text: &str) -> Vec<(f64, &str)> {
    let mut lines = text.lines();
    let url = lines.next().unwrap().split(' ').next().unwrap();
    lines
        .filter(|line| !line.is_empty() && !line.starts_with(url))
        .map(|line| {
            let (at, frame) = line.split_once(": ").unwrap();
            (at.parse().unwrap(), frame)
        })
        .collect()
}

/// A Binance time (ms) in unix seconds.
fn seconds(ms: &Value) -> f64 {
    ms.as_u64().unwrap() as f64 / 1000.0
}

/// One recorded `depthUpdate` of a Binance USD-M futures symbol.
#[derive(Debug, Clone)]
pub struct BinanceDiff {
    /// When the exchange sent it (`E`, unix seconds). Not when it was
    /// received: the recorder read nothing while it fetched the four REST
    /// snapshots one after the other, then received a second of diffs (25)
    /// within 1 ms. Replayed by those times, a snapshot would come ahead of
    /// diffs the exchange had sent before it.
    pub at: f64,
    /// The `data` object of the combined-stream frame, as recorded: what a
    /// single-stream connection receives.
    pub body: String,
    /// `U`.
    pub first: u64,
    /// `u`.
    pub last: u64,
    /// `pu`: the previous diff's `u`.
    pub prev: u64,
}

/// One symbol of the Binance futures session.
#[derive(Debug, Clone)]
pub struct BinanceSymbol {
    /// As REST spells it (`SUSHIUSDT`).
    pub symbol: String,
    /// The recorded REST depth body.
    pub snapshot: String,
    /// Its `lastUpdateId`.
    pub snapshot_id: u64,
    /// When the exchange made it (`E`, unix seconds).
    pub snapshot_at: f64,
    /// Every recorded diff, in order (also those the snapshot contains).
    pub diffs: Vec<BinanceDiff>,
}

/// `BINANCE_FUTURES.ws.1.0` and its REST snapshots, by stream id (the
/// lower-case symbol, as the WebSocket path spells it).
#[derive(Debug, Clone)]
pub struct BinanceFutures {
    pub symbols: BTreeMap<String, BinanceSymbol>,
}

impl BinanceFutures {
    pub fn load() -> BinanceFutures {
        let http = recording_text("BINANCE_FUTURES.http.0.0");
        let mut snapshots: HashMap<String, String> = HashMap::new();
        for line in http.lines().filter(|line| !line.is_empty()) {
            // `<url> -> <time>: <body>`, the URL naming `symbol=…`
            let (url, rest) = line.split_once(" -> ").unwrap();
            let symbol = url.split_once("symbol=").unwrap().1.split('&').next();
            let body = rest.split_once(": ").unwrap().1;
            snapshots.insert(symbol.unwrap().to_owned(), body.to_owned());
        }
        let ws = recording_text("BINANCE_FUTURES.ws.1.0");
        let mut symbols: BTreeMap<String, BinanceSymbol> = BTreeMap::new();
        for (_, frame) in received_frames(&ws) {
            // `{"stream":"…","data":{…}}`: the data object's own text, so a
            // stored payload can be compared with the recording byte for byte.
            let body = frame
                .split_once(",\"data\":")
                .and_then(|(_, rest)| rest.strip_suffix('}'))
                .unwrap();
            let data: Value = serde_json::from_str(body).unwrap();
            let whole: Value = serde_json::from_str(frame).unwrap();
            assert_eq!(data, whole["data"], "the data object of {frame}");
            if data["e"] != "depthUpdate" {
                continue;
            }
            let symbol = data["s"].as_str().unwrap();
            let number = |key: &str| data[key].as_u64().unwrap();
            let entry = symbols
                .entry(symbol.to_ascii_lowercase())
                .or_insert_with(|| {
                    let snapshot = snapshots[symbol].clone();
                    let head: Value = serde_json::from_str(&snapshot).unwrap();
                    BinanceSymbol {
                        symbol: symbol.to_owned(),
                        snapshot_id: head["lastUpdateId"].as_u64().unwrap(),
                        snapshot_at: seconds(&head["E"]),
                        snapshot,
                        diffs: Vec::new(),
                    }
                });
            entry.diffs.push(BinanceDiff {
                at: seconds(&data["E"]),
                body: body.to_owned(),
                first: number("U"),
                last: number("u"),
                prev: number("pu"),
            });
        }
        assert_eq!(symbols.len(), snapshots.len(), "a snapshot per symbol");
        BinanceFutures { symbols }
    }
}

impl BinanceSymbol {
    /// The index of the first diff the recorded snapshot does not contain.
    pub fn first_after_snapshot(&self) -> usize {
        self.diffs.partition_point(|d| d.last <= self.snapshot_id)
    }

    /// The index of the first diff a book at `update_id` does not contain.
    pub fn first_after(&self, update_id: u64) -> usize {
        self.diffs.partition_point(|d| d.last <= update_id)
    }

    /// The diffs applied to the recorded snapshot to get the book at
    /// `update_id`; `None` unless `update_id` is the snapshot's or a later
    /// diff's `u` (the recording knows no book in between).
    fn diffs_to(&self, update_id: u64) -> Option<&[BinanceDiff]> {
        let from = self.first_after_snapshot();
        if update_id == self.snapshot_id {
            return Some(&[]);
        }
        let end = from
            + self.diffs[from..]
                .iter()
                .position(|d| d.last == update_id)?;
        Some(&self.diffs[from..=end])
    }

    /// The book the recording gives at `update_id` (see [`Self::diffs_to`]).
    pub fn book_at(&self, update_id: u64) -> Option<Book> {
        let diffs = self.diffs_to(update_id)?;
        let bodies = diffs.iter().map(|d| d.body.as_bytes());
        Some(Book::rebuild(BookFormat::Binance, None, self.snapshot.as_bytes(), bodies).unwrap())
    }

    /// `GET /fapi/v1/depth` while `due` diffs are due: the recorded snapshot
    /// until the replay passes its id, then that snapshot with every diff up
    /// to the newest due applied, `lastUpdateId` that diff's `u`. Every level
    /// (the recorded snapshot already stops at `limit=1000`; cutting the
    /// book again would drop levels the worker's book keeps).
    pub fn rest_depth(&self, due: usize) -> (u64, String) {
        let from = self.first_after_snapshot();
        if due <= from {
            return (self.snapshot_id, self.snapshot.clone());
        }
        let newest = &self.diffs[due - 1];
        let book = self.book_at(newest.last).unwrap();
        let side = |levels: Vec<(&Decimal, &Decimal)>| {
            let levels: Vec<[&str; 2]> = levels
                .into_iter()
                .map(|(price, qty)| [price.as_str(), qty.as_str()])
                .collect();
            serde_json::to_string(&levels).unwrap()
        };
        let data: Value = serde_json::from_str(&newest.body).unwrap();
        // Binance's own key order: lastUpdateId, E (message time), T
        // (transaction time), bids best first, asks best first.
        let body = format!(
            r#"{{"lastUpdateId":{},"E":{},"T":{},"bids":{},"asks":{}}}"#,
            newest.last,
            data["E"],
            data["T"],
            side(book.bids().collect()),
            side(book.asks().collect()),
        );
        (newest.last, body)
    }
}

/// One pair of the Kraken v1 session.
#[derive(Debug, Clone)]
pub struct KrakenPair {
    /// `XBT/CHF`.
    pub pair: String,
    /// The recorded `channelID`, first in every book frame.
    pub channel_id: u64,
    /// The recorded snapshot frame.
    pub snapshot: String,
    /// When it was received (unix seconds).
    pub snapshot_at: f64,
    /// Every recorded update frame, in order, with when it was received.
    pub updates: Vec<(f64, String)>,
}

/// `KRAKEN.ws.50.0`, by pair.
#[derive(Debug, Clone)]
pub struct Kraken {
    pub pairs: BTreeMap<String, KrakenPair>,
}

impl Kraken {
    pub fn load() -> Kraken {
        let text = recording_text("KRAKEN.ws.50.0");
        let mut pairs: BTreeMap<String, KrakenPair> = BTreeMap::new();
        for (at, frame) in received_frames(&text) {
            let value: Value = serde_json::from_str(frame).unwrap();
            // Book frames are arrays ending with the pair; objects are events
            // (status, subscriptions, heartbeats), sent by the server itself.
            let Some(items) = value.as_array() else {
                continue;
            };
            let pair = items.last().and_then(Value::as_str).unwrap();
            if items[1].get("as").is_some() {
                let previous = pairs.insert(
                    pair.to_owned(),
                    KrakenPair {
                        pair: pair.to_owned(),
                        channel_id: items[0].as_u64().unwrap(),
                        snapshot: frame.to_owned(),
                        snapshot_at: at,
                        updates: Vec::new(),
                    },
                );
                assert!(previous.is_none(), "{pair}: one snapshot");
            } else {
                let entry = pairs.get_mut(pair).expect("an update after its snapshot");
                entry.updates.push((at, frame.to_owned()));
            }
        }
        Kraken { pairs }
    }
}

/// A Kraken v1 book side as the recording spells it: price → (volume,
/// timestamp), for snapshots made of the recorded strings.
type KrakenSide = BTreeMap<Decimal, (String, String)>;

fn kraken_levels(object: &Value, key: &str, side: &mut KrakenSide) {
    let Some(levels) = object.get(key).and_then(Value::as_array) else {
        return;
    };
    for level in levels {
        // [price, volume, timestamp] (a fourth item, "r", marks a republish)
        let text = |i: usize| level[i].as_str().unwrap().to_owned();
        let price = Decimal::parse(level[0].as_str().unwrap()).unwrap();
        // Removed first: the spelling last received is the one kept, as
        // Kraken's checksum is computed from it.
        side.remove(&price);
        if !Decimal::parse(&text(1)).unwrap().is_zero() {
            side.insert(price, (text(1), text(2)));
        }
    }
}

impl KrakenPair {
    /// The book after the first `applied` recorded updates, kept by
    /// `leasehold_stream::book` at the subscribed depth (independent of the
    /// server's own spelling in [`Self::snapshot_after`]).
    pub fn book_after(&self, applied: usize) -> Book {
        let updates = self.updates[..applied].iter().map(|(_, u)| u.as_bytes());
        Book::rebuild(
            BookFormat::KrakenV1,
            Some(KRAKEN_DEPTH),
            self.snapshot.as_bytes(),
            updates,
        )
        .unwrap()
    }

    /// The snapshot a subscription gets when `applied` updates are due: the
    /// recorded one before any, else the recorded book with those updates
    /// applied, in Kraken v1's snapshot shape with the recorded strings
    /// (price, volume, timestamp), at most the subscribed depth a side.
    pub fn snapshot_after(&self, applied: usize) -> String {
        if applied == 0 {
            return self.snapshot.clone();
        }
        let (mut asks, mut bids) = (KrakenSide::new(), KrakenSide::new());
        let snapshot: Value = serde_json::from_str(&self.snapshot).unwrap();
        kraken_levels(&snapshot[1], "as", &mut asks);
        kraken_levels(&snapshot[1], "bs", &mut bids);
        for (_, update) in &self.updates[..applied] {
            let update: Value = serde_json::from_str(update).unwrap();
            let items = update.as_array().unwrap();
            // [channelID, {"a"…}, ({"b"…},) "book-1000", pair]
            for object in &items[1..items.len() - 2] {
                kraken_levels(object, "a", &mut asks);
                kraken_levels(object, "b", &mut bids);
            }
            // The book is the subscribed depth: the worst levels go.
            while asks.len() > KRAKEN_DEPTH {
                asks.pop_last();
            }
            while bids.len() > KRAKEN_DEPTH {
                bids.pop_first();
            }
        }
        let side = |levels: Vec<(&Decimal, &(String, String))>| {
            let levels: Vec<[&str; 3]> = levels
                .into_iter()
                .map(|(price, (volume, at))| [price.as_str(), volume.as_str(), at.as_str()])
                .collect();
            serde_json::to_string(&levels).unwrap()
        };
        format!(
            r#"[{},{{"as":{},"bs":{}}},"book-{KRAKEN_DEPTH}",{}]"#,
            self.channel_id,
            side(asks.iter().collect()),
            side(bids.iter().rev().collect()),
            serde_json::to_string(&self.pair).unwrap(),
        )
    }
}

/// One instrument's frames on the server's timeline. It starts with the
/// recording's first book of the instrument: frames before that (Binance
/// diffs the REST snapshot already contains) are never sent, the recording
/// having no book to serve along with them.
struct Replay {
    /// Frames before the first book.
    first: usize,
    /// When each frame from `first` on is due after the replay started.
    offsets: Vec<Duration>,
    started: Option<Instant>,
}

impl Replay {
    /// Frames at `times` (unix seconds), the replay starting with the book
    /// made at `start` and with frame `first`, compressed by `scale`.
    fn new(times: &[f64], first: usize, start: f64, scale: f64) -> Replay {
        let offsets = times[first..]
            .iter()
            .map(|at| Duration::from_secs_f64(((at - start) * scale).max(0.0)))
            .collect();
        Replay {
            first,
            offsets,
            started: None,
        }
    }

    /// Frames due at `now`, counting those before the first book.
    fn due(&self, now: Instant) -> usize {
        let Some(started) = self.started else {
            return self.first;
        };
        self.first
            + self
                .offsets
                .partition_point(|offset| started + *offset <= now)
    }

    /// When frame `index` is due (`None`: there is none, or no clock yet).
    fn due_at(&self, index: usize) -> Option<Instant> {
        let offset = self.offsets.get(index.checked_sub(self.first)?)?;
        Some(self.started? + *offset)
    }

    /// Every frame, those before the first book included.
    fn len(&self) -> usize {
        self.first + self.offsets.len()
    }
}

enum Exchange {
    BinanceFutures(Arc<BinanceFutures>),
    Kraken(Arc<Kraken>),
}

/// A snapshot the server sent: Binance's REST answer, or a Kraken snapshot
/// frame.
#[derive(Debug, Clone)]
pub struct Served {
    /// The stream id (Binance lower-case symbol, Kraken pair).
    pub instrument: String,
    /// Recorded updates (Kraken) or diffs (Binance) due when it was made.
    pub due: usize,
    pub body: String,
}

struct Shared {
    exchange: Exchange,
    replays: Mutex<BTreeMap<String, Replay>>,
    /// Open WebSocket sessions by number, each with the token that cuts it.
    open: Mutex<HashMap<u64, CancellationToken>>,
    accepted: AtomicU64,
    cuts: AtomicU64,
    served: Mutex<Vec<Served>>,
    shutdown: CancellationToken,
}

impl Shared {
    /// Starts `instrument`'s replay if it has not started; returns the
    /// index of the first frame the caller gets: frames due before were
    /// sent to whoever was connected then.
    fn join(&self, instrument: &str) -> usize {
        let now = Instant::now();
        let mut replays = self.replays.lock().unwrap();
        let replay = replays.get_mut(instrument).unwrap();
        if replay.started.is_none() {
            replay.started = Some(now);
            // A frame due at once is this caller's too.
            return replay.first;
        }
        replay.due(now)
    }

    fn due(&self, instrument: &str) -> usize {
        self.replays.lock().unwrap()[instrument].due(Instant::now())
    }

    fn due_at(&self, instrument: &str, index: usize) -> Option<Instant> {
        self.replays.lock().unwrap()[instrument].due_at(index)
    }

    fn serve(&self, instrument: &str, due: usize, body: &str) {
        self.served.lock().unwrap().push(Served {
            instrument: instrument.to_owned(),
            due,
            body: body.to_owned(),
        });
    }
}

/// The recording server (see the module doc); stops when dropped.
pub struct RecordingServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    replay: Duration,
}

impl Drop for RecordingServer {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
    }
}

impl RecordingServer {
    /// Binance USD-M futures: `/ws/<symbol>@depth@100ms` and
    /// `GET /fapi/v1/depth?symbol=SYMBOL`; the session takes `replay`.
    pub async fn binance_futures(recording: Arc<BinanceFutures>, replay: Duration) -> Self {
        let symbols = &recording.symbols;
        // Each symbol from its snapshot on, by the exchange's times.
        let spans = symbols
            .values()
            .map(|s| s.diffs.last().unwrap().at - s.snapshot_at);
        let scale = replay.as_secs_f64() / spans.fold(0.0, f64::max);
        let replays = (symbols.iter())
            .map(|(id, symbol)| {
                let times: Vec<f64> = symbol.diffs.iter().map(|d| d.at).collect();
                let first = symbol.first_after_snapshot();
                let replay = Replay::new(&times, first, symbol.snapshot_at, scale);
                (id.clone(), replay)
            })
            .collect();
        Self::start(Exchange::BinanceFutures(recording), replays, replay).await
    }

    /// Kraken WebSocket v1 on `/`: subscribe to `book` depth 1000 by pair;
    /// the session takes `replay`.
    pub async fn kraken(recording: Arc<Kraken>, replay: Duration) -> Self {
        let pairs = &recording.pairs;
        // Each pair from its snapshot on.
        let spans = (pairs.values()).filter_map(|p| Some(p.updates.last()?.0 - p.snapshot_at));
        let scale = replay.as_secs_f64() / spans.fold(0.0, f64::max);
        let replays = (pairs.iter())
            .map(|(id, pair)| {
                let times: Vec<f64> = pair.updates.iter().map(|(at, _)| *at).collect();
                (id.clone(), Replay::new(&times, 0, pair.snapshot_at, scale))
            })
            .collect();
        Self::start(Exchange::Kraken(recording), replays, replay).await
    }

    async fn start(
        exchange: Exchange,
        replays: BTreeMap<String, Replay>,
        replay: Duration,
    ) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            exchange,
            replays: Mutex::new(replays),
            open: Mutex::new(HashMap::new()),
            accepted: AtomicU64::new(0),
            cuts: AtomicU64::new(0),
            served: Mutex::new(Vec::new()),
            shutdown: CancellationToken::new(),
        });
        let (rest, handed) = mpsc::channel(64);
        let router = Router::new()
            .route("/fapi/v1/depth", get(binance_depth))
            .with_state(shared.clone());
        let handed = Handed {
            connections: handed,
            addr,
        };
        let stop = shared.shutdown.clone().cancelled_owned();
        tokio::spawn(async move {
            let _ = axum::serve(handed, router)
                .with_graceful_shutdown(stop)
                .await;
        });
        tokio::spawn(accept_loop(listener, shared.clone(), rest));
        RecordingServer {
            addr,
            shared,
            replay,
        }
    }

    /// `UPSTREAM_URL` (Binance: with `{stream_id}` in the path).
    pub fn ws_url(&self) -> String {
        match self.shared.exchange {
            Exchange::BinanceFutures(_) => {
                format!("ws://{}/ws/{{stream_id}}@depth@100ms", self.addr)
            }
            Exchange::Kraken(_) => format!("ws://{}/", self.addr),
        }
    }

    /// The stream worker's settings for this exchange, as a user sets them
    /// (docs/upstreams.md), with stream ids spelled as the exchange does:
    /// Binance's lower-case symbol, Kraken's pair (`XBT/CHF`: a stream id
    /// may hold `/`, and `{stream_id}` is JSON-escaped in the subscribe).
    pub fn worker_settings(&self) -> Vec<(&'static str, String)> {
        let mut settings = vec![("UPSTREAM_URL", self.ws_url())];
        let mut set = |name: &'static str, value: &str| settings.push((name, value.to_owned()));
        match self.shared.exchange {
            Exchange::BinanceFutures(_) => {
                set("UPSTREAM_SUBSCRIBE", "");
                set("UPSTREAM_RESUME", "snapshot");
                // A diff covers pu + 1..=u; its id is u.
                set("UPSTREAM_SEQ_POINTER", "/u");
                set("UPSTREAM_SEQ_PREV_POINTER", "/pu");
                set("UPSTREAM_SEQ_STEP", "increasing");
                set("UPSTREAM_ID_POINTER", "/u");
                set("UPSTREAM_DATA_MATCH", "/e=depthUpdate");
                // No UPSTREAM_TS_POINTER: the recording's times are of 2021,
                // a lag of years says nothing here.
                set(
                    "UPSTREAM_SNAPSHOT_URL",
                    &format!(
                        "http://{}/fapi/v1/depth?symbol={{stream_id_upper}}&limit=1000",
                        self.addr
                    ),
                );
                set("UPSTREAM_SNAPSHOT_SEQ_POINTER", "/lastUpdateId");
            }
            Exchange::Kraken(_) => {
                let subscription =
                    r#""pair":["{stream_id}"],"subscription":{"name":"book","depth":1000}"#;
                set(
                    "UPSTREAM_SUBSCRIBE",
                    &format!(r#"{{"event":"subscribe",{subscription}}}"#),
                );
                // Unsubscribe then subscribe brings a new snapshot (after a
                // checksum failure).
                set(
                    "UPSTREAM_UNSUBSCRIBE",
                    &format!(r#"{{"event":"unsubscribe",{subscription}}}"#),
                );
                set("UPSTREAM_RESUME", "snapshot");
                // No sequence in the frames: the worker numbers them, the
                // first snapshot of a connection after the stream's last.
                set("UPSTREAM_SEQ_POINTER", "none");
                set("UPSTREAM_ID_POINTER", "none");
                // The snapshot has `as`, updates `a` and/or `b`; book frames
                // end "book-1000", PAIR (one or two objects before them).
                set("UPSTREAM_SNAPSHOT_MATCH", "/1/as");
                set("UPSTREAM_DATA_MATCH", "/2=book-1000,/3=book-1000");
                set("UPSTREAM_BOOK_CHECKSUM", "kraken");
                set("UPSTREAM_BOOK_DEPTH", &KRAKEN_DEPTH.to_string());
            }
        }
        settings
    }

    /// How long the whole session takes.
    pub fn replay(&self) -> Duration {
        self.replay
    }

    /// When each of `instruments` started replaying (`None`: not yet).
    pub fn started(&self, instruments: &[String]) -> Vec<Option<Instant>> {
        let replays = self.shared.replays.lock().unwrap();
        instruments.iter().map(|i| replays[i].started).collect()
    }

    /// Whether every one of `instruments` started and has every recorded
    /// frame due: the replay is over (the last frames may be in flight).
    pub fn ended(&self, instruments: &[String]) -> bool {
        let now = Instant::now();
        let replays = self.shared.replays.lock().unwrap();
        (instruments.iter())
            .all(|i| replays[i].started.is_some() && replays[i].due(now) == replays[i].len())
    }

    /// Closes every open WebSocket connection; returns how many. Odd
    /// connections get a close frame, even ones are dropped without one:
    /// real exchanges do both.
    pub fn cut_all(&self) -> usize {
        let open = self.shared.open.lock().unwrap();
        let mut cut = 0;
        for token in open.values().filter(|token| !token.is_cancelled()) {
            token.cancel();
            cut += 1;
        }
        self.shared.cuts.fetch_add(cut as u64, Ordering::Relaxed);
        cut
    }

    /// Connections cut so far.
    pub fn cuts(&self) -> u64 {
        self.shared.cuts.load(Ordering::Relaxed)
    }

    /// WebSocket connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// Every snapshot sent for `instrument`, in order.
    pub fn served(&self, instrument: &str) -> Vec<Served> {
        let served = self.shared.served.lock().unwrap();
        served
            .iter()
            .filter(|s| s.instrument == instrument)
            .cloned()
            .collect()
    }
}

/// The connections the accept loop hands to axum (REST requests).
struct Handed {
    connections: mpsc::Receiver<(TcpStream, SocketAddr)>,
    addr: SocketAddr,
}

impl axum::serve::Listener for Handed {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        match self.connections.recv().await {
            Some(connection) => connection,
            // The accept loop is gone: nothing more comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    rest: mpsc::Sender<(TcpStream, SocketAddr)>,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(_) => continue,
            },
        };
        let _ = tcp.set_nodelay(true);
        let (shared, rest) = (shared.clone(), rest.clone());
        tokio::spawn(async move {
            let Some(path) = request_path(&tcp).await else {
                return;
            };
            if path.starts_with("/fapi/") {
                let _ = rest.send((tcp, peer)).await;
            } else {
                websocket(tcp, path, shared).await;
            }
        });
    }
}

/// The path of a connection's first request line, read without consuming
/// it (the handler that takes the connection reads the request itself).
async fn request_path(tcp: &TcpStream) -> Option<String> {
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let read = tcp.peek(&mut buf).await.ok()?;
        if read == 0 {
            return None;
        }
        if let Some(end) = buf[..read].windows(2).position(|w| w == b"\r\n") {
            let line = std::str::from_utf8(&buf[..end]).ok()?;
            return line.split(' ').nth(1).map(str::to_owned);
        }
        if read == buf.len() || Instant::now() > deadline {
            return None;
        }
        // The rest of the line is on its way; peeking again at once would spin.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// `GET /fapi/v1/depth?symbol=SYMBOL&limit=…`: the book at the replay's
/// position (see [`BinanceSymbol::rest_depth`]).
async fn binance_depth(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let Exchange::BinanceFutures(recording) = &shared.exchange else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let id = query.get("symbol").map(|s| s.to_ascii_lowercase());
    let Some((id, symbol)) = id.and_then(|id| recording.symbols.get_key_value(&id)) else {
        let invalid = r#"{"code":-1121,"msg":"Invalid symbol."}"#;
        return (StatusCode::BAD_REQUEST, invalid).into_response();
    };
    let due = shared.due(id);
    let (_, body) = symbol.rest_depth(due);
    shared.serve(id, due, &body);
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

type Ws = WebSocketStream<TcpStream>;

/// Upgrades a connection to `path` and runs its session until it is cut,
/// the client leaves or the server stops.
async fn websocket(tcp: TcpStream, path: String, shared: Arc<Shared>) {
    let instrument = match &shared.exchange {
        Exchange::BinanceFutures(recording) => path
            .strip_prefix("/ws/")
            .and_then(|rest| rest.strip_suffix("@depth@100ms"))
            .filter(|symbol| recording.symbols.contains_key(*symbol))
            .map(str::to_owned),
        Exchange::Kraken(_) => (path == "/").then(String::new),
    };
    let known = instrument.is_some();
    // The signature is tungstenite's `Callback`, its large `Err` included.
    #[allow(clippy::result_large_err)]
    let check = move |_: &Request, response: Handshake| -> Result<Handshake, ErrorResponse> {
        if known {
            return Ok(response);
        }
        let mut refusal = http::Response::new(Some("no such stream".to_owned()));
        *refusal.status_mut() = http::StatusCode::NOT_FOUND;
        Err(refusal)
    };
    let Ok(ws) = tokio_tungstenite::accept_hdr_async(tcp, check).await else {
        return;
    };
    let Some(instrument) = instrument else {
        return;
    };
    let number = shared.accepted.fetch_add(1, Ordering::Relaxed) + 1;
    let cut = CancellationToken::new();
    shared.open.lock().unwrap().insert(number, cut.clone());
    let ended = match &shared.exchange {
        Exchange::BinanceFutures(recording) => {
            binance_session(
                ws,
                &shared,
                &recording.symbols[&instrument],
                &instrument,
                &cut,
            )
            .await
        }
        Exchange::Kraken(recording) => kraken_session(ws, &shared, recording, &cut).await,
    };
    shared.open.lock().unwrap().remove(&number);
    if let Some((mut ws, reason)) = ended
        && number % 2 == 1
    {
        let frame = CloseFrame {
            code: CloseCode::Away,
            reason: reason.into(),
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(Some(frame))).await;
    }
}

/// Why a session stopped sending: cut or shut down (then the socket is
/// closed by the caller), or `None` when the client left or failed.
type Ended = Option<(Ws, &'static str)>;

/// Sends `frames` and flushes; false when the client is gone.
async fn send_all(ws: &mut Ws, frames: Vec<String>) -> bool {
    for frame in frames {
        if ws.feed(Message::text(frame)).await.is_err() {
            return false;
        }
    }
    ws.flush().await.is_ok()
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A Binance single-stream connection: the symbol's diffs from where the
/// replay is (its start, for the first connection).
async fn binance_session(
    mut ws: Ws,
    shared: &Shared,
    symbol: &BinanceSymbol,
    id: &str,
    cut: &CancellationToken,
) -> Ended {
    let mut next = shared.join(id);
    loop {
        let due = shared.due(id);
        if next < due {
            let frames = symbol.diffs[next..due].iter().map(|d| d.body.clone());
            if !send_all(&mut ws, frames.collect()).await {
                return None;
            }
            next = due;
        }
        let wake = shared.due_at(id, next);
        tokio::select! {
            biased;
            _ = shared.shutdown.cancelled() => return Some((ws, "shutting down")),
            _ = cut.cancelled() => return Some((ws, "cut by the server")),
            message = ws.next() => match message {
                // Pings are answered by tungstenite; nothing else is expected.
                Some(Ok(Message::Close(_)) | Err(_)) | None => return None,
                Some(Ok(_)) => {}
            },
            _ = sleep_until_opt(wake) => {}
        }
    }
}

/// Kraken answers a subscription change with one of these.
fn subscription_status(
    pair: &str,
    channel_id: Option<u64>,
    status: &str,
    error: Option<&str>,
) -> String {
    let mut frame = serde_json::Map::new();
    if let Some(channel_id) = channel_id {
        frame.insert("channelID".into(), channel_id.into());
        frame.insert("channelName".into(), format!("book-{KRAKEN_DEPTH}").into());
    }
    if let Some(error) = error {
        frame.insert("errorMessage".into(), error.into());
    }
    frame.insert("event".into(), "subscriptionStatus".into());
    frame.insert("pair".into(), pair.into());
    frame.insert("status".into(), status.into());
    let subscription = serde_json::json!({"depth": KRAKEN_DEPTH, "name": "book"});
    frame.insert("subscription".into(), subscription);
    Value::Object(frame).to_string()
}

/// A Kraken v1 connection: `systemStatus`, then per subscribed pair a
/// snapshot (the recorded one for the pair's first subscription on the
/// server, else the recording's book where the replay is) and the recorded
/// updates from there; a heartbeat after a second without anything.
async fn kraken_session(
    mut ws: Ws,
    shared: &Shared,
    recording: &Kraken,
    cut: &CancellationToken,
) -> Ended {
    const HEARTBEAT: Duration = Duration::from_secs(1);
    let status = r#"{"connectionID":17843232920108168701,"event":"systemStatus","status":"online","version":"1.8.3"}"#;
    let mut out = vec![status.to_owned()];
    // Subscribed pairs and the index of the next update each gets.
    let mut subscribed: BTreeMap<String, usize> = BTreeMap::new();
    let mut last_sent = Instant::now();
    loop {
        for (pair, next) in &mut subscribed {
            let due = shared.due(pair);
            let updates = &recording.pairs[pair].updates;
            out.extend(
                updates[(*next).min(due)..due]
                    .iter()
                    .map(|(_, u)| u.clone()),
            );
            *next = (*next).max(due);
        }
        let now = Instant::now();
        if out.is_empty() && now >= last_sent + HEARTBEAT {
            out.push(r#"{"event":"heartbeat"}"#.to_owned());
        }
        if !out.is_empty() {
            if !send_all(&mut ws, std::mem::take(&mut out)).await {
                return None;
            }
            last_sent = Instant::now();
        }
        let next_update = (subscribed.iter())
            .filter_map(|(pair, next)| shared.due_at(pair, *next))
            .min();
        let wake = next_update.map_or(last_sent + HEARTBEAT, |at| at.min(last_sent + HEARTBEAT));
        let text = tokio::select! {
            biased;
            _ = shared.shutdown.cancelled() => return Some((ws, "shutting down")),
            _ = cut.cancelled() => return Some((ws, "cut by the server")),
            message = ws.next() => match message {
                Some(Ok(Message::Text(text))) => text,
                Some(Ok(Message::Close(_)) | Err(_)) | None => return None,
                Some(Ok(_)) => continue,
            },
            _ = sleep_until(wake) => continue,
        };
        let Ok(request) = serde_json::from_str::<Value>(&text) else {
            out.push(r#"{"errorMessage":"Malformed request","event":"error"}"#.to_owned());
            continue;
        };
        let event = request["event"].as_str().unwrap_or_default();
        if event == "ping" {
            let mut pong = serde_json::json!({"event": "pong"});
            if let Some(reqid) = request.get("reqid") {
                pong["reqid"] = reqid.clone();
            }
            out.push(pong.to_string());
            continue;
        }
        let pairs = request["pair"].as_array().cloned().unwrap_or_default();
        let book = request["subscription"]["name"] == "book"
            && request["subscription"]["depth"] == KRAKEN_DEPTH;
        for pair in pairs.iter().filter_map(Value::as_str) {
            let recorded = recording.pairs.get(pair);
            let channel = recorded.map(|p| p.channel_id);
            match (event, recorded) {
                (_, None) => {
                    let error = format!("Currency pair not supported {pair}");
                    out.push(subscription_status(pair, None, "error", Some(&error)));
                }
                _ if !book => {
                    let error = "Subscription book depth 1000 only (the recording's)";
                    out.push(subscription_status(pair, None, "error", Some(error)));
                }
                ("subscribe", Some(_)) if subscribed.contains_key(pair) => {
                    let error = "Subscription depth already subscribed";
                    out.push(subscription_status(pair, channel, "error", Some(error)));
                }
                ("subscribe", Some(recorded)) => {
                    let due = shared.join(pair);
                    let snapshot = recorded.snapshot_after(due);
                    shared.serve(pair, due, &snapshot);
                    out.push(subscription_status(pair, channel, "subscribed", None));
                    out.push(snapshot);
                    subscribed.insert(pair.to_owned(), due);
                }
                ("unsubscribe", Some(_)) if subscribed.remove(pair).is_some() => {
                    out.push(subscription_status(pair, channel, "unsubscribed", None));
                }
                ("unsubscribe", Some(_)) => {
                    let error = "Subscription Not Found";
                    out.push(subscription_status(pair, None, "error", Some(error)));
                }
                _ => {
                    let error = format!("Unsupported event {event}");
                    out.push(subscription_status(pair, None, "error", Some(&error)));
                }
            }
        }
    }
}

/// The stream keys of `streams` in the Redis sink at `redis`, deleted: the
/// recordings name their instruments, so these tests reuse stream ids, and
/// a previous run's entries (under its tokens) would fence this one out.
pub async fn clear_sink(redis: &str, streams: &[String]) {
    let client = redis::Client::open(redis).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    for stream in streams {
        let key = leasehold_sink::keys::sink_stream(stream);
        let _: () = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut connection)
            .await
            .unwrap();
    }
}

/// Every sample of counter `name` in a Prometheus text body, summed by its
/// `reason` label ("" without one): the worker's counters carry no stream
/// label, so one reason may show on several lines only if labelled further.
pub fn counter_by_reason(body: &str, name: &str) -> BTreeMap<String, u64> {
    let mut totals = BTreeMap::new();
    for line in body.lines().filter(|line| !line.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !rest.starts_with(['{', ' ']) {
            continue; // another metric whose name starts with this one
        }
        let Some((labels, value)) = rest.rsplit_once(' ') else {
            continue;
        };
        let reason = labels
            .split("reason=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or("");
        let value = value.parse::<f64>().unwrap_or(0.0) as u64;
        *totals.entry(reason.to_owned()).or_insert(0) += value;
    }
    totals
}

/// Panics unless `ours` has the levels of `recorded` (compared by value),
/// naming the first level that differs and each side's size: a book's
/// `Debug` is thousands of levels.
#[track_caller]
pub fn assert_same_book(ours: &Book, recorded: &Book, what: &str) {
    let (our_bids, our_asks) = ours.top(usize::MAX);
    let (bids, asks) = recorded.top(usize::MAX);
    for (side, ours, recorded) in [("bids", our_bids, bids), ("asks", our_asks, asks)] {
        if ours == recorded {
            continue;
        }
        let at = (ours.iter().zip(&recorded))
            .position(|(a, b)| a != b)
            .unwrap_or(ours.len().min(recorded.len()));
        let show = |levels: &[Level]| {
            levels
                .get(at)
                .map_or("nothing".to_owned(), |l| format!("{} x {}", l.price, l.qty))
        };
        panic!(
            "{what}: the {side} differ from level {at} (best first): {} there, the recording {}; \
             {} levels, the recording {}",
            show(&ours),
            show(&recorded),
            ours.len(),
            recorded.len()
        );
    }
}
