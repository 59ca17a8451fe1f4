//! The Lua bodies of the Redis pool bus, loaded as Redis functions: every
//! atomic step on the mark, request, claim and ledger keys. Kept apart from
//! the `PoolBus` impl because they are the layout's contract with APIs in
//! other languages (docs/redis.md) and read as one program.

use crate::bus::WorkerMetadata;
use crate::protocol::{metadata, record};
use leasehold_platform::redis_functions::{FunctionCall, StoredFunction};

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

/// Lua prefix of the claim scripts, `assign::take_mark` in Lua:
/// `taken_for_me(mark_key, value, ttl)`
/// is true when the user's mark names the worker `value` (a mark JSON)
/// names (the credential sealer set it in its assign step; nothing is
/// written, as a broker worker may not write user marks), or when there was
/// no mark and it is now set to `value` (no sealer); false when another
/// worker, or a value that is not a mark, holds the user.
const TAKEN_FOR_ME: &str = r#"
local function taken_for_me(key, value, ttl)
  local current = redis.call('GET', key)
  if not current then
    redis.call('SET', key, value, 'EX', ttl)
    return true
  end
  local ok, mark = pcall(cjson.decode, current)
  local mine = cjson.decode(value)['worker_id']
  return ok and type(mark) == 'table' and mark['worker_id'] == mine
end
"#;

/// KEYS: pool mark, metadata. ARGV: mark value, ttl, task_arn,
/// instance_id, launched_at, sidecar_url ('' = none), the user's mark key
/// (an argument: a pool worker may read it, not write it, and FCALL checks
/// declared keys as read-write; the pool bus is one Redis, never a Cluster,
/// so an undeclared key is reachable). 1 = claimed (the mark was free, or
/// the sealer set it for this worker), 0 = the user already has a worker.
const CLAIM: &str = r#"
if taken_for_me(ARGV[7], ARGV[1], ARGV[2]) then
  redis.call('DEL', KEYS[1])
  redis.call('DEL', KEYS[2])
  write_metadata(KEYS[2], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
  return 1
end
return 0
"#;

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
const SETTLE_CLAIM: &str = r#"
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
write_metadata(KEYS[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
return 1
"#;

/// KEYS: user mark, metadata. ARGV: worker id. Deletes both unless another
/// worker holds the user.
const RELEASE: &str = r#"
redis.call('DEL', KEYS[1], KEYS[2])
return 1
"#;

/// The metadata hash write the claim, settle and heartbeat scripts share:
/// field names from `protocol::metadata`, the sidecar left out when '' (none),
/// the hash expiring with the mark.
const WRITE_METADATA: &str = r#"
local function write_metadata(key, ttl, task_arn, instance_id, launched_at, sidecar_url)
  redis.call('HSET', key, '{task_arn}', task_arn, '{instance_id}', instance_id, '{launched_at}', launched_at)
  if sidecar_url ~= '' then redis.call('HSET', key, '{sidecar_url}', sidecar_url) end
  redis.call('EXPIRE', key, ttl)
end
"#;

/// The metadata as the last four arguments of every script that writes the
/// hash (claim, settle, heartbeat): the order `write_metadata` reads them in.
pub(in crate::bus) fn metadata_args<'c, 'a>(
    call: &'c mut FunctionCall<'a>,
    metadata: &WorkerMetadata,
) -> &'c mut FunctionCall<'a> {
    call.arg(&metadata.task_arn)
        .arg(&metadata.instance_id)
        .arg(metadata.launched_at)
        .arg(metadata.sidecar_url.as_deref().unwrap_or_default())
}

/// A script that writes the metadata hash, with `write_metadata` defined.
fn writing_metadata(body: &str) -> String {
    let prelude = WRITE_METADATA
        .replace("{task_arn}", metadata::TASK_ARN)
        .replace("{instance_id}", metadata::INSTANCE_ID)
        .replace("{launched_at}", metadata::LAUNCHED_AT)
        .replace("{sidecar_url}", metadata::SIDECAR_URL);
    format!("{prelude}{body}")
}

/// A take script behind the retirement guard.
fn unless_retired(body: &str) -> String {
    format!("{UNLESS_RETIRED}{body}")
}

/// A mark script behind the ownership guard.
fn guarded(body: &str) -> String {
    format!("{UNLESS_MARK_IS_MINE}{body}")
}

/// Every Lua body the bus runs, as Redis functions
/// ([`leasehold_platform::redis_functions`]): built once per bus.
pub(in crate::bus) struct Functions {
    pub(in crate::bus) claim: StoredFunction,
    pub(in crate::bus) heartbeat: StoredFunction,
    pub(in crate::bus) release: StoredFunction,
    pub(in crate::bus) next_user_message: StoredFunction,
    pub(in crate::bus) begin_request: StoredFunction,
    pub(in crate::bus) answer_request: StoredFunction,
    pub(in crate::bus) drop_oversized: StoredFunction,
    pub(in crate::bus) excess_requests: StoredFunction,
    pub(in crate::bus) shed_request: StoredFunction,
    pub(in crate::bus) record_paper_order: StoredFunction,
    pub(in crate::bus) settle_claim: StoredFunction,
    pub(in crate::bus) fail_claim: StoredFunction,
    pub(in crate::bus) return_claim: StoredFunction,
    pub(in crate::bus) requeue_claims: StoredFunction,
    pub(in crate::bus) next_claim: StoredFunction,
    pub(in crate::bus) keep_claim: StoredFunction,
    pub(in crate::bus) set_pool_mark: StoredFunction,
    pub(in crate::bus) idle_workers: StoredFunction,
    pub(in crate::bus) retire_idle: StoredFunction,
    pub(in crate::bus) delete_mark_if: StoredFunction,
    pub(in crate::bus) replace_if: StoredFunction,
    pub(in crate::bus) assign_user: StoredFunction,
}

impl Functions {
    pub(in crate::bus) fn new() -> Self {
        Functions {
            claim: StoredFunction::new(&writing_metadata(&format!("{TAKEN_FOR_ME}{CLAIM}"))),
            heartbeat: StoredFunction::new(&writing_metadata(&guarded(HEARTBEAT))),
            release: StoredFunction::new(&guarded(RELEASE)),
            next_user_message: StoredFunction::new(NEXT_USER_MESSAGE),
            begin_request: StoredFunction::new(&with_record_fields(&format!(
                "{MARK_HOLDER}{}",
                crate::bus::begin::BEGIN_REQUEST
            ))),
            answer_request: StoredFunction::new(&with_record_fields(&format!(
                "{MARK_HOLDER}{}",
                crate::bus::answer::ANSWER_REQUEST
            ))),
            drop_oversized: StoredFunction::new(&with_record_fields(DROP_OVERSIZED)),
            excess_requests: StoredFunction::new(EXCESS_REQUESTS),
            shed_request: StoredFunction::new(&with_record_fields(SHED_REQUEST)),
            record_paper_order: StoredFunction::new(RECORD_PAPER_ORDER),
            settle_claim: StoredFunction::new(&writing_metadata(&format!(
                "{TAKEN_FOR_ME}{SETTLE_CLAIM}"
            ))),
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
            assign_user: StoredFunction::new(&crate::bus::assign::assign_user_lua()),
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
            &self.assign_user,
        ]
    }
}

/// The functions the pool bus calls, for `leasehold redis load-functions`:
/// loaded by the admin role at deploy time, so no pool role needs to load code.
pub fn stored_functions() -> Vec<StoredFunction> {
    Functions::new().all().into_iter().cloned().collect()
}
