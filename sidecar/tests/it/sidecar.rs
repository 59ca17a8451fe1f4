//! A running sidecar fed by a real worker-side shipper over loopback.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_control::clock::SystemClock;
use leasehold_control::keeper::{KeeperConfig, LeaseKeeper};
use leasehold_control::pacing::ScanPacing;
use leasehold_control::store::intercept::{Intercepted, Interceptor, StoreOp};
use leasehold_control::store::memory::MemoryLeaseStore;
use leasehold_control::store::{LeaseError, LeaseStore};
use leasehold_sidecar::observer::ObserverConfig;
use leasehold_sidecar::{Sidecar, SidecarConfig};
use leasehold_telemetry::testing::{every_event, every_label_value};
use leasehold_telemetry::transport::{BufferedShipper, PREAMBLE, ShipperConfig};
use leasehold_telemetry::{LogSink, TelemetryEvent, TelemetrySink};
use leasehold_testkit::{http_get, promtool};
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

fn config(observer: Option<ObserverConfig>) -> SidecarConfig {
    SidecarConfig {
        worker_silence: Duration::from_millis(800),
        observer,
        ..SidecarConfig::loopback()
    }
}

fn shipper(sidecar: &Sidecar, shutdown: CancellationToken) -> BufferedShipper {
    BufferedShipper::start(
        ShipperConfig {
            heartbeat: Duration::from_millis(200),
            ..ShipperConfig::new(sidecar.telemetry_addr.to_string(), "stream-worker", "w1")
        },
        shutdown,
    )
}

async fn metrics_text(sidecar: &Sidecar) -> String {
    let (status, head, body) = http_get(&sidecar.http_addr.to_string(), "/metrics")
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert!(
        head.to_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    body
}

async fn status(sidecar: &Sidecar) -> serde_json::Value {
    let (code, _, body) = http_get(&sidecar.http_addr.to_string(), "/status")
        .await
        .unwrap();
    assert_eq!(code, 200);
    serde_json::from_str(&body).unwrap()
}

async fn wait_for<F: Future<Output = bool>>(mut check: impl FnMut() -> F) {
    for _ in 0..500 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("condition not reached in 10 s");
}

fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|line| line.starts_with(series) && line[series.len()..].starts_with(' '))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn events_become_the_contract_metrics_and_status() {
    let shutdown = CancellationToken::new();
    let sidecar = Sidecar::start(config(None), shutdown.clone())
        .await
        .unwrap();
    let worker_stop = CancellationToken::new();
    let shipper = shipper(&sidecar, worker_stop.clone());
    let events = every_event();
    for event in &events {
        shipper.emit(event.clone());
    }
    wait_for(|| async {
        status(&sidecar).await["events_received"]
            .as_u64()
            .unwrap_or(0)
            > events.len() as u64
    })
    .await;
    let text = metrics_text(&sidecar).await;
    for (series, value) in [
        (
            r#"leasehold_lease_acquisitions_total{result="acquired"}"#,
            1.0,
        ),
        (
            r#"leasehold_lease_acquisitions_total{result="conflict"}"#,
            1.0,
        ),
        (r#"leasehold_lease_acquisitions_total{result="error"}"#, 1.0),
        (r#"leasehold_lease_renewals_total{result="renewed"}"#, 1.0),
        (r#"leasehold_lease_renewals_total{result="error"}"#, 1.0),
        (r#"leasehold_lease_losses_total{reason="fenced"}"#, 1.0),
        ("leasehold_lease_releases_total", 1.0),
        (r#"leasehold_websocket_reconnects_total{reason="gap"}"#, 1.0),
        (r#"leasehold_sink_writes_total{result="accepted"}"#, 10.0),
        (r#"leasehold_sink_writes_total{result="duplicate"}"#, 2.0),
        (r#"leasehold_sink_writes_total{result="error"}"#, 3.0),
        (
            r#"leasehold_checkpoint_commits_total{result="committed"}"#,
            1.0,
        ),
        (
            r#"leasehold_checkpoint_lag_events{stream_id="btc-usd"}"#,
            7.0,
        ),
        (
            r#"leasehold_checkpoint_lag_seconds{stream_id="btc-usd"}"#,
            1.5,
        ),
        ("leasehold_stream_gap_events_total", 5.0),
        (
            r#"leasehold_upstream_frames_skipped_total{reason="not_json"}"#,
            1.0,
        ),
        ("leasehold_lease_takeover_gap_seconds_count", 1.0),
        ("leasehold_lease_renew_duration_seconds_count", 1.0),
        ("leasehold_lease_renew_lateness_seconds_count", 1.0),
        ("leasehold_upstream_connects_throttled_total", 1.0),
        ("leasehold_upstream_subscribe_seconds_count", 1.0),
        (
            r#"leasehold_upstream_subscribe_seconds_bucket{le="0.25"}"#,
            0.0,
        ),
        (
            r#"leasehold_upstream_subscribe_seconds_bucket{le="0.5"}"#,
            1.0,
        ),
        (
            r#"leasehold_upstream_subscribe_seconds_bucket{le="60"}"#,
            1.0,
        ),
    ] {
        assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
    }
    // The worker's heartbeats carry its process (the shipper's own heartbeats
    // sample this test process, so only plausibility), and the sidecar's own
    // process is there in the standard names.
    for (series, at_least) in [
        ("leasehold_worker_resident_memory_bytes", 1e6),
        ("leasehold_worker_open_fds", 3.0),
        ("leasehold_worker_cpu_seconds_total", 0.0),
        ("process_resident_memory_bytes", 1e6),
    ] {
        assert!(
            sample(&text, series).is_some_and(|v| v >= at_least),
            "{series} in\n{text}"
        );
    }
    // Gauges the sidecar derives: one stream lease held, one upstream open, worker up.
    wait_for(|| async {
        let text = metrics_text(&sidecar).await;
        sample(&text, "leasehold_worker_up") == Some(1.0)
            && text.contains(r#"component="stream-worker""#)
    })
    .await;
    let text = metrics_text(&sidecar).await;
    assert_eq!(sample(&text, "leasehold_leases_held"), Some(1.0));
    assert_eq!(sample(&text, "leasehold_websocket_connections"), Some(1.0));
    // The worker's report (2 connections, 7 streams on them), under its id.
    assert_eq!(
        sample(&text, r#"leasehold_upstream_connections{worker="w1"}"#),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "leasehold_upstream_streams_per_connection"),
        Some(3.5)
    );
    assert!(
        text.contains(r#"leasehold_build_info{version=""#)
            && text.contains(r#"component="stream-worker""#),
        "{text}"
    );
    assert!(
        text.contains("le=\"0.005\"") && text.contains("le=\"30\""),
        "explicit buckets: {text}"
    );
    let status = status(&sidecar).await;
    assert_eq!(status["component"], "stream-worker");
    assert_eq!(status["worker_up"], true);
    assert_eq!(status["leases"][0]["stream_id"], "btc-usd");
    assert_eq!(status["leases"][0]["fence_token"], 3);

    if let Some(promtool) = promtool() {
        let mut child = std::process::Command::new(promtool)
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "promtool check metrics:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    // The worker goes away: worker_up drops to 0 by itself, and so do its
    // upstream connections (a dead worker's are gone).
    worker_stop.cancel();
    wait_for(|| async {
        sample(&metrics_text(&sidecar).await, "leasehold_worker_up") == Some(0.0)
    })
    .await;
    wait_for(|| async {
        let text = metrics_text(&sidecar).await;
        sample(&text, r#"leasehold_upstream_connections{worker="w1"}"#) == Some(0.0)
            && sample(&text, "leasehold_upstream_streams_per_connection") == Some(0.0)
    })
    .await;
    shutdown.cancel();
}

/// `leasehold_upstream_connections{worker}`: the latest report of the worker
/// behind the sidecar, under the id its heartbeats carry, and only its: a
/// worker replaced behind the sidecar (a new `OWNER_ID`) leaves with its
/// series at once, not after the idle timeout.
#[tokio::test]
async fn upstream_connections_are_the_current_workers_latest_report() {
    let shutdown = CancellationToken::new();
    let sidecar = Sidecar::start(config(None), shutdown.clone())
        .await
        .unwrap();
    let text = sidecar.state.render();
    assert!(
        !text.contains("leasehold_upstream_connections{")
            && !text.contains("leasehold_upstream_streams_per_connection "),
        "no series before a worker reported: {text}"
    );
    let heartbeat = |owner: &str| TelemetryEvent::WorkerHeartbeat {
        component: "stream-worker".into(),
        owner_id: owner.into(),
        process: None,
    };
    let report = |connections, streams| TelemetryEvent::UpstreamConnections {
        connections,
        streams,
        open: Vec::new(),
    };
    sidecar.state.view().connection(true);
    for event in [heartbeat("w1"), report(1, 2), report(4, 10)] {
        sidecar.state.ingest(&event);
    }
    let text = sidecar.state.render();
    assert_eq!(
        sample(&text, r#"leasehold_upstream_connections{worker="w1"}"#),
        Some(4.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "leasehold_upstream_streams_per_connection"),
        Some(2.5)
    );
    // Set when reported, and re-set on every upkeep so it never idles out.
    sidecar.state.upkeep();
    assert_eq!(
        sample(
            &sidecar.state.render(),
            r#"leasehold_upstream_connections{worker="w1"}"#
        ),
        Some(4.0)
    );
    // A new worker behind the sidecar: w1's series is gone at once.
    for event in [heartbeat("w2"), report(2, 2)] {
        sidecar.state.ingest(&event);
    }
    let text = sidecar.state.render();
    assert_eq!(
        sample(&text, r#"leasehold_upstream_connections{worker="w2"}"#),
        Some(2.0),
        "{text}"
    );
    assert!(!text.contains(r#"worker="w1""#), "{text}");
    assert_eq!(
        sample(&text, "leasehold_upstream_streams_per_connection"),
        Some(1.0)
    );
    shutdown.cancel();
}

#[tokio::test]
async fn garbage_on_the_socket_is_counted_and_the_sidecar_keeps_serving() {
    let shutdown = CancellationToken::new();
    let sidecar = Sidecar::start(config(None), shutdown.clone())
        .await
        .unwrap();
    let addr = sidecar.telemetry_addr;
    // Wrong protocol entirely.
    let mut http = tokio::net::TcpStream::connect(addr).await.unwrap();
    http.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    // Right preamble, then a frame that is not an event.
    let mut garbage = tokio::net::TcpStream::connect(addr).await.unwrap();
    garbage.write_all(&PREAMBLE).await.unwrap();
    garbage.write_all(&[0, 0, 0, 5]).await.unwrap();
    garbage.write_all(b"{nope").await.unwrap();
    // Right preamble, then a frame claiming to be larger than the limit.
    let mut huge = tokio::net::TcpStream::connect(addr).await.unwrap();
    huge.write_all(&PREAMBLE).await.unwrap();
    huge.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    wait_for(|| async {
        let text = metrics_text(&sidecar).await;
        ["preamble", "decode", "frame"].iter().all(|reason| {
            sample(
                &text,
                &format!(r#"leasehold_sidecar_transport_errors_total{{reason="{reason}"}}"#),
            ) == Some(1.0)
        })
    })
    .await;
    // A real worker still gets through.
    let shipper = shipper(&sidecar, shutdown.clone());
    shipper.emit(TelemetryEvent::LeaseReleased {
        stream_id: "s".into(),
        fence_token: 1,
    });
    wait_for(|| async {
        sample(
            &metrics_text(&sidecar).await,
            "leasehold_lease_releases_total",
        ) == Some(1.0)
    })
    .await;
    shutdown.cancel();
}

/// The in-memory store with a switch that makes every call fail (a partition),
/// and one that fails only listing (scans throttled or denied, renewals fine).
type Partitionable = Intercepted<MemoryLeaseStore, Partition>;

#[derive(Default)]
struct Partition {
    down: AtomicBool,
    scans_down: AtomicBool,
}

#[async_trait]
impl Interceptor for Partition {
    async fn before(&self, op: StoreOp<'_>) -> Result<(), LeaseError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(LeaseError::Transient {
                message: "partitioned".into(),
            });
        }
        if matches!(op, StoreOp::List { .. }) && self.scans_down.load(Ordering::SeqCst) {
            return Err(LeaseError::Transient {
                message: "scan throttled".into(),
            });
        }
        Ok(())
    }
}

fn partitionable(table: Arc<MemoryLeaseStore>) -> Arc<Partitionable> {
    Arc::new(Intercepted::new(table, Partition::default()))
}

fn observer(store: Arc<dyn LeaseStore>, owner: &str) -> ObserverConfig {
    let keeper = LeaseKeeper::new(
        store,
        Arc::new(SystemClock),
        Arc::new(LogSink),
        KeeperConfig {
            owner_id: owner.into(),
            lease: Duration::from_millis(1500),
            renew_interval: Duration::from_millis(500),
            safety_margin: Duration::from_millis(150),
            skew_margin: Duration::from_millis(100),
            ..KeeperConfig::default()
        },
    );
    ObserverConfig {
        keeper,
        clock: Arc::new(SystemClock),
        pacing: ScanPacing::new(Duration::from_millis(200), 1_000),
        pool: None,
    }
}

#[tokio::test]
async fn exactly_one_observer_publishes_and_another_takes_over() {
    let table = Arc::new(MemoryLeaseStore::new());
    for stream in ["a", "b", "c"] {
        table.register(stream, 0).await.unwrap();
    }
    let a_store = partitionable(table.clone());
    let shutdown = CancellationToken::new();
    let a = Sidecar::start(
        config(Some(observer(a_store.clone(), "sidecar-a"))),
        shutdown.clone(),
    )
    .await
    .unwrap();
    wait_for(|| async {
        sample(
            &metrics_text(&a).await,
            r#"leasehold_streams{state="unowned"}"#,
        ) == Some(3.0)
    })
    .await;
    let b = Sidecar::start(
        config(Some(observer(table.clone(), "sidecar-b"))),
        shutdown.clone(),
    )
    .await
    .unwrap();
    for _ in 0..10 {
        assert!(
            !metrics_text(&b).await.contains("leasehold_streams"),
            "two observers publish at once"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A is cut off from the table: it must stop publishing, and B must take over
    // within about a lease period.
    a_store.interceptor().down.store(true, Ordering::SeqCst);
    let cut = std::time::Instant::now();
    wait_for(|| async { !metrics_text(&a).await.contains("leasehold_streams") }).await;
    wait_for(|| async {
        sample(
            &metrics_text(&b).await,
            r#"leasehold_streams{state="unowned"}"#,
        ) == Some(3.0)
    })
    .await;
    assert!(
        cut.elapsed() < Duration::from_secs(5),
        "takeover took {:?}",
        cut.elapsed()
    );
    assert_eq!(status(&b).await["observer"], true);
    assert_eq!(status(&a).await["observer"], false);
    shutdown.cancel();
}

/// Counter series on a `/metrics` render, with their values.
fn counter_series(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .filter(|(series, _)| {
            // leasehold's own counters (process_* are the sidecar's process).
            series
                .split('{')
                .next()
                .is_some_and(|name| name.starts_with("leasehold_") && name.ends_with("_total"))
        })
        .map(|(series, value)| (series.to_owned(), value.to_owned()))
        .collect()
}

/// Design: counters with closed label sets exist at 0 from the start, so
/// `increase()` sees a task's first event. Every counter series any event
/// creates must already be there, at 0.
#[tokio::test]
async fn every_closed_label_counter_exists_at_zero_from_the_start() {
    let shutdown = CancellationToken::new();
    let sidecar = Sidecar::start(config(None), shutdown.clone())
        .await
        .unwrap();
    let at_start = counter_series(&sidecar.state.render());
    assert_eq!(
        at_start
            .get("leasehold_sink_give_ups_total")
            .map(String::as_str),
        Some("0")
    );
    assert!(at_start.values().all(|value| value == "0"), "{at_start:?}");
    // As from a connected worker: per-stream series are exported only for one.
    sidecar.state.view().connection(true);
    for event in every_event().into_iter().chain(every_label_value()) {
        sidecar.state.ingest(&event);
    }
    let after = counter_series(&sidecar.state.render());
    let created: Vec<&String> = after
        .keys()
        .filter(|s| !at_start.contains_key(*s))
        .collect();
    assert!(
        created.is_empty(),
        "counter series that did not exist at 0 from the start: {created:?}"
    );
    shutdown.cancel();
}

/// The observer publishes how long the oldest stream has gone without an owner,
/// and when its scans fail it counts them while the last-scan time stands still
/// (the cluster gauges would otherwise freeze silently).
#[tokio::test]
async fn the_observer_publishes_the_unowned_age_and_counts_failed_scans() {
    let table = Arc::new(MemoryLeaseStore::new());
    let now = leasehold_control::clock::unix_ms(std::time::SystemTime::now());
    table
        .register("registered-90s-ago", now - 90_000)
        .await
        .unwrap();
    let store = partitionable(table);
    let shutdown = CancellationToken::new();
    let sidecar = Sidecar::start(
        config(Some(observer(store.clone(), "sidecar-a"))),
        shutdown.clone(),
    )
    .await
    .unwrap();
    wait_for(|| async {
        sample(
            &metrics_text(&sidecar).await,
            "leasehold_stream_unowned_age_seconds",
        )
        .is_some_and(|age| (90.0..100.0).contains(&age))
    })
    .await;
    let text = metrics_text(&sidecar).await;
    assert_eq!(
        sample(&text, "leasehold_observer_scan_errors_total"),
        Some(0.0)
    );
    let scanned =
        sample(&text, "leasehold_observer_last_scan_timestamp_seconds").expect("scan time");
    assert!((scanned - now as f64 / 1000.0).abs() < 10.0, "{scanned}");

    store.interceptor().scans_down.store(true, Ordering::SeqCst);
    wait_for(|| async {
        sample(
            &metrics_text(&sidecar).await,
            "leasehold_observer_scan_errors_total",
        )
        .is_some_and(|errors| errors >= 2.0)
    })
    .await;
    let frozen = sample(
        &metrics_text(&sidecar).await,
        "leasehold_observer_last_scan_timestamp_seconds",
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text = metrics_text(&sidecar).await;
    assert_eq!(
        sample(&text, "leasehold_observer_last_scan_timestamp_seconds"),
        frozen
    );
    assert_eq!(
        status(&sidecar).await["observer"],
        true,
        "renewals still succeed"
    );
    shutdown.cancel();
}
