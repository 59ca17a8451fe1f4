//! The gap collector: each gap once (by the sidecar's numbering, across
//! refreshes and sidecar restarts), its time from `age_ms`, and both bounds.

use super::*;

/// (seq, age_ms, stream, from, to, reason)
type Listed<'a> = (u64, u64, &'a str, u64, u64, &'a str);

fn reporting(url: &str, owner: &str, gaps: &[Listed<'_>]) -> SidecarReport {
    let gaps: Vec<serde_json::Value> = gaps
        .iter()
        .map(|(seq, age_ms, stream, from, to, reason)| {
            serde_json::json!({"seq": seq, "age_ms": age_ms, "stream_id": stream,
                "from_seq": from, "to_seq": to, "reason": reason})
        })
        .collect();
    let status = serde_json::json!({
        "component": "stream-worker", "owner_id": owner, "worker_connected": true,
        "last_event_age_ms": 1, "worker_up": true, "events_received": 1,
        "events_dropped": 0, "leases": [], "lag": {}, "websocket_connections": 0,
        "pool": null, "observer": false, "gaps": gaps,
    });
    SidecarReport {
        url: url.into(),
        status: Some(serde_json::from_value(status).unwrap()),
        error: None,
    }
}

fn silent(url: &str) -> SidecarReport {
    SidecarReport {
        url: url.into(),
        status: None,
        error: Some("no answer in time".into()),
    }
}

fn ranges(log: &GapLog, stream: &str) -> Vec<(u64, u64)> {
    log.for_stream(stream)
        .iter()
        .map(|g| (g.from_seq, g.to_seq))
        .collect()
}

const A: &str = "http://10.0.0.1:9464";
const B: &str = "http://10.0.0.2:9464";

#[test]
fn gaps_are_taken_once_across_refreshes_with_their_time_worker_and_size() {
    let mut log = GapLog::default();
    // First sight: every gap listed is taken (they are records, not rates).
    let first = [(1, 5_000, "s", 10, 19, "retention")];
    assert_eq!(log.observe(&[reporting(A, "w1", &first)], 100_000), 1);
    let gap = &log.for_stream("s")[0];
    assert_eq!(
        (gap.at_ms, gap.missing, gap.reason, gap.worker.as_deref()),
        (95_000, 10, GapReason::Retention, Some("w1"))
    );
    assert_eq!(gap.range_text(), "seq 10–19 missing (10 events): retention");
    // The next refresh lists it again (older) and one new gap: only the new one.
    let next = [
        (1, 7_000, "s", 10, 19, "retention"),
        (2, 10, "s", 40, 40, "no_replay"),
    ];
    assert_eq!(log.observe(&[reporting(A, "w1", &next)], 102_000), 1);
    assert_eq!(log.observe(&[reporting(A, "w1", &next)], 104_000), 0);
    assert_eq!(ranges(&log, "s"), [(40, 40), (10, 19)], "newest first");
    let tally = log.tally("s").unwrap();
    assert_eq!((tally.count, tally.missing), (2, 11));
    assert_eq!((tally.last.at_ms, tally.last.from_seq), (101_990, 40));
    assert_eq!(
        tally.last.range_text(),
        "seq 40–40 missing (1 event): no_replay"
    );
    assert_eq!(
        (
            tally.with_reason(GapReason::Retention),
            tally.with_reason(GapReason::NoReplay),
            tally.with_reason(GapReason::SinkLost)
        ),
        (1, 1, 0)
    );
    assert_eq!(
        serde_json::to_value(tally).unwrap()["reasons"],
        serde_json::json!({"no_replay": 1, "retention": 1})
    );
    // A sidecar that does not answer for a refresh is still known after it.
    assert_eq!(log.observe(&[silent(A)], 106_000), 0);
    assert_eq!(log.observe(&[reporting(A, "w1", &next)], 108_000), 0);
    // A range that ends before it starts is not a gap.
    let odd = [(3, 0, "s", 9, 8, "retention")];
    assert_eq!(log.observe(&[reporting(A, "w1", &odd)], 110_000), 0);
}

#[test]
fn a_restarted_sidecar_is_counted_from_its_new_numbering() {
    let mut log = GapLog::default();
    let before = [
        (6, 100, "s", 1, 5, "retention"),
        (7, 50, "s", 9, 9, "retention"),
    ];
    log.observe(&[reporting(A, "w1", &before)], 10_000);
    // Restarted: numbering back to 1, a new gap under a number already taken.
    let after = [(1, 10, "s", 30, 31, "sink_lost")];
    assert_eq!(log.observe(&[reporting(A, "w1", &after)], 12_000), 1);
    // Restarted and already past the last number taken before the next poll:
    // the gap under that number is another one, so it is noticed too.
    let mut log = GapLog::default();
    log.observe(&[reporting(A, "w1", &before)], 10_000);
    let past = [
        (6, 300, "s", 50, 50, "no_replay"),
        (7, 200, "t", 1, 2, "no_replay"),
        (8, 100, "s", 60, 61, "no_replay"),
    ];
    assert_eq!(log.observe(&[reporting(A, "w1", &past)], 12_000), 3);
    assert_eq!(ranges(&log, "s"), [(60, 61), (50, 50), (9, 9), (1, 5)]);
    // A sidecar that left discovery and came back (new to the log) does not
    // bring back the gaps already kept; a newcomer's are all taken.
    log.observe(&[reporting(B, "w2", &[])], 14_000);
    assert_eq!(log.sidecars_seen(), 1, "bounded by the sidecars polled");
    assert_eq!(log.observe(&[reporting(A, "w1", &past)], 16_000), 0);
    assert_eq!(log.tally("s").unwrap().count, 4);
}

#[test]
fn each_stream_keeps_its_newest_and_the_log_its_cap() {
    let mut log = GapLog::bounded(3, 5);
    let gap = |at_ms: i64, from: u64| DataGap {
        at_ms,
        from_seq: from,
        to_seq: from,
        missing: 1,
        reason: GapReason::Retention,
        worker: None,
    };
    for i in 0..5 {
        log.record("loop", gap(i, i as u64));
    }
    assert_eq!(ranges(&log, "loop"), [(4, 4), (3, 3), (2, 2)]);
    assert_eq!(
        log.tally("loop").map(|t| t.count),
        Some(5),
        "the tally counts every gap"
    );
    // Three more streams: the oldest recorded leave first, across streams.
    log.record("a", gap(10, 100));
    log.record("b", gap(11, 200));
    log.record("c", gap(12, 300));
    assert_eq!(log.len(), 5);
    assert_eq!(ranges(&log, "loop"), [(4, 4), (3, 3)]);
    log.record("d", gap(13, 400));
    assert_eq!(ranges(&log, "loop"), [(4, 4)]);
    log.record("e", gap(14, 500));
    assert!(log.for_stream("loop").is_empty());
    assert_eq!(log.tally("loop"), None, "nothing kept, no tally");
    assert_eq!(ranges(&log, "a"), [(100, 100)]);
    assert_eq!((log.len(), log.streams(), log.dropped()), (5, 5, 5));
    // An id no page can be asked for is not kept.
    assert!(!log.record(&"x".repeat(MAX_STREAM_ID_LEN + 1), gap(14, 1)));
}

#[test]
fn ten_thousand_streams_reporting_in_a_loop_stay_within_the_cap() {
    let mut log = GapLog::default();
    let sidecars: Vec<String> = (0..100)
        .map(|i| format!("http://10.0.1.{i}:9464"))
        .collect();
    for round in 0..20u64 {
        let reports: Vec<SidecarReport> = sidecars
            .iter()
            .enumerate()
            .map(|(i, url)| {
                // Each sidecar serves 100 streams and lists its newest 32 gaps.
                let streams: Vec<String> = (0..100)
                    .map(|k| format!("stream-{:05}", i * 100 + k))
                    .collect();
                let listed: Vec<(u64, u64, String, u64, u64)> = (0..32u64)
                    .map(|k| {
                        let seq = round * 32 + k + 1;
                        (seq, 0, streams[(seq % 100) as usize].clone(), seq, seq)
                    })
                    .collect();
                let listed: Vec<Listed<'_>> = listed
                    .iter()
                    .map(|(seq, age, s, f, t)| (*seq, *age, s.as_str(), *f, *t, "retention"))
                    .collect();
                reporting(url, "w", &listed)
            })
            .collect();
        log.observe(&reports, 1_000 * round as i64);
    }
    assert_eq!(log.len(), GAPS_KEPT);
    assert!(log.streams() <= GAPS_KEPT);
    assert_eq!(log.dropped(), 100 * 20 * 32 - GAPS_KEPT as u64);
}

#[test]
fn a_reset_is_listed_with_the_gaps_missing_nothing() {
    let mut log = GapLog::default();
    // The sequence went back: from_seq (reset_from) above to_seq (reset_to).
    let listed = [(1, 1_000, "s", 60_108, 1, "reset")];
    assert_eq!(log.observe(&[reporting(A, "w1", &listed)], 100_000), 1);
    let reset = &log.for_stream("s")[0];
    assert_eq!((reset.reason, reset.missing), (GapReason::Reset, 0));
    assert_eq!(
        reset.range_text(),
        "sequence reset: 60108 then 1 (the upstream started over)"
    );
}
