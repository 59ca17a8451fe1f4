//! OTLP export received by small collectors built on the `opentelemetry-proto`
//! types: one over gRPC (tonic), one over HTTP/protobuf. They decode the real
//! wire format the exporter sends.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_sidecar::otlp::OtlpConfig;
use leasehold_sidecar::{Sidecar, SidecarConfig};
use leasehold_telemetry::testing::every_event;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;
use tokio_util::sync::CancellationToken;

type Received = Arc<Mutex<Vec<ExportMetricsServiceRequest>>>;

struct Collector(Received);

#[tonic::async_trait]
impl MetricsService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

async fn grpc_collector() -> (String, Received) {
    let received: Received = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = MetricsServiceServer::new(Collector(received.clone()));
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    (format!("http://{addr}"), received)
}

async fn http_collector() -> (String, Received) {
    let received: Received = Arc::default();
    let sink = received.clone();
    let app = axum::Router::new().route(
        "/v1/metrics",
        axum::routing::post(move |body: axum::body::Bytes| {
            let sink = sink.clone();
            async move {
                let request =
                    ExportMetricsServiceRequest::decode(body).expect("OTLP protobuf body");
                sink.lock().unwrap().push(request);
                (
                    [("content-type", "application/x-protobuf")],
                    ExportMetricsServiceResponse::default().encode_to_vec(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), received)
}

/// Runs a sidecar exporting to `endpoint` and returns what the collector got.
async fn export_through(
    protocol: &str,
    endpoint: String,
    received: Received,
) -> Vec<ExportMetricsServiceRequest> {
    let shutdown = CancellationToken::new();
    let sidecar = Sidecar::start(
        SidecarConfig {
            otlp: Some(OtlpConfig {
                protocol: Some(protocol.into()),
                endpoint: Some(endpoint),
                interval: Some(Duration::from_millis(300)),
                resource: vec![
                    ("service.instance.id".into(), "task-123".into()),
                    ("aws.ecs.task.family".into(), "stream-worker".into()),
                ],
            }),
            ..SidecarConfig::loopback()
        },
        shutdown.clone(),
    )
    .await
    .unwrap();
    for event in every_event() {
        sidecar.state.ingest(&event);
    }
    for _ in 0..100 {
        if received
            .lock()
            .unwrap()
            .iter()
            .any(|r| !names(r).is_empty())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shutdown.cancel();
    sidecar.finished().await;
    received.lock().unwrap().clone()
}

fn names(request: &ExportMetricsServiceRequest) -> Vec<String> {
    request
        .resource_metrics
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .map(|m| m.name.clone())
        .collect()
}

fn resource(request: &ExportMetricsServiceRequest, key: &str) -> Option<String> {
    request
        .resource_metrics
        .first()?
        .resource
        .as_ref()?
        .attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            AnyValue::StringValue(value) => Some(value.clone()),
            _ => None,
        })
}

fn check(requests: Vec<ExportMetricsServiceRequest>) {
    let request = requests
        .iter()
        .find(|r| !names(r).is_empty())
        .expect("no metrics exported");
    let names = names(request);
    for expected in [
        "leasehold_lease_acquisitions_total",
        "leasehold_lease_renew_duration_seconds",
        "leasehold_checkpoint_lag_events",
        "leasehold_sink_writes_total",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }
    // Units: seconds where the name says so, none otherwise; a "1" would make
    // the OpenTelemetry-to-Prometheus translation append `_ratio`.
    for metric in request
        .resource_metrics
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
    {
        let expected = if metric.name.ends_with("_seconds") {
            "s"
        } else {
            ""
        };
        assert_eq!(metric.unit, expected, "unit of {}", metric.name);
    }
    assert_eq!(
        resource(request, "service.name").as_deref(),
        Some("leasehold-sidecar")
    );
    assert_eq!(
        resource(request, "service.instance.id").as_deref(),
        Some("task-123")
    );
    assert_eq!(
        resource(request, "aws.ecs.task.family").as_deref(),
        Some("stream-worker")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_over_grpc() {
    let (endpoint, received) = grpc_collector().await;
    check(export_through("grpc", endpoint, received).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_over_http_protobuf() {
    let (endpoint, received) = http_collector().await;
    check(export_through("http/protobuf", endpoint, received).await);
}
