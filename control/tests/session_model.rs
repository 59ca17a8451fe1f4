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
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

use std::time::Duration;

use leasehold_control::protocol;
use leasehold_testkit::model_check::{self, Tick};
use stateright::{HasDiscoveries, Model, Property};

const LEASE: Duration = Duration::from_secs(3);
const SAFETY_MARGIN: Duration = Duration::from_secs(1);
const SKEW_MARGIN_S: i64 = 1;
const MAX_TIME: i64 = 7;
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
    fn settle_renew(&mut self, worker: usize, outcome: protocol::RenewOutcome) {
        let Some(session) = self.workers[worker].session.as_mut() else {
            return;
        };
        match protocol::deadline_after_renew(
            session.deadline,
            self.now,
            outcome,
            LEASE,
            SAFETY_MARGIN,
        ) {
            Some(deadline) => session.deadline = deadline,
            None => self.workers[worker].session = None,
        }
    }

    /// The store's renew of `worker`'s session record.
    fn store_renew(&mut self, worker: usize, token: u64) -> bool {
        let wall = self.wall(worker);
        let record = &mut self.sessions[worker];
        let valid =
            record.held && record.token == token && record.expires.is_some_and(|at| at >= wall);
        if valid {
            let asked = wall + LEASE.as_secs() as i64;
            record.expires = Some(protocol::renewed_expiry(
                record.expires.unwrap_or(asked),
                asked,
            ));
        }
        valid
    }

    /// The stream's acquire update, under `worker`'s session.
    fn take_stream(&mut self, worker: usize, session: u64) {
        self.stream = StreamRecord {
            owner: Some(worker),
            session_token: Some(session),
            token: self.stream.token + 1,
            expires: Some(self.wall(worker) + LEASE.as_secs() as i64),
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
            })
            .collect()
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.now.0 < MAX_TIME {
            actions.push(Action::Tick);
        }
        for (i, worker) in state.workers.iter().enumerate() {
            match worker.status {
                Status::Running => {
                    match state.live_session(i) {
                        None => actions.push(Action::StartSession(i)),
                        Some(_) => {
                            actions.push(Action::RenewSession(i));
                            if state.timeouts == 0 {
                                actions.push(Action::RenewUnanswered(i, false));
                                actions.push(Action::RenewUnanswered(i, true));
                            }
                            match (worker.stream, worker.seen) {
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
                                    actions.push(Action::EndSession(i));
                                }
                            }
                        }
                    }
                    if state.pauses == 0 {
                        actions.push(Action::Pause(i));
                    }
                    if state.clock_steps == 0 {
                        actions.push(Action::StepClockBack(i));
                    }
                }
                Status::Paused => actions.push(Action::Resume(i)),
                Status::Crashed => {}
            }
            if worker.status != Status::Crashed && state.crashes == 0 {
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
                record.expires = Some(wall + LEASE.as_secs() as i64);
                let token = record.token;
                s.workers[w].session = Some(SessionBelief {
                    token,
                    deadline: protocol::holder_deadline(s.now, LEASE, SAFETY_MARGIN),
                });
                if rules.stream_bound_to_its_session {
                    // The keeper ended the streams of the lost session.
                    s.workers[w].stream = None;
                }
            }
            Action::RenewSession(w) => {
                let session = s.live_session(w)?;
                let outcome = if s.store_renew(w, session.token) {
                    protocol::RenewOutcome::Confirmed
                } else {
                    protocol::RenewOutcome::Refused
                };
                s.settle_renew(w, outcome);
            }
            Action::RenewUnanswered(w, applied) => {
                let session = s.live_session(w)?;
                if applied {
                    s.store_renew(w, session.token);
                }
                s.timeouts += 1;
                let outcome = if rules.unconfirmed_renew_keeps_deadline {
                    protocol::RenewOutcome::Unconfirmed
                } else {
                    protocol::RenewOutcome::Confirmed
                };
                s.settle_renew(w, outcome);
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
                s.take_stream(w, session.token);
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
                s.take_stream(w, session.token);
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
                    s.take_stream(w, session.token);
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
                // As far back as the safety and skew margins absorb together.
                s.workers[w].skew -= 2;
                s.clock_steps += 1;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
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
            Property::sometimes("a crashed holder's stream taken over", |_, s: &State| {
                s.crashes > 0 && s.takeovers > 0
            }),
            Property::sometimes("a takeover from a stale read refused", |_, s: &State| {
                s.stale_takeover_refused
            }),
            Property::sometimes("a pushed stream taken at once", |_, s: &State| {
                s.pushed_taken
            }),
        ]
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
            SessionProtocol { rules: Rules::ALL },
            HasDiscoveries::AnyFailures,
            depth(),
        )
    });
}

/// Turns rules off and expects a counterexample to `broken`.
fn finds_without(rules: Rules, broken: &'static str) {
    let checker = model_check::explore(
        SessionProtocol { rules },
        HasDiscoveries::AnyOf([broken].into()),
        depth(),
    );
    model_check::expect_counterexamples(&checker, &[broken]);
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
