//! OTLP export: a `metrics` recorder that forwards every update to OpenTelemetry
//! instruments, exported by `opentelemetry-otlp` over gRPC or HTTP.
//!
//! The standard variables apply (`OTEL_EXPORTER_OTLP_ENDPOINT`,
//! `OTEL_EXPORTER_OTLP_PROTOCOL` = `grpc` | `http/protobuf`, `…_HEADERS`,
//! `…_TIMEOUT`, `…_COMPRESSION` = `gzip` | `none`, `…_CERTIFICATE` (a CA PEM
//! file trusted besides the public roots, for a collector with a private CA),
//! `OTEL_METRIC_EXPORT_INTERVAL`, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`);
//! OTLP export is on when an endpoint variable is set. `https://` endpoints use
//! TLS (rustls) on both transports.
//! Resource attributes: `service.name`, `service.instance.id`, and `aws.ecs.*`
//! from the ECS task metadata endpoint v4 when present.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Meter, MeterProvider};
use std::time::Duration;

use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_otlp::tonic_types::transport::{Certificate, ClientTlsConfig};
use opentelemetry_otlp::{
    Compression, Protocol, WithExportConfig, WithHttpConfig, WithTonicConfig,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use rustls::pki_types::pem::PemObject;

/// Which transport, and where (explicit values win over the `OTEL_*` variables).
#[derive(Debug, Clone, Default)]
pub struct OtlpConfig {
    /// `grpc` or `http/protobuf`; `None` reads `OTEL_EXPORTER_OTLP_PROTOCOL`.
    pub protocol: Option<String>,
    /// Collector endpoint; `None` reads the `OTEL_EXPORTER_OTLP_*ENDPOINT` variables.
    pub endpoint: Option<String>,
    /// Export period; `None` reads `OTEL_METRIC_EXPORT_INTERVAL` (default 60 s).
    pub interval: Option<std::time::Duration>,
    /// Resource attributes beyond the environment's (`service.instance.id`, `aws.ecs.*`).
    pub resource: Vec<(String, String)>,
    /// `gzip` or `none`; `None` reads `OTEL_EXPORTER_OTLP_*COMPRESSION` (default none).
    pub compression: Option<String>,
    /// PEM file of the CA that signed the collector's certificate, trusted besides
    /// the public roots; `None` reads `OTEL_EXPORTER_OTLP_*CERTIFICATE`.
    pub certificate: Option<std::path::PathBuf>,
}

/// Why OTLP export could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot start OTLP export: {0}")]
pub struct OtlpError(String);

impl OtlpConfig {
    /// The export this task's environment asks for (`None` when it names no
    /// collector), its resource naming the task: `service.instance.id` is
    /// the ECS task id, else the host name, then the `aws.ecs.*` attributes.
    pub fn for_task(metadata: &leasehold_platform::ecs::TaskMetadata) -> Option<OtlpConfig> {
        if !enabled_by_env() {
            return None;
        }
        let instance = metadata
            .task_id()
            .map(str::to_owned)
            .unwrap_or_else(leasehold_control::settings::default_owner_id);
        let mut resource = vec![("service.instance.id".to_owned(), instance)];
        resource.extend(metadata.resource_attributes());
        Some(OtlpConfig {
            resource,
            ..Default::default()
        })
    }
}

/// Whether the environment asks for OTLP export at all.
pub fn enabled_by_env() -> bool {
    [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    ]
    .iter()
    .any(|name| std::env::var(name).is_ok_and(|v| !v.is_empty()))
}

/// The metrics-specific variable, else the general one (the OTLP exporter spec's order).
fn otlp_env(suffix: &str) -> Option<String> {
    std::env::var(format!("OTEL_EXPORTER_OTLP_METRICS_{suffix}"))
        .ok()
        .or_else(|| std::env::var(format!("OTEL_EXPORTER_OTLP_{suffix}")).ok())
        .filter(|v| !v.is_empty())
}

fn compression(config: &OtlpConfig) -> Result<Option<Compression>, OtlpError> {
    match config
        .compression
        .clone()
        .or_else(|| otlp_env("COMPRESSION"))
        .as_deref()
    {
        None | Some("none") => Ok(None),
        Some("gzip") => Ok(Some(Compression::Gzip)),
        Some(other) => Err(OtlpError(format!(
            "unsupported OTLP compression {other:?} (gzip or none)"
        ))),
    }
}

/// The collector CA's PEM text, when one is configured.
fn certificate(config: &OtlpConfig) -> Result<Option<Vec<u8>>, OtlpError> {
    let Some(path) = config
        .certificate
        .clone()
        .or_else(|| otlp_env("CERTIFICATE").map(Into::into))
    else {
        return Ok(None);
    };
    std::fs::read(&path).map(Some).map_err(|err| {
        OtlpError(format!(
            "cannot read OTLP certificate {}: {err}",
            path.display()
        ))
    })
}

/// The HTTP exporter's client: hyper over rustls, trusting the public roots and
/// the configured CA, so `https://` collectors work (the default hyper client
/// speaks plaintext only).
fn https_client(
    ca: Option<&[u8]>,
) -> Result<HyperClient<HttpsConnector<HttpConnector>>, OtlpError> {
    let mut roots =
        rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(pem) = ca {
        let certificates: Vec<_> = rustls::pki_types::CertificateDer::pem_slice_iter(pem)
            .collect::<Result<_, _>>()
            .map_err(|err| OtlpError(format!("OTLP certificate is not PEM: {err}")))?;
        if certificates.is_empty() {
            return Err(OtlpError(
                "OTLP certificate file holds no certificate".into(),
            ));
        }
        for certificate in certificates {
            roots
                .add(certificate)
                .map_err(|err| OtlpError(format!("OTLP certificate refused: {err}")))?;
        }
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|err| OtlpError(err.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    let timeout = otlp_env("TIMEOUT")
        .and_then(|ms| ms.parse().ok())
        .map_or(Duration::from_secs(10), Duration::from_millis);
    Ok(HyperClient::new(connector, timeout, None))
}

/// Builds the meter provider (call inside the tokio runtime: the exporters use it).
pub fn meter_provider(config: &OtlpConfig) -> Result<SdkMeterProvider, OtlpError> {
    let protocol = config
        .protocol
        .clone()
        .or_else(|| otlp_env("PROTOCOL"))
        .unwrap_or_else(|| "http/protobuf".into());
    let compression = compression(config)?;
    let ca = certificate(config)?;
    let exporter = match protocol.as_str() {
        "grpc" => {
            let mut builder = opentelemetry_otlp::MetricExporter::builder().with_tonic();
            if let Some(endpoint) = &config.endpoint {
                builder = builder.with_endpoint(endpoint);
            }
            if let Some(compression) = compression {
                builder = builder.with_compression(compression);
            }
            // An https endpoint without a CA file gets the public roots from
            // the exporter itself; with one, both are trusted.
            if let Some(pem) = &ca {
                builder = builder.with_tls_config(
                    ClientTlsConfig::new()
                        .with_webpki_roots()
                        .ca_certificate(Certificate::from_pem(pem)),
                );
            }
            builder.build()
        }
        "http/protobuf" => {
            let mut builder = opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_http_client(https_client(ca.as_deref())?);
            if let Some(endpoint) = &config.endpoint {
                builder =
                    builder.with_endpoint(format!("{}/v1/metrics", endpoint.trim_end_matches('/')));
            }
            if let Some(compression) = compression {
                builder = builder.with_compression(compression);
            }
            builder.build()
        }
        other => {
            return Err(OtlpError(format!(
                "unsupported OTLP protocol {other:?} (grpc or http/protobuf)"
            )));
        }
    }
    .map_err(|err| OtlpError(err.to_string()))?;
    // The reader runs on tokio (not its own thread) because the HTTP exporter's
    // hyper client needs the runtime's reactor.
    let mut reader =
        opentelemetry_sdk::metrics::periodic_reader_with_async_runtime::PeriodicReader::builder(
            exporter,
            opentelemetry_sdk::runtime::Tokio,
        );
    if let Some(interval) = config.interval {
        reader = reader.with_interval(interval);
    }
    // The builder's defaults read OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
    let resource = Resource::builder()
        .with_service_name(
            std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "leasehold-sidecar".into()),
        )
        .with_attributes(
            config
                .resource
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
        .build();
    Ok(SdkMeterProvider::builder()
        .with_reader(reader.build())
        .with_resource(resource)
        .build())
}

/// The live series of one gauge name: what its observable instrument reports.
type GaugeSeries = Arc<Mutex<BTreeMap<Vec<(String, String)>, Arc<AtomicU64>>>>;

/// One gauge name: its instrument (kept alive so its callback stays registered)
/// and the series the callback reports.
struct OtelGaugeFamily {
    _instrument: opentelemetry::metrics::ObservableGauge<f64>,
    series: GaugeSeries,
}

/// Forwards `metrics` updates to OpenTelemetry instruments of the same name.
///
/// Gauges are observable instruments reading a set of live series, not
/// synchronous gauges: the SDK keeps reporting every attribute set a
/// synchronous gauge ever saw under cumulative temporality, so a stream's lag
/// would be exported forever after its lease moved to another task. An
/// observable gauge reports only what its callback observes, and a series
/// removed here ([`OtelRecorder::retain_gauges`], [`OtelRecorder::forget_gauges`])
/// leaves the next export.
pub struct OtelRecorder {
    meter: Meter,
    counters: Mutex<HashMap<String, opentelemetry::metrics::Counter<u64>>>,
    gauges: Mutex<HashMap<String, OtelGaugeFamily>>,
    histograms: Mutex<HashMap<String, opentelemetry::metrics::Histogram<f64>>>,
}

impl OtelRecorder {
    /// A recorder on this provider's meter.
    pub fn new(provider: &SdkMeterProvider) -> Self {
        OtelRecorder {
            meter: provider.meter("leasehold"),
            counters: Mutex::default(),
            gauges: Mutex::default(),
            histograms: Mutex::default(),
        }
    }

    /// Stops exporting gauge series whose label `label` has a value `keep`
    /// refuses (the per-stream series of a stream this task no longer holds).
    pub fn retain_gauges(&self, label: &str, keep: impl Fn(&str) -> bool) {
        for family in self
            .gauges
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            family
                .series
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|labels, _| {
                    labels
                        .iter()
                        .find(|(key, _)| key == label)
                        .is_none_or(|(_, value)| keep(value))
                });
        }
    }

    /// Stops exporting every series of the gauges named `names` (the cluster
    /// gauges when this sidecar stops being the observer).
    pub fn forget_gauges(&self, names: &[&str]) {
        for (name, family) in self.gauges.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if names.contains(&name.as_str()) {
                family
                    .series
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clear();
            }
        }
    }
}

fn attributes(key: &Key) -> Vec<KeyValue> {
    key.labels()
        .map(|l| KeyValue::new(l.key().to_owned(), l.value().to_owned()))
        .collect()
}

/// Seconds for `_seconds` metrics; no unit otherwise. Not `"1"`: the
/// OpenTelemetry-to-Prometheus translation appends `_ratio` to gauges with unit
/// `"1"` (`leasehold_worker_up_ratio`), and no rule or dashboard matches that.
fn unit(name: &str) -> Option<&'static str> {
    name.ends_with("_seconds").then_some("s")
}

struct OtelCounter(opentelemetry::metrics::Counter<u64>, Vec<KeyValue>);
struct OtelHistogram(opentelemetry::metrics::Histogram<f64>, Vec<KeyValue>);

impl metrics::CounterFn for OtelCounter {
    fn increment(&self, value: u64) {
        self.0.add(value, &self.1);
    }
    fn absolute(&self, _: u64) {
        // Counters here are only ever incremented; OTel counters have no absolute form.
    }
}

impl metrics::HistogramFn for OtelHistogram {
    fn record(&self, value: f64) {
        self.0.record(value, &self.1);
    }
}

impl Recorder for OtelRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let name = key.name().to_owned();
        let instrument = self
            .counters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name.clone())
            .or_insert_with(|| {
                let builder = self.meter.u64_counter(name);
                match unit(key.name()) {
                    Some(unit) => builder.with_unit(unit).build(),
                    None => builder.build(),
                }
            })
            .clone();
        Counter::from_arc(Arc::new(OtelCounter(instrument, attributes(key))))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let name = key.name().to_owned();
        let series = self
            .gauges
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name.clone())
            .or_insert_with(|| {
                let series = GaugeSeries::default();
                let observed = series.clone();
                let builder =
                    self.meter
                        .f64_observable_gauge(name)
                        .with_callback(move |observer| {
                            for (labels, value) in
                                observed.lock().unwrap_or_else(|p| p.into_inner()).iter()
                            {
                                let attributes: Vec<KeyValue> = labels
                                    .iter()
                                    .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
                                    .collect();
                                observer.observe(
                                    f64::from_bits(value.load(Ordering::Relaxed)),
                                    &attributes,
                                );
                            }
                        });
                let instrument = match unit(key.name()) {
                    Some(unit) => builder.with_unit(unit).build(),
                    None => builder.build(),
                };
                OtelGaugeFamily {
                    _instrument: instrument,
                    series,
                }
            })
            .series
            .clone();
        let labels = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        // `metrics` implements `GaugeFn` for `AtomicU64` (f64 bits): increment,
        // decrement and set land in the value the callback reads.
        let value = series
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(labels)
            .or_default()
            .clone();
        Gauge::from_arc(value)
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let name = key.name().to_owned();
        let boundaries = crate::metrics::buckets_for(key.name()).to_vec();
        let instrument = self
            .histograms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name.clone())
            .or_insert_with(|| {
                let builder = self.meter.f64_histogram(name).with_boundaries(boundaries);
                match unit(key.name()) {
                    Some(unit) => builder.with_unit(unit).build(),
                    None => builder.build(),
                }
            })
            .clone();
        Histogram::from_arc(Arc::new(OtelHistogram(instrument, attributes(key))))
    }
}
