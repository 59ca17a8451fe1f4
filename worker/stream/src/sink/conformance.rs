//! The sink conformance suite: one set of checks, run against both sinks.

use std::sync::Arc;

use async_trait::async_trait;
use leasehold_testkit::{redis_url, unique_name};

use super::memory::{MemorySink, StoredEvent};
use super::redis::RedisSink;
use super::{FencedSink, SinkBatch, SinkEvent, SinkOptions, WriteOutcome};

/// A sink under test, plus a way to read back what it stored.
#[async_trait]
pub trait SinkTarget: Send + Sync {
    /// The sink under test.
    fn sink(&self) -> Arc<dyn FencedSink>;
    /// Everything stored for a stream, in append order.
    async fn stored(&self, stream_id: &str) -> Vec<StoredEvent>;
}

/// The in-memory sink as a target.
pub struct MemoryTarget(Arc<MemorySink>);

impl MemoryTarget {
    /// A fresh sink with these options.
    pub fn new(options: SinkOptions) -> Self {
        MemoryTarget(Arc::new(MemorySink::new(options)))
    }
}

#[async_trait]
impl SinkTarget for MemoryTarget {
    fn sink(&self) -> Arc<dyn FencedSink> {
        self.0.clone()
    }
    async fn stored(&self, stream_id: &str) -> Vec<StoredEvent> {
        self.0.events(stream_id)
    }
}

/// The Redis sink on the test server as a target.
pub struct RedisTarget(Arc<RedisSink>);

impl RedisTarget {
    /// Connects to the test Redis; `None` when no server is configured.
    pub async fn connect(options: SinkOptions) -> Option<Self> {
        let url = redis_url()?;
        Some(RedisTarget(Arc::new(
            RedisSink::connect(&url, options).await.expect("connect"),
        )))
    }
}

#[async_trait]
impl SinkTarget for RedisTarget {
    fn sink(&self) -> Arc<dyn FencedSink> {
        self.0.clone()
    }
    async fn stored(&self, stream_id: &str) -> Vec<StoredEvent> {
        self.0.stored(stream_id).await.expect("read back")
    }
}

/// Options every check runs with: a small window so trimming is exercised.
pub const OPTIONS: SinkOptions = SinkOptions {
    dedup_window: 5,
    max_len: 0,
};

fn events(stream: &str, seqs: std::ops::RangeInclusive<u64>) -> Vec<SinkEvent> {
    seqs.map(|seq| SinkEvent {
        seq,
        event_id: format!("{stream}:{seq}"),
        payload: format!(r#"{{"seq":{seq}}}"#),
    })
    .collect()
}

async fn write(
    target: &dyn SinkTarget,
    stream: &str,
    token: u64,
    events: &[SinkEvent],
) -> WriteOutcome {
    target
        .sink()
        .write(SinkBatch {
            stream_id: stream,
            fence_token: token,
            events,
        })
        .await
        .expect("write")
}

fn seqs(stored: &[StoredEvent]) -> Vec<u64> {
    stored.iter().map(|e| e.seq).collect()
}

/// Events are appended in order with their id, token and payload.
pub async fn appends_in_order(target: &dyn SinkTarget) {
    let stream = unique_name("sink");
    let outcome = write(target, &stream, 3, &events(&stream, 1..=3)).await;
    assert_eq!(
        outcome,
        WriteOutcome {
            accepted: 3,
            duplicate: 0,
            fenced: 0,
            highest_token: 3
        }
    );
    let stored = target.stored(&stream).await;
    assert_eq!(seqs(&stored), [1, 2, 3]);
    assert_eq!(stored[1].event_id, format!("{stream}:2"));
    assert_eq!(stored[1].fence_token, 3);
    assert_eq!(stored[1].payload, r#"{"seq":2}"#);
}

/// A lower token is rejected as a whole; equal and higher tokens are accepted.
pub async fn lower_tokens_are_fenced(target: &dyn SinkTarget) {
    let stream = unique_name("sink");
    write(target, &stream, 5, &events(&stream, 1..=2)).await;
    let stale = write(target, &stream, 4, &events(&stream, 3..=4)).await;
    assert_eq!(
        stale,
        WriteOutcome {
            accepted: 0,
            duplicate: 0,
            fenced: 2,
            highest_token: 5
        }
    );
    assert!(stale.is_fenced());
    assert_eq!(
        write(target, &stream, 5, &events(&stream, 3..=3))
            .await
            .accepted,
        1
    );
    let newer = write(target, &stream, 6, &events(&stream, 4..=4)).await;
    assert_eq!((newer.accepted, newer.highest_token), (1, 6));
    assert_eq!(
        write(target, &stream, 5, &events(&stream, 5..=5))
            .await
            .fenced,
        1
    );
    let stored = target.stored(&stream).await;
    assert_eq!(seqs(&stored), [1, 2, 3, 4]);
    assert!(
        stored
            .windows(2)
            .all(|w| w[0].fence_token <= w[1].fence_token)
    );
}

/// A replay after a takeover drops ids already written, appends the rest.
pub async fn replays_are_deduplicated(target: &dyn SinkTarget) {
    let stream = unique_name("sink");
    write(target, &stream, 1, &events(&stream, 1..=4)).await;
    let replay = write(target, &stream, 2, &events(&stream, 3..=6)).await;
    assert_eq!((replay.accepted, replay.duplicate), (2, 2));
    assert_eq!(seqs(&target.stored(&stream).await), [1, 2, 3, 4, 5, 6]);
}

/// The window is bounded: ids older than the newest `dedup_window` are forgotten.
pub async fn dedup_window_is_bounded(target: &dyn SinkTarget) {
    let stream = unique_name("sink");
    write(target, &stream, 1, &events(&stream, 1..=8)).await;
    // Window 5 keeps ids 4..=8: 8 is a duplicate, 3 is accepted again.
    let outcome = write(target, &stream, 1, &events(&stream, 8..=8)).await;
    assert_eq!(outcome.duplicate, 1);
    let outcome = write(target, &stream, 1, &events(&stream, 3..=3)).await;
    assert_eq!(outcome.accepted, 1);
}

/// Streams have their own fence and window.
pub async fn streams_are_independent(target: &dyn SinkTarget) {
    let a = unique_name("sink-a");
    let b = unique_name("sink-b");
    write(target, &a, 9, &events(&a, 1..=1)).await;
    assert_eq!(write(target, &b, 1, &events(&b, 1..=1)).await.accepted, 1);
    assert_eq!(seqs(&target.stored(&b).await), [1]);
}

/// Generates one `#[tokio::test]` per sink check for a target.
#[macro_export]
macro_rules! sink_conformance_suite {
    ($make:expr) => {
        $crate::sink_conformance_suite!(@cases $make;
            appends_in_order,
            lower_tokens_are_fenced,
            replays_are_deduplicated,
            dedup_window_is_bounded,
            streams_are_independent,
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                if let Some(target) = $make.await {
                    $crate::sink::conformance::$case(&target).await;
                }
            }
        )*
    };
}
