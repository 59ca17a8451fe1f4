//! The stream machine's write path, model-checked with stateright: the
//! model drives `StreamMachine` itself (no runtime: `now` is fixed and every
//! backoff is zero), playing the upstream, the sink and the lease around it.
//!
//! The upstream produces one event per tick (contiguous), delivers them on a
//! connection (a `replay` upstream from where it is asked, a `live` one from
//! its next event), is cut, and restarts once (its sequence starts over at 1
//! on the open connection). The sink appends an entry only above its last id
//! `(token, position)` as Redis does; a write may fail (an outage) or meet a
//! failover that lost the newest entry (the reply is `NotOpen`, and the
//! re-open reports the shorter stream). A new epoch lifts the token and
//! appends the reset entry in one step, as the runner's `new_epoch` does.
//!
//! Checked on the sink, epoch by epoch (the entries between reset entries):
//! every sequence from the first to the last stored is stored once (an event,
//! or inside one gap marker; a `replay` stream has no marker), and the
//! checkpoint is never staged past what the sink holds. Each rule of the
//! machine that these rest on has a switch (`MachineRules`); a test turns
//! each off and expects the model to find the counterexample.
//!
//! Bounds: four ticks, one cut, one failed write, one lost tail, one restart.
//! `LEASEHOLD_MODEL_DEPTH` bounds the search depth.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use leasehold_platform::backoff::Backoff;
use leasehold_sink::{OpenOutcome, SinkError, WriteOutcome};
use leasehold_stream::machine::{Action, Input, Start, StreamMachine};
use leasehold_stream::runner::{MachineRules, RunnerConfig};
use leasehold_stream::sequence::{JumpBound, ResumeMode};
use leasehold_stream::upstream::{UpstreamError, UpstreamEvent};
use leasehold_testkit::model_check;
use stateright::{Checker, HasDiscoveries, Model, Property};
use tokio::time::Instant;

const MAX_TIME: u64 = 4;
const MAX_CUTS: u8 = 1;
const MAX_FAILURES: u8 = 1;
const MAX_LOSSES: u8 = 1;
const MAX_RESTARTS: u8 = 1;

/// The machine, compared and hashed by its `Debug` text (every field shown,
/// the private ones included, so equal text is equal state).
#[derive(Clone)]
struct Machine(StreamMachine);

impl fmt::Debug for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for Machine {
    fn eq(&self, other: &Machine) -> bool {
        format!("{:?}", self.0) == format!("{:?}", other.0)
    }
}

impl Eq for Machine {}

impl Hash for Machine {
    fn hash<H: Hasher>(&self, state: &mut H) {
        format!("{:?}", self.0).hash(state);
    }
}

/// One sink entry.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Entry {
    Event(u64),
    Marker { from: u64, to: u64 },
    Reset { to: u64 },
}

impl Entry {
    fn position(self) -> u64 {
        match self {
            Entry::Event(seq) => seq,
            Entry::Marker { to, .. } => to,
            Entry::Reset { to } => to - 1,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct State {
    machine: Machine,
    /// The upstream honours the position asked for (`replay`).
    replay: bool,
    /// The upstream's newest event (0: none yet, or just restarted).
    head: u64,
    /// The connection's next sequence, when one is up.
    connection: Option<u64>,
    /// A subscribe is out.
    subscribing: Option<u64>,
    /// The lease's token (lifted by each epoch).
    token: u64,
    /// (token, entry), in the order appended.
    sink: Vec<(u64, Entry)>,
    /// The stream's last id; `None`: never written.
    last_id: Option<(u64, u64)>,
    /// The sink's connection was lost since the open: writes are refused.
    must_reopen: bool,
    /// The write out: its entries.
    write: Option<Vec<Entry>>,
    reopen: bool,
    /// A checkpoint was staged past what the sink held.
    checkpoint_ahead: bool,
    now: u64,
    cuts: u8,
    failures: u8,
    losses: u8,
    restarts: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Act {
    Tick,
    Connect,
    Deliver,
    Cut,
    Restart,
    Land,
    FailWrite,
    LoseTail,
    Reopened,
}

struct MachineModel {
    rules: MachineRules,
    modes: Vec<ResumeMode>,
}

/// A fixed instant: the model has no clock (every backoff is zero).
fn epoch() -> Instant {
    use std::sync::OnceLock;
    static AT: OnceLock<Instant> = OnceLock::new();
    *AT.get_or_init(Instant::now)
}

fn frame(seq: u64) -> UpstreamEvent {
    UpstreamEvent {
        seq,
        first_seq: None,
        snapshot: false,
        event_id: seq.to_string(),
        payload: "{}".into(),
        received_at: epoch(),
        arrival_lag: None,
    }
}

impl State {
    fn feed(&mut self, input: Input) {
        self.machine.0.handle(input, epoch());
        self.carry_out();
    }

    /// The driver's part: what the machine asks for.
    fn carry_out(&mut self) {
        while let Some(action) = self.machine.0.poll_action() {
            match action {
                Action::Subscribe { from } => self.subscribing = Some(from),
                Action::Close => {
                    self.connection = None;
                    self.subscribing = None;
                }
                Action::Write(events) => {
                    self.write = Some(
                        events
                            .iter()
                            .map(|e| match e.gap {
                                Some(gap) => Entry::Marker {
                                    from: gap.from,
                                    to: e.seq,
                                },
                                None => Entry::Event(e.seq),
                            })
                            .collect(),
                    );
                }
                Action::Reopen => self.reopen = true,
                Action::FetchSnapshot { .. } | Action::AskSnapshot => {
                    unreachable!("the model's upstream is not an order book")
                }
                Action::StageCheckpoint(seq) => {
                    let held = match self.last_id {
                        Some((token, position)) if token == self.token => position,
                        _ => 0,
                    };
                    if seq > held {
                        self.checkpoint_ahead = true;
                    }
                }
                Action::StartEpoch { to, .. } => {
                    self.token += 1;
                    let reset = Entry::Reset { to };
                    self.sink.push((self.token, reset));
                    self.last_id = Some((self.token, reset.position()));
                    self.machine.0.handle(
                        Input::EpochStarted {
                            fence_token: self.token,
                        },
                        epoch(),
                    );
                }
                Action::Fetch { .. }
                | Action::CancelFetch
                | Action::ReportFenced
                | Action::Emit(_) => {}
            }
        }
    }

    /// Appends what is above the last id, as Redis does.
    fn land(&mut self, entries: &[Entry]) -> WriteOutcome {
        let mut outcome = WriteOutcome {
            highest_token: self.token,
            ..WriteOutcome::default()
        };
        for entry in entries {
            let id = (self.token, entry.position());
            if self.last_id.is_none_or(|last| id > last) {
                self.sink.push((self.token, *entry));
                self.last_id = Some(id);
                outcome.accepted += 1;
            } else {
                outcome.duplicate += 1;
            }
        }
        outcome
    }

    /// The sink's epochs: the entries between reset entries.
    fn epochs(&self) -> Vec<Vec<Entry>> {
        let mut epochs = vec![Vec::new()];
        for (_, entry) in &self.sink {
            match entry {
                Entry::Reset { .. } => epochs.push(Vec::new()),
                other => epochs.last_mut().unwrap().push(*other),
            }
        }
        epochs
    }
}

impl Model for MachineModel {
    type State = State;
    type Action = Act;

    fn init_states(&self) -> Vec<State> {
        self.modes
            .iter()
            .map(|&resume| {
                let config = RunnerConfig {
                    resume,
                    batch_max_events: 2,
                    reconnect: Backoff {
                        base: Duration::ZERO,
                        cap: Duration::ZERO,
                    },
                    sink_retry: Backoff {
                        base: Duration::ZERO,
                        cap: Duration::ZERO,
                    },
                    // Never due: the model has no clock.
                    lag_report_interval: Duration::from_secs(1 << 30),
                    // A restart is one frame behind the stream here.
                    jump: JumpBound {
                        max: 0,
                        confirm_after: 1,
                    },
                    rules: self.rules,
                    ..RunnerConfig::default()
                };
                let start = Start {
                    resume: 0,
                    anchored: false,
                    lost: None,
                };
                let machine = StreamMachine::new(config, "s".into(), 1, false, start, epoch());
                let mut state = State {
                    machine: Machine(machine),
                    replay: resume == ResumeMode::Replay,
                    head: 0,
                    connection: None,
                    subscribing: None,
                    token: 1,
                    sink: Vec::new(),
                    last_id: Some((1, 0)),
                    must_reopen: false,
                    write: None,
                    reopen: false,
                    checkpoint_ahead: false,
                    now: 0,
                    cuts: 0,
                    failures: 0,
                    losses: 0,
                    restarts: 0,
                };
                state.carry_out();
                state
            })
            .collect()
    }

    fn actions(&self, s: &State, actions: &mut Vec<Act>) {
        if s.now < MAX_TIME {
            actions.push(Act::Tick);
        }
        if s.subscribing.is_some() {
            actions.push(Act::Connect);
        }
        if let Some(next) = s.connection {
            if next <= s.head && s.machine.0.wants_frames() {
                actions.push(Act::Deliver);
            }
            if s.cuts < MAX_CUTS {
                actions.push(Act::Cut);
            }
            if s.restarts < MAX_RESTARTS && s.head >= 2 {
                actions.push(Act::Restart);
            }
        }
        if s.write.is_some() {
            actions.push(Act::Land);
            if s.failures < MAX_FAILURES {
                actions.push(Act::FailWrite);
            }
            if s.losses < MAX_LOSSES
                && s.sink.last().is_some_and(|(token, e)| {
                    *token == s.token && !matches!(e, Entry::Reset { .. })
                })
            {
                actions.push(Act::LoseTail);
            }
        }
        if s.reopen {
            actions.push(Act::Reopened);
        }
    }

    fn next_state(&self, last: &State, action: Act) -> Option<State> {
        let mut s = last.clone();
        match action {
            Act::Tick => {
                s.now += 1;
                s.head += 1;
            }
            Act::Connect => {
                let asked = s.subscribing.take()?;
                s.connection = Some(if s.replay && asked > 0 {
                    asked
                } else {
                    s.head + 1
                });
                s.feed(Input::Subscribed);
            }
            Act::Deliver => {
                let next = s.connection?;
                s.connection = Some(next + 1);
                s.feed(Input::Frame(frame(next)));
            }
            Act::Cut => {
                s.cuts += 1;
                s.connection = None;
                s.feed(Input::UpstreamFailed(UpstreamError::Closed("cut".into())));
            }
            Act::Restart => {
                s.restarts += 1;
                s.head = 0;
                s.connection = Some(1);
            }
            Act::Land => {
                let entries = s.write.take()?;
                let result = if s.must_reopen {
                    Err(SinkError::NotOpen {
                        stream_id: "s".into(),
                        fence_token: s.token,
                    })
                } else {
                    Ok(s.land(&entries))
                };
                s.feed(Input::Written {
                    result,
                    started: epoch(),
                });
            }
            Act::FailWrite => {
                s.failures += 1;
                s.write = None;
                s.feed(Input::Written {
                    result: Err(SinkError::Unavailable("down".into())),
                    started: epoch(),
                });
            }
            Act::LoseTail => {
                // A failover to a replica that lacked the newest entry; the
                // write meets the lost connection.
                s.losses += 1;
                s.sink.pop();
                s.last_id = s
                    .sink
                    .last()
                    .map(|(token, e)| (*token, e.position()))
                    .or(Some((s.token, 0)));
                s.must_reopen = true;
                s.write = None;
                s.feed(Input::Written {
                    result: Err(SinkError::NotOpen {
                        stream_id: "s".into(),
                        fence_token: s.token,
                    }),
                    started: epoch(),
                });
            }
            Act::Reopened => {
                s.reopen = false;
                s.must_reopen = false;
                let (token, position) = s.last_id.unwrap_or((s.token, 0));
                s.last_id = Some((s.token.max(token), position));
                let last_seq = (position > 0).then_some(position);
                s.feed(Input::Reopened(Ok(OpenOutcome {
                    highest_token: s.token,
                    last_seq,
                    fenced: false,
                })));
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(CONTIGUOUS, |_, s: &State| {
                s.epochs().iter().all(|entries| {
                    let mut next = None;
                    entries.iter().all(|e| {
                        let (from, to) = match *e {
                            Entry::Event(seq) => (seq, seq),
                            Entry::Marker { from, to } => (from, to),
                            Entry::Reset { .. } => return true,
                        };
                        let ok = next.is_none_or(|n| from == n);
                        next = Some(to + 1);
                        ok
                    })
                })
            }),
            Property::always(CHECKPOINT, |_, s: &State| !s.checkpoint_ahead),
            Property::sometimes("a lost tail is written again", |_, s: &State| {
                s.losses > 0 && s.sink.len() >= 3
            }),
            Property::sometimes(
                "a restarted upstream is written after its reset",
                |_, s: &State| {
                    s.epochs().len() > 1 && s.epochs().last().is_some_and(|e| !e.is_empty())
                },
            ),
        ]
    }
}

/// Every sequence from an epoch's first stored to its last is stored once.
const CONTIGUOUS: &str = "every epoch's sequences are stored once, without a hole";
/// Invariant 3: the checkpoint moves only after the sink confirmed.
const CHECKPOINT: &str = "the checkpoint is never staged past what the sink holds";

fn check(rules: MachineRules, finish_when: HasDiscoveries) -> impl Checker<MachineModel> {
    let model = MachineModel {
        rules,
        modes: vec![ResumeMode::Replay, ResumeMode::Live],
    };
    model_check::explore(model, finish_when, model_check::depth(usize::MAX))
}

#[test]
fn the_shipped_rules_keep_every_promise() {
    model_check::assert_every_property("stream machine model", || {
        check(MachineRules::ALL, HasDiscoveries::AnyFailures)
    });
}

fn finds_without(rules: MachineRules, broken: &'static str) {
    let checker = check(rules, HasDiscoveries::AnyOf([broken].into()));
    let path = checker
        .discovery(broken)
        .unwrap_or_else(|| panic!("no counterexample to {broken:?}"));
    eprintln!(
        "counterexample to {broken:?}: {:?}\n  sink {:?}",
        path.clone().into_actions(),
        path.last_state().sink
    );
}

#[test]
fn without_comparing_the_tail_on_reopen_a_batch_lands_above_a_lost_entry() {
    finds_without(
        MachineRules {
            reopen_compares_the_tail: false,
            ..MachineRules::ALL
        },
        CONTIGUOUS,
    );
}

#[test]
fn without_waiting_for_the_confirmation_the_checkpoint_passes_the_sink() {
    finds_without(
        MachineRules {
            checkpoint_after_confirmation: false,
            ..MachineRules::ALL
        },
        CHECKPOINT,
    );
}
