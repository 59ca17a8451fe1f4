//! Session mode's part of the keeper: the task of a stream that lives by its
//! session, and when a refused acquire becomes a takeover.

use std::sync::Arc;

use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::{HeldLease, Inner, write_checkpoint};
use crate::lease::Lease;
use crate::store::{AcquireRequest, TakeoverRequest};
use leasehold_telemetry::LossReason;

/// The takeover a refused session-mode acquire calls for: the stream is held
/// under another worker's session (whether that session ended is the store's
/// transaction to decide). `None` when it is not another session's.
pub(super) fn takeover_of(request: &AcquireRequest, current: &Lease) -> Option<TakeoverRequest> {
    let owner = current.owner_id.as_deref()?;
    let session_token = current.session_token?;
    (owner != request.owner_id).then(|| TakeoverRequest {
        acquire: request.clone(),
        from_owner: owner.to_owned(),
        from_session_token: session_token,
        from_fence_token: current.fence_token,
        // Read from the session record before the transaction.
        from_expires_at: None,
    })
}

/// A session-mode stream's task: no renewals (the session's renew loop keeps
/// it alive); it ends the stream when the session ends, and writes the staged
/// checkpoint every `checkpoint_interval`.
pub(super) async fn session_stream_loop(
    inner: Arc<Inner>,
    lease: HeldLease,
    stop: CancellationToken,
) {
    let Some(session) = lease.signal.session.clone() else {
        return;
    };
    let interval = inner.config.checkpoint_interval;
    let mut next_checkpoint = Instant::now() + interval;
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = session.ended.cancelled() => {
                let reason = (*session.loss.lock().unwrap_or_else(|p| p.into_inner()))
                    .unwrap_or(LossReason::RenewRejected);
                inner.lose(&lease, reason);
                break;
            }
            _ = sleep_until(next_checkpoint) => {}
        }
        next_checkpoint = Instant::now() + interval;
        let staged = *lease
            .signal
            .staged_checkpoint
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let Some(seq) = staged.filter(|seq| lease.persisted_checkpoint() < Some(*seq)) else {
            continue;
        };
        match write_checkpoint(&inner, &lease, seq).await {
            Err(err) if err.is_ownership_lost() => {
                inner.lose(&lease, LossReason::RenewRejected);
                break;
            }
            Err(err) => {
                tracing::warn!(stream_id = lease.stream_id, error = %err, "could not write the checkpoint; trying again next interval");
            }
            Ok(_) => {}
        }
    }
    inner.forget(&lease.stream_id, lease.fence_token);
}
