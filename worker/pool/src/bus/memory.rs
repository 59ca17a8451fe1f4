//! The pool bus in one process, with the Redis bus's semantics: one keyspace
//! of strings, lists and hashes with TTLs on `tokio::time::Instant` (so tests
//! can pause the clock), each operation one mutex section (as each Lua script
//! is one atomic step in Redis), blocking pops woken by pushes, and glob
//! matching as Redis's `SCAN MATCH` does it.
//!
//! This file is the `PoolBus` impl: the one-command steps, and for every
//! other step a call into its module in `bus/` (`begin`, `answer`,
//! `claims`, `marks`, `queue`, `assign`, `credentials`, `paper_ledger`),
//! which holds the step's rule, its Lua and both buses' sides together.
//! `keyspace` holds the data model the steps run on, `reads` the `Inspect`
//! impl and the snapshot reads, `injection` the faults, clock skew and hooks
//! tests inject.

use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::bus::assign::{AssignRequest, Assignment};
use crate::keys;
use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    Answer, Answered, Begun, BusError, ClaimSettle, CredentialBus, IdleEntry, MarkBus, MarkWrite,
    Oversized, PoolBus, RESPONSE_TTL, Settled, Shed, Take, UserMessage, whole_seconds,
};
use crate::protocol::{self};

mod glob;
pub use glob::glob_match;

mod injection;
pub(in crate::bus) mod keyspace;
mod reads;

use injection::Hooks;
pub use injection::SnapshotRead;
use keyspace::{End, Keyspace, PURGE_EVERY};

/// The pool bus in memory. Share it as `Arc<MemoryPoolBus>` (or
/// `Arc<dyn PoolBus>`) between every component of one process.
#[derive(Debug, Default)]
pub struct MemoryPoolBus {
    pub(in crate::bus) keyspace: Mutex<Keyspace>,
    /// Woken on every push, so blocked pops look again.
    pub(in crate::bus) pushed: Notify,
    /// The next this many `begin_request` calls fail as if Redis were away.
    pub(in crate::bus) failing_begins: AtomicU32,
    /// The next this many `answer_request` / `drop_request` calls fail so.
    pub(in crate::bus) failing_answers: AtomicU32,
    /// The next this many `settle_claim` calls run, then fail as if the
    /// reply were lost.
    pub(in crate::bus) lost_settle_replies: AtomicU32,
    /// The next this many `refresh_user_mark` calls run, then fail as if
    /// the reply were lost.
    pub(in crate::bus) lost_refresh_replies: AtomicU32,
    /// The bus clock's offset from this host's, in ms ([`Self::skew_clock`]).
    pub(in crate::bus) clock_skew_ms: AtomicI64,
    /// Test hooks run after a read took its snapshot ([`Self::after_read`]).
    pub(in crate::bus) hooks: Hooks,
}

impl MemoryPoolBus {
    /// An empty bus.
    pub fn new() -> Self {
        MemoryPoolBus::default()
    }

    /// This bus's clock, unix ms.
    pub(in crate::bus) fn now_ms(&self) -> u64 {
        let host = leasehold_now_ms();
        host.saturating_add_signed(self.clock_skew_ms.load(Ordering::SeqCst))
    }

    pub(in crate::bus) fn lock(&self) -> MutexGuard<'_, Keyspace> {
        let mut keyspace = self.keyspace.lock().unwrap_or_else(|p| p.into_inner());
        keyspace.operations += 1;
        if keyspace.operations.is_multiple_of(PURGE_EVERY) {
            keyspace.purge_expired(Instant::now());
        }
        keyspace
    }

    pub(in crate::bus) fn push(&self, key: &str, body: &str, end: End) -> Result<(), BusError> {
        self.lock().push(key, body, end, Instant::now())?;
        self.pushed.notify_waiters();
        Ok(())
    }
}

#[async_trait]
impl MarkBus for MemoryPoolBus {
    async fn claim_user(&self, mark: &MarkWrite<'_>) -> Result<bool, BusError> {
        self.claim_user_in_memory(mark).await
    }

    async fn refresh_user_mark(&self, mark: &MarkWrite<'_>) -> Result<bool, BusError> {
        self.refresh_user_mark_in_memory(mark).await
    }

    async fn release_user_mark(&self, user_id: &str, worker_id: &str) -> Result<bool, BusError> {
        self.release_user_mark_in_memory(user_id, worker_id).await
    }

    async fn user_is_active(&self, user_id: &str) -> Result<bool, BusError> {
        Ok(self
            .lock()
            .exists(&keys::worker_active(user_id), Instant::now()))
    }

    async fn set_pool_mark(
        &self,
        worker_id: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<bool, BusError> {
        self.set_pool_mark_in_memory(worker_id, value, ttl).await
    }

    async fn delete_pool_mark(&self, worker_id: &str) -> Result<(), BusError> {
        self.delete_pool_mark_in_memory(worker_id).await
    }

    async fn idle_workers(&self) -> Result<Vec<IdleEntry>, BusError> {
        self.idle_workers_in_memory().await
    }

    async fn retire_idle(&self, worker_id: &str) -> Result<bool, BusError> {
        self.retire_idle_in_memory(worker_id).await
    }

    async fn delete_mark_if(
        &self,
        key: &str,
        expected: &str,
        also: &[String],
    ) -> Result<bool, BusError> {
        self.delete_mark_if_in_memory(key, expected, also).await
    }
}

#[async_trait]
impl CredentialBus for MemoryPoolBus {
    async fn credentials(&self, user_id: &str) -> Result<Option<String>, BusError> {
        self.lock().get(&keys::credentials(user_id), Instant::now())
    }

    async fn put_credentials(&self, user_id: &str, blob: &str) -> Result<(), BusError> {
        self.lock()
            .set(&keys::credentials(user_id), blob, None, Instant::now());
        Ok(())
    }

    async fn replace_credentials(
        &self,
        user_id: &str,
        expected: &str,
        blob: &str,
    ) -> Result<bool, BusError> {
        self.replace_credentials_in_memory(user_id, expected, blob)
            .await
    }

    async fn grant_credentials(
        &self,
        user_id: &str,
        grant: &str,
        ttl: Duration,
    ) -> Result<(), BusError> {
        self.lock().set(
            &keys::credentials_grant(user_id),
            grant,
            Some(Duration::from_secs(whole_seconds(ttl))),
            Instant::now(),
        );
        Ok(())
    }

    async fn assign_user(&self, request: &AssignRequest<'_>) -> Result<Assignment, BusError> {
        self.assign_user_in_memory(request).await
    }
}

/// The host's wall clock, unix ms.
fn leasehold_now_ms() -> u64 {
    use leasehold_platform::clock::{Clock, SystemClock};
    SystemClock.now_ms_u64()
}

/// Waits for the next push, like a blocking pop: `false` once `deadline`
/// passes or `interrupt` fires (the pop then returns nothing).
pub(in crate::bus) async fn wait_for_push(
    pushed: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
    deadline: Instant,
    interrupt: &CancellationToken,
) -> bool {
    if interrupt.is_cancelled() {
        return false;
    }
    tokio::select! {
        _ = pushed => true,
        _ = tokio::time::sleep_until(deadline) => false,
        _ = interrupt.cancelled() => false,
    }
}

#[cfg(test)]
mod tests;

#[async_trait]
impl PoolBus for MemoryPoolBus {
    async fn push_claim(&self, body: &str) -> Result<(), BusError> {
        self.push(keys::POOL_CLAIMS, body, End::Head)
    }

    async fn take_claim(
        &self,
        worker_id: &str,
        timeout: Duration,
        interrupt: &CancellationToken,
    ) -> Result<Take, BusError> {
        self.take_claim_in_memory(worker_id, timeout, interrupt)
            .await
    }

    async fn settle_claim(
        &self,
        mark: &MarkWrite<'_>,
        claim: &ClaimSettle<'_>,
    ) -> Result<Settled, BusError> {
        self.settle_claim_in_memory(mark, claim).await
    }

    async fn fail_claim(
        &self,
        worker_id: &str,
        raw: &[u8],
        outcome: Option<(&str, &str)>,
        reason: &str,
        at_unix_ms: u64,
    ) -> Result<bool, BusError> {
        self.fail_claim_in_memory(worker_id, raw, outcome, reason, at_unix_ms)
            .await
    }

    async fn return_claim(&self, worker_id: &str, raw: &[u8]) -> Result<bool, BusError> {
        self.return_claim_in_memory(worker_id, raw).await
    }

    async fn requeue_claims(&self, worker_id: &str) -> Result<u64, BusError> {
        self.requeue_claims_in_memory(worker_id).await
    }

    async fn set_if_absent(&self, key: &str, value: &str, ttl: Duration) -> Result<bool, BusError> {
        let now = Instant::now();
        let mut keyspace = self.lock();
        if keyspace.exists(key, now) {
            return Ok(false);
        }
        keyspace.set(
            key,
            value,
            Some(Duration::from_secs(whole_seconds(ttl))),
            now,
        );
        Ok(true)
    }

    async fn push_request(&self, user_id: &str, body: &str) -> Result<(), BusError> {
        self.push(&keys::user_requests(user_id), body, End::Head)
    }

    async fn push_control(&self, user_id: &str, body: &str) -> Result<(), BusError> {
        self.push(&keys::worker_control(user_id), body, End::Head)
    }

    async fn pop_user_message(
        &self,
        user_id: &str,
        max_bytes: usize,
        timeout: Duration,
        interrupt: &CancellationToken,
    ) -> Result<Option<UserMessage>, BusError> {
        self.pop_user_message_in_memory(user_id, max_bytes, timeout, interrupt)
            .await
    }

    async fn finish_control(&self, user_id: &str, raw: &[u8]) -> Result<(), BusError> {
        self.lock().remove_last(
            &keys::worker_control_processing(user_id),
            raw,
            Instant::now(),
        )?;
        Ok(())
    }

    async fn dead_letter(
        &self,
        list_key: &str,
        reason: &str,
        body: &str,
        at_unix_ms: u64,
    ) -> Result<(), BusError> {
        self.lock().push_dead(
            &keys::dead_letter(list_key),
            &protocol::dead_letter(reason, body, at_unix_ms),
            Instant::now(),
        )
    }

    async fn begin_request(
        &self,
        request_id: &str,
        user_id: &str,
        worker_id: &str,
        at_unix_ms: u64,
    ) -> Result<Begun, BusError> {
        self.begin_in_memory(request_id, user_id, worker_id, at_unix_ms)
            .await
    }

    async fn answer_request(&self, answer: &Answer<'_>) -> Result<Answered, BusError> {
        self.answer_in_memory(answer).await
    }

    async fn drop_oversized(&self, oversized: &Oversized<'_>) -> Result<bool, BusError> {
        self.drop_oversized_in_memory(oversized).await
    }

    async fn drop_request(
        &self,
        user_id: &str,
        raw: &[u8],
        reason: &str,
        at_unix_ms: u64,
    ) -> Result<(), BusError> {
        self.drop_request_in_memory(user_id, raw, reason, at_unix_ms)
            .await
    }

    async fn excess_requests(&self, user_id: &str, max: u64) -> Result<Vec<Vec<u8>>, BusError> {
        self.excess_requests_in_memory(user_id, max).await
    }

    async fn shed_request(&self, shed: &Shed<'_>) -> Result<bool, BusError> {
        self.shed_request_in_memory(shed).await
    }

    async fn put_response(
        &self,
        user_id: &str,
        request_id: &str,
        body: &str,
    ) -> Result<(), BusError> {
        self.lock().set(
            &keys::response(user_id, request_id),
            body,
            Some(RESPONSE_TTL),
            Instant::now(),
        );
        Ok(())
    }

    async fn maintenance_report(&self) -> Result<Option<String>, BusError> {
        self.lock()
            .get(keys::MAINTENANCE_LAST_REPORT, Instant::now())
    }

    async fn put_maintenance_report(&self, report: &str) -> Result<(), BusError> {
        self.lock()
            .set(keys::MAINTENANCE_LAST_REPORT, report, None, Instant::now());
        Ok(())
    }

    async fn delete_keys(&self, keys: &[String]) -> Result<u64, BusError> {
        let now = Instant::now();
        let mut keyspace = self.lock();
        Ok(keys.iter().filter(|key| keyspace.delete(key, now)).count() as u64)
    }
}
