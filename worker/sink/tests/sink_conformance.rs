//! One sink conformance suite, run against both sinks (docs/invariants.md, invariant 2).

use leasehold_sink::conformance::{MemoryTarget, OPTIONS, RedisTarget};

mod memory {
    use super::*;
    leasehold_sink::sink_conformance_suite!(async { Some(MemoryTarget::new(OPTIONS)) });
}

mod redis {
    use super::*;
    leasehold_sink::sink_conformance_suite!(RedisTarget::connect(OPTIONS));
}

/// The Redis sink sends `EVALSHA` itself: a Redis that forgot the script
/// (restarted, `SCRIPT FLUSH`) gets it loaded again and the batch lands.
#[tokio::test]
async fn redis_sink_reloads_a_forgotten_script() {
    use leasehold_sink::conformance::SinkTarget;
    use leasehold_sink::{SinkBatch, SinkEvent};
    let Some(target) = RedisTarget::connect(OPTIONS).await else {
        return;
    };
    let stream = leasehold_testkit::unique_name("sink");
    let event = |seq: u64| SinkEvent::data(seq, format!("{stream}:{seq}"), "{}");
    let write = |events: Vec<SinkEvent>| {
        let sink = target.sink();
        let stream = stream.clone();
        async move {
            sink.write(SinkBatch {
                stream_id: &stream,
                fence_token: 1,
                events: &events,
                after: None,
            })
            .await
            .expect("write")
        }
    };
    assert_eq!(write(vec![event(1)]).await.accepted, 1);
    let url = leasehold_testkit::redis_url().expect("redis URL");
    let mut raw = ::redis::Client::open(url.as_str())
        .expect("redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let _: () = ::redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await
        .expect("SCRIPT FLUSH");
    assert_eq!(write(vec![event(2)]).await.accepted, 1);
    let stored = target.stored(&stream).await;
    assert_eq!(stored.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2]);
}
