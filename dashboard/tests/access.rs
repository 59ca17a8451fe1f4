//! Access rules of the dashboard's HTTP face: the token cookie's `Secure` flag
//! and the Host allow-list that stops DNS rebinding of an anonymous loopback
//! dashboard.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use leasehold_control::conformance::{ConformanceTarget, MemoryTarget};
use leasehold_dashboard::http::{Access, DashboardState, app};
use leasehold_dashboard::testing::collector_at;
use tower::ServiceExt;

const NOW: i64 = 1_800_000_000_000;
const TOKEN: &str = "s3cret-token-0123";

fn router(token: Option<&str>, access: Access) -> axum::Router {
    let target = MemoryTarget::default();
    app(Arc::new(DashboardState {
        collector: collector_at(target.store(), None, NOW),
        token: token.map(str::to_owned),
        access,
        sink: None,
        grafana: None,
        renders: Default::default(),
    }))
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}

async fn status_for(router: &axum::Router, host: Option<&str>, path: &str) -> StatusCode {
    let mut request = Request::get(path);
    if let Some(host) = host {
        request = request.header(header::HOST, host);
    }
    router
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn an_anonymous_loopback_dashboard_answers_only_to_loopback_hosts() {
    let router = router(None, Access::new(loopback(), false, false, Vec::new()));
    for host in [
        "127.0.0.1:8080",
        "localhost:8080",
        "LOCALHOST",
        "localhost.",
        "[::1]:8080",
        "127.9.9.9",
    ] {
        assert_eq!(
            status_for(&router, Some(host), "/api/streams").await,
            StatusCode::OK,
            "{host}"
        );
    }
    // A rebinding page's own name (resolved to 127.0.0.1 by its DNS), names
    // that only look local, and a Host that is not text.
    for host in [
        "attacker.example:8080",
        "attacker.example",
        "localhost.attacker.example",
        "127.0.0.1.nip.io:8080",
        "10.0.0.1:8080",
    ] {
        assert_eq!(
            status_for(&router, Some(host), "/api/streams").await,
            StatusCode::MISDIRECTED_REQUEST,
            "{host}"
        );
        assert_eq!(
            status_for(&router, Some(host), "/streams").await,
            StatusCode::MISDIRECTED_REQUEST,
            "{host}"
        );
    }
    let binary = Request::get("/api/streams")
        .header(
            header::HOST,
            axum::http::HeaderValue::from_bytes(b"\xfflocal").unwrap(),
        )
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        router.clone().oneshot(binary).await.unwrap().status(),
        StatusCode::MISDIRECTED_REQUEST
    );
    // Health checks tell nothing and stay open.
    assert_eq!(
        status_for(&router, Some("attacker.example"), "/healthz").await,
        StatusCode::OK
    );
}

#[tokio::test]
async fn configured_hosts_are_allowed_and_a_token_lifts_the_loopback_rule() {
    let named = router(
        None,
        Access::new(loopback(), false, false, vec!["Dash.Example.com".into()]),
    );
    assert_eq!(
        status_for(&named, Some("dash.example.com:443"), "/api/streams").await,
        StatusCode::OK
    );
    assert_eq!(
        status_for(&named, Some("other.example.com"), "/api/streams").await,
        StatusCode::MISDIRECTED_REQUEST
    );
    // With a token, a rebinding page cannot read anything anyway (it has no
    // token): no Host rule unless configured.
    let protected = router(
        Some(TOKEN),
        Access::new(loopback(), true, false, Vec::new()),
    );
    assert_eq!(
        status_for(&protected, Some("anything.example"), "/api/streams").await,
        StatusCode::UNAUTHORIZED
    );
    // A non-loopback anonymous dashboard (behind an authenticating proxy)
    // answers to the proxy's Host.
    let proxied = router(
        None,
        Access::new(
            SocketAddr::from(([0, 0, 0, 0], 8080)),
            false,
            false,
            Vec::new(),
        ),
    );
    assert_eq!(
        status_for(&proxied, Some("dash.example.com"), "/api/streams").await,
        StatusCode::OK
    );
}

async fn login_cookie(access: Access, forwarded_proto: Option<&str>) -> String {
    let router = router(Some(TOKEN), access);
    let mut request = Request::post("/login")
        .header(header::HOST, "127.0.0.1:8080")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(proto) = forwarded_proto {
        request = request.header("x-forwarded-proto", proto);
    }
    let response = router
        .oneshot(request.body(Body::from(format!("token={TOKEN}"))).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    response.headers()[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn the_cookie_is_secure_only_when_a_trusted_proxy_says_https() {
    let trusting = Access::new(loopback(), true, true, Vec::new());
    let direct = Access::new(loopback(), true, false, Vec::new());
    let cookie = login_cookie(trusting.clone(), Some("https")).await;
    assert!(cookie.contains("; Secure"), "{cookie}");
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
    let cookie = login_cookie(trusting.clone(), Some("HTTPS, http")).await;
    assert!(
        cookie.contains("; Secure"),
        "first hop is the client's: {cookie}"
    );
    let cookie = login_cookie(trusting, Some("http")).await;
    assert!(!cookie.contains("Secure"), "{cookie}");
    // Without trust the header is anyone's to send: ignored.
    let cookie = login_cookie(direct.clone(), Some("https")).await;
    assert!(!cookie.contains("Secure"), "{cookie}");
    let cookie = login_cookie(direct, None).await;
    assert!(!cookie.contains("Secure"), "{cookie}");
}
