//! The cluster observer: exactly one sidecar at a time holds the `observer`
//! lease (dogfooding the lease core) and publishes the cluster-wide gauges, so
//! no series is duplicated across sidecars. If it dies, another takes over
//! within a lease period; a sidecar that loses the lease stops publishing at
//! once (its cluster series vanish from `/metrics`).
//!
//! What it costs: every sidecar contends, but a contender looks before it
//! writes ([`next_step`]): it reads the observer record (eventually consistent)
//! and attempts the conditional acquire only when that record would let it in
//! (no owner, expired past the skew margin, or its own). A healthy cluster
//! therefore makes one election write per renew interval, the holder's renew,
//! instead of one failing acquire per contender; the acquire condition still
//! decides, so a stale look costs at most a refused write or a look one
//! interval later. The holder's scan is eventually consistent and paced by the
//! table's size ([`ScanPacing`]); it reads the table through the lease read
//! model ([`LeaseTable`]) over the keeper's read-only view, so the observer
//! writes nothing but its own lease, and only through the keeper.

use std::sync::Arc;
use std::time::Duration;

use leasehold_control::clock::{Clock, SystemClock};
use leasehold_control::keeper::{HeldLease, KeeperConfig, LeaseKeeper};
use leasehold_control::lease::Lease;
use leasehold_control::pacing::ScanPacing;
use leasehold_control::protocol;
use leasehold_control::read::{self, LeaseTable};
use leasehold_control::schema::OBSERVER_LEASE;
use leasehold_control::store::{Consistency, LeaseError, LeaseStore};
use leasehold_platform::backoff::Backoff;
use leasehold_pool::bus::{BusConnector, BusError};
use leasehold_pool::read::{PoolCounts, PoolReader};
use leasehold_telemetry::{LogSink, OrphanKind};
use tokio_util::sync::CancellationToken;

use crate::SidecarState;
use crate::metrics;

/// How the observer runs.
pub struct ObserverConfig {
    /// Keeper for the observer lease (owner id = this sidecar).
    pub keeper: LeaseKeeper,
    /// Wall clock for lease states.
    pub clock: Arc<dyn Clock>,
    /// How often the cluster gauges are refreshed: the base interval, and how
    /// it grows with the table.
    pub pacing: ScanPacing,
    /// The pool's read model, for the pool and orphan gauges (none: streams only).
    pub pool: Option<Arc<dyn PoolReader>>,
}

impl ObserverConfig {
    /// The observer over `store` on the system clock, its keeper logging its
    /// events. With a `redis_url`, the pool gauges come through a bus
    /// connected lazily (and again after a failure): a Redis that is down at
    /// task start must not stop the sidecar, which ECS would then not
    /// restart. Without one the observer publishes the stream gauges only.
    /// The error is only a malformed URL.
    pub fn new(
        store: Arc<dyn LeaseStore>,
        keeper: KeeperConfig,
        pacing: ScanPacing,
        redis_url: Option<String>,
    ) -> Result<Self, BusError> {
        let clock = Arc::new(SystemClock);
        let keeper = LeaseKeeper::new(store, clock.clone(), Arc::new(LogSink), keeper);
        let pool = match redis_url {
            Some(url) => Some(Arc::new(BusConnector::redis(url)?) as Arc<dyn PoolReader>),
            None => None,
        };
        Ok(ObserverConfig {
            keeper,
            clock,
            pacing,
            pool,
        })
    }
}

/// Competes for the observer lease and publishes while holding it.
pub async fn run(state: Arc<SidecarState>, config: ObserverConfig, shutdown: CancellationToken) {
    // Records the last scan read: the pacing's input (kept across a failed scan).
    let mut scanned = 0;
    loop {
        let Some(lease) = contend(&config.keeper, config.clock.as_ref(), &shutdown).await else {
            return;
        };
        tracing::info!(
            fence_token = lease.fence_token,
            "this sidecar is the cluster observer"
        );
        state.become_observer();
        loop {
            match publish(&state, &config).await {
                Ok(records) => scanned = records,
                Err(err) => {
                    tracing::warn!(error = %err, "cluster scan failed; the cluster gauges keep their last values");
                    state.with_cluster_recorder(|| {
                        ::metrics::counter!(metrics::OBSERVER_SCAN_ERRORS).increment(1)
                    });
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => {
                    state.stop_observing();
                    let _ = config.keeper.release(&lease).await;
                    return;
                }
                _ = lease.cancelled() => break,
                _ = tokio::time::sleep(config.pacing.interval(scanned)) => {}
            }
            if !lease.is_valid() {
                break;
            }
        }
        tracing::warn!("observer lease lost; no longer publishing cluster gauges");
        state.stop_observing();
    }
}

/// What a contender does next, given the observer record it last saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The acquire condition would let this contender in: write.
    Acquire,
    /// Somebody holds it: look again after this long.
    Wait(Duration),
}

/// The read-before-write guard. `record` is the observer record as read (none:
/// absent). A contender writes only when [`read::acquirable`] says the
/// store would accept it; otherwise it waits until the record becomes takeable
/// (its expiry plus the skew margin), but never longer than `recheck`, so a
/// released lease (graceful shutdown of the holder) is taken within `recheck`.
pub fn next_step(
    record: Option<&Lease>,
    me: &str,
    now_ms: i64,
    skew_margin_ms: i64,
    recheck: Duration,
) -> Step {
    let Some(record) = record else {
        return Step::Acquire;
    };
    if read::acquirable(record, me, now_ms, skew_margin_ms) {
        return Step::Acquire;
    }
    let takeable_at = protocol::takeable_at(record.lease_expires_at, skew_margin_ms);
    let until = u64::try_from(takeable_at.saturating_sub(now_ms)).unwrap_or(0);
    Step::Wait(Duration::from_millis(until.max(1)).min(recheck))
}

/// Contends for the observer lease until this sidecar holds it (`None` on
/// shutdown): look ([`next_step`]), and write only when the look says the
/// write can succeed. Contenders that wait for the same expiry spread their
/// attempts over up to a second, so a takeover costs a few writes, not one per
/// contender.
pub async fn contend(
    keeper: &LeaseKeeper,
    clock: &dyn Clock,
    shutdown: &CancellationToken,
) -> Option<HeldLease> {
    let config = keeper.config();
    let recheck = config.renew_interval;
    let skew = i64::try_from(config.skew_margin.as_millis()).unwrap_or(i64::MAX);
    let spread = Backoff {
        base: (recheck / 2).min(Duration::from_secs(1)),
        cap: (recheck / 2).min(Duration::from_secs(1)),
    };
    loop {
        let record = match keeper
            .reader()
            .get_with(OBSERVER_LEASE, Consistency::Eventual)
            .await
        {
            Ok(record) => Ok(Some(record)),
            Err(LeaseError::NotFound { .. }) => Ok(None),
            Err(err) => Err(err),
        };
        let wait = match record {
            Ok(record) => match next_step(
                record.as_ref(),
                &config.owner_id,
                clock.now_ms(),
                skew,
                recheck,
            ) {
                Step::Acquire => match keeper.acquire(OBSERVER_LEASE).await {
                    Ok(lease) => return Some(lease),
                    Err(LeaseError::Conflict { current, .. }) => {
                        // Somebody was faster (or the look was stale): the
                        // refusal carries the record, so decide from it.
                        match next_step(
                            Some(&current),
                            &config.owner_id,
                            clock.now_ms(),
                            skew,
                            recheck,
                        ) {
                            Step::Wait(wait) => wait,
                            Step::Acquire => spread.delay(0),
                        }
                    }
                    Err(_) => recheck,
                },
                Step::Wait(wait) if wait < recheck => wait + spread.delay(0),
                Step::Wait(wait) => wait,
            },
            Err(err) => {
                tracing::debug!(error = %err, "cannot read the observer record");
                recheck
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// One scan and the gauges it gives; returns how many records the scan read.
async fn publish(state: &SidecarState, config: &ObserverConfig) -> Result<usize, LeaseError> {
    let table =
        LeaseTable::read(config.keeper.reader().as_ref(), 1000, Consistency::Eventual).await?;
    let now = config.clock.now_ms();
    let counts = table.stream_counts(now);
    let unowned_age = counts
        .unowned_since_ms
        .map_or(0.0, |since| (now - since).max(0) as f64 / 1000.0);
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
        for (label, count) in [
            ("owned", counts.owned),
            ("expired", counts.expired),
            ("unowned", counts.unowned),
        ] {
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
            ::metrics::gauge!(metrics::SWEEP_HELD).set(if pool.held { 1.0 } else { 0.0 });
        }
    });
    Ok(table.records())
}

/// The pool as its read model shows it.
struct PoolView {
    counts: PoolCounts,
    orphans: std::collections::BTreeMap<OrphanKind, u64>,
    /// The latest sweep was held by its safety valve.
    held: bool,
}

async fn pool_view(reader: &dyn PoolReader) -> Result<PoolView, BusError> {
    let counts = reader.counts().await?;
    let report = reader.anomalies().await?.report;
    let held = report.as_ref().is_some_and(|report| report.held.is_some());
    let orphans = report.map(|report| report.found).unwrap_or_default();
    Ok(PoolView {
        counts,
        orphans,
        held,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use async_trait::async_trait;
    use leasehold_control::clock::PausedClock;
    use leasehold_control::keeper::KeeperConfig;
    use leasehold_control::store::intercept::{Intercepted, Interceptor, StoreOp};
    use leasehold_control::store::memory::MemoryLeaseStore;
    use leasehold_telemetry::LogSink;

    use super::*;

    const T0: i64 = 1_800_000_000_000;
    const LEASE: Duration = Duration::from_secs(30);
    const RENEW: Duration = Duration::from_secs(10);

    #[test]
    fn a_contender_writes_only_when_the_store_would_let_it_in() {
        let recheck = RENEW;
        let mut record = Lease::unowned(OBSERVER_LEASE);
        assert_eq!(next_step(None, "me", T0, 1_000, recheck), Step::Acquire);
        assert_eq!(
            next_step(Some(&record), "me", T0, 1_000, recheck),
            Step::Acquire,
            "released"
        );
        record.owner_id = Some("other".into());
        record.lease_expires_at = T0 + 25_000;
        assert_eq!(
            next_step(Some(&record), "me", T0, 1_000, recheck),
            Step::Wait(recheck),
            "held: look again within a renew interval (a release frees it early)"
        );
        assert_eq!(
            next_step(Some(&record), "me", T0 + 24_000, 1_000, recheck),
            Step::Wait(Duration::from_millis(2_001)),
            "expiring: look again the moment it becomes takeable"
        );
        assert_eq!(
            next_step(Some(&record), "me", T0 + 26_000, 1_000, recheck),
            Step::Wait(Duration::from_millis(1)),
            "expired but within the skew margin"
        );
        assert_eq!(
            next_step(Some(&record), "me", T0 + 26_001, 1_000, recheck),
            Step::Acquire,
            "expired past the skew margin"
        );
        record.owner_id = Some("me".into());
        assert_eq!(
            next_step(Some(&record), "me", T0, 1_000, recheck),
            Step::Acquire,
            "a restarted holder under the same id"
        );
    }

    /// One table shared by every contender; each contender has its own view,
    /// which can be cut off (a crashed or partitioned sidecar).
    #[derive(Default)]
    struct Table {
        store: Arc<MemoryLeaseStore>,
        counts: Arc<Counts>,
    }

    /// Every view's calls that reached the table.
    #[derive(Default)]
    struct Counts {
        writes: AtomicU64,
        failed_writes: AtomicU64,
        reads: AtomicU64,
    }

    type View = Intercepted<MemoryLeaseStore, Cut>;

    /// One contender's link to the table: counts into the shared counts, and
    /// refuses everything while `down` (nothing reaches the table, nothing is
    /// counted).
    struct Cut {
        counts: Arc<Counts>,
        down: AtomicBool,
    }

    #[async_trait]
    impl Interceptor for Cut {
        async fn before(&self, op: StoreOp<'_>) -> Result<(), LeaseError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(LeaseError::Transient {
                    message: "cut off".into(),
                });
            }
            if !op.is_write() {
                self.counts.reads.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        }

        fn after(&self, op: StoreOp<'_>, outcome: Result<(), &LeaseError>) {
            if op.is_write() {
                self.counts.writes.fetch_add(1, Ordering::SeqCst);
                if outcome.is_err() {
                    self.counts.failed_writes.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }

    struct Election {
        table: Arc<Table>,
        views: Vec<Arc<View>>,
        keepers: Vec<LeaseKeeper>,
        /// Who holds the observer lease, by contender index, in order of winning.
        winners: Arc<Mutex<Vec<(usize, HeldLease)>>>,
        stop: CancellationToken,
    }

    /// `contenders` sidecars contending from the same instant, each winner
    /// holding until its lease ends and then contending again.
    fn election(contenders: usize) -> Election {
        let table = Arc::new(Table::default());
        let clock: Arc<dyn Clock> = Arc::new(PausedClock::starting_at(T0));
        let stop = CancellationToken::new();
        let winners = Arc::new(Mutex::new(Vec::new()));
        let mut views = Vec::new();
        let mut keepers = Vec::new();
        for index in 0..contenders {
            let view = Arc::new(Intercepted::new(
                table.store.clone(),
                Cut {
                    counts: table.counts.clone(),
                    down: AtomicBool::new(false),
                },
            ));
            let keeper = LeaseKeeper::new(
                view.clone(),
                clock.clone(),
                Arc::new(LogSink),
                KeeperConfig {
                    owner_id: format!("sidecar-{index:03}"),
                    lease: LEASE,
                    renew_interval: RENEW,
                    safety_margin: Duration::from_secs(3),
                    skew_margin: Duration::from_secs(1),
                    ..KeeperConfig::default()
                },
            );
            tokio::spawn({
                let (keeper, clock, stop, winners) =
                    (keeper.clone(), clock.clone(), stop.clone(), winners.clone());
                async move {
                    while let Some(lease) = contend(&keeper, clock.as_ref(), &stop).await {
                        winners.lock().unwrap().push((index, lease.clone()));
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = lease.cancelled() => {}
                        }
                    }
                }
            });
            views.push(view);
            keepers.push(keeper);
        }
        Election {
            table,
            views,
            keepers,
            winners,
            stop,
        }
    }

    impl Election {
        fn counts(&self) -> (u64, u64, u64) {
            (
                self.table.counts.writes.load(Ordering::SeqCst),
                self.table.counts.failed_writes.load(Ordering::SeqCst),
                self.table.counts.reads.load(Ordering::SeqCst),
            )
        }

        fn holder(&self) -> (usize, HeldLease) {
            self.winners
                .lock()
                .unwrap()
                .last()
                .cloned()
                .expect("a holder")
        }

        fn winners(&self) -> usize {
            self.winners.lock().unwrap().len()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_healthy_cluster_makes_one_election_write_per_interval() {
        let contenders = 20;
        let intervals = 30;
        let election = election(contenders);
        // Cold start: every contender sees no record and tries; one wins.
        tokio::time::sleep(RENEW).await;
        assert_eq!(election.winners(), 1);
        let (writes, _, reads) = election.counts();
        assert!(
            writes <= contenders as u64 + 1,
            "cold start: {writes} writes"
        );
        tokio::time::sleep(RENEW * intervals).await;
        let (after, failed, reads_after) = election.counts();
        let steady = after - writes;
        let looks = reads_after - reads;
        println!(
            "{contenders} contenders, {intervals} renew intervals: {steady} election writes \
             ({failed} refused in all), {looks} eventually consistent looks"
        );
        assert!(
            steady <= u64::from(intervals) + 1,
            "{steady} writes over {intervals} intervals: one per interval (the holder's renew) expected"
        );
        assert_eq!(election.winners(), 1, "nobody took a live lease");
        assert!(
            looks <= (contenders as u64 - 1) * (u64::from(intervals) + 1),
            "{looks} looks: at most one per contender per interval"
        );
        election.stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_crashed_holder_is_replaced_after_expiry_with_a_few_writes() {
        let election = election(20);
        tokio::time::sleep(RENEW * 3).await;
        let (first, lease) = election.holder();
        // The holder is cut off: its renews fail, its record runs out.
        election.views[first]
            .interceptor()
            .down
            .store(true, Ordering::SeqCst);
        let cut = tokio::time::Instant::now();
        let (writes, failed, _) = election.counts();
        while election.winners() == 1 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(cut.elapsed() < LEASE * 2, "no takeover");
        }
        let (second, taken) = election.holder();
        assert_ne!(second, first);
        assert!(taken.fence_token > lease.fence_token);
        // Takeable at the last renew's expiry + skew margin: within a lease
        // (plus the skew margin and the spread) of the cut.
        let took = cut.elapsed();
        assert!(
            took <= LEASE + Duration::from_secs(2),
            "takeover after {took:?}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (after, failed_after, _) = election.counts();
        println!(
            "takeover after {took:?}: {} writes, {} refused",
            after - writes,
            failed_after - failed
        );
        assert!(
            failed_after - failed <= 3,
            "{} refused acquires on takeover: contenders should spread, then look",
            failed_after - failed
        );
        election.stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_lease_is_taken_within_a_renew_interval() {
        let election = election(5);
        tokio::time::sleep(RENEW * 2).await;
        let (first, lease) = election.holder();
        election.keepers[first].release(&lease).await.unwrap();
        let released = tokio::time::Instant::now();
        while election.winners() == 1 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            released.elapsed() <= RENEW + Duration::from_millis(200),
            "taken after {:?}",
            released.elapsed()
        );
        election.stop.cancel();
    }
}
