//! Exponential backoff with full jitter (AWS architecture blog, "Exponential
//! Backoff And Jitter"): the delay before retry *n* is uniform in
//! `[0, min(cap, base * 2^n)]`, which spreads a herd of retrying clients best.

use std::time::Duration;

/// Bounds of a backoff schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Upper bound of the first delay.
    pub base: Duration,
    /// No delay is longer than this.
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_millis(50),
            cap: Duration::from_secs(2),
        }
    }
}

impl Backoff {
    /// The ceiling of the delay before retry `attempt` (0-based), before jitter.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// A random delay in `[0, ceiling(attempt)]`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt).as_micros() as u64;
        Duration::from_micros(rand::random_range(0..=ceiling))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_doubles_up_to_the_cap() {
        let backoff = Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
        };
        assert_eq!(backoff.ceiling(0), Duration::from_millis(100));
        assert_eq!(backoff.ceiling(2), Duration::from_millis(400));
        assert_eq!(backoff.ceiling(4), Duration::from_secs(1));
        assert_eq!(backoff.ceiling(200), Duration::from_secs(1));
    }

    #[test]
    fn delays_stay_within_the_ceiling_and_vary() {
        let backoff = Backoff::default();
        let delays: Vec<_> = (0..200).map(|_| backoff.delay(3)).collect();
        assert!(delays.iter().all(|d| *d <= backoff.ceiling(3)));
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 100, "full jitter should spread delays");
    }
}
