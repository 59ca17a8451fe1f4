//! The paper broker's ledger step: an order is booked once per client order
//! id, in one atomic step, as a real broker refuses a repeated client order
//! id. Its Lua and both buses' steps live here; the conformance suite holds
//! the buses to one behaviour (`paper_ledger_refuses_repeated_client_order_ids`).

use super::memory::MemoryPoolBus;
use super::redis::RedisPoolBus;
use super::redis::classify;
use tokio::time::Instant;

use super::{BusError, LedgerWrite, ledger_entry_parts};
use crate::keys;

/// KEYS: ledger hash, id counter. ARGV: client order id, order text before
/// and after its broker order id. A repeated client order id is refused:
/// {0, stored order}; otherwise {1, new order}.
pub(in crate::bus) const RECORD_PAPER_ORDER: &str = r#"
local existing = redis.call('HGET', KEYS[1], ARGV[1])
if existing then return {0, existing} end
local id = redis.call('INCR', KEYS[2])
local order = ARGV[2] .. string.format('%d', id) .. ARGV[3]
redis.call('HSET', KEYS[1], ARGV[1], order)
return {1, order}
"#;

impl MemoryPoolBus {
    pub(in crate::bus) async fn record_paper_order_in_memory(
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
}

impl RedisPoolBus {
    pub(in crate::bus) async fn record_paper_order_on_redis(
        &self,
        account_id: &str,
        client_order_id: &str,
        order: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<LedgerWrite, BusError> {
        let (prefix, suffix) = ledger_entry_parts(order);
        let (recorded, stored): (i64, String) = self
            .functions
            .record_paper_order
            .key(keys::paper_orders(account_id))
            .key(keys::paper_order_ids(account_id))
            .arg(client_order_id)
            .arg(prefix)
            .arg(suffix)
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Ok(if recorded == 1 {
            LedgerWrite::Recorded(stored)
        } else {
            LedgerWrite::Exists(stored)
        })
    }
}
