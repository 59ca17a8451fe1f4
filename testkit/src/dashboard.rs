//! One seeded cluster state for the router tests, the browser test and the
//! render benchmark: leases in every state, a pool with idle and claimed
//! workers, queues, dead letters and a maintenance report.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::lease_store::ConformanceTarget;
use async_trait::async_trait;
use leasehold_control::schema::{self, AttrValue, RawItem};
use leasehold_control::store::{AcquireRequest, CheckpointRequest, LeaseStore, ReleaseRequest};
use leasehold_pool::bus::memory::MemoryPoolBus;
use leasehold_pool::bus::{BusError, MarkWrite, PoolBus, WorkerMetadata};
use leasehold_pool::keys;
use leasehold_pool::protocol::MarkValue;
use leasehold_pool::read::{AnomalyView, Finding, PoolCounts, PoolReader, PoolView, SweepReport};
use leasehold_telemetry::OrphanKind;

/// A stream id made of markup: must render as inert text.
pub const MARKUP_STREAM: &str = "<img src=x onerror=alert(1)><script>alert(2)</script>";
/// An owner id made of markup (owners are as untrusted as stream ids).
pub const MARKUP_OWNER: &str = "<b onmouseover=alert(3)>evil-owner</b>";
/// A user id made of markup, in a sweep finding.
pub const MARKUP_USER: &str = "<svg onload=alert(4)>";
/// A value planted in the credentials key: must never appear anywhere.
pub const SECRET_CANARY: &str = "CANARY-credentials-blob-7f3a";
/// What the streams view of the seeded cluster must show, however it was
/// rendered (server or refresh script): the owners and every state badge.
pub const SEEDED_STREAMS_VIEW: &[&str] = &[
    "btc-usd",
    "worker-a",
    "worker-b",
    "worker-c",
    "badge badge-owned",
    "badge badge-expiring",
    "badge badge-expired",
    "badge badge-unowned",
    "badge badge-malformed",
];
/// Lease length used for seeding.
pub const LEASE_MS: i64 = 30_000;

fn acquire(stream: &str, owner: &str, at: i64) -> AcquireRequest {
    AcquireRequest {
        stream_id: stream.into(),
        owner_id: owner.into(),
        now_ms: at,
        lease_ms: LEASE_MS,
        skew_margin_ms: 1_000,
        sidecar_url: None,
        handoff_addr: None,
        max_streams: None,
        session_token: None,
    }
}

/// Writes `owner`'s presence record announcing `sidecar_url`, as a worker's
/// own is written, at `now_ms` and held for two minutes: longer than any test
/// polls it, so the dashboard discovers the sidecar throughout.
pub async fn announce_sidecar(store: &dyn LeaseStore, owner: &str, sidecar_url: &str, now_ms: i64) {
    store
        .acquire(&AcquireRequest {
            lease_ms: 120_000,
            sidecar_url: Some(sidecar_url.into()),
            ..acquire(&schema::worker_presence(owner), owner, now_ms)
        })
        .await
        .expect("write a presence record");
}

/// Writes the seeded leases as of `now_ms`: `btc-usd` owned (checkpoint 42),
/// `eth-usd` expiring, `sol-usd` expired, `ada-usd` released, `xrp-usd` taken
/// over from `worker-c`, [`MARKUP_STREAM`] owned by [`MARKUP_OWNER`], `broken` malformed, and
/// `worker-a`'s presence record.
pub async fn seed_leases(target: &dyn ConformanceTarget, now_ms: i64) {
    let store = target.store();
    let held = store
        .acquire(&acquire("btc-usd", "worker-a", now_ms - 5_000))
        .await
        .expect("seed btc-usd");
    store
        .checkpoint(&CheckpointRequest {
            stream_id: "btc-usd".into(),
            owner_id: "worker-a".into(),
            fence_token: held.fence_token,
            checkpoint: 42,
            now_ms: now_ms - 4_000,
        })
        .await
        .expect("seed checkpoint");
    store
        .acquire(&acquire("eth-usd", "worker-b", now_ms - 25_000))
        .await
        .expect("seed eth-usd");
    store
        .acquire(&acquire("sol-usd", "worker-c", now_ms - 60_000))
        .await
        .expect("seed sol-usd");
    let released = store
        .acquire(&acquire("ada-usd", "worker-a", now_ms - 40_000))
        .await
        .expect("seed ada-usd");
    store
        .release(&ReleaseRequest {
            checkpoint: None,
            stream_id: "ada-usd".into(),
            owner_id: "worker-a".into(),
            fence_token: released.fence_token,
            now_ms: now_ms - 35_000,
            successor: None,
        })
        .await
        .expect("seed release");
    store
        .acquire(&acquire("xrp-usd", "worker-c", now_ms - 100_000))
        .await
        .expect("seed xrp-usd");
    store
        .acquire(&acquire("xrp-usd", "worker-a", now_ms - 2_000))
        .await
        .expect("seed takeover");
    store
        .acquire(&acquire(MARKUP_STREAM, MARKUP_OWNER, now_ms - 1_000))
        .await
        .expect("seed markup stream");
    store
        .acquire(&acquire(
            &schema::worker_presence("worker-a"),
            "worker-a",
            now_ms - 1_000,
        ))
        .await
        .expect("seed presence");
    target
        .put_raw(RawItem::from([
            (schema::STREAM_ID.into(), AttrValue::s("broken")),
            (schema::OWNER_ID.into(), AttrValue::s("worker-b")),
            (schema::FENCE_TOKEN.into(), AttrValue::s("not-a-number")),
        ]))
        .await;
}

/// Writes `count` owned streams `stream-00000…` spread over 20 owners.
pub async fn seed_many(target: &dyn ConformanceTarget, count: usize, now_ms: i64) {
    let store = target.store();
    for i in 0..count {
        store
            .acquire(&acquire(
                &format!("stream-{i:05}"),
                &format!("worker-{:02}", i % 20),
                now_ms - 1_000,
            ))
            .await
            .expect("seed stream");
    }
}

/// A collector over `leases` (and `pool`), no sidecars, default settings,
/// on a clock that starts at `now_ms` and follows tokio's (paused) time.
pub fn collector_at(
    leases: std::sync::Arc<dyn leasehold_control::store::LeaseReader>,
    pool: Option<std::sync::Arc<dyn PoolReader>>,
    now_ms: i64,
) -> std::sync::Arc<leasehold_dashboard::Collector> {
    std::sync::Arc::new(leasehold_dashboard::Collector::new(
        leasehold_dashboard::Sources {
            leases,
            pool,
            sidecars: Vec::new(),
            discovery: leasehold_dashboard::sources::sidecars::DiscoveryPolicy::default(),
        },
        leasehold_dashboard::CollectorSettings::default(),
        std::sync::Arc::new(leasehold_control::clock::PausedClock::starting_at(now_ms)),
    ))
}

/// Seeds the pool through the bus's own steps (the one pool keyspace: the
/// memory bus here, Redis in the browser test): idle `pool-7`, user `u42`
/// claimed by `pool-3` with queued requests, a control message and a dead
/// letter, a pending claim, a maintenance report, and a credentials blob that
/// must never be shown.
pub async fn seed_pool(bus: &dyn PoolBus, now_ms: i64) -> Result<(), BusError> {
    let now = now_ms as u64;
    let idle = MarkValue {
        worker_id: "pool-7".into(),
        task_id: "local-4242".into(),
        user_id: keys::POOL_USER_ID.into(),
        heartbeat_at: now - 3_000,
        started_at: now - 600_000,
        sidecar_url: None,
        ttl_ms: None,
        heartbeat_interval_ms: None,
        seal_key: None,
    };
    let claimed = MarkValue {
        worker_id: "pool-3".into(),
        task_id: "arn:aws:ecs:us-east-1:1:task/prod/abc123".into(),
        user_id: "u42".into(),
        heartbeat_at: now - 2_000,
        started_at: now - 900_000,
        sidecar_url: None,
        ttl_ms: None,
        heartbeat_interval_ms: None,
        seal_key: None,
    };
    let mut found: BTreeMap<OrphanKind, u64> = OrphanKind::ALL.iter().map(|k| (*k, 0)).collect();
    found.insert(OrphanKind::OrphanMark, 1);
    found.insert(OrphanKind::DuplicateWorker, 1);
    let report = SweepReport {
        at: now - 20_000,
        dry_run: false,
        marks: 3,
        tasks: 3,
        resolved: found.clone(),
        found,
        findings: vec![
            Finding {
                kind: OrphanKind::OrphanMark,
                user_id: Some(MARKUP_USER.into()),
                delete_key: Some(keys::worker_active(MARKUP_USER)),
                stop_task: None,
            },
            Finding {
                kind: OrphanKind::DuplicateWorker,
                user_id: Some("u42".into()),
                delete_key: None,
                stop_task: Some("arn:aws:ecs:us-east-1:1:task/prod/old999".into()),
            },
        ],
        errors: Vec::new(),
        claims_requeued: 0,
        reserved: Vec::new(),
        held: None,
        unconfirmed: 0,
    };
    let ttl = Duration::from_secs(3_600);
    bus.set_pool_mark(&idle.worker_id, &idle.to_json(), ttl)
        .await?;
    let worker = WorkerMetadata {
        task_arn: claimed.task_id.clone(),
        instance_id: "i-0abc123".into(),
        launched_at: now - 900_000,
        sidecar_url: None,
    };
    bus.claim_user(&MarkWrite {
        user_id: &claimed.user_id,
        worker_id: &claimed.worker_id,
        value: &claimed.to_json(),
        ttl,
        metadata: &worker,
    })
    .await?;
    bus.push_request("u42", "{}").await?;
    bus.push_request("u42", "{}").await?;
    // Queue bodies can carry secrets (a claim's encrypted credentials): the
    // dashboard counts them and must never show them.
    bus.dead_letter(&keys::user_requests("u42"), "invalid", SECRET_CANARY, now)
        .await?;
    bus.push_control("u42", r#"{"type":"reload_credentials"}"#)
        .await?;
    bus.push_claim(&format!(
        r#"{{"user_id":"u9","encrypted_credentials":"{SECRET_CANARY}"}}"#
    ))
    .await?;
    bus.put_maintenance_report(&serde_json::to_string(&report).expect("report serializes"))
        .await?;
    bus.put_credentials("u42", SECRET_CANARY).await
}

/// The seeded pool in memory, as the router tests read it.
pub async fn seeded_pool(now_ms: i64) -> MemoryPoolBus {
    let bus = MemoryPoolBus::new();
    seed_pool(&bus, now_ms)
        .await
        .expect("the memory bus takes every step");
    bus
}

/// A pool source that can be switched off: while `down` holds a message,
/// every read fails with it (Redis away), else it reads `pool`.
pub struct SwitchablePool<P> {
    /// The pool read while up.
    pub pool: P,
    /// When set, every read fails with this message.
    pub down: Mutex<Option<String>>,
}

impl<P> SwitchablePool<P> {
    /// Up, reading `pool`.
    pub fn new(pool: P) -> Self {
        SwitchablePool {
            pool,
            down: Mutex::new(None),
        }
    }

    fn check(&self) -> Result<(), BusError> {
        match self.down.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            Some(message) => Err(BusError::Unavailable(message)),
            None => Ok(()),
        }
    }
}

#[async_trait]
impl<P: PoolReader> PoolReader for SwitchablePool<P> {
    async fn counts(&self) -> Result<PoolCounts, BusError> {
        self.check()?;
        self.pool.counts().await
    }

    async fn pool(&self) -> Result<PoolView, BusError> {
        self.check()?;
        self.pool.pool().await
    }

    async fn anomalies(&self) -> Result<AnomalyView, BusError> {
        self.check()?;
        self.pool.anomalies().await
    }
}

/// A stream worker's `/status` body for `owner`, listing `gaps` as
/// (seq, age_ms, stream, from_seq, to_seq, reason), oldest first.
pub fn status_with_gaps(
    owner: &str,
    gaps: &[(u64, u64, &str, u64, u64, &str)],
) -> serde_json::Value {
    let gaps: Vec<serde_json::Value> = gaps
        .iter()
        .map(|(seq, age_ms, stream, from, to, reason)| {
            serde_json::json!({"seq": seq, "age_ms": age_ms, "stream_id": stream,
                "from_seq": from, "to_seq": to, "reason": reason})
        })
        .collect();
    serde_json::json!({
        "component": "stream-worker", "owner_id": owner, "worker_connected": true,
        "last_event_age_ms": 10, "worker_up": true, "events_received": 1,
        "events_dropped": 0, "leases": [], "lag": {}, "websocket_connections": 0,
        "pool": null, "observer": false, "gaps": gaps,
    })
}

/// A sidecar on 127.0.0.1 answering `/status` with what `status` holds at
/// the time (a test changes it between refreshes); polled as a
/// `DASHBOARD_SIDECARS` target. It serves until the runtime ends.
pub async fn fake_sidecar(
    status: std::sync::Arc<Mutex<serde_json::Value>>,
) -> leasehold_dashboard::sources::sidecars::SidecarTarget {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .expect("bind a fake sidecar");
    let port = listener.local_addr().expect("its address").port();
    let app = axum::Router::new().route(
        "/status",
        axum::routing::get(move || {
            let body = status.lock().unwrap_or_else(|p| p.into_inner()).to_string();
            async move { ([("content-type", "application/json")], body) }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    leasehold_dashboard::sources::sidecars::SidecarTarget {
        host: "127.0.0.1".into(),
        port,
    }
}

/// [`collector_at`] polling `sidecars` (the `DASHBOARD_SIDECARS` override).
pub fn collector_with_sidecars(
    leases: std::sync::Arc<dyn leasehold_control::store::LeaseReader>,
    sidecars: Vec<leasehold_dashboard::sources::sidecars::SidecarTarget>,
    now_ms: i64,
) -> std::sync::Arc<leasehold_dashboard::Collector> {
    std::sync::Arc::new(leasehold_dashboard::Collector::new(
        leasehold_dashboard::Sources {
            leases,
            pool: None,
            sidecars,
            discovery: leasehold_dashboard::sources::sidecars::DiscoveryPolicy::default(),
        },
        leasehold_dashboard::CollectorSettings::default(),
        std::sync::Arc::new(leasehold_control::clock::PausedClock::starting_at(now_ms)),
    ))
}
