//! Assigned discovery's plan: which live worker each stream should be with,
//! decided by the one worker holding the assigner lease from one eventually
//! consistent scan, and written as each stream's `assignee`.
//!
//! The plan is advice, never ownership. A worker acts on its assignments only
//! through the keeper's conditional acquire (and hands a stream back only
//! after a strongly consistent re-read shows it assigned elsewhere), so a
//! stale plan, two assigners for a while, or a dead one can slow streams
//! down or move them twice, but never give a stream two owners: that is the
//! acquire's condition alone (docs/invariants.md, invariant 1).
//!
//! The plan keeps moves few: a stream stays where the last plan put it while
//! that worker lives and is within its quota (then with its live holder, for
//! a stream that never had advice or whose assignee died), and only what is
//! over a quota or has no live anchor moves, to the least-loaded workers.

use std::collections::BTreeMap;

/// A stream as the assigner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seat<'a> {
    /// The stream.
    pub stream_id: &'a str,
    /// Its holder, if that holder is a live worker and the lease is current.
    pub holder: Option<&'a str>,
    /// The stored advice (`assignee`), whatever it names.
    pub assignee: Option<&'a str>,
}

/// One `assignee` to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The stream.
    pub stream_id: String,
    /// The worker it should be with.
    pub assignee: String,
}

/// Each stream's worker among `workers` (the live ones, each with the most
/// streams it holds, its `MAX_STREAMS`): every worker gets ⌊n/w⌋ or ⌈n/w⌉
/// streams, or all it can hold when that is fewer (the others share the
/// rest); returns only the streams whose advice changes. No live worker, or
/// no room left: those streams keep their advice (it waits for a worker).
pub fn plan<'a>(seats: &'a [Seat<'a>], workers: &BTreeMap<&'a str, usize>) -> Vec<Change> {
    if workers.is_empty() {
        return Vec::new();
    }
    let live =
        |worker: Option<&'a str>| -> Option<&'a str> { worker.filter(|w| workers.contains_key(w)) };
    // Anchored: where a stream stays if there is room. The last plan first
    // (a move under way is not undone), the live holder for the rest.
    let mut anchored: BTreeMap<&'a str, Vec<&'a Seat<'a>>> =
        workers.keys().map(|w| (*w, Vec::new())).collect();
    let mut spill: Vec<&'a Seat<'a>> = Vec::new();
    for seat in seats {
        match live(seat.assignee).or(live(seat.holder)) {
            Some(anchor) => anchored.entry(anchor).or_default().push(seat),
            None => spill.push(seat),
        }
    }
    let quota = quotas(seats.len(), workers, &anchored);
    let mut desired: BTreeMap<&str, &str> = BTreeMap::new();
    let mut load: BTreeMap<&str, usize> = workers.keys().map(|w| (*w, 0)).collect();
    for (worker, mut streams) in anchored {
        // Held streams are kept first: moving them costs a hand-off.
        streams.sort_by_key(|s| (s.holder != Some(worker), s.stream_id));
        let keep = quota[worker].min(streams.len());
        for seat in streams.drain(..keep) {
            desired.insert(seat.stream_id, worker);
        }
        load.insert(worker, keep);
        spill.extend(streams);
    }
    spill.sort_by_key(|s| s.stream_id);
    for seat in spill {
        // Some worker is below its quota: the quotas add up to every stream.
        let Some((worker, _)) = load
            .iter()
            .filter(|(w, l)| **l < quota[**w])
            .min_by_key(|(w, l)| (**l, **w))
            .map(|(w, l)| (*w, *l))
        else {
            break;
        };
        desired.insert(seat.stream_id, worker);
        *load.entry(worker).or_default() += 1;
    }
    seats
        .iter()
        .filter_map(|seat| {
            let worker = desired.get(seat.stream_id)?;
            (seat.assignee != Some(*worker)).then(|| Change {
                stream_id: seat.stream_id.to_owned(),
                assignee: (*worker).to_owned(),
            })
        })
        .collect()
}

/// How many streams each worker should have: a worker that holds fewer than
/// its share gets all it can, the others share the rest evenly, and the ones
/// that already have the most keep the one extra stream each (fewer moves;
/// ties by id, so every assigner plans alike).
fn quotas<'a>(
    streams: usize,
    capacity: &BTreeMap<&'a str, usize>,
    anchored: &BTreeMap<&'a str, Vec<&Seat<'_>>>,
) -> BTreeMap<&'a str, usize> {
    let mut quota: BTreeMap<&str, usize> = BTreeMap::new();
    loop {
        let open: Vec<&str> = capacity
            .keys()
            .filter(|w| !quota.contains_key(*w))
            .copied()
            .collect();
        if open.is_empty() {
            return quota;
        }
        let remaining = streams.saturating_sub(quota.values().sum());
        let share = remaining.div_ceil(open.len());
        let full: Vec<&str> = open
            .iter()
            .filter(|w| capacity[*w] < share)
            .copied()
            .collect();
        if full.is_empty() {
            let mut by_anchored = open;
            by_anchored.sort_by(|a, b| anchored[b].len().cmp(&anchored[a].len()).then(a.cmp(b)));
            let (base, extra) = (remaining / by_anchored.len(), remaining % by_anchored.len());
            for (rank, worker) in by_anchored.into_iter().enumerate() {
                quota.insert(worker, base + usize::from(rank < extra));
            }
            return quota;
        }
        for worker in full {
            quota.insert(worker, capacity[worker]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `count` streams, `s-0000` …, held by and assigned to whoever `at` says.
    fn table(count: usize, at: impl Fn(usize) -> (Option<String>, Option<String>)) -> Table {
        Table(
            (0..count)
                .map(|i| {
                    let (holder, assignee) = at(i);
                    (format!("s-{i:04}"), holder, assignee)
                })
                .collect(),
        )
    }

    struct Table(Vec<(String, Option<String>, Option<String>)>);

    impl Table {
        fn seats(&self) -> Vec<Seat<'_>> {
            self.0
                .iter()
                .map(|(id, holder, assignee)| Seat {
                    stream_id: id,
                    holder: holder.as_deref(),
                    assignee: assignee.as_deref(),
                })
                .collect()
        }

        /// Applies a plan that may leave streams without advice; streams per
        /// advised worker.
        fn apply_partial(&mut self, changes: &[Change]) -> BTreeMap<String, usize> {
            for change in changes {
                let row = self.0.iter_mut().find(|r| r.0 == change.stream_id).unwrap();
                row.2 = Some(change.assignee.clone());
            }
            let mut per_worker = BTreeMap::new();
            for (_, _, assignee) in &self.0 {
                if let Some(assignee) = assignee {
                    *per_worker.entry(assignee.clone()).or_default() += 1;
                }
            }
            per_worker
        }

        /// Applies a plan that must advise every stream; streams per worker.
        fn apply(&mut self, changes: &[Change]) -> BTreeMap<String, usize> {
            let per_worker = self.apply_partial(changes);
            assert!(
                self.0.iter().all(|row| row.2.is_some()),
                "a stream left without advice"
            );
            per_worker
        }
    }

    fn names(count: usize) -> Vec<String> {
        (0..count).map(|i| format!("w{i:03}")).collect()
    }

    fn live(names: &[String]) -> BTreeMap<&str, usize> {
        names.iter().map(|n| (n.as_str(), usize::MAX)).collect()
    }

    #[test]
    fn a_cold_table_is_spread_evenly_and_a_second_pass_changes_nothing() {
        let workers = names(7);
        let mut table = table(100, |_| (None, None));
        let changes = plan(&table.seats(), &live(&workers));
        assert_eq!(changes.len(), 100);
        let per_worker = table.apply(&changes);
        assert_eq!(per_worker.len(), 7);
        assert!(
            per_worker.values().all(|n| (14..=15).contains(n)),
            "{per_worker:?}"
        );
        assert!(plan(&table.seats(), &live(&workers)).is_empty(), "stable");
    }

    #[test]
    fn scale_out_moves_only_what_the_newcomers_need() {
        let before = names(100);
        let mut table = table(10_000, |i| {
            let w = before[i % 100].clone();
            (Some(w.clone()), Some(w))
        });
        let after = names(110);
        let changes = plan(&table.seats(), &live(&after));
        // 10,000 / 110: each newcomer needs 90 or 91, ideally 909 moves.
        assert!(changes.len() <= 910, "{} moves", changes.len());
        let per_worker = table.apply(&changes);
        assert_eq!(per_worker.len(), 110);
        assert!(
            per_worker.values().all(|n| (90..=91).contains(n)),
            "{per_worker:?}"
        );
    }

    #[test]
    fn a_dead_workers_streams_go_to_the_least_loaded_and_nothing_else_moves() {
        let workers = names(4);
        let mut table = table(40, |i| {
            let w = workers[i % 4].clone();
            (Some(w.clone()), Some(w))
        });
        let survivors = live(&workers[1..]);
        let changes = plan(&table.seats(), &survivors);
        assert_eq!(changes.len(), 10, "only w000's ten streams move");
        assert!(changes.iter().all(|c| c.assignee != "w000"));
        let per_worker = table.apply(&changes);
        assert!(
            per_worker.values().all(|n| (13..=14).contains(n)),
            "{per_worker:?}"
        );
    }

    #[test]
    fn a_move_under_way_is_not_undone_and_a_pushed_stream_stays_with_its_taker() {
        let workers = names(2);
        // s-0000: held by w000, advised to w001 (w000 has not handed it back
        // yet). s-0001: taken by w001 after a push, advice names a worker
        // that is gone. s-0002, s-0003: w000's.
        let table = Table(vec![
            ("s-0000".into(), Some("w000".into()), Some("w001".into())),
            ("s-0001".into(), Some("w001".into()), Some("gone".into())),
            ("s-0002".into(), Some("w000".into()), Some("w000".into())),
            ("s-0003".into(), Some("w000".into()), Some("w000".into())),
        ]);
        let changes = plan(&table.seats(), &live(&workers));
        assert_eq!(
            changes,
            [Change {
                stream_id: "s-0001".into(),
                assignee: "w001".into()
            }],
            "the advice follows the taker; the move of s-0000 stands"
        );
    }

    #[test]
    fn an_over_quota_worker_gives_up_what_it_does_not_hold_first() {
        let workers = names(2);
        // w000 is advised three streams but holds only s-0002.
        let table = Table(vec![
            ("s-0000".into(), None, Some("w000".into())),
            ("s-0001".into(), None, Some("w000".into())),
            ("s-0002".into(), Some("w000".into()), Some("w000".into())),
            ("s-0003".into(), None, None),
        ]);
        let changes = plan(&table.seats(), &live(&workers));
        let moved: Vec<&str> = changes.iter().map(|c| c.stream_id.as_str()).collect();
        assert_eq!(moved, ["s-0001", "s-0003"]);
        assert!(changes.iter().all(|c| c.assignee == "w001"));
    }

    #[test]
    fn without_live_workers_the_advice_waits() {
        let table = table(3, |_| (Some("gone".into()), Some("gone".into())));
        assert!(plan(&table.seats(), &BTreeMap::new()).is_empty());
    }

    #[test]
    fn a_worker_is_never_advised_more_than_it_holds_and_the_others_share_the_rest() {
        let workers = names(3);
        let mut capacity = live(&workers);
        capacity.insert("w001", 5);
        let mut cold = table(41, |_| (None, None));
        let per_worker = cold.apply(&plan(&cold.seats(), &capacity));
        assert_eq!(per_worker["w001"], 5);
        assert_eq!((per_worker["w000"], per_worker["w002"]), (18, 18));
        // Room for fewer than there are streams: the rest keep their advice.
        capacity.insert("w000", 10);
        capacity.insert("w002", 10);
        let mut short = table(41, |_| (None, None));
        let changes = plan(&short.seats(), &capacity);
        assert_eq!(changes.len(), 25);
        let per_worker = short.apply_partial(&changes);
        assert_eq!(per_worker.values().sum::<usize>(), 25);
    }
}
