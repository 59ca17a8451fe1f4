//! When the claimed loop must act without a message: the idle timeout and the
//! health check of idle connections.

use std::time::Duration;

use tokio::time::Instant;

/// Ticks of the claimed loop: idle timeout, and the health check of connections
/// that have been idle for a period. Pure, so it is tested on tokio's paused clock.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    last_activity: Instant,
    last_health_check: Instant,
    idle_timeout: Duration,
    health_every: Duration,
}

/// What a [`Schedule`] says is due now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Nothing; wait for at most the given time.
    Wait(Duration),
    /// Ping idle connections.
    HealthCheck,
    /// Idle for too long: exit.
    IdleTimeout,
}

impl Schedule {
    /// Starting now.
    pub fn new(now: Instant, idle_timeout: Duration, health_every: Duration) -> Self {
        Schedule {
            last_activity: now,
            last_health_check: now,
            idle_timeout,
            health_every,
        }
    }

    /// A request or control message arrived.
    pub fn activity(&mut self, now: Instant) {
        self.last_activity = now;
    }

    /// A health check ran.
    pub fn health_checked(&mut self, now: Instant) {
        self.last_health_check = now;
    }

    /// What is due at `now`.
    pub fn due(&self, now: Instant) -> Due {
        let idle_deadline = self.last_activity + self.idle_timeout;
        if now >= idle_deadline {
            return Due::IdleTimeout;
        }
        // Only connections idle for a whole period are pinged: traffic proves health.
        let health_at = self.last_activity.max(self.last_health_check) + self.health_every;
        if now >= health_at {
            return Due::HealthCheck;
        }
        Due::Wait(idle_deadline.min(health_at) - now)
    }
}
