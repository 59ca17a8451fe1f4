//! The ownership-change timeline, kept by the dashboard from what it observes.
//!
//! The lease table only holds the present (plus one step of history in
//! `previous_owner` / `previous_expires_at`), so the dashboard compares each
//! scan with the previous one and records what changed. A change that happened
//! and was undone between two scans shows as one step with `missed` > 0: the
//! fence token says how many acquisitions there were.
//!
//! The history is bounded twice: by count (`capacity`, newest kept) and by
//! age (`max_age_ms`, 24 h by default). Whichever bound is hit first decides
//! how far back the timeline goes; [`ChangeLog::oldest_ms`] says where that is,
//! and the timeline page prints it. Fenced writes (a zombie's write refused
//! because a newer token exists) are kept under the same bounds.

use std::collections::{HashMap, VecDeque};

use leasehold_control::lease::Lease;
use serde::Serialize;

/// What kind of ownership change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// A stream nobody had held got its first owner.
    Acquired,
    /// An expired lease was taken over (a crash or a frozen owner).
    Takeover,
    /// A released lease was acquired again (a graceful hand-off).
    Handoff,
    /// The owner gave the lease back (drain).
    Released,
}

impl ChangeKind {
    /// The label in JSON and CSS classes.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Acquired => "acquired",
            ChangeKind::Takeover => "takeover",
            ChangeKind::Handoff => "handoff",
            ChangeKind::Released => "released",
        }
    }
}

/// One entry of the timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    /// When it happened (from the record when it says, else when observed), unix ms.
    pub at_ms: i64,
    /// Stream concerned.
    pub stream_id: String,
    /// What happened.
    pub kind: ChangeKind,
    /// Holder before.
    pub old_owner: Option<String>,
    /// Holder after (none for a release).
    pub new_owner: Option<String>,
    /// Fence token after the change.
    pub fence_token: u64,
    /// Time the stream had no valid owner before this acquire, seconds.
    pub gap_seconds: Option<f64>,
    /// Acquisitions between two scans that were not seen one by one.
    pub missed: u64,
}

/// What the log last saw of a stream: owner, token, and the record's version.
#[derive(Debug, Clone)]
struct Seen {
    owner: Option<String>,
    token: u64,
    version: Version,
}

/// How far along a record is: every acquire raises the token, every other
/// write moves `updated_at`. The scan reads eventually consistent, so a replica
/// may answer with an older version than the previous scan saw; that is not a
/// change, and the log keeps what it had.
type Version = (u64, i64);

fn version(lease: &Lease) -> Version {
    (lease.fence_token, lease.updated_at.unwrap_or(0))
}

/// Fenced writes one worker's sidecar reported between two scans: the sink
/// refused them because a newer fence token existed (a zombie after a pause).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FencedWrite {
    /// When the dashboard saw the counter move, unix ms.
    pub at_ms: i64,
    /// The worker whose writes were refused (untrusted text).
    pub owner_id: String,
    /// How many writes were refused since the previous reading.
    pub writes: u64,
    /// Streams that worker lost most recently (where the refused writes
    /// most likely went; the sidecar counts per worker, not per stream).
    pub streams: Vec<String>,
}

/// Default age bound of the history: 24 hours.
pub const DEFAULT_MAX_AGE_MS: i64 = 24 * 3_600 * 1_000;

/// How many recently lost streams a fenced write is attributed to.
const FENCED_STREAMS: usize = 20;

/// The timeline and the last observation it compares against.
#[derive(Debug)]
pub struct ChangeLog {
    capacity: usize,
    max_age_ms: i64,
    entries: VecDeque<Change>,
    fenced: VecDeque<FencedWrite>,
    fenced_seen: HashMap<String, u64>,
    seen: HashMap<String, Seen>,
    primed: bool,
    /// Changes dropped by a bound so far (the timeline says it is cut).
    dropped: u64,
}

impl ChangeLog {
    /// A timeline keeping the newest `capacity` changes of the last 24 hours.
    pub fn new(capacity: usize) -> Self {
        Self::bounded(capacity, DEFAULT_MAX_AGE_MS)
    }

    /// A timeline keeping at most `capacity` changes, none older than
    /// `max_age_ms` (fenced writes are bounded alike).
    pub fn bounded(capacity: usize, max_age_ms: i64) -> Self {
        ChangeLog {
            capacity: capacity.max(1),
            max_age_ms: max_age_ms.max(1),
            entries: VecDeque::new(),
            fenced: VecDeque::new(),
            fenced_seen: HashMap::new(),
            seen: HashMap::new(),
            primed: false,
            dropped: 0,
        }
    }

    /// Records the fenced-write counters the sidecars report per worker. The
    /// first reading of a worker is a baseline; an increase becomes a
    /// [`FencedWrite`] attributed to the streams that worker lost last.
    pub fn observe_fenced<'a>(
        &mut self,
        counters: impl IntoIterator<Item = (&'a str, u64)>,
        now_ms: i64,
    ) {
        for (owner, total) in counters {
            let before = self.fenced_seen.insert(owner.to_owned(), total);
            let Some(before) = before else { continue };
            if total <= before {
                continue; // unchanged, or the worker restarted and counts from 0
            }
            let mut streams: Vec<String> = Vec::new();
            for change in &self.entries {
                if change.old_owner.as_deref() == Some(owner)
                    && change.new_owner.as_deref() != Some(owner)
                    && !streams.contains(&change.stream_id)
                {
                    streams.push(change.stream_id.clone());
                    if streams.len() == FENCED_STREAMS {
                        break;
                    }
                }
            }
            if self.fenced.len() == self.capacity {
                self.fenced.pop_back();
            }
            self.fenced.push_front(FencedWrite {
                at_ms: now_ms,
                owner_id: owner.to_owned(),
                writes: total - before,
                streams,
            });
        }
        self.expire(now_ms);
    }

    /// Drops what is older than the age bound.
    fn expire(&mut self, now_ms: i64) {
        let cutoff = now_ms - self.max_age_ms;
        while self.entries.back().is_some_and(|c| c.at_ms < cutoff) {
            self.entries.pop_back();
            self.dropped += 1;
        }
        while self.fenced.back().is_some_and(|f| f.at_ms < cutoff) {
            self.fenced.pop_back();
        }
    }

    /// The oldest change still kept, unix ms (how far back the timeline goes).
    pub fn oldest_ms(&self) -> Option<i64> {
        self.entries.back().map(|c| c.at_ms)
    }

    /// Whether a bound has dropped changes (the history is cut at [`Self::oldest_ms`]).
    pub fn truncated(&self) -> bool {
        self.dropped > 0
    }

    /// The bounds: (count, age in ms).
    pub fn bounds(&self) -> (usize, i64) {
        (self.capacity, self.max_age_ms)
    }

    /// Changes since `from_ms` (inclusive), oldest first.
    pub fn since(&self, from_ms: i64) -> Vec<Change> {
        let mut out: Vec<Change> = self
            .entries
            .iter()
            .take_while(|c| c.at_ms >= from_ms)
            .cloned()
            .collect();
        out.reverse();
        out
    }

    /// Changes since `from_ms` (inclusive), oldest first, borrowed (the
    /// timeline reads 50,000 of them without copying).
    pub fn since_ref(&self, from_ms: i64) -> Vec<&Change> {
        let mut out: Vec<&Change> = self
            .entries
            .iter()
            .take_while(|c| c.at_ms >= from_ms)
            .collect();
        out.reverse();
        out
    }

    /// One stream's changes, oldest first.
    pub fn for_stream(&self, stream_id: &str) -> Vec<Change> {
        let mut out: Vec<Change> = self
            .entries
            .iter()
            .filter(|c| c.stream_id == stream_id)
            .cloned()
            .collect();
        out.reverse();
        out
    }

    /// Fenced writes since `from_ms`, oldest first.
    pub fn fenced_since(&self, from_ms: i64) -> Vec<FencedWrite> {
        let mut out: Vec<FencedWrite> = self
            .fenced
            .iter()
            .take_while(|f| f.at_ms >= from_ms)
            .cloned()
            .collect();
        out.reverse();
        out
    }

    /// Compares one full scan with the previous one. The first scan is only a
    /// baseline: the dashboard did not see those changes happen.
    pub fn observe<'a>(&mut self, leases: impl IntoIterator<Item = &'a Lease>, now_ms: i64) {
        let mut next = HashMap::with_capacity(self.seen.len());
        for lease in leases {
            let before = self.seen.get(&lease.stream_id);
            if let Some(before) = before
                && version(lease) < before.version
            {
                // A stale replica: keep the newer observation.
                next.insert(lease.stream_id.clone(), before.clone());
                continue;
            }
            if self.primed
                && let Some(change) = compare(lease, before.map(|b| (&b.owner, b.token)), now_ms)
            {
                self.push(change);
            }
            next.insert(
                lease.stream_id.clone(),
                Seen {
                    owner: lease.owner_id.clone(),
                    token: lease.fence_token,
                    version: version(lease),
                },
            );
        }
        self.seen = next;
        self.primed = true;
        self.expire(now_ms);
    }

    /// Adds a change as if observed (the benchmark fills 24 h this way).
    #[cfg(feature = "testing")]
    pub fn record(&mut self, change: Change) {
        self.push(change);
    }

    /// Adds a fenced write as if observed.
    #[cfg(feature = "testing")]
    pub fn record_fenced(&mut self, fenced: FencedWrite) {
        self.fenced.push_front(fenced);
    }

    fn push(&mut self, change: Change) {
        if self.entries.len() == self.capacity {
            self.entries.pop_back();
            self.dropped += 1;
        }
        // Records carry their own times; a late scan may find a change older
        // than the newest kept, so keep the deque sorted newest first.
        let at = self
            .entries
            .iter()
            .position(|c| c.at_ms <= change.at_ms)
            .unwrap_or(self.entries.len());
        self.entries.insert(at, change);
    }

    /// Newest first, at most `limit`.
    pub fn recent(&self, limit: usize) -> Vec<Change> {
        self.entries.iter().take(limit).cloned().collect()
    }
}

fn compare(lease: &Lease, before: Option<(&Option<String>, u64)>, now_ms: i64) -> Option<Change> {
    let (old_owner, old_token) = match before {
        Some((owner, token)) => (owner.clone(), token),
        None => (None, 0),
    };
    if lease.fence_token > old_token && lease.owner_id.is_some() {
        // The stores write "" for "no previous owner".
        let previous = lease
            .previous_owner
            .clone()
            .filter(|owner| !owner.is_empty())
            .or(old_owner);
        // The previous expiry tells how the lease became free: 0 = released
        // (a hand-off), in the past = it expired (a takeover, even by the same
        // owner restarted under the same id), still running = the holder
        // re-acquired its own live lease.
        let acquired_at = lease.acquired_at.unwrap_or(now_ms);
        let kind = match (lease.previous_expires_at, &previous) {
            (_, None) => ChangeKind::Acquired,
            (Some(0), Some(_)) => ChangeKind::Handoff,
            (Some(expired), Some(_)) if expired < acquired_at => ChangeKind::Takeover,
            (None, Some(_)) => ChangeKind::Takeover,
            (Some(_), Some(_)) => ChangeKind::Acquired,
        };
        return Some(Change {
            at_ms: acquired_at,
            stream_id: lease.stream_id.clone(),
            kind,
            old_owner: previous,
            new_owner: lease.owner_id.clone(),
            fence_token: lease.fence_token,
            gap_seconds: lease.takeover_gap_ms().map(|ms| ms as f64 / 1000.0),
            missed: lease.fence_token - old_token - 1,
        });
    }
    if lease.owner_id.is_none() && old_owner.is_some() {
        return Some(Change {
            at_ms: lease.released_at.unwrap_or(now_ms),
            stream_id: lease.stream_id.clone(),
            kind: ChangeKind::Released,
            old_owner,
            new_owner: None,
            fence_token: lease.fence_token,
            gap_seconds: None,
            missed: lease.fence_token.saturating_sub(old_token),
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(stream: &str, owner: &str, token: u64) -> Lease {
        let mut lease = Lease::unowned(stream);
        lease.owner_id = Some(owner.into());
        lease.fence_token = token;
        lease.acquired_at = Some(10_000 + token as i64);
        lease
    }

    #[test]
    fn the_first_scan_is_a_baseline() {
        let mut log = ChangeLog::new(10);
        log.observe(&[held("a", "w1", 4)], 1);
        assert!(log.recent(10).is_empty());
    }

    #[test]
    fn takeover_release_and_handoff_are_told_apart() {
        let mut log = ChangeLog::new(10);
        log.observe(&[held("a", "w1", 1), held("b", "w1", 1)], 1);

        let mut taken = held("a", "w2", 2);
        taken.previous_owner = Some("w1".into());
        taken.previous_expires_at = Some(9_000);
        let mut released = Lease::unowned("b");
        released.fence_token = 1;
        released.released_at = Some(11_000);
        log.observe(&[taken.clone(), released], 2);

        let mut handed = held("b", "w3", 2);
        handed.previous_owner = Some("w1".into());
        handed.previous_expires_at = Some(0);
        handed.released_at = Some(11_000);
        // Acquired after the release (the history is kept in time order).
        handed.acquired_at = Some(12_000);
        log.observe(&[taken, handed], 3);

        let recent = log.recent(10);
        let kinds: Vec<_> = recent
            .iter()
            .map(|c| (c.stream_id.as_str(), c.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                ("b", ChangeKind::Handoff),
                ("b", ChangeKind::Released),
                ("a", ChangeKind::Takeover)
            ]
        );
        let takeover = &recent[2];
        assert_eq!(takeover.old_owner.as_deref(), Some("w1"));
        assert_eq!(takeover.new_owner.as_deref(), Some("w2"));
        assert_eq!(takeover.gap_seconds, Some((10_002.0 - 9_000.0) / 1000.0));
        assert_eq!(recent[1].at_ms, 11_000);
    }

    #[test]
    fn skipped_acquisitions_are_counted_and_capacity_holds() {
        let mut log = ChangeLog::new(2);
        log.observe(&[held("a", "w1", 1)], 1);
        log.observe(&[held("a", "w2", 5)], 2);
        assert_eq!(log.recent(1)[0].missed, 3);
        log.observe(&[held("a", "w1", 6)], 3);
        log.observe(&[held("a", "w2", 7)], 4);
        let recent = log.recent(10);
        assert_eq!(recent.len(), 2);
        assert_eq!(recent[0].fence_token, 7);
    }

    #[test]
    fn a_restarted_owner_taking_its_own_expired_lease_is_a_takeover() {
        let mut log = ChangeLog::new(10);
        log.observe(&[held("a", "w1", 1)], 1);
        let mut again = held("a", "w1", 2);
        again.previous_owner = Some("w1".into());
        again.previous_expires_at = Some(5_000);
        log.observe(&[again], 2);
        assert_eq!(log.recent(1)[0].kind, ChangeKind::Takeover);
    }

    #[test]
    fn a_stale_replica_answering_an_older_version_is_not_a_change() {
        let mut log = ChangeLog::new(10);
        let mut first = held("a", "w1", 1);
        first.updated_at = Some(20_000);
        log.observe(&[first.clone()], 1);
        let mut released = Lease::unowned("a");
        released.fence_token = 1;
        released.last_owner = Some("w1".into());
        released.released_at = Some(21_000);
        released.updated_at = Some(21_000);
        log.observe(&[released.clone()], 2);
        assert_eq!(log.recent(10).len(), 1, "the release");
        // An eventually consistent scan answered from a replica that has not
        // seen the release yet, then one that has: nothing new happened.
        log.observe(&[first], 3);
        log.observe(&[released], 4);
        let recent = log.recent(10);
        assert_eq!(recent.len(), 1, "{recent:?}");
        assert_eq!(recent[0].kind, ChangeKind::Released);
    }

    #[test]
    fn the_history_is_bounded_by_age_as_well_as_count() {
        let mut log = ChangeLog::bounded(100, 60_000);
        log.observe(&[held("a", "w1", 1)], 0);
        let mut taken = held("a", "w2", 2);
        taken.acquired_at = Some(1_000);
        log.observe(&[taken], 1_000);
        assert_eq!(log.oldest_ms(), Some(1_000));
        assert!(!log.truncated());
        let mut again = held("a", "w1", 3);
        again.acquired_at = Some(50_000);
        log.observe(&[again], 50_000);
        assert_eq!(log.recent(10).len(), 2);
        // At 62 s the first change is older than the 60 s bound.
        log.observe(&[], 62_000);
        assert_eq!(log.recent(10).len(), 1);
        assert_eq!(log.oldest_ms(), Some(50_000));
        assert!(log.truncated());
    }

    #[test]
    fn fenced_counters_become_marks_on_the_streams_the_worker_lost() {
        let mut log = ChangeLog::new(10);
        log.observe(&[held("a", "w1", 1), held("b", "w1", 1)], 1);
        let mut taken = held("a", "w2", 2);
        taken.previous_owner = Some("w1".into());
        taken.previous_expires_at = Some(9_000);
        log.observe(&[taken, held("b", "w1", 1)], 2);
        // A counter counts since the worker started, before the dashboard
        // did: the first reading is a baseline, not news.
        log.observe_fenced([("w1", 5), ("w2", 0)], 3);
        assert!(
            log.fenced_since(0).is_empty(),
            "first reading is a baseline"
        );
        log.observe_fenced([("w1", 8), ("w2", 0)], 4);
        log.observe_fenced([("w1", 8)], 5);
        let fenced = log.fenced_since(0);
        assert_eq!(fenced.len(), 1, "{fenced:?}");
        assert_eq!(fenced[0].owner_id, "w1");
        assert_eq!(fenced[0].writes, 3);
        assert_eq!(fenced[0].streams, ["a"]);
        assert_eq!(log.for_stream("a").len(), 1);
        assert_eq!(log.since(0).len(), 1);
    }

    #[test]
    fn renewals_are_not_changes() {
        let mut log = ChangeLog::new(10);
        log.observe(&[held("a", "w1", 1)], 1);
        let mut renewed = held("a", "w1", 1);
        renewed.lease_expires_at = 99_999;
        log.observe(&[renewed], 2);
        assert!(log.recent(10).is_empty());
    }
}
