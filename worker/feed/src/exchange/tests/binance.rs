use super::*;

const TRADE_KEYS: [&str; 9] = ["e", "E", "s", "t", "p", "q", "T", "m", "M"];
const AGG_KEYS: [&str; 11] = ["e", "E", "s", "a", "p", "q", "f", "l", "T", "m", "M"];

/// An 8-decimal string, as Binance writes prices and quantities.
fn assert_decimal8(value: &Value) {
    let text = value.as_str().expect("a string");
    let (whole, fraction) = text.split_once('.').expect("a decimal point");
    assert!(!whole.is_empty() && fraction.len() == 8, "{text}");
    assert!(text.parse::<f64>().expect("a number") > 0.0);
}

#[tokio::test]
async fn trade_frames_carry_the_documented_fields_in_order() {
    let (server, shutdown) = start(config(ExchangeShape::BinanceTrade, 50.0)).await;
    let mut ws = connect(&url(&server, "btcusdt")).await;
    let mut previous = None;
    for _ in 0..10 {
        let text = next_text(&mut ws).await.expect("trade");
        let trade: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(keys(&trade), sorted(&TRADE_KEYS), "{text}");
        assert_key_order(&text, &TRADE_KEYS);
        assert_eq!(trade["e"], "trade");
        assert_eq!(trade["s"], "BTCUSDT");
        assert_eq!(trade["M"], true);
        assert!(trade["m"].is_boolean());
        assert_decimal8(&trade["p"]);
        assert_decimal8(&trade["q"]);
        let id = trade["t"].as_u64().expect("t");
        assert!(id >= 5_000, "ids start at first_id");
        if let Some(previous) = previous {
            assert_eq!(id, previous + 1, "trade ids are contiguous");
        }
        previous = Some(id);
        let time = trade["T"].as_u64().expect("T");
        assert_eq!(time, server.ts_ms(id));
        assert!(trade["E"].as_u64().expect("E") >= time);
        // The exact text is a pure function of (symbol, id).
        assert_eq!(text, server.frame("btcusdt", id));
        assert_eq!(text, server.frame("BTCUSDT", id));
    }
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn agg_trade_frames_cover_contiguous_trade_ranges() {
    let (server, shutdown) = start(config(ExchangeShape::BinanceAggTrade, 50.0)).await;
    let mut ws = connect(&url(&server, "ethbtc")).await;
    let mut previous: Option<(u64, u64)> = None;
    for _ in 0..12 {
        let text = next_text(&mut ws).await.expect("aggTrade");
        let agg: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(keys(&agg), sorted(&AGG_KEYS), "{text}");
        assert_key_order(&text, &AGG_KEYS);
        assert_eq!(agg["e"], "aggTrade");
        assert_eq!(agg["s"], "ETHBTC");
        let (id, first, last) = (
            agg["a"].as_u64().expect("a"),
            agg["f"].as_u64().expect("f"),
            agg["l"].as_u64().expect("l"),
        );
        assert!(first <= last && last - first < 4);
        if let Some((previous_id, previous_last)) = previous {
            assert_eq!(id, previous_id + 1, "aggregate ids are contiguous");
            assert_eq!(first, previous_last + 1, "trade ranges touch");
        }
        previous = Some((id, last));
        assert_eq!(text, server.frame("ethbtc", id));
    }
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn every_connection_starts_live_and_nothing_is_replayed() {
    let rate = 20.0;
    let (server, shutdown) = start(config(ExchangeShape::BinanceTrade, rate)).await;
    let mut a = connect(&url(&server, "btcusdt")).await;
    let a_first = next_json(&mut a).await["t"].as_u64().expect("t");
    assert!(
        a_first <= 5_002,
        "a fresh server starts near first_id: {a_first}"
    );
    sleep(Duration::from_secs(1)).await;
    // Asking for old ids changes nothing: the URL has no such parameter and
    // stream requests are acknowledged, not acted on.
    let head = server.head("btcusdt");
    let mut b = connect(&(url(&server, "btcusdt") + "?fromId=5000")).await;
    send(
        &mut b,
        r#"{"method":"SUBSCRIBE","params":["btcusdt@trade"],"id":1}"#,
    )
    .await;
    let (_, ack) = next_where(&mut b, |v| v.get("id").is_some()).await;
    assert_eq!(ack, r#"{"result":null,"id":1}"#);
    let (first, _) = next_where(&mut b, |v| v["e"] == "trade").await;
    let b_first = first["t"].as_u64().expect("t");
    assert!(
        b_first > head,
        "b starts after the head at connect ({b_first} vs {head})"
    );
    assert!(
        b_first >= a_first + 15,
        "b starts ~20 ids later ({b_first} vs {a_first})"
    );
    // a is unaffected and still contiguous.
    let mut previous = a_first;
    while previous < b_first {
        let id = next_json(&mut a).await["t"].as_u64().expect("t");
        assert_eq!(id, previous + 1);
        previous = id;
    }
    // A client that reconnects after a second has missed a second of ids.
    drop(b);
    sleep(Duration::from_secs(1)).await;
    let mut c = connect(&url(&server, "btcusdt")).await;
    let c_first = next_json(&mut c).await["t"].as_u64().expect("t");
    assert!(c_first >= b_first + 15, "{c_first} vs {b_first}");
    drop((a, c));
    stop(server, shutdown).await;
}

#[tokio::test]
async fn stream_requests_get_binance_answers_and_the_stream_goes_on() {
    let (server, shutdown) = start(config(ExchangeShape::BinanceTrade, 20.0)).await;
    let mut ws = connect(&url(&server, "btcusdt")).await;
    let answers = [
        (
            r#"{"method":"LIST_SUBSCRIPTIONS","id":3}"#,
            r#"{"result":["btcusdt@trade"],"id":3}"#,
        ),
        (
            "garbage",
            r#"{"code":3,"msg":"Invalid JSON: expected value at line 1 column 1"}"#,
        ),
        (
            r#"{"id":4}"#,
            r#"{"code":2,"msg":"Invalid request: missing field `method`","id":4}"#,
        ),
        (
            r#"{"method":"SUBSCRIBE","id":[1]}"#,
            r#"{"code":2,"msg":"Invalid request: request ID must be an unsigned integer"}"#,
        ),
    ];
    for (request, expected) in answers {
        send(&mut ws, request).await;
        let (_, answer) = next_where(&mut ws, |v| v.get("e").is_none()).await;
        assert_eq!(answer, expected, "for {request}");
    }
    send(&mut ws, r#"{"method":"FOO","id":5}"#).await;
    let (answer, _) = next_where(&mut ws, |v| v.get("e").is_none()).await;
    assert_eq!(
        (answer["code"].as_i64(), answer["id"].as_u64()),
        (Some(2), Some(5))
    );
    ws.send(Message::binary(vec![0, 159, 146, 150]))
        .await
        .expect("send");
    let (answer, _) = next_where(&mut ws, |v| v.get("e").is_none()).await;
    assert_eq!(answer["code"], 3);
    let (trade, _) = next_where(&mut ws, |v| v["e"] == "trade").await;
    assert!(trade["t"].as_u64().is_some());
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn unknown_streams_are_refused_at_the_handshake() {
    let (server, shutdown) = start(config(ExchangeShape::BinanceTrade, 10.0)).await;
    let host = server.local_addr();
    for path in [
        "/ws/BTCUSDT@trade",
        "/ws/btcusdt@aggTrade",
        "/ws/btcusdt",
        "/ws/",
        "/stream",
    ] {
        let result = tokio_tungstenite::connect_async(format!("ws://{host}{path}")).await;
        match result {
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                assert!(matches!(response.status().as_u16(), 400 | 404), "{path}");
            }
            other => panic!("{path} was not refused: {other:?}"),
        }
    }
    stop(server, shutdown).await;
}

/// The ids of a history page, checking each item's exact text on the way.
fn page_ids(server: &ExchangeServer, answer: &Answer) -> Vec<u64> {
    assert_eq!(answer.status, 200, "{}", answer.body);
    let items = answer.json();
    let items = items.as_array().expect("an array");
    let field = match server.config().shape {
        ExchangeShape::BinanceAggTrade => "a",
        _ => "id",
    };
    items
        .iter()
        .map(|item| {
            let id = item[field].as_u64().expect("an id");
            let expected: Value =
                serde_json::from_str(&server.history_item("BTCUSDT", id).expect("item"))
                    .expect("JSON");
            assert_eq!(item, &expected);
            id
        })
        .collect()
}

fn assert_contiguous(ids: &[u64]) {
    for pair in ids.windows(2) {
        assert_eq!(pair[1], pair[0] + 1, "ascending without holes");
    }
}

#[tokio::test]
async fn history_pages_ascend_from_from_id_within_the_retention() {
    let (server, shutdown) = start(ExchangeConfig {
        rate: 1000.0,
        history_retention: 300,
        ..config(ExchangeShape::BinanceTrade, 1000.0)
    })
    .await;
    let first = server.config().first_id;
    wait_for_head(&server, "BTCUSDT", first + 700).await;
    let page = "/api/v3/historicalTrades?symbol=BTCUSDT";
    // Items are exactly the documented set, in order.
    let answer = http_get(&server, &format!("{page}&limit=1")).await;
    assert_key_order(
        &answer.body,
        &[
            "id",
            "price",
            "qty",
            "quoteQty",
            "time",
            "isBuyerMaker",
            "isBestMatch",
        ],
    );
    assert!(
        answer
            .header("content-type")
            .unwrap()
            .starts_with("application/json")
    );
    // Below the retention edge: the page starts at the oldest id kept.
    let oldest_before = server.oldest_kept().expect("keeps some");
    let ids = page_ids(
        &server,
        &http_get(&server, &format!("{page}&fromId={first}")).await,
    );
    assert!(
        ids[0] >= oldest_before && ids[0] > first + 300,
        "{}",
        ids[0]
    );
    assert_contiguous(&ids);
    assert!(ids.len() <= 300, "no more than the retention");
    // Inside it: exactly fromId onwards, `limit` of them.
    let from = server.oldest_kept().expect("keeps some") + 100;
    let ids = page_ids(
        &server,
        &http_get(&server, &format!("{page}&fromId={from}&limit=5")).await,
    );
    assert_eq!(ids, (from..from + 5).collect::<Vec<_>>());
    // Without fromId: the newest.
    let ids = page_ids(
        &server,
        &http_get(&server, &format!("{page}&limit=7")).await,
    );
    assert_eq!(ids.len(), 7);
    assert!(*ids.last().unwrap() <= server.head("BTCUSDT"));
    assert!(*ids.last().unwrap() + 50 >= server.head("BTCUSDT"));
    // Past the head: nothing.
    let beyond = server.head("BTCUSDT") + 100_000;
    let answer = http_get(&server, &format!("{page}&fromId={beyond}")).await;
    assert_eq!((answer.status, answer.body.as_str()), (200, "[]"));
    assert!(server.history_requests() >= 5);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn history_limit_defaults_to_500_and_is_capped_at_1000() {
    let (server, shutdown) = start(ExchangeConfig {
        history_retention: 5_000,
        ..config(ExchangeShape::BinanceTrade, 1000.0)
    })
    .await;
    let first = server.config().first_id;
    wait_for_head(&server, "BTCUSDT", first + 1_100).await;
    let page = format!("/api/v3/historicalTrades?symbol=BTCUSDT&fromId={first}");
    let ids = page_ids(&server, &http_get(&server, &page).await);
    assert_eq!(ids, (first..first + 500).collect::<Vec<_>>());
    let ids = page_ids(
        &server,
        &http_get(&server, &format!("{page}&limit=5000")).await,
    );
    assert_eq!(ids, (first..first + 1000).collect::<Vec<_>>());
    stop(server, shutdown).await;
}

#[tokio::test]
async fn history_requests_are_checked_like_binance_does() {
    let (server, shutdown) = start(config(ExchangeShape::BinanceTrade, 10.0)).await;
    for (query, code) in [
        ("", -1102),
        ("symbol=btcusdt", -1100),
        ("symbol=BTCUSDT&limit=ten", -1100),
        ("symbol=BTCUSDT&fromId=-1", -1100),
        ("symbol=BTCUSDT&startTime=1", -1104),
        ("symbol=BTCUSDT&symbol=ETHBTC", -1101),
        ("symbol=%ZZ", -1100),
    ] {
        let answer = http_get(&server, &format!("/api/v3/historicalTrades?{query}")).await;
        assert_eq!(answer.status, 400, "{query}");
        assert_eq!(answer.json()["code"], code, "{query}: {}", answer.body);
        assert!(answer.json()["msg"].is_string());
    }
    // The other shape's endpoint is not there.
    assert_eq!(
        http_get(&server, "/api/v3/aggTrades?symbol=BTCUSDT")
            .await
            .status,
        404
    );
    stop(server, shutdown).await;
}

#[tokio::test]
async fn agg_trades_history_serves_the_aggregates() {
    let (server, shutdown) = start(config(ExchangeShape::BinanceAggTrade, 200.0)).await;
    let first = server.config().first_id;
    wait_for_head(&server, "BTCUSDT", first + 30).await;
    let answer = http_get(
        &server,
        &format!(
            "/api/v3/aggTrades?symbol=BTCUSDT&fromId={}&limit=20",
            first + 3
        ),
    )
    .await;
    assert_key_order(&answer.body, &["a", "p", "q", "f", "l", "T", "m", "M"]);
    let ids = page_ids(&server, &answer);
    assert_eq!(ids, (first + 3..first + 23).collect::<Vec<_>>());
    let answer = http_get(&server, "/api/v3/aggTrades?symbol=BTCUSDT&startTime=1").await;
    assert_eq!(
        (answer.status, answer.json()["code"].as_i64()),
        (400, Some(-1104))
    );
    stop(server, shutdown).await;
}

#[tokio::test]
async fn history_overrides_answer_429_418_and_500_then_recover() {
    let (server, shutdown) = start(ExchangeConfig {
        history_status_override: Some(HistoryOverride::too_many_requests(2)),
        ..config(ExchangeShape::BinanceTrade, 10.0)
    })
    .await;
    let page = "/api/v3/historicalTrades?symbol=BTCUSDT&limit=1";
    for _ in 0..2 {
        let answer = http_get(&server, page).await;
        assert_eq!(answer.status, 429);
        assert_eq!(answer.header("retry-after"), Some("1"));
        assert_eq!(answer.json()["code"], -1003);
    }
    assert_eq!(http_get(&server, page).await.status, 200);
    server.set_history_override(Some(HistoryOverride::banned(1)));
    let answer = http_get(&server, page).await;
    assert_eq!(
        (answer.status, answer.header("retry-after")),
        (418, Some("1"))
    );
    server.set_history_override(Some(HistoryOverride::server_error(1)));
    let answer = http_get(&server, page).await;
    assert_eq!((answer.status, answer.header("retry-after")), (500, None));
    assert_eq!(http_get(&server, page).await.status, 200);
    assert_eq!(server.history_requests(), 6);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn no_retention_means_no_history() {
    let (server, shutdown) = start(ExchangeConfig {
        history_retention: 0,
        ..config(ExchangeShape::BinanceTrade, 100.0)
    })
    .await;
    wait_for_head(&server, "BTCUSDT", 5_010).await;
    assert_eq!(server.history_url(), None);
    assert_eq!(server.oldest_kept(), None);
    let answer = http_get(
        &server,
        "/api/v3/historicalTrades?symbol=BTCUSDT&fromId=5000",
    )
    .await;
    assert_eq!((answer.status, answer.body.as_str()), (200, "[]"));
    stop(server, shutdown).await;
}
