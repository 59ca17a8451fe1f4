//! The lease keeper: holds leases, renews each on its schedule, and tells the data
//! path when a lease can no longer be trusted.
//!
//! Modelled on etcd-client's lease keeper: a cloneable handle plus per-lease
//! state. The essential rule (docs/lease-table.md) is the holder's own deadline:
//! `monotonic time the renew was *sent* + lease - safety margin`. The store's
//! `lease_expires_at` was computed from a wall-clock time taken no earlier than
//! that send, so the holder's deadline always falls before any taker may act
//! (a taker also waits the skew margin). Past its deadline without a confirmed
//! renew, the holder stops, whatever the network says later.
//!
//! Each held lease has one renew task. The data path gets a [`HeldLease`]:
//! [`HeldLease::is_valid`] checks the deadline against the clock directly (exact
//! even if the renew task is starved), and [`HeldLease::cancelled`] resolves when
//! the lease is lost or released, so side effects can be stopped in a `select!`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::lease::Lease;
use crate::protocol;
use crate::schema;
use crate::settings::LeaseMode;
use crate::store::{
    AcquireRequest, CheckpointRequest, LeaseError, LeaseReader, LeaseStore, LiftRequest,
    ReleaseRequest, TakeoverRequest,
};
use leasehold_platform::backoff::Backoff;
use leasehold_telemetry::{CommitResult, LossReason, TelemetryEvent, TelemetrySink};

mod renew;
mod session;

use renew::renew_loop;
use session::{session_stream_loop, takeover_of};

/// Identity and timings of a keeper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeeperConfig {
    /// Written to `owner_id`.
    pub owner_id: String,
    /// Lease duration.
    pub lease: Duration,
    /// Time between renews (anchored on when the previous renew was sent).
    pub renew_interval: Duration,
    /// The holder's deadline is this much before the lease could expire.
    pub safety_margin: Duration,
    /// Takers wait this long past expiry (absorbs clock skew between hosts).
    pub skew_margin: Duration,
    /// Retry schedule for throttled or failed renews; never beyond the deadline.
    pub retry: Backoff,
    /// `per-stream`: each stream's lease is renewed; `session`: one session
    /// record is, and every stream's deadline is the session's.
    pub mode: LeaseMode,
    /// Session mode: how often a held stream's staged checkpoint is written
    /// (per-stream mode carries it on every renew instead).
    pub checkpoint_interval: Duration,
}

impl Default for KeeperConfig {
    /// What an empty environment configures: the defaults are written once,
    /// in the `LEASE_*` settings.
    fn default() -> Self {
        let no_variables = |_: &str| None;
        crate::settings::lease_settings(&mut leasehold_platform::Env::new(&no_variables)).keeper
    }
}

fn ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// State shared between a lease's renew task and the data path's handles.
#[derive(Debug)]
struct LeaseSignal {
    deadline: Mutex<Instant>,
    /// Fires when the lease must no longer be used (lost or released).
    ended: CancellationToken,
    loss: Mutex<Option<LossReason>>,
    /// Highest sink-confirmed sequence not yet written to the store.
    staged_checkpoint: Mutex<Option<u64>>,
    /// The checkpoint as last confirmed by the store.
    persisted_checkpoint: Mutex<Option<u64>>,
    /// Session mode: the session this stream lives by. Its deadline is the
    /// stream's, and its end ends the stream.
    session: Option<Arc<LeaseSignal>>,
    /// The worker the release hands the stream to (a graceful hand-off).
    successor: Mutex<Option<String>>,
}

impl LeaseSignal {
    fn new(deadline: Instant, checkpoint: Option<u64>, session: Option<Arc<LeaseSignal>>) -> Self {
        LeaseSignal {
            deadline: Mutex::new(deadline),
            ended: CancellationToken::new(),
            loss: Mutex::new(None),
            staged_checkpoint: Mutex::new(None),
            persisted_checkpoint: Mutex::new(checkpoint),
            session,
            successor: Mutex::new(None),
        }
    }

    fn successor(&self) -> Option<String> {
        self.successor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn deadline(&self) -> Instant {
        match &self.session {
            Some(session) => session.deadline(),
            None => *self.deadline.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// Lost or released, or (session mode) its session is.
    fn is_ended(&self) -> bool {
        self.ended.is_cancelled() || self.session.as_ref().is_some_and(|s| s.is_ended())
    }

    fn persisted(&self, checkpoint: Option<u64>) {
        let mut persisted = self
            .persisted_checkpoint
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if checkpoint > *persisted {
            *persisted = checkpoint;
        }
    }

    fn extend(&self, deadline: Instant) {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner()) = deadline;
    }

    /// Marks the lease lost; returns false if it had already ended.
    fn lose(&self, reason: LossReason) -> bool {
        let mut loss = self.loss.lock().unwrap_or_else(|p| p.into_inner());
        if self.ended.is_cancelled() {
            return false;
        }
        *loss = Some(reason);
        self.ended.cancel();
        true
    }
}

/// A lease this process holds. Cheap to clone; every clone sees the same state.
#[derive(Debug, Clone)]
pub struct HeldLease {
    /// Stream held.
    pub stream_id: String,
    /// Token to attach to every side effect.
    pub fence_token: u64,
    /// The record as returned by the acquire (checkpoint to resume from, previous owner).
    pub acquired: Lease,
    signal: Arc<LeaseSignal>,
}

impl HeldLease {
    /// A lease no keeper renews or ends, valid until `deadline` by the clock
    /// alone: tests of the data path's own deadline check (the moment the
    /// deadline has passed but no loss has been signalled yet).
    #[cfg(feature = "testing")]
    pub fn detached(acquired: Lease, deadline: Instant) -> HeldLease {
        HeldLease {
            stream_id: acquired.stream_id.clone(),
            fence_token: acquired.fence_token,
            signal: Arc::new(LeaseSignal::new(deadline, acquired.checkpoint, None)),
            acquired,
        }
    }

    /// Whether side effects may still be produced under this lease: not lost, not
    /// released, and the holder's deadline not passed. Checks the clock itself.
    pub fn is_valid(&self) -> bool {
        !self.signal.is_ended() && protocol::holder_may_act(Instant::now(), self.signal.deadline())
    }

    /// The holder's current deadline (moves forward with each confirmed renew).
    pub fn deadline(&self) -> Instant {
        self.signal.deadline()
    }

    /// Resolves when the lease must no longer be used: lost or released.
    pub async fn cancelled(&self) {
        self.signal.ended.cancelled().await
    }

    /// Why the lease was lost; `None` while held or after a deliberate release.
    pub fn loss_reason(&self) -> Option<LossReason> {
        *self.signal.loss.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether this stream lives by a session (session mode). Its table
    /// checkpoint is then written only every `CHECKPOINT_INTERVAL_MS`, so the
    /// sink's confirmation is what makes progress durable (a takeover resumes
    /// from the sink's last sequence).
    pub fn lives_by_session(&self) -> bool {
        self.signal.session.is_some()
    }

    /// The checkpoint the store holds for this lease, as far as this process knows.
    pub fn persisted_checkpoint(&self) -> Option<u64> {
        *self
            .signal
            .persisted_checkpoint
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Names the worker this lease's release hands the stream to (a graceful
    /// hand-off whose successor subscribed ahead): the release records it as
    /// `handed_to`, and scanning peers leave the stream to that worker.
    pub fn hand_to(&self, successor: &str) {
        *self
            .signal
            .successor
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(successor.to_owned());
    }

    /// Records that the sink confirmed everything up to `seq`; the next renew
    /// writes it as the checkpoint (one write instead of two).
    pub fn stage_checkpoint(&self, seq: u64) {
        let mut staged = self
            .signal
            .staged_checkpoint
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if staged.is_none_or(|current| current < seq) {
            *staged = Some(seq);
        }
    }
}

struct Entry {
    lease: HeldLease,
    stop: CancellationToken,
    task: JoinHandle<()>,
    /// When the lease's first acquire was sent (kept across epochs).
    acquire_sent: Instant,
}

struct Inner {
    store: Arc<dyn LeaseStore>,
    clock: Arc<dyn Clock>,
    telemetry: Arc<dyn TelemetrySink>,
    config: KeeperConfig,
    held: Mutex<HashMap<String, Entry>>,
    /// Session mode: the session record held now (`leasehold#session#{owner}`).
    /// Serialised so that concurrent stream acquires start one session, not two.
    session: tokio::sync::Mutex<Option<HeldLease>>,
}

impl Inner {
    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets a lease if the entry is still the one with this token.
    fn forget(&self, stream_id: &str, fence_token: u64) -> Option<Entry> {
        let mut held = self.held();
        if held
            .get(stream_id)
            .is_some_and(|e| e.lease.fence_token == fence_token)
        {
            held.remove(stream_id)
        } else {
            None
        }
    }

    fn lose(&self, lease: &HeldLease, reason: LossReason) {
        if lease.signal.lose(reason) {
            self.telemetry.emit(TelemetryEvent::LeaseLost {
                stream_id: lease.stream_id.clone(),
                fence_token: lease.fence_token,
                reason,
            });
        }
    }
}

/// What a presence record announces about its worker (see
/// [`LeaseKeeper::acquire_announcing`]); `None` leaves a stored value as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Announcement {
    /// The worker's sidecar (`sidecar_url`).
    pub sidecar_url: Option<String>,
    /// Where the worker takes pushed hand-offs (`handoff_addr`).
    pub handoff_addr: Option<String>,
    /// The most streams it holds (`max_streams`).
    pub max_streams: Option<u64>,
}

/// Acquires, renews and releases leases for one owner. Cheap to clone.
#[derive(Clone)]
pub struct LeaseKeeper {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for LeaseKeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseKeeper")
            .field("config", &self.inner.config)
            .field("held", &self.inner.held().len())
            .finish()
    }
}

impl LeaseKeeper {
    /// A keeper holding nothing yet.
    pub fn new(
        store: Arc<dyn LeaseStore>,
        clock: Arc<dyn Clock>,
        telemetry: Arc<dyn TelemetrySink>,
        config: KeeperConfig,
    ) -> Self {
        LeaseKeeper {
            inner: Arc::new(Inner {
                store,
                clock,
                telemetry,
                config,
                held: Mutex::new(HashMap::new()),
                session: tokio::sync::Mutex::new(None),
            }),
        }
    }

    /// The keeper's configuration.
    pub fn config(&self) -> &KeeperConfig {
        &self.inner.config
    }

    /// A read-only view of the table this keeper writes (the census's scan,
    /// the doorbell, the observer's look): the keeper hands out no store, so
    /// it stays the only writer of the lease table in its process.
    pub fn reader(&self) -> Arc<dyn LeaseReader> {
        self.inner.store.clone()
    }

    /// Registers `stream_id` so discovery finds it; `false` when it already
    /// existed (the record is left untouched).
    pub async fn register(&self, stream_id: &str) -> Result<bool, LeaseError> {
        self.inner
            .store
            .register(stream_id, self.inner.clock.now_ms())
            .await
    }

    /// Increments the counter of the reserved record `record_id` (a doorbell:
    /// "something was released: look now") and returns its new value.
    pub async fn bump(&self, record_id: &str) -> Result<u64, LeaseError> {
        self.inner
            .store
            .bump(record_id, self.inner.clock.now_ms())
            .await
    }

    /// Writes the assigner's advice on `stream_id` (assigned discovery): the
    /// worker it should be with. Advice moves no ownership.
    pub async fn assign(&self, stream_id: &str, assignee: &str) -> Result<(), LeaseError> {
        self.inner.store.assign(stream_id, Some(assignee)).await
    }

    /// A sink refused `lease`'s token as stale, having accepted `sink_fence`.
    /// If the table still says this keeper holds the stream with that very
    /// token, no newer owner exists: the record was re-created (a restore, a
    /// TTL, an operator) and its token started again below the sink's fence,
    /// so every future owner would be fenced until takeovers climbed back past
    /// it one by one. The stored token is lifted past the fence in one
    /// conditional write instead ([`protocol::lifted_token`]), so the next
    /// acquire starts above it. A real zombie (someone else, or a newer token,
    /// in the record) lifts nothing. Returns the lifted record; a failed read
    /// or write is logged and lifts nothing (takeovers still climb).
    pub async fn lift_past_fence(&self, lease: &HeldLease, sink_fence: u64) -> Option<Lease> {
        let store = &self.inner.store;
        let owner = &self.inner.config.owner_id;
        let record = store.get(&lease.stream_id).await.ok()?;
        let to = protocol::lifted_token(
            record.owner_id.as_deref(),
            record.fence_token,
            owner,
            lease.fence_token,
            sink_fence,
        )?;
        let request = LiftRequest {
            stream_id: lease.stream_id.clone(),
            owner_id: owner.clone(),
            fence_token: lease.fence_token,
            to,
            checkpoint: None,
            now_ms: self.inner.clock.now_ms(),
        };
        match store.lift_token(&request).await {
            Ok(lifted) => {
                self.inner.telemetry.emit(TelemetryEvent::FenceLifted {
                    stream_id: lease.stream_id.clone(),
                    from: lease.fence_token,
                    to: lifted.fence_token,
                });
                Some(lifted)
            }
            Err(err) => {
                tracing::warn!(stream_id = lease.stream_id, error = %err, "could not lift the token past the sink's fence");
                None
            }
        }
    }

    /// Tries once to acquire `stream_id`. On success the lease is renewed in the
    /// background until released or lost. If this keeper already holds the stream,
    /// returns the lease it holds (no second acquire, no new token).
    pub async fn acquire(&self, stream_id: &str) -> Result<HeldLease, LeaseError> {
        self.acquire_announcing(stream_id, &Announcement::default())
            .await
    }

    /// [`LeaseKeeper::acquire`] that also stores where the worker answers on
    /// the record (a worker's presence record: how the dashboard finds its
    /// sidecar, and where peers push hand-offs).
    ///
    /// In session mode a stream is acquired under this keeper's session
    /// (started first if none is held), and from another worker's ended
    /// session by the store's takeover transaction. Reserved records (presence,
    /// the session itself, the observer) are per-stream leases in either mode.
    pub async fn acquire_announcing(
        &self,
        stream_id: &str,
        announcement: &Announcement,
    ) -> Result<HeldLease, LeaseError> {
        if let Some(entry) = self.inner.held().get(stream_id)
            && entry.lease.is_valid()
        {
            return Ok(entry.lease.clone());
        }
        let session = match self.inner.config.mode {
            LeaseMode::Session if !stream_id.starts_with(schema::RESERVED_PREFIX) => {
                Some(self.session().await?)
            }
            _ => None,
        };
        self.acquire_lease(stream_id, announcement, session).await
    }

    /// The session this keeper's stream leases live by, started (or started
    /// again, with a new token, after it was lost) when none is valid.
    async fn session(&self) -> Result<HeldLease, LeaseError> {
        let mut current = self.inner.session.lock().await;
        if let Some(session) = current.as_ref()
            && session.is_valid()
        {
            return Ok(session.clone());
        }
        let id = schema::session_record(&self.inner.config.owner_id);
        let session = self
            .acquire_lease(&id, &Announcement::default(), None)
            .await?;
        *current = Some(session.clone());
        Ok(session)
    }

    /// Ends the session (session mode): its record is released, so takers
    /// need not wait for it to expire. Streams still held under it end with
    /// it, so a drain releases them first. Nothing to do in per-stream mode.
    pub async fn end_session(&self) -> Result<(), LeaseError> {
        let session = self.inner.session.lock().await.take();
        match session {
            Some(session) => self.release(&session).await.map(|_| ()),
            None => Ok(()),
        }
    }

    /// Whether the holder's session record, read now (strongly consistent),
    /// says the session the stream names ended. A hint that spares a
    /// transaction bound to fail (two write units) for half a read unit: a
    /// stream another live worker took between this worker's scan and its
    /// acquire is the common case. The transaction still decides.
    async fn session_looks_ended(&self, takeover: &mut TakeoverRequest) -> bool {
        let id = schema::session_record(&takeover.from_owner);
        let session = match self.inner.store.get(&id).await {
            Ok(session) => Some(session),
            Err(LeaseError::NotFound { .. }) => None,
            // Unknown: let the transaction decide.
            Err(_) => return true,
        };
        // When the stream's holder stopped holding it: its session's expiry,
        // or its release, while the record is still that session (a gone or
        // restarted one ended at a time this read cannot tell).
        takeover.from_expires_at = session
            .as_ref()
            .filter(|s| {
                s.last_owner.as_deref() == Some(takeover.from_owner.as_str())
                    && s.fence_token == takeover.from_session_token
            })
            .and_then(|s| match s.owner_id {
                Some(_) => Some(s.lease_expires_at),
                None => s.released_at,
            });
        protocol::session_ended(
            session.as_ref().and_then(|s| s.owner_id.as_deref()),
            session.as_ref().map(|s| s.fence_token),
            session.as_ref().map(|s| s.lease_expires_at),
            takeover.from_session_token,
            takeover.acquire.now_ms,
            takeover.acquire.skew_margin_ms,
        )
    }

    /// One acquire: a plain conditional write, or in session mode (`session`
    /// given) the takeover transaction when the stream is another session's.
    async fn acquire_lease(
        &self,
        stream_id: &str,
        announcement: &Announcement,
        session: Option<HeldLease>,
    ) -> Result<HeldLease, LeaseError> {
        let config = &self.inner.config;
        let request = AcquireRequest {
            stream_id: stream_id.to_owned(),
            owner_id: config.owner_id.clone(),
            now_ms: self.inner.clock.now_ms(),
            lease_ms: ms(config.lease),
            skew_margin_ms: ms(config.skew_margin),
            sidecar_url: announcement.sidecar_url.clone(),
            handoff_addr: announcement.handoff_addr.clone(),
            max_streams: announcement.max_streams,
            session_token: session.as_ref().map(|s| s.fence_token),
        };
        let sent = Instant::now();
        let result = match self.inner.store.acquire(&request).await {
            Err(LeaseError::Conflict { current, .. }) if session.is_some() => {
                let mut takeover = takeover_of(&request, &current);
                let ended = match takeover.as_mut() {
                    Some(takeover) => self.session_looks_ended(takeover).await,
                    None => false,
                };
                match takeover {
                    Some(takeover) if ended => self.inner.store.take_over(&takeover).await,
                    _ => Err(LeaseError::Conflict {
                        stream_id: stream_id.to_owned(),
                        current,
                    }),
                }
            }
            other => other,
        };
        let duration = sent.elapsed();
        let record = match result {
            Ok(record) => record,
            Err(err) => {
                self.inner.telemetry.emit(match &err {
                    LeaseError::Conflict { current, .. } => TelemetryEvent::LeaseAcquireConflict {
                        stream_id: stream_id.to_owned(),
                        holder: current.owner_id.clone(),
                        holder_token: current.fence_token,
                        duration,
                    },
                    other => TelemetryEvent::LeaseAcquireFailed {
                        stream_id: stream_id.to_owned(),
                        error: other.to_string(),
                    },
                });
                return Err(err);
            }
        };
        let lease = HeldLease {
            stream_id: stream_id.to_owned(),
            fence_token: record.fence_token,
            signal: Arc::new(LeaseSignal::new(
                protocol::holder_deadline(sent, config.lease, config.safety_margin),
                record.checkpoint,
                session.map(|s| s.signal),
            )),
            acquired: record,
        };
        self.inner.telemetry.emit(TelemetryEvent::LeaseAcquired {
            stream_id: stream_id.to_owned(),
            fence_token: lease.fence_token,
            expires_at_ms: lease.acquired.lease_expires_at,
            duration,
            takeover_gap: lease
                .acquired
                .takeover_gap_ms()
                .map(|gap| Duration::from_millis(gap.unsigned_abs())),
            previous_owner: lease.acquired.previous_owner.clone(),
        });
        self.hold(lease.clone(), sent);
        Ok(lease)
    }

    /// Renews `lease` from now on (its session's loop in session mode) in
    /// place of any lease of the stream held before. `acquire_sent`: when its
    /// acquire was sent (the renew schedule and the wall clock's origin).
    fn hold(&self, lease: HeldLease, acquire_sent: Instant) {
        let stop = CancellationToken::new();
        let task = if lease.signal.session.is_some() {
            tokio::spawn(session_stream_loop(
                self.inner.clone(),
                lease.clone(),
                stop.clone(),
            ))
        } else {
            tokio::spawn(renew_loop(
                self.inner.clone(),
                lease.clone(),
                acquire_sent,
                stop.clone(),
            ))
        };
        let replaced = self.inner.held().insert(
            lease.stream_id.clone(),
            Entry {
                lease,
                stop,
                task,
                acquire_sent,
            },
        );
        if let Some(old) = replaced {
            // Reachable when the old lease had already ended, or when two
            // acquires of one stream raced in this process: both succeeded
            // (an owner may always re-acquire, with a new token), and the
            // older token's handle must not stay valid beside the newer one.
            self.inner.lose(&old.lease, LossReason::Fenced);
            old.stop.cancel();
        }
    }

    /// Starts a new epoch of a held stream (its upstream's sequence started
    /// over): the token is lifted by one and the checkpoint set to
    /// `checkpoint`, below the stored one, in one conditional write
    /// ([`LeaseStore::lift_token`]). Returns the lease of the new token, renewed
    /// from now on with the same deadline; `lease`'s handle ends (a writer
    /// of the old epoch is fenced by the sink once the new one opened it).
    /// Nothing counts as lost: the stream never changed hands.
    pub async fn start_epoch(
        &self,
        lease: &HeldLease,
        checkpoint: u64,
    ) -> Result<HeldLease, LeaseError> {
        if !lease.is_valid() {
            return Err(LeaseError::Conflict {
                stream_id: lease.stream_id.clone(),
                current: Box::new(lease.acquired.clone()),
            });
        }
        let request = LiftRequest {
            stream_id: lease.stream_id.clone(),
            owner_id: self.inner.config.owner_id.clone(),
            fence_token: lease.fence_token,
            to: lease.fence_token + 1,
            checkpoint: Some(checkpoint),
            now_ms: self.inner.clock.now_ms(),
        };
        let record = self.inner.store.lift_token(&request).await?;
        let acquire_sent = {
            let held = self.inner.held();
            match held.get(&lease.stream_id) {
                Some(entry) if entry.lease.fence_token == lease.fence_token => entry.acquire_sent,
                _ => Instant::now(),
            }
        };
        let epoch = HeldLease {
            stream_id: lease.stream_id.clone(),
            fence_token: record.fence_token,
            signal: Arc::new(LeaseSignal::new(
                lease.signal.deadline(),
                Some(checkpoint),
                lease.signal.session.clone(),
            )),
            // The acquire's expiry stays the renew loop's wall-clock origin.
            acquired: Lease {
                fence_token: record.fence_token,
                checkpoint: Some(checkpoint),
                ..lease.acquired.clone()
            },
        };
        // Ended quietly: a new epoch is no loss of the lease.
        lease.signal.lose(LossReason::Fenced);
        self.hold(epoch.clone(), acquire_sent);
        Ok(epoch)
    }

    /// Leases currently held (and not yet known to be lost).
    pub fn held(&self) -> Vec<HeldLease> {
        self.inner
            .held()
            .values()
            .map(|e| e.lease.clone())
            .collect()
    }

    /// Writes a sink-confirmed checkpoint now (conditional on owner and token). A
    /// refusal means ownership is gone: the lease is marked lost.
    pub async fn commit_checkpoint(
        &self,
        lease: &HeldLease,
        seq: u64,
    ) -> Result<Lease, LeaseError> {
        let result = self.write_checkpoint(lease, seq).await;
        if let Err(err) = &result
            && err.is_ownership_lost()
        {
            self.stop_tracking(lease, LossReason::RenewRejected);
        }
        result
    }

    async fn write_checkpoint(&self, lease: &HeldLease, seq: u64) -> Result<Lease, LeaseError> {
        write_checkpoint(&self.inner, lease, seq).await
    }

    /// The data path learned from a sink that a newer token exists: stop now.
    pub fn report_fenced(&self, lease: &HeldLease) {
        self.stop_tracking(lease, LossReason::Fenced);
    }

    fn stop_tracking(&self, lease: &HeldLease, reason: LossReason) {
        self.inner.lose(lease, reason);
        if let Some(entry) = self.inner.forget(&lease.stream_id, lease.fence_token) {
            entry.stop.cancel();
        }
    }

    /// Stops renewing and releases the lease in the store (token and checkpoint
    /// kept). The handle's `cancelled()` fires first, so nothing races the release.
    pub async fn release(&self, lease: &HeldLease) -> Result<Lease, LeaseError> {
        if let Some(entry) = self.inner.forget(&lease.stream_id, lease.fence_token) {
            entry.stop.cancel();
            // Wait for an in-flight renew to finish so it cannot land after the release.
            let _ = entry.task.await;
        }
        lease.signal.ended.cancel();
        // A drain must not lose progress: what the sink confirmed since the
        // last renew goes into the release itself (one write, so a hand-off
        // waits one round trip, not two).
        let staged = *lease
            .signal
            .staged_checkpoint
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut request = ReleaseRequest {
            stream_id: lease.stream_id.clone(),
            owner_id: self.inner.config.owner_id.clone(),
            fence_token: lease.fence_token,
            now_ms: self.inner.clock.now_ms(),
            checkpoint: staged,
            successor: lease.signal.successor(),
        };
        let record = match self.inner.store.release(&request).await {
            // The store is already further (it never is for a live holder):
            // release without moving it back, and report no commit.
            Err(LeaseError::CheckpointBehind { .. }) => {
                request.checkpoint = None;
                self.inner.store.release(&request).await
            }
            result => result,
        };
        if let Some(seq) = request.checkpoint {
            let result = match &record {
                Ok(record) => {
                    lease.signal.persisted(record.checkpoint);
                    CommitResult::Committed
                }
                Err(err) if err.is_ownership_lost() => CommitResult::Fenced,
                Err(_) => CommitResult::Error,
            };
            self.inner.telemetry.emit(TelemetryEvent::CheckpointCommit {
                stream_id: lease.stream_id.clone(),
                checkpoint: seq,
                result,
            });
        }
        let record = record?;
        self.inner.telemetry.emit(TelemetryEvent::LeaseReleased {
            stream_id: lease.stream_id.clone(),
            fence_token: lease.fence_token,
        });
        Ok(record)
    }
}
/// Writes a sink-confirmed checkpoint (conditional on owner and token) and
/// reports the commit.
async fn write_checkpoint(inner: &Inner, lease: &HeldLease, seq: u64) -> Result<Lease, LeaseError> {
    let request = CheckpointRequest {
        stream_id: lease.stream_id.clone(),
        owner_id: inner.config.owner_id.clone(),
        fence_token: lease.fence_token,
        checkpoint: seq,
        now_ms: inner.clock.now_ms(),
    };
    let result = inner.store.checkpoint(&request).await;
    let outcome = match &result {
        Ok(record) => {
            lease.signal.persisted(record.checkpoint);
            CommitResult::Committed
        }
        Err(err) if err.is_ownership_lost() => CommitResult::Fenced,
        Err(LeaseError::CheckpointBehind { .. }) => return result,
        Err(_) => CommitResult::Error,
    };
    inner.telemetry.emit(TelemetryEvent::CheckpointCommit {
        stream_id: lease.stream_id.clone(),
        checkpoint: seq,
        result: outcome,
    });
    result
}
#[cfg(test)]
mod tests;

#[cfg(test)]
mod session_tests;
