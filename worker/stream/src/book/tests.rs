//! Bodies here are the exchanges' documentation examples, trimmed.

use super::checksum::at_decimals;
use super::format::plain_decimal;
use super::*;

fn d(text: &str) -> Decimal {
    Decimal::parse(text).unwrap()
}

fn keeper(format: BookFormat, rule: ChecksumRule, options: KeeperOptions) -> BookKeeper {
    BookKeeper::new(format, rule, options).unwrap()
}

fn plain(format: BookFormat) -> BookKeeper {
    keeper(format, ChecksumRule::None, KeeperOptions::default())
}

fn feed(keeper: &mut BookKeeper, body: &str) -> Result<Verdict, BookError> {
    keeper.on_frame(body.as_bytes())
}

/// Best bid and best ask, price and quantity as kept.
fn best(book: &Book) -> [String; 4] {
    let (bid, ask) = (book.best_bid().unwrap(), book.best_ask().unwrap());
    [bid.price, bid.qty, ask.price, ask.qty].map(|x| x.to_string())
}

fn seq(format: BookFormat, body: &str) -> SequenceRange {
    format.sequence_range(body.as_bytes()).unwrap().unwrap()
}

#[test]
fn decimals_order_by_value_whatever_the_spelling() {
    assert_eq!(d("1.50"), d("01.5"));
    assert_eq!(d("10"), d("0010.000"));
    let mut sorted = [
        "100",
        "0.0001",
        "99.99",
        "0",
        "100.000001",
        "7",
        "9",
        "0.05",
        "0.5",
    ];
    sorted.sort_by_key(|x| d(x));
    let expected = [
        "0",
        "0.0001",
        "0.05",
        "0.5",
        "7",
        "9",
        "99.99",
        "100",
        "100.000001",
    ];
    assert_eq!(sorted, expected);
    assert!(d("0.1") < d("0.12") && d("1.999") < d("2") && d(".5") < d("5."));
    for bad in ["", ".", "-1", "1e5", "1.2.3", "abc", " 1", "+1"] {
        assert!(Decimal::parse(bad).is_none(), "{bad:?} accepted");
    }
}

#[test]
fn zero_in_any_spelling_removes_a_level_and_the_last_spelling_stays() {
    for zero in ["0", "0.00000000", "000.0", ".0"] {
        let mut book = Book::new();
        book.set(Side::Bid, d("1.5"), d("2"));
        book.set(Side::Bid, d("1.50"), d(zero));
        assert!(book.is_empty(), "{zero} left the level");
    }
    let mut book = Book::new();
    book.set(Side::Ask, d("0.0500"), d("1"));
    book.set(Side::Ask, d("0.05000"), d("0.00000001"));
    assert_eq!(book.asks().len(), 1);
    let (price, qty) = book.asks().next().unwrap();
    assert_eq!((price.as_str(), qty.as_str()), ("0.05000", "0.00000001"));
}

#[test]
fn depth_drops_the_worst_levels_and_top_reads_best_first() {
    let body = r#"{"lastUpdateId":1,"bids":[["3","1"],["1","1"],["2","1"]],"asks":[["13","1"],["11","1"],["12","1"]]}"#;
    let book = Book::rebuild(BookFormat::Binance, Some(2), body.as_bytes(), [""; 0]).unwrap();
    let (bids, asks) = book.top(5);
    let prices = [bids, asks].map(|side| {
        side.into_iter()
            .map(|l| l.price.to_string())
            .collect::<Vec<_>>()
    });
    assert_eq!(prices, [["3", "2"], ["11", "12"]]);
}

#[test]
fn enums_round_trip_their_setting_values() {
    for format in BookFormat::ALL {
        assert_eq!(BookFormat::parse(format.as_str()), Some(format));
    }
    for rule in ChecksumRule::ALL {
        assert_eq!(ChecksumRule::parse(rule.as_str()), Some(rule));
    }
    assert_eq!(
        (BookFormat::parse("kraken"), ChecksumRule::parse("crc32")),
        (None, None)
    );
}

const BINANCE_SNAPSHOT: &str = r#"{"lastUpdateId":1027024,"bids":[["4.00000000","431.00000000"]],"asks":[["4.00000200","12.00000000"]]}"#;
const BINANCE_DIFF: &str = r#"{"e":"depthUpdate","E":1571889248277,"T":1571889248276,"s":"BTCUSDT","U":1027024,"u":1027030,"pu":1027023,"b":[["4.00000000","0"],["3.9","10"]],"a":[["4.00000200","15.5"]]}"#;

#[test]
fn binance_snapshot_and_diff_bare_or_in_an_envelope() {
    let mut keeper = plain(BookFormat::Binance);
    assert_eq!(feed(&mut keeper, BINANCE_SNAPSHOT), Ok(Verdict::Snapshot));
    let wrapped = format!(r#"{{"stream":"btcusdt@depth@100ms","data":{BINANCE_DIFF}}}"#);
    assert_eq!(feed(&mut keeper, &wrapped), Ok(Verdict::Applied));
    assert_eq!(best(keeper.book()), ["3.9", "10", "4.00000200", "15.5"]);
    let bare = Book::rebuild(
        BookFormat::Binance,
        None,
        BINANCE_SNAPSHOT.as_bytes(),
        [BINANCE_DIFF],
    );
    assert_eq!(bare.as_ref(), Ok(keeper.book()));
    let diff = SequenceRange {
        first: 1027024,
        last: 1027030,
        prev: Some(1027023),
    };
    assert_eq!(seq(BookFormat::Binance, BINANCE_DIFF), diff);
    assert_eq!(seq(BookFormat::Binance, BINANCE_SNAPSHOT).last, 1027024);
    let trade =
        r#"{"stream":"btcusdt@aggTrade","data":{"e":"aggTrade","s":"BTCUSDT","p":"0.001"}}"#;
    assert_eq!(feed(&mut keeper, trade), Ok(Verdict::NotBook));
}

#[test]
fn bybit_snapshot_and_delta() {
    let snapshot = r#"{"topic":"orderbook.50.BTCUSDT","type":"snapshot","ts":1672304484978,"data":{"s":"BTCUSDT","b":[["16493.50","0.006"],["16493.00","0.100"]],"a":[["16611.00","0.029"],["16612.00","0.213"]],"u":18521288,"seq":7961638724},"cts":1672304484976}"#;
    let delta = r#"{"topic":"orderbook.50.BTCUSDT","type":"delta","ts":1687940967466,"data":{"s":"BTCUSDT","b":[["16493.50","0"]],"a":[["16610.50","1.5"]],"u":18521289,"seq":7961638800},"cts":1687940967464}"#;
    let mut keeper = plain(BookFormat::Bybit);
    assert_eq!(feed(&mut keeper, snapshot), Ok(Verdict::Snapshot));
    assert_eq!(feed(&mut keeper, delta), Ok(Verdict::Applied));
    assert_eq!(
        best(keeper.book()),
        ["16493.00", "0.100", "16610.50", "1.5"]
    );
    let message = BookFormat::Bybit
        .read_message(delta.as_bytes())
        .unwrap()
        .unwrap();
    assert_eq!(message.instrument.as_deref(), Some("BTCUSDT"));
    assert_eq!(seq(BookFormat::Bybit, delta).last, 18521289);
    let ack = r#"{"success":true,"ret_msg":"","conn_id":"x","op":"subscribe"}"#;
    assert_eq!(feed(&mut keeper, ack), Ok(Verdict::NotBook));
}

#[test]
fn coinbase_snapshot_and_update() {
    let snapshot = r#"{"channel":"l2_data","client_id":"","timestamp":"2023-02-09T20:32:50.714964855Z","sequence_num":0,"events":[{"type":"snapshot","product_id":"BTC-USD","updates":[{"side":"bid","event_time":"1970-01-01T00:00:00Z","price_level":"21921.73","new_quantity":"0.06317902"},{"side":"bid","event_time":"1970-01-01T00:00:00Z","price_level":"21921.3","new_quantity":"0.02"},{"side":"offer","event_time":"1970-01-01T00:00:00Z","price_level":"21921.74","new_quantity":"1.5"}]}]}"#;
    let update = r#"{"channel":"l2_data","client_id":"","timestamp":"2023-02-09T20:32:51Z","sequence_num":1,"events":[{"type":"update","product_id":"BTC-USD","updates":[{"side":"bid","event_time":"2023-02-09T20:32:50Z","price_level":"21921.73","new_quantity":"0"}]}]}"#;
    let mut keeper = plain(BookFormat::Coinbase);
    assert_eq!(feed(&mut keeper, snapshot), Ok(Verdict::Snapshot));
    assert_eq!(feed(&mut keeper, update), Ok(Verdict::Applied));
    assert_eq!(best(keeper.book()), ["21921.3", "0.02", "21921.74", "1.5"]);
    assert_eq!(seq(BookFormat::Coinbase, update).last, 1);
    let eth = r#"}]},{"type":"update","product_id":"ETH-USD","updates":[]}]}"#;
    let mixed = update.replace(r#"}]}]}"#, eth);
    assert_eq!(feed(&mut keeper, &mixed), Err(BookError::MixedInstruments));
    let heartbeat = r#"{"channel":"heartbeats","client_id":"","timestamp":"2023-06-23T20:31:26Z","sequence_num":0,"events":[{"current_time":"2023-06-23","heartbeat_counter":3049}]}"#;
    assert_eq!(feed(&mut keeper, heartbeat), Ok(Verdict::NotBook));
}

/// Kraken's v1 checksum guide: this book state has checksum 974947235.
fn kraken_v1_doc_snapshot() -> String {
    let side = |prices: &str| {
        let level = |p| format!(r#"["0.0{p}","0.00000500","1582905487.439814"]"#);
        prices.split(' ').map(level).collect::<Vec<_>>().join(",")
    };
    let asks = side("5005 5010 5015 5020 5025 5030 5035 5040 5045 5050");
    let bids = side("5000 4995 4990 4980 4975 4970 4965 4960 4955 4950");
    format!(r#"[0,{{"as":[{asks}],"bs":[{bids}]}},"book-10","BTC/USD"]"#)
}

/// The guide's update: every level lands beyond the top 10, so the
/// checksum stays the guide's.
const KRAKEN_V1_DOC_UPDATE: &str = r#"[0,{"a":[["0.05120","0.00000500","1582905486.493008"],["0.05275","0.00000500","1582905486.493034"]]},{"b":[["0.04765","0.00000500","1582905486.493008"],["0.04940","0.00000500","1582905486.493034"]],"c":"974947235"},"book-10","BTC/USD"]"#;

#[test]
fn kraken_v1_checksum_matches_the_documented_example() {
    let options = KeeperOptions {
        depth: Some(10),
        precision: None,
    };
    let mut keeper = keeper(BookFormat::KrakenV1, ChecksumRule::Kraken, options);
    assert_eq!(
        feed(&mut keeper, &kraken_v1_doc_snapshot()),
        Ok(Verdict::Snapshot)
    );
    assert_eq!(
        ChecksumRule::Kraken.compute(keeper.book(), None),
        Some(974947235)
    );
    assert_eq!(
        feed(&mut keeper, KRAKEN_V1_DOC_UPDATE),
        Ok(Verdict::Applied)
    );
    assert_eq!(keeper.book().asks().len(), 10, "cut back to the depth");
    assert_eq!(
        feed(&mut keeper, r#"{"event":"heartbeat"}"#),
        Ok(Verdict::NotBook)
    );
    let trade = r#"[0,[["5541.2","0.15","1534614057.3","s","l",""]],"trade","XBT/USD"]"#;
    assert_eq!(feed(&mut keeper, trade), Ok(Verdict::NotBook));
    // The best ask's quantity changes but the checksum is the old one.
    let stale = r#"[0,{"a":[["0.05005","0.00000501","1582905487.5"]],"c":"974947235"},"book-10","BTC/USD"]"#;
    let Ok(Verdict::ChecksumMismatch { expected, computed }) = feed(&mut keeper, stale) else {
        panic!("a stale checksum was accepted");
    };
    assert_eq!(expected, 974947235);
    assert_ne!(computed, expected);
}

/// Kraken's v2 checksum guide: BTC/USD at 1 price and 8 quantity decimals,
/// checksum 3310070434. The numbers are written as a JSON encoder writes
/// floats (`45281.0` → `45281`, `0.10000000` → `0.1`), so only the
/// precision puts back the digits the checksum counts.
const KRAKEN_V2_DOC_SNAPSHOT: &str = r#"{"channel":"book","type":"snapshot","data":[{"symbol":"BTC/USD","bids":[{"price":45283.5,"qty":0.1},{"price":45283.4,"qty":1.54582015},{"price":45282.1,"qty":0.1},{"price":45281,"qty":0.1},{"price":45280.3,"qty":1.54592586},{"price":45279,"qty":0.0799},{"price":45277.6,"qty":0.03310103},{"price":45277.5,"qty":0.3},{"price":45277.3,"qty":1.54602737},{"price":45276.6,"qty":0.15445238}],"asks":[{"price":45285.2,"qty":1e-3},{"price":45286.4,"qty":1.54571953},{"price":45286.6,"qty":1.54571109},{"price":45289.6,"qty":1.54560911},{"price":45290.2,"qty":0.1589066},{"price":45291.8,"qty":1.54553491},{"price":45294.7,"qty":0.04454749},{"price":45296.1,"qty":0.3538},{"price":45297.5,"qty":0.09945542},{"price":45299.5,"qty":0.18772827}],"checksum":3310070434}]}"#;

#[test]
fn kraken_v2_checksum_matches_the_documented_example_at_the_pairs_precision() {
    let precision = Some(Precision {
        price_decimals: 1,
        qty_decimals: 8,
    });
    let mut keeper = keeper(
        BookFormat::KrakenV2,
        ChecksumRule::Kraken,
        KeeperOptions {
            depth: Some(10),
            precision,
        },
    );
    assert_eq!(
        feed(&mut keeper, KRAKEN_V2_DOC_SNAPSHOT),
        Ok(Verdict::Snapshot)
    );
    assert_eq!(
        best(keeper.book()),
        ["45283.5", "0.1", "45285.2", "0.001"],
        "as sent"
    );
    assert_ne!(
        ChecksumRule::Kraken.compute(keeper.book(), None),
        Some(3310070434)
    );
    let update = r#"{"channel":"book","type":"update","data":[{"symbol":"BTC/USD","bids":[{"price":45283.5,"qty":0}],"asks":[],"checksum":3310070434,"timestamp":"2023-10-06T17:35:55.440295Z"}]}"#;
    let verdict = feed(&mut keeper, update);
    assert!(matches!(
        verdict,
        Ok(Verdict::ChecksumMismatch {
            expected: 3310070434,
            ..
        })
    ));
    assert_eq!(best(keeper.book())[0], "45283.4");
    assert_eq!(
        feed(&mut keeper, r#"{"channel":"heartbeat"}"#),
        Ok(Verdict::NotBook)
    );
    let without = BookKeeper::new(
        BookFormat::KrakenV2,
        ChecksumRule::Kraken,
        KeeperOptions::default(),
    );
    assert_eq!(without.err(), Some(BookError::PrecisionRequired));
}

#[test]
fn number_text_becomes_plain_decimals_and_takes_the_pairs_places() {
    let plain =
        ["45283.5", "1e-05", "1.5E+3", "12.345e1", r#""0.10""#].map(|t| plain_decimal(t).unwrap());
    assert_eq!(plain, ["45283.5", "0.00001", "1500", "123.45", "0.10"]);
    assert_eq!(plain_decimal("1e999"), None);
    let fixed =
        [("45281", 1), ("0.1", 8), ("5.000", 0), ("0.123", 2)].map(|(t, n)| at_decimals(t, n));
    assert_eq!(fixed, ["45281.0", "0.10000000", "5", "0.123"]);
}

/// OKX's checksum examples: two levels a side give
/// `3366.1:7:3366.8:9:3366:6:3368:8` → -1881014294; one bid and three asks
/// give `3366.1:7:3366.8:9:3368:8:3372:8` → 831078360.
const OKX_SNAPSHOT: &str = r#"{"arg":{"channel":"books","instId":"BTC-USDT"},"action":"snapshot","data":[{"asks":[["3366.8","9","10","3"],["3368","8","3","4"]],"bids":[["3366.1","7","0","3"],["3366","6","3","4"]],"ts":"1597026383085","checksum":-1881014294,"prevSeqId":-1,"seqId":123456}]}"#;
const OKX_UPDATE: &str = r#"{"arg":{"channel":"books","instId":"BTC-USDT"},"action":"update","data":[{"asks":[["3372","8","3","4"]],"bids":[["3366","0","0","0"]],"ts":"1597026383086","checksum":831078360,"prevSeqId":123456,"seqId":123457}]}"#;

#[test]
fn okx_checksums_match_the_documented_examples() {
    let mut keeper = keeper(BookFormat::Okx, ChecksumRule::Okx, KeeperOptions::default());
    assert_eq!(feed(&mut keeper, OKX_SNAPSHOT), Ok(Verdict::Snapshot));
    assert_eq!(feed(&mut keeper, OKX_UPDATE), Ok(Verdict::Applied));
    let update = SequenceRange {
        first: 123457,
        last: 123457,
        prev: Some(123456),
    };
    assert_eq!(seq(BookFormat::Okx, OKX_UPDATE), update);
    assert_eq!(seq(BookFormat::Okx, OKX_SNAPSHOT).prev, None);
    let changed = OKX_UPDATE.replace(r#""3372","8""#, r#""3372","9""#);
    let Ok(Verdict::ChecksumMismatch { expected, computed }) = feed(&mut keeper, &changed) else {
        panic!("a wrong checksum was accepted");
    };
    assert_eq!(
        (expected, Some(computed)),
        (831078360, ChecksumRule::Okx.compute(keeper.book(), None))
    );
    // Since OKX's deprecation a zero stands where the checksum was.
    assert_eq!(
        feed(&mut keeper, &changed.replace("831078360", "0")),
        Ok(Verdict::Applied)
    );
    let ack = r#"{"event":"subscribe","arg":{"channel":"books","instId":"BTC-USDT"},"connId":"a4d3ae55"}"#;
    assert_eq!(feed(&mut keeper, ack), Ok(Verdict::NotBook));
}

#[test]
fn detect_names_each_format_and_nothing_else() {
    let bybit = r#"{"topic":"orderbook.1.BTCUSDT","type":"snapshot","data":{"s":"BTCUSDT","u":1}}"#;
    let coinbase = r#"{"channel":"l2_data","sequence_num":4,"events":[{"type":"update","product_id":"BTC-USD","updates":[]}]}"#;
    let kraken_v1 = kraken_v1_doc_snapshot();
    let cases = [
        (BINANCE_SNAPSHOT, Some(BookFormat::Binance)),
        (BINANCE_DIFF, Some(BookFormat::Binance)),
        (bybit, Some(BookFormat::Bybit)),
        (coinbase, Some(BookFormat::Coinbase)),
        (&kraken_v1, Some(BookFormat::KrakenV1)),
        (KRAKEN_V2_DOC_SNAPSHOT, Some(BookFormat::KrakenV2)),
        (OKX_UPDATE, Some(BookFormat::Okx)),
        (r#"{"event":"heartbeat"}"#, None),
        (r#"{"channel":"heartbeat"}"#, None),
        ("[1,2]", None),
        ("not json", None),
    ];
    for (body, format) in cases {
        assert_eq!(BookFormat::detect(body.as_bytes()), format, "{body}");
    }
}

#[test]
fn a_keeper_needs_a_snapshot_before_diffs_and_after_a_reset() {
    let mut keeper = plain(BookFormat::Binance);
    assert_eq!(feed(&mut keeper, BINANCE_DIFF), Err(BookError::NoSnapshot));
    feed(&mut keeper, BINANCE_SNAPSHOT).unwrap();
    keeper.reset();
    assert!(keeper.book().is_empty());
    assert_eq!(feed(&mut keeper, BINANCE_DIFF), Err(BookError::NoSnapshot));
    let rebuilt = Book::rebuild(
        BookFormat::Binance,
        None,
        BINANCE_DIFF.as_bytes(),
        [BINANCE_DIFF],
    );
    assert_eq!(rebuilt, Err(BookError::NotSnapshot));
}

#[test]
fn errors_name_the_field_never_the_value() {
    let mut keeper = plain(BookFormat::Binance);
    let error = feed(
        &mut keeper,
        &BINANCE_SNAPSHOT.replace("431.00000000", "4.3e2"),
    )
    .unwrap_err();
    assert_eq!(error, BookError::BadNumber { field: "bids" });
    assert_eq!(
        error.to_string(),
        "a price or quantity in `bids` is not a decimal number"
    );
    let error = feed(&mut keeper, r#"{"lastUpdateId":1,"bids":[[4,1]]}"#).unwrap_err();
    assert_eq!(
        error.to_string(),
        "binance: `bids` is missing or not of the documented shape"
    );
    let error = feed(&mut keeper, r#"{"lastUpdateId":"secret"#).unwrap_err();
    assert_eq!(
        error.to_string(),
        "frame is not usable JSON (truncated, column 23)"
    );
    let wrong_rule = BookKeeper::new(
        BookFormat::Binance,
        ChecksumRule::Okx,
        KeeperOptions::default(),
    );
    let message = wrong_rule.err().unwrap().to_string();
    assert_eq!(
        message,
        "checksum rule okx does not apply to format binance"
    );
}
