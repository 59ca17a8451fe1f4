//! One refresh's sidecar poll is bounded as a whole, whatever the published
//! `sidecar_url` values point at: 200 addresses that accept and never answer
//! cannot stretch a refresh past the source timeout, and 200 sidecars
//! answering 2 MiB each cannot make it read more than its byte budget. Each
//! test fails when its guard (the poll's deadline, the byte budget) is removed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_control::clock::SystemClock;
use leasehold_dashboard::sources::sidecars::{
    DiscoveryPolicy, KEPT_LEASES, MAX_STATUS_BYTES, SidecarProblem,
};
use leasehold_dashboard::{Collector, CollectorSettings, Sources};
use leasehold_testkit::dashboard::announce_sidecar;
use leasehold_testkit::lease_store::{ConformanceTarget, MemoryTarget};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const SIDECARS: usize = 200;

/// A collector whose lease table holds one presence record per URL in
/// `sidecar_urls` (the discovery path a hostile record takes), under the dev
/// policy so loopback addresses may be polled.
async fn discovering(sidecar_urls: &[String], settings: CollectorSettings) -> Collector {
    let target = MemoryTarget::default();
    let store = target.store();
    let now = leasehold_control::clock::unix_ms(std::time::SystemTime::now());
    for (i, url) in sidecar_urls.iter().enumerate() {
        announce_sidecar(store.as_ref(), &format!("worker-{i:03}"), url, now).await;
    }
    Collector::new(
        Sources {
            leases: store,
            pool: None,
            sidecars: Vec::new(),
            discovery: DiscoveryPolicy::dev(),
        },
        settings,
        Arc::new(SystemClock),
    )
}

/// A listener on 127.0.0.1 that accepts every connection and never writes a
/// byte (it holds the sockets open, so the client sees no reset either).
async fn silent_sidecar() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    format!("http://{addr}")
}

/// A sidecar on 127.0.0.1 answering every `/status` with `reply` (a whole
/// HTTP response, with its length).
async fn answering_sidecar(reply: Arc<Vec<u8>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let reply = reply.clone();
            tokio::spawn(async move {
                let mut request = [0_u8; 4096];
                let _ = socket.read(&mut request).await;
                let _ = socket.write_all(&reply).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    format!("http://{addr}")
}

/// A valid `/status` body just under [`MAX_STATUS_BYTES`]: a stream worker
/// listing far more held leases than a snapshot keeps.
fn two_mib_status() -> Vec<u8> {
    let lease =
        |i: usize| format!(r#"{{"stream_id":"s-{i:07}","fence_token":1,"expires_at_ms":1}}"#);
    let head = r#"{"component":"stream-worker","owner_id":"big","worker_connected":true,"last_event_age_ms":1,"worker_up":true,"events_received":1,"events_dropped":0,"lag":{},"websocket_connections":0,"pool":null,"observer":false,"leases":["#;
    let mut body = head.to_owned();
    let mut i = 0;
    while body.len() + 200 < MAX_STATUS_BYTES {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&lease(i));
        i += 1;
    }
    body.push_str("]}");
    body.into_bytes()
}

fn with_headers(body: &[u8]) -> Vec<u8> {
    let mut reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    reply.extend_from_slice(body);
    reply
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_silent_sidecars_cannot_stretch_a_refresh_past_the_source_timeout() {
    let mut urls = Vec::new();
    for _ in 0..SIDECARS {
        urls.push(silent_sidecar().await);
    }
    // 200 sidecars at 64 at a time, 2 s each, would take 8 s; the source
    // timeout (5 times the refresh, at least 5 s) is 5 s.
    let settings = CollectorSettings {
        refresh: Duration::from_secs(1),
        sidecar_timeout: Duration::from_secs(2),
        ..CollectorSettings::default()
    };
    let source_timeout = settings.source_timeout();
    assert_eq!(source_timeout, Duration::from_secs(5));
    let collector = discovering(&urls, settings).await;

    let started = Instant::now();
    let snapshot = collector.refresh().await;
    let took = started.elapsed();

    let slack = Duration::from_millis(750);
    assert!(
        took <= source_timeout + slack,
        "the refresh took {took:?}, past the source timeout {source_timeout:?}"
    );
    assert_eq!(snapshot.sidecars.len(), SIDECARS);
    let timed_out = SidecarProblem::Timeout.as_str();
    let not_asked = SidecarProblem::PastDeadline.as_str();
    for report in &snapshot.sidecars {
        assert!(report.status.is_none(), "{}", report.url);
        let error = report.error.as_deref();
        assert!(
            error == Some(timed_out) || error == Some(not_asked),
            "{}: {error:?}",
            report.url
        );
    }
    assert!(
        snapshot
            .sidecars
            .iter()
            .any(|report| report.error.as_deref() == Some(not_asked)),
        "the deadline left some sidecars unasked"
    );
    let health = snapshot
        .sources
        .iter()
        .find(|source| source.name == "sidecars")
        .unwrap();
    assert!(!health.ok);
    let error = health.error.as_deref().unwrap_or_default();
    assert!(
        error.starts_with("200 of 200 sidecars did not answer") && error.contains(not_asked),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_sidecars_answering_2_mib_cannot_make_a_refresh_read_past_its_budget() {
    let body = two_mib_status();
    let reply = Arc::new(with_headers(&body));
    let mut urls = Vec::new();
    for _ in 0..SIDECARS {
        urls.push(answering_sidecar(reply.clone()).await);
    }
    let settings = CollectorSettings {
        sidecar_timeout: Duration::from_secs(10),
        ..CollectorSettings::default()
    };
    let budget = settings.sidecar_byte_budget;
    assert_eq!(budget, 32 << 20, "the default budget");
    let collector = discovering(&urls, settings).await;

    let snapshot = collector.refresh().await;

    assert!(
        snapshot.sidecar_bytes_read <= budget,
        "read {} bytes, over the budget of {budget}",
        snapshot.sidecar_bytes_read
    );
    let answered: Vec<_> = snapshot
        .sidecars
        .iter()
        .filter_map(|report| report.status.as_ref())
        .collect();
    assert!(!answered.is_empty(), "some fit in the budget");
    assert!(
        answered.len() * body.len() <= budget,
        "{} answers of {} bytes kept",
        answered.len(),
        body.len()
    );
    for status in &answered {
        assert_eq!(status.leases.len(), KEPT_LEASES, "held leases capped");
    }
    let over = SidecarProblem::OverBudget.as_str();
    let refused = snapshot
        .sidecars
        .iter()
        .filter(|report| report.error.as_deref() == Some(over))
        .count();
    assert_eq!(refused, SIDECARS - answered.len(), "the rest are refused");
    let health = snapshot
        .sources
        .iter()
        .find(|source| source.name == "sidecars")
        .unwrap();
    assert!(
        health.error.as_deref().unwrap_or_default().contains(over),
        "{health:?}"
    );
}

/// Redis down blinds nothing else: with `REDIS_URL` pointing at a port that
/// refuses connections, the pool source shows its error within 3 s, and the
/// lease table keeps its 2 s refresh (before, every read of the pool waited
/// for the Redis client's ~9.5 s of reconnect attempts, and each refresh with
/// it). Fails when the pool is read inline again or the client's retries
/// come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_shows_within_3_s_and_the_lease_table_keeps_its_refresh() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let pool = leasehold_pool::bus::BusConnector::redis(format!("redis://{closed}")).unwrap();
    let target = MemoryTarget::default();
    target.store().register("s-1", 0).await.unwrap();
    let collector = Arc::new(Collector::new(
        Sources {
            leases: target.store(),
            pool: Some(Arc::new(pool)),
            sidecars: Vec::new(),
            discovery: DiscoveryPolicy::dev(),
        },
        CollectorSettings::default(),
        Arc::new(SystemClock),
    ));
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(collector.clone().run(stop.clone()));
    let began = Instant::now();
    let shown = loop {
        let snapshot = collector.latest();
        let pool = snapshot.sources.iter().find(|s| s.name == "pool");
        if let Some(error) = pool.and_then(|p| p.error.clone()) {
            break (began.elapsed(), error);
        }
        assert!(
            began.elapsed() < Duration::from_secs(3),
            "no pool error after 3 s: {:?}",
            snapshot.sources
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!("the pool's error showed after {:?}: {}", shown.0, shown.1);
    // Snapshots over the next 8 s: one per 2 s refresh.
    let from = collector.latest().taken_at_ms;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let to = collector.latest().taken_at_ms;
    let generation = collector.generation();
    stop.cancel();
    task.await.unwrap();
    assert!(
        to - from >= 6_000,
        "the lease table refreshed only {} ms further in 8 s",
        to - from
    );
    assert!(generation >= 5, "{generation} snapshots");
}
