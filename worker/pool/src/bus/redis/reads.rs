//! The Redis pool bus's reads of any key (`Inspect`, for the read model and
//! the conformance suite) and the paper broker's ledger: neither is a step of
//! the pool protocol, so they stay out of the `PoolBus` impl.

use std::collections::HashMap;

use async_trait::async_trait;

use super::RedisPoolBus;
use super::connection::{classify, scan_keys};
use crate::bus::{BusError, Inspect, LedgerWrite, PaperLedger, StoredMark};
use crate::keys;

#[async_trait]
impl PaperLedger for RedisPoolBus {
    async fn record_paper_order(
        &self,
        account_id: &str,
        client_order_id: &str,
        order: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<LedgerWrite, BusError> {
        self.record_paper_order_on_redis(account_id, client_order_id, order)
            .await
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
