//! `leasehold book` as an operator runs it: entries written with the real
//! Redis sink (snapshots, Binance diffs, a non-book frame, a gap marker, a
//! reset), then the real binary rebuilding the book at several positions.

use std::process::{Command, Output};

use leasehold_sink::redis::RedisSink;
use leasehold_sink::{FencedSink, GapMark, ResetMark, SinkBatch, SinkEvent, SinkOptions};
use leasehold_telemetry::GapReason;
use leasehold_testkit::{redis_url, unique_name};

/// The first entry of [`write_book_stream`], before any snapshot.
const BEFORE_SNAPSHOT: &str = "7-3";

/// Writes, under token 7 (entry ids in brackets):
/// - [7-3] a diff before any snapshot;
/// - [7-10] snapshot: bids 100.00×1.0, 99.50×2.0; asks 100.50×1.5, 101.00×3;
/// - [7-11] diff: bid 100.00 removed, bid 99.90×4.5, ask 100.50→0.75;
/// - [7-12] a subscription acknowledgement (not a book message);
/// - [7-13] diff: ask 100.25×2, ask 101.00 removed;
/// - [7-20] gap marker 14..=20;
/// - [7-21] diff (the book is unknown here);
/// - [7-30] snapshot replacing missed diffs 22..=30: bids 98.00×1, 97.5×0.5;
///   asks 99.00×2, 99.10×1;
/// - [7-31] diff: bid 98.50×3, ask 99.00 removed;
/// - [7-32] diff: ask 99.05×0.25.
async fn write_book_stream(redis: &str) -> String {
    let stream = unique_name("book");
    let sink = RedisSink::connect(
        redis,
        SinkOptions {
            max_len: 0,
            ..SinkOptions::default()
        },
    )
    .await
    .unwrap();
    assert!(!sink.open(&stream, 7).await.unwrap().fenced);
    let diff = |seq: u64, bids: &str, asks: &str| {
        SinkEvent::data(
            seq,
            format!("d{seq}"),
            format!(
                r#"{{"e":"depthUpdate","E":1700000000{seq:03},"s":"BTCUSDT","U":{seq},"u":{seq},"b":[{bids}],"a":[{asks}]}}"#
            ),
        )
    };
    let events = [
        diff(3, r#"["100.00","7"]"#, ""),
        SinkEvent::snapshot(
            10,
            r#"{"lastUpdateId":10,"bids":[["100.00","1.0"],["99.50","2.0"]],"asks":[["100.50","1.5"],["101.00","3"]]}"#,
            None,
        ),
        diff(
            11,
            r#"["100.00","0"],["99.90","4.5"]"#,
            r#"["100.50","0.75"]"#,
        ),
        SinkEvent::data(12, "ack", r#"{"result":null,"id":1}"#),
        diff(13, "", r#"["100.25","2"],["101.00","0.000"]"#),
        SinkEvent::gap(14, 20, GapReason::NoReplay),
        diff(21, r#"["99.95","1"]"#, ""),
        SinkEvent::snapshot(
            30,
            r#"{"lastUpdateId":30,"bids":[["98.00","1"],["97.5","0.5"]],"asks":[["99.00","2"],["99.10","1"]]}"#,
            Some(GapMark {
                from: 22,
                reason: GapReason::NoReplay,
            }),
        ),
        diff(31, r#"["98.50","3"]"#, r#"["99.00","0"]"#),
        diff(32, "", r#"["99.05","0.25"]"#),
    ];
    let outcome = sink
        .write(SinkBatch {
            stream_id: &stream,
            fence_token: 7,
            events: &events,
        })
        .await
        .unwrap();
    assert_eq!(outcome.accepted, events.len() as u64, "{outcome:?}");
    stream
}

fn book(envs: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .arg("book")
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(envs.iter().copied())
        .output()
        .expect("run leasehold")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[track_caller]
fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "failed ({}): {}\n{}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
    text(&output.stdout)
}

/// Exit 1 with one line on stderr and nothing on stdout; returns the line.
#[track_caller]
fn refused(output: Output) -> String {
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(output.stdout.is_empty(), "{}", text(&output.stdout));
    assert_eq!(stderr.trim().lines().count(), 1, "one-line error: {stderr}");
    stderr
}

fn json(output: Output) -> serde_json::Value {
    serde_json::from_str(&ok(output)).unwrap()
}

#[tokio::test]
async fn the_last_entry_by_default_as_computed_by_hand() {
    let Some(redis) = redis_url() else { return };
    let stream = write_book_stream(&redis).await;
    let env = [("SINK_URL", redis.as_str())];
    // Snapshot 7-30 (with its gap fields: it is the new book), then 7-31
    // (bid 98.50×3, ask 99.00 gone) and 7-32 (ask 99.05×0.25).
    let printed = ok(book(&env, &[&stream]));
    let expected = format!(
        "{stream} at 7-32: snapshot 7-30 + 2 diffs applied (binance); 3 of 3 bids, 2 of 2 asks
       price  quantity
ask    99.10  1
ask    99.05  0.25
spread  0.55
bid    98.50  3
bid    98.00  1
bid     97.5  0.5
"
    );
    assert_eq!(printed, expected);
    // --depth cuts each side to the best N.
    let printed = ok(book(&env, &[&stream, "--depth", "1"]));
    assert!(
        printed.starts_with(&format!(
            "{stream} at 7-32: snapshot 7-30 + 2 diffs applied (binance); 1 of 3 bids, 1 of 2 asks\n"
        )),
        "{printed}"
    );
    assert!(
        printed.contains("ask    99.05  0.25\nspread  0.55\nbid    98.50  3\n")
            && !printed.contains("99.10")
            && !printed.contains("98.00"),
        "{printed}"
    );
}

#[tokio::test]
async fn an_earlier_entry_gives_the_earlier_book() {
    let Some(redis) = redis_url() else { return };
    let stream = write_book_stream(&redis).await;
    let env = [("SINK_URL", redis.as_str())];
    // Snapshot 7-10, diff 7-11, the acknowledgement 7-12 skipped, diff 7-13
    // (ask 100.25×2; ask 101.00 removed as "0.000").
    let printed = ok(book(&env, &[&stream, "--at", "7-13"]));
    let expected = format!(
        "{stream} at 7-13: snapshot 7-10 + 2 diffs applied (binance); 2 of 2 bids, 2 of 2 asks
        price  quantity
ask    100.50  0.75
ask    100.25  2
spread   0.35
bid     99.90  4.5
bid     99.50  2.0
"
    );
    assert_eq!(printed, expected);
    // The snapshot entry itself: its body, nothing applied.
    let at_snapshot = json(book(&env, &[&stream, "--at", "7-10", "--json"]));
    assert_eq!(at_snapshot["at"], "7-10");
    assert_eq!(at_snapshot["snapshot"], "7-10");
    assert_eq!(at_snapshot["diffs_applied"], 0);
    assert_eq!(
        at_snapshot["bids"],
        serde_json::json!([["100.00", "1.0"], ["99.50", "2.0"]])
    );
    // The non-book entry as the position: the book of the diff before it.
    let at_ack = json(book(&env, &[&stream, "--at", "7-12", "--json"]));
    assert_eq!(at_ack["diffs_applied"], 1);
    assert_eq!(
        at_ack["asks"],
        serde_json::json!([["100.50", "0.75"], ["101.00", "3"]])
    );
}

#[tokio::test]
async fn json_is_the_same_book() {
    let Some(redis) = redis_url() else { return };
    let stream = write_book_stream(&redis).await;
    let env = [("SINK_URL", redis.as_str())];
    let printed = json(book(&env, &[&stream, "--json"]));
    assert_eq!(
        printed,
        serde_json::json!({
            "stream_id": stream,
            "at": "7-32",
            "snapshot": "7-30",
            "diffs_applied": 2,
            "bids": [["98.50", "3"], ["98.00", "1"], ["97.5", "0.5"]],
            "asks": [["99.05", "0.25"], ["99.10", "1"]],
            "best_bid": ["98.50", "3"],
            "best_ask": ["99.05", "0.25"],
        })
    );
    let shallow = json(book(
        &env,
        &[
            &stream, "--at", "7-11", "--depth", "1", "--json", "--format", "binance",
        ],
    ));
    assert_eq!(shallow["bids"], serde_json::json!([["99.90", "4.5"]]));
    assert_eq!(shallow["asks"], serde_json::json!([["100.50", "0.75"]]));
    assert_eq!(shallow["best_bid"], serde_json::json!(["99.90", "4.5"]));
}

#[tokio::test]
async fn a_position_without_a_snapshot_before_it_is_refused() {
    let Some(redis) = redis_url() else { return };
    let stream = write_book_stream(&redis).await;
    let env = [("SINK_URL", redis.as_str())];
    let line = refused(book(&env, &[&stream, "--at", BEFORE_SNAPSHOT]));
    assert!(
        line.contains("no snapshot entry at or before 7-3") && line.contains(&stream),
        "{line}"
    );
    // An id the stream does not hold, and a stream with no entries at all.
    let line = refused(book(&env, &[&stream, "--at", "7-99"]));
    assert!(
        line.contains("entry 7-99 is not in stream") && line.contains("7-3 to 7-32"),
        "{line}"
    );
    let line = refused(book(&env, &[&stream, "--at", "8-10"]));
    assert!(line.contains("entry 8-10 is not in stream"), "{line}");
    let line = refused(book(&env, &[&unique_name("empty")]));
    assert!(line.contains("has no entries in the sink"), "{line}");
}

#[tokio::test]
async fn a_marker_between_the_snapshot_and_the_position_is_refused() {
    let Some(redis) = redis_url() else { return };
    let stream = write_book_stream(&redis).await;
    let env = [("SINK_URL", redis.as_str())];
    for at in ["7-21", "7-20"] {
        let line = refused(book(&env, &[&stream, "--at", at]));
        assert!(
            line.contains(&format!("the book at {at}"))
                && line.contains("gap marker 7-20 (sequences 14..=20 missing, reason no_replay)")
                && line.contains("after snapshot 7-10"),
            "{line}"
        );
    }

    // A reset entry: the upstream's sequence started over under token 8.
    let reset = unique_name("book-reset");
    let sink = RedisSink::connect(&redis, SinkOptions::default())
        .await
        .unwrap();
    sink.open(&reset, 1).await.unwrap();
    let snapshot = r#"{"lastUpdateId":5,"bids":[["1.0","1"]],"asks":[["2.0","1"]]}"#;
    let first = [SinkEvent::snapshot(5, snapshot, None)];
    sink.write(SinkBatch {
        stream_id: &reset,
        fence_token: 1,
        events: &first,
    })
    .await
    .unwrap();
    sink.open_epoch(&reset, 2, ResetMark { from: 5, to: 1 })
        .await
        .unwrap();
    let after = [SinkEvent::data(
        1,
        "d1",
        r#"{"e":"depthUpdate","E":1,"s":"X","U":1,"u":1,"b":[["1.5","1"]],"a":[]}"#,
    )];
    sink.write(SinkBatch {
        stream_id: &reset,
        fence_token: 2,
        events: &after,
    })
    .await
    .unwrap();
    let line = refused(book(&env, &[&reset]));
    assert!(
        line.contains("reset entry 2-0") && line.contains("after snapshot 1-5"),
        "{line}"
    );
    // Before the reset the book is known.
    let before = json(book(&env, &[&reset, "--at", "1-5", "--json"]));
    assert_eq!(before["best_bid"], serde_json::json!(["1.0", "1"]));
}

#[tokio::test]
async fn a_snapshot_of_no_known_format_is_refused() {
    let Some(redis) = redis_url() else { return };
    let stream = unique_name("book-unknown");
    let sink = RedisSink::connect(&redis, SinkOptions::default())
        .await
        .unwrap();
    sink.open(&stream, 3).await.unwrap();
    let events = [SinkEvent::snapshot(1, r#"{"levels":[]}"#, None)];
    sink.write(SinkBatch {
        stream_id: &stream,
        fence_token: 3,
        events: &events,
    })
    .await
    .unwrap();
    let env = [("SINK_URL", redis.as_str())];
    let line = refused(book(&env, &[&stream]));
    assert!(
        line.contains("cannot tell the book format of snapshot entry 3-1")
            && line.contains("--format"),
        "{line}"
    );
    let line = refused(book(&env, &[&stream, "--format", "binance"]));
    assert!(
        line.contains("snapshot entry 3-1 is not a binance book snapshot"),
        "{line}"
    );
}

#[test]
fn bad_configuration_exits_2_and_the_password_is_never_printed() {
    let missing = book(&[], &["s"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(text(&missing.stderr).contains("SINK_URL"));
    let memory = book(&[("SINK_URL", "memory:")], &["s"]);
    assert_eq!(memory.status.code(), Some(2));
    assert!(text(&memory.stderr).contains("in-process sink"));
    let secret = "redis://:hunter2-secret@127.0.0.1:1/";
    for args in [
        &["s", "--at", "seven"][..],
        &["s", "--format", "ftx"],
        &["s", "--depth", "0"],
    ] {
        let output = book(&[("SINK_URL", secret)], args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
    }
    // Nothing listens on port 1: one line, where, never who.
    let line = refused(book(&[("SINK_URL", secret)], &["s"]));
    assert!(
        line.contains("127.0.0.1:1") && !line.contains("hunter2"),
        "{line}"
    );
    let bad = book(
        &[("SINK_URL", "redis://:hunter2-secret@h:notaport")],
        &["s"],
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(!text(&bad.stderr).contains("hunter2"));
}
