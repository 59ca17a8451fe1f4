//! Session mode's lease protocol, model-checked with stateright.
//!
//! Workers hold one session record each and acquire a stream under it; the
//! stream record names the owner and the session token. Time is discrete (one
//! tick = one second) so clock skew, steps and holder deadlines are part of
//! the state. Workers start and renew sessions (and sometimes never learn a
//! renew's outcome), acquire the stream with the plain session acquire, read
//! it, take it over with the two-item transaction (from a read that may be
//! stale by then), release it (a hand-off: the next acquire is a plain one,
//! and the released stream is pushed to the other worker, who may receive
//! the push at any later moment),
//! end their session, pause, resume, crash and step their clock back. Every
//! decision is the runtime's own (`leasehold_control::protocol`): the session
//! acquire condition, the takeover's session condition, the holder's deadline
//! and what a renew's outcome does to it.
//!
//! The promise is the lease's: one holder acts at a time, and whoever acts
//! holds the record's newest token. Each rule of session mode has a switch in
//! [`Rules`]; a test turns each off and checks that the model finds a
//! counterexample. `LEASEHOLD_MODEL_DEPTH` raises the search depth.

use std::time::Duration;

use leasehold_control::protocol;
use leasehold_testkit::model_check::{self, Tick};
use stateright::{HasDiscoveries, Model, Property};

const SAFETY_MARGIN: Duration = Duration::from_secs(1);
const SKEW_MARGIN_S: i64 = 1;

/// The model's timings, and which actions it explores.
#[derive(Clone, Copy, Debug)]
struct Timing {
    lease: Duration,
    /// The last tick explored.
    max_time: i64,
    /// How far a clock steps back.
    clock_step: i64,
    /// Only what a clock step during a session needs: a step while the
    /// stepping worker holds a session, and no pause, crash, lost renew,
    /// release or ended session (a deeper search in the same time).
    clock_step_only: bool,
}

/// The model every rule is checked in: a 3 s lease, and a clock step of 2 s
/// at any moment (as far back as the safety and skew margins absorb together).
const SHORT: Timing = Timing {
    lease: Duration::from_secs(3),
    max_time: 7,
    clock_step: 2,
    clock_step_only: false,
};

/// A lease long enough for a holder whose clock stepped back 3 s (more than
/// the margins absorb) to renew before its deadline passes: only then can the
/// clock-step rule matter (with a 3 s lease the deadline always passes first,
/// as the store never shortens an expiry and a kept later one is unconfirmed).
const LONG: Timing = Timing {
    lease: Duration::from_secs(6),
    max_time: 9,
    clock_step: 3,
    clock_step_only: true,
};
const WORKERS: usize = 2;
const NAMES: [&str; WORKERS] = ["w0", "w1"];

/// Session mode's rules. `ALL` is the shipped protocol.
#[derive(Clone, Copy, Debug)]
struct Rules {
    /// The plain acquire never takes another session's stream (else it judges
    /// the stream by the record's own expiry, which nobody renews: what a
    /// per-stream worker would do, and why the mode record keeps them apart).
    plain_acquire_spares_sessions: bool,
    /// The takeover transaction checks that the holder's session ended (else
    /// the stream's condition alone decides).
    takeover_needs_the_session_ended: bool,
    /// The session's expiry must have passed by the skew margin.
    taker_waits_the_skew_margin: bool,
    /// The transaction checks that the stream is still what the taker read
    /// (owner, session token, fence token; else a stale read takes it from
    /// whoever took it since).
    takeover_checks_the_stream_unchanged: bool,
    /// A stream lives by the session it was acquired under: when that session
    /// ends the stream ends with it (else it lives by whatever session the
    /// worker has now, as a keeper tracking "the current session" would).
    stream_bound_to_its_session: bool,
    /// An unanswered session renew leaves the deadline where it was.
    unconfirmed_renew_keeps_deadline: bool,
    /// A pushed hand-off is a hint: the receiver takes the stream only
    /// through the acquire (else the datagram is taken as a grant, and a
    /// late one hands over a stream its sender has since taken back).
    pushed_stream_acquired_conditionally: bool,
    /// A confirmed renew's deadline comes earlier by however far this host's
    /// wall clock fell behind its monotonic clock since the session began (a
    /// backward step): the expiry it just wrote reads that much early.
    clock_step_shortens_deadline: bool,
}

impl Rules {
    const ALL: Rules = Rules {
        plain_acquire_spares_sessions: true,
        takeover_needs_the_session_ended: true,
        taker_waits_the_skew_margin: true,
        takeover_checks_the_stream_unchanged: true,
        stream_bound_to_its_session: true,
        unconfirmed_renew_keeps_deadline: true,
        pushed_stream_acquired_conditionally: true,
        clock_step_shortens_deadline: true,
    };
}

/// A worker's session record (`leasehold#session#{worker}`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, Default)]
struct SessionRecord {
    held: bool,
    token: u64,
    expires: Option<i64>,
}

/// The stream record.
#[derive(Clone, Debug, Hash, PartialEq, Eq, Default)]
struct StreamRecord {
    owner: Option<usize>,
    session_token: Option<u64>,
    token: u64,
    /// Written at the acquire, never renewed in session mode.
    expires: Option<i64>,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Status {
    Running,
    Paused,
    Crashed,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct SessionBelief {
    token: u64,
    deadline: Tick,
    /// The host's clock offset when the session began: how far its wall
    /// clock fell behind since is the difference to the offset now (what the
    /// keeper measures, wall time against monotonic time).
    skew_at_start: i64,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct StreamBelief {
    token: u64,
    /// The session token it was acquired under.
    session: u64,
}

/// What a taker's read saw of the stream.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Seen {
    owner: usize,
    session_token: u64,
    token: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Worker {
    status: Status,
    /// This host's wall clock minus real time.
    skew: i64,
    session: Option<SessionBelief>,
    stream: Option<StreamBelief>,
    seen: Option<Seen>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct State {
    now: Tick,
    sessions: Vec<SessionRecord>,
    stream: StreamRecord,
    workers: Vec<Worker>,
    pauses: u8,
    crashes: u8,
    timeouts: u8,
    clock_steps: u8,
    /// Takeovers that succeeded.
    takeovers: u8,
    /// A takeover was refused because the stream had moved since the taker
    /// read it (another taker, or its holder again, got there first).
    stale_takeover_refused: bool,
    /// A released stream's push (the draining worker names its successor),
    /// not yet delivered: the receiver.
    push: Option<usize>,
    /// A pushed stream was taken at once.
    pushed_taken: bool,
    /// A session renew was confirmed after its holder's clock stepped back.
    renewed_after_step: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Action {
    Tick,
    StartSession(usize),
    RenewSession(usize),
    /// A session renew that times out: applied (`true`) or not, unknown to the worker.
    RenewUnanswered(usize, bool),
    Acquire(usize),
    Read(usize),
    TakeOver(usize),
    Release(usize),
    /// The push of a released stream reaches its receiver.
    TakePushed(usize),
    EndSession(usize),
    Pause(usize),
    Resume(usize),
    Crash(usize),
    StepClockBack(usize),
}

struct SessionProtocol {
    rules: Rules,
    timing: Timing,
}

impl State {
    fn wall(&self, worker: usize) -> i64 {
        self.now.0 + self.workers[worker].skew
    }

    /// The worker's session, if it may still act under it.
    fn live_session(&self, worker: usize) -> Option<SessionBelief> {
        self.workers[worker]
            .session
            .filter(|s| protocol::holder_may_act(self.now, s.deadline))
    }

    /// Whether `worker` may act on the stream now.
    fn acts(&self, worker: usize, rules: &Rules) -> bool {
        let w = &self.workers[worker];
        let (Some(stream), Some(session)) = (w.stream, self.live_session(worker)) else {
            return false;
        };
        w.status == Status::Running
            && (!rules.stream_bound_to_its_session || stream.session == session.token)
    }

    fn acting(&self, rules: &Rules) -> Vec<usize> {
        (0..self.workers.len())
            .filter(|w| self.acts(*w, rules))
            .collect()
    }

    /// What the holder makes of a session renew sent now.
    fn settle_renew(
        &mut self,
        worker: usize,
        outcome: protocol::RenewOutcome,
        m: &SessionProtocol,
    ) {
        let skew = self.workers[worker].skew;
        let Some(session) = self.workers[worker].session.as_mut() else {
            return;
        };
        match protocol::deadline_after_renew(
            session.deadline,
            self.now,
            outcome,
            m.timing.lease,
            SAFETY_MARGIN,
        ) {
            Some(deadline) => {
                let behind = (session.skew_at_start - skew).max(0);
                let confirmed = outcome == protocol::RenewOutcome::Confirmed;
                self.renewed_after_step |= confirmed && behind > 0;
                session.deadline = if m.rules.clock_step_shortens_deadline && confirmed {
                    Tick(deadline.0 - behind)
                } else {
                    deadline
                };
            }
            None => self.workers[worker].session = None,
        }
    }

    /// The store's renew of `worker`'s session record, and what it proves:
    /// refused, written, or a later expiry kept (`ExpiryAhead`: unconfirmed).
    fn store_renew(
        &mut self,
        worker: usize,
        token: u64,
        lease: Duration,
    ) -> protocol::RenewOutcome {
        let wall = self.wall(worker);
        let record = &mut self.sessions[worker];
        let valid =
            record.held && record.token == token && record.expires.is_some_and(|at| at >= wall);
        if !valid {
            return protocol::RenewOutcome::Refused;
        }
        let asked = wall + lease.as_secs() as i64;
        let stored = protocol::renewed_expiry(record.expires.unwrap_or(asked), asked);
        record.expires = Some(stored);
        protocol::renew_outcome(stored, asked)
    }

    /// The stream's acquire update, under `worker`'s session.
    fn take_stream(&mut self, worker: usize, session: u64, lease: Duration) {
        self.stream = StreamRecord {
            owner: Some(worker),
            session_token: Some(session),
            token: self.stream.token + 1,
            expires: Some(self.wall(worker) + lease.as_secs() as i64),
        };
        self.workers[worker].stream = Some(StreamBelief {
            token: self.stream.token,
            session,
        });
    }
}

impl Model for SessionProtocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        // Clocks within the skew the margins absorb.
        [[0, 0], [0, 1], [1, 0]]
            .iter()
            .map(|skews| State {
                now: Tick(0),
                sessions: vec![SessionRecord::default(); WORKERS],
                stream: StreamRecord::default(),
                workers: skews
                    .iter()
                    .map(|skew| Worker {
                        status: Status::Running,
                        skew: *skew,
                        session: None,
                        stream: None,
                        seen: None,
                    })
                    .collect(),
                pauses: 0,
                crashes: 0,
                timeouts: 0,
                clock_steps: 0,
                takeovers: 0,
                stale_takeover_refused: false,
                push: None,
                pushed_taken: false,
                renewed_after_step: false,
            })
            .collect()
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let only_steps = self.timing.clock_step_only;
        if state.now.0 < self.timing.max_time {
            actions.push(Action::Tick);
        }
        for (i, worker) in state.workers.iter().enumerate() {
            match worker.status {
                Status::Running => {
                    match state.live_session(i) {
                        // With only in-session steps explored, clocks agree
                        // within the skew margin when a session begins (the
                        // margins' assumption): a host whose clock stepped
                        // back further starts no more.
                        None if !only_steps || worker.skew >= -SKEW_MARGIN_S => {
                            actions.push(Action::StartSession(i))
                        }
                        None => {}
                        Some(_) => {
                            actions.push(Action::RenewSession(i));
                            if state.timeouts == 0 && !only_steps {
                                actions.push(Action::RenewUnanswered(i, false));
                                actions.push(Action::RenewUnanswered(i, true));
                            }
                            match (worker.stream, worker.seen) {
                                (Some(_), _) if only_steps => {}
                                (Some(_), _) => actions.push(Action::Release(i)),
                                (None, seen) => {
                                    if state.push == Some(i) {
                                        actions.push(Action::TakePushed(i));
                                    }
                                    actions.push(Action::Acquire(i));
                                    actions.push(Action::Read(i));
                                    if seen.is_some() {
                                        actions.push(Action::TakeOver(i));
                                    }
                                    if !only_steps {
                                        actions.push(Action::EndSession(i));
                                    }
                                }
                            }
                        }
                    }
                    if state.pauses == 0 && !only_steps {
                        actions.push(Action::Pause(i));
                    }
                    if state.clock_steps == 0 && (!only_steps || state.live_session(i).is_some()) {
                        actions.push(Action::StepClockBack(i));
                    }
                }
                Status::Paused => actions.push(Action::Resume(i)),
                Status::Crashed => {}
            }
            if worker.status != Status::Crashed && state.crashes == 0 && !only_steps {
                actions.push(Action::Crash(i));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        let rules = &self.rules;
        match action {
            Action::Tick => s.now = Tick(s.now.0 + 1),
            Action::StartSession(w) => {
                // The session record is only ever this worker's: the acquire
                // condition lets it in (no owner, or its own).
                let wall = s.wall(w);
                let record = &mut s.sessions[w];
                record.held = true;
                record.token += 1;
                record.expires = Some(wall + self.timing.lease.as_secs() as i64);
                let token = record.token;
                s.workers[w].session = Some(SessionBelief {
                    token,
                    deadline: protocol::holder_deadline(s.now, self.timing.lease, SAFETY_MARGIN),
                    skew_at_start: s.workers[w].skew,
                });
                if rules.stream_bound_to_its_session {
                    // The keeper ended the streams of the lost session.
                    s.workers[w].stream = None;
                }
            }
            Action::RenewSession(w) => {
                let session = s.live_session(w)?;
                let outcome = s.store_renew(w, session.token, self.timing.lease);
                s.settle_renew(w, outcome, self);
            }
            Action::RenewUnanswered(w, applied) => {
                let session = s.live_session(w)?;
                if applied {
                    s.store_renew(w, session.token, self.timing.lease);
                }
                s.timeouts += 1;
                let outcome = if rules.unconfirmed_renew_keeps_deadline {
                    protocol::RenewOutcome::Unconfirmed
                } else {
                    protocol::RenewOutcome::Confirmed
                };
                s.settle_renew(w, outcome, self);
            }
            Action::TakePushed(w) => {
                s.push = None;
                let session = s.live_session(w)?;
                if rules.pushed_stream_acquired_conditionally {
                    let owner = s.stream.owner.map(|o| NAMES[o]);
                    let wall = s.wall(w);
                    if !protocol::session_acquirable(
                        owner,
                        s.stream.session_token,
                        s.stream.expires,
                        NAMES[w],
                        wall,
                        SKEW_MARGIN_S,
                    ) {
                        return Some(s);
                    }
                }
                s.take_stream(w, session.token, self.timing.lease);
                s.pushed_taken = true;
            }
            Action::Acquire(w) => {
                let session = s.live_session(w)?;
                let wall = s.wall(w);
                let owner = s.stream.owner.map(|o| NAMES[o]);
                let allowed = if rules.plain_acquire_spares_sessions {
                    protocol::session_acquirable(
                        owner,
                        s.stream.session_token,
                        s.stream.expires,
                        NAMES[w],
                        wall,
                        SKEW_MARGIN_S,
                    )
                } else {
                    protocol::acquirable(owner, s.stream.expires, NAMES[w], wall, SKEW_MARGIN_S)
                };
                if !allowed {
                    return None;
                }
                s.take_stream(w, session.token, self.timing.lease);
            }
            Action::Read(w) => {
                let seen = match (s.stream.owner, s.stream.session_token) {
                    (Some(owner), Some(session_token)) if owner != w => Some(Seen {
                        owner,
                        session_token,
                        token: s.stream.token,
                    }),
                    _ => None,
                };
                if seen == s.workers[w].seen {
                    return None;
                }
                s.workers[w].seen = seen;
            }
            Action::TakeOver(w) => {
                let session = s.live_session(w)?;
                let seen = s.workers[w].seen.take()?;
                let wall = s.wall(w);
                let margin = if rules.taker_waits_the_skew_margin {
                    SKEW_MARGIN_S
                } else {
                    0
                };
                let theirs = &s.sessions[seen.owner];
                let ended = !rules.takeover_needs_the_session_ended
                    || protocol::session_ended(
                        theirs.held.then_some(NAMES[seen.owner]),
                        Some(theirs.token),
                        theirs.expires,
                        seen.session_token,
                        wall,
                        margin,
                    );
                let unchanged = !rules.takeover_checks_the_stream_unchanged
                    || (s.stream.owner == Some(seen.owner)
                        && s.stream.session_token == Some(seen.session_token)
                        && s.stream.token == seen.token);
                if ended && unchanged {
                    s.take_stream(w, session.token, self.timing.lease);
                    s.takeovers += 1;
                } else if s.stream.token > seen.token {
                    s.stale_takeover_refused = true;
                }
            }
            Action::Release(w) => {
                let held = s.workers[w].stream.take()?;
                if s.stream.owner == Some(w) && s.stream.token == held.token {
                    s.stream.owner = None;
                    s.stream.expires = Some(0);
                    // Pushed to the other worker, delivered whenever.
                    if s.push.is_none() {
                        s.push = Some((w + 1) % WORKERS);
                    }
                }
            }
            Action::EndSession(w) => {
                let session = s.workers[w].session.take()?;
                let record = &mut s.sessions[w];
                if record.held && record.token == session.token {
                    record.held = false;
                    record.expires = Some(0);
                }
            }
            Action::Pause(w) => {
                s.workers[w].status = Status::Paused;
                s.pauses += 1;
            }
            Action::Resume(w) => s.workers[w].status = Status::Running,
            Action::Crash(w) => {
                s.workers[w] = Worker {
                    status: Status::Crashed,
                    session: None,
                    stream: None,
                    seen: None,
                    ..s.workers[w].clone()
                };
                s.crashes += 1;
            }
            Action::StepClockBack(w) => {
                s.workers[w].skew -= self.timing.clock_step;
                s.clock_steps += 1;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(
                "one holder acts at a time",
                |m: &SessionProtocol, s: &State| s.acting(&m.rules).len() <= 1,
            ),
            Property::always(
                "whoever acts holds the newest token",
                |m: &SessionProtocol, s: &State| {
                    s.acting(&m.rules)
                        .into_iter()
                        .all(|w| s.workers[w].stream.map(|b| b.token) == Some(s.stream.token))
                },
            ),
        ];
        if self.timing.clock_step_only {
            properties.push(Property::sometimes(
                "a renew confirmed after a clock step",
                |_, s: &State| s.renewed_after_step,
            ));
            return properties;
        }
        properties.extend([
            Property::sometimes("a crashed holder's stream taken over", |_, s: &State| {
                s.crashes > 0 && s.takeovers > 0
            }),
            Property::sometimes("a takeover from a stale read refused", |_, s: &State| {
                s.stale_takeover_refused
            }),
            Property::sometimes("a pushed stream taken at once", |_, s: &State| {
                s.pushed_taken
            }),
        ]);
        properties
    }
}

/// The search depth unless `LEASEHOLD_MODEL_DEPTH` says otherwise.
fn depth() -> usize {
    model_check::depth(14)
}

#[test]
fn the_shipped_session_protocol_keeps_its_promise() {
    model_check::assert_every_property("session model", || {
        model_check::explore(
            SessionProtocol {
                rules: Rules::ALL,
                timing: SHORT,
            },
            HasDiscoveries::AnyFailures,
            depth(),
        )
    });
}

/// Turns rules off and expects a counterexample to `broken`.
fn finds_without(rules: Rules, broken: &'static str) {
    finds_without_in(SHORT, depth(), rules, broken);
}

fn finds_without_in(timing: Timing, depth: usize, rules: Rules, broken: &'static str) {
    let checker = model_check::explore(
        SessionProtocol { rules, timing },
        HasDiscoveries::AnyOf([broken].into()),
        depth,
    );
    model_check::expect_counterexamples(&checker, &[broken]);
}

/// The long-lease model's search depth: a step, a renew a few ticks later and
/// a takeover past the stored expiry take 16 actions.
fn long_depth() -> usize {
    model_check::depth(17)
}

/// A holder's clock steps back 3 s during its session, further than the
/// margins absorb, and it renews before its deadline passes (a 6 s lease):
/// the deadline, shortened by the step, still comes before a taker may act.
#[test]
fn a_clock_step_during_a_session_never_lets_two_holders_act() {
    model_check::assert_every_property("session model, long lease", || {
        model_check::explore(
            SessionProtocol {
                rules: Rules::ALL,
                timing: LONG,
            },
            HasDiscoveries::AnyFailures,
            long_depth(),
        )
    });
}

#[test]
fn without_the_clock_step_rule_a_stepped_back_holder_outlives_its_expiry() {
    finds_without_in(
        LONG,
        long_depth(),
        Rules {
            clock_step_shortens_deadline: false,
            ..Rules::ALL
        },
        "one holder acts at a time",
    );
}

#[test]
fn without_the_session_condition_a_live_holders_stream_is_taken() {
    finds_without(
        Rules {
            takeover_needs_the_session_ended: false,
            ..Rules::ALL
        },
        "one holder acts at a time",
    );
}

#[test]
fn without_sparing_sessions_a_plain_acquire_takes_a_live_sessions_stream() {
    finds_without(
        Rules {
            plain_acquire_spares_sessions: false,
            ..Rules::ALL
        },
        "one holder acts at a time",
    );
}

#[test]
fn without_the_skew_margin_a_fast_clock_takes_over_early() {
    finds_without(
        Rules {
            taker_waits_the_skew_margin: false,
            ..Rules::ALL
        },
        "one holder acts at a time",
    );
}

#[test]
fn without_the_stream_check_a_stale_read_takes_from_the_new_holder() {
    finds_without(
        Rules {
            takeover_checks_the_stream_unchanged: false,
            ..Rules::ALL
        },
        "one holder acts at a time",
    );
}

#[test]
fn without_binding_streams_to_their_session_a_restarted_session_keeps_a_lost_stream() {
    finds_without(
        Rules {
            stream_bound_to_its_session: false,
            ..Rules::ALL
        },
        "one holder acts at a time",
    );
}

#[test]
fn without_keeping_the_deadline_on_an_unanswered_renew_two_holders_act_at_once() {
    finds_without(
        Rules {
            unconfirmed_renew_keeps_deadline: false,
            ..Rules::ALL
        },
        "one holder acts at a time",
    );
}

#[test]
fn without_acquiring_a_pushed_stream_a_late_push_hands_over_a_retaken_stream() {
    finds_without(
        Rules {
            pushed_stream_acquired_conditionally: false,
            ..Rules::ALL
        },
        "one holder acts at a time",
    );
}
