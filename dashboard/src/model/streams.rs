//! Streams as the dashboard shows them: a lease record plus what the owner's
//! sidecar says about lag, classified into a state badge and a Burrow-style
//! verdict.
//!
//! Burrow's lesson is that a lag number alone does not tell on-call whether
//! something is wrong: a consumer far behind but catching up is fine, one with
//! a small lag that never moves is not. So the verdict looks at a window of
//! samples per stream (checkpoint and lag over time), not at one reading.

use std::collections::{HashMap, VecDeque};

use leasehold_control::lease::{Lease, LeaseState};
use leasehold_control::schema::MalformedItem;
use serde::Serialize;

use crate::model::gaps::GapTally;

/// Longest stream id the dashboard looks up or keeps anything for (the
/// per-stream page answers 404 without a lookup beyond it).
pub const MAX_STREAM_ID_LEN: usize = 1_024;

/// State badge of one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamState {
    /// Held, and the last renew is on time.
    Owned,
    /// Held, but a renew is overdue: the lease runs out soon unless renewed.
    Expiring,
    /// The owner's lease ran out; anyone may take it over.
    Expired,
    /// Nobody holds it (never acquired, or released).
    Unowned,
    /// The record cannot be read; see `problem`.
    Malformed,
}

impl StreamState {
    /// Every state, in badge order (filters list them so).
    pub const ALL: [StreamState; 5] = [
        StreamState::Owned,
        StreamState::Expiring,
        StreamState::Expired,
        StreamState::Unowned,
        StreamState::Malformed,
    ];

    /// The label in JSON, CSS classes and the `state` filter.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamState::Owned => "owned",
            StreamState::Expiring => "expiring",
            StreamState::Expired => "expired",
            StreamState::Unowned => "unowned",
            StreamState::Malformed => "malformed",
        }
    }

    /// Parses a filter value.
    pub fn parse(label: &str) -> Option<StreamState> {
        StreamState::ALL.into_iter().find(|s| s.as_str() == label)
    }
}

/// Burrow-style evaluation of a stream's progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Caught up, or catching up.
    Ok,
    /// The checkpoint moves, but the lag grew over the whole window.
    Lagging,
    /// Behind, and the checkpoint has not moved over the whole window.
    Stalled,
    /// No checkpoint for longer than the stop window, while behind or unknown.
    Stopped,
    /// Not enough to judge (malformed record).
    Unknown,
    /// Data was lost (a gap recorded) within the loss window: whatever the
    /// lag says, downstream is missing events.
    LostData,
    /// Nobody holds it now: no worker reads it, whatever the lag said last.
    Unowned,
}

impl Verdict {
    /// The label in JSON and CSS classes.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Lagging => "lagging",
            Verdict::Stalled => "stalled",
            Verdict::Stopped => "stopped",
            Verdict::Unknown => "unknown",
            Verdict::LostData => "lost_data",
            Verdict::Unowned => "unowned",
        }
    }
}

/// One row of the streams view and of `/api/streams`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StreamRow {
    /// Stream id (untrusted text: anyone with table write access chooses it).
    pub stream_id: String,
    /// Current holder, if any.
    pub owner_id: Option<String>,
    /// Fence token of the current (or last) holder.
    pub fence_token: u64,
    /// State badge.
    pub state: StreamState,
    /// Lease expiry, unix ms (0 when unowned).
    pub lease_expires_at_ms: i64,
    /// Last sink-confirmed sequence.
    pub checkpoint: Option<u64>,
    /// When the checkpoint last moved, unix ms (if the writer records it).
    pub checkpoint_at_ms: Option<i64>,
    /// Events received but not yet persisted, from the owner's sidecar.
    pub lag_events: Option<u64>,
    /// Age of the oldest unpersisted event, from the owner's sidecar.
    pub lag_seconds: Option<f64>,
    /// Seconds since the owner last received an event for it (a silent upstream).
    pub last_event_age_seconds: Option<f64>,
    /// Last ownership change (acquire or release), unix ms.
    pub last_change_at_ms: Option<i64>,
    /// The holder before the current one.
    pub previous_owner: Option<String>,
    /// Progress evaluation over the verdict window.
    pub verdict: Verdict,
    /// Why a malformed record cannot be read (attribute and problem, never a value).
    pub problem: Option<String>,
    /// Data gaps the sidecars reported for it (count, missing events, the
    /// newest, per reason); null when none is recorded.
    pub gaps: Option<GapTally>,
    /// The owner's upstream connection carrying it (its number on the
    /// connections view), as the owner's sidecar says.
    pub upstream_connection: Option<u64>,
}

/// Lag numbers for one stream, as a sidecar reported them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lag {
    /// Events behind.
    pub events: u64,
    /// Seconds behind.
    pub seconds: f64,
    /// Seconds since the last event arrived, when the sidecar reports it.
    pub last_event_age: Option<f64>,
}

/// Thresholds of the classification.
#[derive(Debug, Clone, Copy)]
pub struct Thresholds {
    /// A renew is overdue (badge `expiring`) when less than this share of the
    /// lease is left; with the keeper renewing every third of a lease, the
    /// remaining share normally stays above two thirds.
    pub expiring_share: f64,
    /// Used when a record does not tell its lease length (no `updated_at`).
    pub expiring_fallback_ms: i64,
    /// Verdict window: how far back samples count.
    pub window_ms: i64,
    /// No checkpoint movement for this long makes a stream `stopped`.
    pub stopped_after_ms: i64,
    /// A gap recorded this recently makes a stream `lost_data` (the data-gap
    /// alert's window).
    pub loss_window_ms: i64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            expiring_share: 0.4,
            expiring_fallback_ms: 10_000,
            window_ms: 60_000,
            stopped_after_ms: 300_000,
            loss_window_ms: 600_000,
        }
    }
}

/// The verdict once losses are known: a stream that lost data in the loss
/// window is `lost_data`, one nobody holds is `unowned`, so neither is ever
/// `ok` (only `stopped`, the worse news, stays as it is).
pub fn with_losses(row: &StreamRow, now_ms: i64, thresholds: &Thresholds) -> Verdict {
    let lost = row
        .gaps
        .as_ref()
        .is_some_and(|gaps| now_ms - gaps.last.at_ms <= thresholds.loss_window_ms);
    let unheld = matches!(row.state, StreamState::Unowned | StreamState::Expired);
    match row.verdict {
        Verdict::Stopped => Verdict::Stopped,
        _ if lost => Verdict::LostData,
        _ if unheld => Verdict::Unowned,
        verdict => verdict,
    }
}

/// Classifies a readable lease at `now_ms`.
pub fn state_of(lease: &Lease, now_ms: i64, thresholds: &Thresholds) -> StreamState {
    match lease.state(now_ms) {
        LeaseState::Unowned => StreamState::Unowned,
        LeaseState::Expired => StreamState::Expired,
        LeaseState::Owned => {
            let left = lease.lease_expires_at - now_ms;
            let limit = match lease.updated_at {
                Some(written) if lease.lease_expires_at > written => {
                    ((lease.lease_expires_at - written) as f64 * thresholds.expiring_share) as i64
                }
                _ => thresholds.expiring_fallback_ms,
            };
            if left < limit {
                StreamState::Expiring
            } else {
                StreamState::Owned
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    at_ms: i64,
    checkpoint: Option<u64>,
    lag_events: Option<u64>,
}

/// Per-stream samples over the verdict window, kept between refreshes.
#[derive(Debug, Default)]
pub struct LagHistory {
    samples: HashMap<String, VecDeque<Sample>>,
    /// When each stream's last event arrived (unix ms), as last reported:
    /// while no owner reports (crashed, paused, being taken over) its age
    /// keeps growing from there instead of vanishing.
    last_event_at: HashMap<String, i64>,
}

impl LagHistory {
    /// Builds the row for a readable lease, records its sample and judges it.
    pub fn row(
        &mut self,
        lease: &Lease,
        lag: Option<Lag>,
        now_ms: i64,
        thresholds: &Thresholds,
    ) -> StreamRow {
        let state = state_of(lease, now_ms, thresholds);
        // A session-mode stream's table checkpoint moves only every
        // CHECKPOINT_INTERVAL_MS (5 minutes by default): it says nothing about
        // a minute's progress, so its verdict rests on the lag alone (which
        // its worker measures to the sink's confirmation).
        let table_checkpoint_is_timely = lease.session_token.is_none();
        let samples = self.samples.entry(lease.stream_id.clone()).or_default();
        samples.push_back(Sample {
            at_ms: now_ms,
            checkpoint: lease.checkpoint.filter(|_| table_checkpoint_is_timely),
            lag_events: lag.map(|l| l.events),
        });
        while samples
            .front()
            .is_some_and(|s| now_ms - s.at_ms > thresholds.window_ms)
        {
            samples.pop_front();
        }
        let last_progress = lease
            .checkpoint_at
            .or(lease.acquired_at)
            .or(lease.updated_at)
            .filter(|_| table_checkpoint_is_timely);
        let verdict = judge(samples, last_progress, now_ms, thresholds);
        let last_change_at_ms = match (lease.acquired_at, lease.released_at) {
            (Some(a), Some(r)) => Some(a.max(r)),
            (a, r) => a.or(r),
        };
        StreamRow {
            stream_id: lease.stream_id.clone(),
            owner_id: lease.owner_id.clone(),
            fence_token: lease.fence_token,
            state,
            lease_expires_at_ms: lease.lease_expires_at,
            checkpoint: lease.checkpoint,
            checkpoint_at_ms: lease.checkpoint_at,
            lag_events: lag.map(|l| l.events),
            lag_seconds: lag.map(|l| l.seconds),
            last_event_age_seconds: self.last_event_age(&lease.stream_id, lag, now_ms),
            last_change_at_ms,
            previous_owner: lease
                .previous_owner
                .clone()
                .filter(|owner| !owner.is_empty()),
            verdict,
            problem: None,
            gaps: None,
            upstream_connection: None,
        }
    }

    /// Forgets streams that are no longer in the table.
    pub fn retain(&mut self, alive: impl Fn(&str) -> bool) {
        self.samples.retain(|stream, _| alive(stream));
        self.last_event_at.retain(|stream, _| alive(stream));
    }

    /// The owner's figure when it reports one, else the age of the last event
    /// any owner reported.
    fn last_event_age(&mut self, stream_id: &str, lag: Option<Lag>, now_ms: i64) -> Option<f64> {
        match lag.and_then(|l| l.last_event_age) {
            Some(age) => {
                let at = now_ms - (age * 1_000.0) as i64;
                match self.last_event_at.get_mut(stream_id) {
                    Some(known) => *known = at,
                    None => {
                        self.last_event_at.insert(stream_id.to_owned(), at);
                    }
                }
                Some(age)
            }
            None => self
                .last_event_at
                .get(stream_id)
                .map(|at| (now_ms - at).max(0) as f64 / 1_000.0),
        }
    }
}

impl StreamRow {
    /// A row that knows only its id (no owner, no progress, verdict ok): what
    /// the malformed row and tests fill in, so a new column is added once.
    pub fn unowned(stream_id: impl Into<String>) -> StreamRow {
        StreamRow {
            stream_id: stream_id.into(),
            owner_id: None,
            fence_token: 0,
            state: StreamState::Unowned,
            lease_expires_at_ms: 0,
            checkpoint: None,
            checkpoint_at_ms: None,
            lag_events: None,
            lag_seconds: None,
            last_event_age_seconds: None,
            last_change_at_ms: None,
            previous_owner: None,
            verdict: Verdict::Ok,
            problem: None,
            gaps: None,
            upstream_connection: None,
        }
    }
}

/// The row for a record that cannot be decoded: visible, never fatal.
pub fn malformed_row(item: &MalformedItem) -> StreamRow {
    StreamRow {
        state: StreamState::Malformed,
        verdict: Verdict::Unknown,
        problem: Some(format!("{}: {}", item.attribute, item.problem)),
        ..StreamRow::unowned(item.stream_id.clone())
    }
}

fn judge(
    samples: &VecDeque<Sample>,
    last_progress_ms: Option<i64>,
    now_ms: i64,
    thresholds: &Thresholds,
) -> Verdict {
    let Some(last) = samples.back() else {
        return Verdict::Unknown;
    };
    let caught_up = last.lag_events == Some(0);
    if caught_up {
        return Verdict::Ok;
    }
    if let Some(progress) = last_progress_ms
        && now_ms - progress > thresholds.stopped_after_ms
    {
        return Verdict::Stopped;
    }
    let Some(first) = samples.front() else {
        return Verdict::Ok;
    };
    // A verdict needs a window's worth of samples, not two readings a second apart.
    if samples.len() < 3 || last.at_ms - first.at_ms < thresholds.window_ms / 2 {
        return Verdict::Ok;
    }
    let lags: Vec<u64> = samples.iter().filter_map(|s| s.lag_events).collect();
    let lag_not_shrinking = lags.len() >= 2 && lags.windows(2).all(|w| w[1] >= w[0]);
    let lag_grew = lag_not_shrinking && lags.last() > lags.first();
    if last.checkpoint.is_some() && last.checkpoint == first.checkpoint {
        if lag_not_shrinking && lags.last().is_some_and(|l| *l > 0) {
            return Verdict::Stalled;
        }
        return Verdict::Ok;
    }
    if lag_grew {
        return Verdict::Lagging;
    }
    Verdict::Ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(owner: Option<&str>, expires: i64, updated: i64) -> Lease {
        let mut lease = Lease::unowned("s");
        lease.owner_id = owner.map(str::to_owned);
        lease.lease_expires_at = expires;
        lease.updated_at = Some(updated);
        lease.fence_token = 3;
        lease
    }

    #[test]
    fn badges_follow_owner_expiry_and_overdue_renewals() {
        let t = Thresholds::default();
        // 30 s lease renewed at 0: owned until 40 % (12 s) is left.
        let held = lease(Some("w1"), 30_000, 0);
        assert_eq!(state_of(&held, 10_000, &t), StreamState::Owned);
        assert_eq!(state_of(&held, 19_000, &t), StreamState::Expiring);
        assert_eq!(state_of(&held, 30_000, &t), StreamState::Expiring);
        assert_eq!(state_of(&held, 30_001, &t), StreamState::Expired);
        assert_eq!(state_of(&lease(None, 0, 0), 5, &t), StreamState::Unowned);
    }

    fn judge_series(points: &[(i64, u64, Option<u64>)]) -> Verdict {
        let t = Thresholds {
            window_ms: 60_000,
            stopped_after_ms: 300_000,
            ..Thresholds::default()
        };
        let mut history = LagHistory::default();
        let mut verdict = Verdict::Unknown;
        for (at, checkpoint, lag) in points {
            let mut record = lease(Some("w1"), at + 30_000, *at);
            record.checkpoint = Some(*checkpoint);
            record.checkpoint_at = Some(*at);
            let lag = lag.map(|events| Lag {
                events,
                seconds: 1.0,
                last_event_age: None,
            });
            verdict = history.row(&record, lag, *at, &t).verdict;
        }
        verdict
    }

    #[test]
    fn a_session_streams_verdict_rests_on_its_lag_not_the_table_checkpoint() {
        let t = Thresholds {
            window_ms: 60_000,
            stopped_after_ms: 300_000,
            ..Thresholds::default()
        };
        // Steady flow, a small constant lag, the table checkpoint written
        // 6 minutes ago (session mode writes it every 5).
        let judge = |session_token: Option<u64>| {
            let mut history = LagHistory::default();
            let mut verdict = Verdict::Unknown;
            for at in [400_000, 420_000, 440_000] {
                let mut record = lease(Some("w1"), at + 30_000, at);
                record.checkpoint = Some(10);
                record.checkpoint_at = Some(80_000);
                record.session_token = session_token;
                let lag = Some(Lag {
                    events: 2,
                    seconds: 0.2,
                    last_event_age: None,
                });
                verdict = history.row(&record, lag, at, &t).verdict;
            }
            verdict
        };
        assert_eq!(judge(Some(1)), Verdict::Ok);
        assert_eq!(judge(None), Verdict::Stopped, "per-stream: it would be");
    }

    /// After a crash the owner's sidecar reports nothing for the stream: its
    /// last-event age keeps growing from the last report instead of vanishing
    /// (the cluster's "largest last-event age" must rise during a takeover).
    #[test]
    fn a_stream_nobody_reports_ages_from_its_last_reported_event() {
        let t = Thresholds::default();
        let now = 1_000_000;
        let mut history = LagHistory::default();
        let record = lease(Some("w1"), now + 30_000, now);
        let reported = Some(Lag {
            events: 0,
            seconds: 0.0,
            last_event_age: Some(0.5),
        });
        let row = history.row(&record, reported, now, &t);
        assert_eq!(row.last_event_age_seconds, Some(0.5));
        let row = history.row(&record, None, now + 7_000, &t);
        assert_eq!(row.last_event_age_seconds, Some(7.5));
        // A new owner reports again: its figure wins.
        let row = history.row(&record, reported, now + 9_000, &t);
        assert_eq!(row.last_event_age_seconds, Some(0.5));
        // A stream never reported has no age.
        let other = Lease::unowned("never");
        assert_eq!(
            history.row(&other, None, now, &t).last_event_age_seconds,
            None
        );
    }

    #[test]
    fn a_stream_that_lost_data_or_has_no_owner_is_never_ok() {
        use crate::model::gaps::{GapTally, LastGap};
        use leasehold_telemetry::GapReason;
        let t = Thresholds::default();
        let now = 1_000_000;
        let mut history = LagHistory::default();
        let lag = Some(Lag {
            events: 0,
            seconds: 0.0,
            last_event_age: None,
        });
        let mut row = history.row(&lease(Some("w1"), now + 30_000, now), lag, now, &t);
        assert_eq!(row.verdict, Verdict::Ok);
        assert_eq!(with_losses(&row, now, &t), Verdict::Ok);
        let gap_at = |at_ms| GapTally {
            count: 1,
            missing: 12,
            last: LastGap {
                at_ms,
                from_seq: 5,
                to_seq: 16,
                missing: 12,
                reason: GapReason::NoReplay,
            },
            reasons: [0; GapReason::RECORDED.len()],
        };
        row.gaps = Some(gap_at(now - 60_000));
        assert_eq!(with_losses(&row, now, &t), Verdict::LostData);
        row.gaps = Some(gap_at(now - t.loss_window_ms - 1));
        assert_eq!(
            with_losses(&row, now, &t),
            Verdict::Ok,
            "an old gap is history"
        );
        row.gaps = None;
        row.state = StreamState::Unowned;
        assert_eq!(with_losses(&row, now, &t), Verdict::Unowned);
        row.state = StreamState::Expired;
        assert_eq!(with_losses(&row, now, &t), Verdict::Unowned);
        row.verdict = Verdict::Stopped;
        assert_eq!(
            with_losses(&row, now, &t),
            Verdict::Stopped,
            "the worse news stays"
        );
    }

    #[test]
    fn verdicts_follow_burrow_rules() {
        // Catching up: lag shrinks while the checkpoint moves.
        assert_eq!(
            judge_series(&[
                (0, 10, Some(50)),
                (20_000, 40, Some(30)),
                (40_000, 70, Some(10))
            ]),
            Verdict::Ok
        );
        // Checkpoint moves but lag keeps growing.
        assert_eq!(
            judge_series(&[
                (0, 10, Some(5)),
                (20_000, 20, Some(30)),
                (40_000, 30, Some(60))
            ]),
            Verdict::Lagging
        );
        // Behind and not moving at all.
        assert_eq!(
            judge_series(&[
                (0, 10, Some(5)),
                (20_000, 10, Some(5)),
                (40_000, 10, Some(9))
            ]),
            Verdict::Stalled
        );
        // Quiet upstream: nothing to do, the checkpoint may stand still.
        assert_eq!(
            judge_series(&[
                (0, 10, Some(0)),
                (20_000, 10, Some(0)),
                (40_000, 10, Some(0))
            ]),
            Verdict::Ok
        );
        // Two quick readings are not a window.
        assert_eq!(
            judge_series(&[(0, 10, Some(5)), (1_000, 10, Some(6))]),
            Verdict::Ok
        );
    }

    #[test]
    fn no_checkpoint_for_the_stop_window_is_stopped() {
        let t = Thresholds::default();
        let mut history = LagHistory::default();
        let mut record = lease(None, 0, 0);
        record.checkpoint = Some(5);
        record.checkpoint_at = Some(1_000);
        let row = history.row(&record, None, 1_000 + t.stopped_after_ms + 1, &t);
        assert_eq!(row.verdict, Verdict::Stopped);
        // Caught up beats stopped: a quiet stream is fine.
        let row = history.row(
            &record,
            Some(Lag {
                events: 0,
                seconds: 0.0,
                last_event_age: None,
            }),
            1_000 + t.stopped_after_ms + 2,
            &t,
        );
        assert_eq!(row.verdict, Verdict::Ok);
    }

    #[test]
    fn malformed_records_say_why_without_values() {
        let row = malformed_row(&MalformedItem {
            stream_id: "bad".into(),
            attribute: "fence_token".into(),
            problem: "expected a number".into(),
        });
        assert_eq!(row.state, StreamState::Malformed);
        assert_eq!(
            row.problem.as_deref(),
            Some("fence_token: expected a number")
        );
    }
}
