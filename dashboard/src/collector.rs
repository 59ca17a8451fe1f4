//! The cluster picture: one immutable snapshot per refresh, built from the
//! three sources (lease table, pool key space, sidecars) by one collector task.
//!
//! Pages and the JSON API only read the latest snapshot, so a slow or dead
//! source never slows a page down, and a page with 10,000 streams costs one
//! render, not one table scan. A source that fails keeps its last good data,
//! marked with the error and its age, while the others keep updating.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use leasehold_control::clock::Clock;
use leasehold_control::lease::LeaseState;
use leasehold_control::pacing::ScanPacing;
use leasehold_control::read::LeaseTable;
use leasehold_control::store::{Consistency, LeaseReader};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::model::changes::{Change, ChangeLog};
use crate::model::gaps::GapLog;
use crate::model::streams::{Lag, LagHistory, StreamRow, Thresholds, malformed_row};
use crate::model::trends::Trends;
use crate::sources::sidecars::{
    DEFAULT_POLL_BYTE_BUDGET, Discovery, DiscoveryPolicy, PollLimits, SidecarReport, SidecarTarget,
    poll, poll_discovered,
};
use leasehold_pool::read::{AnomalyView, PoolReader, PoolView};

/// Health of one data source.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourceHealth {
    /// `lease table`, `pool` or `sidecars`.
    pub name: &'static str,
    /// Configured at all (a dashboard without Redis has no pool source).
    pub configured: bool,
    /// The last read worked.
    pub ok: bool,
    /// Why the last read failed (no secrets).
    pub error: Option<String>,
    /// Last successful read, unix ms.
    pub last_ok_ms: Option<i64>,
}

/// One row of the workers view: a stream owner with what its sidecar says.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerRow {
    /// Owner id (untrusted text).
    pub owner_id: String,
    /// Streams whose record names this owner (owned or expired).
    pub streams_held: usize,
    /// Of those, expired.
    pub streams_expired: usize,
    /// `stream:token` for the first 50 streams held (`streams_held` counts them all).
    pub tokens: Vec<(String, u64)>,
    /// The worker's presence lease (`leasehold#worker#{owner}`) state, if any.
    pub presence: Option<LeaseState>,
    /// The sidecar reporting this owner, if found.
    pub sidecar_url: Option<String>,
    /// `worker_up` as that sidecar says.
    pub worker_up: Option<bool>,
    /// Milliseconds since the sidecar's last event from this worker.
    pub last_event_age_ms: Option<u64>,
    /// `stream-worker` or `broker-worker`.
    pub component: Option<String>,
    /// Events the sink refused from this worker because a newer token existed.
    pub sink_events_fenced: Option<u64>,
    /// Leases this worker lost.
    pub leases_lost: Option<u64>,
    /// That sidecar publishes the cluster gauges.
    pub observer: bool,
}

/// Everything a page shows, at one instant.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// When the snapshot was assembled, unix ms.
    pub taken_at_ms: i64,
    /// Every stream record, sorted by stream id.
    pub streams: Vec<StreamRow>,
    /// Stream owners and sidecar-only workers, sorted by owner id.
    pub workers: Vec<WorkerRow>,
    /// Sidecars that answered or failed.
    pub sidecars: Vec<SidecarReport>,
    /// `/status` bytes this refresh read from all sidecars together (at most
    /// [`CollectorSettings::sidecar_byte_budget`]).
    pub sidecar_bytes_read: usize,
    /// The pool, when a pool source is configured and was read at least once.
    pub pool: Option<PoolView>,
    /// The sweeper's report, likewise.
    pub anomalies: Option<AnomalyView>,
    /// Source health, in a fixed order.
    pub sources: Vec<SourceHealth>,
}

impl Snapshot {
    /// A snapshot before the first refresh.
    pub fn empty(now_ms: i64) -> Self {
        Snapshot {
            taken_at_ms: now_ms,
            streams: Vec::new(),
            workers: Vec::new(),
            sidecars: Vec::new(),
            sidecar_bytes_read: 0,
            pool: None,
            anomalies: None,
            sources: Vec::new(),
        }
    }

    /// Counts per stream state, for the header.
    pub fn state_counts(&self) -> BTreeMap<&'static str, usize> {
        let mut counts = BTreeMap::new();
        for row in &self.streams {
            *counts.entry(row.state.as_str()).or_default() += 1;
        }
        counts
    }
}

/// Where the collector reads from.
pub struct Sources {
    /// The lease table.
    pub leases: Arc<dyn LeaseReader>,
    /// The pool's key space, if the dashboard is given one.
    pub pool: Option<Arc<dyn PoolReader>>,
    /// `DASHBOARD_SIDECARS`: when not empty, exactly these sidecars are polled
    /// and none are discovered.
    pub sidecars: Vec<SidecarTarget>,
    /// Which discovered `sidecar_url` values may be polled.
    pub discovery: DiscoveryPolicy,
}

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

#[derive(Default)]
struct History {
    lag: LagHistory,
    /// Rows and presence from the last lease read that worked: shown (marked
    /// stale) while the table cannot be read, never re-judged against a newer
    /// clock, which would turn healthy streams "expired".
    streams: Vec<StreamRow>,
    presence: HashMap<String, LeaseState>,
    /// `sidecar_url` of every presence record in the last good lease read.
    presence_sidecars: Vec<String>,
    pool: Option<PoolView>,
    anomalies: Option<AnomalyView>,
    health: HashMap<&'static str, SourceHealth>,
    /// Newest change already counted in the trends, unix ms.
    sampled_ms: i64,
    /// Sidecars (URLs) that answered in the previous refresh: asked first.
    answered: HashSet<String>,
    /// Per sidecar URL, the newest claim `seq` already counted in the trends.
    claims_seen: HashMap<String, u64>,
    /// When the previous refresh assembled its snapshot, unix ms.
    previous_ms: Option<i64>,
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
    published: std::sync::atomic::AtomicU64,
    started_ms: i64,
    history: tokio::sync::Mutex<History>,
    /// Records the last successful lease scan read (the pacing's input).
    scanned: AtomicUsize,
    /// The generation, for the task that renders hot views after each snapshot.
    generations: tokio::sync::watch::Sender<u64>,
}

const LEASE_SOURCE: &str = "lease table";
const POOL_SOURCE: &str = "pool";
const SIDECAR_SOURCE: &str = "sidecars";

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
            published: std::sync::atomic::AtomicU64::new(0),
            started_ms: now,
            sources,
            settings,
            clock,
            latest: RwLock::new(Arc::new(Snapshot::empty(now))),
            history: tokio::sync::Mutex::new(History::default()),
            scanned: AtomicUsize::new(0),
            generations: tokio::sync::watch::Sender::new(0),
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
        self.changes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .recent(limit)
    }

    /// Reads the ownership-change history (and fenced writes) under its lock.
    pub fn with_changes<R>(&self, read: impl FnOnce(&ChangeLog) -> R) -> R {
        read(&self.changes.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Writes the history directly (tests and the benchmark); counts as a
    /// new generation, since pages change.
    #[cfg(feature = "testing")]
    pub fn with_changes_mut<R>(&self, write: impl FnOnce(&mut ChangeLog) -> R) -> R {
        let out = write(&mut self.changes.lock().unwrap_or_else(|p| p.into_inner()));
        self.published_one();
        out
    }

    /// Writes the trends directly (tests and the benchmark); a new generation.
    #[cfg(feature = "testing")]
    pub fn with_trends_mut<R>(&self, write: impl FnOnce(&mut Trends) -> R) -> R {
        let out = write(&mut self.trends.lock().unwrap_or_else(|p| p.into_inner()));
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
        read(&self.trends.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Reads the data gaps under their lock (taken after the changes' and
    /// the trends' when a reader holds those too; the collector never holds
    /// another lock while it holds this one).
    pub fn with_gaps<R>(&self, read: impl FnOnce(&GapLog) -> R) -> R {
        read(&self.gaps.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Writes the data gaps directly (the benchmark); a new generation, and
    /// the next refresh carries them into the rows.
    #[cfg(feature = "testing")]
    pub fn with_gaps_mut<R>(&self, write: impl FnOnce(&mut GapLog) -> R) -> R {
        let out = write(&mut self.gaps.lock().unwrap_or_else(|p| p.into_inner()));
        self.published_one();
        out
    }

    /// The entity tag of the current snapshot: this collector's start time
    /// and how many snapshots it has published (a restarted dashboard never
    /// reuses a tag; two refreshes within one millisecond still differ).
    pub fn entity_tag(&self) -> String {
        format!("\"{:x}-{}\"", self.started_ms, self.generation())
    }

    /// Reads every source once and publishes a new snapshot.
    pub async fn refresh(&self) -> Arc<Snapshot> {
        let mut history = self.history.lock().await;
        // Each source gets a deadline, so one that hangs cannot hold back the
        // others' updates.
        let deadline = self.settings.source_timeout();
        let late = || format!("no answer within {} s", deadline.as_secs());
        let leases = async {
            match tokio::time::timeout(
                deadline,
                LeaseTable::read(
                    self.sources.leases.as_ref(),
                    self.settings.page_size,
                    Consistency::Eventual,
                ),
            )
            .await
            {
                Ok(read) => read.map_err(|err| err.to_string()),
                Err(_) => Err(late()),
            }
        };
        let pool = async {
            let reader = self.sources.pool.as_ref()?;
            let read = async {
                let pool = reader.pool().await.map_err(|e| e.to_string())?;
                let anomalies = reader.anomalies().await.map_err(|e| e.to_string())?;
                Ok::<_, String>((pool, anomalies))
            };
            Some(match tokio::time::timeout(deadline, read).await {
                Ok(read) => read,
                Err(_) => Err(late()),
            })
        };
        let (leases, pool) = tokio::join!(leases, pool);
        let now = self.clock.now_ms();

        let table = match leases {
            Ok(table) => {
                self.scanned.store(table.records(), Ordering::Relaxed);
                history.presence_sidecars = table.sidecar_urls().map(str::to_owned).collect();
                self.mark(&mut history, LEASE_SOURCE, true, None, now);
                Some(table)
            }
            Err(err) => {
                self.mark(&mut history, LEASE_SOURCE, true, Some(err), now);
                None
            }
        };
        match pool {
            Some(Ok((view, anomalies))) => {
                self.mark(&mut history, POOL_SOURCE, true, None, now);
                history.pool = Some(view);
                history.anomalies = Some(anomalies);
            }
            Some(Err(err)) => self.mark(&mut history, POOL_SOURCE, true, Some(err), now),
            None => self.mark(&mut history, POOL_SOURCE, false, None, now),
        }
        // Sidecars: the override, else those the workers published (from the
        // reads above, or the last good ones while a source is down).
        // One deadline for the whole poll, like the other sources: sidecars
        // that have not answered by then count as silent for this refresh.
        let limits = PollLimits {
            per_sidecar: self.settings.sidecar_timeout,
            whole_poll: deadline,
            byte_budget: self.settings.sidecar_byte_budget,
        };
        let answered_before = std::mem::take(&mut history.answered);
        let (sidecar_poll, refused) = if self.sources.sidecars.is_empty() {
            let discovery = Discovery::from_values(
                history.presence_sidecars.iter().map(String::as_str).chain(
                    history.pool.iter().flat_map(|pool| {
                        let idle = pool.idle.iter().filter_map(|w| w.sidecar_url.as_deref());
                        let claimed = pool.claimed.iter().filter_map(|u| u.sidecar_url.as_deref());
                        idle.chain(claimed)
                    }),
                ),
                &self.sources.discovery,
            );
            (
                poll_discovered(&discovery, &limits, &answered_before).await,
                discovery.summary(),
            )
        } else {
            (
                poll(&self.sources.sidecars, &limits, &answered_before).await,
                None,
            )
        };
        let sidecars = sidecar_poll.reports;
        history.answered = sidecars
            .iter()
            .filter(|report| report.status.is_some())
            .map(|report| report.url.clone())
            .collect();
        let silent = silent_summary(&sidecars);
        let configured =
            !self.sources.sidecars.is_empty() || !sidecars.is_empty() || refused.is_some();
        let sidecar_error = match (silent, refused) {
            (Some(silent), Some(refused)) => Some(format!("{silent}; {refused}")),
            (silent, refused) => silent.or(refused),
        };
        self.mark(&mut history, SIDECAR_SOURCE, configured, sidecar_error, now);
        // Gaps are dated from when the sidecars answered (`age_ms` counts to
        // their answer), which is after `now` by up to the sidecar timeout.
        let polled = self.clock.now_ms().max(now);
        self.gaps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(&sidecars, polled);

        let snapshot =
            Arc::new(self.assemble(&mut history, table, sidecars, sidecar_poll.bytes_read, now));
        *self.latest.write().unwrap_or_else(|p| p.into_inner()) = snapshot.clone();
        self.published_one();
        snapshot
    }

    fn mark(
        &self,
        history: &mut History,
        name: &'static str,
        configured: bool,
        error: Option<String>,
        now: i64,
    ) {
        let entry = history.health.entry(name).or_insert(SourceHealth {
            name,
            configured,
            ok: false,
            error: None,
            last_ok_ms: None,
        });
        entry.configured = configured;
        entry.ok = configured && error.is_none();
        if entry.ok {
            entry.last_ok_ms = Some(now);
        }
        entry.error = error;
    }

    fn assemble(
        &self,
        history: &mut History,
        table: Option<LeaseTable>,
        sidecars: Vec<SidecarReport>,
        sidecar_bytes_read: usize,
        now: i64,
    ) -> Snapshot {
        if let Some(table) = table {
            self.judge(history, &table, &sidecars, now);
        }
        {
            let mut changes = self.changes.lock().unwrap_or_else(|p| p.into_inner());
            changes.observe_fenced(
                sidecars.iter().filter_map(|report| {
                    let status = report.status.as_ref()?;
                    Some((status.owner_id.as_deref()?, status.sink_events_fenced))
                }),
                now,
            );
            let new_changes = changes.since(history.sampled_ms + 1);
            drop(changes);
            let claims = new_claims(
                &mut history.claims_seen,
                &sidecars,
                history.previous_ms.map(|previous| now - previous),
            );
            history.previous_ms = Some(now);
            let mut trends = self.trends.lock().unwrap_or_else(|p| p.into_inner());
            trends.sample(now, &history.streams, history.pool.as_ref(), &new_changes);
            trends.sample_claims(now, &claims);
            let streams = &history.streams;
            trends.retain(|stream| {
                streams
                    .binary_search_by(|r| r.stream_id.as_str().cmp(stream))
                    .is_ok()
            });
            history.sampled_ms = new_changes
                .iter()
                .map(|c| c.at_ms)
                .fold(history.sampled_ms, i64::max);
        }
        let mut streams = history.streams.clone();
        {
            // One lookup per row: the tally is kept up to date as gaps arrive.
            let gaps = self.gaps.lock().unwrap_or_else(|p| p.into_inner());
            for row in &mut streams {
                row.gaps = gaps.tally(&row.stream_id);
            }
        }
        let presence = &history.presence;
        let workers = workers(&streams, presence, &sidecars);
        let mut sources: Vec<SourceHealth> = [LEASE_SOURCE, POOL_SOURCE, SIDECAR_SOURCE]
            .iter()
            .filter_map(|name| history.health.get(name).cloned())
            .collect();
        sources.retain(|s| s.configured);
        Snapshot {
            taken_at_ms: now,
            streams,
            workers,
            sidecars,
            sidecar_bytes_read,
            pool: history.pool.clone(),
            anomalies: history.anomalies.clone(),
            sources,
        }
    }

    /// Turns one successful lease read into rows, presence, lag samples and
    /// ownership changes.
    fn judge(
        &self,
        history: &mut History,
        table: &LeaseTable,
        sidecars: &[SidecarReport],
        now: i64,
    ) {
        let thresholds = self.settings.thresholds;
        // Lag only as the owner's own sidecar reports it: another sidecar's
        // figure for the stream is a previous owner's, and stale.
        let mut lag_by_owner: HashMap<(&str, &str), Lag> = HashMap::new();
        for report in sidecars {
            let Some(status) = &report.status else {
                continue;
            };
            let Some(owner) = &status.owner_id else {
                continue;
            };
            for (stream, lag) in &status.lag {
                lag_by_owner.insert(
                    (owner.as_str(), stream.as_str()),
                    Lag {
                        events: lag.lag_events,
                        seconds: lag.lag_seconds,
                        last_event_age: lag.last_event_age_seconds,
                    },
                );
            }
        }
        let mut streams = Vec::with_capacity(table.streams.len() + table.malformed.len());
        for lease in &table.streams {
            let lag = lease
                .owner_id
                .as_deref()
                .and_then(|owner| lag_by_owner.get(&(owner, lease.stream_id.as_str())))
                .copied();
            streams.push(history.lag.row(lease, lag, now, &thresholds));
        }
        streams.extend(table.malformed_streams().map(malformed_row));
        let presence: HashMap<String, LeaseState> = table
            .presence
            .iter()
            .map(|presence| (presence.worker.clone(), presence.lease.state(now)))
            .collect();
        // Sorted by id (stable: rows with one unreadable id keep scan order).
        streams.sort_by(|a, b| a.stream_id.cmp(&b.stream_id));
        history.lag.retain(|stream| {
            streams
                .binary_search_by(|r| r.stream_id.as_str().cmp(stream))
                .is_ok()
        });
        self.changes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(table.streams.iter(), now);
        history.streams = streams;
        history.presence = presence;
    }

    /// Refreshes until `shutdown`, every [`Collector::interval`]: every
    /// `settings.refresh` while the table is small, less often as it grows.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        leasehold_platform::periodic::paced(shutdown, || async {
            self.refresh().await;
            self.interval()
        })
        .await
    }
}

/// The claim latencies (seconds) the sidecars report that the trends have
/// not counted yet, by each sidecar's claim numbering (`seen`: sidecar URL →
/// newest `seq` counted). A sidecar seen for the first time, or restarted
/// (its numbering went back), contributes only the claims younger than
/// `since_previous_ms` (none on the dashboard's first refresh: those claims
/// happened before it was watching). `seen` keeps only the sidecars in
/// `sidecars`, so it is bounded like them.
fn new_claims(
    seen: &mut HashMap<String, u64>,
    sidecars: &[SidecarReport],
    since_previous_ms: Option<i64>,
) -> Vec<f64> {
    let mut latencies = Vec::new();
    for report in sidecars {
        let Some(status) = &report.status else {
            continue;
        };
        let claims = &status.claims;
        let newest = claims.last().map_or(0, |c| c.seq);
        match seen.get(&report.url).copied() {
            Some(counted) if newest >= counted => {
                latencies.extend(claims.iter().filter(|c| c.seq > counted).map(|c| c.seconds))
            }
            _ => {
                let window = since_previous_ms.unwrap_or(0).max(0) as u64;
                latencies.extend(
                    claims
                        .iter()
                        .filter(|c| c.age_ms < window)
                        .map(|c| c.seconds),
                );
            }
        }
        seen.insert(report.url.clone(), newest);
    }
    seen.retain(|url, _| sidecars.iter().any(|report| &report.url == url));
    latencies
}

/// `"3 of 200 sidecars did not answer (2 no answer in time, 1 unreachable)"`,
/// or `None` when all answered: the fixed categories with their counts, so
/// the page says when the refresh's deadline or byte budget cut the poll short.
fn silent_summary(sidecars: &[SidecarReport]) -> Option<String> {
    let mut problems: BTreeMap<&str, usize> = BTreeMap::new();
    for report in sidecars {
        if let Some(error) = &report.error {
            *problems.entry(error.as_str()).or_default() += 1;
        }
    }
    let silent: usize = problems.values().sum();
    (silent > 0).then(|| {
        let parts: Vec<String> = problems
            .iter()
            .map(|(problem, count)| format!("{count} {problem}"))
            .collect();
        format!(
            "{silent} of {} sidecars did not answer ({})",
            sidecars.len(),
            parts.join(", ")
        )
    })
}

/// How many `stream:token` pairs a worker row carries.
const TOKENS_PER_WORKER: usize = 50;

fn workers(
    streams: &[StreamRow],
    presence: &HashMap<String, LeaseState>,
    sidecars: &[SidecarReport],
) -> Vec<WorkerRow> {
    let mut rows: BTreeMap<String, WorkerRow> = BTreeMap::new();
    let blank = |owner: &str| WorkerRow {
        owner_id: owner.to_owned(),
        streams_held: 0,
        streams_expired: 0,
        tokens: Vec::new(),
        presence: None,
        sidecar_url: None,
        worker_up: None,
        last_event_age_ms: None,
        component: None,
        sink_events_fenced: None,
        leases_lost: None,
        observer: false,
    };
    for stream in streams {
        let Some(owner) = &stream.owner_id else {
            continue;
        };
        let row = rows.entry(owner.clone()).or_insert_with(|| blank(owner));
        row.streams_held += 1;
        if stream.state == crate::model::streams::StreamState::Expired {
            row.streams_expired += 1;
        }
        if row.tokens.len() < TOKENS_PER_WORKER {
            row.tokens
                .push((stream.stream_id.clone(), stream.fence_token));
        }
    }
    for (owner, state) in presence {
        rows.entry(owner.clone())
            .or_insert_with(|| blank(owner))
            .presence = Some(*state);
    }
    for report in sidecars {
        let Some(status) = &report.status else {
            continue;
        };
        let owner = status
            .owner_id
            .clone()
            .unwrap_or_else(|| format!("(unknown worker at {})", report.url));
        let row = rows.entry(owner.clone()).or_insert_with(|| blank(&owner));
        row.sidecar_url = Some(report.url.clone());
        row.worker_up = Some(status.worker_up);
        row.last_event_age_ms = status.last_event_age_ms;
        row.component = status.component.clone();
        row.sink_events_fenced = Some(status.sink_events_fenced);
        row.leases_lost = Some(status.leases_lost);
        row.observer = status.observer;
    }
    // A worker that left (presence released or expired, nothing held, no
    // sidecar answering for it) is history, not part of the cluster: without
    // this, every restart would add a row forever.
    rows.into_values()
        .filter(|row| {
            row.streams_held > 0
                || row.sidecar_url.is_some()
                || row.presence == Some(LeaseState::Owned)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use leasehold_control::clock::PausedClock;
    use leasehold_control::lease::Lease;
    use leasehold_control::store::memory::MemoryLeaseStore;
    use leasehold_control::store::{Consistency, LeaseError, LeasePage, LeaseStore};

    use super::*;

    /// Counts full scans (first pages) and remembers the consistency asked for.
    struct Counting {
        inner: MemoryLeaseStore,
        scans: AtomicU32,
        strong_pages: AtomicU32,
    }

    #[async_trait::async_trait]
    impl LeaseReader for Counting {
        async fn get_with(&self, id: &str, consistency: Consistency) -> Result<Lease, LeaseError> {
            self.inner.get_with(id, consistency).await
        }
        async fn list_with(
            &self,
            after: Option<&str>,
            limit: usize,
            consistency: Consistency,
        ) -> Result<LeasePage, LeaseError> {
            if after.is_none() {
                self.scans.fetch_add(1, Ordering::SeqCst);
            }
            if consistency.is_strong() {
                self.strong_pages.fetch_add(1, Ordering::SeqCst);
            }
            self.inner.list_with(after, limit, consistency).await
        }
    }

    async fn scans_in(records: usize, seconds: u64) -> (u32, Duration, u32) {
        let store = MemoryLeaseStore::new();
        for i in 0..records {
            store.register(&format!("s-{i:05}"), 0).await.unwrap();
        }
        let leases = Arc::new(Counting {
            inner: store,
            scans: AtomicU32::new(0),
            strong_pages: AtomicU32::new(0),
        });
        let settings = CollectorSettings {
            refresh: Duration::from_secs(1),
            scan_items_per_second: 1_000,
            ..CollectorSettings::default()
        };
        let collector = Arc::new(Collector::new(
            Sources {
                leases: leases.clone(),
                pool: None,
                sidecars: Vec::new(),
                discovery: DiscoveryPolicy::default(),
            },
            settings,
            Arc::new(PausedClock::starting_at(1_800_000_000_000)),
        ));
        let stop = CancellationToken::new();
        let task = tokio::spawn(collector.clone().run(stop.clone()));
        tokio::time::sleep(Duration::from_millis(seconds * 1000 + 500)).await;
        stop.cancel();
        task.await.unwrap();
        (
            leases.scans.load(Ordering::SeqCst),
            collector.interval(),
            leases.strong_pages.load(Ordering::SeqCst),
        )
    }

    fn reporting(url: &str, claims: &[(u64, u64, f64)]) -> SidecarReport {
        let claims: Vec<serde_json::Value> = claims
            .iter()
            .map(|(seq, age_ms, seconds)| {
                serde_json::json!({"seq": seq, "age_ms": age_ms, "seconds": seconds})
            })
            .collect();
        let status = serde_json::json!({
            "component": "broker-worker", "owner_id": "p", "worker_connected": true,
            "last_event_age_ms": 1, "worker_up": true, "events_received": 1,
            "events_dropped": 0, "leases": [], "lag": {}, "websocket_connections": 0,
            "pool": null, "observer": false, "claims": claims,
        });
        SidecarReport {
            url: url.into(),
            status: Some(serde_json::from_value(status).unwrap()),
            error: None,
        }
    }

    #[test]
    fn claims_are_counted_once_across_refreshes_and_restarts() {
        let mut seen = HashMap::new();
        let a = "http://10.0.0.1:9464";
        // The dashboard's first refresh: what happened before is not counted.
        let first = new_claims(&mut seen, &[reporting(a, &[(1, 50, 0.3)])], None);
        assert!(first.is_empty());
        // The next refresh: only the new claim.
        let next = new_claims(
            &mut seen,
            &[reporting(a, &[(1, 2_050, 0.3), (2, 10, 0.7)])],
            Some(2_000),
        );
        assert_eq!(next, vec![0.7]);
        let again = new_claims(
            &mut seen,
            &[reporting(a, &[(1, 4_050, 0.3), (2, 2_010, 0.7)])],
            Some(2_000),
        );
        assert!(again.is_empty(), "nothing counted twice");
        // Restarted (numbering back to 1) and a newcomer: only claims since
        // the previous refresh.
        let b = "http://10.0.0.2:9464";
        let restarted = new_claims(
            &mut seen,
            &[
                reporting(a, &[(1, 100, 1.5)]),
                reporting(b, &[(7, 9_000, 9.0), (8, 500, 2.5)]),
            ],
            Some(2_000),
        );
        assert_eq!(restarted, vec![1.5, 2.5]);
        // Bounded by the sidecars of the refresh.
        new_claims(&mut seen, &[reporting(b, &[])], Some(2_000));
        assert_eq!(seen.len(), 1);
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
}
