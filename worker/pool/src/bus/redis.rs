//! The pool bus on Redis/Valkey: the layout of docs/redis.md (keys from
//! `crate::keys`, Lua scripts for the mark, request and ledger steps, LPUSH /
//! BRPOP / BLMOVE directions, TTLs). APIs in other languages depend on this
//! layout.
//!
//! Blocking pops run on connections of their own (a blocked connection serves
//! nothing else); an interrupt ends them with `CLIENT UNBLOCK` rather than by
//! dropping the command, so a message Redis already popped is still returned.
//!
//! This file is the `PoolBus` impl: the one-command steps, and for every
//! other step a call into its module in `bus/`, which holds the step's rule,
//! its Lua and both buses' sides together. `scripts` builds the Redis
//! functions from those modules' Lua, `connection` is how commands reach
//! Redis (blocking connections, SCAN, error classification), `reads` the
//! `Inspect` impl.

use std::sync::Mutex;
use std::time::Duration;

use crate::bus::assign::{AssignRequest, Assignment};
use crate::keys;
use async_trait::async_trait;
use redis::aio::ConnectionManager;
use tokio_util::sync::CancellationToken;

use super::{
    Answer, Answered, Begun, BusError, ClaimSettle, CredentialBus, DEAD_LETTER_MAX,
    DEAD_LETTER_TTL, IdleEntry, Inspect, MarkBus, MarkWrite, MessageKind, Oversized, PoolBus,
    RESPONSE_TTL, Settled, Shed, Take, UserMessage, whole_seconds,
};
use crate::protocol;

pub(in crate::bus) mod connection;
mod reads;
pub(in crate::bus) mod scripts;

pub use connection::scan_keys;
pub(crate) use connection::{classify, manager_config};
pub use scripts::stored_functions;

use connection::Blocking;
use scripts::Functions;

/// Queues on `pipe` the push of one dead letter to `dead`, with the cap and
/// the TTL every dead-letter list has (docs/redis.md).
pub(in crate::bus) fn push_dead<'p>(
    pipe: &'p mut redis::Pipeline,
    dead: &str,
    entry: String,
) -> &'p mut redis::Pipeline {
    pipe.cmd("RPUSH")
        .arg(dead)
        .arg(entry)
        .ignore()
        .cmd("LTRIM")
        .arg(dead)
        .arg(-i64::try_from(DEAD_LETTER_MAX).unwrap_or(i64::MAX))
        .arg(-1)
        .ignore()
        .cmd("EXPIRE")
        .arg(dead)
        .arg(DEAD_LETTER_TTL.as_secs())
        .ignore()
}

/// A message a blocking wait handed out whole, checked against the bound as
/// the non-blocking script checks it.
pub(in crate::bus) fn bounded(kind: MessageKind, body: Vec<u8>, max_bytes: usize) -> UserMessage {
    if body.len() <= max_bytes {
        return match kind {
            MessageKind::Control => UserMessage::Control(body),
            MessageKind::Request => UserMessage::Request(body),
        };
    }
    let length = body.len() as u64;
    let mut head = body;
    head.truncate(protocol::DEAD_LETTER_HEAD_BYTES);
    UserMessage::Oversized { kind, head, length }
}

/// The pool bus on Redis. Reconnects by itself.
pub struct RedisPoolBus {
    client: redis::Client,
    commands: ConnectionManager,
    /// Idle blocking connections; each pop takes one, so concurrent pops never
    /// queue behind each other on one connection.
    blocking: Mutex<Vec<Blocking>>,
    pub(in crate::bus) functions: Functions,
}

impl RedisPoolBus {
    /// Refuses a Redis that may evict keys (`REDIS_URL` names it): marks and
    /// request records must never disappear under memory pressure.
    pub async fn require_noeviction(
        &self,
    ) -> Result<(), leasehold_platform::redis_memory::EvictionError> {
        leasehold_platform::redis_memory::require_noeviction(&mut self.commands(), "REDIS_URL")
            .await
    }
}

impl std::fmt::Debug for RedisPoolBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client holds the URL, which may hold a password.
        f.debug_struct("RedisPoolBus").finish_non_exhaustive()
    }
}

#[async_trait]
impl MarkBus for RedisPoolBus {
    async fn claim_user(&self, mark: &MarkWrite<'_>) -> Result<bool, BusError> {
        self.claim_user_on_redis(mark).await
    }

    async fn refresh_user_mark(&self, mark: &MarkWrite<'_>) -> Result<bool, BusError> {
        self.refresh_user_mark_on_redis(mark).await
    }

    async fn release_user_mark(&self, user_id: &str, worker_id: &str) -> Result<bool, BusError> {
        self.release_user_mark_on_redis(user_id, worker_id).await
    }

    async fn user_is_active(&self, user_id: &str) -> Result<bool, BusError> {
        self.query(redis::cmd("EXISTS").arg(keys::worker_active(user_id)))
            .await
    }

    async fn set_pool_mark(
        &self,
        worker_id: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<bool, BusError> {
        self.set_pool_mark_on_redis(worker_id, value, ttl).await
    }

    async fn delete_pool_mark(&self, worker_id: &str) -> Result<(), BusError> {
        self.delete_pool_mark_on_redis(worker_id).await
    }

    async fn idle_workers(&self) -> Result<Vec<IdleEntry>, BusError> {
        self.idle_workers_on_redis().await
    }

    async fn retire_idle(&self, worker_id: &str) -> Result<bool, BusError> {
        self.retire_idle_on_redis(worker_id).await
    }

    async fn delete_mark_if(
        &self,
        key: &str,
        expected: &str,
        also: &[String],
    ) -> Result<bool, BusError> {
        self.delete_mark_if_on_redis(key, expected, also).await
    }
}

#[async_trait]
impl CredentialBus for RedisPoolBus {
    async fn credentials(&self, user_id: &str) -> Result<Option<String>, BusError> {
        self.get(&keys::credentials(user_id)).await
    }

    async fn put_credentials(&self, user_id: &str, blob: &str) -> Result<(), BusError> {
        self.set(&keys::credentials(user_id), blob).await
    }

    async fn replace_credentials(
        &self,
        user_id: &str,
        expected: &str,
        blob: &str,
    ) -> Result<bool, BusError> {
        self.replace_credentials_on_redis(user_id, expected, blob)
            .await
    }

    async fn grant_credentials(
        &self,
        user_id: &str,
        grant: &str,
        ttl: Duration,
    ) -> Result<(), BusError> {
        let _: () = self
            .query(
                redis::cmd("SET")
                    .arg(keys::credentials_grant(user_id))
                    .arg(grant)
                    .arg("EX")
                    .arg(whole_seconds(ttl)),
            )
            .await?;
        Ok(())
    }

    async fn assign_user(&self, request: &AssignRequest<'_>) -> Result<Assignment, BusError> {
        self.assign_user_on_redis(request).await
    }
}

#[async_trait]
impl PoolBus for RedisPoolBus {
    async fn push_claim(&self, body: &str) -> Result<(), BusError> {
        self.lpush(keys::POOL_CLAIMS, body).await
    }

    async fn take_claim(
        &self,
        worker_id: &str,
        timeout: Duration,
        interrupt: &CancellationToken,
    ) -> Result<Take, BusError> {
        self.take_claim_on_redis(worker_id, timeout, interrupt)
            .await
    }

    async fn settle_claim(
        &self,
        mark: &MarkWrite<'_>,
        claim: &ClaimSettle<'_>,
    ) -> Result<Settled, BusError> {
        self.settle_claim_on_redis(mark, claim).await
    }

    async fn fail_claim(
        &self,
        worker_id: &str,
        raw: &[u8],
        outcome: Option<(&str, &str)>,
        reason: &str,
        at_unix_ms: u64,
    ) -> Result<bool, BusError> {
        self.fail_claim_on_redis(worker_id, raw, outcome, reason, at_unix_ms)
            .await
    }

    async fn return_claim(&self, worker_id: &str, raw: &[u8]) -> Result<bool, BusError> {
        self.return_claim_on_redis(worker_id, raw).await
    }

    async fn requeue_claims(&self, worker_id: &str) -> Result<u64, BusError> {
        self.requeue_claims_on_redis(worker_id).await
    }

    async fn set_if_absent(&self, key: &str, value: &str, ttl: Duration) -> Result<bool, BusError> {
        let set: Option<String> = self
            .query(
                redis::cmd("SET")
                    .arg(key)
                    .arg(value)
                    .arg("NX")
                    .arg("EX")
                    .arg(whole_seconds(ttl)),
            )
            .await?;
        Ok(set.is_some())
    }

    async fn push_request(&self, user_id: &str, body: &str) -> Result<(), BusError> {
        self.lpush(&keys::user_requests(user_id), body).await
    }

    async fn push_control(&self, user_id: &str, body: &str) -> Result<(), BusError> {
        self.lpush(&keys::worker_control(user_id), body).await
    }

    async fn pop_user_message(
        &self,
        user_id: &str,
        max_bytes: usize,
        timeout: Duration,
        interrupt: &CancellationToken,
    ) -> Result<Option<UserMessage>, BusError> {
        self.pop_user_message_on_redis(user_id, max_bytes, timeout, interrupt)
            .await
    }

    async fn finish_control(&self, user_id: &str, raw: &[u8]) -> Result<(), BusError> {
        let _: i64 = self
            .query(
                redis::cmd("LREM")
                    .arg(keys::worker_control_processing(user_id))
                    .arg(-1)
                    .arg(raw),
            )
            .await?;
        Ok(())
    }

    async fn dead_letter(
        &self,
        list_key: &str,
        reason: &str,
        body: &str,
        at_unix_ms: u64,
    ) -> Result<(), BusError> {
        let dead = keys::dead_letter(list_key);
        let mut pipe = redis::pipe();
        push_dead(
            pipe.atomic(),
            &dead,
            protocol::dead_letter(reason, body, at_unix_ms),
        );
        let _: () = pipe
            .query_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Ok(())
    }

    async fn begin_request(
        &self,
        request_id: &str,
        user_id: &str,
        worker_id: &str,
        at_unix_ms: u64,
    ) -> Result<Begun, BusError> {
        self.begin_on_redis(request_id, user_id, worker_id, at_unix_ms)
            .await
    }

    async fn answer_request(&self, answer: &Answer<'_>) -> Result<Answered, BusError> {
        self.answer_on_redis(answer).await
    }

    async fn drop_oversized(&self, oversized: &Oversized<'_>) -> Result<bool, BusError> {
        self.drop_oversized_on_redis(oversized).await
    }

    async fn drop_request(
        &self,
        user_id: &str,
        raw: &[u8],
        reason: &str,
        at_unix_ms: u64,
    ) -> Result<(), BusError> {
        self.drop_request_on_redis(user_id, raw, reason, at_unix_ms)
            .await
    }

    async fn excess_requests(&self, user_id: &str, max: u64) -> Result<Vec<Vec<u8>>, BusError> {
        self.excess_requests_on_redis(user_id, max).await
    }

    async fn shed_request(&self, shed: &Shed<'_>) -> Result<bool, BusError> {
        self.shed_request_on_redis(shed).await
    }

    async fn put_response(
        &self,
        user_id: &str,
        request_id: &str,
        body: &str,
    ) -> Result<(), BusError> {
        let _: () = self
            .query(
                redis::cmd("SET")
                    .arg(keys::response(user_id, request_id))
                    .arg(body)
                    .arg("EX")
                    .arg(RESPONSE_TTL.as_secs()),
            )
            .await?;
        Ok(())
    }

    async fn maintenance_report(&self) -> Result<Option<String>, BusError> {
        self.get(keys::MAINTENANCE_LAST_REPORT).await
    }

    async fn put_maintenance_report(&self, report: &str) -> Result<(), BusError> {
        self.set(keys::MAINTENANCE_LAST_REPORT, report).await
    }

    async fn delete_keys(&self, keys: &[String]) -> Result<u64, BusError> {
        if keys.is_empty() {
            return Ok(0);
        }
        self.query(redis::cmd("DEL").arg(keys)).await
    }
}
