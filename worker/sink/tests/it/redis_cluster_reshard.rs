//! The Redis sink on a real three-primary cluster while its slots move
//! (`redis-cli --cluster reshard`, keys migrated with `MIGRATE`): writers
//! that do what the runner does (open, write, open again when the sink asks,
//! retry when it is unavailable) store each sequence once, in order. On a
//! cluster of its own: resharding moves every key in the slots it moves, and
//! the conformance suite runs beside it on the shared test cluster.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leasehold_sink::redis::RedisSink;
use leasehold_sink::{FencedSink, SinkBatch, SinkError, SinkEvent, SinkOptions};
use leasehold_testkit::private_redis::PrivateCluster;
use leasehold_testkit::redis_cluster;

/// What one writer saw: sequences written, re-opens the sink asked for,
/// and how many calls were unavailable (redirects, a slot in migration).
#[derive(Debug, Default)]
struct Writer {
    written: u64,
    reopens: u64,
    unavailable: u64,
}

/// Writes batches of ten until `done`, like a runner: after `NotOpen` it
/// opens again and goes on after the sink's end.
async fn write_until(sink: &RedisSink, stream: &str, done: &AtomicBool) -> Writer {
    let mut seen = Writer::default();
    let mut next = 1u64;
    let opened = sink.open(stream, 1).await.expect("first open");
    assert!(!opened.fenced);
    while !done.load(Ordering::SeqCst) {
        let events: Vec<SinkEvent> = (next..next + 10)
            .map(|seq| SinkEvent::data(seq, format!("{stream}:{seq}"), r#"{"p":1}"#))
            .collect();
        let written = sink
            .write(SinkBatch {
                stream_id: stream,
                fence_token: 1,
                events: &events,
            })
            .await;
        match written {
            Ok(outcome) => {
                assert!(!outcome.is_fenced(), "{outcome:?}");
                next += 10;
                seen.written = next - 1;
            }
            Err(SinkError::NotOpen { .. }) => {
                seen.reopens += 1;
                match sink.open(stream, 1).await {
                    Ok(opened) => next = opened.last_seq.unwrap_or(0) + 1,
                    Err(SinkError::Unavailable(_)) => seen.unavailable += 1,
                    Err(other) => panic!("open: {other}"),
                }
            }
            Err(SinkError::Unavailable(_)) => {
                seen.unavailable += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(other) => panic!("write: {other}"),
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_spread_over_the_primaries_survive_a_reshard_during_traffic() {
    let Some(cluster) = PrivateCluster::start() else {
        return;
    };
    let url = cluster.url();
    let nodes = redis_cluster::nodes(&url);
    let sink = RedisSink::connect(&url, SinkOptions::default())
        .await
        .expect("connect");
    let prefix = leasehold_testkit::unique_name("reshard");
    // Eight streams in the slots the reshard moves (the lowest of the first
    // node's), sixteen anywhere.
    let key = |name: &str| leasehold_sink::keys::sink_stream(name);
    let mut streams =
        redis_cluster::names_in_slots(&nodes[0], &format!("{prefix}-moved"), 8, 0..600, key);
    streams.extend((0..16).map(|i| format!("{prefix}-{i}")));
    let done = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = streams
        .iter()
        .map(|stream| {
            let sink = sink.clone();
            let stream = stream.clone();
            let done = done.clone();
            tokio::spawn(async move { write_until(&sink, &stream, &done).await })
        })
        .collect();
    let (a, b) = (
        redis_cluster::node_id(&nodes[0]),
        redis_cluster::node_id(&nodes[1]),
    );
    let entry = nodes[0].clone();
    tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(500));
        redis_cluster::reshard(&entry, &a, &b, 600);
        redis_cluster::reshard(&entry, &b, &a, 600);
        std::thread::sleep(Duration::from_millis(300));
    })
    .await
    .expect("reshard");
    done.store(true, Ordering::SeqCst);
    let mut redirected = 0;
    for (stream, writer) in streams.iter().zip(writers) {
        let seen = writer.await.expect("writer");
        redirected += seen.reopens + seen.unavailable;
        assert!(seen.written > 0, "{stream}: nothing written: {seen:?}");
        let stored = sink.stored(stream).await.expect("read back");
        let seqs: Vec<u64> = stored.iter().map(|event| event.seq).collect();
        assert_eq!(
            seqs,
            (1..=seqs.len() as u64).collect::<Vec<_>>(),
            "{stream}: each seq once, in order"
        );
        assert!(seqs.len() as u64 >= seen.written, "{stream}: {seen:?}");
    }
    eprintln!("reshard during traffic: {redirected} redirected or refused calls, all retried");
    assert!(
        redirected > 0,
        "the reshard moved no stream's slot while it was written (the test proves nothing)"
    );
}
