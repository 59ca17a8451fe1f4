//! Server-side render time with 10,000 streams: the whole streams view on one
//! page, its first (paginated) page, `/api/streams`, and one collector refresh
//! (scan + classification) on the in-memory store; then, with 24 h of history
//! (50,000 ownership changes, the count bound, spread over 24 h; 1,000 fenced
//! writes; full trend rings; the gap log full, 20,000 data gaps over the
//! streams, each row carrying its tally), the timeline, the per-stream page and the trends,
//! and what one live update costs: a 304 when nothing changed, and the bytes of
//! a changed page with gzip and br.
//!
//! `cargo bench -p leasehold-dashboard --bench render [-- --streams N --rounds N]`
//! Targets (issues #6, #17): a full page ≤ 100 ms; an update ≤ 20 ms.
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use leasehold_dashboard::Collector;
use leasehold_dashboard::model::changes::{Change, ChangeKind, FencedWrite};
use leasehold_dashboard::model::gaps::{DataGap, GAPS_KEPT, GAPS_PER_STREAM};
use leasehold_dashboard::web::{DashboardState, app};
use leasehold_testkit::dashboard::{collector_at, seed_many};
use leasehold_testkit::lease_store::{ConformanceTarget, MemoryTarget};
use leasehold_testkit::measure::{arg, percentile};
use tower::ServiceExt;

const NOW: i64 = 1_800_000_000_000;

/// Every round after a new snapshot generation, so each request renders (the
/// figure a page costs, not a shared render).
async fn time_route(
    router: &axum::Router,
    collector: &Collector,
    path: &str,
    rounds: usize,
) -> (Vec<Duration>, usize) {
    time_request(router, Some(collector), path, &[], rounds).await
}

/// Times `rounds` requests. With `fresh`, a new snapshot generation is
/// published before each (outside the timing): the request is the first after
/// a new snapshot and renders. Without it, the requests are the other clients
/// of one snapshot (or, with `If-None-Match`, the 304).
async fn time_request(
    router: &axum::Router,
    fresh: Option<&Collector>,
    path: &str,
    headers: &[(&str, &str)],
    rounds: usize,
) -> (Vec<Duration>, usize) {
    let mut times = Vec::with_capacity(rounds);
    let mut bytes = 0;
    for _ in 0..rounds {
        if let Some(collector) = fresh {
            collector.republish();
        }
        let started = Instant::now();
        let mut request = Request::get(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = router
            .clone()
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert!(
            response.status().is_success() || response.status().as_u16() == 304,
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
    fill_history(&collector, streams);
    // One more refresh carries the gaps' tallies into the rows.
    collector.refresh().await;
    let state = Arc::new(DashboardState {
        collector: collector.clone(),
        token: None,
        access: Default::default(),
        sink: None,
        grafana: None,
        renders: Default::default(),
    });
    let router = app(state.clone());
    let views = leasehold_dashboard::web::views(state.clone());
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
        let (mut times, bytes) = time_route(&router, &collector, &path, rounds).await;
        report(name, &mut times, bytes);
    }
    println!(
        "with 24 h of history (50,000 changes, 1,000 fenced writes, full trend rings, 20,000 data gaps):"
    );
    for (name, path) in [
        (
            "timeline, 24 h, per stream (50 lanes)",
            "/timeline?window=24h",
        ),
        (
            "timeline, 24 h, per worker (50 lanes)",
            "/timeline?window=24h&by=worker",
        ),
        ("timeline, default window", "/timeline"),
        ("/api/timeline, 24 h", "/api/timeline?window=24h"),
        ("per-stream page", "/streams/stream-04242"),
        ("/api/streams/{id}", "/api/streams/stream-04242"),
        ("trends page", "/trends"),
        (
            "streams view, sorted by data gaps, first page",
            "/streams?sort=gaps",
        ),
        ("streams view, with data gaps only", "/streams?gaps=some"),
    ] {
        let (mut times, bytes) = time_route(&router, &collector, path, rounds).await;
        report(name, &mut times, bytes);
    }
    println!("one live update, as a client sees it:");
    println!("  [render] a new snapshot, the client asks before any render of it: renders and");
    println!(
        "           compresses (also the worst case of a client asking while the prewarm runs)"
    );
    println!("  [prewarm] the background render of a watched view right after the snapshot");
    println!("  [update] the watching client's next poll after that: the changed page");
    println!("  [shared] any other request in the same snapshot");
    println!("  [304] a client that already has this snapshot");
    for (name, path) in [
        ("/api/streams first page", "/api/streams"),
        ("timeline page, 24 h", "/timeline?window=24h"),
        ("per-stream page", "/streams/stream-04242"),
        ("trends page", "/trends"),
    ] {
        for encoding in ["identity", "gzip", "br"] {
            let headers = [("accept-encoding", encoding)];
            let (mut times, bytes) =
                time_request(&router, Some(&collector), path, &headers, rounds).await;
            report(&format!("[render] {name}, {encoding}"), &mut times, bytes);
            let mut prewarms = Vec::with_capacity(rounds);
            let mut updates = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                // The client watched the view in the previous snapshot.
                time_request(&router, None, path, &headers, 1).await;
                collector.republish();
                let started = Instant::now();
                leasehold_dashboard::web::prewarm(&state, &views).await;
                prewarms.push(started.elapsed());
                let (time, _) = time_request(&router, None, path, &headers, 1).await;
                updates.extend(time);
            }
            report(&format!("[prewarm] {name}, {encoding}"), &mut prewarms, 0);
            report(&format!("[update] {name}, {encoding}"), &mut updates, bytes);
            let (mut times, bytes) = time_request(&router, None, path, &headers, rounds).await;
            report(&format!("[shared] {name}, {encoding}"), &mut times, bytes);
        }
        let tag = collector.entity_tag();
        let (mut times, bytes) = time_request(
            &router,
            None,
            path,
            &[("if-none-match", tag.as_str())],
            rounds,
        )
        .await;
        report(&format!("[304] {name}"), &mut times, bytes);
    }
}

/// 24 h of history as the collector would have kept it: the count bound's
/// 50,000 changes (takeovers with a gap) spread over 24 h, 1,000 fenced writes,
/// every trend ring full (one sample per minute, lag on every stream), and
/// the gap log at its bound ([`GAPS_KEPT`] gaps over 24 h; `stream-04242`, the
/// page timed, with [`GAPS_PER_STREAM`] of them).
fn fill_history(collector: &leasehold_dashboard::Collector, streams: usize) {
    const DAY: i64 = 24 * 3_600_000;
    let kept = collector.settings().changes_kept;
    let start = NOW - DAY + 60_000;
    let step = (DAY - 120_000) / kept as i64;
    collector.with_changes_mut(|log| {
        for k in 0..kept {
            let stream = k % streams;
            let round = k / streams;
            log.record(Change {
                at_ms: start + k as i64 * step,
                stream_id: format!("stream-{stream:05}"),
                kind: ChangeKind::Takeover,
                old_owner: Some(format!("worker-{:02}", (stream + round) % 20)),
                new_owner: Some(format!("worker-{:02}", (stream + round + 1) % 20)),
                fence_token: round as u64 + 2,
                gap_seconds: Some(1.5),
                missed: 0,
            });
        }
        for k in 0..1_000 {
            log.record_fenced(FencedWrite {
                at_ms: start + k as i64 * (DAY / 1_000),
                owner_id: format!("worker-{:02}", k % 20),
                writes: 2,
                streams: vec![format!("stream-{:05}", (k * 7) % streams)],
            });
        }
    });
    collector.with_gaps_mut(|gaps| {
        let reasons = leasehold_telemetry::labels::GapReason::RECORDED;
        let gap = |k: usize| DataGap {
            at_ms: start + k as i64 * (DAY / GAPS_KEPT as i64),
            from_seq: k as u64 * 100,
            to_seq: k as u64 * 100 + 9,
            missing: 10,
            reason: reasons[k % reasons.len()],
            worker: Some(format!("worker-{:02}", k % 20)),
        };
        for k in 0..GAPS_KEPT - GAPS_PER_STREAM {
            gaps.record(&format!("stream-{:05}", (k * 7) % streams), gap(k));
        }
        for k in GAPS_KEPT - GAPS_PER_STREAM..GAPS_KEPT {
            gaps.record("stream-04242", gap(k));
        }
    });
    let mut rows = collector.latest().streams.clone();
    collector.with_trends_mut(|trends| {
        for minute in 0..leasehold_dashboard::model::trends::CLUSTER_POINTS as i64 {
            for (i, row) in rows.iter_mut().enumerate() {
                row.lag_events = Some(((i as i64 + minute) % 50) as u64);
                row.lag_seconds = Some(((i as i64 + minute) % 7) as f64 / 2.0);
            }
            trends.sample(NOW - DAY + minute * 60_000, &rows, None, &[]);
        }
    });
}
