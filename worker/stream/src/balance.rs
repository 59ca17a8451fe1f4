//! Balancing decisions, free of I/O: a worker's fair share of the streams, how
//! many it hands back, how far an expiry probe may fill it, and when it stops
//! handing back because its peers do not take what it gives.
//!
//! The worker ([`crate::worker`]) takes a [`Census`] from each discovery scan
//! and asks these functions; unit tests here pin the rules, and
//! `devcluster/tests/it/balance.rs` runs whole workers against them.
//!
//! The rules, and the fault each one answers:
//! - **excess goes back at once**: a worker over the rounded-up share hands all
//!   of the excess back in one scan, so a cold start (the first worker took
//!   everything) or a scale-out converges within a scan, not one stream per scan;
//! - **one giver toward a starving peer**: within the rounded-up share, only the
//!   richest worker gives, and one stream per scan; and nobody gives while the
//!   streams no live worker holds already cover what the starving lack (a gift
//!   still on its way counts: a second giver whose scan falls between the
//!   first one's release and the starving peer's acquire would make the new
//!   worker's share two and leave a peer short);
//! - **probes respect the share**: an expiry probe fills a worker only up to the
//!   share it would have once the lapsing owner is gone;
//! - **no repeated gift to a peer that did not take the last one**: a gift still
//!   free a discovery interval later means the peers cannot take (a lower
//!   `MAX_STREAMS` during a roll-out, a broken peer); hand-backs stop until the
//!   live workers change or one of the peers takes something;
//! - **the starving choose first**: while a peer is below the rounded-down
//!   share, a worker at or above it leaves a free stream for a short grace
//!   before taking it, or a gift to a new worker is won as often as not by a
//!   peer with room, the richest gives again, and the new worker can go
//!   without a stream for minutes while one stream is passed around;
//! - **unowned is worse than unbalanced**: a stream free for a whole discovery
//!   interval is one nobody else takes; a worker takes it up to `MAX_STREAMS`,
//!   above its share.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio::time::Instant;

/// What one discovery scan saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Census {
    /// Stream leases in the table.
    pub streams: usize,
    /// Streams held per live worker (presence lease valid), the scanning worker included.
    pub held_by: BTreeMap<String, usize>,
}

impl Census {
    /// Streams no live worker holds: free, being handed over, or lapsing with a
    /// dead owner. The starving take these first.
    pub fn unheld(&self) -> usize {
        self.streams
            .saturating_sub(self.held_by.values().sum::<usize>())
    }

    /// The census once `owner` is gone (its leases are lapsing: crashed, paused
    /// or partitioned). Its streams are not counted as held by anyone.
    pub fn without(&self, owner: &str) -> Census {
        let mut held_by = self.held_by.clone();
        held_by.remove(owner);
        Census {
            streams: self.streams,
            held_by,
        }
    }
}

/// One worker's fair share, from a census.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// Streams ÷ live workers, rounded up (capped by the configured maximum).
    pub most: usize,
    /// Streams ÷ live workers, rounded down (capped by the configured maximum).
    pub least: usize,
    /// Some live worker holds fewer than `least`.
    someone_starving: bool,
    /// The starving lack more than the unheld streams can give them, so a
    /// holder must give.
    starving_unmet: bool,
    /// This worker holds the most streams (ties broken by owner id), so it is the
    /// one that gives a stream to a starving peer; one giver per scan avoids churn.
    richest: bool,
}

impl Share {
    /// `me`'s share under `census`, at most `max_streams`.
    pub fn of(census: &Census, me: &str, max_streams: usize) -> Share {
        let live = census.held_by.len().max(1);
        let least = (census.streams / live).min(max_streams);
        let richest = census
            .held_by
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then_with(|| a.0.cmp(b.0)))
            .is_some_and(|(owner, _)| owner == me);
        let lacking: usize = census
            .held_by
            .values()
            .map(|held| least.saturating_sub(*held))
            .sum();
        Share {
            most: census.streams.div_ceil(live).min(max_streams),
            least,
            someone_starving: lacking > 0,
            starving_unmet: lacking > census.unheld(),
            richest,
        }
    }

    /// Whether a free stream waits a grace before this worker, holding `held`,
    /// takes it: some peer is below the rounded-down share and this one is not,
    /// so the starving peer gets the first try (after the grace anyone may).
    pub fn defers_to_starving(&self, held: usize) -> bool {
        self.someone_starving && held >= self.least
    }

    /// Streams to hand back now, holding `held` (not counting those already
    /// being handed back): all of the excess over the rounded-up share, or one
    /// if this is the richest worker while a peer is below the rounded-down share
    /// and the unheld streams do not cover it.
    pub fn to_hand_back(&self, held: usize) -> usize {
        if held > self.most {
            held - self.most
        } else if self.starving_unmet && self.richest && held > self.least {
            1
        } else {
            0
        }
    }
}

/// Whether a gift was taken, as the next scan sees its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiftFate {
    /// Another live worker holds it now.
    Taken,
    /// Nobody holds it (or this worker took it back).
    Untaken,
}

/// The streams this worker handed back to balance, and whether its peers took
/// them. A peer that did not take the last gift does not get another one.
#[derive(Debug, Default)]
pub struct Gifts {
    given: HashMap<String, Instant>,
    /// What the peers held when a gift went untaken: no hand-backs while the
    /// same peers hold no more than that.
    refused_by: Option<BTreeMap<String, usize>>,
}

impl Gifts {
    /// Records that `stream` was handed back at `at`.
    pub fn give(&mut self, stream: &str, at: Instant) {
        self.given.insert(stream.to_owned(), at);
    }

    /// Judges the gifts: one a peer holds now is done with; one still untaken
    /// after `patience` (enough for the release, the doorbell and a peer's
    /// rescan) means the peers cannot take, so hand-backs stop until the live
    /// workers change or a peer holds more than it did then. Judged gifts are
    /// forgotten.
    pub fn review(
        &mut self,
        now: Instant,
        patience: Duration,
        census: &Census,
        me: &str,
        fate: impl Fn(&str) -> GiftFate,
    ) {
        let mut peers = census.held_by.clone();
        peers.remove(me);
        if let Some(then) = &self.refused_by {
            let same_peers = then.keys().eq(peers.keys());
            let one_took_more = peers.iter().any(|(peer, held)| then.get(peer) < Some(held));
            if !same_peers || one_took_more {
                self.refused_by = None;
            }
        }
        // Each scan judges what it sees: a gift seen taken is done with, even
        // if its taker hands it on before `patience` runs out (judged only then,
        // a stream taken and handed back in between would look refused, and
        // this worker would stop giving to a peer that is starving).
        let mut refused = false;
        self.given.retain(|stream, at| {
            if fate(stream) == GiftFate::Taken {
                return false;
            }
            if now.duration_since(*at) < patience {
                return true;
            }
            refused = true;
            false
        });
        if refused {
            self.refused_by = Some(peers);
        }
    }

    /// Whether handing back may go on (no untaken gift since the peers last changed).
    pub fn may_give(&self) -> bool {
        self.refused_by.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn census(streams: usize, pairs: &[(&str, usize)]) -> Census {
        Census {
            streams,
            held_by: pairs.iter().map(|(o, n)| (o.to_string(), *n)).collect(),
        }
    }

    #[test]
    fn the_whole_excess_goes_back_at_once() {
        // A cold start: the first worker took all 100 before its peers appeared.
        let cold = census(100, &[("a", 100), ("b", 0), ("c", 0), ("d", 0)]);
        assert_eq!(Share::of(&cold, "a", 100).to_hand_back(100), 75);
        let even = census(6, &[("a", 3), ("b", 3)]);
        assert_eq!(Share::of(&even, "a", 100).to_hand_back(3), 0);
    }

    #[test]
    fn a_starving_peer_gets_one_stream_from_the_richest_only() {
        // 6 streams over 4 workers: 2/2/2/0 is within the rounded-up share but
        // leaves one worker idle; exactly one giver moves one stream.
        let counts = census(6, &[("old1", 2), ("old2", 2), ("new1", 0), ("new2", 2)]);
        let gifts: Vec<_> = ["old1", "old2", "new2"]
            .into_iter()
            .map(|me| (me, Share::of(&counts, me, 100).to_hand_back(2)))
            .filter(|(_, n)| *n > 0)
            .collect();
        assert_eq!(gifts, [("old2", 1)]);
        assert_eq!(Share::of(&counts, "new1", 100).to_hand_back(0), 0);
    }

    #[test]
    fn a_gift_on_its_way_is_not_given_twice() {
        // w2 (the richest by owner id) has released one stream for n1; w1 scans
        // before n1 has taken it and is now the richest. The free stream covers
        // n1's lack, so nobody gives, yet the others still leave it to n1.
        let in_flight = census(
            8,
            &[
                ("n1", 0),
                ("w1", 2),
                ("w2", 1),
                ("w3", 1),
                ("w4", 1),
                ("w5", 1),
                ("w6", 1),
            ],
        );
        let share = Share::of(&in_flight, "w1", 100);
        assert_eq!(share.to_hand_back(2), 0);
        assert!(share.defers_to_starving(2));
        let taken = census(
            8,
            &[
                ("n1", 0),
                ("w1", 2),
                ("w2", 2),
                ("w3", 1),
                ("w4", 1),
                ("w5", 1),
                ("w6", 1),
            ],
        );
        assert_eq!(
            Share::of(&taken, "w2", 100).to_hand_back(2),
            1,
            "nothing unheld: the richest gives"
        );
    }

    #[test]
    fn only_the_starving_take_free_streams_at_once() {
        let c = census(
            8,
            &[
                ("n1", 0),
                ("w1", 1),
                ("w2", 2),
                ("w3", 1),
                ("w4", 2),
                ("w5", 1),
                ("w6", 1),
            ],
        );
        let share = Share::of(&c, "w1", 10);
        assert!(
            !share.defers_to_starving(0),
            "a starving worker takes at once"
        );
        assert!(share.defers_to_starving(1));
        assert!(share.defers_to_starving(2));
        let balanced = census(8, &[("w1", 2), ("w2", 2), ("w3", 2), ("w4", 2)]);
        assert!(!Share::of(&balanced, "w1", 10).defers_to_starving(1));
    }

    #[test]
    fn the_configured_maximum_caps_the_share() {
        let share = Share::of(&census(10, &[("a", 0)]), "a", 4);
        assert_eq!((share.most, share.least), (4, 4));
    }

    #[test]
    fn a_probe_fills_up_to_the_share_without_the_lapsing_owner() {
        // Five workers at 20 each; "e" crashed. The survivors' share is 25.
        let five = census(
            100,
            &[("a", 20), ("b", 20), ("c", 20), ("d", 20), ("e", 20)],
        );
        assert_eq!(Share::of(&five, "a", 100).most, 20);
        assert_eq!(Share::of(&five.without("e"), "a", 100).most, 25);
        assert_eq!(five.without("e").held_by.len(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_gift_nobody_took_stops_hand_backs_until_the_peers_change() {
        let patience = Duration::from_secs(5);
        let two = census(40, &[("a", 30), ("b", 10)]);
        let mut gifts = Gifts::default();
        gifts.give("s1", Instant::now());
        // Too early to judge: the peer may still be rescanning.
        gifts.review(Instant::now(), patience, &two, "a", |_| GiftFate::Untaken);
        assert!(gifts.may_give());
        tokio::time::advance(patience).await;
        gifts.review(Instant::now(), patience, &two, "a", |_| GiftFate::Untaken);
        assert!(!gifts.may_give(), "the peer did not take the last gift");
        let i_took_it_back = census(40, &[("a", 31), ("b", 10)]);
        gifts.review(Instant::now(), patience, &i_took_it_back, "a", |_| {
            GiftFate::Taken
        });
        assert!(!gifts.may_give(), "the same peers, holding no more");
        let three = census(40, &[("a", 30), ("b", 10), ("c", 0)]);
        gifts.review(Instant::now(), patience, &three, "a", |_| GiftFate::Taken);
        assert!(gifts.may_give(), "a new worker may take");
    }

    #[tokio::test(start_paused = true)]
    async fn a_gift_taken_and_handed_on_was_not_refused() {
        // The taker gives the stream on before the giver's patience runs out:
        // at that later scan it is free again, yet it was taken.
        let patience = Duration::from_secs(10);
        let peers = census(8, &[("a", 2), ("b", 1), ("c", 0)]);
        let mut gifts = Gifts::default();
        gifts.give("s1", Instant::now());
        tokio::time::advance(patience / 2).await;
        gifts.review(Instant::now(), patience, &peers, "a", |_| GiftFate::Taken);
        tokio::time::advance(patience).await;
        gifts.review(Instant::now(), patience, &peers, "a", |_| GiftFate::Untaken);
        assert!(gifts.may_give(), "a starving peer must still get a gift");
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_takes_something_may_get_gifts_again() {
        let two = census(40, &[("a", 30), ("b", 10)]);
        let mut gifts = Gifts::default();
        gifts.give("s1", Instant::now());
        tokio::time::advance(Duration::from_secs(5)).await;
        gifts.review(Instant::now(), Duration::from_secs(5), &two, "a", |_| {
            GiftFate::Untaken
        });
        assert!(!gifts.may_give());
        let took = census(40, &[("a", 29), ("b", 11)]);
        gifts.review(Instant::now(), Duration::from_secs(5), &took, "a", |_| {
            GiftFate::Taken
        });
        assert!(gifts.may_give());
    }
}
