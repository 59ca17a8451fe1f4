//! Broker connections, cached per (broker_name, broker_type, simulation,
//! account_id) as the original broker-pool specification prescribes: opened lazily on first use, dropped on
//! error and reopened on the next request, pinged while idle, all closed on
//! idle timeout or credentials reload. Connecting retries with backoff a
//! bounded number of times; past that the worker gives up (the orchestrator
//! replaces it).

use std::collections::HashMap;
use std::sync::Arc;

use leasehold_platform::backoff::Backoff;
use leasehold_telemetry::{TelemetryEvent, TelemetrySink};

use leasehold_pool::protocol::Account;

use crate::credentials::Credentials;
use crate::paper::{Broker, BrokerConnection, BrokerError};

/// Why no connection could be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    /// No adapter registered under this `broker_name`.
    #[error("unknown broker {0:?}")]
    UnknownBroker(String),
    /// Every attempt failed: the worker reports failure and exits non-zero.
    #[error("{attempts} connect attempts failed, last: {last}")]
    Exhausted {
        /// Attempts made.
        attempts: u32,
        /// The last error.
        last: BrokerError,
    },
}

/// Connection cache settings.
#[derive(Debug, Clone, Copy)]
pub struct ConnectPolicy {
    /// Attempts before giving up (originally 3).
    pub attempts: u32,
    /// Delay between attempts.
    pub backoff: Backoff,
}

impl Default for ConnectPolicy {
    fn default() -> Self {
        ConnectPolicy {
            attempts: 3,
            backoff: Backoff {
                base: std::time::Duration::from_millis(200),
                cap: std::time::Duration::from_secs(2),
            },
        }
    }
}

/// Open connections for one user's worker.
pub struct ConnectionCache {
    user_id: String,
    brokers: HashMap<String, Arc<dyn Broker>>,
    open: HashMap<Account, Box<dyn BrokerConnection>>,
    /// Keys invalidated since they were last open: their next open is a reconnect.
    invalidated: HashMap<Account, &'static str>,
    policy: ConnectPolicy,
    telemetry: Arc<dyn TelemetrySink>,
}

impl ConnectionCache {
    /// An empty cache; `brokers` maps `broker_name` to its adapter.
    pub fn new(
        user_id: &str,
        brokers: HashMap<String, Arc<dyn Broker>>,
        policy: ConnectPolicy,
        telemetry: Arc<dyn TelemetrySink>,
    ) -> Self {
        ConnectionCache {
            user_id: user_id.to_owned(),
            brokers,
            open: HashMap::new(),
            invalidated: HashMap::new(),
            policy,
            telemetry,
        }
    }

    /// How many connections are open.
    pub fn open_count(&self) -> usize {
        self.open.len()
    }

    /// The open connection for `key`, opening it first if needed.
    pub async fn get(
        &mut self,
        key: &Account,
        credentials: &Credentials,
    ) -> Result<&dyn BrokerConnection, ConnectError> {
        if !self.open.contains_key(key) {
            let broker = self
                .brokers
                .get(&key.broker_name)
                .ok_or_else(|| ConnectError::UnknownBroker(key.broker_name.clone()))?
                .clone();
            let mut attempt = 0;
            let connection = loop {
                match broker.connect(key, credentials).await {
                    Ok(connection) => break connection,
                    Err(err) => {
                        attempt += 1;
                        tracing::warn!(
                            user_id = self.user_id,
                            connection = %key,
                            attempt,
                            error = %err,
                            "broker connect failed"
                        );
                        if attempt >= self.policy.attempts {
                            return Err(ConnectError::Exhausted {
                                attempts: attempt,
                                last: err,
                            });
                        }
                        tokio::time::sleep(self.policy.backoff.delay(attempt - 1)).await;
                    }
                }
            };
            if let Some(reason) = self.invalidated.remove(key) {
                self.telemetry.emit(TelemetryEvent::BrokerReconnect {
                    user_id: self.user_id.clone(),
                    connection: key.to_string(),
                    reason: reason.to_owned(),
                });
            }
            self.open.insert(key.clone(), connection);
        }
        self.open
            .get(key)
            .map(|connection| connection.as_ref())
            .ok_or_else(|| ConnectError::UnknownBroker(key.broker_name.clone()))
    }

    /// Closes a connection that failed; the next request reopens it.
    pub async fn invalidate(&mut self, key: &Account) {
        if let Some(connection) = self.open.remove(key) {
            connection.close().await;
            self.invalidated.insert(key.clone(), "invalidated");
        }
    }

    /// Pings every open connection; unhealthy ones are closed and reopened on
    /// their next request. Returns how many were dropped.
    pub async fn health_check(&mut self) -> usize {
        let mut unhealthy = Vec::new();
        for (key, connection) in &self.open {
            if let Err(err) = connection.ping().await {
                tracing::warn!(user_id = self.user_id, connection = %key, error = %err, "broker health check failed");
                unhealthy.push(key.clone());
            }
        }
        for key in &unhealthy {
            if let Some(connection) = self.open.remove(key) {
                connection.close().await;
            }
            self.invalidated.insert(key.clone(), "health_check");
        }
        unhealthy.len()
    }

    /// Closes every connection (idle timeout, shutdown, credentials reload).
    pub async fn close_all(&mut self, reason: &'static str) {
        for (key, connection) in self.open.drain() {
            connection.close().await;
            self.invalidated.insert(key, reason);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paper::{PaperBroker, PaperConfig};
    use leasehold_pool::bus::memory::MemoryPoolBus;
    use leasehold_pool::protocol::{Order, Side};
    use leasehold_telemetry::RecordingSink;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    fn key(account: &str) -> Account {
        Account {
            broker_name: "paper".into(),
            broker_type: "stock".into(),
            simulation: true,
            account_id: account.into(),
        }
    }

    fn credentials() -> Credentials {
        Credentials::from_json(br#"{"api_key": "k"}"#).unwrap()
    }

    fn unique() -> String {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        format!("r{}", NEXT.fetch_add(1, Ordering::SeqCst))
    }

    fn order() -> Order {
        Order {
            symbol: "2330".into(),
            side: Side::Buy,
            quantity: 1.0,
            price: Some(600.5),
        }
    }

    fn paper(config: PaperConfig) -> PaperBroker {
        PaperBroker::new(config, Arc::new(MemoryPoolBus::new()))
    }

    fn cache(broker: &PaperBroker, telemetry: &RecordingSink) -> ConnectionCache {
        let brokers: HashMap<String, Arc<dyn Broker>> = HashMap::from([(
            "paper".to_owned(),
            Arc::new(broker.clone()) as Arc<dyn Broker>,
        )]);
        ConnectionCache::new(
            "u1",
            brokers,
            ConnectPolicy::default(),
            Arc::new(telemetry.clone()),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn opens_lazily_once_per_key_and_reuses() {
        let broker = paper(PaperConfig::default());
        let telemetry = RecordingSink::new();
        let mut cache = cache(&broker, &telemetry);
        assert_eq!(cache.open_count(), 0);
        for _ in 0..3 {
            cache
                .get(&key("A1"), &credentials())
                .await
                .unwrap()
                .place_order(&unique(), &order())
                .await
                .unwrap();
        }
        cache.get(&key("A2"), &credentials()).await.unwrap();
        assert_eq!(cache.open_count(), 2);
        assert_eq!(broker.faults().connects.load(Ordering::SeqCst), 2);
        let mut live = key("A1");
        live.simulation = false;
        cache.get(&live, &credentials()).await.unwrap();
        assert_eq!(
            cache.open_count(),
            3,
            "simulation and live are separate sessions"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn invalidated_connections_reopen_on_next_use() {
        let broker = paper(PaperConfig::default());
        let telemetry = RecordingSink::new();
        let mut cache = cache(&broker, &telemetry);
        broker.faults().failing_orders.store(1, Ordering::SeqCst);
        let err = cache
            .get(&key("A1"), &credentials())
            .await
            .unwrap()
            .place_order(&unique(), &order())
            .await;
        assert!(matches!(err, Err(BrokerError::Connection(_))));
        cache.invalidate(&key("A1")).await;
        assert_eq!(cache.open_count(), 0);
        cache
            .get(&key("A1"), &credentials())
            .await
            .unwrap()
            .place_order(&unique(), &order())
            .await
            .unwrap();
        assert_eq!(broker.faults().connects.load(Ordering::SeqCst), 2);
        assert!(matches!(
            telemetry.take().as_slice(),
            [TelemetryEvent::BrokerReconnect { reason, .. }] if reason == "invalidated"
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn connect_retries_then_gives_up_after_the_attempt_limit() {
        let broker = paper(PaperConfig::default());
        let telemetry = RecordingSink::new();
        let mut cache = cache(&broker, &telemetry);
        broker.faults().failing_connects.store(2, Ordering::SeqCst);
        cache.get(&key("A1"), &credentials()).await.unwrap();
        cache.close_all("test").await;
        broker.faults().failing_connects.store(3, Ordering::SeqCst);
        let started = tokio::time::Instant::now();
        let err = cache.get(&key("A1"), &credentials()).await.err().unwrap();
        assert!(
            matches!(err, ConnectError::Exhausted { attempts: 3, .. }),
            "{err}"
        );
        assert!(
            started.elapsed() <= Duration::from_millis(200 + 400),
            "backoff is bounded"
        );
        let unknown = Account {
            broker_name: "nope".into(),
            ..key("A1")
        };
        assert!(matches!(
            cache.get(&unknown, &credentials()).await,
            Err(ConnectError::UnknownBroker(_))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn health_check_drops_only_unhealthy_connections() {
        let broker = paper(PaperConfig {
            latency: Duration::from_millis(5),
            ..PaperConfig::default()
        });
        let telemetry = RecordingSink::new();
        let mut cache = cache(&broker, &telemetry);
        cache.get(&key("A1"), &credentials()).await.unwrap();
        cache.get(&key("A2"), &credentials()).await.unwrap();
        assert_eq!(cache.health_check().await, 0);
        broker.faults().failing_pings.store(1, Ordering::SeqCst);
        assert_eq!(cache.health_check().await, 1);
        assert_eq!(cache.open_count(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn credentials_for_another_account_do_not_connect() {
        let broker = paper(PaperConfig::default());
        let telemetry = RecordingSink::new();
        let mut cache = cache(&broker, &telemetry);
        let creds = Credentials::from_json(br#"{"api_key": "k", "account_id": "A9"}"#).unwrap();
        assert!(cache.get(&key("A1"), &creds).await.is_err());
    }
}
