//! Expiry probes: acquire attempts scheduled for the moment another owner's
//! lease becomes takeable, so a crashed owner's streams are taken over then and
//! not one discovery interval later.

use std::collections::BTreeSet;

use tokio::time::Instant;

/// Streams to try at given instants. Keyed by (instant, stream): many streams of
/// one crashed owner share an expiry, and each must get its attempt.
#[derive(Debug, Default)]
pub struct ExpiryProbes {
    due: BTreeSet<(Instant, String)>,
}

impl ExpiryProbes {
    /// Schedules an attempt on `stream` at `at`.
    pub fn schedule(&mut self, at: Instant, stream: String) {
        self.due.insert((at, stream));
    }

    /// When the earliest attempt is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.due.first().map(|(at, _)| *at)
    }

    /// Takes the earliest attempt.
    pub fn pop(&mut self) -> Option<String> {
        self.due.pop_first().map(|(_, stream)| stream)
    }

    /// Drops every attempt (a new scan schedules afresh).
    pub fn clear(&mut self) {
        self.due.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn streams_takeable_at_the_same_instant_each_get_an_attempt() {
        let mut probes = ExpiryProbes::default();
        let at = Instant::now() + Duration::from_secs(3);
        probes.schedule(at, "btc-usd".into());
        probes.schedule(at, "eth-usd".into());
        probes.schedule(at - Duration::from_secs(1), "sol-usd".into());
        assert_eq!(probes.next_due(), Some(at - Duration::from_secs(1)));
        let order: Vec<String> = std::iter::from_fn(|| probes.pop()).collect();
        assert_eq!(order, ["sol-usd", "btc-usd", "eth-usd"]);
        assert_eq!(probes.next_due(), None);
    }
}
