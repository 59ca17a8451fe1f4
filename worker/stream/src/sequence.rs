//! What an upstream's sequence numbers mean for the sink, free of I/O and of
//! any clock: which arrivals are replays, which open a hole, and what a hole
//! becomes: a reconnect that asks for it again (`replay`), a gap marker
//! (`live`), or a backfill from history while live events are held (`backfill`).
//!
//! [`Sequencer`] is the one place these rules live. The stream runner is the
//! shell around it (it reads frames, fetches history pages, writes what comes
//! out in order); `worker/stream/tests/it/sequence_model.rs` model-checks it with
//! stateright against upstreams that cannot replay and histories that run out.
//!
//! The promise it keeps (invariant 8, restated for every upstream): what it
//! hands on has strictly increasing positions (an event at its sequence, a gap
//! marker at its last missing sequence); with a contiguous sequence every
//! sequence after the first one handed on is either an event or inside
//! exactly one marker, never both; in `replay` mode it produces no markers.

use std::collections::VecDeque;

use leasehold_telemetry::{GapReason, SnapshotReason};

/// What the worker does about missed sequences (`UPSTREAM_RESUME`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResumeMode {
    /// The upstream resumes from any sequence on request: a hole is asked for
    /// again by reconnecting from the last confirmed sequence.
    Replay,
    /// The upstream starts live; a hole is fetched from its history (HTTP)
    /// while live events are held, then the held events follow.
    Backfill,
    /// The upstream starts live and cannot replay: a hole is recorded as a gap
    /// marker and the stream goes on.
    Live,
    /// An order book: diffs mean nothing without the book they apply to, so
    /// a stream with nothing to continue, a hole, a reset or a checksum
    /// failure re-synchronises from a snapshot (REST or in-band) while the
    /// diffs that arrive meanwhile are held, then follow it.
    Snapshot,
}

impl ResumeMode {
    /// Every value, as `UPSTREAM_RESUME` spells it.
    pub const ALL: [ResumeMode; 4] = [
        ResumeMode::Replay,
        ResumeMode::Backfill,
        ResumeMode::Live,
        ResumeMode::Snapshot,
    ];

    /// The `UPSTREAM_RESUME` value.
    pub fn as_str(self) -> &'static str {
        match self {
            ResumeMode::Replay => "replay",
            ResumeMode::Backfill => "backfill",
            ResumeMode::Live => "live",
            ResumeMode::Snapshot => "snapshot",
        }
    }

    /// The mode `UPSTREAM_RESUME` names.
    pub fn parse(value: &str) -> Option<ResumeMode> {
        ResumeMode::ALL.into_iter().find(|m| m.as_str() == value)
    }
}

/// How an upstream's sequence advances (`UPSTREAM_SEQ_STEP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SeqStep {
    /// Every sequence is used: a skipped one is missing data.
    Contiguous,
    /// Sequences only increase (shared by channels, or sparse ids): holes are
    /// normal, and only a sequence at or below the last one is a replay.
    Increasing,
}

impl SeqStep {
    /// Every value, as `UPSTREAM_SEQ_STEP` spells it.
    pub const ALL: [SeqStep; 2] = [SeqStep::Contiguous, SeqStep::Increasing];

    /// The `UPSTREAM_SEQ_STEP` value.
    pub fn as_str(self) -> &'static str {
        match self {
            SeqStep::Contiguous => "contiguous",
            SeqStep::Increasing => "increasing",
        }
    }

    /// The step `UPSTREAM_SEQ_STEP` names.
    pub fn parse(value: &str) -> Option<SeqStep> {
        SeqStep::ALL.into_iter().find(|s| s.as_str() == value)
    }
}

/// What the shell must do next, in this order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<T> {
    /// Write this event at this sequence.
    Event(u64, T),
    /// Write a gap marker for `from..=to`.
    Gap {
        /// First missing sequence.
        from: u64,
        /// Last missing sequence (the marker's position).
        to: u64,
        /// Why it is missing.
        reason: GapReason,
    },
    /// Fetch `from..=to` from history and hand the pages to
    /// [`Sequencer::backfilled`]; live events are held meanwhile.
    Backfill {
        /// First sequence to fetch.
        from: u64,
        /// Last sequence to fetch.
        to: u64,
    },
    /// A frame that claimed a position more than the jump bound ahead was
    /// not confirmed by the frames after it: dropped, never written (the
    /// shell counts it as a skipped frame, `reason="jump"`).
    JumpDiscarded {
        /// The sequence it claimed.
        seq: u64,
    },
    /// The upstream's sequence went back (a service restart: trade ids or
    /// update ids start over): `reset_after` frames in a row below the last
    /// position, each above the one before. Written as a reset entry at the
    /// start of a new epoch (the shell raises the fence token first, so entry
    /// ids still increase and the old epoch's writers are fenced); the steps
    /// after it are the new epoch's, from `to`.
    Reset {
        /// The last position handed on before (`reset_from`).
        from: u64,
        /// The first sequence after (`reset_to`).
        to: u64,
    },
    /// Frames held back as a possible reset turned out to be replays (the
    /// run stopped climbing, or climbed back past the stream): dropped, each
    /// counted by the shell as a replayed frame.
    BehindDropped {
        /// How many.
        frames: usize,
    },
    /// Snapshot mode: get a snapshot of the book and hand it to
    /// [`Sequencer::snapshotted`]; diffs are held meanwhile.
    Resync {
        /// Why the book is re-synchronised.
        reason: SnapshotReason,
    },
    /// Snapshot mode: write this snapshot entry at `seq` (the book after
    /// every update up to `seq`); the held diffs after it follow.
    Snapshot {
        /// The snapshot's sequence (Binance `lastUpdateId`).
        seq: u64,
        /// The snapshot as received.
        item: T,
        /// Why the book was re-synchronised.
        reason: SnapshotReason,
        /// Diffs before it that no reader will see (a hole, or diffs that
        /// went into a book whose checksum failed): the entry says so.
        missed: Option<Missed>,
    },
    /// Replay mode: the upstream skipped `expected`; reconnect from it.
    Reconnect {
        /// The sequence that should have come next.
        expected: u64,
        /// The sequence that came (for a frame that covers a range, the
        /// first it covers).
        got: u64,
    },
}

/// Diffs a snapshot entry stands in for: a reader's book was wrong (or
/// missing) from `from` until the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Missed {
    /// First sequence not carried into a reader's book.
    pub from: u64,
    /// The snapshot's sequence.
    pub to: u64,
    /// Why: `no_replay` after a hole, `checksum` after a checksum failure.
    pub reason: GapReason,
}

/// What became of a snapshot handed to [`Sequencer::snapshotted`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Snapshotted {
    /// Written ([`Step::Snapshot`]), and the held diffs after it.
    Taken,
    /// Too old for the stream: at or below what was written, or the held
    /// diffs start past it (Binance: "if the first event's `U` is above
    /// `lastUpdateId + 1`, get a new snapshot"). Ask again.
    Stale,
    /// No re-synchronisation was waiting for it (a snapshot that outlived a
    /// reposition): dropped.
    Unasked,
}

/// How an arrival was taken (the shell counts replays as skipped frames).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// At or below what was already handed on: dropped.
    Replayed,
    /// Handed on (or, in replay mode, refused with a reconnect).
    Taken,
    /// Kept back until the running backfill is done.
    Held,
    /// Beyond the jump bound: kept back until the next frames confirm the
    /// jump (then it is handed on) or deny it (then it is discarded).
    Suspect,
    /// Below the last position, in a climbing run that may be a restarted
    /// sequence: kept back until the run makes a reset (then it is handed
    /// on) or climbs back past the stream (then it was a replay, dropped).
    Behind,
}

/// How far one frame may move a stream on its own word
/// (`UPSTREAM_MAX_JUMP`, `UPSTREAM_RESET_AFTER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JumpBound {
    /// Largest step ahead of the last position a frame is taken at at once;
    /// 0: unbounded.
    pub max: u64,
    /// Frames in a row beyond the bound, each at most `max` ahead of the one
    /// before, that make a jump real.
    pub confirm_after: u32,
}

impl JumpBound {
    /// No bound: every frame is taken at its word.
    pub const NONE: JumpBound = JumpBound {
        max: 0,
        confirm_after: 1,
    };
}

/// A backfill in progress: the range asked for and how far it got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Filling {
    to: u64,
    /// Something of the range has been handed on (a later hole is then not
    /// the history's retention edge).
    filled_any: bool,
}

/// One frame as the sequencer keeps it while it waits (held behind a
/// backfill, suspected of a jump, or behind the stream).
#[derive(Debug, Clone)]
struct Frame<T> {
    /// The first sequence it covers, when the upstream says
    /// ([`Sequencer::arrive_covering`]).
    first: Option<u64>,
    seq: u64,
    item: T,
    /// It was the first of its connection.
    fresh: bool,
    /// An order book's snapshot sent in the stream
    /// ([`Sequencer::arrive_snapshot`]).
    snapshot: bool,
}

/// The sequence decisions of one held stream, from open to release.
#[derive(Debug, Clone)]
pub struct Sequencer<T> {
    mode: ResumeMode,
    step: SeqStep,
    /// Position of the last event or marker handed on; `None` until the first
    /// (a stream never written: the first event sets the position, since there
    /// is no "before" to record).
    last: Option<u64>,
    /// The next arrival is the first of a new connection.
    fresh_connection: bool,
    filling: Option<Filling>,
    /// Live events that arrived during the backfill, in arrival order, each
    /// with whether it was the first of its connection (a backfill outlives a
    /// reconnect: a new connection's jump is judged when its event is taken).
    held: VecDeque<Frame<T>>,
    /// What the held events weigh together ([`Sequencer::with_weigher`]).
    held_weight: usize,
    /// The weight of one held event (bytes, for the runner); 0 by default.
    weigh: fn(&T) -> usize,
    jump: JumpBound,
    /// Frames beyond the jump bound waiting for confirmation, in arrival
    /// order, each with whether it was the first of its connection.
    suspects: Vec<Frame<T>>,
    /// Frames below the last position in a row, each above the one before:
    /// a restarted upstream, once there are `reset_after` of them.
    behind: Vec<Frame<T>>,
    /// Frames behind in a row that make a reset (`UPSTREAM_RESET_AFTER`);
    /// 0: a sequence never resets (every frame behind is a replay).
    reset_after: u32,
    /// Snapshot mode: a snapshot was asked for, for this reason; diffs are
    /// held until it comes.
    syncing: Option<SnapshotReason>,
    /// Snapshot mode: the ids the last book covered that were never written
    /// as diffs, `(above, upto]`: the stream's position before the book, and
    /// the book's. A REST book can be read ahead of diffs still on their way
    /// (on this connection or a new one); those arrive below the stream, each
    /// above the one before, and are what the book already contains
    /// (Binance: "discard any event where u <= lastUpdateId"), not a
    /// restarted sequence (found by `tests/it/snapshot_model.rs`). Until a diff
    /// past the book is taken.
    covered: Option<(u64, u64)>,
    /// The next frame is the first of a subscription made before the stream
    /// reached its position ([`Sequencer::continue_prepared`]).
    prepared: bool,
}

impl<T> Sequencer<T> {
    /// A stream whose sink or checkpoint ends at `last` (`None`: never written).
    pub fn new(mode: ResumeMode, step: SeqStep, last: Option<u64>) -> Self {
        Sequencer {
            mode,
            step,
            last,
            fresh_connection: true,
            filling: None,
            held: VecDeque::new(),
            held_weight: 0,
            weigh: |_| 0,
            jump: JumpBound::NONE,
            suspects: Vec::new(),
            behind: Vec::new(),
            covered: None,
            prepared: false,
            reset_after: 0,
            syncing: None,
        }
    }

    /// The next connection is a subscription made before the stream reached
    /// its position: an overlapping hand-off's successor subscribed while
    /// its predecessor still wrote. Its frames from its first up to the
    /// position are what the predecessor wrote, arriving below the stream
    /// and each above the one before, exactly like a restarted sequence:
    /// they are replays, dropped until a frame past the position (found by
    /// a rolling deploy in scan discovery, where a successor's subscription
    /// can start a thousand frames back). A restart inside them still shows:
    /// its sequence falls below the subscription's first frame.
    pub fn continue_prepared(&mut self) {
        self.prepared = true;
    }

    /// This sequencer, taking `frames` frames in a row below the last
    /// position, each above the one before, for a restarted upstream
    /// ([`Step::Reset`]); 0 never does.
    ///
    /// Why not the first frame behind, even on a fresh connection: a feed
    /// that resends its last few frames on subscribe (or a replay that starts
    /// a little early) looks the same for a frame or two, and a false reset
    /// would write those sequences a second time in a new epoch. A restart
    /// keeps going from its low ids and is confirmed a few frames later.
    pub fn with_reset_after(mut self, frames: u32) -> Self {
        self.reset_after = frames;
        self
    }

    /// Frames below the last position waiting to confirm a reset.
    pub fn behind(&self) -> usize {
        self.behind.len()
    }

    /// This sequencer, adding up `weigh` over the held events
    /// ([`Sequencer::held_weight`]): a bound on held bytes needs it, since
    /// frames differ in size by orders of magnitude (a trade against a book
    /// snapshot).
    pub fn with_weigher(mut self, weigh: fn(&T) -> usize) -> Self {
        self.weigh = weigh;
        self
    }

    /// What the held events weigh together.
    pub fn held_weight(&self) -> usize {
        self.held_weight
    }

    fn hold(&mut self, frame: Frame<T>, at_front: bool) {
        self.held_weight += (self.weigh)(&frame.item);
        if at_front {
            self.held.push_front(frame);
        } else {
            self.held.push_back(frame);
        }
    }

    fn release_front(&mut self) -> Option<Frame<T>> {
        let released = self.held.pop_front()?;
        self.held_weight -= (self.weigh)(&released.item);
        Some(released)
    }

    /// This sequencer, taking no frame more than `jump.max` ahead at its word.
    pub fn with_jump_bound(mut self, jump: JumpBound) -> Self {
        self.jump = jump;
        self
    }

    /// Position of the last event or marker handed on.
    pub fn last(&self) -> Option<u64> {
        self.last
    }

    /// Where a (re)connect asks the upstream to start: after what was handed
    /// on (a `replay` upstream honours it; live upstreams ignore it). 0 when
    /// nothing was: from wherever the upstream is.
    pub fn resume_from(&self) -> u64 {
        self.last.map_or(0, |last| last + 1)
    }

    /// A backfill is running (live events are held).
    pub fn backfilling(&self) -> bool {
        self.filling.is_some()
    }

    /// A snapshot was asked for and has not been taken yet.
    pub fn syncing(&self) -> bool {
        self.syncing.is_some()
    }

    /// Live events held for the running backfill or snapshot.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// A new upstream connection starts: in `increasing` `backfill` mode its
    /// first event's distance from the last one is the only hole there can be.
    pub fn connected(&mut self) {
        self.fresh_connection = true;
    }

    /// The position is `last` from now on, whatever was handed on or held:
    /// a `replay` reconnect asks again after what the sink confirmed, and an
    /// upstream whose retention moved past a range continues after it.
    pub fn reposition(&mut self, last: Option<u64>) {
        self.last = last;
        self.filling = None;
        self.held.clear();
        self.held_weight = 0;
        self.suspects.clear();
        self.behind.clear();
        self.syncing = None;
        self.fresh_connection = true;
        self.covered = None;
    }

    /// One live event arrived.
    ///
    /// A frame more than the jump bound ahead of the last position (or the
    /// last held event) is not taken at its word: one bogus frame (a status
    /// frame whose timestamp sits at the sequence pointer) would otherwise
    /// move the stream so far ahead that every real event after it is a
    /// replay. It waits; when the next frame is back near the stream, it is
    /// discarded ([`Step::JumpDiscarded`]). A real jump (an exchange that
    /// skipped ahead) is recognised by the frames that follow it:
    /// `confirm_after` frames in a row beyond the bound, each within the
    /// bound of the one before, are handed on in order, as any hole is.
    pub fn arrive(&mut self, seq: u64, item: T, out: &mut Vec<Step<T>>) -> Arrival {
        self.arrive_covering(None, seq, item, out)
    }

    /// One live event that covers `first..=seq` (an order book's diff: the
    /// update ids it folds together, `UPSTREAM_SEQ_FIRST_POINTER`; or the
    /// previous frame's last + 1 from `UPSTREAM_SEQ_PREV_POINTER`). It
    /// continues the stream when it covers the next sequence
    /// (`first <= last + 1`, however far past it reaches); `first > last + 1`
    /// is a hole `last + 1..=first - 1`, whatever `UPSTREAM_SEQ_STEP` says
    /// (the ids inside a range are not contiguous, the ranges are). `None`
    /// is a frame that states only its own sequence ([`Sequencer::arrive`]).
    pub fn arrive_covering(
        &mut self,
        first: Option<u64>,
        seq: u64,
        item: T,
        out: &mut Vec<Step<T>>,
    ) -> Arrival {
        let fresh = std::mem::replace(&mut self.fresh_connection, false);
        let frame = Frame {
            first: first.map(|first| first.min(seq)),
            seq,
            item,
            fresh,
            snapshot: false,
        };
        if std::mem::take(&mut self.prepared)
            && let Some(last) = self.last
            && seq <= last
        {
            let first = first.unwrap_or(seq).min(seq);
            self.covered = Some((first.saturating_sub(1), last));
        }
        if let Some((above, upto)) = self.covered {
            if seq > upto {
                self.covered = None;
            } else if seq > above {
                return Arrival::Replayed;
            }
        }
        if self.reset_after > 0
            && let Some(last) = self.last
        {
            if seq < last {
                return self.fall_behind(last, frame, out);
            }
            // Back at or past the stream: what fell behind was a replay.
            self.drop_behind(out);
        }
        if self.jump.max == 0 {
            return self.arrive_at_its_word(frame, out);
        }
        let reference = match (self.held.back(), self.last) {
            (Some(held), _) => Some(held.seq),
            (None, last) => last,
        };
        let Some(reference) = reference else {
            return self.arrive_at_its_word(frame, out);
        };
        if seq <= reference.saturating_add(self.jump.max) {
            let fresh = self.discard_suspects(out) || frame.fresh;
            return self.arrive_at_its_word(Frame { fresh, ..frame }, out);
        }
        let follows = self
            .suspects
            .last()
            .is_none_or(|previous| seq > previous.seq && seq - previous.seq <= self.jump.max);
        let fresh = if follows {
            frame.fresh
        } else {
            self.discard_suspects(out) || frame.fresh
        };
        self.suspects.push(Frame { fresh, ..frame });
        if self.suspects.len() < self.jump.confirm_after.max(1) as usize {
            return Arrival::Suspect;
        }
        let mut arrival = Arrival::Taken;
        for frame in std::mem::take(&mut self.suspects) {
            arrival = self.arrive_at_its_word(frame, out);
        }
        arrival
    }

    /// Discards the waiting suspects; returns whether one was the first of
    /// its connection. That passes on to the next frame: a discarded first
    /// frame must not hide a new connection's jump (found by the model).
    fn discard_suspects(&mut self, out: &mut Vec<Step<T>>) -> bool {
        let mut fresh = false;
        for discarded in self.suspects.drain(..) {
            out.push(Step::JumpDiscarded { seq: discarded.seq });
            fresh |= discarded.fresh;
        }
        fresh
    }

    /// A frame below the last position: a replay, unless it is the
    /// `reset_after`-th in a row of a sequence that started over.
    fn fall_behind(&mut self, last: u64, frame: Frame<T>, out: &mut Vec<Step<T>>) -> Arrival {
        if self
            .behind
            .last()
            .is_some_and(|previous| frame.seq <= previous.seq)
        {
            // Not one climbing sequence: start counting again from here.
            self.drop_behind(out);
        }
        let seq = frame.seq;
        self.behind.push(frame);
        if self.behind.len() < self.reset_after as usize {
            return Arrival::Behind;
        }
        self.settle_before_reset(out);
        let behind = std::mem::take(&mut self.behind);
        let brings_a_snapshot = behind.iter().any(|frame| frame.snapshot);
        if self.mode == ResumeMode::Snapshot {
            // The new epoch's book starts from a snapshot too: the frames
            // that made the reset wait for it (after the reset entry).
            self.syncing = None;
            self.held.clear();
            self.held_weight = 0;
        }
        let to = behind
            .first()
            .map_or(seq, |first| first.first.unwrap_or(first.seq));
        let from = self.last.unwrap_or(last);
        out.push(Step::Reset { from, to });
        // The new epoch starts just before its first sequence: the reset
        // entry's position, so the next one is taken as contiguous.
        self.last = Some(to.saturating_sub(1));
        self.fresh_connection = false;
        if self.mode == ResumeMode::Snapshot {
            if brings_a_snapshot {
                // The restarted stream sent its book (Bybit: a snapshot
                // with `u=1`): nothing to ask for.
                self.syncing = Some(SnapshotReason::Reset);
            } else {
                self.start_sync(SnapshotReason::Reset, out);
            }
        }
        for frame in behind {
            if frame.snapshot {
                self.take_snapshot(frame.seq, frame.item, out);
                continue;
            }
            self.arrive_at_its_word(
                Frame {
                    fresh: false,
                    ..frame
                },
                out,
            );
        }
        Arrival::Taken
    }

    fn drop_behind(&mut self, out: &mut Vec<Step<T>>) {
        if !self.behind.is_empty() {
            out.push(Step::BehindDropped {
                frames: self.behind.len(),
            });
            self.behind.clear();
        }
    }

    /// Before a reset, the old epoch ends: a running backfill gives up the
    /// rest of its range, the events it held are handed on in order (a hole
    /// among them marked: the history restarted too), and frames waiting to
    /// confirm a jump are discarded.
    fn settle_before_reset(&mut self, out: &mut Vec<Step<T>>) {
        self.discard_suspects(out);
        let Some(filling) = self.filling.take() else {
            return;
        };
        if self.resume_from() <= filling.to {
            self.close_range(filling.to, GapReason::BackfillExhausted, out);
        }
        while let Some(frame) = self.release_front() {
            let next = self.resume_from();
            if frame.seq < next {
                continue;
            }
            if let Some(hole_to) = self.hole_before(&frame, next) {
                self.close_range(hole_to, GapReason::BackfillExhausted, out);
            }
            self.last = Some(frame.seq);
            out.push(Step::Event(frame.seq, frame.item));
        }
    }

    /// The last sequence of the hole before `frame` when the stream's next
    /// sequence is `next`, if there is one it must mark: a range frame's
    /// own word, else the step's rule (only contiguous sequences have holes
    /// between frames).
    fn hole_before(&self, frame: &Frame<T>, next: u64) -> Option<u64> {
        match frame.first {
            Some(first) => (first > next).then(|| first - 1),
            None => (frame.seq > next && self.step == SeqStep::Contiguous).then(|| frame.seq - 1),
        }
    }

    /// Frames beyond the jump bound waiting for confirmation.
    pub fn suspects(&self) -> usize {
        self.suspects.len()
    }

    fn arrive_at_its_word(&mut self, frame: Frame<T>, out: &mut Vec<Step<T>>) -> Arrival {
        if self.filling.is_some() || self.syncing.is_some() {
            if self.held.back().is_some_and(|held| frame.seq <= held.seq)
                || self.last.is_some_and(|last| frame.seq <= last)
            {
                return Arrival::Replayed;
            }
            self.hold(frame, false);
            return Arrival::Held;
        }
        self.take(frame, out)
    }

    fn take(&mut self, frame: Frame<T>, out: &mut Vec<Step<T>>) -> Arrival {
        let Some(last) = self.last else {
            if self.mode == ResumeMode::Snapshot {
                // A diff with no book before it: the book starts at a snapshot.
                self.start_sync(SnapshotReason::Subscribe, out);
                self.hold(frame, true);
                return Arrival::Held;
            }
            self.last = Some(frame.seq);
            out.push(Step::Event(frame.seq, frame.item));
            return Arrival::Taken;
        };
        let seq = frame.seq;
        if seq <= last {
            return Arrival::Replayed;
        }
        let hole_to = match frame.first {
            Some(first) => (first > last + 1).then(|| first - 1),
            None => (seq > last + 1
                && match self.step {
                    SeqStep::Contiguous => true,
                    // Holes are normal; only a new connection's jump can hide
                    // missed events, and only a history can tell.
                    SeqStep::Increasing => {
                        frame.fresh
                            && matches!(self.mode, ResumeMode::Backfill | ResumeMode::Snapshot)
                    }
                })
            .then(|| seq - 1),
        };
        let Some(to) = hole_to else {
            self.last = Some(seq);
            out.push(Step::Event(seq, frame.item));
            return Arrival::Taken;
        };
        let from = last + 1;
        match self.mode {
            ResumeMode::Replay => {
                out.push(Step::Reconnect {
                    expected: from,
                    got: to + 1,
                });
            }
            ResumeMode::Live => {
                out.push(Step::Gap {
                    from,
                    to,
                    reason: GapReason::NoReplay,
                });
                self.last = Some(seq);
                out.push(Step::Event(seq, frame.item));
            }
            ResumeMode::Backfill => {
                self.filling = Some(Filling {
                    to,
                    filled_any: false,
                });
                // Its own jump is the range being filled. At the front: when
                // a held event starts this backfill, later ones are still held.
                self.hold(
                    Frame {
                        fresh: false,
                        ..frame
                    },
                    true,
                );
                out.push(Step::Backfill { from, to });
                return Arrival::Held;
            }
            ResumeMode::Snapshot => {
                // A new connection's first diff past the book is the
                // subscribe's resync (as an in-band book after a subscribe
                // is); inside a connection it is a lost diff.
                let reason = if frame.fresh {
                    SnapshotReason::Subscribe
                } else {
                    SnapshotReason::Gap
                };
                self.start_sync(reason, out);
                self.hold(frame, true);
                return Arrival::Held;
            }
        }
        Arrival::Taken
    }

    fn start_sync(&mut self, reason: SnapshotReason, out: &mut Vec<Step<T>>) {
        if self.syncing.is_none() {
            self.syncing = Some(reason);
            out.push(Step::Resync { reason });
        }
    }

    /// Snapshot mode: the book the worker keeps failed its checksum (or is
    /// otherwise known wrong) after what was handed on: the diffs from here
    /// are held until a snapshot ([`Step::Resync`]). Nothing when one is
    /// already asked for.
    pub fn resync(&mut self, reason: SnapshotReason, out: &mut Vec<Step<T>>) {
        if self.mode == ResumeMode::Snapshot {
            self.start_sync(reason, out);
        }
    }

    /// An order book's snapshot that came in the stream
    /// (`UPSTREAM_SNAPSHOT_MATCH`: Bybit, OKX, Coinbase send one after every
    /// subscribe). Whether asked for or not it re-synchronises the book: a
    /// new connection's first book (reason `subscribe`; diffs missed since
    /// the last written one are named in its entry), or one the upstream
    /// sent unasked (`gap`: the upstream says the reader's book is void). One
    /// at or below what was written is the book as already written: a
    /// replay. Below the last position it may start a restarted sequence
    /// (a snapshot with `u=1`): judged with the frames after it, as any.
    pub fn arrive_snapshot(&mut self, seq: u64, item: T, out: &mut Vec<Step<T>>) -> Arrival {
        let fresh = std::mem::replace(&mut self.fresh_connection, false);
        let frame = Frame {
            first: None,
            seq,
            item,
            fresh,
            snapshot: true,
        };
        if self.reset_after > 0
            && let Some(last) = self.last
        {
            if seq < last {
                return self.fall_behind(last, frame, out);
            }
            self.drop_behind(out);
        }
        // The book itself: whatever claimed to be ahead of it was not.
        self.discard_suspects(out);
        if self.syncing.is_none() {
            if self.last.is_some_and(|last| seq <= last) {
                return Arrival::Replayed;
            }
            self.syncing = Some(if fresh || self.last.is_none() {
                SnapshotReason::Subscribe
            } else {
                SnapshotReason::Gap
            });
        }
        self.take_snapshot(seq, frame.item, out)
    }

    /// [`Sequencer::snapshotted`] for a snapshot from the stream: one that
    /// cannot be taken is asked for again ([`Step::Resync`]).
    fn take_snapshot(&mut self, seq: u64, item: T, out: &mut Vec<Step<T>>) -> Arrival {
        let reason = self.syncing;
        match self.snapshotted(seq, item, out) {
            Snapshotted::Taken => Arrival::Taken,
            Snapshotted::Stale | Snapshotted::Unasked => {
                if let Some(reason) = reason {
                    out.push(Step::Resync { reason });
                }
                Arrival::Replayed
            }
        }
    }

    /// The snapshot asked for by [`Step::Resync`]: the book after every
    /// update up to `seq`. Held diffs it already contains are dropped; the
    /// first one after it must continue it (cover `seq + 1`), or it is
    /// [`Snapshotted::Stale`] and another must be fetched. Taken, it is
    /// handed on as [`Step::Snapshot`], then the held diffs (a hole among
    /// them asks for the next snapshot).
    pub fn snapshotted(&mut self, seq: u64, item: T, out: &mut Vec<Step<T>>) -> Snapshotted {
        let Some(reason) = self.syncing else {
            return Snapshotted::Unasked;
        };
        if self.last.is_some_and(|last| seq <= last) {
            // Its entry would sit at or below what was written.
            return Snapshotted::Stale;
        }
        while self.held.front().is_some_and(|held| held.seq <= seq) {
            self.release_front();
        }
        if let Some(front) = self.held.front()
            && self.hole_before(front, seq + 1).is_some()
        {
            return Snapshotted::Stale;
        }
        let missed = match (reason, self.last) {
            // Nothing before it to continue, or a reset entry said so.
            (SnapshotReason::Reset, _) | (_, None) => None,
            (SnapshotReason::Checksum, Some(last)) => Some(Missed {
                from: last + 1,
                to: seq,
                reason: GapReason::Checksum,
            }),
            // A hole, or a new connection's book past the written one.
            (SnapshotReason::Gap | SnapshotReason::Subscribe, Some(last)) => Some(Missed {
                from: last + 1,
                to: seq,
                reason: GapReason::NoReplay,
            }),
        };
        self.syncing = None;
        self.covered = Some((self.last.unwrap_or(0), seq));
        self.last = Some(seq);
        out.push(Step::Snapshot {
            seq,
            item,
            reason,
            missed,
        });
        while let Some(frame) = self.release_front() {
            if self.take(frame, out) == Arrival::Held {
                break;
            }
        }
        Snapshotted::Taken
    }

    /// The sequence the running backfill needs next and the last one it
    /// wants, or `None` when none runs.
    pub fn backfill_range(&self) -> Option<(u64, u64)> {
        let filling = self.filling?;
        Some((self.resume_from(), filling.to))
    }

    /// One page of history, in the order the history gave it (sorted here by
    /// sequence). Items outside the range are dropped; in a contiguous
    /// sequence a hole before an item is a gap marker (`retention` while the
    /// range has nothing yet: the history no longer starts there). Returns
    /// whether the page brought the backfill forward (a contiguous range must
    /// hold events, so a page that did not is the history having nothing
    /// more: the shell retries a few times, then calls
    /// [`Sequencer::backfill_gave_up`]). With increasing sequences a range may
    /// hold nothing at all: a page with nothing new closes it, unmarked. When
    /// the range is closed the held events follow, which may start the next
    /// backfill.
    pub fn backfilled(&mut self, mut page: Vec<(u64, T)>, out: &mut Vec<Step<T>>) -> bool {
        let Some(mut filling) = self.filling else {
            return false;
        };
        page.sort_by_key(|(seq, _)| *seq);
        let start = self.resume_from();
        let mut moved = false;
        let mut beyond = false;
        for (seq, item) in page {
            let next = self.resume_from();
            if seq < next {
                continue;
            }
            if seq > filling.to {
                beyond = true;
                break;
            }
            if seq > next && self.step == SeqStep::Contiguous {
                out.push(Step::Gap {
                    from: next,
                    to: seq - 1,
                    reason: if filling.filled_any {
                        GapReason::BackfillExhausted
                    } else {
                        GapReason::Retention
                    },
                });
            }
            self.last = Some(seq);
            filling.filled_any = true;
            out.push(Step::Event(seq, item));
            moved = true;
        }
        if self.step == SeqStep::Increasing && (beyond || !moved) {
            // Past the range, or nothing more in it: whatever it held has been
            // read (an increasing range may hold nothing).
            self.filling = None;
            self.finish_backfill(out);
            return true;
        }
        if beyond && self.resume_from() <= filling.to {
            // The history went past the rest of the range without it.
            let reason = if filling.filled_any {
                GapReason::BackfillExhausted
            } else {
                GapReason::Retention
            };
            self.close_range(filling.to, reason, out);
            moved = true;
        }
        self.filling = Some(filling);
        if self.resume_from() > filling.to {
            self.finish_backfill(out);
        }
        moved || self.resume_from() > start
    }

    /// The history cannot close the range (errors past the retry budget, or
    /// nothing more to give): the rest is a gap marker, then the held events.
    pub fn backfill_gave_up(&mut self, out: &mut Vec<Step<T>>) {
        let Some(filling) = self.filling else {
            return;
        };
        if self.resume_from() <= filling.to {
            self.close_range(filling.to, GapReason::BackfillExhausted, out);
        }
        self.finish_backfill(out);
    }

    fn close_range(&mut self, to: u64, reason: GapReason, out: &mut Vec<Step<T>>) {
        let from = self.resume_from();
        out.push(Step::Gap { from, to, reason });
        self.last = Some(to);
    }

    fn finish_backfill(&mut self, out: &mut Vec<Step<T>>) {
        self.filling = None;
        while let Some(frame) = self.release_front() {
            if self.take(frame, out) == Arrival::Held {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(seq: &mut Sequencer<u64>, arrivals: &[u64]) -> Vec<Step<u64>> {
        let mut out = Vec::new();
        for &n in arrivals {
            seq.arrive(n, n, &mut out);
        }
        out
    }

    fn gap(from: u64, to: u64, reason: GapReason) -> Step<u64> {
        Step::Gap { from, to, reason }
    }

    #[test]
    fn a_never_written_stream_starts_wherever_the_upstream_is() {
        // (A book starts at a snapshot instead: tested below.)
        for mode in [ResumeMode::Replay, ResumeMode::Backfill, ResumeMode::Live] {
            let mut s = Sequencer::new(mode, SeqStep::Contiguous, None);
            assert_eq!(s.resume_from(), 0);
            assert_eq!(
                run(&mut s, &[5_000, 5_001]),
                vec![Step::Event(5_000, 5_000), Step::Event(5_001, 5_001)]
            );
        }
    }

    const BOUND: JumpBound = JumpBound {
        max: 1_000,
        confirm_after: 3,
    };

    #[test]
    fn one_frame_far_ahead_is_discarded_and_the_stream_goes_on() {
        for mode in ResumeMode::ALL {
            for step in SeqStep::ALL {
                let mut s = Sequencer::new(mode, step, Some(10)).with_jump_bound(BOUND);
                let mut out = Vec::new();
                assert_eq!(
                    s.arrive(1_000_000_000_000_000, 0, &mut out),
                    Arrival::Suspect
                );
                assert!(out.is_empty(), "{mode:?} {step:?}: {out:?}");
                assert_eq!(s.arrive(11, 11, &mut out), Arrival::Taken);
                assert_eq!(
                    out,
                    vec![
                        Step::JumpDiscarded {
                            seq: 1_000_000_000_000_000
                        },
                        Step::Event(11, 11)
                    ],
                    "{mode:?} {step:?}"
                );
                assert_eq!(s.last(), Some(11));
            }
        }
    }

    #[test]
    fn a_real_jump_is_confirmed_by_the_frames_after_it_and_nothing_is_lost() {
        let mut s =
            Sequencer::new(ResumeMode::Live, SeqStep::Contiguous, Some(10)).with_jump_bound(BOUND);
        let out = run(&mut s, &[5_000, 5_001, 5_002, 5_003]);
        assert_eq!(
            out,
            vec![
                gap(11, 4_999, GapReason::NoReplay),
                Step::Event(5_000, 5_000),
                Step::Event(5_001, 5_001),
                Step::Event(5_002, 5_002),
                Step::Event(5_003, 5_003),
            ]
        );
        // Far frames that do not follow each other confirm nothing.
        let mut s =
            Sequencer::new(ResumeMode::Live, SeqStep::Contiguous, Some(10)).with_jump_bound(BOUND);
        let out = run(&mut s, &[5_000, 90_000, 5_001, 11]);
        assert_eq!(
            out,
            vec![
                Step::JumpDiscarded { seq: 5_000 },
                Step::JumpDiscarded { seq: 90_000 },
                Step::JumpDiscarded { seq: 5_001 },
                Step::Event(11, 11),
            ]
        );
        // Unbounded: taken at its word, as before.
        let mut s = Sequencer::new(ResumeMode::Live, SeqStep::Increasing, Some(10));
        assert_eq!(run(&mut s, &[5_000]), vec![Step::Event(5_000, 5_000)]);
    }

    #[test]
    fn replay_mode_reconnects_on_a_hole_and_writes_no_marker() {
        let mut s = Sequencer::new(ResumeMode::Replay, SeqStep::Contiguous, Some(10));
        let out = run(&mut s, &[11, 14]);
        assert_eq!(
            out,
            vec![
                Step::Event(11, 11),
                Step::Reconnect {
                    expected: 12,
                    got: 14
                }
            ]
        );
        assert_eq!(s.resume_from(), 12);
    }

    #[test]
    fn live_mode_marks_each_hole_once_and_goes_on() {
        let mut s = Sequencer::new(ResumeMode::Live, SeqStep::Contiguous, Some(10));
        let out = run(&mut s, &[11, 11, 9, 15, 16, 20]);
        assert_eq!(
            out,
            vec![
                Step::Event(11, 11),
                gap(12, 14, GapReason::NoReplay),
                Step::Event(15, 15),
                Step::Event(16, 16),
                gap(17, 19, GapReason::NoReplay),
                Step::Event(20, 20),
            ]
        );
    }

    #[test]
    fn increasing_sequences_have_no_holes() {
        for mode in [ResumeMode::Live, ResumeMode::Replay] {
            let mut s = Sequencer::new(mode, SeqStep::Increasing, Some(10));
            let out = run(&mut s, &[13, 13, 40, 41]);
            assert_eq!(
                out,
                vec![
                    Step::Event(13, 13),
                    Step::Event(40, 40),
                    Step::Event(41, 41)
                ]
            );
        }
    }

    #[test]
    fn backfill_holds_live_events_and_writes_them_after_the_history() {
        let mut s = Sequencer::new(ResumeMode::Backfill, SeqStep::Contiguous, Some(10));
        let mut out = Vec::new();
        assert_eq!(s.arrive(14, 14, &mut out), Arrival::Held);
        assert_eq!(out, vec![Step::Backfill { from: 11, to: 13 }]);
        out.clear();
        assert_eq!(s.arrive(15, 15, &mut out), Arrival::Held);
        assert_eq!(s.arrive(15, 15, &mut out), Arrival::Replayed);
        assert_eq!(s.held(), 2);
        assert_eq!(s.backfill_range(), Some((11, 13)));
        assert!(s.backfilled(vec![(12, 12), (11, 11), (10, 10)], &mut out));
        assert_eq!(s.backfill_range(), Some((13, 13)));
        assert!(s.backfilled(vec![(13, 13), (14, 14), (15, 15)], &mut out));
        assert_eq!(
            out,
            vec![
                Step::Event(11, 11),
                Step::Event(12, 12),
                Step::Event(13, 13),
                Step::Event(14, 14),
                Step::Event(15, 15),
            ]
        );
        assert!(!s.backfilling());
    }

    #[test]
    fn a_history_that_no_longer_has_the_start_marks_it_as_retention() {
        let mut s = Sequencer::new(ResumeMode::Backfill, SeqStep::Contiguous, Some(10));
        let mut out = Vec::new();
        s.arrive(20, 20, &mut out);
        out.clear();
        s.backfilled(vec![(15, 15), (16, 16)], &mut out);
        s.backfilled(vec![(18, 18)], &mut out);
        s.backfill_gave_up(&mut out);
        assert_eq!(
            out,
            vec![
                gap(11, 14, GapReason::Retention),
                Step::Event(15, 15),
                Step::Event(16, 16),
                gap(17, 17, GapReason::BackfillExhausted),
                Step::Event(18, 18),
                gap(19, 19, GapReason::BackfillExhausted),
                Step::Event(20, 20),
            ]
        );
    }

    /// Held events are weighed as they are held and released, so a byte
    /// bound can pause reading (`STREAM_HOLD_MAX_BYTES`).
    #[test]
    fn the_held_events_weight_follows_what_is_held() {
        let mut s = Sequencer::new(ResumeMode::Backfill, SeqStep::Contiguous, Some(10))
            .with_weigher(|item: &u64| *item as usize);
        let mut out = Vec::new();
        s.arrive(20, 20, &mut out);
        s.arrive(21, 21, &mut out);
        assert_eq!((s.held(), s.held_weight()), (2, 41));
        out.clear();
        // The history closes 11..=19: both held events are handed on.
        let page = (11..=19).map(|seq| (seq, seq)).collect();
        assert!(s.backfilled(page, &mut out));
        assert_eq!((s.held(), s.held_weight()), (0, 0));
        s.arrive(30, 30, &mut out);
        assert_eq!(
            s.held_weight(),
            30,
            "a new hole holds its first event again"
        );
        s.reposition(Some(30));
        assert_eq!(s.held_weight(), 0);
    }

    #[test]
    fn a_history_past_the_whole_range_marks_all_of_it() {
        let mut s = Sequencer::new(ResumeMode::Backfill, SeqStep::Contiguous, Some(10));
        let mut out = Vec::new();
        s.arrive(20, 20, &mut out);
        out.clear();
        assert!(s.backfilled(vec![(30, 30)], &mut out));
        assert_eq!(
            out,
            vec![gap(11, 19, GapReason::Retention), Step::Event(20, 20)]
        );
    }

    #[test]
    fn an_empty_page_is_no_progress_and_giving_up_marks_the_rest() {
        let mut s = Sequencer::new(ResumeMode::Backfill, SeqStep::Contiguous, Some(10));
        let mut out = Vec::new();
        s.arrive(13, 13, &mut out);
        out.clear();
        assert!(!s.backfilled(Vec::new(), &mut out));
        s.backfill_gave_up(&mut out);
        assert_eq!(
            out,
            vec![
                gap(11, 12, GapReason::BackfillExhausted),
                Step::Event(13, 13)
            ]
        );
    }

    #[test]
    fn a_hole_among_the_held_events_starts_the_next_backfill() {
        let mut s = Sequencer::new(ResumeMode::Backfill, SeqStep::Contiguous, Some(10));
        let mut out = Vec::new();
        for n in [12, 13, 16, 17] {
            s.arrive(n, n, &mut out);
        }
        out.clear();
        s.backfilled(vec![(11, 11)], &mut out);
        assert_eq!(
            out,
            vec![
                Step::Event(11, 11),
                Step::Event(12, 12),
                Step::Event(13, 13),
                Step::Backfill { from: 14, to: 15 },
            ]
        );
        assert_eq!(s.held(), 2);
        out.clear();
        s.backfilled(vec![(14, 14), (15, 15)], &mut out);
        assert_eq!(
            out,
            vec![
                Step::Event(14, 14),
                Step::Event(15, 15),
                Step::Event(16, 16),
                Step::Event(17, 17),
            ],
            "the held events keep their order"
        );
    }

    #[test]
    fn increasing_backfill_fills_only_a_new_connections_jump_and_marks_nothing() {
        let mut s = Sequencer::new(ResumeMode::Backfill, SeqStep::Increasing, Some(10));
        let mut out = Vec::new();
        s.connected();
        s.arrive(50, 50, &mut out);
        assert_eq!(out, vec![Step::Backfill { from: 11, to: 49 }]);
        out.clear();
        s.backfilled(vec![(20, 20), (35, 35)], &mut out);
        assert!(s.backfilling(), "the range is not known to be closed");
        s.backfilled(vec![(60, 60)], &mut out);
        assert_eq!(
            out,
            vec![
                Step::Event(20, 20),
                Step::Event(35, 35),
                Step::Event(50, 50)
            ]
        );
        // Inside a connection, a jump is just the next sequence.
        out.clear();
        s.arrive(90, 90, &mut out);
        assert_eq!(out, vec![Step::Event(90, 90)]);
    }

    #[test]
    fn a_reconnect_during_a_backfill_has_its_own_jump_filled() {
        // Found by the sequence model: the second connection's first event
        // was held with its jump forgotten.
        let mut s = Sequencer::new(ResumeMode::Backfill, SeqStep::Increasing, Some(10));
        let mut out = Vec::new();
        s.connected();
        s.arrive(50, 50, &mut out);
        s.connected();
        assert_eq!(s.arrive(60, 60, &mut out), Arrival::Held);
        out.clear();
        s.backfilled(vec![(20, 20), (50, 50)], &mut out);
        assert_eq!(
            out,
            vec![
                Step::Event(20, 20),
                Step::Event(50, 50),
                Step::Backfill { from: 51, to: 59 }
            ]
        );
    }

    #[test]
    fn an_increasing_range_the_history_has_nothing_for_closes_unmarked() {
        // Found by the sequence model: an empty answer was taken for a
        // failing history and marked `backfill_exhausted`.
        let mut s = Sequencer::new(ResumeMode::Backfill, SeqStep::Increasing, Some(10));
        let mut out = Vec::new();
        s.connected();
        s.arrive(50, 50, &mut out);
        out.clear();
        assert!(s.backfilled(vec![(20, 20)], &mut out));
        assert!(s.backfilled(Vec::new(), &mut out), "closes the range");
        assert_eq!(out, vec![Step::Event(20, 20), Step::Event(50, 50)]);
        assert!(!s.backfilling());
    }

    #[test]
    fn a_sequence_that_starts_over_is_a_reset_after_the_frames_confirm_it() {
        // (A book's new epoch starts at a snapshot: tested below.)
        for mode in [ResumeMode::Replay, ResumeMode::Backfill, ResumeMode::Live] {
            for step in SeqStep::ALL {
                let mut s = Sequencer::new(mode, step, Some(60_108)).with_reset_after(3);
                let mut out = Vec::new();
                assert_eq!(s.arrive(1, 1, &mut out), Arrival::Behind);
                assert_eq!(s.arrive(2, 2, &mut out), Arrival::Behind);
                assert!(out.is_empty(), "{mode:?} {step:?}: {out:?}");
                assert_eq!(s.arrive(3, 3, &mut out), Arrival::Taken);
                assert_eq!(
                    out,
                    vec![
                        Step::Reset {
                            from: 60_108,
                            to: 1
                        },
                        Step::Event(1, 1),
                        Step::Event(2, 2),
                        Step::Event(3, 3),
                    ],
                    "{mode:?} {step:?}"
                );
                assert_eq!(s.last(), Some(3));
                assert_eq!(run(&mut s, &[4]), vec![Step::Event(4, 4)]);
            }
        }
    }

    #[test]
    fn frames_behind_that_climb_back_past_the_stream_are_replays() {
        let mut s =
            Sequencer::new(ResumeMode::Live, SeqStep::Contiguous, Some(100)).with_reset_after(3);
        // A feed that resends its last frames on subscribe, then goes on.
        assert_eq!(
            run(&mut s, &[98, 99, 100, 101]),
            vec![Step::BehindDropped { frames: 2 }, Step::Event(101, 101)]
        );
        assert_eq!(s.behind(), 0);
        // Behind but not one climbing sequence: the count starts again.
        assert_eq!(
            run(&mut s, &[5, 6, 3, 4]),
            vec![Step::BehindDropped { frames: 2 }]
        );
        assert_eq!(s.behind(), 2);
        assert_eq!(
            run(&mut s, &[102]),
            vec![Step::BehindDropped { frames: 2 }, Step::Event(102, 102)]
        );
        assert_eq!(s.behind(), 0);
    }

    /// An overlapping hand-off's successor subscribed while its predecessor
    /// wrote on: its subscription starts below the stream and climbs, like
    /// a restart. Continued as prepared, those frames are replays; a
    /// restart inside them still is a reset.
    #[test]
    fn a_prepared_subscriptions_frames_up_to_the_stream_are_replays_not_a_reset() {
        let climbing: Vec<u64> = (95..=103).collect();
        let mut s =
            Sequencer::new(ResumeMode::Live, SeqStep::Contiguous, Some(100)).with_reset_after(3);
        assert!(
            run(&mut s, &climbing).contains(&Step::Reset { from: 100, to: 95 }),
            "without the word it is taken for a restart"
        );

        let mut s =
            Sequencer::new(ResumeMode::Live, SeqStep::Contiguous, Some(100)).with_reset_after(3);
        s.continue_prepared();
        assert_eq!(
            run(&mut s, &climbing),
            vec![
                Step::Event(101, 101),
                Step::Event(102, 102),
                Step::Event(103, 103)
            ]
        );

        let mut s =
            Sequencer::new(ResumeMode::Live, SeqStep::Contiguous, Some(100)).with_reset_after(3);
        s.continue_prepared();
        let steps = run(&mut s, &[97, 98, 1, 2, 3]);
        assert_eq!(
            steps.first(),
            Some(&Step::Reset { from: 100, to: 1 }),
            "a restart below the subscription's first frame: {steps:?}"
        );
    }

    #[test]
    fn without_reset_after_frames_behind_are_always_replays() {
        let mut s = Sequencer::new(ResumeMode::Live, SeqStep::Contiguous, Some(100));
        assert_eq!(run(&mut s, &[1, 2, 3, 4, 5]), vec![]);
        assert_eq!(s.last(), Some(100));
    }

    #[test]
    fn a_reset_during_a_backfill_ends_the_old_epoch_first() {
        let mut s =
            Sequencer::new(ResumeMode::Backfill, SeqStep::Contiguous, Some(10)).with_reset_after(2);
        assert_eq!(
            run(&mut s, &[15, 16, 18]),
            vec![Step::Backfill { from: 11, to: 14 }]
        );
        assert_eq!(
            run(&mut s, &[1, 2]),
            vec![
                gap(11, 14, GapReason::BackfillExhausted),
                Step::Event(15, 15),
                Step::Event(16, 16),
                gap(17, 17, GapReason::BackfillExhausted),
                Step::Event(18, 18),
                Step::Reset { from: 18, to: 1 },
                Step::Event(1, 1),
                Step::Event(2, 2),
            ]
        );
        assert!(!s.backfilling());
        assert_eq!(s.held(), 0);
    }

    #[test]
    fn a_new_epoch_with_a_hole_after_its_first_frames_is_handled_by_the_mode() {
        let mut s =
            Sequencer::new(ResumeMode::Live, SeqStep::Contiguous, Some(500)).with_reset_after(2);
        assert_eq!(
            run(&mut s, &[3, 5]),
            vec![
                Step::Reset { from: 500, to: 3 },
                Step::Event(3, 3),
                gap(4, 4, GapReason::NoReplay),
                Step::Event(5, 5),
            ]
        );
    }

    /// Diffs as Binance's depth stream sends them: each covers `U..=u`.
    fn diffs(seq: &mut Sequencer<u64>, ranges: &[(u64, u64)]) -> Vec<Step<u64>> {
        let mut out = Vec::new();
        for &(first, last) in ranges {
            seq.arrive_covering(Some(first), last, last, &mut out);
        }
        out
    }

    #[test]
    fn a_diff_continues_the_stream_when_it_covers_the_next_sequence() {
        for step in SeqStep::ALL {
            let mut s = Sequencer::new(ResumeMode::Live, step, Some(100));
            assert_eq!(
                // Straddling the last position (the first diff after a
                // snapshot), then each starting right after the one before.
                diffs(&mut s, &[(95, 104), (105, 131), (132, 132)]),
                vec![
                    Step::Event(104, 104),
                    Step::Event(131, 131),
                    Step::Event(132, 132)
                ],
                "{step:?}"
            );
            // Wholly at or below the stream: a replay.
            let mut out = Vec::new();
            assert_eq!(
                s.arrive_covering(Some(120), 131, 0, &mut out),
                Arrival::Replayed
            );
            assert!(out.is_empty());
        }
    }

    #[test]
    fn a_diff_that_starts_past_the_next_sequence_is_a_hole_whatever_the_step() {
        for step in SeqStep::ALL {
            let mut live = Sequencer::new(ResumeMode::Live, step, Some(100));
            assert_eq!(
                diffs(&mut live, &[(101, 110), (120, 130)]),
                vec![
                    Step::Event(110, 110),
                    gap(111, 119, GapReason::NoReplay),
                    Step::Event(130, 130)
                ],
                "{step:?}"
            );
            let mut replay = Sequencer::new(ResumeMode::Replay, step, Some(100));
            assert_eq!(
                diffs(&mut replay, &[(105, 110)]),
                vec![Step::Reconnect {
                    expected: 101,
                    got: 105
                }]
            );
            let mut backfill = Sequencer::new(ResumeMode::Backfill, step, Some(100));
            let mut out = Vec::new();
            assert_eq!(
                backfill.arrive_covering(Some(105), 110, 110, &mut out),
                Arrival::Held
            );
            assert_eq!(out, vec![Step::Backfill { from: 101, to: 104 }]);
        }
    }

    #[test]
    fn held_diffs_keep_their_ranges_when_a_backfill_ends() {
        let mut s = Sequencer::new(ResumeMode::Backfill, SeqStep::Increasing, Some(100));
        let mut out = diffs(&mut s, &[(105, 110), (111, 115), (121, 125)]);
        assert_eq!(out, vec![Step::Backfill { from: 101, to: 104 }]);
        assert_eq!(s.held(), 3);
        out.clear();
        s.backfill_gave_up(&mut out);
        // The range given up, then the held diffs by their own word: the
        // hole 116..=120 between two of them is a new backfill.
        assert_eq!(
            out,
            vec![
                gap(101, 104, GapReason::BackfillExhausted),
                Step::Event(110, 110),
                Step::Event(115, 115),
                Step::Backfill { from: 116, to: 120 },
            ]
        );
    }

    #[test]
    fn a_restarted_book_resets_to_the_first_sequence_its_diffs_cover() {
        let mut s =
            Sequencer::new(ResumeMode::Live, SeqStep::Increasing, Some(5_000)).with_reset_after(3);
        assert_eq!(
            diffs(&mut s, &[(1, 3), (4, 9), (10, 12)]),
            vec![
                Step::Reset { from: 5_000, to: 1 },
                Step::Event(3, 3),
                Step::Event(9, 9),
                Step::Event(12, 12),
            ]
        );
    }

    fn snapshot(s: &mut Sequencer<u64>, seq: u64, out: &mut Vec<Step<u64>>) -> Snapshotted {
        s.snapshotted(seq, seq, out)
    }

    #[test]
    fn a_book_starts_at_its_snapshot_and_the_diffs_after_it_follow() {
        // Binance spot: diffs U..=u arrive, a snapshot at lastUpdateId = 160
        // is read; diffs up to it are dropped, the first after it straddles.
        let mut s = Sequencer::new(ResumeMode::Snapshot, SeqStep::Increasing, None);
        assert_eq!(
            diffs(&mut s, &[(101, 140), (141, 170), (171, 190)]),
            vec![Step::Resync {
                reason: SnapshotReason::Subscribe
            }]
        );
        assert_eq!(s.held(), 3);
        let mut out = Vec::new();
        assert_eq!(snapshot(&mut s, 160, &mut out), Snapshotted::Taken);
        assert_eq!(
            out,
            vec![
                Step::Snapshot {
                    seq: 160,
                    item: 160,
                    reason: SnapshotReason::Subscribe,
                    missed: None
                },
                Step::Event(170, 170),
                Step::Event(190, 190),
            ]
        );
        assert!(!s.syncing());
        assert_eq!(s.held_weight(), 0);
        // Diffs go straight on after it.
        assert_eq!(diffs(&mut s, &[(191, 200)]), vec![Step::Event(200, 200)]);
    }

    #[test]
    fn a_snapshot_older_than_the_held_diffs_is_stale_and_one_more_is_asked_for() {
        let mut s = Sequencer::new(ResumeMode::Snapshot, SeqStep::Increasing, None);
        diffs(&mut s, &[(141, 170), (171, 190)]);
        let mut out = Vec::new();
        // "If the first event's U is above lastUpdateId + 1, get a new snapshot."
        assert_eq!(snapshot(&mut s, 130, &mut out), Snapshotted::Stale);
        assert_eq!(out, vec![]);
        assert!(s.syncing());
        assert_eq!(s.held(), 2);
        assert_eq!(snapshot(&mut s, 175, &mut out), Snapshotted::Taken);
        assert_eq!(
            out,
            vec![
                Step::Snapshot {
                    seq: 175,
                    item: 175,
                    reason: SnapshotReason::Subscribe,
                    missed: None
                },
                Step::Event(190, 190),
            ]
        );
        // One nobody asked for any more is dropped.
        assert_eq!(snapshot(&mut s, 300, &mut out), Snapshotted::Unasked);
    }

    #[test]
    fn a_hole_in_the_diffs_resyncs_and_the_snapshot_entry_names_what_was_missed() {
        let mut s = Sequencer::new(ResumeMode::Snapshot, SeqStep::Increasing, Some(100));
        assert_eq!(
            diffs(&mut s, &[(101, 110), (120, 130), (131, 140)]),
            vec![
                Step::Event(110, 110),
                Step::Resync {
                    reason: SnapshotReason::Gap
                }
            ]
        );
        let mut out = Vec::new();
        assert_eq!(snapshot(&mut s, 135, &mut out), Snapshotted::Taken);
        assert_eq!(
            out,
            vec![
                Step::Snapshot {
                    seq: 135,
                    item: 135,
                    reason: SnapshotReason::Gap,
                    missed: Some(Missed {
                        from: 111,
                        to: 135,
                        reason: GapReason::NoReplay
                    })
                },
                Step::Event(140, 140),
            ]
        );
    }

    #[test]
    fn futures_diffs_chain_by_their_predecessor_across_a_snapshot() {
        // Binance USD-M: each diff says the previous one's `u` (`pu`); the
        // shell passes `pu + 1` as the first sequence it covers.
        let mut s = Sequencer::new(ResumeMode::Snapshot, SeqStep::Increasing, None);
        let mut out = Vec::new();
        for (pu, u) in [(90, 120), (120, 150), (150, 151)] {
            s.arrive_covering(Some(pu + 1), u, u, &mut out);
        }
        // lastUpdateId 130 falls inside the diff 121..=150: it is kept.
        assert_eq!(snapshot(&mut s, 130, &mut out), Snapshotted::Taken);
        assert_eq!(
            out[1..],
            [
                Step::Snapshot {
                    seq: 130,
                    item: 130,
                    reason: SnapshotReason::Subscribe,
                    missed: None
                },
                Step::Event(150, 150),
                Step::Event(151, 151),
            ]
        );
    }

    #[test]
    fn a_checksum_failure_holds_the_diffs_after_it_until_a_snapshot() {
        let mut s = Sequencer::new(ResumeMode::Snapshot, SeqStep::Contiguous, Some(10));
        let mut out = run(&mut s, &[11]);
        s.resync(SnapshotReason::Checksum, &mut out);
        // Asked once, however many times the book is found wrong.
        s.resync(SnapshotReason::Checksum, &mut out);
        out.extend(run(&mut s, &[12, 13, 14]));
        assert_eq!(
            out,
            vec![
                Step::Event(11, 11),
                Step::Resync {
                    reason: SnapshotReason::Checksum
                }
            ]
        );
        out.clear();
        assert_eq!(snapshot(&mut s, 13, &mut out), Snapshotted::Taken);
        assert_eq!(
            out,
            vec![
                Step::Snapshot {
                    seq: 13,
                    item: 13,
                    reason: SnapshotReason::Checksum,
                    missed: Some(Missed {
                        from: 12,
                        to: 13,
                        reason: GapReason::Checksum
                    })
                },
                Step::Event(14, 14),
            ]
        );
        // Other modes keep no book: nothing to re-synchronise.
        let mut live = Sequencer::<u64>::new(ResumeMode::Live, SeqStep::Contiguous, Some(10));
        let mut out = Vec::new();
        live.resync(SnapshotReason::Checksum, &mut out);
        assert!(out.is_empty() && !live.syncing());
    }

    #[test]
    fn a_snapshot_at_or_below_what_was_written_is_stale() {
        // Its entry id would not be above the last one (a REST cache that
        // lags the stream).
        let mut s = Sequencer::new(ResumeMode::Snapshot, SeqStep::Contiguous, Some(10));
        let mut out = run(&mut s, &[11]);
        s.resync(SnapshotReason::Checksum, &mut out);
        run(&mut s, &[12]);
        out.clear();
        assert_eq!(snapshot(&mut s, 11, &mut out), Snapshotted::Stale);
        assert_eq!((out.len(), s.held()), (0, 1));
    }

    #[test]
    fn a_new_connection_whose_first_diff_continues_the_book_needs_no_snapshot() {
        let mut s = Sequencer::new(ResumeMode::Snapshot, SeqStep::Increasing, Some(100));
        s.connected();
        assert_eq!(diffs(&mut s, &[(95, 120)]), vec![Step::Event(120, 120)]);
        s.connected();
        assert_eq!(
            diffs(&mut s, &[(200, 210)]),
            vec![Step::Resync {
                reason: SnapshotReason::Subscribe
            }]
        );
    }

    #[test]
    fn a_reset_book_starts_its_new_epoch_at_a_snapshot() {
        let mut s = Sequencer::new(ResumeMode::Snapshot, SeqStep::Increasing, Some(5_000))
            .with_reset_after(3);
        assert_eq!(
            diffs(&mut s, &[(1, 3), (4, 9), (10, 12)]),
            vec![
                Step::Reset { from: 5_000, to: 1 },
                Step::Resync {
                    reason: SnapshotReason::Reset
                },
            ]
        );
        let mut out = Vec::new();
        assert_eq!(snapshot(&mut s, 9, &mut out), Snapshotted::Taken);
        assert_eq!(
            out,
            vec![
                Step::Snapshot {
                    seq: 9,
                    item: 9,
                    reason: SnapshotReason::Reset,
                    missed: None
                },
                Step::Event(12, 12),
            ]
        );
    }

    #[test]
    fn a_book_sent_in_the_stream_starts_it_and_the_diffs_after_it_follow() {
        // Bybit v5: a snapshot after the subscribe, then deltas by `u`.
        let mut s = Sequencer::new(ResumeMode::Snapshot, SeqStep::Contiguous, None);
        let mut out = Vec::new();
        assert_eq!(s.arrive_snapshot(500, 500, &mut out), Arrival::Taken);
        out.extend(run(&mut s, &[501, 502]));
        assert_eq!(
            out,
            vec![
                Step::Snapshot {
                    seq: 500,
                    item: 500,
                    reason: SnapshotReason::Subscribe,
                    missed: None
                },
                Step::Event(501, 501),
                Step::Event(502, 502),
            ]
        );
        // A reconnect's book names what it replaced; the same book sent
        // again is a replay.
        s.connected();
        out.clear();
        assert_eq!(s.arrive_snapshot(510, 510, &mut out), Arrival::Taken);
        assert_eq!(s.arrive_snapshot(510, 510, &mut out), Arrival::Replayed);
        assert_eq!(
            out,
            vec![Step::Snapshot {
                seq: 510,
                item: 510,
                reason: SnapshotReason::Subscribe,
                missed: Some(Missed {
                    from: 503,
                    to: 510,
                    reason: GapReason::NoReplay
                })
            }]
        );
    }

    #[test]
    fn a_hole_asks_for_a_book_and_the_one_sent_in_the_stream_ends_the_wait() {
        let mut s = Sequencer::new(ResumeMode::Snapshot, SeqStep::Contiguous, Some(10));
        let mut out = run(&mut s, &[11, 14, 15]);
        assert_eq!(
            out,
            vec![
                Step::Event(11, 11),
                Step::Resync {
                    reason: SnapshotReason::Gap
                }
            ]
        );
        out.clear();
        // Diffs of the old subscription before the book: dropped with it.
        assert_eq!(s.arrive_snapshot(16, 16, &mut out), Arrival::Taken);
        out.extend(run(&mut s, &[17]));
        assert_eq!(
            out,
            vec![
                Step::Snapshot {
                    seq: 16,
                    item: 16,
                    reason: SnapshotReason::Gap,
                    missed: Some(Missed {
                        from: 12,
                        to: 16,
                        reason: GapReason::NoReplay
                    })
                },
                Step::Event(17, 17),
            ]
        );
        assert_eq!(s.held(), 0);
    }

    #[test]
    fn a_restarted_book_sent_with_u_1_starts_the_new_epoch_without_asking() {
        // Bybit: "a snapshot with u=1 means the service restarted".
        let mut s = Sequencer::new(ResumeMode::Snapshot, SeqStep::Contiguous, Some(9_000))
            .with_reset_after(3);
        let mut out = Vec::new();
        assert_eq!(s.arrive_snapshot(1, 1, &mut out), Arrival::Behind);
        out.extend(run(&mut s, &[2, 3]));
        assert_eq!(
            out,
            vec![
                Step::Reset { from: 9_000, to: 1 },
                Step::Snapshot {
                    seq: 1,
                    item: 1,
                    reason: SnapshotReason::Reset,
                    missed: None
                },
                Step::Event(2, 2),
                Step::Event(3, 3),
            ]
        );
        assert!(!s.syncing());
    }

    #[test]
    fn mode_and_step_names_round_trip() {
        for mode in ResumeMode::ALL {
            assert_eq!(ResumeMode::parse(mode.as_str()), Some(mode));
        }
        for step in SeqStep::ALL {
            assert_eq!(SeqStep::parse(step.as_str()), Some(step));
        }
        assert_eq!(ResumeMode::parse("Replay"), None);
    }
}
