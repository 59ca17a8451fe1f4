//! The Redis functions of the pool bus, built from the Lua of each step's
//! module (`begin`, `answer`, `claims`, `marks`, `queue`, `assign`,
//! `credentials`, `paper_ledger`) and the preludes several steps share
//! (`holder()`, `write_metadata()`, the record field names), and loaded
//! once per bus (or by `leasehold redis load-functions`).

use crate::bus::WorkerMetadata;
use crate::bus::assign::TAKEN_FOR_ME;
use crate::bus::claims::{
    FAIL_CLAIM, KEEP_CLAIM, NEXT_CLAIM, REQUEUE_CLAIMS, RETURN_CLAIM, SETTLE_CLAIM, UNLESS_RETIRED,
};
use crate::bus::credentials::REPLACE_IF;
use crate::bus::marks::{
    CLAIM, DELETE_MARK_IF, HEARTBEAT, IDLE_WORKERS, RELEASE, RETIRE_IDLE, SET_POOL_MARK,
    UNLESS_MARK_IS_MINE,
};
use crate::bus::paper_ledger::RECORD_PAPER_ORDER;
use crate::bus::queue::{DROP_OVERSIZED, EXCESS_REQUESTS, NEXT_USER_MESSAGE, SHED_REQUEST};
use crate::protocol::{metadata, record};
use leasehold_platform::redis_functions::{FunctionCall, StoredFunction};

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
