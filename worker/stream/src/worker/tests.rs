use super::*;

use std::sync::Mutex;

use async_trait::async_trait;
use leasehold_control::clock::PausedClock;
use leasehold_control::keeper::KeeperConfig;
use leasehold_control::store::LeaseReader;
use leasehold_control::store::intercept::{Intercepted, Interceptor, StoreOp};
use leasehold_control::store::memory::MemoryLeaseStore;
use leasehold_sink::SinkOptions;
use leasehold_sink::memory::MemorySink;
use leasehold_telemetry::LogSink;

use crate::RunnerConfig;
use crate::upstream::WebSocketUpstreamConfig;

/// The consistency of every scan's first page, in order.
#[derive(Clone, Default)]
struct Scans(Arc<Mutex<Vec<Consistency>>>);

#[async_trait]
impl Interceptor for Scans {
    async fn before(&self, op: StoreOp<'_>) -> Result<(), LeaseError> {
        if let StoreOp::List {
            start_after: None,
            consistency,
            ..
        } = op
        {
            self.0.lock().unwrap().push(consistency);
        }
        Ok(())
    }
}

/// Periodic scans read eventually consistent (half the read units); the
/// first scan and one the doorbell rang for read strongly consistent, so
/// a release is never missed for a whole interval.
#[tokio::test(start_paused = true)]
async fn only_scans_asked_for_read_strongly_consistent() {
    let table = Arc::new(MemoryLeaseStore::new());
    let scans = Scans::default();
    let clock = Arc::new(PausedClock::starting_at(1_700_000_000_000));
    let keeper = LeaseKeeper::new(
        Arc::new(Intercepted::new(table.clone(), scans.clone())),
        clock.clone(),
        Arc::new(LogSink),
        KeeperConfig {
            owner_id: "w".into(),
            ..KeeperConfig::default()
        },
    );
    let context = Arc::new(RunnerContext {
        keeper,
        // Never connected: the table holds no stream.
        upstream: Arc::new(WebSocketUpstream::new(
            WebSocketUpstreamConfig::for_feed("ws://127.0.0.1:9/"),
            Arc::new(LogSink),
        )),
        sink: Arc::new(MemorySink::new(SinkOptions::default())),
        history: None,
        telemetry: Arc::new(LogSink),
        config: RunnerConfig::default(),
    });
    let worker = StreamWorker::new(context, clock.clone(), StreamWorkerConfig::default());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(worker.run(shutdown.clone()));
    // The first scan, then three or four periodic ones (5 s ± 20 %).
    tokio::time::sleep(Duration::from_secs(21)).await;
    let periodic = scans.0.lock().unwrap().clone();
    assert_eq!(periodic.first(), Some(&Consistency::Strong), "{periodic:?}");
    assert!(periodic.len() >= 4, "{periodic:?}");
    assert!(
        periodic[1..].iter().all(|c| *c == Consistency::Eventual),
        "{periodic:?}"
    );
    // A peer rings the doorbell: the rescan within one poll is strong.
    table.bump(HANDOFF_DOORBELL, clock.now_ms()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    // A periodic scan may fall due in the poll's 250 ms first; the rescan
    // the doorbell asked for is the last one either way.
    let after = scans.0.lock().unwrap().clone();
    assert!(after.len() > periodic.len(), "{after:?}");
    assert_eq!(after.last(), Some(&Consistency::Strong), "{after:?}");
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// A stream a graceful hand-off released to another worker (`handed_to`)
/// is left to that worker for one discovery interval: a scanning peer
/// would start it cold, with a gap on a live upstream, while the named
/// successor subscribed ahead. After the interval anyone takes it (the
/// successor may have died); a plain release is taken at once.
#[tokio::test(start_paused = true)]
async fn a_stream_released_to_another_worker_is_left_to_it_for_an_interval() {
    for successor in [Some("heir"), None] {
        let table = Arc::new(MemoryLeaseStore::new());
        let clock = Arc::new(PausedClock::starting_at(1_700_000_000_000));
        let old = table
            .acquire(&leasehold_testkit::lease_store::acquire(
                "s",
                "old",
                clock.now_ms(),
            ))
            .await
            .unwrap();
        table
            .release(&leasehold_control::store::ReleaseRequest {
                stream_id: "s".into(),
                owner_id: "old".into(),
                fence_token: old.fence_token,
                now_ms: clock.now_ms(),
                checkpoint: None,
                successor: successor.map(str::to_owned),
            })
            .await
            .unwrap();
        let keeper = LeaseKeeper::new(
            table.clone(),
            clock.clone(),
            Arc::new(LogSink),
            KeeperConfig {
                owner_id: "w".into(),
                ..KeeperConfig::default()
            },
        );
        let context = Arc::new(RunnerContext {
            keeper,
            upstream: Arc::new(WebSocketUpstream::new(
                WebSocketUpstreamConfig::for_feed("ws://127.0.0.1:9/"),
                Arc::new(LogSink),
            )),
            sink: Arc::new(MemorySink::new(SinkOptions::default())),
            history: None,
            telemetry: Arc::new(LogSink),
            config: RunnerConfig::default(),
        });
        let config = StreamWorkerConfig {
            discovery_interval: Duration::from_secs(5),
            ..StreamWorkerConfig::default()
        };
        let worker = StreamWorker::new(context, clock.clone(), config);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(worker.run(shutdown.clone()));
        tokio::time::sleep(Duration::from_secs(3)).await;
        let owner = table.get("s").await.unwrap().owner_id;
        match successor {
            Some(_) => assert_eq!(owner, None, "left to the named successor"),
            None => assert_eq!(
                owner.as_deref(),
                Some("w"),
                "a plain release is free at once"
            ),
        }
        // Past the interval, at the next scan (5 s ± 20 %), it is anyone's.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let owner = table.get("s").await.unwrap().owner_id;
        assert_eq!(owner.as_deref(), Some("w"), "{successor:?}");
        shutdown.cancel();
        task.await.unwrap().unwrap();
    }
}

#[test]
fn jitter_stays_within_twenty_percent() {
    for _ in 0..100 {
        let factor = jitter();
        assert!((0.8..1.2).contains(&factor), "{factor}");
    }
}
