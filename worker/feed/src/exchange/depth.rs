//! Binance diff depth: spot (`/ws/<symbol>@depth`, `/ws/<symbol>@depth@100ms`,
//! REST `GET /api/v3/depth`) and USD-M futures (`/ws/<symbol>@depth`,
//! `@depth@500ms`, `@depth@100ms`, REST `GET /fapi/v1/depth`). See the module
//! doc of `exchange` for what is modelled.
//!
//! # The book
//!
//! The timeline's ids are update *ordinals*: ordinal `k` (0-based) is due as
//! timeline id `first_id + k`, at the configured rate. Its update id is
//! `first_id + k` on spot (contiguous) and `first_id + 4k - jitter(k)` on
//! futures (strictly increasing by 1 to 7: the ids are shared with other
//! symbols there). Each update sets one slot's quantity: a slot is one price
//! level of one side (even slots bids, odd slots asks, `slot / 2` the level,
//! 0 nearest the mid), [`LEVELS`] per side on a fixed grid around the
//! symbol's mid price, so bids and asks never cross. One update in eight sets
//! the quantity to zero (deletes the level). Before the first update the book
//! is a fixed initial book (about three levels in four filled).
//!
//! Updates visit the slots in cycles of [`SLOTS`] updates: within cycle `c`,
//! update `j` sets slot `(a_c * j + b_c) mod SLOTS`, a permutation chosen per
//! symbol and cycle. So every slot is set exactly once per cycle, and the
//! last update that set a slot at or before any ordinal is found in closed
//! form (this cycle or the one before). The book at any update id is
//! therefore computed, not folded and not stored: [`SLOTS`] slot lookups, the
//! same cost at id 10 and at id 10^12, nothing kept between requests. Folding
//! the diffs gives the same book (the tests check both ways).
//!
//! Frames fold 1 to 5 consecutive updates (sizes from a fixed table of eight
//! frames) and go out when their last update is due; a frame lists each slot
//! it touched once, with its final quantity, bids best (highest) first, asks
//! best (lowest) first.

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
use super::model::{Timeline, fixed, group_of_in, group_start_in, mix, now_us, symbol_hash};
use super::server::{BATCH, Heard, Outbox, Protocol, Refusal, Shared, plain, upgrade};
use super::{BookSide, ExchangeShape};

/// Price levels per side: a book never holds more.
pub(super) const LEVELS: u64 = 200;
/// Every level of both sides.
pub(super) const SLOTS: u64 = 2 * LEVELS;
/// The price step between levels, in cents.
const TICK_CENTS: u64 = 10;
/// Where each of eight consecutive frames starts (sizes 1, 3, 5, 2, 1, 4, 2,
/// 3 updates), then the period.
const FRAME_PREFIX: [u64; 9] = [0, 1, 4, 9, 11, 12, 16, 18, 21];
/// The multipliers `a_c` of the per-cycle permutations: each coprime with
/// [`SLOTS`], so `j -> a*j + b mod SLOTS` is a permutation.
const MULTIPLIERS: [u64; 12] = [7, 13, 37, 61, 91, 123, 157, 191, 233, 277, 311, 349];
/// Their inverses modulo [`SLOTS`].
const INVERSES: [u64; 12] = inverses();

const fn inverses() -> [u64; 12] {
    let mut out = [0; 12];
    let mut i = 0;
    while i < MULTIPLIERS.len() {
        let mut x = 1;
        while x < SLOTS && MULTIPLIERS[i] * x % SLOTS != 1 {
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

/// Which market: the formats and id rules differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Market {
    Spot,
    Futures,
}

impl Market {
    fn of(shape: ExchangeShape) -> Market {
        match shape {
            ExchangeShape::BinanceFuturesDepth => Market::Futures,
            _ => Market::Spot,
        }
    }

    /// Prices: spot with 8 decimals (`"27000.10000000"`), futures with the
    /// tick's 2 (`"27000.10"`).
    fn price(self, cents: u64) -> String {
        match self {
            Market::Spot => fixed(cents.into(), 2, 8),
            Market::Futures => fixed(cents.into(), 2, 2),
        }
    }

    /// Quantities in the market's units: 1e-8 on spot, 1e-3 on futures.
    fn qty(self, units: u64) -> String {
        match self {
            Market::Spot => fixed(units.into(), 8, 8),
            Market::Futures => fixed(units.into(), 3, 3),
        }
    }

    /// A non-zero quantity from pseudo-random bits: about 0.001 to 5.
    fn qty_units(self, bits: u64) -> u64 {
        match self {
            Market::Spot => 100_000 + (bits >> 8) % 500_000_000,
            Market::Futures => 1 + (bits >> 8) % 5_000,
        }
    }
}

/// The update id of ordinal `k`.
fn update_id(timeline: &Timeline, market: Market, k: u64) -> u64 {
    let first = timeline.first_id();
    match market {
        Market::Spot => first.saturating_add(k),
        Market::Futures if k == 0 => first,
        Market::Futures => first
            .saturating_add(k.saturating_mul(4))
            .saturating_sub(jitter(k)),
    }
}

/// 0 to 3, the same for every symbol (futures ids are shared across symbols).
fn jitter(k: u64) -> u64 {
    crate::splitmix64(k ^ SALT_JITTER) % 4
}

/// The update id before ordinal `k`'s (`first_id - 1` before the first).
fn previous_id(timeline: &Timeline, market: Market, k: u64) -> u64 {
    match k.checked_sub(1) {
        Some(previous) => update_id(timeline, market, previous),
        None => timeline.first_id() - 1,
    }
}

/// The last ordinal whose update id is at or below `id` (`None`: before the
/// first).
fn ordinal_at_or_before(timeline: &Timeline, market: Market, id: u64) -> Option<u64> {
    let offset = id.checked_sub(timeline.first_id())?;
    match market {
        Market::Spot => Some(offset),
        Market::Futures => {
            // update_id(k) >= first + 4k - 3, so k <= (offset + 3) / 4; and
            // update_id(k - 1) <= first + 4(k - 1) <= id for that bound.
            let k = offset / 4 + u64::from(!offset.is_multiple_of(4));
            if update_id(timeline, market, k) <= id {
                Some(k)
            } else {
                Some(k - 1)
            }
        }
    }
}

/// The first ordinal whose update id is at or above `id`.
fn ordinal_at_or_after(timeline: &Timeline, market: Market, id: u64) -> u64 {
    match id.checked_sub(1) {
        Some(below) => ordinal_at_or_before(timeline, market, below).map_or(0, |k| k + 1),
        None => 0,
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
fn frame_due(timeline: &Timeline, f: u64) -> u64 {
    timeline.first_id().saturating_add(frame_last(f))
}

/// The frame carrying update id `id`: the one whose `(pu, u]` holds it (on
/// spot `[U, u]`); ids before the first are in frame 0.
fn frame_covering(timeline: &Timeline, market: Market, id: u64) -> u64 {
    frame_of(ordinal_at_or_after(timeline, market, id))
}

/// The newest update id sent in a frame when the timeline's head is `head`:
/// the last update of the newest complete frame (`first_id - 1` before it).
pub(super) fn complete_head(timeline: &Timeline, shape: ExchangeShape, head: u64) -> u64 {
    let first = timeline.first_id();
    let Some(due) = head.checked_sub(first) else {
        return first - 1;
    };
    // Frames before the one holding the first update not due are complete.
    let open = frame_of(due + 1);
    previous_id(timeline, Market::of(shape), frame_start(open))
}

/// The newest update due when the timeline's head is `head`: its ordinal
/// (`None` before the first) and its update id (`first_id - 1` before it).
fn last_due(timeline: &Timeline, market: Market, head: u64) -> (Option<u64>, u64) {
    match head.checked_sub(timeline.first_id()) {
        Some(k) => (Some(k), update_id(timeline, market, k)),
        None => (None, timeline.first_id() - 1),
    }
}

/// The unix ms frame `f` carries (`T` on futures, `E` on spot): when its last
/// update is due.
fn frame_time_ms(timeline: &Timeline, f: u64) -> u64 {
    timeline.time_us(frame_due(timeline, f)) / 1000
}

/// The unix ms of the frame carrying update id `id`.
pub(super) fn time_ms(timeline: &Timeline, shape: ExchangeShape, id: u64) -> u64 {
    frame_time_ms(timeline, frame_covering(timeline, Market::of(shape), id))
}

/// The symbol's mid price in cents, on the tick grid: 1,000.00 to 61,000.00.
fn mid_cents(hash: u64) -> u64 {
    let mid = 100_000 + hash % 6_000_000;
    mid - mid % TICK_CENTS
}

/// The price of `slot` in cents.
fn slot_price(hash: u64, slot: u64) -> u64 {
    let away = (slot / 2 + 1) * TICK_CENTS;
    if is_bid(slot) {
        mid_cents(hash) - away
    } else {
        mid_cents(hash) + away
    }
}

fn is_bid(slot: u64) -> bool {
    slot.is_multiple_of(2)
}

/// The permutation of cycle `c`: `(a, a^-1, b)`.
fn permutation(hash: u64, c: u64) -> (u64, u64, u64) {
    let bits = mix(hash, c, SALT_PERMUTATION);
    let index = (bits % MULTIPLIERS.len() as u64) as usize;
    (MULTIPLIERS[index], INVERSES[index], (bits >> 16) % SLOTS)
}

/// The slot update `k` sets.
fn slot_of(hash: u64, k: u64) -> u64 {
    let (a, _, b) = permutation(hash, k / SLOTS);
    (a * (k % SLOTS) + b) % SLOTS
}

/// Where in its cycle (`(a, a^-1, b)`) `slot` is set.
fn position((_, inverse, b): (u64, u64, u64), slot: u64) -> u64 {
    inverse * ((slot + SLOTS - b) % SLOTS) % SLOTS
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

/// Every slot's quantity after ordinal `last` (`None`: the initial book).
fn quantities(hash: u64, market: Market, last: Option<u64>) -> [u64; SLOTS as usize] {
    let mut qty = [0; SLOTS as usize];
    let Some(last) = last else {
        for (slot, q) in (0..SLOTS).zip(qty.iter_mut()) {
            *q = initial_qty(hash, market, slot);
        }
        return qty;
    };
    let (cycle, within) = (last / SLOTS, last % SLOTS);
    let this = permutation(hash, cycle);
    let before = cycle.checked_sub(1).map(|c| (c, permutation(hash, c)));
    for (slot, q) in (0..SLOTS).zip(qty.iter_mut()) {
        let at = position(this, slot);
        *q = if at <= within {
            update_qty(hash, market, cycle * SLOTS + at)
        } else if let Some((c, permutation)) = before {
            update_qty(hash, market, c * SLOTS + position(permutation, slot))
        } else {
            initial_qty(hash, market, slot)
        };
    }
    qty
}

/// The book of `symbol` (upper case) after update id `id` (the initial book
/// before the first): every level with a quantity, bids highest first, asks
/// lowest first.
pub(super) fn book(
    timeline: &Timeline,
    shape: ExchangeShape,
    symbol: &str,
    id: u64,
) -> (Side, Side) {
    let market = Market::of(shape);
    let hash = symbol_hash(symbol);
    let qty = quantities(hash, market, ordinal_at_or_before(timeline, market, id));
    let (mut bids, mut asks) = (Side::new(), Side::new());
    // Slots ascend by level: away from the mid, best first on both sides.
    for (slot, &q) in (0..SLOTS).zip(qty.iter()) {
        if q == 0 {
            continue;
        }
        let level = (market.price(slot_price(hash, slot)), market.qty(q));
        if is_bid(slot) {
            bids.push(level);
        } else {
            asks.push(level);
        }
    }
    (bids, asks)
}

/// `[["price","qty"],…]`.
fn levels_json(levels: &[(String, String)]) -> String {
    let items: Vec<String> = levels
        .iter()
        .map(|(price, qty)| format!(r#"["{price}","{qty}"]"#))
        .collect();
    format!("[{}]", items.join(","))
}

/// Frame `f` of `symbol` (upper case).
fn frame_text(timeline: &Timeline, market: Market, symbol: &str, f: u64) -> String {
    let hash = symbol_hash(symbol);
    let (first, last) = (frame_start(f), frame_last(f));
    // Each slot once, with its final quantity (a frame may cross a cycle).
    let mut touched: Vec<(u64, u64)> = Vec::with_capacity(5);
    for k in first..=last {
        let (slot, qty) = (slot_of(hash, k), update_qty(hash, market, k));
        match touched.iter_mut().find(|(s, _)| *s == slot) {
            Some(entry) => entry.1 = qty,
            None => touched.push((slot, qty)),
        }
    }
    touched.sort_unstable();
    let (mut bids, mut asks) = (Side::new(), Side::new());
    for (slot, qty) in touched {
        let level = (market.price(slot_price(hash, slot)), market.qty(qty));
        if is_bid(slot) {
            bids.push(level);
        } else {
            asks.push(level);
        }
    }
    let (bids, asks) = (levels_json(&bids), levels_json(&asks));
    let (first_id, last_id) = (
        update_id(timeline, market, first),
        update_id(timeline, market, last),
    );
    let time = frame_time_ms(timeline, f);
    match market {
        Market::Spot => format!(
            r#"{{"e":"depthUpdate","E":{time},"s":"{symbol}","U":{first_id},"u":{last_id},"b":{bids},"a":{asks}}}"#
        ),
        Market::Futures => {
            let event_time = time + mix(hash, f, SALT_EVENT_TIME) % 3;
            let previous = previous_id(timeline, market, first);
            format!(
                r#"{{"e":"depthUpdate","E":{event_time},"T":{time},"s":"{symbol}","U":{first_id},"u":{last_id},"pu":{previous},"b":{bids},"a":{asks}}}"#
            )
        }
    }
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
    let router = Router::new().route("/ws/{stream}", get(stream));
    match Market::of(shape) {
        Market::Spot => router.route("/api/v3/depth", get(snapshot)),
        Market::Futures => router.route("/fapi/v1/depth", get(snapshot)),
    }
}

/// The symbol of a stream name the market serves (`btcusdt@depth@100ms`), in
/// upper case.
fn stream_symbol(market: Market, name: &str) -> Option<String> {
    let (symbol, kind) = name.split_once('@')?;
    let kinds: &[&str] = match market {
        Market::Spot => &["depth", "depth@100ms"],
        Market::Futures => &["depth", "depth@500ms", "depth@100ms"],
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
        let next = frame_of((timeline.head() + 1).saturating_sub(timeline.first_id()));
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
        Market::Spot => (&SPOT_LIMITS, SPOT_DEFAULT_LIMIT),
        Market::Futures => (&FUTURES_LIMITS, FUTURES_DEFAULT_LIMIT),
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
        Market::Spot => {
            format!(r#"{{"lastUpdateId":{last_update_id},"bids":{bids},"asks":{asks}}}"#)
        }
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
    };
    json_response(StatusCode::OK, body)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn timeline(first_id: u64) -> Timeline {
        Timeline::new(1000.0, first_id)
    }

    #[test]
    fn permutations_visit_every_slot_once_per_cycle() {
        for (a, inverse) in MULTIPLIERS.iter().zip(INVERSES) {
            assert_eq!(a * inverse % SLOTS, 1, "{a}");
        }
        for hash in [0, 1, symbol_hash("BTCUSDT")] {
            for cycle in 0..20 {
                let mut seen = [false; SLOTS as usize];
                for j in 0..SLOTS {
                    let slot = slot_of(hash, cycle * SLOTS + j);
                    assert!(!seen[slot as usize], "slot {slot} twice in cycle {cycle}");
                    seen[slot as usize] = true;
                    assert_eq!(position(permutation(hash, cycle), slot), j);
                }
            }
        }
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
    fn futures_ids_jump_by_one_to_seven_and_map_back() {
        for first_id in [1, 5_000] {
            let timeline = timeline(first_id);
            let market = Market::Futures;
            assert_eq!(update_id(&timeline, market, 0), first_id);
            assert_eq!(ordinal_at_or_before(&timeline, market, first_id - 1), None);
            let mut jumps = BTreeMap::new();
            for k in 0..2_000 {
                let id = update_id(&timeline, market, k);
                assert_eq!(ordinal_at_or_before(&timeline, market, id), Some(k));
                assert_eq!(ordinal_at_or_after(&timeline, market, id), k);
                let next = update_id(&timeline, market, k + 1);
                *jumps.entry(next - id).or_insert(0) += 1;
                for hole in id + 1..next {
                    assert_eq!(ordinal_at_or_before(&timeline, market, hole), Some(k));
                    assert_eq!(ordinal_at_or_after(&timeline, market, hole), k + 1);
                }
            }
            assert_eq!(
                jumps.keys().copied().collect::<Vec<_>>(),
                [1, 2, 3, 4, 5, 6, 7]
            );
            // Spot ids are the ordinals.
            assert_eq!(update_id(&timeline, Market::Spot, 7), first_id + 7);
        }
    }

    /// The book by folding every update from the initial book, slot by slot.
    fn folded(hash: u64, market: Market, last: Option<u64>) -> [u64; SLOTS as usize] {
        let mut qty = quantities(hash, market, None);
        if let Some(last) = last {
            for k in 0..=last {
                qty[slot_of(hash, k) as usize] = update_qty(hash, market, k);
            }
        }
        qty
    }

    #[test]
    fn the_closed_form_book_equals_folding_every_update() {
        let hash = symbol_hash("ETHBTC");
        for market in [Market::Spot, Market::Futures] {
            let initial = quantities(hash, market, None);
            let filled = initial.iter().filter(|&&q| q > 0).count() as u64;
            assert!(filled > SLOTS / 2 && filled < SLOTS, "{filled}");
            for last in [0, 1, 17, 399, 400, 401, 799, 1_234, 3 * SLOTS + 5] {
                assert_eq!(
                    quantities(hash, market, Some(last)),
                    folded(hash, market, Some(last)),
                    "{market:?} after ordinal {last}"
                );
            }
        }
        // Deletes happen, and a deleted level is absent from the book.
        let deletes = (0..1_000).filter(|&k| update_qty(hash, Market::Spot, k) == 0);
        assert!(deletes.count() > 50);
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
            for n in 0..40 {
                let symbol = format!("S{n}USDT");
                let hash = symbol_hash(&symbol);
                let mut local = as_maps(book(&timeline, shape, &symbol, 0));
                let mut previous = 0;
                let end = frame_of(6 * SLOTS);
                for f in 0..end {
                    let frame: serde_json::Value =
                        serde_json::from_str(&frame_text(&timeline, market, &symbol, f))
                            .expect("JSON");
                    let u = frame["u"].as_u64().expect("u");
                    match market {
                        Market::Spot => assert_eq!(frame["U"], previous + 1),
                        Market::Futures => assert_eq!(frame["pu"], previous),
                    }
                    previous = u;
                    apply(&mut local, &frame);
                    let (first, last) = (frame_start(f), frame_last(f));
                    let slots: Vec<u64> = (first..=last).map(|k| slot_of(hash, k)).collect();
                    let crosses = first / SLOTS != last / SLOTS;
                    if slots
                        .iter()
                        .enumerate()
                        .any(|(i, s)| slots[..i].contains(s))
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
        ] {
            for id in [0, 4_999, 5_000, 5_321, 99_999] {
                let (bids, asks) = book(&timeline, shape, "BTCUSDT", id);
                let price = |level: &(String, String)| level.0.parse::<f64>().expect("a price");
                assert!(bids.len() > 100 && asks.len() > 100);
                assert!(bids.len() <= LEVELS as usize && asks.len() <= LEVELS as usize);
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
    }
}
