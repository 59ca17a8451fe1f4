//! Kraken WebSocket v2 `book`: a client keeps the book the way Kraken's
//! book guide says (absolute quantities, `qty` 0 removes, then truncate to
//! the subscribed depth), checks every checksum by the guide's rule with the
//! pair's decimals, and the book it keeps is the best levels of `book_at`.

use super::*;

const SHAPE: ExchangeShape = ExchangeShape::KrakenBook;
const SYMBOL: &str = "BTC/USD";
const SUBSCRIBE: &str =
    r#"{"method":"subscribe","params":{"channel":"book","symbol":["BTC/USD"],"depth":10}}"#;
const UNSUBSCRIBE: &str =
    r#"{"method":"unsubscribe","params":{"channel":"book","symbol":["BTC/USD"],"depth":10}}"#;
/// The pair's decimals the checksum writes numbers with.
const PRICE_DECIMALS: usize = 1;
const QTY_DECIMALS: usize = 8;

/// A JSON number's text (`27000.1`, `27000`, `1.5`): the numbers sent have
/// at most 13 significant digits, so the shortest text of the double read is
/// the text sent.
fn number(value: &Value) -> String {
    assert!(value.is_number(), "{value}");
    value.to_string()
}

/// The `{price, qty}` levels of a side, each two JSON numbers.
fn side(levels: &Value) -> Side {
    levels
        .as_array()
        .expect("levels")
        .iter()
        .map(|level| {
            assert_eq!(keys(level), ["price", "qty"], "{level}");
            (number(&level["price"]), number(&level["qty"]))
        })
        .collect()
}

fn sides(frame: &Value) -> (Side, Side) {
    let data = frame["data"].as_array().expect("data");
    assert_eq!(data.len(), 1, "{frame}");
    (side(&data[0]["bids"]), side(&data[0]["asks"]))
}

fn checksum_of(frame: &Value) -> u64 {
    frame["data"][0]["checksum"].as_u64().expect("checksum")
}

/// `text` with exactly `places` decimals.
fn at_decimals(text: &str, places: usize) -> String {
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    format!("{int}.{frac:0<places$}")
}

/// Kraken's documented checksum of the best 10 levels: asks lowest first,
/// then bids highest first; each price and quantity at the pair's decimals,
/// the point removed, then the leading zeros; CRC32, unsigned.
fn kraken_checksum(book: &LocalBook) -> u64 {
    let (bids, asks) = book.sides();
    let mut text = String::new();
    for (price, qty) in asks.iter().take(10).chain(bids.iter().take(10)) {
        for (number, places) in [(price, PRICE_DECIMALS), (qty, QTY_DECIMALS)] {
            let digits = at_decimals(number, places).replace('.', "");
            text.push_str(digits.trim_start_matches('0'));
        }
    }
    u64::from(crc32fast::hash(text.as_bytes()))
}

/// The guide's rule: after each update, keep the best `depth` levels.
fn truncate(book: &mut LocalBook, depth: usize) -> usize {
    let (bids, asks) = book.sides();
    let dropped = bids.len().saturating_sub(depth) + asks.len().saturating_sub(depth);
    *book = LocalBook::snapshot(
        bids.into_iter().take(depth).collect(),
        asks.into_iter().take(depth).collect(),
    );
    dropped
}

/// The best `depth` levels of the exchange's book after `id`.
fn top(server: &ExchangeServer, id: u64, depth: usize) -> (Side, Side) {
    let (mut bids, mut asks) = server.book_at(SYMBOL, id);
    bids.truncate(depth);
    asks.truncate(depth);
    (bids, asks)
}

/// The fake's id of the update received as `text`, the first after
/// `after`; the ids between are frames that changed nothing in the best 10.
fn update_id(server: &ExchangeServer, text: &str, after: u64) -> u64 {
    (after + 1..=server.head(SYMBOL))
        .find(|&id| server.frame(SYMBOL, id) == text)
        .unwrap_or_else(|| panic!("no frame after {after} is {text}"))
}

async fn next_book(ws: &mut Client) -> (Value, String) {
    next_where(ws, |v| v["channel"] == "book").await
}

/// Connects, reads `status`, subscribes with `request`, reads the ack.
async fn subscribed(server: &ExchangeServer, request: &str) -> (Client, Value) {
    let mut ws = connect(&server.ws_url()).await;
    assert_eq!(next_json(&mut ws).await["channel"], "status");
    send(&mut ws, request).await;
    let ack = next_json(&mut ws).await;
    assert_eq!(ack["success"], true, "{ack}");
    (ws, ack)
}

#[tokio::test]
async fn a_snapshot_then_updates_keep_the_best_10_levels_with_valid_checksums() {
    let (server, shutdown) = start(config(SHAPE, 100.0)).await;
    let first_id = server.config().first_id;
    let mut ws = connect(&server.ws_url()).await;
    assert_eq!(next_json(&mut ws).await["channel"], "status");
    send(
        &mut ws,
        r#"{"method":"subscribe","params":{"channel":"book","symbol":["BTC/USD"],"depth":10},"req_id":7}"#,
    )
    .await;
    let text = next_text(&mut ws).await.expect("ack");
    assert_key_order(
        &text,
        &[
            "method", "req_id", "result", "success", "time_in", "time_out",
        ],
    );
    let ack: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(
        ack["result"],
        serde_json::json!({"channel":"book","depth":10,"snapshot":true,"symbol":"BTC/USD"})
    );
    assert_eq!(ack["req_id"], 7);
    let (snapshot, text) = next_book(&mut ws).await;
    assert_key_order(&text, &["channel", "type", "data"]);
    assert_key_order(&text, &["symbol", "bids", "asks", "checksum"]);
    assert_eq!(snapshot["type"], "snapshot");
    assert_eq!(
        keys(&snapshot["data"][0]),
        ["asks", "bids", "checksum", "symbol"]
    );
    let (bids, asks) = sides(&snapshot);
    assert_eq!((bids.len(), asks.len()), (10, 10), "the subscribed depth");
    let mut book = LocalBook::snapshot(bids.clone(), asks.clone());
    assert_eq!(book.sides(), (bids, asks), "listed best first");
    assert_eq!(checksum_of(&snapshot), kraken_checksum(&book));
    let mut pending = Some(book.sides());
    let mut id = first_id - 1;
    let (mut deletes, mut truncated, mut silent, mut entering) = (0, 0, 0, 0);
    for _ in 0..80 {
        let (update, text) = next_book(&mut ws).await;
        assert_eq!(update["type"], "update", "{text}");
        assert_key_order(&text, &["symbol", "bids", "asks", "checksum", "timestamp"]);
        assert!(
            update["data"][0]["timestamp"]
                .as_str()
                .is_some_and(|t| t.ends_with('Z'))
        );
        let next = update_id(&server, &text, id);
        match pending.take() {
            // The snapshot is the book after the frame before the first
            // update (or one that changed nothing in the best 10 since).
            Some(snapshot) => {
                let mut at = next - 1;
                while top(&server, at, 10) != snapshot {
                    assert!(at > first_id, "the snapshot is no book of the exchange");
                    at -= 1;
                }
            }
            None => silent += next - id - 1,
        }
        id = next;
        let (bids, asks) = sides(&update);
        assert!(!bids.is_empty() || !asks.is_empty(), "{text}");
        let (before_bids, before_asks) = book.sides();
        for (levels, held) in [(&bids, &before_bids), (&asks, &before_asks)] {
            deletes += levels.iter().filter(|(_, q)| q == "0").count();
            entering += levels
                .iter()
                .filter(|(p, q)| q != "0" && !held.iter().any(|(h, _)| h == p))
                .count();
        }
        book.apply(bids, asks);
        truncated += truncate(&mut book, 10);
        assert_eq!(checksum_of(&update), kraken_checksum(&book), "after {id}");
        assert_eq!(book.sides(), top(&server, id, 10), "after {id}");
    }
    assert!(deletes > 0, "qty 0 removes levels");
    assert!(entering > 0, "levels come into the best 10");
    assert!(
        truncated > 0,
        "levels pushed out are truncated, not removed"
    );
    assert!(
        silent > 0,
        "frames that change nothing in the best 10 are not sent"
    );
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn depth_25_gets_the_whole_book_and_every_change() {
    let (server, shutdown) = start(config(SHAPE, 100.0)).await;
    let (mut ws, ack) = subscribed(
        &server,
        r#"{"method":"subscribe","params":{"channel":"book","symbol":["BTC/USD"],"depth":25}}"#,
    )
    .await;
    assert_eq!(ack["result"]["depth"], 25);
    let (snapshot, _) = next_book(&mut ws).await;
    let (bids, asks) = sides(&snapshot);
    assert!(bids.len() > 12 && bids.len() <= 25 && asks.len() > 12 && asks.len() <= 25);
    let mut book = LocalBook::snapshot(bids, asks);
    assert_eq!(checksum_of(&snapshot), kraken_checksum(&book));
    let whole = book.sides();
    let mut previous: Option<u64> = None;
    for _ in 0..30 {
        let (update, _) = next_book(&mut ws).await;
        let (bids, asks) = sides(&update);
        book.apply(bids, asks);
        assert_eq!(truncate(&mut book, 25), 0, "the whole book fits");
        assert_eq!(checksum_of(&update), kraken_checksum(&book));
        // Every frame changes the whole book: find it by its book.
        let after = previous.unwrap_or(server.config().first_id - 1);
        let id = (after + 1..=server.head(SYMBOL))
            .find(|&id| server.book_at(SYMBOL, id) == book.sides())
            .expect("a book of the exchange");
        if let Some(previous) = previous {
            // Every frame that changed the book is sent (one that only
            // deleted empty levels changed nothing).
            let unchanged = server.book_at(SYMBOL, previous);
            assert!(
                (previous + 1..id).all(|skipped| server.book_at(SYMBOL, skipped) == unchanged),
                "{previous} then {id}"
            );
        } else {
            assert_eq!(server.book_at(SYMBOL, id - 1), whole);
        }
        previous = Some(id);
    }
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn a_corrupted_kraken_checksum_is_wrong_exactly_once() {
    let (server, shutdown) = start(config(SHAPE, 100.0)).await;
    let (mut ws, _) = subscribed(&server, SUBSCRIBE).await;
    let (snapshot, _) = next_book(&mut ws).await;
    let (bids, asks) = sides(&snapshot);
    let mut book = LocalBook::snapshot(bids, asks);
    for _ in 0..5 {
        let (update, _) = next_book(&mut ws).await;
        let (bids, asks) = sides(&update);
        book.apply(bids, asks);
        truncate(&mut book, 10);
        assert_eq!(checksum_of(&update), kraken_checksum(&book));
    }
    assert!(server.corrupt_next_checksum());
    let mut wrong = Vec::new();
    let mut id = server.config().first_id - 1;
    for i in 0..40 {
        let (update, text) = next_book(&mut ws).await;
        let (bids, asks) = sides(&update);
        book.apply(bids, asks);
        truncate(&mut book, 10);
        if checksum_of(&update) != kraken_checksum(&book) {
            assert_ne!(checksum_of(&update), 0, "0 reads as no checksum");
            // Only the checksum is wrong: the levels are the true ones.
            let mut repaired = update.clone();
            repaired["data"][0]["checksum"] = kraken_checksum(&book).into();
            let truth = (id + 1..=server.head(SYMBOL))
                .map(|id| serde_json::from_str::<Value>(&server.frame(SYMBOL, id)).expect("JSON"))
                .find(|truth| *truth == repaired);
            assert!(truth.is_some(), "{text}");
            wrong.push(i);
        } else {
            id = update_id(&server, &text, id);
        }
    }
    assert_eq!(wrong, [0], "the next update, exactly once");
    drop(ws);
    // A snapshot is never corrupted: the pending one waits for an update.
    assert!(server.corrupt_next_checksum());
    let (mut ws, _) = subscribed(&server, SUBSCRIBE).await;
    let (snapshot, _) = next_book(&mut ws).await;
    let (bids, asks) = sides(&snapshot);
    let mut book = LocalBook::snapshot(bids, asks);
    assert_eq!(checksum_of(&snapshot), kraken_checksum(&book));
    let mut checks = Vec::new();
    for _ in 0..5 {
        let (update, _) = next_book(&mut ws).await;
        let (bids, asks) = sides(&update);
        book.apply(bids, asks);
        truncate(&mut book, 10);
        checks.push(checksum_of(&update) == kraken_checksum(&book));
    }
    assert_eq!(checks, [false, true, true, true, true]);
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn unsubscribe_stops_the_book_and_subscribe_sends_a_new_snapshot() {
    let (server, shutdown) = start(config(SHAPE, 100.0)).await;
    let (mut ws, _) = subscribed(&server, SUBSCRIBE).await;
    let (snapshot, _) = next_book(&mut ws).await;
    assert_eq!(snapshot["type"], "snapshot");
    let mut id = server.config().first_id - 1;
    for _ in 0..5 {
        let (update, text) = next_book(&mut ws).await;
        assert_eq!(update["type"], "update");
        id = update_id(&server, &text, id);
    }
    send(&mut ws, UNSUBSCRIBE).await;
    let answer = loop {
        let (frame, text) = next_where(&mut ws, |v| v["channel"] != "heartbeat").await;
        if frame["channel"] != "book" {
            break frame;
        }
        id = update_id(&server, &text, id);
    };
    assert_eq!(
        (&answer["method"], &answer["success"], &answer["result"]),
        (
            &Value::from("unsubscribe"),
            &Value::from(true),
            &serde_json::json!({"channel":"book","depth":10,"symbol":"BTC/USD"})
        )
    );
    // Nothing more for it (heartbeats aside: none either, nothing is followed).
    let quiet = timeout(Duration::from_millis(300), ws.next()).await;
    assert!(quiet.is_err(), "{quiet:?}");
    send(&mut ws, SUBSCRIBE).await;
    assert_eq!(next_json(&mut ws).await["success"], true);
    let (snapshot, _) = next_book(&mut ws).await;
    assert_eq!(snapshot["type"], "snapshot", "a new snapshot first");
    let (bids, asks) = sides(&snapshot);
    let mut book = LocalBook::snapshot(bids, asks);
    let (update, text) = next_book(&mut ws).await;
    let next = update_id(&server, &text, id);
    assert!(
        next > id + 5,
        "about 300 ms of frames went by: {id} then {next}"
    );
    let (bids, asks) = sides(&update);
    book.apply(bids, asks);
    truncate(&mut book, 10);
    assert_eq!(book.sides(), top(&server, next, 10));
    assert_eq!(server.connections_accepted(), 1);
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn book_requests_are_checked_like_kraken_checks_them() {
    let (server, shutdown) = start(config(SHAPE, 5.0)).await;
    let mut ws = connect(&server.ws_url()).await;
    let status = next_json(&mut ws).await;
    assert_eq!(
        (&status["channel"], &status["type"]),
        (&Value::from("status"), &Value::from("update"))
    );
    send(&mut ws, r#"{"method":"ping","req_id":3}"#).await;
    let pong = next_json(&mut ws).await;
    assert_eq!(
        (&pong["method"], &pong["req_id"]),
        (&Value::from("pong"), &Value::from(3))
    );
    for (request, error) in [
        ("garbage", "EGeneral:Invalid arguments"),
        (
            r#"{"method":"subscribe","params":{"channel":"book","symbol":["BTC/USD"],"depth":7}}"#,
            "EGeneral:Invalid arguments:depth",
        ),
        (
            r#"{"method":"subscribe","params":{"channel":"trade","symbol":["BTC/USD"]}}"#,
            "Channel trade is not modelled by this server",
        ),
        (
            r#"{"method":"subscribe","params":{"channel":"book","symbol":["btc/usd"]}}"#,
            "Currency pair not supported btc/usd",
        ),
        (UNSUBSCRIBE, "Subscription Not Found"),
        (r#"{"method":"nap"}"#, "Method not found"),
    ] {
        send(&mut ws, request).await;
        let answer = next_json(&mut ws).await;
        assert_eq!(
            (&answer["success"], answer["error"].as_str()),
            (&Value::from(false), Some(error)),
            "{request}"
        );
    }
    send(&mut ws, SUBSCRIBE).await;
    assert_eq!(next_json(&mut ws).await["success"], true);
    send(&mut ws, SUBSCRIBE).await;
    let (again, _) = next_where(&mut ws, |v| v.get("method").is_some()).await;
    assert_eq!(again["error"], "Already subscribed");
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn a_restart_starts_the_level2_and_book_over_from_id_1_with_a_snapshot() {
    for shape in [ExchangeShape::CoinbaseLevel2, SHAPE] {
        // Frame 0 (one update) is due 500 ms after the restart, frame 1 at
        // 2 s: a client that subscribes within 500 ms gets the book at 1.
        let (server, shutdown) = start(config(shape, 2.0)).await;
        let symbol = shape.example_stream_id();
        let subscribe = match shape {
            SHAPE => SUBSCRIBE,
            _ => r#"{"type":"subscribe","product_ids":["BTC-USD"],"channel":"level2"}"#,
        };
        let is_data = |v: &Value| v["channel"] == "book" || v["channel"] == "l2_data";
        let mut old = connect(&server.ws_url()).await;
        send(&mut old, subscribe).await;
        next_where(&mut old, is_data).await;
        let restarted = Instant::now();
        assert_eq!(server.restart(), 1, "{shape}");
        assert_eq!(ending(&mut old).await, Ending::CloseFrame, "{shape}");
        let mut fresh = connect(&server.ws_url()).await;
        send(&mut fresh, subscribe).await;
        let subscribed_after = restarted.elapsed();
        let (snapshot, _) = next_where(&mut fresh, is_data).await;
        assert!(
            subscribed_after < Duration::from_millis(500),
            "{shape}: the test needs a subscribe within 500 ms, took {subscribed_after:?}"
        );
        let (bids, asks) = match shape {
            SHAPE => sides(&snapshot),
            _ => {
                assert_eq!(snapshot["events"][0]["type"], "snapshot");
                let mut bids = Vec::new();
                let mut asks = Vec::new();
                for update in snapshot["events"][0]["updates"]
                    .as_array()
                    .expect("updates")
                {
                    let level = (
                        update["price_level"].as_str().expect("price").to_owned(),
                        update["new_quantity"].as_str().expect("qty").to_owned(),
                    );
                    match update["side"].as_str() {
                        Some("bid") => bids.push(level),
                        _ => asks.push(level),
                    }
                }
                (bids, asks)
            }
        };
        let (mut all_bids, mut all_asks) = server.book_at(symbol, 1);
        if shape == SHAPE {
            all_bids.truncate(10);
            all_asks.truncate(10);
        }
        assert_eq!(
            (bids, asks),
            (all_bids, all_asks),
            "{shape}: the new book at 1"
        );
        // The next update continues it: frame 2 or, for Kraken, a later one
        // when frame 2 changed nothing in the best 10.
        let (_, text) = next_where(&mut fresh, is_data).await;
        let first = server.config().first_id;
        let id = (2..=server.head(symbol))
            .find(|&id| {
                let truth = server.frame(symbol, id);
                truth == text
                    || truth.replacen("\"sequence_num\":0,", "\"sequence_num\":2,", 1) == text
            })
            .unwrap_or_else(|| panic!("{shape}: {text}"));
        assert!(id < first, "{shape}: the new timeline's ids");
        drop(fresh);
        stop(server, shutdown).await;
    }
}
