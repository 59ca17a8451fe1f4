//! The sidecar's picture of its worker, built from the events it receives: who
//! it is, whether it is alive, which leases it holds. Served as `/status` and
//! turned into the worker gauges.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use leasehold_control::schema::{RESERVED_PREFIX, SESSION_PREFIX};
use leasehold_telemetry::TelemetryEvent;
use leasehold_telemetry::status::{
    BackfillSample, ClaimSample, GapSample, HeldLease, PoolState, RECENT_BACKFILLS, RECENT_CLAIMS,
    RECENT_GAPS, Status, StreamLag, UpstreamConnection,
};
use tokio::time::Instant;

/// Everything the sidecar knows about its worker.
#[derive(Debug)]
pub struct WorkerView {
    silence: Duration,
    component: Option<String>,
    owner_id: Option<String>,
    connections: usize,
    last_event: Option<Instant>,
    events: u64,
    dropped: u64,
    fenced: u64,
    lost: u64,
    leases: BTreeMap<String, HeldLease>,
    /// Each held stream's last lag report and when it came.
    lag: BTreeMap<String, (StreamLag, Instant)>,
    upstreams: BTreeMap<String, usize>,
    /// The worker's latest `upstream_connections` report: open connections,
    /// and the held streams on them.
    upstream_report: Option<(u64, u64)>,
    /// The connections that report listed (the oldest ones).
    upstream_listed: Vec<UpstreamConnection>,
    /// The connection carrying each stream, from its latest subscription.
    carriers: BTreeMap<String, u64>,
    /// Connects that waited for the connect budget, since the sidecar started.
    connects_throttled: u64,
    pool: Option<PoolState>,
    /// The newest claims taken (seq, when, latency in seconds), at most
    /// [`RECENT_CLAIMS`]; kept across worker changes (a pool sidecar serves a
    /// succession of pool workers), numbered by `claims_seen`.
    claims: VecDeque<(u64, Instant, f64)>,
    claims_seen: u64,
    /// The newest data gaps (when, and the record with its seq), at most
    /// [`RECENT_GAPS`], numbered by `gaps_seen`; kept across workers like claims.
    gaps: VecDeque<(Instant, GapSample)>,
    gaps_seen: u64,
    /// The newest finished backfills (when, and the record), at most
    /// [`RECENT_BACKFILLS`]; kept across workers like gaps.
    backfills: VecDeque<(Instant, BackfillSample)>,
    /// The worker process's CPU seconds at its last heartbeat, and the
    /// fraction of a second not yet added to the counter.
    cpu_seen: f64,
    cpu_carry: f64,
}

/// The upstream connection gauges of one worker
/// (`leasehold_upstream_connections{worker}`,
/// `leasehold_upstream_streams_per_connection`).
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamConnections {
    /// The worker's id (`OWNER_ID`, from its heartbeats).
    pub worker: String,
    /// Upstream connections it has open.
    pub connections: u64,
    /// Mean held streams per open connection (0 with none open).
    pub streams_per_connection: f64,
}

impl WorkerView {
    /// A view that calls the worker down after `silence` without events.
    pub fn new(silence: Duration) -> Self {
        WorkerView {
            silence,
            component: None,
            owner_id: None,
            connections: 0,
            last_event: None,
            events: 0,
            dropped: 0,
            fenced: 0,
            lost: 0,
            leases: BTreeMap::new(),
            lag: BTreeMap::new(),
            upstreams: BTreeMap::new(),
            upstream_report: None,
            upstream_listed: Vec::new(),
            carriers: BTreeMap::new(),
            connects_throttled: 0,
            pool: None,
            claims: VecDeque::new(),
            claims_seen: 0,
            gaps: VecDeque::new(),
            gaps_seen: 0,
            backfills: VecDeque::new(),
            cpu_seen: 0.0,
            cpu_carry: 0.0,
        }
    }

    /// Whole CPU seconds the worker used since its previous heartbeat, for
    /// `leasehold_worker_cpu_seconds_total`. A value below the last one is a new
    /// worker process (a restarted container keeps its task's `OWNER_ID`): its
    /// CPU counts from zero, so the counter never goes back.
    pub fn worker_cpu_seconds(&mut self, cpu_seconds: f64) -> u64 {
        let used = if cpu_seconds < self.cpu_seen {
            cpu_seconds
        } else {
            cpu_seconds - self.cpu_seen
        };
        self.cpu_seen = cpu_seconds;
        self.cpu_carry += used.max(0.0);
        let whole = self.cpu_carry.floor();
        self.cpu_carry -= whole;
        whole as u64
    }

    /// A worker connection opened or closed.
    pub fn connection(&mut self, opened: bool) {
        if opened {
            self.connections += 1;
        } else {
            self.connections = self.connections.saturating_sub(1);
        }
    }

    /// Keeps one gap (or, listed with them, a reset) for `/status`.
    fn record_gap(
        &mut self,
        stream_id: &str,
        from_seq: u64,
        to_seq: u64,
        reason: leasehold_telemetry::GapReason,
    ) {
        self.gaps_seen += 1;
        if self.gaps.len() == RECENT_GAPS {
            self.gaps.pop_front();
        }
        let sample = GapSample {
            seq: self.gaps_seen,
            age_ms: 0,
            stream_id: stream_id.to_owned(),
            from_seq,
            to_seq,
            reason,
        };
        self.gaps.push_back((Instant::now(), sample));
    }

    /// Folds one event into the view.
    pub fn apply(&mut self, event: &TelemetryEvent) {
        use TelemetryEvent::*;
        self.last_event = Some(Instant::now());
        self.events += 1;
        // Counted apart from the state changes below: a loss for an older token
        // changes no state but is still a loss, and fenced writes are the zombie
        // writes the sink refused (what on-call wants to see after a pause).
        match event {
            SinkWrite { fenced, .. } => self.fenced += fenced,
            LeaseLost { .. } => self.lost += 1,
            // As `leasehold_pool_claim_duration_seconds`: claims taken only.
            PoolClaim {
                result: leasehold_telemetry::labels::ClaimResult::Claimed,
                duration,
                ..
            } => {
                self.claims_seen += 1;
                if self.claims.len() == RECENT_CLAIMS {
                    self.claims.pop_front();
                }
                self.claims
                    .push_back((self.claims_seen, Instant::now(), duration.as_secs_f64()));
            }
            StreamGap {
                stream_id,
                from_seq,
                to_seq,
                reason,
            } => self.record_gap(stream_id, *from_seq, *to_seq, *reason),
            // Listed with the gaps: a reader's state does not continue either.
            StreamReset {
                stream_id,
                from_seq,
                to_seq,
                ..
            } => self.record_gap(
                stream_id,
                *from_seq,
                *to_seq,
                leasehold_telemetry::GapReason::Reset,
            ),
            StreamBackfill {
                stream_id,
                result,
                pages,
                events,
                duration,
            } => {
                if self.backfills.len() == RECENT_BACKFILLS {
                    self.backfills.pop_front();
                }
                let sample = BackfillSample {
                    age_ms: 0,
                    stream_id: stream_id.clone(),
                    result: *result,
                    pages: *pages,
                    events: *events,
                    seconds: duration.as_secs_f64(),
                };
                self.backfills.push_back((Instant::now(), sample));
            }
            _ => {}
        }
        match event {
            WorkerHeartbeat {
                component,
                owner_id,
                ..
            } => {
                // A new worker behind this sidecar (a restarted container, a new
                // `dev` generation): the old one's leases, lag and counts are not its.
                if self
                    .owner_id
                    .as_ref()
                    .is_some_and(|known| known != owner_id)
                {
                    self.leases.clear();
                    self.lag.clear();
                    self.upstreams.clear();
                    self.upstream_report = None;
                    self.upstream_listed.clear();
                    self.carriers.clear();
                    self.fenced = 0;
                    self.lost = 0;
                    self.pool = None;
                }
                self.component = Some(component.clone());
                self.owner_id = Some(owner_id.clone());
            }
            LeaseAcquired {
                stream_id,
                fence_token,
                expires_at_ms,
                ..
            }
            | LeaseRenewed {
                stream_id,
                fence_token,
                expires_at_ms,
                ..
            } => {
                self.leases.insert(
                    stream_id.clone(),
                    HeldLease {
                        stream_id: stream_id.clone(),
                        fence_token: *fence_token,
                        expires_at_ms: *expires_at_ms,
                    },
                );
            }
            LeaseLost {
                stream_id,
                fence_token,
                ..
            }
            | LeaseReleased {
                stream_id,
                fence_token,
            } if self
                .leases
                .get(stream_id)
                .is_some_and(|l| l.fence_token == *fence_token) =>
            {
                self.leases.remove(stream_id);
                // The stream's series go with the lease: a figure for a
                // stream this worker no longer writes is a stale one.
                self.lag.remove(stream_id);
                self.carriers.remove(stream_id);
            }
            StreamLag {
                stream_id,
                lag_events,
                lag_seconds,
                last_event_age_seconds,
                ..
            } => {
                let lag = self::StreamLag {
                    lag_events: *lag_events,
                    lag_seconds: *lag_seconds,
                    last_event_age_seconds: Some(*last_event_age_seconds),
                    connection: None,
                };
                self.lag.insert(stream_id.clone(), (lag, Instant::now()));
            }
            StreamStopped { stream_id } => {
                self.lag.remove(stream_id);
                self.carriers.remove(stream_id);
            }
            UpstreamConnected { stream_id, .. } => {
                *self.upstreams.entry(stream_id.clone()).or_default() += 1
            }
            UpstreamDisconnected { stream_id } => {
                self.carriers.remove(stream_id);
                if let Some(open) = self.upstreams.get_mut(stream_id) {
                    *open = open.saturating_sub(1);
                    if *open == 0 {
                        self.upstreams.remove(stream_id);
                    }
                }
            }
            UpstreamConnections {
                connections,
                streams,
                open,
            } => {
                self.upstream_report = Some((*connections, *streams));
                self.upstream_listed.clone_from(open);
            }
            UpstreamSubscribed {
                stream_id,
                connection: Some(connection),
                ..
            } => {
                self.carriers.insert(stream_id.clone(), *connection);
            }
            UpstreamConnectThrottled { .. } => self.connects_throttled += 1,
            EventsDropped { count } => self.dropped += count,
            PoolWorkerState {
                worker_id,
                state,
                user_id,
            } => {
                self.pool = Some(PoolState {
                    worker_id: worker_id.clone(),
                    state: state.as_str().to_owned(),
                    user_id: user_id.clone(),
                });
            }
            _ => {}
        }
    }

    /// Connected and heard from within the silence threshold.
    pub fn worker_up(&self) -> bool {
        self.connections > 0
            && self
                .last_event
                .is_some_and(|at| at.elapsed() < self.silence)
    }

    /// Stream leases held (reserved records left out).
    pub fn stream_leases_held(&self) -> usize {
        self.leases
            .keys()
            .filter(|id| !id.starts_with(RESERVED_PREFIX))
            .count()
    }

    /// Open upstream connections.
    pub fn websocket_connections(&self) -> usize {
        self.upstreams.values().sum()
    }

    /// What the upstream connection gauges say now, once the worker has
    /// reported its connections and named itself (its heartbeat's `owner_id`,
    /// the `worker` label): its latest report while it is up, nothing open
    /// while it is silent or disconnected (a crashed worker's connections are
    /// gone; a paused one's are of no use). `None` for a worker that never
    /// reported (a broker worker, a stream worker before its first connect).
    pub fn upstream_connections(&self) -> Option<UpstreamConnections> {
        let (connections, streams) = self.upstream_report?;
        let worker = self.owner_id.clone()?;
        let (connections, streams) = if self.worker_up() {
            (connections, streams)
        } else {
            (0, 0)
        };
        Some(UpstreamConnections {
            worker,
            connections,
            streams_per_connection: if connections == 0 {
                0.0
            } else {
                streams as f64 / connections as f64
            },
        })
    }

    /// Streams whose per-stream series are exported: held, not stopped, and
    /// reported by a worker that is up. A silent or disconnected worker's
    /// streams are being taken over; their last figures would say "fresh".
    pub fn lag_streams(&self) -> Vec<String> {
        if !self.worker_up() {
            return Vec::new();
        }
        self.lag.keys().cloned().collect()
    }

    /// The held leases as their holder means them: in session mode a
    /// stream's own record keeps its acquire-time expiry and lives by the
    /// session's, which the session record's renewals carry.
    fn held_leases(&self) -> Vec<HeldLease> {
        let session_expiry = self
            .leases
            .iter()
            .find(|(id, _)| id.starts_with(SESSION_PREFIX))
            .map(|(_, session)| session.expires_at_ms);
        self.leases
            .values()
            .map(|lease| match session_expiry {
                Some(session) if !lease.stream_id.starts_with(RESERVED_PREFIX) => HeldLease {
                    expires_at_ms: lease.expires_at_ms.max(session),
                    ..lease.clone()
                },
                _ => lease.clone(),
            })
            .collect()
    }

    /// The lag reports as of now: ages grow from the report's time (a worker
    /// that stopped reporting leaves no frozen "0.2 s ago"), none while the
    /// worker is down.
    fn current_lag(&self) -> BTreeMap<String, StreamLag> {
        if !self.worker_up() {
            return BTreeMap::new();
        }
        self.lag
            .iter()
            .map(|(stream, (lag, at))| {
                let since = at.elapsed().as_secs_f64();
                let lag = StreamLag {
                    lag_events: lag.lag_events,
                    // The oldest unpersisted event keeps ageing until persisted.
                    lag_seconds: if lag.lag_events > 0 {
                        lag.lag_seconds + since
                    } else {
                        lag.lag_seconds
                    },
                    last_event_age_seconds: lag.last_event_age_seconds.map(|age| age + since),
                    connection: self.carriers.get(stream).copied(),
                };
                (stream.clone(), lag)
            })
            .collect()
    }

    /// The component name for `leasehold_build_info`.
    pub fn component(&self) -> Option<&str> {
        self.component.as_deref()
    }

    /// The `/status` body.
    pub fn status(&self) -> Status {
        Status {
            component: self.component.clone(),
            owner_id: self.owner_id.clone(),
            worker_connected: self.connections > 0,
            last_event_age_ms: self.last_event.map(|at| at.elapsed().as_millis() as u64),
            worker_up: self.worker_up(),
            events_received: self.events,
            events_dropped: self.dropped,
            sink_events_fenced: self.fenced,
            leases_lost: self.lost,
            leases: self.held_leases(),
            lag: self.current_lag(),
            websocket_connections: self.websocket_connections(),
            // A silent worker's connections are gone or of no use, as the
            // gauges say (see `upstream_connections`).
            upstream_connections: if self.worker_up() {
                self.upstream_listed.clone()
            } else {
                Vec::new()
            },
            upstream_connects_throttled: self.connects_throttled,
            upstream_connections_open: self.upstream_connections().map_or(0, |u| u.connections),
            pool: self.pool.clone(),
            claims: self
                .claims
                .iter()
                .map(|(seq, at, seconds)| ClaimSample {
                    seq: *seq,
                    age_ms: at.elapsed().as_millis() as u64,
                    seconds: *seconds,
                })
                .collect(),
            gaps: self
                .gaps
                .iter()
                .map(|(at, sample)| GapSample {
                    age_ms: at.elapsed().as_millis() as u64,
                    ..sample.clone()
                })
                .collect(),
            backfills: self
                .backfills
                .iter()
                .map(|(at, sample)| BackfillSample {
                    age_ms: at.elapsed().as_millis() as u64,
                    ..sample.clone()
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_cpu_counts_across_heartbeats_and_restarts() {
        let mut view = WorkerView::new(Duration::from_secs(5));
        // Fractions carry over (binary-exact values keep the sums exact).
        assert_eq!(view.worker_cpu_seconds(0.5), 0);
        assert_eq!(view.worker_cpu_seconds(1.75), 1);
        assert_eq!(view.worker_cpu_seconds(4.0), 3);
        // A new worker process at 0.5 s: counted from zero, never backwards.
        assert_eq!(view.worker_cpu_seconds(0.5), 0);
        assert_eq!(view.worker_cpu_seconds(2.25), 2);
    }

    fn acquired(stream: &str, token: u64) -> TelemetryEvent {
        TelemetryEvent::LeaseAcquired {
            stream_id: stream.into(),
            fence_token: token,
            expires_at_ms: 1_000,
            duration: Duration::from_millis(3),
            takeover_gap: None,
            previous_owner: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn silence_beyond_the_threshold_means_down() {
        let mut view = WorkerView::new(Duration::from_secs(5));
        assert!(!view.worker_up(), "nothing connected yet");
        view.connection(true);
        view.apply(&TelemetryEvent::WorkerHeartbeat {
            component: "stream-worker".into(),
            owner_id: "w1".into(),
            process: None,
        });
        assert!(view.worker_up());
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(!view.worker_up(), "a frozen worker still connected is down");
        view.apply(&TelemetryEvent::EventsDropped { count: 1 });
        assert!(view.worker_up());
        view.connection(false);
        assert!(!view.worker_up(), "a disconnected worker is down");
    }

    #[test]
    fn leases_follow_acquire_loss_and_release() {
        let mut view = WorkerView::new(Duration::from_secs(5));
        view.apply(&acquired("a", 1));
        view.apply(&acquired("b", 4));
        view.apply(&acquired("leasehold#worker#w1", 1));
        assert_eq!(view.stream_leases_held(), 2);
        // A loss report for an older token must not remove the newer lease.
        view.apply(&TelemetryEvent::LeaseLost {
            stream_id: "b".into(),
            fence_token: 3,
            reason: leasehold_telemetry::LossReason::Fenced,
        });
        assert_eq!(view.stream_leases_held(), 2);
        assert_eq!(
            view.status().leases_lost,
            1,
            "a stale loss still counts as a loss"
        );
        view.apply(&TelemetryEvent::SinkWrite {
            stream_id: "a".into(),
            fence_token: 1,
            accepted: 0,
            duplicate: 0,
            fenced: 7,
            duration: Duration::from_millis(1),
        });
        assert_eq!(view.status().sink_events_fenced, 7);
        view.apply(&TelemetryEvent::WorkerHeartbeat {
            component: "stream-worker".into(),
            owner_id: "w1".into(),
            process: None,
        });
        assert_eq!(
            view.status().sink_events_fenced,
            7,
            "same worker, same counts"
        );
        view.apply(&TelemetryEvent::LeaseReleased {
            stream_id: "b".into(),
            fence_token: 4,
        });
        let status = view.status();
        assert_eq!(
            status
                .leases
                .iter()
                .map(|l| l.stream_id.as_str())
                .collect::<Vec<_>>(),
            ["a", "leasehold#worker#w1"]
        );
        view.apply(&TelemetryEvent::WorkerHeartbeat {
            component: "stream-worker".into(),
            owner_id: "w2".into(),
            process: None,
        });
        let status = view.status();
        assert!(status.leases.is_empty(), "w1's leases are not w2's");
        assert_eq!((status.sink_events_fenced, status.leases_lost), (0, 0));
    }

    /// The upstream gauges: the latest report under the worker's own id, 0
    /// while the worker is down, nothing for a worker that never reported
    /// (or never named itself), and a new worker's not the old one's.
    #[tokio::test(start_paused = true)]
    async fn upstream_connections_follow_the_latest_report_of_a_live_worker() {
        let heartbeat = |owner: &str| TelemetryEvent::WorkerHeartbeat {
            component: "stream-worker".into(),
            owner_id: owner.into(),
            process: None,
        };
        let report = |connections, streams| TelemetryEvent::UpstreamConnections {
            connections,
            streams,
            open: Vec::new(),
        };
        let mut view = WorkerView::new(Duration::from_secs(5));
        view.connection(true);
        // Shipped before the first heartbeat: kept until the worker names itself.
        view.apply(&report(2, 7));
        assert_eq!(view.upstream_connections(), None);
        view.apply(&heartbeat("w1"));
        let expected = |worker: &str, connections, streams_per_connection| {
            Some(UpstreamConnections {
                worker: worker.into(),
                connections,
                streams_per_connection,
            })
        };
        assert_eq!(view.upstream_connections(), expected("w1", 2, 3.5));
        view.apply(&report(3, 9));
        assert_eq!(view.upstream_connections(), expected("w1", 3, 3.0));
        view.apply(&report(0, 0));
        assert_eq!(
            view.upstream_connections(),
            expected("w1", 0, 0.0),
            "no division by zero connections"
        );
        view.apply(&report(4, 4));
        // Silent past the threshold: nothing open any more.
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(view.upstream_connections(), expected("w1", 0, 0.0));
        view.apply(&heartbeat("w1"));
        assert_eq!(view.upstream_connections(), expected("w1", 4, 1.0));
        // Another worker behind the sidecar: w1's report is not its.
        view.apply(&heartbeat("w2"));
        assert_eq!(view.upstream_connections(), None);
        view.apply(&report(1, 5));
        assert_eq!(view.upstream_connections(), expected("w2", 1, 5.0));
        // A broker worker never reports upstream connections.
        let mut broker = WorkerView::new(Duration::from_secs(5));
        broker.connection(true);
        broker.apply(&heartbeat("p1"));
        assert_eq!(broker.upstream_connections(), None);
    }

    fn claim(result: leasehold_telemetry::labels::ClaimResult, millis: u64) -> TelemetryEvent {
        TelemetryEvent::PoolClaim {
            worker_id: "p1".into(),
            user_id: Some("u1".into()),
            result,
            duration: Duration::from_millis(millis),
            reason: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn recent_claims_are_numbered_aged_and_bounded() {
        use leasehold_telemetry::labels::ClaimResult;
        let mut view = WorkerView::new(Duration::from_secs(5));
        view.apply(&claim(ClaimResult::Claimed, 250));
        view.apply(&claim(ClaimResult::Invalid, 1));
        tokio::time::advance(Duration::from_secs(2)).await;
        let claims = view.status().claims;
        assert_eq!(claims.len(), 1, "only claims taken count: {claims:?}");
        assert_eq!(claims[0].seq, 1);
        assert_eq!(claims[0].age_ms, 2_000);
        assert!((claims[0].seconds - 0.25).abs() < 1e-9);
        // A new worker behind the sidecar keeps the numbering going.
        view.apply(&TelemetryEvent::WorkerHeartbeat {
            component: "broker-worker".into(),
            owner_id: "p2".into(),
            process: None,
        });
        for _ in 0..RECENT_CLAIMS * 2 {
            view.apply(&claim(ClaimResult::Claimed, 10));
        }
        let claims = view.status().claims;
        assert_eq!(claims.len(), RECENT_CLAIMS, "bounded");
        assert_eq!(claims.last().unwrap().seq, 1 + 2 * RECENT_CLAIMS as u64);
        assert_eq!(claims.first().unwrap().seq, 2 + RECENT_CLAIMS as u64);
    }

    #[tokio::test(start_paused = true)]
    async fn recent_gaps_are_numbered_aged_and_bounded() {
        use leasehold_telemetry::labels::GapReason;
        let mut view = WorkerView::new(Duration::from_secs(5));
        let gap = |from: u64| TelemetryEvent::StreamGap {
            stream_id: "btc-usd".into(),
            from_seq: from,
            to_seq: from + 9,
            reason: GapReason::NoReplay,
        };
        view.apply(&gap(1));
        tokio::time::advance(Duration::from_secs(3)).await;
        let gaps = view.status().gaps;
        assert_eq!(gaps.len(), 1);
        assert_eq!(
            (
                gaps[0].seq,
                gaps[0].age_ms,
                gaps[0].from_seq,
                gaps[0].to_seq
            ),
            (1, 3_000, 1, 10)
        );
        assert_eq!(gaps[0].reason, GapReason::NoReplay);
        for n in 0..RECENT_GAPS as u64 * 2 {
            view.apply(&gap(100 + n * 10));
        }
        let gaps = view.status().gaps;
        assert_eq!(gaps.len(), RECENT_GAPS, "bounded");
        assert_eq!(gaps.last().unwrap().seq, 1 + 2 * RECENT_GAPS as u64);
    }

    fn lag_of(stream: &str, age: f64) -> TelemetryEvent {
        TelemetryEvent::StreamLag {
            stream_id: stream.into(),
            lag_events: 2,
            lag_seconds: 0.5,
            last_event_age_seconds: age,
            event_lag_seconds: None,
        }
    }

    fn held(stream: &str, fence_token: u64) -> TelemetryEvent {
        TelemetryEvent::LeaseAcquired {
            stream_id: stream.into(),
            fence_token,
            expires_at_ms: 0,
            duration: Duration::ZERO,
            takeover_gap: None,
            previous_owner: None,
        }
    }

    /// A stream's series leave with its lease and with its worker: a released
    /// or crashed owner's last figures would say the stream is fresh while
    /// it is being taken over.
    #[tokio::test(start_paused = true)]
    async fn per_stream_figures_go_with_the_lease_and_the_worker_and_age_meanwhile() {
        let mut view = WorkerView::new(Duration::from_secs(5));
        view.connection(true);
        for (stream, token) in [("a", 1), ("b", 2)] {
            view.apply(&held(stream, token));
            view.apply(&lag_of(stream, 0.2));
        }
        assert_eq!(view.lag_streams(), ["a", "b"]);
        // Figures age from the report: a worker that stopped reporting a
        // stream does not keep it at "0.2 s ago".
        tokio::time::advance(Duration::from_secs(3)).await;
        let lag = view.status().lag;
        assert!((lag["a"].last_event_age_seconds.unwrap() - 3.2).abs() < 1e-6);
        assert!(
            (lag["a"].lag_seconds - 3.5).abs() < 1e-6,
            "unpersisted events age too"
        );
        // Released: gone at once.
        view.apply(&TelemetryEvent::LeaseReleased {
            stream_id: "a".into(),
            fence_token: 1,
        });
        assert_eq!(view.lag_streams(), ["b"]);
        assert!(!view.status().lag.contains_key("a"));
        // The worker goes silent (paused, crashed without closing): nothing.
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(view.lag_streams().is_empty());
        assert!(view.status().lag.is_empty());
        // It reports again: its streams are back.
        view.apply(&lag_of("b", 0.1));
        assert_eq!(view.lag_streams(), ["b"]);
        // Disconnected: nothing.
        view.connection(false);
        assert!(view.lag_streams().is_empty());
    }

    /// In session mode the stream records' expiry is their acquire's; the
    /// session's renewals say how long they are held ("expires 26 s ago" on
    /// a stream being written was the acquire-time one).
    #[test]
    fn a_session_streams_expiry_is_its_sessions() {
        let mut view = WorkerView::new(Duration::from_secs(5));
        let lease = |stream: &str, expires_at_ms: i64| TelemetryEvent::LeaseAcquired {
            stream_id: stream.into(),
            fence_token: 1,
            expires_at_ms,
            duration: Duration::ZERO,
            takeover_gap: None,
            previous_owner: None,
        };
        view.apply(&lease("leasehold#session#w1", 10_000));
        view.apply(&lease("s", 10_000));
        view.apply(&TelemetryEvent::LeaseRenewed {
            stream_id: "leasehold#session#w1".into(),
            fence_token: 1,
            expires_at_ms: 40_000,
            duration: Duration::ZERO,
            lateness: Duration::ZERO,
        });
        let expiry = |view: &WorkerView, id: &str| {
            view.status()
                .leases
                .iter()
                .find(|l| l.stream_id == id)
                .map(|l| l.expires_at_ms)
        };
        assert_eq!(expiry(&view, "s"), Some(40_000));
        assert_eq!(expiry(&view, "leasehold#session#w1"), Some(40_000));
        // A per-stream worker (no session record) keeps each stream's own.
        let mut per_stream = WorkerView::new(Duration::from_secs(5));
        per_stream.apply(&lease("s", 10_000));
        assert_eq!(expiry(&per_stream, "s"), Some(10_000));
    }

    /// The connections view's part of `/status`: the listed connections of
    /// a live worker, the connection carrying each held stream until its
    /// lease goes, and the throttled connects.
    #[tokio::test(start_paused = true)]
    async fn status_lists_the_connections_and_which_one_carries_each_held_stream() {
        let mut view = WorkerView::new(Duration::from_secs(5));
        view.connection(true);
        view.apply(&TelemetryEvent::WorkerHeartbeat {
            component: "stream-worker".into(),
            owner_id: "w1".into(),
            process: None,
        });
        let listed = UpstreamConnection {
            id: 2,
            opened_at_ms: 1_760_000_000_000,
            streams: 1,
            replacements: 0,
            subscribe_seconds: Some(0.2),
        };
        view.apply(&TelemetryEvent::UpstreamConnections {
            connections: 1,
            streams: 1,
            open: vec![listed.clone()],
        });
        for stream_id in ["a", "b"] {
            view.apply(&acquired(stream_id, 4));
            view.apply(&TelemetryEvent::StreamLag {
                stream_id: stream_id.into(),
                lag_events: 0,
                lag_seconds: 0.0,
                last_event_age_seconds: 0.1,
                event_lag_seconds: None,
            });
        }
        view.apply(&TelemetryEvent::UpstreamSubscribed {
            stream_id: "a".into(),
            duration: Duration::from_millis(200),
            connection: Some(2),
        });
        view.apply(&TelemetryEvent::UpstreamConnectThrottled {
            stream_id: "b".into(),
            wait: Duration::from_secs(1),
        });
        let status = view.status();
        assert_eq!(status.upstream_connections, vec![listed]);
        assert_eq!(status.upstream_connects_throttled, 1);
        assert_eq!(status.lag["a"].connection, Some(2));
        assert_eq!(status.lag["b"].connection, None, "not subscribed yet");

        view.apply(&TelemetryEvent::LeaseReleased {
            stream_id: "a".into(),
            fence_token: 4,
        });
        view.apply(&TelemetryEvent::StreamLag {
            stream_id: "a".into(),
            lag_events: 0,
            lag_seconds: 0.0,
            last_event_age_seconds: 0.1,
            event_lag_seconds: None,
        });
        assert_eq!(
            view.status().lag["a"].connection,
            None,
            "a released stream is carried by nothing of this worker"
        );
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(
            view.status().upstream_connections.is_empty(),
            "a silent worker's connections are not listed"
        );
    }
}
