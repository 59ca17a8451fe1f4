//! What every shape shares: configuration, cuts, shutdown, hostile input, and
//! the worked settings read the way the stream worker reads them.

use super::*;

/// The subscribe text and a frame that proves the subscription works.
fn subscribe_for(shape: ExchangeShape) -> &'static str {
    match shape {
        ExchangeShape::BinanceTrade
        | ExchangeShape::BinanceAggTrade
        | ExchangeShape::BinanceDepth
        | ExchangeShape::BinanceFuturesDepth => "",
        ExchangeShape::CoinbaseMatches => {
            r#"{"type":"subscribe","product_ids":["BTC-USD"],"channels":["matches"]}"#
        }
        ExchangeShape::KrakenTrade => {
            r#"{"method":"subscribe","params":{"channel":"trade","symbol":["BTC/USD"]}}"#
        }
        ExchangeShape::BybitPublicTrade => r#"{"op":"subscribe","args":["publicTrade.BTCUSDT"]}"#,
        ExchangeShape::BybitOrderbook => r#"{"op":"subscribe","args":["orderbook.50.BTCUSDT"]}"#,
        ExchangeShape::OkxBooks => {
            r#"{"op":"subscribe","args":[{"channel":"books","instId":"BTC-USDT"}]}"#
        }
        ExchangeShape::CoinbaseLevel2 => {
            r#"{"type":"subscribe","product_ids":["BTC-USD"],"channel":"level2"}"#
        }
        ExchangeShape::KrakenBook => {
            r#"{"method":"subscribe","params":{"channel":"book","symbol":["BTC/USD"]}}"#
        }
    }
}

/// Whether `text` answers an application ping: Kraken's `pong` method,
/// Bybit's `ret_msg`, OKX's bare `pong`.
fn is_pong(text: &str) -> bool {
    text == "pong"
        || serde_json::from_str::<Value>(text)
            .is_ok_and(|v| v["method"] == "pong" || v["ret_msg"] == "pong")
}

async fn connect_example(server: &ExchangeServer) -> Client {
    let shape = server.config().shape;
    let mut ws = connect(&url(server, shape.example_stream_id())).await;
    let subscribe = subscribe_for(shape);
    if !subscribe.is_empty() {
        send(&mut ws, subscribe).await;
    }
    ws
}

#[tokio::test]
async fn invalid_configs_are_refused() {
    let base = ExchangeConfig::default();
    for config in [
        ExchangeConfig { rate: 0.0, ..base },
        ExchangeConfig {
            rate: f64::INFINITY,
            ..base
        },
        ExchangeConfig {
            first_id: 0,
            ..base
        },
        ExchangeConfig {
            first_id: u64::MAX,
            ..base
        },
        ExchangeConfig { rate: 1e12, ..base },
        ExchangeConfig {
            cut_every: Some(Duration::ZERO),
            ..base
        },
        // Binance clients do not ping: nothing could keep them.
        ExchangeConfig {
            silent_cut_after: Some(Duration::from_secs(1)),
            ..base
        },
        ExchangeConfig {
            shape: ExchangeShape::KrakenTrade,
            silent_cut_after: Some(Duration::ZERO),
            ..base
        },
        ExchangeConfig {
            history_status_override: Some(HistoryOverride {
                status: 200,
                times: 1,
                retry_after_secs: 1,
            }),
            ..base
        },
    ] {
        let started =
            ExchangeServer::start(([127, 0, 0, 1], 0).into(), config, CancellationToken::new())
                .await;
        assert!(matches!(started, Err(FeedError::Config(_))), "{config:?}");
    }
    for shape in ExchangeShape::ALL {
        assert_eq!(shape.name().parse::<ExchangeShape>(), Ok(shape));
    }
    assert!("binance".parse::<ExchangeShape>().is_err());
}

#[tokio::test]
async fn cut_all_cuts_with_and_without_a_close_frame() {
    let (server, shutdown) = start(config(ExchangeShape::BinanceTrade, 20.0)).await;
    let mut odd = connect(&url(&server, "btcusdt")).await;
    next_json(&mut odd).await;
    let mut even = connect(&url(&server, "btcusdt")).await;
    next_json(&mut even).await;
    assert_eq!(
        (server.connections_accepted(), server.open_connections()),
        (2, 2)
    );
    assert_eq!(server.cut_all(), 2);
    assert_eq!(ending(&mut odd).await, Ending::CloseFrame);
    assert_eq!(ending(&mut even).await, Ending::NoCloseFrame);
    let deadline = Instant::now() + WAIT;
    while server.cuts() < 2 || server.open_connections() > 0 {
        assert!(Instant::now() < deadline, "cuts are counted");
        sleep(Duration::from_millis(10)).await;
    }
    // The server goes on; the next connection starts live.
    let mut again = connect(&url(&server, "btcusdt")).await;
    assert!(next_json(&mut again).await["t"].is_u64());
    assert_eq!(server.cut_all(), 1);
    assert_eq!(
        ending(&mut again).await,
        Ending::CloseFrame,
        "connection 3 is odd"
    );
    drop((odd, even));
    stop(server, shutdown).await;
}

/// Connects and subscribes with the worked settings, as the worker does.
async fn connect_worked(
    settings: &std::collections::HashMap<&str, String>,
    stream_id: &str,
) -> Client {
    let mut ws = connect(&settings["UPSTREAM_URL"].replace("{stream_id}", stream_id)).await;
    let subscribe = settings["UPSTREAM_SUBSCRIBE"].replace("{stream_id}", stream_id);
    if !subscribe.is_empty() {
        send(&mut ws, &subscribe).await;
    }
    ws
}

/// The next data frame (per `UPSTREAM_DATA_MATCH`), its id (per
/// `UPSTREAM_ID_POINTER`) and its text.
async fn next_data(
    ws: &mut Client,
    settings: &std::collections::HashMap<&str, String>,
) -> (u64, String) {
    let data_match = &settings["UPSTREAM_DATA_MATCH"];
    let (frame, text) = next_where(ws, |v| is_data(v, data_match)).await;
    (number_at(&frame, &settings["UPSTREAM_ID_POINTER"]), text)
}

fn unix_ms() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    u64::try_from(since.as_millis()).expect("ms fit")
}

#[tokio::test]
async fn restart_cuts_everyone_and_ids_start_over_at_1() {
    let rate = 20.0;
    // Coinbase's and Kraken's books carry no id: their own tests check that
    // a restart starts their books over.
    for shape in ExchangeShape::ALL
        .into_iter()
        .filter(|s| s.frames_carry_ids())
    {
        // Ids the new timeline can have reached by the time a client
        // reconnects (futures order-book ids advance by up to 7 an update,
        // OKX seqIds up to 5 a frame).
        let step = match shape {
            ExchangeShape::BinanceFuturesDepth => 7,
            ExchangeShape::OkxBooks => 5,
            _ => 1,
        };
        let small = 1 + step * (3.0 * rate) as u64;
        let (server, shutdown) = start(config(shape, rate)).await;
        let first_id = server.config().first_id;
        assert!(first_id > 1000, "the test needs ids well above 1");
        let settings: std::collections::HashMap<&str, String> =
            server.worked_settings().into_iter().collect();
        let stream_id = shape.example_stream_id();
        // Before: ids at first_id and up.
        let mut old = connect_worked(&settings, stream_id).await;
        let mut previous = 0;
        for _ in 0..3 {
            let (id, _) = next_data(&mut old, &settings).await;
            assert!(id >= first_id && id > previous, "{shape}: {id}");
            previous = id;
        }
        assert!(server.head(stream_id) >= first_id, "{shape}");
        if shape.serves_history() {
            assert!(server.oldest_kept().expect("keeps some") >= first_id);
        }
        assert_eq!(server.restarts(), 0);
        let restarted_ms = unix_ms();
        assert_eq!(server.restart(), 1, "{shape}: the open connection is cut");
        assert_eq!(server.restarts(), 1);
        assert_eq!(ending(&mut old).await, Ending::CloseFrame, "{shape}");
        // After: a new connection streams the new ids from (about) 1.
        let mut fresh = connect_worked(&settings, stream_id).await;
        let (first, first_text) = next_data(&mut fresh, &settings).await;
        assert!(
            (1..=small).contains(&first),
            "{shape}: the first id after the restart is {first}"
        );
        if let Some(snapshot_match) = settings.get("UPSTREAM_SNAPSHOT_MATCH") {
            // An in-band book starts over with a snapshot of the new book.
            let snapshot: Value = serde_json::from_str(&first_text).expect("JSON");
            assert!(is_data(&snapshot, snapshot_match), "{shape}: {first_text}");
            assert!(shape.snapshot_in_band(), "{shape}");
        }
        let mut previous = first;
        for _ in 0..4 {
            let (id, text) = next_data(&mut fresh, &settings).await;
            assert!(
                id > previous && id < first_id,
                "{shape}: {id} after {previous}"
            );
            // frame() and ts_ms() answer for the new timeline.
            assert_eq!(text, server.frame(stream_id, id), "{shape}");
            assert!(
                server.ts_ms(id) >= restarted_ms,
                "{shape}: times from the restart"
            );
            previous = id;
        }
        let head = server.head(stream_id);
        assert!(head >= previous && head < first_id, "{shape}: head {head}");
        if shape.serves_snapshot() {
            // The snapshot is of the new book, at a new update id.
            let answer = http_get(&server, &snapshot_target(&server, &settings, stream_id)).await;
            assert_eq!(answer.status, 200, "{shape}: {}", answer.body);
            let snapshot = answer.json();
            let last = number_at(&snapshot, &settings["UPSTREAM_SNAPSHOT_SEQ_POINTER"]);
            assert!(last >= head && last < first_id, "{shape}: {last}");
            let (bids, asks) = server.book_at(stream_id, last);
            assert_eq!(snapshot["bids"], levels_value(&bids), "{shape}");
            assert_eq!(snapshot["asks"], levels_value(&asks), "{shape}");
        }
        if shape.serves_history() {
            assert_eq!(server.oldest_kept(), Some(1), "{shape}");
            let template = settings["UPSTREAM_BACKFILL_URL"]
                .replace("{stream_id_upper}", &stream_id.to_ascii_uppercase());
            let target = |from: u64| {
                let url = template.replace("{from_seq}", &from.to_string());
                let (_, target) = url
                    .split_once(&server.local_addr().to_string())
                    .expect("same host");
                target.to_owned()
            };
            // From 1: exactly the new ids, each the text history_item gives.
            let answer = http_get(&server, &target(1)).await;
            assert_eq!(answer.status, 200, "{shape}: {}", answer.body);
            let items = answer.json();
            let items = items.as_array().expect("an array");
            let item_seq = &settings["UPSTREAM_BACKFILL_SEQ_POINTER"];
            let ids: Vec<u64> = items.iter().map(|item| number_at(item, item_seq)).collect();
            assert!(ids.len() as u64 >= previous, "{shape}: {ids:?}");
            assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>(), "{shape}");
            assert!(*ids.last().expect("some") < first_id, "{shape}");
            for (item, id) in items.iter().zip(&ids) {
                let expected: Value = serde_json::from_str(
                    &server
                        .history_item(&stream_id.to_ascii_uppercase(), *id)
                        .expect("an item"),
                )
                .expect("JSON");
                assert_eq!(item, &expected, "{shape}");
            }
            // An id from before the restart is past the new head: nothing.
            let answer = http_get(&server, &target(first_id + 1)).await;
            assert_eq!(
                (answer.status, answer.body.as_str()),
                (200, "[]"),
                "{shape}"
            );
        }
        drop(fresh);
        stop(server, shutdown).await;
    }
}

#[tokio::test]
async fn cut_every_cuts_each_connection_after_its_lifetime() {
    let (server, shutdown) = start(ExchangeConfig {
        cut_every: Some(Duration::from_millis(400)),
        ..config(ExchangeShape::KrakenTrade, 20.0)
    })
    .await;
    for expected in [Ending::CloseFrame, Ending::NoCloseFrame] {
        let opened = Instant::now();
        let mut ws = connect_example(&server).await;
        assert_eq!(ending(&mut ws).await, expected);
        let lived = opened.elapsed();
        assert!(
            lived >= Duration::from_millis(350) && lived < Duration::from_secs(3),
            "{lived:?}"
        );
    }
    assert_eq!((server.connections_accepted(), server.cuts()), (2, 2));
    stop(server, shutdown).await;
}

#[tokio::test]
async fn silent_clients_are_cut_and_pinging_ones_are_not() {
    for (shape, ping) in [
        (ExchangeShape::KrakenTrade, r#"{"method":"ping"}"#),
        (ExchangeShape::BybitPublicTrade, r#"{"op":"ping"}"#),
        (ExchangeShape::BybitOrderbook, r#"{"op":"ping"}"#),
        (ExchangeShape::OkxBooks, "ping"),
        (ExchangeShape::KrakenBook, r#"{"method":"ping"}"#),
    ] {
        assert!(shape.has_app_ping(), "{shape}");
        let (server, shutdown) = start(ExchangeConfig {
            silent_cut_after: Some(Duration::from_millis(600)),
            ..config(shape, 5.0)
        })
        .await;
        let mut pinging = connect_example(&server).await;
        let mut silent = connect_example(&server).await;
        let opened = Instant::now();
        let silent_ended = tokio::spawn(async move {
            ending(&mut silent).await;
            opened.elapsed()
        });
        // Protocol pings do not count; application pings do.
        pinging
            .send(Message::Ping(Vec::new().into()))
            .await
            .expect("ping");
        while opened.elapsed() < Duration::from_millis(1_800) {
            send(&mut pinging, ping).await;
            sleep(Duration::from_millis(200)).await;
        }
        let lived = silent_ended.await.expect("silent client task");
        assert!(
            lived >= Duration::from_millis(550) && lived < Duration::from_millis(1_500),
            "{shape}: {lived:?}"
        );
        send(&mut pinging, ping).await;
        while !is_pong(
            &next_text(&mut pinging)
                .await
                .unwrap_or_else(|| panic!("{shape}: the pinging client is still served")),
        ) {}
        assert_eq!(server.cuts(), 1, "{shape}");
        drop(pinging);
        stop(server, shutdown).await;
    }
}

#[tokio::test]
async fn hostile_input_never_panics_any_shape() {
    for shape in ExchangeShape::ALL {
        let (server, shutdown) = start(config(shape, 20.0)).await;
        let mut ws = connect(&url(&server, shape.example_stream_id())).await;
        let nested = "[".repeat(30_000);
        for text in [
            "",
            "garbage",
            "{}",
            "[]",
            "null",
            "7",
            r#"{"op":null,"method":{},"type":[]}"#,
            &nested,
        ] {
            send(&mut ws, text).await;
        }
        ws.send(Message::binary(vec![0xff; 1000]))
            .await
            .expect("binary");
        // Still answering after all that.
        let subscribe = subscribe_for(shape);
        if !subscribe.is_empty() {
            send(&mut ws, subscribe).await;
        }
        let frame = next_text(&mut ws).await;
        assert!(
            frame.is_some(),
            "{shape}: the connection survives bad messages"
        );
        // A message over the limit ends that connection only.
        let huge = "x".repeat(200_000);
        let _ = ws.send(Message::text(huge)).await;
        while next_text(&mut ws).await.is_some() {}
        // Broken HTTP on the same port.
        for request in [
            &b"GARBAGE\r\n\r\n"[..],
            b"GET /v2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"GET /ws/btcusdt@trade HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: x\r\nConnection: upgrade, close\r\nUpgrade: websocket\r\nContent-Length: 0\r\n\r\n",
        ] {
            if let Some(answer) = raw_http(&server, request).await {
                assert!(answer.status >= 400, "{shape}: {answer:?}");
            }
        }
        let long = format!(
            "GET /{} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            "a".repeat(40_000)
        );
        if let Some(answer) = raw_http(&server, long.as_bytes()).await {
            assert!(answer.status >= 400);
        }
        assert_eq!(http_get(&server, "/nowhere").await.status, 404);
        // New connections are still served.
        let mut fresh = connect_example(&server).await;
        assert!(next_text(&mut fresh).await.is_some(), "{shape}");
        drop(fresh);
        stop(server, shutdown).await;
    }
}

#[tokio::test]
async fn shutdown_ends_sessions_and_the_listener() {
    let (server, shutdown) = start(config(ExchangeShape::CoinbaseMatches, 1000.0)).await;
    let ws_url = server.ws_url();
    // One client reads, one never does, one is a bare TCP connection.
    let mut reading = connect_example(&server).await;
    let not_reading = connect_example(&server).await;
    let _bare = TcpStream::connect(server.local_addr()).await.expect("tcp");
    sleep(Duration::from_millis(300)).await;
    let stopped = Instant::now();
    stop(server, shutdown).await;
    assert!(stopped.elapsed() < Duration::from_secs(5));
    while next_text(&mut reading).await.is_some() {}
    drop(not_reading);
    assert!(tokio_tungstenite::connect_async(ws_url).await.is_err());
}

/// `UPSTREAM_DATA_MATCH` as the worker reads it.
fn is_data(frame: &Value, data_match: &str) -> bool {
    data_match.split(',').any(|alternative| {
        let (pointer, value) = alternative.split_once('=').expect("pointer=value");
        match frame.pointer(pointer) {
            Some(Value::String(text)) => text == value,
            Some(other) => {
                let rendered = other.to_string();
                rendered == value
            }
            None => false,
        }
    })
}

/// The path and query of the worked `UPSTREAM_SNAPSHOT_URL` for `stream_id`.
fn snapshot_target(
    server: &ExchangeServer,
    settings: &std::collections::HashMap<&str, String>,
    stream_id: &str,
) -> String {
    let url = settings["UPSTREAM_SNAPSHOT_URL"]
        .replace("{stream_id_upper}", &stream_id.to_ascii_uppercase())
        .replace("{stream_id}", stream_id);
    url.split_once(&server.local_addr().to_string())
        .expect("same host")
        .1
        .to_owned()
}

/// A book side as its JSON array of `[price, qty]` pairs.
fn levels_value(levels: &[(String, String)]) -> Value {
    levels
        .iter()
        .map(|(price, qty)| Value::from(vec![price.as_str(), qty.as_str()]))
        .collect()
}

fn number_at(frame: &Value, pointer: &str) -> u64 {
    match frame.pointer(pointer) {
        Some(Value::Number(n)) => n.as_u64().expect("an unsigned number"),
        Some(Value::String(s)) => s.parse().expect("digits"),
        other => panic!("{pointer}: {other:?} in {frame}"),
    }
}

#[tokio::test]
async fn worked_settings_describe_the_frames_the_worker_sees() {
    for shape in ExchangeShape::ALL {
        let (server, shutdown) = start(config(shape, 40.0)).await;
        let settings: std::collections::HashMap<&str, String> =
            server.worked_settings().into_iter().collect();
        let get = |name: &str| {
            settings
                .get(name)
                .unwrap_or_else(|| panic!("{shape}: {name}"))
                .clone()
        };
        let stream_id = shape.example_stream_id();
        let mut ws = connect(&get("UPSTREAM_URL").replace("{stream_id}", stream_id)).await;
        let subscribe = get("UPSTREAM_SUBSCRIBE").replace("{stream_id}", stream_id);
        if !subscribe.is_empty() {
            send(&mut ws, &subscribe).await;
        }
        let data_match = get("UPSTREAM_DATA_MATCH");
        // `none`: the frames carry no sequence (Kraken's book) or no id
        // (Coinbase's book, whose id is its sequence).
        let pointer = |name: &str| settings.get(name).filter(|p| *p != "none").cloned();
        let (seq_pointer, id_pointer) = (
            pointer("UPSTREAM_SEQ_POINTER"),
            pointer("UPSTREAM_ID_POINTER"),
        );
        assert_eq!(
            id_pointer.is_some(),
            shape.frames_carry_ids(),
            "{shape}: an id pointer exactly where frames carry ids"
        );
        // Coinbase numbers every message of a connection, acknowledgements
        // too.
        let per_connection = settings
            .get("UPSTREAM_SEQ_SCOPE")
            .is_some_and(|scope| scope == "connection");
        let contiguous = match settings.get("UPSTREAM_SEQ_STEP").map(String::as_str) {
            Some("contiguous") | None => true,
            Some("increasing") => false,
            Some(other) => panic!("{other}"),
        };
        // A diff's own statement of where it starts (order books).
        let first_pointer = settings.get("UPSTREAM_SEQ_FIRST_POINTER");
        let prev_pointer = settings.get("UPSTREAM_SEQ_PREV_POINTER");
        // An in-band book's snapshot: the first data frame, and only it.
        let snapshot_match = settings.get("UPSTREAM_SNAPSHOT_MATCH");
        let (mut data, mut control, mut previous) = (0, 0, None);
        let mut first_frame = None;
        while data < 30 {
            let frame = next_json(&mut ws).await;
            if !is_data(&frame, &data_match) {
                control += 1;
                if let Some(pointer) = seq_pointer.as_ref().filter(|_| !per_connection) {
                    assert!(frame.pointer(pointer).is_none(), "{shape}: {frame}");
                }
                continue;
            }
            let seq = seq_pointer
                .as_ref()
                .map(|pointer| number_at(&frame, pointer));
            if let Some(pointer) = &id_pointer {
                assert!(frame.pointer(pointer).is_some(), "{shape}: {frame}");
            }
            if per_connection && data == 0 {
                // The acknowledgements took the numbers before it.
                assert_eq!(seq, Some(control), "{shape}: {frame}");
            }
            if let Some(snapshot_match) = snapshot_match {
                assert_eq!(
                    is_data(&frame, snapshot_match),
                    data == 0,
                    "{shape}: {frame}"
                );
            }
            if let Some(ts) = settings.get("UPSTREAM_TS_POINTER") {
                let ms = number_at(&frame, ts);
                assert!(ms > 1_600_000_000_000, "{shape}: unix ms");
            }
            if let (Some(previous), Some(seq)) = (previous, seq) {
                if contiguous {
                    assert_eq!(seq, previous + 1, "{shape}");
                } else {
                    assert!(seq > previous, "{shape}");
                }
                // Diffs chain: spot U = previous u + 1, futures pu = previous u.
                if let Some(pointer) = first_pointer {
                    assert_eq!(number_at(&frame, pointer), previous + 1, "{shape}");
                }
                if let Some(pointer) = prev_pointer {
                    assert_eq!(number_at(&frame, pointer), previous, "{shape}");
                }
            }
            first_frame.get_or_insert_with(|| frame.clone());
            previous = seq;
            data += 1;
        }
        // Acks (and Kraken's status) are control frames, not data; Binance
        // streams send none.
        if !matches!(
            shape,
            ExchangeShape::BinanceTrade
                | ExchangeShape::BinanceAggTrade
                | ExchangeShape::BinanceDepth
                | ExchangeShape::BinanceFuturesDepth
        ) {
            assert!(control >= 1, "{shape}");
        }
        match get("UPSTREAM_RESUME").as_str() {
            "backfill" => {
                let url = get("UPSTREAM_BACKFILL_URL")
                    .replace("{stream_id_upper}", &stream_id.to_ascii_uppercase())
                    .replace("{from_seq}", "5003");
                let target = url
                    .split_once(&server.local_addr().to_string())
                    .expect("same host")
                    .1;
                let answer = http_get(&server, target).await;
                let items = answer.json();
                let item_seq = get("UPSTREAM_BACKFILL_SEQ_POINTER");
                assert_eq!(
                    get("UPSTREAM_BACKFILL_ITEMS_POINTER"),
                    "",
                    "the body is the array"
                );
                let first = &items[0];
                assert_eq!(number_at(first, &item_seq), 5003, "{shape}");
                assert!(
                    first
                        .pointer(&get("UPSTREAM_BACKFILL_ID_POINTER"))
                        .is_some()
                );
                assert!(number_at(first, &get("UPSTREAM_BACKFILL_TS_POINTER")) > 1_600_000_000_000);
            }
            "live" => assert!(!shape.serves_history(), "{shape}"),
            "snapshot" if snapshot_match.is_some() => {
                assert!(
                    shape.snapshot_in_band() && !shape.serves_snapshot(),
                    "{shape}"
                );
                assert!(!settings.contains_key("UPSTREAM_SNAPSHOT_URL"), "{shape}");
                // A new snapshot is asked for on the same connection.
                let unsubscribe = get("UPSTREAM_UNSUBSCRIBE").replace("{stream_id}", stream_id);
                send(&mut ws, &unsubscribe).await;
                send(&mut ws, &subscribe).await;
                let snapshot_match = snapshot_match.expect("in band");
                let (snapshot, _) = next_where(&mut ws, |v| is_data(v, snapshot_match)).await;
                if let Some(pointer) = &seq_pointer {
                    let newest = previous.expect("data was read");
                    assert!(number_at(&snapshot, pointer) > newest, "{shape}");
                }
            }
            "snapshot" => {
                assert!(shape.serves_snapshot(), "{shape}");
                let answer =
                    http_get(&server, &snapshot_target(&server, &settings, stream_id)).await;
                assert_eq!(answer.status, 200, "{shape}: {}", answer.body);
                let snapshot = answer.json();
                let last = number_at(&snapshot, &get("UPSTREAM_SNAPSHOT_SEQ_POINTER"));
                // Taken after the 30 diffs read: at or past the newest.
                let newest = previous.expect("diffs were read");
                assert!(last >= newest, "{shape}: {last} before {newest}");
                assert!(snapshot["bids"].as_array().is_some_and(|b| !b.is_empty()));
                assert!(snapshot["asks"].as_array().is_some_and(|a| !a.is_empty()));
                // The first diff read started at or before the snapshot's next id.
                let first = first_frame.expect("diffs were read");
                let start = match (first_pointer, prev_pointer) {
                    (Some(pointer), _) => number_at(&first, pointer),
                    (None, Some(pointer)) => number_at(&first, pointer) + 1,
                    (None, None) => panic!("{shape}: a diff must state where it starts"),
                };
                assert!(start <= last + 1, "{shape}");
            }
            other => panic!("{other}"),
        }
        if shape.has_app_ping() {
            send(&mut ws, &get("UPSTREAM_PING_TEXT")).await;
            // The reply is a control frame (OKX's is not even JSON).
            let pong = loop {
                let text = next_text(&mut ws).await.expect("a pong");
                match serde_json::from_str::<Value>(&text) {
                    Ok(frame) if is_data(&frame, &data_match) => continue,
                    Ok(frame) => {
                        if let Some(pointer) = &seq_pointer {
                            assert!(frame.pointer(pointer).is_none(), "{shape}");
                        }
                    }
                    Err(_) => {}
                }
                break text;
            };
            assert!(is_pong(&pong), "{shape}: {pong}");
            assert!(get("UPSTREAM_PING_INTERVAL_MS").parse::<u64>().expect("ms") > 0);
        }
        drop(ws);
        stop(server, shutdown).await;
    }
}
