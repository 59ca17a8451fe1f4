//! Binance's combined stream (`/stream`) on the depth shapes.

use std::collections::HashMap;

use super::*;

async fn combined(server: &ExchangeServer) -> Client {
    connect(&server.combined_url().expect("a depth shape serves /stream")).await
}

/// Reads until the answer with `"id": id`, returning the wrapped frames read
/// on the way.
async fn until_answer(ws: &mut Client, id: u64) -> (Value, Vec<Value>) {
    let mut frames = Vec::new();
    loop {
        let value = next_json(ws).await;
        if value.get("id").and_then(Value::as_u64) == Some(id) {
            return (value, frames);
        }
        frames.push(value);
    }
}

#[tokio::test]
async fn subscribe_acks_wraps_frames_and_unsubscribe_stops_them() {
    let (server, shutdown) = start(config(ExchangeShape::BinanceDepth, 200.0)).await;
    let mut ws = combined(&server).await;
    let names = ["btcusdt@depth@100ms", "ethusdt@depth@100ms"];
    send(
        &mut ws,
        r#"{"method":"SUBSCRIBE","params":["btcusdt@depth@100ms","ethusdt@depth@100ms"],"id":1}"#,
    )
    .await;
    let (ack, early) = until_answer(&mut ws, 1).await;
    assert_eq!(ack, serde_json::json!({"result": null, "id": 1}));
    assert!(early.is_empty(), "nothing before the ack: {early:?}");
    send(&mut ws, r#"{"method":"LIST_SUBSCRIPTIONS","id":2}"#).await;
    let (list, _) = until_answer(&mut ws, 2).await;
    assert_eq!(list["result"], serde_json::json!(names));

    // Frames of both streams, wrapped, each the exact depthUpdate and each
    // stream's ids contiguous.
    let mut last_u: HashMap<String, u64> = HashMap::new();
    let mut seen = 0;
    while seen < 40 || last_u.len() < 2 {
        let (frame, text) = next_where(&mut ws, |v| v.get("stream").is_some()).await;
        assert_eq!(keys(&frame), ["data", "stream"], "{text}");
        assert!(text.starts_with(r#"{"stream":""#), "{text}");
        let name = frame["stream"].as_str().expect("a name").to_owned();
        assert!(names.contains(&name.as_str()), "{name}");
        let data = &frame["data"];
        assert_eq!(data["e"], "depthUpdate");
        let symbol = data["s"].as_str().expect("s");
        assert_eq!(symbol.to_ascii_lowercase(), name.split('@').next().unwrap());
        let (first, last) = (data["U"].as_u64().unwrap(), data["u"].as_u64().unwrap());
        assert_eq!(
            serde_json::from_str::<Value>(&server.frame(symbol, last)).unwrap(),
            *data
        );
        if let Some(previous) = last_u.get(&name) {
            assert_eq!(first, previous + 1, "{name}: contiguous");
        }
        last_u.insert(name, last);
        seen += 1;
    }

    // Unsubscribed: after the ack, only the other stream's frames.
    send(
        &mut ws,
        r#"{"method":"UNSUBSCRIBE","params":["btcusdt@depth@100ms"],"id":3}"#,
    )
    .await;
    let (ack, _) = until_answer(&mut ws, 3).await;
    assert_eq!(ack, serde_json::json!({"result": null, "id": 3}));
    for _ in 0..20 {
        let frame = next_json(&mut ws).await;
        assert_eq!(frame["stream"], "ethusdt@depth@100ms", "{frame}");
    }
    // Bad requests are answered and the connection stays.
    send(
        &mut ws,
        r#"{"method":"SUBSCRIBE","params":["btcusdt@nope"],"id":4}"#,
    )
    .await;
    let (refused, _) = until_answer(&mut ws, 4).await;
    assert_eq!(refused["code"], 2, "{refused}");
    assert_eq!(server.connections_accepted(), 1);
    assert_eq!(server.messages_received(), 4);
    assert_eq!(server.limit_closes(), 0);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn streams_in_the_url_are_listened_to() {
    let (server, shutdown) = start(config(ExchangeShape::BinanceDepth, 200.0)).await;
    let url = format!(
        "{}?streams=btcusdt@depth@100ms/ethusdt@depth",
        server.combined_url().unwrap()
    );
    let mut ws = connect(&url).await;
    let mut names = std::collections::BTreeSet::new();
    while names.len() < 2 {
        let frame = next_json(&mut ws).await;
        names.insert(frame["stream"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        http_get(&server, "/stream?streams=btcusdt@trade")
            .await
            .status,
        400
    );
    stop(server, shutdown).await;
}

#[tokio::test]
async fn more_than_five_messages_in_a_second_close_the_connection() {
    let (server, shutdown) = start(config(ExchangeShape::BinanceDepth, 50.0)).await;
    // Five in a second are fine.
    let mut ws = combined(&server).await;
    for id in 1..=5 {
        send(
            &mut ws,
            &format!(r#"{{"method":"SUBSCRIBE","params":["s{id}usdt@depth@100ms"],"id":{id}}}"#),
        )
        .await;
    }
    for id in 1..=5 {
        until_answer(&mut ws, id).await;
    }
    sleep(Duration::from_millis(1100)).await;
    // Five more after the second passed: still fine.
    for id in 6..=10 {
        send(
            &mut ws,
            &format!(r#"{{"method":"LIST_SUBSCRIPTIONS","id":{id}}}"#),
        )
        .await;
    }
    let (list, _) = until_answer(&mut ws, 10).await;
    assert_eq!(list["result"].as_array().unwrap().len(), 5);
    assert_eq!(server.limit_closes(), 0);

    // The sixth in a second: closed with a reason, no answer to it.
    let mut ws = combined(&server).await;
    for id in 1..=6 {
        send(
            &mut ws,
            &format!(r#"{{"method":"LIST_SUBSCRIPTIONS","id":{id}}}"#),
        )
        .await;
    }
    let mut answered = Vec::new();
    let close = loop {
        match timeout(WAIT, ws.next()).await.expect("ends in time") {
            Some(Ok(Message::Text(text))) => {
                let value: Value = serde_json::from_str(&text).unwrap();
                answered.push(value["id"].as_u64().unwrap());
            }
            Some(Ok(Message::Close(frame))) => break frame.expect("a close frame with a reason"),
            Some(Ok(_)) => {}
            other => panic!("no close frame: {other:?}"),
        }
    };
    assert_eq!(answered, [1, 2, 3, 4, 5]);
    assert_eq!(u16::from(close.code), 1008);
    assert!(
        close.reason.contains("too many messages"),
        "{}",
        close.reason
    );
    assert_eq!(server.limit_closes(), 1);
    assert_eq!(server.messages_received(), 16);
    assert_eq!(server.connections_accepted(), 2);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn more_than_1024_streams_close_the_connection() {
    let (server, shutdown) = start(config(ExchangeShape::BinanceDepth, 1.0)).await;
    let mut ws = combined(&server).await;
    let names = |range: std::ops::Range<usize>| {
        let names: Vec<String> = range.map(|i| format!("s{i}usdt@depth@100ms")).collect();
        serde_json::to_string(&names).unwrap()
    };
    send(
        &mut ws,
        &format!(
            r#"{{"method":"SUBSCRIBE","params":{},"id":1}}"#,
            names(0..1024)
        ),
    )
    .await;
    until_answer(&mut ws, 1).await;
    send(
        &mut ws,
        &format!(
            r#"{{"method":"SUBSCRIBE","params":{},"id":2}}"#,
            names(1024..1025)
        ),
    )
    .await;
    assert_eq!(ending(&mut ws).await, Ending::CloseFrame);
    assert_eq!(server.limit_closes(), 1);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn shared_settings_point_the_worker_at_the_combined_stream() {
    let (server, shutdown) = start(config(ExchangeShape::BinanceDepth, 10.0)).await;
    let settings: HashMap<&str, String> = server.worked_settings_shared(50).into_iter().collect();
    let host = server.local_addr();
    assert_eq!(settings["UPSTREAM_URL"], format!("ws://{host}/stream"));
    assert_eq!(settings["UPSTREAM_STREAMS_PER_CONNECTION"], "50");
    assert_eq!(settings["UPSTREAM_ROUTE_POINTER"], "/stream");
    assert_eq!(
        settings["UPSTREAM_ROUTE_TEMPLATE"],
        "{stream_id}@depth@100ms"
    );
    assert_eq!(settings["UPSTREAM_SEQ_POINTER"], "/data/u");
    assert_eq!(settings["UPSTREAM_SEQ_FIRST_POINTER"], "/data/U");
    assert_eq!(settings["UPSTREAM_ID_POINTER"], "/data/u");
    assert_eq!(settings["UPSTREAM_DATA_MATCH"], "/data/e=depthUpdate");
    assert_eq!(settings["UPSTREAM_RESUME"], "snapshot");
    assert_eq!(settings["UPSTREAM_SNAPSHOT_SEQ_POINTER"], "/lastUpdateId");
    assert_eq!(
        settings["UPSTREAM_SNAPSHOT_URL"],
        server.snapshot_url().unwrap()
    );
    assert!(settings["UPSTREAM_SUBSCRIBE"].contains("{stream_ids_json}"));
    assert!(settings["UPSTREAM_UNSUBSCRIBE"].contains("UNSUBSCRIBE"));
    assert_eq!(
        server.worked_settings_shared(50).len(),
        settings.len(),
        "no setting twice"
    );
    stop(server, shutdown).await;
    let (trades, shutdown) = start(config(ExchangeShape::BinanceTrade, 10.0)).await;
    assert!(trades.worked_settings_shared(50).is_empty());
    assert_eq!(trades.combined_url(), None);
    stop(trades, shutdown).await;
}
