//! Chaos for `dev`: crash, pause and roll workers in one process.
//!
//! A worker's lease store and sink are wrapped in a [`Gate`]. A crash fails
//! every call and stops the worker without releasing anything (its leases
//! must expire and be taken over); a pause blocks every call for longer than
//! a lease, so the worker comes back as a zombie whose pending sink write is
//! fenced; a roll drains the worker gracefully (hand-offs) and starts a new one.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_control::LeaseError;
use leasehold_control::lease::Lease;
use leasehold_control::store::{
    AcquireRequest, CheckpointRequest, LeasePage, LeaseStore, ReleaseRequest, RenewRequest,
};
use leasehold_worker::sink::memory::MemorySink;
use leasehold_worker::sink::{FencedSink, SinkBatch, SinkError, WriteOutcome};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::pool::PoolRuntime;
use super::{Slot, StreamShared};

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
    fn block(&self) -> u64 {
        let pause = self
            .pauses
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        self.state.send_replace(GateState::Blocked(pause));
        pause
    }

    /// Opens the gate only if it is still held by this pause: a crash or a
    /// later pause of the same worker must not be undone by an old timer.
    fn end_pause(&self, pause: u64) {
        self.state.send_if_modified(|state| {
            if *state == GateState::Blocked(pause) {
                *state = GateState::Open;
                true
            } else {
                false
            }
        });
    }

    fn fail(&self) {
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

/// A lease store behind a gate.
pub(crate) struct GatedStore {
    inner: Arc<dyn LeaseStore>,
    gate: Gate,
}

impl GatedStore {
    pub(crate) fn new(inner: Arc<dyn LeaseStore>, gate: Gate) -> Self {
        GatedStore { inner, gate }
    }

    async fn pass(&self) -> Result<(), LeaseError> {
        if self.gate.pass().await {
            Ok(())
        } else {
            Err(LeaseError::Transient {
                message: "dev chaos: this worker crashed".into(),
            })
        }
    }
}

#[async_trait]
impl LeaseStore for GatedStore {
    async fn acquire(&self, request: &AcquireRequest) -> Result<Lease, LeaseError> {
        self.pass().await?;
        self.inner.acquire(request).await
    }
    async fn renew(&self, request: &RenewRequest) -> Result<Lease, LeaseError> {
        self.pass().await?;
        self.inner.renew(request).await
    }
    async fn checkpoint(&self, request: &CheckpointRequest) -> Result<Lease, LeaseError> {
        self.pass().await?;
        self.inner.checkpoint(request).await
    }
    async fn release(&self, request: &ReleaseRequest) -> Result<Lease, LeaseError> {
        self.pass().await?;
        self.inner.release(request).await
    }
    async fn force_release(&self, stream_id: &str, now_ms: i64) -> Result<Lease, LeaseError> {
        self.pass().await?;
        self.inner.force_release(stream_id, now_ms).await
    }
    async fn register(&self, stream_id: &str, now_ms: i64) -> Result<bool, LeaseError> {
        self.pass().await?;
        self.inner.register(stream_id, now_ms).await
    }
    async fn bump(&self, record_id: &str, now_ms: i64) -> Result<u64, LeaseError> {
        self.pass().await?;
        self.inner.bump(record_id, now_ms).await
    }
    async fn get(&self, stream_id: &str) -> Result<Lease, LeaseError> {
        self.pass().await?;
        self.inner.get(stream_id).await
    }
    async fn list(&self, start_after: Option<&str>, limit: usize) -> Result<LeasePage, LeaseError> {
        self.pass().await?;
        self.inner.list(start_after, limit).await
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
    async fn write(&self, batch: SinkBatch<'_>) -> Result<WriteOutcome, SinkError> {
        if !self.gate.pass().await {
            return Err(SinkError::Unavailable(
                "dev chaos: this worker crashed".into(),
            ));
        }
        self.inner.write(batch).await
    }
}

/// What the sink holds, checked.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Audit {
    pub(crate) streams: usize,
    pub(crate) events: usize,
    pub(crate) gaps: usize,
    pub(crate) duplicates: usize,
    pub(crate) token_regressions: usize,
}

/// Every stream's events must be consecutive sequences with non-decreasing tokens.
pub(crate) fn audit(sink: &MemorySink, streams: &[String]) -> Audit {
    let mut audit = Audit::default();
    for stream in streams {
        let events = sink.events(stream);
        if events.is_empty() {
            continue;
        }
        audit.streams += 1;
        audit.events += events.len();
        for pair in events.windows(2) {
            match pair[1].seq.cmp(&(pair[0].seq + 1)) {
                std::cmp::Ordering::Equal => {}
                std::cmp::Ordering::Greater => audit.gaps += 1,
                std::cmp::Ordering::Less => audit.duplicates += 1,
            }
            if pair[1].fence_token < pair[0].fence_token {
                audit.token_regressions += 1;
            }
        }
    }
    audit
}

/// One chaos action every `every`, on a random worker or the pool.
pub(crate) async fn run(
    slots: Arc<tokio::sync::Mutex<Vec<Slot>>>,
    shared: Arc<StreamShared>,
    pool: Arc<PoolRuntime>,
    every: Duration,
    lease: Duration,
    stop: CancellationToken,
) {
    let mut round: u64 = 0;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        round += 1;
        let action = rand::random_range(0..4u8);
        if action == 3 {
            pool.crash_random_worker().await;
            continue;
        }
        let mut slots = slots.lock().await;
        let index = rand::random_range(0..slots.len());
        let slot = &mut slots[index];
        let Some(running) = slot.running.take() else {
            continue;
        };
        match action {
            0 => {
                println!(
                    "chaos #{round}: crash {} (no release: its streams wait for expiry)",
                    running.owner_id
                );
                running.gate.fail();
                running.shutdown.cancel();
                let _ = tokio::time::timeout(Duration::from_secs(10), running.task).await;
                if let Err(err) = shared.start(slot) {
                    tracing::error!(error = %err, "cannot restart a worker");
                }
            }
            1 => {
                // Past the lease, the skew margin and a discovery round, so a
                // peer has taken the streams over (with a higher token) by the
                // time the held writes go through.
                let pause = lease + Duration::from_secs(4);
                println!(
                    "chaos #{round}: pause {} for {} s (a zombie: its held writes meet a newer token)",
                    running.owner_id,
                    pause.as_secs()
                );
                let number = running.gate.block();
                let gate = running.gate.clone();
                slot.running = Some(running);
                tokio::spawn(async move {
                    tokio::time::sleep(pause).await;
                    gate.end_pause(number);
                });
            }
            _ => {
                println!(
                    "chaos #{round}: roll {} (drain and hand off, then a new worker)",
                    running.owner_id
                );
                running.gate.open();
                running.shutdown.cancel();
                let _ = tokio::time::timeout(Duration::from_secs(10), running.task).await;
                if let Err(err) = shared.start(slot) {
                    tracing::error!(error = %err, "cannot restart a worker");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_worker::sink::{SinkEvent, SinkOptions};

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

    #[tokio::test]
    async fn the_audit_finds_gaps_duplicates_and_token_regressions() {
        let sink = MemorySink::new(SinkOptions {
            dedup_window: 10,
            max_len: 0,
        });
        let write = |token: u64, seqs: &[u64]| {
            let events: Vec<SinkEvent> = seqs
                .iter()
                .map(|seq| SinkEvent {
                    seq: *seq,
                    event_id: format!("s:{seq}"),
                    payload: "{}".into(),
                })
                .collect();
            (token, events)
        };
        for (token, events) in [write(1, &[1, 2]), write(2, &[3, 5])] {
            sink.write(SinkBatch {
                stream_id: "s",
                fence_token: token,
                events: &events,
            })
            .await
            .unwrap();
        }
        let audit = audit(&sink, &["s".to_owned(), "empty".to_owned()]);
        assert_eq!((audit.streams, audit.events, audit.gaps), (1, 4, 1));
        assert_eq!((audit.duplicates, audit.token_regressions), (0, 0));
    }
}
