//! One module per view: its page (an askama template), its JSON body, its
//! columns and its handlers, with the routes it answers. Adding a view is a
//! module here, an entry in `ALL` and a template.

pub mod anomalies;
pub mod changes;
pub mod pool;
pub mod stream;
pub mod streams;
pub mod timeline;
pub mod trends;
pub mod workers;

use std::sync::LazyLock;

use axum::Router;

use crate::web::Shared;

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
        routes: workers::routes,
    },
    View {
        nav: Some(("/pool", "Pool")),
        routes: pool::routes,
    },
    View {
        nav: Some(("/anomalies", "Anomalies")),
        routes: anomalies::routes,
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
