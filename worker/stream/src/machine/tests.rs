//! The machine's behaviour as input scripts: no runtime, no fakes, time
//! passed in. Each script feeds inputs and reads the actions back.

use std::time::Duration;

use leasehold_sink::{OpenOutcome, SinkError, WriteOutcome};
use leasehold_telemetry::{GapReason, LossReason, SkipReason, TelemetryEvent};
use tokio::time::Instant;

use super::*;
use crate::upstream::{UpstreamError, UpstreamEvent};

/// A script: the machine, its clock, and what it asked for so far.
struct Script {
    machine: StreamMachine,
    now: Instant,
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
        Script { machine, now }
    }

    /// Every action asked for until the machine waits, telemetry apart.
    fn actions(&mut self) -> Vec<Action> {
        std::iter::from_fn(|| self.machine.poll_action())
            .filter(|a| !matches!(a, Action::Emit(_)))
            .collect()
    }

    /// Every action, telemetry included.
    fn all_actions(&mut self) -> Vec<Action> {
        std::iter::from_fn(|| self.machine.poll_action()).collect()
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
        event_id: format!("s:{seq}"),
        payload: format!("{{\"seq\":{seq}}}").into(),
        received_at: at,
        arrival_lag: None,
    }
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
    let mut s = Script { machine, now };
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
