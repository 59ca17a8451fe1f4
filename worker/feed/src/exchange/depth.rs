//! The computed order book every book shape shares, and Binance diff depth:
//! spot (`/ws/<symbol>@depth`, `/ws/<symbol>@depth@100ms`, REST
//! `GET /api/v3/depth`) and USD-M futures (`/ws/<symbol>@depth`,
//! `@depth@500ms`, `@depth@100ms`, REST `GET /fapi/v1/depth`). The Bybit and
//! OKX books (`inband`), Coinbase's `level2` (`coinbase_level2`) and Kraken's
//! `book` (`kraken_book`) use the same book with their own spellings. See the
//! module doc of `exchange` for what is modelled.
//!
//! # The book
//!
//! The timeline's ids are update *ordinals*: ordinal `k` (0-based) is due as
//! timeline id `first_id + k`, at the configured rate. Each update sets one
//! slot's quantity: a slot is one price level of one side (even slots bids,
//! odd slots asks, `slot / 2` the level, 0 nearest the mid), the market's
//! [`Market::levels`] per side (200; Bybit's `orderbook.50`: 50; Kraken: 25,
//! so that most frames reach its default depth of 10) on a fixed
//! grid around the symbol's mid price, so bids and asks never cross. One
//! update in eight sets the quantity to zero (deletes the level). Before the
//! first update the book is a fixed initial book (about three levels in four
//! filled).
//!
//! Updates visit the slots in cycles of as many updates as there are slots:
//! within cycle `c`, update `j` sets slot `(a_c * j + b_c) mod slots`, a
//! permutation chosen per symbol and cycle. So every slot is set exactly once
//! per cycle, and the last update that set a slot at or before any ordinal is
//! found in closed form (this cycle or the one before). The book at any update
//! id is therefore computed, not folded and not stored: one lookup per slot,
//! the same cost at id 10 and at id 10^12, nothing kept between requests.
//! Folding the diffs gives the same book (the tests check both ways).
//!
//! Frames fold 1 to 5 consecutive updates (sizes from a fixed table of eight
//! frames) and go out when their last update is due; a frame lists each slot
//! it touched once, with its final quantity, bids best (highest) first, asks
//! best (lowest) first.
//!
//! # Ids
//!
//! Binance numbers updates: update `k`'s id is `first_id + k` on spot
//! (contiguous) and `first_id + 4k - jitter(k)` on futures (strictly
//! increasing by 1 to 7: the ids are shared with other symbols there), and a
//! frame states the range it covers. Bybit and OKX number messages: frame
//! `f`'s id (Bybit `u`, OKX `seqId`) is `first_id + f` on Bybit (contiguous)
//! and `first_id + 3f - jitter(f)` on OKX (increasing by 1 to 5); the book
//! after that id is the book after the frame's last update. Coinbase's and
//! Kraken's frames carry no id that names the book (Coinbase numbers the
//! messages of a connection, Kraken nothing): the fake numbers their frames
//! as Bybit does, `first_id + f`, for `book_at`, `frame` and `head` alone.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;
use tokio::time::Instant;

use super::binance::{
    BINARY_ANSWER, Refused, error, json_response, overridden, stream_request_answer, valid_symbol,
};
use super::model::{
    Timeline, fixed, group_of_in, group_start_in, mix, now_us, symbol_hash, trimmed,
};
use super::server::{BATCH, Heard, Outbox, Protocol, Refusal, Shared, plain, upgrade};
use super::{BookSide, ExchangeShape};

/// Price levels per side of the largest book: no book holds more.
pub(super) const MAX_LEVELS: u64 = 200;
/// The price step between levels, in cents.
const TICK_CENTS: u64 = 10;
/// Where each of eight consecutive frames starts (sizes 1, 3, 5, 2, 1, 4, 2,
/// 3 updates), then the period.
const FRAME_PREFIX: [u64; 9] = [0, 1, 4, 9, 11, 12, 16, 18, 21];
/// The multipliers `a_c` of the per-cycle permutations: each coprime with
/// every market's slot count (400, 100 and 50: odd, not a multiple of 5), so
/// `j -> a*j + b mod slots` is a permutation.
const MULTIPLIERS: [u64; 12] = [7, 13, 37, 61, 91, 123, 157, 191, 233, 277, 311, 349];
/// Their inverses modulo 400, 100 and 50.
const INVERSES_400: [u64; 12] = inverses(400);
const INVERSES_100: [u64; 12] = inverses(100);
const INVERSES_50: [u64; 12] = inverses(50);

const fn inverses(slots: u64) -> [u64; 12] {
    let mut out = [0; 12];
    let mut i = 0;
    while i < MULTIPLIERS.len() {
        let mut x = 1;
        while x < slots && MULTIPLIERS[i] * x % slots != 1 {
            x += 1;
        }
        out[i] = x;
        i += 1;
    }
    out
}

/// Salts keeping the pseudo-random uses independent.
const SALT_PERMUTATION: u64 = 0xD3_0001;
const SALT_QTY: u64 = 0xD3_0002;
const SALT_INITIAL: u64 = 0xD3_0003;
const SALT_EVENT_TIME: u64 = 0xD3_0004;
const SALT_JITTER: u64 = 0xD3_0005;

/// Spot snapshot `limit`s (a limit between them is rounded up), the default.
const SPOT_LIMITS: [u64; 8] = [5, 10, 20, 50, 100, 500, 1000, 5000];
const SPOT_DEFAULT_LIMIT: u64 = 100;
/// USD-M futures snapshot `limit`s, the default.
const FUTURES_LIMITS: [u64; 7] = [5, 10, 20, 50, 100, 500, 1000];
const FUTURES_DEFAULT_LIMIT: u64 = 500;

/// One side of a book, best level first.
type Side = BookSide;

/// One side of a book as `(slot, quantity)` levels, best first.
pub(super) type SlotSide = Vec<(u64, u64)>;

/// Which market: the book size, the number formats and the id rules differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Market {
    /// Binance spot diff depth.
    Spot,
    /// Binance USD-M futures diff depth.
    Futures,
    /// Bybit v5 spot `orderbook.50`.
    Bybit,
    /// OKX v5 `books`.
    Okx,
    /// Coinbase Advanced Trade `level2`.
    Coinbase,
    /// Kraken spot WebSocket v2 `book`.
    Kraken,
}

impl Market {
    pub(super) fn of(shape: ExchangeShape) -> Market {
        match shape {
            ExchangeShape::BinanceFuturesDepth => Market::Futures,
            ExchangeShape::BybitOrderbook => Market::Bybit,
            ExchangeShape::OkxBooks => Market::Okx,
            ExchangeShape::CoinbaseLevel2 => Market::Coinbase,
            ExchangeShape::KrakenBook => Market::Kraken,
            _ => Market::Spot,
        }
    }

    /// Price levels per side.
    pub(super) fn levels(self) -> u64 {
        match self {
            Market::Bybit => 50,
            Market::Kraken => 25,
            _ => MAX_LEVELS,
        }
    }

    /// Every level of both sides.
    fn slots(self) -> u64 {
        2 * self.levels()
    }

    fn inverses(self) -> &'static [u64; 12] {
        match self.slots() {
            100 => &INVERSES_100,
            50 => &INVERSES_50,
            _ => &INVERSES_400,
        }
    }

    /// Whether ids number frames (Bybit `u`, OKX `seqId`, the fake's own
    /// numbers of Coinbase's and Kraken's frames) rather than updates
    /// (Binance `U`..`u`).
    fn numbers_frames(self) -> bool {
        !matches!(self, Market::Spot | Market::Futures)
    }

    /// The mean step between consecutive ids: 1 is contiguous, above 1 the
    /// ids jump by 1 to `2 * stride - 1`.
    fn stride(self) -> u64 {
        match self {
            Market::Spot | Market::Bybit | Market::Coinbase | Market::Kraken => 1,
            Market::Futures => 4,
            Market::Okx => 3,
        }
    }

    /// Prices: Binance spot with 8 decimals (`"27000.10000000"`), futures,
    /// Bybit and Coinbase with the tick's 2 (`"27000.10"`), OKX and Kraken
    /// without trailing zeros (`"27000.1"`, `"27000"`; Kraken's are JSON
    /// numbers, which keep none).
    pub(super) fn price(self, cents: u64) -> String {
        match self {
            Market::Spot => fixed(cents.into(), 2, 8),
            Market::Futures | Market::Bybit | Market::Coinbase => fixed(cents.into(), 2, 2),
            Market::Okx | Market::Kraken => trimmed(cents.into(), 2),
        }
    }

    /// Quantities in the market's units: 1e-8 on Binance spot, OKX, Coinbase
    /// and Kraken, 1e-3 on futures, 1e-6 on Bybit. Binance writes a removal
    /// with every decimal (`"0.00000000"`), the others as `"0"`; OKX and
    /// Kraken write sizes without trailing zeros.
    pub(super) fn qty(self, units: u64) -> String {
        match self {
            Market::Spot => fixed(units.into(), 8, 8),
            Market::Futures => fixed(units.into(), 3, 3),
            Market::Bybit | Market::Coinbase if units == 0 => "0".to_owned(),
            Market::Bybit => fixed(units.into(), 6, 6),
            Market::Coinbase => fixed(units.into(), 8, 8),
            Market::Okx | Market::Kraken => trimmed(units.into(), 8),
        }
    }

    /// A non-zero quantity from pseudo-random bits: about 0.001 to 5.
    fn qty_units(self, bits: u64) -> u64 {
        match self {
            Market::Spot | Market::Okx | Market::Coinbase | Market::Kraken => {
                100_000 + (bits >> 8) % 500_000_000
            }
            Market::Futures => 1 + (bits >> 8) % 5_000,
            Market::Bybit => 1_000 + (bits >> 8) % 5_000_000,
        }
    }
}

/// Id `n` (0-based) of a numbering that starts at `first` and steps by 1 to
/// `2 * stride - 1` (exactly 1 when `stride` is 1), the same for every
/// symbol.
fn sequence(first: u64, stride: u64, n: u64) -> u64 {
    if n == 0 {
        return first;
    }
    first
        .saturating_add(n.saturating_mul(stride))
        .saturating_sub(crate::splitmix64(n ^ SALT_JITTER) % stride)
}

/// The last `n` whose [`sequence`] id is at or below `id` (`None`: before
/// the first).
fn index_at_or_before(first: u64, stride: u64, id: u64) -> Option<u64> {
    let offset = id.checked_sub(first)?;
    // sequence(n) >= first + stride*n - (stride - 1), so n <= ceil(offset /
    // stride); and sequence(n - 1) <= first + stride*(n - 1) < id then.
    let n = offset.div_ceil(stride);
    if sequence(first, stride, n) <= id {
        Some(n)
    } else {
        Some(n - 1)
    }
}

/// The first `n` whose [`sequence`] id is at or above `id`.
fn index_at_or_after(first: u64, stride: u64, id: u64) -> u64 {
    match id.checked_sub(1) {
        Some(below) => index_at_or_before(first, stride, below).map_or(0, |n| n + 1),
        None => 0,
    }
}

/// The update id of ordinal `k` (Binance).
fn update_id(timeline: &Timeline, market: Market, k: u64) -> u64 {
    sequence(timeline.first_id(), market.stride(), k)
}

/// The id frame `f` states as its last: Binance `u`, Bybit `u`, OKX `seqId`.
pub(super) fn frame_id(timeline: &Timeline, market: Market, f: u64) -> u64 {
    if market.numbers_frames() {
        sequence(timeline.first_id(), market.stride(), f)
    } else {
        update_id(timeline, market, frame_last(f))
    }
}

/// The id of the frame before `f` (Binance futures `pu`, OKX `prevSeqId`;
/// `first_id - 1` before the first).
pub(super) fn frame_prev_id(timeline: &Timeline, market: Market, f: u64) -> u64 {
    match f.checked_sub(1) {
        Some(previous) => frame_id(timeline, market, previous),
        None => timeline.first_id() - 1,
    }
}

/// The last update ordinal of the book after id `id` (`None`: before the
/// first).
fn ordinal_at_or_before(timeline: &Timeline, market: Market, id: u64) -> Option<u64> {
    let found = index_at_or_before(timeline.first_id(), market.stride(), id);
    if market.numbers_frames() {
        found.map(frame_last)
    } else {
        found
    }
}

/// The first ordinal of frame `f`.
fn frame_start(f: u64) -> u64 {
    group_start_in(&FRAME_PREFIX, f)
}

/// The last ordinal of frame `f`.
fn frame_last(f: u64) -> u64 {
    frame_start(f + 1) - 1
}

/// The frame ordinal `k` belongs to.
fn frame_of(k: u64) -> u64 {
    group_of_in(&FRAME_PREFIX, k)
}

/// The timeline id at which frame `f` is due (its last update's).
pub(super) fn frame_due(timeline: &Timeline, f: u64) -> u64 {
    timeline.first_id().saturating_add(frame_last(f))
}

/// The first frame not complete when the timeline's head is `head`: every
/// frame before it is due.
pub(super) fn first_open_frame(timeline: &Timeline, head: u64) -> u64 {
    frame_of((head + 1).saturating_sub(timeline.first_id()))
}

/// The frame carrying id `id`: the one whose `(previous id, id]` holds it
/// (on Binance spot `[U, u]`); ids before the first are in frame 0.
pub(super) fn frame_covering(timeline: &Timeline, market: Market, id: u64) -> u64 {
    let (first, stride) = (timeline.first_id(), market.stride());
    if market.numbers_frames() {
        index_at_or_after(first, stride, id)
    } else {
        frame_of(index_at_or_after(first, stride, id))
    }
}

/// The newest id sent in a frame when the timeline's head is `head`: the id
/// of the newest complete frame (`first_id - 1` before it).
pub(super) fn complete_head(timeline: &Timeline, shape: ExchangeShape, head: u64) -> u64 {
    if head < timeline.first_id() {
        return timeline.first_id() - 1;
    }
    frame_prev_id(
        timeline,
        Market::of(shape),
        first_open_frame(timeline, head),
    )
}

/// The newest update due when the timeline's head is `head`: its ordinal
/// (`None` before the first) and its update id (`first_id - 1` before it).
fn last_due(timeline: &Timeline, market: Market, head: u64) -> (Option<u64>, u64) {
    match head.checked_sub(timeline.first_id()) {
        Some(k) => (Some(k), update_id(timeline, market, k)),
        None => (None, timeline.first_id() - 1),
    }
}

/// The unix ms frame `f` carries (`T` on futures, `E` on spot, Bybit `cts`,
/// OKX `ts`): when its last update is due.
pub(super) fn frame_time_ms(timeline: &Timeline, f: u64) -> u64 {
    frame_time_us(timeline, f) / 1000
}

/// The unix µs of frame `f` (Coinbase and Kraken write RFC 3339 with µs).
pub(super) fn frame_time_us(timeline: &Timeline, f: u64) -> u64 {
    timeline.time_us(frame_due(timeline, f))
}

/// The unix ms of the frame carrying id `id`.
pub(super) fn time_ms(timeline: &Timeline, shape: ExchangeShape, id: u64) -> u64 {
    frame_time_ms(timeline, frame_covering(timeline, Market::of(shape), id))
}

/// The symbol's mid price in cents, on the tick grid: 1,000.00 to 61,000.00.
fn mid_cents(hash: u64) -> u64 {
    let mid = 100_000 + hash % 6_000_000;
    mid - mid % TICK_CENTS
}

/// The price of `slot` in cents.
pub(super) fn slot_price(hash: u64, slot: u64) -> u64 {
    let away = (slot / 2 + 1) * TICK_CENTS;
    if is_bid(slot) {
        mid_cents(hash) - away
    } else {
        mid_cents(hash) + away
    }
}

pub(super) fn is_bid(slot: u64) -> bool {
    slot.is_multiple_of(2)
}

/// A per-cycle permutation of the slots: `(a, a^-1, b)`.
type Permutation = (u64, u64, u64);

/// The permutation of cycle `c`.
fn permutation(hash: u64, market: Market, c: u64) -> Permutation {
    let bits = mix(hash, c, SALT_PERMUTATION);
    let index = (bits % MULTIPLIERS.len() as u64) as usize;
    let slots = market.slots();
    (
        MULTIPLIERS[index],
        market.inverses()[index],
        (bits >> 16) % slots,
    )
}

/// The slot update `k` sets.
fn slot_of(hash: u64, market: Market, k: u64) -> u64 {
    let slots = market.slots();
    let (a, _, b) = permutation(hash, market, k / slots);
    (a * (k % slots) + b) % slots
}

/// Where in its cycle `slot` is set.
fn position(slots: u64, (_, inverse, b): Permutation, slot: u64) -> u64 {
    inverse * ((slot + slots - b) % slots) % slots
}

/// The quantity update `k` sets (0: the level is deleted).
fn update_qty(hash: u64, market: Market, k: u64) -> u64 {
    let bits = mix(hash, k, SALT_QTY);
    if bits.is_multiple_of(8) {
        0
    } else {
        market.qty_units(bits)
    }
}

/// The quantity of `slot` before the first update (0: empty).
fn initial_qty(hash: u64, market: Market, slot: u64) -> u64 {
    let bits = mix(hash, slot, SALT_INITIAL);
    if bits.is_multiple_of(4) {
        0
    } else {
        market.qty_units(bits)
    }
}

/// The book of one symbol after one update ordinal, slot by slot in closed
/// form.
pub(super) struct BookAt {
    hash: u64,
    market: Market,
    /// The cycle and the position in it of the last update (`None`: the
    /// initial book), its permutation and the one of the cycle before.
    last: Option<(u64, u64, Permutation, Option<Permutation>)>,
}

impl BookAt {
    /// After ordinal `last` (`None`: the initial book).
    fn new(hash: u64, market: Market, last: Option<u64>) -> BookAt {
        let slots = market.slots();
        let last = last.map(|last| {
            let cycle = last / slots;
            let before = cycle.checked_sub(1).map(|c| permutation(hash, market, c));
            (
                cycle,
                last % slots,
                permutation(hash, market, cycle),
                before,
            )
        });
        BookAt { hash, market, last }
    }

    /// After id `id` of `symbol` (upper case, as the frames spell it).
    pub(super) fn at(timeline: &Timeline, market: Market, symbol: &str, id: u64) -> BookAt {
        let last = ordinal_at_or_before(timeline, market, id);
        BookAt::new(symbol_hash(symbol), market, last)
    }

    /// After frame `f`.
    pub(super) fn after_frame(market: Market, symbol: &str, f: u64) -> BookAt {
        BookAt::new(symbol_hash(symbol), market, Some(frame_last(f)))
    }

    /// Before frame `f`: after the frame before it (the initial book before
    /// frame 0).
    pub(super) fn before_frame(market: Market, symbol: &str, f: u64) -> BookAt {
        BookAt::new(symbol_hash(symbol), market, frame_start(f).checked_sub(1))
    }

    /// The quantity of `slot` (0: empty).
    fn qty(&self, slot: u64) -> u64 {
        let (hash, market, slots) = (self.hash, self.market, self.market.slots());
        let Some((cycle, within, this, before)) = self.last else {
            return initial_qty(hash, market, slot);
        };
        let at = position(slots, this, slot);
        if at <= within {
            update_qty(hash, market, cycle * slots + at)
        } else if let Some(permutation) = before {
            update_qty(
                hash,
                market,
                (cycle - 1) * slots + position(slots, permutation, slot),
            )
        } else {
            initial_qty(hash, market, slot)
        }
    }

    /// Every slot's quantity, in slot order.
    #[cfg(test)]
    fn quantities(&self) -> Vec<u64> {
        (0..self.market.slots())
            .map(|slot| self.qty(slot))
            .collect()
    }

    /// The best `depth` levels with a quantity on each side, best first, as
    /// `(slot, quantity)` (slots ascend away from the mid on both sides, so
    /// only the slots up to the deepest level returned are looked at).
    pub(super) fn top(&self, depth: usize) -> (SlotSide, SlotSide) {
        let (mut bids, mut asks) = (Vec::new(), Vec::new());
        for slot in 0..self.market.slots() {
            if bids.len() >= depth && asks.len() >= depth {
                break;
            }
            let side = if is_bid(slot) { &mut bids } else { &mut asks };
            if side.len() < depth {
                let qty = self.qty(slot);
                if qty > 0 {
                    side.push((slot, qty));
                }
            }
        }
        (bids, asks)
    }

    /// The levels as `(price, quantity)` the market spells them.
    pub(super) fn spelled(&self, levels: &[(u64, u64)]) -> Side {
        spelled(self.market, self.hash, levels)
    }
}

/// `(slot, quantity)` levels of the symbol with hash `hash` as `(price,
/// quantity)` the market spells them.
pub(super) fn spelled(market: Market, hash: u64, levels: &[(u64, u64)]) -> Side {
    levels
        .iter()
        .map(|&(slot, qty)| (market.price(slot_price(hash, slot)), market.qty(qty)))
        .collect()
}

/// The book of `symbol` (upper case) after id `id` (the initial book before
/// the first): every level with a quantity, bids highest first, asks lowest
/// first.
pub(super) fn book(
    timeline: &Timeline,
    shape: ExchangeShape,
    symbol: &str,
    id: u64,
) -> (Side, Side) {
    let at = BookAt::at(timeline, Market::of(shape), symbol, id);
    let (bids, asks) = at.top(usize::MAX);
    (at.spelled(&bids), at.spelled(&asks))
}

/// The slots frame `f` of the symbol with hash `hash` set, each once with its
/// final quantity (a frame may set a slot twice when it crosses a cycle), in
/// slot order: best first on both sides.
pub(super) fn frame_changes(hash: u64, market: Market, f: u64) -> Vec<(u64, u64)> {
    let mut touched: Vec<(u64, u64)> = Vec::with_capacity(5);
    for k in frame_start(f)..=frame_last(f) {
        let (slot, qty) = (slot_of(hash, market, k), update_qty(hash, market, k));
        match touched.iter_mut().find(|(s, _)| *s == slot) {
            Some(entry) => entry.1 = qty,
            None => touched.push((slot, qty)),
        }
    }
    touched.sort_unstable();
    touched
}

/// `(slot, quantity)` levels split into bids and asks, in their order.
pub(super) fn by_side(levels: &[(u64, u64)]) -> (SlotSide, SlotSide) {
    levels.iter().copied().partition(|(slot, _)| is_bid(*slot))
}

/// `[["price","qty"],…]`.
pub(super) fn levels_json(levels: &[(String, String)]) -> String {
    let items: Vec<String> = levels
        .iter()
        .map(|(price, qty)| format!(r#"["{price}","{qty}"]"#))
        .collect();
    format!("[{}]", items.join(","))
}

/// Frame `f` of `symbol` (upper case), Binance's `depthUpdate`.
pub(super) fn frame_text(timeline: &Timeline, market: Market, symbol: &str, f: u64) -> String {
    let hash = symbol_hash(symbol);
    let (bids, asks) = by_side(&frame_changes(hash, market, f));
    let (bids, asks) = (
        levels_json(&spelled(market, hash, &bids)),
        levels_json(&spelled(market, hash, &asks)),
    );
    let (first_id, last_id) = (
        update_id(timeline, market, frame_start(f)),
        frame_id(timeline, market, f),
    );
    let time = frame_time_ms(timeline, f);
    match market {
        Market::Futures => {
            let event_time = time + push_delay_ms(hash, f);
            let previous = frame_prev_id(timeline, market, f);
            format!(
                r#"{{"e":"depthUpdate","E":{event_time},"T":{time},"s":"{symbol}","U":{first_id},"u":{last_id},"pu":{previous},"b":{bids},"a":{asks}}}"#
            )
        }
        _ => format!(
            r#"{{"e":"depthUpdate","E":{time},"s":"{symbol}","U":{first_id},"u":{last_id},"b":{bids},"a":{asks}}}"#
        ),
    }
}

/// A few ms of push delay after a frame's time (Binance futures `E` after
/// `T`, Bybit `ts` after `cts`): 0 to 2.
pub(super) fn push_delay_ms(hash: u64, f: u64) -> u64 {
    mix(hash, f, SALT_EVENT_TIME) % 3
}

/// The frame carrying update id `id` of `symbol` (upper case).
pub(super) fn frame(timeline: &Timeline, shape: ExchangeShape, symbol: &str, id: u64) -> String {
    let market = Market::of(shape);
    frame_text(
        timeline,
        market,
        symbol,
        frame_covering(timeline, market, id),
    )
}

pub(super) fn routes(shape: ExchangeShape) -> Router<Arc<Shared>> {
    let router = Router::new()
        .route("/ws/{stream}", get(stream))
        .route("/stream", get(super::combined::stream));
    match Market::of(shape) {
        Market::Futures => router.route("/fapi/v1/depth", get(snapshot)),
        _ => router.route("/api/v3/depth", get(snapshot)),
    }
}

/// The symbol of a stream name the market serves (`btcusdt@depth@100ms`), in
/// upper case.
pub(super) fn stream_symbol(market: Market, name: &str) -> Option<String> {
    let (symbol, kind) = name.split_once('@')?;
    let kinds: &[&str] = match market {
        Market::Futures => &["depth", "depth@500ms", "depth@100ms"],
        _ => &["depth", "depth@100ms"],
    };
    (kinds.contains(&kind) && valid_symbol(symbol, false)).then(|| symbol.to_ascii_uppercase())
}

async fn stream(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    request: Request,
) -> Response {
    let market = Market::of(shared.config.shape);
    let Some(symbol) = stream_symbol(market, &name) else {
        return plain(StatusCode::BAD_REQUEST, "unknown stream");
    };
    upgrade(&shared, request, move |session| {
        let timeline = session.shared.timeline();
        // Live start: the first frame not complete yet.
        let next = first_open_frame(&timeline, timeline.head());
        DepthStream {
            timeline,
            market,
            symbol,
            name,
            next,
        }
    })
}

/// One diff depth stream connection.
struct DepthStream {
    /// The timeline current when the connection opened.
    timeline: Arc<Timeline>,
    market: Market,
    symbol: String,
    /// The stream name as the URL spelled it (`btcusdt@depth@100ms`).
    name: String,
    /// The next frame to send.
    next: u64,
}

impl Protocol for DepthStream {
    fn on_text(&mut self, text: &str, out: &mut Outbox) -> Heard {
        out.push_back(stream_request_answer(&self.name, text));
        Heard::default()
    }

    fn on_binary(&mut self, out: &mut Outbox) -> Heard {
        out.push_back(BINARY_ANSWER.to_owned());
        Heard::default()
    }

    fn emit_due(&mut self, now: Instant, out: &mut Outbox) -> Option<Refusal> {
        let timeline = &*self.timeline;
        let head = timeline.head_at(now);
        while out.len() < BATCH && frame_due(timeline, self.next) <= head {
            out.push_back(frame_text(timeline, self.market, &self.symbol, self.next));
            self.next += 1;
        }
        None
    }

    fn next_wake(&self, now: Instant) -> Option<Instant> {
        let timeline = &*self.timeline;
        Some(timeline.wake(frame_due(timeline, self.next), now))
    }
}

/// `symbol` and `limit` of a snapshot request, checked like Binance does.
fn parse_snapshot(market: Market, query: &str) -> Result<(String, u64), Refused> {
    let refuse = |code: i32, message: &str| (code, message.to_owned());
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query)
        .map_err(|_| refuse(-1100, "Illegal characters found in a parameter."))?;
    let (valid, default): (&[u64], u64) = match market {
        Market::Futures => (&FUTURES_LIMITS, FUTURES_DEFAULT_LIMIT),
        _ => (&SPOT_LIMITS, SPOT_DEFAULT_LIMIT),
    };
    let mut seen: Vec<&str> = Vec::new();
    let (mut symbol, mut limit) = (None, default);
    for (name, value) in &pairs {
        if seen.contains(&name.as_str()) {
            return Err(refuse(-1101, "Duplicate values for a parameter detected."));
        }
        seen.push(name);
        match name.as_str() {
            "symbol" => symbol = Some(value.clone()),
            "limit" => {
                let asked = value.parse::<u64>().map_err(|_| {
                    refuse(
                        -1100,
                        "Illegal characters found in parameter 'limit'; legal range is '^[0-9]{1,20}$'.",
                    )
                })?;
                // Rounded up to the next valid limit, at most the largest.
                limit = valid
                    .iter()
                    .copied()
                    .find(|&v| v >= asked)
                    .unwrap_or(valid[valid.len() - 1]);
            }
            _ => {
                return Err(refuse(
                    -1104,
                    &format!("Not all sent parameters were read; '{name}' is not a parameter."),
                ));
            }
        }
    }
    match symbol {
        None => Err(refuse(
            -1102,
            "Mandatory parameter 'symbol' was not sent, was empty/null, or malformed.",
        )),
        Some(symbol) if !valid_symbol(&symbol, true) => Err(refuse(
            -1100,
            "Illegal characters found in parameter 'symbol'; legal range is '^[A-Z0-9-_.]{1,20}$'.",
        )),
        Some(symbol) => Ok((symbol, limit)),
    }
}

/// The REST snapshot: the book as of the newest update due now (which may
/// sit inside a frame not sent yet), top `limit` levels per side.
async fn snapshot(State(shared): State<Arc<Shared>>, RawQuery(query): RawQuery) -> Response {
    if let Some(forced) = shared.history_request() {
        return overridden(forced.status, forced.retry_after_secs);
    }
    let shape = shared.config.shape;
    let market = Market::of(shape);
    let (symbol, limit) = match parse_snapshot(market, query.as_deref().unwrap_or("")) {
        Ok(parsed) => parsed,
        Err((code, message)) => return error(code, &message),
    };
    let timeline = shared.timeline();
    let (ordinal, last_update_id) = last_due(&timeline, market, timeline.head());
    let (mut bids, mut asks) = book(&timeline, shape, &symbol, last_update_id);
    let keep = usize::try_from(limit).unwrap_or(usize::MAX);
    bids.truncate(keep);
    asks.truncate(keep);
    let (bids, asks) = (levels_json(&bids), levels_json(&asks));
    let body = match market {
        Market::Futures => {
            let now_ms = now_us() / 1000;
            // The transaction time of the last update (now before the first).
            let time = ordinal.map_or(now_ms, |k| {
                timeline.time_us(timeline.first_id().saturating_add(k)) / 1000
            });
            let event_time = now_ms.max(time);
            format!(
                r#"{{"lastUpdateId":{last_update_id},"E":{event_time},"T":{time},"bids":{bids},"asks":{asks}}}"#
            )
        }
        _ => format!(r#"{{"lastUpdateId":{last_update_id},"bids":{bids},"asks":{asks}}}"#),
    };
    json_response(StatusCode::OK, body)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const MARKETS: [Market; 6] = [
        Market::Spot,
        Market::Futures,
        Market::Bybit,
        Market::Okx,
        Market::Coinbase,
        Market::Kraken,
    ];

    fn timeline(first_id: u64) -> Timeline {
        Timeline::new(1000.0, first_id)
    }

    #[test]
    fn permutations_visit_every_slot_once_per_cycle() {
        for market in MARKETS {
            let slots = market.slots();
            for (a, inverse) in MULTIPLIERS.iter().zip(market.inverses()) {
                assert_eq!(a * inverse % slots, 1, "{a} mod {slots}");
            }
            for hash in [0, 1, symbol_hash("BTCUSDT")] {
                for cycle in 0..20 {
                    let mut seen = vec![false; slots as usize];
                    for j in 0..slots {
                        let slot = slot_of(hash, market, cycle * slots + j);
                        assert!(!seen[slot as usize], "slot {slot} twice in cycle {cycle}");
                        seen[slot as usize] = true;
                        let this = permutation(hash, market, cycle);
                        assert_eq!(position(slots, this, slot), j);
                    }
                }
            }
        }
        assert_eq!(Market::Bybit.slots(), 100);
        assert_eq!(Market::Okx.slots(), 400);
        assert_eq!(Market::Kraken.slots(), 50);
    }

    #[test]
    fn frames_partition_updates_into_groups_of_one_to_five() {
        let mut sizes = Vec::new();
        for f in 0..100 {
            let (first, last) = (frame_start(f), frame_last(f));
            assert!(first <= last);
            sizes.push(last - first + 1);
            for k in first..=last {
                assert_eq!(frame_of(k), f, "ordinal {k}");
            }
            assert_eq!(frame_start(f + 1), last + 1);
        }
        assert!(sizes.iter().all(|s| (1..=5).contains(s)));
        assert!(sizes.contains(&1) && sizes.contains(&5));
    }

    #[test]
    fn sequences_jump_by_their_documented_steps_and_map_back() {
        // (stride, every jump seen)
        for (stride, jumps_expected) in [
            (1, vec![1]),
            (3, vec![1, 2, 3, 4, 5]),
            (4, vec![1, 2, 3, 4, 5, 6, 7]),
        ] {
            for first in [1, 5_000] {
                assert_eq!(sequence(first, stride, 0), first);
                assert_eq!(index_at_or_before(first, stride, first - 1), None);
                let mut jumps = BTreeMap::new();
                for n in 0..2_000 {
                    let id = sequence(first, stride, n);
                    assert_eq!(index_at_or_before(first, stride, id), Some(n));
                    assert_eq!(index_at_or_after(first, stride, id), n);
                    let next = sequence(first, stride, n + 1);
                    *jumps.entry(next - id).or_insert(0) += 1;
                    for hole in id + 1..next {
                        assert_eq!(index_at_or_before(first, stride, hole), Some(n));
                        assert_eq!(index_at_or_after(first, stride, hole), n + 1);
                    }
                }
                assert_eq!(
                    jumps.keys().copied().collect::<Vec<_>>(),
                    jumps_expected,
                    "stride {stride}"
                );
            }
        }
        let timeline = timeline(5_000);
        // Binance numbers updates, Bybit and OKX frames.
        assert_eq!(update_id(&timeline, Market::Spot, 7), 5_007);
        assert_eq!(frame_id(&timeline, Market::Spot, 1), 5_003);
        assert_eq!(frame_id(&timeline, Market::Bybit, 1), 5_001);
        assert_eq!(frame_prev_id(&timeline, Market::Bybit, 0), 4_999);
        for f in 0..500 {
            let id = frame_id(&timeline, Market::Okx, f);
            assert_eq!(frame_covering(&timeline, Market::Okx, id), f);
            assert_eq!(
                ordinal_at_or_before(&timeline, Market::Okx, id),
                Some(frame_last(f))
            );
            let previous = frame_prev_id(&timeline, Market::Okx, f);
            assert_eq!(frame_covering(&timeline, Market::Okx, previous + 1), f);
        }
    }

    /// The book by folding every update from the initial book, slot by slot.
    fn folded(hash: u64, market: Market, last: Option<u64>) -> Vec<u64> {
        let mut qty = BookAt::new(hash, market, None).quantities();
        if let Some(last) = last {
            for k in 0..=last {
                qty[slot_of(hash, market, k) as usize] = update_qty(hash, market, k);
            }
        }
        qty
    }

    #[test]
    fn the_closed_form_book_equals_folding_every_update() {
        let hash = symbol_hash("ETHBTC");
        for market in MARKETS {
            let slots = market.slots();
            let initial = BookAt::new(hash, market, None).quantities();
            let filled = initial.iter().filter(|&&q| q > 0).count() as u64;
            assert!(filled > slots / 2 && filled < slots, "{filled}");
            for last in [
                0,
                1,
                17,
                99,
                100,
                101,
                399,
                400,
                401,
                799,
                1_234,
                3 * slots + 5,
            ] {
                assert_eq!(
                    BookAt::new(hash, market, Some(last)).quantities(),
                    folded(hash, market, Some(last)),
                    "{market:?} after ordinal {last}"
                );
            }
        }
        // Deletes happen, and a deleted level is absent from the book.
        let deletes = (0..1_000).filter(|&k| update_qty(hash, Market::Spot, k) == 0);
        assert!(deletes.count() > 50);
    }

    #[test]
    fn the_top_levels_are_the_first_of_the_whole_book() {
        for market in MARKETS {
            // Kraken's book has 25 levels a side, not all of them held.
            let depth = if market == Market::Kraken { 10 } else { 25 };
            for last in [None, Some(0), Some(777)] {
                let at = BookAt::new(symbol_hash("BTC-USDT"), market, last);
                let (bids, asks) = at.top(usize::MAX);
                let (top_bids, top_asks) = at.top(depth);
                assert_eq!((top_bids.len(), top_asks.len()), (depth, depth));
                assert_eq!(
                    (&bids[..depth], &asks[..depth]),
                    (&top_bids[..], &top_asks[..])
                );
                assert!(bids.iter().chain(&asks).all(|&(_, q)| q > 0));
                assert_eq!(
                    bids.len() + asks.len(),
                    at.quantities().iter().filter(|&&q| q > 0).count()
                );
            }
        }
    }

    /// Applies a frame's `b` and `a` to a local book the way Binance clients
    /// do (absolute quantities, zero removes).
    fn apply(book: &mut [BTreeMap<String, String>; 2], frame: &serde_json::Value) {
        for (side, levels) in book.iter_mut().zip(["b", "a"]) {
            for level in frame[levels].as_array().expect("levels") {
                let (price, qty) = (level[0].as_str().unwrap(), level[1].as_str().unwrap());
                if qty.parse::<f64>().unwrap() == 0.0 {
                    side.remove(price);
                } else {
                    side.insert(price.to_owned(), qty.to_owned());
                }
            }
        }
    }

    fn as_maps((bids, asks): (Side, Side)) -> [BTreeMap<String, String>; 2] {
        [bids.into_iter().collect(), asks.into_iter().collect()]
    }

    #[test]
    fn rendered_frames_fold_to_the_book_across_cycles() {
        let timeline = timeline(1);
        let mut repeated_slots = 0;
        for shape in [
            ExchangeShape::BinanceDepth,
            ExchangeShape::BinanceFuturesDepth,
        ] {
            let market = Market::of(shape);
            let slots = market.slots();
            for n in 0..40 {
                let symbol = format!("S{n}USDT");
                let hash = symbol_hash(&symbol);
                let mut local = as_maps(book(&timeline, shape, &symbol, 0));
                let mut previous = 0;
                let end = frame_of(6 * slots);
                for f in 0..end {
                    let frame: serde_json::Value =
                        serde_json::from_str(&frame_text(&timeline, market, &symbol, f))
                            .expect("JSON");
                    let u = frame["u"].as_u64().expect("u");
                    match market {
                        Market::Futures => assert_eq!(frame["pu"], previous),
                        _ => assert_eq!(frame["U"], previous + 1),
                    }
                    previous = u;
                    apply(&mut local, &frame);
                    let (first, last) = (frame_start(f), frame_last(f));
                    let touched: Vec<u64> =
                        (first..=last).map(|k| slot_of(hash, market, k)).collect();
                    let crosses = first / slots != last / slots;
                    if touched
                        .iter()
                        .enumerate()
                        .any(|(i, s)| touched[..i].contains(s))
                    {
                        repeated_slots += 1;
                    }
                    // Comparing every frame is slow unoptimised: the ones that
                    // cross a cycle, and every 25th.
                    if crosses || f.is_multiple_of(25) || f + 1 == end {
                        assert_eq!(
                            local,
                            as_maps(book(&timeline, shape, &symbol, u)),
                            "{symbol} {shape} after frame {f}"
                        );
                    }
                }
            }
        }
        assert!(
            repeated_slots > 0,
            "no frame set a slot twice: the test does not check it"
        );
    }

    #[test]
    fn books_never_cross_and_are_sorted_best_first() {
        let timeline = timeline(5_000);
        for shape in [
            ExchangeShape::BinanceDepth,
            ExchangeShape::BinanceFuturesDepth,
            ExchangeShape::BybitOrderbook,
            ExchangeShape::OkxBooks,
            ExchangeShape::CoinbaseLevel2,
            ExchangeShape::KrakenBook,
        ] {
            let levels = Market::of(shape).levels() as usize;
            for id in [0, 4_999, 5_000, 5_321, 99_999] {
                let (bids, asks) = book(&timeline, shape, "BTCUSDT", id);
                let price = |level: &(String, String)| level.0.parse::<f64>().expect("a price");
                assert!(bids.len() > levels / 2 && asks.len() > levels / 2);
                assert!(bids.len() <= levels && asks.len() <= levels);
                assert!(bids.windows(2).all(|w| price(&w[0]) > price(&w[1])));
                assert!(asks.windows(2).all(|w| price(&w[0]) < price(&w[1])));
                assert!(price(&bids[0]) < price(&asks[0]));
                assert!(
                    bids.iter()
                        .chain(&asks)
                        .all(|(_, q)| q.parse::<f64>().unwrap() > 0.0)
                );
            }
        }
    }

    #[test]
    fn markets_spell_numbers_their_own_way() {
        assert_eq!(Market::Spot.price(2_700_010), "27000.10000000");
        assert_eq!(Market::Futures.price(2_700_010), "27000.10");
        assert_eq!(Market::Bybit.price(2_700_010), "27000.10");
        assert_eq!(Market::Okx.price(2_700_010), "27000.1");
        assert_eq!(Market::Okx.price(2_700_000), "27000");
        assert_eq!(Market::Spot.qty(0), "0.00000000");
        assert_eq!(Market::Bybit.qty(0), "0");
        assert_eq!(Market::Bybit.qty(1_500_000), "1.500000");
        assert_eq!(Market::Okx.qty(0), "0");
        assert_eq!(Market::Okx.qty(150_000_000), "1.5");
        assert_eq!(Market::Coinbase.price(2_700_010), "27000.10");
        assert_eq!(Market::Coinbase.qty(0), "0");
        assert_eq!(Market::Coinbase.qty(150_000_000), "1.50000000");
        assert_eq!(Market::Kraken.price(2_700_000), "27000");
        assert_eq!(Market::Kraken.qty(0), "0");
        assert_eq!(Market::Kraken.qty(150_000_000), "1.5");
    }

    #[test]
    fn the_complete_head_is_the_end_of_the_newest_whole_frame() {
        let timeline = timeline(5_000);
        let shape = ExchangeShape::BinanceDepth;
        assert_eq!(complete_head(&timeline, shape, 4_999), 4_999);
        // Frame 0 is ordinal 0; frame 1 is ordinals 1 to 3.
        assert_eq!(complete_head(&timeline, shape, 5_000), 5_000);
        assert_eq!(complete_head(&timeline, shape, 5_002), 5_000);
        assert_eq!(complete_head(&timeline, shape, 5_003), 5_003);
        let futures = ExchangeShape::BinanceFuturesDepth;
        assert_eq!(
            complete_head(&timeline, futures, 5_003),
            update_id(&timeline, Market::Futures, 3)
        );
        // Bybit and OKX: the id of the newest whole frame.
        let bybit = ExchangeShape::BybitOrderbook;
        assert_eq!(complete_head(&timeline, bybit, 4_999), 4_999);
        assert_eq!(complete_head(&timeline, bybit, 5_002), 5_000);
        assert_eq!(complete_head(&timeline, bybit, 5_003), 5_001);
        let okx = ExchangeShape::OkxBooks;
        assert_eq!(
            complete_head(&timeline, okx, 5_003),
            frame_id(&timeline, Market::Okx, 1)
        );
    }
}
