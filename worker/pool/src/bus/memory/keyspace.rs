//! The in-memory bus's keyspace: strings, lists, hashes and sorted sets with
//! TTLs, each operation as Redis does it (lazy expiry, WRONGTYPE). The bus's
//! steps are built on it in the parent module; keeping the data model apart
//! lets each read as one thing.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::bus::begin::RecordView;
use crate::bus::{BusError, DEAD_LETTER_MAX, DEAD_LETTER_TTL, MarkWrite, MessageKind, UserMessage};
use crate::keys;
use crate::protocol::{self, metadata as field, record};

/// Redis's text for an operation on a key of another type.
pub(in crate::bus) const WRONG_TYPE: &str =
    "WRONGTYPE Operation against a key holding the wrong kind of value";

/// Every this many operations, expired keys nobody reads again (responses,
/// request records) are dropped, so a long `leasehold dev` does not grow.
pub(in crate::bus) const PURGE_EVERY: u64 = 1024;

#[derive(Debug, Clone)]
pub(in crate::bus) enum Value {
    String(String),
    List(VecDeque<String>),
    Hash(BTreeMap<String, String>),
    /// A sorted set (`pool:idle`): member → integer score.
    SortedSet(BTreeMap<String, i64>),
}

#[derive(Debug, Clone)]
pub(in crate::bus) struct Entry {
    pub(in crate::bus) value: Value,
    pub(in crate::bus) expires_at: Option<Instant>,
}

/// Which end of a list a pop takes from.
#[derive(Debug, Clone, Copy)]
pub(in crate::bus) enum End {
    /// The end producers push to (`LPUSH`).
    Head,
    /// `RPOP` / `BRPOP`: the other end (oldest first).
    Tail,
}

/// A request record as read for the settlement rules.
pub(in crate::bus) struct StoredRecord {
    pub(in crate::bus) state: String,
    pub(in crate::bus) user_id: String,
    pub(in crate::bus) worker_id: String,
    pub(in crate::bus) deliveries: u32,
    pub(in crate::bus) response: String,
}

impl StoredRecord {
    pub(in crate::bus) fn view(&self) -> RecordView<'_> {
        RecordView {
            state: &self.state,
            user_id: &self.user_id,
            worker_id: &self.worker_id,
            deliveries: self.deliveries,
        }
    }
}

/// A message handed out whole, or only its head when over the bound (as the
/// Redis script does).
pub(in crate::bus) fn bounded(kind: MessageKind, body: String, max_bytes: usize) -> UserMessage {
    let mut body = body.into_bytes();
    if body.len() <= max_bytes {
        return match kind {
            MessageKind::Control => UserMessage::Control(body),
            MessageKind::Request => UserMessage::Request(body),
        };
    }
    let length = body.len() as u64;
    body.truncate(protocol::DEAD_LETTER_HEAD_BYTES);
    UserMessage::Oversized {
        kind,
        head: body,
        length,
    }
}

#[derive(Debug, Default)]
pub(in crate::bus) struct Keyspace {
    pub(in crate::bus) entries: HashMap<String, Entry>,
    pub(in crate::bus) operations: u64,
}

impl Keyspace {
    /// The live entry at `key`; an expired one is removed, as Redis does lazily.
    pub(in crate::bus) fn live(&mut self, key: &str, now: Instant) -> Option<&mut Entry> {
        let expired = self
            .entries
            .get(key)
            .is_some_and(|entry| entry.expires_at.is_some_and(|at| at <= now));
        if expired {
            self.entries.remove(key);
        }
        self.entries.get_mut(key)
    }

    pub(in crate::bus) fn exists(&mut self, key: &str, now: Instant) -> bool {
        self.live(key, now).is_some()
    }

    pub(in crate::bus) fn get(
        &mut self,
        key: &str,
        now: Instant,
    ) -> Result<Option<String>, BusError> {
        match self.live(key, now).map(|entry| &entry.value) {
            None => Ok(None),
            Some(Value::String(value)) => Ok(Some(value.clone())),
            Some(_) => Err(BusError::Rejected(WRONG_TYPE.into())),
        }
    }

    /// `SET key value [EX ttl]`: replaces a value of any type and its TTL.
    pub(in crate::bus) fn set(
        &mut self,
        key: &str,
        value: &str,
        ttl: Option<Duration>,
        now: Instant,
    ) {
        self.entries.insert(
            key.to_owned(),
            Entry {
                value: Value::String(value.to_owned()),
                expires_at: ttl.map(|ttl| now + ttl),
            },
        );
    }

    pub(in crate::bus) fn delete(&mut self, key: &str, now: Instant) -> bool {
        self.live(key, now).is_some() && self.entries.remove(key).is_some()
    }

    pub(in crate::bus) fn list(
        &mut self,
        key: &str,
        now: Instant,
    ) -> Result<Option<&mut VecDeque<String>>, BusError> {
        match self.live(key, now).map(|entry| &mut entry.value) {
            None => Ok(None),
            Some(Value::List(list)) => Ok(Some(list)),
            Some(_) => Err(BusError::Rejected(WRONG_TYPE.into())),
        }
    }

    pub(in crate::bus) fn push(
        &mut self,
        key: &str,
        body: &str,
        end: End,
        now: Instant,
    ) -> Result<(), BusError> {
        let list = match self.list(key, now)? {
            Some(list) => list,
            None => {
                let entry = self.entries.entry(key.to_owned()).or_insert(Entry {
                    value: Value::List(VecDeque::new()),
                    expires_at: None,
                });
                match &mut entry.value {
                    Value::List(list) => list,
                    _ => return Err(BusError::Rejected(WRONG_TYPE.into())),
                }
            }
        };
        match end {
            End::Head => list.push_front(body.to_owned()),
            End::Tail => list.push_back(body.to_owned()),
        }
        Ok(())
    }

    /// Pops from the first non-empty list among `lists`; an emptied list is
    /// deleted, as in Redis.
    pub(in crate::bus) fn pop_first(
        &mut self,
        lists: &[String],
        end: End,
        now: Instant,
    ) -> Result<Option<(String, String)>, BusError> {
        for key in lists {
            let Some(list) = self.list(key, now)? else {
                continue;
            };
            let popped = match end {
                End::Head => list.pop_front(),
                End::Tail => list.pop_back(),
            };
            let emptied = list.is_empty();
            if emptied {
                self.entries.remove(key);
            }
            if let Some(body) = popped {
                return Ok(Some((key.clone(), body)));
            }
        }
        Ok(None)
    }

    /// `LMOVE from to RIGHT LEFT`: the oldest entry of `from` becomes the
    /// newest of `to`; an emptied list is deleted.
    pub(in crate::bus) fn move_oldest(
        &mut self,
        from: &str,
        to: &str,
        now: Instant,
    ) -> Result<Option<String>, BusError> {
        self.list(to, now)?;
        let Some((_, body)) = self.pop_first(&[from.to_owned()], End::Tail, now)? else {
            return Ok(None);
        };
        self.push(to, &body, End::Head, now)?;
        Ok(Some(body))
    }

    /// `RPUSH dead entry`, `LTRIM dead -max -1`, `EXPIRE dead ttl`: what
    /// every push to a dead-letter list does.
    pub(in crate::bus) fn push_dead(
        &mut self,
        dead: &str,
        entry: &str,
        now: Instant,
    ) -> Result<(), BusError> {
        self.push(dead, entry, End::Tail, now)?;
        if let Some(list) = self.list(dead, now)? {
            let max = usize::try_from(DEAD_LETTER_MAX).unwrap_or(usize::MAX);
            while list.len() > max {
                list.pop_front();
            }
        }
        self.expire(dead, DEAD_LETTER_TTL, now);
        Ok(())
    }

    /// `LREM key 1 body`: removes the entry nearest the head; whether one was.
    pub(in crate::bus) fn remove_first(
        &mut self,
        key: &str,
        body: &[u8],
        now: Instant,
    ) -> Result<bool, BusError> {
        let Ok(body) = std::str::from_utf8(body) else {
            return Ok(false);
        };
        let Some(list) = self.list(key, now)? else {
            return Ok(false);
        };
        let Some(index) = list.iter().position(|entry| entry == body) else {
            return Ok(false);
        };
        list.remove(index);
        if list.is_empty() {
            self.entries.remove(key);
        }
        Ok(true)
    }

    /// `LREM key -1 body`: removes the entry nearest the tail; whether one was.
    pub(in crate::bus) fn remove_last(
        &mut self,
        key: &str,
        body: &[u8],
        now: Instant,
    ) -> Result<bool, BusError> {
        let Ok(body) = std::str::from_utf8(body) else {
            // Everything this bus holds is UTF-8: such an entry cannot exist.
            return Ok(false);
        };
        let Some(list) = self.list(key, now)? else {
            return Ok(false);
        };
        let removed = list
            .iter()
            .rposition(|entry| entry == body)
            .is_some_and(|index| {
                list.remove(index);
                true
            });
        if list.is_empty() {
            self.entries.remove(key);
        }
        Ok(removed)
    }

    pub(in crate::bus) fn hash_field(
        &mut self,
        key: &str,
        field: &str,
        now: Instant,
    ) -> Result<Option<String>, BusError> {
        match self.live(key, now).map(|entry| &entry.value) {
            None => Ok(None),
            Some(Value::Hash(hash)) => Ok(hash.get(field).cloned()),
            Some(_) => Err(BusError::Rejected(WRONG_TYPE.into())),
        }
    }

    /// `HSET` of some fields: other fields stay, the TTL is unchanged.
    pub(in crate::bus) fn hash_set(
        &mut self,
        key: &str,
        fields: &[(&str, String)],
        now: Instant,
    ) -> Result<(), BusError> {
        if self.live(key, now).is_none() {
            self.entries.insert(
                key.to_owned(),
                Entry {
                    value: Value::Hash(BTreeMap::new()),
                    expires_at: None,
                },
            );
        }
        match self.entries.get_mut(key).map(|entry| &mut entry.value) {
            Some(Value::Hash(hash)) => {
                for (field, value) in fields {
                    hash.insert((*field).to_owned(), value.clone());
                }
                Ok(())
            }
            _ => Err(BusError::Rejected(WRONG_TYPE.into())),
        }
    }

    pub(in crate::bus) fn sorted_set(
        &mut self,
        key: &str,
        now: Instant,
    ) -> Result<Option<&mut BTreeMap<String, i64>>, BusError> {
        match self.live(key, now).map(|entry| &mut entry.value) {
            None => Ok(None),
            Some(Value::SortedSet(set)) => Ok(Some(set)),
            Some(_) => Err(BusError::Rejected(WRONG_TYPE.into())),
        }
    }

    /// `ZSCORE key member`.
    pub(in crate::bus) fn zscore(
        &mut self,
        key: &str,
        member: &str,
        now: Instant,
    ) -> Result<Option<i64>, BusError> {
        Ok(self
            .sorted_set(key, now)?
            .and_then(|set| set.get(member).copied()))
    }

    /// `ZADD key score member`.
    pub(in crate::bus) fn zadd(
        &mut self,
        key: &str,
        member: &str,
        score: i64,
        now: Instant,
    ) -> Result<(), BusError> {
        if self.sorted_set(key, now)?.is_none() {
            self.entries.insert(
                key.to_owned(),
                Entry {
                    value: Value::SortedSet(BTreeMap::new()),
                    expires_at: None,
                },
            );
        }
        if let Some(set) = self.sorted_set(key, now)? {
            set.insert(member.to_owned(), score);
        }
        Ok(())
    }

    /// `ZREM key member`; an emptied set is deleted, as in Redis.
    pub(in crate::bus) fn zrem(
        &mut self,
        key: &str,
        member: &str,
        now: Instant,
    ) -> Result<(), BusError> {
        let emptied = match self.sorted_set(key, now)? {
            Some(set) => {
                set.remove(member);
                set.is_empty()
            }
            None => false,
        };
        if emptied {
            self.entries.remove(key);
        }
        Ok(())
    }

    /// Whether pool worker `worker_id` is retired (scores below 0 in `pool:idle`).
    pub(in crate::bus) fn retired(
        &mut self,
        worker_id: &str,
        now: Instant,
    ) -> Result<bool, BusError> {
        Ok(self
            .zscore(keys::POOL_IDLE, worker_id, now)?
            .is_some_and(|score| score < 0))
    }

    /// Hands every claim in `worker_id`'s processing list back to the serving
    /// end of `pool:claims` (the retired worker's take).
    pub(in crate::bus) fn hand_back(
        &mut self,
        worker_id: &str,
        now: Instant,
    ) -> Result<(), BusError> {
        let processing = keys::claims_processing(worker_id);
        while let Some((_, body)) =
            self.pop_first(std::slice::from_ref(&processing), End::Head, now)?
        {
            self.push(keys::POOL_CLAIMS, &body, End::Tail, now)?;
        }
        Ok(())
    }

    pub(in crate::bus) fn expire(&mut self, key: &str, ttl: Duration, now: Instant) {
        if let Some(entry) = self.live(key, now) {
            entry.expires_at = Some(now + ttl);
        }
    }

    /// Fails like Redis before anything is written when `key` holds a non-hash.
    pub(in crate::bus) fn check_hash(&mut self, key: &str, now: Instant) -> Result<(), BusError> {
        match self.live(key, now).map(|entry| &entry.value) {
            None | Some(Value::Hash(_)) => Ok(()),
            Some(_) => Err(BusError::Rejected(WRONG_TYPE.into())),
        }
    }

    pub(in crate::bus) fn write_metadata(
        &mut self,
        mark: &MarkWrite<'_>,
        ttl: Duration,
        now: Instant,
    ) -> Result<(), BusError> {
        let key = keys::worker_metadata(mark.user_id);
        let metadata = mark.metadata;
        let mut fields = vec![
            (field::TASK_ARN, metadata.task_arn.clone()),
            (field::INSTANCE_ID, metadata.instance_id.clone()),
            (field::LAUNCHED_AT, metadata.launched_at.to_string()),
        ];
        if let Some(url) = &metadata.sidecar_url {
            fields.push((field::SIDECAR_URL, url.clone()));
        }
        self.hash_set(&key, &fields, now)?;
        self.expire(&key, ttl, now);
        Ok(())
    }

    /// The `worker_id` of the user's liveness mark, as the request scripts'
    /// `holder()` reads it: `None` when absent or not a mark.
    pub(in crate::bus) fn mark_holder(
        &mut self,
        user_id: &str,
        now: Instant,
    ) -> Result<Option<String>, BusError> {
        let Some(current) = self.get(&keys::worker_active(user_id), now)? else {
            return Ok(None);
        };
        let mark: Option<serde_json::Value> = serde_json::from_str(&current).ok();
        Ok(mark
            .as_ref()
            .and_then(|mark| mark.get("worker_id"))
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned))
    }

    /// A request record's fields the settlement rules read, owned.
    pub(in crate::bus) fn record(
        &mut self,
        key: &str,
        now: Instant,
    ) -> Result<Option<StoredRecord>, BusError> {
        let Some(state) = self.hash_field(key, record::STATE, now)? else {
            return Ok(None);
        };
        let mut field = |name| {
            self.hash_field(key, name, now)
                .map(Option::unwrap_or_default)
        };
        Ok(Some(StoredRecord {
            state,
            user_id: field(record::USER_ID)?,
            worker_id: field(record::WORKER_ID)?,
            // Records older than the count had one delivery, as in Lua.
            deliveries: field(record::DELIVERIES)?.parse().unwrap_or(1),
            response: field(record::RESPONSE)?,
        }))
    }

    /// The claim scripts' `taken_for_me`: the user's mark names this
    /// worker already (set by the sealer; left as it is), or was absent and
    /// is now set to the worker's value. `false`: someone else holds it.
    pub(in crate::bus) fn taken_for(
        &mut self,
        mark: &crate::bus::MarkWrite<'_>,
        ttl: Duration,
        now: Instant,
    ) -> Result<bool, BusError> {
        use crate::bus::assign::{MarkSeen, MarkTake, take_mark};
        let key = keys::worker_active(mark.user_id);
        let stored = MarkSeen::of(self.get(&key, now)?.as_deref());
        Ok(match take_mark(&stored, mark.worker_id) {
            MarkTake::Set => {
                self.set(&key, mark.value, Some(ttl), now);
                true
            }
            MarkTake::AlreadyMine => true,
            MarkTake::Refuse => false,
        })
    }

    /// The Lua guard: the mark is absent or names `worker_id`.
    pub(in crate::bus) fn mark_is_mine_or_absent(
        &mut self,
        user_id: &str,
        worker_id: &str,
        now: Instant,
    ) -> Result<bool, BusError> {
        let Some(current) = self.get(&keys::worker_active(user_id), now)? else {
            return Ok(true);
        };
        // As `cjson.decode` + `mark['worker_id'] == ARGV[1]`: anything that is
        // not an object with that string field belongs to someone else.
        let mark: Option<serde_json::Value> = serde_json::from_str(&current).ok();
        Ok(mark
            .as_ref()
            .and_then(|mark| mark.get("worker_id"))
            .and_then(serde_json::Value::as_str)
            == Some(worker_id))
    }

    pub(in crate::bus) fn purge_expired(&mut self, now: Instant) {
        self.entries
            .retain(|_, entry| entry.expires_at.is_none_or(|at| at > now));
    }
}
