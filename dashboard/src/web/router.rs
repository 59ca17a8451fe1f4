//! The dashboard's HTTP face: five views, their JSON API, static assets,
//! `/healthz`, and the token form. Read-only: every route is GET except the
//! token form's POST and `/logout`, which only set or clear a cookie in the
//! caller's browser. The cookie holds a session derived from the token
//! ([`crate::web::session`]), never the token, for at most 12 hours.
//!
//! Every response carries a restrictive Content-Security-Policy (scripts and
//! styles from this origin only, no inline code, no framing), so even a value
//! that escaped escaping could not run.
//!
//! Access ([`Access`]): the token cookie is `Secure` when the request came over
//! TLS, which for this plain-HTTP server means a trusted proxy said so
//! (`X-Forwarded-Proto: https` with `DASHBOARD_TRUST_PROXY=true`; the header
//! is ignored otherwise, since any client can send it). Without a token on a
//! loopback listener, only requests whose `Host` is a loopback name or address
//! (or one of `DASHBOARD_ALLOWED_HOSTS`) are served; others get 421. A web
//! page that rebinds its own DNS name to 127.0.0.1 could otherwise read the
//! dashboard through the victim's browser, since to the browser it is the
//! page's own origin.

use std::sync::Arc;

use askama::Template;
use axum::Router;
use axum::extract::{Form, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Json, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tower_http::compression::CompressionLayer;
use tower_http::set_header::SetResponseHeaderLayer;

use crate::collector::Collector;
use crate::web::pages::{
    AnomaliesBody, CHANGES_SHOWN, ChangesBody, LoginPage, PoolBody, StreamQuery, StreamsPage,
    TablesPage, WorkersBody, stream_page,
};
use crate::web::session;
use crate::web::views::{
    RUNBOOKS, StreamDetail, StreamDetailPage, TimelinePage, TimelineQuery, TrendsBody, TrendsPage,
    stream_detail, timeline_body,
};

/// The policy: nothing but this origin's script, style and fetches.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Cookie set by the token form: a session value ([`crate::web::session`]). Named
/// as the raw-token cookie of older versions was, so signing in replaces it.
pub const SESSION_COOKIE: &str = "leasehold_dashboard_token";

/// What the handlers share.
pub struct DashboardState {
    /// The snapshot source.
    pub collector: Arc<Collector>,
    /// Bearer token required for everything but `/healthz`, `/login` and assets.
    pub token: Option<String>,
    /// Proxy trust and the Host allow-list.
    pub access: Access,
    /// The sink, for a stream page's "sink last seq" (`DASHBOARD_SINK_URL`).
    pub sink: Option<Arc<dyn crate::sources::sink::SinkReader>>,
    /// Grafana, linked from the trends page (`DASHBOARD_GRAFANA_URL`).
    pub grafana: Option<String>,
    /// Responses rendered from the collector's current snapshot, shared
    /// between requests (one per state: renders depend on the sink and link too).
    pub renders: crate::web::render_cache::RenderCache,
}

/// Who may reach the dashboard, and what the token cookie claims.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    /// `DASHBOARD_TRUST_PROXY`: believe `X-Forwarded-Proto` (the cookie gets
    /// `Secure` when it says `https`).
    pub trust_proxy: bool,
    /// When set, only these `Host` values (lower case, without port) and
    /// loopback names and addresses are served; `None`: any `Host`.
    pub allowed_hosts: Option<Vec<String>>,
}

impl Access {
    /// The rule for a dashboard on `listen`: the Host check applies when there
    /// is no token and the listener is loopback (DNS rebinding), or whenever
    /// `extra_hosts` are configured.
    pub fn new(
        listen: std::net::SocketAddr,
        has_token: bool,
        trust_proxy: bool,
        extra_hosts: Vec<String>,
    ) -> Access {
        let checked = (!has_token && listen.ip().is_loopback()) || !extra_hosts.is_empty();
        Access {
            trust_proxy,
            allowed_hosts: checked.then(|| {
                extra_hosts
                    .iter()
                    .map(|host| host.trim().trim_end_matches('.').to_ascii_lowercase())
                    .collect()
            }),
        }
    }

    /// Whether a request with this `Host` header may be served.
    pub fn host_allowed(&self, host: Option<&str>) -> bool {
        let Some(allowed) = &self.allowed_hosts else {
            return true;
        };
        // No Host at all is not a browser (every browser request has one).
        let Some(host) = host else {
            return true;
        };
        let name = host_name(host).to_ascii_lowercase();
        let name = name.trim_end_matches('.');
        name == "localhost"
            || name
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
            || allowed.iter().any(|a| a == name)
    }

    /// Whether the request reached the proxy in front over TLS, as far as
    /// this dashboard may believe.
    fn over_tls(&self, headers: &HeaderMap) -> bool {
        self.trust_proxy
            && headers
                .get("x-forwarded-proto")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split(',').next())
                .is_some_and(|proto| proto.trim().eq_ignore_ascii_case("https"))
    }
}

/// The host part of a `Host` header: `[::1]:8080` → `::1`, `a:80` → `a`.
fn host_name(host: &str) -> &str {
    let host = host.trim();
    if let Some(bracketed) = host.strip_prefix('[') {
        return bracketed.split(']').next().unwrap_or_default();
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

type Shared = Arc<DashboardState>;

/// The router, apart from any listener so tests can drive it with `oneshot`.
pub fn app(state: Shared) -> Router {
    protect(views(state.clone()), state)
}

/// The routes with compression and the shared render, without the access
/// checks: what [`prewarm`] asks (in-process, never reachable from outside).
pub fn views(state: Shared) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/streams") }))
        .route("/streams", get(streams_view))
        .route("/workers", get(workers_view))
        .route("/pool", get(pool_view))
        .route("/anomalies", get(anomalies_view))
        .route("/changes", get(changes_view))
        .route("/api/streams", get(streams_api))
        .route("/api/workers", get(workers_api))
        .route("/api/pool", get(pool_api))
        .route("/api/anomalies", get(anomalies_api))
        .route("/api/changes", get(changes_api))
        .route("/streams/{id}", get(stream_view))
        .route("/api/streams/{id}", get(stream_api))
        .route("/timeline", get(timeline_view))
        .route("/api/timeline", get(timeline_api))
        .route("/trends", get(trends_view))
        .route("/api/trends", get(trends_api))
        .route("/runbooks/{name}", get(runbook))
        .route("/static/dashboard.js", get(script))
        .route("/static/dashboard.css", get(stylesheet))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/login", get(login_form).post(login))
        .route("/logout", post(logout))
        // gzip or br as the client accepts; the predicate skips small bodies.
        // Inside the render cache, so what is shared is already compressed.
        .layer(CompressionLayer::new())
        .layer(middleware::from_fn_with_state(state.clone(), shared_render))
        .with_state(state)
}

/// Renders again, for the snapshot just published, the views clients
/// watched in the previous one ([`crate::web::render_cache`]), so their next poll
/// finds the bytes ready. `views` is [`views`] of the same state.
pub async fn prewarm(state: &DashboardState, views: &Router) {
    use tower::ServiceExt;
    let generation = state.collector.generation();
    for warm in state.renders.hot(generation) {
        let mut request = Request::get(warm.uri.as_str());
        if let Some(coding) = warm.coding {
            request = request.header(header::ACCEPT_ENCODING, coding);
        }
        let Ok(mut request) = request.body(axum::body::Body::empty()) else {
            continue;
        };
        request.extensions_mut().insert(Prewarm);
        let _ = views.clone().oneshot(request).await;
    }
}

/// Marks a request made by [`prewarm`] (not a client: what it renders is
/// not hot until a client fetches it).
#[derive(Debug, Clone, Copy)]
struct Prewarm;

/// The access checks, conditional GET and security headers around `views`.
fn protect(views: Router, state: Shared) -> Router {
    let security_headers = [
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
    ];
    let mut router = views
        .layer(middleware::from_fn_with_state(
            state.clone(),
            conditional_get,
        ))
        // Access checks outermost: a shared render is only ever handed to a
        // request that passed them.
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .layer(middleware::from_fn_with_state(state, check_host));
    for (name, value) in security_headers {
        router = router.layer(SetResponseHeaderLayer::overriding(name, value));
    }
    router
}

fn refresh_ms(state: &DashboardState) -> u64 {
    state.collector.interval().as_millis() as u64
}

fn html(page: impl Template) -> Response {
    match page.render() {
        Ok(body) => Html(body).into_response(),
        Err(err) => {
            tracing::error!(error = %err, "dashboard template failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "template error\n").into_response()
        }
    }
}

async fn streams_view(State(state): State<Shared>, Query(query): Query<StreamQuery>) -> Response {
    let snapshot = state.collector.latest();
    html(StreamsPage::new(&snapshot, query, refresh_ms(&state)))
}

async fn workers_view(State(state): State<Shared>) -> Response {
    html(TablesPage::workers(
        &state.collector.latest(),
        refresh_ms(&state),
    ))
}

async fn pool_view(State(state): State<Shared>) -> Response {
    html(TablesPage::pool(
        &state.collector.latest(),
        refresh_ms(&state),
    ))
}

async fn anomalies_view(State(state): State<Shared>) -> Response {
    html(TablesPage::anomalies(
        &state.collector.latest(),
        refresh_ms(&state),
    ))
}

async fn changes_view(State(state): State<Shared>) -> Response {
    let changes = state.collector.changes(CHANGES_SHOWN);
    html(TablesPage::changes(
        &state.collector.latest(),
        &changes,
        refresh_ms(&state),
    ))
}

async fn streams_api(State(state): State<Shared>, Query(query): Query<StreamQuery>) -> Response {
    let snapshot = state.collector.latest();
    Json(stream_page(&snapshot, &query)).into_response()
}

async fn workers_api(State(state): State<Shared>) -> Response {
    let snapshot = state.collector.latest();
    Json(WorkersBody {
        taken_at_ms: snapshot.taken_at_ms,
        workers: &snapshot.workers,
        sidecars: &snapshot.sidecars,
        sources: &snapshot.sources,
    })
    .into_response()
}

async fn pool_api(State(state): State<Shared>) -> Response {
    let snapshot = state.collector.latest();
    Json(PoolBody {
        taken_at_ms: snapshot.taken_at_ms,
        pool: snapshot.pool.as_ref(),
        sources: &snapshot.sources,
    })
    .into_response()
}

async fn anomalies_api(State(state): State<Shared>) -> Response {
    let snapshot = state.collector.latest();
    Json(AnomaliesBody {
        taken_at_ms: snapshot.taken_at_ms,
        anomalies: snapshot.anomalies.as_ref(),
        sources: &snapshot.sources,
    })
    .into_response()
}

async fn changes_api(State(state): State<Shared>) -> Response {
    let snapshot = state.collector.latest();
    let changes = state.collector.changes(CHANGES_SHOWN);
    Json(ChangesBody {
        taken_at_ms: snapshot.taken_at_ms,
        changes: &changes,
    })
    .into_response()
}

async fn stream_view(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    let Some(detail) = stream_with_sink(&state, &id).await else {
        return not_found();
    };
    let snapshot = state.collector.latest();
    let collector = &state.collector;
    html(collector.with_changes(|log| {
        collector.with_gaps(|gaps| {
            StreamDetailPage::new(&snapshot, log, gaps, detail, refresh_ms(&state))
        })
    }))
}

async fn stream_api(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    match stream_with_sink(&state, &id).await {
        Some(detail) => Json(detail).into_response(),
        None => not_found(),
    }
}

/// One stream's detail, with the sink's position read (bounded) when a sink
/// is configured; `None` for an unknown id, which is never sent to the sink.
async fn stream_with_sink(state: &DashboardState, id: &str) -> Option<StreamDetail> {
    let snapshot = state.collector.latest();
    // Locks in the collector's order: changes, trends, gaps.
    let collector = &state.collector;
    let mut detail = collector.with_changes(|log| {
        collector.with_trends(|trends| {
            collector.with_gaps(|gaps| stream_detail(&snapshot, log, trends, gaps, id))
        })
    })?;
    detail.sink = crate::sources::sink::position(state.sink.as_ref(), id).await;
    Some(detail)
}

/// A 404 that never echoes the (untrusted) id asked for.
fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "no such stream\n").into_response()
}

async fn timeline_view(
    State(state): State<Shared>,
    Query(query): Query<TimelineQuery>,
) -> Response {
    let snapshot = state.collector.latest();
    let collector = &state.collector;
    let page = collector.with_changes(|log| {
        collector
            .with_gaps(|gaps| TimelinePage::new(&snapshot, log, gaps, query, refresh_ms(&state)))
    });
    html(page)
}

async fn timeline_api(State(state): State<Shared>, Query(query): Query<TimelineQuery>) -> Response {
    let snapshot = state.collector.latest();
    let collector = &state.collector;
    let body = collector.with_changes(|log| {
        collector.with_gaps(|gaps| timeline_body(&snapshot, log, gaps, &query))
    });
    Json(body).into_response()
}

async fn trends_view(State(state): State<Shared>) -> Response {
    let snapshot = state.collector.latest();
    let page = state.collector.with_trends(|trends| {
        TrendsPage::new(&snapshot, trends, state.grafana.clone(), refresh_ms(&state))
    });
    html(page)
}

async fn trends_api(State(state): State<Shared>) -> Response {
    let snapshot = state.collector.latest();
    let body = state.collector.with_trends(|trends| TrendsBody {
        taken_at_ms: snapshot.taken_at_ms,
        resolution_ms: trends.resolution_ms(),
        spans_ms: trends.spans_ms(),
        cluster: trends.cluster(),
    });
    Json(body).into_response()
}

async fn runbook(Path(name): Path<String>) -> Response {
    match RUNBOOKS.iter().find(|(known, _)| *known == name) {
        Some((_, text)) => {
            ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], *text).into_response()
        }
        None => (StatusCode::NOT_FOUND, "no such runbook\n").into_response(),
    }
}

/// Conditional GET for every view and API: the entity tag names the snapshot
/// (the process's start and the collector's publication count), so a client
/// that already has it gets `304 Not Modified` and no body. The refresh script
/// sends `If-None-Match` itself (responses are `no-store`, so the browser
/// cache never answers for it).
async fn conditional_get(State(state): State<Shared>, request: Request, next: Next) -> Response {
    if !follows_snapshot(&request) {
        return next.run(request).await;
    }
    let tag = state.collector.entity_tag();
    let matches = request
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag || t.trim() == "*"));
    let etag = HeaderValue::from_str(&tag).ok();
    if matches {
        let mut response = StatusCode::NOT_MODIFIED.into_response();
        if let Some(etag) = etag {
            response.headers_mut().insert(header::ETAG, etag);
        }
        return response;
    }
    let mut response = next.run(request).await;
    if response.status().is_success()
        && let Some(etag) = etag
    {
        response.headers_mut().insert(header::ETAG, etag);
    }
    response
}

/// Whether a request's answer is a function of the snapshot (every view and
/// API; not assets, runbooks, `/healthz` or the token form; never a POST).
fn follows_snapshot(request: &Request) -> bool {
    let path = request.uri().path();
    request.method() == axum::http::Method::GET
        && !path.starts_with("/static/")
        && !path.starts_with("/runbooks/")
        && path != "/healthz"
        && path != "/login"
}

/// Renders a view once per snapshot ([`crate::web::render_cache`]): the first
/// request for a (path, normalised query, coding) after a new snapshot renders
/// and compresses it; others get the same bytes until the next snapshot.
/// Requests that miss at the same time wait for one render.
async fn shared_render(State(state): State<Shared>, mut request: Request, next: Next) -> Response {
    use crate::web::render_cache::{Cached, Warm, cacheable, coding, key};
    if !follows_snapshot(&request) {
        return next.run(request).await;
    }
    let coding = coding(
        request
            .headers()
            .get(header::ACCEPT_ENCODING)
            .and_then(|v| v.to_str().ok()),
    );
    let Some(key) = key(request.uri().path(), request.uri().query(), coding) else {
        return next.run(request).await;
    };
    let warm = Warm {
        uri: request.uri().path_and_query().map_or_else(
            || request.uri().path().to_owned(),
            |pq| pq.as_str().to_owned(),
        ),
        coding,
    };
    let (collector, cache) = (&state.collector, &state.renders);
    let client = request.extensions().get::<Prewarm>().is_none();
    // Read before rendering: the render reads a snapshot at least this new,
    // so an entry is never older than its key says.
    let generation = collector.generation();
    if let Some(hit) = cache.get(generation, &key, client) {
        return hit.response();
    }
    let _rendering = cache.rendering().lock().await;
    if let Some(hit) = cache.get(generation, &key, client) {
        return hit.response();
    }
    // One coding for the compression layer, so the key says what the body is.
    match coding {
        Some(coding) => {
            request
                .headers_mut()
                .insert(header::ACCEPT_ENCODING, HeaderValue::from_static(coding));
        }
        None => {
            request.headers_mut().remove(header::ACCEPT_ENCODING);
        }
    }
    let response = next.run(request).await;
    if !cacheable(response.status(), response.headers()) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let body = match http_body_util::BodyExt::collect(body).await {
        Ok(collected) => collected.to_bytes(),
        Err(err) => {
            tracing::error!(error = %err, "dashboard response body failed");
            return (StatusCode::INTERNAL_SERVER_ERROR, "render error\n").into_response();
        }
    };
    let cached = Arc::new(Cached {
        status: parts.status,
        headers: parts.headers,
        body,
    });
    cache.insert(generation, key, warm, cached.clone(), client);
    cached.response()
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("../../static/dashboard.js"),
    )
        .into_response()
}

async fn stylesheet() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("../../static/dashboard.css"),
    )
        .into_response()
}

async fn login_form(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let signed_in = match &state.token {
        Some(token) => session_cookie(&headers)
            .is_some_and(|value| session::is_valid(token, value, state.collector.now_ms())),
        None => false,
    };
    html(LoginPage {
        failed: false,
        signed_in,
    })
}

#[derive(Deserialize)]
struct TokenForm {
    token: String,
}

async fn login(
    State(state): State<Shared>,
    headers: HeaderMap,
    Form(form): Form<TokenForm>,
) -> Response {
    match &state.token {
        Some(expected) if token_matches(expected, &form.token) => {
            let cookie = session::issue(expected, state.collector.now_ms()).map(|value| {
                format!(
                    "{SESSION_COOKIE}={value}; Max-Age={}{}",
                    session::SESSION_MAX_AGE.as_secs(),
                    cookie_attributes(&state, &headers)
                )
            });
            match cookie.and_then(|cookie| HeaderValue::from_str(&cookie).ok()) {
                Some(cookie) => {
                    ([(header::SET_COOKIE, cookie)], Redirect::to("/streams")).into_response()
                }
                None => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "no session could be made\n",
                )
                    .into_response(),
            }
        }
        Some(_) => (
            StatusCode::UNAUTHORIZED,
            html(LoginPage {
                failed: true,
                signed_in: false,
            }),
        )
            .into_response(),
        None => Redirect::to("/streams").into_response(),
    }
}

/// Clears the session cookie. Open like the token form (an expired session
/// must still be able to leave) and under the same rules: the Host check, a
/// same-site cookie, forms posted only from this origin (the policy's
/// `form-action 'self'`).
async fn logout(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let cookie = format!(
        "{SESSION_COOKIE}=; Max-Age=0{}",
        cookie_attributes(&state, &headers)
    );
    match HeaderValue::from_str(&cookie) {
        Ok(cookie) => ([(header::SET_COOKIE, cookie)], Redirect::to("/login")).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "logout failed\n").into_response(),
    }
}

/// What every session cookie says besides its value and age: the whole
/// site, no script access, never sent cross-site, and `Secure` over TLS.
fn cookie_attributes(state: &DashboardState, headers: &HeaderMap) -> &'static str {
    if state.access.over_tls(headers) {
        "; Path=/; HttpOnly; SameSite=Strict; Secure"
    } else {
        "; Path=/; HttpOnly; SameSite=Strict"
    }
}

/// Compares digests in constant time: comparing the tokens themselves would
/// return early on a length mismatch and tell an attacker the token's length.
fn token_matches(expected: &str, given: &str) -> bool {
    let digest = |text: &str| Sha256::digest(text.as_bytes());
    digest(expected)
        .as_slice()
        .ct_eq(digest(given).as_slice())
        .into()
}

/// Whether a token can travel in a cookie and a header unchanged (visible
/// ASCII without the cookie separators).
pub fn token_is_header_safe(token: &str) -> bool {
    !token.is_empty()
        && token
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b';' | b',' | b'"' | b'\\'))
}

/// The `Authorization: Bearer` token, if any (scripts).
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// The session cookie's value, if any (browsers).
fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value)
}

/// The token itself in a header, or a live session derived from it in the
/// cookie (a cookie holding the raw token, as older versions set, is refused).
fn authenticated(state: &DashboardState, expected: &str, headers: &HeaderMap) -> bool {
    if let Some(bearer) = bearer_token(headers) {
        return token_matches(expected, bearer);
    }
    session_cookie(headers)
        .is_some_and(|value| session::is_valid(expected, value, state.collector.now_ms()))
}

/// Answers 421 to a request whose `Host` is not allowed ([`Access`]);
/// `/healthz` is always served (it tells nothing).
async fn check_host(State(state): State<Shared>, request: Request, next: Next) -> Response {
    // A Host that is not text is not allowed (`""` matches nothing).
    let host = match request.headers().get(header::HOST) {
        Some(value) => Some(value.to_str().unwrap_or_default()),
        None => request.uri().authority().map(|a| a.as_str()),
    };
    if request.uri().path() == "/healthz" || state.access.host_allowed(host) {
        return next.run(request).await;
    }
    (
        StatusCode::MISDIRECTED_REQUEST,
        "this dashboard answers only to its own host names (see DASHBOARD_ALLOWED_HOSTS)\n",
    )
        .into_response()
}

async fn authorize(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let Some(expected) = &state.token else {
        return next.run(request).await;
    };
    let path = request.uri().path();
    let open =
        path == "/healthz" || path == "/login" || path == "/logout" || path.starts_with("/static/");
    if open || authenticated(&state, expected, request.headers()) {
        return next.run(request).await;
    }
    let wants_html = request
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/html"));
    if wants_html && !path.starts_with("/api/") {
        return Redirect::to("/login").into_response();
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "a bearer token is required\n",
    )
        .into_response()
}
