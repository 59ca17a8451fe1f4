//! Fault gates: a worker's lease store and sink wrapped in a [`Gate`] that lets
//! calls through, holds them (a pause: the worker comes back as a zombie whose
//! held writes meet a newer token) or fails them (a crash: nothing is released,
//! the leases must expire and be taken over).

use std::sync::Arc;

use async_trait::async_trait;
use leasehold_control::LeaseError;
use leasehold_control::store::LeaseStore;
use leasehold_control::store::intercept::{Intercepted, Interceptor, StoreOp};
use leasehold_sink::{FencedSink, OpenOutcome, ResetMark, SinkBatch, SinkError, WriteOutcome};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GateState {
    Open,
    /// Held by the pause with this number.
    Blocked(u64),
    Failing,
}

/// Lets a worker's I/O through, holds it (pause) or fails it (crash).
#[derive(Clone)]
pub(crate) struct Gate {
    state: Arc<watch::Sender<GateState>>,
    pauses: Arc<std::sync::atomic::AtomicU64>,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            state: Arc::new(watch::Sender::new(GateState::Open)),
            pauses: Arc::default(),
        }
    }
}

impl Gate {
    pub(crate) fn open(&self) {
        self.state.send_replace(GateState::Open);
    }

    /// Holds every call; returns the pause's number for [`Gate::end_pause`].
    pub(crate) fn block(&self) -> u64 {
        let pause = self
            .pauses
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        self.state.send_replace(GateState::Blocked(pause));
        pause
    }

    /// Opens the gate only if it is still held by this pause: a crash or a
    /// later pause of the same worker must not be undone by an old timer.
    pub(crate) fn end_pause(&self, pause: u64) {
        self.state.send_if_modified(|state| {
            if *state == GateState::Blocked(pause) {
                *state = GateState::Open;
                true
            } else {
                false
            }
        });
    }

    pub(crate) fn fail(&self) {
        self.state.send_replace(GateState::Failing);
    }

    /// Waits while blocked; `false` when failing.
    async fn pass(&self) -> bool {
        let mut state = self.state.subscribe();
        loop {
            let current = *state.borrow_and_update();
            match current {
                GateState::Open => return true,
                GateState::Failing => return false,
                GateState::Blocked(_) => {
                    if state.changed().await.is_err() {
                        return false;
                    }
                }
            }
        }
    }
}

/// A lease store behind a gate: every call, read or write, passes the gate.
pub(crate) type GatedStore = Intercepted<dyn LeaseStore, Gate>;

#[async_trait]
impl Interceptor for Gate {
    async fn before(&self, _: StoreOp<'_>) -> Result<(), LeaseError> {
        if self.pass().await {
            Ok(())
        } else {
            Err(LeaseError::Transient {
                message: "dev chaos: this worker crashed".into(),
            })
        }
    }
}

/// A sink behind a gate.
pub(crate) struct GatedSink {
    inner: Arc<dyn FencedSink>,
    gate: Gate,
}

impl GatedSink {
    pub(crate) fn new(inner: Arc<dyn FencedSink>, gate: Gate) -> Self {
        GatedSink { inner, gate }
    }
}

#[async_trait]
impl FencedSink for GatedSink {
    async fn open(&self, stream_id: &str, fence_token: u64) -> Result<OpenOutcome, SinkError> {
        self.pass().await?;
        self.inner.open(stream_id, fence_token).await
    }

    async fn open_epoch(
        &self,
        stream_id: &str,
        fence_token: u64,
        reset: ResetMark,
    ) -> Result<OpenOutcome, SinkError> {
        self.pass().await?;
        self.inner.open_epoch(stream_id, fence_token, reset).await
    }

    async fn write(&self, batch: SinkBatch<'_>) -> Result<WriteOutcome, SinkError> {
        self.pass().await?;
        self.inner.write(batch).await
    }
}

impl GatedSink {
    /// Waits while the worker is paused; refuses once it crashed.
    async fn pass(&self) -> Result<(), SinkError> {
        if self.gate.pass().await {
            Ok(())
        } else {
            Err(SinkError::Unavailable(
                "dev chaos: this worker crashed".into(),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_blocked_gate_holds_calls_until_opened_and_a_failing_gate_refuses() {
        let gate = Gate::default();
        assert!(gate.pass().await);
        gate.block();
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.pass().await }
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!waiting.is_finished(), "a paused worker's call must hang");
        gate.open();
        assert!(waiting.await.unwrap());
        gate.fail();
        assert!(!gate.pass().await);
        // An old pause's timer must not reopen a crashed worker's gate.
        let first = gate.block();
        gate.fail();
        gate.end_pause(first);
        assert!(!gate.pass().await, "the crash stands");
        let second = gate.block();
        gate.end_pause(first);
        assert!(
            tokio::time::timeout(Duration::from_secs(1), gate.pass())
                .await
                .is_err(),
            "a later pause is not cut short by the first one's timer"
        );
        gate.end_pause(second);
        assert!(gate.pass().await);
    }
}
