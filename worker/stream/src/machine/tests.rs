//! The machine's behaviour as input scripts: no runtime, no fakes, time
//! passed in. Each script feeds inputs and reads the actions back.

use std::time::Duration;

use crate::sequence::SeqStep;
use leasehold_sink::{OpenOutcome, SinkError, SinkEvent, WriteOutcome};
use leasehold_telemetry::{BackfillResult, GapReason, LossReason, SkipReason, TelemetryEvent};
use tokio::time::Instant;

use super::*;
use crate::upstream::history::HistoryError;
use crate::upstream::{UpstreamError, UpstreamEvent};

/// A script: the machine, its clock, and what it asked for so far.
struct Script {
    machine: StreamMachine,
    now: Instant,
    /// Every telemetry event it emitted.
    telemetry: Vec<TelemetryEvent>,
    /// Where each subscribe asked from.
    subscribes: Vec<u64>,
    /// Every history range it asked for.
    fetches: Vec<(u64, u64)>,
    /// The fetch it is waiting for.
    fetch_out: Option<(u64, u64)>,
    /// What [`Script::settle`]'s sink holds.
    stored: Vec<SinkEvent>,
}

fn config() -> RunnerConfig {
    RunnerConfig {
        batch_max_events: 10,
        ..RunnerConfig::default()
    }
}

/// [`config`] with another `UPSTREAM_RESUME`.
fn resuming(resume: ResumeMode) -> RunnerConfig {
    RunnerConfig { resume, ..config() }
}

fn start(resume: u64) -> Start {
    Start {
        resume,
        anchored: resume > 0,
        lost: None,
    }
}

impl Script {
    fn new(config: RunnerConfig, start: Start) -> Script {
        let now = Instant::now();
        let mut machine = StreamMachine::new(config, "s".into(), 7, false, start, now);
        machine.set_persisted(Some(0));
        Script::of(machine, now)
    }

    /// A script over a machine built by hand (another token or mode).
    fn of(machine: StreamMachine, now: Instant) -> Script {
        Script {
            machine,
            now,
            telemetry: Vec::new(),
            subscribes: Vec::new(),
            fetches: Vec::new(),
            fetch_out: None,
            stored: Vec::new(),
        }
    }

    /// Every action asked for until the machine waits, telemetry apart.
    fn actions(&mut self) -> Vec<Action> {
        self.all_actions()
            .into_iter()
            .filter(|a| !matches!(a, Action::Emit(_)))
            .collect()
    }

    /// Every action, telemetry included (and noted: telemetry, subscribes,
    /// fetches).
    fn all_actions(&mut self) -> Vec<Action> {
        let actions: Vec<_> = std::iter::from_fn(|| self.machine.poll_action()).collect();
        for action in &actions {
            match action {
                Action::Emit(event) => self.telemetry.push(event.clone()),
                Action::Subscribe { from } => self.subscribes.push(*from),
                Action::Fetch { from, to, .. } => {
                    self.fetches.push((*from, *to));
                    self.fetch_out = Some((*from, *to));
                }
                Action::CancelFetch => self.fetch_out = None,
                _ => {}
            }
        }
        actions
    }

    /// Carries the actions out against a sink that takes every write (kept
    /// in `stored`, confirmed as appended) until the machine waits; returns
    /// every action besides telemetry.
    fn settle(&mut self) -> Vec<Action> {
        let mut seen = Vec::new();
        loop {
            let asked = self.actions();
            if asked.is_empty() {
                return seen;
            }
            self.confirm(&asked);
            seen.extend(asked);
        }
    }

    /// Confirms the writes among `actions` as appended (kept in `stored`).
    fn confirm(&mut self, actions: &[Action]) {
        for action in actions {
            if let Action::Write(events) = action {
                self.stored.extend(events.iter().cloned());
                self.written(events.len() as u64, 0, 0);
            }
        }
    }

    /// The server closes the connection: what came before is written, then
    /// the reconnect is waited for and made. Returns where it asked from.
    fn cut_and_reconnect(&mut self) -> u64 {
        self.feed(Input::UpstreamFailed(UpstreamError::Closed("cut".into())));
        let mut asked = self.settle();
        for _ in 0..50 {
            if let Some(from) = asked.iter().find_map(|a| match a {
                Action::Subscribe { from } => Some(*from),
                _ => None,
            }) {
                self.feed(Input::Subscribed);
                return from;
            }
            asked = self.wait_for_action();
        }
        panic!("no reconnect: {asked:?}");
    }

    /// Answers each fetch with what `history` gives for its range (the
    /// driver hands a page over only when the machine takes it), settling
    /// in between, until none is asked for.
    fn serve_history(
        &mut self,
        mut history: impl FnMut(u64, u64) -> Result<Vec<UpstreamEvent>, HistoryError>,
    ) {
        self.settle();
        while let Some((from, to)) = self.fetch_out.take() {
            assert!(self.machine.wants_page());
            self.feed(Input::Page(history(from, to)));
            self.settle();
        }
    }

    /// The telemetry events `pick` picks, in order.
    fn reported<T>(&self, pick: impl FnMut(&TelemetryEvent) -> Option<T>) -> Vec<T> {
        self.telemetry.iter().filter_map(pick).collect()
    }

    /// The gap markers counted: (from, to, reason).
    fn gaps_reported(&self) -> Vec<(u64, u64, GapReason)> {
        self.reported(|e| match e {
            TelemetryEvent::StreamGap {
                from_seq,
                to_seq,
                reason,
                ..
            } => Some((*from_seq, *to_seq, *reason)),
            _ => None,
        })
    }

    /// The backfills reported: (result, pages, events).
    fn backfills_reported(&self) -> Vec<(BackfillResult, u32, u64)> {
        self.reported(|e| match e {
            TelemetryEvent::StreamBackfill {
                result,
                pages,
                events,
                ..
            } => Some((*result, *pages, *events)),
            _ => None,
        })
    }

    /// The ranges reported lost by the sink (`SinkRegression`).
    fn regressions(&self) -> Vec<(u64, u64)> {
        self.reported(|e| match e {
            TelemetryEvent::SinkRegression {
                from_seq, to_seq, ..
            } => Some((*from_seq, *to_seq)),
            _ => None,
        })
    }

    /// The last-event ages of the lag reports, in order.
    fn last_event_ages(&self) -> Vec<f64> {
        self.reported(|e| match e {
            TelemetryEvent::StreamLag {
                last_event_age_seconds,
                ..
            } => Some(*last_event_age_seconds),
            _ => None,
        })
    }

    /// How many frames were skipped for `reason`.
    fn skipped(&self, reason: SkipReason) -> usize {
        self.reported(|e| match e {
            TelemetryEvent::UpstreamFrameSkipped { reason: r, .. } if *r == reason => Some(()),
            _ => None,
        })
        .len()
    }

    /// The sequences (markers: their position) the sink holds.
    fn stored_seqs(&self) -> Vec<u64> {
        self.stored.iter().map(|e| e.seq).collect()
    }

    /// What the sink holds: (seq, the marker's first sequence).
    fn entries(&self) -> Vec<(u64, Option<u64>)> {
        self.stored
            .iter()
            .map(|e| (e.seq, e.gap.map(|g| g.from)))
            .collect()
    }

    /// Invariant 8 for a contiguous upstream: every sequence from the first
    /// stored one on is either an event or inside exactly one marker.
    fn assert_contiguous_cover(&self) {
        let mut next = None;
        for entry in &self.stored {
            let first = entry.gap.map_or(entry.seq, |g| g.from);
            if let Some(next) = next {
                assert_eq!(first, next, "covered exactly once: {:?}", self.entries());
            }
            next = Some(entry.seq + 1);
        }
    }

    fn feed(&mut self, input: Input) {
        self.machine.handle(input, self.now);
    }

    fn pass(&mut self, by: Duration) {
        self.now += by;
        self.machine.handle_timeout(self.now);
    }

    /// Lets time pass from timeout to timeout until the machine asks for
    /// something besides telemetry; returns that.
    fn wait_for_action(&mut self) -> Vec<Action> {
        for _ in 0..50 {
            let due = self.machine.poll_timeout().expect("a timer");
            self.now = self.now.max(due);
            self.machine.handle_timeout(self.now);
            let actions = self.actions();
            if !actions.is_empty() {
                return actions;
            }
        }
        panic!("nothing asked for after 50 timeouts");
    }

    /// 1..=4 written and confirmed, 5 and 6 sent; the write meets a lost
    /// connection, and the re-open finds the sink at 2 (a failover lost 3
    /// and 4). Returns every action after the re-open.
    fn losing_a_confirmed_tail(&mut self) -> Vec<Action> {
        self.connected();
        self.frames(1..=4);
        self.actions();
        self.written(4, 0, 0);
        self.frames(5..=6);
        self.actions();
        self.feed(Input::Written {
            result: Err(SinkError::NotOpen {
                stream_id: "s".into(),
                fence_token: 7,
            }),
            started: self.now,
        });
        let asked = self.actions();
        assert!(matches!(asked[..], [Action::Reopen]), "{asked:?}");
        self.feed(Input::Reopened(Ok(OpenOutcome {
            highest_token: 7,
            last_seq: Some(2),
            fenced: false,
        })));
        self.all_actions()
    }

    /// Connected: the subscribe asked for is up.
    /// Feeds frames while the machine wants them; returns how many it read.
    fn read_until_paused(&mut self, seqs: impl IntoIterator<Item = u64>) -> usize {
        let mut read = 0;
        for seq in seqs {
            if !self.machine.wants_frames() {
                break;
            }
            self.frames([seq]);
            read += 1;
        }
        read
    }

    fn connected(&mut self) {
        let asked = self.actions();
        assert!(
            asked.iter().any(|a| matches!(a, Action::Subscribe { .. })),
            "{asked:?}"
        );
        self.feed(Input::Subscribed);
    }

    fn frames(&mut self, seqs: impl IntoIterator<Item = u64>) {
        for seq in seqs {
            self.feed(Input::Frame(frame(seq, self.now)));
        }
    }

    fn written(&mut self, accepted: u64, duplicate: u64, fenced: u64) {
        self.feed(Input::Written {
            result: Ok(WriteOutcome {
                accepted,
                duplicate,
                fenced,
                highest_token: 7,
            }),
            started: self.now,
        });
    }
}

fn frame(seq: u64, at: Instant) -> UpstreamEvent {
    UpstreamEvent {
        seq,
        first_seq: None,
        snapshot: false,
        event_id: format!("s:{seq}"),
        payload: format!("{{\"seq\":{seq}}}").into(),
        received_at: at,
        arrival_lag: None,
    }
}

/// A history page for `from..`: pages of seven, from `oldest` on, up to the
/// upstream's `head`, its events marked as the history's text.
fn history_page(from: u64, oldest: u64, head: u64, at: Instant) -> Vec<UpstreamEvent> {
    let start = from.max(oldest);
    (start..=(start + 6).min(head))
        .map(|seq| UpstreamEvent {
            payload: format!("{{\"history\":{seq}}}").into(),
            ..frame(seq, at)
        })
        .collect()
}

/// The sequences (markers: their position) of a write action.
fn written_seqs(action: &Action) -> Vec<u64> {
    match action {
        Action::Write(events) => events.iter().map(|e| e.seq).collect(),
        other => panic!("not a write: {other:?}"),
    }
}

fn writes(actions: &[Action]) -> Vec<Vec<u64>> {
    actions
        .iter()
        .filter(|a| matches!(a, Action::Write(_)))
        .map(written_seqs)
        .collect()
}

fn emitted(actions: &[Action]) -> Vec<&TelemetryEvent> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Emit(event) => Some(event),
            _ => None,
        })
        .collect()
}

#[test]
fn it_subscribes_after_the_resume_point_and_writes_a_burst_as_one_batch() {
    let mut s = Script::new(config(), start(40));
    let first = s.actions();
    assert!(
        matches!(first[..], [Action::Subscribe { from: 41 }]),
        "{first:?}"
    );
    s.feed(Input::Subscribed);
    s.frames(41..=45);
    let sent = s.actions();
    assert_eq!(writes(&sent), [vec![41, 42, 43, 44, 45]]);
    // One batch in flight: what arrives meanwhile waits for it.
    s.frames(46..=47);
    assert!(s.actions().is_empty(), "no second batch past the first");
    s.written(5, 0, 0);
    let next = s.actions();
    assert!(
        matches!(next[0], Action::StageCheckpoint(45)),
        "the checkpoint moves only after the sink confirmed: {next:?}"
    );
    assert_eq!(writes(&next), [vec![46, 47]]);
}

#[test]
fn a_full_batch_stops_reading_until_the_slot_frees() {
    let mut s = Script::new(config(), start(0));
    s.connected();
    s.frames(1..=10);
    assert!(!s.machine.wants_frames(), "ten pending: backpressure");
    let sent = s.actions();
    assert_eq!(writes(&sent).len(), 1);
    assert!(s.machine.wants_frames(), "the batch left: read again");
}

#[test]
fn a_fenced_write_stops_at_once_and_tells_the_keeper() {
    let mut s = Script::new(config(), start(0));
    s.connected();
    s.frames([1]);
    s.actions();
    s.written(0, 0, 1);
    let after = s.actions();
    assert!(
        after.iter().any(|a| matches!(a, Action::ReportFenced)),
        "{after:?}"
    );
    assert!(
        after.iter().any(|a| matches!(a, Action::Close)),
        "{after:?}"
    );
    assert_eq!(s.machine.stopped(), Some(&Stop::Lost(LossReason::Fenced)));
    assert!(!s.machine.wants_frames());
}

#[test]
fn a_marker_the_sink_dropped_as_a_replay_is_not_counted_again() {
    let mut s = Script::new(resuming(ResumeMode::Live), start(4));
    s.connected();
    // 5..=9 missed: a marker, then 10.
    s.frames([10]);
    let sent = s.actions();
    assert_eq!(writes(&sent), [vec![9, 10]]);
    // The sink had the marker already (a resend after a lost reply).
    s.written(1, 1, 0);
    let gaps = |actions: &[Action]| {
        emitted(actions)
            .into_iter()
            .filter(|e| matches!(e, TelemetryEvent::StreamGap { .. }))
            .count()
    };
    assert_eq!(gaps(&s.all_actions()), 0, "the marker was stored before");
    s.frames([12]);
    s.actions();
    s.written(2, 0, 0);
    assert_eq!(gaps(&s.all_actions()), 1, "11 is a new gap, counted once");
}

#[test]
fn outages_are_retried_after_the_backoff_and_refusals_give_the_stream_up() {
    let mut s = Script::new(
        RunnerConfig {
            sink_max_failures: 3,
            ..config()
        },
        start(0),
    );
    s.connected();
    s.frames([1, 2]);
    s.actions();
    s.feed(Input::Written {
        result: Err(SinkError::Unavailable("down".into())),
        started: s.now,
    });
    assert!(s.actions().is_empty(), "waits the backoff");
    let failed_at = s.now;
    let again = s.wait_for_action();
    assert_eq!(writes(&again), [vec![1, 2]], "the same batch again");
    assert!(
        s.now - failed_at <= Duration::from_millis(50),
        "the first backoff step (jittered)"
    );
    for _ in 0..3 {
        s.feed(Input::Written {
            result: Err(SinkError::Rejected("WRONGTYPE".into())),
            started: s.now,
        });
        if s.machine.stopped().is_some() {
            break;
        }
        s.pass(Duration::from_secs(5));
        s.actions();
    }
    assert!(
        matches!(s.machine.stopped(), Some(Stop::SinkFailing(error)) if error.contains("WRONGTYPE")),
        "{:?}",
        s.machine.stopped()
    );
}

#[test]
fn a_lost_sink_connection_reopens_and_a_lost_tail_is_asked_for_again() {
    let mut s = Script::new(config(), start(0));
    let after = s.losing_a_confirmed_tail();
    assert!(
        emitted(&after).iter().any(|e| matches!(
            e,
            TelemetryEvent::SinkRegression {
                from_seq: 3,
                to_seq: 4,
                ..
            }
        )),
        "{after:?}"
    );
    let after: Vec<_> = after
        .into_iter()
        .filter(|a| !matches!(a, Action::Emit(_)))
        .collect();
    assert!(
        matches!(after[..], [Action::Close, Action::Subscribe { from: 3 }]),
        "a replay upstream is asked again from the sink's end: {after:?}"
    );
}

#[test]
fn a_live_stream_marks_a_lost_tail_in_front_of_the_batch() {
    let mut s = Script::new(resuming(ResumeMode::Live), start(0));
    let sent: Vec<_> = s
        .losing_a_confirmed_tail()
        .into_iter()
        .filter(|a| !matches!(a, Action::Emit(_)))
        .collect();
    assert_eq!(writes(&sent), [vec![4, 5, 6]], "marker 3..=4, then 5 and 6");
    match &sent[0] {
        Action::Write(events) => assert_eq!(
            events[0].gap.map(|g| (g.from, g.reason)),
            Some((3, GapReason::SinkLost))
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.regressions(), [(3, 4)]);
    s.written(3, 0, 0);
    s.actions();
    assert_eq!(
        s.gaps_reported(),
        [(3, 4, GapReason::SinkLost)],
        "counted, never a silent hole"
    );
}

#[test]
fn a_failed_connection_is_written_out_before_the_reconnect() {
    let mut s = Script::new(config(), start(0));
    s.connected();
    s.frames(1..=3);
    s.feed(Input::UpstreamFailed(UpstreamError::Closed("cut".into())));
    let out = s.actions();
    assert!(matches!(out[0], Action::Close), "{out:?}");
    assert_eq!(writes(&out), [vec![1, 2, 3]]);
    assert!(
        !out.iter().any(|a| matches!(a, Action::Subscribe { .. })),
        "no reconnect before the sink confirmed"
    );
    s.written(3, 0, 0);
    s.actions();
    // The first reconnect waits the backoff's first step.
    let confirmed_at = s.now;
    let again = s.wait_for_action();
    assert!(s.now - confirmed_at <= Duration::from_millis(100));
    assert!(
        again
            .iter()
            .any(|a| matches!(a, Action::Subscribe { from: 4 })),
        "{again:?}"
    );
}

#[test]
fn a_drain_after_a_sequence_consumes_until_the_sink_confirmed_it() {
    let mut s = Script::new(config(), start(0));
    s.connected();
    s.frames(1..=2);
    assert_eq!(writes(&s.actions()), [vec![1, 2]]);
    s.written(2, 0, 0);
    s.actions();
    // The successor holds from 5 on: 3 and 4 are still this owner's.
    s.feed(Input::DrainAfter(4));
    s.frames(3..=3);
    let out = s.actions();
    assert_eq!(writes(&out), [vec![3]]);
    assert!(!out.iter().any(|a| matches!(a, Action::Close)), "{out:?}");
    s.written(1, 0, 0);
    s.frames(4..=5);
    let out = s.actions();
    assert_eq!(writes(&out), [vec![4, 5]]);
    assert!(
        !out.iter().any(|a| matches!(a, Action::Close)),
        "not before 4 is confirmed: {out:?}"
    );
    s.written(2, 0, 0);
    let out = s.actions();
    assert!(out.iter().any(|a| matches!(a, Action::Close)), "{out:?}");
    assert_eq!(s.machine.stopped(), Some(&Stop::Drain));
    // A target already confirmed drains at once.
    let mut s = Script::new(config(), start(0));
    s.connected();
    s.frames(1..=3);
    s.actions();
    s.written(3, 0, 0);
    s.actions();
    s.feed(Input::DrainAfter(2));
    assert!(s.actions().iter().any(|a| matches!(a, Action::Close)));
    assert_eq!(s.machine.stopped(), Some(&Stop::Drain));
}

#[test]
fn drain_closes_writes_what_is_pending_and_stops() {
    let mut s = Script::new(config(), start(0));
    s.connected();
    s.frames(1..=2);
    s.feed(Input::Drain);
    let out = s.actions();
    assert!(matches!(out[0], Action::Close), "{out:?}");
    assert_eq!(writes(&out), [vec![1, 2]]);
    assert_eq!(s.machine.stopped(), None, "not before the write landed");
    s.written(2, 0, 0);
    s.actions();
    assert_eq!(s.machine.stopped(), Some(&Stop::Drain));
}

#[test]
fn a_restarted_sequence_is_written_out_then_a_new_epoch_goes_on() {
    let mut s = Script::new(resuming(ResumeMode::Live), start(60_100));
    s.connected();
    s.frames(60_101..=60_102);
    s.frames([1, 2, 3]);
    assert!(
        !s.machine.wants_frames(),
        "no reading while the epoch waits"
    );
    let out = s.actions();
    assert_eq!(writes(&out), [vec![60_101, 60_102]], "the old epoch first");
    s.written(2, 0, 0);
    let epoch = s.actions();
    assert!(
        matches!(
            epoch[..],
            [
                Action::StageCheckpoint(60_102),
                Action::StartEpoch {
                    from: 60_102,
                    to: 1
                }
            ]
        ),
        "{epoch:?}"
    );
    s.feed(Input::EpochStarted { fence_token: 8 });
    assert_eq!(s.machine.fence_token(), 8);
    let out = s.actions();
    assert_eq!(
        writes(&out),
        [vec![1, 2, 3]],
        "the frames that made the reset"
    );
    assert!(
        !out.iter().any(|a| matches!(a, Action::Close)),
        "the same connection goes on"
    );
    s.written(3, 0, 0);
    s.frames([4]);
    assert_eq!(writes(&s.actions()), [vec![4]]);
}

#[test]
fn duplicates_alone_move_no_liveness_and_are_counted() {
    let mut s = Script::new(config(), start(10));
    s.connected();
    s.now += Duration::from_secs(30);
    s.frames([9, 10, 10]);
    let out = s.all_actions();
    let skipped = emitted(&out)
        .into_iter()
        .filter(|e| {
            matches!(
                e,
                TelemetryEvent::UpstreamFrameSkipped {
                    reason: SkipReason::Duplicate,
                    ..
                }
            )
        })
        .count();
    // 9 waits as a possible reset run; the two 10s are replays, and end it.
    assert_eq!(skipped, 3, "{out:?}");
    s.pass(Duration::from_secs(1));
    let report = s.all_actions();
    let age = emitted(&report).into_iter().find_map(|e| match e {
        TelemetryEvent::StreamLag {
            last_event_age_seconds,
            ..
        } => Some(*last_event_age_seconds),
        _ => None,
    });
    assert!(age.is_some_and(|age| age >= 31.0), "{age:?}");
}

#[test]
fn a_gap_in_replay_mode_reconnects_at_once_from_the_confirmed_position() {
    let mut s = Script::new(config(), start(0));
    s.connected();
    s.frames([1, 2, 5]);
    let out = s.actions();
    assert!(matches!(out[0], Action::Close), "{out:?}");
    assert_eq!(writes(&out), [vec![1, 2]]);
    s.written(2, 0, 0);
    let again = s.actions();
    assert!(
        again
            .iter()
            .any(|a| matches!(a, Action::Subscribe { from: 3 })),
        "the first gap reconnect does not wait: {again:?}"
    );
}

#[test]
fn a_moving_retention_edge_is_overtaken_not_chased() {
    let mut s = Script::new(config(), start(0));
    let mut asked = Vec::new();
    // Each subscribe meets an edge 50 further on than the last.
    for n in 0..12u64 {
        let actions = if n == 0 {
            s.actions()
        } else {
            s.wait_for_action()
        };
        let Some(from) = actions.iter().find_map(|a| match a {
            Action::Subscribe { from } => Some(*from),
            _ => None,
        }) else {
            panic!("{actions:?}");
        };
        asked.push(from);
        let earliest = 100 + 50 * n;
        if from >= earliest {
            break;
        }
        s.feed(Input::SubscribeFailed(UpstreamError::RetentionExceeded {
            requested: from,
            earliest: Some(earliest),
        }));
    }
    assert!(asked.len() < 12, "still chasing the edge: {asked:?}");
    // Each retry asked further ahead of the edge than the one before.
    assert!(asked.windows(2).all(|w| w[1] > w[0]), "{asked:?}");
}

#[test]
fn in_session_mode_the_lag_runs_to_the_sinks_confirmation() {
    let now = Instant::now();
    let mut machine = StreamMachine::new(config(), "s".into(), 1, true, start(0), now);
    // The table's checkpoint never moves (written every interval only).
    machine.set_persisted(None);
    let mut s = Script::of(machine, now);
    s.connected();
    s.frames(1..=5);
    s.actions();
    s.now += Duration::from_secs(30);
    s.written(5, 0, 0);
    let report = s.all_actions();
    let lag = emitted(&report).into_iter().find_map(|e| match e {
        TelemetryEvent::StreamLag {
            lag_events,
            lag_seconds,
            ..
        } => Some((*lag_events, *lag_seconds)),
        _ => None,
    });
    assert_eq!(lag, Some((0, 0.0)), "confirmed by the sink is durable here");
}

#[test]
fn a_live_start_lags_by_what_it_received_not_by_the_exchanges_id() {
    let mut s = Script::new(resuming(ResumeMode::Live), start(0));
    s.connected();
    s.frames(60_108..=60_110);
    s.pass(Duration::from_secs(1));
    let report = s.all_actions();
    let lag_events = emitted(&report).into_iter().find_map(|e| match e {
        TelemetryEvent::StreamLag { lag_events, .. } => Some(*lag_events),
        _ => None,
    });
    assert_eq!(lag_events, Some(3));
}

#[test]
fn a_held_hole_is_filled_from_history_then_the_held_events_follow() {
    let mut s = Script::new(resuming(ResumeMode::Backfill), start(10));
    s.connected();
    s.frames([14, 15]);
    let fetch = s.actions();
    assert!(
        fetch.iter().any(|a| matches!(
            a,
            Action::Fetch {
                from: 11,
                to: 13,
                ..
            }
        )),
        "{fetch:?}"
    );
    assert!(s.machine.wants_page());
    let page = (11..=13).map(|seq| frame(seq, s.now)).collect();
    s.feed(Input::Page(Ok(page)));
    let out = s.all_actions();
    assert_eq!(writes(&out), [vec![11, 12, 13, 14, 15]]);
    let filled = emitted(&out).into_iter().any(|e| {
        matches!(
            e,
            TelemetryEvent::StreamBackfill {
                result: leasehold_telemetry::BackfillResult::Filled,
                pages: 1,
                events: 3,
                ..
            }
        )
    });
    assert!(filled, "{out:?}");
}

#[test]
fn reading_pauses_while_the_held_events_are_at_their_bound() {
    let mut s = Script::new(
        RunnerConfig {
            resume: ResumeMode::Backfill,
            backfill_hold_max: 3,
            ..config()
        },
        start(10),
    );
    s.connected();
    s.frames([20, 21, 22]);
    assert!(!s.machine.wants_frames(), "three held: reading waits");
    s.actions();
    s.pass(Duration::from_millis(1_500));
    let page = (11..=19).map(|seq| frame(seq, s.now)).collect();
    s.feed(Input::Page(Ok(page)));
    // Twelve pending: the first batch of ten goes, then reading resumes.
    let out = s.all_actions();
    assert_eq!(writes(&out).len(), 1);
    assert!(s.machine.wants_frames(), "released with the range");
    // The pause is reported once, with its length.
    let waits: Vec<_> = emitted(&out)
        .into_iter()
        .filter(|event| matches!(event, TelemetryEvent::StreamBackfillWait { .. }))
        .collect();
    assert_eq!(
        waits,
        [&TelemetryEvent::StreamBackfillWait {
            stream_id: "s".into(),
            reason: leasehold_telemetry::BackfillWait::Hold,
            duration: Duration::from_millis(1_500),
        }]
    );
}

/// The batch lost on the way: nothing after it goes out before it landed
/// (ids only go up, so a batch sent past it would leave a hole no retry
/// fills), and the checkpoint never passes what landed.
#[test]
fn no_batch_is_sent_past_a_lost_one() {
    let mut s = Script::new(config(), start(0));
    s.connected();
    s.frames(1..=5);
    assert_eq!(writes(&s.actions()), [vec![1, 2, 3, 4, 5]]);
    s.frames(6..=8);
    s.feed(Input::Written {
        result: Err(SinkError::Unavailable("lost on the way".into())),
        started: s.now,
    });
    s.frames(9..=12);
    let again = s.wait_for_action();
    assert_eq!(
        writes(&again),
        [vec![1, 2, 3, 4, 5]],
        "the lost batch alone, again: {again:?}"
    );
    assert!(
        !again
            .iter()
            .any(|a| matches!(a, Action::StageCheckpoint(_))),
        "{again:?}"
    );
    s.written(5, 0, 0);
    let next = s.actions();
    assert!(matches!(next[0], Action::StageCheckpoint(5)), "{next:?}");
    assert_eq!(writes(&next), [vec![6, 7, 8, 9, 10, 11, 12]]);
    s.written(7, 0, 0);
    assert!(
        matches!(s.actions()[..], [Action::StageCheckpoint(12)]),
        "every sequence landed once, in order"
    );
}

#[test]
fn a_gap_reconnects_from_the_checkpoint_without_losing_events() {
    let mut s = Script::new(config(), start(0));
    s.connected();
    s.frames(1..=7);
    s.feed(Input::UpstreamFailed(UpstreamError::Gap {
        expected: 8,
        got: 11,
    }));
    s.settle();
    assert_eq!(
        s.subscribes,
        [1, 8],
        "the first gap reconnect does not wait"
    );
    s.feed(Input::Subscribed);
    s.frames(8..=19);
    assert_eq!(s.cut_and_reconnect(), 20);
    s.frames(20..=40);
    s.settle();
    assert_eq!(s.stored_seqs(), (1..=40).collect::<Vec<_>>());
    assert_eq!(s.subscribes, [1, 8, 20]);
    let reasons = s.reported(|e| match e {
        TelemetryEvent::UpstreamReconnect { reason, .. } => Some(reason.clone()),
        _ => None,
    });
    assert_eq!(reasons, ["gap", "closed"]);
}

#[test]
fn retention_loss_is_reported_and_skipped() {
    let mut s = Script::new(config(), start(0));
    s.actions();
    s.feed(Input::SubscribeFailed(UpstreamError::RetentionExceeded {
        requested: 1,
        earliest: Some(50),
    }));
    s.connected();
    s.frames(50..=60);
    s.settle();
    assert_eq!(s.subscribes, [1, 50], "from the edge, at once");
    assert_eq!(s.stored_seqs(), (50..=60).collect::<Vec<_>>());
    assert_eq!(s.gaps_reported(), [(1, 49, GapReason::Retention)]);
}

#[test]
fn sink_failures_are_retried_without_losing_the_batch() {
    let mut s = Script::new(config(), start(0));
    s.connected();
    s.frames(1..=15);
    assert_eq!(writes(&s.actions()), [(1..=10).collect::<Vec<_>>()]);
    let mut again = Vec::new();
    for _ in 0..3 {
        s.feed(Input::Written {
            result: Err(SinkError::Unavailable("down".into())),
            started: s.now,
        });
        again = s.wait_for_action();
        assert_eq!(writes(&again), [(1..=10).collect::<Vec<_>>()]);
    }
    s.confirm(&again);
    s.settle();
    assert_eq!(s.stored_seqs(), (1..=15).collect::<Vec<_>>());
    // Failures are counted in events, like every other sink outcome.
    let failed = s.reported(|e| match e {
        TelemetryEvent::SinkWriteFailed { events, .. } => Some(*events),
        _ => None,
    });
    assert_eq!(failed, [10, 10, 10]);
}

/// Outages are not counted: 25 in a row (over `SINK_MAX_FAILURES`) and the
/// batch still lands while the lease holds.
#[test]
fn an_unreachable_sink_is_retried_past_the_refusal_limit() {
    let mut s = Script::new(config(), start(0));
    s.connected();
    s.frames(1..=5);
    s.actions();
    for _ in 0..25 {
        s.feed(Input::Written {
            result: Err(SinkError::Unavailable("down".into())),
            started: s.now,
        });
        assert_eq!(s.machine.stopped(), None);
        assert_eq!(writes(&s.wait_for_action()), [vec![1, 2, 3, 4, 5]]);
    }
    s.written(5, 0, 0);
    assert!(matches!(s.actions()[..], [Action::StageCheckpoint(5)]));
    assert_eq!(s.machine.stopped(), None);
}

#[test]
fn a_sink_that_keeps_refusing_is_given_up_after_sink_max_failures_refusals() {
    let mut s = Script::new(config(), start(0));
    s.connected();
    s.frames(1..=5);
    s.actions();
    let mut after = Vec::new();
    for _ in 0..20 {
        s.feed(Input::Written {
            result: Err(SinkError::Rejected("WRONGTYPE".into())),
            started: s.now,
        });
        if s.machine.stopped().is_some() {
            after = s.actions();
            break;
        }
        assert_eq!(writes(&s.wait_for_action()), [vec![1, 2, 3, 4, 5]]);
    }
    assert_eq!(
        s.machine.stopped(),
        Some(&Stop::SinkFailing(
            "sink rejected the write: WRONGTYPE".into()
        ))
    );
    let refused = s.reported(|e| match e {
        TelemetryEvent::SinkWriteFailed { .. } => Some(()),
        _ => None,
    });
    assert_eq!(
        refused.len(),
        10,
        "SINK_MAX_FAILURES refusals, then no more"
    );
    assert!(
        matches!(after[..], [Action::Close]),
        "the connection closes: {after:?}"
    );
    assert_eq!(s.machine.poll_timeout(), None);
}

#[test]
fn the_last_event_age_stays_low_while_events_flow_and_grows_in_silence() {
    let mut s = Script::new(config(), start(0));
    s.connected();
    for seq in 1..=40 {
        s.pass(Duration::from_millis(500));
        s.frames([seq]);
        s.settle();
    }
    let flowing = s.last_event_ages();
    assert!(
        flowing.iter().all(|age| *age < 2.0),
        "{flowing:?} while an event came every 0.5 s"
    );
    for _ in 0..30 {
        s.pass(Duration::from_secs(1));
        s.settle();
    }
    let silent = *s.last_event_ages().last().unwrap();
    assert!(silent >= 29.0, "{silent} s after 30 s of silence");
}

#[test]
fn the_event_lag_is_the_arrival_lag_plus_the_time_since() {
    let mut s = Script::new(config(), start(0));
    s.connected();
    // The events arrive 2 s behind their own time.
    for seq in 1..=3 {
        s.feed(Input::Frame(UpstreamEvent {
            arrival_lag: Some(2.0),
            ..frame(seq, s.now)
        }));
    }
    s.settle();
    for _ in 0..10 {
        s.pass(Duration::from_secs(1));
        s.settle();
    }
    let lag = s
        .reported(|e| match e {
            TelemetryEvent::StreamLag {
                event_lag_seconds, ..
            } => *event_lag_seconds,
            _ => None,
        })
        .pop()
        .expect("event lag reported");
    assert!(
        (11.5..12.5).contains(&lag),
        "{lag} s: 2 s on arrival + 10 s since"
    );
}

#[test]
fn live_mode_starts_at_the_live_position_and_marks_what_a_reconnect_missed() {
    let mut s = Script::new(resuming(ResumeMode::Live), start(0));
    s.connected();
    // A never-written stream: the first event is wherever the upstream is.
    s.frames(5_001..=5_010);
    // The server cut the connection; 20 events pass before the reconnect.
    s.cut_and_reconnect();
    // Then the upstream skips three on the new connection.
    s.frames((5_031..=5_035).chain(5_039..=5_045));
    s.settle();
    let stored = s.entries();
    assert_eq!(
        stored[0],
        (5_001, None),
        "no marker before the first event: {stored:?}"
    );
    let markers: Vec<_> = stored.iter().filter(|(_, from)| from.is_some()).collect();
    assert_eq!(markers, [&(5_030, Some(5_011)), &(5_038, Some(5_036))]);
    assert_eq!(stored.last(), Some(&(5_045, None)));
    s.assert_contiguous_cover();
    assert_eq!(
        s.gaps_reported(),
        [
            (5_011, 5_030, GapReason::NoReplay),
            (5_036, 5_038, GapReason::NoReplay)
        ],
        "each marker counted once"
    );
    let reconnects = s.reported(|e| match e {
        TelemetryEvent::UpstreamReconnect { .. } => Some(()),
        _ => None,
    });
    assert_eq!(reconnects.len(), 1, "a gap never reconnects in live mode");
}

/// One bogus frame far ahead (1e15) neither moves the stream nor stops it:
/// it is dropped and counted as `reason="jump"`, and the real sequence goes
/// on being written with no gap marker. Without the jump bound the frame
/// would be written after a marker up to 1e15 - 1, and every real event
/// after it dropped as a replay.
#[test]
fn one_bogus_frame_far_ahead_is_dropped_and_the_stream_goes_on() {
    let mut s = Script::new(resuming(ResumeMode::Live), start(0));
    s.connected();
    s.frames(101..=105);
    s.feed(Input::Frame(UpstreamEvent {
        event_id: "status".into(),
        payload: "{\"status\":\"ok\"}".into(),
        ..frame(1_000_000_000_000_000, s.now)
    }));
    s.frames(106..=120);
    s.settle();
    assert_eq!(s.stored_seqs(), (101..=120).collect::<Vec<_>>());
    assert!(s.stored.iter().all(|e| e.gap.is_none()), "no marker");
    assert_eq!(s.skipped(SkipReason::Jump), 1);
}

/// The sink ends at a marker (41..=60): a live upstream's next event marks
/// the hole from after the marker to it.
#[test]
fn live_mode_resumes_after_a_marker_and_marks_the_takeover_hole() {
    let mut s = Script::new(resuming(ResumeMode::Live), start(60));
    s.connected();
    s.frames(101..=103);
    s.settle();
    assert_eq!(
        s.entries(),
        [(100, Some(61)), (101, None), (102, None), (103, None)]
    );
    assert_eq!(s.stored[0].gap.map(|g| g.reason), Some(GapReason::NoReplay));
}

#[test]
fn increasing_sequences_never_mark_a_hole() {
    let mut s = Script::new(
        RunnerConfig {
            seq_step: SeqStep::Increasing,
            ..resuming(ResumeMode::Live)
        },
        start(0),
    );
    s.connected();
    s.frames([102, 105, 108, 111]);
    s.cut_and_reconnect();
    s.frames((147..=159).step_by(3));
    s.settle();
    assert_eq!(
        s.stored_seqs(),
        [102, 105, 108, 111, 147, 150, 153, 156, 159]
    );
    assert!(s.stored.iter().all(|e| e.gap.is_none()), "no marker");
    assert!(s.gaps_reported().is_empty());
}

/// Three cuts, each followed by 20 events nobody read live; the second
/// comes while the first hole is still being fetched.
#[test]
fn backfill_closes_the_hole_from_history_then_writes_the_held_events() {
    let mut s = Script::new(resuming(ResumeMode::Backfill), start(0));
    s.connected();
    s.frames(1_001..=1_005);
    s.cut_and_reconnect();
    s.frames(1_026..=1_030);
    s.settle();
    assert_eq!(s.fetch_out.map(|(from, _)| from), Some(1_006));
    s.cut_and_reconnect();
    s.frames(1_051..=1_055);
    let at = s.now;
    s.serve_history(|from, _| Ok(history_page(from, 1, 1_055, at)));
    s.cut_and_reconnect();
    s.frames(1_076..=1_080);
    s.serve_history(|from, _| Ok(history_page(from, 1, 1_080, at)));
    s.frames(1_081..=1_083);
    s.settle();
    assert_eq!(
        s.stored_seqs(),
        (1_001..=1_083).collect::<Vec<_>>(),
        "0 missing, 0 duplicates, no marker"
    );
    assert!(s.stored.iter().all(|e| e.gap.is_none()));
    assert!(s.gaps_reported().is_empty());
    assert!(s.fetches.len() >= 4, "{:?}", s.fetches);
    let from_history = s
        .stored
        .iter()
        .filter(|e| e.payload.as_bytes().starts_with(b"{\"history\""))
        .count() as u64;
    assert_eq!(from_history, 60, "backfilled items are the history's text");
    // A hole found while a backfill runs joins it.
    assert_eq!(
        s.backfills_reported(),
        [
            (BackfillResult::Filled, 6, 40),
            (BackfillResult::Filled, 3, 20)
        ]
    );
}

#[test]
fn a_history_without_the_start_marks_retention_and_a_failing_one_backfill_exhausted() {
    for (oldest, fails, reason) in [
        (25, false, GapReason::Retention),
        (1, true, GapReason::BackfillExhausted),
    ] {
        let mut s = Script::new(resuming(ResumeMode::Backfill), start(0));
        s.connected();
        s.frames(11..=13);
        s.cut_and_reconnect();
        s.frames([41]);
        let at = s.now;
        s.serve_history(|from, _| {
            if fails {
                Err(HistoryError::Unavailable("HTTP 503".into()))
            } else {
                Ok(history_page(from, oldest, 41, at))
            }
        });
        assert_eq!(s.stored.last().map(|e| e.seq), Some(41));
        s.assert_contiguous_cover();
        let reported = s.gaps_reported();
        assert_eq!(reported.len(), 1, "{reported:?}");
        assert_eq!(reported[0].2, reason);
        if reason == GapReason::Retention {
            assert_eq!((reported[0].0, reported[0].1), (14, 24));
            assert!(s.stored_seqs().contains(&25), "the rest came from history");
        } else {
            assert_eq!((reported[0].0, reported[0].1), (14, 40));
        }
        let backfills = s.backfills_reported();
        assert_eq!(backfills.len(), 1, "{backfills:?}");
        assert_eq!(backfills[0].0, BackfillResult::Gap);
    }
}

/// The hole after 900 stays open (its page never comes) while the live feed
/// moves on: reading stops at the held bound, nothing past the hole is
/// written, and a stream dropped then reports its backfill as stopped.
#[test]
fn a_backfill_held_open_stops_reading_at_its_bound_and_a_drop_reports_it_stopped() {
    let mut s = Script::new(
        RunnerConfig {
            backfill_hold_max: 5,
            ..resuming(ResumeMode::Backfill)
        },
        start(900),
    );
    s.connected();
    let read = s.read_until_paused(1_001..=1_100);
    let asked = s.actions();
    assert_eq!(s.fetches, [(901, 1_000)], "the hole is fetched");
    // The first live event opened the hole; four more are held, then reading stops.
    assert_eq!(read, 5, "live events read while 5 may be held");
    assert!(writes(&asked).is_empty(), "nothing written past the hole");
    assert!(s.backfills_reported().is_empty(), "still backfilling");
    s.now += Duration::from_millis(500);
    let dropped = s.machine.abandon(s.now);
    assert!(
        matches!(
            dropped,
            Some(TelemetryEvent::StreamBackfill {
                result: BackfillResult::Stopped,
                pages: 0,
                events: 0,
                ..
            })
        ),
        "{dropped:?}"
    );
}

/// The same pause when the held frames reach their byte bound first
/// (`STREAM_HOLD_MAX_BYTES`), whatever their count.
#[test]
fn reading_pauses_while_the_held_bytes_are_at_their_bound() {
    // Each frame weighs 18 bytes (its id and its text): six reach 100.
    let mut s = Script::new(
        RunnerConfig {
            hold_max_bytes: 100,
            ..resuming(ResumeMode::Backfill)
        },
        start(900),
    );
    s.connected();
    let read = s.read_until_paused(1_001..=1_100);
    assert!(
        read <= 6,
        "{read} live frames read while 100 bytes may be held"
    );
    assert!(
        writes(&s.actions()).is_empty(),
        "nothing written past the hole"
    );
}

/// A failover lost the sink's newest entries: once the regression is
/// reported and the upstream asked again from the sink's end, the refill
/// writes each sequence once, in order.
#[test]
fn a_tail_the_sink_lost_in_a_failover_is_refilled_from_the_upstream() {
    let mut s = Script::new(config(), start(0));
    s.losing_a_confirmed_tail();
    assert_eq!(s.regressions(), [(3, 4)]);
    assert_eq!(
        s.subscribes.last(),
        Some(&3),
        "asked again from the sink's end"
    );
    s.feed(Input::Subscribed);
    s.frames(3..=8);
    let refill = s.settle();
    assert_eq!(writes(&refill), [vec![3, 4, 5, 6, 7, 8]]);
    assert!(
        matches!(refill.last(), Some(Action::StageCheckpoint(8))),
        "{refill:?}"
    );
    assert_eq!(s.regressions(), [(3, 4)], "reported once");
}

/// Draining while a refill is under way: what was not refilled yet is marked
/// `sink_lost` before the stop (the next owner resumes after the checkpoint,
/// which had passed it).
#[test]
fn a_drain_during_a_refill_marks_what_was_not_refilled() {
    let mut s = Script::new(config(), start(0));
    s.losing_a_confirmed_tail();
    // The connection closes at once: the refill cannot start.
    s.feed(Input::Subscribed);
    s.feed(Input::UpstreamFailed(UpstreamError::Closed("cut".into())));
    s.settle();
    s.feed(Input::Drain);
    s.settle();
    let last = s.stored.last().expect("the marker was written");
    assert_eq!(last.seq, 4);
    assert_eq!(
        last.gap.map(|g| (g.from, g.reason)),
        Some((3, GapReason::SinkLost))
    );
    assert_eq!(s.stored.len(), 1, "{:?}", s.entries());
    assert_eq!(s.gaps_reported(), [(3, 4, GapReason::SinkLost)]);
    assert_eq!(s.machine.stopped(), Some(&Stop::Drain));
}

/// An order book's diff covering `first..=last` (Binance `U`, `u`).
fn diff(first: u64, last: u64) -> UpstreamEvent {
    UpstreamEvent {
        seq: last,
        first_seq: Some(first),
        snapshot: false,
        event_id: last.to_string(),
        payload: format!("{{\"U\":{first},\"u\":{last}}}").into(),
        received_at: Instant::now(),
        arrival_lag: None,
    }
}

/// A REST snapshot of the book at `last_update_id`.
fn book_at(last_update_id: u64) -> UpstreamEvent {
    UpstreamEvent {
        seq: last_update_id,
        first_seq: None,
        snapshot: false,
        event_id: String::new(),
        payload: format!("{{\"lastUpdateId\":{last_update_id}}}").into(),
        received_at: Instant::now(),
        arrival_lag: None,
    }
}

/// The book sent in the stream at `seq` (`UPSTREAM_SNAPSHOT_MATCH`).
fn in_band_book(seq: u64) -> UpstreamEvent {
    UpstreamEvent {
        snapshot: true,
        ..book_at(seq)
    }
}

/// How many in-band book asks are among `actions`.
fn asks(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| matches!(a, Action::AskSnapshot))
        .count()
}

/// The waits of the snapshot fetches among `actions`.
fn snapshot_fetches(actions: &[Action]) -> Vec<Duration> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::FetchSnapshot { after } => Some(*after),
            _ => None,
        })
        .collect()
}

#[test]
fn a_book_is_written_from_its_snapshot_then_the_diffs_after_it() {
    let mut s = Script::new(
        RunnerConfig {
            seq_step: SeqStep::Increasing,
            ..resuming(ResumeMode::Snapshot)
        },
        start(0),
    );
    s.settle();
    s.feed(Input::Subscribed);
    s.feed(Input::Frame(diff(101, 140)));
    s.feed(Input::Frame(diff(141, 170)));
    let asked = s.settle();
    assert_eq!(snapshot_fetches(&asked), [Duration::ZERO]);
    assert!(s.stored.is_empty(), "nothing before the snapshot");
    // Older than the held diffs: another, after a wait; an unreadable one too.
    s.feed(Input::Snapshot(Ok(book_at(90))));
    let first_wait = snapshot_fetches(&s.settle());
    s.feed(Input::Snapshot(Err(HistoryError::Unavailable(
        "down".into(),
    ))));
    let second_wait = snapshot_fetches(&s.settle());
    assert_eq!((first_wait.len(), second_wait.len()), (1, 1));
    assert!(s.stored.is_empty());
    s.feed(Input::Snapshot(Ok(book_at(150))));
    s.settle();
    let snapshots: Vec<_> = s.stored.iter().map(|e| (e.seq, e.snapshot)).collect();
    assert_eq!(snapshots, [(150, true), (170, false)]);
    assert_eq!(s.stored[0].gap, None, "a first book misses nothing");
    assert!(s.stored[0].payload == *"{\"lastUpdateId\":150}");
    // A reconnect whose first diff starts past the book: a new snapshot,
    // whose entry names the diffs no reader saw.
    s.cut_and_reconnect();
    s.feed(Input::Frame(diff(300, 320)));
    assert_eq!(snapshot_fetches(&s.settle()), [Duration::ZERO]);
    s.feed(Input::Snapshot(Ok(book_at(310))));
    s.settle();
    assert_eq!(s.stored_seqs(), [150, 170, 310, 320]);
    assert_eq!(
        s.stored[2].gap,
        Some(leasehold_sink::GapMark {
            from: 171,
            reason: GapReason::NoReplay
        })
    );
    assert_eq!(s.gaps_reported(), [(171, 310, GapReason::NoReplay)]);
    let reasons = s.reported(|e| match e {
        TelemetryEvent::StreamSnapshot { reason, .. } => Some(*reason),
        _ => None,
    });
    assert_eq!(
        reasons,
        [
            leasehold_telemetry::SnapshotReason::Subscribe,
            leasehold_telemetry::SnapshotReason::Subscribe
        ]
    );
}

#[test]
fn a_book_sent_in_the_stream_is_asked_for_again_on_the_connection_after_a_hole() {
    let mut s = Script::new(
        RunnerConfig {
            snapshots_in_band: true,
            ..resuming(ResumeMode::Snapshot)
        },
        start(0),
    );
    s.settle();
    s.feed(Input::Subscribed);
    s.feed(Input::Frame(in_band_book(100)));
    s.feed(Input::Frame(frame(101, Instant::now())));
    let asked = s.settle();
    assert_eq!(asks(&asked), 0);
    assert_eq!(
        s.stored
            .iter()
            .map(|e| (e.seq, e.snapshot))
            .collect::<Vec<_>>(),
        [(100, true), (101, false)]
    );
    // A lost diff: no REST fetch, the upstream is asked on the connection.
    s.feed(Input::Frame(frame(103, Instant::now())));
    let asked = s.settle();
    assert_eq!(asks(&asked), 1);
    assert!(snapshot_fetches(&asked).is_empty());
    s.feed(Input::Frame(in_band_book(104)));
    s.settle();
    assert_eq!(s.stored_seqs(), [100, 101, 104]);
    assert_eq!(s.gaps_reported(), [(102, 104, GapReason::NoReplay)]);
}

/// OKX `books` frames with the checksum OKX would send for the book they
/// make (worked out on `book`, which they are applied to).
fn okx_frame(
    book: &mut crate::book::Book,
    action: &str,
    seq: u64,
    bids: &[(&str, &str)],
    asks: &[(&str, &str)],
) -> UpstreamEvent {
    use crate::book::{BookFormat, ChecksumRule};
    let levels = |side: &[(&str, &str)]| {
        side.iter()
            .map(|(p, q)| format!(r#"["{p}","{q}","0","1"]"#))
            .collect::<Vec<_>>()
            .join(",")
    };
    let body = |checksum: i64| {
        format!(
            r#"{{"arg":{{"channel":"books","instId":"BTC-USDT"}},"action":"{action}","data":[{{"asks":[{}],"bids":[{}],"ts":"1","checksum":{checksum},"seqId":{seq},"prevSeqId":{}}}]}}"#,
            levels(asks),
            levels(bids),
            if action == "snapshot" {
                -1
            } else {
                seq as i64 - 1
            }
        )
    };
    let message = BookFormat::Okx
        .read_message(body(0).as_bytes())
        .unwrap()
        .unwrap();
    book.apply(&message);
    let checksum = ChecksumRule::Okx.compute(book, None).unwrap();
    UpstreamEvent {
        seq,
        first_seq: (action != "snapshot").then_some(seq),
        event_id: seq.to_string(),
        payload: body(checksum).into(),
        snapshot: action == "snapshot",
        received_at: Instant::now(),
        arrival_lag: None,
    }
}

#[test]
fn a_book_that_fails_its_checksum_is_reported_and_re_synchronised() {
    let mut s = Script::new(
        RunnerConfig {
            snapshots_in_band: true,
            book_check: crate::runner::BookCheck {
                rule: crate::book::ChecksumRule::Okx,
                options: Default::default(),
            },
            ..resuming(ResumeMode::Snapshot)
        },
        start(0),
    );
    s.settle();
    s.feed(Input::Subscribed);
    let mut exchange = crate::book::Book::new();
    let frames = [
        okx_frame(
            &mut exchange,
            "snapshot",
            10,
            &[("100.0", "1")],
            &[("101.0", "2")],
        ),
        okx_frame(&mut exchange, "update", 11, &[("100.5", "3")], &[]),
    ];
    for frame in frames {
        s.feed(Input::Frame(frame));
    }
    s.settle();
    assert!(
        s.reported(|e| match e {
            TelemetryEvent::StreamChecksumFailure { .. } => Some(()),
            _ => None,
        })
        .is_empty()
    );
    // An update that the exchange applied to a level the worker never saw
    // (a garbled diff): its checksum disagrees with the worker's book.
    let mut diverged = exchange.clone();
    diverged.set(
        crate::book::Side::Ask,
        crate::book::Decimal::parse("102.0").unwrap(),
        crate::book::Decimal::parse("5").unwrap(),
    );
    let bad = okx_frame(&mut diverged, "update", 12, &[("99.0", "1")], &[]);
    s.feed(Input::Frame(bad));
    let asked = s.settle();
    assert_eq!(
        s.reported(|e| match e {
            TelemetryEvent::StreamChecksumFailure { .. } => Some(()),
            _ => None,
        })
        .len(),
        1
    );
    assert_eq!(asks(&asked), 1);
    // Updates until the new book are held, then the book's entry says the
    // reader's book was wrong from after the failed update.
    s.feed(Input::Frame(okx_frame(
        &mut diverged,
        "update",
        13,
        &[],
        &[],
    )));
    let mut fresh = crate::book::Book::new();
    s.feed(Input::Frame(okx_frame(
        &mut fresh,
        "snapshot",
        14,
        &[("99.0", "1")],
        &[("101.0", "2")],
    )));
    s.feed(Input::Frame(okx_frame(
        &mut fresh,
        "update",
        15,
        &[("98.0", "1")],
        &[],
    )));
    s.settle();
    assert_eq!(s.stored_seqs(), [10, 11, 12, 14, 15]);
    assert_eq!(
        s.stored[3].gap,
        Some(leasehold_sink::GapMark {
            from: 13,
            reason: GapReason::Checksum
        })
    );
    assert_eq!(s.gaps_reported(), [(13, 14, GapReason::Checksum)]);
    assert_eq!(
        s.reported(|e| match e {
            TelemetryEvent::StreamChecksumFailure { .. } => Some(()),
            _ => None,
        })
        .len(),
        1,
        "the new book checks out"
    );
}

#[test]
fn a_book_that_keeps_coming_back_unusable_is_asked_for_again_after_a_backoff() {
    let mut s = Script::new(
        RunnerConfig {
            snapshots_in_band: true,
            ..resuming(ResumeMode::Snapshot)
        },
        start(0),
    );
    s.settle();
    s.feed(Input::Subscribed);
    s.feed(Input::Frame(in_band_book(100)));
    s.feed(Input::Frame(frame(101, Instant::now())));
    s.feed(Input::Frame(frame(103, Instant::now())));
    assert_eq!(asks(&s.settle()), 1, "a hole: asked at once");
    // The book comes back at the id already written (unchanged): unusable.
    s.feed(Input::Frame(in_band_book(101)));
    assert_eq!(asks(&s.settle()), 0, "not asked again at once");
    assert_eq!(asks(&s.wait_for_action()), 1, "asked again after a backoff");
    s.feed(Input::Frame(in_band_book(104)));
    s.settle();
    assert_eq!(s.stored_seqs(), [100, 101, 104]);
}

/// A frame of an upstream that numbers nothing (`UPSTREAM_SEQ_POINTER=none`,
/// `UPSTREAM_ID_POINTER=none`): a Kraken v2 book update or, `snapshot`, book.
fn unnumbered(snapshot: bool) -> UpstreamEvent {
    UpstreamEvent {
        seq: 0,
        first_seq: None,
        snapshot,
        event_id: String::new(),
        payload: format!(
            "{{\"type\":\"{}\"}}",
            if snapshot { "snapshot" } else { "update" }
        )
        .into(),
        received_at: Instant::now(),
        arrival_lag: None,
    }
}

#[test]
fn an_upstream_without_sequences_is_numbered_from_each_connections_book() {
    let mut s = Script::new(
        RunnerConfig {
            snapshots_in_band: true,
            seq_source: crate::numbering::SeqSource::Counted,
            ..resuming(ResumeMode::Snapshot)
        },
        // A takeover: the sink ends at 40.
        start(40),
    );
    s.settle();
    s.feed(Input::Subscribed);
    // An update before the connection's book has nothing to follow.
    s.feed(Input::Frame(unnumbered(false)));
    s.settle();
    assert!(s.stored.is_empty());
    assert_eq!(s.skipped(SkipReason::MissingField), 1);
    s.feed(Input::Frame(unnumbered(true)));
    s.feed(Input::Frame(unnumbered(false)));
    s.feed(Input::Frame(unnumbered(false)));
    s.settle();
    let ids: Vec<_> = s
        .stored
        .iter()
        .map(|e| (e.seq, e.event_id.clone()))
        .collect();
    assert_eq!(
        ids,
        [(41, String::new()), (42, "42".into()), (43, "43".into())],
        "the book, then its updates under the stream's next numbers (ids too)"
    );
    // Whatever the predecessor left unwritten is one number wide: the
    // worker cannot count it, only say a book replaced it.
    assert_eq!(s.gaps_reported(), [(41, 41, GapReason::NoReplay)]);

    // A cut: the next connection's book continues the numbers, never a reset.
    s.cut_and_reconnect();
    s.feed(Input::Frame(unnumbered(false)));
    s.feed(Input::Frame(unnumbered(true)));
    s.feed(Input::Frame(unnumbered(false)));
    s.settle();
    assert_eq!(s.stored_seqs(), [41, 42, 43, 44, 45]);
    assert!(s.stored[3].snapshot);
    assert_eq!(s.gaps_reported()[1..], [(44, 44, GapReason::NoReplay)]);
    assert_eq!(s.skipped(SkipReason::MissingField), 2);
}

#[test]
fn an_ask_for_a_book_that_goes_unanswered_is_made_again_then_the_connection_replaced() {
    let mut s = Script::new(
        RunnerConfig {
            snapshots_in_band: true,
            ..resuming(ResumeMode::Snapshot)
        },
        start(0),
    );
    s.settle();
    s.feed(Input::Subscribed);
    s.feed(Input::Frame(in_band_book(100)));
    s.feed(Input::Frame(frame(102, Instant::now())));
    let mut asked = asks(&s.settle());
    assert_eq!(asked, 1, "a hole: the book is asked for");
    // The upstream never answers: one ask per deadline, then a reconnect.
    let subscribes = s.subscribes.len();
    for _ in 0..UNANSWERED_ASKS_BEFORE_RECONNECT {
        s.pass(BOOK_ASK_DEADLINE);
        asked += asks(&s.settle());
    }
    assert_eq!(asked, UNANSWERED_ASKS_BEFORE_RECONNECT as usize);
    for _ in 0..50 {
        if s.subscribes.len() > subscribes {
            break;
        }
        s.pass(Duration::from_millis(100));
        s.settle();
    }
    assert_eq!(
        s.subscribes.len(),
        subscribes + 1,
        "a new connection brings a book"
    );
    // Its book is taken, and the missed diff is marked.
    s.feed(Input::Subscribed);
    s.feed(Input::Frame(in_band_book(103)));
    s.settle();
    assert_eq!(s.stored_seqs(), [100, 103]);
}
