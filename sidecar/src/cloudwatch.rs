//! CloudWatch export, two modes (docs/metrics.md): Embedded Metric Format lines on
//! stdout (for the `awslogs` driver) or `PutMetricData` through the AWS SDK.
//!
//! Names are the Prometheus names. Dimensions are the metric's contract labels
//! only: never a task id (task identity belongs to the log stream or the
//! target; so not the `worker` label either, the worker's `OWNER_ID`), and never
//! `stream_id` (unbounded): per-stream gauges are published as the maximum over
//! streams. Counters are per-interval deltas (alarm on `Sum`),
//! histograms are distributions (percentiles available), gauges are values.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_cloudwatch::types::{Dimension, MetricDatum, StandardUnit};
use leasehold_platform::iam::{self, cloudwatch::PUT_METRIC_DATA};
use serde_json::{Map, Value as Json, json};
use tokio_util::sync::CancellationToken;

use crate::SidecarState;
use crate::snapshot::{Sample, Value};

/// Which CloudWatch path, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No CloudWatch export.
    Off,
    /// Embedded Metric Format JSON lines on stdout.
    Emf,
    /// `PutMetricData` API calls.
    Api,
}

/// CloudWatch export settings.
#[derive(Debug, Clone)]
pub struct CloudWatchConfig {
    /// Which path.
    pub mode: Mode,
    /// Metric namespace.
    pub namespace: String,
    /// Export period.
    pub interval: Duration,
}

/// EMF: at most this many metrics per document and values per metric.
pub const EMF_MAX_METRICS: usize = 100;
/// EMF: at most this many values in one metric's array.
pub const EMF_MAX_VALUES: usize = 100;
/// PutMetricData: at most this many datums per call (and 1 MB, see [`API_MAX_BYTES`]).
pub const API_MAX_DATUMS: usize = 1000;
/// PutMetricData: request size budget, below the 1 MB limit for headroom.
pub const API_MAX_BYTES: usize = 900 * 1024;
/// PutMetricData: at most this many distinct values per datum.
pub const API_MAX_VALUES: usize = 150;

/// One CloudWatch metric value.
#[derive(Debug, Clone, PartialEq)]
pub struct Datum {
    /// Metric name.
    pub name: String,
    /// `Seconds`, `Count` or `None`.
    pub unit: &'static str,
    /// Contract labels as dimensions, sorted.
    pub dimensions: Vec<(String, String)>,
    /// One value, or a distribution of (value, count).
    pub values: Vec<(f64, f64)>,
}

fn unit_of(name: &str) -> &'static str {
    if name.ends_with("_seconds") {
        "Seconds"
    } else if name.ends_with("_total") {
        "Count"
    } else {
        "None"
    }
}

/// Labels that never become dimensions: `stream_id` (unbounded; per-stream
/// gauges become the maximum over streams) and `worker` (the worker's
/// `OWNER_ID`, a task id: one series per sidecar, named by the log stream here).
pub const NOT_DIMENSIONS: [&str; 2] = ["stream_id", "worker"];

/// Turns a snapshot into datums: drops `stream_id` (max over streams),
/// `worker` and build info.
pub fn datums(samples: Vec<Sample>) -> Vec<Datum> {
    let mut gauges: BTreeMap<(String, Vec<(String, String)>), f64> = BTreeMap::new();
    let mut out = Vec::new();
    for sample in samples {
        if sample.name == crate::metrics::BUILD_INFO {
            continue;
        }
        let per_stream = sample.labels.iter().any(|(k, _)| k == "stream_id");
        let dimensions: Vec<(String, String)> = sample
            .labels
            .into_iter()
            .filter(|(k, _)| !NOT_DIMENSIONS.contains(&k.as_str()))
            .collect();
        match sample.value {
            Value::Gauge(value) if per_stream => {
                let slot = gauges.entry((sample.name, dimensions)).or_insert(f64::MIN);
                *slot = slot.max(value);
            }
            Value::Gauge(value) => out.push(Datum {
                unit: unit_of(&sample.name),
                name: sample.name,
                dimensions,
                values: vec![(value, 1.0)],
            }),
            Value::Delta(delta) => out.push(Datum {
                unit: unit_of(&sample.name),
                name: sample.name,
                dimensions,
                values: vec![(delta as f64, 1.0)],
            }),
            Value::Samples(values) if values.is_empty() => {}
            Value::Samples(values) => out.push(Datum {
                unit: unit_of(&sample.name),
                name: sample.name,
                dimensions,
                values: distribution(values),
            }),
        }
    }
    for ((name, dimensions), value) in gauges {
        out.push(Datum {
            unit: unit_of(&name),
            name,
            dimensions,
            values: vec![(value, 1.0)],
        });
    }
    out
}

/// Samples as (value, count), values rounded to 4 significant digits so a busy
/// interval collapses into few distinct values.
fn distribution(values: Vec<f64>) -> Vec<(f64, f64)> {
    let mut counts: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for value in values {
        let rounded = round_significant(value, 4);
        let entry = counts.entry(rounded.to_bits()).or_insert((rounded, 0.0));
        entry.1 += 1.0;
    }
    counts.into_values().collect()
}

fn round_significant(value: f64, digits: i32) -> f64 {
    if value == 0.0 || !value.is_finite() {
        return value;
    }
    let magnitude = value.abs().log10().floor() as i32;
    let factor = 10f64.powi(digits - 1 - magnitude);
    (value * factor).round() / factor
}

/// EMF documents (one JSON object each) for one interval.
pub fn emf_documents(namespace: &str, datums: &[Datum], timestamp_ms: i64) -> Vec<Json> {
    // Dimension values live at the document root, so one document per dimension set.
    let mut groups: BTreeMap<&[(String, String)], Vec<&Datum>> = BTreeMap::new();
    for datum in datums {
        groups.entry(&datum.dimensions).or_default().push(datum);
    }
    let mut documents = Vec::new();
    for (dimensions, group) in groups {
        // Expand distributions into value arrays of at most EMF_MAX_VALUES.
        let mut entries: Vec<(&Datum, Json)> = Vec::new();
        for datum in group {
            let expanded: Vec<f64> = datum
                .values
                .iter()
                .flat_map(|(value, count)| std::iter::repeat_n(*value, *count as usize))
                .collect();
            if expanded.len() == 1 {
                entries.push((datum, json!(expanded[0])));
            } else {
                for chunk in expanded.chunks(EMF_MAX_VALUES) {
                    entries.push((datum, json!(chunk)));
                }
            }
        }
        // A metric name may appear once per document: spread repeated chunks.
        let mut pending = entries;
        while !pending.is_empty() {
            let mut document = Map::new();
            let mut metrics = Vec::new();
            let mut rest = Vec::new();
            for (datum, value) in pending {
                if metrics.len() < EMF_MAX_METRICS && !document.contains_key(&datum.name) {
                    metrics.push(json!({"Name": datum.name, "Unit": datum.unit}));
                    document.insert(datum.name.clone(), value);
                } else {
                    rest.push((datum, value));
                }
            }
            for (key, value) in dimensions {
                document.insert(key.clone(), json!(value));
            }
            let keys: Vec<&String> = dimensions.iter().map(|(k, _)| k).collect();
            document.insert(
                "_aws".into(),
                json!({
                    "Timestamp": timestamp_ms,
                    "CloudWatchMetrics": [{
                        "Namespace": namespace,
                        "Dimensions": [keys],
                        "Metrics": metrics,
                    }]
                }),
            );
            documents.push(Json::Object(document));
            pending = rest;
        }
    }
    documents
}

/// `MetricDatum`s for PutMetricData (distributions split at 150 values).
pub fn api_datums(
    datums: &[Datum],
    timestamp: aws_sdk_cloudwatch::primitives::DateTime,
) -> Vec<MetricDatum> {
    let mut out = Vec::new();
    for datum in datums {
        let dimensions: Vec<Dimension> = datum
            .dimensions
            .iter()
            .map(|(k, v)| Dimension::builder().name(k).value(v).build())
            .collect();
        for chunk in datum.values.chunks(API_MAX_VALUES) {
            out.push(
                MetricDatum::builder()
                    .metric_name(&datum.name)
                    .unit(StandardUnit::from(datum.unit))
                    .timestamp(timestamp)
                    .set_dimensions(Some(dimensions.clone()))
                    .set_values(Some(chunk.iter().map(|(v, _)| *v).collect()))
                    .set_counts(Some(chunk.iter().map(|(_, c)| *c).collect()))
                    .build(),
            );
        }
    }
    out
}

/// A generous upper bound of a datum's encoded size, for the 1 MB limit.
fn estimated_bytes(datum: &MetricDatum) -> usize {
    let dimensions: usize = datum
        .dimensions()
        .iter()
        .map(|d| 16 + d.name().map_or(0, str::len) + d.value().map_or(0, str::len))
        .sum();
    64 + datum.metric_name().map_or(0, str::len)
        + dimensions
        + 18 * (datum.values().len() + datum.counts().len())
}

/// The metric a datum belongs to: its name and dimensions.
fn metric_key(datum: &MetricDatum) -> String {
    let mut key = datum.metric_name().unwrap_or_default().to_owned();
    for dimension in datum.dimensions() {
        key.push('\u{1f}');
        key.push_str(dimension.name().unwrap_or_default());
        key.push('=');
        key.push_str(dimension.value().unwrap_or_default());
    }
    key
}

/// Splits datums into PutMetricData calls within the API limits: at most
/// [`API_MAX_DATUMS`] datums and [`API_MAX_BYTES`] per call, and at most one
/// datum per metric per call, because the [`API_MAX_VALUES`] limit is per
/// metric and request, not per datum (a distribution with more distinct values
/// is sent in chunks, one call each).
pub fn batches(datums: Vec<MetricDatum>) -> Vec<Vec<MetricDatum>> {
    let mut batches = Vec::new();
    let mut current = Vec::new();
    let mut metrics_in_current = std::collections::HashSet::new();
    let mut bytes = 0;
    for datum in datums {
        let size = estimated_bytes(&datum);
        let key = metric_key(&datum);
        if !current.is_empty()
            && (current.len() == API_MAX_DATUMS
                || bytes + size > API_MAX_BYTES
                || metrics_in_current.contains(&key))
        {
            batches.push(std::mem::take(&mut current));
            metrics_in_current.clear();
            bytes = 0;
        }
        bytes += size;
        metrics_in_current.insert(key);
        current.push(datum);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

/// EMF lines at most waiting for stdout; beyond it lines are dropped and counted.
/// One interval of a busy sidecar is a few dozen lines.
pub const EMF_BUFFERED_LINES: usize = 10_000;

/// Where EMF documents go: a writer thread in front of stdout. Under the
/// `awslogs` driver in its default blocking mode a stalled log pipeline stalls
/// every write to stdout; the exporter (and the runtime thread it runs on, which
/// also serves `/metrics` and ingests worker events) must not stall with it, so
/// lines queue up to [`EMF_BUFFERED_LINES`] and are dropped beyond that.
pub struct EmfOutput {
    writer: tracing_appender::non_blocking::NonBlocking,
    // Dropping it flushes what is queued (at most about a second).
    _flush_on_drop: tracing_appender::non_blocking::WorkerGuard,
    reported: u64,
}

impl EmfOutput {
    /// A writer thread in front of `out`.
    pub fn new(out: impl std::io::Write + Send + 'static, buffered_lines: usize) -> Self {
        let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
            .lossy(true)
            .buffered_lines_limit(buffered_lines)
            .thread_name("leasehold-emf")
            .finish(out);
        EmfOutput {
            writer,
            _flush_on_drop: guard,
            reported: 0,
        }
    }

    /// Queues one document as one line (never blocks).
    pub fn write_line(&mut self, document: &str) {
        let mut line = String::with_capacity(document.len() + 1);
        line.push_str(document);
        line.push('\n');
        // One write call is one queued message, so a line is never split.
        let _ = std::io::Write::write_all(&mut self.writer, line.as_bytes());
    }

    /// Lines dropped since the last call.
    pub fn newly_dropped(&mut self) -> u64 {
        let dropped = self.writer.error_counter().dropped_lines() as u64;
        let new = dropped.saturating_sub(self.reported);
        self.reported = dropped;
        new
    }
}

/// Exports every interval until `shutdown` (one last export on the way out).
pub async fn run(
    state: Arc<SidecarState>,
    config: CloudWatchConfig,
    client: Option<aws_sdk_cloudwatch::Client>,
    shutdown: CancellationToken,
) {
    let Some(mut reader) = state.snapshot_reader() else {
        tracing::warn!("CloudWatch export started without a snapshot; nothing to export");
        return;
    };
    let mut emf =
        (config.mode == Mode::Emf).then(|| EmfOutput::new(std::io::stdout(), EMF_BUFFERED_LINES));
    let mut tick = tokio::time::interval(config.interval);
    tick.tick().await;
    loop {
        let last = tokio::select! {
            _ = shutdown.cancelled() => true,
            _ = tick.tick() => false,
        };
        let (held, worker) = {
            let view = state.view();
            (
                view.lag_streams(),
                view.upstream_connections().map(|u| u.worker),
            )
        };
        reader.retain_gauges("stream_id", |stream| held.iter().any(|h| h == stream));
        reader.retain_gauges("worker", |w| worker.as_deref() == Some(w));
        let datums = datums(reader.take());
        let now = leasehold_control::clock::Clock::now_ms(&leasehold_control::clock::SystemClock);
        match (config.mode, &client) {
            (Mode::Emf, _) => {
                if let Some(emf) = &mut emf {
                    for document in emf_documents(&config.namespace, &datums, now) {
                        emf.write_line(&document.to_string());
                    }
                    let dropped = emf.newly_dropped();
                    if dropped > 0 {
                        state.record_emf_dropped(dropped);
                    }
                }
            }
            (Mode::Api, Some(_)) if let Err(err) = iam::authorize(&[PUT_METRIC_DATA]) => {
                tracing::warn!(error = %err, "PutMetricData not sent; this interval is lost");
            }
            (Mode::Api, Some(client)) => {
                let timestamp = aws_sdk_cloudwatch::primitives::DateTime::from_millis(now);
                for batch in batches(api_datums(&datums, timestamp)) {
                    let sent = client
                        .put_metric_data()
                        .namespace(&config.namespace)
                        .set_metric_data(Some(batch))
                        .send()
                        .await;
                    if let Err(err) = sent {
                        tracing::warn!(error = %aws_sdk_cloudwatch::error::DisplayErrorContext(&err), "PutMetricData failed; this interval is lost");
                    }
                }
            }
            _ => {}
        }
        if last {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// stdout stuck (a blocking log driver that stopped draining) until released.
    #[derive(Clone, Default)]
    struct StalledStdout {
        released: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
        written: Arc<std::sync::Mutex<Vec<u8>>>,
    }

    impl std::io::Write for StalledStdout {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let (lock, released) = &*self.released;
            let _open = released
                .wait_while(lock.lock().unwrap(), |open| !*open)
                .unwrap();
            self.written.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_stdout_drops_emf_lines_instead_of_blocking() {
        let stdout = StalledStdout::default();
        let (done, finished) = std::sync::mpsc::channel();
        let writer = stdout.clone();
        std::thread::spawn(move || {
            let mut emf = EmfOutput::new(writer, 50);
            for i in 0..200 {
                emf.write_line(&format!("{{\"n\":{i}}}"));
            }
            done.send((emf.newly_dropped(), emf)).unwrap();
        });
        let (dropped, emf) = finished
            .recv_timeout(Duration::from_secs(10))
            .expect("writing EMF blocked on a stalled stdout");
        // 50 queued, at most one taken by the writer thread; the rest dropped.
        assert!((149..=150).contains(&dropped), "dropped {dropped}");
        *stdout.released.0.lock().unwrap() = true;
        stdout.released.1.notify_all();
        drop(emf);
        let written = String::from_utf8(stdout.written.lock().unwrap().clone()).unwrap();
        assert_eq!(written.lines().count() as u64, 200 - dropped);
        assert!(
            written.lines().all(|l| l.starts_with("{\"n\":")),
            "{written}"
        );
    }

    fn sample(name: &str, labels: &[(&str, &str)], value: Value) -> Sample {
        Sample {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value,
        }
    }

    #[test]
    fn stream_ids_are_aggregated_away_and_build_info_dropped() {
        let out = datums(vec![
            sample(
                "leasehold_checkpoint_lag_seconds",
                &[("stream_id", "a")],
                Value::Gauge(2.0),
            ),
            sample(
                "leasehold_checkpoint_lag_seconds",
                &[("stream_id", "b")],
                Value::Gauge(7.0),
            ),
            sample(
                "leasehold_build_info",
                &[("component", "sidecar")],
                Value::Gauge(1.0),
            ),
            sample(
                "leasehold_lease_acquisitions_total",
                &[("result", "acquired")],
                Value::Delta(3),
            ),
            sample(
                "leasehold_upstream_connections",
                &[("worker", "task-1")],
                Value::Gauge(4.0),
            ),
        ]);
        assert_eq!(out.len(), 3);
        let connections = out
            .iter()
            .find(|d| d.name == "leasehold_upstream_connections")
            .unwrap();
        assert_eq!(
            (connections.values.clone(), connections.dimensions.len()),
            (vec![(4.0, 1.0)], 0),
            "no task id as a dimension"
        );
        let lag = out
            .iter()
            .find(|d| d.name == "leasehold_checkpoint_lag_seconds")
            .unwrap();
        assert_eq!(
            (lag.values.clone(), lag.unit, lag.dimensions.len()),
            (vec![(7.0, 1.0)], "Seconds", 0)
        );
        let acquired = out.iter().find(|d| d.name.ends_with("_total")).unwrap();
        assert_eq!(
            (acquired.unit, acquired.dimensions[0].1.as_str()),
            ("Count", "acquired")
        );
    }

    #[test]
    fn distributions_collapse_to_distinct_values() {
        let values = distribution(vec![0.0012341, 0.0012344, 0.5, 0.5]);
        assert_eq!(values, [(0.001234, 2.0), (0.5, 2.0)]);
    }

    #[test]
    fn api_batches_respect_the_datum_limit() {
        let many: Vec<Datum> = (0..2500)
            .map(|i| Datum {
                name: format!("m{i}"),
                unit: "Count",
                dimensions: vec![],
                values: vec![(1.0, 1.0)],
            })
            .collect();
        let batches = batches(api_datums(
            &many,
            aws_sdk_cloudwatch::primitives::DateTime::from_millis(0),
        ));
        assert_eq!(
            batches.iter().map(Vec::len).collect::<Vec<_>>(),
            [1000, 1000, 500]
        );
    }

    #[test]
    fn api_batches_respect_the_size_limit() {
        let wide: Vec<Datum> = (0..100)
            .map(|i| Datum {
                name: format!("m{i}"),
                unit: "Seconds",
                dimensions: vec![],
                values: (0..1000).map(|v| (v as f64, 1.0)).collect(),
            })
            .collect();
        let datums = api_datums(
            &wide,
            aws_sdk_cloudwatch::primitives::DateTime::from_millis(0),
        );
        assert!(datums.iter().all(|d| d.values().len() <= API_MAX_VALUES));
        for batch in batches(datums) {
            let bytes: usize = batch.iter().map(estimated_bytes).sum();
            assert!(bytes <= API_MAX_BYTES);
        }
    }

    /// 150 values is a per-metric limit of one request: the chunks of a wide
    /// distribution go out in separate calls, each beside other metrics.
    #[test]
    fn one_metric_appears_at_most_once_per_call() {
        let dims = vec![("result".to_owned(), "ok".to_owned())];
        let wide = Datum {
            name: "leasehold_broker_request_duration_seconds".into(),
            unit: "Seconds",
            dimensions: dims.clone(),
            values: (0..400).map(|v| (v as f64 / 1000.0, 1.0)).collect(),
        };
        let other_dims = Datum {
            dimensions: vec![("result".to_owned(), "error".to_owned())],
            values: vec![(0.5, 1.0)],
            ..wide.clone()
        };
        let datums = api_datums(
            &[wide, other_dims],
            aws_sdk_cloudwatch::primitives::DateTime::from_millis(0),
        );
        assert_eq!(datums.len(), 4, "three chunks and the other series");
        let batches = batches(datums);
        assert_eq!(batches.len(), 3);
        for batch in &batches {
            let keys: std::collections::HashSet<String> = batch.iter().map(metric_key).collect();
            assert_eq!(keys.len(), batch.len(), "a metric twice in one call");
        }
        // The same name with other dimensions is another metric: it may share a call.
        assert_eq!(batches[2].len(), 2);
    }
}
