//! The original acceptance scenarios with real processes: a feed, DynamoDB
//! (moto), Redis and several `leasehold stream-worker`s with 3 s leases. Every
//! scenario ends by reading the sink: no sequence gap, no duplicate, no write
//! accepted with a stale token.

mod support;

use std::time::{Duration, Instant};

use leasehold_testkit::measure::percentile;
use support::{Cluster, DISCOVERY_MS, LEASE_SECONDS, SKEW_MS, private_moto, serial};

fn owned_by(owners: &std::collections::BTreeMap<String, String>, owner: &str) -> usize {
    owners.values().filter(|o| o.as_str() == owner).count()
}

async fn verify_all(cluster: &Cluster) {
    for stream in &cluster.streams {
        let written = cluster.verify_sink(stream).await;
        assert!(written > 10, "{stream}: only {written} events");
    }
    let now = leasehold_control::clock::unix_ms(std::time::SystemTime::now());
    for lease in cluster.leases().await {
        assert_eq!(
            lease.owner_id, None,
            "{} still owned after every worker exited",
            lease.stream_id
        );
        assert!(lease.checkpoint.unwrap_or(0) > 0 && lease.lease_expires_at <= now);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_takeover_within_lease_and_without_gaps() {
    let _serial = serial().await;
    let Some(mut cluster) = Cluster::start(6, 100).await else {
        return;
    };
    for owner in ["w1", "w2", "w3"] {
        cluster.start_worker(owner);
    }
    cluster
        .wait_owners(Duration::from_secs(30), |o| {
            o.len() == 6 && ["w1", "w2", "w3"].iter().all(|w| owned_by(o, w) == 2)
        })
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.workers["w1"].signal("KILL");
    let took = cluster
        .wait_owners(Duration::from_secs(20), |o| {
            o.len() == 6 && owned_by(o, "w1") == 0
        })
        .await;
    let bound = Duration::from_millis(LEASE_SECONDS * 1000 + SKEW_MS + DISCOVERY_MS + 1500);
    eprintln!("crash takeover of all streams took {took:?} (lease {LEASE_SECONDS} s)");
    assert!(took <= bound, "takeover took {took:?}, bound {bound:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.workers.remove("w1");
    cluster.stop_workers();
    verify_all(&cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_worker_writes_nothing_stale_and_stops_by_itself() {
    let _serial = serial().await;
    let Some(mut cluster) = Cluster::start(4, 100).await else {
        return;
    };
    cluster.start_worker("w1");
    cluster.start_worker("w2");
    cluster
        .wait_owners(Duration::from_secs(30), |o| {
            o.len() == 4 && owned_by(o, "w1") == 2
        })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.workers["w1"].signal("STOP");
    cluster
        .wait_owners(Duration::from_secs(20), |o| {
            o.len() == 4 && owned_by(o, "w1") == 0
        })
        .await;
    // Longer than a lease: w1 wakes up believing nothing, with batches in memory.
    tokio::time::sleep(Duration::from_secs(LEASE_SECONDS + 2)).await;
    cluster.workers["w1"].signal("CONT");
    cluster.workers["w1"].wait_line("lease lost", Duration::from_secs(10));
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.stop_workers();
    // Token order in the sink proves no stale write was accepted.
    verify_all(&cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_deploy_hands_over_fast_and_without_gaps() {
    let _serial = serial().await;
    let Some(mut cluster) = Cluster::start(6, 100).await else {
        return;
    };
    cluster.start_worker("old1");
    cluster.start_worker("old2");
    cluster
        .wait_owners(Duration::from_secs(30), |o| {
            o.len() == 6 && owned_by(o, "old1") == 3
        })
        .await;
    cluster.start_worker("new1");
    cluster.start_worker("new2");
    cluster
        .wait_owners(Duration::from_secs(30), |o| {
            o.len() == 6 && ["new1", "new2"].iter().all(|w| owned_by(o, w) >= 1)
        })
        .await;
    let mut handoffs = Vec::new();
    for old in ["old1", "old2"] {
        let held: Vec<String> = cluster
            .owners()
            .await
            .into_iter()
            .filter(|(_, owner)| owner == old)
            .map(|(stream, _)| stream)
            .collect();
        let sent = Instant::now();
        cluster.workers[old].signal("TERM");
        let mut pending = held.clone();
        while !pending.is_empty() {
            let owners = cluster.owners().await;
            pending.retain(|stream| match owners.get(stream) {
                Some(owner) if owner != old => {
                    handoffs.push(sent.elapsed());
                    false
                }
                _ => true,
            });
            assert!(
                sent.elapsed() < Duration::from_secs(15),
                "hand-off of {pending:?} stuck\n{}",
                cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut worker = cluster.workers.remove(old).unwrap();
        let status = worker.wait_exit(Duration::from_secs(10));
        assert!(
            status.success(),
            "{old} exited with {status}\n{}",
            worker.output()
        );
        let after = cluster.owners().await;
        assert_eq!(
            owned_by(&after, old),
            0,
            "{old} still holds leases after exit"
        );
    }
    let p50 = percentile(&mut handoffs, 50.0);
    let p99 = percentile(&mut handoffs, 99.0);
    eprintln!(
        "graceful hand-off over {} streams: p50 {p50:?}, p99 {p99:?}",
        handoffs.len()
    );
    assert!(p99 < Duration::from_secs(3), "hand-off p99 {p99:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.stop_workers();
    verify_all(&cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_stops_side_effects_before_the_deadline() {
    let _serial = serial().await;
    if leasehold_testkit::dynamodb_endpoint().is_none() {
        return;
    }
    let (moto, endpoint) = private_moto();
    let Some(mut cluster) = Cluster::start_with(endpoint, 4, 100).await else {
        return;
    };
    cluster.start_worker("w1");
    cluster.start_worker("w2");
    cluster.wait_all_owned(Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let outage_start = leasehold_control::clock::unix_ms(std::time::SystemTime::now());
    moto.signal("STOP");
    tokio::time::sleep(Duration::from_secs(LEASE_SECONDS + 2)).await;
    let outage_end = leasehold_control::clock::unix_ms(std::time::SystemTime::now());
    moto.signal("CONT");
    cluster.wait_all_owned(Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.stop_workers();
    // Every holder's deadline fell before outage start + lease: nothing may be
    // written between then and the end of the outage.
    let quiet_from = outage_start + (LEASE_SECONDS * 1000) as i64 + 200;
    let client = redis::Client::open(cluster.redis.as_str()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    for stream in &cluster.streams {
        let late: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(leasehold_stream::sink::keys::sink_stream(stream))
            .arg(format!("{quiet_from}-0"))
            .arg(format!("{outage_end}-0"))
            .query_async(&mut connection)
            .await
            .unwrap();
        assert!(
            late.ids.is_empty(),
            "{stream}: {} writes during the outage after every deadline",
            late.ids.len()
        );
    }
    verify_all(&cluster).await;
    drop(moto);
}
