//! Real loopback sockets against each shape, with a tokio-tungstenite client
//! and a raw HTTP/1.1 client; the helpers live here, the tests per shape in
//! the child modules.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep, timeout};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;

use super::*;

mod binance;
mod bybit;
mod coinbase;
mod coinbase_level2;
mod combined;
mod common;
mod depth;
mod inband_books;
mod kraken;
mod kraken_book;

/// One side of a book as the tests keep it: (price, quantity) strings.
type Side = Vec<(String, String)>;

fn price(level: &(String, String)) -> f64 {
    level.0.parse().expect("a price")
}

/// A book kept the way both exchanges tell clients to: a snapshot replaces
/// it, an update sets absolute quantities, a zero removes the level.
#[derive(Default)]
struct LocalBook {
    bids: std::collections::HashMap<String, String>,
    asks: std::collections::HashMap<String, String>,
}

impl LocalBook {
    fn snapshot(bids: Side, asks: Side) -> LocalBook {
        LocalBook {
            bids: bids.into_iter().collect(),
            asks: asks.into_iter().collect(),
        }
    }

    fn apply(&mut self, bids: Side, asks: Side) {
        for (levels, book) in [(bids, &mut self.bids), (asks, &mut self.asks)] {
            for (price, qty) in levels {
                if qty.parse::<f64>().expect("a quantity") == 0.0 {
                    book.remove(&price);
                } else {
                    book.insert(price, qty);
                }
            }
        }
    }

    /// Best first on both sides.
    fn sides(&self) -> (Side, Side) {
        let sorted = |side: &std::collections::HashMap<String, String>, descending: bool| {
            let mut levels: Side = side.iter().map(|(p, q)| (p.clone(), q.clone())).collect();
            levels.sort_by(|a, b| price(a).total_cmp(&price(b)));
            if descending {
                levels.reverse();
            }
            levels
        };
        (sorted(&self.bids, true), sorted(&self.asks, false))
    }
}

/// Generous: only a broken server takes this long.
const WAIT: Duration = Duration::from_secs(10);

type Client = WebSocketStream<MaybeTlsStream<TcpStream>>;

async fn start(config: ExchangeConfig) -> (ExchangeServer, CancellationToken) {
    let shutdown = CancellationToken::new();
    let server = ExchangeServer::start(([127, 0, 0, 1], 0).into(), config, shutdown.clone())
        .await
        .expect("exchange starts");
    (server, shutdown)
}

fn config(shape: ExchangeShape, rate: f64) -> ExchangeConfig {
    ExchangeConfig {
        shape,
        rate,
        ..ExchangeConfig::default()
    }
}

/// Cancels, waits for the end and checks nothing panicked on the way.
async fn stop(server: ExchangeServer, shutdown: CancellationToken) {
    let shared = server.shared.clone();
    shutdown.cancel();
    timeout(WAIT, server.finished()).await.expect("stops");
    assert_eq!(shared.panics(), 0, "a session or connection panicked");
}

/// The shape's URL for `stream_id`.
fn url(server: &ExchangeServer, stream_id: &str) -> String {
    server.ws_url().replace("{stream_id}", stream_id)
}

async fn connect(url: &str) -> Client {
    let (ws, _) = timeout(WAIT, tokio_tungstenite::connect_async(url))
        .await
        .expect("connect in time")
        .expect("connect");
    ws
}

async fn send(ws: &mut Client, text: &str) {
    ws.send(Message::text(text)).await.expect("send");
}

/// The next text frame, or `None` when the connection ended.
async fn next_text(ws: &mut Client) -> Option<String> {
    loop {
        match timeout(WAIT, ws.next()).await.expect("frame in time") {
            Some(Ok(Message::Text(text))) => return Some(text.to_string()),
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return None,
            Some(Ok(_)) => {}
        }
    }
}

async fn next_json(ws: &mut Client) -> Value {
    let text = next_text(ws).await.expect("a frame");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Reads until a frame for which `wanted` holds, returning it and its text.
async fn next_where(ws: &mut Client, wanted: impl Fn(&Value) -> bool) -> (Value, String) {
    loop {
        let text = next_text(ws).await.expect("a frame");
        let value: Value = serde_json::from_str(&text).expect("JSON");
        if wanted(&value) {
            return (value, text);
        }
    }
}

/// How a connection ended, read from the client's side.
#[derive(Debug, PartialEq)]
enum Ending {
    CloseFrame,
    NoCloseFrame,
}

async fn ending(ws: &mut Client) -> Ending {
    loop {
        match timeout(WAIT, ws.next()).await.expect("ends in time") {
            Some(Ok(Message::Close(_))) => return Ending::CloseFrame,
            Some(Ok(_)) => {}
            Some(Err(_)) | None => return Ending::NoCloseFrame,
        }
    }
}

/// The key set of an object, sorted.
fn keys(value: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys
}

fn sorted<'a>(names: &[&'a str]) -> Vec<&'a str> {
    let mut names = names.to_vec();
    names.sort_unstable();
    names
}

/// `names` appear as keys in `text` in this order.
fn assert_key_order(text: &str, names: &[&str]) {
    let mut at = 0;
    for name in names {
        let needle = format!("\"{name}\":");
        match text[at..].find(&needle) {
            Some(found) => at += found + needle.len(),
            None => panic!("key {name} missing or out of order in {text}"),
        }
    }
}

/// An answer of the raw HTTP client.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// Sends `request` (raw bytes) and reads the answer until the server closes.
async fn raw_http(server: &ExchangeServer, request: &[u8]) -> Option<Answer> {
    let mut tcp = TcpStream::connect(server.local_addr()).await.expect("tcp");
    let _ = tcp.write_all(request).await;
    let mut raw = Vec::new();
    let _ = timeout(WAIT, tcp.read_to_end(&mut raw))
        .await
        .expect("answer in time");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Some(Answer {
        status,
        headers,
        body: body.to_owned(),
    })
}

async fn http_get(server: &ExchangeServer, target: &str) -> Answer {
    let request = format!("GET {target} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    raw_http(server, request.as_bytes())
        .await
        .expect("an HTTP answer")
}

/// Waits (real time) until the head reaches `id`.
async fn wait_for_head(server: &ExchangeServer, symbol: &str, id: u64) {
    let deadline = Instant::now() + WAIT;
    while server.head(symbol) < id {
        assert!(Instant::now() < deadline, "head never reached {id}");
        sleep(Duration::from_millis(20)).await;
    }
}
