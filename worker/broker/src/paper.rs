//! The [`Broker`] seam and the paper broker (simulated fills), so the whole pool
//! runs without a real broker SDK.
//!
//! A real broker plugs in by implementing [`Broker`] (authenticate with the
//! decrypted [`Credentials`], return a [`BrokerConnection`]) and registering it
//! under its `broker_name` in the worker's broker map. Errors must classify
//! whether the connection is still usable ([`BrokerError::Connection`] makes the
//! cache reopen it) and must never carry credentials.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::credentials::Credentials;
use leasehold_pool::protocol::Account;
use leasehold_pool::protocol::Order;

/// What a broker call can fail with. Messages never contain secrets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrokerError {
    /// Could not connect or authenticate; the cache retries with backoff.
    #[error("cannot connect to the broker: {0}")]
    Connect(String),
    /// The connection broke; it is closed and reopened on the next request.
    #[error("broker connection lost: {0}")]
    Connection(String),
    /// The broker refused this order; the connection is fine.
    #[error("order rejected: {0}")]
    Rejected(String),
}

/// A broker SDK adapter: opens authenticated connections.
#[async_trait]
pub trait Broker: Send + Sync {
    /// Opens one connection for `account` with the user's credentials.
    async fn connect(
        &self,
        account: &Account,
        credentials: &Credentials,
    ) -> Result<Box<dyn BrokerConnection>, BrokerError>;
}

/// One open, authenticated broker session.
#[async_trait]
pub trait BrokerConnection: Send + Sync {
    /// Places an order; returns what the API should see as `result`.
    async fn place_order(&self, order: &Order) -> Result<Value, BrokerError>;
    /// Cheap liveness check (the 60 s health check).
    async fn ping(&self) -> Result<(), BrokerError>;
    /// Closes the session.
    async fn close(&self);
}

/// Paper broker behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PaperConfig {
    /// Added to every connect, order and ping.
    pub latency: Duration,
    /// Fraction (0-1) of orders that fail with a lost connection.
    pub failure_rate: f64,
}

/// Failure injection that tests flip at run time (shared by every connection).
#[derive(Debug, Default)]
pub struct PaperFaults {
    /// The next N connects fail.
    pub failing_connects: AtomicU32,
    /// The next N orders fail with a lost connection.
    pub failing_orders: AtomicU32,
    /// The next N pings fail.
    pub failing_pings: AtomicU32,
    /// Connections opened so far.
    pub connects: AtomicU64,
}

fn take_one(counter: &AtomicU32) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

/// Simulated broker: every order fills at its limit price (or 100.0).
#[derive(Debug, Clone, Default)]
pub struct PaperBroker {
    config: PaperConfig,
    faults: Arc<PaperFaults>,
}

impl PaperBroker {
    /// A paper broker with this behaviour.
    pub fn new(config: PaperConfig) -> Self {
        PaperBroker {
            config,
            faults: Arc::default(),
        }
    }

    /// The failure-injection switches.
    pub fn faults(&self) -> Arc<PaperFaults> {
        self.faults.clone()
    }
}

async fn delay(latency: Duration) {
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
}

#[async_trait]
impl Broker for PaperBroker {
    async fn connect(
        &self,
        account: &Account,
        credentials: &Credentials,
    ) -> Result<Box<dyn BrokerConnection>, BrokerError> {
        delay(self.config.latency).await;
        if take_one(&self.faults.failing_connects) {
            return Err(BrokerError::Connect("simulated connect failure".into()));
        }
        if credentials.get("api_key").is_none() {
            return Err(BrokerError::Connect("credentials have no api_key".into()));
        }
        if let Some(account_id) = credentials.get("account_id")
            && account_id.expose() != account.account_id
        {
            return Err(BrokerError::Connect(
                "credentials are for another account".into(),
            ));
        }
        let serial = self.faults.connects.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Box::new(PaperConnection {
            config: self.config,
            faults: self.faults.clone(),
            account_id: account.account_id.clone(),
            connection_serial: serial,
            orders: AtomicU64::new(0),
        }))
    }
}

struct PaperConnection {
    config: PaperConfig,
    faults: Arc<PaperFaults>,
    account_id: String,
    connection_serial: u64,
    orders: AtomicU64,
}

#[async_trait]
impl BrokerConnection for PaperConnection {
    async fn place_order(&self, order: &Order) -> Result<Value, BrokerError> {
        delay(self.config.latency).await;
        let injected =
            self.config.failure_rate > 0.0 && rand::random::<f64>() < self.config.failure_rate;
        if take_one(&self.faults.failing_orders) || injected {
            return Err(BrokerError::Connection("simulated broker failure".into()));
        }
        let number = self.orders.fetch_add(1, Ordering::Relaxed) + 1;
        Ok(json!({
            "order_id": format!("paper-{}-{number}", self.connection_serial),
            "status": "filled",
            "account_id": self.account_id,
            "symbol": order.symbol,
            "side": order.side,
            "quantity": order.quantity,
            "fill_price": order.price.unwrap_or(100.0),
            "connection": self.connection_serial,
        }))
    }

    async fn ping(&self) -> Result<(), BrokerError> {
        delay(self.config.latency).await;
        if take_one(&self.faults.failing_pings) {
            return Err(BrokerError::Connection("simulated ping failure".into()));
        }
        Ok(())
    }

    async fn close(&self) {}
}
