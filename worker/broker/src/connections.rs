//! Broker connections, cached per (broker_name, broker_type, simulation,
//! account_id) as the original broker-pool specification prescribes: opened lazily on first use, dropped on
//! error and reopened on the next request, pinged while idle, all closed on
//! idle timeout or credentials reload. Connecting retries with backoff a
//! bounded number of times; past that only that account is down: its
//! requests are answered at once until a jittered, growing backoff has
//! passed, then its next request tries again. One account's broker failing
//! never stops the worker, which goes on serving the user's other accounts.
//!
//! Every call into the broker seam has a timeout ([`CallTimeouts`]): a broker
//! that goes silent must not hold the user's queue, nor a stopping worker.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold_platform::backoff::Backoff;
use leasehold_telemetry::{TelemetryEvent, TelemetrySink};
use tokio::time::Instant;

use leasehold_pool::protocol::Account;

use crate::credentials::Credentials;
use crate::paper::{Broker, BrokerConnection, BrokerError};

/// Why no connection could be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    /// No adapter registered under this `broker_name`.
    #[error("unknown broker {0:?}")]
    UnknownBroker(String),
    /// Every attempt failed: the account is down until its backoff passes.
    #[error("{attempts} connect attempts failed, last: {last}")]
    Exhausted {
        /// Attempts made.
        attempts: u32,
        /// The last error.
        last: BrokerError,
    },
    /// The account's last connect attempts failed and its backoff has not
    /// passed: not tried now, so a dead broker costs one request per backoff
    /// the connect timeouts, not every request.
    #[error("the broker was unreachable at the last attempt ({last}); next attempt in {} ms", retry_in.as_millis())]
    Down {
        /// What the last attempt failed with.
        last: BrokerError,
        /// Until the next attempt.
        retry_in: Duration,
    },
}

/// How long each broker call may take before the worker stops waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallTimeouts {
    /// `connect` (each attempt).
    pub connect: Duration,
    /// `place_order`; past it the order is looked up by client order id.
    pub order: Duration,
    /// `lookup_order`; past it an order being settled is in doubt.
    pub lookup: Duration,
    /// `ping` (health check), and `close`.
    pub ping: Duration,
}

impl Default for CallTimeouts {
    /// Defaults chosen so the slowest honest broker still fits and a silent
    /// one is noticed well inside the 30 s a stopping ECS task gets: a TLS and
    /// login handshake can take seconds (connect 15 s); an order's round trip
    /// is sub-second normally and a few seconds on a busy exchange open
    /// (order 10 s); lookups and pings are plain reads (5 s).
    fn default() -> Self {
        CallTimeouts {
            connect: Duration::from_secs(15),
            order: Duration::from_secs(10),
            lookup: Duration::from_secs(5),
            ping: Duration::from_secs(5),
        }
    }
}

/// Connection cache settings.
#[derive(Debug, Clone, Copy)]
pub struct ConnectPolicy {
    /// Attempts per request before the account counts as down (originally 3).
    pub attempts: u32,
    /// Delay between attempts.
    pub backoff: Backoff,
    /// How long a down account is left alone, by consecutive failed rounds
    /// (jittered, growing, capped).
    pub reconnect: Backoff,
    /// Timeouts of every broker call.
    pub timeouts: CallTimeouts,
}

impl Default for ConnectPolicy {
    fn default() -> Self {
        ConnectPolicy {
            attempts: 3,
            backoff: Backoff {
                base: Duration::from_millis(200),
                cap: Duration::from_secs(2),
            },
            reconnect: RECONNECT,
            timeouts: CallTimeouts::default(),
        }
    }
}

/// A down account is retried after up to 1 s, doubling to up to 60 s: quick
/// after a blip, and at most one round of connect attempts a minute against a
/// broker that is really gone.
pub const RECONNECT: Backoff = Backoff {
    base: Duration::from_secs(1),
    cap: Duration::from_secs(60),
};

/// An account whose connects failed.
#[derive(Debug, Clone)]
struct Down {
    /// Consecutive failed rounds of attempts.
    failures: u32,
    /// No attempt before this.
    retry_at: Instant,
    /// The last attempt's error.
    last: BrokerError,
}

/// Open connections for one user's worker.
pub struct ConnectionCache {
    user_id: String,
    brokers: HashMap<String, Arc<dyn Broker>>,
    open: HashMap<Account, Box<dyn BrokerConnection>>,
    /// Keys invalidated since they were last open: their next open is a reconnect.
    invalidated: HashMap<Account, &'static str>,
    /// Accounts whose connects failed, with their backoff.
    down: HashMap<Account, Down>,
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
            down: HashMap::new(),
            policy,
            telemetry,
        }
    }

    /// The broker call timeouts.
    pub fn timeouts(&self) -> CallTimeouts {
        self.policy.timeouts
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
            if let Some(down) = self.down.get(key) {
                let now = Instant::now();
                if now < down.retry_at {
                    return Err(ConnectError::Down {
                        last: down.last.clone(),
                        retry_in: down.retry_at - now,
                    });
                }
            }
            let timeout = self.policy.timeouts.connect;
            let mut attempt = 0;
            let connection = loop {
                let connected = tokio::time::timeout(timeout, broker.connect(key, credentials))
                    .await
                    .unwrap_or(Err(BrokerError::TimedOut {
                        call: "connect",
                        after: timeout,
                    }));
                match connected {
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
                            self.mark_down(key, &err);
                            return Err(ConnectError::Exhausted {
                                attempts: attempt,
                                last: err,
                            });
                        }
                        tokio::time::sleep(self.policy.backoff.delay(attempt - 1)).await;
                    }
                }
            };
            self.down.remove(key);
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

    /// Records a failed round of connects: the account is left alone for a
    /// jittered backoff that grows with each consecutive failed round.
    fn mark_down(&mut self, key: &Account, err: &BrokerError) {
        let failures = self.down.get(key).map_or(0, |down| down.failures) + 1;
        let wait = self.policy.reconnect.delay(failures - 1);
        tracing::warn!(
            user_id = self.user_id,
            connection = %key,
            failures,
            retry_in_ms = wait.as_millis() as u64,
            "broker unreachable; the account's requests are answered `broker` until the next attempt"
        );
        self.down.insert(
            key.clone(),
            Down {
                failures,
                retry_at: Instant::now() + wait,
                last: err.clone(),
            },
        );
    }

    /// Closes a connection, bounded by the ping timeout: a broker that went
    /// silent must not hold a stopping worker in `close`.
    async fn close(&self, key: &Account, connection: Box<dyn BrokerConnection>) {
        let bound = self.policy.timeouts.ping;
        if tokio::time::timeout(bound, connection.close())
            .await
            .is_err()
        {
            tracing::warn!(user_id = self.user_id, connection = %key, "broker close did not finish in time; dropped");
        }
    }

    /// Closes a connection that failed; the next request reopens it.
    pub async fn invalidate(&mut self, key: &Account) {
        if let Some(connection) = self.open.remove(key) {
            self.close(key, connection).await;
            self.invalidated.insert(key.clone(), "invalidated");
        }
    }

    /// Pings every open connection; unhealthy ones are closed and reopened on
    /// their next request. Returns how many were dropped.
    pub async fn health_check(&mut self) -> usize {
        let mut unhealthy = Vec::new();
        let timeout = self.policy.timeouts.ping;
        for (key, connection) in &self.open {
            let pinged = tokio::time::timeout(timeout, connection.ping())
                .await
                .unwrap_or(Err(BrokerError::TimedOut {
                    call: "ping",
                    after: timeout,
                }));
            if let Err(err) = pinged {
                tracing::warn!(user_id = self.user_id, connection = %key, error = %err, "broker health check failed");
                unhealthy.push(key.clone());
            }
        }
        for key in &unhealthy {
            if let Some(connection) = self.open.remove(key) {
                self.close(key, connection).await;
            }
            self.invalidated.insert(key.clone(), "health_check");
        }
        unhealthy.len()
    }

    /// Closes every connection (idle timeout, shutdown, credentials reload).
    pub async fn close_all(&mut self, reason: &'static str) {
        let open: Vec<_> = self.open.drain().collect();
        for (key, connection) in open {
            self.close(&key, connection).await;
            self.invalidated.insert(key, reason);
        }
        // New credentials may be what a down account was missing.
        self.down.clear();
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
    async fn a_hung_connect_ends_at_its_timeout_and_the_account_backs_off() {
        let broker = paper(PaperConfig::default());
        let telemetry = RecordingSink::new();
        let mut cache = cache(&broker, &telemetry);
        broker.faults().hanging_connects.store(3, Ordering::SeqCst);
        let started = tokio::time::Instant::now();
        let err = cache.get(&key("A1"), &credentials()).await.err().unwrap();
        assert!(
            matches!(
                err,
                ConnectError::Exhausted {
                    attempts: 3,
                    last: BrokerError::TimedOut {
                        call: "connect",
                        ..
                    }
                }
            ),
            "{err}"
        );
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(45) && waited <= Duration::from_secs(46),
            "three 15 s attempts and a bounded backoff: {waited:?}"
        );
        // Down: answered at once, without trying, until the backoff passed.
        let started = tokio::time::Instant::now();
        assert!(matches!(
            cache.get(&key("A1"), &credentials()).await,
            Err(ConnectError::Down { .. })
        ));
        assert_eq!(started.elapsed(), Duration::ZERO);
        // Other accounts are not affected.
        cache.get(&key("A2"), &credentials()).await.unwrap();
        tokio::time::sleep(RECONNECT.base).await;
        cache.get(&key("A1"), &credentials()).await.unwrap();
        assert_eq!(cache.open_count(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_ping_ends_at_its_timeout_and_closes_the_connection() {
        let broker = paper(PaperConfig::default());
        let telemetry = RecordingSink::new();
        let mut cache = cache(&broker, &telemetry);
        cache.get(&key("A1"), &credentials()).await.unwrap();
        broker.faults().hanging_pings.store(1, Ordering::SeqCst);
        let started = tokio::time::Instant::now();
        assert_eq!(cache.health_check().await, 1);
        assert_eq!(started.elapsed(), CallTimeouts::default().ping);
        assert_eq!(cache.open_count(), 0);
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
