//! One held stream: subscribe from the checkpoint, batch, write fenced, stage
//! the checkpoint, until the lease is lost or the stream is drained.
//!
//! The order of checks is the point of this module. A new owner opens the sink
//! first (raising its fence to the new token) and resumes after the further of
//! the checkpoint and the sink's last sequence. Before every sink write the
//! lease must still be valid by the holder's own clock; every write carries the
//! fence token; the checkpoint moves only after the sink confirmed; a fenced
//! write or any sign of lost ownership stops the stream at once and closes the
//! upstream connection.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use leasehold_control::keeper::{HeldLease, LeaseKeeper};
use leasehold_control::protocol;
use leasehold_platform::backoff::Backoff;
use leasehold_telemetry::{LossReason, TelemetryEvent, TelemetrySink};
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use leasehold_control::sequence::{JumpBound, ResumeMode, SeqStep, Sequencer};

use crate::upstream::history::{History, HistoryConfig};
use crate::upstream::{Subscription, Upstream, UpstreamError, UpstreamEvent};
use leasehold_sink::{FencedSink, ResetMark, SinkError, SinkEvent};

/// How a runner batches and retries.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// Most events per sink write.
    pub batch_max_events: usize,
    /// Reconnect schedule after upstream errors.
    pub reconnect: Backoff,
    /// Retry schedule after sink errors (the batch is kept and retried).
    pub sink_retry: Backoff,
    /// Consecutive sink refusals (not outages) after which the stream is
    /// released for another worker to try (`SINK_MAX_FAILURES`).
    pub sink_max_failures: u32,
    /// How often lag is reported while nothing else happens.
    pub lag_report_interval: Duration,
    /// What a hole in the sequence becomes (`UPSTREAM_RESUME`).
    pub resume: ResumeMode,
    /// How the upstream's sequence advances (`UPSTREAM_SEQ_STEP`).
    pub seq_step: SeqStep,
    /// Most live events held while a backfill runs; when full, reading the
    /// upstream pauses until the backfill has caught up.
    pub backfill_hold_max: usize,
    /// Most bytes of live frames held meanwhile (`STREAM_HOLD_MAX_BYTES`);
    /// reading pauses likewise.
    pub hold_max_bytes: usize,
    /// History pages that bring nothing new before the rest of a range is
    /// given up (the history may lag the live feed by a moment).
    pub backfill_empty_pages: u32,
    /// Wait before asking again after such a page.
    pub backfill_empty_wait: Duration,
    /// How far one frame may move the stream on its own word
    /// (`UPSTREAM_MAX_JUMP`, `UPSTREAM_RESET_AFTER`).
    pub jump: JumpBound,
}

/// [`RunnerConfig::jump`]'s default: `UPSTREAM_MAX_JUMP` 10,000,000, a real
/// jump confirmed by 3 frames in a row (`UPSTREAM_RESET_AFTER`).
pub const JUMP_BOUND: JumpBound = JumpBound {
    max: 10_000_000,
    confirm_after: 3,
};

/// [`RunnerConfig::batch_max_events`]'s default (`BATCH_MAX_EVENTS`).
/// Larger batches did not help one stream's throughput with one batch in
/// flight (2,000 measured against 500: within the noise on one stream, lower
/// on 100; BENCHMARKS.md), so the default stays.
pub const BATCH_MAX_EVENTS: usize = 500;

/// [`RunnerConfig::backfill_hold_max`]'s default: ten seconds of a busy
/// stream at 10,000 events/s (a few MiB at exchange frame sizes).
pub const BACKFILL_HOLD_MAX: usize = 100_000;

/// [`RunnerConfig::hold_max_bytes`]'s default (`STREAM_HOLD_MAX_BYTES`):
/// 16 MiB, about 100,000 trade frames or a few order-book snapshots, per
/// stream; a worker backfilling 100 streams at once holds 1.6 GiB at most.
pub const HOLD_MAX_BYTES: usize = 16 << 20;

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            batch_max_events: BATCH_MAX_EVENTS,
            reconnect: Backoff {
                base: Duration::from_millis(100),
                cap: Duration::from_secs(5),
            },
            sink_retry: Backoff {
                base: Duration::from_millis(50),
                cap: Duration::from_secs(2),
            },
            sink_max_failures: crate::settings::SINK_MAX_FAILURES.fixed_default(),
            lag_report_interval: Duration::from_secs(1),
            resume: ResumeMode::Replay,
            seq_step: SeqStep::Contiguous,
            backfill_hold_max: BACKFILL_HOLD_MAX,
            hold_max_bytes: HOLD_MAX_BYTES,
            backfill_empty_pages: 3,
            backfill_empty_wait: Duration::from_millis(500),
            jump: JUMP_BOUND,
        }
    }
}

/// What a runner needs, shared by every runner of a worker.
pub struct RunnerContext {
    /// Holds and renews the leases.
    pub keeper: LeaseKeeper,
    /// Where events come from.
    pub upstream: Arc<dyn Upstream>,
    /// Where events go.
    pub sink: Arc<dyn FencedSink>,
    /// Where missed events are read back (`backfill` mode), with its policy.
    pub history: Option<(Arc<dyn History>, HistoryConfig)>,
    /// Where outcomes are reported.
    pub telemetry: Arc<dyn TelemetrySink>,
    /// Batching and retries.
    pub config: RunnerConfig,
}

/// How a runner ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamExit {
    /// Ownership is gone (lost, fenced, or past the deadline); nothing was released.
    Lost(LossReason),
    /// Drained: pending events written, checkpoint committed, lease released.
    Released,
    /// Drained, but the release write failed (the lease will expire instead).
    ReleaseFailed(String),
    /// The sink refused `SINK_MAX_FAILURES` calls in a row: the lease was
    /// released (if the release write failed, it expires) for another worker.
    SinkGaveUp(String),
}

/// Where the runner is in the stream.
struct Progress {
    /// Highest sequence the sink confirmed.
    confirmed: u64,
    /// Highest sequence received.
    received: u64,
    /// (first seq, received at) of each confirmed batch not yet persisted as
    /// the checkpoint, for the lag in seconds.
    unpersisted: VecDeque<(u64, Instant)>,
    /// When the last event arrived (when the stream was opened, before the first).
    last_event_at: Instant,
    /// The last event's arrival lag behind its own time, if the upstream names it.
    last_arrival_lag: Option<f64>,
    /// What had been confirmed before the sink lost its tail, while the
    /// upstream refills it.
    refill_to: Option<u64>,
    /// The first sequence this holder took (event or gap marker): lag counts
    /// from there. A live upstream starts at the exchange's own id (60,108),
    /// and with nothing persisted yet that whole id would read as lag.
    first_seq: Option<u64>,
}

impl Progress {
    /// A holder about to consume after `seq`.
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

/// Why consuming stopped.
enum Stop {
    Drain,
    Lost(LossReason),
    /// The sink keeps refusing: give the stream up (the last error).
    SinkFailing(String),
    /// The upstream's sequence started over; everything before it is
    /// written. The stream goes on in a new epoch, on the same connection.
    Reset(Box<Carried>),
}

/// What a new epoch takes over from the old one.
struct Carried {
    reset: PendingReset,
    subscription: Box<dyn Subscription>,
}

fn loss(lease: &HeldLease) -> Stop {
    Stop::Lost(lease.loss_reason().unwrap_or(LossReason::DeadlinePassed))
}

/// Runs one held stream until it is lost or `drain` is cancelled.
pub async fn run_stream(
    context: Arc<RunnerContext>,
    lease: HeldLease,
    drain: CancellationToken,
) -> StreamExit {
    let mut lease = lease;
    let stop = match open(&context, &lease).await {
        Err(stop) => stop,
        Ok(Opened {
            resume: start,
            anchored,
            lost,
        }) => {
            let config = &context.config;
            let mut progress = Progress::at(start, Instant::now());
            // The sink lost a tail the checkpoint had covered: the upstream
            // refills it, or (live) it is marked where it is missing.
            let mut first = Vec::new();
            if let Some(lost) = lost {
                if config.resume == ResumeMode::Live {
                    first.push(SinkEvent::gap(
                        *lost.start(),
                        *lost.end(),
                        leasehold_telemetry::GapReason::SinkLost,
                    ));
                    progress.received = *lost.end();
                } else {
                    progress.refill_to = Some(*lost.end());
                }
            }
            // A replay upstream is asked for everything from the first
            // sequence; a live one starts wherever it is when nothing was
            // ever written (there is no "before" to record).
            let last =
                (anchored || config.resume == ResumeMode::Replay).then_some(progress.received);
            let mut sequencer = Sequencer::new(config.resume, config.seq_step, last)
                .with_jump_bound(config.jump)
                .with_reset_after(config.jump.confirm_after)
                .with_weigher(|event: &UpstreamEvent| event.payload.len() + event.event_id.len());
            let mut carried = None;
            loop {
                let stop = consume(
                    &context,
                    &lease,
                    &drain,
                    &mut progress,
                    &mut sequencer,
                    std::mem::take(&mut first),
                    carried.take(),
                )
                .await;
                let Stop::Reset(carry) = stop else {
                    break stop;
                };
                match new_epoch(&context, &lease, &carry.reset).await {
                    Ok(epoch) => {
                        lease = epoch;
                        progress = Progress::at(carry.reset.to - 1, progress.last_event_at);
                        carried = Some(*carry);
                    }
                    Err(stop) => {
                        let Carried {
                            mut subscription, ..
                        } = *carry;
                        subscription.close().await;
                        break stop;
                    }
                }
            }
        }
    };
    let exit = match stop {
        Stop::Lost(reason) => StreamExit::Lost(reason),
        // Not reached: the loop above starts a new epoch for every reset.
        // Stopping without a release is the safe answer all the same.
        Stop::Reset(_) => StreamExit::Lost(LossReason::Fenced),
        Stop::Drain => match context.keeper.release(&lease).await {
            Ok(_) => StreamExit::Released,
            Err(err) => StreamExit::ReleaseFailed(err.to_string()),
        },
        Stop::SinkFailing(error) => {
            context.telemetry.emit(TelemetryEvent::SinkGaveUp {
                stream_id: lease.stream_id.clone(),
                failures: context.config.sink_max_failures,
                error: error.clone(),
            });
            if let Err(err) = context.keeper.release(&lease).await {
                tracing::warn!(stream_id = lease.stream_id, error = %err, "release failed; the lease will expire instead");
            }
            StreamExit::SinkGaveUp(error)
        }
    };
    context.telemetry.emit(TelemetryEvent::StreamStopped {
        stream_id: lease.stream_id.clone(),
    });
    exit
}

/// The upstream's sequence started over: the lease's token is lifted for a
/// new epoch whose checkpoint is the reset entry's position, then the sink
/// is opened under it with the reset entry (`<new token>-<reset_to - 1>`),
/// so entry ids keep increasing and the old epoch's writer is fenced. The
/// reset is counted once the sink holds its entry.
async fn new_epoch(
    context: &RunnerContext,
    lease: &HeldLease,
    reset: &PendingReset,
) -> Result<HeldLease, Stop> {
    let mark = ResetMark {
        from: reset.from,
        to: reset.to,
    };
    let mut attempts = 0u32;
    let epoch = loop {
        if !lease.is_valid() {
            return Err(loss(lease));
        }
        match context.keeper.start_epoch(lease, mark.position()).await {
            Ok(epoch) => break epoch,
            Err(err) if err.is_retryable() => {
                tracing::warn!(stream_id = lease.stream_id, error = %err, "could not start the new epoch yet; retrying");
                let delay = context.config.sink_retry.delay(attempts);
                attempts = attempts.saturating_add(1);
                tokio::select! {
                    biased;
                    _ = lease.cancelled() => return Err(loss(lease)),
                    _ = sleep(delay) => {}
                }
            }
            Err(err) => {
                tracing::warn!(stream_id = lease.stream_id, error = %err, "the new epoch was refused: the stream is no longer ours");
                return Err(Stop::Lost(LossReason::Fenced));
            }
        }
    };
    let mut failures = SinkFailures::default();
    loop {
        if !epoch.is_valid() {
            return Err(loss(&epoch));
        }
        match context
            .sink
            .open_epoch(&epoch.stream_id, epoch.fence_token, mark)
            .await
        {
            Ok(opened) if opened.fenced => {
                context.keeper.report_fenced(&epoch);
                return Err(Stop::Lost(LossReason::Fenced));
            }
            Ok(_) => break,
            Err(err) => failures.wait(context, &epoch, err, 0).await?,
        }
    }
    context.telemetry.emit(TelemetryEvent::StreamReset {
        stream_id: epoch.stream_id.clone(),
        from_seq: reset.from,
        to_seq: reset.to,
        fence_token: epoch.fence_token,
    });
    Ok(epoch)
}

/// Where a new owner starts, from its open of the sink.
struct Opened {
    /// The sequence to resume after.
    resume: u64,
    /// The stream was ever written (a checkpoint or an entry).
    anchored: bool,
    /// What the sink lost of what the checkpoint covered.
    lost: Option<std::ops::RangeInclusive<u64>>,
}

/// A new owner's first act: raise the sink's fence to its token (from here on a
/// zombie's delayed write is refused, traffic or not) and learn the last
/// appended sequence. Resumes after the sink's end ([`protocol::resume_point`]):
/// past the checkpoint, a replay of events the previous owner wrote but never
/// checkpointed is not appended again; below it, a failover lost a tail the
/// checkpoint covered (counted as a regression). Retries sink errors while
/// the lease is valid.
async fn open(context: &RunnerContext, lease: &HeldLease) -> Result<Opened, Stop> {
    let checkpoint = lease.acquired.checkpoint.unwrap_or(0);
    let mut failures = SinkFailures::default();
    loop {
        // Invariant 4: no side effect past the holder's deadline, the open included.
        if !lease.is_valid() {
            return Err(loss(lease));
        }
        match context.sink.open(&lease.stream_id, lease.fence_token).await {
            Ok(opened) if opened.fenced => {
                // A fence above the table's token may be a re-created record,
                // not a newer owner: the keeper lifts the token past it then.
                context
                    .keeper
                    .lift_past_fence(lease, opened.highest_token)
                    .await;
                context.keeper.report_fenced(lease);
                return Err(Stop::Lost(LossReason::Fenced));
            }
            Ok(opened) => {
                let resume = protocol::resume_point(Some(checkpoint), opened.last_seq);
                if resume > checkpoint {
                    // What the sink holds is confirmed: the checkpoint catches up.
                    lease.stage_checkpoint(resume);
                }
                let lost = opened
                    .last_seq
                    .and_then(|last| protocol::lost_tail(checkpoint, Some(last)));
                if let Some(lost) = &lost {
                    context.telemetry.emit(TelemetryEvent::SinkRegression {
                        stream_id: lease.stream_id.clone(),
                        from_seq: *lost.start(),
                        to_seq: *lost.end(),
                    });
                }
                return Ok(Opened {
                    resume,
                    anchored: resume > 0 || checkpoint > 0 || opened.last_seq.is_some(),
                    lost,
                });
            }
            Err(err) => failures.wait(context, lease, err, 0).await?,
        }
    }
}

/// Consecutive failed sink calls of one stream: outages are retried while the
/// lease holds; refusals (a wrong key type, a script or auth error) give the
/// stream up after `sink_max_failures` of them, so another worker may succeed.
#[derive(Default)]
struct SinkFailures {
    attempts: u32,
    refusals: u32,
}

impl SinkFailures {
    /// Reports the failure and waits the backoff; `Err` when the stream must stop.
    async fn wait(
        &mut self,
        context: &RunnerContext,
        lease: &HeldLease,
        err: SinkError,
        events: u64,
    ) -> Result<(), Stop> {
        context.telemetry.emit(TelemetryEvent::SinkWriteFailed {
            stream_id: lease.stream_id.clone(),
            error: err.to_string(),
            events,
        });
        if matches!(err, SinkError::Unavailable(_)) {
            self.refusals = 0;
        } else {
            self.refusals += 1;
            if self.refusals >= context.config.sink_max_failures {
                return Err(Stop::SinkFailing(err.to_string()));
            }
        }
        let delay = context.config.sink_retry.delay(self.attempts);
        self.attempts = self.attempts.saturating_add(1);
        tokio::select! {
            biased;
            _ = lease.cancelled() => Err(loss(lease)),
            _ = sleep(delay) => Ok(()),
        }
    }
}

async fn consume(
    context: &RunnerContext,
    lease: &HeldLease,
    drain: &CancellationToken,
    progress: &mut Progress,
    sequencer: &mut Sequencer<UpstreamEvent>,
    first: Vec<SinkEvent>,
    carried: Option<Carried>,
) -> Stop {
    let mut window = Window::new(context, lease);
    let mut intake = Intake {
        context,
        lease,
        sequencer,
        steps: Vec::new(),
        fetch: None,
        empty_pages: 0,
        backfill: None,
        reset: None,
    };
    let stop = consume_in(
        context,
        lease,
        drain,
        progress,
        &mut window,
        &mut intake,
        first,
        carried,
    )
    .await;
    window.settle(stop).await
}

#[allow(clippy::too_many_arguments)] // the runner's parts, borrowed apart
async fn consume_in(
    context: &RunnerContext,
    lease: &HeldLease,
    drain: &CancellationToken,
    progress: &mut Progress,
    window: &mut Window<'_>,
    intake: &mut Intake<'_>,
    first: Vec<SinkEvent>,
    carried: Option<Carried>,
) -> Stop {
    let stream_id = lease.stream_id.as_str();
    let max_events = context.config.batch_max_events.max(1);
    let mut pending: Vec<SinkEvent> = Vec::with_capacity(max_events);
    pending.extend(first);
    let mut reconnects = 0u32;
    // A new epoch goes on on the old one's connection, from the frames that
    // made the reset.
    let mut resumed = None;
    if let Some(Carried {
        reset,
        mut subscription,
    }) = carried
    {
        match intake.apply(progress, &mut pending, reset.after) {
            Ok(()) => resumed = Some(subscription),
            Err(error) => {
                subscription.close().await;
                if let Some(stop) = reconnect_after(
                    context,
                    lease,
                    drain,
                    progress,
                    intake,
                    &error,
                    &mut reconnects,
                )
                .await
                {
                    return stop;
                }
            }
        }
    }
    loop {
        if drain.is_cancelled() {
            return finish(window, progress, &mut pending).await;
        }
        if !lease.is_valid() {
            return loss(lease);
        }
        if let Some(subscription) = resumed.take() {
            match read(
                context,
                lease,
                drain,
                progress,
                window,
                intake,
                &mut pending,
                subscription,
                &mut reconnects,
            )
            .await
            {
                Ok(()) => continue,
                Err(stop) => return stop,
            }
        }
        let subscribe = context
            .upstream
            .subscribe(stream_id, intake.sequencer.resume_from());
        tokio::pin!(subscribe);
        // A connect to a frozen upstream can hang until its timeout: keep
        // reporting, so the last-event age shows the silence meanwhile.
        let mut waiting = tokio::time::interval(context.config.lag_report_interval);
        let subscribed = loop {
            tokio::select! {
                biased;
                _ = lease.cancelled() => return loss(lease),
                _ = drain.cancelled() => return finish(window, progress, &mut pending).await,
                result = &mut subscribe => break result,
                _ = waiting.tick() => report_lag(context, lease, progress),
            }
        };
        let subscription = match subscribed {
            Ok(subscription) => subscription,
            Err(err) => {
                if let Some(stop) = reconnect_after(
                    context,
                    lease,
                    drain,
                    progress,
                    intake,
                    &err,
                    &mut reconnects,
                )
                .await
                {
                    return stop;
                }
                continue;
            }
        };
        intake.sequencer.connected();
        if let Err(stop) = read(
            context,
            lease,
            drain,
            progress,
            window,
            intake,
            &mut pending,
            subscription,
            &mut reconnects,
        )
        .await
        {
            return stop;
        }
    }
}

/// Reads one connection until it fails, the sink loses its tail, or the
/// stream stops (`Err`). `Ok`: connect again.
#[allow(clippy::too_many_arguments)] // the runner's parts, borrowed apart
async fn read(
    context: &RunnerContext,
    lease: &HeldLease,
    drain: &CancellationToken,
    progress: &mut Progress,
    window: &mut Window<'_>,
    intake: &mut Intake<'_>,
    pending: &mut Vec<SinkEvent>,
    mut subscription: Box<dyn Subscription>,
    reconnects: &mut u32,
) -> Result<(), Stop> {
    let max_events = context.config.batch_max_events.max(1);
    let mut lag_tick = tokio::time::interval(context.config.lag_report_interval);
    let interrupt = loop {
        let mut failed = None;
        tokio::select! {
            biased;
            _ = lease.cancelled() => {
                subscription.close().await;
                return Err(loss(lease));
            }
            _ = drain.cancelled() => {
                subscription.close().await;
                return Err(finish(window, progress, pending).await);
            }
            Some(landed) = window.in_flight.next(), if !window.in_flight.is_empty() => {
                if let Err(stop) = window.land(progress, landed).await {
                    subscription.close().await;
                    return Err(stop);
                }
                if window.rewind.is_some() {
                    break Interrupt::Rewind;
                }
            }
            // History pages wait while the batch is full, like the upstream.
            joined = intake.next_page(), if intake.fetch.is_some() && pending.len() < max_events => {
                intake.page_landed(progress, pending, joined);
            }
            _ = lag_tick.tick() => report_lag(context, lease, progress),
            // A full batch waits for a free write slot: reading stops (backpressure).
            next = subscription.next(), if pending.len() < max_events && intake.may_read() => match next {
                Ok(event) => {
                    *reconnects = 0;
                    failed = intake.arrive(progress, pending, event).err();
                    // Take whatever else is already here into the same batch:
                    // under load batches grow, at a trickle each event goes at once.
                    while failed.is_none() && pending.len() < max_events && intake.may_read() {
                        match subscription.next_ready() {
                            Some(Ok(event)) => {
                                failed = intake.arrive(progress, pending, event).err();
                            }
                            Some(Err(err)) => failed = Some(err),
                            None => break,
                        }
                    }
                }
                Err(err) => failed = Some(err),
            },
        }
        if let Some(err) = failed {
            break Interrupt::Failed(err);
        }
        if intake.reset.is_some() {
            break Interrupt::Reset;
        }
        while window.has_room() && !pending.is_empty() {
            if let Err(stop) = window.submit(pending) {
                subscription.close().await;
                return Err(stop);
            }
        }
    };
    let error = match interrupt {
        Interrupt::Rewind => {
            subscription.close().await;
            rewind(window, progress, intake, pending);
            return Ok(());
        }
        Interrupt::Reset => {
            // The old epoch ends with everything before the reset written.
            if let Err(stop) = window.flush(progress, pending).await {
                subscription.close().await;
                return Err(stop);
            }
            // A tail the sink lost now belongs to an epoch that is over: the
            // upstream cannot send it again.
            window.rewind = None;
            let reset = intake.reset.take().expect("checked above");
            return Err(Stop::Reset(Box::new(Carried {
                reset,
                subscription,
            })));
        }
        Interrupt::Failed(error) => error,
    };
    subscription.close().await;
    // Events before a gap or a disconnect are good: write them first, then
    // resume right after what the sink confirmed. A backfill in progress
    // goes on across the reconnect (its held events stay held).
    window.flush(progress, pending).await?;
    if window.rewind.is_some() {
        rewind(window, progress, intake, pending);
        return Ok(());
    }
    match reconnect_after(context, lease, drain, progress, intake, &error, reconnects).await {
        Some(stop) => Err(stop),
        None => Ok(()),
    }
}

/// Why reading a connection stopped short of the stream stopping.
enum Interrupt {
    /// The sink lost confirmed events: consuming starts over.
    Rewind,
    /// The connection failed (or a `replay` hole asks for it again).
    Failed(UpstreamError),
    /// The sequence started over.
    Reset,
}

/// The sink lost confirmed events and the upstream can send them again:
/// what is pending is dropped and consuming starts over after the sink's
/// end (a `replay` upstream is asked from there; a `backfill` one sees the
/// hole at its next event and fetches it from the history). Until the
/// refill passes what had been confirmed, a drain marks the rest.
fn rewind(
    window: &mut Window<'_>,
    progress: &mut Progress,
    intake: &mut Intake<'_>,
    pending: &mut Vec<SinkEvent>,
) {
    let Some(sink_last) = window.rewind.take() else {
        return;
    };
    pending.clear();
    progress.refill_to = Some(progress.refill_to.unwrap_or(0).max(progress.confirmed));
    progress.confirmed = sink_last;
    intake.fetch = None;
    intake.sequencer.reposition(Some(sink_last));
}

fn accept(progress: &mut Progress, pending: &mut Vec<SinkEvent>, event: UpstreamEvent) {
    progress.first_seq.get_or_insert(event.seq);
    if pending.is_empty() {
        progress
            .unpersisted
            .push_back((event.seq, event.received_at));
    }
    progress.received = progress.received.max(event.seq);
    pending.push(SinkEvent::data(event.seq, event.event_id, event.payload));
}

/// Reports the error, decides where to resume, and waits the backoff. Returns
/// `Some` when the stream must stop instead.
async fn reconnect_after(
    context: &RunnerContext,
    lease: &HeldLease,
    drain: &CancellationToken,
    progress: &mut Progress,
    intake: &mut Intake<'_>,
    error: &UpstreamError,
    attempts: &mut u32,
) -> Option<Stop> {
    let stream_id = lease.stream_id.clone();
    context.telemetry.emit(TelemetryEvent::UpstreamReconnect {
        stream_id: stream_id.clone(),
        reason: error.reason().to_owned(),
        cause: Some(error.to_string()),
    });
    let mut delay = context.config.reconnect.delay(*attempts);
    *attempts = attempts.saturating_add(1);
    if context.config.resume == ResumeMode::Replay {
        // Ask again for everything after what the sink confirmed.
        intake.sequencer.reposition(Some(progress.confirmed));
    }
    match error {
        UpstreamError::RetentionExceeded {
            requested,
            earliest: Some(earliest),
        } if *earliest > *requested => {
            // The upstream cannot deliver these any more: report the gap loudly
            // and continue from what it still has, instead of retrying forever.
            // A busy upstream's retention edge moves while we reconnect: when
            // asking for the edge itself failed again, ask further ahead each
            // time, or the worker chases the edge and never reads an event.
            let lead = match *attempts {
                0 | 1 => 0,
                n => 1u64 << (n - 1).min(20),
            };
            let resume = earliest.saturating_add(lead);
            context.telemetry.emit(TelemetryEvent::StreamGap {
                stream_id,
                from_seq: *requested,
                to_seq: resume - 1,
                reason: leasehold_telemetry::GapReason::Retention,
            });
            intake.sequencer.reposition(Some(resume - 1));
            delay = Duration::ZERO;
        }
        UpstreamError::Gap { .. } if *attempts <= 1 => delay = Duration::ZERO,
        _ => {}
    }
    let backoff = sleep(delay);
    tokio::pin!(backoff);
    let mut waiting = tokio::time::interval(context.config.lag_report_interval);
    loop {
        tokio::select! {
            biased;
            _ = lease.cancelled() => return Some(loss(lease)),
            _ = drain.cancelled() => return None,
            _ = &mut backoff => return None,
            _ = waiting.tick() => report_lag(context, lease, progress),
        }
    }
}

/// Drain: write what is pending (if the lease still allows), wait for every
/// write in flight, then stop.
async fn finish(
    window: &mut Window<'_>,
    progress: &mut Progress,
    pending: &mut Vec<SinkEvent>,
) -> Stop {
    window.draining = true;
    if let Err(stop) = window.flush(progress, pending).await {
        return stop;
    }
    // A refill was under way: the rest of what the sink lost can no longer
    // come from this holder, and the next owner resumes after the checkpoint
    // (which had passed it), so the range is marked, not left a silent hole.
    if let Some(to) = progress.refill_to
        && to > progress.confirmed
    {
        pending.push(SinkEvent::gap(
            progress.confirmed + 1,
            to,
            leasehold_telemetry::GapReason::SinkLost,
        ));
        if let Err(stop) = window.flush(progress, pending).await {
            return stop;
        }
    }
    Stop::Drain
}

fn report_lag(context: &RunnerContext, lease: &HeldLease, progress: &mut Progress) {
    // Lag is measured to the durable resume point: the table's checkpoint in
    // per-stream mode (it rides on every renew), the sink's confirmation in
    // session mode (the table's is written only every CHECKPOINT_INTERVAL_MS,
    // and a lag of up to that long would page every operator for nothing).
    let persisted = if lease.lives_by_session() {
        progress.confirmed
    } else {
        lease.persisted_checkpoint().unwrap_or(0)
    };
    while progress
        .unpersisted
        .front()
        .is_some_and(|(seq, _)| *seq <= persisted)
    {
        progress.unpersisted.pop_front();
    }
    let lag_seconds = progress
        .unpersisted
        .front()
        .map_or(0.0, |(_, at)| at.elapsed().as_secs_f64());
    let counted_from = progress
        .first_seq
        .map_or(persisted, |first| persisted.max(first - 1));
    context.telemetry.emit(TelemetryEvent::StreamLag {
        stream_id: lease.stream_id.clone(),
        lag_events: progress.received.saturating_sub(counted_from),
        lag_seconds,
        last_event_age_seconds: progress.last_event_at.elapsed().as_secs_f64(),
        // Now minus the event's time: its lag on arrival plus the time since.
        event_lag_seconds: progress
            .last_arrival_lag
            .map(|lag| lag + progress.last_event_at.elapsed().as_secs_f64()),
    });
}

mod intake;
mod slot;
mod window;

use intake::{Intake, PendingReset};
use window::Window;

#[cfg(test)]
mod tests;
