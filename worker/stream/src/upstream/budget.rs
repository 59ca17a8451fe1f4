//! How many upstream connections a worker may open per minute
//! (`UPSTREAM_CONNECTS_PER_MINUTE`), without I/O or a clock.
//!
//! Exchanges limit new connections per address over a rolling window
//! (Binance: 300 per 5 minutes per IP) and answer a burst past it by refusing
//! every connection for minutes. A worker that starts, takes over a crashed
//! peer's streams or reconnects after a network blip opens one connection per
//! stream at once; the budget spreads those over the window instead. It is a
//! rolling window, the exchanges' own shape (a token bucket with any burst
//! can exceed a rolling limit): a connect may go when fewer than `limit` went
//! in the `window` before it, else when the oldest of them leaves the window.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// The connects a worker made in the last window, and its limit.
#[derive(Debug)]
pub struct ConnectBudget {
    /// Most connects per window; 0: no limit.
    limit: usize,
    window: Duration,
    /// When each connect of the last window went (or will go), oldest first.
    recent: VecDeque<Instant>,
}

impl ConnectBudget {
    /// At most `limit` connects per `window`; `limit` 0 never waits.
    pub fn new(limit: usize, window: Duration) -> Self {
        ConnectBudget {
            limit,
            window,
            recent: VecDeque::with_capacity(limit),
        }
    }

    /// Takes a connect asked for at `now`: returns when it may go (`now`, or
    /// later when the window is full), and counts it at that time, so
    /// callers that wait are spread one window apart in the order they asked.
    pub fn reserve(&mut self, now: Instant) -> Instant {
        if self.limit == 0 {
            return now;
        }
        while self
            .recent
            .front()
            .is_some_and(|at| *at + self.window <= now)
        {
            self.recent.pop_front();
        }
        let at = if self.recent.len() < self.limit {
            now
        } else {
            // The connect `limit` places back leaves the window then.
            let leaves = self.recent[self.recent.len() - self.limit] + self.window;
            leaves.max(now)
        };
        self.recent.push_back(at);
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn without_a_limit_nothing_waits() {
        let now = Instant::now();
        let mut budget = ConnectBudget::new(0, MINUTE);
        assert!((0..1_000).all(|_| budget.reserve(now) == now));
    }

    #[test]
    fn past_the_limit_connects_wait_for_the_window_in_the_order_asked() {
        let t0 = Instant::now();
        let mut budget = ConnectBudget::new(3, MINUTE);
        let at: Vec<Instant> = (0..7).map(|_| budget.reserve(t0)).collect();
        assert_eq!(
            at,
            [
                t0,
                t0,
                t0,
                t0 + MINUTE,
                t0 + MINUTE,
                t0 + MINUTE,
                t0 + MINUTE * 2
            ]
        );
    }

    #[test]
    fn no_window_ever_holds_more_than_the_limit() {
        // Connects asked for at irregular times, a burst among them: in any
        // window at most `limit` go, and each goes as early as that allows.
        let t0 = Instant::now();
        let mut budget = ConnectBudget::new(5, MINUTE);
        let asked: Vec<Instant> = [0, 1, 1, 1, 2, 2, 2, 2, 30, 61, 62, 62, 200]
            .iter()
            .map(|s| t0 + Duration::from_secs(*s))
            .collect();
        let went: Vec<Instant> = asked.iter().map(|at| budget.reserve(*at)).collect();
        for (asked, went) in asked.iter().zip(&went) {
            assert!(went >= asked);
        }
        for start in &went {
            let inside = went
                .iter()
                .filter(|at| **at >= *start && **at < *start + MINUTE)
                .count();
            assert!(
                inside <= 5,
                "{inside} connects in the window from {start:?}"
            );
        }
        // The sixth waits for the first to leave the window, not longer.
        assert_eq!(went[5], t0 + MINUTE);
        assert_eq!(went[12], t0 + Duration::from_secs(200));
    }
}
