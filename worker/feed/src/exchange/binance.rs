//! Binance spot: raw trade and aggregate-trade streams (`/ws/<symbol>@trade`,
//! `/ws/<symbol>@aggTrade`) and their REST history (`/api/v3/historicalTrades`,
//! `/api/v3/aggTrades`). See the module doc of `exchange` for what is modelled.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::time::Instant;

use super::ExchangeShape;
use super::model::{Timeline, fixed, group_start, json_str, mix, symbol_hash, trade, trimmed};
use super::server::{BATCH, Heard, Outbox, Protocol, Refusal, Shared, plain, upgrade};

/// `limit` when the request names none, and the most a page holds.
const DEFAULT_LIMIT: u64 = 500;
const MAX_LIMIT: u64 = 1000;

pub(super) fn routes(shape: ExchangeShape) -> Router<Arc<Shared>> {
    let router = Router::new().route("/ws/{stream}", get(stream));
    match shape {
        ExchangeShape::BinanceAggTrade => router.route("/api/v3/aggTrades", get(agg_trades)),
        _ => router.route("/api/v3/historicalTrades", get(historical_trades)),
    }
}

/// The event name in stream names and in the frames' `e`.
fn event(shape: ExchangeShape) -> &'static str {
    match shape {
        ExchangeShape::BinanceAggTrade => "aggTrade",
        _ => "trade",
    }
}

/// Binance's symbol rule (`^[A-Z0-9-_.]{1,20}$`); stream names carry it in
/// lower case. Valid symbols need no JSON escaping.
pub(super) fn valid_symbol(symbol: &str, upper: bool) -> bool {
    (1..=20).contains(&symbol.len())
        && symbol.bytes().all(|b| {
            b.is_ascii_digit()
                || matches!(b, b'-' | b'_' | b'.')
                || if upper {
                    b.is_ascii_uppercase()
                } else {
                    b.is_ascii_lowercase()
                }
        })
}

/// The first underlying trade id of aggregate `first_id`.
fn trade_base(timeline: &Timeline) -> u64 {
    timeline.first_id().saturating_mul(3)
}

/// The WebSocket frame of trade (or aggregate) `id` of `symbol` (upper case).
pub(super) fn frame(timeline: &Timeline, shape: ExchangeShape, symbol: &str, id: u64) -> String {
    let hash = symbol_hash(symbol);
    let t = trade(hash, id);
    let time = timeline.time_us(id) / 1000;
    let event_time = time + mix(hash, id, 3) % 3;
    let (price, qty) = (
        fixed(t.price_cents.into(), 2, 8),
        fixed(t.qty_e8.into(), 8, 8),
    );
    let maker = t.buyer_maker;
    match shape {
        ExchangeShape::BinanceAggTrade => {
            let (first, last) = underlying(timeline, id);
            format!(
                r#"{{"e":"aggTrade","E":{event_time},"s":"{symbol}","a":{id},"p":"{price}","q":"{qty}","f":{first},"l":{last},"T":{time},"m":{maker},"M":true}}"#
            )
        }
        _ => format!(
            r#"{{"e":"trade","E":{event_time},"s":"{symbol}","t":{id},"p":"{price}","q":"{qty}","T":{time},"m":{maker},"M":true}}"#
        ),
    }
}

/// The REST history item of trade (or aggregate) `id` of `symbol` (upper case).
pub(super) fn history_item(
    timeline: &Timeline,
    shape: ExchangeShape,
    symbol: &str,
    id: u64,
) -> String {
    let t = trade(symbol_hash(symbol), id);
    let time = timeline.time_us(id) / 1000;
    let (price, qty) = (
        fixed(t.price_cents.into(), 2, 8),
        fixed(t.qty_e8.into(), 8, 8),
    );
    let maker = t.buyer_maker;
    match shape {
        ExchangeShape::BinanceAggTrade => {
            let (first, last) = underlying(timeline, id);
            format!(
                r#"{{"a":{id},"p":"{price}","q":"{qty}","f":{first},"l":{last},"T":{time},"m":{maker},"M":true}}"#
            )
        }
        _ => format!(
            r#"{{"id":{id},"price":"{price}","qty":"{qty}","quoteQty":"{}","time":{time},"isBuyerMaker":{maker},"isBestMatch":true}}"#,
            trimmed(t.quote_e8(), 8)
        ),
    }
}

/// The first and last trade id aggregate `id` stands for: aggregates cover 1
/// to 4 trades and neighbours' ranges touch.
fn underlying(timeline: &Timeline, id: u64) -> (u64, u64) {
    let k = id.saturating_sub(timeline.first_id());
    let base = trade_base(timeline);
    (
        base + group_start(k),
        base + group_start(k + 1).saturating_sub(1),
    )
}

async fn stream(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    request: Request,
) -> Response {
    let shape = shared.config.shape;
    let symbol = match name.split_once('@') {
        Some((symbol, kind)) if kind == event(shape) && valid_symbol(symbol, false) => {
            symbol.to_ascii_uppercase()
        }
        _ => return plain(StatusCode::BAD_REQUEST, "unknown stream"),
    };
    upgrade(&shared, request, move |session| {
        let timeline = session.shared.timeline();
        // Live start: the first frame is the first id after the head now.
        let next = timeline.head() + 1;
        RawStream {
            shape,
            symbol,
            name,
            next,
            timeline,
        }
    })
}

/// One raw stream connection.
struct RawStream {
    /// The timeline current when the connection opened.
    timeline: Arc<Timeline>,
    shape: ExchangeShape,
    symbol: String,
    /// The stream name as the URL spelled it (`btcusdt@trade`).
    name: String,
    next: u64,
}

/// Binance answers stream requests (`SUBSCRIBE`, `LIST_SUBSCRIPTIONS`…) on
/// raw streams too; this server acknowledges them without changing what it
/// sends. `name` is the connection's stream name as the URL spelled it.
pub(super) fn stream_request_answer(name: &str, text: &str) -> String {
    let value: serde_json::Value = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(error) => {
            let message = format!(
                "Invalid JSON: expected value at line {} column {}",
                error.line(),
                error.column()
            );
            return format!(r#"{{"code":3,"msg":{}}}"#, json_str(&message));
        }
    };
    let Some(request) = value.as_object() else {
        return r#"{"code":2,"msg":"Invalid request: expected an object"}"#.to_owned();
    };
    let id = match request.get("id") {
        Some(id @ (serde_json::Value::Number(_) | serde_json::Value::String(_))) => id.to_string(),
        None | Some(serde_json::Value::Null) => "null".to_owned(),
        Some(_) => {
            return r#"{"code":2,"msg":"Invalid request: request ID must be an unsigned integer"}"#
                .to_owned();
        }
    };
    match request.get("method").and_then(|m| m.as_str()) {
        Some("SUBSCRIBE" | "UNSUBSCRIBE" | "SET_PROPERTY") => {
            format!(r#"{{"result":null,"id":{id}}}"#)
        }
        Some("LIST_SUBSCRIPTIONS") => {
            format!(r#"{{"result":[{}],"id":{id}}}"#, json_str(name))
        }
        Some("GET_PROPERTY") => format!(r#"{{"result":false,"id":{id}}}"#),
        Some(other) => {
            let message = format!(
                "Invalid request: unknown variant `{other}`, expected one of `SUBSCRIBE`, `UNSUBSCRIBE`, `LIST_SUBSCRIPTIONS`, `SET_PROPERTY`, `GET_PROPERTY`"
            );
            format!(r#"{{"code":2,"msg":{},"id":{id}}}"#, json_str(&message))
        }
        None => {
            format!(r#"{{"code":2,"msg":"Invalid request: missing field `method`","id":{id}}}"#)
        }
    }
}

/// Binance's answer to a binary message on a stream.
pub(super) const BINARY_ANSWER: &str =
    r#"{"code":3,"msg":"Invalid JSON: expected value at line 1 column 1"}"#;

impl Protocol for RawStream {
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
        while self.next <= head && out.len() < BATCH {
            out.push_back(frame(timeline, self.shape, &self.symbol, self.next));
            self.next += 1;
        }
        None
    }

    fn next_wake(&self, now: Instant) -> Option<Instant> {
        Some(self.timeline.wake(self.next, now))
    }
}

async fn historical_trades(State(shared): State<Arc<Shared>>, RawQuery(q): RawQuery) -> Response {
    history(&shared, q.as_deref().unwrap_or(""))
}

async fn agg_trades(State(shared): State<Arc<Shared>>, RawQuery(q): RawQuery) -> Response {
    history(&shared, q.as_deref().unwrap_or(""))
}

/// The oldest id the REST history still serves when `head` is the newest id
/// of `timeline` (`None`: it serves nothing). Only the current timeline is
/// served: ids from before a restart are gone.
pub(super) fn oldest_kept(shared: &Shared, timeline: &Timeline, head: u64) -> Option<u64> {
    let retention = shared.config.history_retention;
    let first = timeline.first_id();
    if retention == 0 || head < first {
        return None;
    }
    Some(head.saturating_sub(retention - 1).max(first))
}

pub(super) fn json_response(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json;charset=UTF-8"),
    );
    response
}

pub(super) fn error(code: i32, message: &str) -> Response {
    let body = format!(r#"{{"code":{code},"msg":{}}}"#, json_str(message));
    json_response(StatusCode::BAD_REQUEST, body)
}

/// The page `history` answers.
struct Page {
    symbol: String,
    from_id: Option<u64>,
    limit: u64,
}

/// Binance's error code and message for a request it refuses.
pub(super) type Refused = (i32, String);

fn parse_page(shape: ExchangeShape, query: &str) -> Result<Page, Refused> {
    let refuse = |code: i32, message: &str| (code, message.to_owned());
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query)
        .map_err(|_| refuse(-1100, "Illegal characters found in a parameter."))?;
    let mut seen: Vec<&str> = Vec::new();
    let (mut symbol, mut from_id, mut limit) = (None, None, DEFAULT_LIMIT);
    for (name, value) in &pairs {
        if seen.contains(&name.as_str()) {
            return Err(refuse(-1101, "Duplicate values for a parameter detected."));
        }
        seen.push(name);
        let number = |value: &str| {
            value.parse::<u64>().map_err(|_| {
                refuse(
                    -1100,
                    &format!(
                        "Illegal characters found in parameter '{name}'; legal range is '^[0-9]{{1,20}}$'."
                    ),
                )
            })
        };
        match name.as_str() {
            "symbol" => symbol = Some(value.clone()),
            "fromId" => from_id = Some(number(value)?),
            "limit" => limit = number(value)?.clamp(1, MAX_LIMIT),
            "startTime" | "endTime" if shape == ExchangeShape::BinanceAggTrade => {
                return Err(refuse(
                    -1104,
                    "startTime and endTime are not modelled by this server; page by fromId.",
                ));
            }
            _ => {
                return Err(refuse(
                    -1104,
                    &format!("Not all sent parameters were read; '{name}' is not a parameter."),
                ));
            }
        }
    }
    let symbol = match symbol {
        None => {
            return Err(refuse(
                -1102,
                "Mandatory parameter 'symbol' was not sent, was empty/null, or malformed.",
            ));
        }
        Some(symbol) if !valid_symbol(&symbol, true) => {
            return Err(refuse(
                -1100,
                "Illegal characters found in parameter 'symbol'; legal range is '^[A-Z0-9-_.]{1,20}$'.",
            ));
        }
        Some(symbol) => symbol,
    };
    Ok(Page {
        symbol,
        from_id,
        limit,
    })
}

/// Both history endpoints: ascending from `fromId` (or the newest `limit`
/// without it), never older than the retention edge and never past the head.
fn history(shared: &Shared, query: &str) -> Response {
    if let Some(forced) = shared.history_request() {
        return overridden(forced.status, forced.retry_after_secs);
    }
    let shape = shared.config.shape;
    let page = match parse_page(shape, query) {
        Ok(page) => page,
        Err((code, message)) => return error(code, &message),
    };
    let timeline = shared.timeline();
    let head = timeline.head();
    let mut body = String::from("[");
    if let Some(oldest) = oldest_kept(shared, &timeline, head) {
        let from = match page.from_id {
            // An id below the oldest kept gets the page from the oldest kept,
            // as Binance answers for an id before a symbol's first trade.
            Some(from_id) => from_id.max(oldest),
            None => head.saturating_sub(page.limit - 1).max(oldest),
        };
        let to = head.min(from.saturating_add(page.limit - 1));
        for id in from..=to {
            if id > from {
                body.push(',');
            }
            body.push_str(&history_item(&timeline, shape, &page.symbol, id));
        }
    }
    body.push(']');
    json_response(StatusCode::OK, body)
}

/// The answer a history override forces: Binance's error body, and for 429 and
/// 418 its `Retry-After`.
pub(super) fn overridden(status: u16, retry_after_secs: u64) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let (code, message) = match status.as_u16() {
        429 => (
            -1003,
            "Too many requests; current limit of IP is 6000 requests per minute. Please use the websocket for live updates to avoid polling the API.",
        ),
        418 => (
            -1003,
            "Way too many requests; IP banned. Please use the websocket for live updates to avoid bans.",
        ),
        _ => (
            -1000,
            "An unknown error occurred while processing the request.",
        ),
    };
    let body = format!(r#"{{"code":{code},"msg":{}}}"#, json_str(message));
    let mut response = json_response(status, body);
    if matches!(status.as_u16(), 429 | 418) {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
    }
    response
}
