//! Bybit v5 public spot WebSocket at `/v5/public/spot`: `publicTrade.<SYMBOL>`
//! topics and application `ping`. See the module doc of `exchange` for what is
//! modelled.
//!
//! Trades come in match packages of 1 to 4 consecutive trade ids; a package is
//! one frame whose trades share its time `T` and its cross sequence `seq`, and
//! goes out when its last trade is due.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::get;
use serde_json::Value;
use tokio::time::Instant;

use super::model::{
    Timeline, fixed, group_of, group_start, holey, json_str, mix, symbol_hash, trade, trimmed, uuid,
};
use super::server::{BATCH, Heard, Outbox, Protocol, Refusal, Shared, upgrade};

/// Topics one connection may follow.
const MAX_TOPICS: usize = 64;
/// Bybit spot takes at most 10 args per subscribe request.
const MAX_ARGS: usize = 10;
const TOPIC_PREFIX: &str = "publicTrade.";

pub(super) fn routes() -> Router<Arc<Shared>> {
    Router::new().route("/v5/public/spot", get(spot))
}

async fn spot(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    upgrade(&shared, request, |session| Spot {
        timeline: session.shared.timeline(),
        topics: Vec::new(),
        conn_id: conn_id(session.number),
    })
}

/// The `conn_id` of the `n`-th connection.
pub(super) fn conn_id(n: u64) -> String {
    uuid(crate::splitmix64(n), crate::splitmix64(n ^ 0xB1B1))
}

/// The `req_id` of a request, as JSON, when it has one.
pub(super) fn req_id(request: &Value) -> Option<String> {
    match request.get("req_id") {
        Some(id @ (Value::String(_) | Value::Number(_))) => Some(id.to_string()),
        _ => None,
    }
}

/// An answer to an `op` (subscribe, unsubscribe, ping).
pub(super) fn reply(
    conn_id: &str,
    success: bool,
    message: &str,
    req_id: Option<&str>,
    op: &str,
) -> String {
    let req_id = req_id
        .map(|id| format!(r#","req_id":{id}"#))
        .unwrap_or_default();
    format!(
        r#"{{"success":{success},"ret_msg":{},"conn_id":"{conn_id}"{req_id},"op":{}}}"#,
        json_str(message),
        json_str(op)
    )
}

/// Upper-case letters and digits (`BTCUSDT`).
pub(super) fn valid_symbol(symbol: &str) -> bool {
    (2..=25).contains(&symbol.len())
        && symbol
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
}

/// The package (0-based) trade `id` belongs to.
fn package_of(timeline: &Timeline, id: u64) -> u64 {
    group_of(id.saturating_sub(timeline.first_id()))
}

/// The last trade id of package `k`.
fn last_id(timeline: &Timeline, k: u64) -> u64 {
    timeline.first_id() + group_start(k + 1) - 1
}

/// The newest trade id sent to anyone when `head` ids are due: the end of the
/// last complete package.
pub(super) fn complete_head(timeline: &Timeline, head: u64) -> u64 {
    let first = timeline.first_id();
    if head < first {
        return head;
    }
    first + group_start(group_of(head + 1 - first)) - 1
}

/// The frame of the package carrying trade `id` of `symbol`.
pub(super) fn frame(timeline: &Timeline, symbol: &str, id: u64) -> String {
    package_frame(timeline, symbol, package_of(timeline, id))
}

/// The trade time (unix ms) of `id`: its package's.
pub(super) fn time_ms(timeline: &Timeline, id: u64) -> u64 {
    timeline.time_us(last_id(timeline, package_of(timeline, id))) / 1000
}

fn package_frame(timeline: &Timeline, symbol: &str, k: u64) -> String {
    let hash = symbol_hash(symbol);
    let first = timeline.first_id() + group_start(k);
    let last = last_id(timeline, k);
    let time = timeline.time_us(last) / 1000;
    let seq = holey(1_000_000_000 + hash % 1_000_000_000, hash, k);
    let items: Vec<String> = (first..=last)
        .map(|id| {
            let t = trade(hash, id);
            let side = if t.buyer_maker { "Sell" } else { "Buy" };
            format!(
                r#"{{"T":{time},"s":"{symbol}","S":"{side}","v":"{}","p":"{}","i":"{id}","BT":false,"RPI":false,"seq":{seq}}}"#,
                trimmed(t.qty_e8.into(), 8),
                fixed(t.price_cents.into(), 2, 2),
            )
        })
        .collect();
    format!(
        r#"{{"topic":"{TOPIC_PREFIX}{symbol}","type":"snapshot","ts":{},"data":[{}]}}"#,
        time + mix(hash, k, 4) % 3,
        items.join(",")
    )
}

struct Topic {
    symbol: String,
    /// The next package to send.
    next: u64,
}

/// One spot connection.
struct Spot {
    /// The timeline current when the connection opened.
    timeline: Arc<Timeline>,
    topics: Vec<Topic>,
    conn_id: String,
}

impl Spot {
    fn reply(&self, success: bool, message: &str, req_id: Option<&str>, op: &str) -> String {
        reply(&self.conn_id, success, message, req_id, op)
    }

    /// Validates every arg first: a request is applied whole or not at all.
    fn topics(&mut self, subscribe: bool, args: Option<&Value>) -> Result<(), String> {
        let Some(Value::Array(args)) = args else {
            return Err("error:args must be a list of topics".into());
        };
        if args.is_empty() || args.len() > MAX_ARGS {
            return Err(format!("error:args size must be 1 to {MAX_ARGS}"));
        }
        let mut symbols: Vec<&str> = Vec::new();
        for arg in args {
            let Some(arg) = arg.as_str() else {
                return Err("error:args must be a list of topics".into());
            };
            let Some(symbol) = arg.strip_prefix(TOPIC_PREFIX) else {
                return Err(format!("error:handler not found,topic:{arg}"));
            };
            if !valid_symbol(symbol) {
                return Err(format!("Invalid symbol :[{arg}]"));
            }
            let held = self.topics.iter().any(|t| t.symbol == symbol);
            if subscribe && (held || symbols.contains(&symbol)) {
                return Err(format!("error:already subscribed,topic:{arg}"));
            }
            if !subscribe && !held {
                return Err(format!("error:not subscribed,topic:{arg}"));
            }
            symbols.push(symbol);
        }
        if !subscribe {
            self.topics
                .retain(|t| !symbols.contains(&t.symbol.as_str()));
            return Ok(());
        }
        if self.topics.len() + symbols.len() > MAX_TOPICS {
            return Err(format!("error:at most {MAX_TOPICS} topics per connection"));
        }
        // Live start: the first package not complete yet.
        let timeline = &*self.timeline;
        let next = package_of(timeline, timeline.head() + 1);
        for symbol in symbols {
            self.topics.push(Topic {
                symbol: symbol.to_owned(),
                next,
            });
        }
        Ok(())
    }
}

impl Protocol for Spot {
    fn on_text(&mut self, text: &str, out: &mut Outbox) -> Heard {
        let value: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        let req_id = req_id(&value);
        let req_id = req_id.as_deref();
        let Some(op) = value.get("op").and_then(Value::as_str) else {
            out.push_back(self.reply(
                false,
                "error:request is not a JSON object with op",
                req_id,
                "",
            ));
            return Heard::default();
        };
        match op {
            "ping" => {
                out.push_back(self.reply(true, "pong", req_id, "ping"));
                return Heard { app_ping: true };
            }
            "subscribe" | "unsubscribe" => {
                let answer = match self.topics(op == "subscribe", value.get("args")) {
                    Ok(()) => self.reply(true, "", req_id, op),
                    Err(message) => self.reply(false, &message, req_id, op),
                };
                out.push_back(answer);
            }
            _ => {
                let message = format!("error:unknown op {op}");
                out.push_back(self.reply(false, &message, req_id, op));
            }
        }
        Heard::default()
    }

    fn on_binary(&mut self, out: &mut Outbox) -> Heard {
        self.on_text("", out)
    }

    fn emit_due(&mut self, now: Instant, out: &mut Outbox) -> Option<Refusal> {
        let timeline = &*self.timeline;
        let head = timeline.head_at(now);
        // Packages in order across topics (they share one timeline).
        while out.len() < BATCH {
            let due = self
                .topics
                .iter_mut()
                .filter(|t| last_id(timeline, t.next) <= head)
                .min_by_key(|t| t.next);
            let Some(topic) = due else { break };
            out.push_back(package_frame(timeline, &topic.symbol, topic.next));
            topic.next += 1;
        }
        None
    }

    fn next_wake(&self, now: Instant) -> Option<Instant> {
        let timeline = &*self.timeline;
        self.topics
            .iter()
            .map(|t| timeline.wake(last_id(timeline, t.next), now))
            .min()
    }
}
