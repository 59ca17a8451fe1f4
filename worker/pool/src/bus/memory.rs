//! The pool bus in one process, with the Redis bus's semantics: one keyspace
//! of strings, lists and hashes with TTLs on `tokio::time::Instant` (so tests
//! can pause the clock), each operation one mutex section (as each Lua script
//! is one atomic step in Redis), blocking pops woken by pushes, and glob
//! matching as Redis's `SCAN MATCH` does it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::keys;
use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    Answer, AnswerMode, Answered, Begun, BusError, CLAIM_OUTCOME_TTL, ClaimSettle, DEAD_LETTER_MAX,
    DEAD_LETTER_TTL, IdleEntry, Inspect, LedgerWrite, MarkWrite, MessageKind, Oversized,
    PaperLedger, PoolBus, REQUEST_RECORD_TTL, RESPONSE_TTL, SHED_BATCH, Settled, Shed, StoredMark,
    Take, TakenClaim, UserMessage, ledger_entry_parts, whole_seconds,
};
use crate::protocol::{self, record};
use crate::settlement::{self, BeginWrite, FinalVerdict, RecordView};

mod glob;
pub use glob::glob_match;

/// Redis's text for an operation on a key of another type.
const WRONG_TYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

/// Every this many operations, expired keys nobody reads again (responses,
/// request records) are dropped, so a long `leasehold dev` does not grow.
const PURGE_EVERY: u64 = 1024;

#[derive(Debug, Clone)]
enum Value {
    String(String),
    List(VecDeque<String>),
    Hash(BTreeMap<String, String>),
    /// A sorted set (`pool:idle`): member → integer score.
    SortedSet(BTreeMap<String, i64>),
}

#[derive(Debug, Clone)]
struct Entry {
    value: Value,
    expires_at: Option<Instant>,
}

/// Which end of a list a pop takes from.
#[derive(Debug, Clone, Copy)]
enum End {
    /// The end producers push to (`LPUSH`).
    Head,
    /// `RPOP` / `BRPOP`: the other end (oldest first).
    Tail,
}

/// A request record as read for the settlement rules.
struct StoredRecord {
    state: String,
    user_id: String,
    worker_id: String,
    deliveries: u32,
    response: String,
}

impl StoredRecord {
    fn view(&self) -> RecordView<'_> {
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
fn bounded(kind: MessageKind, body: String, max_bytes: usize) -> UserMessage {
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
struct Keyspace {
    entries: HashMap<String, Entry>,
    operations: u64,
}

impl Keyspace {
    /// The live entry at `key`; an expired one is removed, as Redis does lazily.
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Entry> {
        let expired = self
            .entries
            .get(key)
            .is_some_and(|entry| entry.expires_at.is_some_and(|at| at <= now));
        if expired {
            self.entries.remove(key);
        }
        self.entries.get_mut(key)
    }

    fn exists(&mut self, key: &str, now: Instant) -> bool {
        self.live(key, now).is_some()
    }

    fn get(&mut self, key: &str, now: Instant) -> Result<Option<String>, BusError> {
        match self.live(key, now).map(|entry| &entry.value) {
            None => Ok(None),
            Some(Value::String(value)) => Ok(Some(value.clone())),
            Some(_) => Err(BusError::Rejected(WRONG_TYPE.into())),
        }
    }

    /// `SET key value [EX ttl]`: replaces a value of any type and its TTL.
    fn set(&mut self, key: &str, value: &str, ttl: Option<Duration>, now: Instant) {
        self.entries.insert(
            key.to_owned(),
            Entry {
                value: Value::String(value.to_owned()),
                expires_at: ttl.map(|ttl| now + ttl),
            },
        );
    }

    fn delete(&mut self, key: &str, now: Instant) -> bool {
        self.live(key, now).is_some() && self.entries.remove(key).is_some()
    }

    fn list(&mut self, key: &str, now: Instant) -> Result<Option<&mut VecDeque<String>>, BusError> {
        match self.live(key, now).map(|entry| &mut entry.value) {
            None => Ok(None),
            Some(Value::List(list)) => Ok(Some(list)),
            Some(_) => Err(BusError::Rejected(WRONG_TYPE.into())),
        }
    }

    fn push(&mut self, key: &str, body: &str, end: End, now: Instant) -> Result<(), BusError> {
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
    fn pop_first(
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
    fn move_oldest(
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
    fn push_dead(&mut self, dead: &str, entry: &str, now: Instant) -> Result<(), BusError> {
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
    fn remove_first(&mut self, key: &str, body: &[u8], now: Instant) -> Result<bool, BusError> {
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
    fn remove_last(&mut self, key: &str, body: &[u8], now: Instant) -> Result<bool, BusError> {
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

    fn hash_field(
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
    fn hash_set(
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

    fn sorted_set(
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
    fn zscore(&mut self, key: &str, member: &str, now: Instant) -> Result<Option<i64>, BusError> {
        Ok(self
            .sorted_set(key, now)?
            .and_then(|set| set.get(member).copied()))
    }

    /// `ZADD key score member`.
    fn zadd(&mut self, key: &str, member: &str, score: i64, now: Instant) -> Result<(), BusError> {
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
    fn zrem(&mut self, key: &str, member: &str, now: Instant) -> Result<(), BusError> {
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
    fn retired(&mut self, worker_id: &str, now: Instant) -> Result<bool, BusError> {
        Ok(self
            .zscore(keys::POOL_IDLE, worker_id, now)?
            .is_some_and(|score| score < 0))
    }

    /// Hands every claim in `worker_id`'s processing list back to the serving
    /// end of `pool:claims` (the retired worker's take).
    fn hand_back(&mut self, worker_id: &str, now: Instant) -> Result<(), BusError> {
        let processing = keys::claims_processing(worker_id);
        while let Some((_, body)) =
            self.pop_first(std::slice::from_ref(&processing), End::Head, now)?
        {
            self.push(keys::POOL_CLAIMS, &body, End::Tail, now)?;
        }
        Ok(())
    }

    fn expire(&mut self, key: &str, ttl: Duration, now: Instant) {
        if let Some(entry) = self.live(key, now) {
            entry.expires_at = Some(now + ttl);
        }
    }

    /// Fails like Redis before anything is written when `key` holds a non-hash.
    fn check_hash(&mut self, key: &str, now: Instant) -> Result<(), BusError> {
        match self.live(key, now).map(|entry| &entry.value) {
            None | Some(Value::Hash(_)) => Ok(()),
            Some(_) => Err(BusError::Rejected(WRONG_TYPE.into())),
        }
    }

    fn write_metadata(
        &mut self,
        mark: &MarkWrite<'_>,
        ttl: Duration,
        now: Instant,
    ) -> Result<(), BusError> {
        let key = keys::worker_metadata(mark.user_id);
        let metadata = mark.metadata;
        let mut fields = vec![
            ("task_arn", metadata.task_arn.clone()),
            ("instance_id", metadata.instance_id.clone()),
            ("launched_at", metadata.launched_at.to_string()),
        ];
        if let Some(url) = &metadata.sidecar_url {
            fields.push(("sidecar_url", url.clone()));
        }
        self.hash_set(&key, &fields, now)?;
        self.expire(&key, ttl, now);
        Ok(())
    }

    /// The `worker_id` of the user's liveness mark, as the request scripts'
    /// `holder()` reads it: `None` when absent or not a mark.
    fn mark_holder(&mut self, user_id: &str, now: Instant) -> Result<Option<String>, BusError> {
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
    fn record(&mut self, key: &str, now: Instant) -> Result<Option<StoredRecord>, BusError> {
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

    /// The Lua guard: the mark is absent or names `worker_id`.
    fn mark_is_mine_or_absent(
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

    fn purge_expired(&mut self, now: Instant) {
        self.entries
            .retain(|_, entry| entry.expires_at.is_none_or(|at| at > now));
    }
}

/// The pool bus in memory. Share it as `Arc<MemoryPoolBus>` (or
/// `Arc<dyn PoolBus>`) between every component of one process.
#[derive(Debug, Default)]
pub struct MemoryPoolBus {
    keyspace: Mutex<Keyspace>,
    /// Woken on every push, so blocked pops look again.
    pushed: Notify,
    /// The next this many `begin_request` calls fail as if Redis were away.
    failing_begins: AtomicU32,
    /// The next this many `answer_request` / `drop_request` calls fail so.
    failing_answers: AtomicU32,
    /// The next this many `settle_claim` calls run, then fail as if the
    /// reply were lost.
    lost_settle_replies: AtomicU32,
    /// The next this many `refresh_user_mark` calls run, then fail as if
    /// the reply were lost.
    lost_refresh_replies: AtomicU32,
    /// The bus clock's offset from this host's, in ms ([`Self::skew_clock`]).
    clock_skew_ms: AtomicI64,
    /// Test hooks run after a read took its snapshot ([`Self::after_read`]).
    hooks: Hooks,
}

/// The snapshot reads a race test can interleave a change after.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SnapshotRead {
    /// [`Inspect::marks`] (the sweep's snapshot).
    Marks,
    /// [`PoolBus::idle_workers`] (the pool manager's and the claim's read).
    IdleWorkers,
}

/// A test hook run between a snapshot and its caller's next step.
type Hook = Box<dyn FnOnce() -> futures_util::future::BoxFuture<'static, ()> + Send>;

/// The hooks by read and call number (from 1), and the calls so far.
#[derive(Default)]
struct Hooks {
    hooks: Mutex<BTreeMap<(SnapshotRead, u32), Hook>>,
    calls: Mutex<BTreeMap<SnapshotRead, u32>>,
}

impl Hooks {
    /// Counts a call of `read` and runs its hook, if any.
    async fn run(&self, read: SnapshotRead) {
        let call = {
            let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
            let count = calls.entry(read).or_default();
            *count += 1;
            *count
        };
        let hook = self
            .hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(read, call));
        if let Some(hook) = hook {
            hook().await;
        }
    }
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks").finish_non_exhaustive()
    }
}

impl MemoryPoolBus {
    /// An empty bus.
    pub fn new() -> Self {
        MemoryPoolBus::default()
    }

    /// Makes the next `count` [`PoolBus::begin_request`] calls fail with
    /// [`BusError::Unavailable`] before touching anything: how tests show that
    /// a worker survives Redis going away mid-request without losing it.
    pub fn fail_begins(&self, count: u32) {
        self.failing_begins.store(count, Ordering::SeqCst);
    }

    /// The same for the next `count` [`PoolBus::answer_request`] and
    /// [`PoolBus::drop_request`] calls (the step after the broker call).
    pub fn fail_answers(&self, count: u32) {
        self.failing_answers.store(count, Ordering::SeqCst);
    }

    /// Makes the next `count` [`PoolBus::settle_claim`] calls take effect
    /// and then fail with [`BusError::Unavailable`], as when Redis ran the
    /// script and the reply was lost: how tests show that an unknown claim
    /// outcome is resolved, never taken for a failure.
    pub fn lose_settle_replies(&self, count: u32) {
        self.lost_settle_replies.store(count, Ordering::SeqCst);
    }

    /// Makes the next `count` [`PoolBus::refresh_user_mark`] calls take
    /// effect and then fail, as heartbeats whose replies are lost: the mark
    /// stays fresh, but its worker cannot tell.
    pub fn lose_refresh_replies(&self, count: u32) {
        self.lost_refresh_replies.store(count, Ordering::SeqCst);
    }

    /// Moves this bus's clock ([`Inspect::server_time_ms`], the `pool:idle`
    /// scores) `skew_ms` away from the host's, as a Redis server whose clock
    /// differs from the sweeper's.
    pub fn skew_clock(&self, skew_ms: i64) {
        self.clock_skew_ms.store(skew_ms, Ordering::SeqCst);
    }

    /// Runs `hook` right after the `call`-th `read` (counting from 1) took its
    /// snapshot and before it returns: how race tests change the bus between
    /// a snapshot and its caller's next step, deterministically. For tests.
    pub fn after_read<F>(&self, read: SnapshotRead, call: u32, hook: F)
    where
        F: FnOnce() -> futures_util::future::BoxFuture<'static, ()> + Send + 'static,
    {
        self.hooks
            .hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((read, call), Box::new(hook));
    }

    /// This bus's clock, unix ms.
    fn now_ms(&self) -> u64 {
        let host = leasehold_now_ms();
        host.saturating_add_signed(self.clock_skew_ms.load(Ordering::SeqCst))
    }

    fn inject_fault(counter: &AtomicU32) -> Result<(), BusError> {
        if counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(BusError::Unavailable("injected fault".into()));
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Keyspace> {
        let mut keyspace = self.keyspace.lock().unwrap_or_else(|p| p.into_inner());
        keyspace.operations += 1;
        if keyspace.operations.is_multiple_of(PURGE_EVERY) {
            keyspace.purge_expired(Instant::now());
        }
        keyspace
    }

    fn push(&self, key: &str, body: &str, end: End) -> Result<(), BusError> {
        self.lock().push(key, body, end, Instant::now())?;
        self.pushed.notify_waiters();
        Ok(())
    }
}

#[async_trait]
impl PoolBus for MemoryPoolBus {
    async fn claim_user(&self, mark: &MarkWrite<'_>) -> Result<bool, BusError> {
        let now = Instant::now();
        let ttl = Duration::from_secs(whole_seconds(mark.ttl));
        let mut keyspace = self.lock();
        let user_mark = keys::worker_active(mark.user_id);
        if keyspace.exists(&user_mark, now) {
            return Ok(false);
        }
        keyspace.set(&user_mark, mark.value, Some(ttl), now);
        keyspace.delete(&keys::pool_worker_active(mark.worker_id), now);
        keyspace.delete(&keys::worker_metadata(mark.user_id), now);
        keyspace.write_metadata(mark, ttl, now)?;
        Ok(true)
    }

    async fn refresh_user_mark(&self, mark: &MarkWrite<'_>) -> Result<bool, BusError> {
        let now = Instant::now();
        let ttl = Duration::from_secs(whole_seconds(mark.ttl));
        let mut keyspace = self.lock();
        if !keyspace.mark_is_mine_or_absent(mark.user_id, mark.worker_id, now)? {
            return Ok(false);
        }
        keyspace.check_hash(&keys::worker_metadata(mark.user_id), now)?;
        keyspace.set(
            &keys::worker_active(mark.user_id),
            mark.value,
            Some(ttl),
            now,
        );
        keyspace.write_metadata(mark, ttl, now)?;
        drop(keyspace);
        Self::inject_fault(&self.lost_refresh_replies)?;
        Ok(true)
    }

    async fn release_user_mark(&self, user_id: &str, worker_id: &str) -> Result<bool, BusError> {
        let now = Instant::now();
        let mut keyspace = self.lock();
        if !keyspace.mark_is_mine_or_absent(user_id, worker_id, now)? {
            return Ok(false);
        }
        keyspace.delete(&keys::worker_active(user_id), now);
        keyspace.delete(&keys::worker_metadata(user_id), now);
        Ok(true)
    }

    async fn user_is_active(&self, user_id: &str) -> Result<bool, BusError> {
        Ok(self
            .lock()
            .exists(&keys::worker_active(user_id), Instant::now()))
    }

    async fn set_pool_mark(
        &self,
        worker_id: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<bool, BusError> {
        let ttl = Duration::from_secs(whole_seconds(ttl));
        let (now, clock) = (Instant::now(), self.now_ms());
        let mut keyspace = self.lock();
        // Fails like the script's ZSCORE before anything is written.
        let retired = keyspace.retired(worker_id, now)?;
        keyspace.set(&keys::pool_worker_active(worker_id), value, Some(ttl), now);
        if retired {
            return Ok(false);
        }
        let score = i64::try_from(clock).unwrap_or(i64::MAX);
        keyspace.zadd(keys::POOL_IDLE, worker_id, score, now)?;
        Ok(true)
    }

    async fn delete_pool_mark(&self, worker_id: &str) -> Result<(), BusError> {
        let now = Instant::now();
        let mut keyspace = self.lock();
        keyspace.sorted_set(keys::POOL_IDLE, now)?;
        keyspace.delete(&keys::pool_worker_active(worker_id), now);
        keyspace.zrem(keys::POOL_IDLE, worker_id, now)
    }

    async fn idle_workers(&self) -> Result<Vec<IdleEntry>, BusError> {
        let idle = self.idle_now()?;
        self.hooks.run(SnapshotRead::IdleWorkers).await;
        Ok(idle)
    }

    async fn retire_idle(&self, worker_id: &str) -> Result<bool, BusError> {
        let now = Instant::now();
        let mut keyspace = self.lock();
        if keyspace
            .zscore(keys::POOL_IDLE, worker_id, now)?
            .is_none_or(|score| score < 0)
        {
            return Ok(false);
        }
        let busy = keyspace
            .list(&keys::claims_processing(worker_id), now)?
            .is_some_and(|list| !list.is_empty());
        if busy || !keyspace.exists(&keys::pool_worker_active(worker_id), now) {
            return Ok(false);
        }
        keyspace.zadd(keys::POOL_IDLE, worker_id, -1, now)?;
        Ok(true)
    }

    async fn delete_mark_if(
        &self,
        key: &str,
        expected: &str,
        also: &[String],
    ) -> Result<bool, BusError> {
        let now = Instant::now();
        let mut keyspace = self.lock();
        if keyspace.get(key, now)?.as_deref() != Some(expected) {
            return Ok(false);
        }
        keyspace.delete(key, now);
        for other in also {
            keyspace.delete(other, now);
        }
        Ok(true)
    }

    async fn push_claim(&self, body: &str) -> Result<(), BusError> {
        self.push(keys::POOL_CLAIMS, body, End::Head)
    }

    async fn take_claim(
        &self,
        worker_id: &str,
        timeout: Duration,
        interrupt: &CancellationToken,
    ) -> Result<Take, BusError> {
        let processing = keys::claims_processing(worker_id);
        let deadline = Instant::now() + timeout;
        loop {
            // Registered before looking, so a push between the look and the
            // wait still wakes this take.
            let pushed = self.pushed.notified();
            tokio::pin!(pushed);
            pushed.as_mut().enable();
            {
                let now = Instant::now();
                let mut keyspace = self.lock();
                if keyspace.retired(worker_id, now)? {
                    keyspace.hand_back(worker_id, now)?;
                    drop(keyspace);
                    self.pushed.notify_waiters();
                    return Ok(Take::Retired);
                }
                if let Some(held) = keyspace
                    .list(&processing, now)?
                    .and_then(|list| list.back().cloned())
                {
                    return Ok(Take::Claim(TakenClaim {
                        raw: held.into_bytes(),
                    }));
                }
                if let Some(moved) = keyspace.move_oldest(keys::POOL_CLAIMS, &processing, now)? {
                    return Ok(Take::Claim(TakenClaim {
                        raw: moved.into_bytes(),
                    }));
                }
            }
            if !wait_for_push(pushed, deadline, interrupt).await {
                return Ok(Take::Empty);
            }
        }
    }

    async fn settle_claim(
        &self,
        mark: &MarkWrite<'_>,
        claim: &ClaimSettle<'_>,
    ) -> Result<Settled, BusError> {
        let now = Instant::now();
        let ttl = Duration::from_secs(whole_seconds(mark.ttl));
        let mut keyspace = self.lock();
        if !keyspace.remove_last(&keys::claims_processing(mark.worker_id), claim.raw, now)? {
            return Ok(Settled::NotHeld);
        }
        let outcome = keys::claim_outcome(claim.claim_id);
        let user_mark = keys::worker_active(mark.user_id);
        if keyspace.exists(&user_mark, now) {
            // A claim settled before (a re-queue after a failover lost the
            // step's removal) keeps its outcome: `failed` must not replace the
            // `claimed` of the worker that serves the user.
            if !keyspace.exists(&outcome, now) {
                keyspace.set(&outcome, claim.refused, Some(CLAIM_OUTCOME_TTL), now);
            }
            return Ok(Settled::Refused);
        }
        keyspace.set(&user_mark, mark.value, Some(ttl), now);
        keyspace.delete(&keys::pool_worker_active(mark.worker_id), now);
        keyspace.delete(&keys::worker_metadata(mark.user_id), now);
        keyspace.write_metadata(mark, ttl, now)?;
        keyspace.set(&outcome, claim.claimed, Some(CLAIM_OUTCOME_TTL), now);
        drop(keyspace);
        Self::inject_fault(&self.lost_settle_replies)?;
        Ok(Settled::Claimed)
    }

    async fn fail_claim(
        &self,
        worker_id: &str,
        raw: &[u8],
        outcome: Option<(&str, &str)>,
        reason: &str,
        at_unix_ms: u64,
    ) -> Result<bool, BusError> {
        let now = Instant::now();
        let mut keyspace = self.lock();
        if !keyspace.remove_last(&keys::claims_processing(worker_id), raw, now)? {
            return Ok(false);
        }
        keyspace.push_dead(
            &keys::dead_letter(keys::POOL_CLAIMS),
            &protocol::dead_letter_raw(reason, raw, at_unix_ms),
            now,
        )?;
        if let Some((claim_id, outcome)) = outcome {
            keyspace.set(
                &keys::claim_outcome(claim_id),
                outcome,
                Some(CLAIM_OUTCOME_TTL),
                now,
            );
        }
        Ok(true)
    }

    async fn return_claim(&self, worker_id: &str, raw: &[u8]) -> Result<bool, BusError> {
        let now = Instant::now();
        {
            let mut keyspace = self.lock();
            if !keyspace.remove_last(&keys::claims_processing(worker_id), raw, now)? {
                return Ok(false);
            }
            keyspace.push(
                keys::POOL_CLAIMS,
                &String::from_utf8_lossy(raw),
                End::Tail,
                now,
            )?;
        }
        self.pushed.notify_waiters();
        Ok(true)
    }

    async fn requeue_claims(&self, worker_id: &str) -> Result<u64, BusError> {
        let now = Instant::now();
        let processing = keys::claims_processing(worker_id);
        let mut moved = 0;
        {
            let mut keyspace = self.lock();
            if keyspace.exists(&keys::pool_worker_active(worker_id), now) {
                return Ok(0);
            }
            // Newest first to the serving end, so the oldest is served first.
            while let Some((_, body)) =
                keyspace.pop_first(std::slice::from_ref(&processing), End::Head, now)?
            {
                keyspace.push(keys::POOL_CLAIMS, &body, End::Tail, now)?;
                moved += 1;
            }
        }
        if moved > 0 {
            self.pushed.notify_waiters();
        }
        Ok(moved)
    }

    async fn set_if_absent(&self, key: &str, value: &str, ttl: Duration) -> Result<bool, BusError> {
        let now = Instant::now();
        let mut keyspace = self.lock();
        if keyspace.exists(key, now) {
            return Ok(false);
        }
        keyspace.set(
            key,
            value,
            Some(Duration::from_secs(whole_seconds(ttl))),
            now,
        );
        Ok(true)
    }

    async fn push_request(&self, user_id: &str, body: &str) -> Result<(), BusError> {
        self.push(&keys::user_requests(user_id), body, End::Head)
    }

    async fn push_control(&self, user_id: &str, body: &str) -> Result<(), BusError> {
        self.push(&keys::worker_control(user_id), body, End::Head)
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
                if let Some(handling) = keyspace
                    .list(&control_processing, now)?
                    .and_then(|list| list.back().cloned())
                {
                    return Ok(Some(bounded(MessageKind::Control, handling, max_bytes)));
                }
                if let Some(moved) = keyspace.move_oldest(&control, &control_processing, now)? {
                    return Ok(Some(bounded(MessageKind::Control, moved, max_bytes)));
                }
                if let Some(oldest) = keyspace
                    .list(&processing, now)?
                    .and_then(|list| list.back().cloned())
                {
                    return Ok(Some(bounded(MessageKind::Request, oldest, max_bytes)));
                }
                if let Some(moved) = keyspace.move_oldest(&requests, &processing, now)? {
                    return Ok(Some(bounded(MessageKind::Request, moved, max_bytes)));
                }
            }
            if !wait_for_push(pushed, deadline, interrupt).await {
                return Ok(None);
            }
        }
    }

    async fn finish_control(&self, user_id: &str, raw: &[u8]) -> Result<(), BusError> {
        self.lock().remove_last(
            &keys::worker_control_processing(user_id),
            raw,
            Instant::now(),
        )?;
        Ok(())
    }

    async fn dead_letter(
        &self,
        list_key: &str,
        reason: &str,
        body: &str,
        at_unix_ms: u64,
    ) -> Result<(), BusError> {
        self.lock().push_dead(
            &keys::dead_letter(list_key),
            &protocol::dead_letter(reason, body, at_unix_ms),
            Instant::now(),
        )
    }

    async fn begin_request(
        &self,
        request_id: &str,
        user_id: &str,
        worker_id: &str,
        at_unix_ms: u64,
    ) -> Result<Begun, BusError> {
        Self::inject_fault(&self.failing_begins)?;
        let now = Instant::now();
        let key = keys::request_record(request_id);
        let mut keyspace = self.lock();
        let holder = keyspace.mark_holder(user_id, now)?;
        let stored = keyspace.record(&key, now)?;
        let (begun, write) = settlement::begin_rule(
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

    async fn answer_request(&self, answer: &Answer<'_>) -> Result<Answered, BusError> {
        Self::inject_fault(&self.failing_answers)?;
        let now = Instant::now();
        let record_key = keys::request_record(answer.request_id);
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
                match settlement::final_answer_rule(
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
                &keys::response(answer.request_id),
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

    async fn drop_oversized(&self, oversized: &Oversized<'_>) -> Result<bool, BusError> {
        Self::inject_fault(&self.failing_answers)?;
        let now = Instant::now();
        let mut keyspace = self.lock();
        let (list, processing) = match oversized.kind {
            MessageKind::Request => (
                keys::user_requests(oversized.user_id),
                keys::user_processing(oversized.user_id),
            ),
            MessageKind::Control => (
                keys::worker_control(oversized.user_id),
                keys::worker_control_processing(oversized.user_id),
            ),
        };
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
            let record_key = keys::request_record(request_id);
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
                    &keys::response(request_id),
                    response,
                    Some(RESPONSE_TTL),
                    now,
                );
            }
        }
        Ok(true)
    }

    async fn drop_request(
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

    async fn excess_requests(&self, user_id: &str, max: u64) -> Result<Vec<Vec<u8>>, BusError> {
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

    async fn shed_request(&self, shed: &Shed<'_>) -> Result<bool, BusError> {
        let now = Instant::now();
        let record_key = keys::request_record(shed.request_id);
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
            &keys::response(shed.request_id),
            shed.response,
            Some(RESPONSE_TTL),
            now,
        );
        Ok(true)
    }

    async fn put_response(&self, request_id: &str, body: &str) -> Result<(), BusError> {
        self.lock().set(
            &keys::response(request_id),
            body,
            Some(RESPONSE_TTL),
            Instant::now(),
        );
        Ok(())
    }

    async fn credentials(&self, user_id: &str) -> Result<Option<String>, BusError> {
        self.lock().get(&keys::credentials(user_id), Instant::now())
    }

    async fn put_credentials(&self, user_id: &str, blob: &str) -> Result<(), BusError> {
        self.lock()
            .set(&keys::credentials(user_id), blob, None, Instant::now());
        Ok(())
    }

    async fn replace_credentials(
        &self,
        user_id: &str,
        expected: &str,
        blob: &str,
    ) -> Result<bool, BusError> {
        let key = keys::credentials(user_id);
        let now = Instant::now();
        let mut state = self.lock();
        if state.get(&key, now)?.as_deref() != Some(expected) {
            return Ok(false);
        }
        state.set(&key, blob, None, now);
        Ok(true)
    }

    async fn maintenance_report(&self) -> Result<Option<String>, BusError> {
        self.lock()
            .get(keys::MAINTENANCE_LAST_REPORT, Instant::now())
    }

    async fn grant_credentials(
        &self,
        user_id: &str,
        grant: &str,
        ttl: Duration,
    ) -> Result<(), BusError> {
        self.lock().set(
            &keys::credentials_grant(user_id),
            grant,
            Some(Duration::from_secs(whole_seconds(ttl))),
            Instant::now(),
        );
        Ok(())
    }

    async fn put_maintenance_report(&self, report: &str) -> Result<(), BusError> {
        self.lock()
            .set(keys::MAINTENANCE_LAST_REPORT, report, None, Instant::now());
        Ok(())
    }

    async fn delete_keys(&self, keys: &[String]) -> Result<u64, BusError> {
        let now = Instant::now();
        let mut keyspace = self.lock();
        Ok(keys.iter().filter(|key| keyspace.delete(key, now)).count() as u64)
    }
}

#[async_trait]
impl PaperLedger for MemoryPoolBus {
    async fn record_paper_order(
        &self,
        account_id: &str,
        client_order_id: &str,
        order: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<LedgerWrite, BusError> {
        let now = Instant::now();
        let (orders, ids) = (
            keys::paper_orders(account_id),
            keys::paper_order_ids(account_id),
        );
        let mut keyspace = self.lock();
        if let Some(existing) = keyspace.hash_field(&orders, client_order_id, now)? {
            return Ok(LedgerWrite::Exists(existing));
        }
        // INCR: a missing counter counts from 0; a non-integer is refused.
        let id = match keyspace.get(&ids, now)? {
            None => 1,
            Some(current) => {
                current.parse::<u64>().map_err(|_| {
                    BusError::Rejected("ERR value is not an integer or out of range".into())
                })? + 1
            }
        };
        keyspace.check_hash(&orders, now)?;
        keyspace.set(&ids, &id.to_string(), None, now);
        let (prefix, suffix) = ledger_entry_parts(order);
        let stored = format!("{prefix}{id}{suffix}");
        keyspace.hash_set(&orders, &[(client_order_id, stored.clone())], now)?;
        Ok(LedgerWrite::Recorded(stored))
    }

    async fn paper_order(
        &self,
        account_id: &str,
        client_order_id: &str,
    ) -> Result<Option<String>, BusError> {
        self.lock().hash_field(
            &keys::paper_orders(account_id),
            client_order_id,
            Instant::now(),
        )
    }
}

#[async_trait]
impl Inspect for MemoryPoolBus {
    async fn marks(&self, pattern: &str) -> Result<Vec<StoredMark>, BusError> {
        let marks = self.marks_now(pattern)?;
        self.hooks.run(SnapshotRead::Marks).await;
        Ok(marks)
    }

    async fn server_time_ms(&self) -> Result<u64, BusError> {
        Ok(self.now_ms())
    }

    async fn scan_keys(&self, pattern: &str) -> Result<Vec<String>, BusError> {
        let now = Instant::now();
        let mut keyspace = self.lock();
        keyspace.purge_expired(now);
        let mut found: Vec<String> = keyspace
            .entries
            .keys()
            .filter(|key| glob_match(pattern.as_bytes(), key.as_bytes()))
            .cloned()
            .collect();
        found.sort();
        Ok(found)
    }

    async fn get(&self, key: &str) -> Result<Option<String>, BusError> {
        self.lock().get(key, Instant::now())
    }

    async fn ttl_ms(&self, key: &str) -> Result<Option<i64>, BusError> {
        let now = Instant::now();
        Ok(self
            .lock()
            .live(key, now)
            .map(|entry| match entry.expires_at {
                Some(at) => i64::try_from(remaining_ms(at, now)).unwrap_or(i64::MAX),
                None => -1,
            }))
    }

    async fn list_len(&self, key: &str) -> Result<u64, BusError> {
        Ok(self
            .lock()
            .list(key, Instant::now())?
            .map_or(0, |list| list.len() as u64))
    }

    async fn list_items(&self, key: &str) -> Result<Vec<String>, BusError> {
        Ok(self
            .lock()
            .list(key, Instant::now())?
            .map(|list| list.iter().cloned().collect())
            .unwrap_or_default())
    }

    async fn hash_get_all(&self, key: &str) -> Result<HashMap<String, String>, BusError> {
        match self
            .lock()
            .live(key, Instant::now())
            .map(|entry| &entry.value)
        {
            None => Ok(HashMap::new()),
            Some(Value::Hash(hash)) => Ok(hash.clone().into_iter().collect()),
            Some(_) => Err(BusError::Rejected(WRONG_TYPE.into())),
        }
    }
}

/// The host's wall clock, unix ms.
fn leasehold_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

impl MemoryPoolBus {
    /// `pool:idle` as [`PoolBus::idle_workers`] reads it, in one lock.
    fn idle_now(&self) -> Result<Vec<IdleEntry>, BusError> {
        let now = Instant::now();
        let mut keyspace = self.lock();
        let members: Vec<(String, i64)> = match keyspace.sorted_set(keys::POOL_IDLE, now)? {
            Some(set) => set.iter().map(|(w, score)| (w.clone(), *score)).collect(),
            None => return Ok(Vec::new()),
        };
        let mut idle = Vec::new();
        for (worker_id, score) in members {
            let Some(mark) = keyspace.get(&keys::pool_worker_active(&worker_id), now)? else {
                // A dead worker's entry: its taken claims go back in line.
                keyspace.hand_back(&worker_id, now)?;
                keyspace.zrem(keys::POOL_IDLE, &worker_id, now)?;
                continue;
            };
            let busy = keyspace
                .list(&keys::claims_processing(&worker_id), now)?
                .is_some_and(|list| !list.is_empty());
            if score >= 0 && !busy {
                idle.push(IdleEntry {
                    worker_id,
                    heartbeat_ms: u64::try_from(score).unwrap_or(0),
                    mark,
                });
            }
        }
        // ZRANGE order: by score, then member.
        idle.sort_by(|a, b| (a.heartbeat_ms, &a.worker_id).cmp(&(b.heartbeat_ms, &b.worker_id)));
        Ok(idle)
    }

    /// The marks matching `pattern`, read in one lock.
    fn marks_now(&self, pattern: &str) -> Result<Vec<StoredMark>, BusError> {
        let now = Instant::now();
        let mut keyspace = self.lock();
        keyspace.purge_expired(now);
        let mut marks: Vec<StoredMark> = keyspace
            .entries
            .iter()
            .filter(|(key, _)| glob_match(pattern.as_bytes(), key.as_bytes()))
            .filter_map(|(key, entry)| match &entry.value {
                Value::String(value) => Some(StoredMark {
                    key: key.clone(),
                    value: value.clone(),
                    ttl_ms: entry.expires_at.map(|at| remaining_ms(at, now)),
                }),
                // GET on another type fails in Redis; a mark is always a string.
                _ => None,
            })
            .collect();
        marks.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(marks)
    }
}

/// Remaining time to `at` in whole ms, rounded up like Redis's PTTL of a live key.
fn remaining_ms(at: Instant, now: Instant) -> u64 {
    let remaining = at.saturating_duration_since(now);
    u64::try_from(remaining.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// Waits for the next push, like a blocking pop: `false` once `deadline`
/// passes or `interrupt` fires (the pop then returns nothing).
async fn wait_for_push(
    pushed: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
    deadline: Instant,
    interrupt: &CancellationToken,
) -> bool {
    if interrupt.is_cancelled() {
        return false;
    }
    tokio::select! {
        _ = pushed => true,
        _ = tokio::time::sleep_until(deadline) => false,
        _ = interrupt.cancelled() => false,
    }
}

#[cfg(test)]
mod tests;
