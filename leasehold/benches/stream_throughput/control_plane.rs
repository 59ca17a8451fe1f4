//! The control-plane part of the set: a stream worker with 8 streams on a
//! store that counts its calls by kind, for 20 s. Apart from the throughput
//! cases because it measures store writes, not events.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_control::clock::SystemClock;
use leasehold_control::schema::RESERVED_PREFIX;
use leasehold_control::store::LeaseError;
use leasehold_control::store::intercept::{Intercepted, Interceptor, StoreOp};
use leasehold_control::store::memory::MemoryLeaseStore;
use leasehold_sink::memory::MemorySink;
use leasehold_sink::{FencedSink, SinkOptions};
use leasehold_stream::upstream::{WebSocketUpstream, WebSocketUpstreamConfig};
use leasehold_stream::{RunnerConfig, RunnerContext, StreamWorker, StreamWorkerConfig};
use leasehold_telemetry::LogSink;
use tokio_util::sync::CancellationToken;

use super::keeper_in;
use leasehold_control::settings::LeaseMode;

/// Counts store calls by kind: writes, stream renews among them (not the
/// presence records' renews), reads.
#[derive(Default)]
struct CountingCalls {
    writes: AtomicU64,
    renews: AtomicU64,
    reads: AtomicU64,
}

#[async_trait]
impl Interceptor for CountingCalls {
    async fn before(&self, op: StoreOp<'_>) -> Result<(), LeaseError> {
        if op.is_write() {
            self.writes.fetch_add(1, Ordering::Relaxed);
        } else {
            self.reads.fetch_add(1, Ordering::Relaxed);
        }
        if let StoreOp::Renew { stream_id } = op
            && !stream_id.starts_with(RESERVED_PREFIX)
        {
            self.renews.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Both lease modes: per-stream with 8 streams, session mode with 8 and 64.
pub(super) async fn control_plane_costs(url: &str) {
    control_plane_cost(url, LeaseMode::PerStream, 8).await;
    control_plane_cost(url, LeaseMode::Session, 8).await;
    control_plane_cost(url, LeaseMode::Session, 64).await;
}

async fn control_plane_cost(url: &str, mode: LeaseMode, streams: usize) {
    let store = Arc::new(Intercepted::new(
        Arc::new(MemoryLeaseStore::new()),
        CountingCalls::default(),
    ));
    let counts = store.interceptor();
    let lease = Duration::from_secs(3);
    let context = Arc::new(RunnerContext {
        keeper: keeper_in(
            store.clone(),
            &format!("cost-{}-{streams}", mode.as_str()),
            lease,
            mode,
        ),
        upstream: Arc::new(WebSocketUpstream::new(
            WebSocketUpstreamConfig::for_feed(url),
            Arc::new(LogSink),
        )),
        sink: Arc::new(MemorySink::new(SinkOptions::default())) as Arc<dyn FencedSink>,
        history: None,
        telemetry: Arc::new(LogSink),
        config: RunnerConfig::default(),
    });
    let config = StreamWorkerConfig {
        register: (0..streams)
            .map(|i| format!("cost-{}-{streams}-{i}", mode.as_str()))
            .collect(),
        discovery_interval: Duration::from_secs(5),
        ..StreamWorkerConfig::default()
    };
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(
        StreamWorker::new(context, Arc::new(SystemClock), config).run(shutdown.clone()),
    );
    // Let acquisition settle, then measure a steady window.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (writes0, renews0, reads0) = (
        counts.writes.load(Ordering::Relaxed),
        counts.renews.load(Ordering::Relaxed),
        counts.reads.load(Ordering::Relaxed),
    );
    let window = Duration::from_secs(20);
    tokio::time::sleep(window).await;
    let writes = counts.writes.load(Ordering::Relaxed) - writes0;
    let renews = counts.renews.load(Ordering::Relaxed) - renews0;
    let reads = counts.reads.load(Ordering::Relaxed) - reads0;
    shutdown.cancel();
    let _ = worker.await;
    let renew_periods = window.as_secs_f64() / (lease / 3).as_secs_f64();
    let per_stream_period = writes as f64 / streams as f64 / renew_periods;
    println!(
        "control plane, LEASE_MODE={}, {streams} streams, 3 s lease renewed every 1 s, {:.0} s steady window:",
        mode.as_str(),
        window.as_secs_f64()
    );
    println!(
        "  writes                    {writes} (stream renews {renews}; the rest: presence and session renews)"
    );
    println!(
        "  writes per stream per renew interval  {per_stream_period:.3}  (per-stream renewals alone: 1.00)"
    );
    // Session mode adds one checkpoint per stream per CHECKPOINT_INTERVAL_MS
    // (300 s by default: none in this window), 12 per stream-hour.
    let checkpoints = match mode {
        LeaseMode::PerStream => 0.0,
        LeaseMode::Session => 12.0,
    };
    println!(
        "  => at a 30 s lease renewed every 10 s: {:.1} writes per stream-hour (+ {checkpoints:.0} checkpoints at the default interval; per-stream renewals alone: 360; target ≤ 720)",
        per_stream_period * 360.0
    );
    println!(
        "  reads (doorbell GetItem + scans)  {reads} ({:.1}/s per worker)",
        reads as f64 / window.as_secs_f64()
    );
}
