//! Router tests with `oneshot`: every view and API over a seeded cluster on the
//! in-memory store and pool, security headers, the token check, read-only-ness.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use leasehold_testkit::lease_store::{ConformanceTarget, MemoryTarget};
use std::sync::atomic::{AtomicBool, Ordering};

use leasehold_control::LeaseError;
use leasehold_control::store::AcquireRequest;
use leasehold_control::store::intercept::{Intercepted, Interceptor, StoreOp};
use leasehold_dashboard::collector::Collector;
use leasehold_dashboard::sources::sink::{SinkReadError, SinkReader};
use leasehold_dashboard::web::{CONTENT_SECURITY_POLICY, DashboardState, SESSION_COOKIE, app};
use leasehold_pool::bus::memory::MemoryPoolBus;
use leasehold_pool::read::PoolReader;
use leasehold_testkit::dashboard::{
    MARKUP_OWNER, MARKUP_STREAM, MARKUP_USER, SECRET_CANARY, SEEDED_STREAMS_VIEW, SwitchablePool,
    collector_at, collector_with_sidecars, fake_sidecar, seed_leases, seed_many, seeded_pool,
    status_with_gaps,
};
use serde_json::Value;
use tower::ServiceExt;

const NOW: i64 = 1_800_000_000_000;

const ROUTES: &[&str] = &[
    "/streams",
    "/workers",
    "/connections",
    "/pool",
    "/anomalies",
    "/changes",
    "/api/streams",
    "/api/workers",
    "/api/connections",
    "/api/pool",
    "/api/anomalies",
    "/api/changes",
    "/timeline",
    "/timeline?by=worker",
    "/trends",
    "/streams/btc-usd",
    "/api/timeline",
    "/api/trends",
    "/api/streams/btc-usd",
    "/streams?gaps=some&sort=last_gap",
    "/api/streams?gaps=sink_lost&sort=gaps",
];

struct Seeded {
    target: Arc<MemoryTarget>,
    pool: Arc<SwitchablePool<MemoryPoolBus>>,
    collector: Arc<Collector>,
}

async fn seeded() -> Seeded {
    let target = Arc::new(MemoryTarget::default());
    seed_leases(target.as_ref(), NOW).await;
    let pool = Arc::new(SwitchablePool::new(seeded_pool(NOW).await));
    let collector = collector_at(
        target.store(),
        Some(pool.clone() as Arc<dyn PoolReader>),
        NOW,
    );
    collector.refresh().await;
    Seeded {
        target,
        pool,
        collector,
    }
}

fn router(collector: &Arc<Collector>, token: Option<&str>) -> axum::Router {
    app(Arc::new(DashboardState {
        collector: collector.clone(),
        token: token.map(str::to_owned),
        access: Default::default(),
        sink: None,
        grafana: None,
        renders: Default::default(),
    }))
}

async fn send(
    router: &axum::Router,
    request: Request<Body>,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

async fn get(router: &axum::Router, path: &str) -> (StatusCode, axum::http::HeaderMap, String) {
    send(router, Request::get(path).body(Body::empty()).unwrap()).await
}

async fn json(router: &axum::Router, path: &str) -> Value {
    let (status, _, body) = get(router, path).await;
    assert_eq!(status, StatusCode::OK, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_streams_view_shows_owners_tokens_badges_and_escapes_markup() {
    let seeded = seeded().await;
    let router = router(&seeded.collector, None);
    let (status, headers, body) = get(&router, "/streams").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers[header::CONTENT_SECURITY_POLICY],
        CONTENT_SECURITY_POLICY
    );
    // The malformed record also says which attribute is wrong.
    for needle in SEEDED_STREAMS_VIEW.iter().chain(&["fence_token: "]) {
        assert!(body.contains(needle), "missing {needle:?}");
    }
    assert!(
        !body.contains("<img src=x"),
        "markup must not reach the page unescaped"
    );
    assert!(
        !body.contains("<script>alert"),
        "markup must not reach the page unescaped"
    );
    assert!(
        body.contains("&#60;img src=x") || body.contains("&lt;img src=x"),
        "the id is shown as text"
    );
    assert!(
        !body.contains("onerror=alert(1)>"),
        "no attribute can be closed by the id"
    );
}

#[tokio::test(start_paused = true)]
async fn the_streams_api_filters_sorts_and_pages() {
    let seeded = seeded().await;
    let router = router(&seeded.collector, None);
    let all = json(&router, "/api/streams").await;
    assert_eq!(all["total"], 7, "{all}");
    assert_eq!(all["counts"]["owned"], 3, "{all}");
    let btc = all["streams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stream_id"] == "btc-usd")
        .unwrap();
    assert_eq!(btc["owner_id"], "worker-a");
    assert_eq!(btc["checkpoint"], 42);
    assert_eq!(btc["state"], "owned");
    let xrp = all["streams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stream_id"] == "xrp-usd")
        .unwrap();
    assert_eq!(
        (xrp["fence_token"].as_u64(), xrp["previous_owner"].as_str()),
        (Some(2), Some("worker-c"))
    );

    assert!(
        all["streams"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["stream_id"] == MARKUP_STREAM),
        "the API returns ids as data (served as application/json, never as HTML)"
    );

    let expired = json(&router, "/api/streams?state=expired").await;
    let ids: Vec<_> = expired["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stream_id"].clone())
        .collect();
    assert_eq!(ids, ["sol-usd"]);

    let mine = json(&router, "/api/streams?owner=worker-a&sort=token").await;
    let streams = mine["streams"].as_array().unwrap();
    assert_eq!(streams.len(), 2);
    assert!(streams.iter().all(|s| s["owner_id"] == "worker-a"));
    assert_eq!(streams[0]["stream_id"], "xrp-usd", "highest token first");

    let page = json(&router, "/api/streams?per_page=2&page=2").await;
    assert_eq!(
        (page["page"].as_u64(), page["pages"].as_u64()),
        (Some(2), Some(4))
    );
    assert_eq!(page["streams"].as_array().unwrap().len(), 2);
    let html = get(&router, "/streams?per_page=2&page=2").await.2;
    assert!(html.contains("rel=\"prev\"") && html.contains("rel=\"next\""));
}

#[tokio::test(start_paused = true)]
async fn workers_pool_and_anomalies_come_from_their_sources() {
    let seeded = seeded().await;
    let router = router(&seeded.collector, None);
    let workers = json(&router, "/api/workers").await;
    let a = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["owner_id"] == "worker-a")
        .unwrap();
    assert_eq!(a["streams_held"], 2, "{a}");
    assert_eq!(a["presence"], "owned");
    assert!(
        a["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t[0] == "btc-usd" && t[1] == 1)
    );

    let pool = json(&router, "/api/pool").await;
    assert_eq!(pool["pool"]["idle"][0]["worker_id"], "pool-7", "{pool}");
    let u42 = &pool["pool"]["claimed"][0];
    assert_eq!(
        (u42["user_id"].as_str(), u42["worker_id"].as_str()),
        (Some("u42"), Some("pool-3"))
    );
    assert_eq!(
        (
            u42["requests_queued"].as_u64(),
            u42["control_queued"].as_u64(),
            u42["dead_letters"].as_u64()
        ),
        (Some(2), Some(1), Some(1))
    );
    assert_eq!(u42["instance_id"], "i-0abc123");
    assert_eq!(pool["pool"]["claims_pending"], 1);

    let anomalies = json(&router, "/api/anomalies").await;
    assert_eq!(
        anomalies["anomalies"]["report"]["found"]["orphan_mark"], 1,
        "{anomalies}"
    );
    assert_eq!(
        anomalies["anomalies"]["report"]["findings"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let page = get(&router, "/anomalies").await.2;
    assert!(page.contains("Last sweep 20.0 s ago"), "{page}");
    assert!(page.contains("badge badge-duplicate_worker"));
}

#[tokio::test(start_paused = true)]
async fn untrusted_ids_stay_text_on_every_view() {
    let seeded = seeded().await;
    let router = router(&seeded.collector, None);
    for route in ["/streams", "/workers", "/anomalies", "/changes", "/pool"] {
        let (_, _, body) = get(&router, route).await;
        for markup in [MARKUP_STREAM, MARKUP_OWNER, MARKUP_USER] {
            assert!(!body.contains(markup), "{route} shows {markup:?} as markup");
        }
    }
    // Each appears escaped where it is shown (owner also in the filter's <option>).
    let streams = get(&router, "/streams").await.2;
    assert!(
        streams.matches("evil-owner&#60;/b&#62;").count()
            + streams.matches("evil-owner&lt;/b&gt;").count()
            >= 2,
        "{streams}"
    );
    let anomalies = get(&router, "/anomalies").await.2;
    assert!(
        anomalies.contains("&#60;svg onload=alert(4)&#62;")
            || anomalies.contains("&lt;svg onload=alert(4)&gt;"),
        "{anomalies}"
    );
}

#[tokio::test(start_paused = true)]
async fn errors_and_redirects_carry_the_security_headers_too() {
    let seeded = seeded().await;
    let router = router(&seeded.collector, Some("a-token-of-sixteen-chars"));
    let html = Request::get("/streams")
        .header(header::ACCEPT, "text/html")
        .body(Body::empty())
        .unwrap();
    let requests = [
        Request::get("/nope").body(Body::empty()).unwrap(),
        Request::post("/healthz").body(Body::empty()).unwrap(),
        html,
    ];
    for request in requests {
        let path = request.uri().to_string();
        let (status, headers, _) = send(&router, request).await;
        assert!(!status.is_success(), "{path}: {status}");
        assert_eq!(
            headers[header::CONTENT_SECURITY_POLICY],
            CONTENT_SECURITY_POLICY,
            "{path}"
        );
        assert_eq!(headers[header::X_FRAME_OPTIONS], "DENY", "{path}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_lease_table_that_cannot_be_read_keeps_the_last_view_and_invents_no_changes() {
    let target = MemoryTarget::default();
    seed_leases(&target, NOW).await;
    let switch = ListingSwitch {
        down: AtomicBool::new(true),
    };
    let store = Arc::new(Intercepted::new(target.store(), switch));
    let collector = collector_at(store.clone(), None, NOW);
    let router = router(&collector, None);
    // Down from the start: shown as such, nothing invented.
    collector.refresh().await;
    let page = get(&router, "/streams").await.2;
    assert!(page.contains("lease table unavailable:"), "{page}");
    assert!(page.contains("no data yet"), "{page}");
    // Back: the first good read is the baseline, not a burst of "takeovers".
    store.interceptor().down.store(false, Ordering::Relaxed);
    tokio::time::advance(Duration::from_secs(2)).await;
    collector.refresh().await;
    assert_eq!(json(&router, "/api/streams").await["total"], 7);
    assert_eq!(
        json(&router, "/api/changes").await["changes"],
        Value::Array(vec![])
    );
    // Down again for two minutes: the last good rows stay as they were read,
    // rather than being re-judged "expired" against a clock the table never saw.
    store.interceptor().down.store(true, Ordering::Relaxed);
    tokio::time::advance(Duration::from_secs(120)).await;
    collector.refresh().await;
    let streams = json(&router, "/api/streams?state=owned").await;
    assert_eq!(streams["total"], 3, "{streams}");
    let source = &streams["sources"][0];
    assert_eq!(
        (source["name"].as_str(), source["ok"].as_bool()),
        (Some("lease table"), Some(false))
    );
    assert!(
        get(&router, "/streams")
            .await
            .2
            .contains("showing data from 2 m 0 s ago")
    );
}

/// Switches a lease store's listing off (an unreachable table).
struct ListingSwitch {
    down: AtomicBool,
}

#[async_trait::async_trait]
impl Interceptor for ListingSwitch {
    async fn before(&self, op: StoreOp<'_>) -> Result<(), LeaseError> {
        if matches!(op, StoreOp::List { .. }) && self.down.load(Ordering::Relaxed) {
            return Err(LeaseError::Transient {
                message: "connection refused".into(),
            });
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn no_secret_reaches_any_page_or_api() {
    let seeded = seeded().await;
    let router = router(&seeded.collector, None);
    for route in ROUTES {
        let (_, _, body) = get(&router, route).await;
        assert!(
            !body.contains(SECRET_CANARY),
            "{route} shows the credentials blob"
        );
        assert!(
            !body.contains("credentials:"),
            "{route} names a credentials key"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn takeovers_appear_in_the_timeline() {
    let seeded = seeded().await;
    let router = router(&seeded.collector, None);
    assert_eq!(
        json(&router, "/api/changes").await["changes"],
        Value::Array(vec![])
    );
    take_over_sol_usd(&seeded).await;
    let changes = json(&router, "/api/changes").await;
    let change = &changes["changes"][0];
    assert_eq!(change["kind"], "takeover", "{changes}");
    assert_eq!(
        (change["old_owner"].as_str(), change["new_owner"].as_str()),
        (Some("worker-c"), Some("worker-b"))
    );
    assert_eq!(change["fence_token"], 2);
    // sol-usd expired at NOW - 30 s and was taken at NOW + 2 s.
    assert_eq!(change["gap_seconds"], 32.0);
    assert!(
        get(&router, "/changes")
            .await
            .2
            .contains("badge badge-takeover")
    );
}

#[tokio::test(start_paused = true)]
async fn a_source_that_is_down_is_shown_and_the_rest_keeps_working() {
    let seeded = seeded().await;
    *seeded.pool.down.lock().unwrap() = Some("redis: connection refused".into());
    tokio::time::advance(Duration::from_secs(3)).await;
    seeded.collector.refresh().await;
    let router = router(&seeded.collector, None);
    let page = get(&router, "/pool").await.2;
    assert!(page.contains("pool unavailable:"), "{page}");
    assert!(page.contains("redis: connection refused"));
    assert!(page.contains("showing data from 3.0 s ago"), "{page}");
    assert!(page.contains("pool-7"), "last good pool data is kept");
    let streams = json(&router, "/api/streams").await;
    assert_eq!(streams["total"], 7);
    let pool_source = streams["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "pool")
        .unwrap();
    assert_eq!(pool_source["ok"], false);
}

#[tokio::test(start_paused = true)]
async fn a_token_protects_everything_but_health_login_and_assets() {
    let seeded = seeded().await;
    let router = router(&seeded.collector, Some("s3cret-token"));
    for route in ROUTES {
        let (status, headers, body) = get(&router, route).await;
        assert!(
            status == StatusCode::UNAUTHORIZED || status == StatusCode::SEE_OTHER,
            "{route}: {status}"
        );
        assert!(!body.contains("btc-usd"));
        assert_eq!(
            headers[header::CONTENT_SECURITY_POLICY],
            CONTENT_SECURITY_POLICY
        );
    }
    let html = Request::get("/streams")
        .header(header::ACCEPT, "text/html")
        .body(Body::empty())
        .unwrap();
    let (status, headers, _) = send(&router, html).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(headers[header::LOCATION], "/login");
    for open in [
        "/healthz",
        "/login",
        "/static/dashboard.js",
        "/static/dashboard.css",
    ] {
        assert_eq!(get(&router, open).await.0, StatusCode::OK, "{open}");
    }
    let bearer = Request::get("/api/streams")
        .header(header::AUTHORIZATION, "Bearer s3cret-token")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, bearer).await.0, StatusCode::OK);
    let wrong = Request::get("/api/streams")
        .header(header::AUTHORIZATION, "Bearer s3cret-tokem")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, wrong).await.0, StatusCode::UNAUTHORIZED);

    let login = |token: &str| {
        Request::post("/login")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(format!("token={token}")))
            .unwrap()
    };
    assert_eq!(
        send(&router, login("nope")).await.0,
        StatusCode::UNAUTHORIZED
    );
    let (status, headers, _) = send(&router, login("s3cret-token")).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let cookie = headers[header::SET_COOKIE].to_str().unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap().to_owned();
    let with_cookie = Request::get("/streams")
        .header(header::COOKIE, format!("other=1; {session}"))
        .body(Body::empty())
        .unwrap();
    let (status, _, body) = send(&router, with_cookie).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("btc-usd"));
    // The raw token, as older versions stored it, no longer opens anything.
    let raw_token = Request::get("/api/streams")
        .header(
            header::COOKIE,
            format!("other=1; {SESSION_COOKIE}=s3cret-token"),
        )
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, raw_token).await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test(start_paused = true)]
async fn nothing_changes_anything() {
    let seeded = seeded().await;
    let router = router(&seeded.collector, None);
    for route in ROUTES {
        for method in [Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
            let request = Request::builder()
                .method(method.clone())
                .uri(*route)
                .body(Body::empty())
                .unwrap();
            assert_eq!(
                send(&router, request).await.0,
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {route}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_streams_render_on_one_page() {
    let target = Arc::new(MemoryTarget::default());
    seed_many(target.as_ref(), 10_000, NOW).await;
    let collector = collector_at(target.store(), None, NOW);
    collector.refresh().await;
    let router = router(&collector, None);
    let (status, _, body) = get(&router, "/streams?per_page=10000").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body.matches("<tr><td><a href=\"/streams/stream%2D").count(),
        10_000
    );
    assert!(body.contains("stream-09999"));
    let first = get(&router, "/streams").await.2;
    assert_eq!(
        first
            .matches("<tr><td><a href=\"/streams/stream%2D")
            .count(),
        100,
        "default page size"
    );
    assert!(first.contains("10000 streams match; page 1 of 100."));
}

#[tokio::test(start_paused = true)]
async fn search_finds_one_stream_among_ten_thousand_prefix_first_and_paged() {
    let target = Arc::new(MemoryTarget::default());
    seed_many(target.as_ref(), 10_000, NOW).await;
    let collector = collector_at(target.store(), None, NOW);
    collector.refresh().await;
    let router = router(&collector, None);
    let one = json(&router, "/api/streams?q=stream-04242").await;
    assert_eq!(one["total"], 1, "{one}");
    assert_eq!(one["streams"][0]["stream_id"], "stream-04242");
    // Case-insensitive substring, paged; the header counts stay whole-table.
    let many = json(&router, "/api/streams?q=REAM-0424&per_page=5&page=2").await;
    assert_eq!(
        (many["total"].as_u64(), many["pages"].as_u64()),
        (Some(10), Some(2))
    );
    assert_eq!(many["streams"][0]["stream_id"], "stream-04245");
    assert_eq!(many["counts"]["owned"], 10_000);
    // A search longer than the bound is cut, not refused; nothing matches.
    let long = "x".repeat(60_000);
    assert_eq!(
        json(&router, &format!("/api/streams?q={long}")).await["total"],
        0
    );
    let page = get(&router, "/streams?q=stream-04242").await.2;
    assert!(page.contains("1 streams match"), "{page}");
    assert!(page.contains("value=\"stream-04242\""));
}

/// Two seconds on, `worker-b` takes the seeded `sol-usd` (its lease has
/// lapsed) and the collector sees it: one takeover in the history.
async fn take_over_sol_usd(seeded: &Seeded) {
    tokio::time::advance(Duration::from_secs(2)).await;
    seeded
        .target
        .store()
        .acquire(&AcquireRequest {
            stream_id: "sol-usd".into(),
            owner_id: "worker-b".into(),
            now_ms: NOW + 2_000,
            lease_ms: 30_000,
            skew_margin_ms: 1_000,
            sidecar_url: None,
            handoff_addr: None,
            max_streams: None,
            session_token: None,
        })
        .await
        .unwrap();
    seeded.collector.refresh().await;
}

#[tokio::test(start_paused = true)]
async fn the_stream_page_shows_record_owner_history_and_problems_and_404s_unknown_ids() {
    let seeded = seeded().await;
    let router = router(&seeded.collector, None);
    take_over_sol_usd(&seeded).await;
    let (status, _, page) = get(&router, "/streams/sol-usd").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("id=\"owner-history\""));
    assert!(page.contains("badge badge-takeover"), "{page}");
    assert!(
        page.contains("data-owner=\"worker-c\" data-token=\"1\""),
        "{page}"
    );
    assert!(
        page.contains("data-owner=\"worker-b\" data-token=\"2\""),
        "{page}"
    );
    // Prefix matches come before other substring matches (then id order).
    let found = json(&router, "/api/streams?q=S").await;
    let ids: Vec<&str> = found["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stream_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids[0], "sol-usd", "{ids:?}");
    assert!(ids.contains(&"btc-usd") && ids.len() > 3, "{ids:?}");
    let api = json(&router, "/api/streams/sol-usd").await;
    assert_eq!(api["owners"][0]["kind"], "takeover");
    assert_eq!(api["stream"]["owner_id"], "worker-b");
    // An unowned stream says so and links the runbook, which is served.
    let ada = get(&router, "/streams/ada-usd").await.2;
    assert!(
        ada.contains("href=\"/runbooks/LeaseholdStreamUnowned\""),
        "{ada}"
    );
    let (status, headers, runbook) = get(&router, "/runbooks/LeaseholdStreamUnowned").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    assert!(runbook.contains("LeaseholdStreamUnowned"));
    assert_eq!(
        get(&router, "/runbooks/..%2F..%2Fetc%2Fpasswd").await.0,
        StatusCode::NOT_FOUND
    );
    // The markup stream, addressed percent-encoded, renders as text.
    let markup = format!(
        "/streams/{}",
        percent_encoding::utf8_percent_encode(MARKUP_STREAM, percent_encoding::NON_ALPHANUMERIC)
    );
    let (status, _, page) = get(&router, &markup).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!page.contains(MARKUP_STREAM));
    assert!(page.contains("&#60;img src=x onerror=alert(1)&#62;") || page.contains("&lt;img"));
    // Unknown and oversized ids: 404, and the id is not echoed.
    for id in ["no-such-stream%3Cscript%3E".to_owned(), "a".repeat(5_000)] {
        let (status, _, body) = get(&router, &format!("/streams/{id}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(!body.contains("script") && !body.contains("aaaa"), "{body}");
        assert_eq!(
            get(&router, &format!("/api/streams/{id}")).await.0,
            StatusCode::NOT_FOUND
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_timeline_draws_a_segment_per_owner_with_its_token_and_a_gap_between() {
    let seeded = seeded().await;
    let router = router(&seeded.collector, None);
    take_over_sol_usd(&seeded).await;
    let body = json(&router, "/api/timeline?window=5m").await;
    let lane = &body["lanes"][0];
    assert_eq!(
        lane["stream_id"], "sol-usd",
        "the lane that changed comes first"
    );
    let segments: Vec<(Option<&str>, Option<u64>)> = lane["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["owner"].as_str(), s["token"].as_u64()))
        .collect();
    assert_eq!(
        segments,
        [
            (Some("worker-c"), Some(1)),
            (None, None),
            (Some("worker-b"), Some(2))
        ]
    );
    let page = get(&router, "/timeline?window=5m").await.2;
    assert!(page.contains("class=\"seg gap\""), "{page}");
    assert!(page.contains(">#2</text>"));
    assert!(
        page.contains("id=\"timeline-table\""),
        "the text equivalent"
    );
    assert!(
        page.contains("tabindex=\"0\""),
        "segments take keyboard focus"
    );
    let per_worker = json(&router, "/api/timeline?window=5m&by=worker").await;
    assert!(
        per_worker["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["worker"] == "worker-c" && l["stream_id"] == "sol-usd")
    );
    let trends = get(&router, "/trends").await.2;
    assert!(
        trends.contains("Takeovers: 1 samples, latest 1"),
        "{trends}"
    );
}

#[tokio::test(start_paused = true)]
async fn unchanged_snapshots_answer_304_and_bodies_are_compressed() {
    let target = Arc::new(MemoryTarget::default());
    seed_many(target.as_ref(), 2_000, NOW).await;
    let collector = collector_at(target.store(), None, NOW);
    collector.refresh().await;
    let router = router(&collector, None);
    let (status, headers, _) = get(&router, "/api/streams").await;
    assert_eq!(status, StatusCode::OK);
    let tag = headers[header::ETAG].to_str().unwrap().to_owned();
    let conditional = |path: &str, tag: &str| {
        Request::get(path)
            .header(header::IF_NONE_MATCH, tag)
            .body(Body::empty())
            .unwrap()
    };
    let (status, headers, body) = send(&router, conditional("/api/streams", &tag)).await;
    assert_eq!(status, StatusCode::NOT_MODIFIED);
    assert!(body.is_empty());
    assert_eq!(headers[header::ETAG].to_str().unwrap(), tag);
    assert_eq!(
        headers[header::CONTENT_SECURITY_POLICY],
        CONTENT_SECURITY_POLICY
    );
    // A new snapshot (even at the same instant) is a new tag.
    collector.refresh().await;
    let (status, headers, _) = send(&router, conditional("/api/streams", &tag)).await;
    assert_eq!(status, StatusCode::OK);
    assert_ne!(headers[header::ETAG].to_str().unwrap(), tag);
    // gzip and br as asked; the body is much smaller.
    let plain = get(&router, "/api/streams?per_page=2000").await.2.len();
    for encoding in ["gzip", "br"] {
        let response = router
            .clone()
            .oneshot(
                Request::get("/api/streams?per_page=2000")
                    .header(header::ACCEPT_ENCODING, encoding)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.headers()[header::CONTENT_ENCODING], encoding);
        let packed = response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .len();
        assert!(packed * 5 < plain, "{encoding}: {packed} of {plain} bytes");
    }
}

fn router_with(
    collector: &Arc<Collector>,
    token: Option<&str>,
    sink: Option<Arc<dyn SinkReader>>,
    grafana: Option<&str>,
) -> axum::Router {
    app(state_with(collector, token, sink, grafana))
}

fn state_with(
    collector: &Arc<Collector>,
    token: Option<&str>,
    sink: Option<Arc<dyn SinkReader>>,
    grafana: Option<&str>,
) -> Arc<DashboardState> {
    Arc::new(DashboardState {
        collector: collector.clone(),
        token: token.map(str::to_owned),
        access: Default::default(),
        sink,
        grafana: grafana.map(str::to_owned),
        renders: Default::default(),
    })
}

/// A sink that answers from a fixed table (or fails), counting its reads.
struct FixedSink {
    last: Option<u64>,
    fail: Option<SinkReadError>,
    reads: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl SinkReader for FixedSink {
    async fn last_seq(&self, _: &str) -> Result<Option<u64>, SinkReadError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        match self.fail {
            Some(err) => Err(err),
            None => Ok(self.last),
        }
    }
}

fn fixed_sink(last: Option<u64>, fail: Option<SinkReadError>) -> Arc<FixedSink> {
    Arc::new(FixedSink {
        last,
        fail,
        reads: Default::default(),
    })
}

#[tokio::test(start_paused = true)]
async fn the_stream_page_shows_the_sinks_last_seq_next_to_the_checkpoint() {
    let seeded = seeded().await;
    // btc-usd is seeded with checkpoint 42; the sink holds up to 45.
    let sink = fixed_sink(Some(45), None);
    let router = router_with(&seeded.collector, None, Some(sink.clone()), None);
    let page = get(&router, "/streams/btc-usd").await.2;
    assert!(page.contains("id=\"stream-sink-seq\">45</dd>"), "{page}");
    assert!(
        page.contains("id=\"stream-sink-ahead\">3 events</dd>"),
        "{page}"
    );
    let api = json(&router, "/api/streams/btc-usd").await;
    assert_eq!(api["sink"]["state"], "at");
    assert_eq!(api["sink"]["last_seq"], 45);
    // An unknown id never reaches the sink.
    let reads = sink.reads.load(Ordering::SeqCst);
    assert_eq!(get(&router, "/streams/nope").await.0, StatusCode::NOT_FOUND);
    assert_eq!(sink.reads.load(Ordering::SeqCst), reads);

    // Unset: the page says the sink is not read.
    let unset = router_with(&seeded.collector, None, None, None);
    let page = get(&unset, "/streams/btc-usd").await.2;
    assert!(page.contains("DASHBOARD_SINK_URL is not set"), "{page}");
    assert!(page.contains("id=\"stream-sink-ahead\">—</dd>"), "{page}");
    // Unreachable: a category, no error text.
    let down = router_with(
        &seeded.collector,
        None,
        Some(fixed_sink(None, Some(SinkReadError::Unavailable))),
        None,
    );
    let page = get(&down, "/streams/btc-usd").await.2;
    assert!(page.contains("the sink is unreachable"), "{page}");
    let api = json(&down, "/api/streams/btc-usd").await;
    assert_eq!(api["sink"]["state"], "unreadable");
}

#[tokio::test(start_paused = true)]
async fn the_trends_page_links_grafana_only_when_configured() {
    let seeded = seeded().await;
    let without = get(&router_with(&seeded.collector, None, None, None), "/trends")
        .await
        .2;
    assert!(!without.contains("Grafana</a>"));
    let with = router_with(
        &seeded.collector,
        None,
        None,
        Some("https://grafana.example/d/leasehold?orgId=1&from=now-7d"),
    );
    let page = get(&with, "/trends").await.2;
    assert!(
        page.contains("href=\"https://grafana.example/d/leasehold?orgId=1&#38;from=now-7d\"")
            || page
                .contains("href=\"https://grafana.example/d/leasehold?orgId=1&amp;from=now-7d\""),
        "{page}"
    );
    assert!(page.contains("Claim latency, 99th percentile"), "{page}");
    assert!(page.contains("Claims waiting"), "{page}");
}

#[tokio::test(start_paused = true)]
async fn a_view_is_rendered_once_per_snapshot_and_shared_behind_the_access_checks() {
    let seeded = seeded().await;
    let sink = fixed_sink(Some(45), None);
    let token = "s3cret-token-0123";
    let state = state_with(&seeded.collector, Some(token), Some(sink.clone()), None);
    let router = app(state.clone());
    let authed = |path: &str, encoding: Option<&str>| {
        let mut request =
            Request::get(path).header(header::AUTHORIZATION, format!("Bearer {token}"));
        if let Some(encoding) = encoding {
            request = request.header(header::ACCEPT_ENCODING, encoding);
        }
        request.body(Body::empty()).unwrap()
    };
    let first = send(&router, authed("/streams/btc-usd", None)).await;
    let second = send(&router, authed("/streams/btc-usd", None)).await;
    assert_eq!(first.0, StatusCode::OK);
    assert_eq!(first.2, second.2, "the same bytes");
    assert_eq!(
        sink.reads.load(Ordering::SeqCst),
        1,
        "rendered once: the second request was the shared render"
    );
    // The query's order does not matter; the coding does.
    send(&router, authed("/timeline?window=5m&by=worker", None)).await;
    send(&router, authed("/timeline?by=worker&window=5m", None)).await;
    let (entries, _) = state.renders.usage();
    assert_eq!(entries, 2, "one entry per view");
    let (_, headers, _) = send(&router, authed("/streams/btc-usd", Some("gzip"))).await;
    assert_eq!(headers[header::CONTENT_ENCODING], "gzip");
    let (_, headers, _) = send(
        &router,
        authed("/streams/btc-usd", Some("br;q=1, gzip;q=0.5")),
    )
    .await;
    assert_eq!(headers[header::CONTENT_ENCODING], "br");
    assert_eq!(state.renders.usage().0, 4);
    // A cached render is still only served past the token check.
    let (status, _, body) = get(&router, "/streams/btc-usd").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(!body.contains("btc-usd"), "{body}");
    // A new snapshot renders again (and drops the old renders)...
    let reads = sink.reads.load(Ordering::SeqCst);
    seeded.collector.refresh().await;
    send(&router, authed("/streams/btc-usd", None)).await;
    assert_eq!(sink.reads.load(Ordering::SeqCst), reads + 1);
    assert_eq!(state.renders.usage().0, 1);
    // ...and the views watched in the last one are rendered before anyone
    // asks (the prewarm after each snapshot), so the next poll is a shared render.
    seeded.collector.refresh().await;
    leasehold_dashboard::web::prewarm(&state, &leasehold_dashboard::web::views(state.clone()))
        .await;
    assert_eq!(sink.reads.load(Ordering::SeqCst), reads + 2, "prewarmed");
    assert_eq!(state.renders.usage().0, 1);
    send(&router, authed("/streams/btc-usd", None)).await;
    assert_eq!(
        sink.reads.load(Ordering::SeqCst),
        reads + 2,
        "served the prewarmed render"
    );
}

/// The data gaps a sidecar lists reach the streams view (two columns, a
/// filter and two sorts, in the JSON too), the stream page (a list, newest
/// first, or "None recorded") and the timeline (a mark on the lane), each
/// once however often the sidecar lists it, and again after it restarts.
/// Real time (not paused): the collector polls a real sidecar over TCP.
#[tokio::test]
async fn data_gaps_a_sidecar_reports_reach_every_view_once() {
    let target = Arc::new(MemoryTarget::default());
    seed_leases(target.as_ref(), NOW).await;
    let status = Arc::new(std::sync::Mutex::new(status_with_gaps(
        "worker-a",
        &[
            (1, 60_000, "btc-usd", 100, 149, "retention"),
            (2, 5_000, "btc-usd", 300, 300, "sink_lost"),
        ],
    )));
    let sidecar = fake_sidecar(status.clone()).await;
    let collector = collector_with_sidecars(target.store(), vec![sidecar], NOW);
    collector.refresh().await;
    let router = router(&collector, None);

    // The streams API: count, the newest, per reason; none elsewhere.
    let all = json(&router, "/api/streams").await;
    let row = |json: &Value, id: &str| -> Value {
        json["streams"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["stream_id"] == id)
            .cloned()
            .unwrap()
    };
    let btc = row(&all, "btc-usd");
    assert_eq!(btc["gaps"]["count"], 2, "{btc}");
    assert_eq!(btc["gaps"]["missing"], 51);
    assert_eq!(btc["gaps"]["last"]["from_seq"], 300);
    assert_eq!(btc["gaps"]["last"]["reason"], "sink_lost");
    assert_eq!(
        btc["gaps"]["reasons"],
        serde_json::json!({"retention": 1, "sink_lost": 1})
    );
    assert_eq!(row(&all, "eth-usd")["gaps"], Value::Null, "none recorded");
    // Filtered and sorted by them.
    let with = json(&router, "/api/streams?gaps=some").await;
    assert_eq!(with["total"], 1, "{with}");
    assert_eq!(json(&router, "/api/streams?gaps=none").await["total"], 6);
    assert_eq!(
        json(&router, "/api/streams?gaps=sink_lost").await["total"],
        1
    );
    assert_eq!(
        json(&router, "/api/streams?gaps=no_replay").await["total"],
        0
    );
    for sort in ["gaps", "last_gap"] {
        let sorted = json(&router, &format!("/api/streams?sort={sort}")).await;
        assert_eq!(sorted["streams"][0]["stream_id"], "btc-usd", "{sort}");
    }
    // The streams view: both columns, the last gap's range and reason as its title.
    let page = get(&router, "/streams").await.2;
    for needle in [
        ">Data gaps</th>",
        ">Last data gap</th>",
        "title=\"seq 300–300 missing (1 event): sink_lost\"",
        "<select name=\"gaps\">",
        "<option value=\"last_gap\">data gap, newest first</option>",
    ] {
        assert!(page.contains(needle), "/streams lacks {needle:?}\n{page}");
    }
    let filtered = get(&router, "/streams?gaps=some&sort=last_gap").await.2;
    assert!(filtered.contains("1 streams match"), "{filtered}");
    assert!(filtered.contains("<option value=\"some\" selected>"));

    // Listed again, and one more: only the new one is taken.
    *status.lock().unwrap() = status_with_gaps(
        "worker-a",
        &[
            (1, 62_000, "btc-usd", 100, 149, "retention"),
            (2, 7_000, "btc-usd", 300, 300, "sink_lost"),
            (3, 1_000, "btc-usd", 400, 409, "no_replay"),
        ],
    );
    collector.refresh().await;
    collector.refresh().await;
    let api = json(&router, "/api/streams/btc-usd").await;
    let listed: Vec<(u64, u64, &str, &str)> = api["gaps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["from_seq"].as_u64().unwrap(),
                g["missing"].as_u64().unwrap(),
                g["reason"].as_str().unwrap(),
                g["worker"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            (400, 10, "no_replay", "worker-a"),
            (300, 1, "sink_lost", "worker-a"),
            (100, 50, "retention", "worker-a"),
        ],
        "each once, newest first"
    );
    assert_eq!(api["stream"]["gaps"]["count"], 3);
    let at = api["gaps"][0]["at_ms"].as_i64().unwrap();
    let taken = api["taken_at_ms"].as_i64().unwrap();
    assert!(
        (taken - 5_000..=taken + 2_000).contains(&at),
        "{at} vs {taken}"
    );

    // The stream page: the list, newest first; an untouched stream says none.
    let page = get(&router, "/streams/btc-usd").await.2;
    let table = page.split("id=\"stream-gaps\"").nth(1).unwrap();
    let table = &table[..table.find("</table>").unwrap()];
    for needle in [
        "<th>When</th><th>Missing sequences</th><th>Missing events</th><th>Reason</th><th>Worker</th>",
        "<td>400–409</td><td>10</td>",
        "<td>100–149</td><td>50</td>",
        "badge badge-gap-no_replay",
        "<td>worker-a</td>",
    ] {
        assert!(
            table.contains(needle),
            "stream page lacks {needle:?}\n{table}"
        );
    }
    assert!(table.find("400–409") < table.find("300–300"), "{table}");
    assert_eq!(table.matches("<tr data-from=").count(), 3, "{table}");
    assert!(
        page.contains("class=\"data-gap\""),
        "the stream's lane marks them"
    );
    let quiet = get(&router, "/streams/eth-usd").await.2;
    assert!(quiet.contains("None recorded"), "{quiet}");
    assert_eq!(
        json(&router, "/api/streams/eth-usd").await["gaps"],
        Value::Array(vec![])
    );

    // The timeline: a mark per gap on btc-usd's lane, its range and reason
    // in the title and the text equivalent; the owner bars are still there.
    let timeline = get(&router, "/timeline?window=5m").await.2;
    assert_eq!(
        timeline.matches("class=\"data-gap\" d=").count(),
        3,
        "{timeline}"
    );
    assert!(timeline.contains("data-stream=\"btc-usd\"><title>btc-usd: data gap, seq 400–409 missing (10 events): no_replay, reported by worker-a,"), "{timeline}");
    assert!(timeline.contains("class=\"data-gap-row\""));
    assert!(timeline.contains("data-stream=\"btc-usd\" data-owner=\"worker-a\" data-token=\"1\""));
    let lanes = json(&router, "/api/timeline?window=5m").await;
    let lane = lanes["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["stream_id"] == "btc-usd")
        .unwrap();
    assert_eq!(lane["data_gaps"].as_array().unwrap().len(), 3, "{lane}");

    // The sidecar restarted: its numbering is back at 1, with a new gap.
    *status.lock().unwrap() = status_with_gaps(
        "worker-a",
        &[(1, 500, "btc-usd", 900, 900, "backfill_exhausted")],
    );
    collector.refresh().await;
    let api = json(&router, "/api/streams/btc-usd").await;
    assert_eq!(api["gaps"].as_array().unwrap().len(), 4, "{api}");
    assert_eq!(api["gaps"][0]["reason"], "backfill_exhausted");
}
