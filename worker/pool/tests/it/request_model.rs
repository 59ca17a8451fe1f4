//! The order path, model-checked with stateright.
//!
//! Two users, three broker workers, one paper broker (a ledger per account,
//! keyed by client order id = request id, refusing a repeated id), and the
//! pool bus (marks, request records, response keys, processing lists). u0
//! sends one request that expires at tick 1; u1 sends one request that reuses
//! u0's request id; the API may resend u0's order under a new id once it was
//! answered "not executed". w0 holds u0's mark, w1 holds u1's, w2 is spare.
//!
//! A worker performs a request the way `leasehold-broker`'s serve loop does
//! (`request()`, `place()`, `lookup()`), one transition per step so that
//! everything else can happen in between: begin (a bus step), then the
//! [`Step`]s of the settlement core — connect (the expiry checked before
//! it), send (the expiry checked again and the holder deadline), look up,
//! and the final answer, replay or dead letter (bus steps). Each bus step is
//! one atomic transition that calls the rule the Redis scripts and the memory
//! bus apply (`begin_rule`, `final_answer_rule`); every decision in between
//! is the core's (`after_begin`, `after_send`, `after_lookup`,
//! `send_budget`). Nothing is re-implemented here but the I/O.
//!
//! What can go wrong, each at most once per run: a worker crashes (its local
//! state is gone, the request stays in processing), pauses (a zombie: its
//! mark expires, supervision gives the user to an idle worker, and later it
//! resumes its step), loses a bus reply (the step applied, the worker retries
//! it), loses Redis for a while (bus steps and heartbeats fail; it can still
//! reach the broker); the broker times out (the order booked before the call
//! gave up, never, or at any later step: a broker may book an order it took
//! after the worker stopped waiting), which is also how a lost broker reply
//! looks, or fails a lookup; a failover loses an
//! `executing` record while the broker keeps the order; time passes (one
//! tick, past u0's `expires_at`). Worker and broker faults strike u0's
//! workers only: u1 is a well-behaved neighbour whose request reuses the id,
//! which keeps the whole state space small enough to exhaust in the test
//! command.
//!
//! Time is abstract except for `expires_at`. A holder's mark expires only
//! while it does not heartbeat (crashed, paused, cut off), and its holder
//! deadline (`Holder::may_act`, the mark TTL minus a heartbeat) has passed
//! by then: the model ends both at once, the latest the deadline can end,
//! which only ever gives a zombie more room.
//!
//! The invariants are the order path's promises: each order is executed at
//! most once (per client order id, and per order the user meant, counting
//! the API's resend of an answer that said "not executed"); a request gets
//! at most one final response and a stored response is never replaced; only
//! the mark holder stores a final response; no user reads another user's
//! response; an expired request is never executed; no response says "not
//! executed" of an order the broker holds; and deliveries count only mark
//! holders. Each fix of issue #28 has a switch in [`Fixes`]; a test turns
//! each off and checks that the model finds a counterexample, which is how we
//! know the model can fail. A lost record meeting a passed `expires_at` is
//! how the model found that an expired request must be looked up before it is
//! answered `expired` (the lost record hid an order placed before the
//! expiry); the core now does (`LookUpFor::Expired`). `LEASEHOLD_MODEL_DEPTH`
//! bounds the search (by default deep enough to exhaust the model).

use leasehold_pool::bus::Begun;
use leasehold_pool::bus::answer::{FinalVerdict, final_answer_rule};
use leasehold_pool::bus::begin::{BeginWrite, RecordView, begin_rule};
use leasehold_pool::protocol::{ErrorCode, record};
use leasehold_pool::settlement::{self, Final, LookUpFor, Looked, Sent, Step};
use leasehold_testkit::model_check;
use stateright::{Checker, HasDiscoveries, Model, Property};

const USERS: [&str; 2] = ["u0", "u1"];
const WORKERS: [&str; 3] = ["w0", "w1", "w2"];
/// `REQUEST_MAX_DELIVERIES`, small so that the poison settlement is reached.
const MAX_DELIVERIES: u32 = 2;
/// One tick of the model in the core's unix milliseconds.
const TICK_MS: u64 = 1_000;
const ORDER_TIMEOUT_MS: u64 = 10_000;
const MAX_TIME: u64 = 1;

/// A request as the API pushed it. The model's requests are fixed; which
/// are pending is state.
#[derive(Clone, Copy, Debug)]
struct Request {
    user: usize,
    /// Index of the request id (the client order id at the broker).
    id: usize,
    /// In ticks.
    expires_at: Option<u64>,
    /// The order the user means: a resend carries the same one.
    intent: usize,
}

const REQUESTS: [Request; 3] = [
    // u0's order, expiring.
    Request {
        user: 0,
        id: 0,
        expires_at: Some(1),
        intent: 0,
    },
    // u1's request reusing u0's id.
    Request {
        user: 1,
        id: 0,
        expires_at: None,
        intent: 1,
    },
    // The API's resend of u0's order, under a new id.
    Request {
        user: 0,
        id: 1,
        expires_at: None,
        intent: 0,
    },
];
const RESEND: usize = 2;
const IDS: usize = 2;

/// Which fixes are in place. `ALL` is the shipped protocol.
#[derive(Clone, Copy, Debug)]
struct Fixes {
    /// The final answer is stored only by the mark holder that began the
    /// request, while it is `executing` (else stored unconditionally, as the
    /// old `ANSWER_REQUEST` did).
    fenced_final_answer: bool,
    /// Only the mark holder begins a request (else begin ignores the mark).
    begin_needs_mark: bool,
    /// Another user's record is dead-lettered, never replayed or settled
    /// (else it is treated as the caller's own, as the old script did by
    /// dropping its `user_id`).
    foreign_request_id: bool,
    /// The expiry is checked again once the connection is ready (else only
    /// before the connect).
    expiry_rechecked: bool,
    /// A client order id the broker refuses as used is looked up (else it is
    /// answered `duplicate`, not executed).
    duplicate_looked_up: bool,
    /// A worker sends an order only while it can show it holds the mark.
    holder_deadline: bool,
    /// A timed-out order whose lookup finds nothing is answered `in_doubt`
    /// (else `timeout`, not executed, as the old core did).
    in_doubt_after_timeout: bool,
}

impl Fixes {
    const ALL: Fixes = Fixes {
        fenced_final_answer: true,
        begin_needs_mark: true,
        foreign_request_id: true,
        expiry_rechecked: true,
        duplicate_looked_up: true,
        holder_deadline: true,
        in_doubt_after_timeout: true,
    };
}

/// When a timed-out order reaches the broker's ledger.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Booked {
    /// Before the call gave up.
    Now,
    /// Never: the order was lost before the broker took it.
    Never,
    /// At some later step ([`Action::Book`]): the broker took the order and
    /// books it after the worker gave up on the call (a queue at the broker,
    /// a gateway retry). Only with [`OrderPath::late_booking`].
    Later,
}

/// An order as the broker reports it: whose account and which id.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Order {
    account: usize,
    id: usize,
}

/// A final answer, as [`Final`] says it (kept in the model's own hashable
/// form).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum Ans {
    Ok(Order),
    Error {
        code: &'static str,
        may_have_executed: bool,
    },
}

impl From<Final<Order>> for Ans {
    fn from(answer: Final<Order>) -> Self {
        let may_have_executed = answer.may_have_executed();
        match answer {
            Final::Ok(order) => Ans::Ok(order),
            Final::Error(code, _) => Ans::Error {
                code: code.as_str(),
                may_have_executed,
            },
        }
    }
}

/// A stored response: the user it was written for (`for_user`) and the
/// answer.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Resp {
    user: usize,
    ans: Ans,
}

impl Resp {
    fn says_not_executed(&self) -> bool {
        matches!(
            self.ans,
            Ans::Error {
                may_have_executed: false,
                ..
            }
        )
    }

    /// The JSON the bus hands back in `Begun::Done`.
    fn encode(&self) -> String {
        format!("{self:?}")
    }
}

/// A request record. `user` and `worker` are `None` when the old final-answer
/// script created the record (it wrote only state and response).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Record {
    done: bool,
    user: Option<usize>,
    worker: Option<usize>,
    deliveries: u32,
    response: Option<Resp>,
}

impl Record {
    fn view(&self) -> RecordView<'_> {
        RecordView {
            state: if self.done {
                record::DONE
            } else {
                record::EXECUTING
            },
            user_id: self.user.map_or("", |u| USERS[u]),
            worker_id: self.worker.map_or("", |w| WORKERS[w]),
            deliveries: self.deliveries,
        }
    }
}

/// Where a worker is in one request: the next transition it performs.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum Pc {
    Begin,
    /// `Step::Place`: the expiry check, then the connect.
    Place,
    /// The connection is ready: the expiry check, the holder deadline, send.
    Connected,
    LookUp(LookUpFor),
    Answer(Ans),
    Replay(Resp),
    DeadLetter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Job {
    request: usize,
    pc: Pc,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Status {
    Running,
    Paused,
    Crashed,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Worker {
    status: Status,
    /// The user it was claimed for.
    user: Option<usize>,
    /// `Holder::may_act`: its last confirmed heartbeat is within the grace.
    current: bool,
    /// A heartbeat found the mark another's (or gone): it exits at its next
    /// turn of the serve loop (mid-request it goes on with its step).
    lost: bool,
    /// Cut off from Redis.
    cut: bool,
    job: Option<Job>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Placed {
    account: usize,
    id: usize,
    at: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct State {
    now: u64,
    workers: Vec<Worker>,
    /// Which worker's mark each user has.
    marks: Vec<Option<usize>>,
    records: Vec<Option<Record>>,
    /// The response key of each request id.
    responses: Vec<Option<Resp>>,
    /// The broker's ledger.
    ledger: Vec<Placed>,
    /// An order the broker took and has not booked yet (`Booked::Later`).
    in_flight: Option<Placed>,
    /// In the user's queue or processing list.
    pending: Vec<bool>,
    /// The response the API read when its request left processing.
    delivered: Vec<Option<Resp>>,
    /// The final response stored for each request.
    finals: Vec<Option<Resp>>,
    /// How many times a worker holding the user's mark created or took over
    /// each request's record.
    holder_takes: Vec<u8>,
    /// A request got a second, different final response.
    two_finals: bool,
    /// A response key was overwritten with a different response.
    replaced: bool,
    /// A final response was stored by a worker not holding the user's mark.
    unfenced: bool,
    crashes: u8,
    pauses: u8,
    cuts: u8,
    lost_replies: u8,
    broker_faults: u8,
    failovers: u8,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Action {
    Tick,
    /// Supervision gives a user with no mark to an idle worker.
    Claim(usize, usize),
    /// A heartbeat goes through and the worker learns its mark is gone.
    Heartbeat(usize),
    /// A bus step (begin, final answer, replay, dead letter); with `true` it
    /// applies but the worker never learns and retries it.
    Bus(usize, bool),
    /// The expiry check before the connect, and the connect.
    Connect(usize),
    /// The expiry check, the holder deadline and the order call: answered
    /// (`None`) or timed out, with the order booked then, never or later.
    Send(usize, Option<Booked>),
    /// The broker books the order it took before a timed-out call gave up.
    Book,
    /// A lookup by client order id: answered, or failed (`true`).
    LookUp(usize, bool),
    Pause(usize),
    Resume(usize),
    Crash(usize),
    CutRedis(usize),
    RestoreRedis(usize),
    /// The user's mark expires, its holder no longer heartbeating (crashed,
    /// paused, cut off): the holder's deadline passed before.
    MarkExpires(usize),
    /// A failover loses an `executing` record (the ledger keeps the order).
    LoseRecord(usize),
    /// The API resends an order answered "not executed".
    Resend,
}

struct OrderPath {
    fixes: Fixes,
    /// The broker may book a timed-out order at any later step (else a
    /// timed-out order is booked before the call gives up, or never).
    late_booking: bool,
}

impl State {
    fn oldest_pending(&self, user: usize) -> Option<usize> {
        (0..REQUESTS.len()).find(|&r| self.pending[r] && REQUESTS[r].user == user)
    }

    fn holds(&self, account: usize, id: usize) -> bool {
        self.ledger
            .iter()
            .any(|p| p.account == account && p.id == id)
    }

    /// The serve loop's next turn after a request ended or was left for a
    /// retry: a worker that learned its mark is gone exits.
    fn next_turn(&mut self, w: usize, retry: bool) {
        let worker = &mut self.workers[w];
        if worker.lost {
            worker.user = None;
            worker.job = None;
            worker.lost = false;
            worker.current = false;
        } else if retry {
            if let Some(job) = worker.job.as_mut() {
                job.pc = Pc::Begin;
            }
        } else {
            worker.job = None;
        }
    }

    fn set_pc(&mut self, w: usize, pc: Pc) {
        if let Some(job) = self.workers[w].job.as_mut() {
            job.pc = pc;
        }
    }

    /// Writes a response key, noting whether that replaced another response.
    fn write_response(&mut self, id: usize, resp: &Resp) {
        if self.responses[id].as_ref().is_some_and(|old| old != resp) {
            self.replaced = true;
        }
        self.responses[id] = Some(resp.clone());
    }

    /// The request leaves processing; its API reads the response key.
    fn finish(&mut self, request: usize, answered: bool) {
        if self.pending[request] && answered && self.delivered[request].is_none() {
            self.delivered[request] = self.responses[REQUESTS[request].id].clone();
        }
        self.pending[request] = false;
    }
}

impl OrderPath {
    /// Turns a core step into the worker's next transition; `None` when the
    /// core says stop (not the holder: nothing changes, the worker tries
    /// again until a heartbeat tells it its mark is gone).
    fn pc_of(step: Step<Order>, done: Option<&Resp>) -> Option<Pc> {
        Some(match step {
            Step::Place => Pc::Place,
            Step::LookUp(why) => Pc::LookUp(why),
            Step::Answer(answer) => Pc::Answer(answer.into()),
            Step::Replay(text) => {
                let resp = done.cloned()?;
                assert_eq!(text, resp.encode(), "the replay is the stored response");
                Pc::Replay(resp)
            }
            Step::DeadLetter(_) => Pc::DeadLetter,
            Step::Stop => return None,
        })
    }

    fn begin(&self, s: &mut State, w: usize, lost_reply: bool) -> Option<()> {
        let user = s.workers[w].user?;
        let job = s.workers[w].job.clone()?;
        let request = REQUESTS[job.request];
        let mark = s.marks[user].map(|m| WORKERS[m]);
        // Without the fix the script does not read the mark.
        let mark = if self.fixes.begin_needs_mark {
            mark
        } else {
            Some(WORKERS[w])
        };
        let stored = s.records[request.id].clone();
        let view = stored.as_ref().map(|r| {
            let mut view = r.view();
            // Without the fix the record's owner is not compared: every
            // record reads as the caller's.
            if !self.fixes.foreign_request_id {
                view.user_id = USERS[user];
            }
            view
        });
        let (begun, write) = begin_rule(view, mark, USERS[user], WORKERS[w]);
        if write != BeginWrite::Nothing && s.marks[user] == Some(w) {
            s.holder_takes[job.request] += 1;
        }
        match write {
            BeginWrite::Nothing => {
                if lost_reply {
                    // Nothing applied: the same as a retry.
                    return None;
                }
            }
            BeginWrite::Create => {
                s.records[request.id] = Some(Record {
                    done: false,
                    user: Some(user),
                    worker: Some(w),
                    deliveries: 1,
                    response: None,
                });
            }
            BeginWrite::TakeOver => {
                let rec = s.records[request.id].as_mut()?;
                rec.worker = Some(w);
                rec.deliveries += 1;
            }
        }
        if lost_reply {
            return Some(());
        }
        let done = stored.as_ref().and_then(|r| r.response.as_ref());
        let begun = match begun {
            Begun::Done { user_id, .. } => Begun::Done {
                user_id,
                response: done.map(Resp::encode).unwrap_or_default(),
            },
            other => other,
        };
        match Self::pc_of(
            settlement::after_begin(&begun, USERS[user], MAX_DELIVERIES),
            done,
        ) {
            Some(pc) => s.set_pc(w, pc),
            // Not the holder: nothing changed, it tries again after a pause
            // until a heartbeat tells it which.
            None => return None,
        }
        Some(())
    }

    fn final_answer(&self, s: &mut State, w: usize, ans: Ans, lost_reply: bool) -> Option<()> {
        let user = s.workers[w].user?;
        let job = s.workers[w].job.clone()?;
        let request = REQUESTS[job.request];
        let verdict = if self.fixes.fenced_final_answer {
            final_answer_rule(
                s.records[request.id].as_ref().map(Record::view),
                s.marks[user].map(|m| WORKERS[m]),
                WORKERS[w],
            )
        } else {
            FinalVerdict::Store
        };
        match verdict {
            FinalVerdict::Store => {
                let resp = Resp { user, ans };
                if s.marks[user] != Some(w) {
                    s.unfenced = true;
                }
                if s.finals[job.request]
                    .as_ref()
                    .is_some_and(|old| *old != resp)
                {
                    s.two_finals = true;
                }
                s.finals[job.request] = Some(resp.clone());
                let rec = s.records[request.id].get_or_insert(Record {
                    done: true,
                    user: None,
                    worker: None,
                    deliveries: 0,
                    response: None,
                });
                rec.done = true;
                rec.response = Some(resp.clone());
                s.write_response(request.id, &resp);
                s.finish(job.request, true);
                if !lost_reply {
                    s.next_turn(w, false);
                }
            }
            FinalVerdict::AlreadyStored => {
                if lost_reply {
                    return None;
                }
                s.next_turn(w, false);
            }
            FinalVerdict::Fenced => {
                if lost_reply {
                    return None;
                }
                // `Unfinished::NotHolder`: the request stays in processing and
                // the serve loop takes it again from begin.
                s.next_turn(w, true);
            }
        }
        Some(())
    }

    fn send(&self, s: &mut State, w: usize, timed_out: Option<Booked>) -> Option<()> {
        let user = s.workers[w].user?;
        let job = s.workers[w].job.clone()?;
        let request = REQUESTS[job.request];
        if self.fixes.expiry_rechecked
            && let Err(instead) = settlement::send_budget::<Order>(
                request.expires_at.map(|t| t * TICK_MS),
                s.now * TICK_MS,
                ORDER_TIMEOUT_MS,
            )
        {
            s.set_pc(w, Self::pc_of(instead, None)?);
            return Some(());
        }
        if self.fixes.holder_deadline && !s.workers[w].current {
            // `Unfinished::NotHolder`: nothing placed; begin again later.
            s.next_turn(w, true);
            return Some(());
        }
        let held = s.holds(user, request.id);
        let order = Order {
            account: user,
            id: request.id,
        };
        let sent = match timed_out {
            None if held => Sent::Duplicate,
            None => {
                s.ledger.push(Placed {
                    account: user,
                    id: request.id,
                    at: s.now,
                });
                Sent::Placed(order)
            }
            Some(booked) => {
                s.broker_faults += 1;
                let placed = Placed {
                    account: user,
                    id: request.id,
                    at: s.now,
                };
                match booked {
                    Booked::Now if !held => s.ledger.push(placed),
                    Booked::Later => s.in_flight = Some(placed),
                    Booked::Now | Booked::Never => {}
                }
                Sent::TimedOut("place_order timed out".to_owned())
            }
        };
        let step = match sent {
            // The old code: a refused client order id answered at once.
            Sent::Duplicate if !self.fixes.duplicate_looked_up => Step::Answer(Final::Error(
                ErrorCode::Duplicate,
                "duplicate client order id; not executed".to_owned(),
            )),
            sent => settlement::after_send(sent),
        };
        let pc = Self::pc_of(step, None)?;
        s.set_pc(w, pc);
        Some(())
    }
}

impl Model for OrderPath {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let worker = |user: Option<usize>| Worker {
            status: Status::Running,
            user,
            current: user.is_some(),
            lost: false,
            cut: false,
            job: None,
        };
        vec![State {
            now: 0,
            workers: vec![worker(Some(0)), worker(Some(1)), worker(None)],
            marks: vec![Some(0), Some(1)],
            records: vec![None; IDS],
            responses: vec![None; IDS],
            ledger: Vec::new(),
            in_flight: None,
            pending: vec![true, true, false],
            delivered: vec![None; REQUESTS.len()],
            finals: vec![None; REQUESTS.len()],
            holder_takes: vec![0; REQUESTS.len()],
            two_finals: false,
            replaced: false,
            unfenced: false,
            crashes: 0,
            pauses: 0,
            cuts: 0,
            lost_replies: 0,
            broker_faults: 0,
            failovers: 0,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        // A broker books a late order before `expires_at` passes and before
        // the sender's mark can expire (what docs/messages.md asks of a
        // broker): the lookups that settle a request someone else may have
        // sent (`expired` after a lost record, `poison` after repeated
        // takes) are then conclusive. A broker that books later can fill an
        // order so answered (docs/deviations.md); lifting this bound, the
        // model finds both.
        if s.now < MAX_TIME && s.in_flight.is_none() {
            actions.push(Action::Tick);
        }
        for (w, worker) in s.workers.iter().enumerate() {
            // Faults strike the workers of u0, whose order the promises are
            // about; u1 is a well-behaved neighbour reusing its id (which keeps
            // the state space small enough for the test command).
            let faulty = worker.user == Some(0);
            match worker.status {
                Status::Running => {
                    if s.pauses == 0 && faulty {
                        actions.push(Action::Pause(w));
                    }
                }
                Status::Paused => actions.push(Action::Resume(w)),
                Status::Crashed => continue,
            }
            if s.crashes == 0 && faulty {
                actions.push(Action::Crash(w));
            }
            if worker.cut {
                actions.push(Action::RestoreRedis(w));
            } else if s.cuts == 0 && faulty {
                actions.push(Action::CutRedis(w));
            }
            if worker.status != Status::Running {
                continue;
            }
            let Some(user) = worker.user else {
                if !worker.cut {
                    for u in 0..USERS.len() {
                        if s.marks[u].is_none() && s.oldest_pending(u).is_some() {
                            actions.push(Action::Claim(w, u));
                        }
                    }
                }
                continue;
            };
            if !worker.cut && !worker.lost && s.marks[user] != Some(w) {
                actions.push(Action::Heartbeat(w));
            }
            let bus = match &worker.job {
                None => s.oldest_pending(user).is_some() || worker.lost,
                Some(job) => matches!(
                    job.pc,
                    Pc::Begin | Pc::Answer(_) | Pc::Replay(_) | Pc::DeadLetter
                ),
            };
            if bus && !worker.cut {
                actions.push(Action::Bus(w, false));
                if s.lost_replies == 0 && faulty {
                    actions.push(Action::Bus(w, true));
                }
            }
            match worker.job.as_ref().map(|j| &j.pc) {
                Some(Pc::Place) => actions.push(Action::Connect(w)),
                Some(Pc::Connected) => {
                    actions.push(Action::Send(w, None));
                    if s.broker_faults == 0 && faulty {
                        actions.push(Action::Send(w, Some(Booked::Never)));
                        actions.push(Action::Send(w, Some(Booked::Now)));
                        if self.late_booking {
                            actions.push(Action::Send(w, Some(Booked::Later)));
                        }
                    }
                }
                Some(Pc::LookUp(_)) => {
                    actions.push(Action::LookUp(w, false));
                    if s.broker_faults == 0 && faulty {
                        actions.push(Action::LookUp(w, true));
                    }
                }
                _ => {}
            }
        }
        for (u, mark) in s.marks.iter().enumerate() {
            if s.in_flight.is_some() {
                break;
            }
            if let Some(h) = *mark {
                let holder = &s.workers[h];
                let heartbeating = holder.status == Status::Running
                    && !holder.cut
                    && holder.user == Some(u)
                    && holder.current;
                if !heartbeating {
                    actions.push(Action::MarkExpires(u));
                }
            }
        }
        if s.in_flight.is_some() {
            actions.push(Action::Book);
        }
        if s.failovers == 0 {
            for (id, rec) in s.records.iter().enumerate() {
                if rec.as_ref().is_some_and(|r| !r.done) {
                    actions.push(Action::LoseRecord(id));
                }
            }
        }
        if !s.pending[RESEND]
            && s.delivered[RESEND].is_none()
            && s.delivered[0]
                .as_ref()
                .is_some_and(|r| r.user == 0 && r.says_not_executed())
        {
            actions.push(Action::Resend);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => s.now += 1,
            Action::Claim(w, u) => {
                s.marks[u] = Some(w);
                let worker = &mut s.workers[w];
                worker.user = Some(u);
                worker.current = true;
                worker.lost = false;
                worker.job = None;
            }
            Action::Heartbeat(w) => {
                s.workers[w].lost = true;
                s.workers[w].current = false;
            }
            Action::Bus(w, lost_reply) => {
                if lost_reply {
                    s.lost_replies += 1;
                }
                let user = s.workers[w].user?;
                let pc = match &s.workers[w].job {
                    Some(job) => job.pc.clone(),
                    None => {
                        if s.workers[w].lost {
                            s.next_turn(w, false);
                            return Some(s);
                        }
                        // The pop: the oldest request in processing.
                        let request = s.oldest_pending(user)?;
                        s.workers[w].job = Some(Job {
                            request,
                            pc: Pc::Begin,
                        });
                        Pc::Begin
                    }
                };
                let request = s.workers[w].job.as_ref()?.request;
                match pc {
                    Pc::Begin => self.begin(&mut s, w, lost_reply)?,
                    Pc::Answer(ans) => self.final_answer(&mut s, w, ans, lost_reply)?,
                    Pc::Replay(resp) => {
                        s.write_response(REQUESTS[request].id, &resp);
                        s.finish(request, true);
                        if !lost_reply {
                            s.next_turn(w, false);
                        }
                    }
                    Pc::DeadLetter => {
                        if !s.pending[request] && lost_reply {
                            return None;
                        }
                        s.finish(request, false);
                        if !lost_reply {
                            s.next_turn(w, false);
                        }
                    }
                    _ => return None,
                }
            }
            Action::Connect(w) => {
                let job = s.workers[w].job.clone()?;
                let request = REQUESTS[job.request];
                // Before connecting too: an expired request needs no
                // connection (in the old code, the only check).
                match settlement::send_budget::<Order>(
                    request.expires_at.map(|t| t * TICK_MS),
                    s.now * TICK_MS,
                    ORDER_TIMEOUT_MS,
                ) {
                    Ok(_) => s.set_pc(w, Pc::Connected),
                    Err(instead) => s.set_pc(w, Self::pc_of(instead, None)?),
                }
            }
            Action::Send(w, timed_out) => self.send(&mut s, w, timed_out)?,
            Action::Book => {
                let placed = s.in_flight.take()?;
                // The broker refuses a client order id it holds already.
                if !s.holds(placed.account, placed.id) {
                    s.ledger.push(placed);
                }
            }
            Action::LookUp(w, fails) => {
                let user = s.workers[w].user?;
                let job = s.workers[w].job.clone()?;
                let Pc::LookUp(why) = job.pc else {
                    return None;
                };
                let id = REQUESTS[job.request].id;
                let looked = if fails {
                    s.broker_faults += 1;
                    Looked::Failed("lookup_order timed out".to_owned())
                } else if s.holds(user, id) {
                    Looked::Found(Order { account: user, id })
                } else {
                    Looked::Absent
                };
                let step = match (&why, &looked) {
                    // The old core: absent after a timeout meant not executed.
                    (LookUpFor::TimedOut(err), Looked::Absent)
                        if !self.fixes.in_doubt_after_timeout =>
                    {
                        Step::Answer(Final::Error(
                            ErrorCode::Timeout,
                            format!("{err}; the broker holds no such order: not executed"),
                        ))
                    }
                    _ => settlement::after_lookup(why, looked),
                };
                let pc = Self::pc_of(step, None)?;
                s.set_pc(w, pc);
            }
            Action::Pause(w) => {
                s.workers[w].status = Status::Paused;
                s.pauses += 1;
            }
            Action::Resume(w) => s.workers[w].status = Status::Running,
            Action::Crash(w) => {
                s.workers[w] = Worker {
                    status: Status::Crashed,
                    user: None,
                    current: false,
                    lost: false,
                    cut: false,
                    job: None,
                };
                s.crashes += 1;
            }
            Action::CutRedis(w) => {
                s.workers[w].cut = true;
                s.cuts += 1;
            }
            Action::RestoreRedis(w) => s.workers[w].cut = false,
            Action::MarkExpires(u) => {
                if let Some(h) = s.marks[u].take()
                    && s.workers[h].user == Some(u)
                {
                    s.workers[h].current = false;
                }
            }
            Action::LoseRecord(id) => {
                s.records[id] = None;
                s.failovers += 1;
            }
            Action::Resend => s.pending[RESEND] = true,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("each order is executed at most once", |_, s: &State| {
                // Per client order id (the broker refuses a repeat), and
                // per order the user meant: the API resends an order
                // answered "not executed" under a new id.
                (0..REQUESTS.len()).all(|r| {
                    let req = REQUESTS[r];
                    let by_id = s
                        .ledger
                        .iter()
                        .filter(|p| p.account == req.user && p.id == req.id)
                        .count();
                    let by_intent = s
                        .ledger
                        .iter()
                        .filter(|p| {
                            REQUESTS.iter().any(|q| {
                                q.intent == req.intent && q.user == p.account && q.id == p.id
                            })
                        })
                        .count();
                    by_id <= 1 && by_intent <= 1
                })
            }),
            Property::always(
                "each request gets at most one final response",
                |_, s: &State| !s.two_finals,
            ),
            Property::always("a stored response is never replaced", |_, s: &State| {
                !s.replaced
            }),
            Property::always(
                "a final response is stored only by the mark holder",
                |_, s: &State| !s.unfenced,
            ),
            Property::always("no user reads another user's response", |_, s: &State| {
                (0..REQUESTS.len()).all(|r| {
                    s.delivered[r].as_ref().is_none_or(|resp| {
                        resp.user == REQUESTS[r].user
                            && match resp.ans {
                                Ans::Ok(order) => order.account == REQUESTS[r].user,
                                Ans::Error { .. } => true,
                            }
                    })
                })
            }),
            Property::always("an expired request is never executed", |_, s: &State| {
                s.ledger.iter().all(|p| {
                    REQUESTS
                        .iter()
                        .filter(|q| q.user == p.account && q.id == p.id)
                        .all(|q| q.expires_at.is_none_or(|at| p.at < at))
                })
            }),
            Property::always(
                "no response says not executed for an order the broker holds",
                |_, s: &State| {
                    s.responses.iter().enumerate().all(|(id, resp)| {
                        resp.as_ref()
                            .is_none_or(|resp| !resp.says_not_executed() || !s.holds(resp.user, id))
                    })
                },
            ),
            Property::always(
                "a request is settled as poison only once more than MAX_DELIVERIES mark holders took it",
                |_, s: &State| {
                    (0..REQUESTS.len()).all(|r| {
                        let poison = matches!(
                            s.finals[r],
                            Some(Resp {
                                ans: Ans::Error { code: "poison", .. },
                                ..
                            })
                        );
                        !poison || u32::from(s.holder_takes[r]) > MAX_DELIVERIES
                    })
                },
            ),
            Property::sometimes("a request is settled as poison", |_, s: &State| {
                s.finals
                    .iter()
                    .flatten()
                    .any(|r| matches!(r.ans, Ans::Error { code: "poison", .. }))
            }),
            Property::sometimes("u0's order is executed and answered", |_, s: &State| {
                matches!(
                    s.delivered[0],
                    Some(Resp {
                        ans: Ans::Ok(_),
                        ..
                    })
                )
            }),
        ]
    }
}

/// Explores until `finish_when` holds, by default deep enough to exhaust the
/// model.
fn check(fixes: Fixes, finish_when: HasDiscoveries) -> impl Checker<OrderPath> {
    let model = OrderPath {
        fixes,
        late_booking: true,
    };
    model_check::explore(model, finish_when, model_check::depth(48))
}

#[test]
fn the_shipped_rules_keep_every_promise() {
    model_check::assert_every_property("request model", || {
        check(Fixes::ALL, HasDiscoveries::AnyFailures)
    });
}

/// Turns one fix off and expects the model to find a counterexample to each
/// of `broken`; the search stops once it has one of each (breadth-first:
/// short ones).
fn finds_without(fixes: Fixes, broken: &[&'static str]) {
    let checker = check(
        fixes,
        HasDiscoveries::AllOf(broken.iter().copied().collect()),
    );
    model_check::expect_counterexamples(&checker, broken);
}

/// (Before timeouts were answered `in_doubt`, a displaced worker's late
/// `timeout` answer also got the order resent; an `in_doubt` one does not.)
#[test]
fn without_the_fenced_final_answer_a_displaced_workers_answer_replaces_its_successors() {
    finds_without(
        Fixes {
            fenced_final_answer: false,
            ..Fixes::ALL
        },
        &[
            "a stored response is never replaced",
            "a final response is stored only by the mark holder",
        ],
    );
}

/// The one consequence the model finds: a zombie's begin takes the record
/// over, which fences its holder's answer and counts as a delivery, so the
/// request is settled `poison` after two holders. No promise about orders or
/// responses breaks without this fix alone: the final-answer fence keeps the
/// zombie's answer out and the holder deadline keeps it from placing.
#[test]
fn without_the_mark_on_begin_a_zombie_takes_the_request_over_and_it_is_settled_as_poison() {
    finds_without(
        Fixes {
            begin_needs_mark: false,
            ..Fixes::ALL
        },
        &["a request is settled as poison only once more than MAX_DELIVERIES mark holders took it"],
    );
}

#[test]
fn without_the_owner_check_a_reused_request_id_reads_another_users_response() {
    finds_without(
        Fixes {
            foreign_request_id: false,
            ..Fixes::ALL
        },
        &["no user reads another user's response"],
    );
}

#[test]
fn without_the_second_expiry_check_an_expired_order_is_placed() {
    finds_without(
        Fixes {
            expiry_rechecked: false,
            ..Fixes::ALL
        },
        &["an expired request is never executed"],
    );
}

#[test]
fn without_the_duplicate_lookup_a_lost_record_answers_an_executed_order_not_executed() {
    finds_without(
        Fixes {
            duplicate_looked_up: false,
            ..Fixes::ALL
        },
        &[
            "no response says not executed for an order the broker holds",
            "each order is executed at most once",
        ],
    );
}

#[test]
fn without_the_holder_deadline_a_zombie_places_an_order_answered_not_executed() {
    finds_without(
        Fixes {
            holder_deadline: false,
            ..Fixes::ALL
        },
        &[
            "no response says not executed for an order the broker holds",
            "each order is executed at most once",
        ],
    );
}

/// A broker that books a timed-out order after the worker's lookup found
/// nothing: answered "not executed", the API resends it and it fills twice.
#[test]
fn without_in_doubt_after_a_timeout_a_late_booked_order_is_answered_not_executed_and_resent() {
    finds_without(
        Fixes {
            in_doubt_after_timeout: false,
            ..Fixes::ALL
        },
        &[
            "no response says not executed for an order the broker holds",
            "each order is executed at most once",
        ],
    );
}
