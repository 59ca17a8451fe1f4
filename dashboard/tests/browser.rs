//! The 10,000-stream page in a real browser: the dashboard served in-process
//! over the in-memory store, loaded in headless Chromium with the refresh
//! script running; every row must be in the rendered DOM.

use std::net::SocketAddr;
use std::sync::Arc;

use leasehold_control::clock::SystemClock;
use leasehold_control::conformance::{ConformanceTarget, MemoryTarget};
use leasehold_dashboard::testing::seed_many;
use leasehold_dashboard::{CollectorSettings, Dashboard, DashboardConfig, Sources};
use leasehold_testkit::{chromium, headless_chromium};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_streams_render_in_chromium() {
    let Some(chromium) = chromium() else { return };
    let target = MemoryTarget::default();
    let now = leasehold_control::clock::unix_ms(std::time::SystemTime::now());
    seed_many(&target, 10_000, now).await;
    let shutdown = CancellationToken::new();
    let dashboard = Dashboard::start(
        DashboardConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            token: None,
            access: Default::default(),
            sources: Sources {
                leases: target.store(),
                pool: None,
                sidecars: Vec::new(),
                discovery: Default::default(),
            },
            // The page refreshes at the collector's paced interval, 10 s for
            // 10,000 records by default; a faster scan budget keeps it at 2 s so
            // the refresh script runs within Chromium's time budget.
            settings: CollectorSettings {
                scan_items_per_second: 100_000,
                ..CollectorSettings::default()
            },
            clock: Arc::new(SystemClock),
            sink: None,
            grafana: None,
        },
        shutdown.clone(),
    )
    .await
    .unwrap();
    dashboard.collector.refresh().await;
    let url = format!("http://{}/streams?per_page=10000", dashboard.addr);
    let dom = tokio::task::spawn_blocking(move || {
        headless_chromium(&chromium, &url, 2_500, &["--dump-dom"])
    })
    .await
    .unwrap();
    assert!(
        dom.contains("data-refreshed="),
        "the refresh script rebuilt the table"
    );
    assert_eq!(
        dom.matches("<tr><td><a href=\"/streams/stream-").count(),
        10_000
    );
    assert!(dom.contains(">stream-09999<") && dom.contains(">worker-19<"));
    assert!(dom.contains("10000 streams match; page 1 of 1."));

    // Search finds one stream among the 10,000, server-side, and the refresh
    // script keeps the search (the header counts stay whole-table).
    let url = format!("http://{}/streams?q=stream-04242", dashboard.addr);
    let chromium = leasehold_testkit::chromium().unwrap();
    let dom = tokio::task::spawn_blocking(move || {
        headless_chromium(&chromium, &url, 2_500, &["--dump-dom"])
    })
    .await
    .unwrap();
    assert!(dom.contains("data-refreshed="), "{dom}");
    assert!(dom.contains("1 streams match; page 1 of 1."), "{dom}");
    assert_eq!(dom.matches("<tr><td><a href=").count(), 1, "{dom}");
    assert!(dom.contains(">stream-04242<"));
    assert!(
        dom.contains("<b>10000</b>"),
        "header counts the whole table\n{dom}"
    );
    shutdown.cancel();
    dashboard.finished().await;
}
