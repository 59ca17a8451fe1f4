//! Every exporter carries every metric with its label set.
//!
//! Two real sidecars, each also the observer of a lease table, are fed one event
//! of every variant and every value of every closed label, plus a stranger on the
//! telemetry port. The first exports over OTLP/HTTP to a collector decoding the
//! protobuf wire format and through PutMetricData to a fake CloudWatch decoding
//! the SDK's CBOR; the second is in EMF mode, read through the same snapshot and
//! document builder its exporter writes to stdout. What each receiver got is
//! compared, name by name and label set by label set, with `/metrics`:
//! - every series that moved on `/metrics` reaches OTLP with the same label keys;
//! - every series that moved reaches CloudWatch (both modes) with the label keys
//!   minus `stream_id` (aggregated away by design, docs/metrics.md) and
//!   `worker` (a task id, never a dimension), except `leasehold_build_info`;
//! - no exporter sends a name or label set `/metrics` does not have.
//!
//! "Moved" means a counter above 0, a histogram with observations, or any gauge:
//! counters that never moved are on `/metrics` at 0 (for `increase()`), while the
//! push exporters send a counter once it moves. The sidecar's own `process_*`
//! series are Prometheus-only (docs/metrics.md).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::support::{decode, fake_cloudwatch, field, http_collector, observer};
use leasehold_control::store::LeaseStore;
use leasehold_control::store::memory::MemoryLeaseStore;
use leasehold_sidecar::cloudwatch::{
    CloudWatchConfig, Mode, NOT_DIMENSIONS, datums, emf_documents,
};
use leasehold_sidecar::otlp::OtlpConfig;
use leasehold_sidecar::{Sidecar, SidecarConfig};
use leasehold_telemetry::testing::{every_event, every_label_value};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

/// Metric name → the label-key sets it is exported with.
type Series = BTreeMap<String, BTreeSet<Vec<String>>>;

fn add(series: &mut Series, name: &str, mut keys: Vec<String>) {
    keys.sort();
    keys.dedup();
    series.entry(name.to_owned()).or_default().insert(keys);
}

/// The label keys of a `{k="v",…}` block (values here never hold `",`).
fn label_keys(labels: &str) -> Vec<String> {
    labels
        .split("\",")
        .filter_map(|pair| pair.split_once('='))
        .map(|(key, _)| key.trim_matches(|c| c == ',' || c == ' ').to_owned())
        .filter(|key| !key.is_empty())
        .collect()
}

/// Every series on `/metrics`, and the ones that moved.
fn prometheus(text: &str) -> (Series, Series) {
    let mut kinds = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                kinds.insert(name.to_owned(), kind.to_owned());
            }
        }
    }
    let (mut all, mut moved) = (Series::new(), Series::new());
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').expect("sample line");
        let (sample, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        let histogram = ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
            sample
                .strip_suffix(suffix)
                .filter(|base| kinds.get(*base).map(String::as_str) == Some("histogram"))
                .map(|base| (base, *suffix))
        });
        let name = histogram.map_or(sample, |(base, _)| base);
        if name.starts_with("process_") {
            continue;
        }
        let keys: Vec<String> = label_keys(labels)
            .into_iter()
            .filter(|key| key != "le")
            .collect();
        add(&mut all, name, keys.clone());
        let value: f64 = value.parse().expect("sample value");
        let has_moved = match (kinds.get(name).map(String::as_str), histogram) {
            (Some("counter"), _) => value > 0.0,
            (Some("histogram"), Some((_, "_count"))) => value > 0.0,
            (Some("histogram"), _) => false,
            _ => true,
        };
        if has_moved {
            add(&mut moved, name, keys);
        }
    }
    (all, moved)
}

/// The series as CloudWatch gets them: without the labels that are never
/// dimensions, and without build info.
fn without_task_labels(series: &Series) -> Series {
    let mut out = Series::new();
    for (name, key_sets) in series {
        if name == "leasehold_build_info" {
            continue;
        }
        for keys in key_sets {
            add(
                &mut out,
                name,
                keys.iter()
                    .filter(|k| !NOT_DIMENSIONS.contains(&k.as_str()))
                    .cloned()
                    .collect(),
            );
        }
    }
    out
}

/// What is in `expected` but not in `got`, and what `got` has that `allowed` has not.
fn compare(exporter: &str, expected: &Series, allowed: &Series, got: &Series) {
    let mut missing = Vec::new();
    for (name, key_sets) in expected {
        for keys in key_sets {
            if !got.get(name).is_some_and(|sets| sets.contains(keys)) {
                missing.push(format!("{name}{keys:?}"));
            }
        }
    }
    let mut unknown = Vec::new();
    for (name, key_sets) in got {
        for keys in key_sets {
            if !allowed.get(name).is_some_and(|sets| sets.contains(keys)) {
                unknown.push(format!("{name}{keys:?}"));
            }
        }
    }
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "{exporter}: missing {missing:?}\nnot on /metrics: {unknown:?}\ngot: {got:?}"
    );
}

/// A sidecar observing a one-stream table, fed everything.
async fn fed_sidecar(config: SidecarConfig, shutdown: &CancellationToken) -> Sidecar {
    let table = Arc::new(MemoryLeaseStore::new());
    table.register("btc-usd", 0).await.unwrap();
    let sidecar = Sidecar::start(
        SidecarConfig {
            observer: Some(observer(table as Arc<dyn LeaseStore>).await),
            ..config
        },
        shutdown.clone(),
    )
    .await
    .unwrap();
    // As from a connected worker: a sidecar exports no per-stream series for
    // a worker that is not connected and reporting.
    sidecar.state.view().connection(true);
    for event in every_event().into_iter().chain(every_label_value()) {
        sidecar.state.ingest(&event);
    }
    let mut stranger = tokio::net::TcpStream::connect(sidecar.telemetry_addr)
        .await
        .unwrap();
    stranger.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    sidecar
}

/// `/metrics` once the observer and the stranger have shown up.
async fn settled_metrics(sidecar: &Sidecar) -> String {
    for _ in 0..250 {
        let text = sidecar.state.render();
        if text.contains("leasehold_streams{")
            && text.contains(r#"leasehold_sidecar_transport_errors_total{reason="preamble"} 1"#)
            && (leasehold_testkit::redis_url().is_none() || text.contains("leasehold_orphans{"))
        {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the sidecar never settled:\n{}", sidecar.state.render());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_exporter_carries_every_metric_and_label_set() {
    let shutdown = CancellationToken::new();
    let (otlp_endpoint, otlp_received) = http_collector().await;
    let (cloudwatch_endpoint, cloudwatch_captured) = fake_cloudwatch().await;
    let client =
        aws_sdk_cloudwatch::Client::new(&leasehold_testkit::local_sdk_config(&cloudwatch_endpoint));
    let pushing = fed_sidecar(
        SidecarConfig {
            otlp: Some(OtlpConfig {
                protocol: Some("http/protobuf".into()),
                endpoint: Some(otlp_endpoint),
                interval: Some(Duration::from_millis(300)),
                ..Default::default()
            }),
            cloudwatch: Some((
                CloudWatchConfig {
                    mode: Mode::Api,
                    namespace: "LeaseholdTest".into(),
                    interval: Duration::from_millis(300),
                },
                Some(client),
            )),
            ..SidecarConfig::loopback()
        },
        &shutdown,
    )
    .await;
    // EMF: an interval the test never reaches; it reads what the exporter would write.
    let emf = fed_sidecar(
        SidecarConfig {
            cloudwatch: Some((
                CloudWatchConfig {
                    mode: Mode::Emf,
                    namespace: "LeaseholdTest".into(),
                    interval: Duration::from_secs(3600),
                },
                None,
            )),
            ..SidecarConfig::loopback()
        },
        &shutdown,
    )
    .await;
    let (all, moved) = prometheus(&settled_metrics(&pushing).await);
    let emf_text = settled_metrics(&emf).await;

    // Let two push intervals pass after everything was fed and observed.
    tokio::time::sleep(Duration::from_millis(1000)).await;

    let mut otlp = Series::new();
    for request in otlp_received.lock().unwrap().iter() {
        for metric in request
            .resource_metrics
            .iter()
            .flat_map(|r| &r.scope_metrics)
            .flat_map(|s| &s.metrics)
        {
            let points: Vec<Vec<String>> = match &metric.data {
                Some(Data::Sum(sum)) => sum
                    .data_points
                    .iter()
                    .map(|p| keys(&p.attributes))
                    .collect(),
                Some(Data::Gauge(gauge)) => gauge
                    .data_points
                    .iter()
                    .map(|p| keys(&p.attributes))
                    .collect(),
                Some(Data::Histogram(histogram)) => histogram
                    .data_points
                    .iter()
                    .map(|p| keys(&p.attributes))
                    .collect(),
                other => panic!("{}: unexpected OTLP data {other:?}", metric.name),
            };
            for point in points {
                add(&mut otlp, &metric.name, point);
            }
        }
    }
    compare("OTLP", &moved, &all, &otlp);

    let mut put_metric_data = Series::new();
    for (_, headers, body) in cloudwatch_captured.lock().unwrap().iter() {
        let request = decode(headers, body);
        for datum in field(&request, "MetricData")
            .and_then(ciborium::Value::as_array)
            .into_iter()
            .flatten()
        {
            let name = field(datum, "MetricName")
                .and_then(ciborium::Value::as_text)
                .expect("MetricName");
            let dimensions = field(datum, "Dimensions")
                .and_then(ciborium::Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|d| field(d, "Name").and_then(ciborium::Value::as_text))
                .map(str::to_owned)
                .collect();
            add(&mut put_metric_data, name, dimensions);
        }
    }
    let cloudwatch_expected = without_task_labels(&moved);
    let cloudwatch_allowed = without_task_labels(&all);
    compare(
        "PutMetricData",
        &cloudwatch_expected,
        &cloudwatch_allowed,
        &put_metric_data,
    );

    let (emf_all, emf_moved) = prometheus(&emf_text);
    let mut emf_series = Series::new();
    let snapshot = emf.state.snapshot_reader().expect("EMF is on").take();
    for document in emf_documents("LeaseholdTest", &datums(snapshot), 0) {
        let directive = &document["_aws"]["CloudWatchMetrics"][0];
        let dimension_sets = directive["Dimensions"].as_array().expect("Dimensions");
        for metric in directive["Metrics"].as_array().expect("Metrics") {
            let name = metric["Name"].as_str().expect("Name");
            for set in dimension_sets {
                let keys = set
                    .as_array()
                    .expect("a dimension set")
                    .iter()
                    .map(|k| k.as_str().expect("dimension name").to_owned())
                    .collect();
                add(&mut emf_series, name, keys);
            }
        }
    }
    compare(
        "EMF",
        &without_task_labels(&emf_moved),
        &without_task_labels(&emf_all),
        &emf_series,
    );

    // Sanity: the comparison saw the kinds that once went missing.
    for name in [
        "leasehold_streams",
        "leasehold_stream_unowned_age_seconds",
        "leasehold_lease_renew_duration_seconds",
        "leasehold_checkpoint_lag_events",
        "leasehold_sidecar_transport_errors_total",
    ] {
        assert!(moved.contains_key(name), "{name} did not move: {moved:?}");
    }
    shutdown.cancel();
}

fn keys(attributes: &[opentelemetry_proto::tonic::common::v1::KeyValue]) -> Vec<String> {
    attributes.iter().map(|kv| kv.key.clone()).collect()
}
