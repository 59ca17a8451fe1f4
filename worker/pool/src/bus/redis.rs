//! The pool bus on Redis/Valkey: the layout of docs/redis.md (keys from
//! `crate::keys`, Lua scripts for the mark, request and ledger steps, LPUSH /
//! BRPOP / BLMOVE directions, TTLs). APIs in other languages depend on this
//! layout.
//!
//! Blocking pops run on connections of their own (a blocked connection serves
//! nothing else); an interrupt ends them with `CLIENT UNBLOCK` rather than by
//! dropping the command, so a message Redis already popped is still returned.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::keys;
use async_trait::async_trait;
use leasehold_platform::redis_functions::StoredFunction;
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use tokio_util::sync::CancellationToken;

use super::{
    Answer, AnswerMode, Answered, Begun, BusError, CLAIM_OUTCOME_TTL, ClaimSettle, DEAD_LETTER_MAX,
    DEAD_LETTER_TTL, IdleEntry, Inspect, LedgerWrite, MarkWrite, MessageKind, Oversized,
    PaperLedger, PoolBus, REQUEST_RECORD_TTL, RESPONSE_TTL, SHED_BATCH, Settled, Shed, StoredMark,
    Take, TakenClaim, UserMessage, ledger_entry_parts, whole_seconds,
};
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
const NEXT_USER_MESSAGE: &str = r#"
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

/// Lua prefix of the request scripts: `holder(key)` is the `worker_id` of
/// the liveness mark at `key`, `nil` when there is none, `false` when it is
/// not a mark. The same reading as [`UNLESS_MARK_IS_MINE`].
const MARK_HOLDER: &str = r#"
local function holder(key)
  local current = redis.call('GET', key)
  if not current then return nil end
  local ok, mark = pcall(cjson.decode, current)
  if ok and type(mark) == 'table' and type(mark['worker_id']) == 'string' then return mark['worker_id'] end
  return false
end
"#;

/// KEYS: request record, the user's mark. ARGV: user id, worker id, unix
/// ms, record ttl. `settlement::begin_rule` in Lua: unless this worker holds
/// the mark, {'not_holder', …} and nothing read or written; without a record,
/// records `executing` (one delivery) and returns {'', …}; an `executing`
/// record of this user begun by another worker is taken over (worker,
/// deliveries + 1). Returns {state, user_id, worker_id (before a take-over),
/// response, deliveries}.
const BEGIN_REQUEST: &str = r#"
if holder(KEYS[2]) ~= ARGV[2] then return {'not_holder', '', '', '', 0} end
local state = redis.call('HGET', KEYS[1], '{state}')
if not state then
  redis.call('HSET', KEYS[1], '{state}', '{executing}', '{user_id}', ARGV[1], '{worker_id}', ARGV[2], '{started_at}', ARGV[3], '{deliveries}', 1)
  redis.call('EXPIRE', KEYS[1], ARGV[4])
  return {'', '', '', '', 1}
end
local owner = redis.call('HGET', KEYS[1], '{user_id}') or ''
local began = redis.call('HGET', KEYS[1], '{worker_id}') or ''
local deliveries = tonumber(redis.call('HGET', KEYS[1], '{deliveries}') or '1') or 1
if state == '{done}' then
  return {state, owner, began, redis.call('HGET', KEYS[1], '{response}') or '', deliveries}
end
if owner == ARGV[1] and began ~= ARGV[2] then
  deliveries = deliveries + 1
  redis.call('HSET', KEYS[1], '{worker_id}', ARGV[2], '{deliveries}', deliveries)
end
return {state, owner, began, '', deliveries}
"#;

/// KEYS: request record, response, processing list, dead list, the user's
/// mark. ARGV: the processing entry, mode (final | first_only | replay),
/// response, dead letter ('' for none), record ttl, response ttl, dead list
/// cap, dead list ttl, worker id, user id. Returns 1 when answered, 0 when
/// first_only found a record, 2 when a final answer is fenced
/// (`settlement::final_answer_rule`: nothing written, the entry stays).
/// One step, so a request leaves the processing list exactly when its final
/// response is stored.
const ANSWER_REQUEST: &str = r#"
local answered = 0
if ARGV[2] == 'final' then
  local state = redis.call('HGET', KEYS[1], '{state}')
  if not state or redis.call('HGET', KEYS[1], '{worker_id}') ~= ARGV[9] then return 2 end
  if state == '{done}' then return 1 end
  if holder(KEYS[5]) ~= ARGV[9] then return 2 end
  redis.call('HSET', KEYS[1], '{state}', '{done}', '{response}', ARGV[3])
  redis.call('EXPIRE', KEYS[1], ARGV[5])
  answered = 1
elseif ARGV[2] == 'first_only' and redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], '{state}', '{done}', '{response}', ARGV[3], '{user_id}', ARGV[10], '{worker_id}', ARGV[9])
  redis.call('EXPIRE', KEYS[1], ARGV[5])
  answered = 1
elseif ARGV[2] == 'replay' then
  answered = 1
end
if answered == 1 then redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[6]) end
if ARGV[4] ~= '' then
  redis.call('RPUSH', KEYS[4], ARGV[4])
  redis.call('LTRIM', KEYS[4], -tonumber(ARGV[7]), -1)
  redis.call('EXPIRE', KEYS[4], ARGV[8])
end
redis.call('LREM', KEYS[3], -1, ARGV[1])
return answered
"#;

/// KEYS: request list. ARGV: the cap, the batch. The newest entries beyond
/// the oldest `cap`, newest first, at most `batch`.
const EXCESS_REQUESTS: &str = r#"
local excess = redis.call('LLEN', KEYS[1]) - tonumber(ARGV[1])
if excess <= 0 then return {} end
return redis.call('LRANGE', KEYS[1], 0, math.min(excess, tonumber(ARGV[2])) - 1)
"#;

/// KEYS: request list, request record, response. ARGV: the queued entry,
/// response, record ttl, response ttl, user id. Returns 1 when the entry left
/// the queue with its response; 0 (nothing changed) when its id has a record
/// or it is no longer queued.
const SHED_REQUEST: &str = r#"
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], '{state}', '{done}', '{response}', ARGV[2], '{user_id}', ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('SET', KEYS[3], ARGV[2], 'EX', ARGV[4])
return 1
"#;

/// KEYS: processing list (the request or the control one), dead list,
/// request record, response. ARGV: kind (request | control), head, length,
/// dead letter, request id ('' for none), response, record ttl, response
/// ttl, dead-list cap, dead-list ttl, user id. The message must still be the
/// processing list's tail with that head and length (else 0, nothing
/// written); it leaves the list. The dead letter is pushed; with an id and no
/// record, the id is recorded `done` with the response, which is stored. 1 = done.
const DROP_OVERSIZED: &str = r#"
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

/// KEYS: ledger hash, id counter. ARGV: client order id, order text before
/// and after its broker order id. A repeated client order id is refused:
/// {0, stored order}; otherwise {1, new order}.
const RECORD_PAPER_ORDER: &str = r#"
local existing = redis.call('HGET', KEYS[1], ARGV[1])
if existing then return {0, existing} end
local id = redis.call('INCR', KEYS[2])
local order = ARGV[2] .. string.format('%d', id) .. ARGV[3]
redis.call('HSET', KEYS[1], ARGV[1], order)
return {1, order}
"#;

/// A request script with the record's field names and states filled in, so
/// they are spelled once (`protocol::record`).
fn with_record_fields(script: &str) -> String {
    script
        .replace("{state}", record::STATE)
        .replace("{response}", record::RESPONSE)
        .replace("{user_id}", record::USER_ID)
        .replace("{worker_id}", record::WORKER_ID)
        .replace("{started_at}", record::STARTED_AT)
        .replace("{deliveries}", record::DELIVERIES)
        .replace("{executing}", record::EXECUTING)
        .replace("{done}", record::DONE)
}

/// KEYS: user mark, pool mark, metadata. ARGV: mark value, ttl, task_arn,
/// instance_id, launched_at, sidecar_url ('' = none). 1 = claimed, 0 = the user already has a worker.
const CLAIM: &str = r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  redis.call('DEL', KEYS[2])
  redis.call('DEL', KEYS[3])
  redis.call('HSET', KEYS[3], 'task_arn', ARGV[3], 'instance_id', ARGV[4], 'launched_at', ARGV[5])
  if ARGV[6] ~= '' then redis.call('HSET', KEYS[3], 'sidecar_url', ARGV[6]) end
  redis.call('EXPIRE', KEYS[3], ARGV[2])
  return 1
end
return 0
"#;

/// KEYS: claim processing list, user mark, pool mark, metadata, outcome.
/// ARGV: the processing entry, mark value, ttl, task_arn, instance_id,
/// launched_at, claimed outcome, refused outcome, outcome ttl, sidecar_url
/// ('' = none).
/// -1 = the entry is not in the list (settled already, or re-queued): nothing
/// written; 1 = claimed; 0 = the user already has a worker (outcome failed,
/// unless this claim has an outcome already: a claim settled once and
/// re-queued after a failover keeps its `claimed`).
/// The entry leaves the list in the step that writes the outcome, so a claim
/// is never lost between taking and marking.
const SETTLE_CLAIM: &str = r#"
if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 0 then return -1 end
if redis.call('SET', KEYS[2], ARGV[2], 'NX', 'EX', ARGV[3]) then
  redis.call('DEL', KEYS[3])
  redis.call('DEL', KEYS[4])
  redis.call('HSET', KEYS[4], 'task_arn', ARGV[4], 'instance_id', ARGV[5], 'launched_at', ARGV[6])
  if ARGV[10] ~= '' then redis.call('HSET', KEYS[4], 'sidecar_url', ARGV[10]) end
  redis.call('EXPIRE', KEYS[4], ARGV[3])
  redis.call('SET', KEYS[5], ARGV[7], 'EX', ARGV[9])
  return 1
end
if redis.call('EXISTS', KEYS[5]) == 0 then redis.call('SET', KEYS[5], ARGV[8], 'EX', ARGV[9]) end
return 0
"#;

/// KEYS: claim processing list, dead list, outcome (untouched when ARGV[3]
/// is ''). ARGV: the entry, dead letter, outcome ('' for none), outcome ttl,
/// dead-list cap, dead-list ttl. 1 = failed and removed; 0 = not in the list,
/// nothing written.
const FAIL_CLAIM: &str = r#"
if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[5]), -1)
redis.call('EXPIRE', KEYS[2], ARGV[6])
if ARGV[3] ~= '' then redis.call('SET', KEYS[3], ARGV[3], 'EX', ARGV[4]) end
return 1
"#;

/// KEYS: claim processing list, pool:claims. ARGV: the entry. Back to the
/// serving end (first in line). 1 = returned; 0 = not in the list.
const RETURN_CLAIM: &str = r#"
if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
return 1
"#;

/// KEYS: claim processing list, the worker's pool mark, pool:claims. Only
/// when the pool mark is gone (the worker is dead), moves every entry to the
/// serving end of pool:claims, newest first so the oldest is served first.
/// Returns how many moved.
const REQUEUE_CLAIMS: &str = r#"
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
const UNLESS_RETIRED: &str = r#"
local score = redis.call('ZSCORE', KEYS[3], ARGV[1])
if score and tonumber(score) < 0 then
  while redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT') do end
  return {2, ''}
end
"#;

/// KEYS: claim processing list, pool:claims, pool:idle. ARGV: worker id.
/// The oldest claim the worker holds already (left there), else the oldest
/// queued one moved in. {1, entry} or {0, ''}; {2, ''} when retired.
const NEXT_CLAIM: &str = r#"
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
const KEEP_CLAIM: &str = r#"
return {1, ARGV[2]}
"#;

/// KEYS: pool mark, pool:idle. ARGV: worker id, mark value, ttl. The
/// heartbeat of an idle pool worker: the mark, and its pool:idle entry scored
/// with Redis's clock unless retired (then 0).
const SET_POOL_MARK: &str = r#"
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
const IDLE_WORKERS: &str = r#"
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
const RETIRE_IDLE: &str = r#"
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) < 0 then return 0 end
if redis.call('LLEN', KEYS[2]) > 0 then return 0 end
if redis.call('EXISTS', KEYS[3]) == 0 then return 0 end
redis.call('ZADD', KEYS[1], -1, ARGV[1])
return 1
"#;

/// KEYS: a credentials key. ARGV: the blob expected there, its replacement.
/// 1 = replaced; 0 = it changed or is gone, nothing written.
const REPLACE_IF: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"#;

/// KEYS: the mark, then keys deleted with it. ARGV: the value a snapshot
/// saw. 1 = deleted; 0 = the mark changed or is gone, nothing deleted.
const DELETE_MARK_IF: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', unpack(KEYS))
return 1
"#;

/// Lua prefix shared by the scripts that touch a user's mark: returns 0 unless
/// the mark at KEYS[1] is absent or belongs to worker ARGV[1]. One definition
/// of "this worker holds the user", so refresh and release cannot disagree.
const UNLESS_MARK_IS_MINE: &str = r#"
local current = redis.call('GET', KEYS[1])
if current then
  local ok, mark = pcall(cjson.decode, current)
  if not ok or type(mark) ~= 'table' or mark['worker_id'] ~= ARGV[1] then
    return 0
  end
end
"#;

/// KEYS: user mark, metadata. ARGV: worker id, mark value, ttl, task_arn,
/// instance_id, launched_at, sidecar_url ('' = none). 1 = refreshed, 0 = another worker holds the user.
/// A mark that expired (Redis was unreachable for a while) is taken back.
const HEARTBEAT: &str = r#"
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
redis.call('HSET', KEYS[2], 'task_arn', ARGV[4], 'instance_id', ARGV[5], 'launched_at', ARGV[6])
if ARGV[7] ~= '' then redis.call('HSET', KEYS[2], 'sidecar_url', ARGV[7]) end
redis.call('EXPIRE', KEYS[2], ARGV[3])
return 1
"#;

/// KEYS: user mark, metadata. ARGV: worker id. Deletes both unless another
/// worker holds the user.
const RELEASE: &str = r#"
redis.call('DEL', KEYS[1], KEYS[2])
return 1
"#;

/// A take script behind the retirement guard.
fn unless_retired(body: &str) -> String {
    format!("{UNLESS_RETIRED}{body}")
}

/// A mark script behind the ownership guard.
fn guarded(body: &str) -> String {
    format!("{UNLESS_MARK_IS_MINE}{body}")
}

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

/// Keys SCAN asks for per call: large enough for few round trips, small
/// enough that no single call blocks a shared Redis.
const SCAN_COUNT: u64 = 500;

/// A blocking pop gets this long beyond its own timeout before the connection
/// is considered dead.
const BLOCK_GRACE: Duration = Duration::from_secs(10);

/// How often `CLIENT UNBLOCK` is repeated while the pop has not reached Redis
/// yet, and for how long at most.
const UNBLOCK_RETRY: Duration = Duration::from_millis(20);
const UNBLOCK_PATIENCE: Duration = Duration::from_secs(2);

/// Redis errors, without the URL (a `RedisError`'s text never includes it; it
/// may name the command).
pub(crate) fn classify(err: redis::RedisError) -> BusError {
    if err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
    {
        BusError::Unavailable(err.to_string())
    } else {
        BusError::Rejected(err.to_string())
    }
}

/// Keys matching `pattern`, by SCAN (never KEYS: it would block Redis on a
/// large keyspace); sorted, without the duplicates SCAN may return.
pub async fn scan_keys<C: ConnectionLike + Send>(
    redis: &mut C,
    pattern: &str,
) -> Result<Vec<String>, redis::RedisError> {
    let mut cursor: u64 = 0;
    let mut found = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .query_async(redis)
            .await?;
        found.extend(batch);
        if next == 0 {
            found.sort();
            found.dedup();
            return Ok(found);
        }
        cursor = next;
    }
}

/// A connection reserved for blocking pops, with its `CLIENT ID`.
struct Blocking {
    connection: MultiplexedConnection,
    id: i64,
}

/// Every Lua body the bus runs, as Redis functions
/// ([`leasehold_platform::redis_functions`]): built once per bus.
struct Functions {
    claim: StoredFunction,
    heartbeat: StoredFunction,
    release: StoredFunction,
    next_user_message: StoredFunction,
    begin_request: StoredFunction,
    answer_request: StoredFunction,
    drop_oversized: StoredFunction,
    excess_requests: StoredFunction,
    shed_request: StoredFunction,
    record_paper_order: StoredFunction,
    settle_claim: StoredFunction,
    fail_claim: StoredFunction,
    return_claim: StoredFunction,
    requeue_claims: StoredFunction,
    next_claim: StoredFunction,
    keep_claim: StoredFunction,
    set_pool_mark: StoredFunction,
    idle_workers: StoredFunction,
    retire_idle: StoredFunction,
    delete_mark_if: StoredFunction,
    replace_if: StoredFunction,
}

impl Functions {
    fn new() -> Self {
        Functions {
            claim: StoredFunction::new(CLAIM),
            heartbeat: StoredFunction::new(&guarded(HEARTBEAT)),
            release: StoredFunction::new(&guarded(RELEASE)),
            next_user_message: StoredFunction::new(NEXT_USER_MESSAGE),
            begin_request: StoredFunction::new(&with_record_fields(&format!(
                "{MARK_HOLDER}{BEGIN_REQUEST}"
            ))),
            answer_request: StoredFunction::new(&with_record_fields(&format!(
                "{MARK_HOLDER}{ANSWER_REQUEST}"
            ))),
            drop_oversized: StoredFunction::new(&with_record_fields(DROP_OVERSIZED)),
            excess_requests: StoredFunction::new(EXCESS_REQUESTS),
            shed_request: StoredFunction::new(&with_record_fields(SHED_REQUEST)),
            record_paper_order: StoredFunction::new(RECORD_PAPER_ORDER),
            settle_claim: StoredFunction::new(SETTLE_CLAIM),
            fail_claim: StoredFunction::new(FAIL_CLAIM),
            return_claim: StoredFunction::new(RETURN_CLAIM),
            requeue_claims: StoredFunction::new(REQUEUE_CLAIMS),
            next_claim: StoredFunction::new(&unless_retired(NEXT_CLAIM)),
            keep_claim: StoredFunction::new(&unless_retired(KEEP_CLAIM)),
            set_pool_mark: StoredFunction::new(SET_POOL_MARK),
            idle_workers: StoredFunction::new(IDLE_WORKERS),
            retire_idle: StoredFunction::new(RETIRE_IDLE),
            delete_mark_if: StoredFunction::new(DELETE_MARK_IF),
            replace_if: StoredFunction::new(REPLACE_IF),
        }
    }

    fn all(&self) -> Vec<&StoredFunction> {
        vec![
            &self.claim,
            &self.heartbeat,
            &self.release,
            &self.next_user_message,
            &self.begin_request,
            &self.answer_request,
            &self.drop_oversized,
            &self.excess_requests,
            &self.shed_request,
            &self.record_paper_order,
            &self.settle_claim,
            &self.fail_claim,
            &self.return_claim,
            &self.requeue_claims,
            &self.next_claim,
            &self.keep_claim,
            &self.set_pool_mark,
            &self.idle_workers,
            &self.retire_idle,
            &self.delete_mark_if,
            &self.replace_if,
        ]
    }
}

/// The functions the pool bus calls, for `leasehold redis load-functions`:
/// loaded by the admin role at deploy time, so no pool role needs to load code.
pub fn stored_functions() -> Vec<StoredFunction> {
    Functions::new().all().into_iter().cloned().collect()
}

/// The pool bus on Redis. Reconnects by itself.
pub struct RedisPoolBus {
    client: redis::Client,
    commands: ConnectionManager,
    /// Idle blocking connections; each pop takes one, so concurrent pops never
    /// queue behind each other on one connection.
    blocking: Mutex<Vec<Blocking>>,
    functions: Functions,
}

impl std::fmt::Debug for RedisPoolBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client holds the URL, which may hold a password.
        f.debug_struct("RedisPoolBus").finish_non_exhaustive()
    }
}

impl RedisPoolBus {
    /// Connects (the URL is never part of an error).
    pub async fn connect(url: &str) -> Result<Self, BusError> {
        let client = redis::Client::open(url)
            .map_err(|err| BusError::Config(format!("invalid Redis URL ({:?})", err.kind())))?;
        let commands = ConnectionManager::new_with_config(
            client.clone(),
            ConnectionManagerConfig::new()
                .set_response_timeout(Some(Duration::from_secs(5)))
                .set_connection_timeout(Some(Duration::from_secs(2))),
        )
        .await
        .map_err(classify)?;
        Ok(RedisPoolBus {
            client,
            commands,
            blocking: Mutex::default(),
            functions: Functions::new(),
        })
    }

    fn commands(&self) -> ConnectionManager {
        self.commands.clone()
    }

    async fn blocking_connection(&self) -> Result<Blocking, BusError> {
        let idle = self
            .blocking
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop();
        if let Some(blocking) = idle {
            return Ok(blocking);
        }
        // No response timeout: the pop's own timeout plus a grace bounds it.
        let config = redis::AsyncConnectionConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(Duration::from_secs(2)));
        let mut connection = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(classify)?;
        let id: i64 = redis::cmd("CLIENT")
            .arg("ID")
            .query_async(&mut connection)
            .await
            .map_err(classify)?;
        Ok(Blocking { connection, id })
    }
    /// One blocking command (its timeout argument appended here) on a
    /// connection of its own, ended early by `interrupt` through `CLIENT
    /// UNBLOCK`, so whatever Redis already did is still reported.
    async fn blocking<T: redis::FromRedisValue>(
        &self,
        mut command: redis::Cmd,
        name: &'static str,
        timeout: Duration,
        interrupt: &CancellationToken,
    ) -> Result<T, BusError> {
        let Blocking { connection, id } = self.blocking_connection().await?;
        // 0 would block forever.
        command.arg(format!("{:.3}", timeout.as_secs_f64().max(0.01)));
        // A handle of its own for the command, so the connection can go back
        // to the idle list afterwards.
        let mut popping = connection.clone();
        let pop = tokio::time::timeout(
            timeout + BLOCK_GRACE,
            command.query_async::<T>(&mut popping),
        );
        tokio::pin!(pop);
        let result = tokio::select! {
            result = &mut pop => result,
            _ = interrupt.cancelled() => {
                let patience = tokio::time::Instant::now() + UNBLOCK_PATIENCE;
                loop {
                    let unblocked: redis::RedisResult<i64> = redis::cmd("CLIENT")
                        .arg("UNBLOCK")
                        .arg(id)
                        .query_async(&mut self.commands())
                        .await;
                    match unblocked {
                        Ok(1) => break pop.await,
                        // Not blocked yet (the pop is still on its way) or
                        // already answered: wait a little for it and retry.
                        Ok(_) if tokio::time::Instant::now() < patience => {
                            tokio::select! {
                                result = &mut pop => break result,
                                _ = tokio::time::sleep(UNBLOCK_RETRY) => {}
                            }
                        }
                        Ok(_) => break pop.await,
                        Err(err) => {
                            tracing::warn!(error = %err, "cannot unblock a blocking pop; waiting for its timeout");
                            break pop.await;
                        }
                    }
                }
            }
        };
        match result {
            Ok(Ok(popped)) => {
                self.blocking
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Blocking { connection, id });
                Ok(popped)
            }
            // The connection is dropped: its state is unknown.
            Ok(Err(err)) => Err(classify(err)),
            Err(_) => Err(BusError::Unavailable(format!(
                "{name} got no answer within its timeout"
            ))),
        }
    }

    /// One command on the shared connection, its failure classified.
    async fn query<T: redis::FromRedisValue>(&self, command: &redis::Cmd) -> Result<T, BusError> {
        command
            .query_async(&mut self.commands())
            .await
            .map_err(classify)
    }

    async fn lpush(&self, list: &str, body: &str) -> Result<(), BusError> {
        let _: i64 = self.query(redis::cmd("LPUSH").arg(list).arg(body)).await?;
        Ok(())
    }

    async fn set(&self, key: &str, value: &str) -> Result<(), BusError> {
        let _: () = self.query(redis::cmd("SET").arg(key).arg(value)).await?;
        Ok(())
    }

    async fn invoke_mark_script(
        &self,
        script: &StoredFunction,
        mark: &MarkWrite<'_>,
    ) -> Result<bool, BusError> {
        let metadata = mark.metadata;
        let done: i64 = script
            .key(keys::worker_active(mark.user_id))
            .key(keys::worker_metadata(mark.user_id))
            .arg(mark.worker_id)
            .arg(mark.value)
            .arg(whole_seconds(mark.ttl))
            .arg(&metadata.task_arn)
            .arg(&metadata.instance_id)
            .arg(metadata.launched_at)
            .arg(metadata.sidecar_url.as_deref().unwrap_or_default())
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Ok(done == 1)
    }
}

#[async_trait]
impl PoolBus for RedisPoolBus {
    async fn claim_user(&self, mark: &MarkWrite<'_>) -> Result<bool, BusError> {
        let metadata = mark.metadata;
        let claimed: i64 = self
            .functions
            .claim
            .key(keys::worker_active(mark.user_id))
            .key(keys::pool_worker_active(mark.worker_id))
            .key(keys::worker_metadata(mark.user_id))
            .arg(mark.value)
            .arg(whole_seconds(mark.ttl))
            .arg(&metadata.task_arn)
            .arg(&metadata.instance_id)
            .arg(metadata.launched_at)
            .arg(metadata.sidecar_url.as_deref().unwrap_or_default())
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
        let metadata = mark.metadata;
        let settled: i64 = self
            .functions
            .settle_claim
            .key(keys::claims_processing(mark.worker_id))
            .key(keys::worker_active(mark.user_id))
            .key(keys::pool_worker_active(mark.worker_id))
            .key(keys::worker_metadata(mark.user_id))
            .key(keys::claim_outcome(claim.claim_id))
            .arg(claim.raw)
            .arg(mark.value)
            .arg(whole_seconds(mark.ttl))
            .arg(&metadata.task_arn)
            .arg(&metadata.instance_id)
            .arg(metadata.launched_at)
            .arg(claim.claimed)
            .arg(claim.refused)
            .arg(CLAIM_OUTCOME_TTL.as_secs())
            .arg(metadata.sidecar_url.as_deref().unwrap_or_default())
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
        let (control, processing, requests, control_processing) = (
            keys::worker_control(user_id),
            keys::user_processing(user_id),
            keys::user_requests(user_id),
            keys::worker_control_processing(user_id),
        );
        let (kind, body, length): (i64, Vec<u8>, u64) = self
            .functions
            .next_user_message
            .key(&control)
            .key(&processing)
            .key(&requests)
            .key(&control_processing)
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
            .arg(&control)
            .arg(&control_processing)
            .arg("RIGHT")
            .arg("LEFT");
        let mut blmove = redis::cmd("BLMOVE");
        blmove
            .arg(&requests)
            .arg(&processing)
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
        let (state, owner, worker_id, response, deliveries): (String, String, String, String, u32) =
            self.functions
                .begin_request
                .key(keys::request_record(request_id))
                .key(keys::worker_active(user_id))
                .arg(user_id)
                .arg(worker_id)
                .arg(at_unix_ms)
                .arg(REQUEST_RECORD_TTL.as_secs())
                .invoke_async(&mut self.commands())
                .await
                .map_err(classify)?;
        Ok(match state.as_str() {
            "" => Begun::Started,
            "not_holder" => Begun::NotHolder,
            record::DONE => Begun::Done {
                user_id: owner,
                response,
            },
            _ => Begun::Executing {
                user_id: owner,
                worker_id,
                deliveries,
            },
        })
    }

    async fn answer_request(&self, answer: &Answer<'_>) -> Result<Answered, BusError> {
        let requests = keys::user_requests(answer.user_id);
        let dead = answer
            .dead_letter
            .map(|(reason, at)| protocol::dead_letter_raw(reason, answer.raw, at))
            .unwrap_or_default();
        let mode = match answer.mode {
            AnswerMode::Final => "final",
            AnswerMode::FirstOnly => "first_only",
            AnswerMode::Replay => "replay",
        };
        let answered: i64 = self
            .functions
            .answer_request
            .key(keys::request_record(answer.request_id))
            .key(keys::response(answer.request_id))
            .key(keys::user_processing(answer.user_id))
            .key(keys::dead_letter(&requests))
            .key(keys::worker_active(answer.user_id))
            .arg(answer.raw)
            .arg(mode)
            .arg(answer.response)
            .arg(dead)
            .arg(REQUEST_RECORD_TTL.as_secs())
            .arg(RESPONSE_TTL.as_secs())
            .arg(DEAD_LETTER_MAX)
            .arg(DEAD_LETTER_TTL.as_secs())
            .arg(answer.worker_id)
            .arg(answer.user_id)
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Ok(match answered {
            1 => Answered::Stored,
            2 => Answered::Fenced,
            _ => Answered::Kept,
        })
    }

    async fn drop_oversized(&self, oversized: &Oversized<'_>) -> Result<bool, BusError> {
        let (list, processing, kind) = match oversized.kind {
            MessageKind::Request => (
                keys::user_requests(oversized.user_id),
                keys::user_processing(oversized.user_id),
                "request",
            ),
            MessageKind::Control => (
                keys::worker_control(oversized.user_id),
                keys::worker_control_processing(oversized.user_id),
                "control",
            ),
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
            .key(keys::request_record(request_id))
            .key(keys::response(request_id))
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
            .key(keys::request_record(shed.request_id))
            .key(keys::response(shed.request_id))
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

    async fn put_response(&self, request_id: &str, body: &str) -> Result<(), BusError> {
        let _: () = self
            .query(
                redis::cmd("SET")
                    .arg(keys::response(request_id))
                    .arg(body)
                    .arg("EX")
                    .arg(RESPONSE_TTL.as_secs()),
            )
            .await?;
        Ok(())
    }

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

    async fn maintenance_report(&self) -> Result<Option<String>, BusError> {
        self.get(keys::MAINTENANCE_LAST_REPORT).await
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

#[async_trait]
impl PaperLedger for RedisPoolBus {
    async fn record_paper_order(
        &self,
        account_id: &str,
        client_order_id: &str,
        order: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<LedgerWrite, BusError> {
        let (prefix, suffix) = ledger_entry_parts(order);
        let (recorded, stored): (i64, String) = self
            .functions
            .record_paper_order
            .key(keys::paper_orders(account_id))
            .key(keys::paper_order_ids(account_id))
            .arg(client_order_id)
            .arg(prefix)
            .arg(suffix)
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Ok(if recorded == 1 {
            LedgerWrite::Recorded(stored)
        } else {
            LedgerWrite::Exists(stored)
        })
    }

    async fn paper_order(
        &self,
        account_id: &str,
        client_order_id: &str,
    ) -> Result<Option<String>, BusError> {
        self.query(
            redis::cmd("HGET")
                .arg(keys::paper_orders(account_id))
                .arg(client_order_id),
        )
        .await
    }
}

#[async_trait]
impl Inspect for RedisPoolBus {
    async fn marks(&self, pattern: &str) -> Result<Vec<StoredMark>, BusError> {
        let mut commands = self.commands();
        let mut marks = Vec::new();
        for key in scan_keys(&mut commands, pattern).await.map_err(classify)? {
            let (value, ttl): (Option<String>, i64) = redis::pipe()
                .cmd("GET")
                .arg(&key)
                .cmd("PTTL")
                .arg(&key)
                .query_async(&mut commands)
                .await
                .map_err(classify)?;
            let Some(value) = value else { continue };
            marks.push(StoredMark {
                key,
                value,
                ttl_ms: u64::try_from(ttl).ok(),
            });
        }
        Ok(marks)
    }

    async fn scan_keys(&self, pattern: &str) -> Result<Vec<String>, BusError> {
        scan_keys(&mut self.commands(), pattern)
            .await
            .map_err(classify)
    }

    async fn get(&self, key: &str) -> Result<Option<String>, BusError> {
        self.query(redis::cmd("GET").arg(key)).await
    }

    async fn ttl_ms(&self, key: &str) -> Result<Option<i64>, BusError> {
        let ttl: i64 = self.query(redis::cmd("PTTL").arg(key)).await?;
        // -2: no such key; -1: no expiry.
        Ok((ttl != -2).then_some(ttl))
    }

    async fn list_len(&self, key: &str) -> Result<u64, BusError> {
        self.query(redis::cmd("LLEN").arg(key)).await
    }

    async fn list_items(&self, key: &str) -> Result<Vec<String>, BusError> {
        self.query(redis::cmd("LRANGE").arg(key).arg(0).arg(-1))
            .await
    }

    async fn hash_get_all(&self, key: &str) -> Result<HashMap<String, String>, BusError> {
        self.query(redis::cmd("HGETALL").arg(key)).await
    }

    async fn server_time_ms(&self) -> Result<u64, BusError> {
        let (seconds, micros): (u64, u64) = self.query(&redis::cmd("TIME")).await?;
        Ok(seconds * 1000 + micros / 1000)
    }
}
