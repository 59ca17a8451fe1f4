//! The driver's own tests: the order of checks around the lease, the sink's
//! open at start, the release, and the machine's actions carried out end to
//! end, on the in-memory store and sink, a scripted upstream and tokio's
//! paused clock. The machine's behaviour is tested without a runtime, as
//! input scripts (`machine/tests.rs`).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use async_trait::async_trait;
use leasehold_control::clock::{Clock, PausedClock};
use leasehold_control::keeper::KeeperConfig;
use leasehold_control::store::memory::MemoryLeaseStore;
use leasehold_control::store::{AcquireRequest, LeaseReader, LeaseStore};
use leasehold_telemetry::RecordingSink;

use super::*;
use crate::upstream::Subscription;
use leasehold_sink::memory::MemorySink;
use leasehold_sink::{OpenOutcome, SinkError, SinkOptions, WriteOutcome};
use leasehold_sink::{SinkBatch, SinkEvent};

/// What the next subscription does after delivering `after` events.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// After `after` events the upstream's sequence starts over at 1 on
    /// the same connection (an exchange's service restart).
    Restart { after: u64 },
}

#[derive(Default)]
struct FakeUpstream {
    head: Arc<AtomicU64>,
    faults: Mutex<VecDeque<Fault>>,
    subscribed_from: Mutex<Vec<u64>>,
    open: Arc<AtomicU64>,
    /// Like an exchange: every connection starts after the head at connect
    /// time, whatever it was asked for.
    live: AtomicBool,
}

struct FakeSubscription {
    next: u64,
    head: Arc<AtomicU64>,
    fault: Option<Fault>,
    delivered: u64,
    open: Arc<AtomicU64>,
    closed: AtomicBool,
}

impl Drop for FakeSubscription {
    fn drop(&mut self) {
        if !self.closed.swap(true, Ordering::SeqCst) {
            self.open.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

#[async_trait]
impl Upstream for FakeUpstream {
    async fn subscribe(
        &self,
        _stream_id: &str,
        from_seq: u64,
    ) -> Result<Box<dyn Subscription>, UpstreamError> {
        self.subscribed_from.lock().unwrap().push(from_seq);
        let fault = self.faults.lock().unwrap().pop_front();
        self.open.fetch_add(1, Ordering::SeqCst);
        let next = if self.live.load(Ordering::SeqCst) {
            self.head.load(Ordering::SeqCst) + 1
        } else {
            from_seq
        };
        Ok(Box::new(FakeSubscription {
            next,
            head: self.head.clone(),
            fault,
            delivered: 0,
            open: self.open.clone(),
            closed: AtomicBool::new(false),
        }))
    }
}

/// The fake upstream's event at `seq`, as it arrives now.
fn trade(seq: u64) -> UpstreamEvent {
    UpstreamEvent {
        seq,
        first_seq: None,
        snapshot: false,
        event_id: format!("s:{seq}"),
        payload: format!("{{\"seq\":{seq}}}").into(),
        received_at: Instant::now(),
        arrival_lag: None,
    }
}

#[async_trait]
impl Subscription for FakeSubscription {
    async fn next(&mut self) -> Result<UpstreamEvent, UpstreamError> {
        if let Some(Fault::Restart { after }) = self.fault
            && self.delivered == after
        {
            self.fault = None;
            self.next = 1;
        }
        while self.next > self.head.load(Ordering::SeqCst) {
            sleep(Duration::from_millis(5)).await;
        }
        let seq = self.next;
        self.next += 1;
        self.delivered += 1;
        Ok(trade(seq))
    }

    async fn close(&mut self) {
        if !self.closed.swap(true, Ordering::SeqCst) {
            self.open.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A sink that fails its first `failures` writes: unreachable, or refusing
/// when `refuse` is set.
struct FlakySink {
    inner: MemorySink,
    failures: AtomicU64,
    refuse: AtomicBool,
}

#[async_trait]
impl FencedSink for FlakySink {
    async fn open(&self, stream_id: &str, fence_token: u64) -> Result<OpenOutcome, SinkError> {
        self.inner.open(stream_id, fence_token).await
    }

    async fn open_epoch(
        &self,
        stream_id: &str,
        fence_token: u64,
        reset: leasehold_sink::ResetMark,
    ) -> Result<OpenOutcome, SinkError> {
        self.inner.open_epoch(stream_id, fence_token, reset).await
    }

    async fn write(&self, batch: SinkBatch<'_>) -> Result<WriteOutcome, SinkError> {
        if self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            if self.refuse.load(Ordering::SeqCst) {
                return Err(SinkError::Rejected("WRONGTYPE".into()));
            }
            return Err(SinkError::Unavailable("down".into()));
        }
        self.inner.write(batch).await
    }
}

struct Fixture {
    store: Arc<MemoryLeaseStore>,
    clock: PausedClock,
    upstream: Arc<FakeUpstream>,
    sink: Arc<FlakySink>,
    events: RecordingSink,
    context: Arc<RunnerContext>,
}

fn fixture(head: u64) -> Fixture {
    let store = Arc::new(MemoryLeaseStore::new());
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
    let upstream = Arc::new(FakeUpstream::default());
    upstream.head.store(head, Ordering::SeqCst);
    let sink = Arc::new(FlakySink {
        inner: MemorySink::new(SinkOptions::default()),
        failures: AtomicU64::new(0),
        refuse: AtomicBool::new(false),
    });
    let context = Arc::new(RunnerContext {
        keeper,
        upstream: upstream.clone(),
        sink: sink.clone(),
        history: None,
        telemetry: Arc::new(events.clone()),
        config: RunnerConfig {
            batch_max_events: 10,
            ..RunnerConfig::default()
        },
    });
    Fixture {
        store,
        clock,
        upstream,
        sink,
        events,
        context,
    }
}

/// The fixture on a live-start upstream (`UPSTREAM_RESUME=live`).
fn live_fixture(head: u64) -> Fixture {
    let mut f = fixture(head);
    f.upstream.live.store(true, Ordering::SeqCst);
    let context = Arc::get_mut(&mut f.context).expect("not shared yet");
    context.config.resume = ResumeMode::Live;
    f
}

fn sink_seqs(f: &Fixture) -> Vec<u64> {
    f.sink.inner.events("s").iter().map(|e| e.seq).collect()
}

async fn wait_for(mut condition: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if condition() {
            return;
        }
        sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not reached");
}

#[tokio::test(start_paused = true)]
async fn writes_in_order_with_the_token_and_checkpoints_on_renew() {
    let f = fixture(25);
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let drain = CancellationToken::new();
    let task = tokio::spawn(run_stream(f.context.clone(), lease.clone(), drain.clone()));
    wait_for(|| f.sink.inner.events("s").len() == 25).await;
    assert_eq!(sink_seqs(&f), (1..=25).collect::<Vec<_>>());
    assert!(f.sink.inner.events("s").iter().all(|e| e.fence_token == 1));
    sleep(Duration::from_secs(11)).await;
    assert_eq!(
        f.store.get("s").await.unwrap().checkpoint,
        Some(25),
        "rides on the renew"
    );
    drain.cancel();
    assert_eq!(task.await.unwrap(), StreamExit::Released);
    assert_eq!(
        f.upstream.open.load(Ordering::SeqCst),
        0,
        "connection closed"
    );
}

#[tokio::test(start_paused = true)]
async fn resumes_from_the_stored_checkpoint() {
    let f = fixture(30);
    f.store.register("s", 0).await.unwrap();
    let lease = f.context.keeper.acquire("s").await.unwrap();
    f.context
        .keeper
        .commit_checkpoint(&lease, 20)
        .await
        .unwrap();
    f.context.keeper.release(&lease).await.unwrap();
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    wait_for(|| f.sink.inner.events("s").len() == 10).await;
    assert_eq!(f.upstream.subscribed_from.lock().unwrap()[0], 21);
    assert_eq!(sink_seqs(&f), (21..=30).collect::<Vec<_>>());
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_new_owner_raises_the_fence_before_any_event_arrives() {
    // A quiet stream: no event ever comes, yet the fence must move at once, or
    // a zombie's delayed write would still be accepted.
    let f = fixture(0);
    let lease = f.context.keeper.acquire("s").await.unwrap();
    assert_eq!(lease.fence_token, 1);
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    wait_for(|| f.sink.inner.highest_token("s") == 1).await;
    let zombie = f
        .sink
        .inner
        .write(SinkBatch {
            stream_id: "s",
            fence_token: 0,
            events: &[SinkEvent::data(1, "s:1", "{}")],
        })
        .await
        .unwrap();
    assert!(zombie.is_fenced(), "the open alone fences the old token");
    assert!(f.sink.inner.events("s").is_empty());
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn resumes_after_the_sinks_last_sequence_when_it_is_past_the_checkpoint() {
    // The previous owner wrote 1..=40 but crashed before its checkpoint (10)
    // moved further: the new owner must not append 11..=40 again.
    let f = fixture(60);
    f.store.register("s", 0).await.unwrap();
    let old = f.context.keeper.acquire("s").await.unwrap();
    f.context.keeper.commit_checkpoint(&old, 10).await.unwrap();
    let written: Vec<SinkEvent> = (1..=40)
        .map(|seq| SinkEvent::data(seq, format!("s:{seq}"), "{}"))
        .collect();
    f.sink.inner.open("s", old.fence_token).await.unwrap();
    f.sink
        .inner
        .write(SinkBatch {
            stream_id: "s",
            fence_token: old.fence_token,
            events: &written,
        })
        .await
        .unwrap();
    f.context.keeper.release(&old).await.unwrap();
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    wait_for(|| f.sink.inner.events("s").len() == 60).await;
    assert_eq!(f.upstream.subscribed_from.lock().unwrap()[0], 41);
    assert_eq!(sink_seqs(&f), (1..=60).collect::<Vec<_>>());
    sleep(Duration::from_secs(11)).await;
    assert_eq!(
        f.store.get("s").await.unwrap().checkpoint,
        Some(60),
        "the checkpoint catches up with what the sink confirmed"
    );
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn an_owner_whose_token_the_sink_already_passed_stops_at_the_open() {
    let f = fixture(10);
    let lease = f.context.keeper.acquire("s").await.unwrap();
    f.sink.inner.open("s", lease.fence_token + 5).await.unwrap();
    let exit = run_stream(f.context.clone(), lease, CancellationToken::new()).await;
    assert_eq!(exit, StreamExit::Lost(LossReason::Fenced));
    assert!(f.sink.inner.events("s").is_empty());
    assert_eq!(
        f.upstream.subscribed_from.lock().unwrap().len(),
        0,
        "never subscribed"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fence_above_the_tables_token_is_lifted_past_not_climbed() {
    // The lease record was re-created: the store gave token 1, but the sink
    // accepted token 50 before. Every owner would be fenced until 50 takeovers.
    let f = fixture(5);
    f.sink.inner.open("s", 50).await.unwrap();
    let lease = f.context.keeper.acquire("s").await.unwrap();
    assert_eq!(lease.fence_token, 1);
    let exit = run_stream(f.context.clone(), lease, CancellationToken::new()).await;
    assert_eq!(exit, StreamExit::Lost(LossReason::Fenced));
    assert_eq!(
        f.store.get("s").await.unwrap().fence_token,
        51,
        "lifted in one write"
    );
    assert!(f.events.snapshot().iter().any(|e| matches!(
        e,
        TelemetryEvent::FenceLifted {
            from: 1,
            to: 51,
            ..
        }
    )));
    // The next acquire starts above the fence and writes.
    let lease = f.context.keeper.acquire("s").await.unwrap();
    assert_eq!(lease.fence_token, 52);
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    wait_for(|| f.sink.inner.events("s").len() == 5).await;
    assert!(f.sink.inner.events("s").iter().all(|e| e.fence_token == 52));
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_zombie_lifts_nothing() {
    // A newer owner really exists: the store says so, and nothing is lifted.
    let f = fixture(5);
    let old = f.context.keeper.acquire("s").await.unwrap();
    f.store
        .acquire(&AcquireRequest {
            stream_id: "s".into(),
            owner_id: "other".into(),
            now_ms: f.clock.now_ms() + 60_000,
            lease_ms: 30_000,
            skew_margin_ms: 0,
            sidecar_url: None,
            handoff_addr: None,
            max_streams: None,
            session_token: None,
        })
        .await
        .unwrap();
    f.sink.inner.open("s", 2).await.unwrap();
    let exit = run_stream(f.context.clone(), old, CancellationToken::new()).await;
    assert_eq!(exit, StreamExit::Lost(LossReason::Fenced));
    assert_eq!(f.store.get("s").await.unwrap().fence_token, 2);
    assert!(
        !f.events
            .snapshot()
            .iter()
            .any(|e| matches!(e, TelemetryEvent::FenceLifted { .. }))
    );
}

#[tokio::test(start_paused = true)]
async fn a_fenced_write_stops_the_stream_at_once() {
    let f = fixture(0);
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease.clone(),
        CancellationToken::new(),
    ));
    wait_for(|| f.sink.inner.highest_token("s") == 1).await;
    // A newer owner opens the stream with token 2; then events arrive.
    f.sink.inner.open("s", 2).await.unwrap();
    f.upstream.head.store(5, Ordering::SeqCst);
    assert_eq!(task.await.unwrap(), StreamExit::Lost(LossReason::Fenced));
    assert!(
        f.sink.inner.events("s").is_empty(),
        "nothing accepted with the stale token"
    );
    assert!(!lease.is_valid());
    assert!(f.context.keeper.held().is_empty());
    assert_eq!(f.upstream.open.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn losing_the_lease_stops_side_effects() {
    let f = fixture(5);
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease.clone(),
        CancellationToken::new(),
    ));
    wait_for(|| f.sink.inner.events("s").len() == 5).await;
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
    f.store.acquire(&other).await.unwrap();
    assert_eq!(
        task.await.unwrap(),
        StreamExit::Lost(LossReason::RenewRejected)
    );
    f.upstream.head.store(50, Ordering::SeqCst);
    sleep(Duration::from_secs(5)).await;
    assert_eq!(f.sink.inner.events("s").len(), 5, "no write after the loss");
    assert_eq!(f.upstream.open.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn past_its_deadline_a_holder_writes_nothing_even_before_the_loss_is_signalled() {
    // The keeper has not (yet) said the lease is lost — its task is late, or
    // the renew is still out — but the holder's own deadline has passed: the
    // runner's check of the clock must stop the write by itself.
    let f = fixture(0);
    let acquired = f
        .store
        .acquire(&AcquireRequest {
            stream_id: "s".into(),
            owner_id: "me".into(),
            now_ms: f.clock.now_ms(),
            lease_ms: 30_000,
            skew_margin_ms: 0,
            sidecar_url: None,
            handoff_addr: None,
            max_streams: None,
            session_token: None,
        })
        .await
        .unwrap();
    let lease = HeldLease::detached(acquired, Instant::now() + Duration::from_secs(5));
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease.clone(),
        CancellationToken::new(),
    ));
    // The sink is opened well before the deadline; events only come after it.
    wait_for(|| f.sink.inner.highest_token("s") == 1).await;
    sleep(Duration::from_secs(6)).await;
    assert!(!lease.is_valid(), "the deadline has passed");
    f.upstream.head.store(20, Ordering::SeqCst);
    sleep(Duration::from_secs(2)).await;
    assert!(
        f.sink.inner.events("s").is_empty(),
        "nothing written past the deadline, though no loss was signalled"
    );
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_sink_that_keeps_refusing_gives_the_stream_up() {
    let f = fixture(5);
    f.sink.failures.store(u64::MAX, Ordering::SeqCst);
    f.sink.refuse.store(true, Ordering::SeqCst);
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let exit = run_stream(f.context.clone(), lease, CancellationToken::new()).await;
    assert_eq!(
        exit,
        StreamExit::SinkGaveUp("sink rejected the write: WRONGTYPE".into())
    );
    // How many refusals it takes is the machine's (its scripts); the
    // driver reports the give-up and releases the lease.
    assert!(
        f.events
            .snapshot()
            .iter()
            .any(|e| matches!(e, TelemetryEvent::SinkGaveUp { failures: 10, .. }))
    );
    assert_eq!(
        f.store.get("s").await.unwrap().owner_id,
        None,
        "released for another worker"
    );
    assert_eq!(
        f.upstream.open.load(Ordering::SeqCst),
        0,
        "connection closed"
    );
}

#[tokio::test(start_paused = true)]
async fn drain_writes_pending_commits_and_releases() {
    let f = fixture(3);
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let drain = CancellationToken::new();
    let task = tokio::spawn(run_stream(f.context.clone(), lease.clone(), drain.clone()));
    wait_for(|| f.sink.inner.events("s").len() == 3).await;
    drain.cancel();
    assert_eq!(task.await.unwrap(), StreamExit::Released);
    let record = f.store.get("s").await.unwrap();
    assert_eq!(
        (record.owner_id, record.checkpoint, record.fence_token),
        (None, Some(3), 1)
    );
    assert_eq!(f.upstream.open.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_sequence_that_starts_over_goes_on_in_a_new_epoch_after_a_reset_entry() {
    let f = live_fixture(100);
    f.upstream
        .faults
        .lock()
        .unwrap()
        .push_back(Fault::Restart { after: 5 });
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let token = lease.fence_token;
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    for head in 101..=110 {
        f.upstream.head.store(head, Ordering::SeqCst);
        sleep(Duration::from_millis(10)).await;
    }
    wait_for(|| sink_seqs(&f).last() == Some(&110) && sink_seqs(&f).len() > 100).await;
    let stored = f.sink.inner.events("s");
    let at = stored
        .iter()
        .position(|e| e.reset.is_some())
        .expect("a reset entry");
    let old: Vec<_> = stored[..at]
        .iter()
        .map(|e| (e.seq, e.fence_token))
        .collect();
    let first = old[0].0;
    assert_eq!(old.len(), 5, "{old:?}");
    assert_eq!(
        old,
        (first..first + 5)
            .map(|seq| (seq, token))
            .collect::<Vec<_>>()
    );
    let reset = &stored[at];
    assert_eq!(
        (reset.seq, reset.fence_token, reset.reset),
        (
            0,
            token + 1,
            Some(leasehold_sink::ResetMark {
                from: first + 4,
                to: 1
            })
        )
    );
    let new: Vec<_> = stored[at + 1..]
        .iter()
        .map(|e| (e.seq, e.fence_token))
        .collect();
    assert_eq!(
        new,
        (1..=110).map(|seq| (seq, token + 1)).collect::<Vec<_>>()
    );
    // One connection throughout: the new epoch went on reading it.
    assert_eq!(f.upstream.subscribed_from.lock().unwrap().len(), 1);
    // The table follows the new epoch: its token, and its checkpoint on the next renew.
    sleep(Duration::from_secs(11)).await;
    let record = f.store.get("s").await.unwrap();
    assert_eq!(
        (record.fence_token, record.checkpoint),
        (token + 1, Some(110))
    );
    let events = f.events.snapshot();
    let resets: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            TelemetryEvent::StreamReset {
                from_seq,
                to_seq,
                fence_token,
                ..
            } => Some((*from_seq, *to_seq, *fence_token)),
            _ => None,
        })
        .collect();
    assert_eq!(resets, [(first + 4, 1, token + 1)]);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, TelemetryEvent::LeaseLost { .. })),
        "a new epoch is no loss"
    );
    task.abort();
}
