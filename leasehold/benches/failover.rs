//! Hand-off and takeover times with real processes (moto, Redis, feed, workers).
//!
//! ```text
//! scripts/bench.sh            # starts the servers, runs every benchmark
//! ```
//! Graceful hand-off: SIGTERM to a worker → each of its streams owned by another
//! worker. Crash takeover: SIGKILL → each of its streams owned by another worker,
//! as a ratio to the lease duration (3 s here; the protocol scales with it).
//! Every round ends with the sink checked for gaps, duplicates and stale tokens.
//! Then the replay after a busy owner's SIGKILL at 1k, 5k and 20k events/s.
//! Workers take pushed hand-offs (`HANDOFF_LISTEN`, as the shipped task
//! definition does); `--push 0` measures the doorbell path alone, and
//! `--session 1` runs the workers in `LEASE_MODE=session`.
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use leasehold_testkit::measure::{arg, percentile};
use support::{BusyTakeover, Cluster, LEASE_SECONDS};

const ROUNDS: usize = 6;

fn held_by(owners: &BTreeMap<String, String>, worker: &str) -> Vec<String> {
    owners
        .iter()
        .filter(|(_, o)| o.as_str() == worker)
        .map(|(s, _)| s.clone())
        .collect()
}

/// When another worker's log says it acquired `stream` from `worker`, at or
/// after `after` (the worker logs the acquire once the conditional write has
/// succeeded).
fn taken_at(
    cluster: &Cluster,
    worker: &str,
    stream: &str,
    after: SystemTime,
) -> Option<SystemTime> {
    let stream_field = format!("stream_id=\"{stream}\"");
    let previous_field = format!("previous_owner=\"{worker}\"");
    cluster
        .workers
        .iter()
        .filter(|(name, _)| name.as_str() != worker)
        .flat_map(|(_, proc)| {
            proc.output()
                .lines()
                .filter(|line| {
                    line.contains("lease acquired")
                        && line.contains(&stream_field)
                        && line.contains(&previous_field)
                })
                .filter_map(|line| humantime::parse_rfc3339(line.split_whitespace().next()?).ok())
                .collect::<Vec<_>>()
        })
        .filter(|at| *at >= after)
        .min()
}

/// Signals `worker` and records, per stream it held, the time until another
/// owner has it. The time comes from the new owner's own log line, not from
/// polling the table: a poll every few milliseconds was most of the load on
/// the one-request-at-a-time DynamoDB stand-in, and it slowed the very calls
/// it timed (and added up to one poll to each figure).
async fn measure(cluster: &mut Cluster, worker: &str, signal: &str) -> Vec<Duration> {
    let held = held_by(&cluster.owners().await, worker);
    let sent = SystemTime::now();
    let started = Instant::now();
    cluster.workers[worker].signal(signal);
    let mut times = Vec::new();
    let mut pending = held;
    while !pending.is_empty() {
        pending.retain(|stream| match taken_at(cluster, worker, stream, sent) {
            Some(at) => {
                times.push(at.duration_since(sent).unwrap_or_default());
                false
            }
            None => true,
        });
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{pending:?} never taken over"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut gone = cluster.workers.remove(worker).expect("worker");
    gone.wait_exit(Duration::from_secs(15));
    times
}

async fn balanced(cluster: &Cluster, workers: usize) {
    let streams = cluster.streams.len();
    cluster
        .wait_owners(Duration::from_secs(60), |owners| {
            let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
            for owner in owners.values() {
                *counts.entry(owner.as_str()).or_default() += 1;
            }
            owners.len() == streams
                && counts.len() == workers
                && counts.values().all(|c| *c >= streams / workers)
        })
        .await;
}

fn report(name: &str, times: &mut [Duration], lease: Option<Duration>) {
    let p50 = percentile(times, 50.0);
    let p99 = percentile(times, 99.0);
    match lease {
        Some(lease) => println!(
            "  {name:<22} n={:<3} p50 {p50:>8.3?} ({:.2} × lease)  p99 {p99:>8.3?} ({:.2} × lease)",
            times.len(),
            p50.as_secs_f64() / lease.as_secs_f64(),
            p99.as_secs_f64() / lease.as_secs_f64()
        ),
        None => println!(
            "  {name:<22} n={:<3} p50 {p50:>8.3?}  p99 {p99:>8.3?}",
            times.len()
        ),
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let Some(mut cluster) = Cluster::start(8, 100).await else {
            eprintln!("servers not configured; run scripts/bench.sh");
            std::process::exit(2);
        };
        let push = arg("--push", 1) == 1;
        // `--session 1`: the workers run LEASE_MODE=session (the replay part,
        // which starts its own cluster, is skipped).
        let session = arg("--session", 0) == 1;
        let mut overrides = Vec::new();
        if push {
            overrides.push(("HANDOFF_LISTEN", "127.0.0.1:0"));
        }
        if session {
            overrides.push(("LEASE_MODE", "session"));
        }
        let mut next = 0;
        let mut spawn = |cluster: &mut Cluster| {
            next += 1;
            let name = format!("w{next}");
            cluster.start_worker_with(&name, &overrides);
            name
        };
        let mut workers: Vec<String> = (0..4).map(|_| spawn(&mut cluster)).collect();
        balanced(&cluster, 4).await;
        let mut handoffs = Vec::new();
        let mut takeovers = Vec::new();
        for round in 0..ROUNDS {
            // A rolling deploy step: a new worker joins, then the oldest drains.
            workers.push(spawn(&mut cluster));
            balanced(&cluster, 5).await;
            let oldest = workers.remove(0);
            handoffs.extend(measure(&mut cluster, &oldest, "TERM").await);
            balanced(&cluster, 4).await;
            // A crash: one worker dies without a word; a replacement starts afterwards.
            let victim = workers.remove(round % workers.len());
            takeovers.extend(measure(&mut cluster, &victim, "KILL").await);
            workers.push(spawn(&mut cluster));
            balanced(&cluster, 4).await;
        }
        cluster.stop_workers();
        for stream in &cluster.streams {
            cluster.verify_sink(stream).await;
        }
        let path = if push { "pushed hand-offs" } else { "doorbell only" };
        let mode = if session { "session" } else { "per-stream" };
        println!("fail-over, 8 streams over 4 workers, lease {LEASE_SECONDS} s, {ROUNDS} rounds, {path}, LEASE_MODE={mode} (sinks verified: no gap, no duplicate, no stale token):");
        report("graceful hand-off", &mut handoffs, None);
        report("crash takeover", &mut takeovers, Some(Duration::from_secs(LEASE_SECONDS)));
        drop(cluster);
        if session {
            return;
        }
        // Replay after a busy owner's crash: what a resume from the checkpoint
        // alone would append again, against the sink-led resume's nothing.
        println!("replay after a takeover, 2 streams, 10 s lease renewed every ~3.3 s, SIGKILL of one owner:");
        for rate in [1_000, 5_000, 20_000] {
            let takeover = BusyTakeover::run(rate).await.expect("servers");
            for stream in &takeover.cluster.streams {
                takeover.cluster.verify_sink(stream).await;
            }
            println!(
                "  {rate:>6} events/s: checkpoint {} events ({:.2} s) behind the sink at the kill; new owner wrote {} events, re-appended 0 (sinks verified)",
                takeover.past_checkpoint,
                takeover.past_checkpoint as f64 / f64::from(rate),
                takeover.new_owner_wrote,
            );
        }
    });
}
