//! The lease store conformance suite: one set of checks, run against every backend.
//!
//! Each check is an async function taking a [`ConformanceTarget`]; the
//! [`conformance_suite!`](crate::conformance_suite) macro turns the whole list into
//! one `#[tokio::test]` per check for a given target. Times are chosen by the
//! checks (stores compare the caller's time), so no check sleeps.
#![allow(clippy::unwrap_used)] // a test suite: a panic is its report

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::{dynamodb_client, dynamodb_endpoint, unique_name};
use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;
use tokio::sync::Barrier;

use leasehold_control::lease::{Lease, LeaseState};
use leasehold_control::schema::{self, AttrValue, RawItem};
use leasehold_control::store::dynamodb::{DynamoLeaseStore, from_raw, to_raw};
use leasehold_control::store::memory::MemoryLeaseStore;
use leasehold_control::store::{
    AcquireRequest, CheckpointRequest, Consistency, LeaseError, LeaseStore, LiftRequest,
    ReleaseRequest, RenewRequest, TakeoverRequest, list_all,
};

/// A store under test, plus raw access to its records.
#[async_trait]
pub trait ConformanceTarget: Send + Sync {
    /// The store under test.
    fn store(&self) -> Arc<dyn LeaseStore>;
    /// Writes an item exactly as given, bypassing the store's conditions.
    async fn put_raw(&self, item: RawItem);
    /// Reads an item exactly as stored.
    async fn get_raw(&self, stream_id: &str) -> Option<RawItem>;
}

/// The in-memory store as a target.
#[derive(Default)]
pub struct MemoryTarget {
    store: Arc<MemoryLeaseStore>,
}

#[async_trait]
impl ConformanceTarget for MemoryTarget {
    fn store(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }

    async fn put_raw(&self, item: RawItem) {
        self.store.put_raw(item);
    }

    async fn get_raw(&self, stream_id: &str) -> Option<RawItem> {
        self.store.get_raw(stream_id)
    }
}

/// The suite's start time (unix ms).
pub const T0: i64 = 1_700_000_000_000;
/// The suite's lease length.
pub const LEASE: i64 = 30_000;
/// The suite's skew margin.
pub const SKEW: i64 = 1_000;

/// An acquire of `stream` by `owner` at `now_ms`, with the suite's lease.
pub fn acquire(stream: &str, owner: &str, now_ms: i64) -> AcquireRequest {
    AcquireRequest {
        stream_id: stream.into(),
        owner_id: owner.into(),
        now_ms,
        lease_ms: LEASE,
        skew_margin_ms: SKEW,
        sidecar_url: None,
        handoff_addr: None,
        max_streams: None,
        session_token: None,
    }
}

fn renew(stream: &str, owner: &str, token: u64, now_ms: i64) -> RenewRequest {
    RenewRequest {
        stream_id: stream.into(),
        owner_id: owner.into(),
        fence_token: token,
        now_ms,
        lease_ms: LEASE,
        checkpoint: None,
    }
}

fn checkpoint(stream: &str, owner: &str, token: u64, seq: u64, now_ms: i64) -> CheckpointRequest {
    CheckpointRequest {
        stream_id: stream.into(),
        owner_id: owner.into(),
        fence_token: token,
        checkpoint: seq,
        now_ms,
    }
}

fn release(stream: &str, owner: &str, token: u64, now_ms: i64) -> ReleaseRequest {
    ReleaseRequest {
        checkpoint: None,
        stream_id: stream.into(),
        owner_id: owner.into(),
        fence_token: token,
        now_ms,
        successor: None,
    }
}

#[track_caller]
fn assert_conflict<T: std::fmt::Debug>(
    result: Result<T, LeaseError>,
    holder: Option<&str>,
    token: u64,
) {
    match result {
        Err(LeaseError::Conflict { current, .. }) => {
            assert_eq!(
                current.owner_id.as_deref(),
                holder,
                "conflict should name the current holder"
            );
            assert_eq!(
                current.fence_token, token,
                "conflict should carry the current token"
            );
        }
        other => panic!("expected a conflict held by {holder:?}/{token}, got {other:?}"),
    }
}

/// Acquiring a stream nobody has seen creates it with token 1 and the original specification's expiry.
pub async fn acquire_creates_the_record(target: &dyn ConformanceTarget) {
    let store = target.store();
    let lease = store.acquire(&acquire("s", "a", T0)).await.unwrap();
    assert_eq!(lease.owner_id.as_deref(), Some("a"));
    assert_eq!(lease.fence_token, 1);
    assert_eq!(lease.lease_expires_at, T0 + LEASE);
    assert_eq!(lease.updated_at, Some(T0));
    assert_eq!(lease.previous_owner, None);
    assert_eq!(store.get("s").await.unwrap(), lease);
}

/// 16 contenders × 100 rounds racing for a fresh stream: exactly one winner each round.
pub async fn exactly_one_winner_per_round(target: &dyn ConformanceTarget) {
    const CONTENDERS: usize = 16;
    const ROUNDS: usize = 100;
    let store = target.store();
    let barrier = Arc::new(Barrier::new(CONTENDERS));
    let tasks: Vec<_> = (0..CONTENDERS)
        .map(|contender| {
            let store = store.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                let owner = format!("owner-{contender}");
                let mut outcomes = Vec::with_capacity(ROUNDS);
                for round in 0..ROUNDS {
                    barrier.wait().await;
                    let stream = format!("race-{round}");
                    outcomes.push(store.acquire(&acquire(&stream, &owner, T0)).await);
                }
                outcomes
            })
        })
        .collect();
    let mut per_round: Vec<Vec<Result<_, _>>> = (0..ROUNDS).map(|_| Vec::new()).collect();
    for task in tasks {
        for (round, outcome) in task.await.unwrap().into_iter().enumerate() {
            per_round[round].push(outcome);
        }
    }
    for (round, outcomes) in per_round.into_iter().enumerate() {
        let winners: Vec<_> = outcomes.iter().filter_map(|o| o.as_ref().ok()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {} winners", winners.len());
        let winner = winners[0];
        assert_eq!(winner.fence_token, 1, "round {round}");
        for outcome in &outcomes {
            match outcome {
                Ok(_) => {}
                Err(LeaseError::Conflict { current, .. }) => {
                    assert_eq!(current.owner_id, winner.owner_id, "round {round}")
                }
                Err(other) => panic!("round {round}: unexpected error {other}"),
            }
        }
    }
}

/// The token strictly increases across acquire → expiry → takeover and release → re-acquire.
pub async fn fence_token_strictly_increases(target: &dyn ConformanceTarget) {
    let store = target.store();
    let first = store.acquire(&acquire("s", "a", T0)).await.unwrap();
    let expired_at = first.lease_expires_at;
    assert_conflict(
        store.acquire(&acquire("s", "b", T0 + 1_000)).await,
        Some("a"),
        1,
    );
    let taken = store
        .acquire(&acquire("s", "b", expired_at + SKEW + 1))
        .await
        .unwrap();
    assert_eq!(taken.fence_token, 2);
    assert_eq!(taken.owner_id.as_deref(), Some("b"));
    assert_eq!(taken.previous_owner.as_deref(), Some("a"));
    assert_eq!(taken.takeover_gap_ms(), Some(SKEW + 1));
    let now = expired_at + SKEW + 10;
    let released = store.release(&release("s", "b", 2, now)).await.unwrap();
    assert_eq!(released.owner_id, None);
    assert_eq!(released.lease_expires_at, 0);
    assert_eq!(released.fence_token, 2);
    assert_eq!(released.state(now), LeaseState::Unowned);
    let again = store.acquire(&acquire("s", "a", now + 5)).await.unwrap();
    assert_eq!(again.fence_token, 3);
    assert_eq!(again.previous_owner.as_deref(), Some("b"));
    assert_eq!(again.takeover_gap_ms(), Some(5));
}

/// The holder itself may acquire again while valid (the original semantics): a new token.
pub async fn owner_reacquire_bumps_the_token(target: &dyn ConformanceTarget) {
    let store = target.store();
    store.acquire(&acquire("s", "a", T0)).await.unwrap();
    let again = store.acquire(&acquire("s", "a", T0 + 100)).await.unwrap();
    assert_eq!(again.fence_token, 2);
    assert_eq!(again.lease_expires_at, T0 + 100 + LEASE);
    assert_conflict(
        store.renew(&renew("s", "a", 1, T0 + 200)).await,
        Some("a"),
        2,
    );
}

/// Takeover happens only once `lease_expires_at + skew margin` has passed.
pub async fn takeover_waits_for_expiry_plus_skew(target: &dyn ConformanceTarget) {
    let store = target.store();
    let held = store.acquire(&acquire("s", "a", T0)).await.unwrap();
    let expiry = held.lease_expires_at;
    for now in [expiry - 1, expiry, expiry + 1, expiry + SKEW] {
        assert_conflict(store.acquire(&acquire("s", "b", now)).await, Some("a"), 1);
    }
    let taken = store
        .acquire(&acquire("s", "b", expiry + SKEW + 1))
        .await
        .unwrap();
    assert_eq!(taken.fence_token, 2);
}

/// Renew extends only the holder's valid lease; stale tokens and expired leases are refused.
pub async fn renew_requires_owner_token_and_validity(target: &dyn ConformanceTarget) {
    let store = target.store();
    let held = store.acquire(&acquire("s", "a", T0)).await.unwrap();
    let renewed = store.renew(&renew("s", "a", 1, T0 + 10_000)).await.unwrap();
    assert_eq!(renewed.lease_expires_at, T0 + 10_000 + LEASE);
    assert_eq!(renewed.fence_token, 1);
    assert_conflict(
        store.renew(&renew("s", "b", 1, T0 + 10_001)).await,
        Some("a"),
        1,
    );
    assert_conflict(
        store.renew(&renew("s", "a", 2, T0 + 10_001)).await,
        Some("a"),
        1,
    );
    let expired = renewed.lease_expires_at + 1;
    assert_conflict(
        store.renew(&renew("s", "a", 1, expired)).await,
        Some("a"),
        1,
    );
    // After a takeover the old holder's token is refused everywhere.
    store
        .acquire(&acquire("s", "b", expired + SKEW))
        .await
        .unwrap();
    let now = expired + SKEW + 1;
    assert_conflict(
        store.renew(&renew("s", "a", held.fence_token, now)).await,
        Some("b"),
        2,
    );
    assert_conflict(
        store.checkpoint(&checkpoint("s", "a", 1, 5, now)).await,
        Some("b"),
        2,
    );
    assert_conflict(
        store.release(&release("s", "a", 1, now)).await,
        Some("b"),
        2,
    );
}

/// A renew never shortens the stored expiry: a holder whose clock stepped back
/// keeps the lease as long as it already had it, and the checkpoint riding on
/// that renew is still stored.
pub async fn renew_never_shortens_the_expiry(target: &dyn ConformanceTarget) {
    let store = target.store();
    store.acquire(&acquire("s", "a", T0)).await.unwrap();
    let renewed = store.renew(&renew("s", "a", 1, T0 + 10_000)).await.unwrap();
    assert_eq!(renewed.lease_expires_at, T0 + 10_000 + LEASE);
    // The holder's clock stepped back 8 s.
    let mut stepped_back = renew("s", "a", 1, T0 + 2_000);
    stepped_back.checkpoint = Some(7);
    let kept = store.renew(&stepped_back).await.unwrap();
    assert_eq!(kept.lease_expires_at, T0 + 10_000 + LEASE, "not shortened");
    assert_eq!(kept.checkpoint, Some(7), "the checkpoint still rides on it");
    assert_eq!(kept.owner_id.as_deref(), Some("a"));
    let stored = store.get("s").await.unwrap();
    assert_eq!(stored.lease_expires_at, T0 + 10_000 + LEASE);
    assert_eq!(stored.checkpoint, Some(7));
    // A later renew moves it forward again.
    let later = store.renew(&renew("s", "a", 1, T0 + 20_000)).await.unwrap();
    assert_eq!(later.lease_expires_at, T0 + 20_000 + LEASE);
}

/// Fence-regression recovery: the holder lifts its stored token past a sink's
/// fence in one write; nobody else can, and it never moves down.
pub async fn lift_token_jumps_past_a_fence_for_the_holder_only(target: &dyn ConformanceTarget) {
    let store = target.store();
    store.acquire(&acquire("s", "a", T0)).await.unwrap();
    let lift = |owner: &str, token: u64, to: u64| LiftRequest {
        stream_id: "s".into(),
        owner_id: owner.into(),
        fence_token: token,
        to,
        checkpoint: None,
        now_ms: T0 + 1,
    };
    assert_conflict(store.lift_token(&lift("b", 1, 40)).await, Some("a"), 1);
    let lifted = store.lift_token(&lift("a", 1, 40)).await.unwrap();
    assert_eq!(
        (lifted.fence_token, lifted.owner_id.as_deref()),
        (40, Some("a"))
    );
    // The old token is void: its renew is refused.
    assert_conflict(
        store.renew(&renew("s", "a", 1, T0 + 2)).await,
        Some("a"),
        40,
    );
    // Never down, never sideways.
    assert_conflict(store.lift_token(&lift("a", 40, 40)).await, Some("a"), 40);
    assert_conflict(store.lift_token(&lift("a", 40, 12)).await, Some("a"), 40);
    // The holder's next acquire continues above it.
    let again = store.acquire(&acquire("s", "a", T0 + 3)).await.unwrap();
    assert_eq!(again.fence_token, 41);
}

/// A new epoch (the upstream's sequence started over): the holder lifts its
/// token by one and sets a checkpoint below the stored one in one write; the
/// old token's checkpoints and renews are refused from then on, and the new
/// token's checkpoints climb from the new epoch's.
pub async fn a_new_epoch_lifts_the_token_and_moves_the_checkpoint_back(
    target: &dyn ConformanceTarget,
) {
    let store = target.store();
    store.acquire(&acquire("s", "a", T0)).await.unwrap();
    store
        .checkpoint(&checkpoint("s", "a", 1, 60_108, T0 + 1))
        .await
        .unwrap();
    let epoch = |owner: &str, token: u64| LiftRequest {
        stream_id: "s".into(),
        owner_id: owner.into(),
        fence_token: token,
        to: token + 1,
        checkpoint: Some(0),
        now_ms: T0 + 2,
    };
    assert_conflict(store.lift_token(&epoch("b", 1)).await, Some("a"), 1);
    let lifted = store.lift_token(&epoch("a", 1)).await.unwrap();
    assert_eq!(
        (lifted.fence_token, lifted.checkpoint, lifted.checkpoint_at),
        (2, Some(0), Some(T0 + 2))
    );
    assert_conflict(
        store
            .checkpoint(&checkpoint("s", "a", 1, 60_109, T0 + 3))
            .await,
        Some("a"),
        2,
    );
    let moved = store
        .checkpoint(&checkpoint("s", "a", 2, 5, T0 + 3))
        .await
        .unwrap();
    assert_eq!(moved.checkpoint, Some(5));
    // A second lift from the old token changes nothing.
    assert_conflict(store.lift_token(&epoch("a", 1)).await, Some("a"), 2);
    assert_eq!(store.get("s").await.unwrap().checkpoint, Some(5));
}

/// Checkpoints need owner and token, and never move backwards.
pub async fn checkpoint_is_fenced_and_monotonic(target: &dyn ConformanceTarget) {
    let store = target.store();
    store.acquire(&acquire("s", "a", T0)).await.unwrap();
    let stored = store
        .checkpoint(&checkpoint("s", "a", 1, 10, T0 + 1))
        .await
        .unwrap();
    assert_eq!(stored.checkpoint, Some(10));
    assert_eq!(stored.checkpoint_at, Some(T0 + 1));
    match store.checkpoint(&checkpoint("s", "a", 1, 9, T0 + 2)).await {
        Err(LeaseError::CheckpointBehind {
            requested: 9,
            stored: 10,
            ..
        }) => {}
        other => panic!("expected CheckpointBehind, got {other:?}"),
    }
    store
        .checkpoint(&checkpoint("s", "a", 1, 10, T0 + 3))
        .await
        .unwrap();
    assert_conflict(
        store.checkpoint(&checkpoint("s", "a", 2, 11, T0 + 4)).await,
        Some("a"),
        1,
    );
    assert_eq!(store.get("s").await.unwrap().checkpoint, Some(10));
}

/// A renew can carry the checkpoint on the same write, under the same rules.
pub async fn renew_carries_a_checkpoint(target: &dyn ConformanceTarget) {
    let store = target.store();
    store.acquire(&acquire("s", "a", T0)).await.unwrap();
    let mut request = renew("s", "a", 1, T0 + 5);
    request.checkpoint = Some(42);
    let renewed = store.renew(&request).await.unwrap();
    assert_eq!(renewed.checkpoint, Some(42));
    assert_eq!(renewed.lease_expires_at, T0 + 5 + LEASE);
    request.checkpoint = Some(41);
    request.now_ms = T0 + 6;
    match store.renew(&request).await {
        Err(LeaseError::CheckpointBehind {
            requested: 41,
            stored: 42,
            ..
        }) => {}
        other => panic!("expected CheckpointBehind, got {other:?}"),
    }
    assert_eq!(
        store.get("s").await.unwrap().lease_expires_at,
        T0 + 5 + LEASE
    );
}

/// Release needs owner and token, and keeps token and checkpoint for the next holder.
pub async fn release_keeps_token_and_checkpoint(target: &dyn ConformanceTarget) {
    let store = target.store();
    store.acquire(&acquire("s", "a", T0)).await.unwrap();
    store
        .checkpoint(&checkpoint("s", "a", 1, 7, T0 + 1))
        .await
        .unwrap();
    assert_conflict(
        store.release(&release("s", "b", 1, T0 + 2)).await,
        Some("a"),
        1,
    );
    assert_conflict(
        store.release(&release("s", "a", 9, T0 + 2)).await,
        Some("a"),
        1,
    );
    let released = store.release(&release("s", "a", 1, T0 + 2)).await.unwrap();
    assert_eq!(
        (
            released.owner_id.as_deref(),
            released.fence_token,
            released.checkpoint
        ),
        (None, 1, Some(7))
    );
    assert_eq!(released.released_at, Some(T0 + 2));
    assert_conflict(store.renew(&renew("s", "a", 1, T0 + 3)).await, None, 1);
    // A released lease is free at once: no skew wait.
    let next = store.acquire(&acquire("s", "b", T0 + 3)).await.unwrap();
    assert_eq!((next.fence_token, next.checkpoint), (2, Some(7)));
}

/// A release can record the holder's last checkpoint in the same write, under
/// the checkpoint's rules: behind the stored one, nothing is written.
pub async fn release_carries_a_checkpoint(target: &dyn ConformanceTarget) {
    let store = target.store();
    store.acquire(&acquire("s", "a", T0)).await.unwrap();
    store
        .checkpoint(&checkpoint("s", "a", 1, 20, T0 + 1))
        .await
        .unwrap();
    let mut request = release("s", "a", 1, T0 + 2);
    request.checkpoint = Some(19);
    match store.release(&request).await {
        Err(LeaseError::CheckpointBehind {
            requested: 19,
            stored: 20,
            ..
        }) => {}
        other => panic!("expected CheckpointBehind, got {other:?}"),
    }
    assert_eq!(store.get("s").await.unwrap().owner_id.as_deref(), Some("a"));
    let mut stale = release("s", "a", 9, T0 + 2);
    stale.checkpoint = Some(30);
    assert_conflict(store.release(&stale).await, Some("a"), 1);
    request.checkpoint = Some(25);
    let released = store.release(&request).await.unwrap();
    assert_eq!(
        (
            released.owner_id.as_deref(),
            released.checkpoint,
            released.checkpoint_at,
            released.released_at
        ),
        (None, Some(25), Some(T0 + 2), Some(T0 + 2))
    );
    let next = store.acquire(&acquire("s", "b", T0 + 3)).await.unwrap();
    assert_eq!((next.fence_token, next.checkpoint), (2, Some(25)));
}

/// A graceful hand-off's release names its successor (`handed_to`), with
/// the checkpoint in the same write; the successor's acquire keeps it (the
/// record is owned, so it advises nobody), and the next release without a
/// successor clears it, as does a forced one. The acquire condition
/// ignores it: it is advice to scanning peers, not a lock.
pub async fn a_release_names_its_successor_until_the_next_release(target: &dyn ConformanceTarget) {
    let store = target.store();
    store.acquire(&acquire("s", "a", T0)).await.unwrap();
    let mut handed = release("s", "a", 1, T0 + 1);
    handed.checkpoint = Some(7);
    handed.successor = Some("b".into());
    let released = store.release(&handed).await.unwrap();
    assert_eq!(
        (released.handed_to.as_deref(), released.checkpoint),
        (Some("b"), Some(7))
    );
    assert_eq!(
        store.get("s").await.unwrap().handed_to.as_deref(),
        Some("b")
    );
    assert_eq!(released.left_to("c", T0 + 2, 1_000), Some("b"));
    assert_eq!(
        released.left_to("b", T0 + 2, 1_000),
        None,
        "not from itself"
    );
    assert_eq!(
        released.left_to("c", T0 + 1_001, 1_000),
        None,
        "only for a while"
    );
    // Anyone may still acquire: the condition is the specification's.
    let taken = store.acquire(&acquire("s", "c", T0 + 2)).await.unwrap();
    assert_eq!(
        taken.left_to("d", T0 + 3, 1_000),
        None,
        "owned: advice to nobody"
    );
    let plain = store.release(&release("s", "c", 2, T0 + 3)).await.unwrap();
    assert_eq!(plain.handed_to, None);
    store.acquire(&acquire("s", "a", T0 + 4)).await.unwrap();
    let mut again = release("s", "a", 3, T0 + 5);
    again.successor = Some("b".into());
    store.release(&again).await.unwrap();
    store.acquire(&acquire("s", "a", T0 + 6)).await.unwrap();
    let forced = store.force_release("s", T0 + 7).await.unwrap();
    assert_eq!(forced.handed_to, None, "a forced release names nobody");
}

/// A presence acquire stores `sidecar_url`, `handoff_addr` and
/// `max_streams`; renew and release keep them, an acquire without them leaves
/// them, the next announcing acquire replaces them.
pub async fn acquire_stores_the_sidecar_url(target: &dyn ConformanceTarget) {
    let store = target.store();
    let id = leasehold_control::schema::worker_presence("a");
    let announcing = |url: &str, now_ms: i64| AcquireRequest {
        sidecar_url: Some(url.into()),
        handoff_addr: Some(url.trim_start_matches("http://").replace(":9464", ":9470")),
        max_streams: Some(now_ms.rem_euclid(100) as u64),
        ..acquire(&id, "a", now_ms)
    };
    let lease = store
        .acquire(&announcing("http://10.0.0.7:9464", T0))
        .await
        .unwrap();
    assert_eq!(lease.sidecar_url.as_deref(), Some("http://10.0.0.7:9464"));
    assert_eq!(lease.handoff_addr.as_deref(), Some("10.0.0.7:9470"));
    assert_eq!(lease.max_streams, Some(T0.rem_euclid(100) as u64));
    store.renew(&renew(&id, "a", 1, T0 + 1)).await.unwrap();
    store.release(&release(&id, "a", 1, T0 + 2)).await.unwrap();
    let plain = store.acquire(&acquire(&id, "a", T0 + 3)).await.unwrap();
    assert_eq!(plain.sidecar_url.as_deref(), Some("http://10.0.0.7:9464"));
    assert_eq!(plain.handoff_addr.as_deref(), Some("10.0.0.7:9470"));
    assert_eq!(plain.max_streams, Some(T0.rem_euclid(100) as u64));
    let moved = store
        .acquire(&announcing("http://10.0.0.8:9464", T0 + 4))
        .await
        .unwrap();
    assert_eq!(moved.sidecar_url.as_deref(), Some("http://10.0.0.8:9464"));
    assert_eq!(
        store.get(&id).await.unwrap().sidecar_url.as_deref(),
        Some("http://10.0.0.8:9464")
    );
    assert_eq!(
        store.get(&id).await.unwrap().handoff_addr.as_deref(),
        Some("10.0.0.8:9470")
    );
    assert_eq!(moved.max_streams, Some((T0 + 4).rem_euclid(100) as u64));
    let stream = store.acquire(&acquire("s", "a", T0)).await.unwrap();
    assert_eq!(
        stream.sidecar_url, None,
        "stream records carry no sidecar_url"
    );
}

/// An operator's forced release frees a held lease; the holder's renew then fails.
pub async fn force_release_frees_a_held_lease(target: &dyn ConformanceTarget) {
    let store = target.store();
    store.acquire(&acquire("s", "a", T0)).await.unwrap();
    let released = store.force_release("s", T0 + 1).await.unwrap();
    assert_eq!((released.owner_id, released.fence_token), (None, 1));
    assert_conflict(store.renew(&renew("s", "a", 1, T0 + 2)).await, None, 1);
    assert_eq!(
        store
            .acquire(&acquire("s", "b", T0 + 2))
            .await
            .unwrap()
            .fence_token,
        2
    );
    assert!(matches!(
        store.force_release("missing", T0).await,
        Err(LeaseError::NotFound { .. })
    ));
    assert!(
        store.get("missing").await.is_err(),
        "force_release must not create records"
    );
}

/// Register creates an unowned record once and never touches an existing one.
pub async fn register_is_idempotent(target: &dyn ConformanceTarget) {
    let store = target.store();
    assert!(store.register("s", T0).await.unwrap());
    let registered = store.get("s").await.unwrap();
    assert_eq!(registered.state(T0), LeaseState::Unowned);
    assert_eq!(
        (registered.fence_token, registered.checkpoint),
        (0, Some(0))
    );
    store.acquire(&acquire("s", "a", T0 + 1)).await.unwrap();
    assert!(!store.register("s", T0 + 2).await.unwrap());
    let after = store.get("s").await.unwrap();
    assert_eq!(
        (after.owner_id.as_deref(), after.fence_token),
        (Some("a"), 1)
    );
}

/// Operations on a stream that does not exist say so (and do not create it).
pub async fn missing_streams_are_not_found(target: &dyn ConformanceTarget) {
    let store = target.store();
    let not_found = |r: Result<_, LeaseError>| matches!(r, Err(LeaseError::NotFound { .. }));
    assert!(not_found(store.get("nope").await));
    assert!(not_found(store.renew(&renew("nope", "a", 1, T0)).await));
    assert!(not_found(
        store.checkpoint(&checkpoint("nope", "a", 1, 1, T0)).await
    ));
    assert!(not_found(store.release(&release("nope", "a", 1, T0)).await));
    assert!(not_found(store.get("nope").await));
}

fn seed_demo_item(stream: &str, owner: &str, expires_at: i64, token: u64) -> RawItem {
    // Exactly what lease_demo.py's acquire writes: no checkpoint, no extras.
    RawItem::from([
        (schema::STREAM_ID.into(), AttrValue::s(stream)),
        (schema::OWNER_ID.into(), AttrValue::s(owner)),
        (schema::LEASE_EXPIRES_AT.into(), AttrValue::n(expires_at)),
        (schema::FENCE_TOKEN.into(), AttrValue::n(token)),
        (schema::UPDATED_AT.into(), AttrValue::n(expires_at - LEASE)),
    ])
}

/// Records written by the original lease specification's Python demo are read correctly and can be taken
/// over; what leasehold writes keeps the original attribute names and types.
pub async fn seed_records_interoperate(target: &dyn ConformanceTarget) {
    let store = target.store();
    target
        .put_raw(seed_demo_item("orders-us-east", "worker-a", T0 + LEASE, 4))
        .await;
    let read = store.get("orders-us-east").await.unwrap();
    assert_eq!(read.owner_id.as_deref(), Some("worker-a"));
    assert_eq!(
        (read.fence_token, read.lease_expires_at, read.checkpoint),
        (4, T0 + LEASE, None)
    );
    assert_conflict(
        store
            .acquire(&acquire("orders-us-east", "lh", T0 + 1))
            .await,
        Some("worker-a"),
        4,
    );
    let taken = store
        .acquire(&acquire("orders-us-east", "lh", T0 + LEASE + SKEW + 1))
        .await
        .unwrap();
    assert_eq!(taken.fence_token, 5);
    store
        .checkpoint(&checkpoint(
            "orders-us-east",
            "lh",
            5,
            3,
            T0 + LEASE + SKEW + 2,
        ))
        .await
        .unwrap();
    let raw = target.get_raw("orders-us-east").await.unwrap();
    for (name, is_number) in [
        (schema::STREAM_ID, false),
        (schema::OWNER_ID, false),
        (schema::LEASE_EXPIRES_AT, true),
        (schema::FENCE_TOKEN, true),
        (schema::CHECKPOINT, true),
        (schema::UPDATED_AT, true),
    ] {
        match (raw.get(name), is_number) {
            (Some(AttrValue::N(_)), true) | (Some(AttrValue::S(_)), false) => {}
            other => panic!("attribute {name} stored as {other:?}"),
        }
    }
    // The original specification's own renew (owner, token, expiry) still works on leasehold's record.
    store
        .renew(&renew("orders-us-east", "lh", 5, T0 + LEASE + SKEW + 3))
        .await
        .unwrap();
}

/// A malformed record is reported naming the attribute; listing still returns the rest.
pub async fn malformed_records_are_isolated(target: &dyn ConformanceTarget) {
    let store = target.store();
    for stream in ["m-1", "m-2", "m-4", "m-5"] {
        store.register(stream, T0).await.unwrap();
    }
    let mut bad = seed_demo_item("m-3", "w", T0, 1);
    bad.insert(schema::FENCE_TOKEN.into(), AttrValue::s("1"));
    target.put_raw(bad).await;
    match store.get("m-3").await {
        Err(LeaseError::Malformed(err)) => {
            assert_eq!(err.stream_id, "m-3");
            assert_eq!(err.attribute, schema::FENCE_TOKEN);
        }
        other => panic!("expected a malformed error, got {other:?}"),
    }
    let listed = list_all(store.as_ref(), 2, Consistency::Strong)
        .await
        .unwrap();
    let good: BTreeSet<_> = listed
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .map(|l| l.stream_id.clone())
        .collect();
    let bad: Vec<_> = listed.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(
        good,
        BTreeSet::from(["m-1", "m-2", "m-4", "m-5"].map(String::from))
    );
    assert_eq!(bad.len(), 1);
    assert_eq!(
        (bad[0].stream_id.as_str(), bad[0].attribute.as_str()),
        ("m-3", schema::FENCE_TOKEN)
    );
}

/// Paginated listing returns every record exactly once.
pub async fn listing_pages_cover_everything_once(target: &dyn ConformanceTarget) {
    let store = target.store();
    let expected: BTreeSet<String> = (0..25).map(|i| format!("p-{i:02}")).collect();
    for stream in &expected {
        store.register(stream, T0).await.unwrap();
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let page = store.list(cursor.as_deref(), 7).await.unwrap();
        assert!(
            page.leases.len() <= 7,
            "a page holds at most `limit` records"
        );
        pages += 1;
        seen.extend(page.leases.into_iter().map(|r| r.unwrap().stream_id));
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
        assert!(pages < 50, "listing does not terminate");
    }
    assert_eq!(seen.len(), expected.len(), "no record twice");
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), expected);
    assert!(
        pages >= 4,
        "25 records in pages of 7 need at least 4 pages, got {pages}"
    );
}

/// Eventually consistent reads (the dashboard's and the observer's) decode,
/// page and report a missing record like strong ones; once writes have settled
/// they return the same records.
pub async fn eventual_reads_match_strong_reads_once_settled(target: &dyn ConformanceTarget) {
    let store = target.store();
    for i in 0..5 {
        store.register(&format!("e-{i}"), T0).await.unwrap();
    }
    let held = store.acquire(&acquire("e-2", "a", T0)).await.unwrap();
    let strong = list_all(store.as_ref(), 2, Consistency::Strong)
        .await
        .unwrap();
    let eventual = list_all(store.as_ref(), 2, Consistency::Eventual)
        .await
        .unwrap();
    let leases = |records: Vec<Result<Lease, schema::MalformedItem>>| {
        let mut leases: Vec<Lease> = records.into_iter().map(Result::unwrap).collect();
        leases.sort_by(|a, b| a.stream_id.cmp(&b.stream_id));
        leases
    };
    assert_eq!(leases(eventual), leases(strong));
    assert_eq!(
        store.get_with("e-2", Consistency::Eventual).await.unwrap(),
        held
    );
    assert!(matches!(
        store.get_with("nope", Consistency::Eventual).await,
        Err(LeaseError::NotFound { .. })
    ));
}

/// The doorbell counter counts every concurrent bump once, and only on reserved records.
pub async fn bump_counts_every_ring(target: &dyn ConformanceTarget) {
    let store = target.store();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                for _ in 0..5 {
                    store.bump("leasehold#doorbell", T0).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(store.bump("leasehold#doorbell", T0 + 1).await.unwrap(), 41);
    assert!(!store.get("leasehold#doorbell").await.unwrap().is_stream());
    store.acquire(&acquire("s", "a", T0)).await.unwrap();
    assert!(matches!(
        store.bump("s", T0).await,
        Err(LeaseError::Rejected { .. })
    ));
    assert_eq!(store.get("s").await.unwrap().fence_token, 1);
}

/// Starts `owner`'s session at `now_ms` (a plain acquire of its session
/// record) and returns the session's token.
async fn start_session(store: &dyn LeaseStore, owner: &str, now_ms: i64) -> u64 {
    store
        .acquire(&acquire(&schema::session_record(owner), owner, now_ms))
        .await
        .unwrap()
        .fence_token
}

/// [`acquire`] within `owner`'s session `session` (session mode).
pub fn session_acquire(stream: &str, owner: &str, session: u64, now_ms: i64) -> AcquireRequest {
    AcquireRequest {
        session_token: Some(session),
        ..acquire(stream, owner, now_ms)
    }
}

fn takeover(
    stream: &str,
    owner: &str,
    session: u64,
    from: (&str, u64, u64),
    now_ms: i64,
) -> TakeoverRequest {
    TakeoverRequest {
        acquire: session_acquire(stream, owner, session, now_ms),
        from_owner: from.0.into(),
        from_session_token: from.1,
        from_fence_token: from.2,
        from_expires_at: None,
    }
}

/// Session mode: a stream held under a session is never taken by a plain
/// acquire, however old its own expiry; a per-stream acquire drops the
/// session token.
pub async fn a_session_stream_is_not_taken_by_a_plain_acquire(target: &dyn ConformanceTarget) {
    let store = target.store();
    let a = start_session(store.as_ref(), "a", T0).await;
    let held = store
        .acquire(&session_acquire("s", "a", a, T0))
        .await
        .unwrap();
    assert_eq!((held.fence_token, held.session_token), (1, Some(a)));
    let b = start_session(store.as_ref(), "b", T0).await;
    let much_later = T0 + 10 * LEASE;
    assert_conflict(
        store
            .acquire(&session_acquire("s", "b", b, much_later))
            .await,
        Some("a"),
        1,
    );
    // The holder itself may acquire again (a restart with the same id).
    let again = store
        .acquire(&session_acquire("s", "a", a, T0 + 1))
        .await
        .unwrap();
    assert_eq!(again.fence_token, 2);
    // A released stream is anyone's; a per-stream holder's lapsed lease too.
    store.release(&release("s", "a", 2, T0 + 2)).await.unwrap();
    let taken = store
        .acquire(&session_acquire("s", "b", b, T0 + 3))
        .await
        .unwrap();
    assert_eq!(taken.session_token, Some(b));
    store.acquire(&acquire("p", "c", T0)).await.unwrap();
    assert_conflict(
        store
            .acquire(&session_acquire("p", "b", b, T0 + LEASE + SKEW))
            .await,
        Some("c"),
        1,
    );
    let migrated = store
        .acquire(&session_acquire("p", "b", b, T0 + LEASE + SKEW + 1))
        .await
        .unwrap();
    assert_eq!(migrated.session_token, Some(b));
    let per_stream = store
        .acquire(&acquire("p", "b", T0 + LEASE + SKEW + 2))
        .await
        .unwrap();
    assert_eq!(
        per_stream.session_token, None,
        "a per-stream acquire drops it"
    );
}

/// Session mode: the takeover transaction succeeds only once the holder's
/// session record expired past the skew margin, and only while the stream is
/// still that session's with the token the taker read.
pub async fn takeover_waits_for_the_session_to_end(target: &dyn ConformanceTarget) {
    let store = target.store();
    let a = start_session(store.as_ref(), "a", T0).await;
    store
        .acquire(&session_acquire("s", "a", a, T0))
        .await
        .unwrap();
    let b = start_session(store.as_ref(), "b", T0).await;
    let session_expiry = T0 + LEASE;
    for now in [session_expiry, session_expiry + SKEW] {
        assert_conflict(
            store
                .take_over(&takeover("s", "b", b, ("a", a, 1), now))
                .await,
            Some("a"),
            1,
        );
    }
    // The holder renews its session: the stream lives on with it.
    store
        .renew(&renew(
            &schema::session_record("a"),
            "a",
            a,
            session_expiry - 1,
        ))
        .await
        .unwrap();
    assert_conflict(
        store
            .take_over(&takeover(
                "s",
                "b",
                b,
                ("a", a, 1),
                session_expiry + SKEW + 1,
            ))
            .await,
        Some("a"),
        1,
    );
    let renewed_expiry = session_expiry - 1 + LEASE;
    // A stale view of the stream (wrong token) takes nothing.
    assert_conflict(
        store
            .take_over(&takeover(
                "s",
                "b",
                b,
                ("a", a, 7),
                renewed_expiry + SKEW + 1,
            ))
            .await,
        Some("a"),
        1,
    );
    let taken = store
        .take_over(&TakeoverRequest {
            from_expires_at: Some(renewed_expiry),
            ..takeover("s", "b", b, ("a", a, 1), renewed_expiry + SKEW + 1)
        })
        .await
        .unwrap();
    assert_eq!(taken.owner_id.as_deref(), Some("b"));
    assert_eq!((taken.fence_token, taken.session_token), (2, Some(b)));
    assert_eq!(taken.previous_owner.as_deref(), Some("a"));
    // The takeover gap is from the session's end, not from the stream
    // record's acquire-time expiry (T0 + LEASE, never renewed).
    assert_eq!(taken.previous_expires_at, Some(renewed_expiry));
    assert_eq!(taken.takeover_gap_ms(), Some(SKEW + 1));
    // The same takeover again: the stream moved on.
    assert_conflict(
        store
            .take_over(&takeover(
                "s",
                "b",
                b,
                ("a", a, 1),
                renewed_expiry + SKEW + 2,
            ))
            .await,
        Some("b"),
        2,
    );
}

/// Session mode: a session started again (a new token) or released ends the
/// streams of the old one at once, whatever its expiry.
pub async fn a_restarted_or_released_session_ends_its_streams(target: &dyn ConformanceTarget) {
    let store = target.store();
    let a = start_session(store.as_ref(), "a", T0).await;
    for stream in ["s1", "s2"] {
        store
            .acquire(&session_acquire(stream, "a", a, T0))
            .await
            .unwrap();
    }
    let b = start_session(store.as_ref(), "b", T0).await;
    let a2 = start_session(store.as_ref(), "a", T0 + 1).await;
    assert_eq!(a2, a + 1);
    let taken = store
        .take_over(&takeover("s1", "b", b, ("a", a, 1), T0 + 2))
        .await
        .unwrap();
    assert_eq!(taken.owner_id.as_deref(), Some("b"));
    // When the old session ended is unknown: no takeover gap, not the
    // stream record's acquire-time expiry.
    assert_eq!(
        (taken.previous_expires_at, taken.takeover_gap_ms()),
        (None, None)
    );
    store
        .release(&release(&schema::session_record("a"), "a", a2, T0 + 3))
        .await
        .unwrap();
    let c = start_session(store.as_ref(), "c", T0).await;
    // s2 names session token `a`, which is not the record's any more either way.
    let taken = store
        .take_over(&takeover("s2", "c", c, ("a", a, 1), T0 + 4))
        .await
        .unwrap();
    assert_eq!(taken.owner_id.as_deref(), Some("c"));
}

/// Session mode: two takers race for one stream of an ended session; exactly
/// one wins, with the token one above, and the other is refused.
pub async fn two_takers_race_and_one_wins(target: &dyn ConformanceTarget) {
    let store = target.store();
    let a = start_session(store.as_ref(), "a", T0).await;
    store
        .acquire(&session_acquire("s", "a", a, T0))
        .await
        .unwrap();
    let later = T0 + LEASE + SKEW + 1;
    let b = start_session(store.as_ref(), "b", later).await;
    let c = start_session(store.as_ref(), "c", later).await;
    let barrier = Arc::new(Barrier::new(2));
    let race = |owner: &'static str, session: u64| {
        let store = store.clone();
        let barrier = barrier.clone();
        tokio::spawn(async move {
            barrier.wait().await;
            store
                .take_over(&takeover("s", owner, session, ("a", a, 1), later))
                .await
        })
    };
    let (first, second) = tokio::join!(race("b", b), race("c", c));
    let results = [first.unwrap(), second.unwrap()];
    let winners: Vec<&Lease> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    for loser in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(
            matches!(loser, LeaseError::Conflict { .. }) || loser.is_retryable(),
            "{loser:?}"
        );
    }
    let stored = store.get("s").await.unwrap();
    assert_eq!(stored.fence_token, 2);
    assert_eq!(stored.owner_id, winners[0].owner_id);
}

/// The first mode declared stays; a later declaration learns it.
pub async fn the_first_declared_mode_stays(target: &dyn ConformanceTarget) {
    let store = target.store();
    assert_eq!(store.declare_mode("session", T0).await.unwrap(), "session");
    assert_eq!(
        store.declare_mode("per-stream", T0 + 1).await.unwrap(),
        "session"
    );
    let record = target.get_raw(schema::MODE_RECORD).await.unwrap();
    assert_eq!(
        record.get(schema::LEASE_MODE),
        Some(&AttrValue::s("session"))
    );
}

/// Assigned discovery: the assigner's advice is found by assignee, sorted,
/// and moves nothing else: not the owner, the token, the expiry or the
/// checkpoint, and an acquire neither needs it nor clears it. It never
/// creates a record and never lands on a reserved one.
pub async fn assignments_are_advice_found_by_assignee(target: &dyn ConformanceTarget) {
    let store = target.store();
    for stream in ["as-c", "as-a", "as-b"] {
        store.register(stream, T0).await.unwrap();
    }
    let held = store.acquire(&acquire("as-b", "w1", T0)).await.unwrap();
    store.assign("as-c", Some("w1")).await.unwrap();
    store.assign("as-a", Some("w1")).await.unwrap();
    store.assign("as-b", Some("w2")).await.unwrap();
    assert_eq!(store.assigned("w1").await.unwrap(), ["as-a", "as-c"]);
    assert_eq!(store.assigned("w2").await.unwrap(), ["as-b"]);
    assert!(store.assigned("w3").await.unwrap().is_empty());

    let advised = store.get("as-b").await.unwrap();
    assert_eq!(advised.assignee.as_deref(), Some("w2"));
    assert_eq!(
        Lease {
            assignee: None,
            ..advised
        },
        held,
        "advice moves nothing else"
    );
    // Advice is not ownership: the holder keeps the stream, the assignee
    // still has to win the conditional acquire.
    let refused = store.acquire(&acquire("as-b", "w2", T0 + 1)).await;
    assert!(
        matches!(refused, Err(LeaseError::Conflict { .. })),
        "{refused:?}"
    );
    let mut renew_b = renew("as-b", "w1", held.fence_token, T0 + 2);
    renew_b.checkpoint = Some(5);
    store.renew(&renew_b).await.unwrap();
    store
        .release(&release("as-b", "w1", held.fence_token, T0 + 3))
        .await
        .unwrap();
    let taken = store.acquire(&acquire("as-b", "w2", T0 + 4)).await.unwrap();
    assert_eq!(
        taken.assignee.as_deref(),
        Some("w2"),
        "an acquire keeps the advice"
    );
    assert_eq!(taken.checkpoint, Some(5));

    store.assign("as-b", None).await.unwrap();
    assert!(store.assigned("w2").await.unwrap().is_empty());
    assert_eq!(store.get("as-b").await.unwrap().assignee, None);

    assert!(matches!(
        store.assign("as-missing", Some("w1")).await,
        Err(LeaseError::NotFound { .. })
    ));
    assert!(
        target.get_raw("as-missing").await.is_none(),
        "never created"
    );
    assert!(matches!(
        store.assign(schema::HANDOFF_DOORBELL, Some("w1")).await,
        Err(LeaseError::Rejected { .. })
    ));
}

/// Generates one `#[tokio::test]` per conformance check for a target.
///
/// `$make` is an async expression yielding `Option<impl ConformanceTarget>`
/// (`None` skips, e.g. when no test server is configured).
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        $crate::conformance_suite!(@cases $make;
            acquire_creates_the_record,
            exactly_one_winner_per_round,
            fence_token_strictly_increases,
            owner_reacquire_bumps_the_token,
            takeover_waits_for_expiry_plus_skew,
            renew_requires_owner_token_and_validity,
            renew_never_shortens_the_expiry,
            lift_token_jumps_past_a_fence_for_the_holder_only,
            a_new_epoch_lifts_the_token_and_moves_the_checkpoint_back,
            checkpoint_is_fenced_and_monotonic,
            renew_carries_a_checkpoint,
            release_keeps_token_and_checkpoint,
            release_carries_a_checkpoint,
            a_release_names_its_successor_until_the_next_release,
            force_release_frees_a_held_lease,
            register_is_idempotent,
            missing_streams_are_not_found,
            seed_records_interoperate,
            malformed_records_are_isolated,
            listing_pages_cover_everything_once,
            eventual_reads_match_strong_reads_once_settled,
            bump_counts_every_ring,
            acquire_stores_the_sidecar_url,
            a_session_stream_is_not_taken_by_a_plain_acquire,
            takeover_waits_for_the_session_to_end,
            a_restarted_or_released_session_ends_its_streams,
            two_takers_race_and_one_wins,
            the_first_declared_mode_stays,
            assignments_are_advice_found_by_assignee,
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                if let Some(target) = $make.await {
                    $crate::lease_store::$case(&target).await;
                }
            }
        )*
    };
}

/// A fresh lease table on the test server, as a conformance target.
pub struct DynamoTarget {
    store: Arc<DynamoLeaseStore>,
    client: aws_sdk_dynamodb::Client,
}

impl DynamoTarget {
    /// Creates a new table on the test server; `None` when no server is configured.
    pub async fn create() -> Option<Self> {
        let endpoint = dynamodb_endpoint()?;
        let client = dynamodb_client(&endpoint);
        let store = DynamoLeaseStore::new(client.clone(), unique_name("conformance"));
        store.create_table().await.expect("create test table");
        Some(DynamoTarget {
            store: Arc::new(store),
            client,
        })
    }

    /// The store under test.
    pub fn dynamo_store(&self) -> &DynamoLeaseStore {
        &self.store
    }
}

#[async_trait]
impl ConformanceTarget for DynamoTarget {
    fn store(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }

    async fn put_raw(&self, item: RawItem) {
        self.client
            .put_item()
            .table_name(self.store.table())
            .set_item(Some(from_raw(&item)))
            .send()
            .await
            .expect("raw put");
    }

    async fn get_raw(&self, stream_id: &str) -> Option<RawItem> {
        self.client
            .get_item()
            .table_name(self.store.table())
            .set_key(Some(HashMap::from([(
                schema::STREAM_ID.to_owned(),
                AttributeValue::S(stream_id.to_owned()),
            )])))
            .consistent_read(true)
            .send()
            .await
            .expect("raw get")
            .item
            .map(to_raw)
    }
}
