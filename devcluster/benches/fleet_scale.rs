//! Fleet scale, simulated: 10,000 streams on 100 workers in one process, on
//! the in-memory lease table behind a meter that adds DynamoDB-like latency
//! (p50 5 ms, p99 20 ms) and counts the capacity units each call would cost,
//! on tokio's paused clock (a simulated hour of discovery takes minutes).
//! Production timings: 30 s lease, 5 s discovery, 250 ms doorbell.
//!
//! For `per-stream` and `session` mode, each with every worker scanning and
//! with assigned discovery (workers taking pushed hand-offs on loopback
//! sockets): cold start until every stream is owned, the balance
//! then, a steady window priced per hour and per month, a rolling restart of
//! all 100 workers (how long any stream was without a valid owner), scale-out
//! 100 → 110 (lease moves against the ideal 909) and a crash of 10 workers
//! (until every stream is owned again).
//!
//! ```text
//! cargo bench -p leasehold-devcluster --bench fleet_scale -- --only assigned
//! cargo bench -p leasehold-devcluster --bench fleet_scale -- --streams 2000 --workers 20
//! ```
//! (`--only <text>`: the setups whose name contains it. At 10,000 on 100 the
//! scanning setups take about an hour each on two cores.)
#![allow(clippy::unwrap_used, unreachable_pub)] // a bench: a panic is its report

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold_control::clock::PausedClock;
use leasehold_control::settings::LeaseMode;
use leasehold_devcluster::fleet::{Fleet, FleetOptions, FleetView, Holdings};
use leasehold_devcluster::meter::Units;
use leasehold_platform::percentile::nearest_rank;
use leasehold_stream::worker::DiscoveryMode;
use leasehold_testkit::measure::arg;
use tokio::time::{Instant, sleep};

struct Shape {
    streams: usize,
    workers: usize,
}

#[derive(Default)]
struct Report {
    cold_start: Duration,
    balance: (usize, usize),
    steady_window: Duration,
    steady: Units,
    rolling_max_unowned: Duration,
    rolling_p99_unowned: Duration,
    rolling_gaps: usize,
    rolling_took: Duration,
    rolling_takeovers: u64,
    scale_out_moves: u64,
    scale_out_took: Duration,
    crash_took: Duration,
}

async fn wait_until(fleet: &Fleet, limit: Duration, done: impl Fn(&Holdings) -> bool) -> Duration {
    let start = Instant::now();
    loop {
        let holdings = fleet.holdings().await.unwrap();
        if done(&holdings) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "not reached in {limit:?}: {holdings:?}"
        );
        sleep(Duration::from_millis(250)).await;
    }
}

fn balance(holdings: &Holdings) -> (usize, usize) {
    let counts = holdings.held_by.values();
    (
        counts.clone().min().copied().unwrap_or(0),
        counts.max().copied().unwrap_or(0),
    )
}

/// Samples every stream's owner every 200 ms while `during` runs, and
/// returns how long each stream went without a valid owner, each time it did.
async fn unowned_spells(
    fleet: &FleetView,
    during: impl std::future::Future<Output = ()>,
) -> Vec<Duration> {
    let mut since: BTreeMap<String, Instant> = BTreeMap::new();
    let mut spells = Vec::new();
    let mut during = std::pin::pin!(during);
    let mut finished = false;
    loop {
        let now = Instant::now();
        for (stream, owner) in fleet.owners().await.unwrap() {
            match owner {
                None => {
                    since.entry(stream).or_insert(now);
                }
                Some(_) => {
                    if let Some(start) = since.remove(&stream) {
                        spells.push(now - start);
                    }
                }
            }
        }
        if finished && since.is_empty() {
            return spells;
        }
        tokio::select! {
            _ = &mut during, if !finished => finished = true,
            _ = sleep(Duration::from_millis(200)) => {}
        }
    }
}

/// A lease mode and how workers discover streams.
#[derive(Clone, Copy)]
struct Setup {
    mode: LeaseMode,
    discovery: DiscoveryMode,
}

impl Setup {
    fn name(self) -> String {
        format!("{}, {}", self.mode.as_str(), self.discovery.as_str())
    }
}

async fn simulate(setup: Setup, shape: &Shape) -> Report {
    let options = FleetOptions {
        streams: shape.streams,
        mode: setup.mode,
        discovery: setup.discovery,
        // Assigned discovery has no doorbell: its hand-offs are pushed.
        pushes: setup.discovery == DiscoveryMode::Assigned,
        store_latency: true,
        ..FleetOptions::default()
    };
    let mode = setup;
    let lease = options.lease;
    let mut fleet = Fleet::new(
        options,
        Arc::new(PausedClock::starting_at(1_800_000_000_000)),
    )
    .await
    .unwrap();
    let max_streams = 2 * shape.streams.div_ceil(shape.workers);
    let mut report = Report::default();
    let olds: Vec<String> = (0..shape.workers).map(|i| format!("w{i:03}")).collect();

    // Cold start: the workers start 10 ms apart.
    let start = Instant::now();
    for owner in &olds {
        fleet.start(owner, max_streams);
        sleep(Duration::from_millis(10)).await;
    }
    wait_until(&fleet, Duration::from_secs(600), |h| h.unowned == 0).await;
    report.cold_start = start.elapsed();
    sleep(Duration::from_secs(30)).await;
    report.balance = balance(&fleet.holdings().await.unwrap());

    // Steady state, priced.
    eprintln!(
        "  {}: cold start done after {:.1?}",
        mode.name(),
        report.cold_start
    );
    report.steady_window = Duration::from_secs(120);
    let before = fleet.units();
    sleep(report.steady_window).await;
    report.steady = fleet.units().since(&before);

    // Rolling restart: each worker replaced in turn (the new one first).
    let before = fleet.units();
    let started = Instant::now();
    let news: Vec<String> = (0..shape.workers).map(|i| format!("n{i:03}")).collect();
    let view = fleet.view();
    let restart = async {
        for (old, new) in olds.iter().zip(&news) {
            fleet.start(new, max_streams);
            sleep(Duration::from_secs(2)).await;
            fleet.stop(old).await;
        }
    };
    let mut spells = unowned_spells(&view, restart).await;
    report.rolling_took = started.elapsed();
    eprintln!("  {}: rolling restart done", mode.name());
    report.rolling_takeovers = fleet
        .units()
        .since(&before)
        .calls
        .get("take_over")
        .copied()
        .unwrap_or(0);
    spells.sort();
    report.rolling_gaps = spells.len();
    report.rolling_max_unowned = spells.last().copied().unwrap_or_default();
    report.rolling_p99_unowned = nearest_rank(&spells, 99.0).unwrap_or_default();
    wait_until(&fleet, Duration::from_secs(600), |h| {
        h.balanced(shape.streams, shape.workers)
    })
    .await;

    // Scale-out by a tenth.
    let extra = shape.workers / 10;
    let acquisitions = fleet.holdings().await.unwrap().acquisitions;
    let start = Instant::now();
    for i in 0..extra {
        fleet.start(&format!("x{i:03}"), max_streams);
    }
    let total = shape.workers + extra;
    wait_until(&fleet, Duration::from_secs(900), |h| {
        h.balanced(shape.streams, total)
    })
    .await;
    report.scale_out_took = start.elapsed();
    eprintln!("  {}: scale-out done", mode.name());
    sleep(Duration::from_secs(30)).await;
    report.scale_out_moves = fleet.holdings().await.unwrap().acquisitions - acquisitions;

    // A crash of a tenth of the workers (nothing released): until every
    // stream is held by a live worker again.
    let crashed: Vec<String> = news.iter().take(extra).cloned().collect();
    for owner in &crashed {
        fleet.crash(owner);
    }
    let start = Instant::now();
    wait_until(&fleet, lease * 10, |h| {
        h.unowned == 0 && crashed.iter().all(|c| !h.held_by.contains_key(c))
    })
    .await;
    report.crash_took = start.elapsed();
    fleet.stop_all().await;
    report
}

fn main() {
    let shape = Shape {
        streams: arg("--streams", 10_000) as usize,
        workers: arg("--workers", 100) as usize,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let mut reports = Vec::new();
    let setups = [
        (LeaseMode::PerStream, DiscoveryMode::Scan),
        (LeaseMode::Session, DiscoveryMode::Scan),
        (LeaseMode::PerStream, DiscoveryMode::Assigned),
        (LeaseMode::Session, DiscoveryMode::Assigned),
    ];
    let only = std::env::args().skip_while(|a| a != "--only").nth(1);
    for (mode, discovery) in setups {
        let setup = Setup { mode, discovery };
        if only
            .as_ref()
            .is_some_and(|only| !setup.name().contains(only.as_str()))
        {
            continue;
        }
        let wall = std::time::Instant::now();
        let report = runtime.block_on(simulate(setup, &shape));
        eprintln!("{}: simulated in {:.0?}", setup.name(), wall.elapsed());
        reports.push((setup, report));
    }
    let ideal = shape.streams * (shape.workers / 10) / (shape.workers + shape.workers / 10);
    println!(
        "fleet scale, {} streams on {} workers, 30 s lease, 5 s discovery, store latency p50 5 ms / p99 20 ms, simulated time:",
        shape.streams, shape.workers
    );
    println!(
        "| figure | {} |",
        reports
            .iter()
            .map(|(m, _)| m.name())
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|{}", "---|".repeat(reports.len()));
    let row = |name: &str, cell: &dyn Fn(&Report) -> String| {
        println!(
            "| {name} | {} |",
            reports
                .iter()
                .map(|(_, r)| cell(r))
                .collect::<Vec<_>>()
                .join(" | ")
        );
    };
    let hour = |r: &Report| 3600.0 / r.steady_window.as_secs_f64();
    row("cold start: every stream owned after", &|r| {
        format!("{:.1?}", r.cold_start)
    });
    row("balance 30 s later (min / max per worker)", &|r| {
        format!("{} / {}", r.balance.0, r.balance.1)
    });
    row("write units per hour (steady)", &|r| {
        format!("{:.0}", r.steady.writes * hour(r))
    });
    row("write units per stream-hour", &|r| {
        format!("{:.1}", r.steady.writes * hour(r) / shape.streams as f64)
    });
    row("read units per hour (steady)", &|r| {
        format!("{:.0}", r.steady.reads * hour(r))
    });
    row("lease table, $ per month (on demand)", &|r| {
        format!("{:.0}", r.steady.monthly_cost(r.steady_window))
    });
    // The upstreams are silent, so nothing is checkpointed in the window; with
    // traffic session mode adds one write per stream per CHECKPOINT_INTERVAL_MS
    // (5 min: 12 an hour), per-stream mode none (they ride on renewals).
    row(
        "… with traffic (session: + 12 checkpoints per stream-hour)",
        &|r| {
            let mut units = r.steady.clone();
            if r.steady.calls.get("renew").copied().unwrap_or(0) < shape.streams as u64 {
                units.writes +=
                    12.0 * shape.streams as f64 * r.steady_window.as_secs_f64() / 3600.0;
            }
            format!("{:.0}", units.monthly_cost(r.steady_window))
        },
    );
    row("rolling restart of every worker took", &|r| {
        format!("{:.0?}", r.rolling_took)
    });
    row("rolling restart: times a stream was unowned", &|r| {
        r.rolling_gaps.to_string()
    });
    row("rolling restart: unowned p99 / max", &|r| {
        format!(
            "{:.1?} / {:.1?}",
            r.rolling_p99_unowned, r.rolling_max_unowned
        )
    });
    row("rolling restart: takeover transactions", &|r| {
        r.rolling_takeovers.to_string()
    });
    row(
        &format!("scale-out +10 %: lease moves (ideal {ideal})"),
        &|r| r.scale_out_moves.to_string(),
    );
    row("scale-out: balanced after", &|r| {
        format!("{:.1?}", r.scale_out_took)
    });
    row(
        "crash of 10 % of the workers: every stream owned after",
        &|r| format!("{:.1?}", r.crash_took),
    );
}
