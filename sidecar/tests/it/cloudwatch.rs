//! CloudWatch export: EMF documents checked against the Embedded Metric Format
//! specification's rules, and PutMetricData checked by decoding the request the
//! real AWS SDK sends (the current SDK speaks Smithy RPC v2 CBOR).

use std::time::Duration;

use crate::support::{decode, fake_cloudwatch, field};
use leasehold_sidecar::cloudwatch::{CloudWatchConfig, Mode, datums, emf_documents};
use leasehold_sidecar::{Sidecar, SidecarConfig};
use leasehold_telemetry::TelemetryEvent;
use leasehold_telemetry::testing::every_event;
use leasehold_testkit::local_sdk_config;
use serde_json::Value as Json;
use tokio_util::sync::CancellationToken;

fn config(
    cloudwatch: Option<(CloudWatchConfig, Option<aws_sdk_cloudwatch::Client>)>,
) -> SidecarConfig {
    SidecarConfig {
        cloudwatch,
        ..SidecarConfig::loopback()
    }
}

fn renewals(count: usize) -> impl Iterator<Item = TelemetryEvent> {
    (0..count).map(|i| TelemetryEvent::LeaseRenewed {
        stream_id: "btc-usd".into(),
        fence_token: 3,
        expires_at_ms: 0,
        duration: Duration::from_micros(1000 + i as u64 * 37),
        lateness: Duration::ZERO,
    })
}

const UNITS: &[&str] = &[
    "Seconds",
    "Microseconds",
    "Milliseconds",
    "Bytes",
    "Kilobytes",
    "Megabytes",
    "Gigabytes",
    "Terabytes",
    "Bits",
    "Kilobits",
    "Megabits",
    "Gigabits",
    "Terabits",
    "Percent",
    "Count",
    "Bytes/Second",
    "Kilobytes/Second",
    "Megabytes/Second",
    "Gigabytes/Second",
    "Terabytes/Second",
    "Bits/Second",
    "Kilobits/Second",
    "Megabits/Second",
    "Gigabits/Second",
    "Terabits/Second",
    "Count/Second",
    "None",
];

/// The EMF specification's structural rules for one document.
fn check_emf(document: &Json) {
    let line = document.to_string();
    assert!(!line.contains('\n'), "one document per line");
    let aws = &document["_aws"];
    assert!(
        aws["Timestamp"].as_i64().is_some_and(|t| t > 0),
        "Timestamp: {line}"
    );
    let directives = aws["CloudWatchMetrics"]
        .as_array()
        .expect("CloudWatchMetrics array");
    assert!(!directives.is_empty());
    for directive in directives {
        let namespace = directive["Namespace"].as_str().expect("Namespace");
        assert!((1..=255).contains(&namespace.len()));
        for set in directive["Dimensions"]
            .as_array()
            .expect("Dimensions array")
        {
            let set = set.as_array().expect("a DimensionSet is an array");
            assert!(set.len() <= 30, "at most 30 dimensions");
            for key in set {
                let key = key.as_str().expect("dimension key");
                assert!(
                    document[key].is_string(),
                    "dimension {key} has a string value at the root: {line}"
                );
                assert_ne!(key, "stream_id", "no unbounded dimensions");
            }
        }
        let metrics = directive["Metrics"].as_array().expect("Metrics array");
        assert!(
            (1..=100).contains(&metrics.len()),
            "1 to 100 metrics per document"
        );
        for metric in metrics {
            let name = metric["Name"].as_str().expect("Name");
            assert!((1..=1024).contains(&name.len()));
            let unit = metric["Unit"].as_str().expect("Unit");
            assert!(UNITS.contains(&unit), "unit {unit}");
            match &document[name] {
                Json::Number(_) => {}
                Json::Array(values) => {
                    assert!(
                        (1..=100).contains(&values.len()),
                        "at most 100 values: {name}"
                    );
                    assert!(values.iter().all(Json::is_number));
                }
                other => panic!("metric {name} has no numeric root value: {other}"),
            }
        }
    }
}

/// EMF export on, at an interval the test never reaches: the test reads the
/// snapshot itself.
fn emf_by_hand() -> SidecarConfig {
    config(Some((
        CloudWatchConfig {
            mode: Mode::Emf,
            namespace: "LeaseholdTest".into(),
            interval: Duration::from_secs(3600),
        },
        None,
    )))
}

#[tokio::test]
async fn emf_documents_follow_the_specification() {
    let shutdown = CancellationToken::new();
    let sidecar = Sidecar::start(emf_by_hand(), shutdown.clone())
        .await
        .unwrap();
    let mut reader = sidecar.state.snapshot_reader().expect("CloudWatch is on");
    // As from a connected worker: per-stream series are exported only for one.
    sidecar.state.view().connection(true);
    for event in every_event().into_iter().chain(renewals(150)) {
        sidecar.state.ingest(&event);
    }
    sidecar.state.ingest(&TelemetryEvent::StreamLag {
        stream_id: "eth-usd".into(),
        lag_events: 40,
        lag_seconds: 0.5,
        last_event_age_seconds: 0.0,
        event_lag_seconds: None,
    });
    let documents = emf_documents("LeaseholdTest", &datums(reader.take()), 1_700_000_000_000);
    assert!(!documents.is_empty());
    for document in &documents {
        check_emf(document);
    }
    let find = |name: &str, dimension: Option<(&str, &str)>| -> Vec<&Json> {
        documents
            .iter()
            .filter(|d| !d[name].is_null())
            .filter(|d| dimension.is_none_or(|(k, v)| d[k] == v))
            .map(|d| &d[name])
            .collect()
    };
    assert_eq!(
        find(
            "leasehold_lease_acquisitions_total",
            Some(("result", "acquired"))
        ),
        [&Json::from(1.0)]
    );
    // Per-stream lag without stream_id: the worst stream.
    assert_eq!(
        find("leasehold_checkpoint_lag_events", None),
        [&Json::from(40.0)]
    );
    // 151 renew latencies, in arrays of at most 100 values.
    let renew_values: usize = find("leasehold_lease_renew_duration_seconds", None)
        .iter()
        .map(|v| v.as_array().map_or(1, Vec::len))
        .sum();
    assert_eq!(renew_values, 151);
    shutdown.cancel();
}

#[tokio::test]
async fn put_metric_data_sends_the_contract_in_cbor() {
    let (endpoint, captured) = fake_cloudwatch().await;
    let client = aws_sdk_cloudwatch::Client::new(&local_sdk_config(&endpoint));
    let shutdown = CancellationToken::new();
    let cloudwatch = CloudWatchConfig {
        mode: Mode::Api,
        namespace: "LeaseholdTest".into(),
        interval: Duration::from_millis(500),
    };
    let sidecar = Sidecar::start(config(Some((cloudwatch, Some(client)))), shutdown.clone())
        .await
        .unwrap();
    // As from a connected worker: per-stream series are exported only for one.
    sidecar.state.view().connection(true);
    for event in every_event() {
        sidecar.state.ingest(&event);
    }
    let mut request = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let calls = captured.lock().unwrap().clone();
        request = calls.into_iter().find(|(_, headers, body)| {
            let decoded = decode(headers, body);
            field(&decoded, "MetricData")
                .and_then(ciborium::Value::as_array)
                .is_some_and(|data| !data.is_empty())
        });
        if request.is_some() {
            break;
        }
    }
    let (path, headers, body) = request.expect("PutMetricData never called");
    assert!(path.contains("PutMetricData"), "{path}");
    assert_eq!(headers.get("smithy-protocol").unwrap(), "rpc-v2-cbor");
    let decoded = decode(&headers, &body);
    assert_eq!(
        field(&decoded, "Namespace").and_then(ciborium::Value::as_text),
        Some("LeaseholdTest")
    );
    let data = field(&decoded, "MetricData")
        .and_then(ciborium::Value::as_array)
        .unwrap();
    let acquired = data
        .iter()
        .find(|datum| {
            field(datum, "MetricName").and_then(ciborium::Value::as_text)
                == Some("leasehold_lease_acquisitions_total")
                && field(datum, "Dimensions")
                    .and_then(ciborium::Value::as_array)
                    .and_then(|d| d.first())
                    .and_then(|d| field(d, "Value"))
                    .and_then(ciborium::Value::as_text)
                    == Some("acquired")
        })
        .expect("acquisitions datum");
    assert_eq!(
        field(acquired, "Unit").and_then(ciborium::Value::as_text),
        Some("Count")
    );
    let values = field(acquired, "Values")
        .and_then(ciborium::Value::as_array)
        .unwrap();
    assert_eq!(values.len(), 1);
    assert_eq!(values[0].as_float(), Some(1.0));
    let names: Vec<&str> = data
        .iter()
        .filter_map(|d| field(d, "MetricName").and_then(ciborium::Value::as_text))
        .collect();
    assert!(
        names.contains(&"leasehold_lease_renew_duration_seconds"),
        "{names:?}"
    );
    assert!(
        data.iter().all(|d| field(d, "Dimensions")
            .and_then(ciborium::Value::as_array)
            .is_none_or(|dims| dims
                .iter()
                .all(|dim| field(dim, "Name").and_then(ciborium::Value::as_text)
                    != Some("stream_id")))),
        "no stream_id dimension"
    );
    shutdown.cancel();
}

/// Histogram samples wait in the snapshot for the next CloudWatch export; with
/// CloudWatch off nothing would ever drain them, so none are kept.
#[tokio::test]
async fn samples_are_kept_for_cloudwatch_only_while_it_exports() {
    let shutdown = CancellationToken::new();
    let prometheus_only = Sidecar::start(config(None), shutdown.clone())
        .await
        .unwrap();
    let with_cloudwatch = Sidecar::start(emf_by_hand(), shutdown.clone())
        .await
        .unwrap();
    for event in renewals(10_000) {
        prometheus_only.state.ingest(&event);
        with_cloudwatch.state.ingest(&event);
    }
    assert!(prometheus_only.state.snapshot_reader().is_none());
    assert_eq!(prometheus_only.state.pending_push_samples(), 0);
    // Two histograms per renew: its round trip and its lateness.
    assert_eq!(with_cloudwatch.state.pending_push_samples(), 20_000);
    // An export drains them.
    let mut reader = with_cloudwatch.state.snapshot_reader().expect("on");
    reader.take();
    assert_eq!(with_cloudwatch.state.pending_push_samples(), 0);
    shutdown.cancel();
}
