//! The OTLP resource a real `leasehold sidecar` sends, as a collector sees it:
//! `service.*` from the process, `cloud.*` and `aws.ecs.*` from the ECS task
//! metadata endpoint (a fake one here, serving the v4 `/task` document).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{free_addr, side_by_side, spawn_leasehold};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;

const TASK_DOCUMENT: &str = r#"{
  "Cluster": "arn:aws:ecs:eu-west-1:123456789012:cluster/market-data",
  "TaskARN": "arn:aws:ecs:eu-west-1:123456789012:task/market-data/0f3c9a2b7d",
  "Family": "stream-worker", "Revision": "42",
  "AvailabilityZone": "eu-west-1b", "LaunchType": "FARGATE",
  "PullStartedAt": "2026-12-01T08:00:00Z", "Containers": []
}"#;

async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecar_names_its_task_in_the_otlp_resource() {
    let _slot = side_by_side().await;
    let metadata = serve(axum::Router::new().route(
        "/task",
        axum::routing::get(|| async { ([("content-type", "application/json")], TASK_DOCUMENT) }),
    ))
    .await;
    let received: Arc<Mutex<Vec<ExportMetricsServiceRequest>>> = Arc::default();
    let sink = received.clone();
    let collector = serve(axum::Router::new().route(
        "/v1/metrics",
        axum::routing::post(move |body: axum::body::Bytes| {
            let sink = sink.clone();
            async move {
                sink.lock()
                    .unwrap()
                    .push(ExportMetricsServiceRequest::decode(body).expect("OTLP protobuf"));
                ExportMetricsServiceResponse::default().encode_to_vec()
            }
        }),
    ))
    .await;
    let sidecar = spawn_leasehold(
        "sidecar",
        &["sidecar", "--no-observer"],
        &[
            ("SIDECAR_LISTEN".into(), free_addr()),
            ("TELEMETRY_ADDR".into(), free_addr()),
            ("ECS_CONTAINER_METADATA_URI_V4".into(), metadata),
            ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), collector),
            ("OTEL_METRIC_EXPORT_INTERVAL".into(), "300".into()),
            ("OTEL_SERVICE_NAME".into(), "market-data-sidecar".into()),
        ],
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let attributes = loop {
        let first = received.lock().unwrap().first().cloned();
        if let Some(request) = first {
            break request
                .resource_metrics
                .first()
                .and_then(|r| r.resource.clone())
                .map(|r| r.attributes)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|kv| match kv.value?.value? {
                    Value::StringValue(value) => Some((kv.key, value)),
                    _ => None,
                })
                .collect::<Vec<_>>();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no OTLP export arrived\n{}",
            sidecar.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for (key, value) in [
        ("service.name", "market-data-sidecar"),
        ("service.instance.id", "0f3c9a2b7d"),
        ("cloud.provider", "aws"),
        ("cloud.platform", "aws_ecs"),
        ("cloud.region", "eu-west-1"),
        ("cloud.account.id", "123456789012"),
        ("cloud.availability_zone", "eu-west-1b"),
        (
            "aws.ecs.cluster.arn",
            "arn:aws:ecs:eu-west-1:123456789012:cluster/market-data",
        ),
        (
            "aws.ecs.task.arn",
            "arn:aws:ecs:eu-west-1:123456789012:task/market-data/0f3c9a2b7d",
        ),
        ("aws.ecs.task.family", "stream-worker"),
        ("aws.ecs.task.revision", "42"),
        ("aws.ecs.launchtype", "fargate"),
    ] {
        assert!(
            attributes.iter().any(|(k, v)| k == key && v == value),
            "{key}={value} missing from {attributes:?}"
        );
    }
}
