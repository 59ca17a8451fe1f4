//! The collector: one task that reads the sources ([`crate::sources`]) and
//! folds what they said into the model ([`crate::model`]), publishing one
//! immutable snapshot per refresh. The only place in the dashboard with locks.
//!
//! Pages and the JSON API only read the latest snapshot, so a slow or dead
//! source never slows a page down, and a page with 10,000 streams costs one
//! render, not one table scan. A source that fails keeps its last good data,
//! marked with the error and its age, while the others keep updating. The
//! pool (Redis) is read by a task of its own, so a Redis that is down or slow
//! never stretches the lease table's refresh.
//!
//! Locks, always taken in this order: `changes`, `trends`, `gaps` (the
//! handlers nest them the same way; a refresh holds all three only while it
//! applies its readings, never across a read). `model` is a `tokio` mutex held
//! for a whole refresh: refreshes never overlap.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use leasehold_control::clock::Clock;
use leasehold_control::pacing::ScanPacing;
use tokio_util::sync::CancellationToken;

use crate::model::changes::{Change, ChangeLog};
use crate::model::gaps::GapLog;
use crate::model::streams::Thresholds;
use crate::model::trends::Trends;
use crate::model::{Logs, Model};
pub use crate::model::{Snapshot, SourceHealth, WorkerRow};
pub use crate::sources::Sources;
use crate::sources::sidecars::{DEFAULT_POLL_BYTE_BUDGET, PollLimits};
use crate::sources::{Readings, leases, pool, sidecars};
use leasehold_pool::read::{AnomalyView, PoolView};

/// Collector settings.
#[derive(Debug, Clone, Copy)]
pub struct CollectorSettings {
    /// Time between refreshes while the table is small (the pacing's base).
    pub refresh: Duration,
    /// Lease records per second the collector may scan on average: above
    /// `refresh × scan_items_per_second` records the refresh interval grows
    /// with the table ([`ScanPacing`]).
    pub scan_items_per_second: u32,
    /// Per-sidecar `/status` timeout (the whole poll has the source timeout).
    pub sidecar_timeout: Duration,
    /// `/status` bytes one refresh may read from all sidecars together
    /// ([`PollLimits::byte_budget`]).
    pub sidecar_byte_budget: usize,
    /// Classification thresholds.
    pub thresholds: Thresholds,
    /// Ownership changes kept (the count bound of the history).
    pub changes_kept: usize,
    /// Oldest ownership change kept (the age bound of the history).
    pub changes_max_age: Duration,
    /// Bucket width of the trend history ([`crate::model::trends`]).
    pub trend_resolution: Duration,
    /// Scan page size for the lease table.
    pub page_size: usize,
}

impl CollectorSettings {
    /// How long one source may take before the refresh goes on without it.
    pub fn source_timeout(&self) -> Duration {
        (self.refresh * 5).max(Duration::from_secs(5))
    }

    /// How the lease-table scans are paced.
    pub fn pacing(&self) -> ScanPacing {
        ScanPacing::new(self.refresh, self.scan_items_per_second)
    }
}

impl Default for CollectorSettings {
    fn default() -> Self {
        CollectorSettings {
            refresh: Duration::from_secs(2),
            scan_items_per_second: 1_000,
            sidecar_timeout: Duration::from_millis(1_500),
            sidecar_byte_budget: DEFAULT_POLL_BYTE_BUDGET,
            thresholds: Thresholds::default(),
            changes_kept: 50_000,
            changes_max_age: Duration::from_millis(
                crate::model::changes::DEFAULT_MAX_AGE_MS as u64,
            ),
            trend_resolution: Duration::from_millis(
                crate::model::trends::DEFAULT_RESOLUTION_MS as u64,
            ),
            page_size: 1_000,
        }
    }
}

/// Builds snapshots and keeps the latest for readers.
pub struct Collector {
    sources: Sources,
    settings: CollectorSettings,
    clock: Arc<dyn Clock>,
    latest: RwLock<Arc<Snapshot>>,
    changes: Mutex<ChangeLog>,
    trends: Mutex<Trends>,
    /// Data gaps the sidecars reported, per stream.
    gaps: Mutex<GapLog>,
    /// Snapshots published so far (the entity tag's counter).
    published: AtomicU64,
    started_ms: i64,
    model: tokio::sync::Mutex<Model>,
    /// Records the last successful lease scan read (the pacing's input).
    scanned: AtomicUsize,
    /// The generation, for the task that renders hot views after each snapshot.
    generations: tokio::sync::watch::Sender<u64>,
    /// The pool's latest reading, when its own task polls it ([`Collector::run`]):
    /// a slow or unreachable Redis then never holds back the lease table.
    pool_polled: tokio::sync::watch::Sender<Option<PoolReading>>,
    /// Whether that task runs (refreshes read the pool inline otherwise).
    pool_polling: std::sync::atomic::AtomicBool,
}

/// What one pool read gave: the pool and the sweeper's report, or why not.
type PoolReading = Result<(PoolView, AnomalyView), String>;

/// Takes a lock even if a reader panicked while holding it: the logs stay
/// consistent between calls, so the data is still good.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Collector {
    /// A collector that has not refreshed yet.
    pub fn new(sources: Sources, settings: CollectorSettings, clock: Arc<dyn Clock>) -> Self {
        let now = clock.now_ms();
        Collector {
            changes: Mutex::new(ChangeLog::bounded(
                settings.changes_kept,
                settings.changes_max_age.as_millis() as i64,
            )),
            trends: Mutex::new(Trends::new(settings.trend_resolution.as_millis() as i64)),
            gaps: Mutex::new(GapLog::default()),
            published: AtomicU64::new(0),
            started_ms: now,
            sources,
            settings,
            clock,
            latest: RwLock::new(Arc::new(Snapshot::empty(now))),
            model: tokio::sync::Mutex::new(Model::default()),
            scanned: AtomicUsize::new(0),
            generations: tokio::sync::watch::Sender::new(0),
            pool_polled: tokio::sync::watch::Sender::new(None),
            pool_polling: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Snapshots published so far: what rendered responses are keyed by.
    pub fn generation(&self) -> u64 {
        self.published.load(Ordering::Acquire)
    }

    /// Follows the generation (a new value after each publication).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generations.subscribe()
    }

    /// Counts a publication and tells the subscribers.
    fn published_one(&self) {
        let generation = self.published.fetch_add(1, Ordering::AcqRel) + 1;
        self.generations.send_replace(generation);
    }

    /// The time between refreshes at the table size last read: the pacing's
    /// interval (pages refresh themselves at the same pace).
    pub fn interval(&self) -> Duration {
        self.settings
            .pacing()
            .interval(self.scanned.load(Ordering::Relaxed))
    }

    /// Now, unix ms, by the collector's clock (the dashboard's one clock:
    /// session expiry is judged on it too).
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The settings in use.
    pub fn settings(&self) -> &CollectorSettings {
        &self.settings
    }

    /// The latest snapshot.
    pub fn latest(&self) -> Arc<Snapshot> {
        self.latest
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Newest ownership changes first.
    pub fn changes(&self, limit: usize) -> Vec<Change> {
        lock(&self.changes).recent(limit)
    }

    /// Reads the ownership-change history (and fenced writes) under its lock.
    pub fn with_changes<R>(&self, read: impl FnOnce(&ChangeLog) -> R) -> R {
        read(&lock(&self.changes))
    }

    /// Writes the history directly (tests and the benchmark); counts as a
    /// new generation, since pages change.
    #[cfg(feature = "testing")]
    pub fn with_changes_mut<R>(&self, write: impl FnOnce(&mut ChangeLog) -> R) -> R {
        let out = write(&mut lock(&self.changes));
        self.published_one();
        out
    }

    /// Writes the trends directly (tests and the benchmark); a new generation.
    #[cfg(feature = "testing")]
    pub fn with_trends_mut<R>(&self, write: impl FnOnce(&mut Trends) -> R) -> R {
        let out = write(&mut lock(&self.trends));
        self.published_one();
        out
    }

    /// Publishes the latest snapshot again as a new generation (the
    /// benchmark's stand-in for a refresh that changed something).
    #[cfg(feature = "testing")]
    pub fn republish(&self) {
        self.published_one();
    }

    /// Reads the trend history under its lock.
    pub fn with_trends<R>(&self, read: impl FnOnce(&Trends) -> R) -> R {
        read(&lock(&self.trends))
    }

    /// Reads the data gaps under their lock (taken after the changes' and
    /// the trends' when a reader holds those too, the order a refresh takes
    /// all three in).
    pub fn with_gaps<R>(&self, read: impl FnOnce(&GapLog) -> R) -> R {
        read(&lock(&self.gaps))
    }

    /// Writes the data gaps directly (the benchmark); a new generation, and
    /// the next refresh carries them into the rows.
    #[cfg(feature = "testing")]
    pub fn with_gaps_mut<R>(&self, write: impl FnOnce(&mut GapLog) -> R) -> R {
        let out = write(&mut lock(&self.gaps));
        self.published_one();
        out
    }

    /// The entity tag of the current snapshot: this collector's start time
    /// and how many snapshots it has published (a restarted dashboard never
    /// reuses a tag; two refreshes within one millisecond still differ).
    pub fn entity_tag(&self) -> String {
        format!("\"{:x}-{}\"", self.started_ms, self.generation())
    }

    /// Reads every source once and publishes a new snapshot: the reads
    /// first (I/O, no log locked), then the model applies them (no I/O).
    pub async fn refresh(&self) -> Arc<Snapshot> {
        let mut model = self.model.lock().await;
        let readings = self.read(&model).await;
        let snapshot = {
            let (mut changes, mut trends, mut gaps) =
                (lock(&self.changes), lock(&self.trends), lock(&self.gaps));
            let logs = Logs {
                changes: &mut changes,
                trends: &mut trends,
                gaps: &mut gaps,
            };
            Arc::new(model.apply(logs, readings, &self.settings.thresholds))
        };
        *self.latest.write().unwrap_or_else(|p| p.into_inner()) = snapshot.clone();
        self.published_one();
        snapshot
    }

    /// One refresh's reads: the lease table and the pool together, then the
    /// sidecars those (or, while a source is down, the last good reads)
    /// name. Every read has the source timeout.
    async fn read(&self, model: &Model) -> Readings {
        let deadline = self.settings.source_timeout();
        let (leases, pool) = tokio::join!(
            leases::read(
                self.sources.leases.as_ref(),
                self.settings.page_size,
                deadline
            ),
            self.read_pool(deadline),
        );
        let now_ms = self.clock.now_ms();
        if let Ok(table) = &leases {
            self.scanned.store(table.records(), Ordering::Relaxed);
        }
        // One deadline for the whole poll, like the other sources: sidecars
        // that have not answered by then count as silent for this refresh.
        let limits = PollLimits {
            per_sidecar: self.settings.sidecar_timeout,
            whole_poll: deadline,
            byte_budget: self.settings.sidecar_byte_budget,
        };
        let pool_view = match &pool {
            Some(Ok((view, _))) => Some(view),
            _ => None,
        };
        let sidecars = sidecars::read(
            &self.sources.sidecars,
            &self.sources.discovery,
            model.published_sidecars(leases.as_ref().ok(), pool_view),
            &limits,
            model.answered(),
            self.clock.as_ref(),
        )
        .await;
        Readings {
            now_ms,
            leases,
            pool,
            sidecars,
        }
    }

    /// The pool as its own task last read it, or (no such task) read now.
    /// The first refreshes wait for the task's first reading at most one
    /// refresh period; after that a refresh never waits for the pool.
    async fn read_pool(&self, deadline: Duration) -> Option<PoolReading> {
        self.sources.pool.as_ref()?;
        if !self.pool_polling.load(Ordering::Relaxed) {
            return pool::read(self.sources.pool.as_ref(), deadline).await;
        }
        let mut polled = self.pool_polled.subscribe();
        let wait = deadline.min(self.settings.refresh);
        let first = tokio::time::timeout(wait, polled.wait_for(Option::is_some)).await;
        match first {
            Ok(Ok(reading)) => reading.clone(),
            _ => Some(Err(format!("no answer within {} ms", wait.as_millis()))),
        }
    }

    /// Reads the pool every `settings.refresh` until `shutdown`, each read
    /// with the source timeout, publishing each reading for the refreshes.
    async fn poll_pool(self: Arc<Self>, shutdown: CancellationToken) {
        let deadline = self.settings.source_timeout();
        leasehold_platform::periodic::paced(shutdown, || async {
            let reading = pool::read(self.sources.pool.as_ref(), deadline).await;
            self.pool_polled.send_replace(reading);
            self.settings.refresh
        })
        .await
    }

    /// Refreshes until `shutdown`, every [`Collector::interval`]: every
    /// `settings.refresh` while the table is small, less often as it grows.
    /// The pool is read by a task of its own (one source down must not slow
    /// the others' refresh).
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        if self.sources.pool.is_some() {
            self.pool_polling.store(true, Ordering::Relaxed);
            tokio::spawn(self.clone().poll_pool(shutdown.clone()));
        }
        leasehold_platform::periodic::paced(shutdown, || async {
            self.refresh().await;
            self.interval()
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use leasehold_control::clock::PausedClock;
    use leasehold_control::store::intercept::{Intercepted, Interceptor, StoreOp};
    use leasehold_control::store::memory::MemoryLeaseStore;
    use leasehold_control::store::{LeaseError, LeaseStore};

    use crate::sources::sidecars::DiscoveryPolicy;

    use super::*;

    /// Counts full scans (first pages) and the pages read strongly consistent.
    #[derive(Default)]
    struct Counting {
        scans: AtomicU32,
        strong_pages: AtomicU32,
    }

    #[async_trait::async_trait]
    impl Interceptor for Counting {
        async fn before(&self, op: StoreOp<'_>) -> Result<(), LeaseError> {
            if let StoreOp::List {
                start_after,
                consistency,
                ..
            } = op
            {
                if start_after.is_none() {
                    self.scans.fetch_add(1, Ordering::SeqCst);
                }
                if consistency.is_strong() {
                    self.strong_pages.fetch_add(1, Ordering::SeqCst);
                }
            }
            Ok(())
        }
    }

    /// A collector over `records` streams whose lease scans are counted,
    /// refreshing every `refresh`, with `pool` as its pool source.
    async fn counted_collector(
        records: usize,
        refresh: Duration,
        pool: Option<Arc<dyn leasehold_pool::read::PoolReader>>,
    ) -> (Arc<Intercepted<MemoryLeaseStore, Counting>>, Arc<Collector>) {
        let store = MemoryLeaseStore::new();
        for i in 0..records {
            store.register(&format!("s-{i:05}"), 0).await.unwrap();
        }
        let leases = Arc::new(Intercepted::new(Arc::new(store), Counting::default()));
        let settings = CollectorSettings {
            refresh,
            scan_items_per_second: 1_000,
            ..CollectorSettings::default()
        };
        let collector = Arc::new(Collector::new(
            Sources {
                leases: leases.clone(),
                pool,
                sidecars: Vec::new(),
                discovery: DiscoveryPolicy::default(),
            },
            settings,
            Arc::new(PausedClock::starting_at(1_800_000_000_000)),
        ));
        (leases, collector)
    }

    async fn scans_in(records: usize, seconds: u64) -> (u32, Duration, u32) {
        let (leases, collector) = counted_collector(records, Duration::from_secs(1), None).await;
        let stop = CancellationToken::new();
        let task = tokio::spawn(collector.clone().run(stop.clone()));
        tokio::time::sleep(Duration::from_millis(seconds * 1000 + 500)).await;
        stop.cancel();
        task.await.unwrap();
        (
            leases.interceptor().scans.load(Ordering::SeqCst),
            collector.interval(),
            leases.interceptor().strong_pages.load(Ordering::SeqCst),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn scans_are_paced_by_the_table_size_and_eventually_consistent() {
        // 500 records: within the budget at the base interval, 1 s.
        let (scans, interval, strong) = scans_in(500, 30).await;
        assert_eq!((scans, interval), (31, Duration::from_secs(1)));
        assert_eq!(strong, 0, "the dashboard never pays for a strong scan");
        // 5,000 records at 1,000 per second: one scan every 5 s.
        let (scans, interval, _) = scans_in(5_000, 30).await;
        assert_eq!((scans, interval), (7, Duration::from_secs(5)));
    }

    /// A pool that never answers (Redis blackholed) or refuses at once.
    struct DownPool {
        hangs: bool,
    }

    #[async_trait::async_trait]
    impl leasehold_pool::read::PoolReader for DownPool {
        async fn counts(&self) -> Result<leasehold_pool::read::PoolCounts, BusError> {
            self.fail().await
        }
        async fn pool(&self) -> Result<PoolView, BusError> {
            self.fail().await
        }
        async fn anomalies(&self) -> Result<AnomalyView, BusError> {
            self.fail().await
        }
    }

    impl DownPool {
        async fn fail<T>(&self) -> Result<T, BusError> {
            if self.hangs {
                std::future::pending::<()>().await;
            }
            Err(BusError::Unavailable("Connection refused".into()))
        }
    }

    use leasehold_pool::bus::BusError;

    /// One source down blinds none of the others: with the pool hanging or
    /// refusing, the lease table keeps its refresh period and the pool's
    /// error shows within one period.
    #[tokio::test(start_paused = true)]
    async fn a_pool_that_is_down_never_slows_the_lease_table() {
        for hangs in [true, false] {
            let pool =
                Some(Arc::new(DownPool { hangs }) as Arc<dyn leasehold_pool::read::PoolReader>);
            let (leases, collector) = counted_collector(1, Duration::from_secs(2), pool).await;
            let stop = CancellationToken::new();
            let task = tokio::spawn(collector.clone().run(stop.clone()));
            tokio::time::sleep(Duration::from_millis(2_500)).await;
            let pool = collector
                .latest()
                .sources
                .iter()
                .find(|s| s.name == crate::sources::POOL_SOURCE)
                .cloned()
                .expect("the pool is listed");
            assert!(!pool.ok, "hangs={hangs}: {pool:?}");
            assert!(pool.error.is_some(), "hangs={hangs}: {pool:?}");
            tokio::time::sleep(Duration::from_millis(20_000)).await;
            stop.cancel();
            task.await.unwrap();
            // 22.5 s at one scan per 2 s: 12 (a refresh that waited for the
            // pool's 10 s timeout would have made 3).
            let scans = leases.interceptor().scans.load(Ordering::SeqCst);
            assert!(scans >= 11, "hangs={hangs}: {scans} lease scans in 22.5 s");
        }
    }
}
