//! Claim latency against the size of the keyspace: `manager::claim_user` (the
//! claim path of `leasehold claim` and supervision: mark check, credentials
//! read, idle count, `LPUSH`) and the time until `worker:active:{user_id}` is
//! set by a warm in-process pool worker, with an empty keyspace and with
//! 1,000,000 unrelated keys (what a day of request records leaves). For
//! comparison, the idle count the claim path used before `pool:idle`: a `SCAN
//! MATCH worker:active:-1:*` of the whole keyspace.
//!
//! Needs `LEASEHOLD_TEST_REDIS_URL` (scripts/bench.sh sets it); uses database 15
//! (the benchmarks' database) and flushes it. Run:
//! `cargo bench -p leasehold-broker --bench claim_keyspace -- --keys 1000000 --claims 100`
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_broker::credentials::AesGcmCipher;
use leasehold_broker::launcher::testing::ScriptedLauncher;
use leasehold_broker::manager::{self, ClaimPath};
use leasehold_broker::paper::{Broker, PaperBroker, PaperConfig};
use leasehold_broker::worker::{BrokerWorker, BrokerWorkerConfig};
use leasehold_pool::bus::redis::RedisPoolBus;
use leasehold_pool::bus::{CredentialBus, Inspect, MarkBus, PoolBus};
use leasehold_pool::keys;
use leasehold_telemetry::RecordingSink;
use leasehold_testkit::measure::{arg, percentile};
use tokio_util::sync::CancellationToken;

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

fn report(name: &str, samples: &mut [Duration]) {
    println!(
        "{name}: n={} p50={:.3} ms p99={:.3} ms",
        samples.len(),
        ms(percentile(samples, 50.0)),
        ms(percentile(samples, 99.0)),
    );
}

/// Starts `count` pool workers on their own buses; returns their stop token.
async fn pool(url: &str, key: &str, prefix: &str, count: usize) -> CancellationToken {
    let stop = CancellationToken::new();
    for n in 0..count {
        let bus: Arc<dyn PoolBus> = Arc::new(RedisPoolBus::connect(url).await.unwrap());
        let brokers: HashMap<String, Arc<dyn Broker>> = HashMap::from([(
            "paper".to_owned(),
            Arc::new(PaperBroker::new(PaperConfig::default(), bus.clone())) as Arc<dyn Broker>,
        )]);
        let mut config =
            BrokerWorkerConfig::for_tests(&format!("{prefix}-{n}"), None, Duration::from_secs(5));
        config.mark_ttl = Duration::from_secs(30);
        let worker = BrokerWorker::new(
            config,
            bus,
            Arc::new(AesGcmCipher::from_base64_key(key).unwrap()),
            brokers,
            Arc::new(RecordingSink::new()),
        );
        let token = stop.clone();
        tokio::spawn(async move { worker.run(token).await });
    }
    stop
}

/// `claims` claims through the claim path, `batch` warm workers at a time.
async fn claims(bus: &RedisPoolBus, url: &str, key: &str, phase: &str, claims: usize) {
    // Ids may not hold spaces.
    let tag: String = phase
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let cipher = AesGcmCipher::from_base64_key(key).unwrap();
    let launcher = ScriptedLauncher::default();
    let (mut call, mut active) = (Vec::new(), Vec::new());
    let batch = 10;
    for round in 0..claims.div_ceil(batch) {
        let stop = pool(url, key, &format!("{tag}-{round}"), batch).await;
        // Until every worker of the round heartbeats into pool:idle.
        while manager::idle_pool_workers(bus).await.unwrap().len() < batch {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for n in 0..batch {
            let user = format!("{tag}-user-{round}-{n}");
            let blob = cipher
                .encrypt(&user, br#"{"api_key": "k", "account_id": "A1"}"#)
                .unwrap();
            bus.put_credentials(&user, &blob).await.unwrap();
            let started = Instant::now();
            let path = manager::claim_user(bus, &launcher, &user).await.unwrap();
            call.push(started.elapsed());
            assert!(matches!(path, ClaimPath::PoolClaim { .. }), "{path}");
            while !bus.user_is_active(&user).await.unwrap() {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            active.push(started.elapsed());
        }
        stop.cancel();
        // Until the claimed workers released their users.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    report(
        &format!("{phase}: claim_user call (idle count from pool:idle + LPUSH)"),
        &mut call,
    );
    report(
        &format!("{phase}: claim_user -> worker:active set"),
        &mut active,
    );
    let mut scans = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        bus.marks(keys::POOL_WORKER_ACTIVE_PATTERN).await.unwrap();
        scans.push(started.elapsed());
    }
    report(
        &format!("{phase}: the former idle count, SCAN MATCH worker:active:-1:*"),
        &mut scans,
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(base) = leasehold_testkit::redis_url() else {
        eprintln!("LEASEHOLD_TEST_REDIS_URL is not set (run scripts/bench.sh)");
        return;
    };
    let fill = arg("--keys", 1_000_000) as usize;
    let count = arg("--claims", 100) as usize;
    let url = format!("{}/15", base.trim_end_matches('/'));
    let mut redis = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("FLUSHDB")
        .arg("ASYNC")
        .query_async(&mut redis)
        .await
        .unwrap();
    let key = AesGcmCipher::generate_key();
    let bus = RedisPoolBus::connect(&url).await.unwrap();

    claims(&bus, &url, &key, "empty keyspace", count).await;

    // Unrelated keys, pipelined MSETs of 1,000 (DEBUG POPULATE is disabled by
    // default since Redis 7).
    let started = Instant::now();
    for chunk in 0..fill.div_ceil(1000) {
        let mut mset = redis::cmd("MSET");
        for n in chunk * 1000..((chunk + 1) * 1000).min(fill) {
            mset.arg(format!("trading:request:fill-{n}")).arg("x");
        }
        let _: () = mset.query_async(&mut redis).await.unwrap();
    }
    let size: u64 = redis::cmd("DBSIZE").query_async(&mut redis).await.unwrap();
    println!(
        "filled {fill} unrelated keys in {:.1} s (DBSIZE {size})",
        started.elapsed().as_secs_f64()
    );
    claims(&bus, &url, &key, &format!("{fill} unrelated keys"), count).await;
    // ASYNC: freeing a million keys takes longer than a client timeout.
    let _: () = redis::cmd("FLUSHDB")
        .arg("ASYNC")
        .query_async(&mut redis)
        .await
        .unwrap();
}
