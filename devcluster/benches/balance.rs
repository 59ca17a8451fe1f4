//! Lease moves and convergence time of the stream workers' balancing, with the
//! production timings (30 s lease, 5 s discovery, 250 ms doorbell poll), on
//! tokio's paused clock: whole workers on one in-memory table, silent
//! upstreams, every acquisition counted from the fence tokens.
//!
//! ```text
//! cargo bench -p leasehold-devcluster --bench balance
//! ```
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

use std::sync::Arc;
use std::time::Duration;

use leasehold_control::clock::PausedClock;
use leasehold_devcluster::fleet::{Fleet, FleetOptions, Holdings};
use tokio::time::Instant;

const STREAMS: usize = 100;
const TRIALS: usize = 10;

async fn fleet() -> Fleet {
    let options = FleetOptions {
        streams: STREAMS,
        ..FleetOptions::default()
    };
    Fleet::new(
        options,
        Arc::new(PausedClock::starting_at(1_700_000_000_000)),
    )
    .await
    .expect("fleet")
}

async fn acquisitions(fleet: &Fleet) -> u64 {
    fleet.holdings().await.expect("holdings").acquisitions
}

/// Simulated time until `workers` hold every stream evenly.
async fn until_balanced(fleet: &Fleet, workers: usize) -> Duration {
    let start = Instant::now();
    loop {
        let holdings: Holdings = fleet.holdings().await.expect("holdings");
        if holdings.balanced(STREAMS, workers) {
            return start.elapsed();
        }
        assert!(start.elapsed() < Duration::from_secs(300), "{holdings:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

struct Trial {
    moves: u64,
    took: Duration,
}

/// Four workers balanced, a fifth joins.
async fn scale_out() -> Trial {
    let mut fleet = fleet().await;
    for owner in ["w1", "w2", "w3", "w4"] {
        fleet.start(owner, 100);
    }
    until_balanced(&fleet, 4).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let before = acquisitions(&fleet).await;
    fleet.start("w5", 100);
    let took = until_balanced(&fleet, 5).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let moves = acquisitions(&fleet).await - before;
    fleet.stop_all().await;
    Trial { moves, took }
}

/// Four workers started `apart` from each other on an empty fleet; moves
/// beyond the first 100 acquisitions. Started together, the ideal is none;
/// started one by one, each arrival ideally takes its share from the others:
/// 100/2 + 100/3 + 100/4 = 108 (rounded down).
async fn cold_start(apart: Duration) -> Trial {
    let mut fleet = fleet().await;
    let start = Instant::now();
    for (index, owner) in ["w1", "w2", "w3", "w4"].into_iter().enumerate() {
        if index > 0 {
            tokio::time::sleep(apart).await;
        }
        fleet.start(owner, 100);
    }
    until_balanced(&fleet, 4).await;
    let took = start.elapsed();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let moves = acquisitions(&fleet).await - STREAMS as u64;
    fleet.stop_all().await;
    Trial { moves, took }
}

/// Five workers balanced, one crashes (nothing released).
async fn crash() -> Trial {
    let mut fleet = fleet().await;
    for owner in ["w1", "w2", "w3", "w4", "w5"] {
        fleet.start(owner, 100);
    }
    until_balanced(&fleet, 5).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let before = acquisitions(&fleet).await;
    fleet.crash("w3");
    let took = until_balanced(&fleet, 4).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let moves = acquisitions(&fleet).await - before;
    fleet.stop_all().await;
    Trial { moves, took }
}

fn report(name: &str, ideal: u64, trials: &[Trial]) {
    let moves: Vec<u64> = trials.iter().map(|t| t.moves).collect();
    let mut took: Vec<Duration> = trials.iter().map(|t| t.took).collect();
    took.sort();
    println!(
        "  {name:<44} moves min {:>3} max {:>3} (ideal {ideal:>3})  balanced after: median {:>6.2?} max {:>6.2?}",
        moves.iter().min().unwrap_or(&0),
        moves.iter().max().unwrap_or(&0),
        took[took.len() / 2],
        took[took.len() - 1],
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    runtime.block_on(async {
        println!(
            "balancing, {STREAMS} streams, {TRIALS} trials each, production timings, simulated time:"
        );
        let mut trials = Vec::new();
        for _ in 0..TRIALS {
            trials.push(scale_out().await);
        }
        report("scale-out 4 → 5 workers", 20, &trials);
        let mut trials = Vec::new();
        for _ in 0..TRIALS {
            trials.push(crash().await);
        }
        report("crash of 1 of 5 workers (30 s lease)", 20, &trials);
        for apart in [Duration::ZERO, Duration::from_secs(1)] {
            let mut trials = Vec::new();
            for _ in 0..TRIALS {
                trials.push(cold_start(apart).await);
            }
            let ideal = if apart.is_zero() {
                0
            } else {
                (2..=4).map(|workers| (STREAMS / workers) as u64).sum()
            };
            report(
                &format!("cold start, 4 workers {apart:?} apart (after the first 100)"),
                ideal,
                &trials,
            );
        }
    });
}
