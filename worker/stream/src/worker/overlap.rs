//! Overlapping hand-offs (`HANDOFF_PREPARE_TIMEOUT_MS`): on a drain, the
//! successor subscribes a stream before the predecessor releases it, so a
//! `live` upstream loses nothing in between.
//!
//! 1. The draining worker sends its successor a prepare
//!    ([`crate::handoff::Hint::Prepare`]) for each stream it holds.
//! 2. The successor subscribes the stream, holds its frames, and answers
//!    with the first sequence it holds ([`crate::handoff::Hint::Ready`]).
//! 3. The predecessor writes until the sink confirmed everything before
//!    that sequence ([`crate::machine::Input::DrainAfter`]), releases, and
//!    pushes the stream ([`crate::handoff::Hint::Take`]).
//! 4. The successor's acquire raises the fence; its runner starts on the
//!    prepared subscription, where the frames up to the sink's last sequence
//!    are replays and the next one continues it.
//!
//! Every step is a hint: a successor that does not answer within the prepare
//! timeout gets the stream as before (release, push), a prepared stream
//! nobody hands over is dropped after a while, and only the acquire decides
//! who writes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use crate::handoff::HandoffSocket;
use crate::upstream::{Subscription, Upstream, UpstreamError, UpstreamEvent};

/// Frames a prepared stream holds at most; past that the subscription ends
/// (its runner reconnects, and its resume mode judges the hole).
const PREPARED_FRAMES: usize = 65_536;

/// Streams this worker subscribed for a draining peer, until it acquires
/// them or they expire.
#[derive(Default)]
pub(super) struct PreparedStreams {
    streams: HashMap<String, (PreparedSubscription, Instant)>,
}

impl PreparedStreams {
    /// Subscribes `stream` for the peer at `reply`, which is told the first
    /// sequence held; kept for `keep`. A stream already prepared, or one
    /// past `most` prepared at once, is left alone.
    pub(super) fn prepare(
        &mut self,
        upstream: Arc<dyn Upstream>,
        socket: HandoffSocket,
        (stream, reply): (String, SocketAddr),
        keep: Duration,
        most: usize,
    ) {
        let now = Instant::now();
        self.streams.retain(|_, (_, until)| *until > now);
        if self.streams.contains_key(&stream) || self.streams.len() >= most {
            return;
        }
        let subscription = PreparedSubscription::start(upstream, socket, stream.clone(), reply);
        self.streams.insert(stream, (subscription, now + keep));
    }

    /// The prepared subscription of `stream`, if there is one still kept.
    pub(super) fn take(&mut self, stream: &str) -> Option<Box<dyn Subscription>> {
        let (subscription, until) = self.streams.remove(stream)?;
        (until > Instant::now()).then(|| Box::new(subscription) as Box<dyn Subscription>)
    }
}

/// A subscription made before its lease: a task reads it and holds the
/// frames for the runner.
pub(crate) struct PreparedSubscription {
    frames: mpsc::Receiver<Result<UpstreamEvent, UpstreamError>>,
    _reader: AbortOnDropHandle<()>,
}

impl PreparedSubscription {
    fn start(
        upstream: Arc<dyn Upstream>,
        socket: HandoffSocket,
        stream: String,
        reply: SocketAddr,
    ) -> Self {
        let (frames, rx) = mpsc::channel(PREPARED_FRAMES);
        let reader = tokio::spawn(async move {
            let mut subscription = match upstream.subscribe(&stream, 0).await {
                Ok(subscription) => subscription,
                Err(error) => {
                    let _ = frames.send(Err(error)).await;
                    return;
                }
            };
            let mut answered = false;
            loop {
                let next = subscription.next().await;
                if !answered && let Ok(event) = &next {
                    answered = true;
                    let first = event.first_seq.unwrap_or(event.seq);
                    socket.ready(reply, &stream, first).await;
                }
                let ended = next.is_err();
                // Full: the subscription ends here, and the runner sees the
                // end after the frames held.
                if frames.try_send(next).is_err() || ended {
                    subscription.close().await;
                    return;
                }
            }
        });
        PreparedSubscription {
            frames: rx,
            _reader: AbortOnDropHandle::new(reader),
        }
    }
}

fn ended() -> UpstreamError {
    UpstreamError::Closed("the subscription prepared for a hand-off ended".into())
}

#[async_trait::async_trait]
impl Subscription for PreparedSubscription {
    async fn next(&mut self) -> Result<UpstreamEvent, UpstreamError> {
        self.frames.recv().await.unwrap_or_else(|| Err(ended()))
    }

    fn next_ready(&mut self) -> Option<Result<UpstreamEvent, UpstreamError>> {
        match self.frames.try_recv() {
            Ok(next) => Some(next),
            Err(mpsc::error::TryRecvError::Empty) => None,
            Err(mpsc::error::TryRecvError::Disconnected) => Some(Err(ended())),
        }
    }

    async fn resubscribe(&mut self) -> Result<(), UpstreamError> {
        Err(UpstreamError::Closed(
            "a prepared subscription asks for a new book by reconnecting".into(),
        ))
    }

    async fn close(&mut self) {
        self.frames.close();
    }
}
