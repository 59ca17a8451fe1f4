//! A planned reconnect without a gap (`UPSTREAM_MAX_CONNECTION_AGE_MS`),
//! without I/O: before a connection reaches its age a new one subscribes
//! the same stream, and both run until the new one is known to continue
//! what the old one delivered. Then the old one is closed and the new one's
//! frames past that point are handed on, each once, in order.
//!
//! The new connection has met the old when it delivers a sequence the old
//! one already delivered (it is behind or level: everything after is new),
//! or when the old one catches up with the first frame the new one holds
//! (it started ahead: its held frames continue the old ones). Until then the
//! old connection's frames are handed on and the new one's held. A book
//! sent in the stream after the new subscribe is dropped: the old
//! connection's diffs already built the book the new diffs continue.
//!
//! This needs a sequence that is the stream's on every connection; a
//! stream numbered by the worker (`UPSTREAM_SEQ_POINTER=none`,
//! `UPSTREAM_SEQ_SCOPE=connection`) cannot be matched, and the settings
//! refuse the age for it.

use std::collections::VecDeque;

use super::UpstreamEvent;

/// The new connection's frames held at most while the old one catches up
/// (a new connection that stays ahead that long is not meeting the old one:
/// it is switched to as it is, and the stream's resume mode judges the hole).
pub const HELD_MAX: usize = 10_000;

/// One planned reconnect, from the new connection's subscribe to the switch.
#[derive(Debug)]
pub struct Handover {
    /// The last sequence handed on (from the old connection, or before).
    delivered: Option<u64>,
    /// The new connection's frames past `delivered`, in arrival order.
    held: VecDeque<UpstreamEvent>,
    /// The new connection delivered a sequence at or below `delivered`.
    met: bool,
}

impl Handover {
    /// A handover after `delivered` (the last sequence handed on so far).
    pub fn new(delivered: Option<u64>) -> Self {
        Handover {
            delivered,
            held: VecDeque::new(),
            met: false,
        }
    }

    /// A frame of the old connection: handed on as it is.
    pub fn from_old(&mut self, event: UpstreamEvent) -> UpstreamEvent {
        self.delivered = self.delivered.max(Some(event.seq));
        event
    }

    /// A frame of the new connection: held until the switch.
    pub fn from_new(&mut self, event: UpstreamEvent) {
        if event.snapshot {
            return;
        }
        if self
            .delivered
            .is_some_and(|delivered| event.seq <= delivered)
        {
            self.met = true;
            return;
        }
        self.held.push_back(event);
    }

    /// Whether the new connection continues what was handed on: the old
    /// one can be closed.
    pub fn met(&self) -> bool {
        if self.met {
            return true;
        }
        match (self.held.front(), self.delivered) {
            (Some(front), Some(delivered)) => {
                front.first_seq.unwrap_or(front.seq) <= delivered.saturating_add(1)
            }
            _ => false,
        }
    }

    /// The new connection has held as much as it may.
    pub fn full(&self) -> bool {
        self.held.len() >= HELD_MAX
    }

    /// The switch: the new connection's held frames that were not handed on
    /// yet, in order.
    pub fn switch(self) -> VecDeque<UpstreamEvent> {
        let mut held = self.held;
        if let Some(delivered) = self.delivered {
            held.retain(|event| event.seq > delivered);
        }
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: u64) -> UpstreamEvent {
        UpstreamEvent {
            seq,
            first_seq: None,
            event_id: seq.to_string(),
            payload: format!("{{\"seq\":{seq}}}").into(),
            snapshot: false,
            received_at: tokio::time::Instant::now(),
            arrival_lag: None,
        }
    }

    fn seqs(events: VecDeque<UpstreamEvent>) -> Vec<u64> {
        events.into_iter().map(|e| e.seq).collect()
    }

    #[test]
    fn a_new_connection_behind_the_old_meets_it_at_its_first_repeat() {
        let mut handover = Handover::new(Some(10));
        assert_eq!(handover.from_old(event(11)).seq, 11);
        assert!(!handover.met());
        // The new connection starts at 11: already handed on.
        handover.from_new(event(11));
        assert!(handover.met());
        assert_eq!(handover.from_old(event(12)).seq, 12);
        handover.from_new(event(12));
        handover.from_new(event(13));
        // Only what the old one did not deliver is left to hand on.
        assert_eq!(seqs(handover.switch()), [13]);
    }

    #[test]
    fn a_new_connection_ahead_of_the_old_waits_for_it_to_catch_up() {
        let mut handover = Handover::new(Some(10));
        // The new connection's first frame is 13: 11 and 12 are on the way
        // on the old one.
        handover.from_new(event(13));
        handover.from_new(event(14));
        assert!(!handover.met(), "11 and 12 would be lost");
        handover.from_old(event(11));
        assert!(!handover.met());
        handover.from_old(event(12));
        assert!(handover.met());
        // The old one may deliver past the first held before the switch.
        handover.from_old(event(13));
        assert_eq!(seqs(handover.switch()), [14]);
    }

    #[test]
    fn a_range_that_reaches_back_over_what_was_delivered_continues_it() {
        let mut handover = Handover::new(Some(100));
        // A depth diff covering 98..=105 continues a stream at 100.
        handover.from_new(UpstreamEvent {
            first_seq: Some(98),
            ..event(105)
        });
        assert!(handover.met());
        assert_eq!(seqs(handover.switch()), [105]);
    }

    #[test]
    fn the_new_connections_book_is_dropped_the_old_diffs_built_it() {
        let mut handover = Handover::new(Some(10));
        handover.from_new(UpstreamEvent {
            snapshot: true,
            ..event(20)
        });
        assert!(!handover.met());
        handover.from_new(event(11));
        assert!(handover.met());
        assert_eq!(seqs(handover.switch()), [11]);
    }

    #[test]
    fn nothing_handed_on_yet_meets_nothing() {
        let mut handover = Handover::new(None);
        handover.from_new(event(5));
        assert!(!handover.met());
        handover.from_old(event(4));
        assert!(handover.met());
        assert_eq!(seqs(handover.switch()), [5]);
    }
}
