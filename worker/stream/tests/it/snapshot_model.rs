//! An order book's `snapshot` mode with REST snapshots (Binance's rules),
//! model-checked with stateright.
//!
//! One stream, one owner. The exchange applies update ids one at a time (its
//! book at id `n` is every update up to `n`, so the model keeps a book as the
//! last id it reflects) and sends the updates since its last diff as one diff
//! `U..=u` of one or two ids. The connection delivers the diffs in order, may
//! lose one and may be cut (the next connection starts with the next diff the
//! exchange sends). The shell around the `Sequencer` the runtime uses plays
//! the machine's part (worker/stream/src/machine.rs): it hands each delivered
//! diff over with its range (`arrive_covering`), calls `connected()` on a new
//! connection, answers `Step::Resync` with a REST request, and hands the
//! answer to `snapshotted`, asking again on `Stale`. A request is read by the
//! exchange at one step (its book at its head, which may be inside a diff not
//! sent yet) and answered at a later one, so diffs interleave with both: a
//! snapshot may be older than the diffs held, or newer than diffs the
//! connection has not delivered yet. What the sequencer hands on (diffs,
//! snapshot entries with their `missed` range, markers, resets) goes to a
//! sink list.
//!
//! The promises, at every state: a reader that rebuilds the book from the
//! sink (from a snapshot entry on, applying each later diff that continues
//! its book) has the exchange's book at every entry's id ([`BOOK`]); every
//! diff after a snapshot continues the entry before it ([`CONTINUES`]);
//! entry ids strictly increase within an epoch ([`INCREASING`]); a snapshot
//! after earlier entries says which ids no reader saw ([`MISSED`]); the
//! exchange never restarts, so no reset entry is written ([`NO_RESET`]); and
//! the model never comes to rest with the sequencer holding diffs for a
//! snapshot nobody fetches ([`NOT_STUCK`]). [`RESYNCED`] checks that a
//! snapshot after a lost diff is reachable at all. Each shell rule has a
//! switch in [`Fixes`]; a test turns each off and checks which promise then
//! has a counterexample.
//!
//! The sequencer runs as the runner builds it (`runner::JUMP_BOUND`: a jump
//! bound far above anything here, and `UPSTREAM_RESET_AFTER` 3). Two
//! starts: a stream never written, and a new owner's whose sink ends at a
//! snapshot of the exchange's book as it is.
//!
//! Found by this model, and fixed: a REST snapshot read while three diffs
//! below its id were still on their way made a false reset. Shortest trace:
//! diffs 1..=1 to 4..=4 sent, update 5 applied; 1..=1 delivered (a
//! `subscribe` resync); the book read at 5 and taken; 2..=2, 3..=3, 4..=4
//! delivered, each below the stream and above the one before, which is what
//! `UPSTREAM_RESET_AFTER` (3) frames of a restarted sequence look like: the
//! sequencer wrote `Reset { from: 5, to: 2 }` (a new epoch, the reset alert,
//! the dashboard's `lost_data`) and fetched a second book, though the
//! exchange never restarted. The sequencer now takes a diff below the stream
//! that continues the connection's own chain of diffs for what the book
//! already covers (Binance: "discard any event where `u` is <= lastUpdateId").
//! [`NO_RESET`] checks it in every test.
//!
//! Left out:
//! - Dropping the held diffs a snapshot covers has no switch: it happens
//!   inside `snapshotted`, and the shell never sees the held diffs, so it is
//!   no choice the shell makes (`held_while_syncing` is the shell's side).
//! - `connected()` is called, but has no switch: with the ranges given, a
//!   new connection's first diff only picks the resync's reason label
//!   (`subscribe` rather than `gap`), never what is written or the `missed`
//!   range, so no property on the sink can tell (the unit tests in
//!   `sequence.rs` check the label).
//! - Checksum failures (`resync(Checksum, ..)`) and books sent in the stream
//!   (`arrive_snapshot`): Binance's REST rules only. A failed REST fetch is
//!   the same as a stale answer to the shell (both ask again).
//! - The hold bound (`STREAM_HOLD_MAX_BYTES`) only pauses reading, and the
//!   backoff between fetches is time, which the model does not keep.
//!
//! `LEASEHOLD_MODEL_DEPTH` bounds the search depth (by default every state
//! is explored).

use std::fmt;
use std::hash::{Hash, Hasher};

use leasehold_stream::runner::JUMP_BOUND;
use leasehold_stream::sequence::{ResumeMode, SeqStep, Sequencer, Snapshotted, Step};
use leasehold_telemetry::{GapReason, SnapshotReason};
use leasehold_testkit::model_check;
use stateright::{Checker, HasDiscoveries, Model, Property};

/// Diffs the exchange sends at most.
const MAX_DIFFS: usize = 5;
/// Update ids one diff covers at most.
const MAX_SPAN: u64 = 2;
const MAX_LOSSES: u8 = 1;
const MAX_CUTS: u8 = 1;

/// Which shell rules are in place. `ALL` is the shipped behaviour.
#[derive(Clone, Copy, Debug)]
struct Fixes {
    /// The shell hands the sequencer each diff's first id
    /// (`UPSTREAM_SEQ_FIRST_POINTER`); else only its last, under
    /// `UPSTREAM_SEQ_STEP=increasing`.
    ranges_given: bool,
    /// Diffs delivered while a snapshot is awaited go to the sequencer,
    /// which holds them; else the shell writes them at once.
    held_while_syncing: bool,
    /// `Step::Resync { reason: gap }` (a lost diff) is answered with a
    /// fetch; else the shell fetches only for a new book (`subscribe`).
    resync_after_a_loss: bool,
    /// A `Stale` answer is followed by another fetch; else it is dropped.
    stale_asked_again: bool,
    /// A `Stale` answer is not written; else the shell takes it as the book
    /// (writes it, with no `missed`, since the sequencer gave none) and
    /// moves the sequencer to it (`reposition`).
    refuse_stale_snapshots: bool,
    /// A snapshot entry carries the `missed` range of its `Step::Snapshot`;
    /// else the shell writes the book alone.
    missed_recorded: bool,
}

impl Fixes {
    const ALL: Fixes = Fixes {
        ranges_given: true,
        held_while_syncing: true,
        resync_after_a_loss: true,
        stale_asked_again: true,
        refuse_stale_snapshots: true,
        missed_recorded: true,
    };
}

/// What the sequencer carries: a diff's `(U, u)`, a snapshot's
/// `(book, book)`.
type Item = (u64, u64);

/// One sink entry.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Entry {
    /// A snapshot entry at `seq` holding the exchange's book at `book`, with
    /// the ids it says no reader saw before it.
    Snapshot {
        seq: u64,
        book: u64,
        missed: Option<(u64, u64, GapReason)>,
    },
    /// A diff covering `first..=last`, at `last`.
    Diff { first: u64, last: u64 },
    /// A gap marker for `from..=to`, at `to`.
    Gap { from: u64, to: u64 },
    /// A new epoch (the shell lifts the fence token first): the ids start
    /// over at `to`.
    Reset { to: u64 },
}

impl Entry {
    /// The entry's id within its epoch.
    fn position(&self) -> u64 {
        match *self {
            Entry::Snapshot { seq, .. } => seq,
            Entry::Diff { last, .. } => last,
            Entry::Gap { to, .. } => to,
            Entry::Reset { to } => to.saturating_sub(1),
        }
    }
}

/// A REST snapshot request.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Fetch {
    /// Sent; the exchange has not read its book for it yet.
    Asked,
    /// The exchange read its book at this id (`lastUpdateId`); the answer
    /// is on its way.
    Read(u64),
}

/// The sequencer, compared and hashed by its derived `Debug` (every field,
/// the private ones included, so equal text is equal state).
#[derive(Clone)]
struct Seq(Sequencer<Item>);

impl fmt::Debug for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for Seq {
    fn eq(&self, other: &Seq) -> bool {
        format!("{:?}", self.0) == format!("{:?}", other.0)
    }
}

impl Eq for Seq {}

impl Hash for Seq {
    fn hash<H: Hasher>(&self, state: &mut H) {
        format!("{:?}", self.0).hash(state);
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    /// The exchange's last update id: its book is every update up to it.
    head: u64,
    /// Every diff the exchange sent, `(U, u)`, in order.
    diffs: Vec<(u64, u64)>,
    /// The next diff the connection delivers.
    next: usize,
    losses: u8,
    cuts: u8,
    /// Sink entries when a diff was lost.
    lost_at: Option<usize>,
    /// REST requests under way.
    fetches: Vec<Fetch>,
    sequencer: Seq,
    sink: Vec<Entry>,
}

impl State {
    /// The last id the exchange sent in a diff.
    fn sent(&self) -> u64 {
        self.diffs.last().map_or(0, |&(_, last)| last)
    }

    /// The shell carries out the sequencer's steps, in order.
    fn apply(&mut self, steps: Vec<Step<Item>>, fixes: &Fixes) {
        for step in steps {
            match step {
                Step::Event(seq, (first, last)) => {
                    assert_eq!(seq, last, "a diff is written at its last id");
                    self.sink.push(Entry::Diff { first, last });
                }
                Step::Snapshot {
                    seq,
                    item: (book, _),
                    missed,
                    ..
                } => self.sink.push(Entry::Snapshot {
                    seq,
                    book,
                    missed: missed
                        .filter(|_| fixes.missed_recorded)
                        .map(|m| (m.from, m.to, m.reason)),
                }),
                Step::Gap { from, to, .. } => self.sink.push(Entry::Gap { from, to }),
                Step::Reset { to, .. } => self.sink.push(Entry::Reset { to }),
                Step::Resync { reason } => {
                    if fixes.resync_after_a_loss || reason != SnapshotReason::Gap {
                        self.fetches.push(Fetch::Asked);
                    }
                }
                // Counted by the runner as skipped frames; nothing written.
                Step::JumpDiscarded { .. } | Step::BehindDropped { .. } => {}
                Step::Backfill { .. } | Step::Reconnect { .. } => {
                    unreachable!("snapshot mode neither backfills nor reconnects: {step:?}")
                }
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    /// The exchange applies its next update id.
    Update,
    /// The exchange sends the updates since its last diff as one diff.
    Send,
    /// The connection delivers its next diff.
    Deliver,
    /// The connection loses its next diff.
    Lose,
    /// The server cuts the connection; the next one starts with the next
    /// diff the exchange sends.
    Cut,
    /// The exchange reads its book for the request at this index.
    Read(usize),
    /// The answer to the request at this index arrives.
    Answer(usize),
}

struct SnapshotModel {
    fixes: Fixes,
    /// `UPSTREAM_RESET_AFTER` (0: the sequencer never resets).
    reset_after: u32,
}

impl SnapshotModel {
    /// No action is left.
    fn at_rest(&self, state: &State) -> bool {
        let mut actions = Vec::new();
        self.actions(state, &mut actions);
        actions.is_empty()
    }
}

/// The sequencer as the runner builds it (`RunnerConfig::jump`), but for
/// `reset_after`.
fn sequencer(last: Option<u64>, reset_after: u32) -> Seq {
    Seq(
        Sequencer::new(ResumeMode::Snapshot, SeqStep::Increasing, last)
            .with_jump_bound(JUMP_BOUND)
            .with_reset_after(reset_after),
    )
}

/// `UPSTREAM_RESET_AFTER`'s default.
const RESET_AFTER: u32 = JUMP_BOUND.confirm_after;

impl Model for SnapshotModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let never_written = State {
            head: 0,
            diffs: Vec::new(),
            next: 0,
            losses: 0,
            cuts: 0,
            lost_at: None,
            fetches: Vec::new(),
            sequencer: sequencer(None, self.reset_after),
            sink: Vec::new(),
        };
        // A new owner of a stream whose sink ends at a snapshot of the
        // exchange's book as it is.
        let written = State {
            sequencer: sequencer(Some(0), self.reset_after),
            sink: vec![Entry::Snapshot {
                seq: 0,
                book: 0,
                missed: None,
            }],
            ..never_written.clone()
        };
        vec![never_written, written]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let unsent = state.head - state.sent();
        if state.diffs.len() < MAX_DIFFS && unsent < MAX_SPAN {
            actions.push(Action::Update);
        }
        if unsent > 0 {
            actions.push(Action::Send);
        }
        if state.next < state.diffs.len() {
            actions.push(Action::Deliver);
            if state.losses < MAX_LOSSES {
                actions.push(Action::Lose);
            }
        }
        if state.cuts < MAX_CUTS && !state.diffs.is_empty() {
            actions.push(Action::Cut);
        }
        for (i, fetch) in state.fetches.iter().enumerate() {
            actions.push(match fetch {
                Fetch::Asked => Action::Read(i),
                Fetch::Read(_) => Action::Answer(i),
            });
        }
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let fixes = &self.fixes;
        let mut next = state.clone();
        match action {
            Action::Update => next.head += 1,
            Action::Send => next.diffs.push((state.sent() + 1, state.head)),
            Action::Lose => {
                next.next += 1;
                next.losses += 1;
                next.lost_at = Some(state.sink.len());
            }
            Action::Cut => {
                next.next = state.diffs.len();
                next.cuts += 1;
                next.sequencer.0.connected();
            }
            Action::Deliver => {
                let (first, last) = state.diffs[state.next];
                next.next += 1;
                if !fixes.held_while_syncing && next.sequencer.0.syncing() {
                    next.sink.push(Entry::Diff { first, last });
                    return Some(next);
                }
                let mut steps = Vec::new();
                // The frame is written as received, whatever the shell reads of it.
                let covers = fixes.ranges_given.then_some(first);
                next.sequencer
                    .0
                    .arrive_covering(covers, last, (first, last), &mut steps);
                next.apply(steps, fixes);
            }
            Action::Read(i) => next.fetches[i] = Fetch::Read(state.head),
            Action::Answer(i) => {
                let Fetch::Read(id) = next.fetches.remove(i) else {
                    unreachable!("an answer comes for a read book");
                };
                let mut steps = Vec::new();
                let outcome = next.sequencer.0.snapshotted(id, (id, id), &mut steps);
                next.apply(steps, fixes);
                if outcome == Snapshotted::Stale {
                    if !fixes.refuse_stale_snapshots {
                        next.sink.push(Entry::Snapshot {
                            seq: id,
                            book: id,
                            missed: None,
                        });
                        next.sequencer.0.reposition(Some(id));
                    } else if fixes.stale_asked_again
                        && next.sequencer.0.syncing()
                        && next.fetches.is_empty()
                    {
                        next.fetches.push(Fetch::Asked);
                    }
                }
            }
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(BOOK, |_, state: &State| rebuilds_the_book(&state.sink)),
            Property::always(CONTINUES, |_, state: &State| diffs_continue(&state.sink)),
            Property::always(INCREASING, |_, state: &State| ids_increase(&state.sink)),
            Property::always(MISSED, |_, state: &State| {
                names_what_was_missed(&state.sink)
            }),
            Property::always(NO_RESET, |_, state: &State| {
                !state.sink.iter().any(|e| matches!(e, Entry::Reset { .. }))
            }),
            Property::always(NOT_STUCK, |model: &SnapshotModel, state: &State| {
                !(state.sequencer.0.syncing() && model.at_rest(state))
            }),
            Property::sometimes(RESYNCED, |_, state: &State| {
                state.lost_at.is_some_and(|at| {
                    state.sink[at..].iter().any(|e| {
                        matches!(
                            e,
                            Entry::Snapshot {
                                missed: Some(_),
                                ..
                            }
                        )
                    })
                })
            }),
        ]
    }
}

/// (1) A reader that starts at a snapshot entry and applies each later diff
/// that continues its book (`U <= book + 1` and `u > book`) has, after every entry,
/// the exchange's book at that entry's id. A marker leaves it without a book;
/// a reset entry is not a position of the book (and is [`NO_RESET`]'s).
const BOOK: &str = "a reader rebuilds the exchange's book at every entry";
/// (2) Right after a snapshot at `L` a diff covers `L + 1` (`U <= L + 1 <= u`);
/// after any other entry it starts right after it.
const CONTINUES: &str = "every diff after a snapshot continues the entry before it";
/// (3) Within an epoch (a reset entry starts one under a new fence token).
const INCREASING: &str = "entry ids strictly increase";
/// (4) A snapshot right after an entry at `p` stands for the ids
/// `p + 1..=L` no reader saw (a lost diff, or a cut): its entry carries
/// them, `no_replay`; the stream's first one, or a new epoch's, carries none.
const MISSED: &str = "a snapshot after earlier entries names the ids missed since the last";
/// The exchange never restarts its ids here.
const NO_RESET: &str = "no reset entry: the exchange's ids never start over";
/// No action left while the sequencer still holds diffs for a snapshot.
const NOT_STUCK: &str = "the stream never comes to rest waiting for a snapshot nobody fetches";
/// Not vacuous: a lost diff ends in a snapshot entry that says so.
const RESYNCED: &str = "a snapshot naming missed ids is written after a lost diff";

fn rebuilds_the_book(sink: &[Entry]) -> bool {
    let mut book: Option<u64> = None;
    sink.iter().all(|entry| match *entry {
        Entry::Snapshot { seq, book: b, .. } => {
            book = Some(b);
            b == seq
        }
        Entry::Diff { first, last } => {
            if let Some(b) = book
                && first <= b + 1
                && last > b
            {
                book = Some(last);
            }
            book == Some(last)
        }
        Entry::Gap { .. } => {
            book = None;
            false
        }
        Entry::Reset { .. } => {
            book = None;
            true
        }
    })
}

fn diffs_continue(sink: &[Entry]) -> bool {
    let mut booked = false;
    let mut before: Option<Entry> = None;
    sink.iter().all(|&entry| {
        let continues = match (entry, before) {
            (Entry::Diff { first, last }, Some(Entry::Snapshot { seq, .. })) if booked => {
                first <= seq + 1 && last > seq
            }
            (Entry::Diff { first, .. }, Some(previous)) if booked => {
                first == previous.position() + 1
            }
            _ => true,
        };
        match entry {
            Entry::Snapshot { .. } => booked = true,
            Entry::Reset { .. } => booked = false,
            _ => {}
        }
        before = Some(entry);
        continues
    })
}

fn ids_increase(sink: &[Entry]) -> bool {
    let mut last: Option<u64> = None;
    sink.iter().all(|entry| {
        let increases =
            matches!(entry, Entry::Reset { .. }) || last.is_none_or(|last| entry.position() > last);
        last = Some(entry.position());
        increases
    })
}

fn names_what_was_missed(sink: &[Entry]) -> bool {
    sink.iter().enumerate().all(|(i, entry)| {
        let Entry::Snapshot { seq, missed, .. } = *entry else {
            return true;
        };
        let expected = match i.checked_sub(1).map(|j| sink[j]) {
            None | Some(Entry::Reset { .. }) => None,
            Some(before) => Some((before.position() + 1, seq, GapReason::NoReplay)),
        };
        missed == expected
    })
}

fn check(
    fixes: Fixes,
    reset_after: u32,
    finish_when: HasDiscoveries,
) -> impl Checker<SnapshotModel> {
    model_check::explore(
        SnapshotModel { fixes, reset_after },
        finish_when,
        model_check::depth(usize::MAX),
    )
}

/// Explores with `fixes` until it has a counterexample to each of `broken`
/// (breadth-first: short ones), and prints them.
fn finds_without(fixes: Fixes, broken: &[&'static str]) {
    let started = std::time::Instant::now();
    let checker = check(
        fixes,
        RESET_AFTER,
        HasDiscoveries::AllOf(broken.iter().copied().collect()),
    );
    eprintln!(
        "{fixes:?}: {} states explored in {:.1?}",
        checker.state_count(),
        started.elapsed()
    );
    model_check::expect_counterexamples(&checker, broken);
}

#[test]
fn a_book_rebuilt_from_the_sink_is_the_exchanges_at_every_entry() {
    model_check::assert_every_property("snapshot model", || {
        check(Fixes::ALL, RESET_AFTER, HasDiscoveries::AnyFailures)
    });
}

/// With reset detection off (`with_reset_after(0)`) every promise holds
/// too: a restart is then never taken for one, and none happens here.
#[test]
fn without_reset_detection_every_promise_holds() {
    model_check::assert_every_property("snapshot model, no resets", || {
        check(Fixes::ALL, 0, HasDiscoveries::AnyFailures)
    });
}

#[test]
fn without_the_ranges_a_lost_diff_is_applied_over() {
    let fixes = Fixes {
        ranges_given: false,
        ..Fixes::ALL
    };
    finds_without(fixes, &[BOOK, CONTINUES]);
}

#[test]
fn without_holding_diffs_during_a_resync_they_are_written_with_no_book() {
    let fixes = Fixes {
        held_while_syncing: false,
        ..Fixes::ALL
    };
    finds_without(fixes, &[BOOK]);
}

#[test]
fn without_a_fetch_after_a_loss_the_stream_holds_diffs_for_ever() {
    let fixes = Fixes {
        resync_after_a_loss: false,
        ..Fixes::ALL
    };
    finds_without(fixes, &[NOT_STUCK]);
}

#[test]
fn without_asking_again_a_stale_snapshot_leaves_the_stream_holding_diffs() {
    let fixes = Fixes {
        stale_asked_again: false,
        ..Fixes::ALL
    };
    finds_without(fixes, &[NOT_STUCK]);
}

#[test]
fn a_stale_snapshot_taken_as_the_book_hides_the_ids_missed_before_it() {
    let fixes = Fixes {
        refuse_stale_snapshots: false,
        ..Fixes::ALL
    };
    finds_without(fixes, &[MISSED]);
}

#[test]
fn without_its_missed_range_a_snapshot_entry_hides_a_lost_diff() {
    let fixes = Fixes {
        missed_recorded: false,
        ..Fixes::ALL
    };
    finds_without(fixes, &[MISSED]);
}
