//! A held stream's intake: each upstream arrival through the `Sequencer`'s
//! rules, and the history page a backfill is fetching. Apart from the write
//! path (`window`) because it decides what is written, not how.

use std::time::Duration;

use leasehold_control::keeper::HeldLease;
use leasehold_control::sequence::{Arrival, Sequencer, Step};
use leasehold_sink::SinkEvent;
use leasehold_telemetry::{BackfillResult, SkipReason, TelemetryEvent};
use tokio::time::{Instant, sleep};
use tokio_util::task::AbortOnDropHandle;

use super::{Progress, RunnerContext, accept};
use crate::upstream::history::{HistoryError, fetch_page};
use crate::upstream::{UpstreamError, UpstreamEvent};

/// A history page being fetched: its task ends with the page or the reason
/// the range is given up (aborted when the stream stops).
pub(super) type PageFetch = AbortOnDropHandle<Result<Vec<UpstreamEvent>, HistoryError>>;

/// Between the upstream and the sink: what each arrival means
/// ([`Sequencer`], the rules) and the backfill those rules may ask for.
pub(super) struct Intake<'a> {
    pub(super) context: &'a RunnerContext,
    pub(super) lease: &'a HeldLease,
    pub(super) sequencer: &'a mut Sequencer<UpstreamEvent>,
    /// Scratch for the sequencer's steps (kept to reuse its allocation).
    pub(super) steps: Vec<Step<UpstreamEvent>>,
    pub(super) fetch: Option<PageFetch>,
    /// Pages in a row that brought the backfill no further.
    pub(super) empty_pages: u32,
    /// The backfill under way, reported when it ends.
    pub(super) backfill: Option<BackfillRun>,
    /// The sequence started over: the old epoch is written out, then the
    /// stream goes on in a new one ([`super::run_stream`]).
    pub(super) reset: Option<PendingReset>,
}

/// A reset the sequencer found, waiting for its new epoch.
pub(super) struct PendingReset {
    /// The last position before (`reset_from`).
    pub(super) from: u64,
    /// The first sequence after (`reset_to`).
    pub(super) to: u64,
    /// The sequencer's steps after the reset: the new epoch's first.
    pub(super) after: Vec<Step<UpstreamEvent>>,
}

/// One backfill from its first request to its end, for
/// [`TelemetryEvent::StreamBackfill`].
#[derive(Debug)]
pub(super) struct BackfillRun {
    started: Instant,
    pages: u32,
    events: u64,
    /// Part of the range was recorded as a gap.
    gap: bool,
}

impl Drop for Intake<'_> {
    fn drop(&mut self) {
        // The stream stopped (lost, drained, the sink gave up) mid-backfill.
        self.end_backfill(BackfillResult::Stopped);
    }
}

impl Intake<'_> {
    /// Reading the upstream pauses while the held events of a backfill are
    /// at their bound, in count or in bytes, and once a reset waits for its
    /// epoch.
    pub(super) fn may_read(&self) -> bool {
        let config = &self.context.config;
        self.reset.is_none()
            && self.sequencer.held() < config.backfill_hold_max.max(1)
            && self.sequencer.held_weight() < config.hold_max_bytes.max(1)
    }

    /// One live event, through the rules into `pending`. `Err` (replay mode):
    /// the upstream skipped sequences and must be asked again.
    pub(super) fn arrive(
        &mut self,
        progress: &mut Progress,
        pending: &mut Vec<SinkEvent>,
        event: UpstreamEvent,
    ) -> Result<(), UpstreamError> {
        let mut steps = std::mem::take(&mut self.steps);
        let arrival = self.sequencer.arrive(event.seq, event, &mut steps);
        if arrival == Arrival::Replayed {
            self.context
                .telemetry
                .emit(TelemetryEvent::UpstreamFrameSkipped {
                    stream_id: self.lease.stream_id.clone(),
                    reason: SkipReason::Duplicate,
                });
        }
        self.apply(progress, pending, steps)
    }

    /// Carries out the sequencer's steps in order.
    pub(super) fn apply(
        &mut self,
        progress: &mut Progress,
        pending: &mut Vec<SinkEvent>,
        mut steps: Vec<Step<UpstreamEvent>>,
    ) -> Result<(), UpstreamError> {
        let mut result = Ok(());
        let mut steps_left = steps.drain(..);
        while let Some(step) = steps_left.next() {
            match step {
                Step::BehindDropped { frames } => {
                    for _ in 0..frames {
                        self.context
                            .telemetry
                            .emit(TelemetryEvent::UpstreamFrameSkipped {
                                stream_id: self.lease.stream_id.clone(),
                                reason: SkipReason::Duplicate,
                            });
                    }
                }
                Step::Reset { from, to } => {
                    self.reset = Some(PendingReset {
                        from,
                        to,
                        after: steps_left.by_ref().collect(),
                    });
                }
                Step::Event(_, event) => {
                    // Liveness moves only with what is written: frames
                    // dropped as replays or jumps must not make a stream that
                    // writes nothing look fresh.
                    progress.last_event_at = event.received_at;
                    progress.last_arrival_lag = event.arrival_lag;
                    accept(progress, pending, event)
                }
                Step::JumpDiscarded { seq } => {
                    tracing::warn!(
                        stream_id = self.lease.stream_id,
                        seq,
                        "dropped a frame whose sequence jumps past UPSTREAM_MAX_JUMP and that the next frames did not confirm"
                    );
                    self.context
                        .telemetry
                        .emit(TelemetryEvent::UpstreamFrameSkipped {
                            stream_id: self.lease.stream_id.clone(),
                            reason: SkipReason::Jump,
                        });
                }
                Step::Gap { from, to, reason } => {
                    progress.first_seq.get_or_insert(from);
                    if pending.is_empty() {
                        progress.unpersisted.push_back((to, Instant::now()));
                    }
                    progress.received = progress.received.max(to);
                    pending.push(SinkEvent::gap(from, to, reason));
                }
                Step::Backfill { from, to } => {
                    self.backfill.get_or_insert_with(|| BackfillRun {
                        started: Instant::now(),
                        pages: 0,
                        events: 0,
                        gap: false,
                    });
                    tracing::info!(
                        stream_id = self.lease.stream_id,
                        from_seq = from,
                        to_seq = to,
                        "backfilling missed events from the history"
                    );
                    self.empty_pages = 0;
                    self.start_fetch(Duration::ZERO);
                }
                Step::Reconnect { expected, got } => {
                    result = Err(UpstreamError::Gap { expected, got });
                }
            }
        }
        drop(steps_left);
        self.steps = steps;
        if !self.sequencer.backfilling() {
            let ended = match &self.backfill {
                Some(run) if run.gap => BackfillResult::Gap,
                _ => BackfillResult::Filled,
            };
            self.end_backfill(ended);
        }
        result
    }

    /// Reports the backfill under way, if any, as ended with `result`.
    fn end_backfill(&mut self, result: BackfillResult) {
        let Some(run) = self.backfill.take() else {
            return;
        };
        self.context.telemetry.emit(TelemetryEvent::StreamBackfill {
            stream_id: self.lease.stream_id.clone(),
            result,
            pages: run.pages,
            events: run.events,
            duration: run.started.elapsed(),
        });
    }

    /// Starts fetching the next page of the running backfill after `delay`.
    pub(super) fn start_fetch(&mut self, delay: Duration) {
        let Some((from, to)) = self.sequencer.backfill_range() else {
            return;
        };
        let Some((history, config)) = self.context.history.clone() else {
            // Settings require a history for `backfill`; a runner built
            // without one has nothing to fetch from.
            self.fetch = Some(AbortOnDropHandle::new(tokio::spawn(async {
                Err(HistoryError::Refused("no history configured".into()))
            })));
            return;
        };
        let stream_id = self.lease.stream_id.clone();
        self.fetch = Some(AbortOnDropHandle::new(tokio::spawn(async move {
            sleep(delay).await;
            fetch_page(&*history, &config, &stream_id, from, to).await
        })));
    }

    /// The running fetch's result (never resolves without one).
    pub(super) async fn next_page(
        &mut self,
    ) -> Result<Result<Vec<UpstreamEvent>, HistoryError>, tokio::task::JoinError> {
        match self.fetch.as_mut() {
            Some(fetch) => fetch.await,
            None => std::future::pending().await,
        }
    }

    /// A page arrived, or the range was given up.
    pub(super) fn page_landed(
        &mut self,
        progress: &mut Progress,
        pending: &mut Vec<SinkEvent>,
        joined: Result<Result<Vec<UpstreamEvent>, HistoryError>, tokio::task::JoinError>,
    ) {
        self.fetch = None;
        let range = self.sequencer.backfill_range();
        let mut steps = std::mem::take(&mut self.steps);
        let mut moved = true;
        match joined {
            Ok(Ok(events)) => {
                let page = events.into_iter().map(|event| (event.seq, event)).collect();
                moved = self.sequencer.backfilled(page, &mut steps);
                self.empty_pages = if moved { 0 } else { self.empty_pages + 1 };
                if !moved && self.empty_pages >= self.context.config.backfill_empty_pages {
                    tracing::warn!(
                        stream_id = self.lease.stream_id,
                        ?range,
                        "the history has nothing more for this range; recording the rest as a gap"
                    );
                    self.sequencer.backfill_gave_up(&mut steps);
                }
            }
            Ok(Err(error)) => {
                tracing::warn!(stream_id = self.lease.stream_id, ?range, %error, "backfill gave up; recording the rest as a gap");
                self.sequencer.backfill_gave_up(&mut steps);
            }
            Err(join) => {
                tracing::warn!(stream_id = self.lease.stream_id, ?range, error = %join, "backfill task failed; recording the rest as a gap");
                self.sequencer.backfill_gave_up(&mut steps);
            }
        }
        if let Some(run) = &mut self.backfill {
            run.pages += 1;
            // History events are the ones inside the range; the held live
            // events released after them are beyond it.
            let in_range = |seq: u64| range.is_some_and(|(_, to)| seq <= to);
            for step in &steps {
                match step {
                    Step::Event(seq, _) if in_range(*seq) => run.events += 1,
                    Step::Gap { .. } => run.gap = true,
                    _ => {}
                }
            }
        }
        // Replays do not come back from history; a hole in held events
        // starts the next backfill inside `apply`.
        let _ = self.apply(progress, pending, steps);
        if self.sequencer.backfilling() && self.fetch.is_none() {
            let wait = if moved {
                Duration::ZERO
            } else {
                self.context.config.backfill_empty_wait
            };
            self.start_fetch(wait);
        } else if !self.sequencer.backfilling() {
            tracing::info!(stream_id = self.lease.stream_id, ?range, "backfill done");
        }
    }
}
