//! Expiry probes: acquire attempts scheduled for the moment another owner's
//! lease becomes takeable, so a crashed owner's streams are taken over then and
//! not one discovery interval later; and for the end of the grace a free
//! stream is left to a starving peer ([`crate::balance`]).

use std::collections::BTreeMap;

use tokio::time::Instant;

/// Streams to try at given instants, with the owner whose lease is lapsing
/// (`None`: the stream was free, left to a starving peer).
/// Keyed by (instant, stream): many streams of one crashed owner share an
/// expiry, and each must get its attempt.
#[derive(Debug, Default)]
pub struct ExpiryProbes {
    due: BTreeMap<(Instant, String), Option<String>>,
}

/// A due attempt: the stream, and the owner whose lease lapsed (the worker
/// leaves it out of the fair share it fills up to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The stream to try.
    pub stream: String,
    /// Its owner at the scan (`None`: free then).
    pub lapsing_owner: Option<String>,
}

impl ExpiryProbes {
    /// Schedules an attempt on `stream`, held by `owner`, at `at`.
    pub fn schedule(&mut self, at: Instant, stream: String, owner: Option<String>) {
        self.due.insert((at, stream), owner);
    }

    /// When the earliest attempt is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.due.first_key_value().map(|((at, _), _)| *at)
    }

    /// Takes the earliest attempt.
    pub fn pop(&mut self) -> Option<Probe> {
        self.due
            .pop_first()
            .map(|((_, stream), lapsing_owner)| Probe {
                stream,
                lapsing_owner,
            })
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
        probes.schedule(at, "btc-usd".into(), Some("w1".into()));
        probes.schedule(at, "eth-usd".into(), None);
        probes.schedule(
            at - Duration::from_secs(1),
            "sol-usd".into(),
            Some("w2".into()),
        );
        assert_eq!(probes.next_due(), Some(at - Duration::from_secs(1)));
        let first = probes.pop().expect("a probe");
        assert_eq!(first.lapsing_owner.as_deref(), Some("w2"));
        let order: Vec<String> = std::iter::once(first.stream)
            .chain(std::iter::from_fn(|| probes.pop().map(|p| p.stream)))
            .collect();
        assert_eq!(order, ["sol-usd", "btc-usd", "eth-usd"]);
        assert_eq!(probes.next_due(), None);
    }
}
