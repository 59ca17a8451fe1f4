//! Helpers for tests that need the real servers the test command starts.
//!
//! The test command (`scripts/test.sh`) starts a DynamoDB-compatible server and
//! exports its address as [`DYNAMODB_ENDPOINT_VAR`]; tests never fall back to the
//! AWS SDK's default endpoints, so no test can touch a real AWS account. With
//! [`REQUIRE_SERVICES_VAR`] set (the test command sets it), a missing server is a
//! test failure rather than a skip.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::types::AttributeValue;

use crate::conformance::ConformanceTarget;
use crate::schema::{self, RawItem};
use crate::store::LeaseStore;
use crate::store::dynamodb::{DynamoLeaseStore, from_raw, to_raw};

/// Address of the local DynamoDB-compatible server (e.g. `http://127.0.0.1:4566`).
pub const DYNAMODB_ENDPOINT_VAR: &str = "LEASEHOLD_TEST_DYNAMODB_ENDPOINT";
/// URL of the test Redis server (e.g. `redis://127.0.0.1:6390`).
pub const REDIS_URL_VAR: &str = "LEASEHOLD_TEST_REDIS_URL";
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

/// SDK configuration for the test server (DynamoDB and ECS both): its
/// endpoint, a fixed region and dummy credentials.
pub fn local_sdk_config(endpoint: &str) -> aws_config::SdkConfig {
    aws_config::SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::SharedCredentialsProvider::new(
            Credentials::new("test", "test", None, None, "leasehold-tests"),
        ))
        .build()
}

/// A DynamoDB client for the test server, with dummy credentials.
pub fn dynamodb_client(endpoint: &str) -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::new(&local_sdk_config(endpoint))
}

/// A minimal HTTP/1.0 GET for tests (no client dependency): returns the status
/// code, the raw header block and the body.
pub async fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
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

/// One event of every `TelemetryEvent` variant (sidecar, export and alert tests;
/// `sidecar/tests/alert_metrics.rs` checks the list stays exhaustive).
pub fn every_event() -> Vec<crate::telemetry::TelemetryEvent> {
    use crate::telemetry::TelemetryEvent::*;
    use crate::telemetry::{
        ClaimResult, CommitResult, LossReason, OrphanKind, PoolWorkerStateKind, RequestResult,
        SkipReason,
    };
    let ms = std::time::Duration::from_millis;
    let s = || "btc-usd".to_owned();
    vec![
        LeaseAcquired {
            stream_id: s(),
            fence_token: 3,
            expires_at_ms: 1,
            duration: ms(4),
            takeover_gap: Some(ms(2500)),
            previous_owner: Some("w0".into()),
        },
        LeaseAcquireConflict {
            stream_id: "eth".into(),
            holder: Some("w2".into()),
            holder_token: 1,
            duration: ms(3),
        },
        LeaseAcquireFailed {
            stream_id: "eth".into(),
            error: "throttled".into(),
        },
        LeaseRenewed {
            stream_id: s(),
            fence_token: 3,
            expires_at_ms: 2,
            duration: ms(5),
            lateness: ms(1),
        },
        LeaseRenewFailed {
            stream_id: s(),
            fence_token: 3,
            error: "timeout".into(),
        },
        LeaseLost {
            stream_id: "old".into(),
            fence_token: 1,
            reason: LossReason::Fenced,
        },
        LeaseReleased {
            stream_id: "old2".into(),
            fence_token: 1,
        },
        UpstreamConnected {
            stream_id: s(),
            from_seq: 1,
        },
        UpstreamReconnect {
            stream_id: s(),
            reason: "gap".into(),
        },
        UpstreamFrameSkipped {
            stream_id: s(),
            reason: SkipReason::NotJson,
        },
        StreamGap {
            stream_id: s(),
            from_seq: 5,
            to_seq: 9,
        },
        SinkWrite {
            stream_id: s(),
            fence_token: 3,
            accepted: 10,
            duplicate: 2,
            fenced: 0,
            duration: ms(2),
        },
        SinkWriteFailed {
            stream_id: s(),
            error: "down".into(),
        },
        CheckpointCommit {
            stream_id: s(),
            checkpoint: 10,
            result: CommitResult::Committed,
        },
        StreamLag {
            stream_id: s(),
            lag_events: 7,
            lag_seconds: 1.5,
        },
        UpstreamDisconnected {
            stream_id: "old2".into(),
        },
        WorkerHeartbeat {
            component: "stream-worker".into(),
            owner_id: "w1".into(),
        },
        EventsDropped { count: 3 },
        StreamStopped {
            stream_id: "old2".into(),
        },
        PoolClaim {
            worker_id: "pw-1".into(),
            user_id: Some("u1".into()),
            result: ClaimResult::Claimed,
            duration: ms(2),
            reason: None,
        },
        BrokerRequest {
            user_id: "u1".into(),
            request_id: Some("r1".into()),
            result: RequestResult::Ok,
            duration: ms(1),
        },
        BrokerReconnect {
            user_id: "u1".into(),
            connection: "paper/stock/sim/A1".into(),
            reason: "health check failed".into(),
        },
        MessageDeadLettered {
            queue: "trading:user:u1:requests:dead".into(),
            reason: "not JSON".into(),
        },
        PoolWorkerState {
            worker_id: "pw-1".into(),
            state: PoolWorkerStateKind::Claimed,
            user_id: Some("u1".into()),
        },
        PoolReconciled {
            idle: 2,
            target: 3,
            started: 1,
            stopped: 0,
        },
        OrphanSweep {
            found: vec![(OrphanKind::OrphanMark, 1)],
            resolved: vec![(OrphanKind::OrphanMark, 1)],
            dry_run: false,
        },
    ]
}

/// The repository root, read at run time: cargo sets `CARGO_MANIFEST_DIR` for
/// the test or bench it runs. (Compile-time `env!` would bake in the path of
/// whichever checkout built the binary, and checkouts share the target dir.)
pub fn repo_root() -> std::path::PathBuf {
    let manifest =
        std::env::var("CARGO_MANIFEST_DIR").expect("run through cargo test or cargo bench");
    std::path::Path::new(&manifest)
        .parent()
        .expect("every crate sits at the repository's top level")
        .to_path_buf()
}

/// A name no other test in this run (or an earlier run against the same
/// servers) uses: tables, stream ids, Redis keys.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}-{}",
        std::process::id(),
        crate::clock::unix_ms(std::time::SystemTime::now()),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fresh lease table on the test server, as a conformance target.
pub struct DynamoTarget {
    store: Arc<DynamoLeaseStore>,
    client: aws_sdk_dynamodb::Client,
}

impl DynamoTarget {
    /// Creates a new table on the test server; `None` when no server is configured.
    pub async fn create() -> Option<Self> {
        let endpoint = dynamodb_endpoint()?;
        let client = dynamodb_client(&endpoint);
        let store = DynamoLeaseStore::new(client.clone(), unique_name("conformance"));
        store.create_table().await.expect("create test table");
        Some(DynamoTarget {
            store: Arc::new(store),
            client,
        })
    }

    /// The store under test.
    pub fn dynamo_store(&self) -> &DynamoLeaseStore {
        &self.store
    }
}

#[async_trait]
impl ConformanceTarget for DynamoTarget {
    fn store(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }

    async fn put_raw(&self, item: RawItem) {
        self.client
            .put_item()
            .table_name(self.store.table())
            .set_item(Some(from_raw(&item)))
            .send()
            .await
            .expect("raw put");
    }

    async fn get_raw(&self, stream_id: &str) -> Option<RawItem> {
        self.client
            .get_item()
            .table_name(self.store.table())
            .set_key(Some(HashMap::from([(
                schema::STREAM_ID.to_owned(),
                AttributeValue::S(stream_id.to_owned()),
            )])))
            .consistent_read(true)
            .send()
            .await
            .expect("raw get")
            .item
            .map(to_raw)
    }
}
