//! The lease-to-sink protocol, model-checked with stateright.
//!
//! Two workers, one stream, explicit discrete time (one tick = one second) so
//! that clock skew and holder deadlines are part of the state. Workers acquire,
//! open the sink (fence on acquire), read events, send writes that the network
//! may deliver arbitrarily late, renew (and sometimes never learn a renew's
//! outcome), pause, resume, crash, and step their clock back. An operator may
//! force-release the record or delete and re-create it (a restore, a TTL)
//! while the sink keeps its fence. Every decision is taken by the same
//! functions the runtime uses (`leasehold_control::protocol`): who may acquire,
//! the holder's deadline and what a renew's outcome does to it, whether a renew
//! may shorten the expiry, what the sink fences and drops, where a new owner
//! resumes, and how far a holder lifts a token that regressed below the sink's
//! fence.
//!
//! The invariants are the data path's promises. An operator's intervention
//! voids the lease of the holder it cuts off: that holder is `overridden`, no
//! longer counted by the lease's own promise (one holder acts at a time); only
//! the fence keeps its late writes out, so every sink promise still covers it.
//! Each fix of the stream-proof work has a switch in [`Fixes`]; a test turns
//! each off and checks that the model finds a counterexample, which is how we
//! know the model can fail. `LEASEHOLD_MODEL_DEPTH` raises the search depth
//! for a longer run.

use std::time::Duration;

use leasehold_control::protocol;
use leasehold_testkit::model_check::{self, Tick};
use stateright::{HasDiscoveries, Model, Property};

const WORKERS: usize = 2;
const LEASE: Duration = Duration::from_secs(3);
const SAFETY_MARGIN: Duration = Duration::from_secs(1);
const SKEW_MARGIN_S: i64 = 1;
/// The upstream produces one event per tick; the model stops time here.
const MAX_TIME: i64 = 7;
const MAX_IN_FLIGHT: usize = 2;

/// Which fixes are in place. `ALL` is the shipped protocol.
#[derive(Clone, Copy, Debug)]
struct Fixes {
    /// A new owner raises the sink's fence before it reads (else its open
    /// only reads the last sequence).
    fence_on_acquire: bool,
    /// A new owner resumes after the sink's last sequence (else after the
    /// checkpoint).
    resume_from_sink: bool,
    /// The sink drops sequences at or below its last (else it appends them,
    /// as an id window does once a replay outgrows it).
    sequence_dedup: bool,
    /// A holder acts only before its own deadline.
    holder_deadline: bool,
    /// A renew never shortens the stored expiry. Within the clock steps the
    /// margins absorb (the model's), a shortened expiry does not let a taker in
    /// early, so no test turns this off: the store conformance suite guards it.
    renew_never_shortens: bool,
    /// A renew whose outcome the holder does not learn (a timeout: the store
    /// may or may not have applied it) leaves the holder's deadline where it
    /// was (else the holder extends it as if the renew had been confirmed).
    unconfirmed_renew_keeps_deadline: bool,
    /// A holder whose open is fenced while the record still names it with its
    /// token (the record was re-created below the sink's fence) lifts the
    /// stored token past the fence (else the stream stays fenced until
    /// takeovers climb back past it).
    lift_after_regression: bool,
    /// After a lost sink connection (a failover) a holder opens the stream
    /// again before its next write and goes on after the sink's end (else it
    /// writes on above whatever the new primary lacks).
    reopen_after_reconnect: bool,
    /// A new owner resumes after the sink's end even when it is below the
    /// checkpoint (a lost tail the checkpoint covered; else it resumes after
    /// the checkpoint and leaves the lost range a hole).
    refill_below_checkpoint: bool,
}

impl Fixes {
    const ALL: Fixes = Fixes {
        fence_on_acquire: true,
        resume_from_sink: true,
        sequence_dedup: true,
        holder_deadline: true,
        renew_never_shortens: true,
        unconfirmed_renew_keeps_deadline: true,
        lift_after_regression: true,
        reopen_after_reconnect: true,
        refill_below_checkpoint: true,
    };
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Record {
    owner: Option<usize>,
    token: u64,
    /// Wall-clock expiry, as the last writer's clock had it.
    expires: Option<i64>,
    checkpoint: u64,
}

impl Record {
    /// A record nobody has held yet: new, or deleted and created again.
    const FRESH: Record = Record {
        owner: None,
        token: 0,
        expires: None,
        checkpoint: 0,
    };
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Status {
    Running,
    Paused,
    Crashed,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Belief {
    token: u64,
    deadline: Tick,
    /// The checkpoint the acquire returned.
    checkpoint: u64,
    next_seq: u64,
    opened: bool,
    /// The sink connection was lost since the open: open again first.
    reopen: bool,
    /// An operator cleared or re-created the record under this holder.
    overridden: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Worker {
    status: Status,
    /// This host's wall clock minus real time.
    skew: i64,
    belief: Option<Belief>,
    stepped_back: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Write {
    worker: usize,
    token: u64,
    seq: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Appended {
    seq: u64,
    token: u64,
    /// The highest token whose owner had opened the sink when this landed.
    opened: u64,
    /// It landed after a failover lost part of the sink: the open that had
    /// raised the id may have been lost with it.
    after_tail_loss: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct State {
    now: Tick,
    record: Record,
    workers: Vec<Worker>,
    in_flight: Vec<Write>,
    /// The sink stream's last generated id (layout v2: the fence and the
    /// high-water mark); `None` while the stream does not exist.
    last_id: Option<protocol::EntryId>,
    sink: Vec<Appended>,
    opened: u64,
    pauses: u8,
    crashes: u8,
    /// Force-releases and re-creates so far.
    interventions: u8,
    /// Renews whose outcome was never learned so far.
    timeouts: u8,
    /// Failovers that lost the sink's newest entry so far.
    tail_losses: u8,
    /// A holder's open was fenced while the record named it with its token:
    /// the record regressed below the sink's fence (cleared by a re-create).
    regression_found: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Action {
    Tick,
    Acquire(usize),
    Open(usize),
    Send(usize),
    Deliver(usize),
    Renew(usize),
    /// A renew that times out: the store applied it (`true`) or not, and the
    /// holder does not learn which.
    RenewUnanswered(usize, bool),
    /// `leasehold leases release --force`: owner cleared, expiry 0, token and
    /// checkpoint kept.
    ForceRelease,
    /// The record is deleted and created again: token and checkpoint start over.
    Recreate,
    Pause(usize),
    Resume(usize),
    Crash(usize),
    StepClockBack(usize),
    /// A failover to a replica without the sink's newest entry: it is gone,
    /// the last id is the newest kept entry's (opens since are lost too),
    /// writes in flight are lost, every connection breaks.
    SinkLosesTail,
}

struct Protocol {
    fixes: Fixes,
}

const NAMES: [&str; WORKERS] = ["w0", "w1"];

impl State {
    fn wall(&self, worker: usize) -> i64 {
        self.now.0 + self.workers[worker].skew
    }

    fn last_seq(&self) -> Option<u64> {
        protocol::last_seq_of(self.last_id)
    }

    /// The sink's fence: the token of its last id.
    fn fence(&self) -> u64 {
        self.last_id.map_or(0, |id| id.token)
    }

    /// Running workers that believe they hold the stream and may act on it.
    fn acting(&self, fixes: &Fixes) -> usize {
        self.workers
            .iter()
            .filter(|w| w.status == Status::Running)
            .filter_map(|w| w.belief.as_ref())
            .filter(|b| !b.overridden)
            .filter(|b| !fixes.holder_deadline || protocol::holder_may_act(self.now, b.deadline))
            .count()
    }

    /// The holder the record names, with the record's token, loses its lease
    /// to an operator.
    fn override_owner(&mut self) {
        let token = self.record.token;
        if let Some(owner) = self.record.owner
            && let Some(belief) = self.workers[owner].belief.as_mut()
            && belief.token == token
        {
            belief.overridden = true;
        }
    }

    /// The store's renew: applied only for the owner with its token and an
    /// unexpired record. Returns whether it was applied.
    fn store_renew(&mut self, worker: usize, token: u64, fixes: &Fixes) -> bool {
        let wall = self.wall(worker);
        let valid = self.record.owner == Some(worker)
            && self.record.token == token
            && self.record.expires.is_some_and(|at| at >= wall);
        if valid {
            let asked = wall + LEASE.as_secs() as i64;
            let stored = self.record.expires.unwrap_or(asked);
            self.record.expires = Some(if fixes.renew_never_shortens {
                protocol::renewed_expiry(stored, asked)
            } else {
                asked
            });
        }
        valid
    }

    /// What the holder makes of its renew (sent now): a deadline, or the end
    /// of its lease.
    fn settle_renew(&mut self, worker: usize, outcome: protocol::RenewOutcome) {
        let Some(belief) = self.workers[worker].belief.as_mut() else {
            return;
        };
        match protocol::deadline_after_renew(
            belief.deadline,
            self.now,
            outcome,
            LEASE,
            SAFETY_MARGIN,
        ) {
            Some(deadline) => belief.deadline = deadline,
            None => self.workers[worker].belief = None,
        }
    }

    /// The store token is at or above the sink's fence once a holder found the
    /// regression and every holder the operator cut off is gone (such a holder
    /// may still open the sink with a token the re-created record never issued).
    fn token_above_fence_after_recovery(&self) -> bool {
        let cut_off = self
            .workers
            .iter()
            .filter_map(|w| w.belief.as_ref())
            .any(|b| b.overridden);
        !self.regression_found || cut_off || self.record.token >= self.fence()
    }
}

impl Protocol {
    fn may_act(&self, state: &State, belief: &Belief) -> bool {
        !self.fixes.holder_deadline || protocol::holder_may_act(state.now, belief.deadline)
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        // Clocks within the skew the margins absorb.
        [(0, 0), (0, 1), (1, 0)]
            .into_iter()
            .map(|(a, b)| State {
                now: Tick(0),
                record: Record::FRESH,
                workers: [a, b]
                    .into_iter()
                    .map(|skew| Worker {
                        status: Status::Running,
                        skew,
                        belief: None,
                        stepped_back: false,
                    })
                    .collect(),
                in_flight: Vec::new(),
                last_id: None,
                sink: Vec::new(),
                opened: 0,
                pauses: 0,
                crashes: 0,
                interventions: 0,
                timeouts: 0,
                tail_losses: 0,
                regression_found: false,
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
                    match &worker.belief {
                        None => actions.push(Action::Acquire(i)),
                        Some(belief) if !belief.opened || belief.reopen => {
                            actions.push(Action::Open(i))
                        }
                        Some(belief) => {
                            // One batch in flight per stream: the runner awaits
                            // each write's outcome before the next.
                            let waiting = state.in_flight.iter().any(|x| x.worker == i);
                            if belief.next_seq <= state.now.0 as u64
                                && !waiting
                                && state.in_flight.len() < MAX_IN_FLIGHT
                            {
                                actions.push(Action::Send(i));
                            }
                            actions.push(Action::Renew(i));
                            if state.timeouts == 0 {
                                actions.push(Action::RenewUnanswered(i, false));
                                actions.push(Action::RenewUnanswered(i, true));
                            }
                        }
                    }
                    if state.pauses == 0 {
                        actions.push(Action::Pause(i));
                    }
                    if !worker.stepped_back {
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
        for i in 0..state.in_flight.len() {
            actions.push(Action::Deliver(i));
        }
        // A failover that loses the whole stream is outside the model: a
        // stream that does not exist resumes after the checkpoint, as the
        // contract says (docs/redis.md: what replication still allows).
        if state.tail_losses == 0 && state.sink.len() >= 2 {
            actions.push(Action::SinkLosesTail);
        }
        if state.interventions == 0 {
            if state.record.owner.is_some() {
                actions.push(Action::ForceRelease);
            }
            if state.record != Record::FRESH {
                actions.push(Action::Recreate);
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => s.now = Tick(s.now.0 + 1),
            Action::Acquire(w) => {
                let wall = s.wall(w);
                let owner = s.record.owner.map(|o| NAMES[o]);
                if !protocol::acquirable(owner, s.record.expires, NAMES[w], wall, SKEW_MARGIN_S) {
                    return None;
                }
                s.record.owner = Some(w);
                s.record.token += 1;
                s.record.expires = Some(wall + LEASE.as_secs() as i64);
                s.workers[w].belief = Some(Belief {
                    token: s.record.token,
                    deadline: protocol::holder_deadline(s.now, LEASE, SAFETY_MARGIN),
                    checkpoint: s.record.checkpoint,
                    next_seq: 0,
                    opened: false,
                    reopen: false,
                    overridden: false,
                });
            }
            Action::Open(w) => {
                let belief = s.workers[w].belief.clone()?;
                if !self.may_act(&s, &belief) {
                    s.workers[w].belief = None;
                    return Some(s);
                }
                if self.fixes.fence_on_acquire {
                    if protocol::fenced(s.fence(), belief.token) {
                        // The runner's fence-regression recovery: read the
                        // record, and lift its token if it still names this
                        // holder with this token (one conditional write).
                        if s.record.owner == Some(w) && s.record.token == belief.token {
                            s.regression_found = true;
                        }
                        let to = protocol::lifted_token(
                            s.record.owner.map(|o| NAMES[o]),
                            s.record.token,
                            NAMES[w],
                            belief.token,
                            s.fence(),
                        );
                        if self.fixes.lift_after_regression
                            && let Some(to) = to
                            // The store's condition (LIFT_CONDITION).
                            && s.record.owner == Some(w)
                            && s.record.token == belief.token
                            && s.record.token < to
                        {
                            s.record.token = to;
                        }
                        s.workers[w].belief = None;
                        return Some(s);
                    }
                    // The open script (the model's sink is the store: one step).
                    s.last_id = protocol::opened_id(s.last_id, belief.token).ok();
                }
                let resume = if belief.reopen {
                    // Going on after the sink's end: a lost tail is refilled.
                    s.last_seq().unwrap_or(0)
                } else if !self.fixes.resume_from_sink {
                    belief.checkpoint
                } else if self.fixes.refill_below_checkpoint {
                    protocol::resume_point(Some(belief.checkpoint), s.last_seq())
                } else {
                    belief.checkpoint.max(s.last_seq().unwrap_or(0))
                };
                s.opened = s.opened.max(belief.token);
                let held = s.workers[w].belief.as_mut()?;
                held.next_seq = resume + 1;
                held.opened = true;
                held.reopen = false;
            }
            Action::Send(w) => {
                let belief = s.workers[w].belief.clone()?;
                if !self.may_act(&s, &belief) {
                    s.workers[w].belief = None;
                    return Some(s);
                }
                s.in_flight.push(Write {
                    worker: w,
                    token: belief.token,
                    seq: belief.next_seq,
                });
                s.workers[w].belief.as_mut()?.next_seq += 1;
            }
            Action::Deliver(i) => {
                let write = s.in_flight.remove(i);
                let id = protocol::EntryId {
                    token: write.token,
                    seq: write.seq,
                };
                // Without de-duplication the sink admits by token alone.
                let admitted = if self.fixes.sequence_dedup {
                    protocol::admits(s.last_id, id)
                } else {
                    !protocol::fenced(s.fence(), write.token)
                };
                if !admitted && protocol::fenced(s.fence(), write.token) {
                    // The writer learns it is fenced and stops.
                    if let Some(b) = &s.workers[write.worker].belief
                        && b.token == write.token
                    {
                        s.workers[write.worker].belief = None;
                    }
                    return Some(s);
                }
                if admitted {
                    s.last_id = Some(s.last_id.map_or(id, |last| last.max(id)));
                    s.sink.push(Appended {
                        seq: write.seq,
                        token: write.token,
                        opened: s.opened,
                        after_tail_loss: s.tail_losses > 0,
                    });
                }
                // The confirmed sequence becomes the checkpoint (owner and token).
                if s.record.owner == Some(write.worker) && s.record.token == write.token {
                    s.record.checkpoint = s.record.checkpoint.max(write.seq);
                }
            }
            Action::Renew(w) => {
                let belief = s.workers[w].belief.clone()?;
                if !self.may_act(&s, &belief) {
                    s.workers[w].belief = None;
                    return Some(s);
                }
                let outcome = if s.store_renew(w, belief.token, &self.fixes) {
                    protocol::RenewOutcome::Confirmed
                } else {
                    protocol::RenewOutcome::Refused
                };
                s.settle_renew(w, outcome);
            }
            Action::RenewUnanswered(w, applied) => {
                let belief = s.workers[w].belief.clone()?;
                if !self.may_act(&s, &belief) {
                    s.workers[w].belief = None;
                    return Some(s);
                }
                if applied {
                    s.store_renew(w, belief.token, &self.fixes);
                }
                s.timeouts += 1;
                // Without the fix, the holder takes no answer as a yes.
                let outcome = if self.fixes.unconfirmed_renew_keeps_deadline {
                    protocol::RenewOutcome::Unconfirmed
                } else {
                    protocol::RenewOutcome::Confirmed
                };
                s.settle_renew(w, outcome);
            }
            Action::ForceRelease => {
                s.override_owner();
                s.record.owner = None;
                s.record.expires = Some(0);
                s.interventions += 1;
            }
            Action::Recreate => {
                s.override_owner();
                s.record = Record::FRESH;
                s.regression_found = false;
                s.interventions += 1;
            }
            Action::Pause(w) => {
                s.workers[w].status = Status::Paused;
                s.pauses += 1;
            }
            Action::Resume(w) => s.workers[w].status = Status::Running,
            Action::Crash(w) => {
                s.workers[w].status = Status::Crashed;
                s.workers[w].belief = None;
                s.crashes += 1;
            }
            Action::SinkLosesTail => {
                s.sink.pop();
                s.last_id = s.sink.last().map(|kept| protocol::EntryId {
                    token: kept.token,
                    seq: kept.seq,
                });
                s.in_flight.clear();
                s.tail_losses += 1;
                if self.fixes.reopen_after_reconnect {
                    for belief in s.workers.iter_mut().filter_map(|w| w.belief.as_mut()) {
                        belief.reopen = true;
                    }
                }
            }
            Action::StepClockBack(w) => {
                // As far back as the safety and skew margins absorb together;
                // a larger step is outside what leases can promise.
                s.workers[w].skew -= 2;
                s.workers[w].stepped_back = true;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("one holder acts at a time", |m: &Protocol, s: &State| {
                s.acting(&m.fixes) <= 1
            }),
            Property::always("sink tokens never decrease", |_, s: &State| {
                s.sink.windows(2).all(|w| w[0].token <= w[1].token)
            }),
            Property::always("each seq once, in order", |_, s: &State| {
                s.sink
                    .iter()
                    .enumerate()
                    .all(|(i, a)| a.seq == i as u64 + 1)
            }),
            // Replication is asynchronous: a failover can lose the open that
            // raised the id, and a zombie's write can land until the owner
            // opens again (SINK_WAIT_REPLICAS closes that window).
            Property::always(
                "no write of an older token lands after a newer owner opened",
                |_, s: &State| {
                    s.sink
                        .iter()
                        .all(|a| a.token >= a.opened || a.after_tail_loss)
                },
            ),
            Property::always("the checkpoint never passes the sink", |_, s: &State| {
                s.tail_losses > 0 || s.record.checkpoint <= s.last_seq().unwrap_or(0)
            }),
            Property::always(
                "the store token is at or above the sink fence after recovery",
                |_, s: &State| s.token_above_fence_after_recovery(),
            ),
            Property::sometimes("a takeover with data on both sides", |_, s: &State| {
                s.sink.first().is_some_and(|a| a.token == 1)
                    && s.sink.last().is_some_and(|a| a.token >= 2)
            }),
            Property::sometimes("a lost tail refilled", |_, s: &State| {
                s.tail_losses > 0 && s.sink.iter().any(|a| a.after_tail_loss)
            }),
        ]
    }
}

/// The search depth unless `LEASEHOLD_MODEL_DEPTH` says otherwise.
fn depth() -> usize {
    model_check::depth(16)
}

#[test]
fn the_shipped_protocol_keeps_every_promise() {
    model_check::assert_every_property("protocol model", || {
        model_check::explore(
            Protocol { fixes: Fixes::ALL },
            HasDiscoveries::AnyFailures,
            depth(),
        )
    });
}

/// Turns one fix off and expects the model to find a counterexample to
/// `broken`; the search stops at the first (breadth-first: a short one).
fn finds_without(fixes: Fixes, broken: &'static str) {
    finds_within(fixes, broken, depth())
}

/// [`finds_without`] for a counterexample longer than the default depth.
fn finds_within(fixes: Fixes, broken: &'static str, depth: usize) {
    let checker = model_check::explore(
        Protocol { fixes },
        HasDiscoveries::AnyOf([broken].into()),
        depth,
    );
    model_check::expect_counterexamples(&checker, &[broken]);
}

#[test]
fn without_fence_on_acquire_a_zombies_late_write_lands() {
    finds_without(
        Fixes {
            fence_on_acquire: false,
            ..Fixes::ALL
        },
        "no write of an older token lands after a newer owner opened",
    );
}

#[test]
fn without_sequence_dedup_an_event_is_appended_twice() {
    finds_without(
        Fixes {
            resume_from_sink: false,
            sequence_dedup: false,
            ..Fixes::ALL
        },
        "each seq once, in order",
    );
}

#[test]
fn without_keeping_the_deadline_on_an_unanswered_renew_two_holders_act_at_once() {
    finds_without(
        Fixes {
            unconfirmed_renew_keeps_deadline: false,
            ..Fixes::ALL
        },
        "one holder acts at a time",
    );
}

#[test]
fn without_the_lift_a_recreated_record_stays_below_the_sinks_fence() {
    finds_without(
        Fixes {
            lift_after_regression: false,
            ..Fixes::ALL
        },
        "the store token is at or above the sink fence after recovery",
    );
}

#[test]
fn without_the_holder_deadline_two_holders_act_at_once() {
    finds_without(
        Fixes {
            holder_deadline: false,
            ..Fixes::ALL
        },
        "one holder acts at a time",
    );
}

#[test]
fn without_the_reopen_a_lost_tail_becomes_a_silent_gap() {
    finds_without(
        Fixes {
            reopen_after_reconnect: false,
            ..Fixes::ALL
        },
        "each seq once, in order",
    );
}

#[test]
fn without_refilling_below_the_checkpoint_a_takeover_leaves_a_lost_tail_a_gap() {
    // Two events, the tail lost, a forced release and a new owner's first
    // write: fifteen steps, one past the default depth.
    finds_within(
        Fixes {
            refill_below_checkpoint: false,
            ..Fixes::ALL
        },
        "each seq once, in order",
        depth().max(17),
    );
}
