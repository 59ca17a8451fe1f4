use super::*;

const ITEM_KEYS: [&str; 9] = ["T", "s", "S", "v", "p", "i", "BT", "RPI", "seq"];

#[tokio::test]
async fn subscribe_is_acknowledged_then_package_frames_follow() {
    let (server, shutdown) = start(config(ExchangeShape::BybitPublicTrade, 60.0)).await;
    let mut ws = connect(&server.ws_url()).await;
    send(
        &mut ws,
        r#"{"op":"subscribe","args":["publicTrade.BTCUSDT"],"req_id":"abc"}"#,
    )
    .await;
    let text = next_text(&mut ws).await.expect("ack");
    assert_key_order(&text, &["success", "ret_msg", "conn_id", "req_id", "op"]);
    let ack: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(ack["success"], true);
    assert_eq!(ack["ret_msg"], "");
    assert_eq!(ack["req_id"], "abc");
    assert_eq!(ack["op"], "subscribe");
    assert!(ack["conn_id"].as_str().is_some_and(|id| id.len() == 36));
    let (mut previous_id, mut previous_seq): (Option<u64>, Option<u64>) = (None, None);
    let (mut trades, mut holes, mut packages_of_several) = (0, 0, 0);
    while trades < 40 {
        let text = next_text(&mut ws).await.expect("trades");
        assert_key_order(&text, &["topic", "type", "ts", "data"]);
        let frame: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(keys(&frame), ["data", "topic", "ts", "type"]);
        assert_eq!(frame["topic"], "publicTrade.BTCUSDT");
        assert_eq!(frame["type"], "snapshot");
        let items = frame["data"].as_array().expect("data");
        assert!((1..=4).contains(&items.len()));
        packages_of_several += usize::from(items.len() > 1);
        let seq = items[0]["seq"].as_u64().expect("seq");
        let time = items[0]["T"].as_u64().expect("T");
        assert!(frame["ts"].as_u64().expect("ts") >= time);
        for item in items {
            assert_eq!(keys(item), sorted(&ITEM_KEYS), "{item}");
            assert_eq!(item["s"], "BTCUSDT");
            assert!(matches!(item["S"].as_str(), Some("Buy" | "Sell")));
            assert!(item["v"].as_str().expect("v").parse::<f64>().is_ok());
            assert!(item["p"].as_str().expect("p").parse::<f64>().is_ok());
            assert_eq!(
                (item["BT"].as_bool(), item["RPI"].as_bool()),
                (Some(false), Some(false))
            );
            assert_eq!(item["seq"], seq, "a package shares its seq");
            assert_eq!(item["T"], time, "and its time");
            // The trade id is a string, contiguous per symbol.
            let id: u64 = item["i"]
                .as_str()
                .expect("i is a string")
                .parse()
                .expect("digits");
            if let Some(previous) = previous_id {
                assert_eq!(id, previous + 1);
            }
            previous_id = Some(id);
            assert_eq!(server.ts_ms(id), time);
            trades += 1;
        }
        assert_key_order(&text, &ITEM_KEYS);
        if let Some(previous) = previous_seq {
            assert!(seq > previous, "the cross sequence increases");
            holes += usize::from(seq > previous + 1);
        }
        previous_seq = Some(seq);
        let first: u64 = items[0]["i"].as_str().unwrap().parse().unwrap();
        let last: u64 = items[items.len() - 1]["i"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(text, server.frame("BTCUSDT", first));
        assert_eq!(text, server.frame("BTCUSDT", last));
        assert!(server.head("BTCUSDT") >= last);
    }
    assert!(holes > 0, "seq has holes");
    assert!(packages_of_several > 0, "some frames carry several trades");
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn pings_get_pongs_and_bad_requests_get_failures() {
    let (server, shutdown) = start(config(ExchangeShape::BybitPublicTrade, 5.0)).await;
    let mut ws = connect(&server.ws_url()).await;
    send(&mut ws, r#"{"op":"ping"}"#).await;
    let text = next_text(&mut ws).await.expect("pong");
    let pong: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(keys(&pong), ["conn_id", "op", "ret_msg", "success"]);
    assert_key_order(&text, &["success", "ret_msg", "conn_id", "op"]);
    assert_eq!(
        (pong["ret_msg"].as_str(), pong["op"].as_str()),
        (Some("pong"), Some("ping"))
    );
    send(&mut ws, r#"{"op":"ping","req_id":"100001"}"#).await;
    assert_eq!(next_json(&mut ws).await["req_id"], "100001");
    for (request, message) in [
        ("garbage", None),
        (r#"{"op":"fly"}"#, Some("error:unknown op fly")),
        (
            r#"{"op":"subscribe","args":["orderbook.1.BTCUSDT"]}"#,
            Some("error:handler not found,topic:orderbook.1.BTCUSDT"),
        ),
        (
            r#"{"op":"subscribe","args":["publicTrade.btcusdt"]}"#,
            Some("Invalid symbol :[publicTrade.btcusdt]"),
        ),
        (r#"{"op":"subscribe","args":[]}"#, None),
        (r#"{"op":"subscribe","args":"publicTrade.BTCUSDT"}"#, None),
        (
            r#"{"op":"unsubscribe","args":["publicTrade.BTCUSDT"]}"#,
            Some("error:not subscribed,topic:publicTrade.BTCUSDT"),
        ),
    ] {
        send(&mut ws, request).await;
        let answer = next_json(&mut ws).await;
        assert_eq!(answer["success"], false, "{request}");
        if let Some(message) = message {
            assert_eq!(answer["ret_msg"], message, "{request}");
        }
    }
    let eleven: Vec<String> = (0..11)
        .map(|i| format!(r#""publicTrade.S{i}USDT""#))
        .collect();
    send(
        &mut ws,
        &format!(r#"{{"op":"subscribe","args":[{}]}}"#, eleven.join(",")),
    )
    .await;
    assert_eq!(
        next_json(&mut ws).await["success"],
        false,
        "at most 10 args"
    );
    send(
        &mut ws,
        r#"{"op":"subscribe","args":["publicTrade.ETHUSDT"]}"#,
    )
    .await;
    assert_eq!(next_json(&mut ws).await["success"], true);
    send(
        &mut ws,
        r#"{"op":"subscribe","args":["publicTrade.ETHUSDT"]}"#,
    )
    .await;
    assert_eq!(
        next_json(&mut ws).await["ret_msg"],
        "error:already subscribed,topic:publicTrade.ETHUSDT"
    );
    let (data, _) = next_where(&mut ws, |v| v.get("topic").is_some()).await;
    assert_eq!(data["topic"], "publicTrade.ETHUSDT");
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn a_second_subscriber_starts_later_and_nothing_is_replayed() {
    let (server, shutdown) = start(config(ExchangeShape::BybitPublicTrade, 30.0)).await;
    let subscribe = r#"{"op":"subscribe","args":["publicTrade.BTCUSDT"]}"#;
    let first_id =
        |frame: &Value| -> u64 { frame["data"][0]["i"].as_str().unwrap().parse().unwrap() };
    let mut a = connect(&server.ws_url()).await;
    send(&mut a, subscribe).await;
    let (a_first, _) = next_where(&mut a, |v| v.get("topic").is_some()).await;
    sleep(Duration::from_secs(1)).await;
    let head = server.head("BTCUSDT");
    let mut b = connect(&server.ws_url()).await;
    send(&mut b, subscribe).await;
    let (b_first, _) = next_where(&mut b, |v| v.get("topic").is_some()).await;
    assert!(first_id(&b_first) > head, "b starts after the head");
    assert!(first_id(&b_first) >= first_id(&a_first) + 20);
    drop((a, b));
    stop(server, shutdown).await;
}
