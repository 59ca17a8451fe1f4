//! OTLP export: a `metrics` recorder that forwards every update to OpenTelemetry
//! instruments, exported by `opentelemetry-otlp` over gRPC or HTTP.
//!
//! The standard variables apply (`OTEL_EXPORTER_OTLP_ENDPOINT`,
//! `OTEL_EXPORTER_OTLP_PROTOCOL` = `grpc` | `http/protobuf`, `…_HEADERS`,
//! `…_TIMEOUT`, `OTEL_METRIC_EXPORT_INTERVAL`, `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`); OTLP export is on when an endpoint variable is set.
//! Resource attributes: `service.name`, `service.instance.id`, and `aws.ecs.*`
//! from the ECS task metadata endpoint v4 when present.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Meter, MeterProvider};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;

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
}

/// Why OTLP export could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot start OTLP export: {0}")]
pub struct OtlpError(String);

/// Whether the environment asks for OTLP export at all.
pub fn enabled_by_env() -> bool {
    [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    ]
    .iter()
    .any(|name| std::env::var(name).is_ok_and(|v| !v.is_empty()))
}

/// Builds the meter provider (call inside the tokio runtime: the exporters use it).
pub fn meter_provider(config: &OtlpConfig) -> Result<SdkMeterProvider, OtlpError> {
    let protocol = config
        .protocol
        .clone()
        .or_else(|| std::env::var("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL").ok())
        .or_else(|| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL").ok())
        .unwrap_or_else(|| "http/protobuf".into());
    let exporter = match protocol.as_str() {
        "grpc" => {
            let mut builder = opentelemetry_otlp::MetricExporter::builder().with_tonic();
            if let Some(endpoint) = &config.endpoint {
                builder = builder.with_endpoint(endpoint);
            }
            builder.build()
        }
        "http/protobuf" => {
            let mut builder = opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary);
            if let Some(endpoint) = &config.endpoint {
                builder =
                    builder.with_endpoint(format!("{}/v1/metrics", endpoint.trim_end_matches('/')));
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

/// Forwards `metrics` updates to OpenTelemetry instruments of the same name.
pub struct OtelRecorder {
    meter: Meter,
    counters: Mutex<HashMap<String, opentelemetry::metrics::Counter<u64>>>,
    gauges: Mutex<HashMap<String, opentelemetry::metrics::Gauge<f64>>>,
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
struct OtelGauge(opentelemetry::metrics::Gauge<f64>, Vec<KeyValue>, AtomicU64);
struct OtelHistogram(opentelemetry::metrics::Histogram<f64>, Vec<KeyValue>);

impl metrics::CounterFn for OtelCounter {
    fn increment(&self, value: u64) {
        self.0.add(value, &self.1);
    }
    fn absolute(&self, _: u64) {
        // Counters here are only ever incremented; OTel counters have no absolute form.
    }
}

impl metrics::GaugeFn for OtelGauge {
    fn increment(&self, value: f64) {
        self.set(f64::from_bits(self.2.load(Ordering::Relaxed)) + value);
    }
    fn decrement(&self, value: f64) {
        self.set(f64::from_bits(self.2.load(Ordering::Relaxed)) - value);
    }
    fn set(&self, value: f64) {
        self.2.store(value.to_bits(), Ordering::Relaxed);
        self.0.record(value, &self.1);
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
        let instrument = self
            .gauges
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name.clone())
            .or_insert_with(|| {
                let builder = self.meter.f64_gauge(name);
                match unit(key.name()) {
                    Some(unit) => builder.with_unit(unit).build(),
                    None => builder.build(),
                }
            })
            .clone();
        Gauge::from_arc(Arc::new(OtelGauge(
            instrument,
            attributes(key),
            AtomicU64::new(0),
        )))
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
