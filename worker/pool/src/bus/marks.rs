//! The mark steps: a user's liveness mark (the exclusive claim, the
//! heartbeat that refreshes it, the release) and the idle pool's marks (set,
//! delete, the idle list, retirement, delete-if-unchanged). Each step's Lua
//! and both buses' steps live here; the conformance suite holds the buses to
//! one behaviour (`claims_are_exclusive`, `heartbeat_is_refused_once_displaced`,
//! `release_is_only_by_the_owner`, `retiring_pool_workers`,
//! `marks_are_deleted_only_if_unchanged` in the testkit).
//!
//! A worker writes or deletes a user's mark only while it names the worker
//! (or is absent), so a displaced worker cannot take a user back.

use std::time::Duration;

use tokio::time::Instant;

use super::memory::MemoryPoolBus;
use super::memory::SnapshotRead;
use super::redis::RedisPoolBus;
use super::redis::classify;
use super::redis::scripts::metadata_args;
use super::{BusError, IdleEntry, MarkWrite, whole_seconds};
use crate::keys;

/// KEYS: pool mark, metadata. ARGV: mark value, ttl, task_arn,
/// instance_id, launched_at, sidecar_url ('' = none), the user's mark key
/// (an argument: a pool worker may read it, not write it, and FCALL checks
/// declared keys as read-write; the pool bus is one Redis, never a Cluster,
/// so an undeclared key is reachable). 1 = claimed (the mark was free, or
/// the sealer set it for this worker), 0 = the user already has a worker.
pub(in crate::bus) const CLAIM: &str = r#"
if taken_for_me(ARGV[7], ARGV[1], ARGV[2]) then
  redis.call('DEL', KEYS[1])
  redis.call('DEL', KEYS[2])
  write_metadata(KEYS[2], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
  return 1
end
return 0
"#;

/// KEYS: user mark, metadata. ARGV: worker id, mark value, ttl, task_arn,
/// instance_id, launched_at, sidecar_url ('' = none). 1 = refreshed, 0 = another worker holds the user.
/// A mark that expired (Redis was unreachable for a while) is taken back.
pub(in crate::bus) const HEARTBEAT: &str = r#"
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
write_metadata(KEYS[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
return 1
"#;

/// KEYS: user mark, metadata. ARGV: worker id. Deletes both unless another
/// worker holds the user.
pub(in crate::bus) const RELEASE: &str = r#"
redis.call('DEL', KEYS[1], KEYS[2])
return 1
"#;

/// Lua prefix shared by the scripts that touch a user's mark: returns 0 unless
/// the mark at KEYS[1] is absent or belongs to worker ARGV[1]. One definition
/// of "this worker holds the user", so refresh and release cannot disagree.
pub(in crate::bus) const UNLESS_MARK_IS_MINE: &str = r#"
local current = redis.call('GET', KEYS[1])
if current then
  local ok, mark = pcall(cjson.decode, current)
  if not ok or type(mark) ~= 'table' or mark['worker_id'] ~= ARGV[1] then
    return 0
  end
end
"#;

/// KEYS: pool mark, pool:idle. ARGV: worker id, mark value, ttl. The
/// heartbeat of an idle pool worker: the mark, and its pool:idle entry scored
/// with Redis's clock unless retired (then 0).
pub(in crate::bus) const SET_POOL_MARK: &str = r#"
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if score and tonumber(score) < 0 then return 0 end
local now = redis.call('TIME')
redis.call('ZADD', KEYS[2], tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000), ARGV[1])
return 1
"#;

/// KEYS: pool:idle, pool:claims. ARGV: pool mark prefix, claim processing
/// prefix. {worker, score, mark, …} for every entry not retired whose mark
/// exists and whose processing list is empty; an entry whose mark is gone is
/// a dead worker's: its taken claims go back to the serving end of
/// pool:claims (as the re-queue does) and the entry is removed. The other
/// keys are built here from the prefixes (single-node layout).
pub(in crate::bus) const IDLE_WORKERS: &str = r#"
local idle = {}
local members = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #members, 2 do
  local worker, score = members[i], members[i + 1]
  local mark = redis.call('GET', ARGV[1] .. worker)
  if not mark then
    while redis.call('LMOVE', ARGV[2] .. worker, KEYS[2], 'LEFT', 'RIGHT') do end
    redis.call('ZREM', KEYS[1], worker)
  elseif tonumber(score) >= 0 and redis.call('LLEN', ARGV[2] .. worker) == 0 then
    idle[#idle + 1] = worker
    idle[#idle + 1] = score
    idle[#idle + 1] = mark
  end
end
return idle
"#;

/// KEYS: pool:idle, claim processing list, pool mark. ARGV: worker id.
/// 1 = retired (score -1); 0 = not provably idle (not in pool:idle, retired
/// already, mark gone, or a claim in its processing list): leave it running.
pub(in crate::bus) const RETIRE_IDLE: &str = r#"
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) < 0 then return 0 end
if redis.call('LLEN', KEYS[2]) > 0 then return 0 end
if redis.call('EXISTS', KEYS[3]) == 0 then return 0 end
redis.call('ZADD', KEYS[1], -1, ARGV[1])
return 1
"#;

/// KEYS: the mark, then keys deleted with it. ARGV: the value a snapshot
/// saw. 1 = deleted; 0 = the mark changed or is gone, nothing deleted.
pub(in crate::bus) const DELETE_MARK_IF: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', unpack(KEYS))
return 1
"#;

impl MemoryPoolBus {
    pub(in crate::bus) async fn claim_user_in_memory(
        &self,
        mark: &MarkWrite<'_>,
    ) -> Result<bool, BusError> {
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
    pub(in crate::bus) async fn refresh_user_mark_in_memory(
        &self,
        mark: &MarkWrite<'_>,
    ) -> Result<bool, BusError> {
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
    pub(in crate::bus) async fn release_user_mark_in_memory(
        &self,
        user_id: &str,
        worker_id: &str,
    ) -> Result<bool, BusError> {
        let now = Instant::now();
        let mut keyspace = self.lock();
        if !keyspace.mark_is_mine_or_absent(user_id, worker_id, now)? {
            return Ok(false);
        }
        keyspace.delete(&keys::worker_active(user_id), now);
        keyspace.delete(&keys::worker_metadata(user_id), now);
        Ok(true)
    }
    pub(in crate::bus) async fn set_pool_mark_in_memory(
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
    pub(in crate::bus) async fn delete_pool_mark_in_memory(
        &self,
        worker_id: &str,
    ) -> Result<(), BusError> {
        let now = Instant::now();
        let mut keyspace = self.lock();
        keyspace.sorted_set(keys::POOL_IDLE, now)?;
        keyspace.delete(&keys::pool_worker_active(worker_id), now);
        keyspace.zrem(keys::POOL_IDLE, worker_id, now)
    }
    pub(in crate::bus) async fn idle_workers_in_memory(&self) -> Result<Vec<IdleEntry>, BusError> {
        let idle = self.idle_now()?;
        self.hooks.run(SnapshotRead::IdleWorkers).await;
        Ok(idle)
    }
    pub(in crate::bus) async fn retire_idle_in_memory(
        &self,
        worker_id: &str,
    ) -> Result<bool, BusError> {
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
    pub(in crate::bus) async fn delete_mark_if_in_memory(
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

impl RedisPoolBus {
    pub(in crate::bus) async fn claim_user_on_redis(
        &self,
        mark: &MarkWrite<'_>,
    ) -> Result<bool, BusError> {
        let claimed: i64 = metadata_args(
            self.functions
                .claim
                .key(keys::pool_worker_active(mark.worker_id))
                .key(keys::worker_metadata(mark.user_id))
                .arg(mark.value)
                .arg(whole_seconds(mark.ttl)),
            mark.metadata,
        )
        // An argument, not a declared key, as in `settle_claim`.
        .arg(keys::worker_active(mark.user_id))
        .invoke_async(&mut self.commands())
        .await
        .map_err(classify)?;
        Ok(claimed == 1)
    }
    pub(in crate::bus) async fn refresh_user_mark_on_redis(
        &self,
        mark: &MarkWrite<'_>,
    ) -> Result<bool, BusError> {
        self.invoke_mark_script(&self.functions.heartbeat, mark)
            .await
    }
    pub(in crate::bus) async fn release_user_mark_on_redis(
        &self,
        user_id: &str,
        worker_id: &str,
    ) -> Result<bool, BusError> {
        let released: i64 = self
            .functions
            .release
            .key(keys::worker_active(user_id))
            .key(keys::worker_metadata(user_id))
            .arg(worker_id)
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Ok(released == 1)
    }
    pub(in crate::bus) async fn set_pool_mark_on_redis(
        &self,
        worker_id: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<bool, BusError> {
        let idle: i64 = self
            .functions
            .set_pool_mark
            .key(keys::pool_worker_active(worker_id))
            .key(keys::POOL_IDLE)
            .arg(worker_id)
            .arg(value)
            .arg(whole_seconds(ttl))
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Ok(idle == 1)
    }
    pub(in crate::bus) async fn delete_pool_mark_on_redis(
        &self,
        worker_id: &str,
    ) -> Result<(), BusError> {
        let _: () = redis::pipe()
            .atomic()
            .cmd("DEL")
            .arg(keys::pool_worker_active(worker_id))
            .ignore()
            .cmd("ZREM")
            .arg(keys::POOL_IDLE)
            .arg(worker_id)
            .ignore()
            .query_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Ok(())
    }
    pub(in crate::bus) async fn idle_workers_on_redis(&self) -> Result<Vec<IdleEntry>, BusError> {
        let flat: Vec<String> = self
            .functions
            .idle_workers
            .key(keys::POOL_IDLE)
            .key(keys::POOL_CLAIMS)
            .arg(keys::pool_worker_active(""))
            .arg(keys::claims_processing(""))
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Ok(flat
            .chunks_exact(3)
            .map(|entry| IdleEntry {
                worker_id: entry[0].clone(),
                heartbeat_ms: entry[1].parse::<f64>().map_or(0, |ms| ms as u64),
                mark: entry[2].clone(),
            })
            .collect())
    }
    pub(in crate::bus) async fn retire_idle_on_redis(
        &self,
        worker_id: &str,
    ) -> Result<bool, BusError> {
        let retired: i64 = self
            .functions
            .retire_idle
            .key(keys::POOL_IDLE)
            .key(keys::claims_processing(worker_id))
            .key(keys::pool_worker_active(worker_id))
            .arg(worker_id)
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Ok(retired == 1)
    }
    pub(in crate::bus) async fn delete_mark_if_on_redis(
        &self,
        key: &str,
        expected: &str,
        also: &[String],
    ) -> Result<bool, BusError> {
        let mut invocation = self.functions.delete_mark_if.key(key);
        for other in also {
            invocation.key(other);
        }
        let deleted: i64 = invocation
            .arg(expected)
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Ok(deleted == 1)
    }
}
