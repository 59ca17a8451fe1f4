//! The stream worker: discovers streams, acquires its fair share, runs each held
//! stream, hands streams back when over-loaded, and drains on shutdown.
//!
//! Discovery is only a hint: a full scan of the lease table every discovery
//! interval (with jitter) proposes candidates, and the keeper's conditional
//! acquire decides. Three things make hand-overs fast without scanning often:
//! - a **doorbell** (`leasehold#handoff`): a worker that releases streams bumps
//!   it; peers read it every `handoff_poll` (one GetItem) and rescan when it moved;
//! - **expiry probes**: a scan that sees another owner's lease expiring before
//!   the next scan schedules an acquire attempt at expiry + skew margin, so a
//!   crashed owner's streams are taken over as soon as the protocol allows;
//! - **presence leases** (`leasehold#worker#{owner}`), so a new worker that holds
//!   nothing yet still counts in everyone's fair share and receives streams; a
//!   starting worker announces itself and rings the doorbell before its first
//!   scan, so workers started together count each other and peers over their
//!   new share hand back at once;
//! - **pushed hand-offs** (`HANDOFF_LISTEN`, [`crate::handoff`]): a draining
//!   worker sends each stream it released to the least-loaded peer in one
//!   datagram, and that peer acquires it at once, without waiting for its
//!   doorbell poll or a scan.
//!
//! The periodic scan reads eventually consistent (half DynamoDB's read units,
//! the bulk of a fleet's lease-table cost): its proposals are hints the
//! conditional acquire checks, and an expiry it sees a second late only moves a
//! probe. A scan something asked for now — the first one, one the doorbell rang
//! for, one after a held stream ended — reads strongly consistent, so a release
//! a replica has not seen yet cannot push a hand-off back by a whole interval.
//!
//! How much to hold and give back is decided in [`crate::balance`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use leasehold_control::clock::Clock;
use leasehold_control::keeper::{Announcement, HeldLease};
use leasehold_control::lease::{Lease, LeaseState};
use leasehold_control::protocol;
use leasehold_control::read::{self, LeaseTable};
use leasehold_control::schema::{self, HANDOFF_DOORBELL};
use leasehold_control::store::{Consistency, LeaseError, LeaseStore};
use rand::seq::SliceRandom;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use leasehold_control::keeper::LeaseKeeper;
use leasehold_telemetry::TelemetrySink;

use super::settings::StreamWorkerSettings;
use crate::balance::{Census, GiftFate, Gifts, Share};
use crate::discovery::{Action, Discovery, Ended, Input};
use crate::handoff::{self, HandoffSocket, Hint};
use crate::probes::{ExpiryProbes, Probe};
use crate::runner::{Controls, RunnerContext, StreamExit, run_stream_with};
use crate::upstream::history::{BoundedHistory, History, HttpHistory};
use crate::upstream::{SharedUpstream, WebSocketUpstream};
use leasehold_sink::FencedSink;

mod assigned;
mod overlap;
pub use crate::discovery::DiscoveryMode;
use assigned::Offered;
use overlap::PreparedStreams;

/// How a stream worker discovers, balances and drains.
#[derive(Debug, Clone)]
pub struct StreamWorkerConfig {
    /// Most streams this worker holds, whatever its fair share.
    pub max_streams: usize,
    /// Period of the full scan (of the assigner's, and of the index query, in
    /// assigned discovery).
    pub discovery_interval: Duration,
    /// Who scans: every worker, or the elected assigner.
    pub discovery_mode: DiscoveryMode,
    /// Period of the doorbell read.
    pub handoff_poll: Duration,
    /// Budget for finishing in-flight batches on shutdown.
    pub drain_timeout: Duration,
    /// How long a drain waits for a successor to hold a stream before it
    /// releases it anyway (`HANDOFF_PREPARE_TIMEOUT_MS`; zero: no overlap).
    pub handoff_prepare_timeout: Duration,
    /// Streams to register at start (idempotent).
    pub register: Vec<String>,
    /// This worker's sidecar, stored in its presence record (`sidecar_url`) so
    /// the dashboard finds it; `None` leaves the field out.
    pub sidecar_url: Option<String>,
}

impl Default for StreamWorkerConfig {
    /// The settings' defaults (written once, in `crate::settings`).
    fn default() -> Self {
        use crate::settings::{
            DISCOVERY_INTERVAL_MS, DRAIN_TIMEOUT_MS, HANDOFF_POLL_MS, HANDOFF_PREPARE_TIMEOUT_MS,
            MAX_STREAMS,
        };
        StreamWorkerConfig {
            max_streams: MAX_STREAMS.fixed_default(),
            discovery_interval: DISCOVERY_INTERVAL_MS.fixed_default(),
            discovery_mode: DiscoveryMode::default(),
            handoff_poll: HANDOFF_POLL_MS.fixed_default(),
            drain_timeout: DRAIN_TIMEOUT_MS.fixed_default(),
            handoff_prepare_timeout: HANDOFF_PREPARE_TIMEOUT_MS.fixed_default(),
            register: Vec::new(),
            sidecar_url: None,
        }
    }
}

/// What a worker did before it stopped.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DrainReport {
    /// Streams released on shutdown.
    pub released: Vec<String>,
    /// Streams whose release failed (they expire instead).
    pub failed: Vec<(String, String)>,
}

struct Running {
    lease: HeldLease,
    drain: CancellationToken,
    /// An overlapping hand-off's last sequence for this worker to write.
    drain_after: tokio::sync::watch::Sender<Option<u64>>,
    task: JoinHandle<StreamExit>,
}

/// A stream worker. Build it, then [`StreamWorker::run`] until shutdown.
pub struct StreamWorker {
    context: Arc<RunnerContext>,
    clock: Arc<dyn Clock>,
    config: StreamWorkerConfig,
    running: HashMap<String, Running>,
    presence: Option<HeldLease>,
    probes: ExpiryProbes,
    /// Streams this worker handed back, and when: it leaves them to its peers for
    /// a while, or it could win them straight back.
    handed_back: HashMap<String, Instant>,
    /// Hand-backs made to balance, and whether peers took them.
    gifts: Gifts,
    /// Free streams, and since when this worker has seen them free: one free
    /// for a whole discovery interval is one nobody else takes.
    free_since: HashMap<String, Instant>,
    /// The last scan's census, for the share an expiry probe fills up to.
    census: Census,
    /// Where this worker takes pushed hand-offs, if it does.
    handoff: Option<HandoffSocket>,
    /// Peers' hand-off addresses from the last scan (checked, still untrusted).
    peer_addrs: HashMap<String, std::net::SocketAddr>,
    /// The stream ids of the last scan: a pushed id must be one of them.
    known_streams: HashSet<String>,
    /// Assigned discovery: the assigner lease, while this worker holds it.
    assigner: Option<HeldLease>,
    /// Assigned discovery: when the assigner plans again before its interval
    /// (a worker's presence lapses first).
    assigner_due: Option<Instant>,
    /// Assigned discovery: streams handed back, and the worker each is
    /// advised to (pushed there once released).
    handing_to: HashMap<String, String>,
    /// Streams subscribed for a draining peer before it releases them.
    prepared: PreparedStreams,
    /// Streams handed back while running on, until their successor holds
    /// them (an overlapping hand-back).
    releasing: HashMap<String, Overlap>,
    exits_tx: mpsc::UnboundedSender<Exited>,
    exits_rx: mpsc::UnboundedReceiver<Exited>,
}

/// A runner ended: (stream, fence token, how).
type Exited = (String, u64, StreamExit);

impl StreamWorker {
    /// A worker over a runner context (keeper, upstream, sink, telemetry).
    pub fn new(
        context: Arc<RunnerContext>,
        clock: Arc<dyn Clock>,
        config: StreamWorkerConfig,
    ) -> Self {
        let (exits_tx, exits_rx) = mpsc::unbounded_channel();
        StreamWorker {
            context,
            clock,
            config,
            running: HashMap::new(),
            presence: None,
            probes: ExpiryProbes::default(),
            handed_back: HashMap::new(),
            gifts: Gifts::default(),
            free_since: HashMap::new(),
            census: Census::default(),
            handoff: None,
            peer_addrs: HashMap::new(),
            known_streams: HashSet::new(),
            assigner: None,
            assigner_due: None,
            handing_to: HashMap::new(),
            prepared: PreparedStreams::default(),
            releasing: HashMap::new(),
            exits_tx,
            exits_rx,
        }
    }

    /// A worker wired from its settings: a keeper on `store`, the WebSocket
    /// upstream, `sink`, and `telemetry` for every event.
    pub fn from_settings(
        settings: &StreamWorkerSettings,
        store: Arc<dyn LeaseStore>,
        sink: Arc<dyn FencedSink>,
        telemetry: Arc<dyn TelemetrySink>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let keeper = LeaseKeeper::new(
            store,
            clock.clone(),
            telemetry.clone(),
            settings.lease.keeper.clone(),
        );
        let history = settings.history.as_ref().and_then(|config| {
            match HttpHistory::new(config.clone()) {
                Ok(history) => {
                    let bounded = BoundedHistory::new(
                        Arc::new(history),
                        config.concurrency,
                        telemetry.clone(),
                    );
                    Some((Arc::new(bounded) as Arc<dyn History>, config.clone()))
                }
                // Building a TLS client from the public roots does not fail in
                // practice; without one, every backfill records a gap.
                Err(err) => {
                    tracing::error!(error = %err, "cannot build the history client; backfills will record gaps");
                    None
                }
            }
        });
        let context = Arc::new(RunnerContext {
            keeper,
            upstream: if settings.upstream.streams_per_connection > 1 {
                Arc::new(SharedUpstream::new(
                    settings.upstream.clone(),
                    telemetry.clone(),
                ))
            } else {
                Arc::new(WebSocketUpstream::new(
                    settings.upstream.clone(),
                    telemetry.clone(),
                ))
            },
            sink,
            history,
            telemetry,
            config: settings.runner.clone(),
        });
        StreamWorker::new(context, clock, settings.worker.clone())
    }

    /// Takes pushed hand-offs on `socket` and announces its address.
    pub fn with_handoff(mut self, socket: HandoffSocket) -> Self {
        self.handoff = Some(socket);
        self
    }

    /// Streams currently being worked on.
    pub fn held(&self) -> Vec<String> {
        self.running.keys().cloned().collect()
    }

    /// Runs until `shutdown` is cancelled, then drains: stops acquiring, lets each
    /// stream finish its batch within the drain timeout, commits checkpoints,
    /// releases every lease, rings the doorbell.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<DrainReport, LeaseError> {
        for stream in &self.config.register {
            self.context.keeper.register(stream).await?;
        }
        // Announce this worker and wake the peers before looking: workers
        // started together then count each other in their first scan, and
        // peers over their new share hand back now, not a scan later.
        let (mut pushed, listener) = match &self.handoff {
            Some(socket) => {
                let (rx, task) = socket.listen();
                (Some(rx), Some(task))
            }
            None => (None, None),
        };
        self.ensure_presence().await;
        let mut discovery = Discovery::new(
            self.config.discovery_mode,
            self.config.discovery_interval,
            self.config.handoff_poll,
            Instant::now(),
        );
        loop {
            while let Some(action) = discovery.poll_action() {
                self.carry_out(action, &mut discovery).await;
            }
            let next_probe = self.probes.next_due();
            let wake = discovery.poll_timeout();
            let release_due = self.releasing.values().filter_map(|o| o.until).min();
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = sleep_until(release_due.unwrap_or_else(Instant::now)), if release_due.is_some() => {
                    self.release_overdue();
                }
                Some((stream, token, exit)) = self.exits_rx.recv() => {
                    let ended = self.on_exit(&stream, token, exit).await;
                    discovery.handle(Input::StreamEnded(ended), Instant::now());
                }
                _ = sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {
                    discovery.handle_timeout(Instant::now());
                }
                _ = sleep_until(next_probe.unwrap_or_else(Instant::now)), if next_probe.is_some() => {
                    if let Some(probe) = self.probes.pop() {
                        discovery.handle(Input::ProbeDue(probe), Instant::now());
                    }
                }
                Some(hint) = async { pushed.as_mut()?.recv().await }, if pushed.is_some() => {
                    // Every hint already here at once: a drained peer's
                    // streams are taken together, not one round trip each.
                    let mut hints = vec![hint];
                    while let Some(Ok(more)) = pushed.as_mut().map(mpsc::Receiver::try_recv) {
                        hints.push(more);
                    }
                    let mut streams = Vec::new();
                    for hint in hints {
                        match hint {
                            Hint::Take(stream) => streams.push(stream),
                            Hint::Prepare { stream, reply } => self.prepare(stream, reply),
                            Hint::Ready { stream, first_seq, from } => {
                                self.readied(&stream, first_seq, from);
                            }
                        }
                    }
                    if !streams.is_empty() {
                        discovery.handle(Input::Pushed(streams), Instant::now());
                    }
                }
            }
        }
        // Every stream starts finishing its batch while discovery prepares
        // the drain (assigned: one table read to choose successors), unless
        // a successor is to subscribe it first.
        let overlapping = self.overlaps();
        if !overlapping {
            for running in self.running.values() {
                running.drain.cancel();
            }
        }
        discovery.handle(Input::Drain, Instant::now());
        while let Some(action) = discovery.poll_action() {
            self.carry_out(action, &mut discovery).await;
        }
        let report = self.drain(pushed.filter(|_| overlapping)).await;
        if let Some(listener) = listener {
            listener.abort();
        }
        Ok(report)
    }

    /// Whether drains overlap their hand-offs: pushed hand-offs on, a
    /// prepare timeout, and a sequence a successor can be matched by.
    fn overlaps(&self) -> bool {
        self.handoff.is_some()
            && !self.config.handoff_prepare_timeout.is_zero()
            && !self.context.config.seq_source.renumbers()
    }

    /// A draining peer asks this worker to subscribe `stream` before it
    /// releases it. Only a stream of the last scan, and at most as many as
    /// this worker may hold, each kept a bounded time (a forged prepare
    /// costs a subscription at most).
    fn prepare(&mut self, stream: String, reply: std::net::SocketAddr) {
        let Some(socket) = self.handoff.clone() else {
            return;
        };
        // Assigned discovery scans nothing here: a stream is known from the
        // advice, which a peer's drain may precede.
        let known = self.known_streams.contains(&stream)
            || self.config.discovery_mode == DiscoveryMode::Assigned;
        if !self.overlaps() || self.running.contains_key(&stream) || !known {
            return;
        }
        // Kept past the peer's own wait: its release and push come after.
        let keep = self.config.handoff_prepare_timeout * 3 + self.config.drain_timeout;
        self.prepared.prepare(
            self.context.upstream.clone(),
            socket,
            (stream, reply),
            keep,
            self.config.max_streams,
        );
    }

    /// Carries out one of discovery's actions, reporting back what it asks.
    async fn carry_out(&mut self, action: Action, discovery: &mut Discovery) {
        match action {
            Action::ReadDoorbell => {
                let rung = self.read_doorbell().await;
                discovery.handle(Input::DoorbellRead(rung), Instant::now());
            }
            Action::RingDoorbell => self.ring_doorbell().await,
            Action::Scan(consistency) => {
                let pass = self.scan(consistency).await;
                self.pass_done(pass, discovery);
            }
            Action::FollowAssignments => {
                let pass = self.follow_assignments().await;
                self.pass_done(pass, discovery);
            }
            Action::AcquireIfRoom(streams) => self.acquire_if_room(streams).await,
            Action::TakeAdvised { streams, pushed } => {
                let offered = if pushed {
                    Offered::Pushed
                } else {
                    Offered::Assigned
                };
                self.take(streams, offered).await
            }
            Action::ProbeShare(probe) => self.probe(probe).await,
            Action::ChooseSuccessors => self.prepare_assigned_drain().await,
        }
    }

    fn pass_done(&mut self, pass: Result<(), LeaseError>, discovery: &mut Discovery) {
        if let Err(err) = &pass {
            tracing::warn!(error = %err, "discovery pass failed; retrying");
        }
        discovery.handle(
            Input::PassDone {
                succeeded: pass.is_ok(),
                jitter: jitter(),
                due: self.assigner_due.take(),
            },
            Instant::now(),
        );
    }

    async fn read_doorbell(&self) -> u64 {
        match self.context.keeper.reader().get(HANDOFF_DOORBELL).await {
            Ok(record) => record.fence_token,
            Err(_) => 0,
        }
    }

    async fn ring_doorbell(&self) {
        if let Err(err) = self.context.keeper.bump(HANDOFF_DOORBELL).await {
            tracing::warn!(error = %err, "could not ring the hand-off doorbell; peers find released streams on their next scan");
        }
    }

    /// A runner ended: forget it, and say how it ended to discovery (a
    /// stream released with a chosen successor is pushed there now).
    async fn on_exit(&mut self, stream: &str, token: u64, exit: StreamExit) -> Ended {
        if self
            .running
            .get(stream)
            .is_some_and(|r| r.lease.fence_token == token)
        {
            self.running.remove(stream);
        }
        let overlapped = self.releasing.remove(stream);
        match exit {
            StreamExit::Released => match (self.handing_to.remove(stream), overlapped) {
                // Its successor holds it already: pushed straight there.
                (assignee, Some(overlap)) => {
                    if let Some(socket) = &self.handoff {
                        socket.push(overlap.successor, stream).await;
                    }
                    if assignee.is_some() {
                        Ended::HandedOn
                    } else {
                        Ended::Released
                    }
                }
                (Some(assignee), None) => {
                    self.push_to(stream, &assignee).await;
                    Ended::HandedOn
                }
                (None, None) => Ended::Released,
            },
            StreamExit::ReleaseFailed(error) => {
                tracing::warn!(
                    stream_id = stream,
                    error,
                    "release failed; the lease will expire instead"
                );
                Ended::Other
            }
            StreamExit::Lost(reason) => {
                tracing::warn!(stream_id = stream, reason = reason.as_str(), "stream lost");
                Ended::Other
            }
            StreamExit::SinkGaveUp(_) => {
                // Another worker may reach the sink where this one cannot: do
                // not take the stream straight back, and let peers look now.
                self.handed_back.insert(stream.to_owned(), Instant::now());
                Ended::SinkGaveUp
            }
        }
    }

    /// Peers pushed `streams` to this worker (scan discovery): take each now
    /// if it is a stream of the table and there is room (the acquire
    /// decides; a forged or late push costs one refused write).
    async fn acquire_if_room(&mut self, streams: Vec<String>) {
        for stream in streams {
            if self.known_streams.contains(&stream)
                && !self.running.contains_key(&stream)
                && self.running.len() < self.config.max_streams
            {
                self.try_acquire(&stream).await;
            }
        }
    }

    async fn ensure_presence(&mut self) {
        if self.presence.as_ref().is_some_and(HeldLease::is_valid) {
            return;
        }
        let id = schema::worker_presence(&self.context.keeper.config().owner_id);
        let announced = Announcement {
            sidecar_url: self.config.sidecar_url.clone(),
            handoff_addr: self.handoff.as_ref().map(|h| h.advertised().to_string()),
            max_streams: u64::try_from(self.config.max_streams).ok(),
        };
        match self
            .context
            .keeper
            .acquire_announcing(&id, &announced)
            .await
        {
            Ok(lease) => self.presence = Some(lease),
            Err(err) => tracing::warn!(error = %err, "could not announce this worker's presence"),
        }
    }

    /// One discovery pass: count live workers, hand back what is over the fair
    /// share, take free streams up to it, and schedule expiry probes.
    async fn scan(&mut self, consistency: Consistency) -> Result<(), LeaseError> {
        self.ensure_presence().await;
        let table =
            LeaseTable::read(self.context.keeper.reader().as_ref(), 1000, consistency).await?;
        for item in &table.malformed {
            tracing::warn!(error = %item, "skipping a malformed lease record");
        }
        let now = self.clock.now_ms();
        let me = self.context.keeper.config().owner_id.clone();
        let skew =
            i64::try_from(self.context.keeper.config().skew_margin.as_millis()).unwrap_or(i64::MAX);
        let streams: &[Lease] = &table.streams;
        let (census, peer_addrs) = census_of(&table, now, &me, self.running.len());
        self.peer_addrs = peer_addrs;
        self.known_streams = streams.iter().map(|l| l.stream_id.clone()).collect();
        // Free: what the acquire condition would let this worker in on and it
        // does not run: unowned, expired past the skew margin, or recorded as
        // this worker's (a restarted process with the same OWNER_ID, or a
        // token lifted past a sink's fence), taken at once with a new token.
        // A stream a graceful hand-off released to another worker is left
        // to it for an interval: that worker subscribed ahead and takes it
        // without a gap; anyone else would start cold.
        let left_for =
            i64::try_from(self.config.discovery_interval.as_millis()).unwrap_or(i64::MAX);
        let free_now: HashSet<String> = table
            .acquirable_streams(&me, now, skew)
            .filter(|l| !self.running.contains_key(&l.stream_id))
            .filter(|l| l.left_to(&me, now, left_for).is_none())
            .map(|l| l.stream_id.clone())
            .collect();
        let holders: HashMap<&str, &Lease> =
            streams.iter().map(|l| (l.stream_id.as_str(), l)).collect();
        self.gifts.review(
            Instant::now(),
            self.config.discovery_interval,
            &census,
            &me,
            |stream| match holders.get(stream) {
                Some(l)
                    if l.state(now) == LeaseState::Owned
                        && l.owner_id
                            .as_ref()
                            .is_some_and(|o| *o != me && census.held_by.contains_key(o)) =>
                {
                    GiftFate::Taken
                }
                _ => GiftFate::Untaken,
            },
        );
        let share = Share::of(&census, &me, self.config.max_streams);
        if self.gifts.may_give() {
            let held = self.running.values().filter(|r| !self.leaving(r)).count();
            self.hand_back(share.to_hand_back(held));
        }
        let cooldown = self.config.discovery_interval * 2;
        self.handed_back.retain(|_, at| at.elapsed() < cooldown);
        let mut free: Vec<&Lease> = streams
            .iter()
            .filter(|l| free_now.contains(&l.stream_id))
            .filter(|l| !self.handed_back.contains_key(&l.stream_id))
            .collect();
        let seen = Instant::now();
        self.free_since
            .retain(|stream, _| free_now.contains(stream));
        for stream in &free_now {
            self.free_since.entry(stream.clone()).or_insert(seen);
        }
        free.shuffle(&mut rand::rng());
        // Time enough for a starving peer to hear the doorbell and rescan.
        let grace = self.config.handoff_poll * 2;
        let mut left_to_starving = Vec::new();
        for lease in free {
            // Free for a whole interval: nobody else takes it, and unowned is
            // worse than unbalanced, so fill up to the maximum.
            let unwanted = self
                .free_since
                .get(&lease.stream_id)
                .is_some_and(|since| seen.duration_since(*since) >= self.config.discovery_interval);
            let target = if unwanted {
                self.config.max_streams
            } else {
                share.most
            };
            if self.running.len() >= target {
                continue;
            }
            let since = self
                .free_since
                .get(&lease.stream_id)
                .copied()
                .unwrap_or(seen);
            if share.defers_to_starving(self.running.len()) && seen < since + grace {
                left_to_starving.push((since + grace, lease.stream_id.clone()));
                continue;
            }
            self.try_acquire(&lease.stream_id).await;
        }
        self.census = census;
        // Another owner's lease running out before the next scan: be there when
        // the protocol allows a takeover, not an interval later.
        self.probes.clear();
        for (at, stream) in left_to_starving {
            self.probes.schedule(at, stream, None);
        }
        let horizon =
            now + i64::try_from(self.config.discovery_interval.as_millis()).unwrap_or(i64::MAX);
        for lease in streams {
            // Not acquirable now means another owner's lease still runs.
            let takeable_at = protocol::takeable_at(lease.lease_expires_at, skew);
            if !read::acquirable(lease, &me, now, skew)
                && takeable_at <= horizon
                && let Some(owner) = lease.owner_id.as_ref()
            {
                let wait = Duration::from_millis(u64::try_from(takeable_at - now).unwrap_or(0));
                self.probes.schedule(
                    Instant::now() + wait,
                    lease.stream_id.clone(),
                    Some(owner.clone()),
                );
            }
        }
        Ok(())
    }

    /// An expiry probe (scan discovery): take the stream if this worker is
    /// below the share it has once the lapsing owner is gone (or, for a
    /// stream left to a starving peer, below its share; the acquire fails if
    /// the peer took it).
    async fn probe(&mut self, probe: Probe) {
        let me = &self.context.keeper.config().owner_id;
        let max = self.config.max_streams;
        let target = match &probe.lapsing_owner {
            Some(owner) => Share::of(&self.census.without(owner), me, max).most,
            None => Share::of(&self.census, me, max).most,
        };
        if self.running.len() < target && !self.running.contains_key(&probe.stream) {
            self.try_acquire(&probe.stream).await;
        }
    }

    async fn try_acquire(&mut self, stream: &str) {
        match self.context.keeper.acquire(stream).await {
            Ok(lease) => self.start(lease),
            Err(LeaseError::Conflict { .. }) => {}
            Err(err) => tracing::warn!(stream_id = stream, error = %err, "acquire failed"),
        }
    }

    fn start(&mut self, lease: HeldLease) {
        let drain = CancellationToken::new();
        let (drain_after, drain_after_rx) = tokio::sync::watch::channel(None);
        let exits = self.exits_tx.clone();
        let context = self.context.clone();
        let (stream, token) = (lease.stream_id.clone(), lease.fence_token);
        let controls = Controls {
            drain: drain.clone(),
            drain_after: drain_after_rx,
            prepared: self.prepared.take(&stream),
        };
        let task = tokio::spawn({
            let lease = lease.clone();
            async move {
                let exit = run_stream_with(context, lease, controls).await;
                let _ = exits.send((stream, token, exit.clone()));
                exit
            }
        });
        self.running.insert(
            lease.stream_id.clone(),
            Running {
                lease,
                drain,
                drain_after,
                task,
            },
        );
    }

    /// Drains `count` streams to balance: each releases when its batch is done
    /// and rings the doorbell, and the gift is judged at a later scan.
    fn hand_back(&mut self, count: usize) {
        if count == 0 {
            return;
        }
        let mut candidates: Vec<&Running> =
            self.running.values().filter(|r| !self.leaving(r)).collect();
        candidates.sort_by(|a, b| b.lease.stream_id.cmp(&a.lease.stream_id));
        let now = Instant::now();
        let streams: Vec<String> = candidates
            .into_iter()
            .take(count)
            .map(|running| running.lease.stream_id.clone())
            .collect();
        for stream in streams {
            tracing::info!(stream_id = stream, "over fair share: handing a stream back");
            // The peer that gets it is the one furthest below its share.
            let me = self.context.keeper.config().owner_id.clone();
            let successor =
                handoff::successor(&self.census, &me, &self.peer_addrs).map(str::to_owned);
            if let Some(next) = &successor {
                *self.census.held_by.entry(next.clone()).or_default() += 1;
            }
            let successor =
                successor.and_then(|next| Some((next.clone(), *self.peer_addrs.get(&next)?)));
            self.release_to(&stream, successor);
            self.handed_back.insert(stream.clone(), now);
            self.gifts.give(&stream, now);
        }
    }

    /// A running stream on its way out: draining, or handed back and
    /// running on until its successor holds it.
    fn leaving(&self, running: &Running) -> bool {
        running.drain.is_cancelled() || self.releasing.contains_key(&running.lease.stream_id)
    }

    /// Releases a running stream towards `successor` (its id and where it
    /// takes hand-offs): when hand-offs overlap, the peer subscribes it
    /// first, the stream runs on until the peer holds what follows (or the
    /// prepare timeout), and the release names the peer so that scanning
    /// workers leave the stream to it; otherwise at once.
    fn release_to(&mut self, stream: &str, successor: Option<(String, std::net::SocketAddr)>) {
        let Some(running) = self.running.get(stream) else {
            return;
        };
        match (successor, self.handoff.clone()) {
            (Some((next, successor)), Some(socket)) if self.overlaps() => {
                running.lease.hand_to(&next);
                let name = stream.to_owned();
                tokio::spawn(async move { socket.prepare(successor, &name).await });
                let until = Some(Instant::now() + self.config.handoff_prepare_timeout);
                self.releasing.insert(
                    stream.to_owned(),
                    Overlap {
                        successor,
                        until,
                        readied: false,
                    },
                );
            }
            _ => running.drain.cancel(),
        }
    }

    /// A successor holds `stream` from `first_seq` on: it runs on until the
    /// sink confirmed what comes before (bounded by the prepare timeout).
    fn readied(&mut self, stream: &str, first_seq: u64, from: std::net::SocketAddr) {
        let Some(overlap) = self.releasing.get_mut(stream) else {
            return;
        };
        if overlap.successor != from || overlap.readied {
            return;
        }
        let Some(running) = self.running.get(stream) else {
            return;
        };
        overlap.readied = true;
        overlap.until = Some(Instant::now() + self.config.handoff_prepare_timeout);
        let _ = running.drain_after.send(Some(first_seq.saturating_sub(1)));
    }

    /// Streams whose successor did not take over in time are released as
    /// they are.
    fn release_overdue(&mut self) {
        let now = Instant::now();
        for (stream, overlap) in &mut self.releasing {
            if overlap.until.is_some_and(|until| until <= now) {
                overlap.until = None;
                if let Some(running) = self.running.get(stream) {
                    tracing::info!(
                        stream_id = stream,
                        readied = overlap.readied,
                        "the successor did not take over in time; releasing the stream as it is"
                    );
                    running.drain.cancel();
                }
            }
        }
    }

    async fn drain(mut self, hints: Option<mpsc::Receiver<Hint>>) -> DrainReport {
        // The presence goes while the streams drain, not after: the doorbell
        // below waits for both, and peers that rescan then count one worker
        // fewer (a larger fair share: they take every released stream).
        let presence = self.presence.take();
        let keeper = self.context.keeper.clone();
        let presence = async move {
            if let Some(presence) = presence
                && let Err(err) = keeper.release(&presence).await
            {
                tracing::warn!(error = %err, "could not release the presence lease");
            }
        };
        let (report, ()) = tokio::join!(self.drain_streams(hints), presence);
        // Session mode: every stream is released (or abandoned) by now; ending
        // the session lets takers in on an abandoned one without waiting for
        // it to expire.
        if let Err(err) = self.context.keeper.end_session().await {
            tracing::warn!(error = %err, "could not end the session");
        }
        self.ring_doorbell().await;
        report
    }

    /// Waits for every stream to finish its batch and release (each releases
    /// with its last checkpoint), up to the drain timeout. Exits are taken as
    /// they come, so each released stream is pushed to its successor at once,
    /// not after the streams before it in some order. With `hints` (an
    /// overlapping drain), each stream's successor is asked to subscribe it
    /// first, and the stream drains once it has written what comes before
    /// the successor's first held frame, or after the prepare timeout.
    async fn drain_streams(&mut self, mut hints: Option<mpsc::Receiver<Hint>>) -> DrainReport {
        let mut report = DrainReport::default();
        let deadline = Instant::now() + self.config.drain_timeout;
        let mut overlaps: HashMap<String, Overlap> = HashMap::new();
        if let (Some(_), Some(socket)) = (&hints, self.handoff.clone()) {
            let streams: Vec<String> = self.running.keys().cloned().collect();
            for stream in streams {
                match self.successor_addr(&stream).await {
                    Some((next, successor)) => {
                        self.running[&stream].lease.hand_to(&next);
                        socket.prepare(successor, &stream).await;
                        let until = Some(Instant::now() + self.config.handoff_prepare_timeout);
                        overlaps.insert(
                            stream,
                            Overlap {
                                successor,
                                until,
                                readied: false,
                            },
                        );
                    }
                    None => self.running[&stream].drain.cancel(),
                }
            }
        }
        let controls: HashMap<
            String,
            (CancellationToken, tokio::sync::watch::Sender<Option<u64>>),
        > = self
            .running
            .iter()
            .map(|(stream, r)| (stream.clone(), (r.drain.clone(), r.drain_after.clone())))
            .collect();
        let mut exits: FuturesUnordered<_> = std::mem::take(&mut self.running)
            .into_iter()
            .map(|(stream, running)| {
                let keeper = self.context.keeper.clone();
                async move {
                    let Running {
                        lease, mut task, ..
                    } = running;
                    let exit = tokio::select! {
                        result = &mut task => result.unwrap_or_else(|err| StreamExit::ReleaseFailed(err.to_string())),
                        _ = sleep_until(deadline) => {
                            // Abandon the in-flight batch; the staged checkpoint covers
                            // everything the sink confirmed, so nothing is skipped.
                            task.abort();
                            match keeper.release(&lease).await {
                                Ok(_) => StreamExit::Released,
                                Err(err) => StreamExit::ReleaseFailed(err.to_string()),
                            }
                        }
                    };
                    (stream, exit)
                }
            })
            .collect();
        loop {
            let due = overlaps.values().filter_map(|o| o.until).min();
            tokio::select! {
                exited = exits.next() => {
                    let Some((stream, exit)) = exited else { break };
                    if exit == StreamExit::Released {
                        match overlaps.get(&stream) {
                            Some(overlap) => {
                                self.handing_to.remove(&stream);
                                if let Some(socket) = &self.handoff {
                                    socket.push(overlap.successor, &stream).await;
                                }
                            }
                            None => self.push_to_successor(&stream).await,
                        }
                    }
                    match exit {
                        StreamExit::Released => report.released.push(stream),
                        StreamExit::ReleaseFailed(error) => report.failed.push((stream, error)),
                        StreamExit::Lost(reason) => {
                            report.failed.push((stream, reason.as_str().to_owned()))
                        }
                        StreamExit::SinkGaveUp(error) => report.failed.push((stream, error)),
                    }
                }
                Some(hint) = async { hints.as_mut()?.recv().await }, if hints.is_some() => {
                    // Only the successor asked answers for a stream, once.
                    if let Hint::Ready { stream, first_seq, from } = hint
                        && let Some(overlap) = overlaps.get_mut(&stream)
                        && overlap.successor == from
                        && !overlap.readied
                        && let Some((_, drain_after)) = controls.get(&stream)
                    {
                        overlap.readied = true;
                        // Writing up to there is bounded too.
                        overlap.until = Some(Instant::now() + self.config.handoff_prepare_timeout);
                        let _ = drain_after.send(Some(first_seq.saturating_sub(1)));
                    }
                }
                _ = sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                    let now = Instant::now();
                    for (stream, overlap) in &mut overlaps {
                        if overlap.until.is_some_and(|until| until <= now) {
                            overlap.until = None;
                            if let Some((drain, _)) = controls.get(stream) {
                                tracing::info!(
                                    stream_id = stream,
                                    readied = overlap.readied,
                                    "the successor did not take over in time; releasing the stream as it is"
                                );
                                drain.cancel();
                            }
                        }
                    }
                }
            }
        }
        report
    }

    /// The address of the peer a drained `stream` goes to: the one advised
    /// in assigned discovery, else the least-loaded peer of the last census
    /// (counted as one more, so the next stream goes elsewhere).
    async fn successor_addr(&mut self, stream: &str) -> Option<(String, std::net::SocketAddr)> {
        if let Some(assignee) = self.handing_to.get(stream).cloned() {
            let addr = self.peer_address(&assignee).await?;
            return Some((assignee, addr));
        }
        let me = self.context.keeper.config().owner_id.clone();
        let next = handoff::successor(&self.census, &me, &self.peer_addrs)?.to_owned();
        *self.census.held_by.entry(next.clone()).or_default() += 1;
        let addr = self.peer_addrs.get(&next).copied()?;
        Some((next, addr))
    }

    /// Hands a released stream to the least-loaded peer of the last census,
    /// counted as one more for it so the next stream goes elsewhere; in
    /// assigned discovery to the live peer it is advised to, if any (that
    /// peer alone takes a push of a stream advised to it).
    async fn push_to_successor(&mut self, stream: &str) {
        if let Some(assignee) = self.handing_to.remove(stream) {
            return self.push_to(stream, &assignee).await;
        }
        let Some(socket) = &self.handoff else {
            return;
        };
        let me = self.context.keeper.config().owner_id.clone();
        let Some(next) = handoff::successor(&self.census, &me, &self.peer_addrs).map(str::to_owned)
        else {
            return;
        };
        socket.push(self.peer_addrs[&next], stream).await;
        *self.census.held_by.entry(next).or_default() += 1;
    }
}

/// One stream of an overlapping drain.
struct Overlap {
    /// Where its successor listens (and answers from).
    successor: std::net::SocketAddr,
    /// When it is drained as it is if nothing happened first.
    until: Option<Instant>,
    /// The successor answered with its first held sequence.
    readied: bool,
}

/// The census of a table read: the live workers, this one with the streams
/// it runs, the streams each holds; and the peers' checked hand-off addresses.
fn census_of(
    table: &LeaseTable,
    now: i64,
    me: &str,
    running: usize,
) -> (Census, HashMap<String, std::net::SocketAddr>) {
    let mut census = Census::default();
    let mut peer_addrs = HashMap::new();
    for (owner, presence) in table.live_workers(now) {
        if let Some(addr) = presence
            .lease
            .handoff_addr
            .as_deref()
            .and_then(handoff::peer_addr)
            && owner != me
        {
            peer_addrs.insert(owner.to_owned(), addr);
        }
        census.held_by.entry(owner.to_owned()).or_default();
    }
    for lease in &table.streams {
        if lease.state(now) == LeaseState::Owned
            && let Some(count) = lease
                .owner_id
                .as_ref()
                .and_then(|o| census.held_by.get_mut(o))
        {
            *count += 1;
        }
    }
    census.streams = table.streams.len();
    census.held_by.insert(me.to_owned(), running);
    (census, peer_addrs)
}

/// ±20 % so workers started together do not scan in lockstep.
fn jitter() -> f64 {
    rand::random_range(0.8..1.2)
}

#[cfg(test)]
mod tests;
