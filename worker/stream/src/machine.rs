//! One held stream's state and every decision about it, free of I/O, of
//! async code and of any clock: [`StreamMachine`], in quinn-proto's shape.
//! The runner ([`crate::runner`]) is the driver: it feeds what happened
//! ([`Input`], with `now` passed in), carries out what the machine asks
//! ([`StreamMachine::poll_action`]: subscribe, write, re-open, fetch, emit,
//! stage a checkpoint, start an epoch, stop), and sleeps until
//! [`StreamMachine::poll_timeout`].
//!
//! What the machine owns: the progress (confirmed, received, what is not
//! persisted yet, liveness), the [`Sequencer`] (replays, holes, jumps,
//! resets, the backfill's held events), the batch being gathered and the one
//! write slot (one batch per stream in flight: with the fence in the entry
//! id, a batch sent past one that failed would land above the hole for
//! good), the sink failure budget, the upstream's reconnect schedule and a
//! running backfill. What it leaves to the driver: the lease (its validity is
//! checked by the driver before every write and open, invariant 4), the
//! connections, and the history requests.
//!
//! Its behaviour is tested as input scripts without a runtime
//! (`machine/tests.rs`); the runner's own tests drive it through the fakes.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crate::book::{BookFormat, BookKeeper, ChecksumRule, Verdict};
use crate::numbering::Numbering;
use crate::sequence::{Arrival, ResumeMode, Sequencer, Snapshotted, Step};
use leasehold_control::protocol;
use leasehold_sink::{GapMark, OpenOutcome, SinkError, SinkEvent, WriteOutcome};
use leasehold_telemetry::{
    BackfillResult, BackfillWait, GapReason, LossReason, SkipReason, SnapshotReason, TelemetryEvent,
};
use tokio::time::Instant;

use crate::runner::RunnerConfig;
use crate::upstream::history::HistoryError;
use crate::upstream::{UpstreamError, UpstreamEvent};

mod slot;

/// How long an in-band ask for a book (unsubscribe, subscribe) waits for
/// the book before it is made again. Exchanges answer in well under a
/// second; a book that takes longer is most likely never coming.
pub const BOOK_ASK_DEADLINE: Duration = Duration::from_secs(5);

/// In-band asks one connection may leave unanswered before it is replaced.
pub const UNANSWERED_ASKS_BEFORE_RECONNECT: u32 = 3;

/// What happened, as the driver saw it.
#[derive(Debug, Clone)]
pub enum Input {
    /// The connection asked for by [`Action::Subscribe`] is up.
    Subscribed,
    /// It could not be made.
    SubscribeFailed(UpstreamError),
    /// A frame arrived on it.
    Frame(UpstreamEvent),
    /// It failed or was closed by the server.
    UpstreamFailed(UpstreamError),
    /// The write asked for by [`Action::Write`] replied.
    Written {
        /// The sink's reply.
        result: Result<WriteOutcome, SinkError>,
        /// When it was sent (for its duration).
        started: Instant,
    },
    /// The open asked for by [`Action::Reopen`] replied.
    Reopened(Result<OpenOutcome, SinkError>),
    /// The page asked for by [`Action::Fetch`] came (or the range was given up).
    Page(Result<Vec<UpstreamEvent>, HistoryError>),
    /// The order book's snapshot asked for by [`Action::FetchSnapshot`] came
    /// (its sequence at `seq`, its body as `payload`), or could not be read.
    Snapshot(Result<UpstreamEvent, HistoryError>),
    /// The new epoch asked for by [`Action::StartEpoch`] started: the lease's
    /// token was lifted to `fence_token` and the sink holds the reset entry.
    EpochStarted {
        /// The new epoch's token.
        fence_token: u64,
    },
    /// Write what is pending, then stop (`Stop::Drain`).
    Drain,
    /// Drain once the sink confirmed through this sequence: a successor
    /// that subscribed before the release holds what follows (an
    /// overlapping hand-off, `HANDOFF_PREPARE_TIMEOUT_MS`). Consuming goes
    /// on until then.
    DrainAfter(u64),
    /// Ownership is gone: no further side effect.
    Lost(LossReason),
}

/// What the driver must do, in this order.
#[derive(Debug, Clone)]
pub enum Action {
    /// Connect and subscribe from `from` (a `replay` upstream honours it).
    Subscribe {
        /// The first sequence wanted (0: wherever the upstream is).
        from: u64,
    },
    /// Close the connection (without a reconnect of its own).
    Close,
    /// Write this batch under the machine's token (after checking the lease).
    Write(Arc<Vec<SinkEvent>>),
    /// Open the stream again under the machine's token (after a lost sink
    /// connection) and report what it found.
    Reopen,
    /// Fetch a page of `from..=to` from the history after waiting `after`.
    Fetch {
        /// First sequence wanted.
        from: u64,
        /// Last sequence wanted.
        to: u64,
        /// Wait before asking.
        after: Duration,
    },
    /// Fetch the order book's snapshot after waiting `after`.
    FetchSnapshot {
        /// Wait before asking.
        after: Duration,
    },
    /// Ask the upstream for a new order-book snapshot on the connection
    /// (`UPSTREAM_UNSUBSCRIBE`, `UPSTREAM_SUBSCRIBE`); when it cannot, report
    /// [`Input::UpstreamFailed`] (the reconnect brings one).
    AskSnapshot,
    /// Drop the running fetch (its range is void).
    CancelFetch,
    /// The sink confirmed through `seq`: it rides on the next renew.
    StageCheckpoint(u64),
    /// A newer token is on the stream: tell the keeper (it stops renewing).
    ReportFenced,
    /// Report this.
    Emit(TelemetryEvent),
    /// The sequence started over: lift the lease's token for a new epoch
    /// whose checkpoint is `to - 1`, open the sink's epoch with its reset
    /// entry, then report [`Input::EpochStarted`].
    StartEpoch {
        /// `reset_from`.
        from: u64,
        /// `reset_to`.
        to: u64,
    },
}

/// Why the machine stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// Drained: everything pending was written.
    Drain,
    /// Ownership is gone.
    Lost(LossReason),
    /// The sink kept refusing (the last error): give the stream up.
    SinkFailing(String),
}

/// Where the machine is in the stream.
#[derive(Debug, Clone)]
struct Progress {
    /// Highest sequence the sink confirmed.
    confirmed: u64,
    /// Highest sequence received.
    received: u64,
    /// (first seq, received at) of each confirmed batch not yet persisted as
    /// the checkpoint, for the lag in seconds.
    unpersisted: VecDeque<(u64, Instant)>,
    /// When the last written event arrived (when the stream was opened,
    /// before the first). Liveness moves only with what is written.
    last_event_at: Instant,
    /// The last event's arrival lag behind its own time, if the upstream names it.
    last_arrival_lag: Option<f64>,
    /// What had been confirmed before the sink lost its tail, while the
    /// upstream refills it.
    refill_to: Option<u64>,
    /// The first sequence this holder took: lag counts from there (a live
    /// upstream starts at the exchange's own id).
    first_seq: Option<u64>,
}

impl Progress {
    fn at(seq: u64, last_event_at: Instant) -> Self {
        Progress {
            confirmed: seq,
            received: seq,
            unpersisted: VecDeque::new(),
            last_event_at,
            last_arrival_lag: None,
            refill_to: None,
            first_seq: None,
        }
    }
}

/// The upstream connection, as the machine sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// None; connect at this time (`None`: not yet decided).
    Down(Option<Instant>),
    /// [`Action::Subscribe`] was asked for.
    Connecting,
    /// Frames flow.
    Up,
}

/// What comes once everything pending is written.
#[derive(Debug, Clone)]
enum Then {
    /// Keep consuming (reconnecting first if the connection failed).
    Consume,
    /// Start the new epoch.
    Epoch,
    /// Stop, drained (`marked`: the refill's rest was marked already).
    Drain { marked: bool },
}

/// The write slot's batch.
#[derive(Debug, Clone)]
struct InFlight {
    /// What the upstream gave (re-sent as it is after an outage).
    events: Arc<Vec<SinkEvent>>,
    /// What was actually sent: `events`, or a `sink_lost` marker and the
    /// events after it.
    sent: Arc<Vec<SinkEvent>>,
    /// The write (or re-open) is out; `false`: waiting to be sent again.
    out: bool,
    /// The reply was a lost connection: an open comes before the resend.
    reopen: bool,
}

/// Consecutive failed sink calls: outages are retried while the lease
/// holds; refusals (a wrong key type, a script or auth error) give the
/// stream up after `sink_max_failures` of them.
#[derive(Debug, Clone, Default)]
pub(crate) struct SinkFailures {
    attempts: u32,
    refusals: u32,
}

impl SinkFailures {
    /// Counts one failed call: `Ok(wait)` before trying again, `Err` when
    /// the refusals reached `SINK_MAX_FAILURES` (an outage resets them).
    pub(crate) fn record(
        &mut self,
        err: &SinkError,
        config: &RunnerConfig,
    ) -> Result<Duration, ()> {
        if matches!(err, SinkError::Unavailable(_)) {
            self.refusals = 0;
        } else {
            self.refusals += 1;
            if self.refusals >= config.sink_max_failures {
                return Err(());
            }
        }
        let delay = config.sink_retry.delay(self.attempts);
        self.attempts = self.attempts.saturating_add(1);
        Ok(delay)
    }
}

/// One backfill from its first request to its end.
#[derive(Debug, Clone)]
struct BackfillRun {
    started: Instant,
    pages: u32,
    events: u64,
    /// Part of the range was recorded as a gap.
    gap: bool,
}

/// A reset the sequencer found, waiting for its epoch.
#[derive(Debug, Clone)]
struct PendingReset {
    from: u64,
    to: u64,
    /// The sequencer's steps after it: the new epoch's first.
    after: Vec<Step<UpstreamEvent>>,
}

/// One held stream, from its open to its stop.
#[derive(Debug, Clone)]
pub struct StreamMachine {
    config: RunnerConfig,
    stream_id: String,
    fence_token: u64,
    /// Session mode: lag runs to the sink's confirmation (the table's
    /// checkpoint is written only every `CHECKPOINT_INTERVAL_MS`).
    lives_by_session: bool,
    /// The checkpoint the table holds, as the driver last saw it.
    persisted: Option<u64>,
    progress: Progress,
    sequencer: Sequencer<UpstreamEvent>,
    /// Scratch for the sequencer's steps (kept for its allocation).
    steps: Vec<Step<UpstreamEvent>>,
    /// The batch being gathered.
    pending: Vec<SinkEvent>,
    in_flight: Option<InFlight>,
    /// A failed write or open waits until then.
    retry_at: Option<Instant>,
    failures: SinkFailures,
    link: Link,
    /// Why the connection failed; the reconnect waits until everything
    /// before the failure is written (then `replay` resumes right after
    /// what the sink confirmed).
    link_error: Option<UpstreamError>,
    /// The time of the last input.
    now: Instant,
    /// Failed connects in a row (the reconnect backoff).
    reconnects: u32,
    then: Then,
    /// Drain was asked for while an epoch was starting.
    drain_asked: bool,
    /// Drain once the sink confirmed through this ([`Input::DrainAfter`]).
    drain_after: Option<u64>,
    draining: bool,
    fetching: bool,
    empty_pages: u32,
    backfill: Option<BackfillRun>,
    /// Snapshots fetched in a row that could not be taken (unreadable, or
    /// older than the held diffs): the wait before the next.
    snapshot_attempts: u32,
    /// In-band asks for a book since the last one was taken: a book that
    /// keeps coming back unusable (at the id already written, as an
    /// unchanged book can) is asked for again after a backoff, not at once.
    asks: u32,
    /// The next in-band ask waits until then: a backoff, or the deadline
    /// of the ask made ([`BOOK_ASK_DEADLINE`]).
    ask_at: Option<Instant>,
    /// Asks made on this connection that no book answered: past
    /// [`UNANSWERED_ASKS_BEFORE_RECONNECT`] the connection is replaced.
    unanswered_asks: u32,
    /// The stream's own numbers when the upstream's sequence is not the
    /// stream's (`UPSTREAM_SEQ_SCOPE`, `UPSTREAM_SEQ_POINTER=none`).
    numbering: Numbering,
    /// The order book as the worker keeps it to check the upstream's
    /// checksums (`UPSTREAM_BOOK_CHECKSUM`), from the first snapshot on.
    book: Option<BookKeeper>,
    /// The kept book failed and a new snapshot is awaited: diffs until then
    /// are not checked.
    book_void: bool,
    /// Since when the held events are at their bound (reading paused).
    held_full_since: Option<Instant>,
    reset: Option<PendingReset>,
    /// Waiting for [`Input::EpochStarted`].
    awaiting_epoch: bool,
    next_lag_report: Instant,
    actions: VecDeque<Action>,
    stopped: Option<Stop>,
}

/// Where a new owner starts ([`StreamMachine::new`]).
#[derive(Debug)]
pub struct Start {
    /// The sequence the sink and checkpoint end at.
    pub resume: u64,
    /// The stream was ever written (a checkpoint or an entry); a live
    /// upstream starts wherever it is when it was not.
    pub anchored: bool,
    /// What the sink lost of what the checkpoint covered.
    pub lost: Option<std::ops::RangeInclusive<u64>>,
}

impl StreamMachine {
    /// A stream just opened under `fence_token` at `start`; consuming
    /// begins with a subscribe.
    pub fn new(
        config: RunnerConfig,
        stream_id: String,
        fence_token: u64,
        lives_by_session: bool,
        start: Start,
        now: Instant,
    ) -> Self {
        let mut progress = Progress::at(start.resume, now);
        let mut pending = Vec::with_capacity(config.batch_max_events.max(1));
        // The sink lost a tail the checkpoint had covered: the upstream
        // refills it, or (live) it is marked where it is missing.
        if let Some(lost) = start.lost {
            if config.resume == ResumeMode::Live {
                pending.push(SinkEvent::gap(
                    *lost.start(),
                    *lost.end(),
                    GapReason::SinkLost,
                ));
                progress.received = *lost.end();
            } else {
                progress.refill_to = Some(*lost.end());
            }
        }
        // A replay upstream is asked for everything from the first sequence;
        // a live one starts wherever it is when nothing was ever written.
        let last =
            (start.anchored || config.resume == ResumeMode::Replay).then_some(progress.received);
        let sequencer = Sequencer::new(config.resume, config.seq_step, last)
            .with_jump_bound(config.jump)
            .with_reset_after(config.jump.confirm_after)
            .with_weigher(|event: &UpstreamEvent| event.payload.len() + event.event_id.len());
        let mut machine = StreamMachine {
            stream_id,
            fence_token,
            lives_by_session,
            persisted: None,
            progress,
            sequencer,
            steps: Vec::new(),
            pending,
            in_flight: None,
            retry_at: None,
            failures: SinkFailures::default(),
            link: Link::Down(None),
            link_error: None,
            now,
            reconnects: 0,
            then: Then::Consume,
            drain_asked: false,
            drain_after: None,
            draining: false,
            fetching: false,
            empty_pages: 0,
            backfill: None,
            snapshot_attempts: 0,
            asks: 0,
            ask_at: None,
            unanswered_asks: 0,
            numbering: Numbering::new(config.seq_source),
            book: None,
            book_void: false,
            held_full_since: None,
            reset: None,
            awaiting_epoch: false,
            next_lag_report: now,
            actions: VecDeque::new(),
            stopped: None,
            config,
        };
        machine.connect();
        machine
    }

    /// The stream's token (raised by every new epoch).
    pub fn fence_token(&self) -> u64 {
        self.fence_token
    }

    /// Why it stopped, once it has.
    pub fn stopped(&self) -> Option<&Stop> {
        self.stopped.as_ref()
    }

    /// A write is out (the driver waits for its reply even after a stop: a
    /// refused zombie write must still count as fenced).
    pub fn writing(&self) -> bool {
        self.in_flight.as_ref().is_some_and(|f| f.out && !f.reopen)
    }

    /// The checkpoint the table holds now (the lease's persisted one).
    pub fn set_persisted(&mut self, checkpoint: Option<u64>) {
        self.persisted = checkpoint;
    }

    /// Reads the upstream now: connected, consuming, a batch with room, and
    /// the held events of a backfill under their bounds (in count and bytes).
    pub fn wants_frames(&self) -> bool {
        self.stopped.is_none()
            && self.link == Link::Up
            && matches!(self.then, Then::Consume)
            && self.reset.is_none()
            && self.pending.len() < self.config.batch_max_events.max(1)
            && !self.held_full()
    }

    fn held_full(&self) -> bool {
        self.sequencer.held() >= self.config.backfill_hold_max.max(1)
            || self.sequencer.held_weight() >= self.config.hold_max_bytes.max(1)
    }

    /// Reports each stretch the held events spent at their bound (reading
    /// paused behind a backfill) once it ends.
    fn watch_the_hold(&mut self, now: Instant) {
        let full = self.stopped.is_none() && self.held_full();
        match (full, self.held_full_since) {
            (true, None) => self.held_full_since = Some(now),
            (false, Some(since)) => {
                self.held_full_since = None;
                self.emit(TelemetryEvent::StreamBackfillWait {
                    stream_id: self.stream_id.clone(),
                    reason: BackfillWait::Hold,
                    duration: now.saturating_duration_since(since),
                });
            }
            _ => {}
        }
    }

    /// Takes the fetched page now: like the upstream, not while the batch is full.
    pub fn wants_page(&self) -> bool {
        self.stopped.is_none()
            && self.fetching
            && self.pending.len() < self.config.batch_max_events.max(1)
    }

    /// The next thing to do, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        if self.actions.is_empty() {
            self.advance();
        }
        self.actions.pop_front()
    }

    /// When [`StreamMachine::handle_timeout`] is due next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.stopped.is_some() {
            return None;
        }
        let mut next = self.next_lag_report;
        if let Some(at) = self.retry_at {
            next = next.min(at);
        }
        if let Link::Down(Some(at)) = self.link {
            next = next.min(at);
        }
        if let Some(at) = self.ask_at {
            next = next.min(at);
        }
        Some(next)
    }

    /// Time passed: lag reports, resends and reconnects that are due.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        if self.stopped.is_some() {
            return;
        }
        if now >= self.next_lag_report {
            self.report_lag(now);
            // Missed reports are not made up for: the next is one interval on.
            self.next_lag_report = now + self.config.lag_report_interval;
        }
        if self.retry_at.is_some_and(|at| now >= at) {
            self.retry_at = None;
            self.send_again();
        }
        if let Link::Down(Some(at)) = self.link
            && now >= at
        {
            self.connect();
        }
        if self.ask_at.is_some_and(|at| now >= at) {
            self.ask_at = None;
            if self.sequencer.syncing() {
                self.ask_for_a_book();
            }
        }
    }

    /// The first subscription is one made before this holder took the
    /// stream (an overlapping hand-off's): its frames up to the stream's
    /// position are the predecessor's, replays ([`Sequencer::continue_prepared`]).
    pub fn continue_prepared(&mut self) {
        self.sequencer.continue_prepared();
    }

    /// Something happened.
    pub fn handle(&mut self, input: Input, now: Instant) {
        self.now = now;
        match input {
            Input::Written { result, started } => self.written(result, started, now),
            _ if self.stopped.is_some() => {}
            Input::Lost(reason) => self.stop(Stop::Lost(reason)),
            Input::Drain => self.drain(),
            Input::DrainAfter(seq) => self.drain_after = Some(seq),
            Input::Subscribed => {
                self.link = Link::Up;
                self.sequencer.connected();
                self.numbering.connected();
                self.unanswered_asks = 0;
            }
            Input::SubscribeFailed(error) => {
                self.link = Link::Down(None);
                self.reconnect_after(&error, now);
            }
            Input::Frame(event) => {
                self.reconnects = 0;
                self.arrive(event, now);
            }
            Input::UpstreamFailed(error) => self.connection_failed(error),
            Input::Reopened(result) => self.reopened(result, now),
            Input::Page(result) => self.page_landed(result, now),
            Input::Snapshot(result) => self.snapshot_landed(result, now),
            Input::EpochStarted { fence_token } => self.epoch_started(fence_token, now),
        }
        if let Some(target) = self.drain_after
            && self.progress.confirmed >= target
            && !self.draining
        {
            self.drain_after = None;
            self.drain();
        }
        self.watch_the_hold(now);
    }

    fn emit(&mut self, event: TelemetryEvent) {
        self.actions.push_back(Action::Emit(event));
    }

    fn stop(&mut self, stop: Stop) {
        if self.stopped.is_none() {
            if matches!(self.link, Link::Up | Link::Connecting) {
                self.actions.push_back(Action::Close);
            }
            if self.fetching {
                self.actions.push_back(Action::CancelFetch);
            }
            self.end_backfill(BackfillResult::Stopped, self.now);
            self.stopped = Some(stop);
        }
    }

    fn connect(&mut self) {
        self.link = Link::Connecting;
        self.actions.push_back(Action::Subscribe {
            from: self.sequencer.resume_from(),
        });
    }

    /// Sends what is pending when the slot is free, and moves on once
    /// everything is written.
    fn advance(&mut self) {
        if self.stopped.is_some() || self.awaiting_epoch {
            return;
        }
        if self.in_flight.is_none() && !self.pending.is_empty() {
            let capacity = self.config.batch_max_events.max(1);
            // A backfill page can queue more than a batch holds.
            let events = if self.pending.len() <= capacity {
                std::mem::replace(&mut self.pending, Vec::with_capacity(capacity))
            } else {
                self.pending.drain(..capacity).collect()
            };
            let events = Arc::new(events);
            if !self.config.rules.checkpoint_after_confirmation
                && let Some(last) = events.last()
            {
                self.actions.push_back(Action::StageCheckpoint(last.seq));
            }
            self.failures = SinkFailures::default();
            self.in_flight = Some(InFlight {
                events: events.clone(),
                sent: events.clone(),
                out: true,
                reopen: false,
            });
            self.actions.push_back(Action::Write(events));
            return;
        }
        if self.in_flight.is_some() || !self.pending.is_empty() {
            return;
        }
        match std::mem::replace(&mut self.then, Then::Consume) {
            Then::Consume => {
                if let Some(error) = self.link_error.take() {
                    self.reconnect_after(&error, self.now);
                }
            }
            Then::Epoch => {
                // Set together with the pending reset, which only the epoch takes.
                let Some(reset) = self.reset.as_ref() else {
                    return;
                };
                self.awaiting_epoch = true;
                self.actions.push_back(Action::StartEpoch {
                    from: reset.from,
                    to: reset.to,
                });
            }
            Then::Drain { marked } => {
                // A refill was under way: the rest of what the sink lost can
                // no longer come from this holder, and the next owner resumes
                // after the checkpoint (which had passed it), so the range is
                // marked, not left a silent hole.
                if !marked
                    && let Some(to) = self.progress.refill_to
                    && to > self.progress.confirmed
                {
                    self.pending.push(SinkEvent::gap(
                        self.progress.confirmed + 1,
                        to,
                        GapReason::SinkLost,
                    ));
                    self.then = Then::Drain { marked: true };
                    self.advance();
                    return;
                }
                self.stop(Stop::Drain);
            }
        }
    }

    fn drain(&mut self) {
        if self.awaiting_epoch || self.reset.is_some() {
            self.drain_asked = true;
            return;
        }
        if matches!(self.link, Link::Up | Link::Connecting) {
            self.actions.push_back(Action::Close);
        }
        self.link = Link::Down(None);
        self.link_error = None;
        self.draining = true;
        self.then = Then::Drain { marked: false };
    }

    /// The connection failed: events before it are good, written first; then
    /// the reconnect (a backfill in progress goes on across it).
    fn connection_failed(&mut self, error: UpstreamError) {
        if matches!(self.link, Link::Up | Link::Connecting) {
            self.actions.push_back(Action::Close);
        }
        self.link = Link::Down(None);
        if !self.draining {
            self.link_error.get_or_insert(error);
        }
    }

    /// Reports the error, decides where to resume, and schedules the connect.
    fn reconnect_after(&mut self, error: &UpstreamError, now: Instant) {
        self.emit(TelemetryEvent::UpstreamReconnect {
            stream_id: self.stream_id.clone(),
            reason: error.reason().to_owned(),
            cause: Some(error.to_string()),
        });
        let attempts = self.reconnects;
        let mut delay = self.config.reconnect.delay(attempts);
        self.reconnects = attempts.saturating_add(1);
        if self.config.resume == ResumeMode::Replay {
            // Ask again for everything after what the sink confirmed.
            self.sequencer.reposition(Some(self.progress.confirmed));
        }
        match error {
            UpstreamError::RetentionExceeded {
                requested,
                earliest: Some(earliest),
            } if *earliest > *requested => {
                // The upstream cannot deliver these any more: report the gap
                // loudly and continue from what it still has. A busy
                // upstream's retention edge moves while we reconnect: when
                // asking for the edge itself failed again, ask further ahead
                // each time, or the worker chases the edge for ever.
                let lead = match self.reconnects {
                    0 | 1 => 0,
                    n => 1u64 << (n - 1).min(20),
                };
                let resume = earliest.saturating_add(lead);
                self.emit(TelemetryEvent::StreamGap {
                    stream_id: self.stream_id.clone(),
                    from_seq: *requested,
                    to_seq: resume - 1,
                    reason: GapReason::Retention,
                });
                self.sequencer.reposition(Some(resume - 1));
                delay = Duration::ZERO;
            }
            UpstreamError::Gap { .. } if self.reconnects <= 1 => delay = Duration::ZERO,
            _ => {}
        }
        if delay.is_zero() {
            self.connect();
        } else {
            self.link = Link::Down(Some(now + delay));
        }
    }

    fn arrive(&mut self, mut event: UpstreamEvent, now: Instant) {
        let book = event.snapshot && self.config.resume == ResumeMode::Snapshot;
        let Some(seq) = self
            .numbering
            .number(event.seq, book, self.sequencer.last())
        else {
            // Before the connection's first book: nothing to number it from.
            self.skipped(SkipReason::MissingField, 1);
            return;
        };
        event.seq = seq;
        if book {
            // An answer, usable or not (an unusable one is asked again
            // after the backoff).
            self.unanswered_asks = 0;
        }
        // `UPSTREAM_ID_POINTER=none`: the sequence is the event's id.
        if event.event_id.is_empty() {
            event.event_id = seq.to_string();
        }
        let mut steps = std::mem::take(&mut self.steps);
        let arrival = if book {
            self.sequencer.arrive_snapshot(event.seq, event, &mut steps)
        } else {
            self.sequencer
                .arrive_covering(event.first_seq, event.seq, event, &mut steps)
        };
        if arrival == Arrival::Replayed {
            self.skipped(SkipReason::Duplicate, 1);
        }
        self.apply(&mut steps, now);
        self.steps = steps;
    }

    fn skipped(&mut self, reason: SkipReason, frames: usize) {
        for _ in 0..frames {
            self.emit(TelemetryEvent::UpstreamFrameSkipped {
                stream_id: self.stream_id.clone(),
                reason,
            });
        }
    }

    /// Carries out the sequencer's steps in order.
    fn apply(&mut self, steps: &mut Vec<Step<UpstreamEvent>>, now: Instant) {
        let mut steps_left = steps.drain(..);
        while let Some(step) = steps_left.next() {
            match step {
                Step::Event(_, event) => {
                    // Liveness moves only with what is written: frames
                    // dropped as replays or jumps must not make a stream that
                    // writes nothing look fresh.
                    self.progress.last_event_at = event.received_at;
                    self.progress.last_arrival_lag = event.arrival_lag;
                    self.check_book(event.payload.as_bytes(), false, now);
                    self.accept(event);
                }
                Step::JumpDiscarded { seq } => {
                    tracing::warn!(
                        stream_id = self.stream_id,
                        seq,
                        "dropped a frame whose sequence jumps past UPSTREAM_MAX_JUMP and that the next frames did not confirm"
                    );
                    self.skipped(SkipReason::Jump, 1);
                }
                Step::BehindDropped { frames } => self.skipped(SkipReason::Duplicate, frames),
                Step::Gap { from, to, reason } => {
                    let progress = &mut self.progress;
                    progress.first_seq.get_or_insert(from);
                    if self.pending.is_empty() {
                        progress.unpersisted.push_back((to, now));
                    }
                    progress.received = progress.received.max(to);
                    self.pending.push(SinkEvent::gap(from, to, reason));
                }
                Step::Backfill { from, to } => {
                    self.backfill.get_or_insert(BackfillRun {
                        started: now,
                        pages: 0,
                        events: 0,
                        gap: false,
                    });
                    tracing::info!(
                        stream_id = self.stream_id,
                        from_seq = from,
                        to_seq = to,
                        "backfilling missed events from the history"
                    );
                    self.empty_pages = 0;
                    self.fetch(Duration::ZERO);
                }
                Step::Reset { from, to } => {
                    self.reset = Some(PendingReset {
                        from,
                        to,
                        after: steps_left.by_ref().collect(),
                    });
                    // The old epoch ends with everything before it written;
                    // the connection stays.
                    self.then = Then::Epoch;
                }
                Step::Reconnect { expected, got } => {
                    self.connection_failed(UpstreamError::Gap { expected, got });
                }
                Step::Resync { reason } => {
                    tracing::info!(
                        stream_id = self.stream_id,
                        reason = reason.as_str(),
                        "fetching the order book's snapshot; diffs are held meanwhile"
                    );
                    if self.config.snapshots_in_band {
                        // The next book comes in the stream, after the ask.
                        let wait = match self.asks {
                            0 => Duration::ZERO,
                            asks => self.config.reconnect.delay(asks),
                        };
                        self.asks = self.asks.saturating_add(1);
                        if wait.is_zero() {
                            self.ask_for_a_book();
                        } else {
                            self.ask_at = Some(now + wait);
                        }
                    } else {
                        self.snapshot_attempts = 0;
                        self.fetch_snapshot(Duration::ZERO);
                    }
                }
                Step::Snapshot {
                    seq,
                    item,
                    reason,
                    missed,
                } => {
                    self.asks = 0;
                    self.ask_at = None;
                    self.unanswered_asks = 0;
                    let progress = &mut self.progress;
                    progress.first_seq.get_or_insert(seq);
                    if self.pending.is_empty() {
                        progress.unpersisted.push_back((seq, item.received_at));
                    }
                    progress.received = progress.received.max(seq);
                    let missed = missed.map(|missed| GapMark {
                        from: missed.from,
                        reason: missed.reason,
                    });
                    self.check_book(item.payload.as_bytes(), true, now);
                    self.pending
                        .push(SinkEvent::snapshot(seq, item.payload, missed));
                    self.emit(TelemetryEvent::StreamSnapshot {
                        stream_id: self.stream_id.clone(),
                        reason,
                    });
                }
            }
        }
        drop(steps_left);
        if !self.sequencer.backfilling() {
            let ended = match &self.backfill {
                Some(run) if run.gap => BackfillResult::Gap,
                _ => BackfillResult::Filled,
            };
            self.end_backfill(ended, now);
        }
    }

    fn accept(&mut self, event: UpstreamEvent) {
        let progress = &mut self.progress;
        progress.first_seq.get_or_insert(event.seq);
        if self.pending.is_empty() {
            progress
                .unpersisted
                .push_back((event.seq, event.received_at));
        }
        progress.received = progress.received.max(event.seq);
        self.pending
            .push(SinkEvent::data(event.seq, event.event_id, event.payload));
    }

    fn fetch(&mut self, after: Duration) {
        let Some((from, to)) = self.sequencer.backfill_range() else {
            return;
        };
        self.fetching = true;
        self.actions.push_back(Action::Fetch { from, to, after });
    }

    /// Applies one written book message to the kept book and checks the
    /// upstream's checksum: on a mismatch (or a message the book cannot
    /// read) the failure is reported and the book re-synchronised; the
    /// message itself is written as received.
    fn check_book(&mut self, body: &[u8], snapshot: bool, now: Instant) {
        let rule = self.config.book_check.rule;
        if rule == ChecksumRule::None {
            return;
        }
        if snapshot {
            self.book_void = false;
            if let Some(keeper) = &mut self.book {
                keeper.reset();
            } else {
                let format = match rule {
                    ChecksumRule::Okx => Some(BookFormat::Okx),
                    _ => BookFormat::detect(body).filter(|format| rule.applies_to(*format)),
                };
                match format
                    .map(|format| BookKeeper::new(format, rule, self.config.book_check.options))
                {
                    Some(Ok(keeper)) => self.book = Some(keeper),
                    Some(Err(error)) => {
                        tracing::warn!(stream_id = self.stream_id, %error, "cannot keep this book; its checksums are not checked");
                        return;
                    }
                    None => {
                        tracing::warn!(
                            stream_id = self.stream_id,
                            rule = rule.as_str(),
                            "the snapshot is not a book UPSTREAM_BOOK_CHECKSUM can check; checksums are not checked"
                        );
                        return;
                    }
                }
            }
        }
        if self.book_void {
            return;
        }
        let Some(keeper) = &mut self.book else {
            return;
        };
        let failure = match keeper.on_frame(body) {
            Ok(Verdict::Snapshot | Verdict::Applied | Verdict::NotBook) => return,
            Ok(Verdict::ChecksumMismatch { expected, computed }) => {
                format!("checksum {expected} sent, {computed} computed")
            }
            Err(error) => error.to_string(),
        };
        keeper.reset();
        tracing::warn!(
            stream_id = self.stream_id,
            failure,
            "the order book failed its check; re-synchronising from a new snapshot"
        );
        self.emit(TelemetryEvent::StreamChecksumFailure {
            stream_id: self.stream_id.clone(),
        });
        self.book_void = true;
        let mut steps = Vec::new();
        self.sequencer.resync(SnapshotReason::Checksum, &mut steps);
        self.apply(&mut steps, now);
    }

    /// Asks the connection for a new book (the reconnect brings one when
    /// the link is down).
    fn ask_for_a_book(&mut self) {
        if self.link != Link::Up {
            return;
        }
        // An upstream that ignores the ask (or lost it) would leave the
        // stream holding diffs for ever: asked again after the deadline,
        // then a new connection, whose subscribe brings a book.
        if self.unanswered_asks >= UNANSWERED_ASKS_BEFORE_RECONNECT {
            self.unanswered_asks = 0;
            self.connection_failed(UpstreamError::Closed(format!(
                "no order book came after {UNANSWERED_ASKS_BEFORE_RECONNECT} asks on the connection"
            )));
            return;
        }
        self.unanswered_asks += 1;
        self.ask_at = Some(self.now + BOOK_ASK_DEADLINE);
        self.actions.push_back(Action::AskSnapshot);
    }

    fn fetch_snapshot(&mut self, after: Duration) {
        self.fetching = true;
        self.actions.push_back(Action::FetchSnapshot { after });
    }

    /// The book's snapshot came: taken, it is written before the held diffs
    /// that follow it; too old or unreadable, another is fetched after a
    /// backoff (a book has nothing valid to write without one).
    fn snapshot_landed(&mut self, result: Result<UpstreamEvent, HistoryError>, now: Instant) {
        self.fetching = false;
        let mut steps = std::mem::take(&mut self.steps);
        let outcome = match result {
            Ok(snapshot) => {
                let seq = snapshot.seq;
                let outcome = self.sequencer.snapshotted(seq, snapshot, &mut steps);
                if outcome == Snapshotted::Stale {
                    tracing::info!(
                        stream_id = self.stream_id,
                        seq,
                        "the snapshot is older than the held diffs; fetching another"
                    );
                }
                outcome
            }
            Err(error) => {
                tracing::warn!(stream_id = self.stream_id, %error, "cannot read the order book's snapshot; trying again");
                Snapshotted::Stale
            }
        };
        self.apply(&mut steps, now);
        self.steps = steps;
        if outcome == Snapshotted::Stale && self.sequencer.syncing() && !self.fetching {
            let wait = self.config.reconnect.delay(self.snapshot_attempts);
            self.snapshot_attempts = self.snapshot_attempts.saturating_add(1);
            self.fetch_snapshot(wait);
        }
    }

    /// Reports the backfill under way, if any, as ended with `result`.
    fn end_backfill(&mut self, result: BackfillResult, now: Instant) {
        if let Some(event) = self.backfill_ended(result, now) {
            self.emit(event);
        }
    }

    fn backfill_ended(&mut self, result: BackfillResult, now: Instant) -> Option<TelemetryEvent> {
        let run = self.backfill.take()?;
        Some(TelemetryEvent::StreamBackfill {
            stream_id: self.stream_id.clone(),
            result,
            pages: run.pages,
            events: run.events,
            duration: now.saturating_duration_since(run.started),
        })
    }

    /// The stream is dropped mid-way (its task aborted): the backfill under
    /// way, if any, to report as `stopped`.
    pub fn abandon(&mut self, now: Instant) -> Option<TelemetryEvent> {
        self.backfill_ended(BackfillResult::Stopped, now)
    }

    /// A page arrived, or the range was given up.
    fn page_landed(&mut self, result: Result<Vec<UpstreamEvent>, HistoryError>, now: Instant) {
        self.fetching = false;
        let range = self.sequencer.backfill_range();
        let mut steps = std::mem::take(&mut self.steps);
        let mut moved = true;
        match result {
            Ok(events) => {
                let page = events.into_iter().map(|event| (event.seq, event)).collect();
                moved = self.sequencer.backfilled(page, &mut steps);
                self.empty_pages = if moved { 0 } else { self.empty_pages + 1 };
                if !moved && self.empty_pages >= self.config.backfill_empty_pages {
                    tracing::warn!(
                        stream_id = self.stream_id,
                        ?range,
                        "the history has nothing more for this range; recording the rest as a gap"
                    );
                    self.sequencer.backfill_gave_up(&mut steps);
                }
            }
            Err(error) => {
                tracing::warn!(stream_id = self.stream_id, ?range, %error, "backfill gave up; recording the rest as a gap");
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
        // A hole among the held events starts the next backfill in `apply`.
        self.apply(&mut steps, now);
        self.steps = steps;
        if self.sequencer.backfilling() && !self.fetching {
            let wait = if moved {
                Duration::ZERO
            } else {
                self.config.backfill_empty_wait
            };
            self.fetch(wait);
        } else if !self.sequencer.backfilling() {
            tracing::info!(stream_id = self.stream_id, ?range, "backfill done");
        }
    }

    /// A write replied.
    fn written(&mut self, result: Result<WriteOutcome, SinkError>, started: Instant, now: Instant) {
        let next = slot::after_write(&result);
        let Some(flight) = &mut self.in_flight else {
            return;
        };
        flight.out = false;
        if let Some(stop) = &self.stopped {
            // After a stop only the verdict counts: a zombie's write the
            // sink refused still shows as fenced and is reported.
            let fenced_already = matches!(stop, Stop::Lost(LossReason::Fenced));
            self.in_flight = None;
            if let Ok(outcome) = &result {
                self.emit_write(outcome, started, now);
                if outcome.is_fenced() && !fenced_already {
                    self.actions.push_back(Action::ReportFenced);
                    self.stopped = Some(Stop::Lost(LossReason::Fenced));
                }
            }
            return;
        }
        match (result, next) {
            (Ok(outcome), _) => {
                let sent = flight.sent.clone();
                self.in_flight = None;
                self.confirm(&sent, outcome, started, now);
            }
            (Err(_), slot::AfterWrite::Reopen) => {
                flight.reopen = true;
                flight.out = true;
                self.actions.push_back(Action::Reopen);
            }
            (Err(err), _) => {
                let events = flight.sent.len() as u64;
                self.failed(err, events, now);
            }
        }
    }

    /// Reports a failed sink call and schedules it again (`retry_at`), or
    /// gives the stream up after too many refusals.
    fn failed(&mut self, err: SinkError, events: u64, now: Instant) {
        self.emit(TelemetryEvent::SinkWriteFailed {
            stream_id: self.stream_id.clone(),
            error: err.to_string(),
            events,
        });
        let Ok(delay) = self.failures.record(&err, &self.config) else {
            self.in_flight = None;
            self.stop(Stop::SinkFailing(err.to_string()));
            return;
        };
        if delay.is_zero() {
            self.send_again();
        } else {
            self.retry_at = Some(now + delay);
        }
    }

    /// The backoff passed: the failed call goes out again.
    fn send_again(&mut self) {
        let Some(flight) = &mut self.in_flight else {
            return;
        };
        flight.out = true;
        if flight.reopen {
            self.actions.push_back(Action::Reopen);
        } else {
            self.actions.push_back(Action::Write(flight.sent.clone()));
        }
    }

    /// The stream was opened again after the sink lost its connection (a
    /// failover shows that way): the sink's end against what was confirmed.
    fn reopened(&mut self, result: Result<OpenOutcome, SinkError>, now: Instant) {
        let compares = self.config.rules.reopen_compares_the_tail;
        let Some(flight) = &mut self.in_flight else {
            return;
        };
        flight.out = false;
        let opened = match result {
            Ok(opened) => opened,
            Err(err) => return self.failed(err, 0, now),
        };
        if opened.fenced {
            self.in_flight = None;
            self.actions.push_back(Action::ReportFenced);
            self.stop(Stop::Lost(LossReason::Fenced));
            return;
        }
        let lost =
            protocol::lost_tail(self.progress.confirmed, opened.last_seq).filter(|_| compares);
        if let Some(lost) = &lost {
            self.emit(TelemetryEvent::SinkRegression {
                stream_id: self.stream_id.clone(),
                from_seq: *lost.start(),
                to_seq: *lost.end(),
            });
        }
        let Some(flight) = &mut self.in_flight else {
            return;
        };
        flight.reopen = false;
        match slot::after_reopen(lost, self.config.resume, self.draining) {
            slot::AfterReopen::Resend => {}
            slot::AfterReopen::Rewind { sink_last } => return self.rewind(sink_last),
            slot::AfterReopen::Mark(lost) => {
                let mut marked = vec![SinkEvent::gap(
                    *lost.start(),
                    *lost.end(),
                    GapReason::SinkLost,
                )];
                marked.extend(
                    flight
                        .events
                        .iter()
                        .filter(|e| e.seq > *lost.end())
                        .cloned(),
                );
                flight.sent = Arc::new(marked);
            }
        }
        flight.out = true;
        self.actions.push_back(Action::Write(flight.sent.clone()));
    }

    /// The sink lost confirmed events and the upstream can send them again:
    /// the batch and what is pending are dropped and consuming starts over
    /// after the sink's end (a `replay` upstream is asked from there; a
    /// `backfill` one sees the hole at its next event and fetches it). Until
    /// the refill passes what had been confirmed, a drain marks the rest.
    fn rewind(&mut self, sink_last: u64) {
        self.in_flight = None;
        self.pending.clear();
        if self.reset.is_some() {
            // The lost tail belongs to an epoch that is over: the upstream
            // started over and cannot send it again.
            return;
        }
        let progress = &mut self.progress;
        progress.refill_to = Some(progress.refill_to.unwrap_or(0).max(progress.confirmed));
        progress.confirmed = sink_last;
        if self.fetching {
            self.fetching = false;
            self.actions.push_back(Action::CancelFetch);
        }
        self.sequencer.reposition(Some(sink_last));
        if matches!(self.link, Link::Up | Link::Connecting) {
            self.actions.push_back(Action::Close);
        }
        // Consuming starts over at once, whatever it was waiting for.
        self.then = Then::Consume;
        self.link_error = None;
        self.link = Link::Down(None);
        self.connect();
    }

    /// Records a landed batch: the fence verdict, then the confirmed
    /// sequence and the staged checkpoint (invariant 3: only now).
    fn confirm(
        &mut self,
        events: &[SinkEvent],
        outcome: WriteOutcome,
        started: Instant,
        now: Instant,
    ) {
        self.emit_write(&outcome, started, now);
        if outcome.is_fenced() {
            // Someone holds a newer token: this process is a zombie here.
            self.actions.push_back(Action::ReportFenced);
            self.stop(Stop::Lost(LossReason::Fenced));
            return;
        }
        // Only a batch's head can be a replay (batches are ordered): the
        // markers after it were appended now, and each is one gap.
        for event in events.iter().skip(outcome.duplicate as usize) {
            if let Some(gap) = event.gap {
                self.emit(TelemetryEvent::StreamGap {
                    stream_id: self.stream_id.clone(),
                    from_seq: gap.from,
                    to_seq: event.seq,
                    reason: gap.reason,
                });
            }
        }
        let last = events.last().map_or(self.progress.confirmed, |e| e.seq);
        self.progress.confirmed = self.progress.confirmed.max(last);
        self.actions
            .push_back(Action::StageCheckpoint(self.progress.confirmed));
        self.report_lag(now);
    }

    fn emit_write(&mut self, outcome: &WriteOutcome, started: Instant, now: Instant) {
        self.emit(TelemetryEvent::SinkWrite {
            stream_id: self.stream_id.clone(),
            fence_token: self.fence_token,
            accepted: outcome.accepted,
            duplicate: outcome.duplicate,
            fenced: outcome.fenced,
            duration: now.saturating_duration_since(started),
        });
    }

    /// The new epoch started: its progress begins at the reset entry, and
    /// the frames that made the reset are its first.
    fn epoch_started(&mut self, fence_token: u64, now: Instant) {
        let Some(reset) = self.reset.take() else {
            return;
        };
        self.awaiting_epoch = false;
        self.fence_token = fence_token;
        self.progress = Progress::at(reset.to - 1, self.progress.last_event_at);
        self.persisted = Some(reset.to - 1);
        let mut after = reset.after;
        self.apply(&mut after, now);
        if self.drain_asked {
            self.drain();
        }
    }

    fn report_lag(&mut self, now: Instant) {
        // Lag is measured to the durable resume point: the table's
        // checkpoint in per-stream mode (it rides on every renew), the sink's
        // confirmation in session mode (the table's is written only every
        // CHECKPOINT_INTERVAL_MS, and a lag of up to that long would page
        // every operator for nothing).
        let progress = &mut self.progress;
        let persisted = if self.lives_by_session {
            progress.confirmed
        } else {
            self.persisted.unwrap_or(0)
        };
        while progress
            .unpersisted
            .front()
            .is_some_and(|(seq, _)| *seq <= persisted)
        {
            progress.unpersisted.pop_front();
        }
        let lag_seconds = progress.unpersisted.front().map_or(0.0, |(_, at)| {
            now.saturating_duration_since(*at).as_secs_f64()
        });
        let counted_from = progress
            .first_seq
            .map_or(persisted, |first| persisted.max(first - 1));
        let since_event = now
            .saturating_duration_since(progress.last_event_at)
            .as_secs_f64();
        let event = TelemetryEvent::StreamLag {
            stream_id: self.stream_id.clone(),
            lag_events: progress.received.saturating_sub(counted_from),
            lag_seconds,
            last_event_age_seconds: since_event,
            // Now minus the event's time: its lag on arrival plus the time since.
            event_lag_seconds: progress.last_arrival_lag.map(|lag| lag + since_event),
        };
        self.emit(event);
    }
}

#[cfg(test)]
mod tests;
