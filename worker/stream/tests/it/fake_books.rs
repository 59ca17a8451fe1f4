//! The fake exchange's Coinbase `level2` and Kraken v2 `book`
//! (`leasehold_feed::exchange`) read through `leasehold_stream::book` as the
//! worker reads them: every frame parses with `BookFormat::Coinbase` or
//! `BookFormat::KrakenV2` (acknowledgements, status and heartbeats as no book
//! at all), every Kraken checksum verifies with `ChecksumRule::Kraken` at the
//! worked settings' depth and precision, a corrupted one does not, and the
//! book kept is the exchange's (`ExchangeServer::book_at`) after every frame.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use leasehold_feed::exchange::{ExchangeConfig, ExchangeServer, ExchangeShape};
use leasehold_stream::book::{
    BookFormat, BookKeeper, ChecksumRule, KeeperOptions, Level, MessageKind, Precision, Verdict,
};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;

type Client = WebSocketStream<MaybeTlsStream<TcpStream>>;
type Side = Vec<(String, String)>;

/// Generous: only a broken server takes this long.
const WAIT: Duration = Duration::from_secs(10);

async fn start(shape: ExchangeShape) -> (ExchangeServer, CancellationToken) {
    let shutdown = CancellationToken::new();
    let config = ExchangeConfig {
        shape,
        rate: 100.0,
        ..ExchangeConfig::default()
    };
    let server = ExchangeServer::start(([127, 0, 0, 1], 0).into(), config, shutdown.clone())
        .await
        .unwrap();
    (server, shutdown)
}

/// The worked settings, by name.
fn settings(server: &ExchangeServer) -> HashMap<&'static str, String> {
    server.worked_settings().into_iter().collect()
}

/// Connects and subscribes with the worked settings, as the worker does.
async fn subscribed(settings: &HashMap<&str, String>, stream_id: &str) -> Client {
    let url = settings["UPSTREAM_URL"].replace("{stream_id}", stream_id);
    let (mut ws, _) = timeout(WAIT, tokio_tungstenite::connect_async(url))
        .await
        .unwrap()
        .unwrap();
    send(&mut ws, &settings["UPSTREAM_SUBSCRIBE"], stream_id).await;
    ws
}

async fn send(ws: &mut Client, template: &str, stream_id: &str) {
    let text = template.replace("{stream_id}", stream_id);
    ws.send(Message::text(text)).await.unwrap();
}

async fn next_text(ws: &mut Client) -> String {
    loop {
        match timeout(WAIT, ws.next()).await.unwrap() {
            Some(Ok(Message::Text(text))) => return text.to_string(),
            Some(Ok(_)) => {}
            other => panic!("the connection ended: {other:?}"),
        }
    }
}

fn ours(levels: Vec<Level>) -> Side {
    levels
        .into_iter()
        .map(|l| (l.price.as_str().to_owned(), l.qty.as_str().to_owned()))
        .collect()
}

/// The best `depth` levels of the exchange's book after `id`.
fn exchange_top(server: &ExchangeServer, symbol: &str, id: u64, depth: usize) -> (Side, Side) {
    let (mut bids, mut asks) = server.book_at(symbol, id);
    bids.truncate(depth);
    asks.truncate(depth);
    (bids, asks)
}

/// The fake's number of the frame received as `text`, the first after
/// `after` (`normalise` turns the fake's frame into what was received).
fn frame_id(
    server: &ExchangeServer,
    symbol: &str,
    text: &str,
    after: u64,
    normalise: impl Fn(String) -> String,
) -> u64 {
    (after + 1..=server.head(symbol))
        .find(|&id| normalise(server.frame(symbol, id)) == text)
        .unwrap_or_else(|| panic!("no frame after {after} is {text}"))
}

#[tokio::test]
async fn coinbase_level2_reads_as_coinbase_books_numbered_by_sequence_num() {
    let (server, shutdown) = start(ExchangeShape::CoinbaseLevel2).await;
    let settings = settings(&server);
    let product = "BTC-USD";
    let mut ws = subscribed(&settings, product).await;
    let ack = next_text(&mut ws).await;
    assert_eq!(BookFormat::Coinbase.read_message(ack.as_bytes()), Ok(None));
    assert_eq!(BookFormat::detect(ack.as_bytes()), None);
    let mut keeper = BookKeeper::new(
        BookFormat::Coinbase,
        ChecksumRule::None,
        KeeperOptions::default(),
    )
    .unwrap();
    let snapshot = next_text(&mut ws).await;
    assert_eq!(
        BookFormat::detect(snapshot.as_bytes()),
        Some(BookFormat::Coinbase)
    );
    let message = BookFormat::Coinbase
        .read_message(snapshot.as_bytes())
        .unwrap()
        .unwrap();
    assert_eq!(message.kind, MessageKind::Snapshot);
    assert_eq!(message.instrument.as_deref(), Some(product));
    assert_eq!(
        message.sequence.map(|s| s.last),
        Some(1),
        "after the ack's 0"
    );
    assert_eq!(keeper.on_frame(snapshot.as_bytes()), Ok(Verdict::Snapshot));
    let mut at_snapshot = Some(ours_book(&keeper));
    let mut id = server.config().first_id - 1;
    for number in 2..100 {
        let text = next_text(&mut ws).await;
        let range = BookFormat::Coinbase
            .sequence_range(text.as_bytes())
            .unwrap();
        assert_eq!(
            range.map(|r| r.last),
            Some(number),
            "contiguous per connection"
        );
        assert_eq!(keeper.on_frame(text.as_bytes()), Ok(Verdict::Applied));
        let numbered = |frame: String| {
            frame.replacen(
                "\"sequence_num\":0,",
                &format!("\"sequence_num\":{number},"),
                1,
            )
        };
        let next = frame_id(&server, product, &text, id, numbered);
        if let Some(book) = at_snapshot.take() {
            assert_eq!(book, server.book_at(product, next - 1), "the snapshot");
        } else {
            assert_eq!(next, id + 1);
        }
        id = next;
        assert_eq!(
            ours_book(&keeper),
            server.book_at(product, id),
            "after {id}"
        );
    }
    drop(ws);
    shutdown.cancel();
    server.finished().await;
}

fn ours_book(keeper: &BookKeeper) -> (Side, Side) {
    let (bids, asks) = keeper.book().top(usize::MAX);
    (ours(bids), ours(asks))
}

/// The keeper the worked settings make: depth and precision from
/// `UPSTREAM_BOOK_DEPTH` and `UPSTREAM_BOOK_PRECISION`.
fn kraken_keeper(settings: &HashMap<&str, String>) -> (BookKeeper, usize) {
    assert_eq!(settings["UPSTREAM_BOOK_CHECKSUM"], "kraken");
    let depth: usize = settings["UPSTREAM_BOOK_DEPTH"].parse().unwrap();
    let (price, qty) = settings["UPSTREAM_BOOK_PRECISION"].split_once(',').unwrap();
    let options = KeeperOptions {
        depth: Some(depth),
        precision: Some(Precision {
            price_decimals: price.parse().unwrap(),
            qty_decimals: qty.parse().unwrap(),
        }),
    };
    let keeper = BookKeeper::new(BookFormat::KrakenV2, ChecksumRule::Kraken, options).unwrap();
    (keeper, depth)
}

#[tokio::test]
async fn every_kraken_book_checksum_verifies_at_the_worked_depth_and_precision() {
    let (server, shutdown) = start(ExchangeShape::KrakenBook).await;
    let settings = settings(&server);
    let symbol = "BTC/USD";
    let (mut keeper, depth) = kraken_keeper(&settings);
    let mut ws = subscribed(&settings, symbol).await;
    // status and the acknowledgement are no book.
    for _ in 0..2 {
        let text = next_text(&mut ws).await;
        assert_eq!(
            keeper.on_frame(text.as_bytes()),
            Ok(Verdict::NotBook),
            "{text}"
        );
    }
    let snapshot = next_text(&mut ws).await;
    assert_eq!(
        BookFormat::detect(snapshot.as_bytes()),
        Some(BookFormat::KrakenV2)
    );
    let message = BookFormat::KrakenV2
        .read_message(snapshot.as_bytes())
        .unwrap()
        .unwrap();
    assert_eq!(message.sequence, None, "Kraken v2 has no sequence");
    assert!(
        message.checksum.is_some(),
        "the snapshot has a checksum too"
    );
    assert_eq!(keeper.on_frame(snapshot.as_bytes()), Ok(Verdict::Snapshot));
    let mut at_snapshot = Some(ours_book(&keeper));
    let mut id = server.config().first_id - 1;
    let mut updates = 0;
    while updates < 100 {
        let text = next_text(&mut ws).await;
        if text == r#"{"channel":"heartbeat"}"# {
            assert_eq!(keeper.on_frame(text.as_bytes()), Ok(Verdict::NotBook));
            continue;
        }
        assert_eq!(
            keeper.on_frame(text.as_bytes()),
            Ok(Verdict::Applied),
            "{text}"
        );
        let next = frame_id(&server, symbol, &text, id, |frame| frame);
        if let Some(book) = at_snapshot.take() {
            assert_eq!(book, exchange_top(&server, symbol, next - 1, depth));
        }
        id = next;
        assert_eq!(ours_book(&keeper), exchange_top(&server, symbol, id, depth));
        updates += 1;
    }
    // One corrupted checksum: a mismatch on that update only.
    assert!(server.corrupt_next_checksum());
    let text = next_text(&mut ws).await;
    assert!(matches!(
        keeper.on_frame(text.as_bytes()),
        Ok(Verdict::ChecksumMismatch { .. })
    ));
    // The book itself is right: the next update verifies again.
    let text = next_text(&mut ws).await;
    assert_eq!(keeper.on_frame(text.as_bytes()), Ok(Verdict::Applied));
    // A new book on the connection, as the worker asks after a mismatch.
    keeper.reset();
    send(&mut ws, &settings["UPSTREAM_UNSUBSCRIBE"], symbol).await;
    send(&mut ws, &settings["UPSTREAM_SUBSCRIBE"], symbol).await;
    let mut verdicts = Vec::new();
    while verdicts.len() < 20 {
        let text = next_text(&mut ws).await;
        match keeper.on_frame(text.as_bytes()) {
            // Updates sent before the unsubscribe was read.
            Err(_) if verdicts.is_empty() => {}
            Ok(Verdict::NotBook) => {}
            verdict => verdicts.push(verdict),
        }
    }
    assert_eq!(verdicts[0], Ok(Verdict::Snapshot));
    assert!(
        verdicts[1..].iter().all(|v| *v == Ok(Verdict::Applied)),
        "{verdicts:?}"
    );
    drop(ws);
    shutdown.cancel();
    server.finished().await;
}
