//! Coinbase Exchange: the WebSocket feed at `/`, `matches` and `heartbeat`
//! channels. See the module doc of `exchange` for what is modelled.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::get;
use serde_json::Value;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::model::{
    Timeline, fixed, holey, json_str, mix, now_us, rfc3339_us, symbol_hash, trade, uuid,
};
use super::server::{BATCH, Heard, Outbox, Protocol, Refusal, Shared, upgrade};

/// Products one connection may follow.
const MAX_PRODUCTS: usize = 64;
/// Coinbase disconnects a client that has not subscribed within 5 s.
pub(super) const SUBSCRIBE_WITHIN: Duration = Duration::from_secs(5);
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

pub(super) fn routes() -> Router<Arc<Shared>> {
    Router::new().route("/", get(feed))
}

async fn feed(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    upgrade(&shared, request, |session| Feed {
        timeline: session.shared.timeline(),
        products: Vec::new(),
        subscribe_by: Some(Instant::now() + SUBSCRIBE_WITHIN),
    })
}

/// `BASE-QUOTE`, upper-case letters and digits (`BTC-USD`).
pub(super) fn valid_product(product: &str) -> bool {
    let part = |p: &str| {
        (1..=10).contains(&p.len())
            && p.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
    };
    product
        .split_once('-')
        .is_some_and(|(base, quote)| part(base) && part(quote))
}

/// The product's sequence at trade `trade_id`: per product, increasing, with
/// holes where order-book events of other channels took numbers.
fn sequence(product: &str, trade_id: u64) -> u64 {
    let hash = symbol_hash(product);
    holey(100_000_000 + hash % 100_000_000, hash, trade_id)
}

/// The `match` frame of trade `trade_id` of `product` (`last_match` for the
/// one sent right after subscribing is the same with that type).
pub(super) fn frame(timeline: &Timeline, product: &str, trade_id: u64) -> String {
    frame_of("match", timeline, product, trade_id)
}

fn frame_of(kind: &str, timeline: &Timeline, product: &str, trade_id: u64) -> String {
    let hash = symbol_hash(product);
    let t = trade(hash, trade_id);
    let maker = uuid(mix(hash, trade_id, 10), mix(hash, trade_id, 11));
    let taker = uuid(mix(hash, trade_id, 12), mix(hash, trade_id, 13));
    // `side` is the maker order's side on Coinbase.
    let side = if t.buyer_maker { "buy" } else { "sell" };
    format!(
        r#"{{"type":"{kind}","trade_id":{trade_id},"sequence":{},"maker_order_id":"{maker}","taker_order_id":"{taker}","time":"{}","product_id":"{product}","size":"{}","price":"{}","side":"{side}"}}"#,
        sequence(product, trade_id),
        rfc3339_us(timeline.time_us(trade_id)),
        fixed(t.qty_e8.into(), 8, 8),
        fixed(t.price_cents.into(), 2, 2),
    )
}

fn error(message: &str, reason: &str) -> String {
    format!(
        r#"{{"type":"error","message":{},"reason":{}}}"#,
        json_str(message),
        json_str(reason)
    )
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Channel {
    Matches,
    Heartbeat,
}

struct Product {
    id: String,
    matches: bool,
    heartbeat: bool,
    /// The next trade id to send (when `matches`).
    next: u64,
    next_heartbeat: Instant,
}

/// One feed connection.
struct Feed {
    /// The timeline current when the connection opened.
    timeline: Arc<Timeline>,
    products: Vec<Product>,
    /// Until the first subscribe: when the connection is dropped.
    subscribe_by: Option<Instant>,
}

/// What a subscribe or unsubscribe message asked for.
fn parse(text: &str) -> Result<(bool, Vec<(Channel, String)>), String> {
    let failed = |reason: &str| error("Failed to subscribe", reason);
    let value: Value = serde_json::from_str(text)
        .map_err(|_| error("Malformed JSON", "the message is not JSON"))?;
    let subscribe = match value.get("type").and_then(Value::as_str) {
        Some("subscribe") => true,
        Some("unsubscribe") => false,
        _ => return Err(failed("Type has to be either subscribe or unsubscribe")),
    };
    let ids = |list: Option<&Value>| -> Result<Vec<String>, String> {
        match list {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| {
                    item.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| failed("product_ids must be a list of strings"))
                })
                .collect(),
            Some(_) => Err(failed("product_ids must be a list of strings")),
        }
    };
    let top = ids(value.get("product_ids"))?;
    let Some(Value::Array(channels)) = value.get("channels") else {
        return Err(failed("channels must be a list"));
    };
    let mut wanted = Vec::new();
    for entry in channels {
        let (name, products) = match entry {
            Value::String(name) => (name.as_str(), top.clone()),
            Value::Object(object) => {
                let name = object
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| failed("a channel object needs a name"))?;
                let mut products = top.clone();
                products.extend(ids(object.get("product_ids"))?);
                (name, products)
            }
            _ => return Err(failed("a channel is a name or an object with a name")),
        };
        let channel = match name {
            "matches" => Channel::Matches,
            "heartbeat" => Channel::Heartbeat,
            "full" | "level2" | "level2_batch" | "ticker" | "ticker_batch" | "status" | "user"
            | "auctionfeed" | "rfq_matches" | "balance" => {
                return Err(failed(&format!(
                    "{name} is not modelled by this server (matches and heartbeat are)"
                )));
            }
            _ => return Err(failed(&format!("{name} is not a valid channel"))),
        };
        for product in products {
            if !valid_product(&product) {
                return Err(failed(&format!("{product} is not a valid product")));
            }
            if wanted.len() >= 2 * MAX_PRODUCTS {
                return Err(failed(&format!(
                    "at most {MAX_PRODUCTS} products per connection"
                )));
            }
            if !wanted.contains(&(channel, product.clone())) {
                wanted.push((channel, product));
            }
        }
    }
    if wanted.is_empty() {
        return Err(failed("No channels or product ids provided"));
    }
    Ok((subscribe, wanted))
}

impl Feed {
    fn subscriptions(&self) -> String {
        let list = |channel: Channel| {
            let ids: Vec<String> = self
                .products
                .iter()
                .filter(|p| match channel {
                    Channel::Matches => p.matches,
                    Channel::Heartbeat => p.heartbeat,
                })
                .map(|p| format!(r#""{}""#, p.id))
                .collect();
            ids.join(",")
        };
        let mut channels = Vec::new();
        for (name, channel) in [
            ("matches", Channel::Matches),
            ("heartbeat", Channel::Heartbeat),
        ] {
            let ids = list(channel);
            if !ids.is_empty() {
                channels.push(format!(r#"{{"name":"{name}","product_ids":[{ids}]}}"#));
            }
        }
        format!(
            r#"{{"type":"subscriptions","channels":[{}]}}"#,
            channels.join(",")
        )
    }

    fn apply(&mut self, subscribe: bool, wanted: Vec<(Channel, String)>, out: &mut Outbox) {
        let now = Instant::now();
        if !subscribe {
            for (channel, id) in &wanted {
                if let Some(product) = self.products.iter_mut().find(|p| &p.id == id) {
                    match channel {
                        Channel::Matches => product.matches = false,
                        Channel::Heartbeat => product.heartbeat = false,
                    }
                }
            }
            self.products.retain(|p| p.matches || p.heartbeat);
            out.push_back(self.subscriptions());
            return;
        }
        let mut new_ids: Vec<&String> = Vec::new();
        for (_, id) in &wanted {
            if !self.products.iter().any(|p| &p.id == id) && !new_ids.contains(&id) {
                new_ids.push(id);
            }
        }
        if self.products.len() + new_ids.len() > MAX_PRODUCTS {
            out.push_back(error(
                "Failed to subscribe",
                &format!("at most {MAX_PRODUCTS} products per connection"),
            ));
            return;
        }
        self.subscribe_by = None;
        let timeline = &*self.timeline;
        let head = timeline.head_at(now);
        let mut last_matches = Vec::new();
        for (channel, id) in wanted {
            let index = match self.products.iter().position(|p| p.id == id) {
                Some(index) => index,
                None => {
                    self.products.push(Product {
                        id,
                        matches: false,
                        heartbeat: false,
                        next: head + 1,
                        next_heartbeat: now + HEARTBEAT_EVERY,
                    });
                    self.products.len() - 1
                }
            };
            let product = &mut self.products[index];
            match channel {
                Channel::Matches if !product.matches => {
                    // Live start: the last match before subscribing, then new ones.
                    product.matches = true;
                    product.next = head + 1;
                    if head >= timeline.first_id() {
                        last_matches.push(frame_of("last_match", timeline, &product.id, head));
                    }
                }
                Channel::Heartbeat if !product.heartbeat => {
                    product.heartbeat = true;
                    product.next_heartbeat = now + HEARTBEAT_EVERY;
                }
                _ => {}
            }
        }
        out.push_back(self.subscriptions());
        out.extend(last_matches);
    }

    fn heartbeat(&self, product: &str, head: u64) -> String {
        let sequence = sequence(product, head + 1) - 1;
        format!(
            r#"{{"type":"heartbeat","sequence":{sequence},"last_trade_id":{head},"product_id":"{product}","time":"{}"}}"#,
            rfc3339_us(now_us())
        )
    }
}

impl Protocol for Feed {
    fn on_text(&mut self, text: &str, out: &mut Outbox) -> Heard {
        match parse(text) {
            Ok((subscribe, wanted)) => self.apply(subscribe, wanted, out),
            Err(frame) => out.push_back(frame),
        }
        Heard::default()
    }

    fn on_binary(&mut self, out: &mut Outbox) -> Heard {
        out.push_back(error("Malformed JSON", "the message is not text"));
        Heard::default()
    }

    fn emit_due(&mut self, now: Instant, out: &mut Outbox) -> Option<Refusal> {
        if self.subscribe_by.is_some_and(|by| now >= by) {
            return Some(Refusal {
                code: CloseCode::Policy,
                reason: "no subscribe message received in time",
            });
        }
        let timeline = &*self.timeline;
        let head = timeline.head_at(now);
        // Trades in id order across products (they share one timeline).
        while out.len() < BATCH {
            let due = self
                .products
                .iter_mut()
                .filter(|p| p.matches && p.next <= head)
                .min_by_key(|p| p.next);
            let Some(product) = due else { break };
            out.push_back(frame(timeline, &product.id, product.next));
            product.next += 1;
        }
        if out.len() < BATCH {
            // Caught up: heartbeats report the last trade already sent.
            for index in 0..self.products.len() {
                let product = &self.products[index];
                if product.heartbeat && now >= product.next_heartbeat {
                    out.push_back(self.heartbeat(&product.id, head));
                    let product = &mut self.products[index];
                    let next = product.next_heartbeat + HEARTBEAT_EVERY;
                    product.next_heartbeat = if next <= now {
                        now + HEARTBEAT_EVERY
                    } else {
                        next
                    };
                }
            }
        }
        None
    }

    fn next_wake(&self, now: Instant) -> Option<Instant> {
        let timeline = &*self.timeline;
        let products = self.products.iter().flat_map(|p| {
            let trade = p.matches.then(|| timeline.wake(p.next, now));
            let heartbeat = p.heartbeat.then_some(p.next_heartbeat);
            trade.into_iter().chain(heartbeat)
        });
        products.chain(self.subscribe_by).min()
    }
}
