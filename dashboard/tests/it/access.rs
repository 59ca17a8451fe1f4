//! Access rules of the dashboard's HTTP face: the session cookie (derived
//! from the token, with a `Max-Age`, its `Secure` flag, logout) and the Host
//! allow-list that stops DNS rebinding of an anonymous loopback dashboard.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use leasehold_dashboard::web::{Access, DashboardState, SESSION_COOKIE, app};
use leasehold_testkit::dashboard::collector_at;
use leasehold_testkit::lease_store::{ConformanceTarget, MemoryTarget};
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

/// Signs in on `router` and returns the `Set-Cookie` it answered.
async fn sign_in(router: &axum::Router) -> String {
    let request = Request::post("/login")
        .header(header::HOST, "127.0.0.1:8080")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("token={TOKEN}")))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    response.headers()[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .to_owned()
}

/// `GET path` with `cookie` (a `name=value` pair).
async fn with_cookie(router: &axum::Router, path: &str, cookie: &str) -> (StatusCode, String) {
    let request = Request::get(path)
        .header(header::HOST, "127.0.0.1:8080")
        .header(header::COOKIE, cookie)
        .body(Body::empty())
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(start_paused = true)]
async fn the_cookie_holds_a_session_not_the_token_and_lasts_12_hours() {
    let router = router(
        Some(TOKEN),
        Access::new(loopback(), true, false, Vec::new()),
    );
    let set_cookie = sign_in(&router).await;
    assert!(!set_cookie.contains(TOKEN), "{set_cookie}");
    assert!(set_cookie.contains("; Max-Age=43200"), "{set_cookie}");
    let session = set_cookie.split(';').next().unwrap().to_owned();
    assert!(
        session.starts_with(&format!("{SESSION_COOKIE}=v1.")),
        "{session}"
    );
    assert_eq!(
        with_cookie(&router, "/api/streams", &session).await.0,
        StatusCode::OK
    );
    // A cookie holding the raw token (what older versions set) is refused.
    let raw = format!("{SESSION_COOKIE}={TOKEN}");
    assert_eq!(
        with_cookie(&router, "/api/streams", &raw).await.0,
        StatusCode::UNAUTHORIZED
    );
    // The bearer header keeps taking the token itself.
    let bearer = Request::get("/api/streams")
        .header(header::HOST, "127.0.0.1:8080")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        router.clone().oneshot(bearer).await.unwrap().status(),
        StatusCode::OK
    );
    // The session ends with its Max-Age even if a browser keeps the cookie.
    tokio::time::advance(Duration::from_secs(12 * 60 * 60 - 1)).await;
    assert_eq!(
        with_cookie(&router, "/api/streams", &session).await.0,
        StatusCode::OK
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        with_cookie(&router, "/api/streams", &session).await.0,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test(start_paused = true)]
async fn logout_clears_the_cookie_under_the_login_forms_rules() {
    let router = router(Some(TOKEN), Access::new(loopback(), true, true, Vec::new()));
    let session = sign_in(&router).await.split(';').next().unwrap().to_owned();
    let (status, page) = with_cookie(&router, "/login", &session).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains("action=\"/logout\""),
        "a signed-in browser is offered to sign out: {page}"
    );

    let logout = |host: &str, proto: Option<&str>| {
        let mut request = Request::post("/logout")
            .header(header::HOST, host)
            .header(header::COOKIE, &session);
        if let Some(proto) = proto {
            request = request.header("x-forwarded-proto", proto);
        }
        request.body(Body::empty()).unwrap()
    };
    let response = router
        .clone()
        .oneshot(logout("127.0.0.1:8080", Some("https")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers()[header::LOCATION], "/login");
    let cleared = response.headers()[header::SET_COOKIE].to_str().unwrap();
    assert!(
        cleared.starts_with(&format!("{SESSION_COOKIE}=;")) && cleared.contains("; Max-Age=0"),
        "{cleared}"
    );
    assert!(
        cleared.contains("Path=/")
            && cleared.contains("HttpOnly")
            && cleared.contains("SameSite=Strict")
            && cleared.contains("; Secure"),
        "the same attributes as the cookie it replaces: {cleared}"
    );
    // Like the token form: a POST only, behind the Host check.
    let get = Request::get("/logout")
        .header(header::HOST, "127.0.0.1:8080")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        router.clone().oneshot(get).await.unwrap().status(),
        StatusCode::METHOD_NOT_ALLOWED
    );
    let checked = self::router(
        Some(TOKEN),
        Access::new(loopback(), true, false, vec!["dash.example.com".into()]),
    );
    assert_eq!(
        checked
            .oneshot(logout("attacker.example", None))
            .await
            .unwrap()
            .status(),
        StatusCode::MISDIRECTED_REQUEST
    );
}
