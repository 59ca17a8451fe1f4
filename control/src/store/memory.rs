//! In-memory lease store for `leasehold dev` and fast tests.
//!
//! It keeps raw items, not typed leases, and evaluates the same conditions the
//! DynamoDB store sends as expressions, so the conformance suite can hold both to
//! one behaviour (including what happens with records written by other tools).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Mutex;

use async_trait::async_trait;

use super::{
    AcquireRequest, CheckpointRequest, Consistency, Holder, LeaseError, LeasePage, LeaseReader,
    LeaseStore, LiftRequest, ReleaseRequest, RenewRequest, TakeoverRequest, check_reserved,
    check_stream, refusal, registration_item,
};
use crate::lease::Lease;
use crate::protocol;
use crate::schema::{self, AttrValue, RawItem};

/// A lease table in process memory. Cheap to share behind an `Arc`.
#[derive(Debug, Default)]
pub struct MemoryLeaseStore {
    items: Mutex<BTreeMap<String, RawItem>>,
    /// While set, [`LeaseReader::assigned`] answers from this copy of the
    /// assignee index, as DynamoDB's eventually consistent index may lag.
    frozen_index: Mutex<Option<BTreeMap<String, String>>>,
}

impl MemoryLeaseStore {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes a raw item as-is, as another tool (the original lease specification's Python demo, a careless
    /// operator) could. Used to seed `dev` and by the conformance suite.
    pub fn put_raw(&self, item: RawItem) {
        let key = schema::item_key(&item)
            .expect("put_raw needs a string stream_id")
            .to_owned();
        self.lock().insert(key, item);
    }

    /// How many records a listing page from `start_after` of at most `limit`
    /// holds (what a simulation's meter prices a `Scan` page by).
    pub fn page_len(&self, start_after: Option<&str>, limit: usize) -> usize {
        let items = self.lock();
        let from = match start_after {
            Some(key) => Bound::Excluded(key.to_owned()),
            None => Bound::Unbounded,
        };
        items.range((from, Bound::Unbounded)).take(limit).count()
    }

    /// Freezes the assignee index as it is now (`true`) or lets it follow the
    /// table again: what a lagging DynamoDB index can answer, for tests that
    /// must not act on a stale index.
    pub fn freeze_index(&self, frozen: bool) {
        let snapshot = frozen.then(|| {
            self.lock()
                .iter()
                .filter_map(|(key, item)| match item.get(schema::ASSIGNEE) {
                    Some(AttrValue::S(assignee)) => Some((key.clone(), assignee.clone())),
                    _ => None,
                })
                .collect()
        });
        *self.frozen_index.lock().unwrap_or_else(|p| p.into_inner()) = snapshot;
    }

    /// How many streams are assigned to `assignee` (what a simulation's
    /// meter prices an index `Query` by).
    pub fn assigned_len(&self, assignee: &str) -> usize {
        self.lock()
            .values()
            .filter(
                |item| matches!(item.get(schema::ASSIGNEE), Some(AttrValue::S(a)) if a == assignee),
            )
            .count()
    }

    /// Reads an item exactly as stored.
    pub fn get_raw(&self, stream_id: &str) -> Option<RawItem> {
        self.lock().get(stream_id).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, RawItem>> {
        // A panic while holding the lock cannot leave an item half-written (every
        // mutation below is computed first and applied at once), so poison is moot.
        self.items.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn set(item: &mut RawItem, name: &str, value: AttrValue) {
    item.insert(name.to_owned(), value);
}

/// Applies the release update (shared by release and force_release).
fn apply_release(item: &mut RawItem, now_ms: i64) {
    item.remove(schema::OWNER_ID);
    set(item, schema::HANDED_TO, AttrValue::s(String::new()));
    set(item, schema::LEASE_EXPIRES_AT, AttrValue::n(0));
    set(item, schema::RELEASED_AT, AttrValue::n(now_ms));
    set(item, schema::UPDATED_AT, AttrValue::n(now_ms));
}

/// Applies the acquire update (shared by acquire and take_over).
fn apply_acquire(item: &mut RawItem, current: &Lease, r: &AcquireRequest) {
    set(
        item,
        schema::PREVIOUS_OWNER,
        AttrValue::s(current.last_owner.clone().unwrap_or_default()),
    );
    set(
        item,
        schema::PREVIOUS_EXPIRES_AT,
        AttrValue::n(current.lease_expires_at),
    );
    set(item, schema::OWNER_ID, AttrValue::s(&r.owner_id));
    set(item, schema::LAST_OWNER, AttrValue::s(&r.owner_id));
    set(
        item,
        schema::LEASE_EXPIRES_AT,
        AttrValue::n(r.now_ms + r.lease_ms),
    );
    set(
        item,
        schema::FENCE_TOKEN,
        AttrValue::n(current.fence_token + 1),
    );
    set(item, schema::ACQUIRED_AT, AttrValue::n(r.now_ms));
    set(item, schema::UPDATED_AT, AttrValue::n(r.now_ms));
    match r.session_token {
        Some(token) => set(item, schema::SESSION_TOKEN, AttrValue::n(token)),
        None => {
            item.remove(schema::SESSION_TOKEN);
        }
    }
    if let Some(url) = &r.sidecar_url {
        set(item, schema::SIDECAR_URL, AttrValue::s(url));
    }
    if let Some(addr) = &r.handoff_addr {
        set(item, schema::HANDOFF_ADDR, AttrValue::s(addr));
    }
    if let Some(max) = r.max_streams {
        set(item, schema::MAX_STREAMS, AttrValue::n(max));
    }
}

/// A copy of the stored item and its decoded lease, to check and write back.
fn stored(
    items: &BTreeMap<String, RawItem>,
    stream_id: &str,
) -> Result<(RawItem, Lease), LeaseError> {
    let item = items
        .get(stream_id)
        .ok_or_else(|| LeaseError::NotFound {
            stream_id: stream_id.to_owned(),
        })?
        .clone();
    let current = schema::decode(&item)?;
    Ok((item, current))
}

#[async_trait]
impl LeaseStore for MemoryLeaseStore {
    async fn acquire(&self, r: &AcquireRequest) -> Result<Lease, LeaseError> {
        let mut items = self.lock();
        let mut item = match items.get(&r.stream_id) {
            Some(item) => item.clone(),
            None => RawItem::from([(schema::STREAM_ID.to_owned(), AttrValue::s(&r.stream_id))]),
        };
        let current = schema::decode(&item)?;
        // A missing lease_expires_at compares as false in DynamoDB, hence the
        // presence check.
        let expires_at = item
            .contains_key(schema::LEASE_EXPIRES_AT)
            .then_some(current.lease_expires_at);
        let allowed = match r.session_token {
            // DynamoDB: attribute_not_exists(owner_id) OR lease_expires_at < :now OR owner_id = :owner.
            None => protocol::acquirable(
                current.owner_id.as_deref(),
                expires_at,
                &r.owner_id,
                r.now_ms,
                r.skew_margin_ms,
            ),
            Some(_) => protocol::session_acquirable(
                current.owner_id.as_deref(),
                current.session_token,
                expires_at,
                &r.owner_id,
                r.now_ms,
                r.skew_margin_ms,
            ),
        };
        if !allowed {
            return Err(refusal(current, Holder::none()));
        }
        apply_acquire(&mut item, &current, r);
        let lease = schema::decode(&item)?;
        items.insert(r.stream_id.clone(), item);
        Ok(lease)
    }

    async fn renew(&self, r: &RenewRequest) -> Result<Lease, LeaseError> {
        let mut items = self.lock();
        let (mut item, current) = stored(&items, &r.stream_id)?;
        let holder = Holder::new(&r.owner_id, r.fence_token, r.checkpoint);
        if !holder.holds(&current)
            || current.lease_expires_at < r.now_ms
            || holder.is_behind(&current)
        {
            return Err(refusal(current, holder));
        }
        // Never shorter than stored: a holder whose clock stepped back keeps
        // the expiry it already has (the DynamoDB store's EXPIRY_NOT_SHORTENED).
        let expires = protocol::renewed_expiry(current.lease_expires_at, r.now_ms + r.lease_ms);
        set(&mut item, schema::LEASE_EXPIRES_AT, AttrValue::n(expires));
        if expires == r.now_ms + r.lease_ms {
            set(&mut item, schema::UPDATED_AT, AttrValue::n(r.now_ms));
        }
        if let Some(checkpoint) = r.checkpoint {
            set(&mut item, schema::CHECKPOINT, AttrValue::n(checkpoint));
            set(&mut item, schema::CHECKPOINT_AT, AttrValue::n(r.now_ms));
        }
        let lease = schema::decode(&item)?;
        items.insert(r.stream_id.clone(), item);
        Ok(lease)
    }

    async fn checkpoint(&self, r: &CheckpointRequest) -> Result<Lease, LeaseError> {
        let mut items = self.lock();
        let (mut item, current) = stored(&items, &r.stream_id)?;
        let holder = Holder::new(&r.owner_id, r.fence_token, Some(r.checkpoint));
        if !holder.holds(&current) || holder.is_behind(&current) {
            return Err(refusal(current, holder));
        }
        set(&mut item, schema::CHECKPOINT, AttrValue::n(r.checkpoint));
        set(&mut item, schema::CHECKPOINT_AT, AttrValue::n(r.now_ms));
        set(&mut item, schema::UPDATED_AT, AttrValue::n(r.now_ms));
        let lease = schema::decode(&item)?;
        items.insert(r.stream_id.clone(), item);
        Ok(lease)
    }

    async fn release(&self, r: &ReleaseRequest) -> Result<Lease, LeaseError> {
        let mut items = self.lock();
        let (mut item, current) = stored(&items, &r.stream_id)?;
        let holder = Holder::new(&r.owner_id, r.fence_token, r.checkpoint);
        if !holder.holds(&current) || holder.is_behind(&current) {
            return Err(refusal(current, holder));
        }
        if let Some(checkpoint) = r.checkpoint {
            set(&mut item, schema::CHECKPOINT, AttrValue::n(checkpoint));
            set(&mut item, schema::CHECKPOINT_AT, AttrValue::n(r.now_ms));
        }
        apply_release(&mut item, r.now_ms);
        // What the DynamoDB store writes: `""` for no successor.
        let successor = r.successor.clone().unwrap_or_default();
        set(&mut item, schema::HANDED_TO, AttrValue::s(successor));
        let lease = schema::decode(&item)?;
        items.insert(r.stream_id.clone(), item);
        Ok(lease)
    }

    async fn force_release(&self, stream_id: &str, now_ms: i64) -> Result<Lease, LeaseError> {
        let mut items = self.lock();
        let Some(item) = items.get_mut(stream_id) else {
            return Err(LeaseError::NotFound {
                stream_id: stream_id.to_owned(),
            });
        };
        apply_release(item, now_ms);
        Ok(schema::decode(item)?)
    }

    async fn register(&self, stream_id: &str, now_ms: i64) -> Result<bool, LeaseError> {
        let mut items = self.lock();
        if items.contains_key(stream_id) {
            return Ok(false);
        }
        items.insert(stream_id.to_owned(), registration_item(stream_id, now_ms));
        Ok(true)
    }

    async fn bump(&self, record_id: &str, now_ms: i64) -> Result<u64, LeaseError> {
        check_reserved(record_id)?;
        let mut items = self.lock();
        let item = items.entry(record_id.to_owned()).or_insert_with(|| {
            RawItem::from([(schema::STREAM_ID.to_owned(), AttrValue::s(record_id))])
        });
        let next = schema::decode(item)?.fence_token + 1;
        set(item, schema::FENCE_TOKEN, AttrValue::n(next));
        set(item, schema::UPDATED_AT, AttrValue::n(now_ms));
        Ok(next)
    }

    async fn assign(&self, stream_id: &str, assignee: Option<&str>) -> Result<(), LeaseError> {
        check_stream(stream_id)?;
        let mut items = self.lock();
        let Some(item) = items.get_mut(stream_id) else {
            return Err(LeaseError::NotFound {
                stream_id: stream_id.to_owned(),
            });
        };
        match assignee {
            Some(assignee) => set(item, schema::ASSIGNEE, AttrValue::s(assignee)),
            None => {
                item.remove(schema::ASSIGNEE);
            }
        }
        Ok(())
    }

    async fn take_over(&self, r: &TakeoverRequest) -> Result<Lease, LeaseError> {
        let acquire = &r.acquire;
        let mut items = self.lock();
        // Both conditions and the write under one lock: the transaction.
        let (mut item, current) = stored(&items, &acquire.stream_id)?;
        let session = items
            .get(&schema::session_record(&r.from_owner))
            .map(schema::decode)
            .transpose()?;
        let ended = protocol::session_ended(
            session.as_ref().and_then(|s| s.owner_id.as_deref()),
            session.as_ref().map(|s| s.fence_token),
            session.as_ref().map(|s| s.lease_expires_at),
            r.from_session_token,
            acquire.now_ms,
            acquire.skew_margin_ms,
        );
        let still_theirs = current.owner_id.as_deref() == Some(r.from_owner.as_str())
            && current.session_token == Some(r.from_session_token)
            && current.fence_token == r.from_fence_token;
        if !(ended && still_theirs) || acquire.session_token.is_none() {
            return Err(refusal(current, Holder::none()));
        }
        apply_acquire(&mut item, &current, acquire);
        match r.from_expires_at {
            Some(expired_at) => set(
                &mut item,
                schema::PREVIOUS_EXPIRES_AT,
                AttrValue::n(expired_at),
            ),
            None => {
                item.remove(schema::PREVIOUS_EXPIRES_AT);
            }
        }
        let lease = schema::decode(&item)?;
        items.insert(acquire.stream_id.clone(), item);
        Ok(lease)
    }

    async fn declare_mode(&self, mode: &str, now_ms: i64) -> Result<String, LeaseError> {
        let mut items = self.lock();
        let item = items
            .entry(schema::MODE_RECORD.to_owned())
            .or_insert_with(|| {
                RawItem::from([(
                    schema::STREAM_ID.to_owned(),
                    AttrValue::s(schema::MODE_RECORD),
                )])
            });
        match item.get(schema::LEASE_MODE) {
            Some(AttrValue::S(declared)) => Ok(declared.clone()),
            Some(_) => Err(LeaseError::Malformed(schema::MalformedItem {
                stream_id: schema::MODE_RECORD.to_owned(),
                attribute: schema::LEASE_MODE.to_owned(),
                problem: "has a type other than S".to_owned(),
            })),
            None => {
                set(item, schema::LEASE_MODE, AttrValue::s(mode));
                set(item, schema::UPDATED_AT, AttrValue::n(now_ms));
                Ok(mode.to_owned())
            }
        }
    }

    async fn lift_token(&self, r: &LiftRequest) -> Result<Lease, LeaseError> {
        let mut items = self.lock();
        let (mut item, current) = stored(&items, &r.stream_id)?;
        let holder = Holder::new(&r.owner_id, r.fence_token, None);
        if !holder.holds(&current) || current.fence_token >= r.to {
            return Err(refusal(current, holder));
        }
        set(&mut item, schema::FENCE_TOKEN, AttrValue::n(r.to));
        set(&mut item, schema::UPDATED_AT, AttrValue::n(r.now_ms));
        if let Some(checkpoint) = r.checkpoint {
            set(&mut item, schema::CHECKPOINT, AttrValue::n(checkpoint));
            set(&mut item, schema::CHECKPOINT_AT, AttrValue::n(r.now_ms));
        }
        let lease = schema::decode(&item)?;
        items.insert(r.stream_id.clone(), item);
        Ok(lease)
    }
}

#[async_trait]
impl LeaseReader for MemoryLeaseStore {
    // One process, one copy: every read sees every write, which is one of the
    // answers an eventually consistent read may give.
    async fn get_with(&self, stream_id: &str, _: Consistency) -> Result<Lease, LeaseError> {
        match self.lock().get(stream_id) {
            Some(item) => Ok(schema::decode(item)?),
            None => Err(LeaseError::NotFound {
                stream_id: stream_id.to_owned(),
            }),
        }
    }

    async fn assigned(&self, assignee: &str) -> Result<Vec<String>, LeaseError> {
        if let Some(index) = &*self.frozen_index.lock().unwrap_or_else(|p| p.into_inner()) {
            return Ok(index
                .iter()
                .filter(|(_, a)| *a == assignee)
                .map(|(key, _)| key.clone())
                .collect());
        }
        // Keys in order, as the index's range key (`stream_id`) sorts them.
        Ok(self
            .lock()
            .iter()
            .filter(|(_, item)| {
                matches!(item.get(schema::ASSIGNEE), Some(AttrValue::S(a)) if a == assignee)
            })
            .map(|(key, _)| key.clone())
            .collect())
    }

    async fn list_with(
        &self,
        start_after: Option<&str>,
        limit: usize,
        _: Consistency,
    ) -> Result<LeasePage, LeaseError> {
        let limit = limit.max(1);
        let items = self.lock();
        let lower = match start_after {
            Some(key) => Bound::Excluded(key.to_owned()),
            None => Bound::Unbounded,
        };
        // One extra entry tells whether another page follows.
        let window: Vec<_> = items
            .range((lower, Bound::Unbounded))
            .take(limit + 1)
            .collect();
        let next = (window.len() > limit).then(|| window[limit - 1].0.clone());
        let leases = window
            .iter()
            .take(limit)
            .map(|(_, item)| schema::decode(item))
            .collect();
        Ok(LeasePage { leases, next })
    }
}
