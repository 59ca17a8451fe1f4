//! The ownership timeline: the change history cut into segments per lane
//! (one lane per stream, or per worker and stream), ready to be drawn as SVG
//! by the template (no JavaScript charting).
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
/// Width of the drawing area, in view-box units.
pub const WIDTH: f64 = 1000.0;

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

/// A segment placed in the SVG.
#[derive(Debug, Clone)]
pub struct DrawnSegment {
    /// Left edge, view-box units.
    pub x: String,
    /// Width, view-box units.
    pub w: String,
    /// Label centre.
    pub label_x: String,
    /// Colour class (`own-0` … `own-7`, or `gap`).
    pub class: String,
    /// The label drawn inside (`#token`), empty when too narrow.
    pub label: String,
    /// Hover/focus text and the text equivalent.
    pub describe: String,
    /// The segment.
    pub segment: Segment,
}

/// A fenced-write mark placed in the SVG.
#[derive(Debug, Clone)]
pub struct DrawnMark {
    /// Position, view-box units.
    pub x: String,
    /// Hover/focus text.
    pub describe: String,
}

/// A lane placed in the SVG.
#[derive(Debug, Clone)]
pub struct DrawnLane {
    /// Row title (stream, or worker · stream).
    pub title: String,
    /// The stream.
    pub stream_id: String,
    /// Top edge, view-box units.
    pub y: u32,
    /// Segments.
    pub segments: Vec<DrawnSegment>,
    /// Fenced writes.
    pub marks: Vec<DrawnMark>,
    /// Data gaps.
    pub data_gaps: Vec<DrawnMark>,
}

/// Height of one lane, view-box units.
pub const LANE_HEIGHT: u32 = 22;

/// The colour class of an owner: one of eight, stable for a given id.
pub fn owner_class(owner: &str) -> String {
    // FNV-1a: stable across runs and processes (the std hasher is seeded).
    let mut hash: u32 = 0x811c_9dc5;
    for byte in owner.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    format!("own-{}", hash % 8)
}

fn when(at_ms: i64, to_ms: i64) -> String {
    format!(
        "{} before the snapshot",
        crate::web::column::duration_ms(to_ms - at_ms)
    )
}

/// Places lanes on the x axis of `[from_ms, to_ms]`.
pub fn draw(lanes: &[Lane], from_ms: i64, to_ms: i64) -> Vec<DrawnLane> {
    let span = (to_ms - from_ms).max(1) as f64;
    let x_of = |at: i64| (at - from_ms) as f64 / span * WIDTH;
    lanes
        .iter()
        .enumerate()
        .map(|(i, lane)| {
            let segments = lane
                .segments
                .iter()
                .map(|s| {
                    let x = x_of(s.start_ms);
                    let w = (x_of(s.end_ms) - x).max(1.0);
                    let (class, label) = match (&s.owner, s.token) {
                        (Some(owner), Some(token)) => (owner_class(owner), format!("#{token}")),
                        (Some(owner), None) => (owner_class(owner), String::new()),
                        _ => ("gap".to_owned(), String::new()),
                    };
                    let label = if w >= 8.0 * label.len() as f64 {
                        label
                    } else {
                        String::new()
                    };
                    let who = match (&s.owner, s.token) {
                        (Some(owner), Some(token)) => format!("{owner} with token {token}"),
                        (Some(owner), None) => owner.clone(),
                        _ => "no owner (gap)".to_owned(),
                    };
                    let describe = format!(
                        "{}: {who}, from {} ({}) for {}{}",
                        lane.stream_id,
                        when(s.start_ms, to_ms),
                        s.began,
                        crate::web::column::duration_ms(s.end_ms - s.start_ms),
                        match s.ended {
                            Some(how) => format!(", ended: {how}"),
                            None => ", still current".to_owned(),
                        }
                    );
                    DrawnSegment {
                        x: format!("{x:.1}"),
                        w: format!("{w:.1}"),
                        label_x: format!("{:.1}", x + w / 2.0),
                        class,
                        label,
                        describe,
                        segment: s.clone(),
                    }
                })
                .collect();
            let marks = lane
                .fenced
                .iter()
                .map(|m| DrawnMark {
                    x: format!("{:.1}", x_of(m.at_ms)),
                    describe: format!(
                        "{}: {} fenced write(s) from {} refused, {}",
                        lane.stream_id,
                        m.writes,
                        m.owner,
                        when(m.at_ms, to_ms)
                    ),
                })
                .collect();
            let data_gaps = lane
                .data_gaps
                .iter()
                .map(|g| DrawnMark {
                    x: format!("{:.1}", x_of(g.at_ms.clamp(from_ms, to_ms))),
                    describe: format!(
                        "{}: data gap, {}{}, {}",
                        lane.stream_id,
                        g.range_text(),
                        match &g.worker {
                            Some(worker) => format!(", reported by {worker}"),
                            None => String::new(),
                        },
                        when(g.at_ms.min(to_ms), to_ms)
                    ),
                })
                .collect();
            DrawnLane {
                title: match &lane.worker {
                    Some(worker) => format!("{worker} · {}", lane.stream_id),
                    None => lane.stream_id.clone(),
                },
                stream_id: lane.stream_id.clone(),
                y: i as u32 * LANE_HEIGHT,
                segments,
                marks,
                data_gaps,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::streams::StreamState;

    fn change(
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

    fn row(owner: Option<&str>, token: u64) -> StreamRow {
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

    #[test]
    fn fenced_writes_land_on_the_lanes_of_the_streams_the_zombie_lost() {
        let mut takeover = change(60, ChangeKind::Takeover, Some("w1"), Some("w2"), 5, None);
        takeover.stream_id = "s".into();
        let fenced = FencedWrite {
            at_ms: 80,
            owner_id: "w1".into(),
            writes: 2,
            streams: vec!["s".into()],
        };
        let rows = [row(Some("w2"), 5)];
        let lanes_now = lanes(
            &rows,
            std::slice::from_ref(&takeover),
            std::slice::from_ref(&fenced),
            &GapLog::default(),
            0,
            100,
            false,
        );
        assert_eq!(lanes_now.len(), 1);
        assert_eq!(lanes_now[0].fenced.len(), 1);
        let drawn = draw(&lanes_now, 0, 100);
        assert_eq!(drawn[0].marks[0].x, "800.0");
        assert!(
            drawn[0].marks[0]
                .describe
                .contains("2 fenced write(s) from w1")
        );
        assert_eq!(drawn[0].segments[0].label, "#4");
        assert_eq!(drawn[0].segments[1].label, "#5");
        // Per worker: w1's lane carries the mark, w2's does not.
        let per_worker = lanes(
            &rows,
            &[takeover],
            &[fenced],
            &GapLog::default(),
            0,
            100,
            true,
        );
        let titles: Vec<_> = per_worker
            .iter()
            .map(|l| (l.worker.as_deref(), l.fenced.len()))
            .collect();
        assert_eq!(titles, [(Some("w1"), 1), (Some("w2"), 0)]);
    }

    #[test]
    fn data_gaps_are_marks_on_their_lane_beside_the_owner_bars() {
        use leasehold_telemetry::labels::GapReason;
        let takeover = change(60, ChangeKind::Takeover, Some("w1"), Some("w2"), 5, None);
        let rows = [row(Some("w2"), 5)];
        let mut gaps = GapLog::default();
        let gap = |at_ms: i64, from_seq: u64, worker: &str| DataGap {
            at_ms,
            from_seq,
            to_seq: from_seq + 9,
            missing: 10,
            reason: GapReason::Retention,
            worker: Some(worker.into()),
        };
        gaps.record("s", gap(-50, 1, "w1")); // before the window: not drawn
        gaps.record("s", gap(40, 100, "w1"));
        gaps.record("s", gap(90, 200, "w2"));
        gaps.record("other", gap(50, 7, "w2"));
        let drawn_lanes = lanes(
            &rows,
            std::slice::from_ref(&takeover),
            &[],
            &gaps,
            0,
            100,
            false,
        );
        let froms: Vec<u64> = drawn_lanes[0]
            .data_gaps
            .iter()
            .map(|g| g.from_seq)
            .collect();
        assert_eq!(froms, [100, 200], "the window's, oldest first");
        let drawn = draw(&drawn_lanes, 0, 100);
        let segments = |lanes: &[DrawnLane]| -> Vec<(String, String)> {
            lanes[0]
                .segments
                .iter()
                .map(|s| (s.x.clone(), s.w.clone()))
                .collect()
        };
        assert_eq!(
            segments(&drawn),
            segments(&draw(
                &lanes(
                    &rows,
                    std::slice::from_ref(&takeover),
                    &[],
                    &GapLog::default(),
                    0,
                    100,
                    false
                ),
                0,
                100
            )),
            "the owner bars are the same with or without gaps"
        );
        assert_eq!(drawn[0].data_gaps[0].x, "400.0");
        assert_eq!(
            drawn[0].data_gaps[1].describe,
            "s: data gap, seq 200–209 missing (10 events): retention, reported by w2, 10 ms before the snapshot"
        );
        // Per worker: each gap on the lane of the worker that reported it.
        let per_worker = lanes(&rows, &[takeover], &[], &gaps, 0, 100, true);
        let marks: Vec<_> = per_worker
            .iter()
            .map(|l| {
                (
                    l.worker.as_deref(),
                    l.data_gaps.iter().map(|g| g.from_seq).collect::<Vec<_>>(),
                )
            })
            .collect();
        assert_eq!(marks, [(Some("w1"), vec![100]), (Some("w2"), vec![200])]);
    }

    #[test]
    fn owner_colours_are_stable() {
        assert_eq!(owner_class("w1"), owner_class("w1"));
        assert!(owner_class("anything").starts_with("own-"));
    }
}
