//! The begin step: a worker that took a request from its user's queue
//! records that it runs it, in one atomic step on the bus, before it sends
//! anything to the broker. Its pure rule ([`begin_rule`]), its Lua
//! ([`BEGIN_REQUEST`]) and both buses' steps live here; the conformance
//! suite runs the step over its whole input domain ([`domain`]) on both
//! buses and compares each outcome with the rule.
//!
//! Only the worker holding the user's mark may begin: a displaced worker that
//! began would take the record over from the holder and fence the holder's
//! answer. A successor takes an `executing` record over (its worker, one more
//! delivery), so the holder before it can no longer store an answer.

use tokio::time::Instant;

use super::memory::MemoryPoolBus;
use super::memory::keyspace::StoredRecord;
use super::redis::RedisPoolBus;
use super::redis::classify;
use super::{Begun, BusError, REQUEST_RECORD_TTL};
use crate::keys;
use crate::protocol::record;

/// A request record as the bus rules see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    /// `executing` or `done`.
    pub state: &'a str,
    /// The user whose request it is.
    pub user_id: &'a str,
    /// The worker that began (or took over) it.
    pub worker_id: &'a str,
    /// How many workers have taken it.
    pub deliveries: u32,
}

#[cfg(test)]
impl<'a> RecordView<'a> {
    /// An `executing` record of `user`, begun by `worker` (the rules' tests).
    pub(super) fn executing(user: &'a str, worker: &'a str, deliveries: u32) -> Self {
        RecordView {
            state: record::EXECUTING,
            user_id: user,
            worker_id: worker,
            deliveries,
        }
    }
}

/// What [`begin_rule`] does to the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeginWrite {
    /// Nothing.
    Nothing,
    /// Create it `executing` for this user and worker, one delivery.
    Create,
    /// Take an `executing` record over: this worker, deliveries + 1.
    TakeOver,
}

/// Who may begin a request: only the worker holding the user's mark
/// (`mark_worker`) of `user_id`, or it would take a record over from the
/// holder and fence the holder's answer. Returns what to report and what to
/// write.
pub fn begin_rule(
    record: Option<RecordView<'_>>,
    mark_worker: Option<&str>,
    user_id: &str,
    worker_id: &str,
) -> (Begun, BeginWrite) {
    if mark_worker != Some(worker_id) {
        return (Begun::NotHolder, BeginWrite::Nothing);
    }
    let Some(record) = record else {
        return (Begun::Started, BeginWrite::Create);
    };
    if record.state == crate::protocol::record::DONE {
        // The response is read by the bus; the rule only decides.
        return (
            Begun::Done {
                user_id: record.user_id.to_owned(),
                response: String::new(),
            },
            BeginWrite::Nothing,
        );
    }
    // Another user's executing record is reported, never taken over (that
    // would fence its own worker's answer); nor is this worker's own retry
    // another delivery.
    let untouched = record.user_id != user_id || record.worker_id == worker_id;
    let (deliveries, write) = if untouched {
        (record.deliveries, BeginWrite::Nothing)
    } else {
        (record.deliveries.saturating_add(1), BeginWrite::TakeOver)
    };
    (
        Begun::Executing {
            user_id: record.user_id.to_owned(),
            worker_id: record.worker_id.to_owned(),
            deliveries,
        },
        write,
    )
}

/// KEYS: request record, the user's mark. ARGV: user id, worker id, unix
/// ms, record ttl. [`begin_rule`] in Lua: unless this worker holds
/// the mark, {'not_holder', …} and nothing read or written; without a record,
/// records `executing` (one delivery) and returns {'', …}; an `executing`
/// record of this user begun by another worker is taken over (worker,
/// deliveries + 1). Returns {state, user_id, worker_id (before a take-over),
/// response, deliveries}.
pub(in crate::bus) const BEGIN_REQUEST: &str = r#"
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

impl MemoryPoolBus {
    /// [`super::PoolBus::begin_request`] on the in-memory bus: the rule
    /// applied under the keyspace's lock.
    pub(in crate::bus) async fn begin_in_memory(
        &self,
        request_id: &str,
        user_id: &str,
        worker_id: &str,
        at_unix_ms: u64,
    ) -> Result<Begun, BusError> {
        Self::inject_fault(&self.failing_begins)?;
        let now = Instant::now();
        let key = keys::request_record(user_id, request_id);
        let mut keyspace = self.lock();
        let holder = keyspace.mark_holder(user_id, now)?;
        let stored = keyspace.record(&key, now)?;
        let (begun, write) = begin_rule(
            stored.as_ref().map(StoredRecord::view),
            holder.as_deref(),
            user_id,
            worker_id,
        );
        match write {
            BeginWrite::Nothing => {}
            BeginWrite::Create => {
                keyspace.hash_set(
                    &key,
                    &[
                        (record::STATE, record::EXECUTING.to_owned()),
                        (record::USER_ID, user_id.to_owned()),
                        (record::WORKER_ID, worker_id.to_owned()),
                        (record::STARTED_AT, at_unix_ms.to_string()),
                        (record::DELIVERIES, "1".to_owned()),
                    ],
                    now,
                )?;
                keyspace.expire(&key, REQUEST_RECORD_TTL, now);
            }
            BeginWrite::TakeOver => {
                let deliveries = stored.as_ref().map_or(1, |r| r.deliveries) + 1;
                keyspace.hash_set(
                    &key,
                    &[
                        (record::WORKER_ID, worker_id.to_owned()),
                        (record::DELIVERIES, deliveries.to_string()),
                    ],
                    now,
                )?;
            }
        }
        Ok(match begun {
            // The rule decides; the stored response comes from the record.
            Begun::Done { user_id, .. } => Begun::Done {
                user_id,
                response: stored.map(|r| r.response).unwrap_or_default(),
            },
            other => other,
        })
    }
}

impl RedisPoolBus {
    /// [`super::PoolBus::begin_request`] on Redis: [`BEGIN_REQUEST`].
    pub(in crate::bus) async fn begin_on_redis(
        &self,
        request_id: &str,
        user_id: &str,
        worker_id: &str,
        at_unix_ms: u64,
    ) -> Result<Begun, BusError> {
        let (state, owner, worker_id, response, deliveries): (String, String, String, String, u32) =
            self.functions
                .begin_request
                .key(keys::request_record(user_id, request_id))
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
}

/// The begin step's whole input domain, for the conformance suite: every
/// record state × whose record × which worker began it × the user's mark ×
/// the asking worker. Records are keyed by user, so "another user's record"
/// only arises from a foreign writer; the rule reports it untouched.
pub mod domain {
    use crate::protocol::record;

    /// The workers a case names: `w1` and `w2`.
    pub const WORKERS: [&str; 2] = ["w1", "w2"];

    /// The stored record's fields (`None`: no record), for `user` and
    /// `other`, a second user.
    pub fn records(user: &str, other: &str) -> Vec<Option<Vec<(&'static str, String)>>> {
        let record = |state: &str, owner: &str, worker: &str, deliveries: u32| {
            let mut fields = vec![
                (record::STATE, state.to_owned()),
                (record::USER_ID, owner.to_owned()),
                (record::WORKER_ID, worker.to_owned()),
                (record::STARTED_AT, "1".to_owned()),
                (record::DELIVERIES, deliveries.to_string()),
            ];
            if state == record::DONE {
                fields.push((record::RESPONSE, format!("response-of-{worker}")));
            }
            Some(fields)
        };
        let mut records = vec![None];
        for state in [record::EXECUTING, record::DONE] {
            for owner in [user, other] {
                for (worker, deliveries) in [("w1", 1), ("w2", 3)] {
                    records.push(record(state, owner, worker, deliveries));
                }
            }
        }
        records
    }

    /// The user's mark: none, each worker's, and one that is not a mark.
    pub fn marks(user: &str) -> Vec<Option<String>> {
        let mut marks = vec![None, Some("not a mark".to_owned())];
        for worker in WORKERS {
            marks.push(Some(format!(
                r#"{{"worker_id":"{worker}","user_id":"{user}"}}"#
            )));
        }
        marks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_mark_holder_begins_and_a_successor_takes_over() {
        assert_eq!(
            begin_rule(None, Some("w2"), "u1", "w1"),
            (Begun::NotHolder, BeginWrite::Nothing)
        );
        assert_eq!(begin_rule(None, None, "u1", "w1").0, Begun::NotHolder);
        assert_eq!(
            begin_rule(None, Some("w1"), "u1", "w1"),
            (Begun::Started, BeginWrite::Create)
        );
        let (begun, write) = begin_rule(
            Some(RecordView::executing("u1", "w1", 1)),
            Some("w2"),
            "u1",
            "w2",
        );
        assert_eq!(write, BeginWrite::TakeOver);
        assert!(matches!(begun, Begun::Executing { deliveries: 2, .. }));
        // Its own retry does not count as another delivery.
        let (begun, write) = begin_rule(
            Some(RecordView::executing("u1", "w2", 2)),
            Some("w2"),
            "u1",
            "w2",
        );
        assert_eq!(write, BeginWrite::Nothing);
        assert!(matches!(begun, Begun::Executing { deliveries: 2, .. }));
        // Another user's record is reported, not taken over.
        let (begun, write) = begin_rule(
            Some(RecordView::executing("u1", "w1", 1)),
            Some("w9"),
            "u2",
            "w9",
        );
        assert_eq!(write, BeginWrite::Nothing);
        assert!(matches!(begun, Begun::Executing { deliveries: 1, .. }));
    }
}
