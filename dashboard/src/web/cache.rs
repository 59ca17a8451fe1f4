//! Answers that follow the snapshot: conditional GET (an entity tag per
//! snapshot) and the shared render ([`crate::web::render_cache`]), both as
//! middleware around the views.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::web::Shared;
use crate::web::router::Prewarm;

/// Conditional GET for every view and API: the entity tag names the snapshot
/// (the process's start and the collector's publication count), so a client
/// that already has it gets `304 Not Modified` and no body. The refresh script
/// sends `If-None-Match` itself (responses are `no-store`, so the browser
/// cache never answers for it).
pub(crate) async fn conditional_get(
    State(state): State<Shared>,
    request: Request,
    next: Next,
) -> Response {
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
pub(crate) async fn shared_render(
    State(state): State<Shared>,
    mut request: Request,
    next: Next,
) -> Response {
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
