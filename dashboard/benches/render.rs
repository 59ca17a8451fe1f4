//! Server-side render time with 10,000 streams: the whole streams view on one
//! page, its first (paginated) page, `/api/streams`, and one collector refresh
//! (scan + classification) on the in-memory store.
//!
//! `cargo bench -p leasehold-dashboard --bench render [-- --streams N --rounds N]`
//! Targets (issue #6): the 10,000-stream view ≤ 100 ms; a first page ≤ 20 ms.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use leasehold_control::conformance::{ConformanceTarget, MemoryTarget};
use leasehold_dashboard::http::{DashboardState, app};
use leasehold_dashboard::testing::{collector_at, seed_many};
use leasehold_testkit::measure::{arg, percentile};
use tower::ServiceExt;

const NOW: i64 = 1_800_000_000_000;

async fn time_route(router: &axum::Router, path: &str, rounds: usize) -> (Vec<Duration>, usize) {
    let mut times = Vec::with_capacity(rounds);
    let mut bytes = 0;
    for _ in 0..rounds {
        let started = Instant::now();
        let response = router
            .clone()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert!(
            response.status().is_success(),
            "{path}: {}",
            response.status()
        );
        bytes = response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .len();
        times.push(started.elapsed());
    }
    (times, bytes)
}

fn report(name: &str, times: &mut [Duration], bytes: usize) {
    println!(
        "{name:<44} p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms  ({:.1} KiB)",
        percentile(times, 50.0).as_secs_f64() * 1e3,
        percentile(times, 99.0).as_secs_f64() * 1e3,
        percentile(times, 100.0).as_secs_f64() * 1e3,
        bytes as f64 / 1024.0
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let streams = arg("--streams", 10_000) as usize;
    let rounds = arg("--rounds", 30) as usize;
    let target = MemoryTarget::default();
    seed_many(&target, streams, NOW).await;
    let collector = collector_at(target.store(), None, NOW);
    let mut refreshes = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        collector.refresh().await;
        refreshes.push(started.elapsed());
    }
    let router = app(Arc::new(DashboardState {
        collector,
        token: None,
        access: Default::default(),
    }));
    println!("dashboard render, {streams} streams, {rounds} rounds each");
    report("collector refresh (scan + classify)", &mut refreshes, 0);
    for (name, path) in [
        (
            "streams view, all on one page",
            format!("/streams?per_page={streams}"),
        ),
        ("streams view, first page (100)", "/streams".to_owned()),
        (
            "streams view, sorted by lag, first page",
            "/streams?sort=lag".to_owned(),
        ),
        (
            "/api/streams, all",
            format!("/api/streams?per_page={streams}"),
        ),
        ("/api/streams, first page (100)", "/api/streams".to_owned()),
        ("workers view (20 owners)", "/workers".to_owned()),
    ] {
        let (mut times, bytes) = time_route(&router, &path, rounds).await;
        report(name, &mut times, bytes);
    }
}
