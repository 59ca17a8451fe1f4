//! The Redis sink behind a busy Redis. On a Redis of its own: the test stalls
//! its server for most of a second, which must not hit the tests running
//! beside it on the shared test Redis (the conformance suite's timings).

use leasehold_sink::redis::RedisSink;
use leasehold_testkit::private_redis::PrivateRedis;
use leasehold_testkit::sink::OPTIONS;

/// A write that waits behind a busy Redis for longer than the Redis client's
/// own 500 ms default still lands: the sink's reply timeout is its own
/// (`SINK_TIMEOUT_MS`), so a busy moment does not turn every in-flight batch
/// into a failure and a resend.
#[tokio::test]
async fn redis_sink_waits_out_a_busy_moment() {
    use leasehold_sink::{FencedSink, SinkBatch, SinkEvent};
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    let url = server.url();
    let sink = RedisSink::connect(&url, OPTIONS).await.expect("connect");
    let stream = leasehold_testkit::unique_name("sink");
    sink.open(&stream, 1).await.expect("open");
    let mut busy = ::redis::Client::open(url.as_str())
        .expect("redis URL")
        .get_multiplexed_async_connection_with_config(
            &::redis::AsyncConnectionConfig::new().set_response_timeout(None),
        )
        .await
        .expect("connect");
    // Lua runs atomically: Redis answers nobody for 900 ms.
    let hog = tokio::spawn(async move {
        let _: () = ::redis::cmd("EVAL")
            .arg(
                "local t = redis.call('TIME') local start = t[1] * 1e6 + t[2] \
                 repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] - start > 900000",
            )
            .arg(0)
            .query_async(&mut busy)
            .await
            .expect("busy script");
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let events = [SinkEvent::data(1, format!("{stream}:1"), "{}")];
    let written = sink
        .write(SinkBatch {
            stream_id: &stream,
            fence_token: 1,
            events: &events,
        })
        .await
        .expect("a busy Redis is waited out");
    assert_eq!(written.accepted, 1);
    hog.await.expect("hog");
}
