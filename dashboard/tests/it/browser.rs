//! The 10,000-stream page in a real browser: the dashboard served in-process
//! over the in-memory store, loaded in headless Chromium with the refresh
//! script running; every row must be in the rendered DOM. A sidecar reports
//! data gaps on two of the streams: the script's rebuilt table, the stream
//! page and the timeline must show them.

use std::net::SocketAddr;
use std::sync::Arc;

use leasehold_control::clock::SystemClock;
use leasehold_dashboard::{CollectorSettings, Dashboard, DashboardConfig, Sources};
use leasehold_testkit::dashboard::{fake_sidecar, seed_many, status_with_gaps};
use leasehold_testkit::lease_store::{ConformanceTarget, MemoryTarget};
use leasehold_testkit::{chromium, headless_chromium};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_streams_render_in_chromium() {
    let Some(chromium) = chromium() else { return };
    let target = MemoryTarget::default();
    let now = leasehold_control::clock::unix_ms(std::time::SystemTime::now());
    seed_many(&target, 10_000, now).await;
    let sidecar = fake_sidecar(Arc::new(std::sync::Mutex::new(status_with_gaps(
        "worker-02",
        &[
            (1, 90_000, "stream-04242", 10, 19, "retention"),
            (2, 30_000, "stream-04242", 500, 500, "sink_lost"),
            (3, 20_000, "stream-00002", 7, 8, "no_replay"),
        ],
    ))))
    .await;
    let shutdown = CancellationToken::new();
    let dashboard = Dashboard::start(
        DashboardConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            token: None,
            access: Default::default(),
            sources: Sources {
                leases: target.store(),
                pool: None,
                sidecars: vec![sidecar],
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

    // Data gaps: the script rebuilds the two columns from the JSON (count,
    // the newest gap's age with its range and reason as the title), keeps
    // the gaps filter, and the page fits 1,400 px with them.
    let addr = dashboard.addr;
    let dom_of = |path: &str, extra: &'static [&'static str]| {
        let url = format!("http://{addr}{path}");
        let chromium = leasehold_testkit::chromium().unwrap();
        tokio::task::spawn_blocking(move || headless_chromium(&chromium, &url, 2_500, extra))
    };
    let wide: &[&str] = &["--dump-dom", "--window-size=1400,900"];
    let dom = dom_of("/streams?gaps=some&sort=gaps", wide).await.unwrap();
    assert!(dom.contains("data-refreshed="), "{dom}");
    assert!(dom.contains("2 streams match; page 1 of 1."), "{dom}");
    assert_eq!(dom.matches("<tr><td><a href=").count(), 2, "{dom}");
    assert!(
        dom.find(">stream-04242<") < dom.find(">stream-00002<"),
        "most gaps first\n{dom}"
    );
    for needle in [
        "data-kind=\"gap\">Last data gap</th>",
        "<td>2</td><td data-at=",
        "title=\"seq 500–500 missing (1 event): sink_lost\"",
        "title=\"seq 7–8 missing (2 events): no_replay\"",
        " s ago</td>",
        "<option value=\"some\" selected=\"\">",
    ] {
        assert!(dom.contains(needle), "/streams lacks {needle:?}\n{dom}");
    }
    let dom = dom_of("/streams", wide).await.unwrap();
    assert!(
        dom.contains("data-fits=\"true\""),
        "/streams overflows 1,400 px\n{dom}"
    );
    // The stream page lists them newest first; another stream says none.
    let dom = dom_of("/streams/stream-04242", wide).await.unwrap();
    let table = dom.split("id=\"stream-gaps\"").nth(1).unwrap_or_default();
    assert!(
        table.contains("<td>500–500</td><td>1</td>") && table.contains("<td>10–19</td><td>10</td>"),
        "{dom}"
    );
    assert!(table.find("500–500") < table.find("10–19"), "{table}");
    assert!(table.contains("<td>worker-02</td>"), "{table}");
    assert!(
        dom.contains("class=\"data-gap\""),
        "the lane marks them\n{dom}"
    );
    assert!(
        dom.contains("data-fits=\"true\""),
        "the stream page overflows\n{dom}"
    );
    let dom = dom_of("/streams/stream-00003", wide).await.unwrap();
    assert!(dom.contains("None recorded"), "{dom}");
    // The timeline marks them on their lanes, next to the owner bars.
    let dom = dom_of("/timeline?window=5m&q=stream-04242", wide)
        .await
        .unwrap();
    assert_eq!(dom.matches("class=\"data-gap\" d=").count(), 2, "{dom}");
    assert!(dom.contains("class=\"seg own-"), "{dom}");
    assert!(
        dom.contains("stream-04242: data gap, seq 500–500 missing (1 event): sink_lost, reported by worker-02"),
        "{dom}"
    );
    shutdown.cancel();
    dashboard.finished().await;
}
