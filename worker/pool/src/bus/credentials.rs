//! The credentials step that needs atomicity: a blob is replaced only if it
//! is still the one the caller read (compare-and-set), so two concurrent
//! `credentials rotate` runs never lose one's blob to the other's. Its Lua and
//! both buses' steps live here.

use tokio::time::Instant;

use super::BusError;
use super::memory::MemoryPoolBus;
use super::redis::RedisPoolBus;
use super::redis::classify;
use crate::keys;

/// KEYS: a credentials key. ARGV: the blob expected there, its replacement.
/// 1 = replaced; 0 = it changed or is gone, nothing written.
pub(in crate::bus) const REPLACE_IF: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"#;

impl MemoryPoolBus {
    pub(in crate::bus) async fn replace_credentials_in_memory(
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
}

impl RedisPoolBus {
    pub(in crate::bus) async fn replace_credentials_on_redis(
        &self,
        user_id: &str,
        expected: &str,
        blob: &str,
    ) -> Result<bool, BusError> {
        let replaced: i64 = self
            .functions
            .replace_if
            .key(keys::credentials(user_id))
            .arg(expected)
            .arg(blob)
            .invoke_async(&mut self.commands())
            .await
            .map_err(classify)?;
        Ok(replaced == 1)
    }
}
