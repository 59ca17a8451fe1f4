//! The pool bus in one process, with the Redis bus's semantics: one keyspace
//! of strings, lists and hashes with TTLs on `tokio::time::Instant` (so tests
//! can pause the clock), each operation one mutex section (as each Lua script
//! is one atomic step in Redis), blocking pops woken by pushes, and glob
//! matching as Redis's `SCAN MATCH` does it.
//!
//! This file is the `PoolBus` impl; `keyspace` holds the data model it runs
//! on, `reads` the `Inspect` and ledger impls and the snapshot reads,
//! `injection` the faults, clock skew and hooks tests inject.

use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::bus::assign::{
    AssignRequest, Assignment, MarkSeen, SealHolder, assign_rule, used_grant,
};
use crate::keys;
use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    Answer, Answered, Begun, BusError, CLAIM_OUTCOME_TTL, ClaimBus, ClaimSettle, CredentialBus,
    IdleEntry, MarkBus, MarkWrite, MessageKind, Oversized, REQUEST_RECORD_TTL, RESPONSE_TTL,
    ReportBus, RequestBus, SHED_BATCH, Settled, Shed, Take, TakenClaim, UserMessage, UserQueue,
    whole_seconds,
};
use crate::protocol::{self, record};

mod glob;
pub use glob::glob_match;

mod injection;
pub(in crate::bus) mod keyspace;
mod reads;

use injection::Hooks;
pub use injection::SnapshotRead;
use keyspace::{End, Keyspace, PURGE_EVERY, bounded};

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
        let now = Instant::now();
        let ttl = Duration::from_secs(whole_seconds(mark.ttl));
        let mut keyspace = self.lock();
        if !keyspace.taken_for(mark, ttl, now)? {
            return Ok(false);
        }
        keyspace.delete(&keys::pool_worker_active(mark.worker_id), now);
        keyspace.delete(&keys::worker_metadata(mark.user_id), now);
        keyspace.write_metadata(mark, ttl, now)?;
        Ok(true)
    }

    async fn refresh_user_mark(&self, mark: &MarkWrite<'_>) -> Result<bool, BusError> {
        let now = Instant::now();
        let ttl = Duration::from_secs(whole_seconds(mark.ttl));
        let mut keyspace = self.lock();
        if !keyspace.mark_is_mine_or_absent(mark.user_id, mark.worker_id, now)? {
            return Ok(false);
        }
        keyspace.check_hash(&keys::worker_metadata(mark.user_id), now)?;
        keyspace.set(
            &keys::worker_active(mark.user_id),
            mark.value,
            Some(ttl),
            now,
        );
        keyspace.write_metadata(mark, ttl, now)?;
        drop(keyspace);
        Self::inject_fault(&self.lost_refresh_replies)?;
        Ok(true)
    }

    async fn release_user_mark(&self, user_id: &str, worker_id: &str) -> Result<bool, BusError> {
        let now = Instant::now();
        let mut keyspace = self.lock();
        if !keyspace.mark_is_mine_or_absent(user_id, worker_id, now)? {
            return Ok(false);
        }
        keyspace.delete(&keys::worker_active(user_id), now);
        keyspace.delete(&keys::worker_metadata(user_id), now);
        Ok(true)
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
        let ttl = Duration::from_secs(whole_seconds(ttl));
        let (now, clock) = (Instant::now(), self.now_ms());
        let mut keyspace = self.lock();
        // Fails like the script's ZSCORE before anything is written.
        let retired = keyspace.retired(worker_id, now)?;
        keyspace.set(&keys::pool_worker_active(worker_id), value, Some(ttl), now);
        if retired {
            return Ok(false);
        }
        let score = i64::try_from(clock).unwrap_or(i64::MAX);
        keyspace.zadd(keys::POOL_IDLE, worker_id, score, now)?;
        Ok(true)
    }

    async fn delete_pool_mark(&self, worker_id: &str) -> Result<(), BusError> {
        let now = Instant::now();
        let mut keyspace = self.lock();
        keyspace.sorted_set(keys::POOL_IDLE, now)?;
        keyspace.delete(&keys::pool_worker_active(worker_id), now);
        keyspace.zrem(keys::POOL_IDLE, worker_id, now)
    }

    async fn idle_workers(&self) -> Result<Vec<IdleEntry>, BusError> {
        let idle = self.idle_now()?;
        self.hooks.run(SnapshotRead::IdleWorkers).await;
        Ok(idle)
    }

    async fn retire_idle(&self, worker_id: &str) -> Result<bool, BusError> {
        let now = Instant::now();
        let mut keyspace = self.lock();
        if keyspace
            .zscore(keys::POOL_IDLE, worker_id, now)?
            .is_none_or(|score| score < 0)
        {
            return Ok(false);
        }
        let busy = keyspace
            .list(&keys::claims_processing(worker_id), now)?
            .is_some_and(|list| !list.is_empty());
        if busy || !keyspace.exists(&keys::pool_worker_active(worker_id), now) {
            return Ok(false);
        }
        keyspace.zadd(keys::POOL_IDLE, worker_id, -1, now)?;
        Ok(true)
    }

    async fn delete_mark_if(
        &self,
        key: &str,
        expected: &str,
        also: &[String],
    ) -> Result<bool, BusError> {
        let now = Instant::now();
        let mut keyspace = self.lock();
        if keyspace.get(key, now)?.as_deref() != Some(expected) {
            return Ok(false);
        }
        keyspace.delete(key, now);
        for other in also {
            keyspace.delete(other, now);
        }
        Ok(true)
    }
}

#[async_trait]
impl ClaimBus for MemoryPoolBus {
    async fn push_claim(&self, body: &str) -> Result<(), BusError> {
        self.push(keys::POOL_CLAIMS, body, End::Head)
    }

    async fn take_claim(
        &self,
        worker_id: &str,
        timeout: Duration,
        interrupt: &CancellationToken,
    ) -> Result<Take, BusError> {
        let processing = keys::claims_processing(worker_id);
        let deadline = Instant::now() + timeout;
        loop {
            // Registered before looking, so a push between the look and the
            // wait still wakes this take.
            let pushed = self.pushed.notified();
            tokio::pin!(pushed);
            pushed.as_mut().enable();
            {
                let now = Instant::now();
                let mut keyspace = self.lock();
                if keyspace.retired(worker_id, now)? {
                    keyspace.hand_back(worker_id, now)?;
                    drop(keyspace);
                    self.pushed.notify_waiters();
                    return Ok(Take::Retired);
                }
                if let Some(held) = keyspace
                    .list(&processing, now)?
                    .and_then(|list| list.back().cloned())
                {
                    return Ok(Take::Claim(TakenClaim {
                        raw: held.into_bytes(),
                    }));
                }
                if let Some(moved) = keyspace.move_oldest(keys::POOL_CLAIMS, &processing, now)? {
                    return Ok(Take::Claim(TakenClaim {
                        raw: moved.into_bytes(),
                    }));
                }
            }
            if !wait_for_push(pushed, deadline, interrupt).await {
                return Ok(Take::Empty);
            }
        }
    }

    async fn settle_claim(
        &self,
        mark: &MarkWrite<'_>,
        claim: &ClaimSettle<'_>,
    ) -> Result<Settled, BusError> {
        let now = Instant::now();
        let ttl = Duration::from_secs(whole_seconds(mark.ttl));
        let mut keyspace = self.lock();
        if !keyspace.remove_last(&keys::claims_processing(mark.worker_id), claim.raw, now)? {
            return Ok(Settled::NotHeld);
        }
        let outcome = keys::claim_outcome(claim.claim_id);
        if !keyspace.taken_for(mark, ttl, now)? {
            // A claim settled before (a re-queue after a failover lost the
            // step's removal) keeps its outcome: `failed` must not replace the
            // `claimed` of the worker that serves the user.
            if !keyspace.exists(&outcome, now) {
                keyspace.set(&outcome, claim.refused, Some(CLAIM_OUTCOME_TTL), now);
            }
            return Ok(Settled::Refused);
        }
        keyspace.delete(&keys::pool_worker_active(mark.worker_id), now);
        keyspace.delete(&keys::worker_metadata(mark.user_id), now);
        keyspace.write_metadata(mark, ttl, now)?;
        keyspace.set(&outcome, claim.claimed, Some(CLAIM_OUTCOME_TTL), now);
        drop(keyspace);
        Self::inject_fault(&self.lost_settle_replies)?;
        Ok(Settled::Claimed)
    }

    async fn fail_claim(
        &self,
        worker_id: &str,
        raw: &[u8],
        outcome: Option<(&str, &str)>,
        reason: &str,
        at_unix_ms: u64,
    ) -> Result<bool, BusError> {
        let now = Instant::now();
        let mut keyspace = self.lock();
        if !keyspace.remove_last(&keys::claims_processing(worker_id), raw, now)? {
            return Ok(false);
        }
        keyspace.push_dead(
            &keys::dead_letter(keys::POOL_CLAIMS),
            &protocol::dead_letter_raw(reason, raw, at_unix_ms),
            now,
        )?;
        if let Some((claim_id, outcome)) = outcome {
            keyspace.set(
                &keys::claim_outcome(claim_id),
                outcome,
                Some(CLAIM_OUTCOME_TTL),
                now,
            );
        }
        Ok(true)
    }

    async fn return_claim(&self, worker_id: &str, raw: &[u8]) -> Result<bool, BusError> {
        let now = Instant::now();
        {
            let mut keyspace = self.lock();
            if !keyspace.remove_last(&keys::claims_processing(worker_id), raw, now)? {
                return Ok(false);
            }
            keyspace.push(
                keys::POOL_CLAIMS,
                &String::from_utf8_lossy(raw),
                End::Tail,
                now,
            )?;
        }
        self.pushed.notify_waiters();
        Ok(true)
    }

    async fn requeue_claims(&self, worker_id: &str) -> Result<u64, BusError> {
        let now = Instant::now();
        let processing = keys::claims_processing(worker_id);
        let mut moved = 0;
        {
            let mut keyspace = self.lock();
            if keyspace.exists(&keys::pool_worker_active(worker_id), now) {
                return Ok(0);
            }
            // Newest first to the serving end, so the oldest is served first.
            while let Some((_, body)) =
                keyspace.pop_first(std::slice::from_ref(&processing), End::Head, now)?
            {
                keyspace.push(keys::POOL_CLAIMS, &body, End::Tail, now)?;
                moved += 1;
            }
        }
        if moved > 0 {
            self.pushed.notify_waiters();
        }
        Ok(moved)
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
}

#[async_trait]
impl RequestBus for MemoryPoolBus {
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
        // Control messages before requests; in each queue, the message already
        // being handled (a predecessor's) before the oldest waiting.
        let queues =
            [MessageKind::Control, MessageKind::Request].map(|kind| (kind, kind.queue(user_id)));
        let deadline = Instant::now() + timeout;
        loop {
            // Registered before looking, so a push between the look and the
            // wait still wakes this pop.
            let pushed = self.pushed.notified();
            tokio::pin!(pushed);
            pushed.as_mut().enable();
            {
                let now = Instant::now();
                let mut keyspace = self.lock();
                for (kind, queue) in &queues {
                    if let Some(handling) = keyspace
                        .list(&queue.processing, now)?
                        .and_then(|list| list.back().cloned())
                    {
                        return Ok(Some(bounded(*kind, handling, max_bytes)));
                    }
                    if let Some(moved) =
                        keyspace.move_oldest(&queue.list, &queue.processing, now)?
                    {
                        return Ok(Some(bounded(*kind, moved, max_bytes)));
                    }
                }
            }
            if !wait_for_push(pushed, deadline, interrupt).await {
                return Ok(None);
            }
        }
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
        Self::inject_fault(&self.failing_answers)?;
        let now = Instant::now();
        let mut keyspace = self.lock();
        let UserQueue { list, processing } = oversized.kind.queue(oversized.user_id);
        let tail = keyspace
            .list(&processing, now)?
            .and_then(|list| list.back().cloned())
            .filter(|tail| {
                tail.len() as u64 == oversized.length && tail.as_bytes().starts_with(oversized.head)
            });
        let Some(tail) = tail else {
            return Ok(false);
        };
        keyspace.remove_last(&processing, tail.as_bytes(), now)?;
        keyspace.push_dead(
            &keys::dead_letter(&list),
            &protocol::dead_letter_truncated(
                protocol::dead_reason::TOO_LARGE,
                oversized.head,
                oversized.length,
                oversized.at_unix_ms,
            ),
            now,
        )?;
        if let Some((request_id, response)) = oversized.answer {
            let record_key = keys::request_record(oversized.user_id, request_id);
            if !keyspace.exists(&record_key, now) {
                keyspace.hash_set(
                    &record_key,
                    &[
                        (record::STATE, record::DONE.to_owned()),
                        (record::RESPONSE, response.to_owned()),
                        (record::USER_ID, oversized.user_id.to_owned()),
                    ],
                    now,
                )?;
                keyspace.expire(&record_key, REQUEST_RECORD_TTL, now);
                keyspace.set(
                    &keys::response(oversized.user_id, request_id),
                    response,
                    Some(RESPONSE_TTL),
                    now,
                );
            }
        }
        Ok(true)
    }

    async fn drop_request(
        &self,
        user_id: &str,
        raw: &[u8],
        reason: &str,
        at_unix_ms: u64,
    ) -> Result<(), BusError> {
        Self::inject_fault(&self.failing_answers)?;
        let now = Instant::now();
        let mut keyspace = self.lock();
        keyspace.push_dead(
            &keys::dead_letter(&keys::user_requests(user_id)),
            &protocol::dead_letter_raw(reason, raw, at_unix_ms),
            now,
        )?;
        keyspace.remove_last(&keys::user_processing(user_id), raw, now)?;
        Ok(())
    }

    async fn excess_requests(&self, user_id: &str, max: u64) -> Result<Vec<Vec<u8>>, BusError> {
        let mut keyspace = self.lock();
        let Some(list) = keyspace.list(&keys::user_requests(user_id), Instant::now())? else {
            return Ok(Vec::new());
        };
        let excess = (list.len() as u64).saturating_sub(max).min(SHED_BATCH);
        Ok(list
            .iter()
            .take(usize::try_from(excess).unwrap_or(usize::MAX))
            .map(|entry| entry.clone().into_bytes())
            .collect())
    }

    async fn shed_request(&self, shed: &Shed<'_>) -> Result<bool, BusError> {
        let now = Instant::now();
        let record_key = keys::request_record(shed.user_id, shed.request_id);
        let mut keyspace = self.lock();
        if keyspace.exists(&record_key, now) {
            return Ok(false);
        }
        if !keyspace.remove_first(&keys::user_requests(shed.user_id), shed.raw, now)? {
            return Ok(false);
        }
        keyspace.hash_set(
            &record_key,
            &[
                (record::STATE, record::DONE.to_owned()),
                (record::RESPONSE, shed.response.to_owned()),
                (record::USER_ID, shed.user_id.to_owned()),
            ],
            now,
        )?;
        keyspace.expire(&record_key, REQUEST_RECORD_TTL, now);
        keyspace.set(
            &keys::response(shed.user_id, shed.request_id),
            shed.response,
            Some(RESPONSE_TTL),
            now,
        );
        Ok(true)
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
        let key = keys::credentials(user_id);
        let now = Instant::now();
        let mut state = self.lock();
        if state.get(&key, now)?.as_deref() != Some(expected) {
            return Ok(false);
        }
        state.set(&key, blob, None, now);
        Ok(true)
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
        let now = Instant::now();
        let asker = &request.asker;
        let mut keyspace = self.lock();
        let grant_key = keys::credentials_grant(asker.user_id);
        let holder_key = keys::seal_holder(asker.user_id);
        let mark_key = keys::worker_active(asker.user_id);
        let grant = keyspace.get(&grant_key, now)?;
        let holder = keyspace.get(&holder_key, now)?;
        let mark = MarkSeen::of(keyspace.get(&mark_key, now)?.as_deref());
        let taken: Vec<String> = keyspace
            .list(&keys::claims_processing(asker.worker_id), now)?
            .map(|list| list.iter().cloned().collect())
            .unwrap_or_default();
        let decision = assign_rule(asker, grant.as_deref(), holder.as_deref(), &mark, &taken);
        if let (Assignment::Assigned { .. } | Assignment::Renewed { .. }, Some(grant)) =
            (&decision, &grant)
        {
            // KEEPTTL: the used grant expires when the grant would have.
            let expires_at = keyspace
                .live(&grant_key, now)
                .and_then(|entry| entry.expires_at);
            keyspace.set(&grant_key, &used_grant(grant, asker.worker_id), None, now);
            if let Some(entry) = keyspace.live(&grant_key, now) {
                entry.expires_at = expires_at;
            }
        }
        if let Assignment::Assigned { bound_to } = &decision {
            let ttl = Duration::from_secs(whole_seconds(request.mark_ttl));
            keyspace.set(&mark_key, request.mark, Some(ttl), now);
            let record = SealHolder {
                worker_id: asker.worker_id.to_owned(),
                seal_key: asker.seal_key.to_owned(),
                bound_to: bound_to.clone(),
                login_hash: request.login_hash.to_owned(),
            };
            keyspace.set(&holder_key, &record.to_json(), None, now);
            keyspace.zadd(keys::SEAL_HOLDERS, asker.user_id, 0, now)?;
        }
        Ok(decision)
    }
}

#[async_trait]
impl ReportBus for MemoryPoolBus {
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

/// The host's wall clock, unix ms.
fn leasehold_now_ms() -> u64 {
    use leasehold_platform::clock::{Clock, SystemClock};
    SystemClock.now_ms_u64()
}

/// Waits for the next push, like a blocking pop: `false` once `deadline`
/// passes or `interrupt` fires (the pop then returns nothing).
async fn wait_for_push(
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
