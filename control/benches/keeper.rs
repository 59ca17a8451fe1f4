//! The lease keeper holding many leases on the in-memory store.
//!
//! Prints CPU used per second of wall time (all threads, from the kernel's
//! per-thread schedstat) and how late each renew fires versus its schedule.
//!
//! ```text
//! cargo bench -p leasehold-control --bench keeper -- [--leases 10000] [--seconds 60]
//!     [--lease-seconds 30] [--aligned]
//! ```
//! By default acquisitions are spread over one renew interval, as they are when
//! a worker picks streams up over time; `--aligned` acquires all at once so every
//! renew of a round is due at the same instant (the worst burst).
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_control::clock::SystemClock;
use leasehold_control::keeper::{KeeperConfig, LeaseKeeper};
use leasehold_control::store::memory::MemoryLeaseStore;
use leasehold_telemetry::{TelemetryEvent, TelemetrySink};
use leasehold_testkit::measure::{arg, percentile, process_cpu_seconds, rss_kib};
use tokio::time::Instant;

/// Keeps renew lateness, drops everything else (as cheap as a real buffer push).
#[derive(Default)]
struct LatenessSink {
    lateness: Mutex<Vec<Duration>>,
    failures: Mutex<usize>,
}

impl TelemetrySink for LatenessSink {
    fn emit(&self, event: TelemetryEvent) {
        match event {
            TelemetryEvent::LeaseRenewed { lateness, .. } => {
                self.lateness.lock().unwrap().push(lateness)
            }
            TelemetryEvent::LeaseRenewFailed { .. } | TelemetryEvent::LeaseLost { .. } => {
                *self.failures.lock().unwrap() += 1
            }
            _ => {}
        }
    }
}

fn main() {
    let leases = arg("--leases", 10_000);
    let seconds = arg("--seconds", 60);
    let lease_seconds = arg("--lease-seconds", 30);
    let aligned = std::env::args().any(|a| a == "--aligned");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let sink = Arc::new(LatenessSink::default());
        let config = KeeperConfig {
            owner_id: "bench".into(),
            lease: Duration::from_secs(lease_seconds),
            renew_interval: Duration::from_millis(lease_seconds * 1000 / 3),
            safety_margin: Duration::from_millis(lease_seconds * 100),
            ..KeeperConfig::default()
        };
        let interval = config.renew_interval;
        let keeper = LeaseKeeper::new(Arc::new(MemoryLeaseStore::new()), Arc::new(SystemClock), sink.clone(), config);
        let rss_start = rss_kib("self");
        let start = Instant::now();
        for i in 0..leases {
            keeper.acquire(&format!("bench-{i:05}")).await.expect("acquire");
            if !aligned {
                tokio::time::sleep_until(start + interval.mul_f64(i as f64 / leases as f64)).await;
            }
        }
        let rss_held = rss_kib("self");
        sink.lateness.lock().unwrap().clear();
        let cpu_start = process_cpu_seconds();
        let wall_start = Instant::now();
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let wall = wall_start.elapsed().as_secs_f64();
        let cpu = process_cpu_seconds() - cpu_start;
        let mut lateness = std::mem::take(&mut *sink.lateness.lock().unwrap());
        lateness.sort();
        let held = keeper.held().len();
        println!("keeper bench: {leases} leases, lease {lease_seconds} s, renew every {interval:?}, {} acquisition", if aligned { "aligned" } else { "staggered" });
        println!("  measured over        {wall:.1} s wall");
        println!("  leases still held    {held}");
        println!("  renews confirmed     {} ({:.0}/s)", lateness.len(), lateness.len() as f64 / wall);
        println!("  renew failures/loss  {}", sink.failures.lock().unwrap());
        println!("  CPU per wall second  {:.2} % of one core", 100.0 * cpu / wall);
        println!("  renew lateness p50   {:.3} ms", percentile(&mut lateness, 50.0).as_secs_f64() * 1e3);
        println!("  renew lateness p99   {:.3} ms", percentile(&mut lateness, 99.0).as_secs_f64() * 1e3);
        println!("  renew lateness max   {:.3} ms", lateness.last().copied().unwrap_or_default().as_secs_f64() * 1e3);
        println!("  RSS for the leases   {} KiB ({:.2} KiB per lease)", rss_held.saturating_sub(rss_start), rss_held.saturating_sub(rss_start) as f64 / leases as f64);
    });
}
