//! Sidecar cost: CPU per 10,000 events/s, and `/metrics` render time with 1,000 streams.
//!
//! ```text
//! cargo bench -p leasehold-sidecar --bench sidecar -- [--seconds 10] [--rate 10000]
//! ```
//! The sidecar runs on its own runtime whose threads are named `sidecar-*`, the
//! event source on another; CPU is summed over the sidecar's threads only
//! (per-thread schedstat), so the figure is the sidecar's own cost.
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

use std::time::{Duration, Instant};

use leasehold_sidecar::{Sidecar, SidecarConfig};
use leasehold_telemetry::testing::every_event;
use leasehold_telemetry::transport::{BufferedShipper, ShipperConfig};
use leasehold_telemetry::{TelemetryEvent, TelemetrySink};
use leasehold_testkit::measure::{arg, thread_cpu_seconds};
use tokio_util::sync::CancellationToken;

fn config() -> SidecarConfig {
    SidecarConfig {
        stream_series_idle: Duration::from_secs(600),
        ..SidecarConfig::loopback()
    }
}

fn main() {
    let seconds = arg("--seconds", 10);
    let rate = arg("--rate", 10_000);
    let sidecar_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("sidecar-rt")
        .enable_all()
        .build()
        .unwrap();
    let source_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("source-rt")
        .enable_all()
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let sidecar = sidecar_runtime
        .block_on(Sidecar::start(config(), shutdown.clone()))
        .unwrap();

    // 1. CPU per 10,000 events/s: a worker-side shipper sends a realistic mix at `rate`.
    let telemetry_addr = sidecar.telemetry_addr.to_string();
    let mix = every_event();
    let (cpu, sent) = source_runtime.block_on(async {
        let shipper = BufferedShipper::start(
            ShipperConfig::new(telemetry_addr, "bench", "bench"),
            shutdown.clone(),
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        let cpu_start = thread_cpu_seconds("sidecar-rt");
        let started = Instant::now();
        let mut sent = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        while started.elapsed() < Duration::from_secs(seconds) {
            tick.tick().await;
            let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
            while sent < due {
                shipper.emit(mix[(sent % mix.len() as u64) as usize].clone());
                sent += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        (thread_cpu_seconds("sidecar-rt") - cpu_start, sent)
    });
    let wall = seconds as f64;
    println!("sidecar ingest: {sent} events at {rate}/s over {wall:.0} s");
    println!(
        "  sidecar CPU            {:.2} % of one core ({:.2} % per 10,000 events/s; target ≤ 5 %)",
        100.0 * cpu / wall,
        100.0 * cpu / wall * 10_000.0 / rate as f64
    );

    // 2. /metrics render time with 1,000 streams' lag series (from a
    // connected worker: a silent one's are not exported).
    sidecar.state.view().connection(true);
    for i in 0..1000 {
        sidecar.state.ingest(&TelemetryEvent::StreamLag {
            stream_id: format!("stream-{i:04}"),
            lag_events: i,
            lag_seconds: i as f64 / 100.0,
            last_event_age_seconds: 0.0,
            event_lag_seconds: None,
        });
    }
    let mut times = Vec::new();
    let mut bytes = 0;
    for _ in 0..50 {
        let started = Instant::now();
        bytes = sidecar.state.render().len();
        times.push(started.elapsed());
    }
    times.sort();
    println!("/metrics render with 1,000 streams ({bytes} bytes):");
    println!(
        "  p50 {:.2} ms, max {:.2} ms (target ≤ 10 ms)",
        times[25].as_secs_f64() * 1e3,
        times[49].as_secs_f64() * 1e3
    );
    shutdown.cancel();
}
