//! The order books whose snapshots come in the stream: Bybit `orderbook.50`
//! and OKX `books`. Each book is folded from its snapshot and updates by the
//! exchange's documented rules, independently of the server's code, and
//! compared with `book_at`; OKX checksums are recomputed from the folded
//! book by OKX's documented rule.

use super::*;

const BYBIT: ExchangeShape = ExchangeShape::BybitOrderbook;
const OKX: ExchangeShape = ExchangeShape::OkxBooks;
const BYBIT_SUBSCRIBE: &str = r#"{"op":"subscribe","args":["orderbook.50.BTCUSDT"]}"#;
const BYBIT_UNSUBSCRIBE: &str = r#"{"op":"unsubscribe","args":["orderbook.50.BTCUSDT"]}"#;
const OKX_SUBSCRIBE: &str =
    r#"{"op":"subscribe","args":[{"channel":"books","instId":"BTC-USDT"}]}"#;
const OKX_UNSUBSCRIBE: &str =
    r#"{"op":"unsubscribe","args":[{"channel":"books","instId":"BTC-USDT"}]}"#;

/// The `[price, qty, …]` rows of a side, each exactly `width` strings.
fn rows(value: &Value, width: usize) -> Side {
    value
        .as_array()
        .expect("an array of levels")
        .iter()
        .map(|row| {
            let row = row.as_array().expect("a row");
            assert_eq!(row.len(), width, "{row:?}");
            let text = |i: usize| row[i].as_str().expect("a string").to_owned();
            (1..width).for_each(|i| assert!(text(i).parse::<f64>().is_ok(), "{row:?}"));
            (text(0), text(1))
        })
        .collect()
}

impl LocalBook {
    /// OKX's documented checksum: the best 25 bids and asks interleaved as
    /// `bid price:bid size:ask price:ask size:…` (a missing level is left
    /// out), CRC32, as a signed 32-bit integer.
    fn okx_checksum(&self) -> i64 {
        let (bids, asks) = self.sides();
        let mut text = String::new();
        for i in 0..25 {
            for level in [bids.get(i), asks.get(i)].into_iter().flatten() {
                for part in [&level.0, &level.1] {
                    if !text.is_empty() {
                        text.push(':');
                    }
                    text.push_str(part);
                }
            }
        }
        i64::from(crc32fast::hash(text.as_bytes()) as i32)
    }
}

/// Bybit's `b`/`a` or OKX's `bids`/`asks` of a data frame.
fn frame_sides(shape: ExchangeShape, frame: &Value) -> (Side, Side) {
    match shape {
        BYBIT => (rows(&frame["data"]["b"], 2), rows(&frame["data"]["a"], 2)),
        _ => (
            rows(&frame["data"][0]["bids"], 4),
            rows(&frame["data"][0]["asks"], 4),
        ),
    }
}

/// The frame's id in the shape's numbering: Bybit `u`, OKX `seqId`.
fn frame_id(shape: ExchangeShape, frame: &Value) -> u64 {
    match shape {
        BYBIT => frame["data"]["u"].as_u64().expect("u"),
        _ => frame["data"][0]["seqId"].as_u64().expect("seqId"),
    }
}

fn is_snapshot(shape: ExchangeShape, frame: &Value) -> bool {
    match shape {
        BYBIT => frame["type"] == "snapshot",
        _ => frame["action"] == "snapshot",
    }
}

fn is_data(shape: ExchangeShape, frame: &Value) -> bool {
    match shape {
        BYBIT => frame.get("topic").is_some(),
        _ => frame.get("action").is_some(),
    }
}

fn subscribe_texts(shape: ExchangeShape) -> (&'static str, &'static str) {
    match shape {
        BYBIT => (BYBIT_SUBSCRIBE, BYBIT_UNSUBSCRIBE),
        _ => (OKX_SUBSCRIBE, OKX_UNSUBSCRIBE),
    }
}

fn symbol(shape: ExchangeShape) -> &'static str {
    shape.example_stream_id()
}

/// The next data frame, skipping acknowledgements.
async fn next_book_frame(ws: &mut Client, shape: ExchangeShape) -> (Value, String) {
    next_where(ws, |v| is_data(shape, v)).await
}

/// The next acknowledgement (or error), failing on a data frame.
async fn next_answer(ws: &mut Client, shape: ExchangeShape) -> Value {
    let frame = next_json(ws).await;
    assert!(
        !is_data(shape, &frame),
        "{shape}: data before the answer: {frame}"
    );
    frame
}

/// Connects, subscribes to the example symbol and reads the acknowledgement.
async fn subscribed(server: &ExchangeServer) -> Client {
    let shape = server.config().shape;
    let mut ws = connect(&server.ws_url()).await;
    send(&mut ws, subscribe_texts(shape).0).await;
    let ack = next_answer(&mut ws, shape).await;
    match shape {
        BYBIT => assert_eq!(ack["success"], true, "{ack}"),
        _ => assert_eq!(ack["event"], "subscribe", "{ack}"),
    }
    ws
}

#[tokio::test]
async fn bybit_snapshot_then_deltas_with_contiguous_u_fold_to_the_book() {
    let (server, shutdown) = start(config(BYBIT, 100.0)).await;
    let first_id = server.config().first_id;
    let mut ws = connect(&server.ws_url()).await;
    send(
        &mut ws,
        r#"{"op":"subscribe","args":["orderbook.50.BTCUSDT"],"req_id":"r1"}"#,
    )
    .await;
    let text = next_text(&mut ws).await.expect("ack");
    assert_key_order(&text, &["success", "ret_msg", "conn_id", "req_id", "op"]);
    let ack: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(
        (&ack["success"], &ack["ret_msg"], &ack["req_id"], &ack["op"]),
        (
            &Value::from(true),
            &Value::from(""),
            &Value::from("r1"),
            &Value::from("subscribe")
        )
    );
    // The snapshot first.
    let (snapshot, text) = next_book_frame(&mut ws, BYBIT).await;
    assert_key_order(&text, &["topic", "type", "ts", "data", "cts"]);
    assert_key_order(&text, &["s", "b", "a", "u", "seq"]);
    assert_eq!(keys(&snapshot), ["cts", "data", "topic", "ts", "type"]);
    assert_eq!(keys(&snapshot["data"]), ["a", "b", "s", "seq", "u"]);
    assert_eq!(
        (
            &snapshot["topic"],
            &snapshot["type"],
            &snapshot["data"]["s"]
        ),
        (
            &Value::from("orderbook.50.BTCUSDT"),
            &Value::from("snapshot"),
            &Value::from("BTCUSDT")
        )
    );
    let (bids, asks) = frame_sides(BYBIT, &snapshot);
    assert!(bids.len() <= 50 && asks.len() <= 50 && bids.len() > 25 && asks.len() > 25);
    assert!(bids.iter().chain(&asks).all(|(p, q)| {
        p.split_once('.').is_some_and(|(_, d)| d.len() == 2)
            && q.split_once('.').is_some_and(|(_, d)| d.len() == 6)
    }));
    let mut u = frame_id(BYBIT, &snapshot);
    assert!(u >= first_id);
    assert_eq!((bids.clone(), asks.clone()), server.book_at("BTCUSDT", u));
    let mut book = LocalBook::snapshot(bids, asks);
    let mut seq = snapshot["data"]["seq"].as_u64().expect("seq");
    let (mut deletes, mut several) = (0, 0);
    for _ in 0..60 {
        let (delta, text) = next_book_frame(&mut ws, BYBIT).await;
        assert_eq!(delta["type"], "delta", "{text}");
        let next = frame_id(BYBIT, &delta);
        assert_eq!(next, u + 1, "u is contiguous");
        u = next;
        let next_seq = delta["data"]["seq"].as_u64().expect("seq");
        assert!(next_seq > seq, "the cross sequence increases");
        seq = next_seq;
        let (ts, cts) = (
            delta["ts"].as_u64().expect("ts"),
            delta["cts"].as_u64().expect("cts"),
        );
        assert!(ts >= cts && ts <= cts + 2 && cts > 1_600_000_000_000);
        assert_eq!(server.ts_ms(u), cts);
        assert_eq!(text, server.frame("BTCUSDT", u));
        let (bids, asks) = frame_sides(BYBIT, &delta);
        assert!(!bids.is_empty() || !asks.is_empty(), "changed levels only");
        several += usize::from(bids.len() + asks.len() > 1);
        deletes += bids.iter().chain(&asks).filter(|(_, q)| q == "0").count();
        book.apply(bids, asks);
        let (bids, asks) = book.sides();
        assert!(price(&bids[0]) < price(&asks[0]));
        assert_eq!((bids, asks), server.book_at("BTCUSDT", u), "after u={u}");
    }
    assert!(deletes > 0, "qty \"0\" deletes levels");
    assert!(several > 0, "some deltas change several levels");
    assert!(server.head("BTCUSDT") >= u);
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn okx_snapshot_then_updates_chained_by_prev_seq_id_with_valid_checksums() {
    let (server, shutdown) = start(config(OKX, 100.0)).await;
    let first_id = server.config().first_id;
    let mut ws = connect(&server.ws_url()).await;
    send(
        &mut ws,
        r#"{"id":"7","op":"subscribe","args":[{"channel":"books","instId":"BTC-USDT"}]}"#,
    )
    .await;
    let text = next_text(&mut ws).await.expect("ack");
    assert_key_order(
        &text,
        &["id", "event", "arg", "channel", "instId", "connId"],
    );
    let ack: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(keys(&ack), ["arg", "connId", "event", "id"]);
    assert_eq!(
        ack["arg"],
        serde_json::json!({"channel":"books","instId":"BTC-USDT"})
    );
    assert!(ack["connId"].as_str().is_some_and(|id| id.len() == 8));
    let (snapshot, text) = next_book_frame(&mut ws, OKX).await;
    assert_key_order(&text, &["arg", "action", "data"]);
    assert_key_order(
        &text,
        &["asks", "bids", "ts", "checksum", "prevSeqId", "seqId"],
    );
    assert_eq!(snapshot["action"], "snapshot");
    assert_eq!(snapshot["arg"], ack["arg"]);
    let data = &snapshot["data"][0];
    assert_eq!(snapshot["data"].as_array().map(Vec::len), Some(1));
    assert_eq!(data["prevSeqId"], -1);
    assert!(
        data["ts"]
            .as_str()
            .expect("ts is a string")
            .parse::<u64>()
            .is_ok()
    );
    let mut seq = frame_id(OKX, &snapshot);
    assert!(seq >= first_id);
    let (bids, asks) = frame_sides(OKX, &snapshot);
    assert!(bids.len() > 100 && bids.len() <= 200 && asks.len() > 100 && asks.len() <= 200);
    assert_eq!(
        (bids.clone(), asks.clone()),
        server.book_at("BTC-USDT", seq)
    );
    let mut book = LocalBook::snapshot(bids, asks);
    assert_eq!(data["checksum"].as_i64(), Some(book.okx_checksum()));
    let (mut jumps, mut deletes) = (Vec::new(), 0);
    for _ in 0..60 {
        let (update, text) = next_book_frame(&mut ws, OKX).await;
        assert_eq!(update["action"], "update", "{text}");
        let data = &update["data"][0];
        assert_eq!(
            data["prevSeqId"].as_u64(),
            Some(seq),
            "chained by prevSeqId"
        );
        let next = frame_id(OKX, &update);
        assert!(next > seq && next - seq <= 5, "{seq} then {next}");
        jumps.push(next - seq);
        // Any id the update covers, (prevSeqId, seqId], names it.
        assert_eq!(text, server.frame("BTC-USDT", seq + 1));
        seq = next;
        assert_eq!(text, server.frame("BTC-USDT", seq));
        let ts: u64 = data["ts"].as_str().expect("ts").parse().expect("ms");
        assert_eq!(server.ts_ms(seq), ts);
        for row in data["bids"]
            .as_array()
            .into_iter()
            .chain(data["asks"].as_array())
            .flatten()
        {
            let row = row.as_array().expect("a row");
            assert_eq!(row[2], "0", "liquidated orders, deprecated");
            // A deleted level has no orders; a held one at least one.
            assert_eq!(row[1] == "0", row[3] == "0", "{row:?}");
            deletes += usize::from(row[1] == "0");
        }
        let (bids, asks) = frame_sides(OKX, &update);
        book.apply(bids, asks);
        assert_eq!(
            data["checksum"].as_i64(),
            Some(book.okx_checksum()),
            "checksum after seqId {seq}"
        );
        assert_eq!(book.sides(), server.book_at("BTC-USDT", seq), "after {seq}");
    }
    assert!(jumps.iter().any(|&j| j > 1), "seqIds have holes: {jumps:?}");
    assert!(deletes > 0, "size \"0\" deletes levels");
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn okx_numbers_are_written_without_trailing_zeros() {
    let (server, shutdown) = start(config(OKX, 50.0)).await;
    let mut ws = subscribed(&server).await;
    let (snapshot, _) = next_book_frame(&mut ws, OKX).await;
    let (bids, asks) = frame_sides(OKX, &snapshot);
    let all: Vec<&String> = bids.iter().chain(&asks).flat_map(|(p, q)| [p, q]).collect();
    assert!(
        all.iter().all(|n| !n.contains('.') || !n.ends_with('0')),
        "{all:?}"
    );
    // A 0.10 grid: prices with one decimal, and some whole ones.
    assert!(
        bids.iter()
            .chain(&asks)
            .all(|(p, _)| p.split_once('.').is_none_or(|(_, d)| d.len() == 1))
    );
    assert!(bids.iter().chain(&asks).any(|(p, _)| !p.contains('.')));
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn a_corrupted_okx_checksum_is_wrong_exactly_once() {
    let (server, shutdown) = start(config(OKX, 100.0)).await;
    let mut ws = subscribed(&server).await;
    let (snapshot, _) = next_book_frame(&mut ws, OKX).await;
    let (bids, asks) = frame_sides(OKX, &snapshot);
    let mut book = LocalBook::snapshot(bids, asks);
    let check = |book: &LocalBook, frame: &Value| {
        frame["data"][0]["checksum"].as_i64() == Some(book.okx_checksum())
    };
    assert!(check(&book, &snapshot));
    for _ in 0..5 {
        let (update, _) = next_book_frame(&mut ws, OKX).await;
        let (bids, asks) = frame_sides(OKX, &update);
        book.apply(bids, asks);
        assert!(check(&book, &update));
    }
    assert!(server.corrupt_next_checksum());
    let mut wrong = Vec::new();
    for _ in 0..40 {
        let (update, text) = next_book_frame(&mut ws, OKX).await;
        let (bids, asks) = frame_sides(OKX, &update);
        book.apply(bids, asks);
        if !check(&book, &update) {
            let seq = frame_id(OKX, &update);
            // Only the checksum is wrong: the levels and ids are the true ones.
            let truth: Value = serde_json::from_str(&server.frame("BTC-USDT", seq)).expect("JSON");
            assert_ne!(truth, update);
            assert_eq!(
                truth["data"][0]["checksum"].as_i64(),
                Some(book.okx_checksum())
            );
            let mut repaired = update.clone();
            repaired["data"][0]["checksum"] = truth["data"][0]["checksum"].clone();
            assert_eq!(repaired, truth, "{text}");
            assert_ne!(update["data"][0]["checksum"], 0, "0 reads as no checksum");
            wrong.push(seq);
        }
    }
    assert_eq!(wrong.len(), 1, "exactly one wrong checksum: {wrong:?}");
    drop(ws);
    // A corruption asked for while nobody listens goes to the next update,
    // never to a snapshot.
    assert!(server.corrupt_next_checksum());
    let mut ws = subscribed(&server).await;
    let (snapshot, _) = next_book_frame(&mut ws, OKX).await;
    let (bids, asks) = frame_sides(OKX, &snapshot);
    let mut book = LocalBook::snapshot(bids, asks);
    assert!(check(&book, &snapshot), "a snapshot is never corrupted");
    let mut checks = Vec::new();
    for _ in 0..5 {
        let (update, _) = next_book_frame(&mut ws, OKX).await;
        let (bids, asks) = frame_sides(OKX, &update);
        book.apply(bids, asks);
        checks.push(check(&book, &update));
    }
    assert_eq!(checks, [false, true, true, true, true]);
    drop(ws);
    // Shapes without checksums refuse.
    let (bybit, bybit_shutdown) = start(config(BYBIT, 10.0)).await;
    assert!(!bybit.corrupt_next_checksum());
    stop(bybit, bybit_shutdown).await;
    stop(server, shutdown).await;
}

#[tokio::test]
async fn unsubscribe_stops_a_book_and_subscribe_sends_a_new_snapshot_on_the_same_connection() {
    for shape in [BYBIT, OKX] {
        let (server, shutdown) = start(config(shape, 100.0)).await;
        let symbol = symbol(shape);
        let (subscribe, unsubscribe) = subscribe_texts(shape);
        let mut ws = subscribed(&server).await;
        let (snapshot, _) = next_book_frame(&mut ws, shape).await;
        assert!(is_snapshot(shape, &snapshot), "{shape}: a snapshot first");
        let mut last = frame_id(shape, &snapshot);
        for _ in 0..5 {
            let (update, _) = next_book_frame(&mut ws, shape).await;
            assert!(!is_snapshot(shape, &update), "{shape}: then updates");
            last = frame_id(shape, &update);
        }
        send(&mut ws, unsubscribe).await;
        // Updates sent before the unsubscribe was read may come first.
        let answer = loop {
            let frame = next_json(&mut ws).await;
            if !is_data(shape, &frame) {
                break frame;
            }
            assert!(!is_snapshot(shape, &frame), "{shape}");
            last = frame_id(shape, &frame);
        };
        match shape {
            BYBIT => assert_eq!(
                (&answer["success"], &answer["op"]),
                (&Value::from(true), &Value::from("unsubscribe"))
            ),
            _ => assert_eq!(answer["event"], "unsubscribe", "{answer}"),
        }
        // Nothing more for it (about 20 frames would be due meanwhile).
        let quiet = timeout(Duration::from_millis(300), ws.next()).await;
        assert!(quiet.is_err(), "{shape}: {quiet:?}");
        send(&mut ws, subscribe).await;
        let ack = next_answer(&mut ws, shape).await;
        assert!(
            ack["success"] == true || ack["event"] == "subscribe",
            "{ack}"
        );
        let (snapshot, _) = next_book_frame(&mut ws, shape).await;
        assert!(
            is_snapshot(shape, &snapshot),
            "{shape}: a new snapshot first"
        );
        let id = frame_id(shape, &snapshot);
        assert!(
            id > last,
            "{shape}: the new snapshot is newer: {id} after {last}"
        );
        let (bids, asks) = frame_sides(shape, &snapshot);
        assert_eq!((bids.clone(), asks.clone()), server.book_at(symbol, id));
        let mut book = LocalBook::snapshot(bids, asks);
        // And the updates continue it.
        let mut previous = id;
        for _ in 0..10 {
            let (update, _) = next_book_frame(&mut ws, shape).await;
            let next = frame_id(shape, &update);
            match shape {
                BYBIT => assert_eq!(next, previous + 1),
                _ => assert_eq!(update["data"][0]["prevSeqId"].as_u64(), Some(previous)),
            }
            previous = next;
            let (bids, asks) = frame_sides(shape, &update);
            book.apply(bids, asks);
            assert_eq!(book.sides(), server.book_at(symbol, next), "{shape}");
        }
        assert_eq!(server.connections_accepted(), 1, "{shape}: one connection");
        drop(ws);
        stop(server, shutdown).await;
    }
}

#[tokio::test]
async fn a_restart_starts_the_books_over_from_id_1_with_a_snapshot() {
    for shape in [BYBIT, OKX] {
        // Frame 0 (one update) is due 500 ms after the restart, frame 1 at
        // 2 s: a client that subscribes within 500 ms gets the snapshot at 1.
        let (server, shutdown) = start(config(shape, 2.0)).await;
        let symbol = symbol(shape);
        let mut old = subscribed(&server).await;
        let (snapshot, _) = next_book_frame(&mut old, shape).await;
        assert!(frame_id(shape, &snapshot) >= server.config().first_id);
        let restarted = Instant::now();
        assert_eq!(server.restart(), 1, "{shape}");
        assert_eq!(ending(&mut old).await, Ending::CloseFrame, "{shape}");
        let mut fresh = subscribed(&server).await;
        let subscribed_after = restarted.elapsed();
        let (snapshot, _) = next_book_frame(&mut fresh, shape).await;
        assert!(
            subscribed_after < Duration::from_millis(500),
            "{shape}: the test needs a subscribe within 500 ms, took {subscribed_after:?}"
        );
        assert!(is_snapshot(shape, &snapshot), "{shape}");
        assert_eq!(
            frame_id(shape, &snapshot),
            1,
            "{shape}: the ids start over at 1"
        );
        let (bids, asks) = frame_sides(shape, &snapshot);
        assert_eq!(
            (bids.clone(), asks.clone()),
            server.book_at(symbol, 1),
            "{shape}"
        );
        let mut book = LocalBook::snapshot(bids, asks);
        let (update, text) = next_book_frame(&mut fresh, shape).await;
        let next = frame_id(shape, &update);
        match shape {
            BYBIT => assert_eq!(next, 2, "{shape}: and continue from 1"),
            _ => assert_eq!(update["data"][0]["prevSeqId"], 1, "{shape}"),
        }
        assert_eq!(text, server.frame(symbol, next));
        let (bids, asks) = frame_sides(shape, &update);
        book.apply(bids, asks);
        assert_eq!(book.sides(), server.book_at(symbol, next), "{shape}");
        if shape == OKX {
            assert_eq!(
                update["data"][0]["checksum"].as_i64(),
                Some(book.okx_checksum())
            );
        }
        assert_eq!(server.head(symbol), next, "{shape}");
        drop(fresh);
        stop(server, shutdown).await;
    }
}

#[tokio::test]
async fn bybit_book_requests_are_checked_like_bybit_checks_them() {
    let (server, shutdown) = start(config(BYBIT, 5.0)).await;
    let mut ws = connect(&server.ws_url()).await;
    send(&mut ws, r#"{"op":"ping","req_id":"p"}"#).await;
    let pong = next_json(&mut ws).await;
    assert_eq!(
        (&pong["ret_msg"], &pong["req_id"]),
        (&Value::from("pong"), &Value::from("p"))
    );
    for (request, message) in [
        ("garbage", "error:request is not a JSON object with op"),
        (
            r#"{"op":"subscribe","args":["orderbook.200.BTCUSDT"]}"#,
            "error:only orderbook.50.<symbol> is modelled,topic:orderbook.200.BTCUSDT",
        ),
        (
            r#"{"op":"subscribe","args":["orderbook.50.btcusdt"]}"#,
            "Invalid symbol :[orderbook.50.btcusdt]",
        ),
        (
            r#"{"op":"subscribe","args":["publicTrade.BTCUSDT"]}"#,
            "error:handler not found,topic:publicTrade.BTCUSDT",
        ),
        (
            BYBIT_UNSUBSCRIBE,
            "error:not subscribed,topic:orderbook.50.BTCUSDT",
        ),
        (
            r#"{"op":"subscribe","args":[]}"#,
            "error:args size must be 1 to 10",
        ),
    ] {
        send(&mut ws, request).await;
        let answer = next_json(&mut ws).await;
        assert_eq!(
            (&answer["success"], answer["ret_msg"].as_str()),
            (&Value::from(false), Some(message)),
            "{request}"
        );
    }
    send(&mut ws, BYBIT_SUBSCRIBE).await;
    assert_eq!(next_answer(&mut ws, BYBIT).await["success"], true);
    send(&mut ws, BYBIT_SUBSCRIBE).await;
    let (again, _) = next_where(&mut ws, |v| !is_data(BYBIT, v)).await;
    assert_eq!(
        again["ret_msg"],
        "error:already subscribed,topic:orderbook.50.BTCUSDT"
    );
    drop(ws);
    stop(server, shutdown).await;
}

#[tokio::test]
async fn okx_book_requests_are_checked_like_okx_checks_them() {
    let (server, shutdown) = start(config(OKX, 5.0)).await;
    let mut ws = connect(&server.ws_url()).await;
    send(&mut ws, "ping").await;
    assert_eq!(next_text(&mut ws).await.as_deref(), Some("pong"));
    for (request, code) in [
        ("garbage", "60012"),
        (r#"{"op":"subscribe"}"#, "60012"),
        (
            r#"{"op":"subscribe","args":[{"channel":"books"}]}"#,
            "60012",
        ),
        (r#"{"op":"login","args":[]}"#, "60012"),
        (
            r#"{"op":"subscribe","args":[{"channel":"trades","instId":"BTC-USDT"}]}"#,
            "60018",
        ),
        (
            r#"{"op":"subscribe","args":[{"channel":"books","instId":"btc-usdt"}]}"#,
            "60018",
        ),
    ] {
        send(&mut ws, request).await;
        let text = next_text(&mut ws).await.expect("an answer");
        assert_key_order(&text, &["event", "code", "msg", "connId"]);
        let answer: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(
            (answer["event"].as_str(), answer["code"].as_str()),
            (Some("error"), Some(code)),
            "{request}: {text}"
        );
    }
    // A refused request is refused whole: the good arg is not followed.
    send(
        &mut ws,
        r#"{"op":"subscribe","args":[{"channel":"books","instId":"ETH-USDT"},{"channel":"books5","instId":"BTC-USDT"}]}"#,
    )
    .await;
    assert_eq!(next_answer(&mut ws, OKX).await["code"], "60018");
    // Several args: one event each, then a snapshot each.
    send(
        &mut ws,
        r#"{"op":"subscribe","args":[{"channel":"books","instId":"ETH-USDT"},{"channel":"books","instId":"BTC-USDT"}]}"#,
    )
    .await;
    for inst_id in ["ETH-USDT", "BTC-USDT"] {
        let event = next_answer(&mut ws, OKX).await;
        assert_eq!(
            (&event["event"], &event["arg"]["instId"]),
            (&Value::from("subscribe"), &Value::from(inst_id))
        );
    }
    let mut snapshots = Vec::new();
    while snapshots.len() < 2 {
        let (frame, _) = next_book_frame(&mut ws, OKX).await;
        let inst_id = frame["arg"]["instId"].as_str().expect("instId").to_owned();
        if is_snapshot(OKX, &frame) {
            assert!(!snapshots.contains(&inst_id), "{inst_id}: one snapshot");
            snapshots.push(inst_id);
        } else {
            assert!(
                snapshots.contains(&inst_id),
                "{inst_id}: an update before its snapshot"
            );
        }
    }
    drop(ws);
    stop(server, shutdown).await;
}
