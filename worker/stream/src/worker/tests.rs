use super::*;

use std::sync::Mutex;

use async_trait::async_trait;
use leasehold_control::clock::PausedClock;
use leasehold_control::keeper::KeeperConfig;
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

#[test]
fn jitter_stays_within_twenty_percent() {
    for _ in 0..100 {
        let factor = jitter();
        assert!((0.8..1.2).contains(&factor), "{factor}");
    }
}
