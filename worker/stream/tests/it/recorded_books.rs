//! Real exchange sessions (`testdata/recordings/`, see its README) replayed
//! through `leasehold_stream::book`.
//!
//! Kraken v1 sends a checksum on every update: each one must verify, and a
//! level corrupted by hand must not. The Binance futures session has one
//! REST snapshot per symbol, each taken before the diffs applied to it, so
//! no later snapshot can be compared with a rebuilt book. What it does
//! allow: the diffs chain (`pu` = previous `u`) from the snapshot to the end;
//! where a diff ends exactly at `lastUpdateId`, applying it to the snapshot
//! changes nothing; and after every diff the rebuilt book's best bid and ask
//! are those of the latest `bookTicker` at or before that diff's `u` (the
//! ticker is pushed on every change of the top of the book, so none between
//! it and `u` means the top did not change).

use std::collections::{BTreeMap, HashMap};

use leasehold_stream::book::{
    Book, BookFormat, BookKeeper, ChecksumRule, KeeperOptions, SequenceRange, Side, Verdict,
};
use serde_json::Value;

fn recording(name: &str) -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/recordings/");
    std::fs::read_to_string(format!("{dir}{name}")).unwrap()
}

/// The received frames of a `.ws.` recording, in order: the first line is
/// the URL, lines starting with it are frames the client sent.
fn received_frames(text: &str) -> Vec<&str> {
    let mut lines = text.lines();
    let url = lines.next().unwrap().split(' ').next().unwrap();
    let received = lines.filter(|line| !line.is_empty() && !line.starts_with(url));
    received
        .map(|line| line.split_once(": ").unwrap().1)
        .collect()
}

fn kraken_keeper() -> BookKeeper {
    let options = KeeperOptions {
        depth: Some(1000),
        precision: None,
    };
    BookKeeper::new(BookFormat::KrakenV1, ChecksumRule::Kraken, options).unwrap()
}

#[test]
fn every_kraken_checksum_verifies_and_a_corrupted_level_does_not() {
    let text = recording("KRAKEN.ws.50.0");
    let frames = received_frames(&text);
    let with_checksum = frames.iter().filter(|f| f.contains(r#""c":""#)).count();
    let mut keepers: HashMap<String, BookKeeper> = HashMap::new();
    let (mut snapshots, mut verified, mut not_book, mut corrupted) = (0, 0, 0, None);
    for frame in frames {
        let value: Value = serde_json::from_str(frame).unwrap();
        // Array frames end with their pair; object frames are events.
        let Some(pair) = value.as_array().and_then(|a| a.last()?.as_str()) else {
            assert_eq!(
                kraken_keeper().on_frame(frame.as_bytes()),
                Ok(Verdict::NotBook)
            );
            not_book += 1;
            continue;
        };
        let keeper = keepers.entry(pair.to_owned()).or_insert_with(kraken_keeper);
        let before = keeper.clone();
        match keeper.on_frame(frame.as_bytes()) {
            Ok(Verdict::Snapshot) => snapshots += 1,
            Ok(Verdict::Applied) => verified += 1,
            other => panic!("{pair}: {other:?} on {frame}"),
        }
        // Once, on an update whose first level lands in the top 10 (a
        // corruption deeper would not touch the checksum): give that level
        // another quantity and replay the frame on the book before it.
        let message = BookFormat::KrakenV1
            .read_message(frame.as_bytes())
            .unwrap()
            .unwrap();
        let (bids, asks) = keeper.book().top(10);
        let changed = &message.changes[0];
        let top = if changed.side == Side::Bid {
            bids
        } else {
            asks
        };
        if corrupted.is_none() && verified > 100 && top.iter().any(|l| l.price == changed.price) {
            let (price, qty) = (changed.price.as_str(), changed.qty.as_str());
            let other = if qty == "1.00000000" {
                "2.00000000"
            } else {
                "1.00000000"
            };
            let level = format!(r#"["{price}","{qty}""#);
            assert_eq!(frame.matches(&level).count(), 1);
            let body = frame.replace(&level, &format!(r#"["{price}","{other}""#));
            corrupted = Some((before.clone().on_frame(body.as_bytes()), message.checksum));
        }
    }
    assert_eq!(
        (keepers.len(), snapshots),
        (10, 10),
        "ten pairs, a snapshot each"
    );
    assert_eq!(
        verified, with_checksum,
        "every update carries a checksum; each verified"
    );
    assert_eq!(verified, 4269);
    assert_eq!(not_book, 42, "status, subscription and heartbeat frames");
    let (verdict, sent) = corrupted.unwrap();
    let Ok(Verdict::ChecksumMismatch { expected, computed }) = verdict else {
        panic!("the corrupted frame gave {verdict:?}");
    };
    assert_eq!(Some(expected), sent);
    assert_ne!(computed, expected);
}

/// A bookTicker's best bid and ask: (price, quantity, price, quantity).
type Top = (String, String, String, String);

fn range(body: &str) -> SequenceRange {
    BookFormat::Binance
        .sequence_range(body.as_bytes())
        .unwrap()
        .unwrap()
}

#[test]
fn binance_futures_book_rebuilt_from_its_snapshot_follows_the_ticker() {
    const F: BookFormat = BookFormat::Binance;
    let http = recording("BINANCE_FUTURES.http.0.0");
    let snapshots: BTreeMap<&str, &str> = (http.lines().filter(|l| !l.is_empty()))
        .map(|line| {
            let (url, rest) = line.split_once(" -> ").unwrap();
            let symbol = url.split(['=', '&']).nth(1).unwrap();
            (symbol, rest.split_once(": ").unwrap().1)
        })
        .collect();
    assert_eq!(snapshots.len(), 4, "one snapshot a symbol, none later");

    let ws = recording("BINANCE_FUTURES.ws.1.0");
    let mut diffs: HashMap<String, Vec<(SequenceRange, &str)>> = HashMap::new();
    let mut tickers: HashMap<String, BTreeMap<u64, Top>> = HashMap::new();
    for frame in received_frames(&ws) {
        let value: Value = serde_json::from_str(frame).unwrap();
        let data = &value["data"];
        let symbol = data["s"].as_str().unwrap().to_owned();
        let text = |key: &str| data[key].as_str().unwrap().to_owned();
        match data["e"].as_str().unwrap() {
            "depthUpdate" => diffs.entry(symbol).or_default().push((range(frame), frame)),
            "bookTicker" => {
                let top = (text("b"), text("B"), text("a"), text("A"));
                tickers
                    .entry(symbol)
                    .or_default()
                    .insert(data["u"].as_u64().unwrap(), top);
            }
            _ => assert_eq!(F.read_message(frame.as_bytes()), Ok(None)),
        }
    }

    let (mut compared, mut ending_at_snapshot) = (0, 0);
    for (&symbol, &snapshot) in &snapshots {
        let last_update_id = range(snapshot).last;
        let all = &diffs[symbol];
        // The snapshot holds 1000 levels at most; deeper ones are unknown.
        if let Some((_, at)) = all.iter().find(|(r, _)| r.last == last_update_id) {
            let alone = Book::rebuild(F, Some(1000), snapshot.as_bytes(), [""; 0]).unwrap();
            let with_it = Book::rebuild(F, Some(1000), snapshot.as_bytes(), [at]).unwrap();
            assert_eq!(
                with_it, alone,
                "{symbol}: the snapshot is not the book at its id"
            );
            ending_at_snapshot += 1;
        }

        let kept: Vec<_> = all
            .iter()
            .filter(|(r, _)| r.last > last_update_id)
            .collect();
        let first = kept[0].0;
        let covers_next = first.first <= last_update_id + 1 && last_update_id < first.last;
        assert!(
            covers_next || first.prev == Some(last_update_id),
            "{symbol}: first diff"
        );
        for pair in kept.windows(2) {
            assert_eq!(
                pair[1].0.prev,
                Some(pair[0].0.last),
                "{symbol}: a diff is missing"
            );
        }

        let mut keeper = BookKeeper::new(F, ChecksumRule::None, KeeperOptions::default()).unwrap();
        assert_eq!(keeper.on_frame(snapshot.as_bytes()), Ok(Verdict::Snapshot));
        for (range, body) in &kept {
            assert_eq!(keeper.on_frame(body.as_bytes()), Ok(Verdict::Applied));
            let (bid, ask) = (
                keeper.book().best_bid().unwrap(),
                keeper.book().best_ask().unwrap(),
            );
            assert!(
                bid.price < ask.price,
                "{symbol}: crossed after u={}",
                range.last
            );
            let Some((_, ticker)) = tickers[symbol].range(..=range.last).next_back() else {
                continue;
            };
            let top = (
                bid.price.to_string(),
                bid.qty.to_string(),
                ask.price.to_string(),
                ask.qty.to_string(),
            );
            assert_eq!(&top, ticker, "{symbol}: top of book after u={}", range.last);
            compared += 1;
        }
        let stored = kept.iter().map(|(_, body)| body);
        let rebuilt = Book::rebuild(F, None, snapshot.as_bytes(), stored).unwrap();
        assert_eq!(
            &rebuilt,
            keeper.book(),
            "{symbol}: readers rebuild the worker's book"
        );
    }
    assert_eq!(
        ending_at_snapshot, 3,
        "AKRO, CTK and KEEP have a diff ending at their id"
    );
    assert_eq!(compared, 743, "diffs whose top of book a ticker confirms");
}
