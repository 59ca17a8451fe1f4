//! The dashboard end to end: a seeded cluster (leases in every state on the
//! DynamoDB-compatible server, pool keys and a maintenance report in Redis, a
//! sidecar with a live worker), `leasehold dashboard` as a real process, and
//! Debian's Chromium loading it headless: the rendered DOM is checked (after
//! the refresh script ran) and a screenshot is saved under `test-output/`.
//!
//! A second test drives `leasehold dev --chaos` until a takeover and a fenced
//! write happened, then checks the pictures from Chromium's DOM: the timeline's
//! segments and tokens around the takeover, the fenced-write mark, the
//! per-stream page's owner history, an in-place update (conditional GET), and
//! that no view overflows a 1,400 × 900 window. `LEASEHOLD_SCREENSHOTS=docs`
//! also writes every view's screenshot into `docs/` for the README.

use std::sync::Arc;
use std::time::Duration;

use crate::support::{serial, spawn_dev_chaos, spawn_leasehold};
use leasehold_control::clock::unix_ms;
use leasehold_sidecar::{Sidecar, SidecarConfig};
use leasehold_telemetry::transport::{BufferedShipper, ShipperConfig};
use leasehold_telemetry::{TelemetryEvent, TelemetrySink};
use leasehold_testkit::dashboard::{
    MARKUP_STREAM, SECRET_CANARY, SEEDED_STREAMS_VIEW, seed_leases, seed_pool,
};
use leasehold_testkit::lease_store::DynamoTarget;
use leasehold_testkit::{chromium, headless_chromium, http_get, redis_url, repo_root};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// The dashboard's Redis database, apart from the broker tests' keys.
const DASHBOARD_DB: u32 = 7;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_cluster_renders_in_headless_chromium() {
    let (Some(target), Some(redis), Some(chromium)) =
        (DynamoTarget::create().await, redis_url(), chromium())
    else {
        return;
    };
    let _serial = serial().await;
    // Seeded a few seconds ahead so `eth-usd` is still "expiring" (not yet
    // expired) while the browser loads the page.
    let now = unix_ms(std::time::SystemTime::now()) + 4_000;
    seed_leases(&target, now).await;
    let redis_db = format!("{}/{DASHBOARD_DB}", redis.trim_end_matches('/'));
    let mut connection =
        redis::aio::ConnectionManager::new(redis::Client::open(redis_db.as_str()).unwrap())
            .await
            .unwrap();
    redis::cmd("FLUSHDB")
        .query_async::<()>(&mut connection)
        .await
        .unwrap();
    let bus = leasehold_pool::bus::redis::RedisPoolBus::connect(&redis_db)
        .await
        .unwrap();
    seed_pool(&bus, now).await.unwrap();

    // A sidecar with a live worker reporting lag for one of its streams.
    let shutdown = CancellationToken::new();
    let sidecar = Sidecar::start(SidecarConfig::loopback(), shutdown.clone())
        .await
        .unwrap();
    let shipper = Arc::new(BufferedShipper::start(
        ShipperConfig::new(
            sidecar.telemetry_addr.to_string(),
            "stream-worker",
            "worker-a",
        ),
        shutdown.clone(),
    ));
    shipper.emit(TelemetryEvent::StreamLag {
        stream_id: "btc-usd".into(),
        lag_events: 17,
        lag_seconds: 0.8,
        last_event_age_seconds: 42.5,
        event_lag_seconds: None,
    });
    // Its upstream connections: btc-usd rides on connection 7, replaced
    // once before its age.
    shipper.emit(TelemetryEvent::UpstreamConnections {
        connections: 2,
        streams: 301,
        open: vec![
            leasehold_telemetry::status::UpstreamConnection {
                id: 7,
                opened_at_ms: unix_ms(std::time::SystemTime::now()) - 90_000,
                streams: 300,
                replacements: 1,
                subscribe_seconds: Some(0.42),
            },
            leasehold_telemetry::status::UpstreamConnection {
                id: 9,
                opened_at_ms: unix_ms(std::time::SystemTime::now()) - 5_000,
                streams: 1,
                replacements: 0,
                subscribe_seconds: None,
            },
        ],
    });
    shipper.emit(TelemetryEvent::UpstreamSubscribed {
        stream_id: "btc-usd".into(),
        duration: Duration::from_millis(420),
        connection: Some(7),
    });
    shipper.emit(TelemetryEvent::UpstreamConnectThrottled {
        stream_id: "eth-usd".into(),
        wait: Duration::from_secs(2),
    });

    let endpoint = leasehold_testkit::dynamodb_endpoint().unwrap();
    let dashboard = spawn_leasehold(
        "dashboard",
        &["dashboard", "--listen", "127.0.0.1:0"],
        &[
            (
                "LEASE_TABLE".into(),
                target.dynamo_store().table().to_owned(),
            ),
            ("AWS_ENDPOINT_URL".into(), endpoint),
            ("AWS_REGION".into(), "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID".into(), "test".into()),
            ("AWS_SECRET_ACCESS_KEY".into(), "test".into()),
            ("REDIS_URL".into(), redis_db.clone()),
            (
                "DASHBOARD_SIDECARS".into(),
                format!("http://{}", sidecar.http_addr),
            ),
            ("DASHBOARD_REFRESH_MS".into(), "500".into()),
        ],
    );
    let line = dashboard.wait_line("dashboard: http://", Duration::from_secs(20));
    let base = line
        .split_whitespace()
        .last()
        .unwrap()
        .trim_end_matches('/')
        .to_owned();
    // Two refreshes: the lag sample and the sidecar status are in.
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    let chromium_run = {
        let chromium = chromium.clone();
        let base = base.clone();
        move |path: &str, extra: Vec<String>| {
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            headless_chromium(&chromium, &format!("{base}{path}"), 3_000, &extra)
        }
    };
    let dom = tokio::task::spawn_blocking({
        let run = chromium_run.clone();
        move || run("/streams", vec!["--dump-dom".into()])
    })
    .await
    .unwrap();
    assert!(
        dom.contains("data-refreshed="),
        "the refresh script ran against the JSON API\n{dom}"
    );
    // Also btc-usd's lag and the age of its last event, which only worker-a's
    // sidecar knows.
    for needle in SEEDED_STREAMS_VIEW.iter().chain(&[">17<"]) {
        assert!(dom.contains(needle), "rendered DOM lacks {needle:?}\n{dom}");
    }
    // The sidecar ages the reported 42.5 s from its report: a worker that
    // stopped reporting does not stay "fresh".
    let aged =
        (425..=600).any(|tenths| dom.contains(&format!(">{}.{} s<", tenths / 10, tenths % 10)));
    assert!(
        aged,
        "rendered DOM lacks a last-event age from 42.5 s up\n{dom}"
    );
    // Markup in a stream id stays text through both the server render and the script.
    assert!(
        dom.contains("&lt;img src=x onerror=alert(1)&gt;&lt;script&gt;"),
        "{dom}"
    );
    assert!(
        !dom.contains("<img"),
        "a stream id became an element\n{dom}"
    );
    assert!(!dom.contains(SECRET_CANARY));
    assert!(
        !dom.contains(MARKUP_STREAM) && !dom.contains("<b onmouseover"),
        "{dom}"
    );

    for (path, needles) in [
        ("/workers", &["worker-a", "stream-worker", "/status"][..]),
        // Rebuilt by the script from /api/connections: the per-worker sums
        // and each listed connection, aged from its opening.
        (
            "/connections",
            &[
                "2 connections open on 1 stream workers; 1 connects waited",
                ">301<",
                ">300<",
                ">0.4 s<",
                // Opened 90 s before the test started: a minute and more.
                "\">1 m ",
            ][..],
        ),
        (
            "/streams/btc-usd",
            &[
                "#7 of worker-a: 300 streams on it, opened 1 m ",
                "replaced 1× before its age",
            ][..],
        ),
        ("/pool", &["pool-7", "u42", "pool-3", "i-0abc123"][..]),
        (
            "/anomalies",
            &[
                "badge badge-orphan_mark",
                "badge badge-duplicate_worker",
                "old999",
            ][..],
        ),
    ] {
        let dom = tokio::task::spawn_blocking({
            let run = chromium_run.clone();
            move || run(path, vec!["--dump-dom".into()])
        })
        .await
        .unwrap();
        for needle in needles {
            assert!(dom.contains(needle), "{path} lacks {needle:?}\n{dom}");
        }
        assert!(!dom.contains(SECRET_CANARY), "{path} shows a secret");
    }

    let shots = repo_root().join("test-output/dashboard");
    std::fs::create_dir_all(&shots).unwrap();
    for (path, file) in [
        ("/streams", "streams.png"),
        ("/pool", "pool.png"),
        ("/workers", "workers.png"),
    ] {
        let png = shots.join(file);
        let _ = std::fs::remove_file(&png);
        let arg = format!("--screenshot={}", png.display());
        tokio::task::spawn_blocking({
            let run = chromium_run.clone();
            move || run(path, vec![arg, "--window-size=1600,900".into()])
        })
        .await
        .unwrap();
        let bytes =
            std::fs::read(&png).unwrap_or_else(|_| panic!("no screenshot at {}", png.display()));
        assert!(
            bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
            "{file} is not a PNG"
        );
        assert!(
            bytes.len() > 20_000,
            "{file} is suspiciously small: {} bytes",
            bytes.len()
        );
    }
    drop(dashboard);
    shutdown.cancel();
    sidecar.finished().await;
}

async fn api(addr: &str, path: &str) -> Value {
    let (status, _, body) = http_get(addr, path).await.expect("dashboard answers");
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).expect("JSON")
}

/// Loads `path` in headless Chromium at 1,400 × 900 and returns the DOM after
/// `budget_ms` of (virtual) time.
async fn dom_of(chromium: &str, addr: &str, path: &str, budget_ms: u64) -> String {
    let (chromium, url) = (chromium.to_owned(), format!("http://{addr}{path}"));
    tokio::task::spawn_blocking(move || {
        headless_chromium(
            &chromium,
            &url,
            budget_ms,
            &["--dump-dom", "--window-size=1400,900"],
        )
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_chaos_timeline_stream_page_and_live_updates_in_chromium() {
    let Some(chromium) = chromium() else { return };
    let _serial = serial().await;
    let (mut dev, addr) = spawn_dev_chaos("dev", Duration::from_secs(30));

    // Wait for a takeover and for a fenced write (a paused worker's writes
    // meeting the newer token) to be in the timeline.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let (takeover, fenced_stream) = loop {
        let changes = api(&addr, "/api/changes").await;
        let takeover = changes["changes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["kind"] == "takeover" && c["missed"] == 0)
            .cloned();
        let timeline = api(&addr, "/api/timeline?window=5m").await;
        let fenced = timeline["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|lane| !lane["fenced"].as_array().unwrap().is_empty())
            .map(|lane| lane["stream_id"].as_str().unwrap().to_owned());
        if let (Some(takeover), Some(fenced)) = (takeover, fenced) {
            break (takeover, fenced);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no takeover and fenced write within 120 s\n{}",
            dev.output()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let stream = takeover["stream_id"].as_str().unwrap();
    let old_owner = takeover["old_owner"].as_str().unwrap();
    let new_owner = takeover["new_owner"].as_str().unwrap();
    let token = takeover["fence_token"].as_u64().unwrap();

    // The timeline: the lane of that stream has the old owner's segment with
    // the token before and the new owner's with the token after.
    let timeline = dom_of(&chromium, &addr, "/timeline?window=5m", 2_500).await;
    for (owner, token) in [(old_owner, token - 1), (new_owner, token)] {
        let segment =
            format!("data-stream=\"{stream}\" data-owner=\"{owner}\" data-token=\"{token}\"");
        assert!(
            timeline.contains(&segment),
            "timeline lacks {segment}\n{timeline}"
        );
    }
    assert!(timeline.contains("class=\"seg gap\""), "{timeline}");
    let mark = "class=\"fenced\"";
    assert!(
        timeline.contains(mark) && timeline.contains(&format!("data-stream=\"{fenced_stream}\"")),
        "no fenced-write mark on {fenced_stream}\n{timeline}"
    );
    assert!(timeline.contains("fenced write(s) from"), "{timeline}");
    // Updated in place: a newer snapshot's render replaced the live region.
    let updates = |dom: &str| -> u64 {
        dom.split("data-updates=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    assert!(updates(&timeline) >= 1, "no in-place update\n{timeline}");

    // The per-stream page shows the owner history with the tokens.
    let page = dom_of(&chromium, &addr, &format!("/streams/{stream}"), 1_500).await;
    assert!(page.contains("id=\"owner-history\""), "{page}");
    assert!(page.contains("badge badge-takeover"), "{page}");
    for needle in [old_owner, new_owner, &format!("<td>{token}</td>")] {
        assert!(
            page.contains(needle),
            "stream page lacks {needle:?}\n{page}"
        );
    }

    // `dev` shares its sink with the dashboard: the page shows the sink's
    // last seq (a number) next to the checkpoint.
    let sink_seq = page
        .split("id=\"stream-sink-seq\">")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .unwrap_or_default();
    assert!(
        sink_seq.parse::<u64>().is_ok(),
        "sink last seq {sink_seq:?}\n{page}"
    );
    let trends = dom_of(&chromium, &addr, "/trends", 1_500).await;
    assert!(
        trends.contains("Claim latency, 99th percentile"),
        "{trends}"
    );

    // No view overflows 1,400 px (the script records whether the page fits).
    let mut shots = Vec::new();
    for (path, file) in [
        ("/streams", "dashboard-streams.png"),
        ("/timeline", "dashboard-timeline.png"),
        ("/timeline?by=worker", "dashboard-timeline-workers.png"),
        ("/trends", "dashboard-trends.png"),
        (
            &format!("/streams/{stream}") as &str,
            "dashboard-stream.png",
        ),
        ("/workers", "dashboard-workers.png"),
        ("/pool", "dashboard-pool.png"),
        ("/anomalies", "dashboard-anomalies.png"),
        ("/changes", "dashboard-changes.png"),
    ] {
        let dom = dom_of(&chromium, &addr, path, 1_500).await;
        assert!(
            dom.contains("data-fits=\"true\""),
            "{path} overflows 1,400 px\n{dom}"
        );
        shots.push((path.to_owned(), file));
    }
    let into_docs = std::env::var("LEASEHOLD_SCREENSHOTS").as_deref() == Ok("docs");
    let dir = if into_docs {
        repo_root().join("docs")
    } else {
        repo_root().join("test-output/dashboard")
    };
    std::fs::create_dir_all(&dir).unwrap();
    for (path, file) in shots {
        let png = dir.join(file);
        let _ = std::fs::remove_file(&png);
        let (chromium, url) = (chromium.clone(), format!("http://{addr}{path}"));
        let arg = format!("--screenshot={}", png.display());
        tokio::task::spawn_blocking(move || {
            headless_chromium(&chromium, &url, 1_500, &[&arg, "--window-size=1400,900"])
        })
        .await
        .unwrap();
        let bytes = std::fs::read(&png).unwrap_or_else(|_| panic!("no {}", png.display()));
        assert!(
            bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
            "{file} is not a PNG"
        );
    }

    dev.signal("INT");
    let status = dev.wait_exit(Duration::from_secs(30));
    assert!(
        status.success(),
        "dev did not exit cleanly\n{}",
        dev.output()
    );
}
