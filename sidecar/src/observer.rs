//! The cluster observer: exactly one sidecar at a time holds the `observer`
//! lease (dogfooding the lease core) and publishes the cluster-wide gauges, so
//! no series is duplicated across sidecars. If it dies, another takes over
//! within a lease period; a sidecar that loses the lease stops publishing at
//! once (its cluster series vanish from `/metrics`).

use std::sync::Arc;
use std::time::Duration;

use leasehold_control::clock::Clock;
use leasehold_control::keeper::LeaseKeeper;
use leasehold_control::keys;
use leasehold_control::lease::LeaseState;
use leasehold_control::schema::OBSERVER_LEASE;
use leasehold_control::store::list_all;
use leasehold_control::telemetry::OrphanKind;
use leasehold_worker::broker::bus::{BusConnector, BusError, PoolBus};
use tokio_util::sync::CancellationToken;

use crate::SidecarState;
use crate::metrics;

/// How the observer runs.
pub struct ObserverConfig {
    /// Keeper for the observer lease (owner id = this sidecar).
    pub keeper: LeaseKeeper,
    /// Wall clock for lease states.
    pub clock: Arc<dyn Clock>,
    /// How often the cluster gauges are refreshed.
    pub interval: Duration,
    /// The pool bus, for the pool and orphan gauges (none: streams only).
    pub pool: Option<Arc<BusConnector>>,
}

/// Competes for the observer lease and publishes while holding it.
pub async fn run(state: Arc<SidecarState>, config: ObserverConfig, shutdown: CancellationToken) {
    let retry = config.keeper.config().renew_interval;
    loop {
        let lease = tokio::select! {
            _ = shutdown.cancelled() => return,
            result = config.keeper.acquire(OBSERVER_LEASE) => result,
        };
        let lease = match lease {
            Ok(lease) => lease,
            Err(_) => {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(retry) => continue,
                }
            }
        };
        tracing::info!(
            fence_token = lease.fence_token,
            "this sidecar is the cluster observer"
        );
        state.become_observer();
        loop {
            if let Err(err) = publish(&state, &config).await {
                tracing::warn!(error = %err, "cluster scan failed");
            }
            tokio::select! {
                _ = shutdown.cancelled() => {
                    state.stop_observing();
                    let _ = config.keeper.release(&lease).await;
                    return;
                }
                _ = lease.cancelled() => break,
                _ = tokio::time::sleep(config.interval) => {}
            }
            if !lease.is_valid() {
                break;
            }
        }
        tracing::warn!("observer lease lost; no longer publishing cluster gauges");
        state.stop_observing();
    }
}

async fn publish(
    state: &SidecarState,
    config: &ObserverConfig,
) -> Result<(), leasehold_control::LeaseError> {
    let records = list_all(config.keeper.store().as_ref(), 1000).await?;
    let now = config.clock.now_ms();
    let (mut owned, mut expired, mut unowned) = (0u64, 0u64, 0u64);
    for lease in records
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .filter(|l| l.is_stream())
    {
        match lease.state(now) {
            LeaseState::Owned => owned += 1,
            LeaseState::Expired => expired += 1,
            LeaseState::Unowned => unowned += 1,
        }
    }
    let pool = match &config.pool {
        Some(connector) => match async { pool_view(connector.get().await?.as_ref()).await }.await {
            Ok(pool) => Some(pool),
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the pool state from the pool bus");
                None
            }
        },
        None => None,
    };
    state.with_cluster_recorder(|| {
        for (label, count) in [("owned", owned), ("expired", expired), ("unowned", unowned)] {
            ::metrics::gauge!(metrics::STREAMS, "state" => label).set(count as f64);
        }
        if let Some(pool) = &pool {
            ::metrics::gauge!(metrics::POOL_WORKERS, "state" => "idle").set(pool.idle as f64);
            ::metrics::gauge!(metrics::POOL_WORKERS, "state" => "claimed").set(pool.claimed as f64);
            ::metrics::gauge!(metrics::POOL_CLAIMS_PENDING).set(pool.pending as f64);
            for kind in OrphanKind::ALL {
                let found = pool.orphans.get(kind.as_str()).copied().unwrap_or(0);
                ::metrics::gauge!(metrics::ORPHANS, "kind" => kind.as_str()).set(found as f64);
            }
        }
    });
    Ok(())
}

/// The pool as the pool bus shows it.
struct PoolView {
    idle: u64,
    claimed: u64,
    pending: u64,
    orphans: std::collections::BTreeMap<String, u64>,
}

/// Counts keys matching `pattern` (SCAN, never KEYS: the pool's Redis is shared).
async fn count_keys(bus: &dyn PoolBus, pattern: &str) -> Result<u64, BusError> {
    Ok(bus.scan_keys(pattern).await?.len() as u64)
}

async fn pool_view(bus: &dyn PoolBus) -> Result<PoolView, BusError> {
    let idle = count_keys(bus, keys::POOL_WORKER_ACTIVE_PATTERN).await?;
    let all = count_keys(bus, keys::WORKER_ACTIVE_PATTERN).await?;
    let pending = bus.list_len(keys::POOL_CLAIMS).await?;
    let report = bus.maintenance_report().await?;
    // The report is the maintenance sweep's JSON; only its `found` counts matter here.
    let orphans = report
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .and_then(|report| serde_json::from_value(report["found"].clone()).ok())
        .unwrap_or_default();
    Ok(PoolView {
        idle,
        claimed: all.saturating_sub(idle),
        pending,
        orphans,
    })
}
