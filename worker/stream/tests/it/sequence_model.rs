//! The upstream-sequence rules, model-checked with stateright.
//!
//! One stream, explicit discrete time. The upstream produces one event per
//! tick (contiguous sequences, or, for the `increasing` step, sequences that
//! may skip one). A worker connects (a `replay` upstream delivers from the
//! sequence it is asked for; a live upstream, in `live` and `backfill` mode,
//! starts at its current head and cannot replay), is cut by the server at any
//! time, may miss an event inside a connection (a live hole), and crashes: a
//! new owner then opens the sink and resumes from it. A history (`backfill`)
//! holds what was produced from a retention edge that moves forward, and may
//! fail a fetch. Every decision about sequences is taken by the `Sequencer`
//! the runtime uses (`leasehold_stream::sequence`); the model plays the
//! machine's shell around it (worker/stream/src/machine.rs): it feeds
//! the arrivals, calls `connected()` on each connection, fetches a page for a
//! running backfill and gives the range up after three pages without
//! progress or a failed fetch, answers `Step::Reconnect` in replay mode by
//! reconnecting after the confirmed position, and queues every event and gap
//! marker, in order, for a sink that drops an entry at or below its last
//! position (`protocol::already_appended`). Queued writes land one at a time;
//! a cut flushes them (the runner writes what it has before it reconnects), a
//! crash loses them. One owner at a time: fencing is the lease model's
//! business (`protocol_model.rs`).
//!
//! The invariants are checked on the sink. Each rule has a switch in
//! [`Fixes`]; a test turns each off and checks that the model finds a
//! counterexample, which is how we know the model can fail. Its first runs
//! found three bugs of the first `Sequencer`, all fixed (each has a unit
//! test in `sequence.rs` now): a connection made while a backfill ran had its
//! own jump never filled; a range the history had nothing for was given up
//! with a false `backfill_exhausted` marker; and a held event that started
//! the next backfill went behind the events held after it, which were then
//! written first and it dropped as a replay. `LEASEHOLD_MODEL_DEPTH` bounds the search
//! depth (by default every state is explored).
//!
//! Bounds, and what is left out:
//! - `UPSTREAM_RESUME=snapshot` (order books) is not modelled (see
//!   [`Setup::all`]).
//! - In `increasing` mode the upstream's own holes inside a connection are
//!   not modelled: a sequence that skips is normal there, so nothing can tell
//!   a lost event from an unused sequence. What is checkable is a new
//!   connection's jump, which `backfill` fills from the history.
//! - A `replay` upstream keeps everything: its retention edge is the runner's
//!   `RetentionExceeded` path (telemetry and a reposition), not the
//!   sequencer's.
//! - The bound on held events (`backfill_hold_max`) only pauses reading; it
//!   is left out, as are the waits between pages.
//! - The history is up to date with the upstream (a lagging one is what the
//!   empty-page retries are for; here an empty page means the history has
//!   nothing more). It answers a page in one of two shapes ([`Shape`]): from
//!   the requested sequence on, past the range (`fromId`-style), or bounded
//!   by the range (a server that honours `{to_seq}`).
//! - A restart (the upstream's sequence starts over at 1, on the open
//!   connection) is modelled for `live` and `backfill`: the sequencer runs
//!   with `UPSTREAM_RESET_AFTER` 1 (nothing else here delivers a frame below
//!   the stream), and the shell's new epoch (lifted token, reset entry) is
//!   one atomic step that starts a fresh sink epoch; the old epoch's entries
//!   are dropped from the state once written (every property held for them
//!   while they were current). A `replay` upstream is asked for a position
//!   and answers for its own API; it is left out. The properties that
//!   compare the sink with the upstream hold from the reset entry on.
//! - In replay mode a reconnect repositions after the confirmed sequence;
//!   the runner flushes its writes first, so that is where the sequencer
//!   already stands and no switch can show the reposition matters here.

use std::fmt;
use std::hash::{Hash, Hasher};

use leasehold_control::protocol;
use leasehold_stream::sequence::{Arrival, JumpBound, ResumeMode, SeqStep, Sequencer, Step};
use leasehold_telemetry::GapReason;
use leasehold_testkit::model_check;
use stateright::{Checker, HasDiscoveries, Model, Property};

/// The upstream produces one event per tick; the model stops time here.
const MAX_TIME: u64 = 5;
/// Items a history page holds at most.
const PAGE: usize = 2;
/// Pages in a row without progress before the shell gives a range up
/// (`RunnerConfig::backfill_empty_pages`'s default).
const EMPTY_PAGES: u8 = 3;
const MAX_CUTS: u8 = 1;
const MAX_SKIPS: u8 = 1;
const MAX_CRASHES: u8 = 1;
const MAX_FETCH_FAILURES: u8 = 1;
const MAX_RESENDS: u8 = 1;
const MAX_BOGUS: u8 = 1;
const MAX_RESTARTS: u8 = 1;
/// What a bogus frame claims: far beyond anything the upstream produces here.
const BOGUS_SEQ: u64 = 1_000;
/// The jump bound the shipped rules run with: above every real step here
/// (a live start after a crash jumps at most to the head, 2 * MAX_TIME).
const JUMP: JumpBound = JumpBound {
    max: 2 * MAX_TIME,
    confirm_after: 3,
};

/// Which rules are in place. `ALL` is the shipped behaviour.
#[derive(Clone, Copy, Debug)]
struct Fixes {
    /// A live hole becomes a gap marker (else the shell drops `Step::Gap` in
    /// `live` mode).
    live_holes_marked: bool,
    /// Live events that arrive during a backfill are held and written after
    /// it (else the shell writes them at once, bypassing the sequencer).
    hold_during_backfill: bool,
    /// The sequencer drops an arrival at or below what it handed on or holds
    /// (else the shell writes an arrival the sequencer calls `Replayed`).
    sequencer_drops_replays: bool,
    /// The sink drops an entry at or below its last position (else it
    /// appends it). With the other rules on, a single owner hands the sink a
    /// replay only by resending a write whose reply was lost; a lagging
    /// resume (`resume_from_sink` off) or a zombie (the lease model) are the
    /// other ways.
    sink_drops_replays: bool,
    /// A new owner resumes after the further of the sink's last position and
    /// the checkpoint (else after its own checkpoint, which may lag).
    resume_from_sink: bool,
    /// The shell calls `connected()` on each new connection (else never: only
    /// a new sequencer or a reposition starts a fresh connection). Only
    /// `increasing` + `backfill` reads it.
    connected_called: bool,
    /// A gap marker sits at its last missing sequence (else at its first:
    /// a new owner that resumes after a marker whose event was lost in the
    /// crash marks part of it again).
    marker_at_last_missing: bool,
    /// A frame more than the jump bound ahead waits for the frames after it
    /// (else it is taken at its word: one bogus frame moves the stream past
    /// everything the upstream will send).
    jump_bound: bool,
    /// A sequence below the stream's starts a new epoch (else every frame
    /// behind is a replay: a restarted upstream is never written again).
    resets_detected: bool,
}

impl Fixes {
    const ALL: Fixes = Fixes {
        live_holes_marked: true,
        hold_during_backfill: true,
        sequencer_drops_replays: true,
        sink_drops_replays: true,
        resume_from_sink: true,
        connected_called: true,
        marker_at_last_missing: true,
        jump_bound: true,
        resets_detected: true,
    };

    fn reset_after(&self) -> u32 {
        u32::from(self.resets_detected)
    }

    fn jump(&self) -> JumpBound {
        if self.jump_bound {
            JUMP
        } else {
            JumpBound::NONE
        }
    }
}

/// How the history answers a page request for `from..=to`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Shape {
    /// Up to [`PAGE`] items from `from` on, whatever `to` is (`fromId`-style).
    FromId,
    /// Up to [`PAGE`] items of `from..=to` (the server honours `{to_seq}`).
    Bounded,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Setup {
    mode: ResumeMode,
    step: SeqStep,
    /// Only `backfill` reads the history (the others have `FromId`).
    shape: Shape,
}

impl Setup {
    fn all() -> Vec<Setup> {
        let mut setups = Vec::new();
        // An order book's `snapshot` mode is not modelled here: its upstream
        // has no trade-like history, and its promise (a reader rebuilds the
        // book at every position) needs the book, which this model does not
        // keep. Its rules are unit-tested in `sequence.rs` and end to end.
        let modes = ResumeMode::ALL
            .into_iter()
            .filter(|mode| *mode != ResumeMode::Snapshot);
        for mode in modes {
            for step in SeqStep::ALL {
                let shapes: &[Shape] = if mode == ResumeMode::Backfill {
                    &[Shape::FromId, Shape::Bounded]
                } else {
                    &[Shape::FromId]
                };
                for &shape in shapes {
                    setups.push(Setup { mode, step, shape });
                }
            }
        }
        setups
    }
}

/// The sequencer, compared and hashed by its derived `Debug` (it has no
/// `Eq`/`Hash` of its own; `Debug` shows every field, the private ones
/// included, so equal text is equal state).
#[derive(Clone)]
struct Seq(Sequencer<u64>);

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

/// One sink entry: an event at its sequence, or a gap marker covering
/// `from..=to`, stored at `at`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Entry {
    Event(u64),
    Marker {
        from: u64,
        to: u64,
        at: u64,
        reason: GapReason,
        /// The reason the model says is right (`None`: no such marker
        /// should exist).
        right: Option<GapReason>,
    },
    /// A new epoch's first entry: the sequence starts over at `to`.
    Reset {
        to: u64,
    },
}

impl Entry {
    /// Where the sink stores it (what its drop compares).
    fn position(&self) -> u64 {
        match *self {
            Entry::Event(seq) => seq,
            Entry::Marker { at, .. } => at,
            Entry::Reset { to } => to - 1,
        }
    }

    /// The sequences it stands for.
    fn covers(&self) -> (u64, u64) {
        match *self {
            Entry::Event(seq) => (seq, seq),
            Entry::Marker { from, to, .. } => (from, to),
            // Nothing: an empty range just before the new sequence.
            Entry::Reset { to } => (to, to - 1),
        }
    }

    fn is_marker(&self) -> bool {
        matches!(self, Entry::Marker { .. })
    }
}

/// What produced a batch of steps (for the right reason of a marker).
#[derive(Clone, Copy, Debug)]
enum Cause {
    /// A live arrival.
    Arrival,
    /// A history page, read while the history's edge was here.
    Page { edge: u64 },
    /// The shell gave the range up.
    GaveUp,
    /// The old epoch ends before a reset (a running backfill gives up).
    Reset,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Connection {
    /// The lowest sequence it delivers next.
    next: u64,
    /// Nothing was delivered on it yet.
    first: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct State {
    setup: Setup,
    now: u64,
    /// Bit `s`: sequence `s` was produced.
    produced: u64,
    /// The newest produced sequence (0: none yet).
    head: u64,
    /// The history holds the produced sequences from here on.
    edge: u64,
    connection: Option<Connection>,
    sequencer: Seq,
    /// Written by the shell, not landed yet, in order.
    pending: Vec<Entry>,
    /// The highest position the sink acknowledged to this owner.
    confirmed: u64,
    /// The running backfill's range, as its `Step::Backfill` gave it.
    range: (u64, u64),
    /// Pages in a row that brought the backfill no further.
    empty_pages: u8,
    /// The stored checkpoint (only moved when the resume ignores the sink).
    checkpoint: u64,
    sink: Vec<Entry>,
    /// The last write that landed (what a resend repeats).
    last_landed: Option<Entry>,
    /// A page asked for a produced sequence the history had forgotten, or a
    /// fetch failed.
    history_lost: bool,
    /// A backfill page queued an event from inside its range.
    filled_from_history: bool,
    /// Sink entries when the owner crashed.
    crashed_at: Option<usize>,
    cuts: u8,
    skips: u8,
    crashes: u8,
    fetch_failures: u8,
    resends: u8,
    bogus: u8,
    restarts: u8,
    /// The upstream restarted and the sink has no reset entry for it yet:
    /// the sink and the upstream count different sequences meanwhile.
    restart_unrecorded: bool,
    /// A frame of a restarted upstream was dropped as a replay.
    restart_dropped: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    /// The upstream's sequence starts over at 1, on the open connection.
    Restart,
    /// The upstream produces its next event (`true`: skipping a sequence,
    /// `increasing` only).
    Tick(bool),
    Connect,
    /// The connection delivers its next event.
    Deliver,
    /// The connection loses its next event (a live hole).
    Skip,
    /// The server closes the connection.
    Cut,
    /// The oldest queued write lands.
    Land,
    /// The running backfill's page arrives.
    Page,
    /// The running backfill's fetch fails past its retries.
    FetchFails,
    /// The history forgets its oldest sequence.
    Forget,
    /// The owner crashes; a new one opens the sink.
    Crash,
    /// The owner's confirmed position reaches the stored checkpoint.
    Checkpoint,
    /// The sink applied the last write but its reply was lost: written again.
    Resend,
    /// The connection delivers a frame that passes the data match with a
    /// far-future number at the sequence pointer (a status frame's timestamp).
    Bogus,
}

struct SequenceModel {
    fixes: Fixes,
    setups: Vec<Setup>,
}

impl State {
    fn produced(&self, seq: u64) -> bool {
        seq < 64 && self.produced & (1 << seq) != 0
    }

    /// The next produced sequence at or after `from`, if any.
    fn next_produced(&self, from: u64) -> Option<u64> {
        (from.max(1)..=self.head).find(|&s| self.produced(s))
    }

    fn sink_last(&self) -> Option<u64> {
        self.sink.last().map(Entry::position)
    }

    fn markers(&self) -> impl Iterator<Item = &Entry> {
        self.sink.iter().filter(|e| e.is_marker())
    }

    fn marked(&self, reason: GapReason) -> bool {
        self.markers()
            .any(|e| matches!(*e, Entry::Marker { reason: r, .. } if r == reason))
    }

    /// The lowest and highest sequence the sink stands for.
    fn span(&self) -> Option<(u64, u64)> {
        let first = self.sink.iter().map(|e| e.covers().0).min()?;
        let last = self.sink.iter().map(|e| e.covers().1).max()?;
        Some((first, last))
    }

    /// Every produced sequence in `from..=to` is an event in the sink.
    fn nothing_missing(&self, from: u64, to: u64) -> bool {
        (from..=to)
            .filter(|&s| self.produced(s))
            .all(|s| self.sink.contains(&Entry::Event(s)))
    }

    /// The page the history answers for `from..=to`.
    fn page(&self, from: u64, to: u64) -> Vec<(u64, u64)> {
        (from.max(self.edge)..=self.head)
            .filter(|&s| self.produced(s))
            .filter(|&s| self.setup.shape == Shape::FromId || s <= to)
            .take(PAGE)
            .map(|s| (s, s))
            .collect()
    }

    /// The runner's open: where a new owner resumes, and its sequencer.
    fn open(&mut self, fixes: &Fixes) {
        let sink_last = self.sink_last();
        let (resume, anchored) = if fixes.resume_from_sink {
            let resume = protocol::resume_point(Some(self.checkpoint), sink_last);
            (resume, resume > 0 || sink_last.is_some())
        } else {
            (self.checkpoint, self.checkpoint > 0)
        };
        let mode = self.setup.mode;
        // A never-written stream: `None` for a live start, `Some(0)` for replay.
        let last = (anchored || mode == ResumeMode::Replay).then_some(resume);
        self.sequencer = Seq(Sequencer::new(mode, self.setup.step, last)
            .with_jump_bound(fixes.jump())
            .with_reset_after(fixes.reset_after()));
        self.confirmed = resume;
        self.connection = None;
        self.pending.clear();
        self.range = (0, 0);
        self.empty_pages = 0;
        self.last_landed = None;
    }

    /// The sink's write: dropped at or below the last position, else appended.
    fn land(&mut self, entry: Entry, fixes: &Fixes) -> bool {
        let position = entry.position();
        let appended =
            !(fixes.sink_drops_replays && protocol::already_appended(self.sink_last(), position));
        if appended {
            self.sink.push(entry);
        }
        // Dropped or appended, the sink acknowledges it.
        self.confirmed = self.confirmed.max(position);
        self.last_landed = Some(entry);
        appended
    }

    /// Everything queued lands (the runner flushes before it reconnects).
    fn flush(&mut self, fixes: &Fixes) {
        for entry in std::mem::take(&mut self.pending) {
            self.land(entry, fixes);
        }
    }

    /// The reason a marker from `from` should carry.
    fn right_reason(&self, from: u64, cause: Cause) -> Option<GapReason> {
        match (self.setup.mode, cause) {
            (ResumeMode::Live, Cause::Arrival) => Some(GapReason::NoReplay),
            (ResumeMode::Backfill, Cause::Page { edge }) => {
                // A page marks only what the history had forgotten: the
                // range's first sequence is `retention`, a later one (the
                // edge moved while the range was read) `backfill_exhausted`.
                (from < edge).then_some(if from == self.range.0 {
                    GapReason::Retention
                } else {
                    GapReason::BackfillExhausted
                })
            }
            // Failed, or the history had nothing more; or the upstream
            // restarted under a running backfill.
            (ResumeMode::Backfill, Cause::GaveUp | Cause::Reset) => {
                Some(GapReason::BackfillExhausted)
            }
            _ => None,
        }
    }

    /// The shell carries out the sequencer's steps, in order.
    fn apply(&mut self, steps: Vec<Step<u64>>, cause: Cause, fixes: &Fixes) {
        // Steps before a reset end the old epoch.
        let resets = steps.iter().any(|s| matches!(s, Step::Reset { .. }));
        let mut cause = if resets { Cause::Reset } else { cause };
        for step in steps {
            match step {
                Step::Reset { to, .. } => {
                    // The shell writes the old epoch out, then lifts the
                    // token and appends the reset entry in one step.
                    self.flush(fixes);
                    self.sink = vec![Entry::Reset { to }];
                    self.last_landed = None;
                    self.crashed_at = None;
                    self.confirmed = to - 1;
                    self.checkpoint = to - 1;
                    self.restart_unrecorded = false;
                    cause = Cause::Arrival;
                }
                Step::BehindDropped { .. } => {}
                Step::Resync { .. } | Step::Snapshot { .. } => {
                    unreachable!("no mode in this model re-synchronises from a snapshot")
                }
                Step::Event(seq, item) => {
                    assert_eq!(seq, item, "an event is written at its own sequence");
                    // Held live events follow a closed range in the same batch.
                    if matches!(cause, Cause::Page { .. }) && seq <= self.range.1 {
                        self.filled_from_history = true;
                    }
                    self.pending.push(Entry::Event(seq));
                }
                Step::Gap { from, to, reason } => {
                    if !fixes.live_holes_marked && self.setup.mode == ResumeMode::Live {
                        continue;
                    }
                    self.pending.push(Entry::Marker {
                        from,
                        to,
                        at: if fixes.marker_at_last_missing {
                            to
                        } else {
                            from
                        },
                        reason,
                        right: self.right_reason(from, cause),
                    });
                }
                Step::Backfill { from, to } => {
                    self.range = (from, to);
                    self.empty_pages = 0;
                }
                Step::Reconnect { .. } => self.disconnect(fixes),
                // Counted by the runner as a skipped frame; nothing written.
                Step::JumpDiscarded { .. } => {}
            }
        }
    }

    /// The connection ends (cut, or a reconnect step): what is queued is
    /// written first, then a replay shell asks again after what the sink
    /// confirmed.
    fn disconnect(&mut self, fixes: &Fixes) {
        self.flush(fixes);
        self.connection = None;
        if self.setup.mode == ResumeMode::Replay {
            self.sequencer.0.reposition(Some(self.confirmed));
        }
    }

    /// One live event reaches the shell.
    fn arrive(&mut self, seq: u64, fixes: &Fixes) {
        let backfilling = self.sequencer.0.backfilling();
        if !fixes.hold_during_backfill && backfilling {
            self.pending.push(Entry::Event(seq));
            return;
        }
        let mut out = Vec::new();
        // A restarted sequence that repeats the old last id exactly cannot
        // be told from a replay of it; one below it can.
        let below = self.sequencer.0.last().is_some_and(|last| seq < last);
        let arrival = self.sequencer.0.arrive(seq, seq, &mut out);
        if arrival == Arrival::Replayed && !fixes.sequencer_drops_replays {
            self.pending.push(Entry::Event(seq));
        }
        if arrival == Arrival::Replayed && self.restart_unrecorded && below {
            self.restart_dropped = true;
        }
        self.apply(out, Cause::Arrival, fixes);
    }
}

impl Model for SequenceModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        self.setups
            .iter()
            .map(|&setup| {
                let mut state = State {
                    setup,
                    now: 0,
                    produced: 0,
                    head: 0,
                    edge: 1,
                    connection: None,
                    sequencer: Seq(Sequencer::new(setup.mode, setup.step, None)),
                    pending: Vec::new(),
                    confirmed: 0,
                    range: (0, 0),
                    empty_pages: 0,
                    checkpoint: 0,
                    sink: Vec::new(),
                    last_landed: None,
                    history_lost: false,
                    filled_from_history: false,
                    crashed_at: None,
                    cuts: 0,
                    skips: 0,
                    crashes: 0,
                    fetch_failures: 0,
                    resends: 0,
                    bogus: 0,
                    restarts: 0,
                    restart_unrecorded: false,
                    restart_dropped: false,
                };
                state.open(&self.fixes);
                state
            })
            .collect()
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let setup = state.setup;
        if state.now < MAX_TIME {
            actions.push(Action::Tick(false));
            if setup.step == SeqStep::Increasing {
                actions.push(Action::Tick(true));
            }
        }
        match state.connection {
            None => actions.push(Action::Connect),
            Some(connection) => {
                if state.next_produced(connection.next).is_some() {
                    actions.push(Action::Deliver);
                    if setup.step == SeqStep::Contiguous
                        && state.skips < MAX_SKIPS
                        && state.restarts == 0
                    {
                        actions.push(Action::Skip);
                    }
                }
                if state.cuts < MAX_CUTS {
                    actions.push(Action::Cut);
                }
                // A stream's very first frame has nothing to be judged
                // against: it is taken at its word (documented).
                if state.bogus < MAX_BOGUS
                    && state.sequencer.0.last().is_some()
                    && state.restarts == 0
                {
                    actions.push(Action::Bogus);
                }
            }
        }
        if !state.pending.is_empty() {
            actions.push(Action::Land);
        }
        if state.sequencer.0.backfilling() {
            actions.push(Action::Page);
            if state.fetch_failures < MAX_FETCH_FAILURES && state.restarts == 0 {
                actions.push(Action::FetchFails);
            }
        }
        if setup.mode == ResumeMode::Backfill && state.edge < state.head {
            actions.push(Action::Forget);
        }
        if state.crashes < MAX_CRASHES {
            actions.push(Action::Crash);
        }
        // With the resume from the sink, the checkpoint (never past the
        // sink) is never read beyond `resume_after`'s maximum: it only
        // matters without that rule.
        if !self.fixes.resume_from_sink && state.checkpoint != state.confirmed {
            actions.push(Action::Checkpoint);
        }
        if state.last_landed.is_some() && state.resends < MAX_RESENDS && state.restarts == 0 {
            actions.push(Action::Resend);
        }
        // Something to go back below; a replay upstream is left out (above).
        // Not combined with the faults that meet no rule of the reset (a
        // bogus frame, a resend, a failed fetch, a live hole), before or
        // after it: with them the states grew sixfold for nothing.
        let unrelated_faults = state.bogus + state.resends + state.fetch_failures + state.skips;
        if setup.mode != ResumeMode::Replay
            && state.restarts < MAX_RESTARTS
            && state.head >= 2
            && unrelated_faults == 0
        {
            actions.push(Action::Restart);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let fixes = &self.fixes;
        let mut s = last.clone();
        match action {
            Action::Tick(skip) => {
                s.now += 1;
                s.head += if skip { 2 } else { 1 };
                s.produced |= 1 << s.head;
            }
            Action::Connect => {
                let asked = s.sequencer.0.resume_from();
                let next = match s.setup.mode {
                    // A replay upstream honours the request (0: wherever it is).
                    ResumeMode::Replay if asked > 0 => asked,
                    // A live upstream starts at its current head.
                    _ => s.head.max(1),
                };
                s.connection = Some(Connection { next, first: true });
                if fixes.connected_called {
                    s.sequencer.0.connected();
                }
            }
            Action::Deliver => {
                let connection = s.connection?;
                let seq = s.next_produced(connection.next)?;
                s.connection = Some(Connection {
                    next: seq + 1,
                    first: false,
                });
                s.arrive(seq, fixes);
            }
            Action::Skip => {
                let connection = s.connection?;
                let seq = s.next_produced(connection.next)?;
                s.connection = Some(Connection {
                    next: seq + 1,
                    ..connection
                });
                s.skips += 1;
            }
            Action::Bogus => {
                s.bogus += 1;
                s.arrive(BOGUS_SEQ, fixes);
            }
            Action::Cut => {
                s.cuts += 1;
                s.disconnect(fixes);
            }
            Action::Land => {
                let entry = s.pending.remove(0);
                s.land(entry, fixes);
            }
            Action::Page => {
                let (from, to) = s.sequencer.0.backfill_range()?;
                if (from..s.edge).any(|seq| s.produced(seq)) {
                    s.history_lost = true;
                }
                let page = s.page(from, to);
                let mut out = Vec::new();
                let moved = s.sequencer.0.backfilled(page, &mut out);
                s.empty_pages = if moved { 0 } else { s.empty_pages + 1 };
                let edge = s.edge;
                s.apply(out, Cause::Page { edge }, fixes);
                if !moved && s.empty_pages >= EMPTY_PAGES {
                    let mut out = Vec::new();
                    s.sequencer.0.backfill_gave_up(&mut out);
                    s.apply(out, Cause::GaveUp, fixes);
                }
            }
            Action::FetchFails => {
                s.fetch_failures += 1;
                s.history_lost = true;
                let mut out = Vec::new();
                s.sequencer.0.backfill_gave_up(&mut out);
                s.apply(out, Cause::GaveUp, fixes);
            }
            Action::Forget => s.edge += 1,
            Action::Restart => {
                s.restarts += 1;
                s.head = 0;
                s.produced = 0;
                s.edge = 1;
                s.restart_unrecorded = true;
                if let Some(connection) = &mut s.connection {
                    connection.next = 1;
                }
            }
            Action::Crash => {
                s.crashes += 1;
                s.crashed_at = Some(s.sink.len());
                s.open(fixes);
            }
            Action::Checkpoint => s.checkpoint = s.confirmed,
            Action::Resend => {
                let entry = s.last_landed?;
                // A resend the sink drops changes nothing: only one it
                // appends spends the budget.
                if s.land(entry, fixes) {
                    s.resends += 1;
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(POSITIONS, |_, s: &State| {
                s.sink.windows(2).all(|w| w[0].position() < w[1].position())
            }),
            Property::always(ONCE, |_, s: &State| {
                s.sink.iter().enumerate().all(|(i, a)| {
                    let (a_from, a_to) = a.covers();
                    s.sink[i + 1..].iter().all(|b| {
                        let (b_from, b_to) = b.covers();
                        a_to < b_from || b_to < a_from
                    })
                })
            }),
            Property::always(CONTIGUOUS, |_, s: &State| {
                s.setup.step != SeqStep::Contiguous
                    || s.span().is_none_or(|(first, last)| {
                        (first..=last).all(|seq| {
                            s.sink.iter().any(|e| {
                                let (from, to) = e.covers();
                                (from..=to).contains(&seq)
                            })
                        })
                    })
            }),
            Property::always(REPLAY, |_, s: &State| {
                s.setup.mode != ResumeMode::Replay
                    || (s.markers().next().is_none()
                        && s.span().is_none_or(|(_, last)| s.nothing_missing(1, last)))
            }),
            Property::always(BACKFILL, |_, s: &State| {
                s.setup.mode != ResumeMode::Backfill
                    || s.history_lost
                    || s.restart_unrecorded
                    || (s.markers().next().is_none()
                        && s.span()
                            .is_none_or(|(first, last)| s.nothing_missing(first, last)))
            }),
            Property::always(BEYOND, |_, s: &State| {
                s.restart_unrecorded || s.sink.iter().all(|e| e.covers().1 <= s.head)
            }),
            Property::always(RESTART, |_, s: &State| !s.restart_dropped),
            Property::always(REASON, |_, s: &State| {
                s.sink.iter().all(|e| match *e {
                    Entry::Marker { reason, right, .. } => right == Some(reason),
                    Entry::Event(_) | Entry::Reset { .. } => true,
                })
            }),
            Property::always(INCREASING_LIVE, |_, s: &State| {
                s.setup.step != SeqStep::Increasing
                    || s.setup.mode != ResumeMode::Live
                    || s.markers().next().is_none()
            }),
            Property::sometimes("a live hole is marked no_replay", |_, s: &State| {
                s.marked(GapReason::NoReplay)
            }),
            Property::sometimes(
                "a forgotten range start is marked retention",
                |_, s: &State| s.marked(GapReason::Retention),
            ),
            Property::sometimes(
                "a range given up is marked backfill_exhausted",
                |_, s: &State| s.marked(GapReason::BackfillExhausted),
            ),
            Property::sometimes(
                "a contiguous backfill fills a hole from history",
                |_, s: &State| s.setup.step == SeqStep::Contiguous && s.filled_from_history,
            ),
            Property::sometimes(
                "an increasing backfill fills a jump from history",
                |_, s: &State| s.setup.step == SeqStep::Increasing && s.filled_from_history,
            ),
            Property::sometimes(
                "a restarted upstream is written after a reset entry",
                |_, s: &State| {
                    matches!(s.sink.first(), Some(Entry::Reset { .. }))
                        && s.sink.iter().any(|e| matches!(e, Entry::Event(_)))
                },
            ),
            Property::sometimes("a new owner continues the sink", |_, s: &State| {
                s.crashed_at.is_some_and(|at| at > 0 && s.sink.len() > at)
            }),
        ]
    }
}

/// Invariant (1).
const POSITIONS: &str = "positions strictly increase";
/// Invariant (2), for both steps: nothing stands for a sequence twice.
const ONCE: &str = "no sequence is both an event and in a marker, or in two markers";
/// Invariant (2), contiguous: nothing is left out.
const CONTIGUOUS: &str = "contiguous: every sequence from the first to the last is stored";
/// Invariant (3).
const REPLAY: &str = "replay: no marker and nothing missing";
/// Invariants (4) and (6) for backfill, both steps.
const BACKFILL: &str = "backfill from a working history: no marker and nothing missing";
/// A bogus frame moves nothing: the sink never stands for a sequence the
/// upstream has not produced.
const BEYOND: &str = "nothing stands for a sequence the upstream never reached";
/// A restarted upstream is written again: none of its frames below the old
/// sequence is taken for a replay of it (one that repeats the old last id
/// exactly cannot be told from a replay, nor can a restart that already
/// passed the old sequence when it is first read).
const RESTART: &str = "no frame of a restarted upstream is dropped as a replay";
/// Invariant (5).
const REASON: &str = "every marker has the right reason";
/// Invariant (6) for live.
const INCREASING_LIVE: &str = "increasing live: no marker";

/// Explores until `finish_when` holds, by default to the end (every state).
fn check(fixes: Fixes, finish_when: HasDiscoveries) -> impl Checker<SequenceModel> {
    let model = SequenceModel {
        fixes,
        setups: Setup::all(),
    };
    model_check::explore(model, finish_when, model_check::depth(usize::MAX))
}

#[test]
fn the_shipped_rules_keep_every_promise() {
    model_check::assert_every_property("sequence model", || {
        check(Fixes::ALL, HasDiscoveries::AnyFailures)
    });
}

/// Explores with `fixes` and expects a counterexample to `broken`; the
/// search stops at the first (breadth-first: a short one).
fn counterexample(fixes: Fixes, broken: &'static str) -> State {
    let started = std::time::Instant::now();
    let checker = check(fixes, HasDiscoveries::AnyOf([broken].into()));
    let path = checker
        .discovery(broken)
        .unwrap_or_else(|| panic!("no counterexample to {broken:?}"));
    let last = path.last_state().clone();
    let actions = path.into_actions();
    eprintln!(
        "counterexample to {broken:?} ({} states, {:.1?}): {} actions\n  {:?}\n  {:?}\n  sink {:?}",
        checker.state_count(),
        started.elapsed(),
        actions.len(),
        last.setup,
        actions,
        last.sink,
    );
    last
}

/// Turns rules off and expects the model to find a counterexample to `broken`.
fn finds_without(fixes: Fixes, broken: &'static str) -> State {
    counterexample(fixes, broken)
}

#[test]
fn without_live_hole_markers_a_missed_event_leaves_no_trace() {
    let fixes = Fixes {
        live_holes_marked: false,
        ..Fixes::ALL
    };
    finds_without(fixes, CONTIGUOUS);
}

#[test]
fn without_holding_live_events_the_backfill_lands_below_the_sink_and_is_dropped() {
    let fixes = Fixes {
        hold_during_backfill: false,
        ..Fixes::ALL
    };
    finds_without(fixes, BACKFILL);
}

#[test]
fn without_the_sequencers_replay_drop_a_repeated_live_event_overtakes_the_backfill() {
    let fixes = Fixes {
        sequencer_drops_replays: false,
        ..Fixes::ALL
    };
    finds_without(fixes, BACKFILL);
}

#[test]
fn without_the_sinks_replay_drop_a_resent_write_is_appended_twice() {
    let fixes = Fixes {
        sink_drops_replays: false,
        ..Fixes::ALL
    };
    finds_without(fixes, POSITIONS);
}

#[test]
fn without_resuming_from_the_sink_a_new_owner_marks_events_it_already_wrote() {
    let fixes = Fixes {
        resume_from_sink: false,
        ..Fixes::ALL
    };
    finds_without(fixes, ONCE);
}

#[test]
fn without_connected_an_increasing_reconnects_jump_is_not_backfilled() {
    let fixes = Fixes {
        connected_called: false,
        ..Fixes::ALL
    };
    finds_without(fixes, BACKFILL);
}

#[test]
fn without_markers_at_their_last_sequence_a_new_owner_marks_a_range_twice() {
    let fixes = Fixes {
        marker_at_last_missing: false,
        ..Fixes::ALL
    };
    finds_without(fixes, ONCE);
}

#[test]
fn without_resets_a_restarted_upstream_is_dropped_as_replays() {
    let fixes = Fixes {
        resets_detected: false,
        ..Fixes::ALL
    };
    finds_without(fixes, RESTART);
}

#[test]
fn without_the_jump_bound_one_bogus_frame_moves_the_stream_past_the_upstream() {
    let fixes = Fixes {
        jump_bound: false,
        ..Fixes::ALL
    };
    finds_without(fixes, BEYOND);
}
