//! The sealer's assign step: the one place a user gets a holder when the
//! credential sealer is in use. Its pure rule, its Lua and its effects live
//! here together; both buses call them, and one test runs the rule over its
//! whole input domain on both buses.
//!
//! In one atomic step the sealer, never a broker worker:
//! 1. reads `pool:grant:{user_id}` and refuses when there is none, when it
//!    was used before (a second seal per grant) or when it is not bound to
//!    the asker: a claim grant names the claim (`claim_id`), which must sit in
//!    the asker's own claim processing list for that user; a cold-start grant
//!    names the launched task, which must be the asker's; a reload grant
//!    needs the asker to be the holder the sealer recorded, with the same
//!    key;
//! 2. refuses when another worker holds the user (an unreadable mark is
//!    someone else's), and on a reload unless the asker holds it;
//! 3. marks the grant used (`used_by`, its TTL kept) and, unless this is a
//!    reload, sets the user's mark for the asker and records the asker and
//!    its key in `pool:holder:{user_id}` (and the user in `pool:holders`),
//!    keys only the sealer writes.
//!
//! Broker workers may read user marks but not write them
//! (deploy/redis-acl.conf): a compromised worker cannot make itself a user's
//! holder in the sealer's eyes.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;

use super::redis::classify;
use super::{BusError, whole_seconds};
use crate::keys;

#[cfg(test)]
use crate::protocol;
use crate::protocol::GrantReason;

/// Who asks the sealer, as the assign step compares it with what is stored.
#[derive(Debug, Clone, Copy)]
pub struct Asker<'a> {
    /// The user asked for.
    pub user_id: &'a str,
    /// The asking worker.
    pub worker_id: &'a str,
    /// The public key the sealed answer is for.
    pub seal_key: &'a str,
    /// The asking worker's task (its ECS ARN, or `local-{pid}`); `""` unknown.
    pub task_id: &'a str,
}

/// One assign step's full input: the asker and what it writes when assigned.
#[derive(Debug, Clone, Copy)]
pub struct AssignRequest<'a> {
    /// Who asks.
    pub asker: Asker<'a>,
    /// The user's mark the sealer writes for the asker (JSON).
    pub mark: &'a str,
    /// That mark's TTL.
    pub mark_ttl: std::time::Duration,
    /// The SHA-256 (hex) of the per-claim Redis password the sealer will
    /// hand the asker (`""`: none), kept in the holder record so the sealer
    /// can make the user again after a failover or an `ACL LOAD`.
    pub login_hash: &'a str,
}

/// What the user's mark says, as the step reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkSeen {
    /// No mark: no one holds the user.
    Absent,
    /// A mark naming this worker.
    Held(String),
    /// A value that is not a mark (it names no one, so it is not the asker's).
    Unreadable,
}

impl MarkSeen {
    /// Reads a stored mark as `cjson.decode` + `mark['worker_id']` does.
    pub fn of(stored: Option<&str>) -> Self {
        let Some(text) = stored else {
            return MarkSeen::Absent;
        };
        match serde_json::from_str::<Value>(text)
            .ok()
            .as_ref()
            .and_then(|mark| mark.get("worker_id"))
            .and_then(Value::as_str)
        {
            Some(worker) => MarkSeen::Held(worker.to_owned()),
            None => MarkSeen::Unreadable,
        }
    }
}

/// What the claim and settle steps do with the user's mark (the Lua's
/// `taken_for_me`): a worker may take a free user, or one the sealer's
/// assign step already gave it, never another worker's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkTake {
    /// No mark: set it (no sealer).
    Set,
    /// The sealer set it for this worker: leave it (a broker worker may not
    /// write user marks).
    AlreadyMine,
    /// Another worker, or a value that is not a mark: refuse.
    Refuse,
}

/// [`MarkTake`] for `worker_id` given the stored mark.
pub fn take_mark(mark: &MarkSeen, worker_id: &str) -> MarkTake {
    match mark {
        MarkSeen::Absent => MarkTake::Set,
        MarkSeen::Held(holder) if holder == worker_id => MarkTake::AlreadyMine,
        _ => MarkTake::Refuse,
    }
}

/// The step's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assignment {
    /// The asker now holds the user: grant used, mark and holder written.
    Assigned {
        /// What the grant was bound to (the claim id or the task id).
        bound_to: String,
    },
    /// A reload by the recorded holder: grant used, nothing else written.
    Renewed {
        /// What the holder's first grant was bound to.
        bound_to: String,
    },
    /// No live grant.
    NoGrant,
    /// The grant was used by an earlier seal.
    GrantUsed,
    /// The grant is not bound to this asker (or does not parse).
    NotBound,
    /// Another worker holds the user, or (reload) the asker does not.
    Held,
}

impl Assignment {
    /// The word the Lua returns for it.
    pub fn word(&self) -> &'static str {
        match self {
            Assignment::Assigned { .. } => "assigned",
            Assignment::Renewed { .. } => "renewed",
            Assignment::NoGrant => "no_grant",
            Assignment::GrantUsed => "grant_used",
            Assignment::NotBound => "not_bound",
            Assignment::Held => "held",
        }
    }

    /// Reads the Lua's `{word, bound_to}` reply.
    pub fn from_reply(word: &str, bound_to: String) -> Option<Self> {
        Some(match word {
            "assigned" => Assignment::Assigned { bound_to },
            "renewed" => Assignment::Renewed { bound_to },
            "no_grant" => Assignment::NoGrant,
            "grant_used" => Assignment::GrantUsed,
            "not_bound" => Assignment::NotBound,
            "held" => Assignment::Held,
            _ => return None,
        })
    }
}

/// `pool:holder:{user_id}`: the worker the sealer last assigned the user to
/// and the key it sealed to; only the sealer writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealHolder {
    /// The holder.
    pub worker_id: String,
    /// Its public key.
    pub seal_key: String,
    /// The claim id or task id its grant was bound to.
    pub bound_to: String,
    /// SHA-256 (hex) of its per-claim Redis password; `""`: none.
    #[serde(default)]
    pub login_hash: String,
}

impl SealHolder {
    /// The JSON stored in Redis.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A non-empty string field, as the Lua's `text()` reads it.
fn text<'v>(object: &'v Value, field: &str) -> Option<&'v str> {
    object
        .get(field)
        .and_then(Value::as_str)
        .filter(|value| !value.is_empty())
}

fn object(stored: Option<&str>) -> Option<Option<Value>> {
    stored.map(|text| {
        serde_json::from_str::<Value>(text)
            .ok()
            .filter(Value::is_object)
    })
}

/// The rule, pure: what the step decides from the stored grant, holder
/// record, mark and the asker's taken claims (all as stored).
pub fn assign_rule(
    asker: &Asker<'_>,
    grant: Option<&str>,
    holder: Option<&str>,
    mark: &MarkSeen,
    taken: &[String],
) -> Assignment {
    let grant = match object(grant) {
        None => return Assignment::NoGrant,
        Some(None) => return Assignment::NotBound,
        Some(Some(grant)) => grant,
    };
    if text(&grant, "used_by").is_some() {
        return Assignment::GrantUsed;
    }
    let reason: Option<GrantReason> = grant
        .get("reason")
        .and_then(|reason| serde_json::from_value(reason.clone()).ok());
    let bound_to: Option<String> = match reason {
        Some(GrantReason::Claim) => text(&grant, "claim_id")
            .filter(|id| {
                taken.iter().any(|raw| {
                    object(Some(raw)).flatten().is_some_and(|claim| {
                        claim.get("claim_id").and_then(Value::as_str) == Some(id)
                            && claim.get("user_id").and_then(Value::as_str) == Some(asker.user_id)
                    })
                })
            })
            .map(str::to_owned),
        Some(GrantReason::ColdStart) => text(&grant, "task_id")
            .filter(|task| *task == asker.task_id)
            .map(str::to_owned),
        Some(GrantReason::Reload) => object(holder).flatten().and_then(|holder| {
            let same = holder.get("worker_id").and_then(Value::as_str) == Some(asker.worker_id)
                && holder.get("seal_key").and_then(Value::as_str) == Some(asker.seal_key);
            if same {
                text(&holder, "bound_to").map(str::to_owned)
            } else {
                None
            }
        }),
        None => None,
    };
    let Some(bound_to) = bound_to else {
        return Assignment::NotBound;
    };
    let mine = *mark == MarkSeen::Held(asker.worker_id.to_owned());
    match reason {
        Some(GrantReason::Reload) if mine => Assignment::Renewed { bound_to },
        Some(GrantReason::Reload) => Assignment::Held,
        _ if mine || *mark == MarkSeen::Absent => Assignment::Assigned { bound_to },
        _ => Assignment::Held,
    }
}

/// The grant as stored once used: the same object with `used_by` set (the
/// Lua re-encodes it with cjson, so only its fields, not their order, are
/// the contract).
pub fn used_grant(grant: &str, worker_id: &str) -> String {
    let mut value: Value =
        serde_json::from_str(grant).unwrap_or_else(|_| Value::Object(Default::default()));
    if let Some(object) = value.as_object_mut() {
        object.insert("used_by".into(), Value::String(worker_id.to_owned()));
    }
    value.to_string()
}

/// Lua prefix of the claim scripts, [`take_mark`] in Lua:
/// `taken_for_me(mark_key, value, ttl)`
/// is true when the user's mark names the worker `value` (a mark JSON)
/// names (the credential sealer set it in its assign step; nothing is
/// written, as a broker worker may not write user marks), or when there was
/// no mark and it is now set to `value` (no sealer); false when another
/// worker, or a value that is not a mark, holds the user.
pub(in crate::bus) const TAKEN_FOR_ME: &str = r#"
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

/// KEYS: grant, user mark, holder record, the asker's claim processing
/// list, the set of users with a holder record.
/// ARGV: user id, worker id, seal key, task id, mark value, mark ttl (s),
/// login hash.
/// [`assign_rule`] and its effects in Lua; returns `{word, bound_to}`.
pub const ASSIGN_USER: &str = r#"
local function decoded(raw)
  if not raw then return nil end
  local ok, value = pcall(cjson.decode, raw)
  if ok and type(value) == 'table' then return value end
  return false
end
local function text(object, field)
  local value = object[field]
  if type(value) == 'string' and value ~= '' then return value end
  return nil
end
local grant = decoded(redis.call('GET', KEYS[1]))
if grant == nil then return {'no_grant', ''} end
if grant == false then return {'not_bound', ''} end
if text(grant, 'used_by') then return {'grant_used', ''} end
local reason = grant['reason']
local bound_to = nil
if reason == '{claim}' then
  local id = text(grant, 'claim_id')
  if id then
    for _, raw in ipairs(redis.call('LRANGE', KEYS[4], 0, -1)) do
      local claim = decoded(raw)
      if claim and claim['claim_id'] == id and claim['user_id'] == ARGV[1] then bound_to = id end
    end
  end
elseif reason == '{cold_start}' then
  local task = text(grant, 'task_id')
  if task and task == ARGV[4] then bound_to = task end
elseif reason == '{reload}' then
  local holder = decoded(redis.call('GET', KEYS[3]))
  if holder and holder['worker_id'] == ARGV[2] and holder['seal_key'] == ARGV[3] then
    bound_to = text(holder, 'bound_to')
  end
end
if not bound_to then return {'not_bound', ''} end
local mark = decoded(redis.call('GET', KEYS[2]))
local mine = mark and mark['worker_id'] == ARGV[2]
if reason == '{reload}' then
  if not mine then return {'held', ''} end
elseif mark ~= nil and not mine then
  return {'held', ''}
end
grant['used_by'] = ARGV[2]
redis.call('SET', KEYS[1], cjson.encode(grant), 'KEEPTTL')
if reason == '{reload}' then return {'renewed', bound_to} end
redis.call('SET', KEYS[2], ARGV[5], 'EX', ARGV[6])
redis.call('SET', KEYS[3], cjson.encode({worker_id = ARGV[2], seal_key = ARGV[3], bound_to = bound_to, login_hash = ARGV[7]}))
redis.call('ZADD', KEYS[5], 0, ARGV[1])
return {'assigned', bound_to}
"#;

/// [`ASSIGN_USER`] with the grant reasons spelled as `protocol` serialises them.
pub fn assign_user_lua() -> String {
    let word = |reason: GrantReason| {
        serde_json::to_value(reason)
            .ok()
            .and_then(|value| value.as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    ASSIGN_USER
        .replace("{claim}", &word(GrantReason::Claim))
        .replace("{cold_start}", &word(GrantReason::ColdStart))
        .replace("{reload}", &word(GrantReason::Reload))
}

impl super::memory::MemoryPoolBus {
    /// [`super::CredentialBus::assign_user`] on the in-memory bus: [`assign_rule`]
    /// applied under the keyspace's lock.
    pub(in crate::bus) async fn assign_user_in_memory(
        &self,
        request: &AssignRequest<'_>,
    ) -> Result<Assignment, BusError> {
        let now = Instant::now();
        let asker = &request.asker;
        let mut keyspace = self.lock();
        let grant_key = keys::credentials_grant(asker.user_id);
        let holder_key = keys::seal_holder(asker.user_id);
        let mark_key = keys::worker_active(asker.user_id);
        let grant = keyspace.get(&grant_key, now)?;
        let holder = keyspace.get(&holder_key, now)?;
        let mark = MarkSeen::of(keyspace.get(&mark_key, now)?.as_deref());
        let taken: Vec<String> = keyspace
            .list(&keys::claims_processing(asker.worker_id), now)?
            .map(|list| list.iter().cloned().collect())
            .unwrap_or_default();
        let decision = assign_rule(asker, grant.as_deref(), holder.as_deref(), &mark, &taken);
        if let (Assignment::Assigned { .. } | Assignment::Renewed { .. }, Some(grant)) =
            (&decision, &grant)
        {
            // KEEPTTL: the used grant expires when the grant would have.
            let expires_at = keyspace
                .live(&grant_key, now)
                .and_then(|entry| entry.expires_at);
            keyspace.set(&grant_key, &used_grant(grant, asker.worker_id), None, now);
            if let Some(entry) = keyspace.live(&grant_key, now) {
                entry.expires_at = expires_at;
            }
        }
        if let Assignment::Assigned { bound_to } = &decision {
            let ttl = Duration::from_secs(whole_seconds(request.mark_ttl));
            keyspace.set(&mark_key, request.mark, Some(ttl), now);
            let record = SealHolder {
                worker_id: asker.worker_id.to_owned(),
                seal_key: asker.seal_key.to_owned(),
                bound_to: bound_to.clone(),
                login_hash: request.login_hash.to_owned(),
            };
            keyspace.set(&holder_key, &record.to_json(), None, now);
            keyspace.zadd(keys::SEAL_HOLDERS, asker.user_id, 0, now)?;
        }
        Ok(decision)
    }
}

impl super::redis::RedisPoolBus {
    /// [`super::CredentialBus::assign_user`] on Redis: [`ASSIGN_USER`].
    pub(in crate::bus) async fn assign_user_on_redis(
        &self,
        request: &AssignRequest<'_>,
    ) -> Result<Assignment, BusError> {
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

/// Every value each input of [`assign_rule`] can take, for the whole-domain
/// test on both buses: grants, holder records, marks and taken claims around
/// one asker, whose names the caller picks (each case needs its own keys).
pub mod domain {
    use super::*;

    /// The names one case uses.
    #[derive(Debug, Clone)]
    pub struct Names {
        /// The user asked for.
        pub user: String,
        /// The asking worker; its key is `K1`, its task `task-{worker}`.
        pub worker: String,
        /// Another worker.
        pub other_worker: String,
        /// Another user.
        pub other_user: String,
    }

    /// Names built from a prefix (`{prefix}-u`, `{prefix}-w1`, …).
    pub fn names(prefix: &str) -> NamesWithTask {
        let names = Names {
            user: format!("{prefix}-u"),
            worker: format!("{prefix}-w1"),
            other_worker: format!("{prefix}-w2"),
            other_user: format!("{prefix}-bob"),
        };
        NamesWithTask {
            task: format!("task-{}", names.worker),
            names,
        }
    }

    fn grant(reason: &str, extra: &str) -> String {
        format!(r#"{{"reason":"{reason}","granted_at":1{extra}}}"#)
    }

    /// Stored grants: none, not JSON, used, bound to the asker's claim, to
    /// another claim, to no claim, to the asker's task, to another task, a
    /// reload, an unknown reason.
    pub fn grants(n: &Names) -> Vec<Option<String>> {
        let used = format!(r#","claim_id":"c1","used_by":"{}""#, n.other_worker);
        vec![
            None,
            Some("not json".into()),
            Some(grant("claim", &used)),
            Some(grant("claim", r#","claim_id":"c1""#)),
            Some(grant("claim", r#","claim_id":"c2""#)),
            Some(grant("claim", "")),
            Some(grant(
                "cold_start",
                &format!(r#","task_id":"task-{}""#, n.worker),
            )),
            Some(grant(
                "cold_start",
                &format!(r#","task_id":"task-{}""#, n.other_worker),
            )),
            Some(grant("reload", "")),
            Some(grant("coup", r#","claim_id":"c1""#)),
        ]
    }

    /// Stored holder records: none, the asker with its key, the asker with
    /// another key, another worker.
    pub fn holders(n: &Names) -> Vec<Option<String>> {
        let holder = |worker: &str, key: &str| {
            SealHolder {
                worker_id: worker.into(),
                seal_key: key.into(),
                bound_to: "c0".into(),
                login_hash: String::new(),
            }
            .to_json()
        };
        vec![
            None,
            Some(holder(&n.worker, "K1")),
            Some(holder(&n.worker, "K2")),
            Some(holder(&n.other_worker, "K1")),
        ]
    }

    /// Stored user marks: none, the asker's, another worker's, not a mark.
    pub fn marks(n: &Names) -> Vec<Option<String>> {
        let mark = |worker: &str| format!(r#"{{"worker_id":"{worker}","user_id":"{}"}}"#, n.user);
        vec![
            None,
            Some(mark(&n.worker)),
            Some(mark(&n.other_worker)),
            Some("garbage".into()),
        ]
    }

    /// The asker's taken claims: none, the user's `c1`, another user's
    /// `c1`, the user's `c2`.
    pub fn taken(n: &Names) -> Vec<Vec<String>> {
        let claim = |user: &str, id: &str| {
            format!(
                r#"{{"user_id":"{user}","encrypted_credentials":"x","claim_id":"{id}","enqueued_at":1}}"#
            )
        };
        vec![
            vec![],
            vec![claim(&n.user, "c1")],
            vec![claim(&n.other_user, "c1")],
            vec![claim(&n.user, "c2")],
        ]
    }

    /// The holder record the step writes for the case's asker.
    pub fn written_holder(n: &Names, bound_to: &str, login_hash: &str) -> SealHolder {
        SealHolder {
            worker_id: n.worker.clone(),
            seal_key: "K1".into(),
            bound_to: bound_to.into(),
            login_hash: login_hash.into(),
        }
    }

    /// [`Names`] with the asker's task id, so [`Names::asker`] can borrow it.
    #[derive(Debug, Clone)]
    pub struct NamesWithTask {
        /// The names.
        pub names: Names,
        /// `task-{worker}`.
        pub task: String,
    }

    impl std::ops::Deref for NamesWithTask {
        type Target = Names;
        fn deref(&self) -> &Names {
            &self.names
        }
    }

    impl NamesWithTask {
        /// The asker of the case.
        pub fn asker(&self) -> Asker<'_> {
            Asker {
                user_id: &self.names.user,
                worker_id: &self.names.worker,
                seal_key: "K1",
                task_id: &self.task,
            }
        }
    }
}

/// Reason strings are the protocol's: checked so a renamed variant breaks
/// here, not silently in Lua.
#[cfg(test)]
mod tests {
    use super::domain::*;
    use super::*;

    #[test]
    fn the_lua_names_every_reason_as_the_protocol_does() {
        let lua = assign_user_lua();
        for reason in ["'claim'", "'cold_start'", "'reload'"] {
            assert!(lua.contains(reason), "{reason}");
        }
        assert!(!lua.contains("{claim}"));
        let grant = protocol::CredentialsGrant {
            reason: GrantReason::ColdStart,
            granted_at: 1,
            claim_id: None,
            task_id: Some("t".into()),
            used_by: None,
        };
        assert!(grant.to_json().contains(r#""reason":"cold_start""#));
    }

    #[test]
    fn only_a_bound_unused_grant_assigns_and_only_to_a_free_or_own_user() {
        let n = names("t");
        let asker = n.asker();
        let taken = taken(&n);
        let mine = MarkSeen::Held(n.worker.clone());
        let theirs = MarkSeen::Held(n.other_worker.clone());
        let [
            none,
            bad,
            used,
            claim,
            other_claim,
            no_claim,
            task,
            other_task,
            reload,
            coup,
        ] = <[Option<String>; 10]>::try_from(grants(&n)).unwrap();
        let rule =
            |grant: &Option<String>, holder: Option<&str>, mark: &MarkSeen, taken: &[String]| {
                assign_rule(&asker, grant.as_deref(), holder, mark, taken)
            };
        let assigned = |id: &str| Assignment::Assigned {
            bound_to: id.into(),
        };
        let free = MarkSeen::Absent;
        assert_eq!(rule(&none, None, &free, &taken[1]), Assignment::NoGrant);
        assert_eq!(rule(&bad, None, &free, &taken[1]), Assignment::NotBound);
        assert_eq!(rule(&used, None, &free, &taken[1]), Assignment::GrantUsed);
        assert_eq!(rule(&claim, None, &free, &taken[1]), assigned("c1"));
        assert_eq!(rule(&claim, None, &mine, &taken[1]), assigned("c1"));
        assert_eq!(rule(&claim, None, &theirs, &taken[1]), Assignment::Held);
        assert_eq!(
            rule(&claim, None, &MarkSeen::Unreadable, &taken[1]),
            Assignment::Held
        );
        // The claim must be the asker's own, for this user.
        assert_eq!(rule(&claim, None, &free, &taken[0]), Assignment::NotBound);
        assert_eq!(rule(&claim, None, &free, &taken[2]), Assignment::NotBound);
        assert_eq!(rule(&claim, None, &free, &taken[3]), Assignment::NotBound);
        assert_eq!(
            rule(&other_claim, None, &free, &taken[1]),
            Assignment::NotBound
        );
        assert_eq!(
            rule(&no_claim, None, &free, &taken[1]),
            Assignment::NotBound
        );
        assert_eq!(rule(&task, None, &free, &[]), assigned(&n.task));
        assert_eq!(rule(&other_task, None, &free, &[]), Assignment::NotBound);
        assert_eq!(rule(&coup, None, &free, &taken[1]), Assignment::NotBound);
        // A reload: only the recorded holder with its key, while it holds the user.
        let holders = holders(&n);
        let renewed = Assignment::Renewed {
            bound_to: "c0".into(),
        };
        assert_eq!(rule(&reload, holders[1].as_deref(), &mine, &[]), renewed);
        assert_eq!(
            rule(&reload, holders[1].as_deref(), &free, &[]),
            Assignment::Held
        );
        assert_eq!(
            rule(&reload, holders[1].as_deref(), &theirs, &[]),
            Assignment::Held
        );
        assert_eq!(
            rule(&reload, holders[2].as_deref(), &mine, &[]),
            Assignment::NotBound
        );
        assert_eq!(
            rule(&reload, holders[3].as_deref(), &mine, &[]),
            Assignment::NotBound
        );
        assert_eq!(rule(&reload, None, &mine, &[]), Assignment::NotBound);
    }

    #[test]
    fn a_used_grant_keeps_its_fields_and_names_the_user() {
        let used = used_grant(r#"{"reason":"claim","claim_id":"c1","granted_at":5}"#, "w1");
        let value: Value = serde_json::from_str(&used).unwrap();
        assert_eq!(value["used_by"], "w1");
        assert_eq!(value["claim_id"], "c1");
        assert_eq!(value["granted_at"], 5);
    }

    #[test]
    fn a_worker_takes_a_free_mark_or_its_own_and_never_another() {
        assert_eq!(take_mark(&MarkSeen::Absent, "w1"), MarkTake::Set);
        assert_eq!(
            take_mark(&MarkSeen::Held("w1".into()), "w1"),
            MarkTake::AlreadyMine
        );
        assert_eq!(
            take_mark(&MarkSeen::Held("w2".into()), "w1"),
            MarkTake::Refuse
        );
        assert_eq!(take_mark(&MarkSeen::Unreadable, "w1"), MarkTake::Refuse);
    }

    #[test]
    fn marks_are_read_as_the_lua_reads_them() {
        assert_eq!(MarkSeen::of(None), MarkSeen::Absent);
        assert_eq!(
            MarkSeen::of(Some(r#"{"worker_id":"w1"}"#)),
            MarkSeen::Held("w1".into())
        );
        assert_eq!(
            MarkSeen::of(Some(r#"{"worker_id":7}"#)),
            MarkSeen::Unreadable
        );
        assert_eq!(MarkSeen::of(Some("[]")), MarkSeen::Unreadable);
    }
}
