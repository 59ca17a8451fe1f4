use super::*;

const MATCH_KEYS: [&str; 10] = [
    "type",
    "trade_id",
    "sequence",
    "maker_order_id",
    "taker_order_id",
    "time",
    "product_id",
    "size",
    "price",
    "side",
];
const HEARTBEAT_KEYS: [&str; 5] = ["type", "sequence", "last_trade_id", "product_id", "time"];

const SUBSCRIBE: &str =
    r#"{"type":"subscribe","product_ids":["BTC-USD"],"channels":["matches","heartbeat"]}"#;

#[tokio::test]
async fn subscribe_is_acknowledged_then_last_match_then_matches_and_heartbeats() {
    let (server, shutdown) = start(config(ExchangeShape::CoinbaseMatches, 40.0)).await;
    wait_for_head(&server, "BTC-USD", 5_005).await;
    let mut ws = connect(&server.ws_url()).await;
    send(&mut ws, SUBSCRIBE).await;
    assert_eq!(
        next_text(&mut ws).await.expect("ack"),
        r#"{"type":"subscriptions","channels":[{"name":"matches","product_ids":["BTC-USD"]},{"name":"heartbeat","product_ids":["BTC-USD"]}]}"#
    );
    let last = next_json(&mut ws).await;
    assert_eq!(last["type"], "last_match");
    let mut previous = last["trade_id"].as_u64().expect("trade_id");
    assert!(previous >= 5_005);
    let mut previous_sequence = last["sequence"].as_u64().expect("sequence");
    let (mut holes, mut heartbeats, mut matches) = (0, 0, 0);
    let deadline = Instant::now() + Duration::from_millis(2_500);
    while Instant::now() < deadline || heartbeats == 0 {
        let text = next_text(&mut ws).await.expect("frame");
        let frame: Value = serde_json::from_str(&text).expect("JSON");
        match frame["type"].as_str() {
            Some("match") => {
                assert_eq!(keys(&frame), sorted(&MATCH_KEYS), "{text}");
                assert_key_order(&text, &MATCH_KEYS);
                let id = frame["trade_id"].as_u64().expect("trade_id");
                assert_eq!(id, previous + 1, "trade ids are contiguous");
                let sequence = frame["sequence"].as_u64().expect("sequence");
                assert!(sequence > previous_sequence, "sequence increases");
                holes += usize::from(sequence > previous_sequence + 1);
                assert_eq!(text, server.frame("BTC-USD", id));
                assert!(frame["size"].as_str().expect("size").parse::<f64>().is_ok());
                assert!(
                    frame["price"]
                        .as_str()
                        .expect("price")
                        .parse::<f64>()
                        .is_ok()
                );
                assert!(matches!(frame["side"].as_str(), Some("buy" | "sell")));
                assert!(frame["time"].as_str().expect("time").ends_with('Z'));
                (previous, previous_sequence) = (id, sequence);
                matches += 1;
            }
            Some("heartbeat") => {
                assert_eq!(keys(&frame), sorted(&HEARTBEAT_KEYS), "{text}");
                assert_key_order(&text, &HEARTBEAT_KEYS);
                assert_eq!(frame["product_id"], "BTC-USD");
                // It reports the last trade sent before it, with a sequence
                // at or after that trade's and before the next one's.
                assert_eq!(frame["last_trade_id"], previous);
                let sequence = frame["sequence"].as_u64().expect("sequence");
                assert!(sequence >= previous_sequence);
                let next: Value =
                    serde_json::from_str(&server.frame("BTC-USD", previous + 1)).expect("JSON");
                assert!(sequence < next["sequence"].as_u64().expect("sequence"));
                heartbeats += 1;
            }
            other => panic!("unexpected {other:?}: {text}"),
        }
    }
    assert!(matches >= 50, "{matches} matches");
    assert!(holes > 0, "the sequence has holes");
    assert!(
        (1..=4).contains(&heartbeats),
        "about one heartbeat a second: {heartbeats}"
    );
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn channel_objects_and_several_products_interleave() {
    let (server, shutdown) = start(config(ExchangeShape::CoinbaseMatches, 30.0)).await;
    wait_for_head(&server, "ETH-USD", 5_002).await;
    let mut ws = connect(&server.ws_url()).await;
    send(
        &mut ws,
        r#"{"type":"subscribe","channels":[{"name":"matches","product_ids":["ETH-USD","BTC-USD"]}]}"#,
    )
    .await;
    let ack = next_json(&mut ws).await;
    assert_eq!(ack["type"], "subscriptions");
    assert_eq!(ack["channels"][0]["name"], "matches");
    assert_eq!(
        ack["channels"][0]["product_ids"],
        serde_json::json!(["ETH-USD", "BTC-USD"])
    );
    let mut next = std::collections::HashMap::new();
    for _ in 0..2 {
        let last = next_json(&mut ws).await;
        assert_eq!(last["type"], "last_match");
        next.insert(
            last["product_id"].as_str().expect("product").to_owned(),
            last["trade_id"].as_u64().expect("id") + 1,
        );
    }
    assert_eq!(next.len(), 2);
    for _ in 0..20 {
        let frame = next_json(&mut ws).await;
        assert_eq!(frame["type"], "match");
        let product = frame["product_id"].as_str().expect("product");
        let expected = next.get_mut(product).expect("a subscribed product");
        assert_eq!(frame["trade_id"], *expected, "contiguous per product");
        *expected += 1;
    }
    // Unsubscribing one leaves the other.
    send(
        &mut ws,
        r#"{"type":"unsubscribe","product_ids":["ETH-USD"],"channels":["matches"]}"#,
    )
    .await;
    let (ack, _) = next_where(&mut ws, |v| v["type"] == "subscriptions").await;
    assert_eq!(
        ack["channels"][0]["product_ids"],
        serde_json::json!(["BTC-USD"])
    );
    let (after, _) = next_where(&mut ws, |v| v["type"] == "match").await;
    assert_eq!(after["product_id"], "BTC-USD");
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn reconnecting_starts_at_the_live_trade_whatever_is_asked() {
    let (server, shutdown) = start(config(ExchangeShape::CoinbaseMatches, 20.0)).await;
    let subscribe = r#"{"type":"subscribe","product_ids":["BTC-USD"],"channels":["matches"],"from_seq":1,"sequence":1}"#;
    wait_for_head(&server, "BTC-USD", 5_001).await;
    let mut a = connect(&server.ws_url()).await;
    send(&mut a, subscribe).await;
    let (first, _) = next_where(&mut a, |v| v["type"] == "last_match").await;
    drop(a);
    sleep(Duration::from_secs(1)).await;
    let mut b = connect(&server.ws_url()).await;
    send(&mut b, subscribe).await;
    let (second, _) = next_where(&mut b, |v| v["type"] == "last_match").await;
    let (a_id, b_id) = (
        first["trade_id"].as_u64().unwrap(),
        second["trade_id"].as_u64().unwrap(),
    );
    assert!(
        b_id >= a_id + 15,
        "a second of ids missed: {a_id} then {b_id}"
    );
    let (live, _) = next_where(&mut b, |v| v["type"] == "match").await;
    assert_eq!(live["trade_id"], b_id + 1);
    drop(b);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn bad_subscribes_get_error_frames_and_the_connection_stays_open() {
    let (server, shutdown) = start(config(ExchangeShape::CoinbaseMatches, 20.0)).await;
    let mut ws = connect(&server.ws_url()).await;
    for (request, reason) in [
        ("garbage", None),
        (
            r#"{"type":"hello"}"#,
            Some("Type has to be either subscribe or unsubscribe"),
        ),
        (
            r#"{"type":"subscribe","product_ids":["btc-usd"],"channels":["matches"]}"#,
            Some("btc-usd is not a valid product"),
        ),
        (
            r#"{"type":"subscribe","product_ids":["BTC-USD"],"channels":["bogus"]}"#,
            Some("bogus is not a valid channel"),
        ),
        (
            r#"{"type":"subscribe","product_ids":["BTC-USD"],"channels":["level2"]}"#,
            None,
        ),
        (
            r#"{"type":"subscribe","product_ids":["BTC-USD"]}"#,
            Some("channels must be a list"),
        ),
        (
            r#"{"type":"subscribe","product_ids":"BTC-USD","channels":["matches"]}"#,
            None,
        ),
        (r#"{"type":"subscribe","channels":["matches"]}"#, None),
    ] {
        send(&mut ws, request).await;
        let error = next_json(&mut ws).await;
        assert_eq!(keys(&error), ["message", "reason", "type"], "{request}");
        assert_eq!(error["type"], "error", "{request}");
        if let Some(reason) = reason {
            assert_eq!(error["reason"], reason, "{request}");
        }
    }
    ws.send(Message::binary(vec![1, 2, 3])).await.expect("send");
    assert_eq!(next_json(&mut ws).await["type"], "error");
    send(&mut ws, SUBSCRIBE).await;
    assert_eq!(next_json(&mut ws).await["type"], "subscriptions");
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn a_client_that_never_subscribes_is_closed_after_5_seconds() {
    let (server, shutdown) = start(config(ExchangeShape::CoinbaseMatches, 10.0)).await;
    let opened = Instant::now();
    let mut ws = connect(&server.ws_url()).await;
    assert_eq!(ending(&mut ws).await, Ending::CloseFrame);
    let waited = opened.elapsed();
    assert!(
        waited >= Duration::from_secs(5) && waited < Duration::from_secs(7),
        "{waited:?}"
    );
    assert_eq!(server.cuts(), 0, "a refusal, not a cut");
    stop(server, shutdown).await;
}
