use std::collections::HashMap;

use super::*;

const SPOT_KEYS: [&str; 7] = ["e", "E", "s", "U", "u", "b", "a"];
const FUTURES_KEYS: [&str; 9] = ["e", "E", "T", "s", "U", "u", "pu", "b", "a"];

/// A `[["price","qty"],…]` array as pairs, each a decimal string with
/// `price_places` and `qty_places` decimals.
fn levels(value: &Value, price_places: usize, qty_places: usize) -> Side {
    let decimals = |text: &str, places: usize| {
        let (whole, fraction) = text.split_once('.').expect("a decimal point");
        assert!(!whole.is_empty() && fraction.len() == places, "{text}");
        assert!(text.parse::<f64>().is_ok(), "{text}");
    };
    value
        .as_array()
        .expect("an array of levels")
        .iter()
        .map(|level| {
            let pair = level.as_array().expect("a [price, qty] pair");
            assert_eq!(pair.len(), 2, "{level}");
            let (p, q) = (
                pair[0].as_str().expect("a string price"),
                pair[1].as_str().expect("a string qty"),
            );
            decimals(p, price_places);
            decimals(q, qty_places);
            (p.to_owned(), q.to_owned())
        })
        .collect()
}

/// Decimals of (prices, quantities) per shape.
fn places(shape: ExchangeShape) -> (usize, usize) {
    match shape {
        ExchangeShape::BinanceFuturesDepth => (2, 3),
        _ => (8, 8),
    }
}

/// Bids strictly descending, asks strictly ascending, never crossed.
fn assert_sorted(bids: &Side, asks: &Side) {
    assert!(
        bids.windows(2).all(|w| price(&w[0]) > price(&w[1])),
        "{bids:?}"
    );
    assert!(
        asks.windows(2).all(|w| price(&w[0]) < price(&w[1])),
        "{asks:?}"
    );
    if let (Some(bid), Some(ask)) = (bids.first(), asks.first()) {
        assert!(price(bid) < price(ask), "crossed: {bid:?} {ask:?}");
    }
}

async fn snapshot(server: &ExchangeServer, query: &str) -> Answer {
    let path = match server.config().shape {
        ExchangeShape::BinanceFuturesDepth => "/fapi/v1/depth",
        _ => "/api/v3/depth",
    };
    http_get(server, &format!("{path}?{query}")).await
}

#[tokio::test]
async fn spot_diffs_chain_and_carry_the_documented_fields() {
    let shape = ExchangeShape::BinanceDepth;
    let (server, shutdown) = start(config(shape, 100.0)).await;
    let first_id = server.config().first_id;
    let mut ws = connect(&url(&server, "btcusdt")).await;
    let mut previous: Option<u64> = None;
    let mut folded_several = 0;
    for _ in 0..25 {
        let text = next_text(&mut ws).await.expect("a diff");
        let diff: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(keys(&diff), sorted(&SPOT_KEYS), "{text}");
        assert_key_order(&text, &SPOT_KEYS);
        assert_eq!(
            (diff["e"].as_str(), diff["s"].as_str()),
            (Some("depthUpdate"), Some("BTCUSDT"))
        );
        let (first, last) = (
            diff["U"].as_u64().expect("U"),
            diff["u"].as_u64().expect("u"),
        );
        assert!(first >= first_id && first <= last, "{text}");
        assert!(last - first < 5, "1 to 5 updates a frame: {text}");
        folded_several += usize::from(last > first);
        if let Some(previous) = previous {
            assert_eq!(first, previous + 1, "U = previous u + 1");
        }
        previous = Some(last);
        let (bids, asks) = (levels(&diff["b"], 8, 8), levels(&diff["a"], 8, 8));
        assert!(!bids.is_empty() || !asks.is_empty(), "{text}");
        assert!(bids.len() + asks.len() <= (last - first + 1) as usize);
        assert_sorted(&bids, &asks);
        assert_eq!(diff["E"].as_u64(), Some(server.ts_ms(last)));
        assert!(diff["E"].as_u64().expect("E") > 1_600_000_000_000);
        // The exact text is a function of (symbol, update id).
        for id in [first, last] {
            assert_eq!(text, server.frame("btcusdt", id));
            assert_eq!(text, server.frame("BTCUSDT", id));
        }
        assert!(server.head("BTCUSDT") >= last);
    }
    assert!(folded_several > 0, "some frames fold several updates");
    // Stream requests are answered the Binance way; the diffs go on.
    send(&mut ws, r#"{"method":"LIST_SUBSCRIPTIONS","id":7}"#).await;
    let (_, answer) = next_where(&mut ws, |v| v.get("e").is_none()).await;
    assert_eq!(answer, r#"{"result":["btcusdt@depth@100ms"],"id":7}"#);
    let (diff, _) = next_where(&mut ws, |v| v["e"] == "depthUpdate").await;
    assert!(diff["U"].as_u64().expect("U") > previous.expect("read some"));
    // The 1000 ms stream name serves the same diffs.
    let mut slow = connect(&format!("ws://{}/ws/btcusdt@depth", server.local_addr())).await;
    let text = next_text(&mut slow).await.expect("a diff");
    let diff: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(
        text,
        server.frame("btcusdt", diff["u"].as_u64().expect("u"))
    );
    // Some updates delete a level (quantity zero).
    let deletes = (first_id..first_id + 300)
        .filter(|&id| server.frame("btcusdt", id).contains(r#""0.00000000"]"#))
        .count();
    assert!(deletes > 0, "no update deleted a level");
    drop((ws, slow));
    stop(server, shutdown).await;
}

#[tokio::test]
async fn futures_diffs_chain_by_pu_and_their_ids_jump() {
    let shape = ExchangeShape::BinanceFuturesDepth;
    let (server, shutdown) = start(config(shape, 100.0)).await;
    let first_id = server.config().first_id;
    let mut ws = connect(&url(&server, "ethusdt")).await;
    let mut previous: Option<u64> = None;
    let mut jumps = 0;
    for _ in 0..25 {
        let text = next_text(&mut ws).await.expect("a diff");
        let diff: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(keys(&diff), sorted(&FUTURES_KEYS), "{text}");
        assert_key_order(&text, &FUTURES_KEYS);
        assert_eq!(
            (diff["e"].as_str(), diff["s"].as_str()),
            (Some("depthUpdate"), Some("ETHUSDT"))
        );
        let (first, last, prev) = (
            diff["U"].as_u64().expect("U"),
            diff["u"].as_u64().expect("u"),
            diff["pu"].as_u64().expect("pu"),
        );
        assert!(first >= first_id && prev < first && first <= last, "{text}");
        // Ids are shared with other symbols: they advance by 1 to 7 an update.
        assert!(first - prev <= 7, "{text}");
        assert!(last - first <= 4 * 7, "{text}");
        jumps += usize::from(first > prev + 1);
        if let Some(previous) = previous {
            assert_eq!(prev, previous, "pu = previous u");
        }
        previous = Some(last);
        let (bids, asks) = (levels(&diff["b"], 2, 3), levels(&diff["a"], 2, 3));
        assert!(!bids.is_empty() || !asks.is_empty(), "{text}");
        assert_sorted(&bids, &asks);
        let (event, transaction) = (
            diff["E"].as_u64().expect("E"),
            diff["T"].as_u64().expect("T"),
        );
        assert!(event >= transaction && transaction > 1_600_000_000_000);
        assert_eq!(transaction, server.ts_ms(last));
        for id in [prev + 1, first, last] {
            assert_eq!(text, server.frame("ETHUSDT", id), "id {id}");
        }
        assert!(server.head("ethusdt") >= last);
    }
    assert!(jumps > 0, "update ids are not contiguous across frames");
    drop(ws);
    stop(server, shutdown).await;
}

/// Binance's procedure: buffer diffs, take a snapshot, drop diffs it already
/// holds, check the first kept one covers the next id, then apply diffs in
/// order; the local book must be the server's exact book after every diff.
async fn snapshot_then_diffs_make_the_exact_book(shape: ExchangeShape) {
    let (server, shutdown) = start(config(shape, 200.0)).await;
    let settings: HashMap<&str, String> = server.worked_settings().into_iter().collect();
    let mut ws = connect(&settings["UPSTREAM_URL"].replace("{stream_id}", "btcusdt")).await;
    let mut buffered = std::collections::VecDeque::new();
    for _ in 0..3 {
        buffered.push_back(next_json(&mut ws).await);
    }
    let target = settings["UPSTREAM_SNAPSHOT_URL"].replace("{stream_id_upper}", "BTCUSDT");
    let (_, target) = target
        .split_once(&server.local_addr().to_string())
        .expect("same host");
    let answer = http_get(&server, target).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let snapshot = answer.json();
    let expected_keys: &[&str] = match shape {
        ExchangeShape::BinanceFuturesDepth => &["lastUpdateId", "E", "T", "bids", "asks"],
        _ => &["lastUpdateId", "bids", "asks"],
    };
    assert_eq!(keys(&snapshot), sorted(expected_keys));
    assert_key_order(&answer.body, expected_keys);
    let last_update_id = snapshot["lastUpdateId"].as_u64().expect("lastUpdateId");
    let (p, q) = places(shape);
    let mut book = LocalBook::snapshot(
        levels(&snapshot["bids"], p, q),
        levels(&snapshot["asks"], p, q),
    );
    let (bids, asks) = book.sides();
    assert_eq!(
        (bids, asks),
        server.book_at("BTCUSDT", last_update_id),
        "the snapshot is the book at lastUpdateId"
    );
    assert!(!book.bids.is_empty() && !book.asks.is_empty());
    let mut last: Option<u64> = None;
    let mut applied = 0;
    while applied < 25 {
        let diff = match buffered.pop_front() {
            Some(diff) => diff,
            None => next_json(&mut ws).await,
        };
        let u = diff["u"].as_u64().expect("u");
        if u <= last_update_id {
            continue;
        }
        // Where the diff starts: spot U, futures pu + 1.
        let start = match shape {
            ExchangeShape::BinanceFuturesDepth => diff["pu"].as_u64().expect("pu") + 1,
            _ => diff["U"].as_u64().expect("U"),
        };
        match last {
            None => assert!(
                start <= last_update_id + 1 && last_update_id < u,
                "the first kept diff covers lastUpdateId + 1: {diff}"
            ),
            Some(last) => assert_eq!(start, last + 1, "{diff}"),
        }
        book.apply(levels(&diff["b"], p, q), levels(&diff["a"], p, q));
        assert_eq!(
            book.sides(),
            server.book_at("btcusdt", u),
            "after the diff ending at {u}"
        );
        last = Some(u);
        applied += 1;
    }
    let last = last.expect("diffs applied");
    assert!(server.head("BTCUSDT") >= last);
    // The book moved: it is not the snapshot's any more.
    assert_ne!(
        server.book_at("BTCUSDT", last),
        server.book_at("BTCUSDT", last_update_id)
    );
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn spot_snapshot_and_later_diffs_make_the_exact_book() {
    snapshot_then_diffs_make_the_exact_book(ExchangeShape::BinanceDepth).await;
}

#[tokio::test]
async fn futures_snapshot_and_later_diffs_make_the_exact_book() {
    snapshot_then_diffs_make_the_exact_book(ExchangeShape::BinanceFuturesDepth).await;
}

#[tokio::test]
async fn snapshot_limits_round_up_to_binance_values() {
    for (shape, cases) in [
        (
            ExchangeShape::BinanceDepth,
            [
                ("", 100),
                ("&limit=5", 5),
                ("&limit=7", 10),
                ("&limit=0", 5),
                ("&limit=6000", 5000),
            ],
        ),
        (
            ExchangeShape::BinanceFuturesDepth,
            [
                ("", 500),
                ("&limit=5", 5),
                ("&limit=7", 10),
                ("&limit=0", 5),
                ("&limit=6000", 1000),
            ],
        ),
    ] {
        let (server, shutdown) = start(config(shape, 50.0)).await;
        let (p, q) = places(shape);
        for (limit, levels_wanted) in cases {
            let answer = snapshot(&server, &format!("symbol=ETHBTC{limit}")).await;
            assert_eq!(answer.status, 200, "{shape}{limit}: {}", answer.body);
            assert!(
                answer
                    .header("content-type")
                    .is_some_and(|t| t.starts_with("application/json"))
            );
            let body = answer.json();
            let id = body["lastUpdateId"].as_u64().expect("lastUpdateId");
            let (bids, asks) = server.book_at("ETHBTC", id);
            // The book holds about 150 levels a side (at most 200).
            assert!(bids.len() > 100 && asks.len() > 100 && bids.len() <= 200);
            let (got_bids, got_asks) = (levels(&body["bids"], p, q), levels(&body["asks"], p, q));
            assert_eq!(
                got_bids.len(),
                levels_wanted.min(bids.len()),
                "{shape}{limit}"
            );
            assert_eq!(
                got_asks.len(),
                levels_wanted.min(asks.len()),
                "{shape}{limit}"
            );
            assert_eq!(got_bids[..], bids[..got_bids.len()], "{shape}{limit}");
            assert_eq!(got_asks[..], asks[..got_asks.len()], "{shape}{limit}");
        }
        stop(server, shutdown).await;
    }
}

#[tokio::test]
async fn snapshot_requests_are_checked_and_overridden_like_history() {
    let (server, shutdown) = start(config(ExchangeShape::BinanceDepth, 20.0)).await;
    for (query, code) in [
        ("", -1102),
        ("symbol=btcusdt", -1100),
        ("symbol=BTCUSDT&limit=ten", -1100),
        ("symbol=BTCUSDT&limit=-1", -1100),
        ("symbol=BTCUSDT&fromId=1", -1104),
        ("symbol=BTCUSDT&symbol=ETHBTC", -1101),
        ("symbol=%ZZ", -1100),
    ] {
        let answer = snapshot(&server, query).await;
        assert_eq!(answer.status, 400, "{query}");
        assert_eq!(answer.json()["code"], code, "{query}: {}", answer.body);
        assert!(answer.json()["msg"].is_string());
    }
    // The futures path and the trade history are not on a spot depth server.
    for path in [
        "/fapi/v1/depth?symbol=BTCUSDT",
        "/api/v3/historicalTrades?symbol=BTCUSDT",
    ] {
        assert_eq!(http_get(&server, path).await.status, 404, "{path}");
    }
    assert_eq!(server.history_url(), None);
    assert_eq!(server.oldest_kept(), None);
    assert_eq!(server.history_item("BTCUSDT", 5_000), None);
    // Overrides fail snapshots as they fail history pages.
    let before = server.history_requests();
    server.set_history_override(Some(HistoryOverride::too_many_requests(2)));
    for _ in 0..2 {
        let answer = snapshot(&server, "symbol=BTCUSDT").await;
        assert_eq!(
            (answer.status, answer.header("retry-after")),
            (429, Some("1"))
        );
        assert_eq!(answer.json()["code"], -1003);
    }
    assert_eq!(snapshot(&server, "symbol=BTCUSDT").await.status, 200);
    assert_eq!(server.history_requests(), before + 3);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn a_restart_starts_update_ids_at_1_from_the_initial_book() {
    let rate = 5.0;
    for shape in [
        ExchangeShape::BinanceDepth,
        ExchangeShape::BinanceFuturesDepth,
    ] {
        let (server, shutdown) = start(config(shape, rate)).await;
        let first_id = server.config().first_id;
        let initial = server.book_at("BTCUSDT", first_id - 1);
        assert_eq!(initial, server.book_at("BTCUSDT", 0), "{shape}");
        let mut old = connect(&url(&server, "btcusdt")).await;
        let diff = next_json(&mut old).await;
        assert!(
            diff["U"].as_u64().expect("U") >= first_id,
            "{shape}: {diff}"
        );
        // Id 40 is before the first: the initial book, until the restart.
        let before = server.book_at("BTCUSDT", 40);
        assert_eq!(before, initial, "{shape}");
        assert_eq!(server.restart(), 1, "{shape}");
        assert_eq!(ending(&mut old).await, Ending::CloseFrame, "{shape}");
        // The new timeline: update id 1 is the first, on the same initial book.
        let frame: Value = serde_json::from_str(&server.frame("BTCUSDT", 1)).expect("JSON");
        assert_eq!(frame["U"], 1, "{shape}: {frame}");
        if shape == ExchangeShape::BinanceFuturesDepth {
            assert_eq!(frame["pu"], 0, "{shape}: {frame}");
        }
        assert_eq!(server.book_at("BTCUSDT", 0), initial, "{shape}");
        assert_ne!(
            server.book_at("BTCUSDT", 40),
            before,
            "{shape}: new updates"
        );
        // A new connection streams ids from (about) 1.
        let mut fresh = connect(&url(&server, "btcusdt")).await;
        let text = next_text(&mut fresh).await.expect("a diff");
        let diff: Value = serde_json::from_str(&text).expect("JSON");
        let (start, last) = match shape {
            ExchangeShape::BinanceFuturesDepth => (
                diff["pu"].as_u64().expect("pu") + 1,
                diff["u"].as_u64().expect("u"),
            ),
            _ => (
                diff["U"].as_u64().expect("U"),
                diff["u"].as_u64().expect("u"),
            ),
        };
        assert!(
            start >= 1 && last < 1 + 7 * (3.0 * rate) as u64,
            "{shape}: {diff}"
        );
        assert_eq!(text, server.frame("BTCUSDT", last), "{shape}");
        // The snapshot is of the new book.
        let answer = snapshot(&server, "symbol=BTCUSDT&limit=1000").await;
        let body = answer.json();
        let id = body["lastUpdateId"].as_u64().expect("lastUpdateId");
        assert!(
            id >= server.head("BTCUSDT") && id < first_id,
            "{shape}: {id}"
        );
        let (p, q) = places(shape);
        assert_eq!(
            (levels(&body["bids"], p, q), levels(&body["asks"], p, q)),
            server.book_at("BTCUSDT", id),
            "{shape}"
        );
        drop(fresh);
        stop(server, shutdown).await;
    }
}

#[tokio::test]
async fn cuts_end_depth_streams_and_a_reconnect_starts_live() {
    let shape = ExchangeShape::BinanceFuturesDepth;
    let (server, shutdown) = start(ExchangeConfig {
        cut_every: Some(Duration::from_millis(500)),
        ..config(shape, 100.0)
    })
    .await;
    let opened = Instant::now();
    let mut ws = connect(&url(&server, "btcusdt")).await;
    let mut last_u = 0;
    let ended = loop {
        match timeout(WAIT, ws.next()).await.expect("ends in time") {
            Some(Ok(Message::Text(text))) => {
                let diff: Value = serde_json::from_str(&text).expect("JSON");
                last_u = diff["u"].as_u64().expect("u");
            }
            Some(Ok(Message::Close(_))) => break Ending::CloseFrame,
            Some(Ok(_)) => {}
            Some(Err(_)) | None => break Ending::NoCloseFrame,
        }
    };
    assert_eq!(ended, Ending::CloseFrame, "connection 1 is odd");
    let lived = opened.elapsed();
    assert!(
        lived >= Duration::from_millis(450) && lived < Duration::from_secs(3),
        "{lived:?}"
    );
    assert!(last_u > 0, "diffs before the cut");
    // Dropping the client answers the close: the session leaves.
    drop(ws);
    let deadline = Instant::now() + WAIT;
    while server.open_connections() > 0 {
        assert!(Instant::now() < deadline, "the cut session ends");
        sleep(Duration::from_millis(10)).await;
    }
    // Reconnecting later: the diffs missed meanwhile are not replayed, so the
    // first one does not chain (a client must take a new snapshot).
    sleep(Duration::from_millis(300)).await;
    let mut again = connect(&url(&server, "btcusdt")).await;
    let diff = next_json(&mut again).await;
    assert!(
        diff["pu"].as_u64().expect("pu") > last_u,
        "{diff} after {last_u}"
    );
    assert_eq!(server.cut_all(), 1);
    assert_eq!(
        ending(&mut again).await,
        Ending::NoCloseFrame,
        "connection 2 is even"
    );
    let deadline = Instant::now() + WAIT;
    while server.cuts() < 2 {
        assert!(Instant::now() < deadline, "cuts are counted");
        sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(server.connections_accepted(), 2);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn depth_streams_are_named_like_binance_names_them() {
    for (shape, good, bad) in [
        (
            ExchangeShape::BinanceDepth,
            &["btcusdt@depth", "btcusdt@depth@100ms"][..],
            &[
                "btcusdt@depth@500ms",
                "BTCUSDT@depth",
                "btcusdt@trade",
                "btcusdt@depth5",
                "btcusdt",
            ][..],
        ),
        (
            ExchangeShape::BinanceFuturesDepth,
            &[
                "btcusdt@depth",
                "btcusdt@depth@500ms",
                "btcusdt@depth@100ms",
            ][..],
            &[
                "btcusdt@depth@1000ms",
                "btcusdt@aggTrade",
                "BTCUSDT@depth@100ms",
            ][..],
        ),
    ] {
        let (server, shutdown) = start(config(shape, 50.0)).await;
        let host = server.local_addr();
        for name in good {
            let mut ws = connect(&format!("ws://{host}/ws/{name}")).await;
            let diff = next_json(&mut ws).await;
            assert_eq!(diff["e"], "depthUpdate", "{shape} {name}");
        }
        for name in bad {
            match tokio_tungstenite::connect_async(format!("ws://{host}/ws/{name}")).await {
                Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                    assert_eq!(response.status().as_u16(), 400, "{shape} {name}");
                }
                other => panic!("{shape}: {name} was not refused: {other:?}"),
            }
        }
        stop(server, shutdown).await;
    }
}
