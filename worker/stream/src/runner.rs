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

use leasehold_control::clock::unix_ms;
use leasehold_control::keeper::{HeldLease, LeaseKeeper};
use leasehold_control::protocol;
use leasehold_control::store::LiftRequest;
use leasehold_platform::backoff::Backoff;
use leasehold_telemetry::{LossReason, TelemetryEvent, TelemetrySink};
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::sink::{FencedSink, SinkBatch, SinkError, SinkEvent};
use crate::upstream::{Upstream, UpstreamError, UpstreamEvent};

/// How a runner batches and retries.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// Most events per sink write.
    pub batch_max_events: usize,
    /// Longest an event waits for its batch to fill.
    pub batch_max_delay: Duration,
    /// Reconnect schedule after upstream errors.
    pub reconnect: Backoff,
    /// Retry schedule after sink errors (the batch is kept and retried).
    pub sink_retry: Backoff,
    /// Consecutive sink refusals (not outages) after which the stream is
    /// released for another worker to try (`SINK_MAX_FAILURES`).
    pub sink_max_failures: u32,
    /// How often lag is reported while nothing else happens.
    pub lag_report_interval: Duration,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            batch_max_events: 500,
            batch_max_delay: Duration::from_millis(20),
            reconnect: Backoff {
                base: Duration::from_millis(100),
                cap: Duration::from_secs(5),
            },
            sink_retry: Backoff {
                base: Duration::from_millis(50),
                cap: Duration::from_secs(2),
            },
            sink_max_failures: 10,
            lag_report_interval: Duration::from_secs(1),
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
    /// Next sequence to ask the upstream for.
    next_seq: u64,
    /// Highest sequence received.
    received: u64,
    /// (first seq, received at) of each confirmed batch not yet persisted as
    /// the checkpoint, for the lag in seconds.
    unpersisted: VecDeque<(u64, Instant)>,
    /// When the last event arrived (when the stream was opened, before the first).
    last_event_at: Instant,
    /// The last event's arrival lag behind its own time, if the upstream names it.
    last_arrival_lag: Option<f64>,
}

/// Why consuming stopped.
enum Stop {
    Drain,
    Lost(LossReason),
    /// The sink keeps refusing: give the stream up (the last error).
    SinkFailing(String),
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
    let stop = match open(&context, &lease).await {
        Err(stop) => stop,
        Ok(start) => {
            let mut progress = Progress {
                confirmed: start,
                next_seq: start + 1,
                received: start,
                unpersisted: VecDeque::new(),
                last_event_at: Instant::now(),
                last_arrival_lag: None,
            };
            consume(&context, &lease, &drain, &mut progress).await
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

/// A new owner's first act: raise the sink's fence to its token (from here on a
/// zombie's delayed write is refused, traffic or not) and learn the last
/// appended sequence. Returns the sequence to resume after: the store's
/// checkpoint or the sink's last sequence, whichever is further, so a replay
/// of events the previous owner wrote but never checkpointed is not appended
/// again. Retries sink errors while the lease is valid.
async fn open(context: &RunnerContext, lease: &HeldLease) -> Result<u64, Stop> {
    let checkpoint = lease.acquired.checkpoint.unwrap_or(0);
    let mut failures = SinkFailures::default();
    loop {
        // Invariant 4: no side effect past the holder's deadline, the open included.
        if !lease.is_valid() {
            return Err(loss(lease));
        }
        match context.sink.open(&lease.stream_id, lease.fence_token).await {
            Ok(opened) if opened.fenced => {
                lift_regressed_token(context, lease, opened.highest_token).await;
                context.keeper.report_fenced(lease);
                return Err(Stop::Lost(LossReason::Fenced));
            }
            Ok(opened) => {
                let resume = protocol::resume_after(Some(checkpoint), opened.last_seq);
                if resume > checkpoint {
                    // What the sink holds is confirmed: the checkpoint catches up.
                    lease.stage_checkpoint(resume);
                }
                return Ok(resume);
            }
            Err(err) => failures.wait(context, lease, err, 0).await?,
        }
    }
}

/// The sink refused this holder's token as stale. If the lease table still says
/// this worker holds the stream with that very token, no newer owner exists: the
/// record was re-created (a restore, a TTL, an operator) and its token started
/// again below the sink's fence, so every future owner would be fenced until
/// takeovers climbed back past it one by one. Lift the stored token past the
/// fence in one conditional write instead; the worker's next acquire starts
/// above it. A real zombie (someone else holds the record) lifts nothing.
async fn lift_regressed_token(context: &RunnerContext, lease: &HeldLease, fence: u64) {
    let store = context.keeper.store();
    let owner = context.keeper.config().owner_id.clone();
    let Ok(record) = store.get(&lease.stream_id).await else {
        return;
    };
    let Some(to) = protocol::lifted_token(
        record.owner_id.as_deref(),
        record.fence_token,
        &owner,
        lease.fence_token,
        fence,
    ) else {
        return;
    };
    let request = LiftRequest {
        stream_id: lease.stream_id.clone(),
        owner_id: owner,
        fence_token: lease.fence_token,
        to,
        now_ms: unix_ms(std::time::SystemTime::now()),
    };
    match store.lift_token(&request).await {
        Ok(lifted) => context.telemetry.emit(TelemetryEvent::FenceLifted {
            stream_id: lease.stream_id.clone(),
            from: lease.fence_token,
            to: lifted.fence_token,
        }),
        Err(err) => {
            tracing::warn!(stream_id = lease.stream_id, error = %err, "could not lift the token past the sink's fence")
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
) -> Stop {
    let stream_id = lease.stream_id.as_str();
    let mut pending: Vec<SinkEvent> = Vec::with_capacity(context.config.batch_max_events);
    let mut batch_started: Option<Instant> = None;
    let mut reconnects = 0u32;
    loop {
        if drain.is_cancelled() {
            return finish(context, lease, progress, &mut pending).await;
        }
        if !lease.is_valid() {
            return loss(lease);
        }
        let subscribe = context.upstream.subscribe(stream_id, progress.next_seq);
        tokio::pin!(subscribe);
        // A connect to a frozen upstream can hang until its timeout: keep
        // reporting, so the last-event age shows the silence meanwhile.
        let mut waiting = tokio::time::interval(context.config.lag_report_interval);
        let subscribed = loop {
            tokio::select! {
                biased;
                _ = lease.cancelled() => return loss(lease),
                _ = drain.cancelled() => return finish(context, lease, progress, &mut pending).await,
                result = &mut subscribe => break result,
                _ = waiting.tick() => report_lag(context, lease, progress),
            }
        };
        let mut subscription = match subscribed {
            Ok(subscription) => subscription,
            Err(err) => {
                if let Some(stop) =
                    reconnect_after(context, lease, drain, progress, &err, &mut reconnects).await
                {
                    return stop;
                }
                continue;
            }
        };
        let mut lag_tick = tokio::time::interval(context.config.lag_report_interval);
        let error = loop {
            let flush_at = batch_started.map(|t| t + context.config.batch_max_delay);
            tokio::select! {
                biased;
                _ = lease.cancelled() => {
                    subscription.close().await;
                    return loss(lease);
                }
                _ = drain.cancelled() => {
                    subscription.close().await;
                    return finish(context, lease, progress, &mut pending).await;
                }
                _ = sleep_until(flush_at.unwrap_or_else(Instant::now)), if flush_at.is_some() => {
                    batch_started = None;
                    if let Err(stop) = flush(context, lease, progress, &mut pending).await {
                        subscription.close().await;
                        return stop;
                    }
                }
                _ = lag_tick.tick() => report_lag(context, lease, progress),
                next = subscription.next() => match next {
                    Ok(event) => {
                        reconnects = 0;
                        accept(progress, &mut pending, &mut batch_started, event);
                        if pending.len() >= context.config.batch_max_events {
                            batch_started = None;
                            if let Err(stop) = flush(context, lease, progress, &mut pending).await {
                                subscription.close().await;
                                return stop;
                            }
                        }
                    }
                    Err(err) => break err,
                },
            }
        };
        subscription.close().await;
        // Events before a gap or a disconnect are good: write them first, then
        // resume right after what the sink confirmed.
        batch_started = None;
        if let Err(stop) = flush(context, lease, progress, &mut pending).await {
            return stop;
        }
        if let Some(stop) =
            reconnect_after(context, lease, drain, progress, &error, &mut reconnects).await
        {
            return stop;
        }
    }
}

fn accept(
    progress: &mut Progress,
    pending: &mut Vec<SinkEvent>,
    batch_started: &mut Option<Instant>,
    event: UpstreamEvent,
) {
    if pending.is_empty() {
        *batch_started = Some(event.received_at);
        progress
            .unpersisted
            .push_back((event.seq, event.received_at));
    }
    progress.received = progress.received.max(event.seq);
    progress.last_event_at = event.received_at;
    progress.last_arrival_lag = event.arrival_lag;
    progress.next_seq = event.seq + 1;
    pending.push(SinkEvent {
        seq: event.seq,
        event_id: event.event_id,
        payload: event.payload,
    });
}

/// Reports the error, decides where to resume, and waits the backoff. Returns
/// `Some` when the stream must stop instead.
async fn reconnect_after(
    context: &RunnerContext,
    lease: &HeldLease,
    drain: &CancellationToken,
    progress: &mut Progress,
    error: &UpstreamError,
    attempts: &mut u32,
) -> Option<Stop> {
    let stream_id = lease.stream_id.clone();
    context.telemetry.emit(TelemetryEvent::UpstreamReconnect {
        stream_id: stream_id.clone(),
        reason: error.reason().to_owned(),
    });
    let mut delay = context.config.reconnect.delay(*attempts);
    *attempts = attempts.saturating_add(1);
    progress.next_seq = progress.confirmed + 1;
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
            });
            progress.next_seq = resume;
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

/// Writes the pending batch, retrying sink errors while the lease is valid.
async fn flush(
    context: &RunnerContext,
    lease: &HeldLease,
    progress: &mut Progress,
    pending: &mut Vec<SinkEvent>,
) -> Result<(), Stop> {
    if pending.is_empty() {
        return Ok(());
    }
    let mut failures = SinkFailures::default();
    loop {
        // Invariant 4: no side effect past the holder's deadline.
        if !lease.is_valid() {
            return Err(loss(lease));
        }
        let batch = SinkBatch {
            stream_id: &lease.stream_id,
            fence_token: lease.fence_token,
            events: pending,
        };
        let started = Instant::now();
        let result = context.sink.write(batch).await;
        match result {
            Ok(outcome) => {
                context.telemetry.emit(TelemetryEvent::SinkWrite {
                    stream_id: lease.stream_id.clone(),
                    fence_token: lease.fence_token,
                    accepted: outcome.accepted,
                    duplicate: outcome.duplicate,
                    fenced: outcome.fenced,
                    duration: started.elapsed(),
                });
                if outcome.is_fenced() {
                    // Someone holds a newer token: this process is a zombie for this stream.
                    context.keeper.report_fenced(lease);
                    return Err(Stop::Lost(LossReason::Fenced));
                }
                let last = pending.last().map_or(progress.confirmed, |e| e.seq);
                progress.confirmed = progress.confirmed.max(last);
                // Invariant 3: the checkpoint moves only now, and rides on the next renew.
                lease.stage_checkpoint(progress.confirmed);
                pending.clear();
                report_lag(context, lease, progress);
                return Ok(());
            }
            Err(err) => {
                failures
                    .wait(context, lease, err, pending.len() as u64)
                    .await?
            }
        }
    }
}

/// Drain: write what is pending (if the lease still allows), then stop.
async fn finish(
    context: &RunnerContext,
    lease: &HeldLease,
    progress: &mut Progress,
    pending: &mut Vec<SinkEvent>,
) -> Stop {
    match flush(context, lease, progress, pending).await {
        Ok(()) => Stop::Drain,
        Err(stop) => stop,
    }
}

fn report_lag(context: &RunnerContext, lease: &HeldLease, progress: &mut Progress) {
    let persisted = lease.persisted_checkpoint().unwrap_or(0);
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
    context.telemetry.emit(TelemetryEvent::StreamLag {
        stream_id: lease.stream_id.clone(),
        lag_events: progress.received.saturating_sub(persisted),
        lag_seconds,
        last_event_age_seconds: progress.last_event_at.elapsed().as_secs_f64(),
        // Now minus the event's time: its lag on arrival plus the time since.
        event_lag_seconds: progress
            .last_arrival_lag
            .map(|lag| lag + progress.last_event_at.elapsed().as_secs_f64()),
    });
}

#[cfg(test)]
mod tests;
