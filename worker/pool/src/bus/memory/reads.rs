//! The in-memory bus's reads of any key (`Inspect`), its snapshot reads of
//! `pool:idle` and the marks, and the paper broker's ledger: not steps of the
//! pool protocol, so they stay out of the `PoolBus` impl.

use std::collections::HashMap;

use async_trait::async_trait;
use tokio::time::Instant;

use super::injection::SnapshotRead;
use super::keyspace::{Value, WRONG_TYPE};
use super::{MemoryPoolBus, glob_match};
use crate::bus::{BusError, IdleEntry, Inspect, LedgerWrite, PaperLedger, StoredMark};
use crate::keys;

#[async_trait]
impl PaperLedger for MemoryPoolBus {
    async fn record_paper_order(
        &self,
        account_id: &str,
        client_order_id: &str,
        order: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<LedgerWrite, BusError> {
        self.record_paper_order_in_memory(account_id, client_order_id, order)
            .await
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

impl MemoryPoolBus {
    /// `pool:idle` as [`PoolBus::idle_workers`] reads it, in one lock.
    pub(in crate::bus) fn idle_now(&self) -> Result<Vec<IdleEntry>, BusError> {
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
    pub(in crate::bus) fn marks_now(&self, pattern: &str) -> Result<Vec<StoredMark>, BusError> {
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
pub(in crate::bus) fn remaining_ms(at: Instant, now: Instant) -> u64 {
    let remaining = at.saturating_duration_since(now);
    u64::try_from(remaining.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}
