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
//!
//! The decisions live in the stream's machine ([`crate::machine`]); this
//! module is its driver: it opens the sink, feeds the machine what the
//! upstream, the sink, the history and the lease do, and carries out what
//! it asks, checking the lease before every sink call.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::sequence::{JumpBound, ResumeMode, SeqStep};
use futures_util::future::BoxFuture;
use leasehold_control::keeper::{HeldLease, LeaseKeeper};
use leasehold_control::protocol;
use leasehold_platform::backoff::Backoff;
use leasehold_sink::{FencedSink, ResetMark, SinkBatch, SinkError};
use leasehold_telemetry::{LossReason, TelemetryEvent, TelemetrySink};
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::machine::{Action, Input, SinkFailures, Start, Stop, StreamMachine};
use crate::upstream::history::{History, HistoryConfig, HistoryError, fetch_page, fetch_snapshot};
use crate::upstream::{Subscription, Upstream, UpstreamError, UpstreamEvent};

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
    /// Whether the upstream's sequence is the stream's or the worker numbers
    /// frames (`UPSTREAM_SEQ_SCOPE`, `UPSTREAM_SEQ_POINTER=none`).
    pub seq_source: crate::numbering::SeqSource,
    /// `snapshot` mode: the book's snapshots come in the stream
    /// (`UPSTREAM_SNAPSHOT_MATCH`; a new one is asked for on the connection),
    /// not from `UPSTREAM_SNAPSHOT_URL`.
    pub snapshots_in_band: bool,
    /// `snapshot` mode: the checksum every book update is checked against
    /// (`UPSTREAM_BOOK_CHECKSUM`) and how the book is kept for it.
    pub book_check: BookCheck,
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
    /// The machine's rules, each of which the model turns off once to show
    /// it matters (`tests/it/machine_model.rs`); always all on otherwise.
    #[doc(hidden)]
    pub rules: MachineRules,
}

/// How an order book's updates are checked (`UPSTREAM_BOOK_CHECKSUM`,
/// `UPSTREAM_BOOK_DEPTH`, `UPSTREAM_BOOK_PRECISION`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BookCheck {
    /// `none`: the worker keeps no book.
    pub rule: crate::book::ChecksumRule,
    /// The subscribed depth and the pair's decimals.
    pub options: crate::book::KeeperOptions,
}

/// Rules of the stream machine that a model can switch off.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MachineRules {
    /// A re-open compares the sink's end with what was confirmed (else a
    /// batch is sent again above a tail a failover lost).
    pub reopen_compares_the_tail: bool,
    /// The checkpoint is staged only once the sink confirmed (else when the
    /// batch is sent).
    pub checkpoint_after_confirmation: bool,
}

impl MachineRules {
    /// Every rule in place: the shipped behaviour.
    pub const ALL: MachineRules = MachineRules {
        reopen_compares_the_tail: true,
        checkpoint_after_confirmation: true,
    };
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
            seq_source: crate::numbering::SeqSource::Stream,
            snapshots_in_band: false,
            book_check: BookCheck::default(),
            backfill_hold_max: BACKFILL_HOLD_MAX,
            hold_max_bytes: HOLD_MAX_BYTES,
            backfill_empty_pages: 3,
            backfill_empty_wait: Duration::from_millis(500),
            jump: JUMP_BOUND,
            rules: MachineRules::ALL,
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

/// Why `lease` can no longer be used (past its deadline when no loss was
/// signalled yet).
fn loss_reason(lease: &HeldLease) -> LossReason {
    lease.loss_reason().unwrap_or(LossReason::DeadlinePassed)
}

fn loss(lease: &HeldLease) -> Stop {
    Stop::Lost(loss_reason(lease))
}

/// Runs one held stream until it is lost or `drain` is cancelled.
pub async fn run_stream(
    context: Arc<RunnerContext>,
    lease: HeldLease,
    drain: CancellationToken,
) -> StreamExit {
    let (_unused, drain_after) = tokio::sync::watch::channel(None);
    let controls = Controls {
        drain,
        drain_after,
        prepared: None,
    };
    run_stream_with(context, lease, controls).await
}

/// How a worker steers one running stream: the drain, the drain after a
/// sequence (an overlapping hand-off's predecessor), and a subscription made
/// before the lease was taken (its successor).
pub struct Controls {
    /// Cancelled: write what is pending, then release.
    pub drain: CancellationToken,
    /// A sequence: drain once the sink confirmed through it (the successor
    /// holds what follows).
    pub drain_after: tokio::sync::watch::Receiver<Option<u64>>,
    /// The subscription the first connect uses, holding the frames that
    /// came since it was made.
    pub prepared: Option<Box<dyn Subscription>>,
}

/// [`run_stream`] steered by `controls`.
pub async fn run_stream_with(
    context: Arc<RunnerContext>,
    lease: HeldLease,
    controls: Controls,
) -> StreamExit {
    let Controls {
        drain,
        mut drain_after,
        prepared,
    } = controls;
    let mut lease = lease;
    let stop = match open(&context, &lease).await {
        Err(stop) => stop,
        Ok(start) => {
            let mut held = Held {
                telemetry: context.telemetry.as_ref(),
                machine: StreamMachine::new(
                    context.config.clone(),
                    lease.stream_id.clone(),
                    lease.fence_token,
                    lease.lives_by_session(),
                    start,
                    Instant::now(),
                ),
            };
            if prepared.is_some() {
                held.machine.continue_prepared();
            }
            let mut out = Out {
                prepared,
                ..Out::default()
            };
            drive(
                &context,
                &mut lease,
                (&drain, &mut drain_after),
                &mut held.machine,
                &mut out,
            )
            .await
        }
    };
    let exit = match stop {
        Stop::Lost(reason) => StreamExit::Lost(reason),
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

/// The machine of a running stream; if the stream's task is dropped mid-way
/// (aborted), a backfill under way is reported as stopped.
struct Held<'a> {
    telemetry: &'a dyn TelemetrySink,
    machine: StreamMachine,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(event) = self.machine.abandon(Instant::now()) {
            self.telemetry.emit(event);
        }
    }
}

/// A history page or a book's snapshot being fetched: its task ends with
/// the machine's input (aborted when dropped).
type PageFetch = AbortOnDropHandle<Input>;

/// What the driver has out: each at most once (one write slot, one
/// connection, one fetch).
#[derive(Default)]
struct Out {
    /// A subscription made before the lease (an overlapping hand-off's):
    /// the first connect takes it.
    prepared: Option<Box<dyn Subscription>>,
    subscription: Option<Box<dyn Subscription>>,
    subscribing: Option<BoxFuture<'static, Result<Box<dyn Subscription>, UpstreamError>>>,
    /// A write or a re-open: its reply is the input.
    sink_call: Option<BoxFuture<'static, Input>>,
    fetch: Option<PageFetch>,
}

impl Out {
    async fn close(&mut self) {
        self.subscribing = None;
        if let Some(mut subscription) = self.subscription.take() {
            subscription.close().await;
        }
    }
}

/// Waits for `future` if there is one (never resolves otherwise).
async fn next_of<F: Future + Unpin>(future: &mut Option<F>) -> F::Output {
    match future {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

async fn next_frame(
    subscription: &mut Option<Box<dyn Subscription>>,
) -> Result<UpstreamEvent, UpstreamError> {
    match subscription {
        Some(subscription) => subscription.next().await,
        None => std::future::pending().await,
    }
}

/// The machine's driver: one `select!` over the lease, the drain, the sink
/// call, the connect, the history, the upstream and the machine's timer.
async fn drive(
    context: &RunnerContext,
    lease: &mut HeldLease,
    (drain, drain_after): (
        &CancellationToken,
        &mut tokio::sync::watch::Receiver<Option<u64>>,
    ),
    machine: &mut StreamMachine,
    out: &mut Out,
) -> Stop {
    let mut drain_seen = false;
    // A sender gone (or a plain `run_stream`) sends nothing more.
    let mut drain_after_open = true;
    loop {
        machine.set_persisted(lease.persisted_checkpoint());
        while let Some(action) = machine.poll_action() {
            if let Err(stop) = carry_out(context, lease, machine, out, action).await {
                out.close().await;
                return stop;
            }
        }
        if let Some(stop) = machine.stopped() {
            // A write already sent runs whether or not its reply is awaited:
            // wait for its verdict, so a zombie's refused write still counts.
            if machine.writing()
                && let Some(call) = out.sink_call.take()
            {
                let input = call.await;
                machine.handle(input, Instant::now());
                continue;
            }
            let stop = stop.clone();
            out.close().await;
            return stop;
        }
        let timeout = machine.poll_timeout();
        tokio::select! {
            biased;
            _ = lease.cancelled() => machine.handle(Input::Lost(loss_reason(lease)), Instant::now()),
            _ = drain.cancelled(), if !drain_seen => {
                drain_seen = true;
                machine.handle(Input::Drain, Instant::now());
            }
            changed = drain_after.changed(), if drain_after_open && !drain_seen => {
                match changed {
                    Ok(()) => {
                        if let Some(seq) = *drain_after.borrow_and_update() {
                            machine.handle(Input::DrainAfter(seq), Instant::now());
                        }
                    }
                    Err(_) => drain_after_open = false,
                }
            }
            input = next_of(&mut out.sink_call), if out.sink_call.is_some() => {
                out.sink_call = None;
                machine.handle(input, Instant::now());
            }
            subscribed = next_of(&mut out.subscribing), if out.subscribing.is_some() => {
                out.subscribing = None;
                match subscribed {
                    Ok(subscription) => {
                        out.subscription = Some(subscription);
                        machine.handle(Input::Subscribed, Instant::now());
                    }
                    Err(err) => machine.handle(Input::SubscribeFailed(err), Instant::now()),
                }
            }
            joined = next_of(&mut out.fetch), if out.fetch.is_some() && machine.wants_page() => {
                out.fetch = None;
                let input = joined.unwrap_or_else(|join| {
                    Input::Page(Err(HistoryError::Refused(format!("backfill task failed: {join}"))))
                });
                machine.handle(input, Instant::now());
            }
            // A full batch waits for a free write slot: reading stops (backpressure).
            next = next_frame(&mut out.subscription), if out.subscription.is_some() && machine.wants_frames() => {
                match next {
                    Ok(event) => {
                        machine.handle(Input::Frame(event), Instant::now());
                        // Take whatever else is already here into the same
                        // batch: under load batches grow, at a trickle each
                        // event goes at once.
                        while machine.wants_frames() {
                            let Some(subscription) = out.subscription.as_mut() else {
                                break;
                            };
                            match subscription.next_ready() {
                                Some(Ok(event)) => machine.handle(Input::Frame(event), Instant::now()),
                                Some(Err(err)) => {
                                    machine.handle(Input::UpstreamFailed(err), Instant::now());
                                    break;
                                }
                                None => break,
                            }
                        }
                    }
                    Err(err) => machine.handle(Input::UpstreamFailed(err), Instant::now()),
                }
            }
            _ = sleep_until(timeout.unwrap_or_else(Instant::now)), if timeout.is_some() => {
                machine.handle_timeout(Instant::now());
            }
        }
    }
}

/// One of the machine's actions. `Err` when the stream must stop at once.
async fn carry_out(
    context: &RunnerContext,
    lease: &mut HeldLease,
    machine: &mut StreamMachine,
    out: &mut Out,
    action: Action,
) -> Result<(), Stop> {
    // Invariant 4: no side effect past the holder's deadline.
    if matches!(action, Action::Write(_) | Action::Reopen) && !lease.is_valid() {
        machine.handle(Input::Lost(loss_reason(lease)), Instant::now());
        return Ok(());
    }
    match action {
        Action::Subscribe { .. } if out.prepared.is_some() => {
            let prepared = out.prepared.take();
            out.subscribing = Some(Box::pin(async move {
                prepared.ok_or_else(|| UpstreamError::Closed("no prepared subscription".into()))
            }));
        }
        Action::Subscribe { from } => {
            let upstream = context.upstream.clone();
            let stream_id = lease.stream_id.clone();
            out.subscribing = Some(Box::pin(async move {
                upstream.subscribe(&stream_id, from).await
            }));
        }
        Action::Close => out.close().await,
        Action::Write(events) => {
            let sink = context.sink.clone();
            let stream_id = lease.stream_id.clone();
            let fence_token = lease.fence_token;
            out.sink_call = Some(Box::pin(async move {
                let started = Instant::now();
                let result = sink
                    .write(SinkBatch {
                        stream_id: &stream_id,
                        fence_token,
                        events: &events,
                    })
                    .await;
                Input::Written { result, started }
            }));
        }
        Action::Reopen => {
            let sink = context.sink.clone();
            let stream_id = lease.stream_id.clone();
            let fence_token = lease.fence_token;
            out.sink_call = Some(Box::pin(async move {
                Input::Reopened(sink.open(&stream_id, fence_token).await)
            }));
        }
        Action::Fetch { from, to, after } => {
            let stream_id = lease.stream_id.clone();
            out.fetch = Some(match context.history.clone() {
                Some((history, config)) => {
                    let telemetry = context.telemetry.clone();
                    AbortOnDropHandle::new(tokio::spawn(async move {
                        sleep(after).await;
                        Input::Page(
                            fetch_page(&*history, &config, &*telemetry, &stream_id, from, to).await,
                        )
                    }))
                }
                // Settings require a history for `backfill`; a runner built
                // without one has nothing to fetch from.
                None => AbortOnDropHandle::new(tokio::spawn(async {
                    Input::Page(Err(HistoryError::Refused("no history configured".into())))
                })),
            });
        }
        Action::FetchSnapshot { after } => {
            let stream_id = lease.stream_id.clone();
            let history = context.history.clone();
            let telemetry = context.telemetry.clone();
            out.fetch = Some(AbortOnDropHandle::new(tokio::spawn(async move {
                sleep(after).await;
                Input::Snapshot(match history {
                    Some((history, config)) => {
                        fetch_snapshot(&*history, &config, &*telemetry, &stream_id).await
                    }
                    // Settings require a snapshot URL for `snapshot`.
                    None => Err(HistoryError::Refused("no snapshot URL configured".into())),
                })
            })));
        }
        Action::AskSnapshot => {
            if let Some(subscription) = out.subscription.as_mut()
                && let Err(error) = subscription.resubscribe().await
            {
                machine.handle(Input::UpstreamFailed(error), Instant::now());
            }
        }
        Action::CancelFetch => out.fetch = None,
        Action::StageCheckpoint(seq) => lease.stage_checkpoint(seq),
        Action::ReportFenced => context.keeper.report_fenced(lease),
        Action::Emit(event) => context.telemetry.emit(event),
        Action::StartEpoch { from, to } => {
            let epoch = new_epoch(context, lease, ResetMark { from, to }).await?;
            *lease = epoch;
            machine.handle(
                Input::EpochStarted {
                    fence_token: lease.fence_token,
                },
                Instant::now(),
            );
        }
    }
    Ok(())
}

/// The upstream's sequence started over: the lease's token is lifted for a
/// new epoch whose checkpoint is the reset entry's position, then the sink
/// is opened under it with the reset entry (`<new token>-<reset_to - 1>`),
/// so entry ids keep increasing and the old epoch's writer is fenced. The
/// reset is counted once the sink holds its entry.
async fn new_epoch(
    context: &RunnerContext,
    lease: &HeldLease,
    mark: ResetMark,
) -> Result<HeldLease, Stop> {
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
            Err(err) => wait_after(&mut failures, context, &epoch, err).await?,
        }
    }
    context.telemetry.emit(TelemetryEvent::StreamReset {
        stream_id: epoch.stream_id.clone(),
        from_seq: mark.from,
        to_seq: mark.to,
        fence_token: epoch.fence_token,
    });
    Ok(epoch)
}

/// A new owner's first act: raise the sink's fence to its token (from here on a
/// zombie's delayed write is refused, traffic or not) and learn the last
/// appended sequence. Resumes after the sink's end ([`protocol::resume_point`]):
/// past the checkpoint, a replay of events the previous owner wrote but never
/// checkpointed is not appended again; below it, a failover lost a tail the
/// checkpoint covered (counted as a regression). Retries sink errors while
/// the lease is valid.
async fn open(context: &RunnerContext, lease: &HeldLease) -> Result<Start, Stop> {
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
                return Ok(Start {
                    resume,
                    anchored: resume > 0 || checkpoint > 0 || opened.last_seq.is_some(),
                    lost,
                });
            }
            Err(err) => wait_after(&mut failures, context, lease, err).await?,
        }
    }
}

/// The open's (and a new epoch's) failed sink call: reported, counted by the
/// machine's rule ([`SinkFailures::record`]), then the backoff is waited
/// while the lease holds. `Err` when the stream must stop.
async fn wait_after(
    failures: &mut SinkFailures,
    context: &RunnerContext,
    lease: &HeldLease,
    err: SinkError,
) -> Result<(), Stop> {
    context.telemetry.emit(TelemetryEvent::SinkWriteFailed {
        stream_id: lease.stream_id.clone(),
        error: err.to_string(),
        events: 0,
    });
    let Ok(delay) = failures.record(&err, &context.config) else {
        return Err(Stop::SinkFailing(err.to_string()));
    };
    tokio::select! {
        biased;
        _ = lease.cancelled() => Err(loss(lease)),
        _ = sleep(delay) => Ok(()),
    }
}

#[cfg(test)]
mod tests;
