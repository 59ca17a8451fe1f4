//! The claim steps: how a pool worker takes a claim from `pool:claims` into
//! its own claim processing list (unless it was retired), settles it (the
//! user's mark and the claim's outcome in one step, by
//! [`super::assign::take_mark`]), fails it (dead letter and outcome), returns
//! it to the queue, and how the claims of a dead worker are queued again.
//! Each step's Lua and both buses' steps live here; the conformance suite
//! holds the buses to one behaviour (`taking_claims`, `settling_claims`,
//! `requeueing_claims` in the testkit).
//!
//! A claim leaves the worker's processing list only in the step that settles,
//! fails or returns it, so no claim is lost with a worker.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::memory::keyspace::End;
use super::memory::{MemoryPoolBus, wait_for_push};
use super::redis::RedisPoolBus;
use super::redis::classify;
use super::redis::scripts::metadata_args;
use super::{
    BusError, CLAIM_OUTCOME_TTL, ClaimSettle, DEAD_LETTER_MAX, DEAD_LETTER_TTL, MarkWrite, Settled,
    Take, TakenClaim, whole_seconds,
};
use crate::keys;
use crate::protocol;

/// KEYS: claim processing list, pool mark, metadata, outcome.
/// ARGV: the processing entry, mark value, ttl, claimed outcome, refused
/// outcome, outcome ttl, then the metadata ([`metadata_args`]: task_arn,
/// instance_id, launched_at, sidecar_url, '' = none), then the user's mark
/// key (an argument, as in [`CLAIM`]).
/// -1 = the entry is not in the list (settled already, or re-queued): nothing
/// written; 1 = claimed (the mark was free, or the sealer set it for this
/// worker); 0 = the user already has another worker (outcome failed,
/// unless this claim has an outcome already: a claim settled once and
/// re-queued after a failover keeps its `claimed`).
/// The entry leaves the list in the step that writes the outcome, so a claim
/// is never lost between taking and marking.
pub(in crate::bus) const SETTLE_CLAIM: &str = r#"
if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 0 then return -1 end
if taken_for_me(ARGV[11], ARGV[2], ARGV[3]) then
  redis.call('DEL', KEYS[2])
  redis.call('DEL', KEYS[3])
  write_metadata(KEYS[3], ARGV[3], ARGV[7], ARGV[8], ARGV[9], ARGV[10])
  redis.call('SET', KEYS[4], ARGV[4], 'EX', ARGV[6])
  return 1
end
if redis.call('EXISTS', KEYS[4]) == 0 then redis.call('SET', KEYS[4], ARGV[5], 'EX', ARGV[6]) end
return 0
"#;

/// KEYS: claim processing list, dead list, outcome (untouched when ARGV[3]
/// is ''). ARGV: the entry, dead letter, outcome ('' for none), outcome ttl,
/// dead-list cap, dead-list ttl. 1 = failed and removed; 0 = not in the list,
/// nothing written.
pub(in crate::bus) const FAIL_CLAIM: &str = r#"
if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[5]), -1)
redis.call('EXPIRE', KEYS[2], ARGV[6])
if ARGV[3] ~= '' then redis.call('SET', KEYS[3], ARGV[3], 'EX', ARGV[4]) end
return 1
"#;

/// KEYS: claim processing list, pool:claims. ARGV: the entry. Back to the
/// serving end (first in line). 1 = returned; 0 = not in the list.
pub(in crate::bus) const RETURN_CLAIM: &str = r#"
if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
return 1
"#;

/// KEYS: claim processing list, the worker's pool mark, pool:claims. Only
/// when the pool mark is gone (the worker is dead), moves every entry to the
/// serving end of pool:claims, newest first so the oldest is served first.
/// Returns how many moved.
pub(in crate::bus) const REQUEUE_CLAIMS: &str = r#"
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local moved = 0
while redis.call('LMOVE', KEYS[1], KEYS[3], 'LEFT', 'RIGHT') do moved = moved + 1 end
return moved
"#;

/// Lua prefix of the take scripts: KEYS[3] is pool:idle, ARGV[1] the
/// worker. A retired worker (score -1) hands every claim in its processing
/// list (KEYS[1]) back to the serving end of pool:claims (KEYS[2]) and gets
/// {2, ''}: a claim it moved after the pool manager retired it is never
/// served by it.
pub(in crate::bus) const UNLESS_RETIRED: &str = r#"
local score = redis.call('ZSCORE', KEYS[3], ARGV[1])
if score and tonumber(score) < 0 then
  while redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT') do end
  return {2, ''}
end
"#;

/// KEYS: claim processing list, pool:claims, pool:idle. ARGV: worker id.
/// The oldest claim the worker holds already (left there), else the oldest
/// queued one moved in. {1, entry} or {0, ''}; {2, ''} when retired.
pub(in crate::bus) const NEXT_CLAIM: &str = r#"
local held = redis.call('LINDEX', KEYS[1], -1)
if held then return {1, held} end
local moved = redis.call('LMOVE', KEYS[2], KEYS[1], 'RIGHT', 'LEFT')
if moved then return {1, moved} end
return {0, ''}
"#;

/// KEYS: claim processing list, pool:claims, pool:idle. ARGV: worker id,
/// the entry a blocking move just filed. {1, entry} while the worker is not
/// retired; else (the retirement won the race with the move) the entry is
/// handed back first in line and {2, ''}.
pub(in crate::bus) const KEEP_CLAIM: &str = r#"
return {1, ARGV[2]}
"#;

impl MemoryPoolBus {
    pub(in crate::bus) async fn take_claim_in_memory(
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
    pub(in crate::bus) async fn settle_claim_in_memory(
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
    pub(in crate::bus) async fn fail_claim_in_memory(
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
    pub(in crate::bus) async fn return_claim_in_memory(
        &self,
        worker_id: &str,
        raw: &[u8],
    ) -> Result<bool, BusError> {
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
    pub(in crate::bus) async fn requeue_claims_in_memory(
        &self,
        worker_id: &str,
    ) -> Result<u64, BusError> {
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
}

impl RedisPoolBus {
    pub(in crate::bus) async fn take_claim_on_redis(
        &self,
        worker_id: &str,
        timeout: Duration,
        interrupt: &CancellationToken,
    ) -> Result<Take, BusError> {
        let processing = keys::claims_processing(worker_id);
        let (found, raw): (i64, Vec<u8>) = self
            .functions
            .next_claim
            .key(&processing)
            .key(keys::POOL_CLAIMS)
            .key(keys::POOL_IDLE)
            .arg(worker_id)
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)?;
        match found {
            1 => return Ok(Take::Claim(TakenClaim { raw })),
            2 => return Ok(Take::Retired),
            _ => {}
        }
        if interrupt.is_cancelled() {
            return Ok(Take::Empty);
        }
        // Producers LPUSH; RIGHT takes the oldest first (the original
        // design's SQS queue was FIFO-like), LEFT files it in the worker's list.
        let mut blmove = redis::cmd("BLMOVE");
        blmove
            .arg(keys::POOL_CLAIMS)
            .arg(&processing)
            .arg("RIGHT")
            .arg("LEFT");
        let moved: Option<Vec<u8>> = self.blocking(blmove, "BLMOVE", timeout, interrupt).await?;
        let Some(raw) = moved else {
            return Ok(Take::Empty);
        };
        // The move could not check the retirement: the check, and the hand
        // back if the retirement came first, is one step of its own.
        let (kept, raw): (i64, Vec<u8>) = self
            .functions
            .keep_claim
            .key(&processing)
            .key(keys::POOL_CLAIMS)
            .key(keys::POOL_IDLE)
            .arg(worker_id)
            .arg(raw)
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Ok(if kept == 1 {
            Take::Claim(TakenClaim { raw })
        } else {
            Take::Retired
        })
    }
    pub(in crate::bus) async fn settle_claim_on_redis(
        &self,
        mark: &MarkWrite<'_>,
        claim: &ClaimSettle<'_>,
    ) -> Result<Settled, BusError> {
        let settled: i64 = metadata_args(
            self.functions
                .settle_claim
                .key(keys::claims_processing(mark.worker_id))
                .key(keys::pool_worker_active(mark.worker_id))
                .key(keys::worker_metadata(mark.user_id))
                .key(keys::claim_outcome(claim.claim_id))
                .arg(claim.raw)
                .arg(mark.value)
                .arg(whole_seconds(mark.ttl))
                .arg(claim.claimed)
                .arg(claim.refused)
                .arg(CLAIM_OUTCOME_TTL.as_secs()),
            mark.metadata,
        )
        // The user's mark is an argument, not a declared key: FCALL checks
        // declared keys as read-write, and a pool worker may only read it.
        .arg(keys::worker_active(mark.user_id))
        .invoke_async(&mut self.commands())
        .await
        .map_err(classify)?;
        Ok(match settled {
            1 => Settled::Claimed,
            0 => Settled::Refused,
            _ => Settled::NotHeld,
        })
    }
    pub(in crate::bus) async fn fail_claim_on_redis(
        &self,
        worker_id: &str,
        raw: &[u8],
        outcome: Option<(&str, &str)>,
        reason: &str,
        at_unix_ms: u64,
    ) -> Result<bool, BusError> {
        let (outcome_key, outcome) = match outcome {
            Some((claim_id, outcome)) => (keys::claim_outcome(claim_id), outcome),
            // Not written (the script skips it); named for the key count only.
            None => (keys::claim_outcome(""), ""),
        };
        let failed: i64 = self
            .functions
            .fail_claim
            .key(keys::claims_processing(worker_id))
            .key(keys::dead_letter(keys::POOL_CLAIMS))
            .key(outcome_key)
            .arg(raw)
            .arg(protocol::dead_letter_raw(reason, raw, at_unix_ms))
            .arg(outcome)
            .arg(CLAIM_OUTCOME_TTL.as_secs())
            .arg(DEAD_LETTER_MAX)
            .arg(DEAD_LETTER_TTL.as_secs())
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Ok(failed == 1)
    }
    pub(in crate::bus) async fn return_claim_on_redis(
        &self,
        worker_id: &str,
        raw: &[u8],
    ) -> Result<bool, BusError> {
        let returned: i64 = self
            .functions
            .return_claim
            .key(keys::claims_processing(worker_id))
            .key(keys::POOL_CLAIMS)
            .arg(raw)
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Ok(returned == 1)
    }
    pub(in crate::bus) async fn requeue_claims_on_redis(
        &self,
        worker_id: &str,
    ) -> Result<u64, BusError> {
        let moved: u64 = self
            .functions
            .requeue_claims
            .key(keys::claims_processing(worker_id))
            .key(keys::pool_worker_active(worker_id))
            .key(keys::POOL_CLAIMS)
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Ok(moved)
    }
}
