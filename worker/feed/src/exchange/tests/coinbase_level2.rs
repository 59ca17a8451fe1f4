//! Coinbase Advanced Trade `level2`: the book folded from the snapshot and
//! updates by Coinbase's documented rule (absolute sizes, `"0"` removes)
//! equals `book_at`, and `sequence_num` counts every message of a
//! connection from 0.

use super::*;

const SHAPE: ExchangeShape = ExchangeShape::CoinbaseLevel2;
const PRODUCT: &str = "BTC-USD";
const SUBSCRIBE: &str = r#"{"type":"subscribe","product_ids":["BTC-USD"],"channel":"level2"}"#;
const UNSUBSCRIBE: &str = r#"{"type":"unsubscribe","product_ids":["BTC-USD"],"channel":"level2"}"#;
const MESSAGE_KEYS: [&str; 5] = [
    "channel",
    "client_id",
    "timestamp",
    "sequence_num",
    "events",
];
const UPDATE_KEYS: [&str; 4] = ["side", "event_time", "price_level", "new_quantity"];

/// The bids and offers of an `l2_data` message, in the order listed.
fn levels(frame: &Value) -> (Side, Side) {
    let events = frame["events"].as_array().expect("events");
    assert_eq!(events.len(), 1, "{frame}");
    let (mut bids, mut asks) = (Vec::new(), Vec::new());
    for update in events[0]["updates"].as_array().expect("updates") {
        assert_eq!(keys(update), sorted(&UPDATE_KEYS), "{update}");
        let level = (
            update["price_level"].as_str().expect("price").to_owned(),
            update["new_quantity"]
                .as_str()
                .expect("quantity")
                .to_owned(),
        );
        match update["side"].as_str() {
            Some("bid") => bids.push(level),
            Some("offer") => asks.push(level),
            other => panic!("side {other:?}"),
        }
    }
    (bids, asks)
}

fn sequence_num(frame: &Value) -> u64 {
    frame["sequence_num"].as_u64().expect("sequence_num")
}

fn kind(frame: &Value) -> &str {
    frame["events"][0]["type"].as_str().unwrap_or("")
}

/// The update of frame `id` as a connection numbers it.
fn numbered(server: &ExchangeServer, id: u64, sequence_num: u64) -> String {
    server.frame(PRODUCT, id).replacen(
        "\"sequence_num\":0,",
        &format!("\"sequence_num\":{sequence_num},"),
        1,
    )
}

/// The fake's id of the update received as `text`, the first after `after`.
fn update_id(server: &ExchangeServer, text: &str, sequence_num: u64, after: u64) -> u64 {
    (after + 1..=server.head(PRODUCT))
        .find(|&id| numbered(server, id, sequence_num) == text)
        .unwrap_or_else(|| panic!("no frame after {after} is {text}"))
}

/// The next `l2_data` message, skipping acknowledgements.
async fn next_data(ws: &mut Client) -> (Value, String) {
    next_where(ws, |v| v["channel"] == "l2_data").await
}

/// The `level2` products a `subscriptions` message lists.
fn subscribed(ack: &Value) -> Value {
    assert_eq!(ack["channel"], "subscriptions", "{ack}");
    ack["events"][0]["subscriptions"].clone()
}

#[tokio::test]
async fn the_acknowledgement_then_a_snapshot_then_updates_that_fold_to_the_book() {
    let (server, shutdown) = start(config(SHAPE, 100.0)).await;
    let first_id = server.config().first_id;
    let mut ws = connect(&server.ws_url()).await;
    send(&mut ws, SUBSCRIBE).await;
    let text = next_text(&mut ws).await.expect("ack");
    assert_key_order(&text, &MESSAGE_KEYS);
    let ack: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(keys(&ack), sorted(&MESSAGE_KEYS));
    assert_eq!(
        (ack["client_id"].as_str(), sequence_num(&ack)),
        (Some(""), 0)
    );
    assert_eq!(subscribed(&ack), serde_json::json!({"level2": ["BTC-USD"]}));
    // The snapshot takes the next number.
    let (snapshot, text) = next_data(&mut ws).await;
    assert_key_order(&text, &MESSAGE_KEYS);
    assert_key_order(&text, &["type", "product_id", "updates"]);
    assert_key_order(&text, &UPDATE_KEYS);
    assert_eq!((kind(&snapshot), sequence_num(&snapshot)), ("snapshot", 1));
    assert_eq!(snapshot["events"][0]["product_id"], PRODUCT);
    let timestamp = snapshot["timestamp"].as_str().expect("timestamp");
    assert!(
        timestamp.ends_with('Z') && timestamp.len() == 27,
        "{timestamp}"
    );
    let (bids, asks) = levels(&snapshot);
    assert!(bids.len() > 100 && bids.len() <= 200 && asks.len() > 100 && asks.len() <= 200);
    assert!(bids.iter().chain(&asks).all(|(p, q)| {
        p.split_once('.').is_some_and(|(_, d)| d.len() == 2)
            && q.split_once('.').is_some_and(|(_, d)| d.len() == 8)
    }));
    let mut book = LocalBook::snapshot(bids.clone(), asks.clone());
    assert_eq!(book.sides(), (bids, asks), "listed best first");
    let mut pending = Some(book.sides());
    let (mut id, mut number) = (first_id - 1, 1);
    let mut deletes = 0;
    for _ in 0..60 {
        let (update, text) = next_data(&mut ws).await;
        assert_eq!(kind(&update), "update", "{text}");
        assert_eq!(sequence_num(&update), number + 1, "every message counts");
        number += 1;
        let next = update_id(&server, &text, number, id);
        if let Some(snapshot) = pending.take() {
            // The snapshot is the book after the frame before the first update.
            assert!(next > first_id);
            assert_eq!(snapshot, server.book_at(PRODUCT, next - 1));
        } else {
            assert_eq!(next, id + 1, "the frames follow each other");
        }
        id = next;
        let (bids, asks) = levels(&update);
        assert!(!bids.is_empty() || !asks.is_empty(), "changed levels only");
        deletes += bids.iter().chain(&asks).filter(|(_, q)| q == "0").count();
        book.apply(bids, asks);
        assert_eq!(book.sides(), server.book_at(PRODUCT, id), "after {id}");
    }
    assert!(deletes > 0, "new_quantity \"0\" removes levels");
    assert!(server.head(PRODUCT) >= id);
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn unsubscribe_stops_the_book_and_a_new_subscribe_numbers_on_with_a_new_snapshot() {
    let (server, shutdown) = start(config(SHAPE, 100.0)).await;
    let mut ws = connect(&server.ws_url()).await;
    send(&mut ws, SUBSCRIBE).await;
    let ack = next_json(&mut ws).await;
    assert_eq!(sequence_num(&ack), 0);
    let mut last = 0;
    let mut id = server.config().first_id - 1;
    for _ in 0..5 {
        let (frame, text) = next_data(&mut ws).await;
        assert_eq!(sequence_num(&frame), last + 1);
        last += 1;
        if kind(&frame) == "update" {
            id = update_id(&server, &text, last, id);
        }
    }
    send(&mut ws, UNSUBSCRIBE).await;
    // Updates sent before the unsubscribe was read may come first.
    let answer = loop {
        let frame = next_json(&mut ws).await;
        assert_eq!(sequence_num(&frame), last + 1, "{frame}");
        last += 1;
        if frame["channel"] != "l2_data" {
            break frame;
        }
    };
    assert_eq!(subscribed(&answer), serde_json::json!({}));
    let quiet = timeout(Duration::from_millis(300), ws.next()).await;
    assert!(quiet.is_err(), "nothing after the unsubscribe: {quiet:?}");
    send(&mut ws, SUBSCRIBE).await;
    let ack = next_json(&mut ws).await;
    assert_eq!(sequence_num(&ack), last + 1);
    assert_eq!(subscribed(&ack), serde_json::json!({"level2": ["BTC-USD"]}));
    let (snapshot, _) = next_data(&mut ws).await;
    assert_eq!(
        (kind(&snapshot), sequence_num(&snapshot)),
        ("snapshot", last + 2)
    );
    let (bids, asks) = levels(&snapshot);
    let (update, text) = next_data(&mut ws).await;
    assert_eq!(sequence_num(&update), last + 3);
    let next = update_id(&server, &text, last + 3, id);
    // About 300 ms of frames went by unsent: the new book is newer.
    assert!(next - 1 > id + 5, "{id} then {next}");
    assert_eq!(
        LocalBook::snapshot(bids, asks).sides(),
        server.book_at(PRODUCT, next - 1)
    );
    assert_eq!(server.connections_accepted(), 1);
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn a_new_connection_numbers_its_messages_from_0_again() {
    let (server, shutdown) = start(config(SHAPE, 100.0)).await;
    let mut ws = connect(&server.ws_url()).await;
    send(&mut ws, SUBSCRIBE).await;
    let mut numbers = Vec::new();
    for _ in 0..20 {
        numbers.push(sequence_num(&next_json(&mut ws).await));
    }
    assert_eq!(numbers, (0..20).collect::<Vec<_>>());
    assert_eq!(server.cut_all(), 1);
    assert_eq!(ending(&mut ws).await, Ending::CloseFrame);
    let mut again = connect(&server.ws_url()).await;
    send(&mut again, SUBSCRIBE).await;
    let ack = next_json(&mut again).await;
    assert_eq!(
        (ack["channel"].as_str(), sequence_num(&ack)),
        (Some("subscriptions"), 0)
    );
    let (snapshot, _) = next_data(&mut again).await;
    assert_eq!((kind(&snapshot), sequence_num(&snapshot)), ("snapshot", 1));
    drop(again);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn a_client_that_never_subscribes_is_closed_after_5_seconds() {
    let (server, shutdown) = start(config(SHAPE, 10.0)).await;
    let opened = Instant::now();
    let mut ws = connect(&server.ws_url()).await;
    // A refused request is no subscribe.
    send(
        &mut ws,
        r#"{"type":"subscribe","product_ids":["BTC-USD"],"channel":"ticker"}"#,
    )
    .await;
    let refused = next_json(&mut ws).await;
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(ending(&mut ws).await, Ending::CloseFrame);
    let waited = opened.elapsed();
    assert!(
        waited >= Duration::from_secs(5) && waited < Duration::from_secs(7),
        "{waited:?}"
    );
    assert_eq!(server.cuts(), 0, "a refusal, not a cut");
    // One that subscribes in time stays.
    let mut ws = connect(&server.ws_url()).await;
    send(&mut ws, SUBSCRIBE).await;
    sleep(Duration::from_millis(5_500)).await;
    let (frame, _) = next_data(&mut ws).await;
    assert_eq!(frame["channel"], "l2_data");
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn bad_requests_get_an_error_and_the_connection_stays() {
    let (server, shutdown) = start(config(SHAPE, 5.0)).await;
    let mut ws = connect(&server.ws_url()).await;
    for request in [
        "garbage",
        r#"{"type":"subscribe","product_ids":["BTC-USD"],"channel":"level3"}"#,
        r#"{"type":"subscribe","product_ids":["btc-usd"],"channel":"level2"}"#,
        r#"{"type":"subscribe","product_ids":["BTC-USD"],"channels":["level2"]}"#,
    ] {
        send(&mut ws, request).await;
        let answer = next_json(&mut ws).await;
        assert_eq!(keys(&answer), ["message", "type"], "{request}");
        assert_eq!(answer["type"], "error", "{request}");
    }
    ws.send(Message::binary(vec![1, 2, 3]))
        .await
        .expect("binary");
    assert_eq!(next_json(&mut ws).await["type"], "error");
    // Errors take no number.
    send(&mut ws, SUBSCRIBE).await;
    assert_eq!(sequence_num(&next_json(&mut ws).await), 0);
    drop(ws);
    stop(server, shutdown).await;
}
