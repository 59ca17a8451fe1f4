//! The queue steps of a user's worker: the next message to handle (control
//! before requests, a message already in processing before a waiting one,
//! only the head of a message over the size bound), and the ways a request
//! leaves processing without an answer from the broker: dropped (oversized or
//! invalid, with a dead letter) or shed (over the queue's cap, newest first).
//! Each step's Lua and both buses' steps live here; the conformance suite
//! holds the buses to one behaviour (`requests_are_served_oldest_first_through_processing`,
//! `oversized_messages_are_ended_from_their_head`, `dropped_requests_are_dead_lettered`,
//! `over_cap_requests_are_shed_newest_first` in the testkit).

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::memory::keyspace::bounded;
use super::memory::{MemoryPoolBus, wait_for_push};
use super::redis::RedisPoolBus;
use super::redis::{classify, push_dead};
use super::{
    BusError, DEAD_LETTER_MAX, DEAD_LETTER_TTL, MessageKind, Oversized, REQUEST_RECORD_TTL,
    RESPONSE_TTL, SHED_BATCH, Shed, UserMessage, UserQueue,
};
use crate::keys;
use crate::protocol::{self, record};

/// KEYS: control list, processing list, request list, control processing
/// list. ARGV: the size bound, the head length. What a user's worker does
/// next, without blocking: the oldest control message already in control
/// processing (left there), else the oldest queued one moved in; else the
/// oldest request already in processing (left there), else the oldest queued
/// request moved into processing. Returns {1, control} | {2, request} |
/// {0, '', 0}, and for a message over the bound only its head and length:
/// {3, head, length} (a control message) | {4, head, length} (a request), so
/// a body too large for a worker's memory never reaches one.
pub(in crate::bus) const NEXT_USER_MESSAGE: &str = r#"
local max, head = tonumber(ARGV[1]), tonumber(ARGV[2])
local control = redis.call('LINDEX', KEYS[4], -1)
if not control then control = redis.call('LMOVE', KEYS[1], KEYS[4], 'RIGHT', 'LEFT') end
if control then
  if #control > max then return {3, string.sub(control, 1, head), #control} end
  return {1, control, 0}
end
local oldest = redis.call('LINDEX', KEYS[2], -1)
if not oldest then oldest = redis.call('LMOVE', KEYS[3], KEYS[2], 'RIGHT', 'LEFT') end
if oldest then
  if #oldest > max then return {4, string.sub(oldest, 1, head), #oldest} end
  return {2, oldest, 0}
end
return {0, '', 0}
"#;

/// KEYS: processing list (the request or the control one), dead list,
/// request record, response. ARGV: kind (request | control), head, length,
/// dead letter, request id ('' for none), response, record ttl, response
/// ttl, dead-list cap, dead-list ttl, user id. The message must still be the
/// processing list's tail with that head and length (else 0, nothing
/// written); it leaves the list. The dead letter is pushed; with an id and no
/// record, the id is recorded `done` with the response, which is stored. 1 = done.
pub(in crate::bus) const DROP_OVERSIZED: &str = r#"
local tail = redis.call('LINDEX', KEYS[1], -1)
if not tail or #tail ~= tonumber(ARGV[3]) or string.sub(tail, 1, #ARGV[2]) ~= ARGV[2] then return 0 end
redis.call('RPOP', KEYS[1])
redis.call('RPUSH', KEYS[2], ARGV[4])
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[9]), -1)
redis.call('EXPIRE', KEYS[2], ARGV[10])
if ARGV[5] ~= '' and redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('HSET', KEYS[3], '{state}', '{done}', '{response}', ARGV[6], '{user_id}', ARGV[11])
  redis.call('EXPIRE', KEYS[3], ARGV[7])
  redis.call('SET', KEYS[4], ARGV[6], 'EX', ARGV[8])
end
return 1
"#;

/// KEYS: request list. ARGV: the cap, the batch. The newest entries beyond
/// the oldest `cap`, newest first, at most `batch`.
pub(in crate::bus) const EXCESS_REQUESTS: &str = r#"
local excess = redis.call('LLEN', KEYS[1]) - tonumber(ARGV[1])
if excess <= 0 then return {} end
return redis.call('LRANGE', KEYS[1], 0, math.min(excess, tonumber(ARGV[2])) - 1)
"#;

/// KEYS: request list, request record, response. ARGV: the queued entry,
/// response, record ttl, response ttl, user id. Returns 1 when the entry left
/// the queue with its response; 0 (nothing changed) when its id has a record
/// or it is no longer queued.
pub(in crate::bus) const SHED_REQUEST: &str = r#"
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], '{state}', '{done}', '{response}', ARGV[2], '{user_id}', ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('SET', KEYS[3], ARGV[2], 'EX', ARGV[4])
return 1
"#;

impl MemoryPoolBus {
    pub(in crate::bus) async fn pop_user_message_in_memory(
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
    pub(in crate::bus) async fn drop_oversized_in_memory(
        &self,
        oversized: &Oversized<'_>,
    ) -> Result<bool, BusError> {
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
    pub(in crate::bus) async fn drop_request_in_memory(
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
    pub(in crate::bus) async fn excess_requests_in_memory(
        &self,
        user_id: &str,
        max: u64,
    ) -> Result<Vec<Vec<u8>>, BusError> {
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
    pub(in crate::bus) async fn shed_request_in_memory(
        &self,
        shed: &Shed<'_>,
    ) -> Result<bool, BusError> {
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
}

impl RedisPoolBus {
    pub(in crate::bus) async fn pop_user_message_on_redis(
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
            (Ok(Some(body)), _) => Ok(Some(super::redis::bounded(
                MessageKind::Control,
                body,
                max_bytes,
            ))),
            (_, Ok(Some(body))) => Ok(Some(super::redis::bounded(
                MessageKind::Request,
                body,
                max_bytes,
            ))),
            (Err(err), _) | (_, Err(err)) => Err(err),
            (Ok(None), Ok(None)) => Ok(None),
        }
    }
    pub(in crate::bus) async fn drop_oversized_on_redis(
        &self,
        oversized: &Oversized<'_>,
    ) -> Result<bool, BusError> {
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
    pub(in crate::bus) async fn drop_request_on_redis(
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
    pub(in crate::bus) async fn excess_requests_on_redis(
        &self,
        user_id: &str,
        max: u64,
    ) -> Result<Vec<Vec<u8>>, BusError> {
        self.functions
            .excess_requests
            .key(keys::user_requests(user_id))
            .arg(max)
            .arg(SHED_BATCH)
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)
    }
    pub(in crate::bus) async fn shed_request_on_redis(
        &self,
        shed: &Shed<'_>,
    ) -> Result<bool, BusError> {
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
}
