//! Broker pool figures: claim latency from LPUSH of the claim to
//! `worker:active:{user_id}` being set and to the claim outcome
//! (`pool:claim:{claim_id}`) being readable, as an API sees it; request round
//! trip (LPUSH → response readable) and worker-side handling with a
//! zero-latency paper broker, through the processing list and the request
//! record; resident memory of an idle pool worker process.
//!
//! The claim figures are taken twice: workers that decrypt the blob in the
//! claim themselves (local key), and workers that get their credentials
//! sealed from an in-process credential sealer (local key too, so the
//! difference is the sealing step: the grant, the HTTP round trip, the
//! sealer's reads, X25519 and two AES-GCM operations; KMS adds its own round
//! trip in either mode, see the `kms_decrypt` bench).
//!
//! Needs `LEASEHOLD_TEST_REDIS_URL` (scripts/bench.sh sets it).
//! Run: `cargo bench -p leasehold --bench broker_pool`
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_broker::connections::ConnectPolicy;
use leasehold_broker::credentials::AesGcmCipher;
use leasehold_broker::paper::{Broker, PaperBroker, PaperConfig};
use leasehold_broker::sealer::{CredentialSealer, SealerClient};
use leasehold_broker::worker::{BrokerWorker, BrokerWorkerConfig, WorkerMetadata};
use leasehold_pool::keys;
use leasehold_pool::protocol::{CredentialsGrant, GrantReason};
use leasehold_telemetry::{RecordingSink, TelemetryEvent};
use leasehold_testkit::measure::percentile;
use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

fn config(worker_id: String, user_id: Option<String>) -> BrokerWorkerConfig {
    BrokerWorkerConfig {
        task_id: worker_id.clone(),
        worker_id,
        user_id,
        heartbeat: Duration::from_secs(5),
        mark_ttl: Duration::from_secs(30),
        block: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(1800),
        health_check: Duration::from_secs(60),
        connect: ConnectPolicy::default(),
        queue_max: leasehold_broker::worker::DEFAULT_QUEUE_MAX,
        bounds: leasehold_broker::worker::RequestBounds::DEFAULT,
        metadata: WorkerMetadata {
            task_arn: "bench".into(),
            instance_id: "bench".into(),
            launched_at: 0,
            sidecar_url: None,
        },
    }
}

async fn start(
    url: &str,
    key: &str,
    sealer_url: Option<&str>,
    worker_id: String,
    user_id: Option<String>,
    telemetry: RecordingSink,
) -> CancellationToken {
    let brokers: HashMap<String, Arc<dyn Broker>> = HashMap::from([(
        "paper".to_owned(),
        Arc::new(PaperBroker::new(
            PaperConfig::default(),
            Arc::new(
                leasehold_pool::bus::redis::RedisPoolBus::connect(url)
                    .await
                    .unwrap(),
            ),
        )) as Arc<dyn Broker>,
    )]);
    let worker = BrokerWorker::new(
        config(worker_id, user_id),
        Arc::new(
            leasehold_pool::bus::redis::RedisPoolBus::connect(url)
                .await
                .unwrap(),
        ),
        Arc::new(AesGcmCipher::from_base64_key(key).unwrap()),
        brokers,
        Arc::new(telemetry),
    );
    let worker = match sealer_url {
        Some(sealer) => worker.with_sealer(
            SealerClient::new(sealer, Duration::from_secs(5))
                .trusting(leasehold_testkit::sealer_tls::CA.as_bytes())
                .unwrap(),
        ),
        None => worker,
    };
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    tokio::spawn(async move { worker.run(token).await });
    shutdown
}

/// 100 warm claims (10 rounds of 10 fresh pool workers): LPUSH → the user's
/// mark, and LPUSH → the outcome reads `claimed`. With a sealer, the grant
/// is written first, as `leasehold claim` does, and counted.
async fn warm_claims(
    redis: &mut redis::aio::MultiplexedConnection,
    url: &str,
    key: &str,
    sealer_url: Option<&str>,
) -> (Vec<Duration>, Vec<Duration>) {
    let cipher = AesGcmCipher::from_base64_key(key).unwrap();
    let mode = if sealer_url.is_some() {
        "sealed"
    } else {
        "local"
    };
    let mut claims = Vec::new();
    let mut outcomes = Vec::new();
    let mut stops = Vec::new();
    for round in 0..10 {
        for i in 0..10 {
            stops.push(
                start(
                    url,
                    key,
                    sealer_url,
                    format!("bench-{mode}-{round}-{i}"),
                    None,
                    RecordingSink::new(),
                )
                .await,
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        for i in 0..10 {
            let user = format!("bench-user-{mode}-{round}-{i}");
            let blob = cipher
                .encrypt(&user, br#"{"api_key": "k", "account_id": "A1"}"#)
                .unwrap();
            let _: () = redis.set(keys::credentials(&user), &blob).await.unwrap();
            let claim_id = format!("claim-{user}");
            let claim = serde_json::json!({"user_id": user, "encrypted_credentials": blob, "claim_id": claim_id, "enqueued_at": 0});
            let grant = CredentialsGrant::new(GrantReason::Claim, 0).for_claim(&claim_id);
            let started = Instant::now();
            if sealer_url.is_some() {
                let _: () = redis
                    .set_ex(keys::credentials_grant(&user), grant.to_json(), 120)
                    .await
                    .unwrap();
            }
            let _: () = redis
                .lpush(keys::POOL_CLAIMS, claim.to_string())
                .await
                .unwrap();
            loop {
                let exists: bool = redis.exists(keys::worker_active(&user)).await.unwrap();
                if exists {
                    break;
                }
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            claims.push(started.elapsed());
            loop {
                let outcome: Option<String> =
                    redis.get(keys::claim_outcome(&claim_id)).await.unwrap();
                if let Some(outcome) = outcome {
                    assert!(outcome.contains(r#""claimed""#), "{outcome}");
                    break;
                }
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            outcomes.push(started.elapsed());
        }
    }
    for stop in stops.drain(..) {
        stop.cancel();
    }
    (claims, outcomes)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Ok(base) = std::env::var("LEASEHOLD_TEST_REDIS_URL") else {
        eprintln!("LEASEHOLD_TEST_REDIS_URL is not set (run scripts/bench.sh)");
        return;
    };
    let url = format!("{}/15", base.trim_end_matches('/'));
    let mut redis = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("FLUSHDB").query_async(&mut redis).await.unwrap();
    let key = AesGcmCipher::generate_key();
    let cipher = AesGcmCipher::from_base64_key(&key).unwrap();

    // 1. Claim latency: LPUSH claim → worker:active:{user} exists, and → the
    //    claim outcome reads `claimed` (polled every 0.2 ms); workers that
    //    decrypt, then workers served by a credential sealer.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    // Over HTTPS, as deployed: the test CA's certificate for 127.0.0.1.
    let sealer_url = format!("https://{}", listener.local_addr().unwrap());
    let sealer_bus = Arc::new(
        leasehold_pool::bus::redis::RedisPoolBus::connect(&url)
            .await
            .unwrap(),
    );
    let sealer = Arc::new(CredentialSealer::new(sealer_bus, Arc::new(cipher.clone())));
    let sealer_stop = CancellationToken::new();
    tokio::spawn(leasehold_broker::sealer::serve(
        listener,
        sealer,
        leasehold_broker::sealer::CLAIM_USER_SWEEP,
        None,
        Some(Arc::new(
            leasehold_broker::sealer::tls::server_config(
                leasehold_testkit::sealer_tls::CERT.as_bytes(),
                leasehold_testkit::sealer_tls::KEY.as_bytes(),
            )
            .unwrap(),
        )),
        sealer_stop.clone(),
    ));
    for (mode, sealer) in [("local key", None), ("sealed", Some(sealer_url.as_str()))] {
        let (mut claims, mut outcomes) = warm_claims(&mut redis, &url, &key, sealer).await;
        println!(
            "claim latency, {mode} (LPUSH -> worker:active set, {} claims): p50 {:?} p99 {:?}",
            claims.len(),
            percentile(&mut claims, 50.0),
            percentile(&mut claims, 99.0)
        );
        println!(
            "claim outcome as the API sees it, {mode} (LPUSH -> pool:claim:{{id}} reads claimed, {} claims): p50 {:?} p99 {:?}",
            outcomes.len(),
            percentile(&mut outcomes, 50.0),
            percentile(&mut outcomes, 99.0)
        );
    }
    sealer_stop.cancel();

    // 2. Requests, zero-latency paper broker: worker-side handling (taken into
    //    the processing list → final response stored) and the API's round trip.
    let user = "bench-requests".to_owned();
    let blob = cipher
        .encrypt(&user, br#"{"api_key": "k", "account_id": "A1"}"#)
        .unwrap();
    let _: () = redis.set(keys::credentials(&user), blob).await.unwrap();
    let telemetry = RecordingSink::new();
    let stop = start(
        &url,
        &key,
        None,
        "bench-req".into(),
        Some(user.clone()),
        telemetry.clone(),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let total = 2000;
    let started = Instant::now();
    let mut round_trips = Vec::with_capacity(total);
    for n in 0..total {
        let sent = Instant::now();
        let request_id = format!("bench-r-{n}");
        let body = serde_json::json!({"request_id": request_id, "action": "place_order",
            "account": {"broker_name": "paper", "broker_type": "stock", "simulation": true, "account_id": "A1"},
            "order": {"symbol": "2330", "side": "buy", "quantity": 1, "price": 600.5}});
        let _: () = redis
            .lpush(keys::user_requests(&user), body.to_string())
            .await
            .unwrap();
        loop {
            let exists: bool = redis
                .exists(keys::response(&user, &request_id))
                .await
                .unwrap();
            if exists {
                break;
            }
            tokio::time::sleep(Duration::from_micros(100)).await;
        }
        round_trips.push(sent.elapsed());
    }
    let elapsed = started.elapsed();
    stop.cancel();
    let mut handling: Vec<Duration> = telemetry
        .snapshot()
        .into_iter()
        .filter_map(|e| match e {
            TelemetryEvent::BrokerRequest { duration, .. } => Some(duration),
            _ => None,
        })
        .collect();
    println!(
        "request handling worker-side ({} requests, {:.0} req/s end to end): p50 {:?} p99 {:?}",
        handling.len(),
        total as f64 / elapsed.as_secs_f64(),
        percentile(&mut handling, 50.0),
        percentile(&mut handling, 99.0)
    );
    println!(
        "request round trip as the API sees it (LPUSH -> response readable, polled every 0.1 ms): p50 {:?} p99 {:?}",
        percentile(&mut round_trips, 50.0),
        percentile(&mut round_trips, 99.0)
    );

    // 3. Idle pool worker RSS: the real binary, after it settled.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .arg("broker-worker")
        .env("REDIS_URL", &url)
        .env("CREDENTIALS_KEY", &key)
        .env("LEASEHOLD_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .unwrap_or("VmRSS: ?")
        .to_owned();
    let _ = child.kill();
    let _ = child.wait();
    println!(
        "idle pool worker ({}): {rss}",
        if cfg!(debug_assertions) {
            "debug build"
        } else {
            "release build"
        }
    );
}
