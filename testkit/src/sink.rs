//! The sink conformance suite: one set of checks, run against both sinks.
#![allow(clippy::unwrap_used)] // a test suite: a panic is its report

use std::sync::Arc;

use crate::{redis_url, unique_name};
use async_trait::async_trait;

use leasehold_sink::memory::{MemorySink, StoredEvent};
use leasehold_sink::redis::{RedisConnection, RedisSink};
use leasehold_sink::url::SinkUrl;
use leasehold_sink::{
    FencedSink, GapMark, OpenOutcome, ResetMark, SinkBatch, SinkError, SinkEvent, SinkOptions,
    WriteOutcome,
};
use leasehold_telemetry::GapReason;
use redis::streams::StreamId;

/// A sink under test, plus a way to read back what it stored.
#[async_trait]
pub trait SinkTarget: Send + Sync {
    /// The sink under test.
    fn sink(&self) -> Arc<dyn FencedSink>;
    /// Everything stored for a stream, in append order.
    async fn stored(&self, stream_id: &str) -> Vec<StoredEvent>;
    /// Makes every call on the stream fail (Redis: its stream key holds a
    /// string), or work again.
    async fn break_stream(&self, stream_id: &str, broken: bool);
    /// What a failover to an asynchronous replica that lacked the stream's
    /// newest `entries` entries leaves: they are gone, the last id is the
    /// newest kept entry's, and the sink's connection is lost.
    async fn fail_over(&self, stream_id: &str, entries: usize);
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
    async fn break_stream(&self, stream_id: &str, broken: bool) {
        self.0.set_broken(stream_id, broken);
    }
    async fn fail_over(&self, stream_id: &str, entries: usize) {
        self.0.lose_tail(stream_id, entries);
    }
}

/// A broken stream's entries and last id (`<token>-<seq>`), kept to put back.
type SetAside = (Vec<StreamId>, Option<String>);

/// The Redis sink on the test server (or the test cluster) as a target.
pub struct RedisTarget {
    sink: Arc<RedisSink>,
    /// A connection of the test's own (with the client's usual retries).
    raw: RedisConnection,
    /// One plain URL per node: a failover breaks the sink's connections on each.
    nodes: Vec<String>,
    /// The Redis user the sink connects as (its own, so a failover can
    /// break exactly its connections while other tests run).
    user: String,
    /// A broken stream's entries and last id, while a string holds its key.
    aside: std::sync::Mutex<std::collections::HashMap<String, SetAside>>,
}

impl RedisTarget {
    /// Connects to the test Redis; `None` when no server is configured.
    pub async fn connect(options: SinkOptions) -> Option<Self> {
        Some(Self::connect_to(&redis_url()?, options).await)
    }

    /// Connects to the test Redis over RESP3 (`?protocol=resp3`), where a
    /// client may learn of a dropped connection with no call in flight.
    pub async fn connect_resp3(options: SinkOptions) -> Option<Self> {
        let url = redis_url()?;
        let separator = if url.contains('?') { '&' } else { '?' };
        Some(Self::connect_to(&format!("{url}{separator}protocol=resp3"), options).await)
    }

    /// Connects to the test Redis Cluster; `None` when none is configured.
    pub async fn connect_cluster(options: SinkOptions) -> Option<Self> {
        Some(Self::connect_to(&crate::redis_cluster_url()?, options).await)
    }

    async fn connect_to(url: &str, options: SinkOptions) -> Self {
        let nodes = match SinkUrl::parse(url).expect("sink URL") {
            SinkUrl::RedisCluster(nodes) => nodes,
            _ => vec![url.to_owned()],
        };
        let user = unique_name("sink-test");
        for node in &nodes {
            let _: () = redis::cmd("ACL")
                .arg("SETUSER")
                .arg(&user)
                .arg("on")
                .arg(">sink-test")
                .arg("~*")
                .arg("&*")
                .arg("+@all")
                .query_async(&mut node_connection(node).await)
                .await
                .expect("ACL SETUSER");
        }
        let (scheme, rest) = url.split_once("://").expect("scheme");
        let sink_url = format!("{scheme}://{user}:sink-test@{rest}");
        RedisTarget {
            sink: Arc::new(
                RedisSink::connect(&sink_url, options)
                    .await
                    .expect("connect"),
            ),
            raw: RedisConnection::connect(url, leasehold_sink::DEFAULT_REPLY_TIMEOUT, 16)
                .await
                .expect("connect"),
            nodes,
            user,
            aside: Default::default(),
        }
    }

    /// The sink under test, as its own type.
    pub fn redis_sink(&self) -> &RedisSink {
        &self.sink
    }

    async fn entries(&self, key: &str) -> Vec<StreamId> {
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(key)
            .arg("-")
            .arg("+")
            .query_async(&mut self.raw.clone())
            .await
            .expect("XRANGE");
        reply.ids
    }

    /// Writes a stream again from `entries` (one transaction, one key), its
    /// last id raised to `last` when given.
    async fn rewrite(&self, key: &str, entries: &[StreamId], last: Option<&str>) {
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("DEL").arg(key).ignore();
        for entry in entries {
            let command = pipe.cmd("XADD").arg(key).arg(&entry.id);
            for (field, value) in &entry.map {
                let value: Vec<u8> = redis::from_redis_value(value.clone()).expect("field");
                command.arg(field).arg(value);
            }
            command.ignore();
        }
        if let Some(last) = last {
            pipe.cmd("XSETID").arg(key).arg(last).ignore();
        }
        let _: () = pipe
            .query_async(&mut self.raw.clone())
            .await
            .expect("rewrite");
    }
}

#[async_trait]
impl SinkTarget for RedisTarget {
    fn sink(&self) -> Arc<dyn FencedSink> {
        self.sink.clone()
    }
    async fn stored(&self, stream_id: &str) -> Vec<StoredEvent> {
        self.sink.stored(stream_id).await.expect("read back")
    }
    async fn break_stream(&self, stream_id: &str, broken: bool) {
        // Copied aside, not renamed: a cluster refuses a RENAME across slots.
        let key = leasehold_sink::keys::sink_stream(stream_id);
        if broken {
            let entries = self.entries(&key).await;
            let last = self
                .sink
                .last_id(stream_id)
                .await
                .expect("last id")
                .map(|id| format!("{}-{}", id.token, id.seq));
            self.aside
                .lock()
                .unwrap()
                .insert(stream_id.to_owned(), (entries, last));
            let mut pipe = redis::pipe();
            pipe.atomic()
                .cmd("DEL")
                .arg(&key)
                .ignore()
                .cmd("SET")
                .arg(&key)
                .arg("not a stream")
                .ignore();
            let _: () = pipe.query_async(&mut self.raw.clone()).await.expect("SET");
        } else {
            let aside = self.aside.lock().unwrap().remove(stream_id);
            let (entries, last) = aside.unwrap_or_default();
            self.rewrite(&key, &entries, last.as_deref()).await;
        }
    }
    async fn fail_over(&self, stream_id: &str, entries: usize) {
        // The stream as the replica had it: written again without its tail
        // (ids only go up, so a new key), then every other connection on
        // every node dropped, as a failover drops them.
        let key = leasehold_sink::keys::sink_stream(stream_id);
        let stored = self.entries(&key).await;
        let kept = stored.len().saturating_sub(entries);
        self.rewrite(&key, &stored[..kept], None).await;
        for node in &self.nodes {
            let _: () = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("USER")
                .arg(&self.user)
                .query_async(&mut node_connection(node).await)
                .await
                .expect("CLIENT KILL");
        }
    }
}

async fn node_connection(node: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(node)
        .expect("node URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

/// Options every check runs with.
pub const OPTIONS: SinkOptions = SinkOptions {
    max_len: 0,
    reply_timeout: leasehold_sink::DEFAULT_REPLY_TIMEOUT,
    wait_replicas: 0,
    wait_timeout: leasehold_sink::DEFAULT_WAIT_TIMEOUT,
};

fn events(stream: &str, seqs: std::ops::RangeInclusive<u64>) -> Vec<SinkEvent> {
    seqs.map(|seq| {
        SinkEvent::data(
            seq,
            format!("{stream}:{seq}"),
            format!(r#"{{"seq":{seq}}}"#),
        )
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

/// Opens a stream as a new owner does before its first write.
async fn open(target: &dyn SinkTarget, stream: &str, token: u64) -> OpenOutcome {
    let opened = target.sink().open(stream, token).await.expect("open");
    assert!(!opened.fenced, "{opened:?}");
    opened
}

fn seqs(stored: &[StoredEvent]) -> Vec<u64> {
    stored.iter().map(|e| e.seq).collect()
}

/// Events are appended in order with their id, token and payload.
pub async fn appends_in_order(target: &dyn SinkTarget) {
    let stream = unique_name("sink");
    open(target, &stream, 3).await;
    let outcome = write(target, &stream, 3, &events(&stream, 1..=3)).await;
    assert_eq!(
        outcome,
        WriteOutcome {
            accepted: 3,
            duplicate: 0,
            fenced: 0,
            highest_token: 3,
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
    open(target, &stream, 5).await;
    write(target, &stream, 5, &events(&stream, 1..=2)).await;
    let stale = write(target, &stream, 4, &events(&stream, 3..=4)).await;
    assert_eq!(
        stale,
        WriteOutcome {
            accepted: 0,
            duplicate: 0,
            fenced: 2,
            highest_token: 5,
        }
    );
    assert!(stale.is_fenced());
    assert_eq!(
        write(target, &stream, 5, &events(&stream, 3..=3))
            .await
            .accepted,
        1
    );
    open(target, &stream, 6).await;
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

/// A replay after a takeover drops sequences already appended, appends the rest.
pub async fn replays_are_deduplicated(target: &dyn SinkTarget) {
    let stream = unique_name("sink");
    open(target, &stream, 1).await;
    write(target, &stream, 1, &events(&stream, 1..=4)).await;
    assert_eq!(open(target, &stream, 2).await.last_seq, Some(4));
    let replay = write(target, &stream, 2, &events(&stream, 3..=6)).await;
    assert_eq!((replay.accepted, replay.duplicate), (2, 2));
    assert_eq!(seqs(&target.stored(&stream).await), [1, 2, 3, 4, 5, 6]);
}

/// A batch whose sequences do not strictly increase is refused whole, before
/// anything is appended: the sinks only compare a batch's head with the
/// stream's end.
pub async fn unordered_batches_are_refused_whole(target: &dyn SinkTarget) {
    let stream = unique_name("sink");
    open(target, &stream, 1).await;
    write(target, &stream, 1, &events(&stream, 1..=2)).await;
    let mut unordered = events(&stream, 3..=5);
    unordered.swap(1, 2);
    let repeated = [events(&stream, 3..=3), events(&stream, 3..=3)].concat();
    let zero = events(&stream, 0..=3);
    for batch in [&unordered[..], &repeated[..], &zero[..]] {
        let refused = target
            .sink()
            .write(SinkBatch {
                stream_id: &stream,
                fence_token: 1,
                events: batch,
            })
            .await;
        assert!(
            matches!(refused, Err(SinkError::Rejected(_))),
            "{refused:?}"
        );
    }
    assert_eq!(seqs(&target.stored(&stream).await), [1, 2]);
}

/// However long the replay and however old the sequence, nothing already
/// appended is appended again (an id window forgot ids beyond its size and
/// re-appended them out of order).
pub async fn replays_of_any_length_are_dropped(target: &dyn SinkTarget) {
    let stream = unique_name("sink");
    open(target, &stream, 1).await;
    write(target, &stream, 1, &events(&stream, 1..=20_000)).await;
    open(target, &stream, 2).await;
    let replay = write(target, &stream, 2, &events(&stream, 1..=20_010)).await;
    assert_eq!((replay.accepted, replay.duplicate), (10, 20_000));
    let old = write(target, &stream, 2, &events(&stream, 3..=3)).await;
    assert_eq!((old.accepted, old.duplicate), (0, 1));
    let stored = seqs(&target.stored(&stream).await);
    assert_eq!(stored.len(), 20_010);
    assert!(
        stored.windows(2).all(|w| w[1] == w[0] + 1),
        "each seq once, in order"
    );
}

/// Opening raises the fence to the new owner's token before any write, so a
/// zombie's delayed write is refused on a stream with no traffic, and tells the
/// owner where the sink stands.
pub async fn opening_raises_the_fence_and_returns_the_last_sequence(target: &dyn SinkTarget) {
    let stream = unique_name("sink");
    let sink = target.sink();
    assert_eq!(
        sink.open(&stream, 3).await.expect("open"),
        OpenOutcome {
            highest_token: 3,
            last_seq: None,
            fenced: false
        }
    );
    let zombie = write(target, &stream, 2, &events(&stream, 1..=2)).await;
    assert!(
        zombie.is_fenced(),
        "a lower token is refused after the open alone"
    );
    write(target, &stream, 3, &events(&stream, 1..=7)).await;
    let next = sink.open(&stream, 4).await.expect("open");
    assert_eq!(
        (next.last_seq, next.highest_token, next.fenced),
        (Some(7), 4, false)
    );
    let stale = sink.open(&stream, 3).await.expect("open");
    assert_eq!((stale.fenced, stale.highest_token), (true, 4));
    assert_eq!(seqs(&target.stored(&stream).await), [1, 2, 3, 4, 5, 6, 7]);
}

/// Sequences are exact up to 2^63 − 1 on every path: a stream whose last id
/// is `5-100000000000000` (a microsecond timestamp used as the sequence) is
/// opened by a new owner at exactly that sequence and continued as
/// `6-100000000000001`; a stream at 2^63 − 2 is taken over and written at
/// 2^63 − 1, and its next open reports 2^63 − 1, not a rounded float.
pub async fn sequences_are_exact_up_to_the_largest(target: &dyn SinkTarget) {
    let sink = target.sink();
    for (first, token) in [(100_000_000_000_000_u64, 5_u64), (i64::MAX as u64 - 1, 8)] {
        let stream = unique_name("sink");
        open(target, &stream, token).await;
        let outcome = write(target, &stream, token, &events(&stream, first..=first)).await;
        assert_eq!(outcome.accepted, 1, "{first}: {outcome:?}");
        let next = sink.open(&stream, token + 1).await.expect("open");
        assert_eq!(
            (next.last_seq, next.highest_token, next.fenced),
            (Some(first), token + 1, false),
            "{first}: the new owner must resume after exactly the last sequence"
        );
        let outcome = write(
            target,
            &stream,
            token + 1,
            &events(&stream, first + 1..=first + 1),
        )
        .await;
        assert_eq!(outcome.accepted, 1, "{first}: {outcome:?}");
        let stored = target.stored(&stream).await;
        assert_eq!(seqs(&stored), [first, first + 1], "{first}");
        assert_eq!(stored[1].fence_token, token + 1);
        let again = sink.open(&stream, token + 2).await.expect("open");
        assert_eq!(again.last_seq, Some(first + 1), "{first}");
    }
}

/// A write that fails records nothing it did not append: the retry appends
/// every event (an id recorded before a failed append made the retry drop it).
pub async fn a_failed_write_records_nothing_it_did_not_append(target: &dyn SinkTarget) {
    let stream = unique_name("sink");
    open(target, &stream, 1).await;
    write(target, &stream, 1, &events(&stream, 1..=3)).await;
    target.break_stream(&stream, true).await;
    let failed = target
        .sink()
        .write(SinkBatch {
            stream_id: &stream,
            fence_token: 1,
            events: &events(&stream, 4..=6),
        })
        .await;
    assert!(failed.is_err(), "{failed:?}");
    target.break_stream(&stream, false).await;
    let retry = write(target, &stream, 1, &events(&stream, 4..=6)).await;
    assert_eq!((retry.accepted, retry.duplicate), (3, 0));
    assert_eq!(seqs(&target.stored(&stream).await), [1, 2, 3, 4, 5, 6]);
}

/// A write before the open (or under a higher token than the open's) is
/// refused and sends nothing: with the fence in the id, a higher token is
/// appended whatever its sequence, so it would store a replay twice.
pub async fn a_write_before_the_open_is_refused(target: &dyn SinkTarget) {
    let stream = unique_name("sink");
    let refused = target
        .sink()
        .write(SinkBatch {
            stream_id: &stream,
            fence_token: 1,
            events: &events(&stream, 1..=2),
        })
        .await;
    assert!(
        matches!(refused, Err(SinkError::NotOpen { fence_token: 1, .. })),
        "{refused:?}"
    );
    open(target, &stream, 1).await;
    write(target, &stream, 1, &events(&stream, 1..=2)).await;
    let higher = target
        .sink()
        .write(SinkBatch {
            stream_id: &stream,
            fence_token: 2,
            events: &events(&stream, 1..=3),
        })
        .await;
    assert!(
        matches!(higher, Err(SinkError::NotOpen { fence_token: 2, .. })),
        "{higher:?}"
    );
    assert_eq!(seqs(&target.stored(&stream).await), [1, 2]);
}

/// Calls `call` until it is not `Unavailable` (the first calls after a lost
/// connection may fail on it while the client reconnects), at most 20 times.
async fn past_the_reconnect<T, F, Fut>(mut call: F) -> Result<T, SinkError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, SinkError>>,
{
    let mut last = None;
    for _ in 0..20 {
        match call().await {
            Err(SinkError::Unavailable(why)) => {
                last = Some(why);
                tokio::time::sleep(std::time::Duration::from_millis(50)).await
            }
            other => return other,
        }
    }
    Err(SinkError::Unavailable(last.unwrap_or_default()))
}

/// After a failover of a stream written to 10 under token 1, its next batch
/// (11, 12) is refused as `NotOpen`: nothing lands above a lost tail. The
/// first calls after a lost connection may fail on it (Redis) first.
async fn the_next_write_is_refused_until_reopened(target: &dyn SinkTarget, stream: &str) {
    let sink = target.sink();
    let next = events(stream, 11..=12);
    let refused = past_the_reconnect(|| {
        sink.write(SinkBatch {
            stream_id: stream,
            fence_token: 1,
            events: &next,
        })
    })
    .await;
    assert!(
        matches!(refused, Err(SinkError::NotOpen { .. })),
        "{refused:?}"
    );
}

/// After a failover that lost the stream's tail, the next write asks for a
/// new open (nothing is written above the hole), the open tells where the
/// stream really ends, and the owner fills the hole from there: each
/// sequence once, in order, no gap.
pub async fn a_lost_tail_is_found_by_the_next_open(target: &dyn SinkTarget) {
    let stream = unique_name("sink");
    open(target, &stream, 1).await;
    write(target, &stream, 1, &events(&stream, 1..=10)).await;
    target.fail_over(&stream, 4).await;
    the_next_write_is_refused_until_reopened(target, &stream).await;
    let sink = target.sink();
    let reopened = past_the_reconnect(|| sink.open(&stream, 1)).await;
    let reopened = reopened.expect("opened again");
    assert_eq!((reopened.last_seq, reopened.fenced), (Some(6), false));
    let refill = write(target, &stream, 1, &events(&stream, 7..=12)).await;
    assert_eq!((refill.accepted, refill.duplicate), (6, 0));
    assert_eq!(
        seqs(&target.stored(&stream).await),
        (1..=12).collect::<Vec<_>>()
    );
}

/// A connection lost while the stream was idle (a failover between two
/// batches) is found before the next write, however the client learns of it
/// (a RESP3 client reconnects at once, with no call failing): the write is
/// refused until the stream is opened again, so nothing lands above a lost
/// tail.
pub async fn a_connection_lost_while_idle_is_found_before_the_next_write(target: &dyn SinkTarget) {
    let stream = unique_name("sink");
    open(target, &stream, 1).await;
    write(target, &stream, 1, &events(&stream, 1..=10)).await;
    target.fail_over(&stream, 4).await;
    // Long enough for a client that reconnects by itself to have done so.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    the_next_write_is_refused_until_reopened(target, &stream).await;
    assert_eq!(
        seqs(&target.stored(&stream).await),
        (1..=6).collect::<Vec<_>>()
    );
}

/// A gap marker is an entry at its last missing sequence: read back with its
/// range, reason and token and no payload, in order between the events; the
/// next owner resumes after it; a replayed marker is dropped like an event.
pub async fn gap_markers_stand_where_the_data_is_missing(target: &dyn SinkTarget) {
    let stream = unique_name("sink");
    open(target, &stream, 2).await;
    let mut batch = events(&stream, 1..=2);
    batch.push(SinkEvent::gap(3, 9, GapReason::NoReplay));
    batch.extend(events(&stream, 10..=10));
    let outcome = write(target, &stream, 2, &batch).await;
    assert_eq!((outcome.accepted, outcome.duplicate), (4, 0));
    let stored = target.stored(&stream).await;
    assert_eq!(seqs(&stored), [1, 2, 9, 10]);
    let marker = &stored[2];
    assert_eq!(
        marker.gap,
        Some(GapMark {
            from: 3,
            reason: GapReason::NoReplay
        })
    );
    assert_eq!((marker.covers(), marker.fence_token), (3..=9, 2));
    assert!(marker.payload.is_empty() && marker.event_id.is_empty());
    assert_eq!(stored[3].gap, None);
    // A stream whose newest entry is a marker resumes after it.
    write(
        target,
        &stream,
        2,
        &[SinkEvent::gap(11, 20, GapReason::Retention)],
    )
    .await;
    let opened = target.sink().open(&stream, 3).await.expect("open");
    assert_eq!(opened.last_seq, Some(20));
    // A takeover's replay of a marker and the events before it appends nothing twice.
    let mut replay = vec![SinkEvent::gap(11, 20, GapReason::Retention)];
    replay.extend(events(&stream, 21..=21));
    let outcome = write(target, &stream, 3, &replay).await;
    assert_eq!((outcome.accepted, outcome.duplicate), (1, 1));
    assert_eq!(seqs(&target.stored(&stream).await), [1, 2, 9, 10, 20, 21]);
    for reason in GapReason::ALL {
        let stream = unique_name("sink-reason");
        open(target, &stream, 1).await;
        write(target, &stream, 1, &[SinkEvent::gap(1, 4, reason)]).await;
        assert_eq!(
            target.stored(&stream).await[0].gap.map(|g| g.reason),
            Some(reason)
        );
    }
}

/// A zombie's gap marker is fenced like any write: nothing of it is stored.
pub async fn a_zombie_marker_is_fenced(target: &dyn SinkTarget) {
    let stream = unique_name("sink");
    open(target, &stream, 1).await;
    write(target, &stream, 1, &events(&stream, 1..=2)).await;
    open(target, &stream, 2).await;
    let zombie = write(
        target,
        &stream,
        1,
        &[SinkEvent::gap(3, 7, GapReason::NoReplay)],
    )
    .await;
    assert_eq!((zombie.fenced, zombie.accepted), (1, 0));
    assert!(zombie.is_fenced());
    assert_eq!(seqs(&target.stored(&stream).await), [1, 2]);
}

/// An order book's snapshot is an entry at the sequence it is the book at,
/// its body as received under `snapshot`; one that replaces missed diffs
/// also carries their range and reason. Ids strictly increase through
/// diffs, marker, snapshot and diffs again; a replayed snapshot is dropped
/// like an event, and a zombie's is fenced.
pub async fn snapshots_stand_between_the_diffs_they_follow(target: &dyn SinkTarget) {
    let stream = unique_name("sink-book");
    open(target, &stream, 1).await;
    let body = r#"{"lastUpdateId":40,"bids":[["7.61","2"]],"asks":[["7.62","297"]]}"#;
    let resync = SinkEvent::snapshot(
        40,
        body,
        Some(GapMark {
            from: 13,
            reason: GapReason::NoReplay,
        }),
    );
    let mut batch = events(&stream, 10..=12);
    batch.push(resync.clone());
    batch.extend(events(&stream, 41..=42));
    batch.push(SinkEvent::snapshot(50, r#"{"lastUpdateId":50}"#, None));
    let outcome = write(target, &stream, 1, &batch).await;
    assert_eq!((outcome.accepted, outcome.duplicate), (7, 0));
    let stored = target.stored(&stream).await;
    assert_eq!(seqs(&stored), [10, 11, 12, 40, 41, 42, 50]);
    let snapshot = &stored[3];
    assert!(snapshot.snapshot && !stored[2].snapshot);
    assert_eq!(snapshot.payload, body, "the body as received");
    assert_eq!((snapshot.fence_token, snapshot.event_id.as_str()), (1, ""));
    assert_eq!(
        snapshot.gap,
        Some(GapMark {
            from: 13,
            reason: GapReason::NoReplay
        })
    );
    assert_eq!(snapshot.covers(), 13..=40);
    assert_eq!((stored[6].snapshot, stored[6].gap), (true, None));
    // A takeover resumes after the last snapshot; its replay adds nothing.
    assert_eq!(open(target, &stream, 2).await.last_seq, Some(50));
    let replay = write(target, &stream, 2, &[resync]).await;
    assert_eq!((replay.accepted, replay.duplicate), (0, 1));
    // The old owner's snapshot is fenced: nothing of it is stored.
    let zombie = write(
        target,
        &stream,
        1,
        &[SinkEvent::snapshot(60, r#"{"lastUpdateId":60}"#, None)],
    )
    .await;
    assert!(zombie.is_fenced(), "{zombie:?}");
    assert_eq!(target.stored(&stream).await.len(), 7);
}

/// A new epoch (the upstream's sequence started over) is a reset entry at
/// `<new token>-<reset_to - 1>`: below the old sequence, above every old id,
/// so the old epoch's writer is fenced and the new sequence is appended after
/// it. Opening it again under the same token (a retry) adds nothing; a
/// takeover resumes after it.
pub async fn a_new_epoch_starts_with_its_reset_entry(target: &dyn SinkTarget) {
    let stream = unique_name("sink");
    open(target, &stream, 4).await;
    write(target, &stream, 4, &events(&stream, 60_107..=60_108)).await;
    let reset = ResetMark {
        from: 60_108,
        to: 1,
    };
    let opened = target
        .sink()
        .open_epoch(&stream, 5, reset)
        .await
        .expect("open_epoch");
    assert_eq!((opened.fenced, opened.last_seq), (false, Some(0)));
    let again = target
        .sink()
        .open_epoch(&stream, 5, reset)
        .await
        .expect("open_epoch again");
    assert_eq!((again.fenced, again.last_seq), (false, Some(0)));
    let outcome = write(target, &stream, 5, &events(&stream, 1..=2)).await;
    assert_eq!((outcome.accepted, outcome.duplicate), (2, 0));
    // The old epoch's writer is fenced, even above the new sequence.
    let zombie = write(target, &stream, 4, &events(&stream, 60_109..=60_109)).await;
    assert!(zombie.is_fenced(), "{zombie:?}");
    let stored = target.stored(&stream).await;
    assert_eq!(seqs(&stored), [60_107, 60_108, 0, 1, 2]);
    let entry = &stored[2];
    assert_eq!(entry.reset, Some(reset));
    assert_eq!((entry.fence_token, entry.gap), (5, None));
    assert!(entry.payload.is_empty() && entry.event_id.is_empty());
    assert!(entry.covers().is_empty());
    // A takeover resumes in the new epoch.
    assert_eq!(open(target, &stream, 6).await.last_seq, Some(2));
}

/// A zombie's new epoch is fenced like any open: nothing is stored, and a
/// reset entry on a stream that does not exist yet starts it.
pub async fn a_zombie_epoch_is_fenced(target: &dyn SinkTarget) {
    let stream = unique_name("sink");
    open(target, &stream, 7).await;
    write(target, &stream, 7, &events(&stream, 10..=11)).await;
    let reset = ResetMark { from: 11, to: 3 };
    let zombie = target
        .sink()
        .open_epoch(&stream, 6, reset)
        .await
        .expect("open_epoch");
    assert!(zombie.fenced, "{zombie:?}");
    assert_eq!(zombie.highest_token, 7);
    assert_eq!(seqs(&target.stored(&stream).await), [10, 11]);
    let fresh = unique_name("sink");
    let opened = target
        .sink()
        .open_epoch(&fresh, 2, reset)
        .await
        .expect("open_epoch");
    assert_eq!((opened.fenced, opened.last_seq), (false, Some(2)));
    write(target, &fresh, 2, &events(&fresh, 3..=3)).await;
    assert_eq!(seqs(&target.stored(&fresh).await), [2, 3]);
}

/// Streams have their own fence and sequence.
pub async fn streams_are_independent(target: &dyn SinkTarget) {
    let a = unique_name("sink-a");
    let b = unique_name("sink-b");
    open(target, &a, 9).await;
    open(target, &b, 1).await;
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
            replays_of_any_length_are_dropped,
            unordered_batches_are_refused_whole,
            opening_raises_the_fence_and_returns_the_last_sequence,
            sequences_are_exact_up_to_the_largest,
            a_failed_write_records_nothing_it_did_not_append,
            streams_are_independent,
            a_write_before_the_open_is_refused,
            a_lost_tail_is_found_by_the_next_open,
            a_connection_lost_while_idle_is_found_before_the_next_write,
            gap_markers_stand_where_the_data_is_missing,
            a_zombie_marker_is_fenced,
            snapshots_stand_between_the_diffs_they_follow,
            a_new_epoch_starts_with_its_reset_entry,
            a_zombie_epoch_is_fenced,
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                if let Some(target) = $make.await {
                    $crate::sink::$case(&target).await;
                }
            }
        )*
    };
}
