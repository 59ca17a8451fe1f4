use super::*;
use crate::clock::PausedClock;
use crate::store::intercept::{Intercepted, Interceptor, StoreOp};
use crate::store::memory::MemoryLeaseStore;
use crate::store::{Consistency, LeaseReader, RenewRequest, list_all};
use async_trait::async_trait;
use leasehold_telemetry::RecordingSink;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

const HEALTHY: u8 = 0;
const FAILING: u8 = 1;
const HANGING: u8 = 2;

/// The in-memory store, with renews that can be made to fail or hang.
type FaultyStore = Intercepted<MemoryLeaseStore, Faults>;

#[derive(Default)]
struct Faults {
    mode: AtomicU8,
    renews: AtomicUsize,
    /// Acquires take this long (so two can race).
    acquire_delay: std::sync::Mutex<Duration>,
}

impl Faults {
    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }
}

#[async_trait]
impl Interceptor for Faults {
    async fn before(&self, op: StoreOp<'_>) -> Result<(), LeaseError> {
        match op {
            StoreOp::Acquire { .. } => {
                let delay = *self.acquire_delay.lock().unwrap();
                tokio::time::sleep(delay).await;
                Ok(())
            }
            StoreOp::Renew { .. } => {
                self.renews.fetch_add(1, Ordering::SeqCst);
                match self.mode.load(Ordering::SeqCst) {
                    FAILING => Err(LeaseError::Throttled {
                        message: "slow down".into(),
                    }),
                    HANGING => std::future::pending().await,
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }
}

fn faulty_store() -> Arc<FaultyStore> {
    Arc::new(Intercepted::new(
        Arc::new(MemoryLeaseStore::default()),
        Faults::default(),
    ))
}

struct Fixture {
    store: Arc<FaultyStore>,
    clock: PausedClock,
    events: RecordingSink,
    keeper: LeaseKeeper,
}

fn fixture() -> Fixture {
    let store = faulty_store();
    let clock = PausedClock::starting_at(1_700_000_000_000);
    let events = RecordingSink::new();
    let keeper = LeaseKeeper::new(
        store.clone(),
        Arc::new(clock),
        Arc::new(events.clone()),
        KeeperConfig {
            owner_id: "me".into(),
            ..KeeperConfig::default()
        },
    );
    Fixture {
        store,
        clock,
        events,
        keeper,
    }
}

fn count(events: &[TelemetryEvent], pred: impl Fn(&TelemetryEvent) -> bool) -> usize {
    events.iter().filter(|e| pred(e)).count()
}

#[tokio::test(start_paused = true)]
async fn renews_every_interval_and_moves_the_deadline() {
    let f = fixture();
    let lease = f.keeper.acquire("s").await.unwrap();
    let first_deadline = lease.deadline();
    assert_eq!(first_deadline, Instant::now() + Duration::from_secs(27));
    tokio::time::sleep(Duration::from_secs(95)).await;
    assert!(lease.is_valid());
    let events = f.events.take();
    let renewals: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            TelemetryEvent::LeaseRenewed { lateness, .. } => Some(*lateness),
            _ => None,
        })
        .collect();
    assert_eq!(renewals.len(), 9, "one renew per 10 s over 95 s");
    assert!(
        renewals.iter().all(|l| *l < Duration::from_millis(5)),
        "{renewals:?}"
    );
    assert_eq!(lease.deadline(), first_deadline + Duration::from_secs(90));
    let record = f.store.get("s").await.unwrap();
    assert_eq!(record.lease_expires_at, f.clock.now_ms() - 5_000 + 30_000);
}

#[tokio::test(start_paused = true)]
async fn a_hanging_store_ends_the_lease_at_the_deadline_before_expiry() {
    let f = fixture();
    let lease = f.keeper.acquire("s").await.unwrap();
    tokio::time::sleep(Duration::from_secs(11)).await; // one renew confirmed at t=10
    f.store.interceptor().set(HANGING);
    let deadline = lease.deadline();
    assert_eq!(deadline, Instant::now() + Duration::from_secs(26));
    let expires_at = f.store.get("s").await.unwrap().lease_expires_at;
    tokio::time::timeout(Duration::from_secs(60), lease.cancelled())
        .await
        .expect("lease must end");
    assert_eq!(
        Instant::now(),
        deadline,
        "fires exactly at the holder's deadline"
    );
    assert!(!lease.is_valid());
    assert_eq!(lease.loss_reason(), Some(LossReason::DeadlinePassed));
    assert!(
        f.clock.now_ms() < expires_at,
        "the holder stops before the lease can expire"
    );
    assert!(f.keeper.held().is_empty());
    let events = f.events.take();
    assert_eq!(
        count(&events, |e| matches!(
            e,
            TelemetryEvent::LeaseLost {
                reason: LossReason::DeadlinePassed,
                ..
            }
        )),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn is_valid_checks_the_clock_even_before_the_task_runs() {
    let f = fixture();
    let lease = f.keeper.acquire("s").await.unwrap();
    f.store.interceptor().set(HANGING);
    // Jump past the deadline without yielding to the renew task.
    let deadline = lease.deadline();
    tokio::time::advance(Duration::from_secs(27)).await;
    assert!(Instant::now() >= deadline);
    assert!(!lease.is_valid());
}

#[tokio::test(start_paused = true)]
async fn throttled_renews_retry_with_backoff_and_recover() {
    let f = fixture();
    let lease = f.keeper.acquire("s").await.unwrap();
    f.store.interceptor().set(FAILING);
    tokio::time::sleep(Duration::from_secs(13)).await;
    f.store.interceptor().set(HEALTHY);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(lease.is_valid());
    let events = f.events.take();
    let failures = count(&events, |e| {
        matches!(e, TelemetryEvent::LeaseRenewFailed { .. })
    });
    // Full jitter with a 2 s cap over ~3 s of failures: several attempts, not a hot loop.
    assert!((2..200).contains(&failures), "{failures} failed attempts");
    assert_eq!(
        count(&events, |e| matches!(
            e,
            TelemetryEvent::LeaseRenewed { .. }
        )),
        1
    );
    assert_eq!(
        count(&events, |e| matches!(e, TelemetryEvent::LeaseLost { .. })),
        0
    );
}

#[tokio::test(start_paused = true)]
async fn retries_never_run_past_the_deadline() {
    let f = fixture();
    let lease = f.keeper.acquire("s").await.unwrap();
    let deadline_after_acquire = lease.deadline();
    f.store.interceptor().set(FAILING);
    lease.cancelled().await;
    assert_eq!(Instant::now(), deadline_after_acquire);
    let attempts = f.store.interceptor().renews.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        f.store.interceptor().renews.load(Ordering::SeqCst),
        attempts,
        "no renew after the lease ended"
    );
}

#[tokio::test(start_paused = true)]
async fn a_takeover_is_noticed_on_the_next_renew() {
    let f = fixture();
    let lease = f.keeper.acquire("s").await.unwrap();
    // An operator release followed by another owner's acquire.
    f.store.force_release("s", f.clock.now_ms()).await.unwrap();
    let other = AcquireRequest {
        stream_id: "s".into(),
        owner_id: "other".into(),
        now_ms: f.clock.now_ms(),
        lease_ms: 30_000,
        skew_margin_ms: 1_000,
        sidecar_url: None,
        handoff_addr: None,
        max_streams: None,
        session_token: None,
    };
    assert_eq!(f.store.acquire(&other).await.unwrap().fence_token, 2);
    lease.cancelled().await;
    assert_eq!(lease.loss_reason(), Some(LossReason::RenewRejected));
    assert_eq!(
        Instant::now().duration_since(deadline_origin(&lease)),
        Duration::from_secs(10)
    );
}

fn deadline_origin(lease: &HeldLease) -> Instant {
    lease.deadline() - Duration::from_secs(27)
}

#[tokio::test(start_paused = true)]
async fn release_keeps_the_token_and_ends_the_handle() {
    let f = fixture();
    let lease = f.keeper.acquire("s").await.unwrap();
    let record = f.keeper.release(&lease).await.unwrap();
    assert_eq!((record.owner_id, record.fence_token), (None, 1));
    assert!(!lease.is_valid());
    assert_eq!(lease.loss_reason(), None);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        f.store.interceptor().renews.load(Ordering::SeqCst),
        0,
        "no renew after release"
    );
    let events = f.events.take();
    assert_eq!(
        count(&events, |e| matches!(
            e,
            TelemetryEvent::LeaseReleased { .. }
        )),
        1
    );
    assert_eq!(
        count(&events, |e| matches!(e, TelemetryEvent::LeaseLost { .. })),
        0
    );
}

#[tokio::test(start_paused = true)]
async fn release_carries_the_staged_checkpoint() {
    let f = fixture();
    let lease = f.keeper.acquire("s").await.unwrap();
    lease.stage_checkpoint(77);
    let record = f.keeper.release(&lease).await.unwrap();
    assert_eq!((record.owner_id, record.checkpoint), (None, Some(77)));
    assert_eq!(lease.persisted_checkpoint(), Some(77));
    let commits = count(&f.events.take(), |e| {
        matches!(
            e,
            TelemetryEvent::CheckpointCommit {
                checkpoint: 77,
                result: CommitResult::Committed,
                ..
            }
        )
    });
    assert_eq!(commits, 1);
}

#[tokio::test(start_paused = true)]
async fn a_release_behind_the_stored_checkpoint_still_releases() {
    let f = fixture();
    let lease = f.keeper.acquire("s").await.unwrap();
    f.store
        .checkpoint(&CheckpointRequest {
            stream_id: "s".into(),
            owner_id: "me".into(),
            fence_token: lease.fence_token,
            checkpoint: 90,
            now_ms: 1_700_000_000_001,
        })
        .await
        .unwrap();
    lease.stage_checkpoint(77);
    let record = f.keeper.release(&lease).await.unwrap();
    assert_eq!((record.owner_id, record.checkpoint), (None, Some(90)));
}

#[tokio::test(start_paused = true)]
async fn fenced_reports_stop_renewing() {
    let f = fixture();
    let lease = f.keeper.acquire("s").await.unwrap();
    f.keeper.report_fenced(&lease);
    assert!(!lease.is_valid());
    assert_eq!(lease.loss_reason(), Some(LossReason::Fenced));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(f.store.interceptor().renews.load(Ordering::SeqCst), 0);
    assert!(f.keeper.held().is_empty());
}

#[tokio::test(start_paused = true)]
async fn staged_checkpoints_ride_on_the_renew() {
    let f = fixture();
    let lease = f.keeper.acquire("s").await.unwrap();
    lease.stage_checkpoint(40);
    lease.stage_checkpoint(42);
    lease.stage_checkpoint(41);
    tokio::time::sleep(Duration::from_secs(11)).await;
    let record = f.store.get("s").await.unwrap();
    assert_eq!(record.checkpoint, Some(42));
    assert_eq!(lease.persisted_checkpoint(), Some(42));
    assert_eq!(
        f.store.interceptor().renews.load(Ordering::SeqCst),
        1,
        "no separate checkpoint write"
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_epoch_lifts_the_token_moves_the_checkpoint_back_and_keeps_renewing() {
    let f = fixture();
    let lease = f.keeper.acquire("s").await.unwrap();
    lease.stage_checkpoint(60_108);
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(f.store.get("s").await.unwrap().checkpoint, Some(60_108));
    let epoch = f.keeper.start_epoch(&lease, 0).await.unwrap();
    assert_eq!(epoch.fence_token, lease.fence_token + 1);
    assert!(!lease.is_valid() && epoch.is_valid());
    assert_eq!(epoch.persisted_checkpoint(), Some(0));
    epoch.stage_checkpoint(7);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(epoch.is_valid(), "renewed under the new token");
    let record = f.store.get("s").await.unwrap();
    assert_eq!(
        (
            record.fence_token,
            record.checkpoint,
            record.owner_id.as_deref()
        ),
        (epoch.fence_token, Some(7), Some("me"))
    );
    assert_eq!(f.keeper.held().len(), 1);
    assert_eq!(f.keeper.held()[0].fence_token, epoch.fence_token);
    let events = f.events.take();
    assert_eq!(
        count(&events, |e| matches!(e, TelemetryEvent::LeaseLost { .. })),
        0,
        "a new epoch is no loss: {events:?}"
    );
    // The old epoch's handle starts nothing more.
    assert!(f.keeper.start_epoch(&lease, 0).await.is_err());
    f.keeper.release(&epoch).await.unwrap();
    assert_eq!(f.store.get("s").await.unwrap().checkpoint, Some(7));
}

#[tokio::test(start_paused = true)]
async fn acquiring_a_held_stream_returns_the_same_lease() {
    let f = fixture();
    let first = f.keeper.acquire("s").await.unwrap();
    let second = f.keeper.acquire("s").await.unwrap();
    assert_eq!(first.fence_token, second.fence_token);
    assert_eq!(f.keeper.held().len(), 1);
    let records = list_all(f.store.as_ref(), 10, Consistency::Strong)
        .await
        .unwrap();
    assert_eq!(records.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_conflict_is_reported_with_the_holder() {
    let f = fixture();
    let other = AcquireRequest {
        stream_id: "s".into(),
        owner_id: "other".into(),
        now_ms: f.clock.now_ms(),
        lease_ms: 30_000,
        skew_margin_ms: 1_000,
        sidecar_url: None,
        handoff_addr: None,
        max_streams: None,
        session_token: None,
    };
    f.store.acquire(&other).await.unwrap();
    assert!(matches!(
        f.keeper.acquire("s").await,
        Err(LeaseError::Conflict { .. })
    ));
    let events = f.events.take();
    assert!(matches!(
        &events[..],
        [TelemetryEvent::LeaseAcquireConflict { holder: Some(h), holder_token: 1, .. }] if h == "other"
    ));
}

/// A wall clock that follows tokio's and can be stepped back, as NTP steps a
/// host's clock.
#[derive(Clone)]
struct SteppedClock {
    paused: PausedClock,
    offset_ms: Arc<std::sync::atomic::AtomicI64>,
}

impl Clock for SteppedClock {
    fn now_ms(&self) -> i64 {
        self.paused.now_ms() + self.offset_ms.load(Ordering::SeqCst)
    }
}

/// Review finding D8/N8: this host's clock steps 20 s back right after the
/// acquire. Its renews then ask for expiries below the stored one (refused as
/// shortening: `ExpiryAhead`), and later ones write expiries that read 20 s
/// early to every other host. The holder's deadline must never pass the
/// moment a taker with a correct clock could acquire: the stored expiry, read
/// on the clock the acquire used.
#[tokio::test(start_paused = true)]
async fn a_backward_clock_step_never_leaves_the_deadline_past_the_stored_expiry() {
    let store = faulty_store();
    let clock = SteppedClock {
        paused: PausedClock::starting_at(1_700_000_000_000),
        offset_ms: Arc::default(),
    };
    let keeper = LeaseKeeper::new(
        store.clone(),
        Arc::new(clock.clone()),
        Arc::new(RecordingSink::new()),
        KeeperConfig {
            owner_id: "me".into(),
            ..KeeperConfig::default()
        },
    );
    let acquired_at = Instant::now();
    let acquire_wall = clock.now_ms();
    let lease = keeper.acquire("s").await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    clock.offset_ms.store(-20_000, Ordering::SeqCst);
    for second in 1..=70 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if !lease.is_valid() {
            break;
        }
        let stored = store.get("s").await.unwrap().lease_expires_at;
        // The stored expiry on the acquire's (correct) clock.
        let expires = acquired_at + Duration::from_millis((stored - acquire_wall) as u64);
        assert!(
            lease.deadline() <= expires,
            "after {second} s the deadline is {:?} past the stored expiry",
            lease.deadline() - expires
        );
    }
}

/// A renew the store answers with an expiry later than the one asked for
/// (`ExpiryAhead`: it kept what a clock running ahead once wrote) is not a
/// confirmation: the deadline stays where the last confirmed renew put it.
#[tokio::test(start_paused = true)]
async fn a_renew_that_kept_a_later_expiry_does_not_move_the_deadline() {
    let f = fixture();
    let lease = f.keeper.acquire("s").await.unwrap();
    let first_deadline = lease.deadline();
    // An earlier write by a clock 20 s ahead left the record running until
    // +50 s; the keeper's renew at +10 s asks for +40 s.
    f.store
        .inner()
        .renew(&RenewRequest {
            stream_id: "s".into(),
            owner_id: "me".into(),
            fence_token: lease.fence_token,
            now_ms: f.clock.now_ms() + 20_000,
            lease_ms: 30_000,
            checkpoint: None,
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(
        f.store.interceptor().renews.load(Ordering::SeqCst),
        1,
        "one renew, at +10 s"
    );
    assert!(lease.is_valid());
    assert_eq!(
        lease.deadline(),
        first_deadline,
        "the renew that kept the later expiry did not move the deadline"
    );
}

/// Two acquires of one stream racing in one process both succeed (an owner
/// may re-acquire, with a new token): the older token's handle ends, so at
/// most one valid lease of the stream exists in the process.
#[tokio::test(start_paused = true)]
async fn racing_acquires_leave_one_valid_lease() {
    let f = fixture();
    f.store.register("s", 0).await.unwrap();
    *f.store.interceptor().acquire_delay.lock().unwrap() = Duration::from_millis(10);
    let (first, second) = tokio::join!(f.keeper.acquire("s"), f.keeper.acquire("s"));
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_ne!(
        first.fence_token, second.fence_token,
        "both acquires reached the store"
    );
    let valid: Vec<u64> = [&first, &second]
        .iter()
        .filter(|lease| lease.is_valid())
        .map(|lease| lease.fence_token)
        .collect();
    assert_eq!(
        valid.len(),
        1,
        "tokens {} and {}",
        first.fence_token,
        second.fence_token
    );
    let held = f.keeper.held();
    assert_eq!(held.len(), 1);
    assert_eq!(
        held[0].fence_token, valid[0],
        "the one kept is the valid one"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fence_is_lifted_past_only_for_the_records_holder() {
    let f = fixture();
    let lease = f.keeper.acquire("s").await.unwrap();
    assert_eq!(lease.fence_token, 1);
    assert_eq!(
        f.keeper.lift_past_fence(&lease, 1).await,
        None,
        "a fence not above the held token lifts nothing"
    );
    let lifted = f.keeper.lift_past_fence(&lease, 50).await.expect("lifted");
    assert_eq!(lifted.fence_token, 51);
    assert_eq!(f.store.get("s").await.unwrap().fence_token, 51);
    assert_eq!(
        count(&f.events.take(), |e| matches!(
            e,
            TelemetryEvent::FenceLifted {
                from: 1,
                to: 51,
                ..
            }
        )),
        1
    );
    // The record now names token 51: the old handle is a zombie's.
    assert_eq!(f.keeper.lift_past_fence(&lease, 60).await, None);
    assert_eq!(f.store.get("s").await.unwrap().fence_token, 51);
}

#[tokio::test(start_paused = true)]
async fn registers_and_doorbells_are_written_at_the_keepers_clock() {
    let f = fixture();
    assert!(f.keeper.register("s").await.unwrap());
    assert!(!f.keeper.register("s").await.unwrap(), "already there");
    let record = f.keeper.reader().get("s").await.unwrap();
    assert_eq!(record.updated_at, Some(f.clock.now_ms()));
    assert_eq!(record.owner_id, None);
    assert_eq!(f.keeper.bump("leasehold#handoff").await.unwrap(), 1);
    assert_eq!(f.keeper.bump("leasehold#handoff").await.unwrap(), 2);
    assert!(
        f.keeper.bump("s").await.is_err(),
        "a stream's token only moves on acquire"
    );
}
