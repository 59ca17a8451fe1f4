//! An overlapping hand-off (`HANDOFF_PREPARE_TIMEOUT_MS`) on a `live`
//! upstream, model-checked with stateright.
//!
//! One stream, a predecessor P that holds it and a successor S. The upstream
//! produces one sequence per step; every connection receives the sequences
//! produced after it subscribed, in order. P has been subscribed from the
//! start and writes what it received. The hand-off, as `worker.rs` and
//! `worker/overlap.rs` run it:
//! 1. P sends S a prepare (and keeps running);
//! 2. S subscribes and, once it holds its first frame F, answers ready(F);
//! 3. P releases once the sink holds everything before F;
//! 4. S acquires and runs its subscription through the `Sequencer` the
//!    runner uses (`live`: a hole is a gap marker), from the sink's last
//!    sequence on.
//!
//! The promise: a graceful hand-off writes every sequence once and no gap
//! marker. Switch `wait_for_ready` off and P releases as soon as it asked
//! (before S holds anything, as before this overlap): a counterexample. Switch
//! `start_on_prepared` off and S subscribes afresh when it acquires: a
//! counterexample too. The sequencer takes frames behind the stream that
//! climb for a restarted sequence (`UPSTREAM_RESET_AFTER`), as the runner's
//! does; P writes on past S's first frame until it releases, so S's first
//! frames are behind: switch `continue_prepared` off (S's runner does not
//! tell its sequencer the subscription was made ahead) and they are taken
//! for a restart and written again, a counterexample (found first by a
//! rolling deploy in scan discovery). The timeout path (P releases after
//! `HANDOFF_PREPARE_TIMEOUT_MS` without an answer) is the old hand-off and is
//! left out: it promises nothing more than before.

use leasehold_stream::sequence::{ResumeMode, SeqStep, Sequencer, Step};
use leasehold_testkit::model_check;
use stateright::{Checker, HasDiscoveries, Model, Property};

/// Sequences the upstream produces at most.
const MAX_SEQ: u64 = 8;

/// Frames behind in a row that make a restart: the runner's default is 3;
/// 2 lets the small model reach it.
const RESET_AFTER: u32 = 2;

#[derive(Clone, Copy, Debug)]
struct Fixes {
    /// P releases only once S holds the stream and the sink holds what
    /// comes before S's first frame.
    wait_for_ready: bool,
    /// S's runner starts on the subscription it made when asked.
    start_on_prepared: bool,
    /// S's sequencer takes that subscription's frames up to the stream's
    /// position for replays (`Sequencer::continue_prepared`).
    continue_prepared: bool,
}

impl Fixes {
    const ALL: Fixes = Fixes {
        wait_for_ready: true,
        start_on_prepared: true,
        continue_prepared: true,
    };
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Entry {
    Event(u64),
    Gap { from: u64, to: u64 },
    Reset { from: u64, to: u64 },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    /// The upstream has produced 1..=head.
    head: u64,
    /// P has received 1..=received.
    received: u64,
    /// P asked S to prepare.
    asked: bool,
    /// S subscribed when the head was here (it receives what follows).
    prepared_after: Option<u64>,
    /// S's ready reached P: its first held sequence.
    ready: Option<u64>,
    released: bool,
    /// S holds the lease; its connection receives after this head.
    successor_after: Option<u64>,
    /// S's connection has delivered up to here.
    delivered: u64,
    sequencer: SequencerState,
    sink: Vec<Entry>,
}

impl State {
    fn sink_last(&self) -> u64 {
        match self.sink.last() {
            Some(Entry::Event(seq)) => *seq,
            Some(Entry::Gap { to, .. }) => *to,
            // Stored just before its new epoch's first sequence.
            Some(Entry::Reset { to, .. }) => to.saturating_sub(1),
            None => 0,
        }
    }
}

/// The successor's sequencer, compared and hashed whole (its position,
/// the frames behind it counted towards a restart, the replay window of a
/// prepared subscription): two states that differ in any of them have
/// different futures.
#[derive(Clone, Debug)]
struct SequencerState(Option<Sequencer<u64>>);

impl SequencerState {
    fn key(&self) -> String {
        format!("{:?}", self.0)
    }
}

impl PartialEq for SequencerState {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl Eq for SequencerState {}
impl std::hash::Hash for SequencerState {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    Produce,
    /// P's connection delivers its next sequence; P writes it.
    PredecessorReads,
    Ask,
    SuccessorSubscribes,
    /// S holds its first frame and answers.
    Ready,
    Release,
    Acquire,
    /// S's connection delivers its next sequence to its runner.
    SuccessorReads,
}

struct HandoffModel {
    fixes: Fixes,
}

impl Model for HandoffModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            head: 0,
            received: 0,
            asked: false,
            prepared_after: None,
            ready: None,
            released: false,
            successor_after: None,
            delivered: 0,
            sequencer: SequencerState(None),
            sink: Vec::new(),
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.head < MAX_SEQ {
            actions.push(Action::Produce);
        }
        if !state.released && state.received < state.head {
            actions.push(Action::PredecessorReads);
        }
        if !state.asked {
            actions.push(Action::Ask);
        }
        if state.asked && state.prepared_after.is_none() {
            actions.push(Action::SuccessorSubscribes);
        }
        if state.ready.is_none()
            && let Some(after) = state.prepared_after
            && state.head > after
        {
            actions.push(Action::Ready);
        }
        let may_release = if self.fixes.wait_for_ready {
            state
                .ready
                .is_some_and(|first| state.sink_last() + 1 >= first)
        } else {
            state.asked
        };
        if !state.released && may_release {
            actions.push(Action::Release);
        }
        if state.released && state.successor_after.is_none() {
            actions.push(Action::Acquire);
        }
        if let Some(after) = state.successor_after
            && after.max(state.delivered) < state.head
        {
            actions.push(Action::SuccessorReads);
        }
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut next = state.clone();
        match action {
            Action::Produce => next.head += 1,
            Action::PredecessorReads => {
                next.received += 1;
                next.sink.push(Entry::Event(next.received));
            }
            Action::Ask => next.asked = true,
            Action::SuccessorSubscribes => next.prepared_after = Some(state.head),
            Action::Ready => next.ready = state.prepared_after.map(|after| after + 1),
            Action::Release => next.released = true,
            Action::Acquire => {
                let after = match state.prepared_after {
                    Some(after) if self.fixes.start_on_prepared => after,
                    // A fresh subscription: what the upstream sends from now.
                    _ => state.head,
                };
                next.successor_after = Some(after);
                next.delivered = after;
                let mut sequencer = Sequencer::new(
                    ResumeMode::Live,
                    SeqStep::Contiguous,
                    Some(state.sink_last()),
                )
                .with_reset_after(RESET_AFTER);
                if self.fixes.continue_prepared && self.fixes.start_on_prepared {
                    sequencer.continue_prepared();
                }
                next.sequencer = SequencerState(Some(sequencer));
            }
            Action::SuccessorReads => {
                next.delivered += 1;
                let seq = next.delivered;
                let mut steps = Vec::new();
                if let Some(sequencer) = next.sequencer.0.as_mut() {
                    sequencer.arrive(seq, seq, &mut steps);
                }
                for step in steps {
                    next.sink.push(match step {
                        Step::Event(seq, _) => Entry::Event(seq),
                        Step::Gap { from, to, .. } => Entry::Gap { from, to },
                        Step::Reset { from, to } => Entry::Reset { from, to },
                        Step::BehindDropped { .. } => continue,
                        other => panic!("a live stream makes events and markers only: {other:?}"),
                    });
                }
            }
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ONCE_NO_GAP, |_, state: &State| {
                state
                    .sink
                    .iter()
                    .enumerate()
                    .all(|(i, entry)| *entry == Entry::Event(i as u64 + 1))
            }),
            Property::sometimes(HANDED_OVER, |_, state: &State| {
                state.successor_after.is_some() && state.delivered > state.received
            }),
        ]
    }
}

/// The promise above.
const ONCE_NO_GAP: &str = "every sequence in the sink once, in order, and no gap marker";
/// Not vacuous: the successor writes after the hand-off.
const HANDED_OVER: &str = "the successor writes what the predecessor never received";

fn check(fixes: Fixes, finish_when: HasDiscoveries) -> impl Checker<HandoffModel> {
    model_check::explore(
        HandoffModel { fixes },
        finish_when,
        model_check::depth(usize::MAX),
    )
}

#[test]
fn an_overlapped_hand_off_writes_every_sequence_once_and_no_gap() {
    model_check::assert_every_property("hand-off model", || {
        check(Fixes::ALL, HasDiscoveries::AnyFailures)
    });
}

#[test]
fn releasing_before_the_successor_is_ready_loses_sequences() {
    let checker = check(
        Fixes {
            wait_for_ready: false,
            ..Fixes::ALL
        },
        HasDiscoveries::AnyOf([ONCE_NO_GAP].into()),
    );
    model_check::expect_counterexamples(&checker, &[ONCE_NO_GAP]);
}

#[test]
fn a_successor_that_takes_its_early_frames_for_a_restart_writes_them_twice() {
    let checker = check(
        Fixes {
            continue_prepared: false,
            ..Fixes::ALL
        },
        HasDiscoveries::AnyOf([ONCE_NO_GAP].into()),
    );
    model_check::expect_counterexamples(&checker, &[ONCE_NO_GAP]);
}

#[test]
fn a_successor_that_subscribes_only_when_it_acquires_loses_sequences() {
    let checker = check(
        Fixes {
            start_on_prepared: false,
            ..Fixes::ALL
        },
        HasDiscoveries::AnyOf([ONCE_NO_GAP].into()),
    );
    model_check::expect_counterexamples(&checker, &[ONCE_NO_GAP]);
}
