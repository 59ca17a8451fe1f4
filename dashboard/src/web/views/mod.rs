//! One module per view: its page (an askama template), its JSON body, its
//! columns and its handlers, with the routes it answers. Adding a view is a
//! module here, an entry in `ALL` and a template; a view drawn from the latest
//! snapshot alone implements `SnapshotView` and needs no handlers of its own.

pub mod anomalies;
pub mod changes;
pub mod connections;
pub mod pool;
pub mod stream;
pub mod streams;
pub mod timeline;
pub mod trends;
pub mod workers;

use std::sync::LazyLock;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde::Serialize;

use crate::model::{Snapshot, SourceHealth};
use crate::web::Shared;
use crate::web::page::{TablesPage, html, refresh_ms};

/// One view: its entry in the navigation, if any, and its routes.
pub(crate) struct View {
    /// (path, title) in the navigation bar.
    nav: Option<(&'static str, &'static str)>,
    /// The routes it answers (page and JSON API).
    routes: fn() -> Router<Shared>,
}

/// Every view, in navigation order.
pub(crate) const ALL: &[View] = &[
    View {
        nav: Some(("/streams", "Streams")),
        routes: streams::routes,
    },
    View {
        nav: Some(("/workers", "Workers")),
        routes: snapshot_routes::<workers::Workers>,
    },
    View {
        nav: Some(("/connections", "Connections")),
        routes: snapshot_routes::<connections::Connections>,
    },
    View {
        nav: Some(("/pool", "Pool")),
        routes: snapshot_routes::<pool::Pool>,
    },
    View {
        nav: Some(("/anomalies", "Anomalies")),
        routes: snapshot_routes::<anomalies::Anomalies>,
    },
    View {
        nav: Some(("/changes", "Ownership changes")),
        routes: changes::routes,
    },
    View {
        nav: Some(("/timeline", "Timeline")),
        routes: timeline::routes,
    },
    View {
        nav: Some(("/trends", "Trends")),
        routes: trends::routes,
    },
    View {
        nav: None,
        routes: stream::routes,
    },
];

/// Every view's routes.
pub(crate) fn routes() -> Router<Shared> {
    ALL.iter()
        .fold(Router::new(), |router, view| router.merge((view.routes)()))
}

/// The navigation entries: (path, title).
pub(crate) fn nav() -> &'static [(&'static str, &'static str)] {
    static NAV: LazyLock<Vec<(&str, &str)>> =
        LazyLock::new(|| ALL.iter().filter_map(|view| view.nav).collect());
    &NAV
}

/// A view drawn from the latest snapshot alone: its page and its JSON body
/// read nothing else, so one pair of handlers serves every such view.
pub(crate) trait SnapshotView: 'static {
    /// The page's path; the JSON body is at `/api` followed by this path.
    const PATH: &'static str;
    /// The view's own fields of its JSON body ([`SnapshotBody::view`]).
    type Fields<'a>: Serialize;
    /// The page.
    fn page(snapshot: &Snapshot, refresh_ms: u64) -> TablesPage;
    /// The view's own fields, borrowed from the snapshot.
    fn fields(snapshot: &Snapshot) -> Self::Fields<'_>;
}

/// The JSON body of a `SnapshotView`: when the snapshot was taken, the
/// view's own fields, and the health of the sources it was read from.
#[derive(Debug, Serialize)]
pub struct SnapshotBody<'a, T> {
    /// Snapshot time, unix ms.
    pub taken_at_ms: i64,
    /// The view's own fields, inline between the two.
    #[serde(flatten)]
    pub view: T,
    /// Source health.
    pub sources: &'a [SourceHealth],
}

/// A [`SnapshotView`]'s routes: its page and its JSON body.
fn snapshot_routes<V: SnapshotView>() -> Router<Shared> {
    Router::new()
        .route(V::PATH, get(snapshot_page::<V>))
        .route(&format!("/api{}", V::PATH), get(snapshot_body::<V>))
}

async fn snapshot_page<V: SnapshotView>(State(state): State<Shared>) -> Response {
    html(V::page(&state.collector.latest(), refresh_ms(&state)))
}

async fn snapshot_body<V: SnapshotView>(State(state): State<Shared>) -> Response {
    let snapshot = state.collector.latest();
    Json(SnapshotBody {
        taken_at_ms: snapshot.taken_at_ms,
        view: V::fields(&snapshot),
        sources: &snapshot.sources,
    })
    .into_response()
}
