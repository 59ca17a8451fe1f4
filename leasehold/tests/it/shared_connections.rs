//! Many held streams on few connections (`UPSTREAM_STREAMS_PER_CONNECTION`),
//! against the fake Binance combined stream (`/stream`, subscribe on the
//! socket, frames wrapped `{"stream","data"}`): a real `leasehold
//! stream-worker` with its sidecar, moto and Redis.
//!
//! One worker holds 200 diff-depth streams, 50 a connection: the fake accepts
//! exactly 4 connections, closes none for its limits (5 messages a second,
//! 1,024 streams a connection), and every stream's sink starts with a REST
//! snapshot and then holds diffs, with no gap. Then a newcomer takes one
//! stream over: it leaves w1's connection and the 199 others go on
//! undisturbed (no reconnect, no resync, no gap).

use std::time::{Duration, Instant};

use crate::support::{Cluster, serial};
use leasehold_feed::exchange::{ExchangeConfig, ExchangeServer, ExchangeShape};
use tokio_util::sync::CancellationToken;

const STREAMS: usize = 200;
const PER_CONNECTION: usize = 50;
/// Book updates per second per symbol: 200 streams must fit two cores.
const RATE: f64 = 5.0;
/// Diff entries every stream must hold after its snapshot.
const DIFFS: usize = 3;

/// 200 symbols never used before (the Redis sink outlives the run), Binance
/// stream spelling.
fn symbols() -> Vec<String> {
    let n = leasehold_testkit::unique_name("x")
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64))
        % 1_000_000_000;
    (0..STREAMS).map(|i| format!("x{n}s{i}usdt")).collect()
}

async fn metrics(cluster: &Cluster, owner: &str) -> String {
    let (_, _, body) = leasehold_testkit::http_get(&cluster.sidecars[owner].http, "/metrics")
        .await
        .expect("sidecar answers");
    body
}

/// The sum of every sample of `name` in a Prometheus text body.
fn total(body: &str, name: &str) -> u64 {
    body.lines()
        .filter(|line| line.starts_with(name) && !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_carries_200_streams_on_4_connections() {
    let _serial = serial().await;
    let shutdown = CancellationToken::new();
    let config = ExchangeConfig {
        shape: ExchangeShape::BinanceDepth,
        rate: RATE,
        ..ExchangeConfig::default()
    };
    let server = ExchangeServer::start(([127, 0, 0, 1], 0).into(), config, shutdown.clone())
        .await
        .expect("fake exchange starts");
    let streams = symbols();
    let Some(mut cluster) =
        Cluster::start_on(server.combined_url().unwrap(), streams.clone()).await
    else {
        return;
    };
    let mut settings = server.worked_settings_shared(PER_CONNECTION);
    settings.push(("MAX_STREAMS", (STREAMS + 50).to_string()));
    // The harness's 3 s leases: renewing 200 of them on moto with two cores
    // misses deadlines (seen: leases lost with `deadline_passed`), which is
    // not what this test is about.
    settings.push(("LEASE_SECONDS", "20".to_owned()));
    let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let started = Instant::now();
    cluster.start_worker_with_sidecar("w1", &settings);

    let owned = cluster
        .wait_owners(Duration::from_secs(60), |owners| {
            owners.len() == STREAMS && owners.values().all(|o| o == "w1")
        })
        .await;
    eprintln!("all {STREAMS} streams owned by w1 after {owned:?}");

    // Every stream: a snapshot, then diffs.
    let mut waiting: Vec<&String> = streams.iter().collect();
    while !waiting.is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "{} streams without a snapshot and {DIFFS} diffs, e.g. {:?}: {:?}\naccepted {}, messages {}, limit closes {}\n{}",
            waiting.len(),
            waiting[0],
            cluster.sink_entries(waiting[0]).await.len(),
            server.connections_accepted(),
            server.messages_received(),
            server.limit_closes(),
            cluster.logs()
        );
        let mut still = Vec::new();
        for stream in waiting {
            let entries = cluster.sink_entries(stream).await;
            if entries.iter().filter(|e| !e.snapshot).count() < DIFFS {
                still.push(stream);
            }
        }
        waiting = still;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!(
        "every stream has a snapshot and {DIFFS} diffs after {:?}",
        started.elapsed()
    );
    // A little longer: nothing is cut or resubscribed later.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let accepted = server.connections_accepted();
    let messages = server.messages_received();
    let limit_closes = server.limit_closes();
    let body = metrics(&cluster, "w1").await;
    let reconnects = total(&body, "leasehold_websocket_reconnects_total");
    let snapshots = total(&body, "leasehold_stream_snapshots_total");
    let gaps = total(&body, "leasehold_stream_gaps_total");
    let control = total(&body, "leasehold_upstream_frames_skipped_total");
    eprintln!(
        "fake: {accepted} connections, {messages} messages received, {limit_closes} closed for a limit, {} cut, {} snapshot requests; worker: {reconnects} reconnects, {snapshots} snapshots, {gaps} gaps, {control} frames skipped",
        server.cuts(),
        server.history_requests()
    );
    assert_eq!(
        limit_closes,
        0,
        "the fake closed connections for a limit\n{}",
        cluster.logs()
    );
    assert_eq!(
        accepted,
        STREAMS.div_ceil(PER_CONNECTION) as u64,
        "connections accepted\n{}",
        cluster.logs()
    );
    assert_eq!(server.cuts(), 0);
    assert_eq!(reconnects, 0, "{body}");
    // One snapshot request per stream, no retry.
    assert_eq!(server.history_requests(), STREAMS as u64);
    // Subscribes (batched, at most 4 a second per connection) and nothing
    // else but pings: far fewer messages than streams.
    assert!(
        messages >= accepted && messages < STREAMS as u64,
        "{messages} messages"
    );

    // A newcomer with room for one stream: the balancer hands one back to
    // it. It leaves its shared connection (unsubscribed); the 199 others on
    // w1's connections are not disturbed.
    let mut newcomer = settings.clone();
    newcomer.retain(|(k, _)| *k != "MAX_STREAMS");
    newcomer.push(("MAX_STREAMS", "1"));
    cluster.start_worker_with_sidecar("w2", &newcomer);
    let moved = cluster
        .wait_owners(Duration::from_secs(60), |owners| {
            owners.values().filter(|o| *o == "w2").count() == 1
        })
        .await;
    let owners = cluster.owners().await;
    let moved_stream = owners
        .iter()
        .find_map(|(stream, owner)| (owner == "w2").then(|| stream.clone()))
        .unwrap();
    eprintln!("{moved_stream} moved to w2 after {moved:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        server.limit_closes(),
        0,
        "no connection closed for a limit\n{}",
        cluster.logs()
    );
    assert_eq!(
        total(
            &metrics(&cluster, "w1").await,
            "leasehold_websocket_reconnects_total"
        ),
        0,
        "w1 reconnected nothing"
    );

    cluster.stop_workers();
    for stream in &streams {
        let entries = cluster.sink_entries(stream).await;
        let first = entries.first().unwrap();
        assert!(
            first.snapshot && first.gap.is_none(),
            "{stream}: the sink starts with a snapshot: {first:?}"
        );
        if *stream == moved_stream {
            // Its new owner starts at a book of its own.
            assert!(entries[1..].iter().any(|e| e.snapshot), "{stream}");
            continue;
        }
        assert!(
            entries[1..].iter().all(|e| !e.snapshot && e.gap.is_none()),
            "{stream}: one snapshot, then diffs without a gap"
        );
        assert!(entries.len() > DIFFS, "{stream}: {} entries", entries.len());
        // Each diff is the exact frame the fake sent for its id.
        let last = entries.last().unwrap();
        let data: serde_json::Value = serde_json::from_str(&last.payload).unwrap();
        let symbol = stream.to_ascii_uppercase();
        let frame: serde_json::Value =
            serde_json::from_str(&server.frame(&symbol, last.seq)).unwrap();
        assert!(
            data == frame || data["data"] == frame,
            "{stream}: {data} is not {frame}"
        );
    }
    shutdown.cancel();
    server.finished().await;
}
