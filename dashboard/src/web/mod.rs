//! The HTTP face: [`router`] (the routes and the layers around them),
//! [`access`] (token, session cookie, Host check), `cache` (conditional GET
//! and the shared render, kept in [`render_cache`]), [`column`](mod@column)
//! (typed table columns), [`chart`] and [`lanes`] (SVG drawn server-side),
//! [`page`] (what every page shares) and [`views`](mod@views), one module per
//! view with its page, its JSON body and its handlers.

pub mod access;
mod cache;
pub mod chart;
pub mod column;
pub mod lanes;
pub mod page;
pub mod render_cache;
pub mod router;
pub mod session;
pub mod views;

use std::sync::Arc;

use crate::collector::Collector;

pub use access::{Access, SESSION_COOKIE, token_is_header_safe};
pub use router::{CONTENT_SECURITY_POLICY, app, prewarm, views};

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

/// The state every handler is given.
pub(crate) type Shared = Arc<DashboardState>;
