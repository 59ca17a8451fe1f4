//! Coinbase Advanced Trade market data at `/`: the `level2` channel, whose
//! messages come on channel `l2_data`, and the `subscriptions`
//! acknowledgements. See the module doc of `exchange` for what is modelled.
//!
//! The book is the computed book of `depth` (200 levels a side). Coinbase's
//! frames carry no number of the book: `sequence_num` counts every message
//! of a connection from 0, acknowledgements included, so the fake numbers
//! its frames `first_id + f` for `book_at`, `frame` and `head`, and each
//! connection counts its own `sequence_num`.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::get;
use serde_json::Value;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::coinbase::{SUBSCRIBE_WITHIN, valid_product};
use super::depth::{Market, frame_covering, frame_time_us, spelled};
use super::inband::{Books, MAX_BOOKS, Push, pushed_levels};
use super::model::{Timeline, json_str, now_us, rfc3339_us, symbol_hash};
use super::server::{Heard, Outbox, Protocol, Refusal, Shared, upgrade};

const CHANNEL: &str = "level2";
/// The channel `level2` messages come on.
const DATA_CHANNEL: &str = "l2_data";
/// Advanced Trade's other market-data and user channels: refused as not
/// modelled rather than as unknown.
const OTHER_CHANNELS: [&str; 8] = [
    "heartbeats",
    "candles",
    "status",
    "ticker",
    "ticker_batch",
    "market_trades",
    "user",
    "futures_balance_summary",
];

pub(super) fn routes() -> Router<Arc<Shared>> {
    Router::new().route("/", get(feed))
}

async fn feed(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    upgrade(&shared, request, |session| Level2 {
        books: Books::new(session.shared.timeline()),
        sequence_num: 0,
        subscribe_by: Some(Instant::now() + SUBSCRIBE_WITHIN),
    })
}

/// The `l2_data` message of `push` for `product`, numbered `sequence_num`:
/// one event, bids (best first) then offers (best first); every time is the
/// frame's.
fn frame_text(
    timeline: &Timeline,
    product: &str,
    hash: u64,
    push: Push,
    sequence_num: u64,
) -> String {
    let market = Market::Coinbase;
    let (kind, f) = match push {
        Push::Snapshot(f) => ("snapshot", f),
        Push::Update(f) => ("update", f),
    };
    let (bids, asks) = pushed_levels(market, product, hash, push);
    let time = rfc3339_us(frame_time_us(timeline, f));
    let mut updates: Vec<String> = Vec::with_capacity(bids.len() + asks.len());
    for (side, levels) in [("bid", &bids), ("offer", &asks)] {
        for (price, qty) in spelled(market, hash, levels) {
            updates.push(format!(
                r#"{{"side":"{side}","event_time":"{time}","price_level":"{price}","new_quantity":"{qty}"}}"#
            ));
        }
    }
    format!(
        r#"{{"channel":"{DATA_CHANNEL}","client_id":"","timestamp":"{time}","sequence_num":{sequence_num},"events":[{{"type":"{kind}","product_id":"{product}","updates":[{}]}}]}}"#,
        updates.join(",")
    )
}

/// The `update` message of the frame carrying id `id` (the fake's
/// numbering) of `product`, with `sequence_num` 0: on a connection it is the
/// number of messages sent before it.
pub(super) fn frame(timeline: &Timeline, product: &str, id: u64) -> String {
    let f = frame_covering(timeline, Market::Coinbase, id);
    frame_text(timeline, product, symbol_hash(product), Push::Update(f), 0)
}

fn error(message: &str) -> String {
    format!(r#"{{"type":"error","message":{}}}"#, json_str(message))
}

/// What a request asked: subscribe (or unsubscribe) and its products, each
/// once, all checked; `Err` holds the error frame.
fn parse(text: &str) -> Result<(bool, Vec<String>), String> {
    let value: Value =
        serde_json::from_str(text).map_err(|_| error("failure to parse message: not JSON"))?;
    let subscribe = match value.get("type").and_then(Value::as_str) {
        Some("subscribe") => true,
        Some("unsubscribe") => false,
        _ => return Err(error("type must be subscribe or unsubscribe")),
    };
    match value.get("channel").and_then(Value::as_str) {
        Some(CHANNEL) => {}
        Some(name) if OTHER_CHANNELS.contains(&name) => {
            return Err(error(&format!(
                "channel {name} is not modelled by this server ({CHANNEL} is)"
            )));
        }
        Some(name) => return Err(error(&format!("{name} is not a valid channel"))),
        None => return Err(error("channel must be a channel name")),
    }
    let Some(Value::Array(ids)) = value.get("product_ids") else {
        return Err(error("product_ids must be a list of products"));
    };
    if ids.is_empty() || ids.len() > MAX_BOOKS {
        return Err(error(&format!(
            "product_ids must list 1 to {MAX_BOOKS} products"
        )));
    }
    let mut products: Vec<String> = Vec::with_capacity(ids.len());
    for id in ids {
        let Some(product) = id.as_str() else {
            return Err(error("product_ids must be a list of products"));
        };
        if !valid_product(product) {
            return Err(error(&format!("{product} is not a valid product")));
        }
        if !products.iter().any(|p| p == product) {
            products.push(product.to_owned());
        }
    }
    Ok((subscribe, products))
}

/// One market-data connection following `level2` products.
struct Level2 {
    books: Books,
    /// The `sequence_num` of the next message: every message the connection
    /// sends takes one.
    sequence_num: u64,
    /// Until the first subscribe: when the connection is dropped.
    subscribe_by: Option<Instant>,
}

impl Level2 {
    /// The `subscriptions` acknowledgement: every product followed now.
    fn subscriptions(&mut self) -> String {
        let products: Vec<String> = self.books.symbols().map(|p| format!(r#""{p}""#)).collect();
        let listed = match products.is_empty() {
            true => String::new(),
            false => format!(r#""{CHANNEL}":[{}]"#, products.join(",")),
        };
        let number = self.sequence_num;
        self.sequence_num += 1;
        format!(
            r#"{{"channel":"subscriptions","client_id":"","timestamp":"{}","sequence_num":{number},"events":[{{"subscriptions":{{{listed}}}}}]}}"#,
            rfc3339_us(now_us())
        )
    }
}

impl Protocol for Level2 {
    fn on_text(&mut self, text: &str, out: &mut Outbox) -> Heard {
        let (subscribe, products) = match parse(text) {
            Ok(asked) => asked,
            Err(frame) => {
                out.push_back(frame);
                return Heard::default();
            }
        };
        if subscribe {
            let new = products.iter().filter(|p| !self.books.follows(p)).count();
            if self.books.len() + new > MAX_BOOKS {
                out.push_back(error(&format!(
                    "at most {MAX_BOOKS} products per connection"
                )));
                return Heard::default();
            }
            self.subscribe_by = None;
            // A product already followed starts over with a new snapshot.
            for product in &products {
                self.books.follow(product);
            }
        } else {
            for product in &products {
                self.books.unfollow(product);
            }
        }
        // The acknowledgement takes its number before the snapshots.
        let acknowledgement = self.subscriptions();
        out.push_back(acknowledgement);
        Heard::default()
    }

    fn on_binary(&mut self, out: &mut Outbox) -> Heard {
        out.push_back(error("failure to parse message: not text"));
        Heard::default()
    }

    fn emit_due(&mut self, now: Instant, out: &mut Outbox) -> Option<Refusal> {
        if self.subscribe_by.is_some_and(|by| now >= by) {
            return Some(Refusal {
                code: CloseCode::Policy,
                reason: "no subscribe message received in time",
            });
        }
        let sequence_num = &mut self.sequence_num;
        self.books
            .emit_due(now, out, |timeline, product, hash, push| {
                let number = *sequence_num;
                *sequence_num += 1;
                Some(frame_text(timeline, product, hash, push, number))
            });
        None
    }

    fn next_wake(&self, now: Instant) -> Option<Instant> {
        self.books
            .next_wake(now)
            .into_iter()
            .chain(self.subscribe_by)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked_before_anything_is_followed() {
        let ok = parse(
            r#"{"type":"subscribe","product_ids":["BTC-USD","BTC-USD","ETH-EUR"],"channel":"level2"}"#,
        );
        assert_eq!(
            ok,
            Ok((true, vec!["BTC-USD".to_owned(), "ETH-EUR".to_owned()]))
        );
        let unsubscribe =
            parse(r#"{"type":"unsubscribe","product_ids":["BTC-USD"],"channel":"level2"}"#);
        assert_eq!(unsubscribe, Ok((false, vec!["BTC-USD".to_owned()])));
        for bad in [
            "garbage",
            r#"{"type":"subscribe","product_ids":["BTC-USD"]}"#,
            r#"{"type":"subscribe","product_ids":["BTC-USD"],"channel":"ticker"}"#,
            r#"{"type":"subscribe","product_ids":["BTC-USD"],"channel":"level3"}"#,
            r#"{"type":"subscribe","product_ids":["btc-usd"],"channel":"level2"}"#,
            r#"{"type":"subscribe","product_ids":[],"channel":"level2"}"#,
            r#"{"type":"subscribe","product_ids":"BTC-USD","channel":"level2"}"#,
            r#"{"type":"sub","product_ids":["BTC-USD"],"channel":"level2"}"#,
        ] {
            let answer = parse(bad).expect_err(bad);
            let answer: Value = serde_json::from_str(&answer).expect("JSON");
            assert_eq!(answer["type"], "error", "{bad}");
            assert!(answer["message"].is_string(), "{bad}");
        }
    }
}
