//! OTLP export received by small collectors built on the `opentelemetry-proto`
//! types: one over gRPC (tonic), one over HTTP/protobuf. They decode the real
//! wire format the exporter sends.

use std::sync::Arc;
use std::time::Duration;

use crate::support::{
    Collector, Received, grpc_collector, http_collector, http_collector_with_encodings, http_routes,
};
use leasehold_sidecar::otlp::OtlpConfig;
use leasehold_sidecar::{Sidecar, SidecarConfig};
use leasehold_telemetry::testing::every_event;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::MetricsServiceServer;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use tokio_util::sync::CancellationToken;

/// A collector behind TLS with a certificate from the test CA
/// (`tests/it/fixtures/otlp-ca.pem`, valid until 2126): gRPC or HTTP.
async fn tls_collector(protocol: &str) -> (String, Received) {
    let received: Received = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let certificate = include_bytes!("fixtures/otlp-collector.pem");
    let key = include_bytes!("fixtures/otlp-collector.key");
    if protocol == "grpc" {
        let identity = tonic::transport::Identity::from_pem(certificate, key);
        // The exporter gzips when asked to; tonic servers refuse it unless told.
        let service = MetricsServiceServer::new(Collector(received.clone()))
            .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
        let mut server = tonic::transport::Server::builder()
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .unwrap();
        tokio::spawn(async move {
            server
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
    } else {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let chain = CertificateDer::pem_slice_iter(certificate)
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, PrivateKeyDer::from_pem_slice(key).unwrap())
        .unwrap();
        let tls = TlsListener {
            tcp: listener,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        };
        let app = http_routes(received.clone(), Arc::default());
        tokio::spawn(async move { axum::serve(tls, app).await.unwrap() });
    }
    (format!("https://localhost:{}", addr.port()), received)
}

/// TLS on top of a TCP listener for `axum::serve`; failed handshakes are skipped.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(stream).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// Runs a sidecar exporting to `endpoint` and returns what the collector got.
async fn export_through(
    protocol: &str,
    endpoint: String,
    received: Received,
) -> Vec<ExportMetricsServiceRequest> {
    export_with(protocol, endpoint, received, OtlpConfig::default()).await
}

/// Like [`export_through`], with compression and certificate from `extra`.
async fn export_with(
    protocol: &str,
    endpoint: String,
    received: Received,
    extra: OtlpConfig,
) -> Vec<ExportMetricsServiceRequest> {
    let shutdown = CancellationToken::new();
    let sidecar = Sidecar::start(
        SidecarConfig {
            otlp: Some(OtlpConfig {
                protocol: Some(protocol.into()),
                endpoint: Some(endpoint),
                compression: extra.compression,
                certificate: extra.certificate,
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
    // As from a connected worker: per-stream series are exported only for one.
    sidecar.state.view().connection(true);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_compresses_http_exports() {
    let (endpoint, received, encodings) = http_collector_with_encodings().await;
    let extra = OtlpConfig {
        compression: Some("gzip".into()),
        ..Default::default()
    };
    check(export_with("http/protobuf", endpoint, received, extra).await);
    let encodings = encodings.lock().unwrap().clone();
    assert!(
        !encodings.is_empty() && encodings.iter().all(|e| e == "gzip"),
        "{encodings:?}"
    );
}

fn private_ca() -> OtlpConfig {
    OtlpConfig {
        certificate: Some(
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/fixtures/otlp-ca.pem").into(),
        ),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_over_grpc_with_tls_to_a_private_ca() {
    let (endpoint, received) = tls_collector("grpc").await;
    let extra = OtlpConfig {
        compression: Some("gzip".into()),
        ..private_ca()
    };
    check(export_with("grpc", endpoint, received, extra).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_over_https_to_a_private_ca() {
    let (endpoint, received) = tls_collector("http/protobuf").await;
    check(export_with("http/protobuf", endpoint, received, private_ca()).await);
}

/// Without the CA the collector's certificate is refused: nothing arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_collector_gets_nothing() {
    let (endpoint, received) = tls_collector("http/protobuf").await;
    let requests = export_through("http/protobuf", endpoint, received).await;
    assert!(requests.is_empty(), "{} requests arrived", requests.len());
}

/// The `stream_id` of every data point of gauge `name` in one export.
fn gauge_streams(request: &ExportMetricsServiceRequest, name: &str) -> Vec<String> {
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;
    let mut streams: Vec<String> = request
        .resource_metrics
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .filter(|m| m.name == name)
        .filter_map(|m| match &m.data {
            Some(Data::Gauge(gauge)) => Some(&gauge.data_points),
            _ => None,
        })
        .flatten()
        .flat_map(|point| &point.attributes)
        .filter(|kv| kv.key == "stream_id")
        .filter_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
            AnyValue::StringValue(value) => Some(value.clone()),
            _ => None,
        })
        .collect();
    streams.sort();
    streams
}

/// Under cumulative temporality an OTel synchronous gauge reports every
/// attribute set it ever saw: a stream's lag would be exported forever after
/// its lease moved on. A stopped stream must leave the export.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_streams_gauges_leave_the_export() {
    use leasehold_telemetry::event::TelemetryEvent;
    let (endpoint, received) = http_collector().await;
    let shutdown = CancellationToken::new();
    let sidecar = Sidecar::start(
        SidecarConfig {
            otlp: Some(OtlpConfig {
                protocol: Some("http/protobuf".into()),
                endpoint: Some(endpoint),
                interval: Some(Duration::from_millis(200)),
                ..Default::default()
            }),
            ..SidecarConfig::loopback()
        },
        shutdown.clone(),
    )
    .await
    .unwrap();
    let lag = |stream: &str| TelemetryEvent::StreamLag {
        stream_id: stream.into(),
        lag_events: 3,
        lag_seconds: 0.5,
        last_event_age_seconds: 0.1,
        event_lag_seconds: None,
    };
    // As from a connected worker: per-stream series are exported only for one.
    sidecar.state.view().connection(true);
    sidecar.state.ingest(&lag("a"));
    sidecar.state.ingest(&lag("b"));
    let latest = || {
        received
            .lock()
            .unwrap()
            .iter()
            .rev()
            .map(|r| gauge_streams(r, "leasehold_checkpoint_lag_events"))
            .find(|streams| !streams.is_empty())
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while latest() != Some(vec!["a".to_owned(), "b".to_owned()]) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never exported a and b: {:?}",
            latest()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sidecar.state.ingest(&TelemetryEvent::StreamStopped {
        stream_id: "a".into(),
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while latest() != Some(vec!["b".to_owned()]) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "stream a is still exported after it stopped: {:?}",
            latest()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    sidecar.finished().await;
}
