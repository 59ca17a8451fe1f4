//! (c) The peer: the consumer a user would write without leasehold, the
//! yardstick the other cases are read against. Apart because it shares no
//! code with leasehold's path by design.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures_util::stream::FuturesOrdered;
use futures_util::{FutureExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use super::{Probe, subscribe_raw};

/// What a plain consumer reads from each frame.
#[derive(serde::Deserialize)]
pub(super) struct PeerEvent<'a> {
    seq: u64,
    #[serde(borrow)]
    event_id: std::borrow::Cow<'a, str>,
}

const PEER_BATCH: usize = 500;
const PEER_IN_FLIGHT: usize = 4;

/// (c) The consumer a user would write without leasehold: serde-derive the two
/// fields, batch what has arrived, pipeline `XADD`s with up to four pipelines
/// in flight on the shared multiplexed connection. No fence, no de-duplication,
/// no checkpoint.
pub(super) async fn peer(
    url: String,
    stream: String,
    limit: Option<u64>,
    redis: redis::aio::MultiplexedConnection,
    probe: Arc<Probe>,
) {
    let key = format!("peer:{stream}");
    let mut socket = subscribe_raw(&url, &stream).await;
    let mut batch = PeerBatch::default();
    let mut in_flight = FuturesOrdered::new();
    let mut read = 0u64;
    let mut confirmed = 0u64;
    let more = |read: u64| limit.is_none_or(|limit| read < limit);
    loop {
        if limit.is_some_and(|limit| confirmed >= limit) {
            break;
        }
        let reading = batch.count < PEER_BATCH && more(read);
        tokio::select! {
            biased;
            Some((count, frames)) = in_flight.next(), if !in_flight.is_empty() => {
                let frames: Vec<String> = frames;
                probe.record(frames.iter().map(String::as_str));
                confirmed += count;
                probe.done.fetch_add(count, Ordering::Relaxed);
            }
            message = socket.next(), if reading => {
                match message {
                    Some(Ok(Message::Text(text))) => read += batch.add(&key, text.as_str(), &probe),
                    Some(Ok(_)) => {}
                    other => panic!("feed ended early: {other:?}"),
                }
                while batch.count < PEER_BATCH && more(read) {
                    match socket.next().now_or_never() {
                        Some(Some(Ok(Message::Text(text)))) => {
                            read += batch.add(&key, text.as_str(), &probe)
                        }
                        Some(Some(Ok(_))) => {}
                        Some(other) => panic!("feed ended early: {other:?}"),
                        None => break,
                    }
                }
            }
        }
        if batch.count > 0 && in_flight.len() < PEER_IN_FLIGHT {
            let sent = std::mem::take(&mut batch);
            let mut connection = redis.clone();
            in_flight.push_back(async move {
                sent.pipe
                    .query_async::<()>(&mut connection)
                    .await
                    .expect("XADD");
                (sent.count as u64, sent.frames)
            });
        }
    }
}

/// The peer's next pipeline.
#[derive(Default)]
pub(super) struct PeerBatch {
    pipe: redis::Pipeline,
    count: usize,
    /// The frames, while latency is recorded.
    frames: Vec<String>,
}

impl PeerBatch {
    /// Adds one frame's `XADD`; 1 if it was an event.
    fn add(&mut self, key: &str, text: &str, probe: &Probe) -> u64 {
        let Ok(event) = serde_json::from_str::<PeerEvent>(text) else {
            return 0;
        };
        self.pipe
            .cmd("XADD")
            .arg(key)
            .arg("*")
            .arg("seq")
            .arg(event.seq)
            .arg("event_id")
            .arg(event.event_id.as_ref())
            .arg("payload")
            .arg(text)
            .ignore();
        self.count += 1;
        if probe.recording() {
            self.frames.push(text.to_owned());
        }
        1
    }
}
