//! A lease store meter for fleet simulations: DynamoDB-like latency on every
//! call, and the read and write capacity units each call would cost on
//! DynamoDB on demand, so a simulated hour prices itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_control::LeaseError;
use leasehold_control::store::Consistency;
use leasehold_control::store::intercept::{Interceptor, StoreOp};
use leasehold_control::store::memory::MemoryLeaseStore;

/// Bytes of one lease record as DynamoDB sizes it (names and values; a
/// stream record with leasehold's extras is 250-312 B).
pub const RECORD_BYTES: u64 = 300;
/// What one keys-only entry of the assignee index is priced at: its keys and
/// DynamoDB's per-entry overhead.
pub const INDEX_ENTRY_BYTES: u64 = 100;

/// On-demand prices, us-east-1: dollars per million units.
pub const WRITE_PRICE: f64 = 0.625;
/// See [`WRITE_PRICE`].
pub const READ_PRICE: f64 = 0.125;

/// Capacity units consumed so far, in tenths (an eventually consistent read
/// of up to 4 KB is half a unit).
#[derive(Debug)]
pub struct Meter {
    /// The metered table, to price a `Scan` page by the records it holds.
    table: Arc<MemoryLeaseStore>,
    write_tenths: AtomicU64,
    read_tenths: AtomicU64,
    calls: Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Inject latency (p50 5 ms, p99 20 ms) on every call.
    latency: bool,
    draws: AtomicU64,
}

/// A snapshot of a [`Meter`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Units {
    /// Write capacity units.
    pub writes: f64,
    /// Read capacity units.
    pub reads: f64,
    /// Calls by kind (`renew`, `take_over`, `list` …).
    pub calls: std::collections::BTreeMap<&'static str, u64>,
}

impl Units {
    /// What has been consumed since `earlier`.
    pub fn since(&self, earlier: &Units) -> Units {
        Units {
            writes: self.writes - earlier.writes,
            reads: self.reads - earlier.reads,
            calls: self
                .calls
                .iter()
                .map(|(kind, n)| (*kind, n - earlier.calls.get(kind).unwrap_or(&0)))
                .collect(),
        }
    }

    /// Dollars a month at this rate, given the window it was measured over.
    pub fn monthly_cost(&self, window: Duration) -> f64 {
        let per_month = 730.0 * 3600.0 / window.as_secs_f64();
        (self.writes * WRITE_PRICE + self.reads * READ_PRICE) * per_month / 1e6
    }
}

impl Meter {
    /// A meter of `table`'s calls that adds DynamoDB-like latency to every
    /// call when `latency`.
    pub fn new(table: Arc<MemoryLeaseStore>, latency: bool) -> Meter {
        Meter {
            table,
            write_tenths: AtomicU64::default(),
            read_tenths: AtomicU64::default(),
            calls: Mutex::default(),
            latency,
            draws: AtomicU64::default(),
        }
    }

    /// Units consumed so far.
    pub fn units(&self) -> Units {
        Units {
            writes: self.write_tenths.load(Ordering::Relaxed) as f64 / 10.0,
            reads: self.read_tenths.load(Ordering::Relaxed) as f64 / 10.0,
            calls: self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        }
    }

    /// 5 ms, one call in fifty 20 ms: a p50 of 5 ms and a p99 of 20 ms,
    /// spread evenly (a counter, not randomness, keeps runs repeatable).
    fn delay(&self) -> Duration {
        let draw = self.draws.fetch_add(1, Ordering::Relaxed);
        if draw % 50 == 49 {
            Duration::from_millis(20)
        } else {
            Duration::from_millis(5)
        }
    }
}

/// Tenths of a read unit for `bytes` read at `consistency`.
fn read_tenths(bytes: u64, consistency: Consistency) -> u64 {
    let units = bytes.div_ceil(4096).max(1) * 10;
    match consistency {
        Consistency::Strong => units,
        Consistency::Eventual => units / 2,
    }
}

#[async_trait]
impl Interceptor for Meter {
    async fn before(&self, _: StoreOp<'_>) -> Result<(), LeaseError> {
        if self.latency {
            tokio::time::sleep(self.delay()).await;
        }
        Ok(())
    }

    fn after(&self, op: StoreOp<'_>, _outcome: Result<(), &LeaseError>) {
        *self
            .calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(op.name())
            .or_default() += 1;
        match op {
            StoreOp::Get { consistency, .. } => {
                self.read_tenths
                    .fetch_add(read_tenths(RECORD_BYTES, consistency), Ordering::Relaxed);
            }
            StoreOp::List {
                start_after,
                limit,
                consistency,
            } => {
                // Priced after the call: the page as read (a write since may
                // move it by a record, nothing a scan's units notice).
                let records = self.table.page_len(start_after, limit);
                let bytes = records as u64 * RECORD_BYTES;
                self.read_tenths
                    .fetch_add(read_tenths(bytes, consistency), Ordering::Relaxed);
            }
            // Keys-only index entries of about 100 bytes (keys and
            // DynamoDB's per-entry overhead); a Query is always eventual.
            StoreOp::Assigned { assignee } => {
                let bytes = self.table.assigned_len(assignee) as u64 * INDEX_ENTRY_BYTES;
                self.read_tenths
                    .fetch_add(read_tenths(bytes, Consistency::Eventual), Ordering::Relaxed);
            }
            // The record, and the index: an entry moved from one assignee to
            // another is a delete and a put there.
            StoreOp::Assign { .. } => {
                self.write_tenths.fetch_add(30, Ordering::Relaxed);
            }
            // Two items, each a write unit (a condition check is priced as a write).
            StoreOp::TakeOver { .. } => {
                self.write_tenths.fetch_add(20, Ordering::Relaxed);
            }
            _ => {
                self.write_tenths.fetch_add(10, Ordering::Relaxed);
            }
        }
    }
}
