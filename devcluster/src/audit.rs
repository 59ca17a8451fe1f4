//! The sink audit `dev` prints when it stops: every stream's entries must
//! cover consecutive sequences (an event its own, a gap marker its range) with
//! non-decreasing fence tokens.

use leasehold_sink::memory::MemorySink;

/// What the sink holds, checked.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Audit {
    /// Streams with events.
    pub streams: usize,
    /// Events checked.
    pub events: usize,
    /// Places where a sequence was skipped without a gap marker.
    pub gaps: usize,
    /// Gap markers: ranges recorded as lost (a live upstream, a history
    /// that no longer had them).
    pub marked_gaps: usize,
    /// Places where a sequence repeated or went back.
    pub duplicates: usize,
    /// Places where the fence token went down.
    pub token_regressions: usize,
    /// Order-book snapshot entries (`--feed book`).
    pub snapshots: usize,
}

/// The one line `leasehold dev` prints after the drain.
impl std::fmt::Display for Audit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sink check: {} streams, {} events, {} gaps, {} duplicates, {} token regressions, {} gap markers",
            self.streams,
            self.events,
            self.gaps,
            self.duplicates,
            self.token_regressions,
            self.marked_gaps
        )?;
        if self.snapshots > 0 {
            write!(f, ", {} book snapshots", self.snapshots)?;
        }
        Ok(())
    }
}

/// Every stream's entries must cover consecutive sequences with non-decreasing
/// tokens. An order book's (`books`) diffs each cover a range their entry does
/// not record: there positions must strictly increase, and the first entry
/// must be a snapshot (a diff means nothing without the book before it).
pub fn audit(sink: &MemorySink, streams: &[String], books: bool) -> Audit {
    let mut audit = Audit::default();
    for stream in streams {
        let events = sink.events(stream);
        if events.is_empty() {
            continue;
        }
        audit.streams += 1;
        audit.snapshots += events.iter().filter(|e| e.snapshot).count();
        if books && !events[0].snapshot {
            audit.gaps += 1;
        }
        audit.marked_gaps += events.iter().filter(|e| e.gap.is_some()).count();
        audit.events += events
            .iter()
            .filter(|e| e.gap.is_none() && e.reset.is_none())
            .count();
        for pair in events.windows(2) {
            if pair[1].reset.is_some() {
                // A new epoch: the sequence starts over, the token must still rise.
                if pair[1].fence_token <= pair[0].fence_token {
                    audit.token_regressions += 1;
                }
                continue;
            }
            let next = if books && !pair[1].snapshot && pair[1].gap.is_none() {
                // A diff continues the book when its position is past the last.
                (pair[1].seq > pair[0].seq).then_some(pair[0].seq + 1)
            } else {
                Some(*pair[1].covers().start())
            };
            match next.map_or(std::cmp::Ordering::Less, |start| {
                start.cmp(&(pair[0].seq + 1))
            }) {
                std::cmp::Ordering::Equal => {}
                std::cmp::Ordering::Greater => audit.gaps += 1,
                std::cmp::Ordering::Less => audit.duplicates += 1,
            }
            if pair[1].fence_token < pair[0].fence_token {
                audit.token_regressions += 1;
            }
        }
    }
    audit
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_sink::{FencedSink, SinkBatch, SinkEvent, SinkOptions};

    #[tokio::test]
    async fn the_audit_finds_gaps_duplicates_and_token_regressions() {
        let sink = MemorySink::new(SinkOptions::default());
        let write = |token: u64, seqs: &[u64]| {
            let events: Vec<SinkEvent> = seqs
                .iter()
                .map(|seq| SinkEvent::data(*seq, format!("s:{seq}"), "{}"))
                .collect();
            (token, events)
        };
        let (_, mut marked) = write(2, &[6]);
        marked.insert(
            0,
            SinkEvent::gap(6, 9, leasehold_telemetry::GapReason::NoReplay),
        );
        marked[1].seq = 10;
        for (token, events) in [write(1, &[1, 2]), write(2, &[3, 5]), (2, marked)] {
            sink.open("s", token).await.unwrap();
            sink.write(SinkBatch {
                stream_id: "s",
                fence_token: token,
                events: &events,
            })
            .await
            .unwrap();
        }
        let audit = audit(&sink, &["s".to_owned(), "empty".to_owned()], false);
        assert_eq!((audit.streams, audit.events, audit.gaps), (1, 5, 1));
        assert_eq!(
            audit.marked_gaps, 1,
            "a marked range is not an unmarked gap"
        );
        assert_eq!((audit.duplicates, audit.token_regressions), (0, 0));
    }

    #[tokio::test]
    async fn a_book_starts_at_a_snapshot_and_its_diffs_only_move_forward() {
        let sink = MemorySink::new(SinkOptions::default());
        let book = |missed: Option<u64>, seq: u64| {
            SinkEvent::snapshot(
                seq,
                "{}",
                missed.map(|from| leasehold_sink::GapMark {
                    from,
                    reason: leasehold_telemetry::GapReason::NoReplay,
                }),
            )
        };
        let diff = |seq: u64| SinkEvent::data(seq, seq.to_string(), "{}");
        // Diffs skip ids (each covers a range); a later book names what it
        // replaced.
        let good = [
            book(None, 100),
            diff(107),
            diff(120),
            book(Some(121), 150),
            diff(160),
        ];
        // No book before the first diff.
        let bad = [diff(5), diff(9)];
        for (stream, events) in [("good", &good[..]), ("bad", &bad[..])] {
            sink.open(stream, 1).await.unwrap();
            sink.write(SinkBatch {
                stream_id: stream,
                fence_token: 1,
                events,
            })
            .await
            .unwrap();
        }
        let audit_of = |stream: &str| audit(&sink, &[stream.to_owned()], true);
        let good = audit_of("good");
        assert_eq!((good.gaps, good.duplicates, good.snapshots), (0, 0, 2));
        assert_eq!(audit_of("bad").gaps, 1, "a book without its snapshot");
        // Read as trades, the same diffs are holes.
        assert_eq!(audit(&sink, &["good".to_owned()], false).gaps, 3);
    }
}
