//! One sink conformance suite, run against both sinks (docs/invariants.md, invariant 2).

use leasehold_testkit::sink::{MemoryTarget, OPTIONS, RedisTarget};

mod memory {
    use super::*;
    leasehold_testkit::sink_conformance_suite!(async { Some(MemoryTarget::new(OPTIONS)) });
}

mod redis {
    use super::*;
    leasehold_testkit::sink_conformance_suite!(RedisTarget::connect(OPTIONS));
}

/// The same suite over RESP3, whose client hears of a dropped connection
/// with no call in flight.
mod redis_resp3 {
    use super::*;
    leasehold_testkit::sink_conformance_suite!(RedisTarget::connect_resp3(OPTIONS));
}

/// The same suite on a three-primary Redis Cluster: every sink command names
/// one key (layout v2), so the streams spread over the primaries.
mod redis_cluster {
    use super::*;
    leasehold_testkit::sink_conformance_suite!(RedisTarget::connect_cluster(OPTIONS));
}

async fn raw_redis() -> ::redis::aio::MultiplexedConnection {
    let url = leasehold_testkit::redis_url().expect("redis URL");
    ::redis::Client::open(url.as_str())
        .expect("redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

/// A Redis that lost the open function (`FUNCTION FLUSH`, a new server with
/// no deploy step) gets it loaded again by a user allowed to; writes use no
/// Lua at all.
#[tokio::test]
async fn redis_sink_reloads_a_lost_function() {
    use leasehold_sink::{SinkBatch, SinkEvent};
    use leasehold_testkit::sink::SinkTarget;
    let Some(target) = RedisTarget::connect(OPTIONS).await else {
        return;
    };
    let stream = leasehold_testkit::unique_name("sink");
    let mut raw = raw_redis().await;
    let _: () = ::redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await
        .expect("FUNCTION FLUSH");
    let opened = target.sink().open(&stream, 1).await.expect("open");
    assert!(!opened.fenced);
    let events = [SinkEvent::data(1, format!("{stream}:1"), "{}")];
    let written = target
        .sink()
        .write(SinkBatch {
            stream_id: &stream,
            fence_token: 1,
            events: &events,
        })
        .await
        .expect("write");
    assert_eq!(written.accepted, 1);
}

/// The open leaves the stream's last id at `<token>-<last seq>` (created
/// empty at `<token>-0`): the id is the fence, no `leasehold:fence:*` key is
/// written, and entries carry `<token>-<seq>` ids (docs/redis.md, layout v2).
#[tokio::test]
async fn redis_sink_ids_are_token_and_sequence() {
    use leasehold_sink::{SinkBatch, SinkEvent, keys};
    use leasehold_testkit::sink::SinkTarget;
    let Some(target) = RedisTarget::connect(OPTIONS).await else {
        return;
    };
    let stream = leasehold_testkit::unique_name("sink");
    let mut raw = raw_redis().await;
    let last_id = |info: ::redis::Value| -> String {
        let map: std::collections::HashMap<String, ::redis::Value> =
            ::redis::from_redis_value(info).expect("XINFO map");
        ::redis::from_redis_value(map["last-generated-id"].clone()).expect("id")
    };
    target.sink().open(&stream, 7).await.expect("open");
    let info = ::redis::cmd("XINFO")
        .arg("STREAM")
        .arg(keys::sink_stream(&stream))
        .query_async(&mut raw)
        .await
        .expect("XINFO");
    assert_eq!(last_id(info), "7-0");
    let events = [
        SinkEvent::data(4, format!("{stream}:4"), "{}"),
        SinkEvent::data(5, format!("{stream}:5"), "{}"),
    ];
    target
        .sink()
        .write(SinkBatch {
            stream_id: &stream,
            fence_token: 7,
            events: &events,
        })
        .await
        .expect("write");
    let ids: ::redis::streams::StreamRangeReply = ::redis::cmd("XRANGE")
        .arg(keys::sink_stream(&stream))
        .arg("-")
        .arg("+")
        .query_async(&mut raw)
        .await
        .expect("XRANGE");
    let ids: Vec<&str> = ids.ids.iter().map(|entry| entry.id.as_str()).collect();
    assert_eq!(ids, ["7-4", "7-5"]);
    target.sink().open(&stream, 9).await.expect("open");
    let info = ::redis::cmd("XINFO")
        .arg("STREAM")
        .arg(keys::sink_stream(&stream))
        .query_async(&mut raw)
        .await
        .expect("XINFO");
    assert_eq!(last_id(info), "9-5");
    let fence: bool = ::redis::cmd("EXISTS")
        .arg(keys::sink_fence(&stream))
        .query_async(&mut raw)
        .await
        .expect("EXISTS");
    assert!(!fence, "layout v2 writes no fence key");
}

/// A stream written in layout v1 (ids Redis generated from its clock) is
/// refused on open with an error naming the stream and what to do; its time
/// id is never taken for a fence token (which would fence every owner).
#[tokio::test]
async fn redis_sink_refuses_a_layout_v1_stream() {
    use leasehold_sink::{SinkError, keys};
    use leasehold_testkit::sink::SinkTarget;
    let Some(target) = RedisTarget::connect(OPTIONS).await else {
        return;
    };
    let stream = leasehold_testkit::unique_name("sink");
    let mut raw = raw_redis().await;
    let _: String = ::redis::cmd("XADD")
        .arg(keys::sink_stream(&stream))
        .arg("*")
        .arg("seq")
        .arg(1)
        .query_async(&mut raw)
        .await
        .expect("XADD");
    let refused = target.sink().open(&stream, 3).await;
    match refused {
        Err(SinkError::Rejected(message)) => {
            assert!(message.contains(&keys::sink_stream(&stream)), "{message}");
            assert!(message.contains("layout v1"), "{message}");
        }
        other => panic!("a v1 stream must be refused, got {other:?}"),
    }
}

/// `SINK_WAIT_REPLICAS`: with a replica attached, a batch is confirmed once
/// the replica has it; with more replicas asked for than exist, the write
/// fails after `SINK_WAIT_TIMEOUT_MS` (not confirmed: the runner sends it
/// again) although the primary appended it.
#[tokio::test]
async fn a_batch_waits_for_its_replicas_before_it_is_confirmed() {
    use leasehold_sink::redis::RedisSink;
    use leasehold_sink::{FencedSink, SinkBatch, SinkError, SinkEvent, SinkOptions};
    let Some(url) = leasehold_testkit::redis_url() else {
        return;
    };
    let _replica = leasehold_testkit::redis_replica::Replica::start(&url);
    let stream = leasehold_testkit::unique_name("sink-wait");
    let event = |seq: u64| [SinkEvent::data(seq, format!("{stream}:{seq}"), "{}")];
    // A linked replica answers `WAIT` within milliseconds, but on a machine
    // busy with the rest of the suite 300 ms was once not enough.
    let options = |replicas, wait_ms| SinkOptions {
        wait_replicas: replicas,
        wait_timeout: std::time::Duration::from_millis(wait_ms),
        ..SinkOptions::default()
    };
    let one = RedisSink::connect(&url, options(1, 3_000))
        .await
        .expect("connect");
    one.open(&stream, 1).await.expect("open");
    let written = one
        .write(SinkBatch {
            stream_id: &stream,
            fence_token: 1,
            events: &event(1),
        })
        .await
        .expect("one replica acknowledges");
    assert_eq!(written.accepted, 1);
    let five = RedisSink::connect(&url, options(5, 300))
        .await
        .expect("connect");
    five.open(&stream, 1).await.expect("open");
    let unconfirmed = five
        .write(SinkBatch {
            stream_id: &stream,
            fence_token: 1,
            events: &event(2),
        })
        .await;
    assert!(
        matches!(&unconfirmed, Err(SinkError::Unavailable(why)) if why.contains("1 of 5 replicas")),
        "{unconfirmed:?}"
    );
    assert_eq!(
        one.last_seq(&stream).await.expect("read"),
        Some(2),
        "appended, unconfirmed"
    );
}

/// `WAIT` blocks the connection it is sent on, so a sink that waits for
/// replicas spreads its streams over several: a replica that does not answer
/// holds one stream's batch for the wait's timeout, not every stream's one
/// after another. Two streams on different connections, each batch waiting
/// the full second for replicas that are not there: both are answered
/// within about one second (on one connection the second waits behind the
/// first: two).
#[tokio::test]
async fn a_batch_waiting_for_replicas_holds_no_other_streams_connection() {
    use leasehold_sink::redis::RedisSink;
    use leasehold_sink::{FencedSink, SinkBatch, SinkEvent, SinkOptions};
    let Some(url) = leasehold_testkit::redis_url() else {
        return;
    };
    let options = SinkOptions {
        wait_replicas: 5,
        wait_timeout: std::time::Duration::from_secs(1),
        ..SinkOptions::default()
    };
    let sink = RedisSink::connect(&url, options).await.expect("connect");
    let first = leasehold_testkit::unique_name("sink-wait-a");
    let second = (0..)
        .map(|n| format!("{first}-{n}"))
        .find(|name| sink.connection_of(name) != sink.connection_of(&first))
        .unwrap();
    for stream in [&first, &second] {
        sink.open(stream, 1).await.expect("open");
    }
    let write = |stream: String| {
        let sink = sink.clone();
        async move {
            let events = [SinkEvent::data(1, format!("{stream}:1"), "{}")];
            let started = std::time::Instant::now();
            let _unconfirmed = sink
                .write(SinkBatch {
                    stream_id: &stream,
                    fence_token: 1,
                    events: &events,
                })
                .await;
            started.elapsed()
        }
    };
    let (a, b) = tokio::join!(write(first.clone()), write(second.clone()));
    let slowest = a.max(b);
    assert!(
        slowest >= std::time::Duration::from_secs(1),
        "each waited for its replicas: {a:?} {b:?}"
    );
    assert!(
        slowest < std::time::Duration::from_millis(1_800),
        "one stream's WAIT held the other's batch: {a:?} {b:?}"
    );
}
