//! What tests inject into the in-memory bus: failures of single steps (with
//! or without the step taking effect), a skewed clock, and hooks run between
//! a snapshot read and its caller's next step, for race tests. Kept apart
//! from the bus's steps, which only consult them.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use super::MemoryPoolBus;
use crate::bus::BusError;
// For the doc links only.
#[cfg(doc)]
use crate::bus::{CredentialBus, Inspect, MarkBus, PoolBus};

/// The snapshot reads a race test can interleave a change after.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SnapshotRead {
    /// [`Inspect::marks`] (the sweep's snapshot).
    Marks,
    /// [`PoolBus::idle_workers`] (the pool manager's and the claim's read).
    IdleWorkers,
}

/// A test hook run between a snapshot and its caller's next step.
pub(in crate::bus) type Hook =
    Box<dyn FnOnce() -> futures_util::future::BoxFuture<'static, ()> + Send>;

/// The hooks by read and call number (from 1), and the calls so far.
#[derive(Default)]
pub(in crate::bus) struct Hooks {
    hooks: Mutex<BTreeMap<(SnapshotRead, u32), Hook>>,
    calls: Mutex<BTreeMap<SnapshotRead, u32>>,
}

impl Hooks {
    /// Counts a call of `read` and runs its hook, if any.
    pub(in crate::bus) async fn run(&self, read: SnapshotRead) {
        let call = {
            let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
            let count = calls.entry(read).or_default();
            *count += 1;
            *count
        };
        let hook = self
            .hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(read, call));
        if let Some(hook) = hook {
            hook().await;
        }
    }
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks").finish_non_exhaustive()
    }
}

impl MemoryPoolBus {
    /// Makes the next `count` [`PoolBus::begin_request`] calls fail with
    /// [`BusError::Unavailable`] before touching anything: how tests show that
    /// a worker survives Redis going away mid-request without losing it.
    pub fn fail_begins(&self, count: u32) {
        self.failing_begins.store(count, Ordering::SeqCst);
    }

    /// The same for the next `count` [`PoolBus::answer_request`] and
    /// [`PoolBus::drop_request`] calls (the step after the broker call).
    pub fn fail_answers(&self, count: u32) {
        self.failing_answers.store(count, Ordering::SeqCst);
    }

    /// Makes the next `count` [`PoolBus::settle_claim`] calls take effect
    /// and then fail with [`BusError::Unavailable`], as when Redis ran the
    /// script and the reply was lost: how tests show that an unknown claim
    /// outcome is resolved, never taken for a failure.
    pub fn lose_settle_replies(&self, count: u32) {
        self.lost_settle_replies.store(count, Ordering::SeqCst);
    }

    /// Makes the next `count` [`PoolBus::refresh_user_mark`] calls take
    /// effect and then fail, as heartbeats whose replies are lost: the mark
    /// stays fresh, but its worker cannot tell.
    pub fn lose_refresh_replies(&self, count: u32) {
        self.lost_refresh_replies.store(count, Ordering::SeqCst);
    }

    /// Moves this bus's clock ([`Inspect::server_time_ms`], the `pool:idle`
    /// scores) `skew_ms` away from the host's, as a Redis server whose clock
    /// differs from the sweeper's.
    pub fn skew_clock(&self, skew_ms: i64) {
        self.clock_skew_ms.store(skew_ms, Ordering::SeqCst);
    }

    /// Runs `hook` right after the `call`-th `read` (counting from 1) took its
    /// snapshot and before it returns: how race tests change the bus between
    /// a snapshot and its caller's next step, deterministically. For tests.
    pub fn after_read<F>(&self, read: SnapshotRead, call: u32, hook: F)
    where
        F: FnOnce() -> futures_util::future::BoxFuture<'static, ()> + Send + 'static,
    {
        self.hooks
            .hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((read, call), Box::new(hook));
    }

    /// Writes `fields` into the hash at `key` as a foreign writer would, no
    /// step and no rule in between (Redis `HSET`): how the whole-domain tests
    /// set up records that no step writes. For tests.
    pub fn write_hash(&self, key: &str, fields: &[(&str, String)]) -> Result<(), BusError> {
        let now = tokio::time::Instant::now();
        self.lock().hash_set(key, fields, now)
    }

    pub(in crate::bus) fn inject_fault(counter: &AtomicU32) -> Result<(), BusError> {
        if counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(BusError::Unavailable("injected fault".into()));
        }
        Ok(())
    }
}
