//! Wall-clock time as a dependency.
//!
//! Lease expiry is compared across hosts, so it is wall-clock time (unix ms). The
//! holder's own deadline is monotonic (`tokio::time::Instant`) and never comes from
//! here. Tests that pause tokio's clock use [`PausedClock`] so both advance together.

use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in unix milliseconds.
pub trait Clock: Send + Sync + 'static {
    /// Now, in unix ms.
    fn now_ms(&self) -> i64;

    /// Now, in unix ms, for records that store time unsigned (0 before the epoch).
    fn now_ms_u64(&self) -> u64 {
        u64::try_from(self.now_ms()).unwrap_or(0)
    }
}

/// The system clock (keep it synchronised: it takes part in takeover decisions).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        unix_ms(SystemTime::now())
    }
}

impl SystemClock {
    /// Now, in unix microseconds: the exchange simulator stamps trades and
    /// acknowledgements this finely, as real exchanges do.
    pub fn now_us(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }

    /// How long ago (seconds, never negative) an upstream event stamped at
    /// `event_ms` (unix ms, possibly fractional) happened: the arrival lag.
    pub fn seconds_since(&self, event_ms: f64) -> f64 {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        ((now_ms - event_ms) / 1000.0).max(0.0)
    }
}

/// Unix ms of a system time (0 before the epoch).
pub fn unix_ms(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Wall-clock time that follows tokio's clock, so `tokio::time::pause()` and
/// `advance()` move it too. Starts at a fixed, recognisable instant.
#[derive(Debug, Clone, Copy)]
pub struct PausedClock {
    origin_ms: i64,
    origin: tokio::time::Instant,
}

impl PausedClock {
    /// A clock reading `origin_ms` now.
    pub fn starting_at(origin_ms: i64) -> Self {
        PausedClock {
            origin_ms,
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Clock for PausedClock {
    fn now_ms(&self) -> i64 {
        let elapsed = tokio::time::Instant::now().duration_since(self.origin);
        self.origin_ms + i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn paused_clock_follows_tokio_time() {
        let clock = PausedClock::starting_at(1_000);
        assert_eq!(clock.now_ms(), 1_000);
        tokio::time::advance(Duration::from_millis(2_500)).await;
        assert_eq!(clock.now_ms(), 3_500);
    }
}
