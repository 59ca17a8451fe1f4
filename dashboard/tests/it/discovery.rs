//! The dashboard finds every sidecar through the `sidecar_url` workers publish,
//! without `DASHBOARD_SIDECARS`: 100 stream workers' presence records in the
//! real DynamoDB-compatible server and 100 broker workers (50 idle pool marks,
//! 50 claimed users' `worker:metadata:*`) in a real Redis, written through the
//! production write paths, each pointing at its own sidecar HTTP server. Hostile
//! values among them are refused and never connected to.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use leasehold_control::store::LeaseReader;
use leasehold_dashboard::sources::sidecars::{DiscoveryPolicy, Network};
use leasehold_dashboard::{Collector, CollectorSettings, Sources};
use leasehold_pool::bus::{BusConnector, MarkWrite, WorkerMetadata};
use leasehold_pool::keys::POOL_USER_ID;
use leasehold_pool::protocol::MarkValue;
use leasehold_pool::read::PoolReader;
use leasehold_testkit::dashboard::announce_sidecar;
use leasehold_testkit::lease_store::{ConformanceTarget, DynamoTarget};
use leasehold_testkit::{non_loopback_address, redis_url};
use tokio::net::TcpListener;

const STREAM_WORKERS: usize = 100;
const IDLE_BROKERS: usize = 50;
const CLAIMED_BROKERS: usize = 50;
/// This test's own Redis database (flushed first).
const DISCOVERY_DB: u32 = 12;

/// A sidecar: answers `/status` for `owner`, counting requests.
async fn sidecar(
    ip: IpAddr,
    owner: String,
    component: &'static str,
) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let body = serde_json::json!({
        "component": component, "owner_id": owner, "worker_connected": true,
        "last_event_age_ms": 10, "worker_up": true, "events_received": 1,
        "events_dropped": 0, "leases": [], "lag": {}, "websocket_connections": 0,
        "pool": null, "observer": false
    })
    .to_string();
    let app = Router::new().route(
        "/status",
        get(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            let body = body.clone();
            async move { ([("content-type", "application/json")], body) }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, hits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_finds_200_sidecars_from_presence_records_and_broker_metadata() {
    let (Some(target), Some(redis)) = (DynamoTarget::create().await, redis_url()) else {
        return;
    };
    // Sidecars on this host's own network address, as another task's would
    // be, under a production policy (no loopback); loopback and the dev
    // policy only where the host has no other address.
    let (ip, policy) = match non_loopback_address() {
        Some(ip) => {
            let width = if ip.is_ipv4() { 32 } else { 128 };
            let network = Network::parse(&format!("{ip}/{width}")).unwrap();
            (
                ip,
                DiscoveryPolicy {
                    networks: vec![network],
                    allow_loopback: false,
                },
            )
        }
        None => (IpAddr::from([127, 0, 0, 1]), DiscoveryPolicy::dev()),
    };
    let production = !policy.allow_loopback;
    println!("sidecars on {ip}, production policy: {production}");

    let store = target.store();
    let now = leasehold_control::clock::unix_ms(std::time::SystemTime::now());
    let mut expected: BTreeSet<String> = BTreeSet::new();
    let mut counters = Vec::new();
    for i in 0..STREAM_WORKERS {
        let owner = format!("stream-{i:03}");
        let (addr, hits) = sidecar(ip, owner.clone(), "stream-worker").await;
        let url = format!("http://{addr}");
        announce_sidecar(store.as_ref(), &owner, &url, now).await;
        expected.insert(url);
        counters.push(hits);
    }

    let url = format!("{}/{DISCOVERY_DB}", redis.trim_end_matches('/'));
    let mut connection = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("FLUSHDB")
        .query_async(&mut connection)
        .await
        .unwrap();
    let bus = BusConnector::redis(url.clone())
        .unwrap()
        .get()
        .await
        .unwrap();
    let ttl = Duration::from_secs(120);
    let mark = |worker: &str, user: &str, sidecar_url: Option<String>| MarkValue {
        worker_id: worker.into(),
        task_id: format!("task-{worker}"),
        user_id: user.into(),
        heartbeat_at: now as u64,
        started_at: now as u64,
        sidecar_url,
        ttl_ms: None,
        heartbeat_interval_ms: None,
        seal_key: None,
    };
    for i in 0..IDLE_BROKERS {
        let worker = format!("idle-{i:03}");
        let (addr, hits) = sidecar(ip, worker.clone(), "broker-worker").await;
        let url = format!("http://{addr}");
        bus.set_pool_mark(
            &worker,
            &mark(&worker, POOL_USER_ID, Some(url.clone())).to_json(),
            ttl,
        )
        .await
        .unwrap();
        expected.insert(url);
        counters.push(hits);
    }
    let claim = |worker: String, user: String, sidecar_url: Option<String>| {
        let bus = bus.clone();
        let value = mark(&worker, &user, None).to_json();
        async move {
            let metadata = WorkerMetadata {
                task_arn: format!("task-{worker}"),
                instance_id: "test-host".into(),
                launched_at: 1,
                sidecar_url,
            };
            let claimed = bus
                .claim_user(&MarkWrite {
                    user_id: &user,
                    worker_id: &worker,
                    value: &value,
                    ttl,
                    metadata: &metadata,
                })
                .await
                .unwrap();
            assert!(claimed);
        }
    };
    for i in 0..CLAIMED_BROKERS {
        let worker = format!("claimed-{i:03}");
        let (addr, hits) = sidecar(ip, worker.clone(), "broker-worker").await;
        let url = format!("http://{addr}");
        claim(worker, format!("user-{i:03}"), Some(url.clone())).await;
        expected.insert(url);
        counters.push(hits);
    }
    assert_eq!(expected.len(), 200);

    // Hostile values: the ECS credentials endpoint, a userinfo trick, and (on
    // a host with a real address) a loopback sidecar that is listening.
    announce_sidecar(
        store.as_ref(),
        "hostile-1",
        "http://169.254.169.254:80",
        now,
    )
    .await;
    claim(
        "hostile-2".into(),
        "user-hostile-2".into(),
        Some("http://10.0.0.1@169.254.169.254/".into()),
    )
    .await;
    let (canary, canary_hits) = sidecar(
        IpAddr::from([127, 0, 0, 1]),
        "canary".into(),
        "broker-worker",
    )
    .await;
    if production {
        claim(
            "hostile-3".into(),
            "user-hostile-3".into(),
            Some(format!("http://{canary}")),
        )
        .await;
    }

    let collector = Collector::new(
        Sources {
            leases: store.clone() as Arc<dyn LeaseReader>,
            pool: Some(Arc::new(BusConnector::redis(url).unwrap()) as Arc<dyn PoolReader>),
            sidecars: Vec::new(),
            discovery: policy,
        },
        CollectorSettings {
            sidecar_timeout: Duration::from_secs(5),
            ..CollectorSettings::default()
        },
        Arc::new(leasehold_control::clock::SystemClock),
    );
    let started = Instant::now();
    let snapshot = collector.refresh().await;
    let took = started.elapsed();
    println!(
        "refresh with 200 discovered sidecars: {} ms",
        took.as_millis()
    );

    let found: BTreeSet<String> = snapshot.sidecars.iter().map(|s| s.url.clone()).collect();
    assert_eq!(found, expected, "exactly the published sidecars are polled");
    assert_eq!(snapshot.sidecars.len(), 200);
    let answered = snapshot
        .sidecars
        .iter()
        .filter(|s| s.status.is_some())
        .count();
    assert_eq!(
        answered,
        200,
        "{:?}",
        snapshot.sidecars.iter().find(|s| s.status.is_none())
    );
    for (i, hits) in counters.iter().enumerate() {
        assert_eq!(hits.load(Ordering::SeqCst), 1, "sidecar {i} scraped once");
    }
    assert_eq!(
        canary_hits.load(Ordering::SeqCst),
        0,
        "a refused URL was connected to"
    );
    // Every worker row names its sidecar: stream owners through presence,
    // broker workers through their status.
    let with_sidecar = snapshot
        .workers
        .iter()
        .filter(|w| w.sidecar_url.is_some() && w.worker_up == Some(true))
        .count();
    assert_eq!(with_sidecar, 200);
    let health = snapshot
        .sources
        .iter()
        .find(|s| s.name == "sidecars")
        .expect("the sidecar source is shown");
    let refused = if production { 3 } else { 2 };
    let error = health.error.as_deref().unwrap_or_default();
    assert!(
        error.starts_with(&format!("{refused} sidecar_url values refused")),
        "{error}"
    );
    // Each for its own reason, by category.
    assert!(error.contains("1 link-local"), "{error}");
    assert!(error.contains("1 malformed (userinfo)"), "{error}");
    if production {
        assert!(error.contains("1 loopback"), "{error}");
    }
    assert!(
        !error.contains("169.254") && !error.contains("127.0.0.1"),
        "{error}"
    );
}
