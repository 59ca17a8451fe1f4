//! Kraken spot WebSocket v2 at `/v2`: the `trade` channel, `status` on
//! connect, `heartbeat`, application `ping`, and the request handling the
//! `book` channel (`kraken_book`) shares. See the module doc of `exchange`
//! for what is modelled.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::get;
use serde_json::{Map, Value};
use tokio::time::Instant;

use super::model::{Timeline, json_str, now_us, rfc3339_us, symbol_hash, trade, trimmed};
use super::server::{BATCH, Heard, Outbox, Protocol, Refusal, Shared, upgrade};

/// Symbols one connection may follow.
const MAX_SYMBOLS: usize = 64;
/// Trades in the snapshot sent on subscribe.
const SNAPSHOT: u64 = 50;
/// Heartbeats go out after this long without any other frame.
pub(super) const HEARTBEAT_AFTER: Duration = Duration::from_secs(1);
/// What Kraken sends after a second without other frames.
pub(super) const HEARTBEAT: &str = r#"{"channel":"heartbeat"}"#;

pub(super) fn routes() -> Router<Arc<Shared>> {
    Router::new().route("/v2", get(v2))
}

async fn v2(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    upgrade(&shared, request, |session| Connection {
        timeline: session.shared.timeline(),
        books: Vec::new(),
        connection_id: connection_id(session.number),
        last_sent: Instant::now(),
    })
}

/// The `connection_id` the `status` frame of session `number` names.
pub(super) fn connection_id(number: u64) -> u64 {
    crate::splitmix64(number ^ 0x4B52_414B)
}

/// `BASE/QUOTE`, upper-case letters and digits (`BTC/USD`).
pub(super) fn valid_symbol(symbol: &str) -> bool {
    let part = |p: &str| {
        (1..=10).contains(&p.len())
            && p.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
    };
    symbol
        .split_once('/')
        .is_some_and(|(base, quote)| part(base) && part(quote))
}

fn item(timeline: &Timeline, symbol: &str, trade_id: u64) -> String {
    let t = trade(symbol_hash(symbol), trade_id);
    let order_type = if t.mix.is_multiple_of(4) {
        "market"
    } else {
        "limit"
    };
    format!(
        r#"{{"symbol":"{symbol}","side":"{}","price":{},"qty":{},"ord_type":"{order_type}","trade_id":{trade_id},"timestamp":"{}"}}"#,
        t.taker_side(),
        trimmed(t.price_cents.into(), 2),
        trimmed(t.qty_e8.into(), 8),
        rfc3339_us(timeline.time_us(trade_id)),
    )
}

/// The `update` frame carrying trade `trade_id` of `symbol`.
pub(super) fn frame(timeline: &Timeline, symbol: &str, trade_id: u64) -> String {
    format!(
        r#"{{"channel":"trade","type":"update","data":[{}]}}"#,
        item(timeline, symbol, trade_id)
    )
}

/// The snapshot of the newest trades up to `head`, oldest first.
fn snapshot(timeline: &Timeline, symbol: &str, head: u64) -> String {
    let from = head.saturating_sub(SNAPSHOT - 1).max(timeline.first_id());
    let items: Vec<String> = (from..=head).map(|id| item(timeline, symbol, id)).collect();
    format!(
        r#"{{"channel":"trade","type":"snapshot","data":[{}]}}"#,
        items.join(",")
    )
}

/// The request fields echoed in every answer.
pub(super) struct Asked {
    pub(super) method: String,
    req_id: Option<u64>,
    time_in: u64,
}

/// The `status` frame a v2 connection opens with.
pub(super) fn status(connection_id: u64) -> String {
    format!(
        r#"{{"channel":"status","data":[{{"api_version":"v2","connection_id":{connection_id},"system":"online","version":"2.0.0"}}],"type":"update"}}"#
    )
}

/// The `symbol` list of a subscribe or unsubscribe's `params`: 1 to `most`
/// strings, else `None` (Kraken's "Invalid arguments:symbol").
pub(super) fn requested_symbols(params: &Map<String, Value>, most: usize) -> Option<Vec<&str>> {
    match params.get("symbol") {
        Some(Value::Array(list)) if !list.is_empty() && list.len() <= most => {
            list.iter().map(Value::as_str).collect()
        }
        _ => None,
    }
}

/// Reads a client request: its echoed fields and its `params`. `None` when
/// it is refused (no `method`, a bad `req_id`), the error in `out`.
pub(super) fn read_request(text: &str, out: &mut Outbox) -> Option<(Asked, Option<Value>)> {
    let mut request = Asked {
        method: String::new(),
        req_id: None,
        time_in: now_us(),
    };
    let value: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    let empty = Map::new();
    let object = value.as_object().unwrap_or(&empty);
    let Some(method) = object.get("method").and_then(Value::as_str) else {
        out.push_back(request.error("EGeneral:Invalid arguments", None));
        return None;
    };
    request.method = method.to_owned();
    match object.get("req_id") {
        None => {}
        Some(id) => match id.as_u64() {
            Some(id) => request.req_id = Some(id),
            None => {
                out.push_back(request.error("EGeneral:Invalid arguments:req_id", None));
                return None;
            }
        },
    }
    let params = object.get("params").cloned();
    Some((request, params))
}

impl Asked {
    fn req_id(&self) -> String {
        self.req_id
            .map(|id| format!(r#","req_id":{id}"#))
            .unwrap_or_default()
    }

    fn times(&self) -> String {
        format!(
            r#""time_in":"{}","time_out":"{}""#,
            rfc3339_us(self.time_in),
            rfc3339_us(now_us())
        )
    }

    pub(super) fn error(&self, message: &str, symbol: Option<&str>) -> String {
        let symbol = symbol
            .map(|s| format!(r#","symbol":{}"#, json_str(s)))
            .unwrap_or_default();
        format!(
            r#"{{"error":{},"method":{}{},"success":false{symbol},{}}}"#,
            json_str(message),
            json_str(&self.method),
            self.req_id(),
            self.times()
        )
    }

    pub(super) fn ack(&self, result: &str) -> String {
        format!(
            r#"{{"method":{}{},"result":{result},"success":true,{}}}"#,
            json_str(&self.method),
            self.req_id(),
            self.times()
        )
    }

    /// The answer to a `ping`.
    pub(super) fn pong(&self) -> String {
        format!(r#"{{"method":"pong"{},{}}}"#, self.req_id(), self.times())
    }
}

struct Book {
    symbol: String,
    next: u64,
}

/// One v2 connection.
struct Connection {
    /// The timeline current when the connection opened.
    timeline: Arc<Timeline>,
    books: Vec<Book>,
    connection_id: u64,
    /// When a frame last went into the outbox (heartbeats fill silences).
    last_sent: Instant,
}

impl Connection {
    fn subscription(&mut self, request: &Asked, params: Option<&Value>, out: &mut Outbox) {
        let invalid =
            |what: &str| request.error(&format!("EGeneral:Invalid arguments:{what}"), None);
        let Some(params) = params.and_then(Value::as_object) else {
            return out.push_back(invalid("params"));
        };
        match params.get("channel").and_then(Value::as_str) {
            Some("trade") => {}
            Some(
                channel @ ("book" | "ticker" | "ohlc" | "instrument" | "level3" | "executions"
                | "balances"),
            ) => {
                let message = format!("Channel {channel} is not modelled by this server");
                return out.push_back(request.error(&message, None));
            }
            _ => return out.push_back(invalid("channel")),
        }
        let Some(symbols) = requested_symbols(params, MAX_SYMBOLS) else {
            return out.push_back(invalid("symbol"));
        };
        let snapshot_wanted = match params.get("snapshot") {
            None => true,
            Some(Value::Bool(wanted)) => *wanted,
            Some(_) => return out.push_back(invalid("snapshot")),
        };
        let subscribe = request.method == "subscribe";
        let timeline = &*self.timeline;
        for symbol in symbols {
            let held = self.books.iter().position(|b| b.symbol == symbol);
            if !valid_symbol(symbol) {
                let message = format!("Currency pair not supported {symbol}");
                out.push_back(request.error(&message, Some(symbol)));
            } else if !subscribe {
                match held {
                    Some(index) => {
                        self.books.remove(index);
                        let result = format!(r#"{{"channel":"trade","symbol":"{symbol}"}}"#);
                        out.push_back(request.ack(&result));
                    }
                    None => out.push_back(request.error("Subscription Not Found", Some(symbol))),
                }
            } else if held.is_some() {
                out.push_back(request.error("Already subscribed", Some(symbol)));
            } else if self.books.len() >= MAX_SYMBOLS {
                out.push_back(request.error("Too many subscriptions", Some(symbol)));
            } else {
                // Live start: updates begin after the head; the snapshot is
                // Kraken's own view of the recent past, not a replay.
                let head = timeline.head();
                self.books.push(Book {
                    symbol: symbol.to_owned(),
                    next: head + 1,
                });
                let result = format!(
                    r#"{{"channel":"trade","snapshot":{snapshot_wanted},"symbol":"{symbol}"}}"#
                );
                out.push_back(request.ack(&result));
                if snapshot_wanted && head >= timeline.first_id() {
                    out.push_back(snapshot(timeline, symbol, head));
                }
            }
        }
    }

    fn answer(&mut self, text: &str, out: &mut Outbox) -> Heard {
        let Some((request, params)) = read_request(text, out) else {
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
        out.push_back(status(self.connection_id));
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
        let timeline = &*self.timeline;
        let head = timeline.head_at(now);
        let before = out.len();
        // One trade per update frame, in id order across symbols.
        while out.len() < BATCH {
            let due = self
                .books
                .iter_mut()
                .filter(|b| b.next <= head)
                .min_by_key(|b| b.next);
            let Some(book) = due else { break };
            out.push_back(frame(timeline, &book.symbol, book.next));
            book.next += 1;
        }
        if out.len() > before {
            self.last_sent = now;
        } else if !self.books.is_empty() && now >= self.last_sent + HEARTBEAT_AFTER {
            out.push_back(HEARTBEAT.to_owned());
            self.last_sent = now;
        }
        None
    }

    fn next_wake(&self, now: Instant) -> Option<Instant> {
        let timeline = &*self.timeline;
        let heartbeat = (!self.books.is_empty()).then_some(self.last_sent + HEARTBEAT_AFTER);
        self.books
            .iter()
            .map(|b| timeline.wake(b.next, now))
            .chain(heartbeat)
            .min()
    }
}
