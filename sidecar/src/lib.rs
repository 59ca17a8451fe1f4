//! The per-task telemetry sidecar: the one place that turns what a worker does
//! into metrics, and the outside view of the worker and the cluster.
//!
//! Module map:
//! - [`metrics`]: the metric contract (docs/metrics.md) and the event → metric mapping.
//! - [`view`]: the worker as the sidecar sees it (alive, leases, lag) → `/status`.
//! - [`ingest`]: worker connections on `TELEMETRY_ADDR` (versioned framing).
//! - [`http`]: `/metrics`, `/healthz`, `/status`.
//! - [`observer`]: the single cluster observer (observer lease → cluster gauges).
//! - [`snapshot`]: raw values beside Prometheus's, for the push exporters.
//! - [`cloudwatch`]: EMF lines or PutMetricData from those snapshots.
//! - [`otlp`]: OpenTelemetry instruments fed by the same updates, exported over OTLP.
//! - [`settings`]: the sidecar's variables (addresses, exporters, observer).

pub mod cloudwatch;
pub mod http;
pub mod ingest;
pub mod metrics;
pub mod observer;
pub mod otlp;
pub mod settings;
pub mod snapshot;
pub mod view;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::snapshot::{SnapshotRecorder, Tee};
use leasehold_telemetry::TelemetryEvent;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::view::WorkerView;

/// How a sidecar runs.
pub struct SidecarConfig {
    /// HTTP address (`SIDECAR_LISTEN`).
    pub listen: SocketAddr,
    /// Telemetry address (`TELEMETRY_ADDR`).
    pub telemetry: SocketAddr,
    /// Worker called down after this long without events.
    pub worker_silence: Duration,
    /// Per-stream series disappear this long after their last update.
    pub stream_series_idle: Duration,
    /// The cluster observer, if this sidecar competes for it.
    pub observer: Option<observer::ObserverConfig>,
    /// OTLP export, if any.
    pub otlp: Option<otlp::OtlpConfig>,
    /// CloudWatch export (EMF or API), if any; the client is needed for the API mode.
    pub cloudwatch: Option<(
        cloudwatch::CloudWatchConfig,
        Option<aws_sdk_cloudwatch::Client>,
    )>,
}

impl SidecarConfig {
    /// Both listeners on ephemeral loopback ports, Prometheus only, default
    /// thresholds: the starting point for tests, benchmarks and `dev`.
    pub fn loopback() -> Self {
        SidecarConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            telemetry: SocketAddr::from(([127, 0, 0, 1], 0)),
            worker_silence: Duration::from_secs(5),
            stream_series_idle: Duration::from_secs(120),
            observer: None,
            otlp: None,
            cloudwatch: None,
        }
    }
}

/// Why the sidecar could not start.
#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    /// A listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// OTLP export could not be set up.
    #[error(transparent)]
    Otlp(#[from] otlp::OtlpError),
}

/// State shared by the ingest, HTTP and observer tasks.
pub struct SidecarState {
    /// Prometheus, the snapshot and OTLP, fed together.
    recorder: Tee,
    handle: PrometheusHandle,
    /// Raw values for CloudWatch; only when CloudWatch export drains them.
    snapshot: Option<SnapshotRecorder>,
    otlp: Option<Arc<otlp::OtelRecorder>>,
    view: Mutex<WorkerView>,
    /// While this sidecar is the observer: the cluster gauges' own fanout (its
    /// own Prometheus registry, so they leave `/metrics` when observing stops,
    /// and the same snapshot and OTLP instruments as everything else).
    cluster: Mutex<Option<Tee>>,
    meter_provider: Option<opentelemetry_sdk::metrics::SdkMeterProvider>,
    /// The sidecar's own `process_*` metrics (Prometheus only: per-task
    /// values mean nothing in CloudWatch without a task dimension).
    process: metrics_process::Collector,
}

impl SidecarState {
    fn new(config: &SidecarConfig) -> Result<Self, SidecarError> {
        let prometheus = metrics::recorder(config.stream_series_idle);
        let handle = prometheus.handle();
        let cloudwatch_on = config
            .cloudwatch
            .as_ref()
            .is_some_and(|(cloudwatch, _)| cloudwatch.mode != cloudwatch::Mode::Off);
        let snapshot = cloudwatch_on.then(SnapshotRecorder::default);
        let meter_provider = config.otlp.as_ref().map(otlp::meter_provider).transpose()?;
        let otlp = meter_provider
            .as_ref()
            .map(|provider| Arc::new(otlp::OtelRecorder::new(provider)));
        let recorder = Tee {
            prometheus,
            snapshot: snapshot.clone(),
            otlp: otlp.clone(),
        };
        ::metrics::with_local_recorder(&recorder, metrics::describe);
        ::metrics::with_local_recorder(&recorder.prometheus, metrics::zero_counters);
        let process = metrics_process::Collector::default();
        ::metrics::with_local_recorder(&recorder.prometheus, || process.describe());
        Ok(SidecarState {
            recorder,
            handle,
            snapshot,
            otlp,
            view: Mutex::new(WorkerView::new(config.worker_silence)),
            cluster: Mutex::new(None),
            meter_provider,
            process,
        })
    }

    /// The worker view (short critical sections only).
    pub fn view(&self) -> MutexGuard<'_, WorkerView> {
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One event: into the view and the metrics.
    pub fn ingest(&self, event: &TelemetryEvent) {
        // The view stays locked while the metrics are recorded: upkeep drops
        // OTLP series of streams the view no longer has under the same lock,
        // so it can never drop a series this event is adding.
        let mut view = self.view();
        view.apply(event);
        let cpu_seconds = match event {
            TelemetryEvent::WorkerHeartbeat {
                process: Some(usage),
                ..
            } => view.worker_cpu_seconds(usage.cpu_seconds),
            _ => 0,
        };
        // A new report, or the worker naming itself: the upstream gauges now,
        // not at the next upkeep.
        let upstream = match event {
            TelemetryEvent::UpstreamConnections { .. } | TelemetryEvent::WorkerHeartbeat { .. } => {
                view.upstream_connections()
            }
            _ => None,
        };
        ::metrics::with_local_recorder(&self.recorder, || {
            metrics::record(event);
            if cpu_seconds > 0 {
                ::metrics::counter!(metrics::WORKER_CPU_SECONDS).increment(cpu_seconds);
            }
            if let Some(upstream) = &upstream {
                metrics::set_upstream_gauges(upstream);
            }
        });
        drop(view);
    }

    fn record_emf_dropped(&self, lines: u64) {
        ::metrics::with_local_recorder(&self.recorder, || {
            ::metrics::counter!(metrics::EMF_LINES_DROPPED).increment(lines)
        });
    }

    fn record_transport_error(&self, reason: metrics::TransportError) {
        ::metrics::with_local_recorder(&self.recorder, || metrics::transport_error(reason));
    }

    /// Re-sets the sidecar-owned gauges and runs the exporters' upkeep.
    pub fn upkeep(&self) {
        let (up, held, connections, component, upstream) = {
            let view = self.view();
            let upstream = view.upstream_connections();
            // A stream this task stopped working on leaves OTLP within a second
            // (Prometheus drops it after the idle timeout, CloudWatch per
            // export), and so does a worker that was replaced behind this
            // sidecar. Under the view's lock: see `ingest`.
            if let Some(otlp) = &self.otlp {
                let lag_streams = view.lag_streams();
                otlp.retain_gauges("stream_id", |stream| {
                    lag_streams.iter().any(|s| s == stream)
                });
                otlp.retain_gauges("worker", |worker| {
                    upstream.as_ref().is_some_and(|u| u.worker == worker)
                });
            }
            (
                view.worker_up(),
                view.stream_leases_held(),
                view.websocket_connections(),
                view.component().map(str::to_owned),
                upstream,
            )
        };
        ::metrics::with_local_recorder(&self.recorder, || {
            metrics::set_worker_gauges(up, held, connections, "sidecar");
            if let Some(upstream) = &upstream {
                metrics::set_upstream_gauges(upstream);
            }
            if let Some(component) = &component {
                ::metrics::gauge!(metrics::BUILD_INFO, "version" => env!("CARGO_PKG_VERSION"), "component" => component.clone()).set(1.0);
            }
        });
        ::metrics::with_local_recorder(&self.recorder.prometheus, || self.process.collect());
        self.handle.run_upkeep();
    }

    /// The `/metrics` body: the worker's series, plus the cluster gauges while
    /// this sidecar is the observer.
    pub fn render(&self) -> String {
        let (held, worker) = {
            let view = self.view();
            (
                view.lag_streams(),
                view.upstream_connections().map(|u| u.worker),
            )
        };
        let text = metrics::drop_unheld_stream_series(self.handle.render(), &held);
        let mut text = metrics::drop_other_worker_series(text, worker.as_deref());
        if let Some(cluster) = self
            .cluster
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            text.push_str(&cluster.prometheus.handle().render());
        }
        text
    }

    fn become_observer(&self) {
        let recorder = Tee {
            prometheus: metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder(),
            snapshot: self.snapshot.clone(),
            otlp: self.otlp.clone(),
        };
        ::metrics::with_local_recorder(&recorder, metrics::describe_cluster);
        *self.cluster.lock().unwrap_or_else(|p| p.into_inner()) = Some(recorder);
    }

    fn stop_observing(&self) {
        *self.cluster.lock().unwrap_or_else(|p| p.into_inner()) = None;
        // Another sidecar publishes them now: CloudWatch must not get this
        // one's last values too.
        if let Some(snapshot) = &self.snapshot {
            snapshot.forget_gauges(metrics::CLUSTER);
        }
        if let Some(otlp) = &self.otlp {
            otlp.forget_gauges(metrics::CLUSTER);
        }
    }

    fn with_cluster_recorder(&self, update: impl FnOnce()) {
        if let Some(recorder) = self
            .cluster
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            ::metrics::with_local_recorder(recorder, update);
        }
    }

    /// A reader of the push-export snapshots (tests and benchmarks; the
    /// CloudWatch exporter holds its own). `None` when CloudWatch export is off:
    /// nothing is kept for it then.
    pub fn snapshot_reader(&self) -> Option<snapshot::SnapshotReader> {
        self.snapshot.as_ref().map(snapshot::SnapshotReader::new)
    }

    /// Histogram samples waiting for the next push export (0 when none is on).
    pub fn pending_push_samples(&self) -> usize {
        self.snapshot
            .as_ref()
            .map_or(0, SnapshotRecorder::pending_samples)
    }

    /// This sidecar publishes the cluster gauges.
    pub fn is_observer(&self) -> bool {
        self.cluster
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }
}

/// A running sidecar.
pub struct Sidecar {
    /// Bound HTTP address.
    pub http_addr: SocketAddr,
    /// Bound telemetry address.
    pub telemetry_addr: SocketAddr,
    /// Shared state (tests and `dev` read it directly).
    pub state: Arc<SidecarState>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Sidecar {
    /// Binds both listeners and starts serving until `shutdown`.
    pub async fn start(
        config: SidecarConfig,
        shutdown: CancellationToken,
    ) -> Result<Sidecar, SidecarError> {
        let state = Arc::new(SidecarState::new(&config)?);
        let bind = |addr: SocketAddr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| SidecarError::Bind { addr, source })
        };
        let telemetry = bind(config.telemetry).await?;
        let http = bind(config.listen).await?;
        let telemetry_addr = telemetry
            .local_addr()
            .map_err(|source| SidecarError::Bind {
                addr: config.telemetry,
                source,
            })?;
        let http_addr = http.local_addr().map_err(|source| SidecarError::Bind {
            addr: config.listen,
            source,
        })?;
        let mut tasks = vec![tokio::spawn(ingest::serve(
            telemetry,
            state.clone(),
            shutdown.clone(),
        ))];
        tasks.push(tokio::spawn({
            let router = http::app(state.clone());
            let shutdown = shutdown.clone();
            async move {
                let served = axum::serve(http, router)
                    .with_graceful_shutdown(shutdown.cancelled_owned())
                    .await;
                if let Err(err) = served {
                    tracing::error!(error = %err, "sidecar HTTP server failed");
                }
            }
        }));
        tasks.push(tokio::spawn({
            let state = state.clone();
            let shutdown = shutdown.clone();
            async move {
                leasehold_platform::periodic::every(Duration::from_secs(1), shutdown, || {
                    state.upkeep();
                    std::future::ready(())
                })
                .await
            }
        }));
        if let Some((cloudwatch, client)) = config.cloudwatch
            && cloudwatch.mode != cloudwatch::Mode::Off
        {
            tasks.push(tokio::spawn(cloudwatch::run(
                state.clone(),
                cloudwatch,
                client,
                shutdown.clone(),
            )));
        }
        if let Some(observer) = config.observer {
            tasks.push(tokio::spawn(observer::run(
                state.clone(),
                observer,
                shutdown.clone(),
            )));
        }
        state.upkeep();
        Ok(Sidecar {
            http_addr,
            telemetry_addr,
            state,
            tasks,
        })
    }

    /// Waits for every task to end (after shutdown), then flushes OTLP.
    pub async fn finished(self) {
        for task in self.tasks {
            let _ = task.await;
        }
        if let Some(provider) = &self.state.meter_provider
            && let Err(err) = provider.shutdown()
        {
            tracing::warn!(error = %err, "OTLP flush on shutdown failed");
        }
    }
}
