//! The snapshot and its history: pure data and pure functions over it (no
//! locks, no I/O), so what a refresh makes of its readings is tested without
//! a clock, a network or a task. `Model::apply` turns one refresh's
//! `Readings` into the next [`Snapshot`]; the collector
//! ([`crate::collector`]) only reads the sources and holds the locks.

pub mod changes;
pub mod connections;
pub mod gaps;
pub mod streams;
pub mod timeline;
pub mod trends;

use std::collections::{BTreeMap, HashMap, HashSet};

use leasehold_control::lease::LeaseState;
use leasehold_control::read::LeaseTable;
use leasehold_pool::read::{AnomalyView, PoolView};
use serde::Serialize;

use crate::model::changes::ChangeLog;
use crate::model::gaps::GapLog;
use crate::model::streams::{Lag, LagHistory, StreamRow, Thresholds, malformed_row};
use crate::model::trends::Trends;
use crate::sources::sidecars::SidecarReport;
use crate::sources::{LEASE_SOURCE, POOL_SOURCE, Readings, SIDECAR_SOURCE};

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
    /// The stream workers' upstream connections, as their sidecars list them.
    pub connections: connections::Connections,
    /// Sidecars that answered or failed.
    pub sidecars: Vec<SidecarReport>,
    /// `/status` bytes this refresh read from all sidecars together (at most
    /// [`crate::CollectorSettings::sidecar_byte_budget`]).
    pub sidecar_bytes_read: usize,
    /// The pool, when a pool source is configured and was read at least once.
    pub pool: Option<PoolView>,
    /// The sweeper's report, likewise.
    pub anomalies: Option<AnomalyView>,
    /// Source health, in a fixed order.
    pub sources: Vec<SourceHealth>,
    /// What the cluster runs as, from its lease table: (what, value) for
    /// the lease mode, the discovery mode with its assigner, the observer.
    pub roles: Vec<(&'static str, String)>,
    /// The maintenance sweeps seen since the dashboard started, newest first
    /// (at most [`SWEEPS_KEPT`]): the pool keeps only the latest report.
    pub sweeps: Vec<SweepSummary>,
}

/// Sweeps kept in [`Snapshot::sweeps`].
pub const SWEEPS_KEPT: usize = 30;

/// One maintenance sweep, as its report said.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepSummary {
    /// When it ran, unix ms.
    pub at_ms: i64,
    /// Only reported, nothing resolved.
    pub dry_run: bool,
    /// Anomalies found, every kind.
    pub found: u64,
    /// Anomalies resolved.
    pub resolved: u64,
    /// Claims put back from dead workers' processing lists.
    pub claims_requeued: u64,
    /// Resolution failures.
    pub errors: usize,
}

impl Snapshot {
    /// What the pool views say without pool data: a dashboard given no pool
    /// source, or one whose pool has not answered yet (the banner names why).
    pub fn no_pool_data(&self) -> String {
        match self.sources.iter().find(|s| s.name == POOL_SOURCE) {
            Some(pool) => format!(
                "No pool data yet: {}.",
                pool.error
                    .as_deref()
                    .unwrap_or("the first read is under way")
            ),
            None => "No pool source (start the dashboard with REDIS_URL).".to_owned(),
        }
    }

    /// A snapshot before the first refresh.
    pub fn empty(now_ms: i64) -> Self {
        Snapshot {
            taken_at_ms: now_ms,
            streams: Vec::new(),
            workers: Vec::new(),
            connections: connections::Connections::default(),
            sidecars: Vec::new(),
            sidecar_bytes_read: 0,
            pool: None,
            anomalies: None,
            sources: Vec::new(),
            roles: Vec::new(),
            sweeps: Vec::new(),
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

/// What the snapshots remember between refreshes, besides the logs pages
/// read while a refresh runs ([`Logs`]).
#[derive(Default)]
pub(crate) struct Model {
    lag: LagHistory,
    /// Rows and presence from the last lease read that worked: shown (marked
    /// stale) while the table cannot be read, never re-judged against a newer
    /// clock, which would turn healthy streams "expired".
    streams: Vec<StreamRow>,
    presence: HashMap<String, LeaseState>,
    /// `sidecar_url` of every presence record in the last good lease read.
    presence_sidecars: Vec<String>,
    /// The cluster's modes and role holders from the last good lease read.
    roles: Vec<(&'static str, String)>,
    /// Maintenance sweeps seen, newest first.
    sweeps: std::collections::VecDeque<SweepSummary>,
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

/// The histories pages read between refreshes (each behind its own lock in
/// the collector), lent to [`Model::apply`] for one refresh.
pub(crate) struct Logs<'a> {
    /// Ownership changes and fenced writes.
    pub(crate) changes: &'a mut ChangeLog,
    /// Downsampled lag, pool and claim samples.
    pub(crate) trends: &'a mut Trends,
    /// Data gaps the sidecars reported.
    pub(crate) gaps: &'a mut GapLog,
}

impl Model {
    /// The `sidecar_url` values workers published, from this refresh's reads
    /// where they worked, else from the last good ones (a source that is down
    /// must not make its sidecars vanish).
    pub(crate) fn published_sidecars<'a>(
        &'a self,
        table: Option<&'a LeaseTable>,
        pool: Option<&'a PoolView>,
    ) -> Vec<&'a str> {
        let presence: Vec<&str> = match table {
            Some(table) => table.sidecar_urls().collect(),
            None => self.presence_sidecars.iter().map(String::as_str).collect(),
        };
        let pool = pool.or(self.pool.as_ref());
        let workers = pool.into_iter().flat_map(|pool| {
            let idle = pool.idle.iter().filter_map(|w| w.sidecar_url.as_deref());
            let claimed = pool.claimed.iter().filter_map(|u| u.sidecar_url.as_deref());
            idle.chain(claimed)
        });
        presence.into_iter().chain(workers).collect()
    }

    /// Sidecars that answered in the previous refresh (asked first in the next).
    pub(crate) fn answered(&self) -> &HashSet<String> {
        &self.answered
    }

    /// Folds one refresh's readings into the history and the logs, and
    /// returns the snapshot pages show until the next refresh.
    pub(crate) fn apply(
        &mut self,
        logs: Logs<'_>,
        readings: Readings,
        thresholds: &Thresholds,
    ) -> Snapshot {
        let now = readings.now_ms;
        let table = match readings.leases {
            Ok(table) => {
                self.presence_sidecars = table.sidecar_urls().map(str::to_owned).collect();
                self.roles = roles(&table, now);
                self.mark(LEASE_SOURCE, true, None, now);
                Some(table)
            }
            Err(err) => {
                self.mark(LEASE_SOURCE, true, Some(err), now);
                None
            }
        };
        match readings.pool {
            Some(Ok((view, anomalies))) => {
                self.mark(POOL_SOURCE, true, None, now);
                self.pool = Some(view);
                if let Some(report) = &anomalies.report {
                    self.saw_sweep(report);
                }
                self.anomalies = Some(anomalies);
            }
            Some(Err(err)) => self.mark(POOL_SOURCE, true, Some(err), now),
            None => self.mark(POOL_SOURCE, false, None, now),
        }
        let polled = readings.sidecars;
        let sidecars = polled.reports;
        self.answered = sidecars
            .iter()
            .filter(|report| report.status.is_some())
            .map(|report| report.url.clone())
            .collect();
        let silent = silent_summary(&sidecars);
        let configured = polled.overridden || !sidecars.is_empty() || polled.refused.is_some();
        let sidecar_error = match (silent, polled.refused) {
            (Some(silent), Some(refused)) => Some(format!("{silent}; {refused}")),
            (silent, refused) => silent.or(refused),
        };
        self.mark(SIDECAR_SOURCE, configured, sidecar_error, now);
        // Gaps are dated from when the sidecars answered (`age_ms` counts to
        // their answer), which is after `now` by up to the sidecar timeout.
        logs.gaps.observe(&sidecars, polled.polled_ms.max(now));

        if let Some(table) = table {
            self.judge(logs.changes, &table, &sidecars, thresholds, now);
        }
        logs.changes.observe_fenced(
            sidecars.iter().filter_map(|report| {
                let status = report.status.as_ref()?;
                Some((status.owner_id.as_deref()?, status.sink_events_fenced))
            }),
            now,
        );
        let new_changes = logs.changes.since(self.sampled_ms + 1);
        let claims = new_claims(
            &mut self.claims_seen,
            &sidecars,
            self.previous_ms.map(|previous| now - previous),
        );
        self.previous_ms = Some(now);
        let trends = logs.trends;
        trends.sample(now, &self.streams, self.pool.as_ref(), &new_changes);
        trends.sample_claims(now, &claims);
        let streams = &self.streams;
        trends.retain(|stream| {
            streams
                .binary_search_by(|r| r.stream_id.as_str().cmp(stream))
                .is_ok()
        });
        self.sampled_ms = new_changes
            .iter()
            .map(|c| c.at_ms)
            .fold(self.sampled_ms, i64::max);
        let mut streams = self.streams.clone();
        // One lookup per row: the tally is kept up to date as gaps arrive.
        for row in &mut streams {
            row.gaps = logs.gaps.tally(&row.stream_id);
            row.verdict = streams::with_losses(row, now, thresholds);
        }
        let workers = workers(&streams, &self.presence, &sidecars);
        let connections = connections::Connections::from_sidecars(&sidecars);
        let mut sources: Vec<SourceHealth> = [LEASE_SOURCE, POOL_SOURCE, SIDECAR_SOURCE]
            .iter()
            .filter_map(|name| self.health.get(name).cloned())
            .collect();
        sources.retain(|s| s.configured);
        Snapshot {
            taken_at_ms: now,
            streams,
            workers,
            connections,
            sidecars,
            sidecar_bytes_read: polled.bytes_read,
            pool: self.pool.clone(),
            anomalies: self.anomalies.clone(),
            sources,
            roles: self.roles.clone(),
            sweeps: self.sweeps.iter().cloned().collect(),
        }
    }

    /// Keeps a sweep's summary the first time its report is read.
    fn saw_sweep(&mut self, report: &leasehold_pool::read::SweepReport) {
        let at_ms = report.at as i64;
        if self
            .sweeps
            .front()
            .is_some_and(|newest| newest.at_ms >= at_ms)
        {
            return;
        }
        self.sweeps.push_front(SweepSummary {
            at_ms,
            dry_run: report.dry_run,
            found: report.found.values().sum(),
            resolved: report.resolved.values().sum(),
            claims_requeued: report.claims_requeued,
            errors: report.errors.len(),
        });
        self.sweeps.truncate(SWEEPS_KEPT);
    }

    fn mark(&mut self, name: &'static str, configured: bool, error: Option<String>, now: i64) {
        let entry = self.health.entry(name).or_insert(SourceHealth {
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

    /// Turns one successful lease read into rows, presence, lag samples and
    /// ownership changes.
    fn judge(
        &mut self,
        changes: &mut ChangeLog,
        table: &LeaseTable,
        sidecars: &[SidecarReport],
        thresholds: &Thresholds,
        now: i64,
    ) {
        // Lag only as the owner's own sidecar reports it: another sidecar's
        // figure for the stream is a previous owner's, and stale.
        let mut lag_by_owner: HashMap<(&str, &str), (Lag, Option<u64>)> = HashMap::new();
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
                    (
                        Lag {
                            events: lag.lag_events,
                            seconds: lag.lag_seconds,
                            last_event_age: lag.last_event_age_seconds,
                        },
                        lag.connection,
                    ),
                );
            }
        }
        let mut streams = Vec::with_capacity(table.streams.len() + table.malformed.len());
        for lease in &table.streams {
            let reported = lease
                .owner_id
                .as_deref()
                .and_then(|owner| lag_by_owner.get(&(owner, lease.stream_id.as_str())))
                .copied();
            let mut row = self
                .lag
                .row(lease, reported.map(|(lag, _)| lag), now, thresholds);
            row.upstream_connection = reported.and_then(|(_, connection)| connection);
            streams.push(row);
        }
        streams.extend(table.malformed_streams().map(malformed_row));
        let presence: HashMap<String, LeaseState> = table
            .presence
            .iter()
            .map(|presence| (presence.worker.clone(), presence.lease.state(now)))
            .collect();
        // Sorted by id (stable: rows with one unreadable id keep scan order).
        streams.sort_by(|a, b| a.stream_id.cmp(&b.stream_id));
        self.lag.retain(|stream| {
            streams
                .binary_search_by(|r| r.stream_id.as_str().cmp(stream))
                .is_ok()
        });
        changes.observe(table.streams.iter(), now);
        self.streams = streams;
        self.presence = presence;
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

/// What the lease table says the cluster runs as: session mode when any
/// session record or session-held stream exists; assigned discovery while an
/// assigner holds its lease; the observer holding its lease.
fn roles(table: &LeaseTable, now: i64) -> Vec<(&'static str, String)> {
    use leasehold_control::schema::{ASSIGNER_LEASE, OBSERVER_LEASE, SESSION_PREFIX};
    let held_by = |id: &str| {
        table
            .reserved
            .iter()
            .find(|r| r.stream_id == id && r.state(now) == LeaseState::Owned)
            .and_then(|r| r.owner_id.clone())
    };
    let session = table
        .reserved
        .iter()
        .any(|r| r.stream_id.starts_with(SESSION_PREFIX))
        || table.streams.iter().any(|s| s.session_token.is_some());
    vec![
        (
            "lease mode",
            if session { "session" } else { "per-stream" }.to_owned(),
        ),
        (
            "discovery",
            match held_by(ASSIGNER_LEASE) {
                Some(assigner) => format!("assigned (assigner {assigner})"),
                None => "scan".to_owned(),
            },
        ),
        (
            "observer",
            held_by(OBSERVER_LEASE).unwrap_or_else(|| "none".to_owned()),
        ),
    ]
}

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
        if stream.state == streams::StreamState::Expired {
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
mod tests;
