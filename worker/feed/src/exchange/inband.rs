//! Order books whose snapshot comes in the stream: Bybit v5 spot
//! `orderbook.50.<SYMBOL>` at `/v5/public/spot` and OKX v5 `books` at
//! `/ws/v5/public`. See the module doc of `exchange` for what is modelled.
//!
//! Both use the computed book of `depth` (the Bybit book with 50 levels a
//! side, the OKX book with 200) and number its frames: Bybit's `u` is
//! `first_id + f` for frame `f`, OKX's `seqId` increases by 1 to 5 a frame.
//! Every subscribe starts a book over: one snapshot (the book after the next
//! frame, when it is due), then one update per frame after it. [`Books`]
//! keeps that per connection for Coinbase's `level2` and Kraken's `book` too.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::get;
use serde_json::Value;
use tokio::time::Instant;

use super::ExchangeShape;
use super::bybit;
use super::depth::{
    BookAt, Market, SlotSide, by_side, first_open_frame, frame_changes, frame_covering, frame_due,
    frame_id, frame_prev_id, frame_time_ms, levels_json, push_delay_ms, spelled,
};
use super::model::{Timeline, holey, json_str, symbol_hash};
use super::server::{BATCH, Heard, Outbox, Protocol, Refusal, Shared, upgrade};

/// Books one connection may follow.
pub(super) const MAX_BOOKS: usize = 64;
/// Bybit spot takes at most 10 args per subscribe request.
const BYBIT_MAX_ARGS: usize = 10;
/// The one Bybit depth modelled.
const BYBIT_TOPIC_PREFIX: &str = "orderbook.50.";
const OKX_CHANNEL: &str = "books";
/// OKX's checksum covers the best 25 levels of each side.
const OKX_CHECKSUM_LEVELS: usize = 25;
/// Client text echoed in an OKX error, at most.
const OKX_ECHO_CHARS: usize = 256;

pub(super) fn bybit_routes() -> Router<Arc<Shared>> {
    Router::new().route("/v5/public/spot", get(bybit_spot))
}

pub(super) fn okx_routes() -> Router<Arc<Shared>> {
    Router::new().route("/ws/v5/public", get(okx_public))
}

async fn bybit_spot(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    upgrade(&shared, request, |session| BybitBooks {
        books: Books::new(session.shared.timeline()),
        conn_id: bybit::conn_id(session.number),
    })
}

async fn okx_public(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    upgrade(&shared, request, |session| {
        let n = session.number;
        OkxBooks {
            books: Books::new(session.shared.timeline()),
            conn_id: format!("{:08x}", crate::splitmix64(n ^ 0x0C0C) >> 32),
            shared: session.shared.clone(),
        }
    })
}

/// What a frame of a followed book carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Push {
    /// The whole book after frame `f`.
    Snapshot(u64),
    /// The levels frame `f` changed.
    Update(u64),
}

/// One book a connection follows.
pub(super) struct Followed {
    /// As the frames spell it (`BTCUSDT`, `BTC-USDT`).
    symbol: String,
    hash: u64,
    /// The frame whose book goes out as the snapshot, until it has.
    snapshot: Option<u64>,
    /// The next frame to send as an update.
    next: u64,
}

impl Followed {
    /// The frame it sends next.
    fn pending(&self) -> u64 {
        self.snapshot.unwrap_or(self.next)
    }
}

/// The books one connection follows, in the order they were subscribed.
pub(super) struct Books {
    /// The timeline current when the connection opened.
    timeline: Arc<Timeline>,
    followed: Vec<Followed>,
}

impl Books {
    pub(super) fn new(timeline: Arc<Timeline>) -> Books {
        Books {
            timeline,
            followed: Vec::new(),
        }
    }

    pub(super) fn follows(&self, symbol: &str) -> bool {
        self.followed.iter().any(|b| b.symbol == symbol)
    }

    /// How many books it follows.
    pub(super) fn len(&self) -> usize {
        self.followed.len()
    }

    /// Starts following `symbol` (over, if it was followed): when the next
    /// frame is due, a snapshot of the book after it, then the frames after
    /// it. So a snapshot's id is above that of every update sent before the
    /// subscribe, on any connection: a client that resubscribes after a
    /// failure never gets a book it has already seen.
    pub(super) fn follow(&mut self, symbol: &str) {
        self.start(symbol, true);
    }

    /// Starts following `symbol` without a snapshot (Kraken's
    /// `"snapshot":false`): the updates from the next frame due on.
    pub(super) fn follow_updates_only(&mut self, symbol: &str) {
        self.start(symbol, false);
    }

    fn start(&mut self, symbol: &str, with_snapshot: bool) {
        self.unfollow(symbol);
        let timeline = &*self.timeline;
        let first = first_open_frame(timeline, timeline.head());
        let (snapshot, next) = match with_snapshot {
            true => (Some(first), first + 1),
            false => (None, first),
        };
        self.followed.push(Followed {
            symbol: symbol.to_owned(),
            hash: symbol_hash(symbol),
            snapshot,
            next,
        });
    }

    pub(super) fn unfollow(&mut self, symbol: &str) {
        self.followed.retain(|b| b.symbol != symbol);
    }

    /// The symbols followed, in the order they were subscribed.
    pub(super) fn symbols(&self) -> impl Iterator<Item = &str> {
        self.followed.iter().map(|b| b.symbol.as_str())
    }

    /// Adds the frames due at `now`, in order across books (they share one
    /// timeline), each rendered by `render`; a frame it renders as `None` is
    /// not sent (Kraken sends nothing when its depth did not change).
    pub(super) fn emit_due(
        &mut self,
        now: Instant,
        out: &mut Outbox,
        mut render: impl FnMut(&Timeline, &str, u64, Push) -> Option<String>,
    ) {
        let timeline = &*self.timeline;
        let head = timeline.head_at(now);
        while out.len() < BATCH {
            let due = self
                .followed
                .iter_mut()
                .filter(|b| frame_due(timeline, b.pending()) <= head)
                .min_by_key(|b| b.pending());
            let Some(book) = due else { break };
            let push = match book.snapshot.take() {
                Some(f) => Push::Snapshot(f),
                None => {
                    book.next += 1;
                    Push::Update(book.next - 1)
                }
            };
            if let Some(frame) = render(timeline, &book.symbol, book.hash, push) {
                out.push_back(frame);
            }
        }
    }

    pub(super) fn next_wake(&self, now: Instant) -> Option<Instant> {
        let timeline = &*self.timeline;
        self.followed
            .iter()
            .map(|b| timeline.wake(frame_due(timeline, b.pending()), now))
            .min()
    }
}

/// The levels a push lists as `(slot, quantity)`: the whole book after the
/// frame for a snapshot, the slots it changed for an update.
pub(super) fn pushed_levels(
    market: Market,
    symbol: &str,
    hash: u64,
    push: Push,
) -> (SlotSide, SlotSide) {
    match push {
        Push::Snapshot(f) => BookAt::after_frame(market, symbol, f).top(usize::MAX),
        Push::Update(f) => by_side(&frame_changes(hash, market, f)),
    }
}

/// The Bybit frame of `push` for `symbol`.
pub(super) fn bybit_frame(timeline: &Timeline, symbol: &str, hash: u64, push: Push) -> String {
    let market = Market::Bybit;
    let (kind, f) = match push {
        Push::Snapshot(f) => ("snapshot", f),
        Push::Update(f) => ("delta", f),
    };
    let (bids, asks) = pushed_levels(market, symbol, hash, push);
    let (bids, asks) = (
        levels_json(&spelled(market, hash, &bids)),
        levels_json(&spelled(market, hash, &asks)),
    );
    let u = frame_id(timeline, market, f);
    // The cross sequence: shared with the symbol's trades, so it has holes.
    let seq = holey(2_000_000_000 + hash % 1_000_000_000, hash, f);
    let cts = frame_time_ms(timeline, f);
    let ts = cts + push_delay_ms(hash, f);
    format!(
        r#"{{"topic":"{BYBIT_TOPIC_PREFIX}{symbol}","type":"{kind}","ts":{ts},"data":{{"s":"{symbol}","b":{bids},"a":{asks},"u":{u},"seq":{seq}}},"cts":{cts}}}"#
    )
}

/// OKX's checksum of a book: CRC32 of the best 25 bids and asks interleaved
/// (`bid price:bid size:ask price:ask size:…`, a side that runs out is
/// skipped), as a signed 32-bit integer.
fn okx_checksum(book: &BookAt) -> i32 {
    let (bids, asks) = book.top(OKX_CHECKSUM_LEVELS);
    let (bids, asks) = (book.spelled(&bids), book.spelled(&asks));
    let mut parts: Vec<&str> = Vec::with_capacity(4 * OKX_CHECKSUM_LEVELS);
    for i in 0..OKX_CHECKSUM_LEVELS {
        for side in [&bids, &asks] {
            if let Some((price, size)) = side.get(i) {
                parts.push(price);
                parts.push(size);
            }
        }
    }
    crc32fast::hash(parts.join(":").as_bytes()).cast_signed()
}

/// A checksum that is not `checksum` and not 0 (which clients may read as
/// "no checksum").
pub(super) fn wrong_checksum(checksum: i32) -> i32 {
    match checksum.wrapping_add(1) {
        0 => 2,
        wrong => wrong,
    }
}

/// OKX rows: `["price","size","0","orders"]` (the third, liquidated orders,
/// is deprecated and always "0").
fn okx_rows(market: Market, hash: u64, levels: &[(u64, u64)]) -> String {
    let rows: Vec<String> = spelled(market, hash, levels)
        .iter()
        .zip(levels)
        .map(|((price, size), &(_, qty))| {
            let orders = if qty == 0 { 0 } else { 1 + qty % 29 };
            format!(r#"["{price}","{size}","0","{orders}"]"#)
        })
        .collect();
    format!("[{}]", rows.join(","))
}

/// The OKX frame of `push` for `symbol`; `corrupt` gives it a wrong
/// checksum.
pub(super) fn okx_frame(
    timeline: &Timeline,
    symbol: &str,
    hash: u64,
    push: Push,
    corrupt: bool,
) -> String {
    let market = Market::Okx;
    let (action, f, prev) = match push {
        Push::Snapshot(f) => ("snapshot", f, "-1".to_owned()),
        Push::Update(f) => ("update", f, frame_prev_id(timeline, market, f).to_string()),
    };
    let (bids, asks) = pushed_levels(market, symbol, hash, push);
    let (bids, asks) = (okx_rows(market, hash, &bids), okx_rows(market, hash, &asks));
    let checksum = okx_checksum(&BookAt::after_frame(market, symbol, f));
    let checksum = if corrupt {
        wrong_checksum(checksum)
    } else {
        checksum
    };
    let seq = frame_id(timeline, market, f);
    let ts = frame_time_ms(timeline, f);
    format!(
        r#"{{"arg":{{"channel":"{OKX_CHANNEL}","instId":"{symbol}"}},"action":"{action}","data":[{{"asks":{asks},"bids":{bids},"ts":"{ts}","checksum":{checksum},"prevSeqId":{prev},"seqId":{seq}}}]}}"#
    )
}

/// The update frame (Bybit `delta`, OKX `update`) carrying id `id` of
/// `symbol`: the one whose `(previous id, id]` holds it.
pub(super) fn frame(timeline: &Timeline, shape: ExchangeShape, symbol: &str, id: u64) -> String {
    let market = Market::of(shape);
    let push = Push::Update(frame_covering(timeline, market, id));
    let hash = symbol_hash(symbol);
    match market {
        Market::Okx => okx_frame(timeline, symbol, hash, push, false),
        _ => bybit_frame(timeline, symbol, hash, push),
    }
}

/// One Bybit spot connection following `orderbook.50` topics.
struct BybitBooks {
    books: Books,
    conn_id: String,
}

impl BybitBooks {
    /// Validates every arg first: a request is applied whole or not at all.
    fn topics(&mut self, subscribe: bool, args: Option<&Value>) -> Result<(), String> {
        let Some(Value::Array(args)) = args else {
            return Err("error:args must be a list of topics".into());
        };
        if args.is_empty() || args.len() > BYBIT_MAX_ARGS {
            return Err(format!("error:args size must be 1 to {BYBIT_MAX_ARGS}"));
        }
        let mut symbols: Vec<&str> = Vec::new();
        for arg in args {
            let Some(arg) = arg.as_str() else {
                return Err("error:args must be a list of topics".into());
            };
            let Some((depth, symbol)) = arg
                .strip_prefix("orderbook.")
                .and_then(|rest| rest.split_once('.'))
            else {
                return Err(format!("error:handler not found,topic:{arg}"));
            };
            if depth != "50" {
                return Err(format!(
                    "error:only {BYBIT_TOPIC_PREFIX}<symbol> is modelled,topic:{arg}"
                ));
            }
            if !bybit::valid_symbol(symbol) {
                return Err(format!("Invalid symbol :[{arg}]"));
            }
            let held = self.books.follows(symbol);
            if subscribe && (held || symbols.contains(&symbol)) {
                return Err(format!("error:already subscribed,topic:{arg}"));
            }
            if !subscribe && !held {
                return Err(format!("error:not subscribed,topic:{arg}"));
            }
            symbols.push(symbol);
        }
        if subscribe && self.books.len() + symbols.len() > MAX_BOOKS {
            return Err(format!("error:at most {MAX_BOOKS} topics per connection"));
        }
        for symbol in symbols {
            if subscribe {
                self.books.follow(symbol);
            } else {
                self.books.unfollow(symbol);
            }
        }
        Ok(())
    }
}

impl Protocol for BybitBooks {
    fn on_text(&mut self, text: &str, out: &mut Outbox) -> Heard {
        let value: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        let req_id = bybit::req_id(&value);
        let req_id = req_id.as_deref();
        let conn_id = &self.conn_id;
        let Some(op) = value.get("op").and_then(Value::as_str) else {
            let message = "error:request is not a JSON object with op";
            out.push_back(bybit::reply(conn_id, false, message, req_id, ""));
            return Heard::default();
        };
        match op {
            "ping" => {
                out.push_back(bybit::reply(conn_id, true, "pong", req_id, "ping"));
                return Heard { app_ping: true };
            }
            "subscribe" | "unsubscribe" => {
                let answer = match self.topics(op == "subscribe", value.get("args")) {
                    Ok(()) => bybit::reply(&self.conn_id, true, "", req_id, op),
                    Err(message) => bybit::reply(&self.conn_id, false, &message, req_id, op),
                };
                out.push_back(answer);
            }
            _ => {
                let message = format!("error:unknown op {op}");
                out.push_back(bybit::reply(conn_id, false, &message, req_id, op));
            }
        }
        Heard::default()
    }

    fn on_binary(&mut self, out: &mut Outbox) -> Heard {
        self.on_text("", out)
    }

    fn emit_due(&mut self, now: Instant, out: &mut Outbox) -> Option<Refusal> {
        self.books
            .emit_due(now, out, |timeline, symbol, hash, push| {
                Some(bybit_frame(timeline, symbol, hash, push))
            });
        None
    }

    fn next_wake(&self, now: Instant) -> Option<Instant> {
        self.books.next_wake(now)
    }
}

/// An OKX instrument id: upper-case letters and digits in 2 to 5 parts
/// joined by `-` (`BTC-USDT`, `BTC-USDT-SWAP`, `BTC-USD-250627-100000-C`).
fn valid_inst_id(inst_id: &str) -> bool {
    let parts = inst_id.split('-');
    inst_id.len() <= 32
        && (2..=5).contains(&parts.clone().count())
        && parts.into_iter().all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
        })
}

/// An OKX request `id` echoed in its answers: up to 32 letters and digits.
fn okx_request_id(request: &Value) -> Option<&str> {
    request
        .get("id")
        .and_then(Value::as_str)
        .filter(|id| id.len() <= 32 && id.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// One OKX public connection following `books` channels.
struct OkxBooks {
    books: Books,
    conn_id: String,
    shared: Arc<Shared>,
}

impl OkxBooks {
    fn id_field(id: Option<&str>) -> String {
        id.map(|id| format!(r#""id":"{id}","#)).unwrap_or_default()
    }

    fn error(&self, id: Option<&str>, code: &str, message: &str) -> String {
        format!(
            r#"{{{}"event":"error","code":"{code}","msg":{},"connId":"{}"}}"#,
            Self::id_field(id),
            json_str(message),
            self.conn_id
        )
    }

    fn event(&self, id: Option<&str>, op: &str, inst_id: &str) -> String {
        format!(
            r#"{{{}"event":"{op}","arg":{{"channel":"{OKX_CHANNEL}","instId":"{inst_id}"}},"connId":"{}"}}"#,
            Self::id_field(id),
            self.conn_id
        )
    }

    /// The instruments of a request's args, all checked before any is
    /// applied: `Err((code, message))` refuses it whole.
    fn inst_ids<'v>(
        &self,
        subscribe: bool,
        args: Option<&'v Value>,
        text: &str,
    ) -> Result<Vec<&'v str>, (&'static str, String)> {
        let invalid = || {
            let echoed: String = text.chars().take(OKX_ECHO_CHARS).collect();
            ("60012", format!("Invalid request: {echoed}"))
        };
        let Some(Value::Array(args)) = args else {
            return Err(invalid());
        };
        if args.is_empty() {
            return Err(invalid());
        }
        let mut inst_ids = Vec::with_capacity(args.len());
        for arg in args {
            let channel = arg.get("channel").and_then(Value::as_str);
            let inst_id = arg.get("instId").and_then(Value::as_str);
            let (Some(channel), Some(inst_id)) = (channel, inst_id) else {
                return Err(invalid());
            };
            if channel != OKX_CHANNEL || !valid_inst_id(inst_id) {
                return Err((
                    "60018",
                    format!(
                        "Wrong URL or channel:{channel},instId:{inst_id} doesn't exist. Please use the correct URL, channel and parameters referring to API document."
                    ),
                ));
            }
            if !inst_ids.contains(&inst_id) {
                inst_ids.push(inst_id);
            }
        }
        let new = inst_ids.iter().filter(|id| !self.books.follows(id)).count();
        if subscribe && self.books.len() + new > MAX_BOOKS {
            return Err((
                "60012",
                format!("Invalid request: at most {MAX_BOOKS} subscriptions per connection"),
            ));
        }
        Ok(inst_ids)
    }
}

impl Protocol for OkxBooks {
    fn on_text(&mut self, text: &str, out: &mut Outbox) -> Heard {
        if text == "ping" {
            out.push_back("pong".to_owned());
            return Heard { app_ping: true };
        }
        let value: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        let id = okx_request_id(&value);
        match value.get("op").and_then(Value::as_str) {
            Some(op @ ("subscribe" | "unsubscribe")) => {
                let subscribe = op == "subscribe";
                match self.inst_ids(subscribe, value.get("args"), text) {
                    Ok(inst_ids) => {
                        for inst_id in inst_ids {
                            out.push_back(self.event(id, op, inst_id));
                            if subscribe {
                                self.books.follow(inst_id);
                            } else {
                                self.books.unfollow(inst_id);
                            }
                        }
                    }
                    Err((code, message)) => out.push_back(self.error(id, code, &message)),
                }
            }
            _ => {
                let echoed: String = text.chars().take(OKX_ECHO_CHARS).collect();
                out.push_back(self.error(id, "60012", &format!("Invalid request: {echoed}")));
            }
        }
        Heard::default()
    }

    fn on_binary(&mut self, out: &mut Outbox) -> Heard {
        out.push_back(self.error(None, "60012", "Invalid request: binary message"));
        Heard::default()
    }

    fn emit_due(&mut self, now: Instant, out: &mut Outbox) -> Option<Refusal> {
        let shared = &self.shared;
        self.books
            .emit_due(now, out, |timeline, symbol, hash, push| {
                let corrupt = matches!(push, Push::Update(_)) && shared.take_corrupt_checksum();
                Some(okx_frame(timeline, symbol, hash, push, corrupt))
            });
        None
    }

    fn next_wake(&self, now: Instant) -> Option<Instant> {
        self.books.next_wake(now)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::BookSide;
    use super::super::depth::book;
    use super::*;

    /// A side keyed by price in cents (ordered), holding the strings sent.
    type Levels = BTreeMap<u64, (String, String)>;

    fn cents(price: &str) -> u64 {
        (price.parse::<f64>().expect("a price") * 100.0).round() as u64
    }

    /// Sets the rows of `value` on `side` (a zero quantity removes).
    fn apply(side: &mut Levels, value: &Value) {
        for row in value.as_array().expect("rows") {
            let (price, qty) = (row[0].as_str().unwrap(), row[1].as_str().unwrap());
            if qty.parse::<f64>().unwrap() == 0.0 {
                side.remove(&cents(price));
            } else {
                side.insert(cents(price), (price.to_owned(), qty.to_owned()));
            }
        }
    }

    /// Bids highest first, asks lowest first.
    fn sides(bids: &Levels, asks: &Levels) -> (BookSide, BookSide) {
        (
            bids.values().rev().cloned().collect(),
            asks.values().cloned().collect(),
        )
    }

    /// OKX's rule, from the folded book: best 25 of each side interleaved.
    fn checksum(bids: &Levels, asks: &Levels) -> i64 {
        let (bids, asks) = sides(bids, asks);
        let mut parts = Vec::new();
        for i in 0..25 {
            for level in [bids.get(i), asks.get(i)].into_iter().flatten() {
                parts.extend([level.0.as_str(), level.1.as_str()]);
            }
        }
        i64::from(crc32fast::hash(parts.join(":").as_bytes()).cast_signed())
    }

    #[test]
    fn rendered_frames_fold_to_the_book_and_checksums_hold_across_cycles() {
        let timeline = Timeline::new(1000.0, 1);
        for shape in [ExchangeShape::BybitOrderbook, ExchangeShape::OkxBooks] {
            for symbol in ["BTCUSDT", "ETH-USDT", "X7USDT"] {
                let hash = symbol_hash(symbol);
                let render = |push| match shape {
                    ExchangeShape::OkxBooks => okx_frame(&timeline, symbol, hash, push, false),
                    _ => bybit_frame(&timeline, symbol, hash, push),
                };
                let fields = |frame: &Value| -> (Value, Value, u64) {
                    match shape {
                        ExchangeShape::OkxBooks => {
                            let data = &frame["data"][0];
                            let seq = data["seqId"].as_u64().unwrap();
                            (data["bids"].clone(), data["asks"].clone(), seq)
                        }
                        _ => {
                            let data = &frame["data"];
                            let u = data["u"].as_u64().unwrap();
                            (data["b"].clone(), data["a"].clone(), u)
                        }
                    }
                };
                let start = 3;
                let snapshot: Value = serde_json::from_str(&render(Push::Snapshot(start))).unwrap();
                let (b, a, mut id) = fields(&snapshot);
                let (mut bids, mut asks) = (Levels::new(), Levels::new());
                apply(&mut bids, &b);
                apply(&mut asks, &a);
                assert_eq!(sides(&bids, &asks), book(&timeline, shape, symbol, id));
                if shape == ExchangeShape::OkxBooks {
                    assert_eq!(
                        snapshot["data"][0]["checksum"].as_i64(),
                        Some(checksum(&bids, &asks))
                    );
                }
                // 400 frames: about 1,000 updates, over two OKX and ten Bybit cycles.
                for f in start + 1..start + 400 {
                    let frame: Value = serde_json::from_str(&render(Push::Update(f))).unwrap();
                    let (b, a, next) = fields(&frame);
                    apply(&mut bids, &b);
                    apply(&mut asks, &a);
                    match shape {
                        ExchangeShape::OkxBooks => {
                            let data = &frame["data"][0];
                            assert_eq!(data["prevSeqId"].as_u64(), Some(id));
                            assert!(next > id && next - id <= 5);
                            assert_eq!(data["checksum"].as_i64(), Some(checksum(&bids, &asks)));
                        }
                        _ => assert_eq!(next, id + 1),
                    }
                    id = next;
                    assert_eq!(
                        sides(&bids, &asks),
                        book(&timeline, shape, symbol, id),
                        "{shape} {symbol} after frame {f}"
                    );
                }
            }
        }
    }

    #[test]
    fn wrong_checksums_differ_and_are_never_zero() {
        for checksum in [0, 1, -1, -2, i32::MAX, i32::MIN, 12_345] {
            let wrong = wrong_checksum(checksum);
            assert_ne!(wrong, checksum);
            assert_ne!(wrong, 0);
        }
    }

    #[test]
    fn okx_instrument_ids_are_checked() {
        for good in ["BTC-USDT", "BTC-USDT-SWAP", "BTC-USD-250627-100000-C"] {
            assert!(valid_inst_id(good), "{good}");
        }
        for bad in [
            "BTCUSDT",
            "btc-usdt",
            "A-B-C-D-E-F",
            "BTC--USDT",
            "-BTC",
            "BTC-",
            "BTC/USDT",
            "",
        ] {
            assert!(!valid_inst_id(bad), "{bad}");
        }
    }
}
