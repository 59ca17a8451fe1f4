//! The cluster dashboard (axum + askama): who owns which stream with which
//! fence token, what is behind, what the warm pool looks like and what the
//! sweeper found, as server-rendered pages and a JSON API.
//!
//! Module map (a refresh flows sources → collector → model; a request flows
//! router → access → cache → views):
//! - [`sources`]: timed reads that produce one refresh's readings —
//!   [`sources::leases`] (the lease table through `leasehold_control::read`'s
//!   `LeaseTable`), [`sources::pool`] (the pool's one read model,
//!   `leasehold_pool::read`), [`sources::sidecars`] (discovery from the
//!   `sidecar_url` workers publish, validated as untrusted input, or the
//!   `DASHBOARD_SIDECARS` override; `/status` polling bounded per sidecar and
//!   per refresh — one deadline, one byte budget — kept as
//!   [`sources::sidecars::KeptStatus`]) and [`sources::sink`] (the stream page's sink
//!   position, through a [`sources::sink::SinkReader`] the binary provides).
//! - [`collector`]: runs the sources on the table-paced interval and applies
//!   the model; the only module with the locks the pages read under.
//! - [`model`]: the snapshot and its history, pure (no locks, no I/O):
//!   `Model::apply(readings) -> Snapshot`; [`model::streams`] (lease → row,
//!   badges, the Burrow-style verdict), [`model::changes`] (ownership changes,
//!   bounded by count and age, and fenced writes), [`model::gaps`] (data gaps,
//!   each taken once, bounded per stream and in all), [`model::trends`] (ring
//!   buffers of downsampled samples) and [`model::timeline`] (the history cut
//!   into per-lane segments).
//! - [`web`]: [`web::router`] (routes, security headers), [`web::access`]
//!   (bearer token, Host allow-list, the token form and `/logout`;
//!   [`web::session`]: the cookie's value, derived from the token, never the
//!   token, with its 12-hour expiry), conditional GET and the shared render
//!   ([`web::render_cache`]), [`web::column`] (typed `Column<Row>` and cells,
//!   shared with the refresh script), [`web::chart`] and [`web::lanes`] (SVG
//!   line charts and timeline lanes, each with a text equivalent),
//!   [`web::page`] (the header and the plain-tables page) and
//!   [`web::views`](mod@web::views), one module per view with its page, JSON
//!   body, columns, handlers and routes.
//! - [`settings`]: the `DASHBOARD_*` variables, read once.
//!
//! Feature `testing` opens the collector's test hooks to the seeded cluster
//! (`leasehold_testkit::dashboard`), which tests and the benchmark share.

pub mod collector;
pub mod model;
pub mod settings;
pub mod sources;
pub mod web;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use crate::collector::{Collector, CollectorSettings, Sources};
pub use crate::web::{Access, DashboardState, app};

/// How the dashboard runs.
pub struct DashboardConfig {
    /// Listen address (`DASHBOARD_LISTEN`; loopback unless told otherwise).
    pub listen: SocketAddr,
    /// Bearer token (`DASHBOARD_TOKEN`), if the dashboard is protected.
    pub token: Option<String>,
    /// Proxy trust and the Host allow-list.
    pub access: Access,
    /// Where the data comes from.
    pub sources: Sources,
    /// Refresh period and thresholds.
    pub settings: CollectorSettings,
    /// Wall clock.
    pub clock: Arc<dyn leasehold_control::clock::Clock>,
    /// The sink, for the per-stream page (`DASHBOARD_SINK_URL`).
    pub sink: Option<Arc<dyn sources::sink::SinkReader>>,
    /// Grafana, linked from the trends page (`DASHBOARD_GRAFANA_URL`).
    pub grafana: Option<String>,
}

/// Why the dashboard could not start.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    /// The listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Renders the views clients watch as soon as each snapshot is published
/// ([`web::render_cache`]), until `shutdown`.
async fn prewarm_after_each_snapshot(state: Arc<DashboardState>, shutdown: CancellationToken) {
    let views = web::views(state.clone());
    let mut generations = state.collector.subscribe();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = generations.changed() => {
                if changed.is_err() {
                    return;
                }
                web::prewarm(&state, &views).await;
            }
        }
    }
}

/// A running dashboard.
pub struct Dashboard {
    /// Bound address.
    pub addr: SocketAddr,
    /// The collector (tests and `dev` may refresh it directly).
    pub collector: Arc<Collector>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Dashboard {
    /// Binds, takes a first snapshot, and serves until `shutdown`.
    pub async fn start(
        config: DashboardConfig,
        shutdown: CancellationToken,
    ) -> Result<Dashboard, DashboardError> {
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| DashboardError::Bind {
                    addr: config.listen,
                    source,
                })?;
        let addr = listener
            .local_addr()
            .map_err(|source| DashboardError::Bind {
                addr: config.listen,
                source,
            })?;
        let collector = Arc::new(Collector::new(
            config.sources,
            config.settings,
            config.clock,
        ));
        let state = Arc::new(DashboardState {
            collector: collector.clone(),
            token: config.token,
            access: config.access,
            sink: config.sink,
            grafana: config.grafana,
            renders: Default::default(),
        });
        let router = app(state.clone());
        let mut tasks = vec![
            tokio::spawn(collector.clone().run(shutdown.clone())),
            tokio::spawn(prewarm_after_each_snapshot(state, shutdown.clone())),
        ];
        tasks.push(tokio::spawn(async move {
            let served = axum::serve(listener, router)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await;
            if let Err(err) = served {
                tracing::error!(error = %err, "dashboard HTTP server failed");
            }
        }));
        Ok(Dashboard {
            addr,
            collector,
            tasks,
        })
    }

    /// Waits for the server and the collector to stop (after shutdown).
    pub async fn finished(self) {
        for task in self.tasks {
            let _ = task.await;
        }
    }
}
