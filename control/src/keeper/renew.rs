//! The per-stream renew loop: one task per lease renewed on its own
//! (every lease in per-stream mode, and the session record in session mode).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::{HeldLease, Inner, ms};
use crate::protocol;
use crate::store::{LeaseError, RenewRequest};
use leasehold_telemetry::{CommitResult, LossReason, TelemetryEvent};

/// A backward step this large is logged (smaller ones are NTP's slewing).
const CLOCK_STEP_WORTH_A_WARNING: Duration = Duration::from_millis(500);

/// What ended a renew attempt.
enum Attempt {
    Renewed,
    Lost(LossReason),
    Stopped,
}

pub(super) async fn renew_loop(
    inner: Arc<Inner>,
    lease: HeldLease,
    acquire_sent: Instant,
    stop: CancellationToken,
) {
    let config = &inner.config;
    let mut scheduled = acquire_sent + config.renew_interval;
    loop {
        let deadline = lease.signal.deadline();
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = sleep_until(deadline) => {
                inner.lose(&lease, LossReason::DeadlinePassed);
                break;
            }
            _ = sleep_until(scheduled) => {}
        }
        let lateness = Instant::now().saturating_duration_since(scheduled);
        match renew_with_retries(&inner, &lease, &stop, lateness, acquire_sent).await {
            (Attempt::Renewed, sent) => scheduled = sent + config.renew_interval,
            (Attempt::Lost(reason), _) => {
                inner.lose(&lease, reason);
                break;
            }
            (Attempt::Stopped, _) => return,
        }
    }
    inner.forget(&lease.stream_id, lease.fence_token);
}

/// Renews until confirmed, refused, stopped, or the deadline passes. Returns
/// the outcome and when the successful request was sent.
async fn renew_with_retries(
    inner: &Inner,
    lease: &HeldLease,
    stop: &CancellationToken,
    lateness: Duration,
    acquire_sent: Instant,
) -> (Attempt, Instant) {
    let config = &inner.config;
    // The wall time the acquire wrote its expiry from: the origin against
    // which a backward step of this host's clock is measured.
    let acquire_wall_ms = lease.acquired.lease_expires_at - ms(config.lease);
    let mut attempt = 0u32;
    let mut carry_checkpoint = true;
    loop {
        let deadline = lease.signal.deadline();
        let staged = *lease
            .signal
            .staged_checkpoint
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let request = RenewRequest {
            stream_id: lease.stream_id.clone(),
            owner_id: config.owner_id.clone(),
            fence_token: lease.fence_token,
            now_ms: inner.clock.now_ms(),
            lease_ms: ms(config.lease),
            checkpoint: staged.filter(|_| carry_checkpoint),
        };
        let sent = Instant::now();
        let result = tokio::select! {
            biased;
            _ = stop.cancelled() => return (Attempt::Stopped, sent),
            _ = sleep_until(deadline) => return (Attempt::Lost(LossReason::DeadlinePassed), sent),
            result = inner.store.renew(&request) => result,
        };
        // Only a confirmed renew moves the deadline: one whose outcome is
        // unknown (a timeout, throttling, an error) may not have been applied,
        // so the holder retries and still stops at the deadline it had.
        // A kept later expiry (`ExpiryAhead`) is unconfirmed too.
        let outcome = match &result {
            Ok(record) => {
                protocol::renew_outcome(record.lease_expires_at, request.now_ms + request.lease_ms)
            }
            Err(err) if err.is_ownership_lost() => protocol::RenewOutcome::Refused,
            Err(_) => protocol::RenewOutcome::Unconfirmed,
        };
        let next = protocol::deadline_after_renew(
            deadline,
            sent,
            outcome,
            config.lease,
            config.safety_margin,
        );
        let Some(next) = next else {
            return (Attempt::Lost(LossReason::RenewRejected), sent);
        };
        // The expiry just written reads early by however far this host's
        // wall clock fell behind since the acquire: so does the deadline.
        let behind = protocol::wall_clock_behind(
            sent.saturating_duration_since(acquire_sent),
            request.now_ms - acquire_wall_ms,
        );
        if outcome == protocol::RenewOutcome::Confirmed && behind > Duration::ZERO {
            if behind >= CLOCK_STEP_WORTH_A_WARNING {
                tracing::warn!(
                    stream_id = lease.stream_id,
                    behind_ms = ms(behind),
                    "this host's wall clock fell behind since the acquire (stepped back?): the lease's deadline comes that much earlier"
                );
            }
            lease
                .signal
                .extend(next.checked_sub(behind).unwrap_or(sent).min(next));
        } else {
            lease.signal.extend(next);
        }
        let error = match result {
            Ok(record) => {
                lease.signal.persisted(record.checkpoint);
                if let Some(seq) = request.checkpoint {
                    inner.telemetry.emit(TelemetryEvent::CheckpointCommit {
                        stream_id: lease.stream_id.clone(),
                        checkpoint: seq,
                        result: CommitResult::Committed,
                    });
                }
                if let (Some(written), Some(staged)) = (record.checkpoint, staged) {
                    let mut current = lease
                        .signal
                        .staged_checkpoint
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    if *current == Some(staged) && written >= staged {
                        *current = None;
                    }
                }
                inner.telemetry.emit(TelemetryEvent::LeaseRenewed {
                    stream_id: lease.stream_id.clone(),
                    fence_token: lease.fence_token,
                    expires_at_ms: record.lease_expires_at,
                    duration: sent.elapsed(),
                    lateness,
                });
                return (Attempt::Renewed, sent);
            }
            Err(LeaseError::CheckpointBehind { .. }) => {
                // A staged checkpoint behind the stored one is a caller bug; the
                // lease matters more than the checkpoint, so renew without it.
                carry_checkpoint = false;
                continue;
            }
            Err(err) => err,
        };
        inner.telemetry.emit(TelemetryEvent::LeaseRenewFailed {
            stream_id: lease.stream_id.clone(),
            fence_token: lease.fence_token,
            error: error.to_string(),
        });
        let retry_at = Instant::now() + config.retry.delay(attempt);
        attempt = attempt.saturating_add(1);
        tokio::select! {
            biased;
            _ = stop.cancelled() => return (Attempt::Stopped, sent),
            _ = sleep_until(deadline) => return (Attempt::Lost(LossReason::DeadlinePassed), sent),
            _ = sleep_until(retry_at) => {}
        }
    }
}
