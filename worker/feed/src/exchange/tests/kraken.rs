use super::*;

const ITEM_KEYS: [&str; 7] = [
    "symbol",
    "side",
    "price",
    "qty",
    "ord_type",
    "trade_id",
    "timestamp",
];

fn subscribe(symbols: &str, snapshot: bool, req_id: Option<u64>) -> String {
    let req_id = req_id
        .map(|id| format!(r#","req_id":{id}"#))
        .unwrap_or_default();
    format!(
        r#"{{"method":"subscribe","params":{{"channel":"trade","symbol":[{symbols}],"snapshot":{snapshot}}}{req_id}}}"#
    )
}

fn assert_item(item: &Value, symbol: &str) {
    assert_eq!(keys(item), sorted(&ITEM_KEYS), "{item}");
    assert_eq!(item["symbol"], symbol);
    assert!(matches!(item["side"].as_str(), Some("buy" | "sell")));
    assert!(matches!(
        item["ord_type"].as_str(),
        Some("limit" | "market")
    ));
    assert!(item["price"].as_f64().expect("price is a number") > 0.0);
    assert!(item["qty"].as_f64().expect("qty is a number") > 0.0);
    let timestamp = item["timestamp"].as_str().expect("an RFC 3339 string");
    assert_eq!(
        (timestamp.len(), &timestamp[10..11]),
        (27, "T"),
        "{timestamp}"
    );
}

#[tokio::test]
async fn status_on_connect_then_ack_snapshot_and_one_trade_per_update() {
    let (server, shutdown) = start(config(ExchangeShape::KrakenTrade, 40.0)).await;
    wait_for_head(&server, "BTC/USD", 5_010).await;
    let mut ws = connect(&server.ws_url()).await;
    let text = next_text(&mut ws).await.expect("status");
    let status: Value = serde_json::from_str(&text).expect("JSON");
    assert_key_order(
        &text,
        &[
            "channel",
            "data",
            "api_version",
            "connection_id",
            "system",
            "version",
            "type",
        ],
    );
    assert_eq!(
        (status["channel"].as_str(), status["type"].as_str()),
        (Some("status"), Some("update"))
    );
    assert_eq!(status["data"][0]["system"], "online");
    assert!(status["data"][0]["connection_id"].is_u64());

    send(&mut ws, &subscribe(r#""BTC/USD""#, true, Some(7))).await;
    let text = next_text(&mut ws).await.expect("ack");
    assert_key_order(
        &text,
        &[
            "method", "req_id", "result", "success", "time_in", "time_out",
        ],
    );
    let ack: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(ack["method"], "subscribe");
    assert_eq!(ack["req_id"], 7);
    assert_eq!(ack["success"], true);
    assert_eq!(
        ack["result"],
        serde_json::json!({"channel": "trade", "snapshot": true, "symbol": "BTC/USD"})
    );

    let text = next_text(&mut ws).await.expect("snapshot");
    assert_key_order(&text, &["channel", "type", "data"]);
    let snapshot: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(
        (snapshot["channel"].as_str(), snapshot["type"].as_str()),
        (Some("trade"), Some("snapshot"))
    );
    let items = snapshot["data"].as_array().expect("data");
    assert!((10..=50).contains(&items.len()), "{} trades", items.len());
    let ids: Vec<u64> = items
        .iter()
        .map(|i| i["trade_id"].as_u64().expect("id"))
        .collect();
    assert_eq!(
        ids[0], 5_000,
        "the snapshot reaches back to the first trade here"
    );
    for (item, pair) in items.iter().zip(ids.windows(2)) {
        assert_item(item, "BTC/USD");
        assert_eq!(pair[1], pair[0] + 1, "oldest first, contiguous");
    }
    let mut previous = *ids.last().expect("a trade");
    for _ in 0..10 {
        let (update, text) = next_where(&mut ws, |v| v["channel"] == "trade").await;
        assert_eq!(update["type"], "update");
        let data = update["data"].as_array().expect("data");
        assert_eq!(data.len(), 1, "one trade per update");
        assert_item(&data[0], "BTC/USD");
        assert_key_order(&text, &ITEM_KEYS);
        let id = data[0]["trade_id"].as_u64().expect("id");
        assert_eq!(id, previous + 1, "live after the snapshot, contiguous");
        assert_eq!(text, server.frame("BTC/USD", id));
        previous = id;
    }
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn the_snapshot_holds_the_last_50_trades_and_updates_start_live() {
    let (server, shutdown) = start(config(ExchangeShape::KrakenTrade, 200.0)).await;
    wait_for_head(&server, "ETH/EUR", 5_150).await;
    let mut ws = connect(&server.ws_url()).await;
    next_json(&mut ws).await; // status
    let head = server.head("ETH/EUR");
    send(&mut ws, &subscribe(r#""ETH/EUR""#, true, None)).await;
    let ack = next_json(&mut ws).await;
    assert!(ack.get("req_id").is_none(), "no req_id asked, none echoed");
    let snapshot = next_json(&mut ws).await;
    let items = snapshot["data"].as_array().expect("data");
    assert_eq!(items.len(), 50);
    let last = items[49]["trade_id"].as_u64().expect("id");
    assert!(last >= head);
    let (update, _) = next_where(&mut ws, |v| v["type"] == "update").await;
    assert_eq!(update["data"][0]["trade_id"], last + 1);
    // Without a snapshot the first frame after the ack is live.
    let mut quiet = connect(&server.ws_url()).await;
    next_json(&mut quiet).await;
    let head = server.head("ETH/EUR");
    send(&mut quiet, &subscribe(r#""ETH/EUR""#, false, None)).await;
    assert_eq!(next_json(&mut quiet).await["result"]["snapshot"], false);
    let first = next_json(&mut quiet).await;
    assert_eq!(first["type"], "update");
    assert!(first["data"][0]["trade_id"].as_u64().expect("id") > head);
    drop((ws, quiet));
    stop(server, shutdown).await;
}

#[tokio::test]
async fn heartbeats_fill_a_second_without_trades() {
    let (server, shutdown) = start(config(ExchangeShape::KrakenTrade, 0.2)).await;
    let mut ws = connect(&server.ws_url()).await;
    next_json(&mut ws).await; // status
    send(&mut ws, &subscribe(r#""BTC/USD""#, false, None)).await;
    assert_eq!(next_json(&mut ws).await["success"], true);
    let started = Instant::now();
    let (_, text) = next_where(&mut ws, |v| v["channel"] == "heartbeat").await;
    assert_eq!(text, r#"{"channel":"heartbeat"}"#);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn pings_get_pongs_and_bad_requests_get_errors() {
    let (server, shutdown) = start(config(ExchangeShape::KrakenTrade, 1.0)).await;
    let mut ws = connect(&server.ws_url()).await;
    next_json(&mut ws).await; // status
    send(&mut ws, r#"{"method":"ping","req_id":101}"#).await;
    let text = next_text(&mut ws).await.expect("pong");
    assert_key_order(&text, &["method", "req_id", "time_in", "time_out"]);
    let pong: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(
        (pong["method"].as_str(), pong["req_id"].as_u64()),
        (Some("pong"), Some(101))
    );
    send(&mut ws, r#"{"method":"ping"}"#).await;
    assert_eq!(
        keys(&next_json(&mut ws).await),
        ["method", "time_in", "time_out"]
    );
    for (request, error) in [
        ("garbage", "EGeneral:Invalid arguments"),
        (
            r#"{"method":"ping","req_id":"x"}"#,
            "EGeneral:Invalid arguments:req_id",
        ),
        (r#"{"method":"fly"}"#, "Method not found"),
        (
            r#"{"method":"subscribe"}"#,
            "EGeneral:Invalid arguments:params",
        ),
        (
            r#"{"method":"subscribe","params":{"channel":"book","symbol":["BTC/USD"]}}"#,
            "Channel book is not modelled by this server",
        ),
        (
            r#"{"method":"subscribe","params":{"channel":"trade","symbol":[]}}"#,
            "EGeneral:Invalid arguments:symbol",
        ),
        (
            &subscribe(r#""btc/usd""#, false, Some(3)),
            "Currency pair not supported btc/usd",
        ),
        (
            r#"{"method":"unsubscribe","params":{"channel":"trade","symbol":["BTC/USD"]}}"#,
            "Subscription Not Found",
        ),
    ] {
        send(&mut ws, request).await;
        let answer = next_json(&mut ws).await;
        assert_eq!(answer["success"], false, "{request}");
        assert_eq!(answer["error"], error, "{request}");
        assert!(answer["time_in"].is_string() && answer["time_out"].is_string());
    }
    send(&mut ws, &subscribe(r#""BTC/USD""#, false, None)).await;
    assert_eq!(next_json(&mut ws).await["success"], true);
    send(&mut ws, &subscribe(r#""BTC/USD""#, false, None)).await;
    let again = next_json(&mut ws).await;
    assert_eq!(
        (again["error"].as_str(), again["symbol"].as_str()),
        (Some("Already subscribed"), Some("BTC/USD"))
    );
    send(
        &mut ws,
        r#"{"method":"unsubscribe","params":{"channel":"trade","symbol":["BTC/USD"]}}"#,
    )
    .await;
    let (gone, _) = next_where(&mut ws, |v| v["method"] == "unsubscribe").await;
    assert_eq!(
        gone["result"],
        serde_json::json!({"channel": "trade", "symbol": "BTC/USD"})
    );
    drop(ws);
    stop(server, shutdown).await;
}
