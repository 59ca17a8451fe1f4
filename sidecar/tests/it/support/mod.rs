//! Receivers the sidecar's exporters talk to in tests, in one place: an OTLP
//! collector (gRPC and HTTP/protobuf, gzip-aware) decoding the real wire format
//! with the `opentelemetry-proto` types, and a fake CloudWatch endpoint that
//! captures the CBOR requests the real AWS SDK sends.

use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, Uri};
use leasehold_control::clock::SystemClock;
use leasehold_control::keeper::{KeeperConfig, LeaseKeeper};
use leasehold_control::store::LeaseStore;
use leasehold_pool::bus::redis::RedisPoolBus;
use leasehold_pool::bus::{BusConnector, PoolBus};
use leasehold_pool::read::PoolReader;
use leasehold_sidecar::observer::ObserverConfig;
use leasehold_telemetry::LogSink;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use prost::Message;

pub type Received = Arc<Mutex<Vec<ExportMetricsServiceRequest>>>;

pub struct Collector(pub Received);

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

pub async fn grpc_collector() -> (String, Received) {
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

/// The `Content-Encoding` of every OTLP/HTTP request received.
pub type Encodings = Arc<Mutex<Vec<String>>>;

/// The OTLP/HTTP `/v1/metrics` route, gzip-aware.
pub fn http_routes(received: Received, encodings: Encodings) -> axum::Router {
    axum::Router::new().route(
        "/v1/metrics",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let (sink, encodings) = (received.clone(), encodings.clone());
                async move {
                    let encoding = headers
                        .get("content-encoding")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("identity")
                        .to_owned();
                    let body = if encoding == "gzip" {
                        let mut plain = Vec::new();
                        std::io::Read::read_to_end(
                            &mut flate2::read::GzDecoder::new(&body[..]),
                            &mut plain,
                        )
                        .expect("gzip body");
                        plain.into()
                    } else {
                        body
                    };
                    encodings.lock().unwrap().push(encoding);
                    let request =
                        ExportMetricsServiceRequest::decode(body).expect("OTLP protobuf body");
                    sink.lock().unwrap().push(request);
                    (
                        [("content-type", "application/x-protobuf")],
                        ExportMetricsServiceResponse::default().encode_to_vec(),
                    )
                }
            },
        ),
    )
}

pub async fn http_collector() -> (String, Received) {
    let (endpoint, received, _) = http_collector_with_encodings().await;
    (endpoint, received)
}

pub async fn http_collector_with_encodings() -> (String, Received, Encodings) {
    let received: Received = Arc::default();
    let encodings: Encodings = Arc::default();
    let app = http_routes(received.clone(), encodings.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), received, encodings)
}

pub type Captured = Arc<Mutex<Vec<(String, HeaderMap, Bytes)>>>;

pub async fn fake_cloudwatch() -> (String, Captured) {
    let captured: Captured = Arc::default();
    let sink = captured.clone();
    let app = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap, body: Bytes| {
        let sink = sink.clone();
        async move {
            sink.lock().unwrap().push((uri.to_string(), headers, body));
            (
                [
                    ("content-type", "application/cbor"),
                    ("smithy-protocol", "rpc-v2-cbor"),
                ],
                vec![0xa0u8], // an empty CBOR map: PutMetricData's empty output
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), captured)
}

pub fn field<'a>(value: &'a ciborium::Value, name: &str) -> Option<&'a ciborium::Value> {
    value
        .as_map()?
        .iter()
        .find(|(k, _)| k.as_text() == Some(name))
        .map(|(_, v)| v)
}

pub fn decode(headers: &HeaderMap, body: &[u8]) -> ciborium::Value {
    let mut bytes = body.to_vec();
    if headers.get("content-encoding").is_some_and(|v| v == "gzip") {
        bytes.clear();
        flate2::read::GzDecoder::new(body)
            .read_to_end(&mut bytes)
            .unwrap();
    }
    ciborium::from_reader(bytes.as_slice()).expect("the request body is CBOR")
}

/// An observer of `store` with a short lease, scanning every 200 ms; with the
/// pool and orphan gauges when the test Redis is there.
pub async fn observer(store: Arc<dyn LeaseStore>) -> ObserverConfig {
    let keeper = LeaseKeeper::new(
        store,
        Arc::new(SystemClock),
        Arc::new(LogSink),
        KeeperConfig {
            owner_id: "sidecar-a".into(),
            lease: Duration::from_millis(1500),
            renew_interval: Duration::from_millis(500),
            safety_margin: Duration::from_millis(150),
            skew_margin: Duration::from_millis(100),
            ..KeeperConfig::default()
        },
    );
    // The pool and orphan gauges come from the pool bus on the test Redis.
    let pool = match leasehold_testkit::redis_url() {
        Some(url) => Some(Arc::new(BusConnector::ready(Arc::new(
            RedisPoolBus::connect(&url).await.unwrap(),
        ) as Arc<dyn PoolBus>)) as Arc<dyn PoolReader>),
        None => None,
    };
    ObserverConfig {
        keeper,
        clock: Arc::new(SystemClock),
        pacing: leasehold_control::pacing::ScanPacing::new(Duration::from_millis(200), 1_000),
        pool,
    }
}
