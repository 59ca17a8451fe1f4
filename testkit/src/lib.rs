//! Helpers for tests that need the real servers the test command starts.
//!
//! The test command (`scripts/test.sh`) starts a DynamoDB-compatible server and
//! exports its address as [`DYNAMODB_ENDPOINT_VAR`]; tests never fall back to the
//! AWS SDK's default endpoints, so no test can touch a real AWS account. With
//! [`REQUIRE_SERVICES_VAR`] set (the test command sets it), a missing server is a
//! test failure rather than a skip.
//!
//! Module map:
//! - this module: server addresses and clients (DynamoDB, Redis, Chromium),
//!   [`unique_name`], the repository root.
//! - [`lease_store`], [`sink`], [`pool_bus`]: the conformance suites every
//!   lease store, sink and pool bus passes (`conformance_suite!`,
//!   `sink_conformance_suite!`, `pool_bus_conformance_suite!`): here, not in
//!   their crates, so that no production crate depends on this one.
//! - [`dashboard`]: the seeded cluster the dashboard's tests, its render
//!   benchmark and the browser test share.
//! - [`measure`]: CPU time, resident memory, percentiles and `--name value`
//!   arguments for the benchmarks.
//! - `model_check` (feature `model-check`): one stateright search set-up and
//!   report for the protocol, sequence and order-path models.
//! - [`redis_cluster`]: the test Redis Cluster, resharded as an operator would.
//! - [`redis_replica`]: a replica of the test Redis (`SINK_WAIT_REPLICAS`).
//! - [`private_redis`]: a Redis server or cluster of a test's own, for what
//!   the tests sharing the test Redis must not see (a stall, a reshard).
//! - [`sealer_tls`]: a test CA and sealer certificate, for HTTPS tests.

use std::sync::atomic::{AtomicU64, Ordering};

use leasehold_platform::aws::RetryPolicy;

pub mod dashboard;
pub mod lease_store;
pub mod measure;
#[cfg(feature = "model-check")]
pub mod model_check;
pub mod pool_bus;
pub mod private_redis;
pub mod redis_cluster;
pub mod redis_replica;
pub mod sealer_tls;
pub mod sink;

/// Address of the local DynamoDB-compatible server (e.g. `http://127.0.0.1:4566`).
pub const DYNAMODB_ENDPOINT_VAR: &str = "LEASEHOLD_TEST_DYNAMODB_ENDPOINT";
/// URL of the test Redis server (e.g. `redis://127.0.0.1:6390`).
pub const REDIS_URL_VAR: &str = "LEASEHOLD_TEST_REDIS_URL";
/// URL of the test Redis Cluster (`redis+cluster://127.0.0.1:p1,127.0.0.1:p2,…`,
/// three primaries).
pub const REDIS_CLUSTER_URL_VAR: &str = "LEASEHOLD_TEST_REDIS_CLUSTER_URL";
/// Python interpreter that can import moto (for tests that run a private server).
pub const PYTHON_VAR: &str = "LEASEHOLD_TEST_PYTHON";
/// When set to `1`, tests fail instead of skipping when a server is not configured.
pub const REQUIRE_SERVICES_VAR: &str = "LEASEHOLD_REQUIRE_SERVICES";

/// The endpoint of the test DynamoDB server, or `None` to skip (panics when the
/// test command said services are required).
pub fn dynamodb_endpoint() -> Option<String> {
    match std::env::var(DYNAMODB_ENDPOINT_VAR)
        .ok()
        .filter(|v| !v.is_empty())
    {
        Some(endpoint) => Some(endpoint),
        None if std::env::var(REQUIRE_SERVICES_VAR).as_deref() == Ok("1") => {
            panic!("{DYNAMODB_ENDPOINT_VAR} is not set but {REQUIRE_SERVICES_VAR}=1")
        }
        None => {
            eprintln!("skipping: {DYNAMODB_ENDPOINT_VAR} is not set (run the test command)");
            None
        }
    }
}

/// The URL of the test Redis server, or `None` to skip (panics when the test
/// command said services are required).
pub fn redis_url() -> Option<String> {
    required_var(REDIS_URL_VAR)
}

/// The URL of the test Redis Cluster, or `None` to skip (panics when the
/// test command said services are required).
pub fn redis_cluster_url() -> Option<String> {
    required_var(REDIS_CLUSTER_URL_VAR)
}

fn required_var(name: &str) -> Option<String> {
    match std::env::var(name).ok().filter(|v| !v.is_empty()) {
        Some(value) => Some(value),
        None if std::env::var(REQUIRE_SERVICES_VAR).as_deref() == Ok("1") => {
            panic!("{name} is not set but {REQUIRE_SERVICES_VAR}=1")
        }
        None => {
            eprintln!("skipping: {name} is not set (run the test command)");
            None
        }
    }
}

/// SDK configuration for the test server (DynamoDB and ECS both): its endpoint,
/// a fixed region and dummy credentials, the SDK's standard retries.
pub fn local_sdk_config(endpoint: &str) -> aws_config::SdkConfig {
    leasehold_platform::aws::local_sdk_config(RetryPolicy::Standard, endpoint)
}

/// A DynamoDB client for the test server, with dummy credentials.
pub fn dynamodb_client(endpoint: &str) -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::new(&local_sdk_config(endpoint))
}

/// A minimal HTTP/1.0 GET for tests (no client dependency): returns the status
/// code, the raw header block and the body.
pub async fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String, String)> {
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    http_exchange(addr, request.as_bytes()).await
}

/// A minimal HTTP/1.0 POST of a JSON body, answered as [`http_get`] is.
pub async fn http_post_json(
    addr: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, String, String)> {
    let request = format!(
        "POST {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    http_exchange(addr, request.as_bytes()).await
}

async fn http_exchange(addr: &str, request: &[u8]) -> std::io::Result<(u16, String, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(request).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text.as_str(), ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    Ok((status, head.to_owned(), body.to_owned()))
}

/// The `promtool` binary the test command found (`LEASEHOLD_PROMTOOL`).
pub fn promtool() -> Option<String> {
    required_var("LEASEHOLD_PROMTOOL")
}

/// The `prometheus` server binary the test command found (`LEASEHOLD_PROMETHEUS`).
pub fn prometheus() -> Option<String> {
    required_var("LEASEHOLD_PROMETHEUS")
}

/// The `redis-server` binary the test command found (`LEASEHOLD_REDIS_SERVER`),
/// for tests that start a server of their own (e.g. with an ACL file).
pub fn redis_server() -> Option<String> {
    required_var("LEASEHOLD_REDIS_SERVER")
}

/// Debian's `chromium` the test command installed (`LEASEHOLD_CHROMIUM`).
pub fn chromium() -> Option<String> {
    required_var("LEASEHOLD_CHROMIUM")
}

/// Loads `url` in headless Chromium with the flags this machine needs (no
/// sandbox as root, no background networking towards Google) and a fresh
/// profile; `extra` adds e.g. `--dump-dom` or `--screenshot=PATH`. Returns
/// stdout (the DOM for `--dump-dom`). Virtual time lets the page's scripts run
/// for `budget_ms` without the test waiting that long in real time.
pub fn headless_chromium(chromium: &str, url: &str, budget_ms: u64, extra: &[&str]) -> String {
    let profile = std::env::temp_dir().join(unique_name("chromium-profile"));
    let output = std::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-quic",
            "--no-first-run",
            "--hide-scrollbars",
            &format!("--user-data-dir={}", profile.display()),
            &format!("--virtual-time-budget={budget_ms}"),
        ])
        .args(extra)
        .arg(url)
        .output()
        .expect("start chromium");
    let _ = std::fs::remove_dir_all(&profile);
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The repository root, read at run time: cargo sets `CARGO_MANIFEST_DIR` for
/// the test or bench it runs. (Compile-time `env!` would bake in the path of
/// whichever checkout built the binary, and checkouts share the target dir.)
pub fn repo_root() -> std::path::PathBuf {
    let manifest =
        std::env::var("CARGO_MANIFEST_DIR").expect("run through cargo test or cargo bench");
    std::path::Path::new(&manifest)
        .ancestors()
        .find(|dir| dir.join("Cargo.lock").is_file())
        .expect("every crate sits inside the workspace")
        .to_path_buf()
}

/// A name no other test in this run (or an earlier run against the same
/// servers) uses: tables, stream ids, Redis keys.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}-{}",
        std::process::id(),
        leasehold_platform::clock::Clock::now_ms(&leasehold_platform::clock::SystemClock),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// This host's address on its default route, if it has one that is not
/// loopback (no packet is sent: a UDP `connect` only picks the route). Tests
/// that must reach a server the way another host would bind there.
pub fn non_loopback_address() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("198.51.100.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}
