use super::*;
use serde_json::Value;
use tokio_tungstenite::MaybeTlsStream;

/// Generous: only a broken server takes this long.
const WAIT: Duration = Duration::from_secs(10);

type Client = WebSocketStream<MaybeTlsStream<TcpStream>>;

async fn start(config: FeedConfig) -> (FeedServer, CancellationToken) {
    let shutdown = CancellationToken::new();
    let server = FeedServer::start(([127, 0, 0, 1], 0).into(), config, shutdown.clone())
        .await
        .expect("feed starts");
    (server, shutdown)
}

async fn connect(server: &FeedServer, request: &str) -> Client {
    let (mut ws, _) = timeout(WAIT, tokio_tungstenite::connect_async(server.url()))
        .await
        .expect("connect in time")
        .expect("connect");
    ws.send(Message::text(request))
        .await
        .expect("send subscribe");
    ws
}

/// The next text frame as JSON, or `None` when the server closed.
async fn next_json(ws: &mut Client) -> Option<Value> {
    loop {
        match timeout(WAIT, ws.next()).await.expect("frame in time") {
            Some(Ok(Message::Text(text))) => {
                return Some(serde_json::from_str(&text).expect("valid JSON"));
            }
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return None,
            Some(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn subscribe_from_one_delivers_consecutive_events() {
    let (server, shutdown) = start(FeedConfig {
        rate: 50.0,
        ..FeedConfig::default()
    })
    .await;
    let mut ws = connect(&server, r#"{"subscribe": "btc-usd", "from_seq": 1}"#).await;
    let mut previous_ts = None;
    for seq in 1..=5u64 {
        let event = next_json(&mut ws).await.expect("event");
        assert_eq!(event["stream_id"], "btc-usd");
        assert_eq!(event["seq"], seq);
        assert_eq!(event["event_id"], format!("btc-usd:{seq}"));
        let ts = event["ts_ms"].as_u64().expect("ts_ms");
        assert_eq!(ts, server.ts_ms(seq));
        if let Some(previous) = previous_ts {
            assert_eq!(ts - previous, 20, "50 events/s are 20 ms apart");
        }
        previous_ts = Some(ts);
        assert!(event["payload"]["price"].as_f64().expect("price") >= 100.0);
        assert!(event["payload"]["qty"].as_u64().expect("qty") >= 1);
        // Events are a pure function of (stream, seq, ts).
        let expected: Value = serde_json::from_str(&event_frame("btc-usd", seq, ts)).expect("JSON");
        assert_eq!(event, expected);
    }
    // A client that stops reading would hold the server's bounded close wait.
    drop(ws);
    shutdown.cancel();
    timeout(WAIT, server.finished()).await.expect("stops");
}

#[tokio::test]
async fn backlog_is_replayed_at_once_then_events_follow_the_rate() {
    let before = Instant::now();
    let rate = 25.0;
    let (server, shutdown) = start(FeedConfig {
        rate,
        retention: 1000,
        backlog: 20,
    })
    .await;
    let mut ws = connect(&server, r#"{"subscribe": "s", "from_seq": 0}"#).await;
    let connected = Instant::now();
    for seq in 1..=20u64 {
        let event = next_json(&mut ws).await.expect("backlog event");
        assert_eq!(event["seq"], seq);
        assert_eq!(
            event["ts_ms"],
            server.ts_ms(1),
            "backlog carries the start time"
        );
    }
    // Paced at 25/s the backlog would take 760 ms; a batch takes a few.
    assert!(connected.elapsed() < Duration::from_millis(600));
    for k in 1..=10u64 {
        let event = next_json(&mut ws).await.expect("live event");
        assert_eq!(event["seq"], 20 + k);
        // The server never sends an event before it is due.
        let due = before + Duration::from_secs_f64(k as f64 / rate);
        assert!(Instant::now() >= due, "seq {} arrived early", 20 + k);
    }
    drop(ws);
    shutdown.cancel();
    timeout(WAIT, server.finished()).await.expect("stops");
}

#[tokio::test]
async fn streams_are_independent() {
    let (server, shutdown) = start(FeedConfig {
        rate: 0.01,
        retention: 1000,
        backlog: 100,
    })
    .await;
    let mut a = connect(&server, r#"{"subscribe": "a", "from_seq": 10}"#).await;
    let mut b = connect(&server, r#"{"subscribe": "b\"q", "from_seq": 50}"#).await;
    let mut differ = false;
    for i in 0..5u64 {
        let ea = next_json(&mut a).await.expect("a");
        let eb = next_json(&mut b).await.expect("b");
        assert_eq!(
            (ea["stream_id"].as_str(), ea["seq"].as_u64()),
            (Some("a"), Some(10 + i))
        );
        assert_eq!(eb["stream_id"], "b\"q");
        assert_eq!(eb["seq"], 50 + i);
        assert_eq!(eb["event_id"], format!("b\"q:{}", 50 + i));
        let payload = |id: &str| {
            let frame: Value = serde_json::from_str(&event_frame(id, 10 + i, 0)).expect("JSON");
            frame["payload"].clone()
        };
        differ |= payload("a") != payload("b");
    }
    assert!(differ, "payloads depend on the stream id");
    drop(a);
    // b is unaffected by a leaving.
    assert_eq!(next_json(&mut b).await.expect("b")["seq"], 55);
    drop(b);
    shutdown.cancel();
    timeout(WAIT, server.finished()).await.expect("stops");
}

#[tokio::test]
async fn request_older_than_retention_is_refused_with_the_earliest_seq() {
    let (server, shutdown) = start(FeedConfig {
        rate: 0.01,
        retention: 10,
        backlog: 100,
    })
    .await;
    assert_eq!(server.head(), 100);
    let mut ws = connect(&server, r#"{"subscribe": "s", "from_seq": 90}"#).await;
    let error = next_json(&mut ws).await.expect("error frame");
    assert_eq!(error["code"], "retention_exceeded");
    assert_eq!(error["earliest_seq"], 91);
    assert!(next_json(&mut ws).await.is_none(), "closed after the error");
    // Missing from_seq means 1, which is also too old here.
    let mut ws = connect(&server, r#"{"subscribe": "s"}"#).await;
    assert_eq!(
        next_json(&mut ws).await.expect("error")["code"],
        "retention_exceeded"
    );
    let mut ws = connect(&server, r#"{"subscribe": "s", "from_seq": 91}"#).await;
    assert_eq!(next_json(&mut ws).await.expect("event")["seq"], 91);
    drop(ws);
    shutdown.cancel();
    timeout(WAIT, server.finished()).await.expect("stops");
}

#[tokio::test]
async fn malformed_subscribe_is_a_bad_request_and_others_are_still_served() {
    let (server, shutdown) = start(FeedConfig {
        rate: 0.01,
        retention: 1000,
        backlog: 5,
    })
    .await;
    let mut healthy = connect(&server, r#"{"subscribe": "ok", "from_seq": 1}"#).await;
    assert_eq!(next_json(&mut healthy).await.expect("event")["seq"], 1);
    for bad in [
        "not json",
        r#"{"subscribe": 5}"#,
        r#"{"subscribe": "s", "from_seq": -3}"#,
        r#"{"subscribe": ""}"#,
        r#"["subscribe"]"#,
    ] {
        let mut ws = connect(&server, bad).await;
        let error = next_json(&mut ws).await.expect("error frame");
        assert_eq!(error["code"], "bad_request", "for {bad}");
        assert!(error["error"].is_string());
        assert!(next_json(&mut ws).await.is_none(), "closed after {bad}");
    }
    let (mut ws, _) = tokio_tungstenite::connect_async(server.url())
        .await
        .expect("connect");
    ws.send(Message::binary(vec![1, 2, 3])).await.expect("send");
    assert_eq!(
        next_json(&mut ws).await.expect("error")["code"],
        "bad_request"
    );
    // Both the old connection and new ones still work.
    assert_eq!(next_json(&mut healthy).await.expect("event")["seq"], 2);
    let mut again = connect(&server, r#"{"subscribe": "ok", "from_seq": 4}"#).await;
    assert_eq!(next_json(&mut again).await.expect("event")["seq"], 4);
    drop((healthy, again, ws));
    shutdown.cancel();
    timeout(WAIT, server.finished()).await.expect("stops");
}

#[tokio::test]
async fn shutdown_closes_connections_and_the_listener() {
    let (server, shutdown) = start(FeedConfig::default()).await;
    let url = server.url();
    let mut ws = connect(&server, r#"{"subscribe": "s", "from_seq": 1}"#).await;
    let (mut idle, _) = timeout(WAIT, tokio_tungstenite::connect_async(server.url()))
        .await
        .expect("in time")
        .expect("connect");
    shutdown.cancel();
    timeout(WAIT, server.finished()).await.expect("stops");
    // Whatever was in flight, the stream ends.
    while next_json(&mut ws).await.is_some() {}
    assert!(next_json(&mut idle).await.is_none());
    assert!(tokio_tungstenite::connect_async(url).await.is_err());
}

#[tokio::test]
async fn invalid_config_is_refused() {
    for config in [
        FeedConfig {
            rate: 0.0,
            ..FeedConfig::default()
        },
        FeedConfig {
            rate: f64::NAN,
            ..FeedConfig::default()
        },
        FeedConfig {
            retention: 0,
            ..FeedConfig::default()
        },
    ] {
        let result =
            FeedServer::start(([127, 0, 0, 1], 0).into(), config, CancellationToken::new()).await;
        assert!(matches!(result, Err(FeedError::Config(_))), "{config:?}");
    }
}

#[test]
fn frames_are_valid_json_for_awkward_stream_ids() {
    for id in ["plain", "quo\"te", "back\\slash", "new\nline", "ünï"] {
        let frame: Value = serde_json::from_str(&event_frame(id, 7, 1)).expect("JSON");
        assert_eq!(frame["stream_id"], id);
        assert_eq!(frame["event_id"], format!("{id}:7"));
    }
    assert_eq!(event_frame("x", 3, 9), event_frame("x", 3, 9));
    assert_ne!(
        event_frame("x", 3, 9),
        event_frame("x", 4, 9).replace("4", "3")
    );
}
