//! The [`Broker`] seam and the paper broker (simulated fills), so the whole pool
//! runs without a real broker SDK.
//!
//! A real broker plugs in by implementing [`Broker`] (authenticate with the
//! decrypted [`Credentials`], return a [`BrokerConnection`]) and registering it
//! under its `broker_name` in the worker's broker map. Errors must classify
//! whether the connection is still usable ([`BrokerError::Connection`] makes the
//! cache reopen it) and must never carry credentials.
//!
//! Orders carry a client order id (the request id). A broker must refuse a
//! repeated one ([`BrokerError::DuplicateClientOrderId`]) and find an order by
//! it ([`BrokerConnection::lookup_order`]), as Alpaca (`client_order_id`),
//! Binance (`newClientOrderId`) and FIX (`ClOrdID`) do: that is how the worker
//! settles an order whose outcome it did not learn, without sending it twice.
//!
//! The paper broker keeps its ledger on the pool bus (`paper:orders:{account_id}`
//! in Redis), so it outlives workers the way a real broker's order book does.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::credentials::Credentials;
use leasehold_control::clock::{Clock, SystemClock};
use leasehold_pool::bus::{LedgerWrite, PaperLedger};
use leasehold_pool::protocol::{Account, Order, PaperOrder};

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
    /// The broker already holds an order with this client order id: nothing
    /// was executed now (look the existing one up).
    #[error("client order id {0:?} was used before; the order was not placed again")]
    DuplicateClientOrderId(String),
    /// The call did not return within its timeout (set by the worker, not
    /// the broker): its outcome is unknown and the connection is suspect.
    #[error("the broker did not answer {call} within {} ms", after.as_millis())]
    TimedOut {
        /// Which call: `connect`, `place_order`, `lookup_order`, `ping`.
        call: &'static str,
        /// The timeout that passed.
        after: Duration,
    },
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
    /// Places an order under `client_order_id`; returns what the API should
    /// see as `result`. A client order id the broker has seen before is
    /// refused with [`BrokerError::DuplicateClientOrderId`], never executed.
    async fn place_order(&self, client_order_id: &str, order: &Order)
    -> Result<Value, BrokerError>;
    /// The order the broker holds under `client_order_id` (the same `result`
    /// shape as [`BrokerConnection::place_order`]), `None` when it has none.
    /// An error means the broker could not tell.
    async fn lookup_order(&self, client_order_id: &str) -> Result<Option<Value>, BrokerError>;
    /// Cheap liveness check (the 60 s health check).
    async fn ping(&self) -> Result<(), BrokerError>;
    /// Closes the session.
    async fn close(&self);
}

/// Paper broker behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PaperConfig {
    /// Added to every connect, order, lookup and ping.
    pub latency: Duration,
    /// Fraction (0-1) of orders that fail with a lost connection before they
    /// reach the ledger (not executed).
    pub failure_rate: f64,
    /// Fraction (0-1) of orders that are executed and then never answered:
    /// the call hangs forever, as a broker that went silent mid-order does.
    pub hang_rate: f64,
    /// Non-zero: every order is booked this long after the call reaches the
    /// broker (after `latency`), and the call never returns, as a broker whose
    /// gateway holds orders does. A lookup before then finds nothing: the
    /// order is in doubt, not "not executed". Zero: off.
    pub late_booking: Duration,
}

/// Failure injection that tests flip at run time (shared by every connection).
#[derive(Debug, Default)]
pub struct PaperFaults {
    /// The next N connects fail.
    pub failing_connects: AtomicU32,
    /// The next N orders fail with a lost connection before reaching the
    /// ledger: not executed.
    pub failing_orders: AtomicU32,
    /// The next N orders are executed (in the ledger), then the reply is lost
    /// (a connection error): the caller cannot tell what happened.
    pub lost_replies: AtomicU32,
    /// The next N orders are executed, then the call never returns.
    pub hanging_orders: AtomicU32,
    /// The next N orders never return and never reach the ledger (a broker
    /// that went silent before it took the order): not executed.
    pub stalled_orders: AtomicU32,
    /// The next N connects never return.
    pub hanging_connects: AtomicU32,
    /// The next N lookups never return.
    pub hanging_lookups: AtomicU32,
    /// The next N pings never return.
    pub hanging_pings: AtomicU32,
    /// The next N lookups fail with a lost connection.
    pub failing_lookups: AtomicU32,
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

/// Simulated broker: every order fills at its limit price (or 100.0), and is
/// kept in the ledger under its client order id.
#[derive(Clone)]
pub struct PaperBroker {
    config: PaperConfig,
    faults: Arc<PaperFaults>,
    ledger: Arc<dyn PaperLedger>,
}

impl std::fmt::Debug for PaperBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PaperBroker")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl PaperBroker {
    /// A paper broker with this behaviour, keeping its orders in `ledger`
    /// (the pool bus: Redis in production, memory in one process).
    pub fn new(config: PaperConfig, ledger: Arc<dyn PaperLedger>) -> Self {
        PaperBroker {
            config,
            faults: Arc::default(),
            ledger,
        }
    }

    /// The failure-injection switches.
    pub fn faults(&self) -> Arc<PaperFaults> {
        self.faults.clone()
    }
}

/// Never returns when a fault of `counter` is due: a broker gone silent.
async fn hang_if(counter: &AtomicU32) {
    if take_one(counter) {
        std::future::pending::<()>().await;
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
        hang_if(&self.faults.hanging_connects).await;
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
            ledger: self.ledger.clone(),
            account_id: account.account_id.clone(),
            connection_serial: serial,
        }))
    }
}

struct PaperConnection {
    config: PaperConfig,
    faults: Arc<PaperFaults>,
    ledger: Arc<dyn PaperLedger>,
    account_id: String,
    connection_serial: u64,
}

impl PaperConnection {
    /// What the API sees: the ledger's order, and which connection served it.
    fn result(&self, stored: &str) -> Result<Value, BrokerError> {
        let mut order: Value = serde_json::from_str(stored)
            .map_err(|_| BrokerError::Connection("the ledger holds an unreadable order".into()))?;
        if let Some(fields) = order.as_object_mut() {
            fields.insert("connection".into(), json!(self.connection_serial));
        }
        Ok(order)
    }
}

fn chance(rate: f64) -> bool {
    rate > 0.0 && rand::random::<f64>() < rate
}

/// Writes `order` to the ledger under `client_order_id`, as the broker books
/// it: the ledger assigns the broker order id in the same step that refuses a
/// repeated client order id. Returns the stored order.
async fn book(
    ledger: &dyn PaperLedger,
    account_id: &str,
    client_order_id: &str,
    order: &Order,
) -> Result<String, BrokerError> {
    let entry = PaperOrder {
        broker_order_id: 0,
        client_order_id: client_order_id.to_owned(),
        status: "filled".into(),
        account_id: account_id.to_owned(),
        symbol: order.symbol.clone(),
        side: order.side,
        quantity: order.quantity,
        price: order.price,
        fill_price: order.price.unwrap_or(100.0),
        created_at: SystemClock.now_ms_u64(),
    };
    let mut fields = match serde_json::to_value(&entry) {
        Ok(Value::Object(fields)) => fields,
        _ => return Err(BrokerError::Rejected("order cannot be encoded".into())),
    };
    // The ledger assigns it, in the same step that refuses a repeat.
    fields.remove("broker_order_id");
    match ledger
        .record_paper_order(account_id, client_order_id, &fields)
        .await
    {
        Ok(LedgerWrite::Recorded(stored)) => Ok(stored),
        Ok(LedgerWrite::Exists(_)) => Err(BrokerError::DuplicateClientOrderId(
            client_order_id.to_owned(),
        )),
        // The write may or may not have happened: exactly a lost reply.
        Err(err) => Err(BrokerError::Connection(format!("ledger: {err}"))),
    }
}

#[async_trait]
impl BrokerConnection for PaperConnection {
    async fn place_order(
        &self,
        client_order_id: &str,
        order: &Order,
    ) -> Result<Value, BrokerError> {
        delay(self.config.latency).await;
        hang_if(&self.faults.stalled_orders).await;
        if take_one(&self.faults.failing_orders) || chance(self.config.failure_rate) {
            return Err(BrokerError::Connection("simulated broker failure".into()));
        }
        if !self.config.late_booking.is_zero() {
            // The gateway holds the order and books it later, whatever became
            // of the call: nobody hears how the booking went.
            let ledger = self.ledger.clone();
            let account_id = self.account_id.clone();
            let client_order_id = client_order_id.to_owned();
            let order = order.clone();
            let after = self.config.late_booking;
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let booked = book(ledger.as_ref(), &account_id, &client_order_id, &order).await;
                if let Err(err) = booked {
                    tracing::debug!(%client_order_id, %err, "paper broker: late booking not made");
                }
            });
            return std::future::pending().await;
        }
        let stored = book(
            self.ledger.as_ref(),
            &self.account_id,
            client_order_id,
            order,
        )
        .await?;
        if take_one(&self.faults.hanging_orders) || chance(self.config.hang_rate) {
            // Executed, and the answer never comes: what a call timeout is for.
            std::future::pending::<()>().await;
        }
        if take_one(&self.faults.lost_replies) {
            return Err(BrokerError::Connection("simulated lost reply".into()));
        }
        self.result(&stored)
    }

    async fn lookup_order(&self, client_order_id: &str) -> Result<Option<Value>, BrokerError> {
        delay(self.config.latency).await;
        hang_if(&self.faults.hanging_lookups).await;
        if take_one(&self.faults.failing_lookups) {
            return Err(BrokerError::Connection("simulated lookup failure".into()));
        }
        match self
            .ledger
            .paper_order(&self.account_id, client_order_id)
            .await
        {
            Ok(Some(stored)) => self.result(&stored).map(Some),
            Ok(None) => Ok(None),
            Err(err) => Err(BrokerError::Connection(format!("ledger: {err}"))),
        }
    }

    async fn ping(&self) -> Result<(), BrokerError> {
        delay(self.config.latency).await;
        hang_if(&self.faults.hanging_pings).await;
        if take_one(&self.faults.failing_pings) {
            return Err(BrokerError::Connection("simulated ping failure".into()));
        }
        Ok(())
    }

    async fn close(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_pool::bus::memory::MemoryPoolBus;
    use leasehold_pool::protocol::Side;

    fn account() -> Account {
        Account {
            broker_name: "paper".into(),
            broker_type: "stock".into(),
            simulation: true,
            account_id: "A1".into(),
        }
    }

    fn order(price: Option<f64>) -> Order {
        Order {
            symbol: "2330".into(),
            side: Side::Buy,
            quantity: 2.0,
            price,
        }
    }

    async fn open(broker: &PaperBroker) -> Box<dyn BrokerConnection> {
        let credentials = Credentials::from_json(br#"{"api_key": "k"}"#).unwrap();
        broker.connect(&account(), &credentials).await.unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_repeated_client_order_id_is_refused_and_can_be_looked_up() {
        let ledger = Arc::new(MemoryPoolBus::new());
        let broker = PaperBroker::new(PaperConfig::default(), ledger.clone());
        let connection = open(&broker).await;
        assert_eq!(connection.lookup_order("r1").await.unwrap(), None);
        let placed = connection
            .place_order("r1", &order(Some(600.5)))
            .await
            .unwrap();
        assert_eq!(placed["broker_order_id"], 1);
        assert_eq!(placed["client_order_id"], "r1");
        assert_eq!(placed["fill_price"], 600.5);
        assert_eq!(placed["status"], "filled");
        assert_eq!(
            connection.place_order("r1", &order(None)).await,
            Err(BrokerError::DuplicateClientOrderId("r1".into()))
        );
        // A new connection (or a new worker) sees the same book.
        let again = open(&broker).await;
        let found = again.lookup_order("r1").await.unwrap().unwrap();
        assert_eq!(found["broker_order_id"], 1);
        assert_eq!(found["fill_price"], 600.5);
        let market = again.place_order("r2", &order(None)).await.unwrap();
        assert_eq!(market["broker_order_id"], 2);
        assert_eq!(market["fill_price"], 100.0);
        assert_eq!(
            PaperOrder::parse(&ledger.paper_order("A1", "r2").await.unwrap().unwrap())
                .unwrap()
                .price,
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn injected_failures_land_on_either_side_of_the_ledger() {
        let ledger = Arc::new(MemoryPoolBus::new());
        let broker = PaperBroker::new(PaperConfig::default(), ledger.clone());
        let connection = open(&broker).await;
        broker.faults().failing_orders.store(1, Ordering::SeqCst);
        assert!(matches!(
            connection.place_order("r1", &order(None)).await,
            Err(BrokerError::Connection(_))
        ));
        assert_eq!(
            connection.lookup_order("r1").await.unwrap(),
            None,
            "not executed"
        );
        broker.faults().lost_replies.store(1, Ordering::SeqCst);
        assert!(matches!(
            connection.place_order("r2", &order(None)).await,
            Err(BrokerError::Connection(_))
        ));
        assert!(
            connection.lookup_order("r2").await.unwrap().is_some(),
            "executed"
        );
        broker.faults().failing_lookups.store(1, Ordering::SeqCst);
        assert!(connection.lookup_order("r2").await.is_err());

        broker.faults().hanging_orders.store(1, Ordering::SeqCst);
        let hung = tokio::time::timeout(
            Duration::from_secs(3600),
            connection.place_order("r3", &order(None)),
        )
        .await;
        assert!(hung.is_err(), "a hanging order never returns");
        assert!(
            connection.lookup_order("r3").await.unwrap().is_some(),
            "but it executed"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_booking_lands_after_the_call_gave_up_and_only_once() {
        let ledger = Arc::new(MemoryPoolBus::new());
        let config = PaperConfig {
            late_booking: Duration::from_millis(1500),
            ..PaperConfig::default()
        };
        let broker = PaperBroker::new(config, ledger.clone());
        let connection = open(&broker).await;
        let call = tokio::time::timeout(
            Duration::from_millis(500),
            connection.place_order("r1", &order(Some(600.5))),
        )
        .await;
        assert!(call.is_err(), "the call never returns");
        assert_eq!(
            connection.lookup_order("r1").await.unwrap(),
            None,
            "not booked yet"
        );
        // The same client order id again: booked late too, and refused then.
        let again = tokio::time::timeout(
            Duration::from_millis(100),
            connection.place_order("r1", &order(None)),
        )
        .await;
        assert!(again.is_err());
        tokio::time::sleep(Duration::from_secs(2)).await;
        let found = connection.lookup_order("r1").await.unwrap().unwrap();
        assert_eq!(found["broker_order_id"], 1);
        assert_eq!(found["fill_price"], 600.5, "the first booking stays");
        assert_eq!(ledger.paper_order("A1", "r2").await.unwrap(), None);
    }
}
