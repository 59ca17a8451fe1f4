//! [`BusConnector`]: a pool bus connected on first use, for readers that must
//! keep running while Redis is down.

use std::collections::HashMap;

use async_trait::async_trait;

use super::{BusError, Inspect, PoolBus, StoredMark};

/// A pool bus that may not be connected yet: readers that must keep running
/// while Redis is down (the sidecar's observer, the dashboard) connect on first
/// use and again after a failed connect, instead of failing at start.
pub struct BusConnector {
    bus: tokio::sync::Mutex<Option<std::sync::Arc<dyn PoolBus>>>,
    redis_url: Option<String>,
}

impl std::fmt::Debug for BusConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a password.
        f.debug_struct("BusConnector").finish_non_exhaustive()
    }
}

impl BusConnector {
    /// A connector over a bus that already exists (memory bus, tests).
    pub fn ready(bus: std::sync::Arc<dyn PoolBus>) -> Self {
        BusConnector {
            bus: tokio::sync::Mutex::new(Some(bus)),
            redis_url: None,
        }
    }

    /// A connector to Redis at `url`; nothing is connected yet. The URL's form
    /// is checked now, so a typo is a configuration error at start.
    pub fn redis(url: String) -> Result<Self, BusError> {
        ::redis::Client::open(url.as_str())
            .map_err(|err| BusError::Config(format!("invalid Redis URL ({:?})", err.kind())))?;
        Ok(BusConnector {
            bus: tokio::sync::Mutex::new(None),
            redis_url: Some(url),
        })
    }

    /// The bus, connecting first if needed.
    pub async fn get(&self) -> Result<std::sync::Arc<dyn PoolBus>, BusError> {
        let mut slot = self.bus.lock().await;
        if let Some(bus) = slot.as_ref() {
            return Ok(bus.clone());
        }
        let url = self
            .redis_url
            .as_deref()
            .ok_or_else(|| BusError::Config("no pool bus".into()))?;
        let bus: std::sync::Arc<dyn PoolBus> =
            std::sync::Arc::new(super::redis::RedisPoolBus::connect_failing_fast(url).await?);
        *slot = Some(bus.clone());
        Ok(bus)
    }
}

/// A connector inspects through the bus it connects, so a reader that holds one
/// as a [`crate::read::PoolReader`] survives a Redis that is down at start.
#[async_trait]
impl Inspect for BusConnector {
    async fn marks(&self, pattern: &str) -> Result<Vec<StoredMark>, BusError> {
        self.get().await?.marks(pattern).await
    }
    async fn scan_keys(&self, pattern: &str) -> Result<Vec<String>, BusError> {
        self.get().await?.scan_keys(pattern).await
    }
    async fn get(&self, key: &str) -> Result<Option<String>, BusError> {
        BusConnector::get(self).await?.get(key).await
    }
    async fn ttl_ms(&self, key: &str) -> Result<Option<i64>, BusError> {
        self.get().await?.ttl_ms(key).await
    }
    async fn list_len(&self, key: &str) -> Result<u64, BusError> {
        self.get().await?.list_len(key).await
    }
    async fn list_items(&self, key: &str) -> Result<Vec<String>, BusError> {
        self.get().await?.list_items(key).await
    }
    async fn hash_get_all(&self, key: &str) -> Result<HashMap<String, String>, BusError> {
        self.get().await?.hash_get_all(key).await
    }
    async fn server_time_ms(&self) -> Result<u64, BusError> {
        self.get().await?.server_time_ms().await
    }
}

#[cfg(test)]
mod connector_tests {
    use super::*;

    #[tokio::test]
    async fn a_redis_that_is_down_is_an_error_per_use_not_at_creation() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let connector = BusConnector::redis(format!("redis://127.0.0.1:{port}")).unwrap();
        let err = connector.get().await.err().expect("nothing listens there");
        assert!(matches!(err, BusError::Unavailable(_)), "{err:?}");
        assert!(BusConnector::redis("http://nope".into()).is_err());
        let ready = BusConnector::ready(std::sync::Arc::new(
            super::super::memory::MemoryPoolBus::new(),
        ));
        assert!(ready.get().await.is_ok());
    }
}
