//! The ownership timeline: the change history cut into segments per lane
//! (one lane per stream, or per worker and stream), which `web/lanes.rs`
//! places for the SVG the templates draw (no JavaScript charting).
//!
//! A segment is a stretch of time with one owner and one fence token, or a
//! gap with no valid owner (between a lease running out or being released
//! and the next acquire). Fenced writes are marks on the lanes they hit, and
//! so are data gaps (ranges that will never reach the sink, [`crate::model::gaps`]),
//! at the time they were recorded, on the reporting worker's lane per worker.

use serde::Serialize;

use crate::model::changes::{Change, ChangeKind, FencedWrite};
use crate::model::gaps::{DataGap, GapLog};
use crate::model::streams::StreamRow;

/// Lanes drawn per page (the rest are paged).
pub const LANES_PER_PAGE: usize = 50;

/// One stretch of a lane.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Segment {
    /// Start, unix ms (clipped to the window).
    pub start_ms: i64,
    /// End, unix ms (clipped to the window).
    pub end_ms: i64,
    /// Holder; none for a gap.
    pub owner: Option<String>,
    /// Fence token the holder wrote with; none for a gap.
    pub token: Option<u64>,
    /// How the stretch began (`acquired`, `takeover`, `handoff`,
    /// `released`, `expired`, or `before window`).
    pub began: &'static str,
    /// How it ended (`takeover`, `handoff`, `released`, `expired`), or none
    /// while it lasts.
    pub ended: Option<&'static str>,
}

/// A fenced write drawn on a lane.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mark {
    /// When it was seen, unix ms.
    pub at_ms: i64,
    /// The worker whose writes were refused.
    pub owner: String,
    /// How many.
    pub writes: u64,
}

/// One lane: a stream (or, per worker, a worker's holding of a stream).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Lane {
    /// The stream.
    pub stream_id: String,
    /// The worker, when lanes are per worker.
    pub worker: Option<String>,
    /// Segments, oldest first, not overlapping.
    pub segments: Vec<Segment>,
    /// Fenced writes.
    pub fenced: Vec<Mark>,
    /// Data gaps recorded in the window, oldest first.
    pub data_gaps: Vec<DataGap>,
    /// Last change in the lane, unix ms (lanes sort newest change first).
    pub last_change_ms: i64,
}

/// Cuts one stream's history into segments over `[from_ms, to_ms]`.
///
/// `changes` are that stream's changes, oldest first; `row` is the stream now
/// (its owner and token when nothing changed inside the window).
pub fn segments(
    changes: &[&Change],
    row: Option<&StreamRow>,
    from_ms: i64,
    to_ms: i64,
) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    // Who held the stream at the window's start, as far as the first change
    // in the window tells (its previous owner) or, failing that, the row now.
    let mut owner: Option<String>;
    let mut token: Option<u64>;
    let mut began: &'static str = "before window";
    let mut start = from_ms;
    match changes.first() {
        Some(first) => {
            owner = first.old_owner.clone();
            token = owner.as_ref().map(|_| match first.kind {
                ChangeKind::Released => first.fence_token,
                _ => first.fence_token.saturating_sub(first.missed + 1),
            });
            if first.kind == ChangeKind::Acquired && first.old_owner.is_none() {
                owner = None;
                token = None;
            }
        }
        None => {
            owner = row.and_then(|r| r.owner_id.clone());
            token = owner.as_ref().and(row.map(|r| r.fence_token));
        }
    }
    let push = |out: &mut Vec<Segment>, seg: Segment| {
        let seg = Segment {
            start_ms: seg.start_ms.max(from_ms),
            end_ms: seg.end_ms.min(to_ms),
            ..seg
        };
        if seg.end_ms > seg.start_ms || (seg.end_ms == seg.start_ms && seg.owner.is_some()) {
            out.push(seg);
        }
    };
    for change in changes {
        let at = change.at_ms;
        match change.kind {
            ChangeKind::Released => {
                push(
                    &mut out,
                    Segment {
                        start_ms: start,
                        end_ms: at,
                        owner: owner.take(),
                        token: token.take(),
                        began,
                        ended: Some("released"),
                    },
                );
                began = "released";
                start = at;
            }
            kind => {
                // The stream had no valid owner for the gap before this acquire.
                let gap_ms = change
                    .gap_seconds
                    .map(|s| (s * 1000.0).round() as i64)
                    .unwrap_or(0)
                    .max(0);
                let free_from = (at - gap_ms).max(start);
                let ended = match kind {
                    ChangeKind::Takeover => "expired",
                    ChangeKind::Handoff => "released",
                    _ => "replaced",
                };
                if owner.is_some() {
                    push(
                        &mut out,
                        Segment {
                            start_ms: start,
                            end_ms: free_from,
                            owner: owner.take(),
                            token: token.take(),
                            began,
                            ended: Some(ended),
                        },
                    );
                    start = free_from;
                    began = ended;
                }
                if at > start {
                    push(
                        &mut out,
                        Segment {
                            start_ms: start,
                            end_ms: at,
                            owner: None,
                            token: None,
                            began,
                            ended: Some(kind.as_str()),
                        },
                    );
                }
                owner = change.new_owner.clone();
                token = Some(change.fence_token);
                began = kind.as_str();
                start = at;
            }
        }
    }
    push(
        &mut out,
        Segment {
            start_ms: start,
            end_ms: to_ms,
            owner,
            token,
            began,
            ended: None,
        },
    );
    out
}

/// Builds every lane over `[from_ms, to_ms]`: per stream, or per worker
/// (one lane per worker and stream it held, sorted by worker).
pub fn lanes(
    rows: &[StreamRow],
    changes: &[Change],
    fenced: &[FencedWrite],
    gaps: &GapLog,
    from_ms: i64,
    to_ms: i64,
    per_worker: bool,
) -> Vec<Lane> {
    let window = Window {
        from_ms,
        to_ms,
        per_worker,
    };
    let changes: Vec<&Change> = changes.iter().collect();
    let marked = Marked { fenced, gaps };
    lane_page(rows, &changes, marked, &window, None, 0, usize::MAX).1
}

/// What [`lane_page`] marks on the lanes.
#[derive(Debug, Clone, Copy)]
pub struct Marked<'a> {
    /// Fenced writes (on the lanes of the streams they are attributed to).
    pub fenced: &'a [FencedWrite],
    /// Data gaps (on their stream's lane).
    pub gaps: &'a GapLog,
}

/// What [`lane_page`] draws.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Window start, unix ms.
    pub from_ms: i64,
    /// Window end, unix ms.
    pub to_ms: i64,
    /// Lanes per worker and stream rather than per stream.
    pub per_worker: bool,
}

/// One page of lanes: (lanes matching in all, the lanes of the page).
///
/// Lanes are ordered (latest change first per stream; by worker, then stream,
/// per worker) and paged *before* any segment is cut, so a page of 50 lanes
/// costs 50 lanes' work at 10,000 streams with 24 h of history (a lane's
/// data gaps are looked up per lane: at most [`crate::model::gaps::GAPS_PER_STREAM`]).
pub fn lane_page(
    rows: &[StreamRow],
    changes: &[&Change],
    marked: Marked<'_>,
    window: &Window,
    search: Option<&str>,
    skip: usize,
    take: usize,
) -> (usize, Vec<Lane>) {
    use std::collections::HashMap;
    let Window {
        from_ms,
        to_ms,
        per_worker,
    } = *window;
    let Marked { fenced, gaps } = marked;
    let mut by_stream: HashMap<&str, Vec<&Change>> = HashMap::new();
    for &change in changes {
        by_stream
            .entry(change.stream_id.as_str())
            .or_default()
            .push(change);
    }
    let mut ids: Vec<(&str, Option<&StreamRow>)> = rows
        .iter()
        .map(|row| (row.stream_id.as_str(), Some(row)))
        .collect();
    // Streams with history but no longer in the table.
    for id in by_stream.keys() {
        if rows
            .binary_search_by(|r| r.stream_id.as_str().cmp(id))
            .is_err()
        {
            ids.push((id, None));
        }
    }
    if let Some(q) = search {
        ids.retain(|(id, _)| id.to_lowercase().contains(q));
    }
    let mut marks: HashMap<&str, Vec<Mark>> = HashMap::new();
    for f in fenced {
        for stream in &f.streams {
            marks.entry(stream.as_str()).or_default().push(Mark {
                at_ms: f.at_ms.clamp(from_ms, to_ms),
                owner: f.owner_id.clone(),
                writes: f.writes,
            });
        }
    }
    let last_change = |id: &str| {
        by_stream
            .get(id)
            .and_then(|h| h.last())
            .map(|c| c.at_ms)
            .unwrap_or(i64::MIN)
    };
    let stream_lane = |id: &str, row: Option<&StreamRow>| {
        let history = by_stream.get(id).map(Vec::as_slice).unwrap_or(&[]);
        Lane {
            stream_id: id.to_owned(),
            worker: None,
            segments: segments(history, row, from_ms, to_ms),
            fenced: marks.get(id).cloned().unwrap_or_default(),
            data_gaps: gaps.since(id, from_ms),
            last_change_ms: last_change(id),
        }
    };
    if !per_worker {
        let mut keyed: Vec<(i64, &str, Option<&StreamRow>)> = ids
            .into_iter()
            .map(|(id, row)| (last_change(id), id, row))
            .collect();
        keyed.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let total = keyed.len();
        let page = keyed
            .into_iter()
            .skip(skip)
            .take(take)
            .map(|(_, id, row)| stream_lane(id, row))
            .collect();
        return (total, page);
    }
    // Per worker: every (owner, stream) pair the history or the record names.
    let mut keyed: Vec<(&str, &str, Option<&StreamRow>)> = Vec::new();
    for (id, row) in ids {
        let mut owners: Vec<&str> = Vec::new();
        if let Some(owner) = row.and_then(|r| r.owner_id.as_deref()) {
            owners.push(owner);
        }
        for change in by_stream.get(id).map(Vec::as_slice).unwrap_or(&[]) {
            owners.extend(change.old_owner.as_deref());
            owners.extend(change.new_owner.as_deref());
        }
        owners.sort_unstable();
        owners.dedup();
        keyed.extend(owners.into_iter().map(|owner| (owner, id, row)));
    }
    keyed.sort_unstable_by(|a, b| a.0.cmp(b.0).then_with(|| a.1.cmp(b.1)));
    let total = keyed.len();
    let page = keyed
        .into_iter()
        .skip(skip)
        .take(take)
        .map(|(owner, id, row)| {
            let lane = stream_lane(id, row);
            Lane {
                segments: lane
                    .segments
                    .into_iter()
                    .filter(|s| s.owner.as_deref() == Some(owner))
                    .collect(),
                fenced: lane
                    .fenced
                    .into_iter()
                    .filter(|m| m.owner == owner)
                    .collect(),
                data_gaps: lane
                    .data_gaps
                    .into_iter()
                    .filter(|g| g.worker.as_deref() == Some(owner))
                    .collect(),
                worker: Some(owner.to_owned()),
                ..lane
            }
        })
        .collect();
    (total, page)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::streams::StreamState;

    pub(crate) fn change(
        at: i64,
        kind: ChangeKind,
        old: Option<&str>,
        new: Option<&str>,
        token: u64,
        gap: Option<f64>,
    ) -> Change {
        Change {
            at_ms: at,
            stream_id: "s".into(),
            kind,
            old_owner: old.map(Into::into),
            new_owner: new.map(Into::into),
            fence_token: token,
            gap_seconds: gap,
            missed: 0,
        }
    }

    pub(crate) fn row(owner: Option<&str>, token: u64) -> StreamRow {
        StreamRow {
            owner_id: owner.map(Into::into),
            fence_token: token,
            state: StreamState::Owned,
            ..StreamRow::unowned("s")
        }
    }

    fn owners(segments: &[Segment]) -> Vec<(i64, i64, Option<&str>, Option<u64>)> {
        segments
            .iter()
            .map(|s| (s.start_ms, s.end_ms, s.owner.as_deref(), s.token))
            .collect()
    }

    #[test]
    fn a_takeover_leaves_a_gap_between_the_two_owners() {
        let takeover = change(
            60,
            ChangeKind::Takeover,
            Some("w1"),
            Some("w2"),
            5,
            Some(10.0 / 1000.0),
        );
        let segs = segments(&[&takeover], Some(&row(Some("w2"), 5)), 0, 100);
        assert_eq!(
            owners(&segs),
            [
                (0, 50, Some("w1"), Some(4)),
                (50, 60, None, None),
                (60, 100, Some("w2"), Some(5))
            ]
        );
        assert_eq!(segs[0].ended, Some("expired"));
        assert_eq!(segs[1].ended, Some("takeover"));
        assert_eq!(segs[2].began, "takeover");
        assert_eq!(segs[2].ended, None);
    }

    #[test]
    fn release_then_handoff_and_quiet_streams() {
        let released = change(30, ChangeKind::Released, Some("w1"), None, 3, None);
        let handed = change(70, ChangeKind::Handoff, Some("w1"), Some("w3"), 4, None);
        let segs = segments(&[&released, &handed], None, 0, 100);
        assert_eq!(
            owners(&segs),
            [
                (0, 30, Some("w1"), Some(3)),
                (30, 70, None, None),
                (70, 100, Some("w3"), Some(4))
            ]
        );
        // Nothing changed in the window: one segment with the owner now.
        let quiet = segments(&[], Some(&row(Some("w9"), 12)), 0, 100);
        assert_eq!(owners(&quiet), [(0, 100, Some("w9"), Some(12))]);
        // Never owned: one gap.
        let never = segments(&[], Some(&row(None, 0)), 0, 100);
        assert_eq!(owners(&never), [(0, 100, None, None)]);
    }
}
