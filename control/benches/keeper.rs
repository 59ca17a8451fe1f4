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

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_control::clock::SystemClock;
use leasehold_control::keeper::{KeeperConfig, LeaseKeeper};
use leasehold_control::store::memory::MemoryLeaseStore;
use leasehold_control::telemetry::{TelemetryEvent, TelemetrySink};
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

/// CPU time of every thread of this process, in seconds.
fn process_cpu_seconds() -> f64 {
    let mut nanos: u64 = 0;
    for task in std::fs::read_dir("/proc/self/task")
        .expect("procfs")
        .flatten()
    {
        if let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) {
            nanos += stat
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    nanos as f64 / 1e9
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
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
        let rss_start = rss_kib();
        let start = Instant::now();
        for i in 0..leases {
            keeper.acquire(&format!("bench-{i:05}")).await.expect("acquire");
            if !aligned {
                tokio::time::sleep_until(start + interval.mul_f64(i as f64 / leases as f64)).await;
            }
        }
        let rss_held = rss_kib();
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
        println!("  renew lateness p50   {:.3} ms", percentile(&lateness, 50.0).as_secs_f64() * 1e3);
        println!("  renew lateness p99   {:.3} ms", percentile(&lateness, 99.0).as_secs_f64() * 1e3);
        println!("  renew lateness max   {:.3} ms", lateness.last().copied().unwrap_or_default().as_secs_f64() * 1e3);
        println!("  RSS for the leases   {} KiB ({:.2} KiB per lease)", rss_held.saturating_sub(rss_start), rss_held.saturating_sub(rss_start) as f64 / leases as f64);
    });
}
