//! The cluster observer: exactly one sidecar at a time holds the `observer`
//! lease (dogfooding the lease core) and publishes the cluster-wide gauges, so
//! no series is duplicated across sidecars. If it dies, another takes over
//! within a lease period; a sidecar that loses the lease stops publishing at
//! once (its cluster series vanish from `/metrics`).

use std::sync::Arc;
use std::time::Duration;

use leasehold_control::clock::Clock;
use leasehold_control::keeper::LeaseKeeper;
use leasehold_control::lease::LeaseState;
use leasehold_control::schema::OBSERVER_LEASE;
use leasehold_control::store::{Consistency, list_all};
use leasehold_pool::bus::BusError;
use leasehold_pool::read::{PoolCounts, PoolReader};
use leasehold_telemetry::OrphanKind;
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
    /// The pool's read model, for the pool and orphan gauges (none: streams only).
    pub pool: Option<Arc<dyn PoolReader>>,
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
                tracing::warn!(error = %err, "cluster scan failed; the cluster gauges keep their last values");
                state.with_cluster_recorder(|| {
                    ::metrics::counter!(metrics::OBSERVER_SCAN_ERRORS).increment(1)
                });
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
    let records = list_all(config.keeper.store().as_ref(), 1000, Consistency::Eventual).await?;
    let now = config.clock.now_ms();
    let (mut owned, mut expired, mut unowned) = (0u64, 0u64, 0u64);
    // Since when the longest-waiting stream has had no valid owner.
    let mut unowned_since: Option<i64> = None;
    for lease in records
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .filter(|l| l.is_stream())
    {
        let since = match lease.state(now) {
            LeaseState::Owned => {
                owned += 1;
                continue;
            }
            LeaseState::Expired => {
                expired += 1;
                lease.lease_expires_at
            }
            LeaseState::Unowned => {
                unowned += 1;
                // Released, or registered and never taken.
                lease.released_at.or(lease.updated_at).unwrap_or(now)
            }
        };
        unowned_since = Some(unowned_since.map_or(since, |oldest| oldest.min(since)));
    }
    let unowned_age = unowned_since.map_or(0.0, |since| (now - since).max(0) as f64 / 1000.0);
    let pool = match &config.pool {
        Some(reader) => match pool_view(reader.as_ref()).await {
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
        ::metrics::gauge!(metrics::STREAM_UNOWNED_AGE).set(unowned_age);
        ::metrics::gauge!(metrics::OBSERVER_LAST_SCAN).set(now as f64 / 1000.0);
        if let Some(pool) = &pool {
            let counts = pool.counts;
            ::metrics::gauge!(metrics::POOL_WORKERS, "state" => "idle").set(counts.idle as f64);
            ::metrics::gauge!(metrics::POOL_WORKERS, "state" => "claimed")
                .set(counts.claimed as f64);
            ::metrics::gauge!(metrics::POOL_CLAIMS_PENDING).set(counts.claims_pending as f64);
            for kind in OrphanKind::ALL {
                let found = pool.orphans.get(&kind).copied().unwrap_or(0);
                ::metrics::gauge!(metrics::ORPHANS, "kind" => kind.as_str()).set(found as f64);
            }
        }
    });
    Ok(())
}

/// The pool as its read model shows it.
struct PoolView {
    counts: PoolCounts,
    orphans: std::collections::BTreeMap<OrphanKind, u64>,
}

async fn pool_view(reader: &dyn PoolReader) -> Result<PoolView, BusError> {
    let counts = reader.counts().await?;
    let orphans = reader
        .anomalies()
        .await?
        .report
        .map(|report| report.found)
        .unwrap_or_default();
    Ok(PoolView { counts, orphans })
}
