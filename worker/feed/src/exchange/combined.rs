//! Binance's combined stream for the diff depth shapes: `GET /stream` (with
//! or without `?streams=a/b/c`), streams added and removed on the socket with
//! `{"method":"SUBSCRIBE","params":["btcusdt@depth@100ms",…],"id":N}` and
//! `UNSUBSCRIBE` (each answered `{"result":null,"id":N}`), every frame wrapped
//! `{"stream":"<name>","data":<the depthUpdate frame>}`. Modelled on the spot
//! "WebSocket Streams" page (General WSS information, Live Subscribing/
//! Unsubscribing to streams) and the USD-M futures "Websocket Market Streams"
//! page: a connection that sends more than 5 messages in any second (futures:
//! 10) — text, binary, ping and pong frames all count — or listens to more
//! than 1,024 streams is closed (1008, with the reason).
//!
//! A stream subscribed starts live, at the first frame not complete yet, like
//! a raw stream connection; subscribing a stream already held changes
//! nothing; unsubscribing one not held is acknowledged.
//! [`ExchangeServer::messages_received`](super::ExchangeServer::messages_received)
//! and [`ExchangeServer::limit_closes`](super::ExchangeServer::limit_closes)
//! count what clients sent and the connections closed for a limit.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{RawQuery, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::Value;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::binance::{BINARY_ANSWER, stream_request_answer};
use super::depth::{Market, first_open_frame, frame_due, frame_text, stream_symbol};
use super::model::{Timeline, json_str};
use super::server::{BATCH, Heard, Outbox, Protocol, Refusal, Shared, plain, upgrade};

/// Streams one connection may listen to.
pub(super) const MAX_STREAMS: usize = 1024;

/// Incoming messages allowed in any second.
fn messages_per_second(market: Market) -> usize {
    match market {
        Market::Futures => 10,
        _ => 5,
    }
}

const TOO_MANY_MESSAGES: Refusal = Refusal {
    code: CloseCode::Policy,
    reason: "too many messages: more than the limit in one second",
};
const TOO_MANY_STREAMS: Refusal = Refusal {
    code: CloseCode::Policy,
    reason: "too many streams: more than 1024 on one connection",
};

/// One stream a connection listens to.
struct Listened {
    /// As the client spelled it (`btcusdt@depth@100ms`).
    name: String,
    /// Upper case, as the frames spell it.
    symbol: String,
    /// The next frame to send.
    next: u64,
}

/// One combined-stream connection.
struct Combined {
    /// The timeline current when the connection opened.
    timeline: Arc<Timeline>,
    market: Market,
    shared: Arc<Shared>,
    streams: Vec<Listened>,
    /// When each message of the last second arrived.
    recent: VecDeque<Instant>,
    /// The close owed for a broken limit, sent at the next chance.
    refusal: Option<Refusal>,
}

pub(super) async fn stream(
    State(shared): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
    request: Request,
) -> Response {
    let market = Market::of(shared.config.shape);
    // `?streams=a/b/c`: listened to from the start.
    let mut initial: Vec<(String, String)> = Vec::new();
    if let Some(query) = query.as_deref().filter(|q| !q.is_empty()) {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query).unwrap_or_default();
        for (key, value) in pairs {
            if key != "streams" {
                continue;
            }
            for name in value.split('/').filter(|n| !n.is_empty()) {
                let Some(symbol) = stream_symbol(market, name) else {
                    return plain(StatusCode::BAD_REQUEST, "unknown stream");
                };
                if !initial.iter().any(|(n, _)| n == name) {
                    initial.push((name.to_owned(), symbol));
                }
            }
        }
        if initial.len() > MAX_STREAMS {
            return plain(StatusCode::BAD_REQUEST, "too many streams");
        }
    }
    upgrade(&shared, request, move |session| {
        let mut combined = Combined {
            timeline: session.shared.timeline(),
            market,
            shared: session.shared.clone(),
            streams: Vec::new(),
            recent: VecDeque::new(),
            refusal: None,
        };
        for (name, symbol) in initial {
            combined.listen(name, symbol);
        }
        combined
    })
}

impl Combined {
    fn listen(&mut self, name: String, symbol: String) {
        if self.streams.iter().any(|s| s.name == name) {
            return;
        }
        let timeline = &*self.timeline;
        let next = first_open_frame(timeline, timeline.head());
        self.streams.push(Listened { name, symbol, next });
    }

    /// Counts one incoming message; false when it breaks the per-second
    /// limit (the close is then owed).
    fn count_message(&mut self) -> bool {
        let now = Instant::now();
        while self
            .recent
            .front()
            .is_some_and(|&at| now.duration_since(at) >= Duration::from_secs(1))
        {
            self.recent.pop_front();
        }
        self.recent.push_back(now);
        if self.recent.len() > messages_per_second(self.market) {
            self.refuse(TOO_MANY_MESSAGES);
            return false;
        }
        true
    }

    fn refuse(&mut self, refusal: Refusal) {
        if self.refusal.is_none() {
            self.refusal = Some(refusal);
            self.shared.count_limit_close();
        }
    }

    /// `SUBSCRIBE`/`UNSUBSCRIBE` params: the stream names with their symbols,
    /// or Binance's error text.
    fn names(&self, params: Option<&Value>) -> Result<Vec<(String, String)>, String> {
        let Some(Value::Array(items)) = params else {
            return Err("Invalid request: params must be an array of stream names".to_owned());
        };
        let mut names = Vec::with_capacity(items.len());
        for item in items {
            let Some(name) = item.as_str() else {
                return Err("Invalid request: stream names must be strings".to_owned());
            };
            let Some(symbol) = stream_symbol(self.market, name) else {
                return Err(format!("Invalid request: unknown stream {name}"));
            };
            names.push((name.to_owned(), symbol));
        }
        Ok(names)
    }

    fn request(&mut self, text: &str, out: &mut Outbox) {
        let value: Value = match serde_json::from_str(text) {
            Ok(value) => value,
            // The raw streams' answer for everything else.
            Err(_) => return out.push_back(stream_request_answer("", text)),
        };
        let id = match value.get("id") {
            Some(id @ (Value::Number(_) | Value::String(_))) => id.to_string(),
            _ => return out.push_back(stream_request_answer("", text)),
        };
        let method = value.get("method").and_then(Value::as_str);
        match method {
            Some(method @ ("SUBSCRIBE" | "UNSUBSCRIBE")) => {
                let names = match self.names(value.get("params")) {
                    Ok(names) => names,
                    Err(message) => {
                        return out.push_back(format!(
                            r#"{{"code":2,"msg":{},"id":{id}}}"#,
                            json_str(&message)
                        ));
                    }
                };
                if method == "SUBSCRIBE" {
                    for (name, symbol) in names {
                        self.listen(name, symbol);
                    }
                    if self.streams.len() > MAX_STREAMS {
                        return self.refuse(TOO_MANY_STREAMS);
                    }
                } else {
                    self.streams
                        .retain(|s| !names.iter().any(|(name, _)| *name == s.name));
                }
                out.push_back(format!(r#"{{"result":null,"id":{id}}}"#));
            }
            Some("LIST_SUBSCRIPTIONS") => {
                let names: Vec<String> = self.streams.iter().map(|s| json_str(&s.name)).collect();
                out.push_back(format!(r#"{{"result":[{}],"id":{id}}}"#, names.join(",")));
            }
            _ => out.push_back(stream_request_answer("", text)),
        }
    }
}

impl Protocol for Combined {
    fn on_text(&mut self, text: &str, out: &mut Outbox) -> Heard {
        if self.count_message() {
            self.request(text, out);
        }
        Heard::default()
    }

    fn on_binary(&mut self, out: &mut Outbox) -> Heard {
        if self.count_message() {
            out.push_back(BINARY_ANSWER.to_owned());
        }
        Heard::default()
    }

    fn on_control_frame(&mut self) {
        self.count_message();
    }

    fn emit_due(&mut self, now: Instant, out: &mut Outbox) -> Option<Refusal> {
        if let Some(refusal) = self.refusal {
            return Some(refusal);
        }
        let timeline = &*self.timeline;
        let head = timeline.head_at(now);
        while out.len() < BATCH {
            let due = self
                .streams
                .iter_mut()
                .filter(|s| frame_due(timeline, s.next) <= head)
                .min_by_key(|s| s.next);
            let Some(stream) = due else { break };
            let data = frame_text(timeline, self.market, &stream.symbol, stream.next);
            out.push_back(format!(
                r#"{{"stream":{},"data":{data}}}"#,
                json_str(&stream.name)
            ));
            stream.next += 1;
        }
        None
    }

    fn next_wake(&self, now: Instant) -> Option<Instant> {
        if self.refusal.is_some() {
            return Some(now);
        }
        let timeline = &*self.timeline;
        self.streams
            .iter()
            .map(|s| timeline.wake(frame_due(timeline, s.next), now))
            .min()
    }
}
