//! Data gaps: ranges of sequences that will never reach the sink, as the
//! workers recorded them and their sidecars list them in `/status` (`gaps`,
//! the newest [`leasehold_telemetry::status::RECENT_GAPS`] per sidecar).
//!
//! A sidecar numbers the gaps it has seen (`seq`, from 1 since it started),
//! so the collector takes each gap once: from a sidecar it knows, only the
//! numbers above the newest it took; from a sidecar seen for the first time,
//! or one that restarted (its numbering went back, or the gap it last took
//! under a number is not the one listed under it now), every gap listed,
//! except those already kept. A gap's time is the poll's time minus its
//! `age_ms`.
//!
//! Bounded twice, so 10,000 streams cannot make the dashboard grow: each
//! stream keeps its newest [`GAPS_PER_STREAM`], and the log keeps
//! [`GAPS_KEPT`] in all (the oldest recorded leave first). The per-stream
//! tally the streams view shows ([`GapTally`]: count, missing events, the
//! newest gap, counts per reason) lives as long as the stream keeps a gap.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use leasehold_telemetry::labels::GapReason;
use serde::{Deserialize, Serialize, Serializer};

use crate::model::streams::MAX_STREAM_ID_LEN;
use crate::sources::sidecars::SidecarReport;

/// Gaps kept per stream, newest first out: the stream page lists them all,
/// and 50 is more than a page needs to show a pattern (a stream losing data
/// every few minutes) while a stream that loses data in a loop cannot push
/// every other stream's gaps out of the log.
pub const GAPS_PER_STREAM: usize = 50;

/// Gaps kept in all: about 150 bytes each with their stream's share, so at
/// most about 3 MB however many streams report them; two per stream at
/// 10,000 streams, and a burst (a Redis failover losing entries on every
/// stream at once) still leaves the newest of them.
pub const GAPS_KEPT: usize = 20_000;

/// One data gap as the dashboard keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DataGap {
    /// When it was recorded (the poll's time minus the sidecar's `age_ms`), unix ms.
    pub at_ms: i64,
    /// First missing sequence.
    pub from_seq: u64,
    /// Last missing sequence.
    pub to_seq: u64,
    /// Missing events: `to_seq - from_seq + 1`.
    pub missing: u64,
    /// Why the range is missing.
    pub reason: GapReason,
    /// The worker whose sidecar reported it (untrusted text), if it said.
    pub worker: Option<String>,
}

impl DataGap {
    /// `seq 100–120 missing (21 events): retention`, the text of a gap's
    /// tooltip (`static/dashboard.js` writes the same).
    pub fn range_text(&self) -> String {
        range_text(self.from_seq, self.to_seq, self.missing, self.reason)
    }
}

/// The newest gap of a stream, as its row carries it (read back from the
/// row's JSON by the table's `gap` cells).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastGap {
    /// When it was recorded, unix ms.
    pub at_ms: i64,
    /// First missing sequence.
    pub from_seq: u64,
    /// Last missing sequence.
    pub to_seq: u64,
    /// Missing events.
    pub missing: u64,
    /// Why.
    pub reason: GapReason,
}

impl LastGap {
    fn of(gap: &DataGap) -> LastGap {
        LastGap {
            at_ms: gap.at_ms,
            from_seq: gap.from_seq,
            to_seq: gap.to_seq,
            missing: gap.missing,
            reason: gap.reason,
        }
    }

    /// The tooltip text ([`DataGap::range_text`]).
    pub fn range_text(&self) -> String {
        range_text(self.from_seq, self.to_seq, self.missing, self.reason)
    }
}

fn range_text(from: u64, to: u64, missing: u64, reason: GapReason) -> String {
    if reason == GapReason::Reset {
        return format!("sequence reset: {from} then {to} (the upstream started over)");
    }
    let events = if missing == 1 { "event" } else { "events" };
    format!(
        "seq {from}–{to} missing ({missing} {events}): {}",
        reason.as_str()
    )
}

/// What the streams view shows of one stream's gaps (O(1) per row: kept up
/// to date as gaps are recorded, never counted at render time). A stream
/// that keeps no gap has none (its row's `gaps` is null).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GapTally {
    /// Gaps recorded since the dashboard started (while it keeps one of them).
    pub count: u64,
    /// Missing events over those gaps.
    pub missing: u64,
    /// The newest gap.
    pub last: LastGap,
    /// Of `count`, how many per reason (JSON: reason → count, non-zero only).
    #[serde(serialize_with = "reason_counts")]
    pub reasons: [u64; GapReason::RECORDED.len()],
}

impl GapTally {
    /// How many gaps with `reason`.
    pub fn with_reason(&self, reason: GapReason) -> u64 {
        GapReason::RECORDED
            .iter()
            .position(|r| *r == reason)
            .map_or(0, |i| self.reasons[i])
    }

    fn first(gap: &DataGap) -> GapTally {
        let mut tally = GapTally {
            count: 0,
            missing: 0,
            last: LastGap::of(gap),
            reasons: [0; GapReason::RECORDED.len()],
        };
        tally.add(gap);
        tally
    }

    fn add(&mut self, gap: &DataGap) {
        self.count += 1;
        self.missing = self.missing.saturating_add(gap.missing);
        if let Some(i) = GapReason::RECORDED.iter().position(|r| *r == gap.reason) {
            self.reasons[i] += 1;
        }
        if gap.at_ms >= self.last.at_ms {
            self.last = LastGap::of(gap);
        }
    }
}

fn reason_counts<S: Serializer>(
    counts: &[u64; GapReason::RECORDED.len()],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_map(
        GapReason::RECORDED
            .iter()
            .zip(counts)
            .filter(|(_, n)| **n > 0)
            .map(|(reason, n)| (reason.as_str(), *n)),
    )
}

#[derive(Debug)]
struct StreamGaps {
    /// Kept gaps in the order recorded (oldest first), with their numbers.
    kept: VecDeque<(u64, DataGap)>,
    tally: GapTally,
}

/// What the log last took from one sidecar: the newest number, and which
/// gap it was (a restarted sidecar may have reached that number again with
/// another gap before the next poll).
#[derive(Debug, Clone)]
struct Seen {
    seq: u64,
    gap: Option<(String, u64, u64)>,
}

/// The gaps the dashboard keeps, per stream, and what it took from each sidecar.
#[derive(Debug)]
pub struct GapLog {
    per_stream_cap: usize,
    cap: usize,
    streams: HashMap<Arc<str>, StreamGaps>,
    /// Every kept gap by its number (the order recorded): whose is the oldest.
    order: BTreeMap<u64, Arc<str>>,
    next: u64,
    /// Per sidecar URL.
    seen: HashMap<String, Seen>,
    /// Gaps a bound has dropped.
    dropped: u64,
}

impl Default for GapLog {
    fn default() -> Self {
        GapLog::bounded(GAPS_PER_STREAM, GAPS_KEPT)
    }
}

impl GapLog {
    /// A log keeping `per_stream` gaps per stream and `cap` in all.
    pub fn bounded(per_stream: usize, cap: usize) -> Self {
        GapLog {
            per_stream_cap: per_stream.max(1),
            cap: cap.max(1),
            streams: HashMap::new(),
            order: BTreeMap::new(),
            next: 0,
            seen: HashMap::new(),
            dropped: 0,
        }
    }

    /// Takes the gaps the sidecars list that the log has not taken yet
    /// (`polled_ms`: when they answered). Returns how many were new.
    /// What the log remembers per sidecar is kept only for the sidecars in
    /// `sidecars` (one that did not answer stays), so it is bounded like them.
    pub fn observe(&mut self, sidecars: &[SidecarReport], polled_ms: i64) -> usize {
        let mut taken = 0;
        for report in sidecars {
            let Some(status) = &report.status else {
                continue;
            };
            let gaps = &status.gaps;
            let newest = gaps.iter().max_by_key(|g| g.seq);
            let newest_seq = newest.map_or(0, |g| g.seq);
            let counted = self.seen.get(&report.url).and_then(|seen| {
                // Still the numbering it took from: not gone back, and the gap
                // under its last number (if still listed) is the one it took.
                let same = newest_seq >= seen.seq
                    && gaps.iter().find(|g| g.seq == seen.seq).is_none_or(|g| {
                        seen.gap.as_ref().is_some_and(|(stream, from, to)| {
                            *stream == g.stream_id && *from == g.from_seq && *to == g.to_seq
                        })
                    });
                same.then_some(seen.seq)
            });
            for gap in gaps {
                let fresh = match counted {
                    Some(counted) => gap.seq > counted,
                    // New or restarted: all, but not twice (a sidecar that
                    // dropped out of discovery for a refresh comes back new).
                    None => !self.holds(&gap.stream_id, gap.from_seq, gap.to_seq),
                };
                // A gap's range ascends; a reset's goes back (from the last
                // sequence before to the first after).
                if !fresh || (gap.to_seq < gap.from_seq && gap.reason != GapReason::Reset) {
                    continue;
                }
                let age = i64::try_from(gap.age_ms).unwrap_or(i64::MAX);
                taken += usize::from(self.record(
                    &gap.stream_id,
                    DataGap {
                        at_ms: polled_ms.saturating_sub(age),
                        from_seq: gap.from_seq,
                        to_seq: gap.to_seq,
                        // A reset goes back: it misses nothing.
                        missing: match gap.reason {
                            GapReason::Reset => 0,
                            _ => gap.to_seq.saturating_sub(gap.from_seq).saturating_add(1),
                        },
                        reason: gap.reason,
                        worker: status.owner_id.clone(),
                    },
                ));
            }
            self.seen.insert(
                report.url.clone(),
                Seen {
                    seq: newest_seq,
                    gap: newest.map(|g| (g.stream_id.clone(), g.from_seq, g.to_seq)),
                },
            );
        }
        let polled: HashSet<&str> = sidecars.iter().map(|r| r.url.as_str()).collect();
        self.seen.retain(|url, _| polled.contains(url.as_str()));
        taken
    }

    /// Whether `stream` keeps a gap of exactly this range.
    fn holds(&self, stream: &str, from_seq: u64, to_seq: u64) -> bool {
        self.streams.get(stream).is_some_and(|s| {
            s.kept
                .iter()
                .any(|(_, g)| g.from_seq == from_seq && g.to_seq == to_seq)
        })
    }

    /// Keeps one gap (the bounds drop the oldest recorded). A stream id no
    /// stream page can be asked for (longer than [`MAX_STREAM_ID_LEN`]) is not
    /// kept. Returns whether it was kept.
    pub fn record(&mut self, stream_id: &str, gap: DataGap) -> bool {
        if stream_id.len() > MAX_STREAM_ID_LEN {
            return false;
        }
        let number = self.next;
        self.next += 1;
        let key: Arc<str> = match self.streams.get_key_value(stream_id) {
            Some((key, _)) => key.clone(),
            None => Arc::from(stream_id),
        };
        let stream = self
            .streams
            .entry(key.clone())
            .and_modify(|s| s.tally.add(&gap))
            .or_insert_with(|| StreamGaps {
                kept: VecDeque::new(),
                tally: GapTally::first(&gap),
            });
        stream.kept.push_back((number, gap));
        self.order.insert(number, key);
        if stream.kept.len() > self.per_stream_cap
            && let Some((oldest, _)) = stream.kept.pop_front()
        {
            self.order.remove(&oldest);
            self.dropped += 1;
        }
        while self.order.len() > self.cap {
            let Some((oldest, key)) = self.order.pop_first() else {
                break;
            };
            // The oldest recorded overall is the front of its stream's list.
            if let Some(stream) = self.streams.get_mut(&key) {
                if stream.kept.front().is_some_and(|(n, _)| *n == oldest) {
                    stream.kept.pop_front();
                }
                if stream.kept.is_empty() {
                    self.streams.remove(&key);
                }
            }
            self.dropped += 1;
        }
        true
    }

    /// One stream's kept gaps, newest first.
    pub fn for_stream(&self, stream_id: &str) -> Vec<DataGap> {
        let mut gaps: Vec<DataGap> = self
            .streams
            .get(stream_id)
            .map(|s| s.kept.iter().map(|(_, g)| g.clone()).collect())
            .unwrap_or_default();
        gaps.sort_by(|a, b| {
            b.at_ms
                .cmp(&a.at_ms)
                .then_with(|| b.from_seq.cmp(&a.from_seq))
        });
        gaps
    }

    /// One stream's kept gaps recorded since `from_ms`, oldest first (the
    /// timeline's marks; one dated a little after the snapshot, since the
    /// sidecars answer after it is taken, is drawn at its right edge).
    pub fn since(&self, stream_id: &str, from_ms: i64) -> Vec<DataGap> {
        let mut gaps = self.for_stream(stream_id);
        gaps.retain(|g| g.at_ms >= from_ms);
        gaps.reverse();
        gaps
    }

    /// What one stream's row shows (none when it keeps no gap).
    pub fn tally(&self, stream_id: &str) -> Option<GapTally> {
        self.streams.get(stream_id).map(|s| s.tally)
    }

    /// Gaps kept now, over all streams.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether no gap is kept.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Streams keeping at least one gap.
    pub fn streams(&self) -> usize {
        self.streams.len()
    }

    /// The bounds: (per stream, in all).
    pub fn bounds(&self) -> (usize, usize) {
        (self.per_stream_cap, self.cap)
    }

    /// Gaps a bound has dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Sidecars whose numbering the log remembers.
    pub fn sidecars_seen(&self) -> usize {
        self.seen.len()
    }
}

#[cfg(test)]
mod tests;
