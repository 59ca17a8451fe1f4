//! Frames that cover a range of sequences (an order book's diffs: Binance's
//! `U..=u`, or `pu` + 1 ..= `u`), model-checked with stateright.
//!
//! One stream, one owner, a `live` upstream whose update ids are not
//! contiguous inside a diff but whose diffs are: each diff covers the ids
//! after the one before. The upstream produces a diff of one or two ids per
//! step; the connection delivers them in order, may lose one (a missed diff:
//! the book is wrong from there until a new snapshot) and may be cut (the
//! next connection starts at the head). The `Sequencer` the runtime uses
//! takes each delivered diff with its range (`arrive_covering`), and the
//! model writes what it hands on to a sink.
//!
//! The promise: every update id from the first to the sink's last position
//! is covered by exactly one written diff or gap marker, so a reader knows
//! where its book stops being right. Switch `ranges_checked` off and the
//! shell hands the sequencer only each diff's last id under
//! `UPSTREAM_SEQ_STEP=increasing` (the only step under which update ids that
//! skip are not holes): a lost diff then leaves no trace.

use leasehold_stream::sequence::{ResumeMode, SeqStep, Sequencer, Step};
use leasehold_testkit::model_check;
use stateright::{Checker, HasDiscoveries, Model, Property};

/// Diffs the upstream produces at most.
const MAX_DIFFS: usize = 5;
const MAX_LOSSES: u8 = 1;
const MAX_CUTS: u8 = 1;

#[derive(Clone, Copy, Debug)]
struct Fixes {
    /// The shell hands the sequencer each diff's first id too.
    ranges_checked: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Entry {
    /// A diff covering `first..=last`, at `last`.
    Diff { first: u64, last: u64 },
    /// A gap marker for `from..=to`, at `to`.
    Gap { from: u64, to: u64 },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    /// Every diff produced: `(first, last)`.
    produced: Vec<(u64, u64)>,
    /// The next diff the connection delivers.
    next: usize,
    losses: u8,
    cuts: u8,
    sequencer: SequencerState,
    sink: Vec<Entry>,
}

/// The sequencer, hashed by what decides its future (it holds nothing here:
/// no backfill, no jump bound, no reset).
#[derive(Clone, Debug)]
struct SequencerState(Sequencer<(u64, u64)>);

impl PartialEq for SequencerState {
    fn eq(&self, other: &Self) -> bool {
        self.0.last() == other.0.last()
    }
}
impl Eq for SequencerState {}
impl std::hash::Hash for SequencerState {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.last().hash(state);
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// The upstream produces a diff covering `ids` update ids.
    Produce(u64),
    /// The connection delivers its next diff.
    Deliver,
    /// The connection loses its next diff.
    Lose,
    /// The server cuts the connection; the next starts at the head.
    Cut,
}

struct RangeModel {
    fixes: Fixes,
}

impl Model for RangeModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            produced: Vec::new(),
            next: 0,
            losses: 0,
            cuts: 0,
            // The sink holds the stream up to id 0 (a snapshot's position).
            sequencer: SequencerState(Sequencer::new(
                ResumeMode::Live,
                SeqStep::Increasing,
                Some(0),
            )),
            sink: Vec::new(),
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.produced.len() < MAX_DIFFS {
            actions.push(Action::Produce(1));
            actions.push(Action::Produce(2));
        }
        if state.next < state.produced.len() {
            actions.push(Action::Deliver);
            if state.losses < MAX_LOSSES {
                actions.push(Action::Lose);
            }
        }
        if state.cuts < MAX_CUTS && !state.produced.is_empty() {
            actions.push(Action::Cut);
        }
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut next = state.clone();
        match action {
            Action::Produce(ids) => {
                let first = state.produced.last().map_or(1, |(_, last)| last + 1);
                next.produced.push((first, first + ids - 1));
            }
            Action::Lose => {
                next.next += 1;
                next.losses += 1;
            }
            Action::Cut => {
                next.next = state.produced.len();
                next.cuts += 1;
                next.sequencer.0.connected();
            }
            Action::Deliver => {
                let (first, last) = state.produced[state.next];
                next.next += 1;
                let mut steps = Vec::new();
                if self.fixes.ranges_checked {
                    next.sequencer
                        .0
                        .arrive_covering(Some(first), last, (first, last), &mut steps);
                } else {
                    next.sequencer.0.arrive(last, (first, last), &mut steps);
                }
                for step in steps {
                    next.sink.push(match step {
                        Step::Event(_, (first, last)) => Entry::Diff { first, last },
                        Step::Gap { from, to, .. } => Entry::Gap { from, to },
                        other => panic!("live diffs make events and markers only: {other:?}"),
                    });
                }
            }
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![Property::always(COVERED, |_, state: &State| {
            // Each entry starts right after the one before (a diff may reach
            // back into it: the first after a snapshot straddles it).
            let mut position = 0;
            state.sink.iter().all(|entry| {
                let (first, last) = match *entry {
                    Entry::Diff { first, last } => (first, last),
                    Entry::Gap { from, to } => (from, to),
                };
                let continues = first <= position + 1 && last > position;
                let marker_exact = !matches!(entry, Entry::Gap { .. }) || first == position + 1;
                position = last;
                continues && marker_exact
            })
        })]
    }
}

/// The promise above.
const COVERED: &str = "every update id up to the sink's last is in one diff or one marker";

fn check(fixes: Fixes, finish_when: HasDiscoveries) -> impl Checker<RangeModel> {
    model_check::explore(
        RangeModel { fixes },
        finish_when,
        model_check::depth(usize::MAX),
    )
}

#[test]
fn diffs_taken_by_their_ranges_cover_every_update_id_once() {
    model_check::assert_every_property("range model", || {
        check(
            Fixes {
                ranges_checked: true,
            },
            HasDiscoveries::AnyFailures,
        )
    });
}

#[test]
fn without_the_ranges_a_lost_diff_leaves_no_trace() {
    let checker = check(
        Fixes {
            ranges_checked: false,
        },
        HasDiscoveries::AnyOf([COVERED].into()),
    );
    model_check::expect_counterexamples(&checker, &[COVERED]);
}
