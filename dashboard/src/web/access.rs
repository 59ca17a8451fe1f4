//! Who may reach the dashboard: the bearer token (a header for scripts, a
//! session cookie for browsers), the token form and `/logout`, and the Host
//! allow-list.
//!
//! The cookie holds a session derived from the token ([`crate::web::session`]),
//! never the token, for at most 12 hours. It is `Secure` when the request came
//! over TLS, which for this plain-HTTP server means a trusted proxy said so
//! (`X-Forwarded-Proto: https` with `DASHBOARD_TRUST_PROXY=true`; the header
//! is ignored otherwise, since any client can send it). Without a token on a
//! loopback listener, only requests whose `Host` is a loopback name or address
//! (or one of `DASHBOARD_ALLOWED_HOSTS`) are served; others get 421. A web
//! page that rebinds its own DNS name to 127.0.0.1 could otherwise read the
//! dashboard through the victim's browser, since to the browser it is the
//! page's own origin.

use askama::Template;
use axum::Router;
use axum::extract::{Form, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::web::page::html;
use crate::web::{DashboardState, Shared, session};

/// The token form and `/logout` (open routes: [`authorize`] lets them through).
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/login", get(login_form).post(login))
        .route("/logout", post(logout))
}

/// Cookie set by the token form: a session value ([`crate::web::session`]). Named
/// as the raw-token cookie of older versions was, so signing in replaces it.
pub const SESSION_COOKIE: &str = "leasehold_dashboard_token";

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
pub(crate) async fn check_host(
    State(state): State<Shared>,
    request: Request,
    next: Next,
) -> Response {
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

pub(crate) async fn authorize(
    State(state): State<Shared>,
    request: Request,
    next: Next,
) -> Response {
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

/// The token form shown when a bearer token is required.
#[derive(Template)]
#[template(path = "login.html")]
pub struct LoginPage {
    /// A wrong token was given.
    pub failed: bool,
    /// This browser already holds a live session: the page offers to end it.
    pub signed_in: bool,
}
