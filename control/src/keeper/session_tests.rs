//! Session mode: one renewed session record per keeper, streams that live by it.

use super::*;
use crate::clock::PausedClock;
use crate::store::intercept::{Intercepted, Interceptor, StoreOp};
use crate::store::memory::MemoryLeaseStore;
use crate::store::{Consistency, LeaseReader};
use leasehold_telemetry::RecordingSink;
use std::sync::atomic::{AtomicBool, Ordering};

const T0: i64 = 1_700_000_000_000;

/// Counts writes by kind and stream; renews of the session hang on demand.
#[derive(Default)]
struct Writes {
    log: Mutex<Vec<(&'static str, String)>>,
    hang_renews: AtomicBool,
}

impl Writes {
    fn of(&self, kind: &str) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, id)| id.clone())
            .collect()
    }
}

#[async_trait::async_trait]
impl Interceptor for Writes {
    async fn before(&self, op: StoreOp<'_>) -> Result<(), LeaseError> {
        if op.is_write() {
            let id = op.stream_id().unwrap_or_default().to_owned();
            self.log.lock().unwrap().push((op.name(), id));
        }
        if matches!(op, StoreOp::Renew { .. }) && self.hang_renews.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

struct Fixture {
    store: Arc<Intercepted<MemoryLeaseStore, Writes>>,
    clock: PausedClock,
    events: RecordingSink,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture {
            store: Arc::new(Intercepted::new(
                Arc::new(MemoryLeaseStore::default()),
                Writes::default(),
            )),
            clock: PausedClock::starting_at(T0),
            events: RecordingSink::new(),
        }
    }

    fn keeper(&self, owner: &str) -> LeaseKeeper {
        LeaseKeeper::new(
            self.store.clone(),
            Arc::new(self.clock),
            Arc::new(self.events.clone()),
            KeeperConfig {
                owner_id: owner.into(),
                mode: LeaseMode::Session,
                checkpoint_interval: Duration::from_secs(60),
                ..KeeperConfig::default()
            },
        )
    }
}

#[tokio::test(start_paused = true)]
async fn only_the_session_is_renewed_and_every_stream_lives_by_it() {
    let f = Fixture::new();
    let keeper = f.keeper("me");
    let s1 = keeper.acquire("s1").await.unwrap();
    let s2 = keeper.acquire("s2").await.unwrap();
    let session_id = schema::session_record("me");
    let session = f.store.get(&session_id).await.unwrap();
    for stream in ["s1", "s2"] {
        let record = f.store.get(stream).await.unwrap();
        assert_eq!(record.session_token, Some(session.fence_token), "{stream}");
    }
    tokio::time::sleep(Duration::from_secs(95)).await;
    assert!(s1.is_valid() && s2.is_valid());
    let renewed = f.store.interceptor().of("renew");
    assert_eq!(renewed.len(), 9, "one renew per 10 s: {renewed:?}");
    assert!(renewed.iter().all(|id| *id == session_id), "{renewed:?}");
    assert_eq!(s1.deadline(), s2.deadline());
    let table = crate::read::LeaseTable::read(f.store.as_ref(), 100, Consistency::Strong)
        .await
        .unwrap();
    let session = f.store.get(&session_id).await.unwrap();
    assert!(
        table
            .streams
            .iter()
            .all(|s| s.lease_expires_at == session.lease_expires_at),
        "a reader sees the session's expiry on each stream"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lost_session_ends_every_stream_at_its_deadline() {
    let f = Fixture::new();
    let keeper = f.keeper("me");
    let s1 = keeper.acquire("s1").await.unwrap();
    let s2 = keeper.acquire("s2").await.unwrap();
    f.store
        .interceptor()
        .hang_renews
        .store(true, Ordering::SeqCst);
    let deadline = s1.deadline();
    tokio::time::timeout(Duration::from_secs(60), async {
        s1.cancelled().await;
        s2.cancelled().await;
    })
    .await
    .expect("both streams end");
    assert_eq!(Instant::now(), deadline, "at the session's deadline");
    for stream in [&s1, &s2] {
        assert!(!stream.is_valid());
        assert_eq!(stream.loss_reason(), Some(LossReason::DeadlinePassed));
    }
    // The next acquire starts a new session, with a new token.
    f.store
        .interceptor()
        .hang_renews
        .store(false, Ordering::SeqCst);
    let again = keeper.acquire("s1").await.unwrap();
    let record = f.store.get("s1").await.unwrap();
    assert_eq!(record.session_token, Some(2));
    assert!(again.is_valid());
}

#[tokio::test(start_paused = true)]
async fn checkpoints_are_written_every_interval_and_on_release_not_on_renew() {
    let f = Fixture::new();
    let keeper = f.keeper("me");
    let stream = keeper.acquire("s").await.unwrap();
    stream.stage_checkpoint(5);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        f.store.get("s").await.unwrap().checkpoint,
        None,
        "not on renew"
    );
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(f.store.get("s").await.unwrap().checkpoint, Some(5));
    assert_eq!(f.store.interceptor().of("checkpoint"), ["s"]);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        f.store.interceptor().of("checkpoint").len(),
        1,
        "nothing new staged, nothing written"
    );
    stream.stage_checkpoint(7);
    keeper.release(&stream).await.unwrap();
    assert_eq!(f.store.get("s").await.unwrap().checkpoint, Some(7));
    keeper.end_session().await.unwrap();
    let session = f.store.get(&schema::session_record("me")).await.unwrap();
    assert_eq!(session.owner_id, None, "the session record is released");
}

#[tokio::test(start_paused = true)]
async fn a_stream_of_an_ended_session_is_taken_in_one_transaction() {
    let f = Fixture::new();
    let gone = f.keeper("gone");
    gone.acquire("s").await.unwrap();
    // "gone" is paused from here on: nothing it holds is renewed.
    f.store
        .interceptor()
        .hang_renews
        .store(true, Ordering::SeqCst);
    let taker = f.keeper("taker");
    let refused = taker.acquire("s").await.unwrap_err();
    assert!(matches!(refused, LeaseError::Conflict { .. }), "{refused}");
    tokio::time::sleep(Duration::from_millis(30_000 + 1_000)).await;
    let refused = taker.acquire("s").await.unwrap_err();
    assert!(
        matches!(refused, LeaseError::Conflict { .. }),
        "within the skew margin: {refused}"
    );
    tokio::time::sleep(Duration::from_millis(1)).await;
    let taken = taker.acquire("s").await.unwrap();
    assert_eq!(taken.fence_token, 2);
    assert_eq!(taken.acquired.previous_owner.as_deref(), Some("gone"));
    // The two refusals were read off the session record: no transaction
    // (two write units each) was sent to fail.
    assert_eq!(f.store.interceptor().of("take_over").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_released_sessions_stream_is_taken_with_the_release_as_its_end() {
    let f = Fixture::new();
    let gone = f.keeper("gone");
    gone.acquire("s").await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    gone.end_session().await.unwrap();
    let session = f.store.get(&schema::session_record("gone")).await.unwrap();
    let released_at = session.released_at.expect("a released session");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let taken = f.keeper("taker").acquire("s").await.unwrap();
    assert_eq!(taken.acquired.previous_owner.as_deref(), Some("gone"));
    // The takeover's gap runs from the session's release, not unknown.
    assert_eq!(taken.acquired.previous_expires_at, Some(released_at));
    assert_eq!(
        taken.acquired.takeover_gap_ms(),
        Some(taken.acquired.acquired_at.unwrap() - released_at)
    );
}
