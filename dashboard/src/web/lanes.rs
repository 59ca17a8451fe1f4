//! Timeline lanes ([`crate::model::timeline`]) placed on an SVG's x axis:
//! bars with their colour class and label, marks for fenced writes and data
//! gaps, each with the text a screen reader (and the hover) gets.

use crate::model::timeline::{Lane, Segment};
use crate::web::column::duration_ms;

/// Width of the drawing area, in view-box units.
pub const WIDTH: f64 = 1000.0;

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

/// Owner colours in the stylesheet (`own-0` … `own-11`).
pub const OWNER_COLOURS: usize = 12;

/// Every owner on `lanes`, by name, with its colour class: distinct for up
/// to [`OWNER_COLOURS`] owners (a hash of the id reused colours among three
/// workers), and the legend's entries.
pub fn owner_legend(lanes: &[Lane]) -> Vec<(String, String)> {
    let owners: std::collections::BTreeSet<&str> = lanes
        .iter()
        .flat_map(|lane| lane.segments.iter().filter_map(|s| s.owner.as_deref()))
        .collect();
    owners
        .into_iter()
        .enumerate()
        .map(|(i, owner)| (owner.to_owned(), format!("own-{}", i % OWNER_COLOURS)))
        .collect()
}

fn when(at_ms: i64, to_ms: i64) -> String {
    format!("{} before the snapshot", duration_ms(to_ms - at_ms))
}

/// Places lanes on the x axis of `[from_ms, to_ms]`.
pub fn draw(lanes: &[Lane], from_ms: i64, to_ms: i64) -> Vec<DrawnLane> {
    let legend = owner_legend(lanes);
    let owner_class = |owner: &str| {
        legend
            .binary_search_by(|(known, _)| known.as_str().cmp(owner))
            .map_or_else(|_| "gap".to_owned(), |at| legend[at].1.clone())
    };
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
                        duration_ms(s.end_ms - s.start_ms),
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
    use crate::model::changes::{ChangeKind, FencedWrite};
    use crate::model::gaps::{DataGap, GapLog};
    use crate::model::timeline::lanes;
    use crate::model::timeline::tests::{change, row};

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
    fn owners_on_a_page_get_distinct_colours_and_a_legend() {
        use crate::model::timeline::{Lane, Segment};
        let lane = |owners: &[&str]| Lane {
            stream_id: "s".into(),
            worker: None,
            segments: owners
                .iter()
                .enumerate()
                .map(|(i, owner)| Segment {
                    start_ms: i as i64 * 10,
                    end_ms: i as i64 * 10 + 10,
                    owner: Some((*owner).to_owned()),
                    token: Some(i as u64 + 1),
                    began: "acquired",
                    ended: None,
                })
                .collect(),
            fenced: Vec::new(),
            data_gaps: Vec::new(),
            last_change_ms: 0,
        };
        // Three workers whose id hashes met in eight colours.
        let lanes = [
            lane(&["worker-3-g2", "worker-1-g2"]),
            lane(&["worker-2-g5"]),
        ];
        let legend = owner_legend(&lanes);
        assert_eq!(
            legend,
            [
                ("worker-1-g2".to_owned(), "own-0".to_owned()),
                ("worker-2-g5".to_owned(), "own-1".to_owned()),
                ("worker-3-g2".to_owned(), "own-2".to_owned()),
            ]
        );
        let drawn = draw(&lanes, 0, 30);
        let classes: Vec<&str> = drawn[0].segments.iter().map(|s| s.class.as_str()).collect();
        assert_eq!(classes, ["own-2", "own-0"]);
    }
}
