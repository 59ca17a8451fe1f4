//! Runner tests on the in-memory store and sink, with a scripted upstream and
//! tokio's paused clock.

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
    Gap {
        after: u64,
    },
    Close {
        after: u64,
    },
    Retention {
        earliest: u64,
    },
    /// The upstream skips `by` sequences after `after` events (a hole
    /// inside the connection, delivered as a jump).
    Skip {
        after: u64,
        by: u64,
    },
    /// After `after` events the upstream sends its last event again and
    /// again, every half second (an exchange replaying after a restart).
    Stuck {
        after: u64,
    },
    /// After `after` events, one frame that claims `seq` (a status frame
    /// whose timestamp sits at the sequence pointer); the real sequence
    /// goes on after it.
    Bogus {
        after: u64,
        seq: u64,
    },
    /// After `after` events the upstream's sequence starts over at 1 on
    /// the same connection (an exchange's service restart).
    Restart {
        after: u64,
    },
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
    /// Only sequences divisible by this are sent (0 or 1: all), like a
    /// sequence shared by several channels.
    every: AtomicU64,
    /// Events delivered by every subscription so far.
    delivered_total: Arc<AtomicU64>,
}

struct FakeSubscription {
    next: u64,
    delivered_total: Arc<AtomicU64>,
    every: u64,
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
        if let Some(Fault::Retention { earliest }) = fault
            && from_seq < earliest
        {
            return Err(UpstreamError::RetentionExceeded {
                requested: from_seq,
                earliest: Some(earliest),
            });
        }
        self.open.fetch_add(1, Ordering::SeqCst);
        let next = if self.live.load(Ordering::SeqCst) {
            self.head.load(Ordering::SeqCst) + 1
        } else {
            from_seq
        };
        Ok(Box::new(FakeSubscription {
            next,
            delivered_total: self.delivered_total.clone(),
            every: self.every.load(Ordering::SeqCst).max(1),
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
        event_id: format!("s:{seq}"),
        payload: format!("{{\"seq\":{seq}}}").into(),
        received_at: Instant::now(),
        arrival_lag: Some(2.0),
    }
}

#[async_trait]
impl Subscription for FakeSubscription {
    async fn next(&mut self) -> Result<UpstreamEvent, UpstreamError> {
        match self.fault {
            Some(Fault::Gap { after }) if self.delivered == after => {
                return Err(UpstreamError::Gap {
                    expected: self.next,
                    got: self.next + 3,
                });
            }
            Some(Fault::Close { after }) if self.delivered == after => {
                return Err(UpstreamError::Closed("test".into()));
            }
            Some(Fault::Skip { after, by }) if self.delivered == after => {
                self.next += by;
                self.fault = None;
            }
            Some(Fault::Stuck { after }) if self.delivered >= after => {
                sleep(Duration::from_millis(500)).await;
                return Ok(trade(self.next - 1));
            }
            Some(Fault::Restart { after }) if self.delivered == after => {
                self.fault = None;
                self.next = 1;
            }
            Some(Fault::Bogus { after, seq }) if self.delivered == after => {
                self.fault = None;
                self.delivered += 1;
                return Ok(UpstreamEvent {
                    event_id: "status".into(),
                    payload: "{\"status\":\"ok\"}".into(),
                    ..trade(seq)
                });
            }
            _ => {}
        }
        while !self.next.is_multiple_of(self.every) {
            self.next += 1;
        }
        while self.next > self.head.load(Ordering::SeqCst) {
            sleep(Duration::from_millis(5)).await;
        }
        let seq = self.next;
        self.next += 1;
        self.delivered += 1;
        self.delivered_total.fetch_add(1, Ordering::SeqCst);
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
    /// Like Redis: a write applies when sent, its reply comes this much later.
    reply_delay: Mutex<Duration>,
    /// The batch holding this seq is lost once (not applied, an error replied).
    lose_once_at: AtomicU64,
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
        let delay = *self.reply_delay.lock().unwrap();
        let lose = self.lose_once_at.load(Ordering::SeqCst);
        if lose > 0
            && batch.events.iter().any(|e| e.seq == lose)
            && self
                .lose_once_at
                .compare_exchange(lose, 0, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            sleep(delay).await;
            return Err(SinkError::Unavailable("lost on the way".into()));
        }
        let outcome = self.inner.write(batch).await;
        if !delay.is_zero() {
            sleep(delay).await;
        }
        outcome
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
        reply_delay: Mutex::new(Duration::ZERO),
        lose_once_at: AtomicU64::new(0),
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

/// The batch holding seq 5 lost on the way: no later batch is sent before it
/// landed (ids only go up, so one sent past it would leave a hole no retry
/// fills), it is written again, and the checkpoint never passes what landed.
#[tokio::test(start_paused = true)]
async fn no_batch_is_sent_past_a_lost_one() {
    let f = fixture(0);
    *f.sink.reply_delay.lock().unwrap() = Duration::from_millis(50);
    f.sink.lose_once_at.store(5, Ordering::SeqCst);
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let drain = CancellationToken::new();
    let task = tokio::spawn(run_stream(f.context.clone(), lease.clone(), drain.clone()));
    for head in 1..=40 {
        f.upstream.head.store(head, Ordering::SeqCst);
        sleep(Duration::from_millis(7)).await;
        let stored = sink_seqs(&f);
        assert_eq!(
            stored,
            (1..=stored.len() as u64).collect::<Vec<_>>(),
            "no hole, ever"
        );
        let checkpoint = f.store.get("s").await.unwrap().checkpoint.unwrap_or(0);
        assert!(
            checkpoint <= stored.len() as u64,
            "checkpoint {checkpoint} past the sink"
        );
    }
    wait_for(|| sink_seqs(&f).len() == 40).await;
    assert_eq!(sink_seqs(&f), (1..=40).collect::<Vec<_>>());
    assert_eq!(
        f.sink.lose_once_at.load(Ordering::SeqCst),
        0,
        "a batch was lost"
    );
    drain.cancel();
    assert_eq!(task.await.unwrap(), StreamExit::Released);
    assert_eq!(f.store.get("s").await.unwrap().checkpoint, Some(40));
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
async fn a_gap_reconnects_from_the_checkpoint_without_losing_events() {
    let f = fixture(40);
    f.upstream
        .faults
        .lock()
        .unwrap()
        .push_back(Fault::Gap { after: 7 });
    f.upstream
        .faults
        .lock()
        .unwrap()
        .push_back(Fault::Close { after: 12 });
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    wait_for(|| f.sink.inner.events("s").len() == 40).await;
    assert_eq!(sink_seqs(&f), (1..=40).collect::<Vec<_>>());
    assert_eq!(*f.upstream.subscribed_from.lock().unwrap(), [1, 8, 20]);
    let reasons: Vec<_> = f
        .events
        .take()
        .into_iter()
        .filter_map(|e| match e {
            TelemetryEvent::UpstreamReconnect { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    assert_eq!(reasons, ["gap", "closed"]);
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn retention_loss_is_reported_and_skipped() {
    let f = fixture(60);
    f.upstream
        .faults
        .lock()
        .unwrap()
        .push_back(Fault::Retention { earliest: 50 });
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    wait_for(|| f.sink.inner.events("s").len() == 11).await;
    assert_eq!(sink_seqs(&f), (50..=60).collect::<Vec<_>>());
    assert!(f.events.snapshot().iter().any(|e| matches!(
        e,
        TelemetryEvent::StreamGap {
            from_seq: 1,
            to_seq: 49,
            ..
        }
    )));
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_moving_retention_edge_is_overtaken_not_chased() {
    // A busy upstream: its earliest retained sequence moves 50 further on by
    // every reconnect. Asking for the edge itself would fail forever.
    let f = fixture(10_000);
    for n in 0..100 {
        f.upstream
            .faults
            .lock()
            .unwrap()
            .push_back(Fault::Retention {
                earliest: 100 + 50 * n,
            });
    }
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    wait_for(|| !f.sink.inner.events("s").is_empty()).await;
    let first = sink_seqs(&f)[0];
    let attempts = f.upstream.subscribed_from.lock().unwrap().len();
    assert!(
        attempts < 20,
        "reading resumed after {attempts} subscriptions (first seq {first})"
    );
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn sink_failures_are_retried_without_losing_the_batch() {
    let f = fixture(15);
    f.sink.failures.store(3, Ordering::SeqCst);
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    wait_for(|| f.sink.inner.events("s").len() == 15).await;
    assert_eq!(sink_seqs(&f), (1..=15).collect::<Vec<_>>());
    let failed_batches: Vec<u64> = f
        .events
        .snapshot()
        .iter()
        .filter_map(|e| match e {
            TelemetryEvent::SinkWriteFailed { events, .. } => Some(*events),
            _ => None,
        })
        .collect();
    assert_eq!(failed_batches.len(), 3);
    // Failures are counted in events, like every other sink outcome.
    assert!(failed_batches.iter().all(|&n| n > 0), "{failed_batches:?}");
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_sink_is_retried_past_the_refusal_limit() {
    // Outages are not counted: 25 in a row (over SINK_MAX_FAILURES) and the
    // batch still lands while the lease holds.
    let f = fixture(5);
    f.sink.failures.store(25, Ordering::SeqCst);
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    wait_for(|| f.sink.inner.events("s").len() == 5).await;
    assert_eq!(
        f.store.get("s").await.unwrap().owner_id.as_deref(),
        Some("me")
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
    let events = f.events.snapshot();
    let refused = events
        .iter()
        .filter(|e| matches!(e, TelemetryEvent::SinkWriteFailed { .. }))
        .count();
    assert_eq!(refused, 10, "SINK_MAX_FAILURES refusals, then no more");
    assert!(
        events
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

fn last_event_age(events: &RecordingSink) -> f64 {
    events
        .snapshot()
        .iter()
        .rev()
        .find_map(|e| match e {
            TelemetryEvent::StreamLag {
                last_event_age_seconds,
                ..
            } => Some(*last_event_age_seconds),
            _ => None,
        })
        .expect("lag reported")
}

#[tokio::test(start_paused = true)]
async fn in_session_mode_the_lag_runs_to_the_sinks_confirmation() {
    let mut f = fixture(0);
    let keeper = LeaseKeeper::new(
        f.store.clone(),
        Arc::new(f.clock),
        Arc::new(f.events.clone()),
        KeeperConfig {
            owner_id: "me".into(),
            mode: leasehold_control::settings::LeaseMode::Session,
            ..KeeperConfig::default()
        },
    );
    f.context = Arc::new(RunnerContext {
        keeper,
        upstream: f.upstream.clone(),
        sink: f.sink.clone(),
        history: None,
        telemetry: Arc::new(f.events.clone()),
        config: f.context.config.clone(),
    });
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    for _ in 0..60 {
        f.upstream.head.fetch_add(1, Ordering::SeqCst);
        sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        f.store.get("s").await.unwrap().checkpoint,
        None,
        "no checkpoint written within the interval"
    );
    let lag = f
        .events
        .snapshot()
        .iter()
        .rev()
        .find_map(|e| match e {
            TelemetryEvent::StreamLag {
                lag_events,
                lag_seconds,
                ..
            } => Some((*lag_events, *lag_seconds)),
            _ => None,
        })
        .expect("lag reported");
    assert!(
        lag.0 <= 2 && lag.1 < 2.0,
        "{lag:?} after 30 s of confirmed events"
    );
    task.abort();
}

/// A live upstream starts at the exchange's own id: before anything is
/// persisted, the lag counts the events this holder took, not the id.
#[tokio::test(start_paused = true)]
async fn a_live_start_lags_by_what_it_received_not_by_the_exchanges_id() {
    let (f, _) = live_fixture(60_000, ResumeMode::Live);
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    subscribed(&f, 1).await;
    f.upstream.head.store(60_005, Ordering::SeqCst);
    wait_for(|| sink_seqs(&f).last() == Some(&60_005)).await;
    sleep(Duration::from_secs(2)).await;
    let largest = f
        .events
        .snapshot()
        .iter()
        .filter_map(|e| match e {
            TelemetryEvent::StreamLag { lag_events, .. } => Some(*lag_events),
            _ => None,
        })
        .max()
        .expect("lag reported");
    assert!(largest <= 6, "a lag of {largest} events for 6 received");
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn the_last_event_age_stays_low_while_events_flow_and_grows_in_silence() {
    let f = fixture(0);
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    for _ in 0..40 {
        f.upstream.head.fetch_add(1, Ordering::SeqCst);
        sleep(Duration::from_millis(500)).await;
    }
    let flowing = last_event_age(&f.events);
    assert!(flowing < 2.0, "{flowing} s while an event came every 0.5 s");
    sleep(Duration::from_secs(30)).await;
    let silent = last_event_age(&f.events);
    assert!(silent >= 29.0, "{silent} s after 30 s of silence");
    task.abort();
}

/// Liveness moves only with events that are written: an upstream that
/// keeps sending what was already written (every frame a duplicate) does not
/// keep the last-event age low, so the stale-stream alert can fire.
#[tokio::test(start_paused = true)]
async fn duplicates_alone_do_not_keep_the_last_event_age_low() {
    let f = fixture(0);
    f.upstream
        .faults
        .lock()
        .unwrap()
        .push_back(Fault::Stuck { after: 10 });
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    f.upstream.head.store(10, Ordering::SeqCst);
    wait_for(|| sink_seqs(&f).last() == Some(&10)).await;
    // 30 s of frames every half second, each a duplicate.
    sleep(Duration::from_secs(30)).await;
    let duplicates = f
        .events
        .snapshot()
        .iter()
        .filter(|e| {
            matches!(
                e,
                TelemetryEvent::UpstreamFrameSkipped {
                    reason: leasehold_telemetry::SkipReason::Duplicate,
                    ..
                }
            )
        })
        .count();
    assert!(duplicates >= 25, "{duplicates} duplicates");
    let age = last_event_age(&f.events);
    assert!(age >= 29.0, "{age} s after 30 s of nothing but duplicates");
    task.abort();
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
async fn the_event_lag_is_the_arrival_lag_plus_the_time_since() {
    // The fake upstream's events arrive 2 s behind their own time.
    let f = fixture(3);
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    wait_for(|| f.sink.inner.events("s").len() == 3).await;
    sleep(Duration::from_secs(10)).await;
    let lag = f
        .events
        .snapshot()
        .iter()
        .rev()
        .find_map(|e| match e {
            TelemetryEvent::StreamLag {
                event_lag_seconds, ..
            } => *event_lag_seconds,
            _ => None,
        })
        .expect("event lag reported");
    assert!(
        (11.5..12.5).contains(&lag),
        "{lag} s: 2 s on arrival + 10 s since"
    );
    task.abort();
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

/// A history that serves sequences `oldest..` (up to the upstream's head) in
/// pages of `page`, failing the first `failures` requests.
struct FakeHistory {
    head: Arc<AtomicU64>,
    oldest: AtomicU64,
    page: u64,
    failures: AtomicU64,
    requests: Mutex<Vec<(u64, u64)>>,
}

#[async_trait]
impl crate::upstream::history::History for FakeHistory {
    async fn page(
        &self,
        _stream_id: &str,
        from_seq: u64,
        to_seq: u64,
    ) -> Result<Vec<UpstreamEvent>, crate::upstream::history::HistoryError> {
        self.requests.lock().unwrap().push((from_seq, to_seq));
        sleep(Duration::from_millis(20)).await;
        if self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(crate::upstream::history::HistoryError::Unavailable(
                "HTTP 503".into(),
            ));
        }
        let start = from_seq.max(self.oldest.load(Ordering::SeqCst));
        let end = (start + self.page - 1).min(self.head.load(Ordering::SeqCst));
        Ok((start..=end)
            .map(|seq| UpstreamEvent {
                seq,
                event_id: format!("s:{seq}"),
                payload: format!("{{\"history\":{seq}}}").into(),
                received_at: Instant::now(),
                arrival_lag: None,
            })
            .collect())
    }
}

/// The fixture on a live-start upstream in `mode`, with a history when
/// `backfill`.
fn live_fixture(head: u64, mode: ResumeMode) -> (Fixture, Option<Arc<FakeHistory>>) {
    let mut f = fixture(head);
    f.upstream.live.store(true, Ordering::SeqCst);
    let history = (mode == ResumeMode::Backfill).then(|| {
        Arc::new(FakeHistory {
            head: f.upstream.head.clone(),
            oldest: AtomicU64::new(1),
            page: 7,
            failures: AtomicU64::new(0),
            requests: Mutex::new(Vec::new()),
        })
    });
    let context = Arc::get_mut(&mut f.context).expect("not shared yet");
    context.config.resume = mode;
    context.history = history.clone().map(|h| {
        let config = crate::upstream::history::HistoryConfig {
            max_attempts: 3,
            ..Default::default()
        };
        (h as Arc<dyn crate::upstream::history::History>, config)
    });
    (f, history)
}

/// Waits until the runner opened its `n`th upstream connection (a live
/// upstream starts wherever its head is then).
async fn subscribed(f: &Fixture, n: usize) {
    wait_for(|| f.upstream.subscribed_from.lock().unwrap().len() >= n).await;
}

/// Every stored sequence, markers as their ranges: (seq or gap_to, gap_from).
fn entries(f: &Fixture) -> Vec<(u64, Option<u64>)> {
    f.sink
        .inner
        .events("s")
        .iter()
        .map(|e| (e.seq, e.gap.map(|g| g.from)))
        .collect()
}

/// Invariant 8 for a contiguous upstream: positions increase, and every
/// sequence from the first stored one on is either an event or inside
/// exactly one marker.
fn assert_contiguous_cover(f: &Fixture) {
    let stored = f.sink.inner.events("s");
    let mut next = stored.first().map_or(0, |e| *e.covers().start());
    for entry in &stored {
        assert_eq!(
            *entry.covers().start(),
            next,
            "covered exactly once: {:?}",
            entries(f)
        );
        next = entry.seq + 1;
    }
}

fn gaps_reported(f: &Fixture) -> Vec<(u64, u64, leasehold_telemetry::GapReason)> {
    f.events
        .snapshot()
        .into_iter()
        .filter_map(|e| match e {
            TelemetryEvent::StreamGap {
                from_seq,
                to_seq,
                reason,
                ..
            } => Some((from_seq, to_seq, reason)),
            _ => None,
        })
        .collect()
}

/// The backfills reported: (result, pages, events).
fn backfills_reported(f: &Fixture) -> Vec<(leasehold_telemetry::BackfillResult, u32, u64)> {
    f.events
        .snapshot()
        .into_iter()
        .filter_map(|e| match e {
            TelemetryEvent::StreamBackfill {
                result,
                pages,
                events,
                ..
            } => Some((result, pages, events)),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn live_mode_starts_at_the_live_position_and_marks_what_a_reconnect_missed() {
    use leasehold_telemetry::GapReason::NoReplay;
    let (f, _) = live_fixture(5_000, ResumeMode::Live);
    f.upstream
        .faults
        .lock()
        .unwrap()
        .extend([Fault::Close { after: 10 }, Fault::Skip { after: 5, by: 3 }]);
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    // A never-written stream: the first event is wherever the upstream is.
    for head in 5_001..=5_010 {
        f.upstream.head.store(head, Ordering::SeqCst);
        sleep(Duration::from_millis(10)).await;
    }
    wait_for(|| sink_seqs(&f).last() == Some(&5_010)).await;
    // The server cut the connection; 20 events pass before the reconnect.
    f.upstream.head.store(5_030, Ordering::SeqCst);
    sleep(Duration::from_secs(6)).await;
    for head in 5_031..=5_045 {
        f.upstream.head.store(head, Ordering::SeqCst);
        sleep(Duration::from_millis(10)).await;
    }
    wait_for(|| sink_seqs(&f).last() == Some(&5_045) && gaps_reported(&f).len() >= 2).await;
    let stored = entries(&f);
    assert!(
        stored[0].0 > 5_000 && stored[0].1.is_none(),
        "no marker before the first event: {stored:?}"
    );
    let markers: Vec<_> = stored.iter().filter(|(_, from)| from.is_some()).collect();
    assert_eq!(markers.len(), 2, "{stored:?}");
    assert_contiguous_cover(&f);
    let reported = gaps_reported(&f);
    assert_eq!(reported.len(), 2, "each marker counted once: {reported:?}");
    assert!(reported.iter().all(|(_, _, reason)| *reason == NoReplay));
    let reconnects = f
        .events
        .snapshot()
        .iter()
        .filter(|e| matches!(e, TelemetryEvent::UpstreamReconnect { .. }))
        .count();
    assert_eq!(reconnects, 1, "a gap never reconnects in live mode");
    task.abort();
}

/// One bogus frame far ahead (1e15) neither moves the stream nor stops it:
/// it is dropped and counted as `reason="jump"`, and the real sequence goes
/// on being written with no gap marker. Without the jump bound the frame
/// would be written after a marker up to 1e15 - 1, and every real event
/// after it dropped as a replay.
#[tokio::test(start_paused = true)]
async fn a_sequence_that_starts_over_goes_on_in_a_new_epoch_after_a_reset_entry() {
    let (f, _) = live_fixture(100, ResumeMode::Live);
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

#[tokio::test(start_paused = true)]
async fn one_bogus_frame_far_ahead_is_dropped_and_the_stream_goes_on() {
    let (f, _) = live_fixture(100, ResumeMode::Live);
    f.upstream.faults.lock().unwrap().push_back(Fault::Bogus {
        after: 5,
        seq: 1_000_000_000_000_000,
    });
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    for head in 101..=120 {
        f.upstream.head.store(head, Ordering::SeqCst);
        sleep(Duration::from_millis(10)).await;
    }
    wait_for(|| sink_seqs(&f).last() == Some(&120)).await;
    let stored = entries(&f);
    assert!(
        stored.iter().all(|(seq, gap)| *seq <= 120 && gap.is_none()),
        "{stored:?}"
    );
    assert_contiguous_cover(&f);
    let jumps = f
        .events
        .snapshot()
        .iter()
        .filter(|e| {
            matches!(
                e,
                TelemetryEvent::UpstreamFrameSkipped {
                    reason: leasehold_telemetry::SkipReason::Jump,
                    ..
                }
            )
        })
        .count();
    assert_eq!(jumps, 1);
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn live_mode_resumes_after_a_marker_and_marks_the_takeover_hole() {
    let (f, _) = live_fixture(100, ResumeMode::Live);
    f.sink.inner.open("s", 1).await.unwrap();
    f.sink
        .inner
        .write(SinkBatch {
            stream_id: "s",
            fence_token: 1,
            events: &[
                SinkEvent::data(40, "s:40", "{}"),
                SinkEvent::gap(41, 60, leasehold_telemetry::GapReason::NoReplay),
            ],
        })
        .await
        .unwrap();
    f.store.register("s", 0).await.unwrap();
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    subscribed(&f, 1).await;
    f.upstream.head.store(103, Ordering::SeqCst);
    wait_for(|| sink_seqs(&f).last() == Some(&103)).await;
    assert_eq!(
        entries(&f),
        [
            (40, None),
            (60, Some(41)),
            (100, Some(61)),
            (101, None),
            (102, None),
            (103, None)
        ]
    );
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn increasing_sequences_never_mark_a_hole() {
    let (f, _) = live_fixture(100, ResumeMode::Live);
    f.upstream.every.store(3, Ordering::SeqCst);
    let context = Arc::new(RunnerContext {
        config: RunnerConfig {
            seq_step: SeqStep::Increasing,
            ..f.context.config.clone()
        },
        keeper: f.context.keeper.clone(),
        upstream: f.context.upstream.clone(),
        sink: f.context.sink.clone(),
        history: None,
        telemetry: f.context.telemetry.clone(),
    });
    f.upstream
        .faults
        .lock()
        .unwrap()
        .push_back(Fault::Close { after: 4 });
    let lease = context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(context, lease, CancellationToken::new()));
    subscribed(&f, 1).await;
    f.upstream.head.store(130, Ordering::SeqCst);
    wait_for(|| sink_seqs(&f).len() == 4).await;
    f.upstream.head.store(145, Ordering::SeqCst);
    subscribed(&f, 2).await;
    f.upstream.head.store(160, Ordering::SeqCst);
    wait_for(|| sink_seqs(&f).last() == Some(&159)).await;
    assert!(
        entries(&f)
            .iter()
            .all(|(seq, gap)| gap.is_none() && seq.is_multiple_of(3))
    );
    assert!(gaps_reported(&f).is_empty());
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn backfill_closes_the_hole_from_history_then_writes_the_held_events() {
    let (f, history) = live_fixture(1_000, ResumeMode::Backfill);
    let history = history.unwrap();
    history.failures.store(1, Ordering::SeqCst);
    f.upstream.faults.lock().unwrap().extend([
        Fault::Close { after: 5 },
        Fault::Close { after: 5 },
        Fault::Close { after: 5 },
    ]);
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    // Three cuts, each followed by 20 events nobody read live.
    for round in 0..4u64 {
        for head in 0..5 {
            f.upstream.head.fetch_add(1, Ordering::SeqCst);
            let _ = head;
            sleep(Duration::from_millis(10)).await;
        }
        let _ = round;
        sleep(Duration::from_millis(200)).await;
        f.upstream.head.fetch_add(20, Ordering::SeqCst);
        sleep(Duration::from_secs(6)).await;
    }
    let head = f.upstream.head.load(Ordering::SeqCst);
    f.upstream.head.fetch_add(3, Ordering::SeqCst);
    wait_for(|| sink_seqs(&f).last() == Some(&(head + 3))).await;
    let first = sink_seqs(&f)[0];
    assert_eq!(
        sink_seqs(&f),
        (first..=head + 3).collect::<Vec<_>>(),
        "0 missing, 0 duplicates, no marker"
    );
    assert!(gaps_reported(&f).is_empty());
    let requests = history.requests.lock().unwrap().clone();
    assert!(requests.len() >= 4, "{requests:?}");
    let stored = f.sink.inner.events("s");
    let from_history = stored
        .iter()
        .filter(|e| e.payload.starts_with("{\"history\""))
        .count() as u64;
    assert!(from_history > 0, "backfilled items are the history's text");
    // The holes are filled by backfills (a hole found while one runs joins
    // it); the failed first request counts as a page.
    let backfills = backfills_reported(&f);
    assert!(!backfills.is_empty(), "{backfills:?}");
    assert!(
        backfills.iter().all(|(result, pages, _)| *result
            == leasehold_telemetry::BackfillResult::Filled
            && *pages >= 1),
        "{backfills:?}"
    );
    assert_eq!(
        backfills.iter().map(|(_, _, events)| events).sum::<u64>(),
        from_history,
        "every event the history supplied is counted once"
    );
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_history_without_the_start_marks_retention_and_a_failing_one_backfill_exhausted() {
    use leasehold_telemetry::GapReason::{BackfillExhausted, Retention};
    for (oldest, failures, reason) in [(25, 0, Retention), (1, 1_000, BackfillExhausted)] {
        let (f, history) = live_fixture(10, ResumeMode::Backfill);
        let history = history.unwrap();
        history.oldest.store(oldest, Ordering::SeqCst);
        history.failures.store(failures, Ordering::SeqCst);
        f.upstream
            .faults
            .lock()
            .unwrap()
            .push_back(Fault::Close { after: 3 });
        let lease = f.context.keeper.acquire("s").await.unwrap();
        let task = tokio::spawn(run_stream(
            f.context.clone(),
            lease,
            CancellationToken::new(),
        ));
        subscribed(&f, 1).await;
        // The feed moves to 40 while the first connection is still open: it
        // delivers 11-13 and closes, so the reconnect starts live at 40
        // whenever it comes (a jittered reconnect that came before the head
        // moved saw 14-40 as live and opened no hole: a flaky test).
        f.upstream.head.store(40, Ordering::SeqCst);
        subscribed(&f, 2).await;
        f.upstream.head.store(41, Ordering::SeqCst);
        // The marker is counted once the runner took the write's outcome.
        wait_for(|| sink_seqs(&f).last() == Some(&41) && !gaps_reported(&f).is_empty()).await;
        assert_contiguous_cover(&f);
        let reported = gaps_reported(&f);
        assert_eq!(reported.len(), 1, "{reported:?}");
        assert_eq!(reported[0].2, reason);
        if reason == Retention {
            assert_eq!((reported[0].0, reported[0].1), (14, 24));
            assert!(sink_seqs(&f).contains(&25), "the rest came from history");
        }
        let backfills = backfills_reported(&f);
        assert_eq!(backfills.len(), 1, "{backfills:?}");
        assert_eq!(backfills[0].0, leasehold_telemetry::BackfillResult::Gap);
        task.abort();
    }
}

/// A stream past seq 900 whose history keeps failing (the hole after 900
/// stays open) while the live feed moves to 1,100, with `bound` applied to
/// its runner; returns after half a second of reading, with the task.
async fn holding_a_hole_open(
    bound: impl FnOnce(&mut RunnerConfig),
) -> (
    Fixture,
    Arc<FakeHistory>,
    tokio::task::JoinHandle<StreamExit>,
) {
    let (mut f, history) = live_fixture(1_000, ResumeMode::Backfill);
    let history = history.unwrap();
    // A history that fails for a long while (and is retried): the hole stays open.
    history.failures.store(u64::MAX, Ordering::SeqCst);
    let context = Arc::get_mut(&mut f.context).unwrap();
    bound(&mut context.config);
    context.history.as_mut().unwrap().1.max_attempts = 1_000;
    let lease = f.context.keeper.acquire("s").await.unwrap();
    f.sink.inner.open("s", lease.fence_token).await.unwrap();
    f.sink
        .inner
        .write(SinkBatch {
            stream_id: "s",
            fence_token: lease.fence_token,
            events: &[SinkEvent::data(900, "s:900", "{}")],
        })
        .await
        .unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    subscribed(&f, 1).await;
    f.upstream.head.store(1_100, Ordering::SeqCst);
    sleep(Duration::from_millis(500)).await;
    (f, history, task)
}

#[tokio::test(start_paused = true)]
async fn reading_pauses_while_the_held_events_are_at_their_bound() {
    let (f, history, task) = holding_a_hole_open(|config| config.backfill_hold_max = 5).await;
    let asked = history.requests.lock().unwrap().clone();
    assert_eq!(asked.first(), Some(&(901, 1_000)), "the hole is fetched");
    // The first live event opened the hole; four more are held, then reading stops.
    let delivered = f.upstream.delivered_total.load(Ordering::SeqCst);
    assert!(
        delivered <= 6,
        "{delivered} live events read while 5 may be held"
    );
    assert_eq!(sink_seqs(&f), [900], "nothing written past the hole");
    assert!(backfills_reported(&f).is_empty(), "still backfilling");
    // The stream stops mid-backfill: reported as stopped, nothing from history.
    task.abort();
    let _ = task.await;
    assert_eq!(
        backfills_reported(&f),
        [(leasehold_telemetry::BackfillResult::Stopped, 0, 0)]
    );
}

/// The same pause when the held frames reach their byte bound first
/// (`STREAM_HOLD_MAX_BYTES`), whatever their count.
#[tokio::test(start_paused = true)]
async fn reading_pauses_while_the_held_bytes_are_at_their_bound() {
    // Each fake frame weighs a few dozen bytes: about three fit.
    let (f, _, task) = holding_a_hole_open(|config| config.hold_max_bytes = 100).await;
    let delivered = f.upstream.delivered_total.load(Ordering::SeqCst);
    assert!(
        delivered <= 6,
        "{delivered} live frames read while 100 bytes may be held"
    );
    assert_eq!(sink_seqs(&f), [900], "nothing written past the hole");
    task.abort();
}

/// The ranges the runner reported the sink lost (`SinkRegression`).
fn regressions(f: &Fixture) -> Vec<(u64, u64)> {
    f.events
        .snapshot()
        .into_iter()
        .filter_map(|event| match event {
            TelemetryEvent::SinkRegression {
                from_seq, to_seq, ..
            } => Some((from_seq, to_seq)),
            _ => None,
        })
        .collect()
}

/// A failover lost the sink's newest six entries: the next write asks for a
/// new open, the open finds the stream behind what was confirmed, the
/// regression is reported, and a `replay` upstream is asked again from the
/// sink's end: each sequence once, in order, nothing silently missing.
#[tokio::test(start_paused = true)]
async fn a_tail_the_sink_lost_in_a_failover_is_refilled_from_the_upstream() {
    let f = fixture(20);
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    wait_for(|| sink_seqs(&f).len() == 20).await;
    f.sink.inner.lose_tail("s", 6);
    f.upstream.head.store(30, Ordering::SeqCst);
    wait_for(|| sink_seqs(&f).last() == Some(&30)).await;
    assert_eq!(sink_seqs(&f), (1..=30).collect::<Vec<_>>());
    assert_eq!(regressions(&f), [(15, 20)]);
    assert_eq!(
        f.upstream.subscribed_from.lock().unwrap().last(),
        Some(&15),
        "asked again from the sink's end"
    );
    task.abort();
}

/// A `live` upstream cannot send the lost tail again: it becomes a
/// `sink_lost` marker in front of the next batch, never a silent hole.
#[tokio::test(start_paused = true)]
async fn a_tail_a_live_upstream_cannot_refill_is_marked_sink_lost() {
    use leasehold_telemetry::GapReason::SinkLost;
    let (f, _) = live_fixture(100, ResumeMode::Live);
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let task = tokio::spawn(run_stream(
        f.context.clone(),
        lease,
        CancellationToken::new(),
    ));
    subscribed(&f, 1).await;
    for head in 101..=110 {
        f.upstream.head.store(head, Ordering::SeqCst);
        sleep(Duration::from_millis(10)).await;
    }
    wait_for(|| sink_seqs(&f).last() == Some(&110)).await;
    f.sink.inner.lose_tail("s", 4);
    f.upstream.head.store(111, Ordering::SeqCst);
    wait_for(|| sink_seqs(&f).last() == Some(&111)).await;
    assert_eq!(
        entries(&f),
        [
            (101, None),
            (102, None),
            (103, None),
            (104, None),
            (105, None),
            (106, None),
            (110, Some(107)),
            (111, None)
        ]
    );
    assert_eq!(regressions(&f), [(107, 110)]);
    assert!(gaps_reported(&f).contains(&(107, 110, SinkLost)));
    task.abort();
}

/// Draining while a refill is under way: what was not refilled yet is marked
/// `sink_lost` before the release (the next owner resumes after the
/// checkpoint, which had passed it).
#[tokio::test(start_paused = true)]
async fn a_drain_during_a_refill_marks_what_was_not_refilled() {
    use leasehold_telemetry::GapReason::SinkLost;
    let f = fixture(20);
    let lease = f.context.keeper.acquire("s").await.unwrap();
    let drain = CancellationToken::new();
    let task = tokio::spawn(run_stream(f.context.clone(), lease, drain.clone()));
    wait_for(|| sink_seqs(&f).len() == 20).await;
    sleep(Duration::from_secs(11)).await;
    assert_eq!(f.store.get("s").await.unwrap().checkpoint, Some(20));
    f.sink.inner.lose_tail("s", 6);
    // Every connection from now on closes at once: the refill cannot start.
    f.upstream
        .faults
        .lock()
        .unwrap()
        .extend((0..50).map(|_| Fault::Close { after: 0 }));
    f.upstream.head.store(21, Ordering::SeqCst);
    wait_for(|| !regressions(&f).is_empty()).await;
    drain.cancel();
    assert_eq!(task.await.unwrap(), StreamExit::Released);
    let stored = f.sink.inner.events("s");
    let last = stored.last().expect("stored");
    assert_eq!(last.seq, 20);
    assert_eq!(last.gap.map(|g| (g.from, g.reason)), Some((15, SinkLost)));
}
