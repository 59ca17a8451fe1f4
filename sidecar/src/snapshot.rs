//! A second recorder beside Prometheus's, keeping raw values for the push
//! exporters (CloudWatch). Every metric update goes to all of them through one
//! fanout ([`Tee`]), the observer's cluster gauges included, so the mapping in
//! [`crate::metrics`] stays the only place names are spelled and every exporter
//! carries every metric.
//!
//! The snapshot exists only when a push exporter drains it: histogram samples
//! wait in it until the next export, so without a reader they would pile up.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::registry::{AtomicStorage, Registry};

/// Records into an atomic registry the exporters read periodically.
#[derive(Clone)]
pub struct SnapshotRecorder {
    registry: Arc<Registry<Key, AtomicStorage>>,
}

impl Default for SnapshotRecorder {
    fn default() -> Self {
        SnapshotRecorder {
            registry: Arc::new(Registry::atomic()),
        }
    }
}

impl SnapshotRecorder {
    /// Drops the gauges named `names` (the cluster gauges when this sidecar
    /// stops being the observer: another one publishes them now).
    pub fn forget_gauges(&self, names: &[&str]) {
        self.registry
            .retain_gauges(|key, _| !names.contains(&key.name()));
    }

    /// Histogram samples waiting for the next export.
    pub fn pending_samples(&self) -> usize {
        let mut pending = 0;
        self.registry.visit_histograms(|_, histogram| {
            histogram.data_with(|chunk| pending += chunk.len());
        });
        pending
    }
}

impl Recorder for SnapshotRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.registry
            .get_or_create_counter(key, |c| Counter::from_arc(c.clone()))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.registry
            .get_or_create_gauge(key, |g| Gauge::from_arc(g.clone()))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.registry
            .get_or_create_histogram(key, |h| Histogram::from_arc(h.clone()))
    }
}

/// Feeds Prometheus's recorder and the snapshot recorder with every update.
/// (metrics-util's `Fanout` is not `Send`, and the sidecar's state crosses tasks.)
pub struct Tee {
    /// Renders `/metrics`.
    pub prometheus: metrics_exporter_prometheus::PrometheusRecorder,
    /// Feeds the CloudWatch exporter, when CloudWatch export is on.
    pub snapshot: Option<SnapshotRecorder>,
    /// Feeds OpenTelemetry instruments, when OTLP export is on.
    pub otlp: Option<Arc<crate::otlp::OtelRecorder>>,
}

struct TeeCounter(Vec<Counter>);
struct TeeGauge(Vec<Gauge>);
struct TeeHistogram(Vec<Histogram>);

impl metrics::CounterFn for TeeCounter {
    fn increment(&self, value: u64) {
        self.0.iter().for_each(|c| c.increment(value));
    }
    fn absolute(&self, value: u64) {
        self.0.iter().for_each(|c| c.absolute(value));
    }
}

impl metrics::GaugeFn for TeeGauge {
    fn increment(&self, value: f64) {
        self.0.iter().for_each(|g| g.increment(value));
    }
    fn decrement(&self, value: f64) {
        self.0.iter().for_each(|g| g.decrement(value));
    }
    fn set(&self, value: f64) {
        self.0.iter().for_each(|g| g.set(value));
    }
}

impl metrics::HistogramFn for TeeHistogram {
    fn record(&self, value: f64) {
        self.0.iter().for_each(|h| h.record(value));
    }
}

impl Recorder for Tee {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.prometheus.describe_counter(key, unit, description);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.prometheus.describe_gauge(key, unit, description);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.prometheus.describe_histogram(key, unit, description);
    }
    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        let mut all = vec![self.prometheus.register_counter(key, metadata)];
        all.extend(
            self.snapshot
                .as_ref()
                .map(|s| s.register_counter(key, metadata)),
        );
        all.extend(
            self.otlp
                .as_ref()
                .map(|o| o.register_counter(key, metadata)),
        );
        Counter::from_arc(Arc::new(TeeCounter(all)))
    }
    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        let mut all = vec![self.prometheus.register_gauge(key, metadata)];
        all.extend(
            self.snapshot
                .as_ref()
                .map(|s| s.register_gauge(key, metadata)),
        );
        all.extend(self.otlp.as_ref().map(|o| o.register_gauge(key, metadata)));
        Gauge::from_arc(Arc::new(TeeGauge(all)))
    }
    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        let mut all = vec![self.prometheus.register_histogram(key, metadata)];
        all.extend(
            self.snapshot
                .as_ref()
                .map(|s| s.register_histogram(key, metadata)),
        );
        all.extend(
            self.otlp
                .as_ref()
                .map(|o| o.register_histogram(key, metadata)),
        );
        Histogram::from_arc(Arc::new(TeeHistogram(all)))
    }
}

/// One metric's value over an export interval.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Counter increase since the previous snapshot.
    Delta(u64),
    /// Gauge value now.
    Gauge(f64),
    /// Histogram samples recorded since the previous snapshot.
    Samples(Vec<f64>),
}

/// One series' value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name (the Prometheus name).
    pub name: String,
    /// Labels, sorted by name.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: Value,
}

/// Reads snapshots, remembering counter values to report deltas. One reader
/// per recorder: reading drains the histograms.
pub struct SnapshotReader {
    registry: Arc<Registry<Key, AtomicStorage>>,
    last_counts: HashMap<Key, u64>,
}

impl SnapshotReader {
    /// A reader for this recorder.
    pub fn new(recorder: &SnapshotRecorder) -> Self {
        SnapshotReader {
            registry: recorder.registry.clone(),
            last_counts: HashMap::new(),
        }
    }

    /// Everything recorded since the previous call.
    pub fn take(&mut self) -> Vec<Sample> {
        let mut samples = Vec::new();
        let sample = |key: &Key, value: Value| {
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            Sample {
                name: key.name().to_owned(),
                labels,
                value,
            }
        };
        let last = &mut self.last_counts;
        self.registry.visit_counters(|key, counter| {
            let now = counter.load(Ordering::Relaxed);
            let before = last.insert(key.clone(), now).unwrap_or(0);
            samples.push(sample(key, Value::Delta(now.saturating_sub(before))));
        });
        self.registry.visit_gauges(|key, gauge| {
            samples.push(sample(
                key,
                Value::Gauge(f64::from_bits(gauge.load(Ordering::Relaxed))),
            ));
        });
        self.registry.visit_histograms(|key, histogram| {
            let mut values = Vec::new();
            histogram.clear_with(|chunk| values.extend_from_slice(chunk));
            samples.push(sample(key, Value::Samples(values)));
        });
        samples.sort_by(|a, b| (&a.name, &a.labels).cmp(&(&b.name, &b.labels)));
        samples
    }

    /// Drops gauges whose label `label` has a value not in `keep` (per-stream
    /// series of streams no longer held).
    pub fn retain_gauges(&self, label: &str, keep: impl Fn(&str) -> bool) {
        self.registry.retain_gauges(|key, _| {
            key.labels()
                .find(|l| l.key() == label)
                .is_none_or(|l| keep(l.value()))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_deltas_and_histograms_drain() {
        let recorder = SnapshotRecorder::default();
        let mut reader = SnapshotReader::new(&recorder);
        metrics::with_local_recorder(&recorder, || {
            metrics::counter!("c_total", "result" => "ok").increment(3);
            metrics::gauge!("g").set(2.5);
            metrics::histogram!("h_seconds").record(0.1);
            metrics::histogram!("h_seconds").record(0.2);
        });
        let first = reader.take();
        assert_eq!(first[0].name, "c_total");
        assert_eq!(first[0].labels, [("result".to_owned(), "ok".to_owned())]);
        assert_eq!(first[0].value, Value::Delta(3));
        assert_eq!(first[1].value, Value::Gauge(2.5));
        assert_eq!(first[2].value, Value::Samples(vec![0.1, 0.2]));
        metrics::with_local_recorder(&recorder, || {
            metrics::counter!("c_total", "result" => "ok").increment(2)
        });
        let second = reader.take();
        assert_eq!(second[0].value, Value::Delta(2));
        assert_eq!(second[2].value, Value::Samples(vec![]));
    }

    #[test]
    fn per_stream_gauges_can_be_dropped() {
        let recorder = SnapshotRecorder::default();
        let mut reader = SnapshotReader::new(&recorder);
        metrics::with_local_recorder(&recorder, || {
            metrics::gauge!("lag", "stream_id" => "a").set(1.0);
            metrics::gauge!("lag", "stream_id" => "b").set(2.0);
        });
        reader.retain_gauges("stream_id", |s| s == "b");
        let samples = reader.take();
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].labels[0].1, "b");
    }
}
