//! Kraken spot WebSocket v2 `book` at `/v2`: `status` on connect, a snapshot
//! after every subscribe, then the updates of the subscribed depth, each with
//! Kraken's CRC32 checksum, `heartbeat`, application `ping`. See the module
//! doc of `exchange` for what is modelled.
//!
//! The book is the computed book of `depth` with 25 levels a side. Kraken's
//! frames carry no number: the fake numbers them `first_id + f` for
//! `book_at`, `frame` and `head`. A subscriber at depth `d` sees the best `d`
//! levels of each side: an update lists what changed there (a level deleted
//! there with `qty` 0, a level that came into it with its quantity), never a
//! level pushed out of it by better ones, which the client drops by
//! truncating its book to the depth, as Kraken's book guide says; a frame
//! that changed nothing there is not sent at all.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::get;
use serde_json::Value;
use tokio::time::Instant;

use super::depth::{
    BookAt, Market, SlotSide, frame_changes, frame_covering, frame_time_us, slot_price, spelled,
};
use super::inband::{Books, MAX_BOOKS, Push, wrong_checksum};
use super::kraken::{self, Asked, HEARTBEAT, HEARTBEAT_AFTER};
use super::model::{Timeline, fixed, rfc3339_us, symbol_hash};
use super::server::{Heard, Outbox, Protocol, Refusal, Shared, upgrade};

const CHANNEL: &str = "book";
/// The depths Kraken takes.
const DEPTHS: [usize; 5] = [10, 25, 100, 500, 1000];
/// Kraken's default depth (and the worked settings').
pub(super) const DEFAULT_DEPTH: usize = 10;
/// Kraken's checksum covers the best 10 levels of each side, whatever the
/// depth.
const CHECKSUM_LEVELS: usize = 10;
/// The pair's decimals (Kraken's `price_precision` and `qty_precision`): the
/// book's tick is 0.1 and its quantities have 8 decimals. The checksum writes
/// every number with them; the frames' JSON numbers keep no trailing zero.
pub(super) const PRICE_DECIMALS: u32 = 1;
pub(super) const QTY_DECIMALS: u32 = 8;

pub(super) fn routes() -> Router<Arc<Shared>> {
    Router::new().route("/v2", get(v2))
}

async fn v2(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    upgrade(&shared, request, |session| Connection {
        books: Books::new(session.shared.timeline()),
        depths: Vec::new(),
        connection_id: kraken::connection_id(session.number),
        last_sent: Instant::now(),
        shared: session.shared.clone(),
    })
}

/// `[{"price":27000.1,"qty":1.5},…]`: JSON numbers without trailing zeros,
/// as Kraken v2 writes them.
fn levels_json(hash: u64, levels: &[(u64, u64)]) -> String {
    let items: Vec<String> = spelled(Market::Kraken, hash, levels)
        .iter()
        .map(|(price, qty)| format!(r#"{{"price":{price},"qty":{qty}}}"#))
        .collect();
    format!("[{}]", items.join(","))
}

/// Kraken's checksum of a book: CRC32 of the best 10 asks (lowest first)
/// then the best 10 bids (highest first), each price then quantity written
/// with the pair's decimals, its point and then its leading zeros removed;
/// unsigned.
fn checksum(book: &BookAt, hash: u64) -> u32 {
    let (bids, asks) = book.top(CHECKSUM_LEVELS);
    let mut text = String::new();
    for &(slot, qty) in asks.iter().chain(&bids) {
        for number in [
            fixed(slot_price(hash, slot).into(), 2, PRICE_DECIMALS),
            fixed(qty.into(), 8, QTY_DECIMALS),
        ] {
            text.extend(
                number
                    .chars()
                    .filter(|&c| c != '.')
                    .skip_while(|&c| c == '0'),
            );
        }
    }
    crc32fast::hash(text.as_bytes())
}

/// What an update of frame `f` lists for a book subscribed `depth` deep, as
/// `(slot, quantity)` best first: each level of the best `depth` after the
/// frame that is new there or holds a new quantity, and each level of the
/// best `depth` before it that the frame deleted, with quantity 0. A level
/// pushed below the depth by better ones is not listed (the client truncates
/// it), nor anything the frame changed below the depth.
fn visible_changes(symbol: &str, hash: u64, f: u64, depth: usize) -> (SlotSide, SlotSide) {
    let market = Market::Kraken;
    let before = BookAt::before_frame(market, symbol, f).top(depth);
    let after = BookAt::after_frame(market, symbol, f).top(depth);
    let deleted: Vec<u64> = frame_changes(hash, market, f)
        .into_iter()
        .filter(|&(_, qty)| qty == 0)
        .map(|(slot, _)| slot)
        .collect();
    let side = |before: &SlotSide, after: &SlotSide| -> SlotSide {
        let mut listed: SlotSide = after
            .iter()
            .copied()
            .filter(|level| !before.contains(level))
            .collect();
        listed.extend(
            before
                .iter()
                .filter(|(slot, _)| deleted.contains(slot))
                .map(|&(slot, _)| (slot, 0)),
        );
        // Slots ascend away from the mid on both sides: best first.
        listed.sort_unstable();
        listed
    };
    (side(&before.0, &after.0), side(&before.1, &after.1))
}

/// The levels a push lists at `depth`: the best `depth` of the book after
/// the frame for a snapshot, the visible changes for an update (`None` when
/// there are none: Kraken sends nothing then).
fn pushed(symbol: &str, hash: u64, push: Push, depth: usize) -> Option<(SlotSide, SlotSide)> {
    match push {
        Push::Snapshot(f) => Some(BookAt::after_frame(Market::Kraken, symbol, f).top(depth)),
        Push::Update(f) => {
            let (bids, asks) = visible_changes(symbol, hash, f, depth);
            (!bids.is_empty() || !asks.is_empty()).then_some((bids, asks))
        }
    }
}

/// The `book` frame of `push` for `symbol` listing `levels`; `corrupt` gives
/// it a wrong checksum. Updates carry the frame's time, snapshots none.
fn frame_text(
    timeline: &Timeline,
    symbol: &str,
    hash: u64,
    push: Push,
    (bids, asks): &(SlotSide, SlotSide),
    corrupt: bool,
) -> String {
    let (kind, f, timestamp) = match push {
        Push::Snapshot(f) => ("snapshot", f, String::new()),
        Push::Update(f) => (
            "update",
            f,
            format!(
                r#","timestamp":"{}""#,
                rfc3339_us(frame_time_us(timeline, f))
            ),
        ),
    };
    let sum = checksum(&BookAt::after_frame(Market::Kraken, symbol, f), hash);
    let sum = if corrupt {
        wrong_checksum(sum.cast_signed()).cast_unsigned()
    } else {
        sum
    };
    format!(
        r#"{{"channel":"{CHANNEL}","type":"{kind}","data":[{{"symbol":"{symbol}","bids":{},"asks":{},"checksum":{sum}{timestamp}}}]}}"#,
        levels_json(hash, bids),
        levels_json(hash, asks)
    )
}

/// The update of the frame carrying id `id` (the fake's numbering) of
/// `symbol` at the default depth, 10, with its true checksum; its `bids` and
/// `asks` are empty when it changed nothing in the best 10 levels (that one
/// is not sent).
pub(super) fn frame(timeline: &Timeline, symbol: &str, id: u64) -> String {
    let f = frame_covering(timeline, Market::Kraken, id);
    let hash = symbol_hash(symbol);
    let levels = visible_changes(symbol, hash, f, DEFAULT_DEPTH);
    frame_text(timeline, symbol, hash, Push::Update(f), &levels, false)
}

/// The depth `symbol` was subscribed with.
fn depth_of(depths: &[(String, usize)], symbol: &str) -> usize {
    depths
        .iter()
        .find(|(held, _)| held == symbol)
        .map_or(DEFAULT_DEPTH, |&(_, depth)| depth)
}

/// One v2 connection following `book` channels.
struct Connection {
    books: Books,
    /// The depth each followed book was subscribed with.
    depths: Vec<(String, usize)>,
    connection_id: u64,
    /// When a frame last went into the outbox (heartbeats fill silences).
    last_sent: Instant,
    shared: Arc<Shared>,
}

impl Connection {
    fn subscription(&mut self, request: &Asked, params: Option<&Value>, out: &mut Outbox) {
        let invalid =
            |what: &str| request.error(&format!("EGeneral:Invalid arguments:{what}"), None);
        let Some(params) = params.and_then(Value::as_object) else {
            return out.push_back(invalid("params"));
        };
        match params.get("channel").and_then(Value::as_str) {
            Some(CHANNEL) => {}
            Some(
                channel @ ("trade" | "ticker" | "ohlc" | "instrument" | "level3" | "executions"
                | "balances"),
            ) => {
                let message = format!("Channel {channel} is not modelled by this server");
                return out.push_back(request.error(&message, None));
            }
            _ => return out.push_back(invalid("channel")),
        }
        let Some(symbols) = kraken::requested_symbols(params, MAX_BOOKS) else {
            return out.push_back(invalid("symbol"));
        };
        let depth = match params.get("depth") {
            None => DEFAULT_DEPTH,
            Some(value) => match value
                .as_u64()
                .and_then(|d| usize::try_from(d).ok())
                .filter(|d| DEPTHS.contains(d))
            {
                Some(depth) => depth,
                None => return out.push_back(invalid("depth")),
            },
        };
        let snapshot_wanted = match params.get("snapshot") {
            None => true,
            Some(Value::Bool(wanted)) => *wanted,
            Some(_) => return out.push_back(invalid("snapshot")),
        };
        let subscribe = request.method == "subscribe";
        for symbol in symbols {
            let held = self.books.follows(symbol);
            if !kraken::valid_symbol(symbol) {
                let message = format!("Currency pair not supported {symbol}");
                out.push_back(request.error(&message, Some(symbol)));
            } else if !subscribe {
                if held {
                    let depth = depth_of(&self.depths, symbol);
                    self.books.unfollow(symbol);
                    self.depths.retain(|(s, _)| s != symbol);
                    let result =
                        format!(r#"{{"channel":"{CHANNEL}","depth":{depth},"symbol":"{symbol}"}}"#);
                    out.push_back(request.ack(&result));
                } else {
                    out.push_back(request.error("Subscription Not Found", Some(symbol)));
                }
            } else if held {
                out.push_back(request.error("Already subscribed", Some(symbol)));
            } else if self.books.len() >= MAX_BOOKS {
                out.push_back(request.error("Too many subscriptions", Some(symbol)));
            } else {
                if snapshot_wanted {
                    self.books.follow(symbol);
                } else {
                    self.books.follow_updates_only(symbol);
                }
                self.depths.push((symbol.to_owned(), depth));
                let result = format!(
                    r#"{{"channel":"{CHANNEL}","depth":{depth},"snapshot":{snapshot_wanted},"symbol":"{symbol}"}}"#
                );
                out.push_back(request.ack(&result));
            }
        }
    }

    fn answer(&mut self, text: &str, out: &mut Outbox) -> Heard {
        let Some((request, params)) = kraken::read_request(text, out) else {
            return Heard::default();
        };
        match request.method.as_str() {
            "ping" => {
                out.push_back(request.pong());
                return Heard { app_ping: true };
            }
            "subscribe" | "unsubscribe" => self.subscription(&request, params.as_ref(), out),
            _ => out.push_back(request.error("Method not found", None)),
        }
        Heard::default()
    }
}

impl Protocol for Connection {
    fn opening(&mut self, out: &mut Outbox) {
        out.push_back(kraken::status(self.connection_id));
        self.last_sent = Instant::now();
    }

    fn on_text(&mut self, text: &str, out: &mut Outbox) -> Heard {
        let heard = self.answer(text, out);
        self.last_sent = Instant::now();
        heard
    }

    fn on_binary(&mut self, out: &mut Outbox) -> Heard {
        self.on_text("", out)
    }

    fn emit_due(&mut self, now: Instant, out: &mut Outbox) -> Option<Refusal> {
        let before = out.len();
        let (shared, depths) = (&self.shared, &self.depths);
        self.books
            .emit_due(now, out, |timeline, symbol, hash, push| {
                let levels = pushed(symbol, hash, push, depth_of(depths, symbol))?;
                // Only a frame that goes out takes the pending corruption.
                let corrupt = matches!(push, Push::Update(_)) && shared.take_corrupt_checksum();
                Some(frame_text(timeline, symbol, hash, push, &levels, corrupt))
            });
        if out.len() > before {
            self.last_sent = now;
        } else if self.books.len() > 0 && now >= self.last_sent + HEARTBEAT_AFTER {
            out.push_back(HEARTBEAT.to_owned());
            self.last_sent = now;
        }
        None
    }

    fn next_wake(&self, now: Instant) -> Option<Instant> {
        let heartbeat = (self.books.len() > 0).then_some(self.last_sent + HEARTBEAT_AFTER);
        self.books.next_wake(now).into_iter().chain(heartbeat).min()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A client's book kept the way Kraken's guide says: levels set by
    /// price, `qty` 0 removes, then truncated to the depth.
    struct Client {
        depth: usize,
        bids: BTreeMap<u64, u64>,
        asks: BTreeMap<u64, u64>,
    }

    impl Client {
        /// Applies an update; returns how many levels the truncation dropped.
        fn apply(&mut self, (bids, asks): &(SlotSide, SlotSide)) -> usize {
            let mut dropped = 0;
            for (side, levels) in [(&mut self.bids, bids), (&mut self.asks, asks)] {
                for &(slot, qty) in levels {
                    if qty == 0 {
                        side.remove(&slot);
                    } else {
                        side.insert(slot, qty);
                    }
                }
                // Slots ascend away from the mid: the worst levels are last.
                while side.len() > self.depth {
                    side.pop_last();
                    dropped += 1;
                }
            }
            dropped
        }

        fn top(&self) -> (SlotSide, SlotSide) {
            let side = |levels: &BTreeMap<u64, u64>| levels.iter().map(|(&s, &q)| (s, q)).collect();
            (side(&self.bids), side(&self.asks))
        }
    }

    #[test]
    fn visible_changes_keep_a_truncating_client_at_the_best_levels() {
        for depth in [10, 25] {
            for symbol in ["BTC/USD", "ETH/EUR", "X7/USD"] {
                let hash = symbol_hash(symbol);
                let start = BookAt::after_frame(Market::Kraken, symbol, 3).top(depth);
                let mut client = Client {
                    depth,
                    bids: start.0.into_iter().collect(),
                    asks: start.1.into_iter().collect(),
                };
                let (mut silent, mut pushed_out, mut deletes) = (0, 0, 0);
                // 300 frames: about 750 updates, fifteen cycles of the book.
                for f in 4..304 {
                    let changes = visible_changes(symbol, hash, f, depth);
                    if changes.0.is_empty() && changes.1.is_empty() {
                        // Not sent: nothing changed within the depth.
                        let before = BookAt::before_frame(Market::Kraken, symbol, f).top(depth);
                        let after = BookAt::after_frame(Market::Kraken, symbol, f).top(depth);
                        assert_eq!(before, after, "{symbol} depth {depth} frame {f}");
                        silent += 1;
                    }
                    deletes += changes
                        .0
                        .iter()
                        .chain(&changes.1)
                        .filter(|&&(_, q)| q == 0)
                        .count();
                    pushed_out += client.apply(&changes);
                    let truth = BookAt::after_frame(Market::Kraken, symbol, f).top(depth);
                    assert_eq!(client.top(), truth, "{symbol} depth {depth} frame {f}");
                }
                assert!(deletes > 0, "{symbol}: removals are listed");
                if depth == 10 {
                    assert!(
                        silent > 0,
                        "{symbol}: some frames change nothing in the top 10"
                    );
                    assert!(pushed_out > 0, "{symbol}: some levels are truncated away");
                } else {
                    // 25 levels: the whole book, nothing is pushed out.
                    assert_eq!(pushed_out, 0, "{symbol}");
                }
            }
        }
    }

    #[test]
    fn the_checksum_follows_kraken_s_documented_example_rule() {
        // The rule on numbers: point removed, then leading zeros.
        let timeline = Timeline::new(1000.0, 1);
        let symbol = "BTC/USD";
        let hash = symbol_hash(symbol);
        let book = BookAt::after_frame(Market::Kraken, symbol, 0);
        let (bids, asks) = book.top(10);
        let digits = |cents: u64, units: u64| {
            let price = format!("{}{}", cents / 100, (cents % 100) / 10);
            let qty = format!("{units}");
            format!(
                "{}{}",
                price.trim_start_matches('0'),
                qty.trim_start_matches('0')
            )
        };
        let text: String = asks
            .iter()
            .chain(&bids)
            .map(|&(slot, qty)| digits(slot_price(hash, slot), qty))
            .collect();
        assert_eq!(checksum(&book, hash), crc32fast::hash(text.as_bytes()));
        let snapshot: Value = serde_json::from_str(&frame_text(
            &timeline,
            symbol,
            hash,
            Push::Snapshot(0),
            &book.top(10),
            false,
        ))
        .expect("JSON");
        assert_eq!(
            snapshot["data"][0]["checksum"].as_u64(),
            Some(u64::from(crc32fast::hash(text.as_bytes())))
        );
        assert!(snapshot["data"][0].get("timestamp").is_none());
    }
}
