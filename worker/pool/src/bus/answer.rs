//! The answer step: a worker stores a request's answer, its response and
//! (optionally) a dead letter, and takes the request out of the user's
//! processing list, in one atomic step, so a request leaves processing
//! exactly when its answer is stored. Its pure rule for final answers
//! ([`final_answer_rule`]), its Lua ([`ANSWER_REQUEST`]) and both buses'
//! steps live here; the conformance suite runs final answers over the whole
//! domain of [`super::begin::domain`] on both buses.

use tokio::time::Instant;

use super::begin::RecordView;
use super::memory::MemoryPoolBus;
use super::memory::keyspace::StoredRecord;
use super::redis::RedisPoolBus;
use super::redis::classify;
use super::{
    Answer, AnswerMode, Answered, BusError, DEAD_LETTER_MAX, DEAD_LETTER_TTL, REQUEST_RECORD_TTL,
    RESPONSE_TTL,
};
use crate::keys;
use crate::protocol::{self, record};

/// What [`final_answer_rule`] lets a worker do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalVerdict {
    /// Store it: record `done`, the response, the entry out of processing.
    Store,
    /// This worker's answer is stored already (its reply was lost): nothing to do.
    AlreadyStored,
    /// Someone else holds the user or the request: nothing is written.
    Fenced,
}

/// Who may store a final answer: the worker that holds the user's mark and
/// began (or took over) the request while it is still `executing`. A
/// displaced worker's late answer would otherwise replace its successor's
/// (the order run twice by an API that trusts "not executed").
pub fn final_answer_rule(
    record: Option<RecordView<'_>>,
    mark_worker: Option<&str>,
    worker_id: &str,
) -> FinalVerdict {
    let Some(record) = record else {
        return FinalVerdict::Fenced;
    };
    if record.worker_id != worker_id {
        return FinalVerdict::Fenced;
    }
    if record.state == crate::protocol::record::DONE {
        return FinalVerdict::AlreadyStored;
    }
    if mark_worker != Some(worker_id) {
        return FinalVerdict::Fenced;
    }
    FinalVerdict::Store
}

/// KEYS: request record, response, processing list, dead list, the user's
/// mark. ARGV: the processing entry, mode (final | first_only | replay),
/// response, dead letter ('' for none), record ttl, response ttl, dead list
/// cap, dead list ttl, worker id, user id. Returns 1 when answered, 0 when
/// first_only found a record, 2 when a final answer is fenced
/// ([`final_answer_rule`]: nothing written, the entry stays).
/// One step, so a request leaves the processing list exactly when its final
/// response is stored.
pub(in crate::bus) const ANSWER_REQUEST: &str = r#"
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

impl MemoryPoolBus {
    /// [`super::PoolBus::answer_request`] on the in-memory bus.
    pub(in crate::bus) async fn answer_in_memory(
        &self,
        answer: &Answer<'_>,
    ) -> Result<Answered, BusError> {
        Self::inject_fault(&self.failing_answers)?;
        let now = Instant::now();
        let record_key = keys::request_record(answer.user_id, answer.request_id);
        let mut keyspace = self.lock();
        // Checked before anything is written, as Redis fails the script's
        // first command on a wrong type.
        keyspace.check_hash(&record_key, now)?;
        let mut fields = vec![
            (record::STATE, record::DONE.to_owned()),
            (record::RESPONSE, answer.response.to_owned()),
        ];
        let answered = match answer.mode {
            AnswerMode::Final => {
                let holder = keyspace.mark_holder(answer.user_id, now)?;
                let stored = keyspace.record(&record_key, now)?;
                match final_answer_rule(
                    stored.as_ref().map(StoredRecord::view),
                    holder.as_deref(),
                    answer.worker_id,
                ) {
                    FinalVerdict::Store => true,
                    FinalVerdict::AlreadyStored => return Ok(Answered::Stored),
                    FinalVerdict::Fenced => return Ok(Answered::Fenced),
                }
            }
            AnswerMode::FirstOnly => {
                fields.push((record::USER_ID, answer.user_id.to_owned()));
                fields.push((record::WORKER_ID, answer.worker_id.to_owned()));
                !keyspace.exists(&record_key, now)
            }
            AnswerMode::Replay => false,
        };
        if answered {
            keyspace.hash_set(&record_key, &fields, now)?;
            keyspace.expire(&record_key, REQUEST_RECORD_TTL, now);
        }
        let answered = answered || answer.mode == AnswerMode::Replay;
        if answered {
            keyspace.set(
                &keys::response(answer.user_id, answer.request_id),
                answer.response,
                Some(RESPONSE_TTL),
                now,
            );
        }
        let requests = keys::user_requests(answer.user_id);
        if let Some((reason, at)) = answer.dead_letter {
            keyspace.push_dead(
                &keys::dead_letter(&requests),
                &protocol::dead_letter_raw(reason, answer.raw, at),
                now,
            )?;
        }
        keyspace.remove_last(&keys::user_processing(answer.user_id), answer.raw, now)?;
        Ok(if answered {
            Answered::Stored
        } else {
            Answered::Kept
        })
    }
}

impl RedisPoolBus {
    /// [`super::PoolBus::answer_request`] on Redis: [`ANSWER_REQUEST`].
    pub(in crate::bus) async fn answer_on_redis(
        &self,
        answer: &Answer<'_>,
    ) -> Result<Answered, BusError> {
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
            .key(keys::request_record(answer.user_id, answer.request_id))
            .key(keys::response(answer.user_id, answer.request_id))
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_holder_that_began_it_stores_the_final_answer() {
        let rec = RecordView::executing("u1", "w1", 1);
        assert_eq!(
            final_answer_rule(Some(rec), Some("w1"), "w1"),
            FinalVerdict::Store
        );
        // Displaced: the mark is another worker's.
        assert_eq!(
            final_answer_rule(Some(rec), Some("w2"), "w1"),
            FinalVerdict::Fenced
        );
        // Taken over by a successor, even if the old worker got the mark back.
        let taken = RecordView::executing("u1", "w2", 2);
        assert_eq!(
            final_answer_rule(Some(taken), Some("w1"), "w1"),
            FinalVerdict::Fenced
        );
        let done = RecordView {
            state: record::DONE,
            ..taken
        };
        assert_eq!(
            final_answer_rule(Some(done), Some("w2"), "w2"),
            FinalVerdict::AlreadyStored
        );
        assert_eq!(
            final_answer_rule(Some(done), Some("w1"), "w1"),
            FinalVerdict::Fenced
        );
        assert_eq!(
            final_answer_rule(None, Some("w1"), "w1"),
            FinalVerdict::Fenced
        );
    }
}
