//! A held stream's one batch in flight to the sink: sending, waiting,
//! resending after a failure, re-opening after a lost connection and
//! confirming a landed batch (fence verdict, then checkpoint). The decisions
//! are `slot`'s; this is the shell that does the I/O.

use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesOrdered;
use leasehold_control::keeper::HeldLease;
use leasehold_control::protocol;
use leasehold_sink::{SinkBatch, SinkError, SinkEvent, WriteOutcome};
use leasehold_telemetry::{LossReason, TelemetryEvent};
use tokio::time::Instant;

use super::{Progress, RunnerContext, SinkFailures, Stop, loss, report_lag, slot};

/// A batch's write, finished: the events (kept for a resend) and the outcome.
pub(super) struct Landed {
    pub(super) events: Arc<Vec<SinkEvent>>,
    pub(super) started: Instant,
    pub(super) result: Result<WriteOutcome, SinkError>,
}

/// One stream's batch in flight to the sink, if any. One at a time: with
/// the fence in the entry id, a batch sent past one that failed would land
/// above the hole, and no retry could fill it (ids only go up). Many streams'
/// batches are still pipelined on the sink's one connection.
pub(super) struct Window<'a> {
    pub(super) context: &'a RunnerContext,
    pub(super) lease: &'a HeldLease,
    pub(super) in_flight: FuturesOrdered<BoxFuture<'a, Landed>>,
    /// The sink lost confirmed events and the upstream can send them again:
    /// consuming starts over after this sequence (the sink's last).
    pub(super) rewind: Option<u64>,
    /// Draining: a lost tail cannot be refilled any more, so it is marked.
    pub(super) draining: bool,
}

impl<'a> Window<'a> {
    pub(super) fn new(context: &'a RunnerContext, lease: &'a HeldLease) -> Self {
        Window {
            context,
            lease,
            in_flight: FuturesOrdered::new(),
            rewind: None,
            draining: false,
        }
    }

    /// After the stream stopped (lost, fenced, given up): waits for the write
    /// already sent and counts its verdict, so a zombie's write the sink
    /// refused still shows as fenced (`sink_events_fenced`) and is reported to
    /// the keeper. Nothing new is sent; a Redis command already on the wire
    /// runs whether or not its reply is awaited.
    pub(super) async fn settle(&mut self, stop: Stop) -> Stop {
        let mut fenced = false;
        while let Some(landed) = self.in_flight.next().await {
            if let Ok(outcome) = &landed.result {
                emit_write(self.context, self.lease, outcome, landed.started);
                fenced |= outcome.is_fenced();
            }
        }
        if fenced && !matches!(stop, Stop::Lost(LossReason::Fenced)) {
            self.context.keeper.report_fenced(self.lease);
            return Stop::Lost(LossReason::Fenced);
        }
        stop
    }

    pub(super) fn has_room(&self) -> bool {
        self.in_flight.is_empty() && self.rewind.is_none()
    }

    /// Starts writing everything pending as one batch.
    pub(super) fn submit(&mut self, pending: &mut Vec<SinkEvent>) -> Result<(), Stop> {
        if pending.is_empty() {
            return Ok(());
        }
        // Invariant 4: no side effect past the holder's deadline.
        if !self.lease.is_valid() {
            return Err(loss(self.lease));
        }
        let capacity = self.context.config.batch_max_events.max(1);
        // A backfill page can queue more than a batch holds.
        let events = if pending.len() <= capacity {
            Arc::new(std::mem::replace(pending, Vec::with_capacity(capacity)))
        } else {
            Arc::new(pending.drain(..capacity).collect())
        };
        let sink = &self.context.sink;
        let stream_id = self.lease.stream_id.as_str();
        let fence_token = self.lease.fence_token;
        self.in_flight.push_back(Box::pin(async move {
            let started = Instant::now();
            let result = sink
                .write(SinkBatch {
                    stream_id,
                    fence_token,
                    events: &events,
                })
                .await;
            Landed {
                events,
                started,
                result,
            }
        }));
        Ok(())
    }

    /// Takes the write's outcome; a failed one is written again on its own
    /// until it lands (already appended sequences are dropped by the sink).
    pub(super) async fn land(
        &mut self,
        progress: &mut Progress,
        landed: Landed,
    ) -> Result<(), Stop> {
        let mut failures = SinkFailures::default();
        let next = slot::after_write(&landed.result);
        match (landed.result, next) {
            (Ok(outcome), _) => confirm(
                self.context,
                self.lease,
                progress,
                &landed.events,
                outcome,
                landed.started,
            ),
            (Err(_), slot::AfterWrite::Reopen) => {
                self.write_serially(progress, &landed.events, &mut failures)
                    .await
            }
            (Err(err), _) => {
                failures
                    .wait(self.context, self.lease, err, landed.events.len() as u64)
                    .await?;
                self.write_serially(progress, &landed.events, &mut failures)
                    .await
            }
        }
    }

    /// Writes one batch on its own, retrying sink errors while the lease is
    /// valid. A sink that asks for a new open (its connection was lost) is
    /// opened again; if it lost confirmed events, the batch is dropped and
    /// consuming starts over after the sink's end (`rewind`: the upstream
    /// sends them again), or, for a `live` upstream or while draining, a
    /// `sink_lost` gap marker goes in front of the batch.
    pub(super) async fn write_serially(
        &mut self,
        progress: &mut Progress,
        events: &[SinkEvent],
        failures: &mut SinkFailures,
    ) -> Result<(), Stop> {
        let mut marked: Option<Vec<SinkEvent>> = None;
        loop {
            // Invariant 4: no side effect past the holder's deadline.
            if !self.lease.is_valid() {
                return Err(loss(self.lease));
            }
            let sending = marked.as_deref().unwrap_or(events);
            let batch = SinkBatch {
                stream_id: &self.lease.stream_id,
                fence_token: self.lease.fence_token,
                events: sending,
            };
            let started = Instant::now();
            let reply = self.context.sink.write(batch).await;
            let next = slot::after_write(&reply);
            match (reply, next) {
                (Ok(outcome), _) => {
                    return confirm(
                        self.context,
                        self.lease,
                        progress,
                        sending,
                        outcome,
                        started,
                    );
                }
                (Err(_), slot::AfterWrite::Reopen) => {
                    let lost = reopen(self.context, self.lease, progress, failures).await?;
                    match slot::after_reopen(lost, self.context.config.resume, self.draining) {
                        slot::AfterReopen::Resend => {}
                        slot::AfterReopen::Rewind { sink_last } => {
                            self.rewind = Some(sink_last);
                            return Ok(());
                        }
                        slot::AfterReopen::Mark(lost) => {
                            let mut with_marker = vec![SinkEvent::gap(
                                *lost.start(),
                                *lost.end(),
                                leasehold_telemetry::GapReason::SinkLost,
                            )];
                            with_marker
                                .extend(events.iter().filter(|e| e.seq > *lost.end()).cloned());
                            marked = Some(with_marker);
                        }
                    }
                }
                (Err(err), _) => {
                    failures
                        .wait(self.context, self.lease, err, sending.len() as u64)
                        .await?
                }
            }
        }
    }

    /// Writes what is pending and waits until every write has landed (or a
    /// rewind dropped what was pending).
    pub(super) async fn flush(
        &mut self,
        progress: &mut Progress,
        pending: &mut Vec<SinkEvent>,
    ) -> Result<(), Stop> {
        loop {
            if self.rewind.is_some() {
                pending.clear();
                return Ok(());
            }
            if !pending.is_empty() && self.has_room() {
                self.submit(pending)?;
            }
            let next = tokio::select! {
                biased;
                _ = self.lease.cancelled() => return Err(loss(self.lease)),
                next = self.in_flight.next() => next,
            };
            match next {
                Some(landed) => self.land(progress, landed).await?,
                None if pending.is_empty() => return Ok(()),
                None => {}
            }
        }
    }
}

/// Opens the stream again after the sink lost its connection (a failover
/// shows that way) and compares its end with what it had confirmed.
/// `Some(lost range)` when the sink is behind, counted and logged; a fenced
/// open stops the stream.
pub(super) async fn reopen(
    context: &RunnerContext,
    lease: &HeldLease,
    progress: &Progress,
    failures: &mut SinkFailures,
) -> Result<Option<std::ops::RangeInclusive<u64>>, Stop> {
    loop {
        if !lease.is_valid() {
            return Err(loss(lease));
        }
        match context.sink.open(&lease.stream_id, lease.fence_token).await {
            Ok(opened) if opened.fenced => {
                context.keeper.report_fenced(lease);
                return Err(Stop::Lost(LossReason::Fenced));
            }
            Ok(opened) => {
                let lost = protocol::lost_tail(progress.confirmed, opened.last_seq);
                if let Some(lost) = &lost {
                    context.telemetry.emit(TelemetryEvent::SinkRegression {
                        stream_id: lease.stream_id.clone(),
                        from_seq: *lost.start(),
                        to_seq: *lost.end(),
                    });
                }
                return Ok(lost);
            }
            Err(err) => failures.wait(context, lease, err, 0).await?,
        }
    }
}

/// One write's verdict for the sidecar (accepted, duplicate, fenced, time).
pub(super) fn emit_write(
    context: &RunnerContext,
    lease: &HeldLease,
    outcome: &WriteOutcome,
    started: Instant,
) {
    context.telemetry.emit(TelemetryEvent::SinkWrite {
        stream_id: lease.stream_id.clone(),
        fence_token: lease.fence_token,
        accepted: outcome.accepted,
        duplicate: outcome.duplicate,
        fenced: outcome.fenced,
        duration: started.elapsed(),
    });
}

/// Records a landed batch: the fence verdict, then the confirmed sequence and
/// the staged checkpoint.
pub(super) fn confirm(
    context: &RunnerContext,
    lease: &HeldLease,
    progress: &mut Progress,
    events: &[SinkEvent],
    outcome: WriteOutcome,
    started: Instant,
) -> Result<(), Stop> {
    emit_write(context, lease, &outcome, started);
    if outcome.is_fenced() {
        // Someone holds a newer token: this process is a zombie for this stream.
        context.keeper.report_fenced(lease);
        return Err(Stop::Lost(LossReason::Fenced));
    }
    // Only a batch's head can be a replay (batches are ordered): the markers
    // after it were appended now, and each is one gap.
    for event in events.iter().skip(outcome.duplicate as usize) {
        if let Some(gap) = event.gap {
            context.telemetry.emit(TelemetryEvent::StreamGap {
                stream_id: lease.stream_id.clone(),
                from_seq: gap.from,
                to_seq: event.seq,
                reason: gap.reason,
            });
        }
    }
    let last = events.last().map_or(progress.confirmed, |e| e.seq);
    progress.confirmed = progress.confirmed.max(last);
    // Invariant 3: the checkpoint moves only now, and rides on the next renew.
    lease.stage_checkpoint(progress.confirmed);
    report_lag(context, lease, progress);
    Ok(())
}
