//! The routes: every view's ([`crate::web::views`](mod@crate::web::views)), static assets,
//! `/healthz` and the token form, with the access checks, conditional GET,
//! the shared render, compression and security headers around them.
//! Read-only: every route is GET except the token form's POST and `/logout`,
//! which only set or clear a cookie in the caller's browser.
//!
//! Every response carries a restrictive Content-Security-Policy (scripts and
//! styles from this origin only, no inline code, no framing), so even a value
//! that escaped escaping could not run.

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use tower_http::compression::CompressionLayer;
use tower_http::set_header::SetResponseHeaderLayer;

use crate::web::{DashboardState, Shared, access, cache};

/// The policy: nothing but this origin's script, style and fetches.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The router, apart from any listener so tests can drive it with `oneshot`.
pub fn app(state: Shared) -> Router {
    protect(views(state.clone()), state)
}

/// The routes with compression and the shared render, without the access
/// checks: what [`prewarm`] asks (in-process, never reachable from outside).
pub fn views(state: Shared) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/streams") }))
        .merge(crate::web::views::routes())
        .route("/static/dashboard.js", get(script))
        .route("/static/dashboard.css", get(stylesheet))
        .route("/healthz", get(|| async { "ok\n" }))
        .merge(access::routes())
        // gzip or br as the client accepts; the predicate skips small bodies.
        // Inside the render cache, so what is shared is already compressed.
        .layer(CompressionLayer::new())
        .layer(middleware::from_fn_with_state(
            state.clone(),
            cache::shared_render,
        ))
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
pub(crate) struct Prewarm;

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
            cache::conditional_get,
        ))
        // Access checks outermost: a shared render is only ever handed to a
        // request that passed them.
        .layer(middleware::from_fn_with_state(
            state.clone(),
            access::authorize,
        ))
        .layer(middleware::from_fn_with_state(state, access::check_host));
    for (name, value) in security_headers {
        router = router.layer(SetResponseHeaderLayer::overriding(name, value));
    }
    router
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
