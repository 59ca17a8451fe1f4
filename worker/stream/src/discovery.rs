//! When a stream worker looks for streams, and how it takes what it is
//! offered, without I/O: [`Discovery`] is driven like the stream machine
//! (`handle`, `poll_action`, `poll_timeout`, `handle_timeout`, `now` passed
//! in), and is the one place that knows the discovery mode. The worker
//! carries out its actions (a table scan, the assignee query, a doorbell
//! read or ring, an acquire) and reports back; it never asks which mode it
//! runs in.
//!
//! The two modes differ here and only here:
//! - **scan**: every worker scans; releases ring the doorbell
//!   (`leasehold#handoff`), which peers read every `handoff_poll` and rescan
//!   when it moved; a push or a probe is checked against this worker's
//!   fair share.
//! - **assigned**: the assigner's pass and the assignee query replace the
//!   scan; no doorbell is read or rung for a release (pushes and the
//!   assigner's next pass find released streams); a push or a probe is
//!   taken when the re-read record advises it here; a drain first chooses
//!   each held stream's successor.

use std::collections::VecDeque;
use std::time::Duration;

use leasehold_control::store::Consistency;
use tokio::time::Instant;

use crate::probes::Probe;

/// How a worker finds streams (`DISCOVERY_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DiscoveryMode {
    /// Every worker scans the table and balances by itself.
    #[default]
    Scan,
    /// The elected assigner scans and advises; workers query their own.
    Assigned,
}

impl DiscoveryMode {
    /// The value of `DISCOVERY_MODE`.
    pub fn as_str(self) -> &'static str {
        match self {
            DiscoveryMode::Scan => "scan",
            DiscoveryMode::Assigned => "assigned",
        }
    }

    /// Parses a `DISCOVERY_MODE` value.
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "scan" => Some(DiscoveryMode::Scan),
            "assigned" => Some(DiscoveryMode::Assigned),
            _ => None,
        }
    }
}

impl std::str::FromStr for DiscoveryMode {
    type Err = String;

    /// `DISCOVERY_MODE` (also `leasehold dev --discovery-mode`).
    fn from_str(raw: &str) -> Result<Self, String> {
        DiscoveryMode::parse(raw).ok_or_else(|| "must be scan or assigned".into())
    }
}

/// What the worker tells its discovery.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// The doorbell read `value` (its fence token; 0 when unreadable).
    DoorbellRead(u64),
    /// A pass ([`Action::Scan`] or [`Action::FollowAssignments`]) ended.
    PassDone {
        /// Whether it read what it needed (a failed pass is retried at the
        /// next interval, still asked for).
        succeeded: bool,
        /// The interval's random factor (0.8–1.2), so workers started
        /// together do not scan in lockstep.
        jitter: f64,
        /// When the assigner must plan again before the interval (a
        /// worker's presence lapses first), if it must.
        due: Option<Instant>,
    },
    /// A held stream ended.
    StreamEnded(Ended),
    /// Peers pushed these streams to this worker.
    Pushed(Vec<String>),
    /// An expiry probe fell due.
    ProbeDue(Probe),
    /// The worker drains: no more passes.
    Drain,
}

/// How a held stream ended, as far as discovery cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Released, with a successor chosen (pushed to it).
    HandedOn,
    /// Released with no successor chosen.
    Released,
    /// The sink refused it: peers may reach the sink where this worker
    /// cannot.
    SinkGaveUp,
    /// Lost, or its release failed.
    Other,
}

/// What the worker must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Read the doorbell; report [`Input::DoorbellRead`].
    ReadDoorbell,
    /// Bump the doorbell: peers rescan.
    RingDoorbell,
    /// Scan the table and take up to the fair share; report
    /// [`Input::PassDone`].
    Scan(Consistency),
    /// Serve as the assigner if this worker may, then follow the assignee
    /// index; report [`Input::PassDone`].
    FollowAssignments,
    /// Acquire these pushed streams where they are known and there is room.
    AcquireIfRoom(Vec<String>),
    /// Take these streams if their re-read records advise them here.
    TakeAdvised {
        /// The streams.
        streams: Vec<String>,
        /// Pushed (a datagram) rather than found by this worker's query.
        pushed: bool,
    },
    /// Try the probe's stream if this worker is below its share.
    ProbeShare(Probe),
    /// Before the drain: choose each held stream's successor.
    ChooseSuccessors,
}

/// Discovery's timing and mode, without I/O.
#[derive(Debug)]
pub struct Discovery {
    mode: DiscoveryMode,
    interval: Duration,
    poll: Duration,
    next_pass: Option<Instant>,
    /// Whether the next pass was asked for (start, doorbell, a stream that
    /// ended) rather than due: those read strongly consistent.
    asked_for: bool,
    next_doorbell_read: Option<Instant>,
    /// The doorbell's value at the last read (`None` before the first).
    doorbell: Option<u64>,
    actions: VecDeque<Action>,
}

impl Discovery {
    /// A worker's discovery, starting at `now`: in scan mode it announces
    /// itself by ringing the doorbell and reads its value; the first pass
    /// comes one `poll` later (peers started together count each other).
    pub fn new(mode: DiscoveryMode, interval: Duration, poll: Duration, now: Instant) -> Self {
        let mut discovery = Discovery {
            mode,
            interval,
            poll,
            next_pass: Some(now + poll),
            asked_for: true,
            next_doorbell_read: None,
            doorbell: None,
            actions: VecDeque::new(),
        };
        if mode == DiscoveryMode::Scan {
            discovery.actions.push_back(Action::RingDoorbell);
            discovery.actions.push_back(Action::ReadDoorbell);
        }
        discovery
    }

    /// Takes one input.
    pub fn handle(&mut self, input: Input, now: Instant) {
        let scans = self.mode == DiscoveryMode::Scan;
        match input {
            Input::DoorbellRead(value) => {
                self.next_doorbell_read = scans.then(|| now + self.poll);
                if self.doorbell.is_some_and(|seen| seen != value) {
                    self.ask_now(now);
                }
                self.doorbell = Some(value);
            }
            Input::PassDone {
                succeeded,
                jitter,
                due,
            } => {
                if succeeded {
                    self.asked_for = false;
                }
                let next = now + self.interval.mul_f64(jitter);
                self.next_pass = Some(due.map_or(next, |due| next.min(due)));
            }
            Input::StreamEnded(ended) => {
                // A lost stream may be free again soon: look without
                // waiting a full interval.
                self.next_pass = self.next_pass.map(|at| at.min(now + self.poll));
                self.asked_for = true;
                let rings = match ended {
                    Ended::Released => scans,
                    Ended::SinkGaveUp => true,
                    Ended::HandedOn | Ended::Other => false,
                };
                if rings {
                    self.actions.push_back(Action::RingDoorbell);
                }
            }
            Input::Pushed(streams) => self.actions.push_back(if scans {
                Action::AcquireIfRoom(streams)
            } else {
                Action::TakeAdvised {
                    streams,
                    pushed: true,
                }
            }),
            Input::ProbeDue(probe) => self.actions.push_back(if scans {
                Action::ProbeShare(probe)
            } else {
                Action::TakeAdvised {
                    streams: vec![probe.stream],
                    pushed: false,
                }
            }),
            Input::Drain => {
                self.next_pass = None;
                self.next_doorbell_read = None;
                if !scans {
                    self.actions.push_back(Action::ChooseSuccessors);
                }
            }
        }
    }

    fn ask_now(&mut self, now: Instant) {
        if self.next_pass.is_some() {
            self.next_pass = Some(now);
        }
        self.asked_for = true;
    }

    /// The next thing to do, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When [`Discovery::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (self.next_pass, self.next_doorbell_read) {
            (Some(pass), Some(read)) => Some(pass.min(read)),
            (pass, read) => pass.or(read),
        }
    }

    /// Time passed: a pass or a doorbell read may be due. A pass is not
    /// due again until its [`Input::PassDone`].
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.next_doorbell_read.is_some_and(|at| at <= now) {
            self.next_doorbell_read = None;
            self.actions.push_back(Action::ReadDoorbell);
        }
        if self.next_pass.is_some_and(|at| at <= now) {
            self.next_pass = None;
            self.actions.push_back(match self.mode {
                DiscoveryMode::Scan => Action::Scan(if self.asked_for {
                    Consistency::Strong
                } else {
                    Consistency::Eventual
                }),
                DiscoveryMode::Assigned => Action::FollowAssignments,
            });
        }
    }
}

#[cfg(test)]
mod tests;
