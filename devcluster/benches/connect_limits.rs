//! Connects under an exchange's limits, simulated: 10,000 streams on 100
//! workers behind one address, against Binance's limits (300 new connections
//! per rolling 5 minutes per IP, 1,024 streams per connection, 5 incoming
//! messages per second per connection, the connection cut past it), at a
//! cold start and at a rolling restart of every worker.
//!
//! A discrete-event loop on virtual time (no sockets, no sleeping) drives the
//! workers' real cores: [`ConnectBudget`] (`UPSTREAM_CONNECTS_PER_MINUTE`),
//! [`Outbox`] (`UPSTREAM_SUBSCRIBE_BATCH`, `UPSTREAM_SUBSCRIBES_PER_SECOND`)
//! and the runner's reconnect schedule ([`RunnerConfig::reconnect`], full
//! jitter drawn from a seeded generator). Around them it rebuilds what the
//! I/O code does:
//! - `UPSTREAM_STREAMS_PER_CONNECTION=1` (`WebSocketUpstream`): each stream
//!   waits for the worker's budget, connects, subscribes; a refused connect
//!   is retried after the backoff, through the budget again.
//! - Above 1 (`SharedUpstream`): a new stream goes on the worker's first
//!   connection with room, else opens one under the budget while holding the
//!   pool's lock (the worker's other new streams queue behind it); a
//!   subscribe waits 20 ms (`BATCH_WINDOW`) for more to join it when the
//!   outbox was empty; a released stream is unsubscribed through the same
//!   outbox. The worker pings every third of `UPSTREAM_IDLE_TIMEOUT_MS`, and
//!   answers the exchange's ping (every 20 s) with a pong: Binance counts
//!   both as incoming messages.
//!
//! Cold start: each worker acquires its 100 streams at times spread
//! uniformly over 0–14 s (`fleet_scale`: every stream owned after 13.8 s in
//! assigned mode). Rolling restart: from a steady fleet (connections long
//! open, the IP window empty), every 2 s one worker releases its streams and
//! a fresh replacement (its own budget) acquires each within 0.2 s.
//!
//! ```text
//! cargo bench -p leasehold-devcluster --bench connect_limits
//! cargo bench -p leasehold-devcluster --bench connect_limits -- --only N=200
//! cargo bench -p leasehold-devcluster --bench connect_limits -- --subscribes-per-second 10
//! ```
//! Options: `--only <text>` (the settings whose name contains it),
//! `--subscribes-per-second <n>` (instead of 4 in the shipped shared rows:
//! their assertion then shows what breaks), `--server-ping-offset-ms <ms>`
//! (when the exchange's first ping comes after the connect; 0: at 20 s),
//! `--random-ping-phase` (instead: anywhere in the first 20 s, per connection),
//! `--count-refused` (refused connects count against the IP limit too),
//! `--rtt-ms <ms>` (50), `--horizon-min <min>` (360), `--seed <n>`,
//! `--streams <n>`, `--workers <n>`.
#![allow(clippy::unwrap_used, unreachable_pub)] // a bench: a panic is its report

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, VecDeque};
use std::time::Duration;

use leasehold_platform::backoff::Backoff;
use leasehold_stream::runner::RunnerConfig;
use leasehold_stream::settings::UPSTREAM_IDLE_TIMEOUT_MS;
use leasehold_stream::upstream::budget::ConnectBudget;
use leasehold_stream::upstream::shared::{Op, Outbox};
use leasehold_testkit::measure::arg;
use tokio::time::Instant;

/// Virtual time: microseconds since the scenario began.
type Micros = u64;

const SECOND: Micros = 1_000_000;
const MILLI: Micros = 1_000;

/// Binance: new connections per IP per rolling window.
const IP_LIMIT: usize = 300;
const IP_WINDOW: Micros = 300 * SECOND;
/// Binance: incoming messages (subscribe, unsubscribe, ping, pong) per
/// connection per second; one more and the connection is cut.
const MESSAGE_LIMIT: usize = 5;
/// Binance: streams on one connection.
const STREAMS_LIMIT: usize = 1_024;
/// Binance pings every connection this often; the worker's pong counts.
const SERVER_PING: Micros = 20 * SECOND;
/// `shared::BATCH_WINDOW` (private there): how long a subscribe waits for
/// more to join it when the outbox was empty.
const BATCH_WINDOW: Micros = 20 * MILLI;
/// `upstream::CONNECT_WINDOW` (`pub(crate)` there): the budget's window.
const CONNECT_WINDOW: Duration = Duration::from_secs(60);
/// Cold start: every stream acquired within this (`fleet_scale`, assigned).
const ACQUIRE_SPREAD: Micros = 14 * SECOND;
/// Rolling restart: one worker every this, its replacement acquiring each
/// stream within `REPLACE_SPREAD`.
const RESTART_EVERY: Micros = 2 * SECOND;
const REPLACE_SPREAD: Micros = 200 * MILLI;

/// One row: the worker's upstream settings.
#[derive(Clone)]
struct Setting {
    name: String,
    /// `UPSTREAM_STREAMS_PER_CONNECTION`.
    per_connection: usize,
    /// `UPSTREAM_CONNECTS_PER_MINUTE` (0: none).
    connects_per_minute: usize,
    /// `UPSTREAM_SUBSCRIBE_BATCH`.
    batch: usize,
    /// `UPSTREAM_SUBSCRIBES_PER_SECOND`.
    per_second: u32,
    /// Asserted: no refusal, no violation, every stream flowing.
    shipped: bool,
    /// Asserted: the simulation sees violations (it can fail).
    expect_violations: bool,
}

/// What the simulation assumes beyond the settings.
struct Model {
    streams: usize,
    workers: usize,
    /// Round trip to the exchange: a subscribe is answered one after it goes.
    rtt: Micros,
    /// TCP, TLS and WebSocket handshakes: three round trips; a refused
    /// connect (HTTP 429 on the upgrade) is known as late.
    handshake: Micros,
    horizon: Micros,
    /// When the exchange's first ping comes, after the connect.
    server_ping_first: Micros,
    /// Instead: at a random time within its first 20 s, per connection.
    random_ping_phase: bool,
    /// Refused connects count against the IP limit as well.
    count_refused: bool,
    seed: u64,
    reconnect: Backoff,
    /// The worker's WebSocket ping: a third of `UPSTREAM_IDLE_TIMEOUT_MS`.
    worker_ping: Micros,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Scenario {
    ColdStart,
    RollingRestart,
}

/// SplitMix64: a seeded, reproducible generator for the jitter.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, max]`.
    fn upto(&mut self, max: u64) -> u64 {
        self.next() % (max + 1)
    }
}

enum Ev {
    /// A worker took a stream's lease.
    Acquire { worker: usize, stream: usize },
    /// Rolling restart: a worker releases every stream and stops.
    Release { worker: usize },
    /// A stream's reconnect backoff is over: it asks again.
    Retry { stream: usize, epoch: u32 },
    /// One connection per stream: its budget slot came, it connects.
    Dial { stream: usize, epoch: u32 },
    /// One connection per stream: connected and the subscribe answered.
    Flow { stream: usize, epoch: u32 },
    /// Shared: the worker's budget slot came, it connects.
    Open { worker: usize },
    /// Shared: the handshake ended.
    Opened { worker: usize, accepted: bool },
    /// Shared: the outbox may send.
    Wake { conn: usize },
    /// Shared: a subscribe message was answered.
    Ack { conn: usize, streams: Vec<usize> },
    /// Shared: the worker's WebSocket ping.
    Ping { conn: usize },
    /// Shared: the exchange's ping, answered with a pong.
    Pong { conn: usize },
}

struct Entry {
    at: Micros,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

struct Worker {
    alive: bool,
    budget: ConnectBudget,
    /// Shared: its open connections, oldest first.
    conns: Vec<usize>,
    /// Shared: streams waiting for the pool's lock, with their epoch.
    waiting: VecDeque<(usize, u32)>,
    /// Shared: a connect holds the lock.
    opening: bool,
}

struct Stream {
    owner: usize,
    /// Moves on at each release: older events for the stream are stale.
    epoch: u32,
    /// Failed connects in a row (the backoff's attempt; reset by a frame).
    attempts: u32,
    flowing: bool,
    conn: Option<usize>,
    down_since: Micros,
}

struct Conn {
    worker: usize,
    alive: bool,
    /// Its worker stopped: it closes once its outbox is empty.
    closing: bool,
    held: usize,
    routes: BTreeSet<usize>,
    outbox: Outbox,
    hold_until: Micros,
    wake_at: Option<Micros>,
    /// The exchange's view: its messages in the last second.
    heard: VecDeque<Micros>,
}

/// The exchange's per-IP connect limit, and what it saw.
#[derive(Default)]
struct Exchange {
    tried: VecDeque<Micros>,
    accepted: VecDeque<Micros>,
    worst_tried: usize,
    worst_accepted: usize,
    refusals: u64,
}

impl Exchange {
    fn connect(&mut self, now: Micros, count_refused: bool) -> bool {
        for window in [&mut self.tried, &mut self.accepted] {
            while window.front().is_some_and(|at| at + IP_WINDOW <= now) {
                window.pop_front();
            }
        }
        let used = if count_refused {
            self.tried.len()
        } else {
            self.accepted.len()
        };
        self.tried.push_back(now);
        self.worst_tried = self.worst_tried.max(self.tried.len());
        if used < IP_LIMIT {
            self.accepted.push_back(now);
            self.worst_accepted = self.worst_accepted.max(self.accepted.len());
            true
        } else {
            self.refusals += 1;
            false
        }
    }
}

/// One scenario's figures.
struct Outcome {
    /// When every stream flowed (and nothing was owed), if within the horizon.
    all_flowing: Option<Micros>,
    flowing_at_end: usize,
    worst_tried: usize,
    worst_accepted: usize,
    refusals: u64,
    violations: u64,
    longest_outage: Micros,
    most_on_a_connection: usize,
    events: u64,
}

struct Sim<'a> {
    model: &'a Model,
    setting: &'a Setting,
    epoch: Instant,
    now: Micros,
    seq: u64,
    queue: BinaryHeap<Reverse<Entry>>,
    rng: Rng,
    exchange: Exchange,
    workers: Vec<Worker>,
    streams: Vec<Stream>,
    conns: Vec<Conn>,
    flowing: usize,
    violations: u64,
    longest_outage: Micros,
    most_on_a_connection: usize,
    /// No stream can flow for good before this (the last acquisition).
    settled_after: Micros,
    events: u64,
}

impl<'a> Sim<'a> {
    fn new(model: &'a Model, setting: &'a Setting, scenario: Scenario) -> Self {
        // Replacements (rolling restart) are workers `workers..2 * workers`.
        let workers = (0..2 * model.workers)
            .map(|i| Worker {
                alive: scenario == Scenario::RollingRestart || i < model.workers,
                budget: ConnectBudget::new(setting.connects_per_minute, CONNECT_WINDOW),
                conns: Vec::new(),
                waiting: VecDeque::new(),
                opening: false,
            })
            .collect();
        let streams = (0..model.streams)
            .map(|k| Stream {
                owner: k % model.workers,
                epoch: 0,
                attempts: 0,
                flowing: false,
                conn: None,
                down_since: 0,
            })
            .collect();
        let mut sim = Sim {
            model,
            setting,
            epoch: Instant::now(),
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            // The same acquisition times for every row of a scenario.
            rng: Rng(model.seed ^ scenario as u64),
            exchange: Exchange::default(),
            workers,
            streams,
            conns: Vec::new(),
            flowing: 0,
            violations: 0,
            longest_outage: 0,
            most_on_a_connection: 0,
            settled_after: 0,
            events: 0,
        };
        match scenario {
            Scenario::ColdStart => {
                for stream in 0..model.streams {
                    let at = sim.rng.upto(ACQUIRE_SPREAD);
                    let worker = sim.streams[stream].owner;
                    sim.at(at, Ev::Acquire { worker, stream });
                    sim.settled_after = sim.settled_after.max(at);
                }
            }
            Scenario::RollingRestart => {
                sim.steady();
                for worker in 0..model.workers {
                    sim.at(worker as u64 * RESTART_EVERY, Ev::Release { worker });
                }
                sim.settled_after = (model.workers as u64 - 1) * RESTART_EVERY + REPLACE_SPREAD;
            }
        }
        sim
    }

    /// Every stream flowing on its original worker, connections long open
    /// (pings in a random phase), nothing in the IP window.
    fn steady(&mut self) {
        for stream in 0..self.streams.len() {
            self.streams[stream].flowing = true;
            self.flowing += 1;
            if self.setting.per_connection == 1 {
                continue;
            }
            let worker = self.streams[stream].owner;
            let room = self.setting.per_connection;
            let conn = match self.workers[worker]
                .conns
                .iter()
                .copied()
                .find(|c| self.conns[*c].held < room)
            {
                Some(conn) => conn,
                None => {
                    let conn = self.new_conn(worker);
                    let ping = self.rng.upto(self.model.worker_ping);
                    let pong = self.rng.upto(SERVER_PING);
                    self.at(ping, Ev::Ping { conn });
                    self.at(pong, Ev::Pong { conn });
                    conn
                }
            };
            let c = &mut self.conns[conn];
            c.held += 1;
            c.routes.insert(stream);
            self.streams[stream].conn = Some(conn);
        }
    }

    fn instant(&self, at: Micros) -> Instant {
        self.epoch + Duration::from_micros(at)
    }

    fn micros(&self, at: Instant) -> Micros {
        (at - self.epoch).as_micros() as Micros
    }

    fn at(&mut self, at: Micros, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Entry {
            at,
            seq: self.seq,
            ev,
        }));
    }

    fn backoff(&mut self, stream: usize) -> Micros {
        let s = &mut self.streams[stream];
        let attempt = s.attempts;
        s.attempts = s.attempts.saturating_add(1);
        let ceiling = self.model.reconnect.ceiling(attempt).as_micros() as u64;
        self.rng.upto(ceiling)
    }

    fn run(mut self) -> Outcome {
        let mut all_flowing = None;
        while let Some(Reverse(entry)) = self.queue.pop() {
            if entry.at > self.model.horizon {
                break;
            }
            self.now = entry.at;
            self.events += 1;
            self.handle(entry.ev);
            if self.flowing == self.streams.len() && self.now >= self.settled_after && self.quiet()
            {
                all_flowing = Some(self.now);
                break;
            }
        }
        if all_flowing.is_none() {
            // Streams still down at the horizon count as down until then.
            for s in self.streams.iter().filter(|s| !s.flowing) {
                let down = self.model.horizon.saturating_sub(s.down_since);
                self.longest_outage = self.longest_outage.max(down);
            }
        }
        Outcome {
            all_flowing,
            flowing_at_end: self.flowing,
            worst_tried: self.exchange.worst_tried,
            worst_accepted: self.exchange.worst_accepted,
            refusals: self.exchange.refusals,
            violations: self.violations,
            longest_outage: self.longest_outage,
            most_on_a_connection: self.most_on_a_connection,
            events: self.events,
        }
    }

    /// No connection owes a message.
    fn quiet(&self) -> bool {
        self.conns.iter().all(|c| !c.alive || c.outbox.is_empty())
    }

    fn valid(&self, stream: usize, epoch: u32) -> bool {
        let s = &self.streams[stream];
        s.epoch == epoch && self.workers[s.owner].alive
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Acquire { worker, stream } => {
                if self.workers[worker].alive && self.streams[stream].owner == worker {
                    self.ask(stream);
                }
            }
            Ev::Release { worker } => self.release(worker),
            Ev::Retry { stream, epoch } => {
                if self.valid(stream, epoch) {
                    self.ask(stream);
                }
            }
            Ev::Dial { stream, epoch } => {
                if self.valid(stream, epoch) {
                    self.dial(stream);
                }
            }
            Ev::Flow { stream, epoch } => {
                if self.valid(stream, epoch) {
                    self.flows(stream);
                }
            }
            Ev::Open { worker } => {
                if self.workers[worker].alive {
                    let accepted = self.exchange.connect(self.now, self.model.count_refused);
                    let at = self.now + self.model.handshake;
                    self.at(at, Ev::Opened { worker, accepted });
                }
            }
            Ev::Opened { worker, accepted } => self.opened(worker, accepted),
            Ev::Wake { conn } => self.wake(conn),
            Ev::Ack { conn, streams } => {
                if self.conns[conn].alive {
                    for stream in streams {
                        let s = &self.streams[stream];
                        if s.conn == Some(conn) && !s.flowing {
                            self.flows(stream);
                        }
                    }
                }
            }
            Ev::Ping { conn } => {
                if self.conns[conn].alive && self.hear(conn) {
                    let at = self.now + self.model.worker_ping;
                    self.at(at, Ev::Ping { conn });
                }
            }
            Ev::Pong { conn } => {
                if self.conns[conn].alive && self.hear(conn) {
                    self.at(self.now + SERVER_PING, Ev::Pong { conn });
                }
            }
        }
    }

    /// A stream (newly acquired, or after its backoff) asks for a subscription.
    fn ask(&mut self, stream: usize) {
        let worker = self.streams[stream].owner;
        if self.setting.per_connection == 1 {
            let now = self.instant(self.now);
            let at = self.workers[worker].budget.reserve(now);
            let at = self.micros(at);
            if at == self.now {
                self.dial(stream);
            } else {
                let epoch = self.streams[stream].epoch;
                self.at(at, Ev::Dial { stream, epoch });
            }
        } else {
            let epoch = self.streams[stream].epoch;
            self.workers[worker].waiting.push_back((stream, epoch));
            self.pump(worker);
        }
    }

    /// One connection per stream: the connect, the subscribe on it.
    fn dial(&mut self, stream: usize) {
        let epoch = self.streams[stream].epoch;
        if self.exchange.connect(self.now, self.model.count_refused) {
            let at = self.now + self.model.handshake + self.model.rtt;
            self.most_on_a_connection = self.most_on_a_connection.max(1);
            self.at(at, Ev::Flow { stream, epoch });
        } else {
            let at = self.now + self.model.handshake + self.backoff(stream);
            self.at(at, Ev::Retry { stream, epoch });
        }
    }

    fn flows(&mut self, stream: usize) {
        let s = &mut self.streams[stream];
        s.flowing = true;
        s.attempts = 0;
        self.flowing += 1;
        self.longest_outage = self.longest_outage.max(self.now - s.down_since);
    }

    /// Shared: the streams waiting for the pool's lock, in order: each on
    /// the first connection with room, else a connect under the budget.
    fn pump(&mut self, worker: usize) {
        let room = self.setting.per_connection;
        loop {
            let w = &self.workers[worker];
            if w.opening || !w.alive {
                return;
            }
            let Some(&(stream, epoch)) = w.waiting.front() else {
                return;
            };
            if self.streams[stream].epoch != epoch {
                self.workers[worker].waiting.pop_front();
                continue;
            }
            let free = w.conns.iter().copied().find(|c| self.conns[*c].held < room);
            if let Some(conn) = free {
                self.workers[worker].waiting.pop_front();
                self.place(stream, conn);
                continue;
            }
            let now = self.instant(self.now);
            let w = &mut self.workers[worker];
            w.opening = true;
            let at = w.budget.reserve(now);
            let at = self.micros(at);
            self.at(at, Ev::Open { worker });
            return;
        }
    }

    fn new_conn(&mut self, worker: usize) -> usize {
        self.conns.push(Conn {
            worker,
            alive: true,
            closing: false,
            held: 0,
            routes: BTreeSet::new(),
            outbox: Outbox::new(self.setting.batch, self.setting.per_second),
            hold_until: 0,
            wake_at: None,
            heard: VecDeque::new(),
        });
        let conn = self.conns.len() - 1;
        self.workers[worker].conns.push(conn);
        conn
    }

    fn opened(&mut self, worker: usize, accepted: bool) {
        if !self.workers[worker].alive {
            return;
        }
        self.workers[worker].opening = false;
        let head = self.workers[worker].waiting.pop_front();
        let head = head.filter(|(stream, epoch)| self.streams[*stream].epoch == *epoch);
        if accepted {
            let conn = self.new_conn(worker);
            self.at(self.now + self.model.worker_ping, Ev::Ping { conn });
            let first = if self.model.random_ping_phase {
                self.rng.upto(SERVER_PING)
            } else {
                self.model.server_ping_first
            };
            self.at(self.now + first, Ev::Pong { conn });
            if let Some((stream, _)) = head {
                self.place(stream, conn);
            }
        } else if let Some((stream, epoch)) = head {
            let at = self.now + self.backoff(stream);
            self.at(at, Ev::Retry { stream, epoch });
        }
        self.pump(worker);
    }

    fn place(&mut self, stream: usize, conn: usize) {
        let now = self.now;
        let c = &mut self.conns[conn];
        c.held += 1;
        c.routes.insert(stream);
        self.most_on_a_connection = self.most_on_a_connection.max(c.held);
        if c.outbox.is_empty() {
            c.hold_until = now + BATCH_WINDOW;
        }
        c.outbox.subscribe(stream.to_string());
        self.streams[stream].conn = Some(conn);
        self.schedule_wake(conn);
    }

    fn schedule_wake(&mut self, conn: usize) {
        let now = self.instant(self.now);
        let c = &self.conns[conn];
        if !c.alive || c.wake_at.is_some() {
            return;
        }
        if let Some(due) = c.outbox.due(now) {
            let at = self.micros(due).max(c.hold_until);
            self.conns[conn].wake_at = Some(at);
            self.at(at, Ev::Wake { conn });
        }
    }

    fn wake(&mut self, conn: usize) {
        let now = self.instant(self.now);
        let c = &mut self.conns[conn];
        if !c.alive || c.wake_at != Some(self.now) {
            return;
        }
        c.wake_at = None;
        if let Some((op, routes)) = c.outbox.poll(now) {
            if !self.hear(conn) {
                return;
            }
            if op == Op::Subscribe {
                let streams = routes.iter().map(|r| r.parse().unwrap()).collect();
                self.at(self.now + self.model.rtt, Ev::Ack { conn, streams });
            }
        }
        let c = &mut self.conns[conn];
        if c.closing && c.outbox.is_empty() {
            c.alive = false;
        } else {
            self.schedule_wake(conn);
        }
    }

    /// The exchange hears a message on `conn`: past its limit it counts a
    /// violation and cuts the connection (false).
    fn hear(&mut self, conn: usize) -> bool {
        let now = self.now;
        let heard = &mut self.conns[conn].heard;
        while heard.front().is_some_and(|at| at + SECOND <= now) {
            heard.pop_front();
        }
        heard.push_back(now);
        if heard.len() > MESSAGE_LIMIT {
            self.violations += 1;
            self.cut(conn);
            false
        } else {
            true
        }
    }

    /// The exchange cut `conn`: every stream on it reconnects after its backoff.
    fn cut(&mut self, conn: usize) {
        let c = &mut self.conns[conn];
        c.alive = false;
        c.wake_at = None;
        c.held = 0;
        let routes = std::mem::take(&mut c.routes);
        let worker = c.worker;
        self.workers[worker].conns.retain(|other| *other != conn);
        for stream in routes {
            let s = &mut self.streams[stream];
            s.conn = None;
            if s.flowing {
                s.flowing = false;
                s.down_since = self.now;
                self.flowing -= 1;
            }
            let epoch = s.epoch;
            let at = self.now + self.backoff(stream);
            self.at(at, Ev::Retry { stream, epoch });
        }
    }

    /// A worker releases every stream and stops; its replacement (a fresh
    /// process) acquires each within `REPLACE_SPREAD`.
    fn release(&mut self, worker: usize) {
        let replacement = worker + self.model.workers;
        self.workers[worker].alive = false;
        self.workers[worker].waiting.clear();
        for stream in (worker..self.streams.len()).step_by(self.model.workers) {
            let s = &mut self.streams[stream];
            s.epoch += 1;
            s.owner = replacement;
            s.down_since = self.now;
            if s.flowing {
                s.flowing = false;
                self.flowing -= 1;
            }
            if let Some(conn) = s.conn.take() {
                let c = &mut self.conns[conn];
                c.held -= 1;
                c.routes.remove(&stream);
                if c.alive {
                    if c.outbox.is_empty() {
                        c.hold_until = self.now + BATCH_WINDOW;
                    }
                    c.outbox.unsubscribe(stream.to_string());
                    self.schedule_wake(conn);
                }
            }
            let at = self.now + self.rng.upto(REPLACE_SPREAD);
            self.at(
                at,
                Ev::Acquire {
                    worker: replacement,
                    stream,
                },
            );
        }
        for conn in std::mem::take(&mut self.workers[worker].conns) {
            let c = &mut self.conns[conn];
            c.closing = true;
            if c.outbox.is_empty() {
                c.alive = false;
            }
        }
    }
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

fn duration(at: Micros) -> String {
    let seconds = at as f64 / SECOND as f64;
    if seconds < 60.0 {
        format!("{seconds:.1} s")
    } else if seconds < 3_600.0 {
        format!("{} min {:02} s", at / 60 / SECOND, at / SECOND % 60)
    } else {
        format!("{} h {:02} min", at / 3_600 / SECOND, at / 60 / SECOND % 60)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let only = args.iter().skip_while(|a| *a != "--only").nth(1).cloned();
    let shipped_rate = arg("--subscribes-per-second", 3) as u32;
    let server_ping_offset = arg("--server-ping-offset-ms", 0) * MILLI % SERVER_PING;
    let rtt = arg("--rtt-ms", 50) * MILLI;
    let idle: Duration = UPSTREAM_IDLE_TIMEOUT_MS.fixed_default();
    let model = Model {
        streams: arg("--streams", 10_000) as usize,
        workers: arg("--workers", 100) as usize,
        rtt,
        handshake: 3 * rtt,
        horizon: arg("--horizon-min", 360) * 60 * SECOND,
        server_ping_first: if server_ping_offset == 0 {
            SERVER_PING
        } else {
            server_ping_offset
        },
        random_ping_phase: args.iter().any(|a| a == "--random-ping-phase"),
        count_refused: args.iter().any(|a| a == "--count-refused"),
        seed: arg("--seed", 1),
        reconnect: RunnerConfig::default().reconnect,
        worker_ping: (idle / 3).as_micros() as Micros,
    };
    let row = |name: &str, per_connection, connects_per_minute, per_second| Setting {
        name: name.to_owned(),
        per_connection,
        connects_per_minute,
        batch: 200,
        per_second,
        shipped: false,
        expect_violations: false,
    };
    let settings = [
        row("N=1, no budget (a connection per stream)", 1, 0, 4),
        row("N=1, budget 3/min", 1, 3, 4),
        row("N=1, budget 1/min (the least above 0)", 1, 1, 4),
        Setting {
            shipped: true,
            ..row(
                &format!("N=200, budget 1/min, {shipped_rate}/s"),
                200,
                1,
                shipped_rate,
            )
        },
        Setting {
            shipped: true,
            ..row(
                &format!("N=1024, budget 1/min, {shipped_rate}/s"),
                1024,
                1,
                shipped_rate,
            )
        },
        Setting {
            expect_violations: true,
            ..row("N=200, budget 1/min, 10/s (a check)", 200, 1, 10)
        },
    ];
    let wall = std::time::Instant::now();
    let mut results = Vec::new();
    for setting in settings {
        if only
            .as_ref()
            .is_some_and(|only| !setting.name.contains(only.as_str()))
        {
            continue;
        }
        let started = std::time::Instant::now();
        let cold = Sim::new(&model, &setting, Scenario::ColdStart).run();
        let rolling = Sim::new(&model, &setting, Scenario::RollingRestart).run();
        eprintln!(
            "{}: simulated in {:.1?} ({} + {} events)",
            setting.name,
            started.elapsed(),
            thousands(cold.events),
            thousands(rolling.events)
        );
        results.push((setting, cold, rolling));
    }
    println!(
        "connect limits, {} streams on {} workers behind one IP: {} connects / 5 min \
         ({}), {} messages/s per connection (cut past it), {} streams per connection; \
         subscribe batch 200; RTT {} ms, handshake {} ms; worker ping every {} s, \
         exchange ping every 20 s (first at {}); reconnect backoff full jitter {:?}..{:?}; \
         simulated time:",
        thousands(model.streams as u64),
        model.workers,
        IP_LIMIT,
        if model.count_refused {
            "refused connects count too"
        } else {
            "refused connects not counted"
        },
        MESSAGE_LIMIT,
        thousands(STREAMS_LIMIT as u64),
        model.rtt / MILLI,
        model.handshake / MILLI,
        model.worker_ping / SECOND,
        if model.random_ping_phase {
            "random".to_owned()
        } else {
            duration(model.server_ping_first)
        },
        model.reconnect.base,
        model.reconnect.cap,
    );
    let flowing = |o: &Outcome| match o.all_flowing {
        Some(at) => duration(at),
        None => format!(
            "> {} ({} flowing)",
            duration(model.horizon),
            thousands(o.flowing_at_end as u64)
        ),
    };
    let connects = |o: &Outcome| {
        format!(
            "{} / {}",
            thousands(o.worst_tried as u64),
            thousands(o.worst_accepted as u64)
        )
    };
    for (title, rolling) in [
        ("cold start (acquisitions over 0–14 s)", false),
        (
            "rolling restart (a worker every 2 s, its replacement acquiring within 0.2 s)",
            true,
        ),
    ] {
        println!();
        println!("{title}:");
        let outage = if rolling {
            " longest a stream was not flowing |"
        } else {
            ""
        };
        println!(
            "| setting | every stream flowing after | connects in the worst 5 min (tried / accepted) | refused by the IP limit | message-rate violations (cuts) |{outage}"
        );
        println!("|---|---|---|---|---|{}", if rolling { "---|" } else { "" });
        for (setting, cold, roll) in &results {
            let o = if rolling { roll } else { cold };
            let outage = if rolling {
                let over = if o.all_flowing.is_none() { "≥ " } else { "" };
                format!(" {over}{} |", duration(o.longest_outage))
            } else {
                String::new()
            };
            println!(
                "| {} | {} | {} | {} | {} |{outage}",
                setting.name,
                flowing(o),
                connects(o),
                thousands(o.refusals),
                thousands(o.violations),
            );
        }
    }
    println!();
    println!(
        "(N=1 rows: one connection per stream, the batch and rate settings do not apply; \
         its one subscribe per connection cannot reach the message limit.)"
    );
    eprintln!("all simulated in {:.1?}", wall.elapsed());

    for (setting, cold, rolling) in &results {
        for (scenario, o) in [("cold start", cold), ("rolling restart", rolling)] {
            assert!(
                o.most_on_a_connection <= STREAMS_LIMIT,
                "{}, {scenario}: {} streams on one connection",
                setting.name,
                o.most_on_a_connection
            );
            if setting.shipped {
                assert!(
                    o.violations == 0 && o.refusals == 0 && o.all_flowing.is_some(),
                    "{}, {scenario}: {} message-rate violations, {} refused connects, \
                     every stream flowing: {} (expected 0, 0, yes)",
                    setting.name,
                    o.violations,
                    o.refusals,
                    o.all_flowing.is_some()
                );
            }
        }
        if setting.expect_violations {
            assert!(
                cold.violations + rolling.violations > 0,
                "{}: no message-rate violation seen: the simulation would not catch one",
                setting.name
            );
        }
    }
}
