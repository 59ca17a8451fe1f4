//! The pool bus on Redis/Valkey: the layout of docs/redis.md (keys from
//! `crate::keys`, Lua scripts for the mark, request and ledger steps, LPUSH /
//! BRPOP / BLMOVE directions, TTLs). APIs in other languages depend on this
//! layout.
//!
//! Blocking pops run on connections of their own (a blocked connection serves
//! nothing else); an interrupt ends them with `CLIENT UNBLOCK` rather than by
//! dropping the command, so a message Redis already popped is still returned.
//!
//! This file is the `PoolBus` impl, what each step does; `scripts` holds the
//! Lua bodies, `connection` how commands reach Redis (blocking connections,
//! SCAN, error classification), `reads` the `Inspect` and `PaperLedger` impls.

use std::sync::Mutex;
use std::time::Duration;

use crate::bus::assign::{AssignRequest, Assignment};
use crate::keys;
use async_trait::async_trait;
use redis::aio::ConnectionManager;
use tokio_util::sync::CancellationToken;

use super::{
    Answer, Answered, Begun, BusError, CLAIM_OUTCOME_TTL, ClaimBus, ClaimSettle, CredentialBus,
    DEAD_LETTER_MAX, DEAD_LETTER_TTL, IdleEntry, Inspect, MarkBus, MarkWrite, MessageKind,
    Oversized, REQUEST_RECORD_TTL, RESPONSE_TTL, ReportBus, RequestBus, SHED_BATCH, Settled, Shed,
    Take, TakenClaim, UserMessage, UserQueue, whole_seconds,
};
use crate::protocol;

pub(in crate::bus) mod connection;
mod reads;
pub(in crate::bus) mod scripts;

pub(crate) use connection::classify;
pub use connection::scan_keys;
pub use scripts::stored_functions;

use connection::Blocking;
use scripts::{Functions, metadata_args};

/// Queues on `pipe` the push of one dead letter to `dead`, with the cap and
/// the TTL every dead-letter list has (docs/redis.md).
fn push_dead<'p>(
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
fn bounded(kind: MessageKind, body: Vec<u8>, max_bytes: usize) -> UserMessage {
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

    async fn refresh_user_mark(&self, mark: &MarkWrite<'_>) -> Result<bool, BusError> {
        self.invoke_mark_script(&self.functions.heartbeat, mark)
            .await
    }

    async fn release_user_mark(&self, user_id: &str, worker_id: &str) -> Result<bool, BusError> {
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

    async fn delete_pool_mark(&self, worker_id: &str) -> Result<(), BusError> {
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

    async fn idle_workers(&self) -> Result<Vec<IdleEntry>, BusError> {
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

    async fn retire_idle(&self, worker_id: &str) -> Result<bool, BusError> {
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

    async fn delete_mark_if(
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

#[async_trait]
impl ClaimBus for RedisPoolBus {
    async fn push_claim(&self, body: &str) -> Result<(), BusError> {
        self.lpush(keys::POOL_CLAIMS, body).await
    }

    async fn take_claim(
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

    async fn settle_claim(
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

    async fn fail_claim(
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

    async fn return_claim(&self, worker_id: &str, raw: &[u8]) -> Result<bool, BusError> {
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

    async fn requeue_claims(&self, worker_id: &str) -> Result<u64, BusError> {
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
}

#[async_trait]
impl RequestBus for RedisPoolBus {
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
        let (control, requests) = (
            MessageKind::Control.queue(user_id),
            MessageKind::Request.queue(user_id),
        );
        let (kind, body, length): (i64, Vec<u8>, u64) = self
            .functions
            .next_user_message
            .key(&control.list)
            .key(&requests.processing)
            .key(&requests.list)
            .key(&control.processing)
            .arg(max_bytes)
            .arg(protocol::DEAD_LETTER_HEAD_BYTES)
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)?;
        match kind {
            1 => return Ok(Some(UserMessage::Control(body))),
            2 => return Ok(Some(UserMessage::Request(body))),
            3 | 4 => {
                let kind = if kind == 3 {
                    MessageKind::Control
                } else {
                    MessageKind::Request
                };
                return Ok(Some(UserMessage::Oversized {
                    kind,
                    head: body,
                    length,
                }));
            }
            _ => {}
        }
        if interrupt.is_cancelled() {
            return Ok(None);
        }
        // Nothing waiting: block on both lists at once, each on a connection
        // of its own (no single Redis command blocks on two lists and moves),
        // and end the other wait as soon as one returns. A request the other
        // wait moved meanwhile is in the processing list: handed out next.
        let (control_stop, request_stop) = (interrupt.child_token(), interrupt.child_token());
        let mut control_move = redis::cmd("BLMOVE");
        control_move
            .arg(&control.list)
            .arg(&control.processing)
            .arg("RIGHT")
            .arg("LEFT");
        let mut blmove = redis::cmd("BLMOVE");
        blmove
            .arg(&requests.list)
            .arg(&requests.processing)
            .arg("RIGHT")
            .arg("LEFT");
        let control_wait =
            self.blocking::<Option<Vec<u8>>>(control_move, "BLMOVE", timeout, &control_stop);
        let request_wait =
            self.blocking::<Option<Vec<u8>>>(blmove, "BLMOVE", timeout, &request_stop);
        tokio::pin!(control_wait, request_wait);
        let (control, request) = tokio::select! {
            control = &mut control_wait => {
                request_stop.cancel();
                (control, request_wait.await)
            }
            request = &mut request_wait => {
                control_stop.cancel();
                (control_wait.await, request)
            }
        };
        match (control, request) {
            (Ok(Some(body)), _) => Ok(Some(bounded(MessageKind::Control, body, max_bytes))),
            (_, Ok(Some(body))) => Ok(Some(bounded(MessageKind::Request, body, max_bytes))),
            (Err(err), _) | (_, Err(err)) => Err(err),
            (Ok(None), Ok(None)) => Ok(None),
        }
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
        let UserQueue { list, processing } = oversized.kind.queue(oversized.user_id);
        let kind = match oversized.kind {
            MessageKind::Request => "request",
            MessageKind::Control => "control",
        };
        let dead = protocol::dead_letter_truncated(
            protocol::dead_reason::TOO_LARGE,
            oversized.head,
            oversized.length,
            oversized.at_unix_ms,
        );
        let (request_id, response) = oversized.answer.unwrap_or(("", ""));
        let done: i64 = self
            .functions
            .drop_oversized
            .key(processing)
            .key(keys::dead_letter(&list))
            .key(keys::request_record(oversized.user_id, request_id))
            .key(keys::response(oversized.user_id, request_id))
            .arg(kind)
            .arg(oversized.head)
            .arg(oversized.length)
            .arg(dead)
            .arg(request_id)
            .arg(response)
            .arg(REQUEST_RECORD_TTL.as_secs())
            .arg(RESPONSE_TTL.as_secs())
            .arg(DEAD_LETTER_MAX)
            .arg(DEAD_LETTER_TTL.as_secs())
            .arg(oversized.user_id)
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Ok(done == 1)
    }

    async fn drop_request(
        &self,
        user_id: &str,
        raw: &[u8],
        reason: &str,
        at_unix_ms: u64,
    ) -> Result<(), BusError> {
        let dead = keys::dead_letter(&keys::user_requests(user_id));
        let mut pipe = redis::pipe();
        push_dead(
            pipe.atomic(),
            &dead,
            protocol::dead_letter_raw(reason, raw, at_unix_ms),
        )
        .cmd("LREM")
        .arg(keys::user_processing(user_id))
        .arg(-1)
        .arg(raw)
        .ignore();
        let _: () = pipe
            .query_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Ok(())
    }

    async fn excess_requests(&self, user_id: &str, max: u64) -> Result<Vec<Vec<u8>>, BusError> {
        self.functions
            .excess_requests
            .key(keys::user_requests(user_id))
            .arg(max)
            .arg(SHED_BATCH)
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)
    }

    async fn shed_request(&self, shed: &Shed<'_>) -> Result<bool, BusError> {
        let shed_one: i64 = self
            .functions
            .shed_request
            .key(keys::user_requests(shed.user_id))
            .key(keys::request_record(shed.user_id, shed.request_id))
            .key(keys::response(shed.user_id, shed.request_id))
            .arg(shed.raw)
            .arg(shed.response)
            .arg(REQUEST_RECORD_TTL.as_secs())
            .arg(RESPONSE_TTL.as_secs())
            .arg(shed.user_id)
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Ok(shed_one == 1)
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
        let replaced: i64 = self
            .functions
            .replace_if
            .key(keys::credentials(user_id))
            .arg(expected)
            .arg(blob)
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Ok(replaced == 1)
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
        let asker = &request.asker;
        let (word, bound_to): (String, String) = self
            .functions
            .assign_user
            .key(keys::credentials_grant(asker.user_id))
            .key(keys::worker_active(asker.user_id))
            .key(keys::seal_holder(asker.user_id))
            .key(keys::claims_processing(asker.worker_id))
            .key(keys::SEAL_HOLDERS)
            .arg(asker.user_id)
            .arg(asker.worker_id)
            .arg(asker.seal_key)
            .arg(asker.task_id)
            .arg(request.mark)
            .arg(whole_seconds(request.mark_ttl))
            .arg(request.login_hash)
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Assignment::from_reply(&word, bound_to)
            .ok_or_else(|| BusError::Rejected(format!("the assign step answered {word:?}")))
    }
}

#[async_trait]
impl ReportBus for RedisPoolBus {
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
